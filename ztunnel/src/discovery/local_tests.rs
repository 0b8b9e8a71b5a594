//! Tests for the local config: Istio's fixture, errors, and the file watch.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;
use test_support::poll::eventually;

use super::*;
use crate::discovery::local_fields;
use crate::identity::Identity;
use crate::state::{ConnectionAttrs, Denied, RbacMatch, StringMatch};

const FIXTURE: &str = include_str!("../../testdata/istio-localhost.yaml");

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn conn(src: Option<(&str, &str)>, src_ip: &str, dst: &str) -> ConnectionAttrs {
    ConnectionAttrs {
        src_identity: src.map(|(ns, sa)| Identity {
            trust_domain: "cluster.local".into(),
            namespace: ns.into(),
            service_account: sa.into(),
        }),
        src_ip: ip(src_ip),
        dst: dst.parse().unwrap(),
    }
}

#[test]
fn istio_fixture_loads() {
    let state = parse_local_config(FIXTURE).unwrap();
    assert_eq!(state.counts(), (7, 3, 4));
    assert!(state.workload_by_ip(ip("127.0.0.6")).is_none()); // host network
    assert_eq!(
        state
            .workload_by_uid("Kubernetes//WorkloadEntry/external/db")
            .unwrap()
            .hostname,
        "db.example.com"
    );
    let doc: serde_yaml::Value = serde_yaml::from_str(FIXTURE).unwrap();
    assert_eq!(local_fields::unknown_fields(&doc), Vec::<String>::new());

    let server = state.workload_by_ip(ip("fd00::2")).unwrap();
    assert_eq!(server.name, "server-5c6b7d");
    assert_eq!(
        server.identity().to_uri(),
        "spiffe://cluster.local/ns/default/sa/server"
    );
    let legacy = state.workload_by_name("legacy", "legacy-tcp").unwrap();
    assert_eq!(legacy.uid, "Kubernetes//Pod/legacy/legacy-tcp");
    assert_eq!(
        legacy.identity().principal(),
        "cluster.local/ns/legacy/sa/default"
    );
    assert!(!legacy.is_hbone());

    // Service resolution: VIP on the default network, unhealthy endpoint skipped.
    let svc = state.service_by_vip(ip("10.96.0.10")).unwrap();
    let eps = state.service_endpoints(&svc, 80);
    assert_eq!(eps.len(), 1);
    assert_eq!((eps[0].0.name.as_str(), eps[0].1), ("server-5c6b7d", 8080));
    // A VIP on a named network, and endpoints listed on the service itself.
    let legacy_svc = state.service_by_vip(ip("10.0.0.1")).unwrap();
    assert_eq!(legacy_svc.name, "legacy");
    let wp = state.service_by_vip(ip("10.96.0.30")).unwrap();
    assert_eq!(state.service_endpoints(&wp, 15008)[0].0.name, "waypoint-0");

    // The fixture's policies, end to end.
    let cases = [
        (
            conn(Some(("default", "client")), "127.0.0.1", "127.0.0.2:8080"),
            Ok(()),
        ),
        (
            conn(Some(("trusted", "x")), "127.0.0.1", "127.0.0.2:8443"),
            Ok(()),
        ),
        (
            conn(Some(("trusted", "x")), "127.0.0.1", "127.0.0.2:9999"),
            Err(Denied::NoAllowMatch),
        ),
        (
            conn(Some(("default", "other")), "127.0.0.1", "127.0.0.2:8080"),
            Err(Denied::NoAllowMatch),
        ),
        (
            conn(None, "10.1.1.1", "127.0.0.2:8080"),
            Err(Denied::ByDeny("default/deny-plaintext".into())),
        ),
        (
            conn(None, "127.0.0.9", "127.0.0.2:8080"),
            Err(Denied::NoAllowMatch),
        ),
    ];
    for (c, want) in cases {
        assert_eq!(state.authorize(&c, &server), want, "{c}");
    }
    // The Global DENY applies in every namespace, minus its not* exceptions.
    let attacker = |dst: &str| conn(Some(("evil-blocked", "attacker")), "10.244.1.1", dst);
    assert_eq!(
        state.authorize(&attacker("127.0.0.2:8080"), &server),
        Err(Denied::ByDeny("istio-system/deny-blocked".into()))
    );
    let p = state.policy("istio-system/deny-blocked").unwrap();
    assert_eq!(
        p.rules[0][0][0].namespaces,
        vec![StringMatch::Suffix("-blocked".into())]
    );
    // notDestinationIps exempts the legacy workload; its dry-run ALLOW restricts nothing.
    assert!(state
        .authorize(&attacker("127.0.0.4:9000"), &legacy)
        .is_ok());
    assert!(state
        .authorize(&conn(None, "1.1.1.1", "127.0.0.4:9000"), &legacy)
        .is_ok());
}

#[test]
fn empty_and_null_sections_are_empty() {
    for yaml in [
        "",
        "# nothing\n",
        "workloads:\nservices: ~\npolicies: []\n",
        "{}",
    ] {
        assert!(parse_local_config(yaml).unwrap().is_empty(), "{yaml:?}");
    }
}

#[test]
fn yaml_errors_carry_location_and_field_path() {
    let yaml = "workloads:\n- name: a\n  namespace: n\n  workloadIps: [not-an-ip]\n";
    match parse_local_config(yaml).unwrap_err() {
        DiscoveryError::Yaml { line, message, .. } => {
            assert_eq!(line, Some(4));
            assert!(message.contains("workloads[0].workloadIps[0]"), "{message}");
        }
        e => panic!("unexpected {e}"),
    }
    let err = parse_local_config("workloads: [\n").unwrap_err();
    assert!(
        matches!(err, DiscoveryError::Yaml { line: Some(_), .. }),
        "{err}"
    );

    let yaml = "policies:\n- name: p\n  scope: Global\n  action: Deny\n  rules:\n  - - - sourceIps: [10.0.0.0/40]\n";
    let err = parse_local_config(yaml).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("invalid CIDR \"10.0.0.0/40\""), "{msg}");
    assert!(
        matches!(err, DiscoveryError::Yaml { line: Some(6), .. }),
        "{msg}"
    );

    let err =
        parse_local_config("policies:\n- name: p\n  scope: Cluster\n  action: Deny\n").unwrap_err();
    assert!(err.to_string().contains("Cluster"), "{err}");
    let err = parse_local_config("services:\n- hostname: h\n  namespace: n\n  vips: [/1.2.3]\n")
        .unwrap_err();
    assert!(err.to_string().contains("/1.2.3"), "{err}");
}

#[test]
fn semantic_errors_name_the_entry() {
    let err = parse_local_config("workloads:\n- name: a\n  workloadIps: [10.0.0.1]\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid local config: workloads[0] (a): namespace is required"
    );
    let err = parse_local_config(
        "workloads:\n- name: a\n  namespace: n\n  services:\n    nohost: {80: 80}\n",
    )
    .unwrap_err();
    assert!(matches!(err, DiscoveryError::Invalid(_)), "{err}");
    assert!(err.to_string().contains("nohost"), "{err}");
    let err = parse_local_config("services:\n- name: s\n  namespace: n\n").unwrap_err();
    assert!(err.to_string().contains("services[0] (s)"), "{err}");
}

#[test]
fn unknown_fields_are_reported_not_fatal() {
    let yaml = "workloads:\n- namespace: n\n  serviceAcount: x\nextra: 1\npolicies:\n\
                - name: p\n  scope: Global\n  action: Allow\n  rules: [[[{fromNamespaces: [a]}]]]\n";
    let doc: serde_yaml::Value = serde_yaml::from_str(yaml).unwrap();
    assert_eq!(
        local_fields::unknown_fields(&doc),
        vec![
            "extra".to_string(),
            "workloads[0].serviceAcount".to_string(),
            "policies[0].rules[0][0][0].fromNamespaces".to_string(),
        ]
    );
    let state = parse_local_config(yaml).unwrap();
    assert_eq!(state.counts(), (1, 0, 1));
}

fn keys(v: impl serde::Serialize) -> BTreeSet<String> {
    let v = serde_yaml::to_value(v).unwrap();
    v.as_mapping()
        .unwrap()
        .keys()
        .map(|k| k.as_str().unwrap().to_string())
        .collect()
}

fn set(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn known_field_lists_match_the_structs() {
    // The fixture sets every field; parsing then serializing it must produce exactly
    // the keys listed as known.
    let doc: serde_yaml::Value = serde_yaml::from_str(FIXTURE).unwrap();
    let cfg: LocalConfig = serde_yaml::from_value(doc).unwrap();
    let all = |sets: Vec<BTreeSet<String>>| sets.into_iter().flatten().collect::<BTreeSet<_>>();
    assert_eq!(
        all(cfg.workloads.iter().map(keys).collect()),
        set(local_fields::WORKLOAD)
    );
    // Istio's fixture has every Istio field; our extensions are checked below.
    let istio_service_fields = &set(local_fields::SERVICE) - &set(local_fields::SERVICE_EXTENSIONS);
    assert_eq!(
        all(cfg.services.iter().map(keys).collect()),
        istio_service_fields
    );
    let extended: serde_yaml::Value = serde_yaml::from_str(
        "{name: s, namespace: n, hostname: s.n.svc.cluster.local, appProtocols: {80: HTTP11, 81: GRPC}}",
    )
    .unwrap();
    let service: crate::state::Service = serde_yaml::from_value(extended).unwrap();
    assert_eq!(
        keys(&service)
            .into_iter()
            .filter(|k| local_fields::SERVICE_EXTENSIONS.contains(&k.as_str()))
            .count(),
        1
    );
    assert_eq!(service.app_protocols.len(), 2);
    assert_eq!(
        all(cfg.policies.iter().map(keys).collect()),
        set(local_fields::POLICY)
    );
    let matches: Vec<&RbacMatch> = cfg
        .policies
        .iter()
        .flat_map(|p| p.rules.iter().flatten().flatten())
        .collect();
    assert_eq!(
        all(matches.into_iter().map(keys).collect()),
        set(local_fields::MATCH)
    );
}

// ---- watching ----

fn workload_yaml(name: &str, ip: &str) -> String {
    format!("workloads:\n- name: {name}\n  namespace: ns\n  workloadIps: [{ip}]\n")
}

fn has(store: &StateStore, name: &str) -> bool {
    store.workload_by_name("ns", name).is_some()
}

/// Replace the file the way editors do: write a temp file, rename it over.
fn atomic_write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test]
async fn watch_reloads_valid_and_keeps_last_good_on_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, workload_yaml("a", "10.0.0.1")).unwrap();
    let store = StateStore::new();
    let (reloads, errors) = (Counter::default(), Counter::default());
    let cancel = CancellationToken::new();
    let watch = watch_local_file(
        path.clone(),
        store.clone(),
        reloads.clone(),
        errors.clone(),
        cancel.clone(),
    )
    .await
    .unwrap();
    assert!(has(&store, "a"));

    atomic_write(&path, &workload_yaml("b", "10.0.0.2"));
    eventually("rename-write reload", Duration::from_secs(10), || {
        has(&store, "b")
    })
    .await;
    assert!(!has(&store, "a"));
    assert_eq!((reloads.get(), errors.get()), (1, 0));

    std::fs::write(
        &path,
        "workloads:\n- name: c\n  namespace: ns\n  workloadIps: [bogus]\n",
    )
    .unwrap();
    eventually("error counted", Duration::from_secs(10), || {
        errors.get() == 1
    })
    .await;
    assert!(has(&store, "b"), "last good config kept");
    assert_eq!(reloads.get(), 1);

    // In-place write (truncate + write) of a valid file.
    std::fs::write(&path, workload_yaml("c", "10.0.0.3")).unwrap();
    eventually("in-place reload", Duration::from_secs(10), || {
        has(&store, "c")
    })
    .await;
    assert_eq!((reloads.get(), errors.get()), (2, 1));

    // Cancel stops the watch: its task ends (a watch that ignored the cancel would
    // time out here), so later changes are no longer picked up.
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), watch)
        .await
        .expect("the watch ends on cancel")
        .unwrap();
    atomic_write(&path, &workload_yaml("d", "10.0.0.4"));
    assert!(!has(&store, "d"));
    assert_eq!((reloads.get(), errors.get()), (2, 1));
}

#[cfg(unix)]
#[tokio::test]
async fn watch_follows_configmap_symlink_swap() {
    use std::os::unix::fs::symlink;
    // Kubernetes' layout: config.yaml -> ..data/config.yaml, ..data -> ..<timestamp>.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("..v1")).unwrap();
    std::fs::write(d.join("..v1/config.yaml"), workload_yaml("a", "10.0.0.1")).unwrap();
    symlink("..v1", d.join("..data")).unwrap();
    symlink("..data/config.yaml", d.join("config.yaml")).unwrap();

    let store = StateStore::new();
    let (reloads, errors) = (Counter::default(), Counter::default());
    let cancel = CancellationToken::new();
    watch_local_file(
        d.join("config.yaml"),
        store.clone(),
        reloads.clone(),
        errors,
        cancel.clone(),
    )
    .await
    .unwrap();
    assert!(has(&store, "a"));

    std::fs::create_dir(d.join("..v2")).unwrap();
    std::fs::write(d.join("..v2/config.yaml"), workload_yaml("b", "10.0.0.2")).unwrap();
    symlink("..v2", d.join("..data_tmp")).unwrap();
    std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
    std::fs::remove_dir_all(d.join("..v1")).unwrap();
    eventually("symlink swap reload", Duration::from_secs(10), || {
        has(&store, "b")
    })
    .await;
    assert_eq!(reloads.get(), 1);
    cancel.cancel();
}

#[tokio::test]
async fn first_load_failure_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::new();
    let missing = dir.path().join("missing.yaml");
    let err = watch_local_file(
        missing,
        store.clone(),
        Counter::default(),
        Counter::default(),
        CancellationToken::new(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, DiscoveryError::Io { .. }), "{err}");

    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "workloads: {").unwrap();
    let err = watch_local_file(
        bad,
        store.clone(),
        Counter::default(),
        Counter::default(),
        CancellationToken::new(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, DiscoveryError::Yaml { .. }), "{err}");
    assert_eq!(store.generation(), 0);
}
