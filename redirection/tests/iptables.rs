//! The redirection module against golden files and real namespaces.
//!
//! Golden files in `testdata/iptables/` are both the `iptables-restore` input for a
//! fresh netns and what `iptables-save` prints back for our chains.
//! `UPDATE_GOLDEN=1 cargo test -p redirection --test iptables` rewrites them (review
//! the diff). Root-only tests build their own namespaces (`test_support::netns`) and skip with
//! a message when not root; nothing is created in the root namespace.

use mesh_runtime::netns::NetnsHandle;
use redirection::host_capture::HostCapture;
use redirection::iptables::{self, Backend};
use redirection::netlink::PolicyRouting;
use redirection::rules::{InpodRules, IpFamily, RuleSet};
use redirection::save::SavedTables;
use redirection::{
    check_inpod, disable_inpod, enable_fresh_inpod, enable_inpod, CheckResult, Mode, ProbeSnat,
    Redirector,
};
use std::net::IpAddr;
use test_support::netns::Netns;
use test_support::topology::Node;

const BACKENDS: [Backend; 2] = [Backend::Nft, Backend::Legacy];

fn assert_golden(name: &str, actual: &str) {
    test_support::golden::assert_golden(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/iptables")
            .join(name),
        actual,
    );
}

/// Every variant with its golden file.
fn variants() -> Vec<(&'static str, RuleSet)> {
    let v6 = InpodRules {
        ipv6: true,
        ..Default::default()
    };
    let dns = InpodRules {
        ipv6: true,
        dns_capture: true,
        ..Default::default()
    };
    let bypass = InpodRules {
        ipv6: true,
        inbound_capture: false,
        ..Default::default()
    };
    // A VM: the metadata server and ssh left alone, one local port's inbound captured.
    let vm = HostCapture {
        mark: 0x539,
        exclude_cidrs: vec![
            "169.254.169.254/32".parse().unwrap(),
            "fd00::/8".parse().unwrap(),
        ],
        exclude_ports: vec![22],
        inbound_ports: vec![8080],
    };
    vec![
        ("inpod_v4.golden", v6.rule_set(IpFamily::V4)),
        ("inpod_v6.golden", v6.rule_set(IpFamily::V6)),
        ("inpod_dns_v4.golden", dns.rule_set(IpFamily::V4)),
        ("inpod_dns_v6.golden", dns.rule_set(IpFamily::V6)),
        (
            "inpod_bypass_inbound_v4.golden",
            bypass.rule_set(IpFamily::V4),
        ),
        (
            "inpod_bypass_inbound_v6.golden",
            bypass.rule_set(IpFamily::V6),
        ),
        ("probe_host_v4.golden", ProbeSnat::rule_set(IpFamily::V4)),
        ("probe_host_v6.golden", ProbeSnat::rule_set(IpFamily::V6)),
        ("host_capture_v4.golden", vm.rule_set(IpFamily::V4)),
        ("host_capture_v6.golden", vm.rule_set(IpFamily::V6)),
    ]
}

fn handle(ns: &Netns) -> NetnsHandle {
    NetnsHandle::open(ns.path()).unwrap()
}

/// Our part of `iptables-save` in `ns`, in the golden layout.
fn owned_view(ns: &Netns, backend: Backend, set: &RuleSet) -> String {
    let text = ns.stdout(&[&backend.save_binary(set.family)]).unwrap();
    SavedTables::parse(&text).unwrap().owned_view(set)
}

fn full_save(ns: &Netns, backend: Backend, family: IpFamily) -> String {
    ns.stdout(&[&backend.save_binary(family)]).unwrap()
}

/// Runs `args` with the backend's `iptables`/`ip6tables` binary inside `ns`.
/// Runs a command line (split on whitespace) inside `ns`; returns its stdout.
fn sh(ns: &Netns, line: &str) -> String {
    let argv: Vec<&str> = line.split_whitespace().collect();
    ns.stdout(&argv).unwrap()
}

/// Runs `args` with the backend's `iptables`/`ip6tables` binary inside `ns`.
fn ipt(ns: &Netns, backend: Backend, family: IpFamily, args: &str) {
    let bin = match family {
        IpFamily::V4 => "iptables",
        IpFamily::V6 => "ip6tables",
    };
    sh(ns, &format!("{bin}-{backend} {args}"));
}

/// Runs a fallible job inside `ns` (on its own thread) and unwraps both layers.
fn inside<R: Send, E: std::fmt::Debug + Send>(
    ns: &Netns,
    job: impl FnOnce() -> Result<R, E> + Send,
) -> R {
    handle(ns).run(job).unwrap().unwrap()
}

fn apply(ns: &Netns, backend: Backend, set: &RuleSet) -> bool {
    inside(ns, || iptables::apply(backend, set))
}

fn check(ns: &Netns, backend: Backend, set: &RuleSet) -> CheckResult {
    inside(ns, || iptables::check(backend, set))
}

#[test]
fn rendered_rule_sets_match_golden_files() {
    for (name, set) in variants() {
        assert_golden(name, &set.render());
    }
}

#[test]
fn applied_rules_read_back_as_the_golden_files_on_both_backends() {
    if !test_support::can_run_root_tests() {
        return;
    }
    for backend in BACKENDS {
        for (name, set) in variants()
            .into_iter()
            .filter(|(n, _)| n.starts_with("inpod"))
        {
            let ns = Netns::new(&format!("rg{}", &backend.name()[..1])).unwrap();
            assert!(
                apply(&ns, backend, &set),
                "{backend} {name}: first apply changes"
            );
            assert_eq!(
                owned_view(&ns, backend, &set),
                set.render(),
                "{backend} {name}"
            );
            assert_golden(name, &owned_view(&ns, backend, &set));
            assert_eq!(
                check(&ns, backend, &set),
                CheckResult::Ok,
                "{backend} {name}"
            );
            assert!(
                !apply(&ns, backend, &set),
                "{backend} {name}: second apply is a no-op"
            );
        }
    }
}

#[test]
fn check_reports_missing_partial_and_foreign() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let node = Node::new("rc", 202).unwrap();
    let pod = node.add_pod("rc", "p").unwrap();
    for backend in BACKENDS {
        let set = InpodRules::default().rule_set(IpFamily::V4);
        assert_eq!(
            check(&pod.ns, backend, &set),
            CheckResult::Missing,
            "{backend}"
        );
        apply(&pod.ns, backend, &set);

        ipt(
            &pod.ns,
            backend,
            IpFamily::V4,
            "-t nat -D ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT",
        );
        assert!(
            matches!(check(&pod.ns, backend, &set), CheckResult::Partial(_)),
            "{backend}: deleted rule"
        );
        apply(&pod.ns, backend, &set);

        ipt(
            &pod.ns,
            backend,
            IpFamily::V4,
            "-t mangle -D PREROUTING -j ISTIO_PRERT",
        );
        assert!(
            matches!(check(&pod.ns, backend, &set), CheckResult::Partial(_)),
            "{backend}: deleted jump"
        );
        apply(&pod.ns, backend, &set);

        ipt(
            &pod.ns,
            backend,
            IpFamily::V4,
            "-t nat -A ISTIO_OUTPUT -p udp -j ACCEPT",
        );
        assert!(
            matches!(check(&pod.ns, backend, &set), CheckResult::Foreign(_)),
            "{backend}: extra rule"
        );
        apply(&pod.ns, backend, &set);

        ipt(
            &pod.ns,
            backend,
            IpFamily::V4,
            "-t nat -I OUTPUT -j ISTIO_OUTPUT",
        );
        assert!(
            matches!(check(&pod.ns, backend, &set), CheckResult::Foreign(_)),
            "{backend}: second jump"
        );
        apply(&pod.ns, backend, &set);
        assert_eq!(check(&pod.ns, backend, &set), CheckResult::Ok, "{backend}");

        inside(&pod.ns, || iptables::remove(backend, &set));
    }
}

#[test]
fn repair_fixes_drift_in_one_transaction_with_exactly_one_jump() {
    if !test_support::can_run_root_tests() {
        return;
    }
    for backend in BACKENDS {
        let ns = Netns::new(&format!("rr{}", &backend.name()[..1])).unwrap();
        let dns = InpodRules {
            dns_capture: true,
            ..Default::default()
        }
        .rule_set(IpFamily::V4);
        apply(&ns, backend, &dns);
        // Drift: duplicate jumps, a foreign jump, a lost rule, a foreign rule.
        for table in ["mangle", "nat"] {
            ipt(
                &ns,
                backend,
                IpFamily::V4,
                &format!("-t {table} -A OUTPUT -j ISTIO_OUTPUT"),
            );
            ipt(
                &ns,
                backend,
                IpFamily::V4,
                &format!("-t {table} -A PREROUTING -j ISTIO_PRERT"),
            );
        }
        ipt(
            &ns,
            backend,
            IpFamily::V4,
            "-t mangle -A FORWARD -p tcp -j ISTIO_OUTPUT",
        );
        ipt(&ns, backend, IpFamily::V4, "-t nat -F ISTIO_PRERT");
        ipt(
            &ns,
            backend,
            IpFamily::V4,
            "-t mangle -A ISTIO_OUTPUT -j RETURN",
        );
        // And DNS capture turned off: the raw chains must go in the same repair.
        let set = InpodRules::default().rule_set(IpFamily::V4);
        assert!(apply(&ns, backend, &set));
        assert_eq!(check(&ns, backend, &set), CheckResult::Ok, "{backend}");
        let save = full_save(&ns, backend, IpFamily::V4);
        assert_eq!(
            save.matches("-A OUTPUT -j ISTIO_OUTPUT\n").count(),
            2,
            "{backend}: one per table\n{save}"
        );
        assert_eq!(
            save.matches("-A PREROUTING -j ISTIO_PRERT\n").count(),
            2,
            "{backend}\n{save}"
        );
        assert!(
            !save.contains("FORWARD -p tcp -j ISTIO_OUTPUT"),
            "{backend}\n{save}"
        );
        assert!(
            !save.contains("*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:ISTIO"),
            "{backend}\n{save}"
        );
        assert_golden("inpod_v4.golden", &owned_view(&ns, backend, &set));
    }
}

#[test]
fn remove_deletes_only_our_jumps_and_chains() {
    if !test_support::can_run_root_tests() {
        return;
    }
    for backend in BACKENDS {
        let ns = Netns::new(&format!("rm{}", &backend.name()[..1])).unwrap();
        let rules = InpodRules {
            ipv6: true,
            dns_capture: true,
            ..Default::default()
        };
        for family in rules.families() {
            ipt(&ns, backend, family, "-t nat -A OUTPUT -p udp -j ACCEPT");
            ipt(&ns, backend, family, "-t mangle -N OTHER_CHAIN");
        }
        let mode = Mode::Iptables(backend);
        inside(&ns, || enable_inpod(mode, &rules));
        let status = inside(&ns, || check_inpod(mode, &rules));
        assert!(status.is_ok(), "{backend}: {status:?}");
        inside(&ns, || disable_inpod(mode, &rules));
        for family in rules.families() {
            let save = full_save(&ns, backend, family);
            assert!(!save.contains("ISTIO"), "{backend} {family}:\n{save}");
            assert!(
                save.contains("-A OUTPUT -p udp -j ACCEPT"),
                "{backend} {family}:\n{save}"
            );
            assert!(save.contains(":OTHER_CHAIN"), "{backend} {family}:\n{save}");
        }
        // Removing again is a no-op, not an error.
        inside(&ns, || disable_inpod(mode, &rules));
    }
}

#[test]
fn fresh_enable_on_a_programmed_netns_converges_without_doubling() {
    if !test_support::can_run_root_tests() {
        return;
    }
    for backend in BACKENDS {
        let ns = Netns::new(&format!("fr{}", &backend.name()[..1])).unwrap();
        let rules = InpodRules {
            ipv6: true,
            dns_capture: true,
            ..Default::default()
        };
        let mode = Mode::Iptables(backend);
        // Fresh: written without a save first, verified by one.
        assert!(inside(&ns, || enable_fresh_inpod(mode, &rules)));
        let golden: Vec<String> = rules
            .rule_sets()
            .iter()
            .map(|set| owned_view(&ns, backend, set))
            .collect();
        // A retried CNI ADD: the netns already holds our rules, and some drift.
        ipt(&ns, backend, IpFamily::V4, "-t nat -D ISTIO_OUTPUT 1");
        assert!(inside(&ns, || enable_fresh_inpod(mode, &rules)));
        let again: Vec<String> = rules
            .rule_sets()
            .iter()
            .map(|set| owned_view(&ns, backend, set))
            .collect();
        assert_eq!(again, golden, "{backend}");
        assert!(
            inside(&ns, || check_inpod(mode, &rules)).is_ok(),
            "{backend}"
        );
    }
}

#[test]
fn policy_routing_is_added_idempotently_and_removed() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let node = Node::new("rn", 203).unwrap();
    let pod = node.add_pod("rn", "p").unwrap();
    let families = [IpFamily::V4, IpFamily::V6];
    let routing = PolicyRouting::default();
    inside(&pod.ns, || routing.add(&families));
    inside(&pod.ns, || routing.add(&families));
    for (v, family) in [("-4", IpFamily::V4), ("-6", IpFamily::V6)] {
        let rules = sh(&pod.ns, &format!("ip {v} rule"));
        let rule = "32764:\tfrom all fwmark 0x111/0xfff lookup 100";
        assert_eq!(rules.matches(rule).count(), 1, "{rules}");
        let routes = sh(&pod.ns, &format!("ip {v} route show table 100"));
        assert_eq!(
            routes.matches("local default dev lo").count(),
            1,
            "{routes}"
        );
        let state = inside(&pod.ns, || routing.state(family));
        assert!(state.rule && state.route, "{family}: {state:?}");
    }
    inside(&pod.ns, || routing.remove(&families));
    inside(&pod.ns, || routing.remove(&families));
    for v in ["-4", "-6"] {
        assert!(!sh(&pod.ns, &format!("ip {v} rule")).contains("fwmark 0x111"));
        assert_eq!(
            sh(&pod.ns, &format!("ip {v} route show table 100")).trim(),
            ""
        );
    }
}

#[tokio::test]
async fn redirector_programs_a_pod_from_async_code() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let node = Node::new("ra", 204).unwrap();
    let pod = node.add_pod("ra", "p").unwrap();
    let ns = handle(&pod.ns);
    let redirector = Redirector::new(Mode::Iptables(Backend::Nft));
    let rules = InpodRules::default();
    assert!(!redirector.check(&ns, &rules).await.unwrap().is_ok());
    assert!(redirector.enable(&ns, &rules).await.unwrap());
    assert!(
        !redirector.enable(&ns, &rules).await.unwrap(),
        "second enable changes nothing"
    );
    assert!(redirector.check(&ns, &rules).await.unwrap().is_ok());
    assert_golden(
        "inpod_v4.golden",
        &owned_view(&pod.ns, Backend::Nft, &rules.rule_set(IpFamily::V4)),
    );
    redirector.disable(&ns, &rules).await.unwrap();
    let status = redirector.check(&ns, &rules).await.unwrap();
    assert_eq!(status.rules, CheckResult::Missing);
    assert!(!status.routing);
}

#[test]
fn probe_snat_sets_and_rules_in_a_node_netns() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let node = Node::new("rp", 207).unwrap();
    let ip4: IpAddr = "10.244.207.10".parse().unwrap();
    let ip6: IpAddr = "fd00:10:244::a".parse().unwrap();
    for backend in BACKENDS {
        let probe = ProbeSnat::new(Mode::Iptables(backend), true);
        inside(&node.ns, || probe.install());
        inside(&node.ns, || probe.install());
        assert!(inside(&node.ns, || probe.check()).is_ok());
        for (name, family) in [
            ("probe_host_v4.golden", IpFamily::V4),
            ("probe_host_v6.golden", IpFamily::V6),
        ] {
            assert_golden(
                name,
                &owned_view(&node.ns, backend, &ProbeSnat::rule_set(family)),
            );
        }
        assert!(inside(&node.ns, || probe.add_pod(ip4, "uid-a")));
        assert!(inside(&node.ns, || probe.add_pod(ip6, "uid-a")));
        let listed = node
            .ns
            .stdout(&["ipset", "list", "istio-inpod-probes-v4"])
            .unwrap();
        assert!(
            listed.contains("10.244.207.10 comment \"uid-a\""),
            "{listed}"
        );
        inside(&node.ns, || probe.remove_pod(ip4));
        inside(&node.ns, || probe.remove_pod(ip4));
        assert!(inside(&node.ns, || probe.members(IpFamily::V4)).is_empty());
        assert_eq!(inside(&node.ns, || probe.remove_pod_uid("uid-a")), [ip6]);

        inside(&node.ns, || probe.uninstall());
        inside(&node.ns, || probe.uninstall());
        for family in [IpFamily::V4, IpFamily::V6] {
            let save = full_save(&node.ns, backend, family);
            assert!(
                !save.contains("ISTIO_POSTRT"),
                "{backend} {family}:\n{save}"
            );
        }
        let sets = node.ns.stdout(&["ipset", "list", "-name"]).unwrap();
        assert!(!sets.contains("istio-inpod-probes"), "{sets}");
    }
}

#[test]
fn backend_detection_is_consistent_and_follows_the_rules_present() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let detect = |ns: &Netns| handle(ns).run(Backend::detect).unwrap();
    let empty = Netns::new("rbe").unwrap();
    assert_eq!(detect(&empty), Backend::Nft, "no rules: nft");
    assert_eq!(detect(&empty), detect(&empty));

    let legacy = Netns::new("rbl").unwrap();
    sh(&legacy, "iptables-legacy -t nat -A OUTPUT -p udp -j ACCEPT");
    assert_eq!(detect(&legacy), Backend::Legacy, "only legacy has rules");

    let hinted = Netns::new("rbh").unwrap();
    sh(&hinted, "iptables-legacy -t nat -A OUTPUT -p udp -j ACCEPT");
    sh(&hinted, "iptables-legacy -t nat -A OUTPUT -p tcp -j ACCEPT");
    sh(&hinted, "iptables-nft -t mangle -N KUBE-IPTABLES-HINT");
    assert_eq!(detect(&hinted), Backend::Nft, "kubelet's hint chain wins");
}
