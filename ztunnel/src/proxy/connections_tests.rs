//! Re-checking live connections against policy as the state changes.

use std::time::Duration;

use super::*;
use crate::discovery::local::parse_local_config;
use crate::identity::Identity;

/// The destination workload `test/server` on 10.1.0.1.
const WORKLOADS: &str = r#"
workloads:
- uid: Kubernetes//Pod/test/server
  name: server
  namespace: test
  serviceAccount: server
  workloadIps: ["10.1.0.1"]
  protocol: HBONE
"#;

/// Denies sources in 10.0.0.1/32 to workloads of namespace `test`.
const DENY_ONE_SOURCE: &str = r#"
policies:
- name: deny-one-source
  namespace: test
  scope: Namespace
  action: Deny
  rules:
  - - - sourceIps: [10.0.0.1/32]
"#;

fn state(yaml: &str) -> StateStore {
    let state = StateStore::new();
    state.replace_source("local", parse_local_config(yaml).unwrap());
    state
}

fn with_deny(state: &StateStore) {
    state.replace_source(
        "local",
        parse_local_config(&format!("{WORKLOADS}{DENY_ONE_SOURCE}")).unwrap(),
    );
}

fn attrs(src: &str, dst: &str) -> ConnectionAttrs {
    ConnectionAttrs {
        src_identity: Some(Identity::new("cluster.local", "test", "client")),
        src_ip: src.parse().unwrap(),
        dst: dst.parse().unwrap(),
    }
}

#[test]
fn a_deny_policy_revokes_the_connections_it_matches_and_only_those() {
    let state = state(WORKLOADS);
    let metrics = Metrics::new();
    let manager = ConnectionManager::new();
    let denied = manager.register(attrs("10.0.0.1", "10.1.0.1:80"));
    let other_source = manager.register(attrs("10.0.0.2", "10.1.0.1:80"));
    // A destination the state does not know is left alone.
    let unknown_dst = manager.register(attrs("10.0.0.1", "10.1.0.9:80"));
    assert_eq!(manager.len(), 3);

    manager.recheck(&state, &metrics);
    assert!(!denied.revoked.is_cancelled());
    assert_eq!(metrics.policy_revoked.get(), 0);

    with_deny(&state);
    manager.recheck(&state, &metrics);
    assert!(denied.revoked.is_cancelled());
    assert!(!other_source.revoked.is_cancelled());
    assert!(!unknown_dst.revoked.is_cancelled());
    assert_eq!(metrics.policy_revoked.get(), 1);
    assert!(metrics
        .encode()
        .contains("ztunnel_policy_revoked_connections_total 1"));

    // A connection is revoked (and counted) once.
    manager.recheck(&state, &metrics);
    assert_eq!(metrics.policy_revoked.get(), 1);

    // Dropping a registration unregisters it.
    drop(denied);
    assert_eq!(manager.len(), 2);
    drop((other_source, unknown_dst));
    assert!(manager.is_empty());
}

#[tokio::test]
async fn watch_rechecks_on_every_state_change_until_stopped() {
    let state = state(WORKLOADS);
    let metrics = Arc::new(Metrics::new());
    let manager = ConnectionManager::new();
    let stop = CancellationToken::new();
    let watch = tokio::spawn(
        manager
            .clone()
            .watch(state.clone(), metrics.clone(), stop.clone()),
    );
    // Let the watch subscribe (a current-thread runtime runs it now), so the change
    // below is one it sees.
    tokio::task::yield_now().await;

    let conn = manager.register(attrs("10.0.0.1", "10.1.0.1:80"));
    with_deny(&state);
    tokio::time::timeout(Duration::from_secs(5), conn.revoked.cancelled())
        .await
        .expect("the state change revoked the connection");
    assert_eq!(metrics.policy_revoked.get(), 1);

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), watch)
        .await
        .expect("the watch stopped")
        .unwrap();
}
