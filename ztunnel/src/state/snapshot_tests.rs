//! Tests for indexing, endpoint resolution and the multi-policy decision.

use std::collections::HashMap;

use super::*;
use crate::identity::Identity;
use crate::state::policy::{RbacMatch, StringMatch};
use crate::state::service::{Endpoint, LoadBalancer, LoadBalancerHealthPolicy};
use crate::state::workload::{HealthStatus, Protocol};

const SVC: &str = "ns/svc.ns.svc.cluster.local";

fn wl(uid: &str, ns: &str, ip: &str) -> Workload {
    Workload {
        uid: uid.into(),
        name: uid.into(),
        namespace: ns.into(),
        workload_ips: vec![ip.parse().unwrap()],
        ..Default::default()
    }
}

fn backing(mut w: Workload, ports: &[(u16, u16)]) -> Workload {
    w.services
        .insert(SVC.into(), ports.iter().copied().collect());
    w
}

fn svc(ports: &[(u16, u16)]) -> Service {
    Service {
        name: "svc".into(),
        namespace: "ns".into(),
        hostname: "svc.ns.svc.cluster.local".into(),
        vips: vec!["/10.96.0.10".parse().unwrap()],
        ports: ports.iter().copied().collect(),
        ..Default::default()
    }
}

#[test]
fn endpoints_map_target_ports_and_skip_unhealthy() {
    let mut s = ProxyState::new();
    // Own mapping wins.
    s.insert_workload(backing(wl("a", "ns", "10.0.0.1"), &[(80, 9000)]));
    // No own mapping for 80: the service's.
    s.insert_workload(backing(wl("b", "ns", "10.0.0.2"), &[(443, 8443)]));
    // Unhealthy: skipped.
    let mut c = backing(wl("c", "ns", "10.0.0.3"), &[(80, 9000)]);
    c.status = HealthStatus::Unhealthy;
    s.insert_workload(c);
    // Not a backend at all.
    s.insert_workload(wl("d", "ns", "10.0.0.4"));
    let service = svc(&[(80, 8080)]);
    s.insert_service(service.clone());

    let eps: Vec<_> = s
        .service_endpoints(&service, 80)
        .into_iter()
        .map(|(w, p)| (w.uid.clone(), p))
        .collect();
    assert_eq!(eps, vec![("a".to_string(), 9000), ("b".to_string(), 8080)]);
    // Neither mapping: the service port itself.
    let eps = s.service_endpoints(&service, 7070);
    assert!(eps.iter().all(|(_, p)| *p == 7070));

    let found = s.service_by_vip("10.96.0.10".parse().unwrap()).unwrap();
    assert_eq!(found.key(), SVC);
    let (w, _) = s.pick_endpoint(&found, 80).unwrap();
    assert!(w.uid == "a" || w.uid == "b");

    // AllowAll health policy includes the unhealthy one.
    let mut lenient = service.clone();
    lenient.load_balancer = Some(LoadBalancer {
        routing_preferences: vec![],
        mode: None,
        health_policy: LoadBalancerHealthPolicy::AllowAll,
    });
    assert_eq!(s.service_endpoints(&lenient, 80).len(), 3);
}

#[test]
fn endpoints_listed_on_the_service_are_merged() {
    let mut s = ProxyState::new();
    s.insert_workload(wl("a", "ns", "10.0.0.1"));
    s.insert_workload(wl("b", "ns", "10.0.0.2"));
    let mut service = svc(&[(80, 8080)]);
    service.endpoints = HashMap::from([
        (
            "a".to_string(),
            Endpoint {
                workload_uid: "a".into(),
                port: HashMap::from([(80, 7000)]),
                status: HealthStatus::Healthy,
            },
        ),
        (
            "b".to_string(),
            Endpoint {
                workload_uid: "b".into(),
                port: HashMap::new(),
                status: HealthStatus::Unhealthy,
            },
        ),
        (
            "gone".to_string(),
            Endpoint {
                workload_uid: "gone".into(),
                port: HashMap::new(),
                status: HealthStatus::Healthy,
            },
        ),
    ]);
    let eps = s.service_endpoints(&service, 80);
    assert_eq!(eps.len(), 1);
    assert_eq!((eps[0].0.uid.as_str(), eps[0].1), ("a", 7000));
    assert!(s.pick_endpoint(&service, 80).is_some());
    service.endpoints.clear();
    assert!(s.pick_endpoint(&service, 80).is_none());
}

#[test]
fn replacing_a_workload_reindexes_it() {
    let mut s = ProxyState::new();
    s.insert_workload(backing(wl("a", "ns", "10.0.0.1"), &[]));
    s.insert_workload(wl("a", "ns", "10.0.0.9"));
    assert!(s.workload_by_ip("10.0.0.1".parse().unwrap()).is_none());
    assert_eq!(
        s.workload_by_ip("10.0.0.9".parse().unwrap()).unwrap().uid,
        "a"
    );
    assert!(s.service_endpoints(&svc(&[]), 80).is_empty());
    assert!(s.remove_workload("a").is_some());
    assert!(s.workload_by_name("ns", "a").is_none());
    assert!(s.is_empty());
}

#[test]
fn ip_conflict_prefers_pods_then_hbone() {
    let mut s = ProxyState::new();
    s.insert_workload(wl("Kubernetes//WorkloadEntry/ns/vm", "ns", "10.0.0.1"));
    let mut pod = wl("Kubernetes//Pod/ns/p", "ns", "10.0.0.1");
    pod.protocol = Protocol::Tcp;
    s.insert_workload(pod);
    let mut hbone = wl("other", "ns", "10.0.0.1");
    hbone.protocol = Protocol::Hbone;
    s.insert_workload(hbone);
    let got = s.workload_by_ip("10.0.0.1".parse().unwrap()).unwrap();
    assert_eq!(got.uid, "Kubernetes//Pod/ns/p");
}

#[test]
fn host_network_workloads_are_not_indexed_by_ip() {
    let mut s = ProxyState::new();
    let mut w = wl("h", "ns", "192.168.1.10");
    w.network_mode = crate::state::workload::NetworkMode::HostNetwork;
    s.insert_workload(w);
    assert!(s.workload_by_ip("192.168.1.10".parse().unwrap()).is_none());
    assert!(s.workload_by_uid("h").is_some());
}

#[test]
fn empty_uid_gets_istio_shaped_key() {
    let mut s = ProxyState::new();
    let mut w = wl("", "ns", "10.0.0.1");
    w.name = "p".into();
    s.insert_workload(w);
    assert!(s.workload_by_uid("Kubernetes//Pod/ns/p").is_some());
}

// ---- authorization across policies ----

fn id(ns: &str, sa: &str) -> Identity {
    Identity {
        trust_domain: "cluster.local".into(),
        namespace: ns.into(),
        service_account: sa.into(),
    }
}

fn conn(src: Option<Identity>, port: u16) -> ConnectionAttrs {
    ConnectionAttrs {
        src_identity: src,
        src_ip: "10.1.0.1".parse().unwrap(),
        dst: format!("10.0.0.1:{port}").parse().unwrap(),
    }
}

fn policy(name: &str, ns: &str, scope: Scope, action: Action, m: RbacMatch) -> Authorization {
    Authorization {
        name: name.into(),
        namespace: ns.into(),
        scope,
        action,
        rules: vec![vec![vec![m]]],
        dry_run: false,
        warnings: Vec::new(),
    }
}

fn from_ns(ns: &str) -> RbacMatch {
    RbacMatch {
        namespaces: vec![StringMatch::Exact(ns.into())],
        ..Default::default()
    }
}

fn port(p: u16) -> RbacMatch {
    RbacMatch {
        destination_ports: vec![p],
        ..Default::default()
    }
}

/// Destination: workload "dst" in namespace "app", selecting "app/selected".
fn dst() -> Workload {
    let mut w = wl("dst", "app", "10.0.0.1");
    w.authorization_policies = vec!["app/selected".into(), "app/missing".into()];
    w
}

fn decide(policies: Vec<Authorization>, c: &ConnectionAttrs) -> Result<(), Denied> {
    let mut s = ProxyState::new();
    for p in policies {
        s.insert_policy(p);
    }
    s.authorize(c, &dst())
}

#[test]
fn authorize_decision_table() {
    use Action::*;
    use Scope::*;
    let client = Some(id("client-ns", "client"));
    let other = Some(id("other-ns", "x"));
    let ok = Ok(());
    let no_allow = Err(Denied::NoAllowMatch);
    let by = |k: &str| Err(Denied::ByDeny(k.into()));

    #[allow(clippy::type_complexity)]
    let cases: Vec<(
        &str,
        Vec<Authorization>,
        ConnectionAttrs,
        Result<(), Denied>,
    )> = vec![
        ("no policies allow", vec![], conn(None, 80), ok.clone()),
        (
            "allow matches",
            vec![policy("a", "app", Namespace, Allow, from_ns("client-ns"))],
            conn(client.clone(), 80),
            ok.clone(),
        ),
        (
            "allow does not match",
            vec![policy("a", "app", Namespace, Allow, from_ns("client-ns"))],
            conn(other.clone(), 80),
            no_allow.clone(),
        ),
        (
            "allow needing identity denies plaintext",
            vec![policy("a", "app", Namespace, Allow, from_ns("client-ns"))],
            conn(None, 80),
            no_allow.clone(),
        ),
        (
            "deny beats a matching allow",
            vec![
                policy("a", "app", Namespace, Allow, from_ns("client-ns")),
                policy("d", "app", Namespace, Deny, port(80)),
            ],
            conn(client.clone(), 80),
            by("app/d"),
        ),
        (
            "non-matching deny and no allow",
            vec![policy("d", "app", Namespace, Deny, port(81))],
            conn(client.clone(), 80),
            ok.clone(),
        ),
        (
            "any one allow suffices",
            vec![
                policy("a1", "app", Namespace, Allow, from_ns("nope")),
                policy("a2", "app", Namespace, Allow, port(80)),
            ],
            conn(other.clone(), 80),
            ok.clone(),
        ),
        (
            "namespace scope of another namespace does not apply",
            vec![policy("a", "elsewhere", Namespace, Allow, from_ns("nope"))],
            conn(client.clone(), 80),
            ok.clone(),
        ),
        (
            "global scope applies everywhere",
            vec![policy("g", "istio-system", Global, Deny, port(80))],
            conn(client.clone(), 80),
            by("istio-system/g"),
        ),
        (
            "workload selector applies when listed",
            vec![policy(
                "selected",
                "app",
                WorkloadSelector,
                Allow,
                from_ns("nope"),
            )],
            conn(client.clone(), 80),
            no_allow.clone(),
        ),
        (
            "workload selector not listed does not apply",
            vec![policy(
                "unlisted",
                "app",
                WorkloadSelector,
                Allow,
                from_ns("nope"),
            )],
            conn(client.clone(), 80),
            ok.clone(),
        ),
        (
            "allow with zero rules denies everything",
            vec![Authorization {
                rules: vec![],
                ..policy("a", "app", Namespace, Allow, port(80))
            }],
            conn(client.clone(), 80),
            no_allow.clone(),
        ),
        (
            "deny with an empty rule denies everything",
            vec![Authorization {
                rules: vec![vec![]],
                ..policy("d", "app", Namespace, Deny, port(80))
            }],
            conn(None, 1),
            by("app/d"),
        ),
        (
            "deny with zero rules denies nothing",
            vec![Authorization {
                rules: vec![],
                ..policy("d", "app", Namespace, Deny, port(80))
            }],
            conn(None, 1),
            ok.clone(),
        ),
        (
            "not_principals deny rejects plaintext only",
            vec![policy(
                "d",
                "app",
                Namespace,
                Deny,
                RbacMatch {
                    not_principals: vec![StringMatch::Presence],
                    ..Default::default()
                },
            )],
            conn(None, 80),
            by("app/d"),
        ),
        (
            "not_principals deny lets mTLS through",
            vec![policy(
                "d",
                "app",
                Namespace,
                Deny,
                RbacMatch {
                    not_principals: vec![StringMatch::Presence],
                    ..Default::default()
                },
            )],
            conn(client.clone(), 80),
            ok.clone(),
        ),
        (
            "dry-run deny is not enforced",
            vec![Authorization {
                dry_run: true,
                ..policy("d", "app", Namespace, Deny, port(80))
            }],
            conn(client.clone(), 80),
            ok.clone(),
        ),
        (
            "dry-run allow does not restrict",
            vec![Authorization {
                dry_run: true,
                ..policy("a", "app", Namespace, Allow, from_ns("nope"))
            }],
            conn(client.clone(), 80),
            ok.clone(),
        ),
    ];
    for (name, policies, c, want) in cases {
        assert_eq!(decide(policies, &c), want, "{name}");
    }
}

#[test]
fn policies_for_lists_applicable_and_skips_unknown() {
    let mut s = ProxyState::new();
    s.insert_policy(policy("g", "root", Scope::Global, Action::Allow, port(1)));
    s.insert_policy(policy("n", "app", Scope::Namespace, Action::Allow, port(1)));
    s.insert_policy(policy(
        "x",
        "other",
        Scope::Namespace,
        Action::Allow,
        port(1),
    ));
    s.insert_policy(policy(
        "selected",
        "app",
        Scope::WorkloadSelector,
        Action::Allow,
        port(1),
    ));
    let keys: Vec<_> = s.policies_for(&dst()).iter().map(|p| p.key()).collect();
    assert_eq!(keys, vec!["app/n", "app/selected", "root/g"]);
    // Replacing a policy with another scope re-indexes it.
    s.insert_policy(policy(
        "n",
        "app",
        Scope::WorkloadSelector,
        Action::Allow,
        port(1),
    ));
    assert_eq!(s.policies_for(&dst()).len(), 2);
    assert!(s.remove_policy("root/g").is_some());
    assert_eq!(s.policies_for(&dst()).len(), 1);
}

#[test]
fn dump_is_sorted_and_camel_case() {
    let mut s = ProxyState::new();
    s.insert_workload(backing(wl("b", "ns", "10.0.0.2"), &[(80, 8080)]));
    s.insert_workload(wl("a", "ns", "10.0.0.1"));
    s.insert_service(svc(&[(80, 8080)]));
    s.insert_policy(policy("p", "ns", Scope::Namespace, Action::Deny, port(1)));
    let d = s.dump();
    assert_eq!(d["workloads"][0]["uid"], "a");
    assert_eq!(d["workloads"][1]["workloadIps"][0], "10.0.0.2");
    assert_eq!(d["workloads"][1]["services"][SVC]["80"], 8080);
    assert_eq!(d["services"][0]["vips"][0], "/10.96.0.10");
    assert_eq!(d["services"][0]["subjectAltNames"], serde_json::json!([]));
    assert_eq!(d["policies"][0]["action"], "Deny");
    assert_eq!(d["policies"][0]["rules"][0][0][0]["destinationPorts"][0], 1);
}
