use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::*;
use crate::model::{build, Options};
use mesh_model::{ConnectionAttrs, Denied};
use shared_types::identity::Identity;

const ROOT: &str = "istio-system";

/// A PeerAuthentication: `created` orders policies (seconds past 2024-01-01T00:00).
fn pa(ns: &str, name: &str, created: u32, spec: &str) -> PeerAuthn {
    let y = format!(
        "apiVersion: security.istio.io/v1beta1\nkind: PeerAuthentication\n\
         metadata: {{name: {name}, namespace: {ns}, creationTimestamp: \"2024-01-01T00:{:02}:{:02}Z\"}}\n\
         spec: {spec}\n",
        created / 60,
        created % 60
    );
    let obj: DynamicObject = serde_yaml::from_str(&y).unwrap();
    parse(&obj).unwrap()
}

fn strict(ns: &str, name: &str, created: u32) -> PeerAuthn {
    pa(ns, name, created, "{mtls: {mode: STRICT}}")
}

fn set(all: Vec<PeerAuthn>) -> PeerAuthentications {
    PeerAuthentications::new(all, ROOT)
}

fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn web() -> BTreeMap<String, String> {
    labels(&[("app", "web")])
}

fn conn(identity: bool, port: u16) -> ConnectionAttrs {
    ConnectionAttrs {
        src_identity: identity.then(|| Identity::new("cluster.local", "app", "client")),
        src_ip: "10.0.0.9".parse().unwrap(),
        dst: format!("10.0.0.5:{port}").parse().unwrap(),
    }
}

#[test]
fn parses_modes_selectors_and_ports() {
    let p = pa(
        "app",
        "p",
        0,
        "{selector: {matchLabels: {app: web}}, mtls: {mode: PERMISSIVE}, \
          portLevelMtls: {\"8080\": {mode: STRICT}, \"9090\": {mode: UNSET}, \"7000\": {}}}",
    );
    assert_eq!(p.mode, Mode::Permissive);
    assert_eq!(p.ports, BTreeMap::from([(8080, Mode::Strict)]));
    assert_eq!(pa("app", "p", 0, "{}").mode, Mode::Unset);
    assert_eq!(pa("app", "p", 0, "null").mode, Mode::Unset);
    assert_eq!(
        pa("app", "p", 0, "{mtls: {mode: DISABLE}}").mode,
        Mode::Disable
    );
    let bad = |spec: &str| {
        let y = format!("metadata: {{name: p, namespace: app}}\nspec: {spec}\n");
        parse(&serde_yaml::from_str::<DynamicObject>(&y).unwrap()).unwrap_err()
    };
    assert!(bad("{mtls: {mode: MAYBE}}").contains("MAYBE"));
    assert!(bad("{portLevelMtls: {http: {mode: STRICT}}}").contains("http"));
    assert!(bad("{portLevelMtls: {\"0\": {mode: STRICT}}}").contains("0"));
}

#[test]
fn no_policy_is_permissive_and_publishes_nothing() {
    let none = set(vec![]);
    assert!(none.is_empty());
    assert_eq!(none.effective("app", &web()), Effective::Permissive);
}

#[test]
fn mesh_namespace_workload_inheritance() {
    // Mesh-wide STRICT applies everywhere.
    let mesh = strict(ROOT, "default", 0);
    assert_eq!(
        set(vec![mesh.clone()]).effective("app", &web()),
        Effective::Strict
    );
    assert_eq!(
        set(vec![mesh.clone()]).effective(ROOT, &web()),
        Effective::Strict
    );

    // A namespace policy overrides it, in its namespace only; UNSET inherits.
    let ns_permissive = pa("app", "ns", 1, "{mtls: {mode: PERMISSIVE}}");
    let s = set(vec![mesh.clone(), ns_permissive.clone()]);
    assert_eq!(s.effective("app", &web()), Effective::Permissive);
    assert_eq!(s.effective("other", &web()), Effective::Strict);
    let ns_unset = pa("app", "ns", 1, "{}");
    assert_eq!(
        set(vec![mesh.clone(), ns_unset]).effective("app", &web()),
        Effective::Strict
    );
    let ns_disable = pa("app", "ns", 1, "{mtls: {mode: DISABLE}}");
    assert_eq!(
        set(vec![mesh.clone(), ns_disable]).effective("app", &web()),
        Effective::Permissive,
        "DISABLE is PERMISSIVE for ztunnel"
    );

    // A workload policy overrides both, for the pods it selects.
    let wl_strict = pa(
        "app",
        "wl",
        2,
        "{selector: {matchLabels: {app: web}}, mtls: {mode: STRICT}}",
    );
    let s = set(vec![mesh.clone(), ns_permissive.clone(), wl_strict]);
    assert_eq!(s.effective("app", &web()), Effective::Strict);
    assert_eq!(
        s.effective("app", &labels(&[("app", "db")])),
        Effective::Permissive
    );
    let wl_permissive = pa(
        "app",
        "wl",
        2,
        "{selector: {matchLabels: {app: web}}, mtls: {mode: PERMISSIVE}}",
    );
    let s = set(vec![mesh.clone(), wl_permissive]);
    assert_eq!(s.effective("app", &web()), Effective::Permissive);
    assert_eq!(s.effective("app", &BTreeMap::new()), Effective::Strict);
    let wl_unset = pa("app", "wl", 2, "{selector: {matchLabels: {app: web}}}");
    assert_eq!(
        set(vec![mesh.clone(), wl_unset]).effective("app", &web()),
        Effective::Strict
    );

    // A namespace STRICT without a mesh policy.
    let s = set(vec![strict("app", "ns", 0)]);
    assert_eq!(s.effective("app", &BTreeMap::new()), Effective::Strict);
    assert_eq!(
        s.effective("other", &BTreeMap::new()),
        Effective::Permissive
    );
}

#[test]
fn selectors_apply_in_their_own_namespace_only() {
    // A selector policy elsewhere does not select pods of "app".
    let other = pa(
        "other",
        "wl",
        0,
        "{selector: {matchLabels: {app: web}}, mtls: {mode: STRICT}}",
    );
    assert_eq!(
        set(vec![other]).effective("app", &web()),
        Effective::Permissive
    );
    // istiod ignores selector policies in the root namespace for ztunnel.
    let root_sel = pa(
        ROOT,
        "wl",
        0,
        "{selector: {matchLabels: {app: web}}, mtls: {mode: STRICT}}",
    );
    let s = set(vec![root_sel]);
    assert_eq!(s.effective("app", &web()), Effective::Permissive);
    assert_eq!(s.effective(ROOT, &web()), Effective::Permissive);
    // An empty selector is namespace-wide.
    let empty = pa("app", "all", 0, "{selector: {}, mtls: {mode: STRICT}}");
    assert_eq!(
        set(vec![empty]).effective("app", &BTreeMap::new()),
        Effective::Strict
    );
}

#[test]
fn the_oldest_policy_wins_at_each_level() {
    let older = pa("app", "b-older", 1, "{mtls: {mode: STRICT}}");
    let newer = pa("app", "a-newer", 5, "{mtls: {mode: PERMISSIVE}}");
    assert_eq!(
        set(vec![newer.clone(), older.clone()]).effective("app", &web()),
        Effective::Strict
    );
    let older_wl = pa(
        "app",
        "z",
        1,
        "{selector: {matchLabels: {app: web}}, mtls: {mode: PERMISSIVE}}",
    );
    let newer_wl = pa(
        "app",
        "a",
        9,
        "{selector: {matchLabels: {tier: front}}, mtls: {mode: STRICT}}",
    );
    let both = labels(&[("app", "web"), ("tier", "front")]);
    assert_eq!(
        set(vec![newer_wl, older_wl, older]).effective("app", &both),
        Effective::Permissive
    );
    // Same creation time: by name.
    let a = pa(ROOT, "a", 3, "{mtls: {mode: PERMISSIVE}}");
    let b = pa(ROOT, "b", 3, "{mtls: {mode: STRICT}}");
    assert_eq!(
        set(vec![b, a]).effective("app", &web()),
        Effective::Permissive
    );
}

#[test]
fn port_level_exceptions_convert_to_a_workload_policy() {
    // STRICT with one PERMISSIVE port: plaintext refused except on 8080.
    let p = pa(
        "app",
        "web",
        0,
        "{selector: {matchLabels: {app: web}}, mtls: {mode: STRICT}, \
          portLevelMtls: {\"8080\": {mode: PERMISSIVE}, \"9090\": {mode: STRICT}}}",
    );
    let Effective::Ports(policy) = set(vec![p]).effective("app", &web()) else {
        panic!("expected a port-level policy");
    };
    assert_eq!(policy.key(), "app/converted_peer_authentication_web");
    assert_eq!(
        (policy.scope, policy.action),
        (Scope::WorkloadSelector, Action::Deny)
    );
    assert!(!policy.matches(&conn(false, 8080)), "8080 stays permissive");
    assert!(policy.matches(&conn(false, 9090)));
    assert!(policy.matches(&conn(false, 80)));
    assert!(!policy.matches(&conn(true, 80)), "mTLS is never refused");

    // Inherited STRICT (namespace) with an exception, and UNSET at the workload.
    let ns = strict("app", "ns", 0);
    let wl = pa(
        "app",
        "web",
        1,
        "{selector: {matchLabels: {app: web}}, portLevelMtls: {\"8080\": {mode: DISABLE}}}",
    );
    let Effective::Ports(policy) = set(vec![ns, wl]).effective("app", &web()) else {
        panic!("expected a port-level policy");
    };
    assert!(!policy.matches(&conn(false, 8080)));
    assert!(policy.matches(&conn(false, 81)));

    // PERMISSIVE (default) with one STRICT port: refused on that port only.
    let wl = pa(
        "app",
        "web",
        0,
        "{selector: {matchLabels: {app: web}}, portLevelMtls: {\"9090\": {mode: STRICT}}}",
    );
    let Effective::Ports(policy) = set(vec![wl]).effective("app", &web()) else {
        panic!("expected a port-level policy");
    };
    assert!(policy.matches(&conn(false, 9090)));
    assert!(!policy.matches(&conn(false, 8080)));
    assert!(!policy.matches(&conn(true, 9090)));

    // Port modes equal to the workload's change nothing.
    let same = pa(
        "app",
        "web",
        0,
        "{selector: {matchLabels: {app: web}}, mtls: {mode: STRICT}, \
          portLevelMtls: {\"9090\": {mode: STRICT}}}",
    );
    assert_eq!(set(vec![same]).effective("app", &web()), Effective::Strict);
}

#[test]
fn the_static_policy_refuses_plaintext_only() {
    let s = set(vec![strict(ROOT, "default", 0)]);
    let p = s.static_strict();
    assert_eq!(p.key(), "istio-system/istio_converted_static_strict");
    assert_eq!((p.scope, p.action), (Scope::WorkloadSelector, Action::Deny));
    assert!(p.matches(&conn(false, 8080)));
    assert!(!p.matches(&conn(true, 8080)));
}

fn pod(ns: &str, name: &str, ip: &str, labels: &str) -> Arc<Pod> {
    let y = format!(
        "metadata: {{name: {name}, namespace: {ns}, labels: {labels}, \
           annotations: {{ambient.istio.io/redirection: enabled}}}}\n\
         status: {{phase: Running, podIP: {ip}, conditions: [{{type: Ready, status: \"True\"}}]}}\n"
    );
    Arc::new(serde_yaml::from_str(&y).unwrap())
}

#[test]
fn build_lists_the_strict_policy_and_authorization_refuses_plaintext() {
    let opts = Options::default();
    let pods = vec![
        pod("app", "web", "10.0.0.5", "{app: web}"),
        pod("app", "db", "10.0.0.6", "{app: db}"),
        pod("legacy", "old", "10.0.0.7", "{}"),
        pod("app", "nolabels", "10.0.0.8", "null"),
    ];
    let pas = set(vec![
        strict(ROOT, "default", 0),
        pa("legacy", "ns", 1, "{mtls: {mode: PERMISSIVE}}"),
        pa(
            "app",
            "db",
            2,
            "{selector: {matchLabels: {app: db}}, portLevelMtls: {\"5432\": {mode: PERMISSIVE}}}",
        ),
    ]);
    let built = build(&pods, &[], &Default::default(), &[], &pas, &opts);
    let by_name = |n: &str| built.workloads.iter().find(|w| w.name == n).unwrap();
    assert_eq!(
        by_name("web").authorization_policies,
        ["istio-system/istio_converted_static_strict"]
    );
    assert_eq!(
        by_name("nolabels").authorization_policies,
        ["istio-system/istio_converted_static_strict"]
    );
    assert_eq!(
        by_name("db").authorization_policies,
        ["app/converted_peer_authentication_db"]
    );
    assert!(by_name("old").authorization_policies.is_empty());
    let keys: Vec<String> = built.policies.iter().map(|p| p.key()).collect();
    assert_eq!(
        keys,
        [
            "app/converted_peer_authentication_db",
            "istio-system/istio_converted_static_strict"
        ]
    );

    assert_eq!(Denied::NoAllowMatch.reason(), "policy_denied");
}
