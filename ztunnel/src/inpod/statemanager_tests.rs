//! `PodProxies`' add / keep / del / snapshot transitions, without root: every "pod"
//! is served in the test's own network namespace (`/proc/self/ns/net`, which any user
//! may open and the netns switch need not enter), on ephemeral loopback ports, with
//! unmarked sockets.

use std::net::SocketAddr;

use super::*;
use crate::proxy::fixtures::{certs, errors, identity, state};

const WORKLOADS: &str = r#"
workloads:
- uid: Kubernetes//Pod/test/a
  name: a
  namespace: test
  serviceAccount: sa-a
  workloadIps: ["10.0.0.1"]
  node: node-1
- uid: Kubernetes//Pod/test/far
  name: far
  namespace: test
  serviceAccount: sa-far
  workloadIps: ["10.0.0.9"]
  node: node-2
"#;

fn pod_proxies() -> PodProxies {
    let ephemeral = SocketAddr::from(([127, 0, 0, 1], 0));
    let inputs = SharedInputs {
        state: state(WORKLOADS),
        certs: certs(),
        metrics: Arc::new(Metrics::new()),
        connections: ConnectionManager::new(),
        netns_switch: NetnsSwitch::new().unwrap(),
        root_drain: Drain::new(),
        mark: 0,
        trust_domain: "cluster.local".into(),
        cluster_id: "Kubernetes".into(),
        drain_deadline: Duration::from_secs(1),
        own_ports: OwnPorts::default(),
        node_name: "node-1".into(),
        dns: None,
        listen: ListenAddrs {
            outbound: ephemeral,
            inbound: ephemeral,
            inbound_plaintext: ephemeral,
            transparent: false,
            ipv6: false,
        },
    };
    PodProxies::new(inputs, PodRegistry::default())
}

/// Our own network namespace, as the agent would hand over a pod's.
fn own_netns() -> NetnsHandle {
    NetnsHandle::open("/proc/self/ns/net").unwrap()
}

/// A new namespace with loopback up: what a pod recreated with the same uid (a new
/// sandbox) looks like. Entering it needs root.
fn new_netns() -> NetnsHandle {
    std::thread::spawn(|| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare a netns");
        // A child process starts in its thread's namespace.
        let up = std::process::Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status()
            .expect("ip link");
        assert!(up.success());
        NetnsHandle::current().expect("open")
    })
    .join()
    .expect("the unsharing thread")
}

fn info(name: &str) -> WorkloadInfo {
    WorkloadInfo {
        name: name.into(),
        namespace: "test".into(),
        service_account: format!("sa-{name}"),
    }
}

/// The drain of the running pod `uid` (stopped once the pod's proxies stop).
fn drain_of(pods: &PodProxies, uid: &str) -> Drain {
    pods.pods[uid].drain.clone()
}

fn stopped(drain: &Drain) -> bool {
    drain.accepting_token().is_cancelled()
}

fn uids(pods: &PodProxies) -> Vec<String> {
    pods.registry
        .summaries()
        .into_iter()
        .map(|s| s.uid)
        .collect()
}

fn has_certificate(pods: &PodProxies, name: &str) -> bool {
    let id = identity("test", &format!("sa-{name}"));
    pods.inputs
        .certs
        .certificates()
        .iter()
        .any(|c| c.identity == id)
}

#[tokio::test]
async fn add_serves_the_pod_and_a_repeated_add_with_the_same_netns_is_a_no_op() {
    let mut pods = pod_proxies();
    pods.add("uid-a".into(), info("a"), own_netns())
        .await
        .unwrap();
    assert_eq!(pods.len(), 1);
    let summary = &pods.registry.summaries()[0];
    assert_eq!(
        (
            summary.uid.as_str(),
            summary.state,
            summary.identity.as_str()
        ),
        ("uid-a", "Up", "spiffe://cluster.local/ns/test/sa/sa-a")
    );
    assert_eq!(summary.netns_inode, own_netns().inode());
    assert!(has_certificate(&pods, "a"));
    let drain = drain_of(&pods, "uid-a");
    assert!(pods.pods["uid-a"]
        .listeners
        .iter()
        .all(|l| !l.is_finished()));

    // The agent repeats (or replays) the add: the running proxies stay as they are.
    pods.add("uid-a".into(), info("a"), own_netns())
        .await
        .unwrap();
    assert_eq!(pods.len(), 1);
    assert!(!stopped(&drain), "a repeated add restarted the pod");
    assert!(pods.pods["uid-a"]
        .listeners
        .iter()
        .all(|l| !l.is_finished()));
}

#[tokio::test]
async fn add_with_a_changed_netns_restarts_the_pods_proxies() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(std::env::var_os("CI").is_none(), "CI: this test needs root");
        return;
    }
    let mut pods = pod_proxies();
    pods.add("uid-a".into(), info("a"), own_netns())
        .await
        .unwrap();
    let old = drain_of(&pods, "uid-a");

    let netns = new_netns();
    let inode = netns.inode();
    pods.add("uid-a".into(), info("a"), netns).await.unwrap();
    assert!(stopped(&old), "the old namespace's proxies still run");
    let new = drain_of(&pods, "uid-a");
    assert!(!stopped(&new));
    assert_eq!(pods.len(), 1);
    assert_eq!(pods.registry.summaries()[0].netns_inode, inode);
    assert!(pods.pods["uid-a"]
        .listeners
        .iter()
        .all(|l| !l.is_finished()));
    // The old proxies' drain has run its course (nothing to drain) without taking the
    // certificate the restarted pod still uses.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(
        has_certificate(&pods, "a"),
        "the restarted pod lost its certificate"
    );
}

#[tokio::test]
async fn keep_of_an_unknown_pod_is_acknowledged_and_starts_nothing() {
    let mut pods = pod_proxies();
    pods.keep("uid-unknown").unwrap();
    assert!(pods.is_empty());
    assert!(uids(&pods).is_empty());
}

#[tokio::test]
async fn del_stops_the_pod_and_forgets_its_certificate() {
    let mut pods = pod_proxies();
    pods.add("uid-a".into(), info("a"), own_netns())
        .await
        .unwrap();
    let drain = drain_of(&pods, "uid-a");
    pods.del("uid-a").await.unwrap();
    assert!(pods.is_empty());
    assert!(uids(&pods).is_empty());
    assert!(stopped(&drain));
    assert!(!has_certificate(&pods, "a"));
    // A del for a pod not served (any more) is acknowledged.
    pods.del("uid-a").await.unwrap();
}

#[tokio::test]
async fn snapshot_sent_stops_the_pods_the_agent_did_not_replay() {
    let mut pods = pod_proxies();
    pods.connection_started();
    for name in ["a", "b", "c"] {
        pods.add(format!("uid-{name}"), info(name), own_netns())
            .await
            .unwrap();
    }
    pods.snapshot_sent().await.unwrap();
    assert_eq!(uids(&pods), ["uid-a", "uid-b", "uid-c"]);
    let b = drain_of(&pods, "uid-b");

    // The agent reconnects and replays a (as a keep) and c (as an add); b is gone.
    pods.connection_started();
    pods.keep("uid-a").unwrap();
    pods.add("uid-c".into(), info("c"), own_netns())
        .await
        .unwrap();
    pods.snapshot_sent().await.unwrap();
    assert_eq!(uids(&pods), ["uid-a", "uid-c"]);
    assert!(stopped(&b));
    assert!(!has_certificate(&pods, "b"));
    assert!(has_certificate(&pods, "a") && has_certificate(&pods, "c"));
}

#[tokio::test]
async fn snapshot_sent_twice_on_one_connection_is_an_error() {
    let mut pods = pod_proxies();
    pods.connection_started();
    pods.add("uid-a".into(), info("a"), own_netns())
        .await
        .unwrap();
    pods.snapshot_sent().await.unwrap();
    let err = pods.snapshot_sent().await.unwrap_err();
    assert!(err.contains("twice"), "{err}");
    // The error stops nothing.
    assert_eq!(uids(&pods), ["uid-a"]);
    // Without a connection_started first (no replay under way) it is an error too.
    assert!(pod_proxies().snapshot_sent().await.is_err());
}

#[tokio::test]
async fn pods_without_an_identity_or_on_another_node_are_refused() {
    let mut pods = pod_proxies();
    let mut no_sa = info("a");
    no_sa.service_account.clear();
    let err = pods
        .add("uid-a".into(), no_sa, own_netns())
        .await
        .unwrap_err();
    assert!(
        err.contains("workload info needs a namespace and a service account"),
        "{err}"
    );

    let err = pods
        .add("uid-far".into(), info("far"), own_netns())
        .await
        .unwrap_err();
    assert!(err.contains("node-2"), "{err}");
    assert_eq!(errors(&pods.inputs.metrics, "zds_pod_on_other_node"), 1);
    assert!(pods.is_empty());
    assert!(!has_certificate(&pods, "far"));
}

#[test]
fn an_identity_being_added_counts_as_served() {
    // A stopped pod's drain forgets its identity's certificate unless the registry
    // says a pod still uses it; an add in progress does.
    let registry = PodRegistry::default();
    let id = identity("test", "sa-a");
    assert!(!registry.serves_identity(&id));
    let first = registry.adding(&id);
    let second = registry.adding(&id);
    assert!(registry.serves_identity(&id));
    drop(first);
    assert!(
        registry.serves_identity(&id),
        "one add is still in progress"
    );
    drop(second);
    assert!(!registry.serves_identity(&id));
}
