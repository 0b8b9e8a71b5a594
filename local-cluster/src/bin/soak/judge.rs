//! The soak's verdicts, from its samples: growth of each mesh process after warm-up,
//! failures outside the injected faults, state that outlived its pod, enrollment.

use std::collections::BTreeMap;

use local_cluster::load::Failures;
use serde::Serialize;

use crate::faults::Fault;
use crate::sample::Sample;

/// Growth allowed from the warm-up sample to the end.
pub const MAX_GROWTH: f64 = 0.10;
/// How long state may outlive its pod.
pub const STALE_LIMIT_S: f64 = 30.0;

#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub check: String,
    pub passed: bool,
    pub detail: String,
}

fn verdict(check: &str, problems: Vec<String>, ok: String) -> Verdict {
    Verdict {
        check: check.into(),
        passed: problems.is_empty(),
        detail: if problems.is_empty() {
            ok
        } else {
            problems.join("; ")
        },
    }
}

/// Growth below these is noise however large in percent (a process of 20 descriptors
/// opening 3 more): growth fails only above both the percentage and these.
const RSS_FLOOR_KIB: u64 = 2048;
const FDS_FLOOR: usize = 5;
/// A life this long after its warm-up is judged, however long the soak.
const LONG_ENOUGH_S: f64 = 600.0;
/// The processes the growth verdict must judge (sampled components' names).
const MESH_COMPONENTS: [&str; 3] = ["ztunnel", "istio-cni-node", "istiod"];

/// RSS and descriptors of every mesh process (not the API server: it stands in for
/// Kubernetes), from its first sample after warm-up to its last. A process started
/// during the soak (a fault replaced it) warms up too: it is judged from `warm_up_s`
/// after it was first seen, if it then lives a third of the judged time or
/// [`LONG_ENOUGH_S`]. Every mesh component must have a life judged: a rollout that
/// replaces ztunnel too often to judge any of them fails the verdict rather than
/// leaving ztunnel unjudged.
pub fn growth(samples: &[Sample], warm_up_s: f64) -> (Verdict, Vec<Growth>) {
    let last_t = samples.last().map(|s| s.t_s).unwrap_or_default();
    let mut born: BTreeMap<u32, f64> = BTreeMap::new();
    let mut first: BTreeMap<u32, (f64, u64, usize)> = BTreeMap::new();
    let mut last: BTreeMap<u32, (f64, u64, usize, String)> = BTreeMap::new();
    for s in samples {
        for p in s
            .processes
            .iter()
            .filter(|p| p.component != "kube-apiserver")
        {
            let seen = *born.entry(p.pid).or_insert(s.t_s);
            // The soak's own start counts as time zero for what was there from it.
            let from = if seen <= samples[0].t_s {
                warm_up_s
            } else {
                seen + warm_up_s
            };
            if s.t_s < from {
                continue;
            }
            first.entry(p.pid).or_insert((s.t_s, p.rss_kib, p.fds));
            last.insert(
                p.pid,
                (
                    s.t_s,
                    p.rss_kib,
                    p.fds,
                    format!("{} {}", p.component, p.pod),
                ),
            );
        }
    }
    let span_needed = ((last_t - warm_up_s) / 3.0).clamp(1.0, LONG_ENOUGH_S);
    let mut growths = Vec::new();
    let mut problems = Vec::new();
    for (pid, (t0, rss0, fds0)) in first {
        let Some((t1, rss1, fds1, name)) = last.get(&pid).cloned() else {
            continue;
        };
        if t1 - t0 < span_needed {
            continue;
        }
        let rss_growth = rss1 as f64 / rss0.max(1) as f64 - 1.0;
        let fd_growth = fds1 as f64 / fds0.max(1) as f64 - 1.0;
        if rss_growth > MAX_GROWTH && rss1.saturating_sub(rss0) > RSS_FLOOR_KIB {
            problems.push(format!(
                "{name} (pid {pid}) RSS {rss0} -> {rss1} KiB (+{:.0} %) from {t0:.0}s to {t1:.0}s",
                rss_growth * 100.0
            ));
        }
        if fd_growth > MAX_GROWTH && fds1.saturating_sub(fds0) > FDS_FLOOR {
            problems.push(format!(
                "{name} (pid {pid}) descriptors {fds0} -> {fds1} (+{:.0} %) from {t0:.0}s to {t1:.0}s",
                fd_growth * 100.0
            ));
        }
        growths.push(Growth {
            process: name,
            pid,
            from_s: t0,
            to_s: t1,
            rss_kib: (rss0, rss1),
            fds: (fds0, fds1),
        });
    }
    let judged = growths.len();
    for component in MESH_COMPONENTS {
        if !growths.iter().any(|g| g.process.starts_with(component)) {
            problems.push(format!(
                "no {component} process lived long enough to be judged"
            ));
        }
    }
    let v = verdict(
        "no mesh process grows more than 10 % after warm-up (RSS, descriptors)",
        problems,
        format!("{judged} processes judged"),
    );
    (v, growths)
}

#[derive(Debug, Clone, Serialize)]
pub struct Growth {
    pub process: String,
    pub pid: u32,
    pub from_s: f64,
    pub to_s: f64,
    pub rss_kib: (u64, u64),
    pub fds: (usize, usize),
}

/// Every failed connection falls in an injected fault's window; long-lived connections
/// are lost only in ztunnel's rollout. `failures` are the load's groups with the
/// seconds (into the soak) of their first and last; `counted` is the load's own total,
/// which the groups must add up to.
pub fn failures(failures: &[(f64, f64, Failures)], faults: &[Fault], counted: u64) -> Verdict {
    let mut problems = Vec::new();
    for (first_s, last_s, f) in failures {
        // A window is one interval: covering both ends covers the whole group.
        let allowed = faults.iter().any(|x| {
            x.covers(*first_s)
                && x.covers(*last_s)
                && (f.kind != "long" || x.kind == crate::faults::Kind::ZtunnelRollout)
        });
        if !allowed {
            problems.push(format!(
                "{} {} connection(s) to {} from {first_s:.1}s to {last_s:.1}s: {}",
                f.count, f.kind, f.target, f.reason
            ));
        }
    }
    let grouped: u64 = failures.iter().map(|(_, _, f)| f.count).sum();
    if grouped != counted {
        problems.push(format!(
            "the load counted {counted} failures but reported {grouped} with their times"
        ));
    }
    problems.truncate(20);
    verdict(
        "no connection fails outside an injected fault (long-lived: only at ztunnel's rollout)",
        problems,
        format!("{counted} failures, all inside a fault's window"),
    )
}

/// Stale state (xDS workloads, certificates, pods served) no older than the limit.
pub fn stale_state(samples: &[Sample]) -> Verdict {
    // (node, kind, item) -> first time seen stale, last time seen stale
    let mut seen: BTreeMap<(String, &str, String), (f64, f64)> = BTreeMap::new();
    for s in samples {
        for z in &s.ztunnels {
            for (kind, items) in [
                ("xDS workload", &z.xds_stale),
                ("certificate", &z.certificates_stale),
                ("pod served", &z.pods_served_stale),
            ] {
                for item in items {
                    let e = seen
                        .entry((z.node.clone(), kind, item.clone()))
                        .or_insert((s.t_s, s.t_s));
                    e.1 = s.t_s;
                }
            }
        }
    }
    let problems: Vec<String> = seen
        .iter()
        .filter(|(_, (a, b))| b - a > STALE_LIMIT_S)
        .map(|((node, kind, item), (a, b))| {
            format!("{kind} {item} on {node} outlived its pod from {a:.0}s to {b:.0}s")
        })
        .take(20)
        .collect();
    verdict(
        "no xDS workload, certificate or served pod outlives its pod by more than 30 s",
        problems,
        format!("{} stale items seen, none for more than 30 s", seen.len()),
    )
}

/// Each ztunnel holds one network namespace per pod it serves (plus at most its own
/// and the node's), sampled outside faults.
pub fn netns_held(samples: &[Sample]) -> Verdict {
    let mut problems = Vec::new();
    for s in samples.iter().filter(|s| s.faults.is_empty()) {
        for z in &s.ztunnels {
            if z.netns_fds > z.pods_served + 2 {
                problems.push(format!(
                    "{} at {:.0}s: {} namespaces held for {} pods served",
                    z.node, s.t_s, z.netns_fds, z.pods_served
                ));
            }
        }
    }
    problems.truncate(10);
    verdict(
        "ztunnel holds no pod network namespace after the pod is gone",
        problems,
        "namespaces held = pods served (+ its own) at every sample".into(),
    )
}

/// The agents keep up: once the churn settles after warm-up, the pods enrolled never
/// trail the pods that should be by more than the churn in flight.
pub fn enrollment(samples: &[Sample], warm_up_s: f64, in_flight: usize) -> Verdict {
    let mut problems = Vec::new();
    for s in samples
        .iter()
        .filter(|s| s.t_s >= warm_up_s && s.faults.is_empty())
    {
        let gap = s.meshed_expected as f64 - s.meshed_enrolled;
        if gap.abs() > in_flight as f64 {
            problems.push(format!(
                "at {:.0}s: {} pods should be enrolled, agents report {}",
                s.t_s, s.meshed_expected, s.meshed_enrolled
            ));
        }
    }
    problems.truncate(10);
    verdict(
        "pods enrolled follow the pods that should be (outside faults)",
        problems,
        format!("within {in_flight} at every sample"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::Kind;
    use crate::sample::Process;

    fn group(kind: &str, count: u64) -> Failures {
        Failures {
            kind: kind.into(),
            target: "10.0.0.1:9001".into(),
            reason: "connection reset".into(),
            count,
            first_ms: 0,
            last_ms: 0,
        }
    }

    #[test]
    fn failures_count_only_inside_their_faults_window() {
        let faults = [
            Fault::ran(Kind::IstiodKilled, 100.0, 110.0),
            Fault::ran(Kind::ZtunnelRollout, 200.0, 240.0),
        ];
        // Short ones in any window (grace included); long ones only in the rollout.
        let inside = [
            (101.0, 120.0, group("short", 3)),
            (240.0, 254.0, group("long", 1000)),
        ];
        assert!(failures(&inside, &faults, 1003).passed);
        let v = failures(&[(105.0, 106.0, group("long", 2))], &faults, 2);
        assert!(!v.passed && v.detail.contains("2 long"), "{}", v.detail);
        // A group that runs past its window's grace is outside it.
        let v = failures(&[(230.0, 300.0, group("short", 5))], &faults, 5);
        assert!(!v.passed, "{}", v.detail);
        // Failures the load counted but did not report are never assumed fine.
        let v = failures(&inside, &faults, 1004);
        assert!(
            !v.passed && v.detail.contains("counted 1004"),
            "{}",
            v.detail
        );
    }

    fn sample(t_s: f64, processes: &[(&str, u32, u64)]) -> Sample {
        Sample {
            t_s,
            processes: processes
                .iter()
                .map(|&(component, pid, rss_kib)| Process {
                    component: component.into(),
                    pod: format!("{component}-{pid}"),
                    node: "node-1".into(),
                    pid,
                    rss_kib,
                    fds: 20,
                    threads: 4,
                    cpu_cores: None,
                })
                .collect(),
            ..Sample::default()
        }
    }

    #[test]
    fn growth_judges_every_component_and_fails_a_leak() {
        let steady = |t: f64, ztunnel_rss: u64| {
            sample(
                t,
                &[
                    ("istio-cni-node", 1, 20_000),
                    ("istiod", 2, 50_000),
                    ("ztunnel", 3, ztunnel_rss),
                ],
            )
        };
        let run = |end_rss: u64| {
            (0..=36)
                .map(|i| {
                    let t = i as f64 * 100.0;
                    steady(t, if i == 36 { end_rss } else { 70_000 })
                })
                .collect::<Vec<_>>()
        };
        let (v, judged) = growth(&run(72_000), 300.0);
        assert!(v.passed, "{}", v.detail);
        assert_eq!(judged.len(), 3);
        let (v, _) = growth(&run(80_000), 300.0);
        assert!(!v.passed && v.detail.contains("ztunnel"), "{}", v.detail);

        // ztunnel replaced every 10 minutes: no life of it is long enough to judge.
        let rolled: Vec<Sample> = (0..=36)
            .map(|i| {
                let t = i as f64 * 100.0;
                let mut s = steady(t, 70_000);
                s.processes[2].pid = 100 + (i / 6) as u32;
                s
            })
            .collect();
        let (v, _) = growth(&rolled, 300.0);
        assert!(
            !v.passed && v.detail.contains("no ztunnel process"),
            "{}",
            v.detail
        );
    }
}
