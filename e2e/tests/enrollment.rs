//! The enrollment engine end to end (root only): a local Kubernetes API server, a node
//! and pods as namespaces (`test_support::topology`, node index 210), the real ztunnel in shared
//! mode on our ZDS server, and pods enrolled through the CNI ADD handler.

use cni_agent::enrollment::cmdadd::EnrollOnAdd;
use cni_agent::enrollment::eligibility::Selection;
use cni_agent::enrollment::enroll::{Enroller, PodEnrollmentConfig};
use cni_agent::enrollment::kube::KubeCache;
use cni_agent::enrollment::queue::{Backoff, WorkQueue};
use cni_agent::ops::metrics::Metrics;
use cni_agent::plugin_api::event::CmdAddHandler;
use cni_agent::zds::ZdsServer;
use k8s_openapi::api::core::v1::{Namespace, Pod as KPod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use local_cluster::mesh;
use redirection::rules::{InpodRules, IpFamily};
use redirection::save::SavedTables;
use redirection::{Backend, Mode, Redirector};
use serde_json::json;
use shared_types::cni::{CniPluginAddEvent, GoIpNet, PodIpConfig};
use std::path::Path;
use std::time::Duration;
use test_support::poll::wait_for;
use test_support::process::ChildGuard;
use test_support::topology::{Node, Pod};
use tokio_util::sync::CancellationToken;

const NS: &str = "shop";
const DNS_CAPTURE: &str = "ambient.istio.io/dns-capture";

fn root_gate() -> cni_agent::plugin_api::peer::PeerGate {
    cni_agent::plugin_api::peer::PeerGate::new(
        cni_agent::plugin_api::peer::SOCKET_ZDS,
        0,
        &Metrics::new(),
    )
}

fn owned_v4(pod: &Pod, backend: Backend) -> String {
    owned_v4_of(pod, backend, &InpodRules::default())
}

/// The pod's IPv4 rules in the chains and tables that `rules` use.
fn owned_v4_of(pod: &Pod, backend: Backend, rules: &InpodRules) -> String {
    let set = rules.rule_set(IpFamily::V4);
    let text = pod
        .ns
        .stdout(&[&backend.save_binary(IpFamily::V4)])
        .unwrap();
    SavedTables::parse(&text).unwrap().owned_view(&set)
}

fn event(pod: &Pod) -> CniPluginAddEvent {
    CniPluginAddEvent {
        netns: pod.ns.path().display().to_string(),
        pod_name: pod.name.clone(),
        pod_namespace: NS.into(),
        ips: vec![PodIpConfig {
            interface: Some(0),
            address: GoIpNet::parse_cidr(&format!("{}/24", pod.ip)).unwrap(),
            gateway: None,
        }],
        pod_uid: String::new(),
        container_id: "c1".into(),
        if_name: "eth0".into(),
    }
}

async fn create_pod(client: &kube::Client, name: &str, labels: serde_json::Value) -> String {
    create_pod_in(client, NS, "node210", name, labels).await
}

async fn create_pod_in(
    client: &kube::Client,
    ns: &str,
    node: &str,
    name: &str,
    labels: serde_json::Value,
) -> String {
    let api: Api<KPod> = Api::namespaced(client.clone(), ns);
    let pod: KPod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"nodeName": node, "serviceAccountName": name,
                 "containers": [{"name": "app", "image": "app"}]},
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &pod).await.unwrap();
    created.metadata.uid.unwrap()
}

async fn annotation(client: &kube::Client, name: &str) -> Option<String> {
    let api: Api<KPod> = Api::namespaced(client.clone(), NS);
    let pod = api.get(name).await.unwrap();
    pod.metadata
        .annotations
        .and_then(|a| a.get("ambient.istio.io/redirection").cloned())
}

/// `protocol`: HBONE for enrolled pods, TCP for the opted-out server.
fn workload(pod: &Pod, uid: &str, protocol: &str) -> String {
    workload_in(pod, uid, protocol, NS, "node210")
}

fn workload_in(pod: &Pod, uid: &str, protocol: &str, ns: &str, node: &str) -> String {
    format!(
        "- uid: {uid}\n  name: {name}\n  namespace: {ns}\n  serviceAccount: {name}\n  workloadIps: [\"{ip}\"]\n  protocol: {protocol}\n  node: {node}\n",
        name = pod.name,
        ip = pod.ip
    )
}

fn start_ztunnel(node: &Node, dir: &Path, sock: &Path) -> ChildGuard {
    start_ztunnel_with(node, dir, sock, "config.yaml")
}

fn start_ztunnel_with(node: &Node, dir: &Path, sock: &Path, config: &str) -> ChildGuard {
    mesh::start_shared_ztunnel(
        &node.ns,
        sock,
        &dir.join("ca"),
        &dir.join(config),
        &[("TERMINATION_GRACE_PERIOD", "1s")],
    )
    .unwrap()
}

fn dump_pods(node: &Node) -> serde_json::Value {
    let dump = mesh::http_get(&node.ns, "http://127.0.0.1:15000/config_dump").unwrap();
    let dump: serde_json::Value = serde_json::from_str(&dump).unwrap();
    dump["workloadState"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cni_add_enrolls_replays_fails_closed_and_unenrolls() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    mesh::ca_init(&dir.path().join("ca")).unwrap();
    let api = kube_apiserver_lite::ApiServer::bind("127.0.0.1:0", None)
        .await
        .unwrap();
    let control = api.spawn();
    let config = kube::Config::new(control.url().parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();

    let node = Node::new("enr", 210).unwrap();
    let client_pod = node.add_pod("enr", "client").unwrap();
    let server_pod = node.add_pod("enr", "server").unwrap();
    let late_pod = node.add_pod("enr", "late").unwrap();

    let ns: Namespace = serde_json::from_value(
        json!({"metadata": {"name": NS, "labels": {"istio.io/dataplane-mode": "ambient"}}}),
    )
    .unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let client_uid = create_pod(&client, "client", json!({})).await;
    let server_uid = create_pod(
        &client,
        "server",
        json!({"istio.io/dataplane-mode": "none"}),
    )
    .await;
    let late_uid = create_pod(&client, "late", json!({})).await;
    let config = format!(
        "workloads:\n{}{}{}",
        workload(&client_pod, &client_uid, "HBONE"),
        workload(&server_pod, &server_uid, "TCP"),
        workload(&late_pod, &late_uid, "HBONE")
    );
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();

    let cancel = CancellationToken::new();
    let sock = dir.path().join("zds/ztunnel.sock");
    let zds = ZdsServer::bind(&sock, root_gate()).unwrap();
    tokio::spawn({
        let (zds, cancel) = (zds.clone(), cancel.clone());
        async move { zds.run(cancel).await }
    });
    let (changes, _rx) = tokio::sync::mpsc::unbounded_channel();
    let cache = KubeCache::start(client.clone(), "node210", changes, cancel.clone());
    assert!(cache.wait_synced().await);
    let backend = tokio::task::spawn_blocking(Backend::detect).await.unwrap();
    let enroller = Enroller::new(
        PodEnrollmentConfig {
            selection: Selection::default(),
            host_proc: "/proc".into(),
            netns_dir: "/var/run/netns".into(),
            dns_capture: false,
            ipv6: false,
            cni_event_timeout: Duration::from_secs(3),
        },
        cache.clone(),
        zds.clone(),
        Redirector::new(Mode::Iptables(backend)),
        None,
        Metrics::new(),
        WorkQueue::new(Backoff::default()),
    );
    let handler = EnrollOnAdd::new(enroller.clone());

    let mut ztunnel = tokio::task::block_in_place(|| start_ztunnel(&node, dir.path(), &sock));
    assert_eq!(zds.connections(), 1);

    // A pod opted out starts at once, untouched.
    handler.handle(event(&server_pod)).await.unwrap();
    assert!(!owned_v4(&server_pod, backend).contains("ISTIO"));

    // CNI path: rules as the golden file, acked by ztunnel, annotated.
    handler.handle(event(&client_pod)).await.unwrap();
    // What the agent renders (the redirection crate's golden file holds the same).
    let golden = InpodRules::default().rule_set(IpFamily::V4).render();
    assert_eq!(owned_v4(&client_pod, backend), golden);
    assert_eq!(
        annotation(&client, "client").await.as_deref(),
        Some("enabled")
    );
    let pods = tokio::task::block_in_place(|| dump_pods(&node));
    assert!(pods.to_string().contains(&client_uid), "{pods}");
    let metrics = enroller.metrics.encode();
    assert!(metrics.contains("istio_cni_pods_enrolled 1"), "{metrics}");
    assert!(
        metrics.contains("istio_cni_enrollments_total{result=\"success\"} 1"),
        "{metrics}"
    );

    // App traffic from the pod goes through ztunnel.
    let mut sink = server_pod.ns.command(
        test_support::built_binary("e2e-app")
            .unwrap()
            .to_str()
            .unwrap(),
    );
    sink.args(["sink", "--listen", "0.0.0.0:9000"]);
    let _sink = ChildGuard::spawn("enr-sink", sink).unwrap();
    let target = format!("{}:9000", server_pod.ip);
    tokio::task::block_in_place(|| {
        wait_for("traffic through ztunnel", Duration::from_secs(10), || {
            if let Err(e) = mesh::send_from(&client_pod.ns, &target, 1) {
                eprintln!("send: {e:#}");
                return None;
            }
            let metrics = mesh::ztunnel_metrics(&node.ns).ok()?;
            (mesh::metric_sum(&metrics, "istio_tcp_connections_opened_total", &[]) > 0.0)
                .then_some(())
        })
    })
    .unwrap();

    // ztunnel restarts: the snapshot gives it the pod back.
    ztunnel.kill();
    let mut ztunnel = tokio::task::block_in_place(|| start_ztunnel(&node, dir.path(), &sock));
    let pods = tokio::task::block_in_place(|| dump_pods(&node));
    assert!(pods.to_string().contains(&client_uid), "{pods}");

    // ztunnel down during an ADD: fail closed, annotated pending; heals on retry.
    ztunnel.kill();
    let mut count = zds.watch_connections();
    tokio::time::timeout(Duration::from_secs(10), count.wait_for(|c| *c == 0))
        .await
        .unwrap()
        .unwrap();
    let err = handler.handle(event(&late_pod)).await.unwrap_err();
    assert!(err.to_string().contains("not connected"), "{err}");
    assert_eq!(
        annotation(&client, "late").await.as_deref(),
        Some("pending")
    );
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), NS)
        .list(&Default::default())
        .await
        .unwrap();
    let failure = events
        .items
        .iter()
        .find(|e| e.reason.as_deref() == Some(cni_agent::enrollment::enroll::FAILURE_EVENT_REASON))
        .expect("an AmbientEnrollmentFailed event");
    assert_eq!(failure.involved_object.name.as_deref(), Some("late"));
    let metrics = enroller.metrics.encode();
    assert!(
        metrics.contains("istio_cni_enrollment_failures_total{reason=\"ztunnel_not_connected\"}"),
        "{metrics}"
    );
    assert!(
        failure
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("ztunnel is not connected"),
        "{failure:?}"
    );
    let _ztunnel = tokio::task::block_in_place(|| start_ztunnel(&node, dir.path(), &sock));
    handler.handle(event(&late_pod)).await.unwrap();
    assert_eq!(
        annotation(&client, "late").await.as_deref(),
        Some("enabled")
    );

    // The DNS-capture annotation changes on the enrolled pod: its rules follow in
    // place, and it stays in the mesh.
    for capture in ["true", "false"] {
        Api::<KPod>::namespaced(client.clone(), NS)
            .patch(
                "client",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {DNS_CAPTURE: capture}}})),
            )
            .await
            .unwrap();
        wait_cache(&cache, "the client's dns-capture annotation", |cache| {
            cache.cached_pod(&format!("{NS}/client")).is_some_and(|p| {
                p.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(DNS_CAPTURE))
                    == Some(&capture.to_string())
            })
        })
        .await;
        enroller.reconcile(&format!("{NS}/client")).await.unwrap();
        let rules = InpodRules {
            dns_capture: capture == "true",
            ..Default::default()
        };
        assert_eq!(
            owned_v4_of(&client_pod, backend, &rules),
            rules.rule_set(IpFamily::V4).render(),
            "capture {capture}"
        );
        assert!(zds.is_enrolled(&client_uid));
    }
    let saved = client_pod
        .ns
        .stdout(&[&backend.save_binary(IpFamily::V4)])
        .unwrap();
    assert!(
        !saved.contains("15053"),
        "DNS capture left behind:\n{saved}"
    );

    // Un-enroll on a label change: rules and annotation gone.
    Api::<KPod>::namespaced(client.clone(), NS)
        .patch(
            "client",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"istio.io/dataplane-mode": "none"}}})),
        )
        .await
        .unwrap();
    wait_cache(&cache, "the client's dataplane-mode=none label", |cache| {
        cache.cached_pod(&format!("{NS}/client")).is_some_and(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("istio.io/dataplane-mode"))
                == Some(&"none".to_string())
        })
    })
    .await;
    enroller.reconcile(&format!("{NS}/client")).await.unwrap();
    assert!(!owned_v4(&client_pod, backend).contains("ISTIO"));
    assert_eq!(annotation(&client, "client").await, None);
    assert!(!zds.is_enrolled(&client_uid));
    cancel.cancel();
    control.shutdown();
}

struct Agent {
    zds: ZdsServer,
    cache: KubeCache,
    enroller: Enroller,
    cancel: CancellationToken,
}

/// The agent's library pieces on ZDS socket `sock`, as `engine::start` wires them.
async fn agent(client: &kube::Client, node: &str, sock: &Path, backend: Backend) -> Agent {
    let cancel = CancellationToken::new();
    let zds = ZdsServer::bind(sock, root_gate()).unwrap();
    tokio::spawn({
        let (zds, cancel) = (zds.clone(), cancel.clone());
        async move { zds.run(cancel).await }
    });
    let (changes, _rx) = tokio::sync::mpsc::unbounded_channel();
    let cache = KubeCache::start(client.clone(), node, changes, cancel.clone());
    assert!(cache.wait_synced().await);
    let enroller = Enroller::new(
        PodEnrollmentConfig {
            selection: Selection::default(),
            host_proc: "/proc".into(),
            netns_dir: "/var/run/netns".into(),
            dns_capture: false,
            ipv6: false,
            cni_event_timeout: Duration::from_secs(3),
        },
        cache.clone(),
        zds.clone(),
        Redirector::new(Mode::Iptables(backend)),
        None,
        Metrics::new(),
        WorkQueue::new(Backoff::default()),
    );
    Agent {
        zds,
        cache,
        enroller,
        cancel,
    }
}

async fn wait_cache(cache: &KubeCache, what: &str, check: impl Fn(&KubeCache) -> bool) {
    for _ in 0..200 {
        if check(cache) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the cache never saw {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn running_pod_enrolled_by_namespace_label_then_restored_and_repaired_on_restart() {
    if !test_support::can_run_root_tests() {
        return;
    }
    const QUIET: &str = "quiet";
    let dir = tempfile::tempdir().unwrap();
    mesh::ca_init(&dir.path().join("ca")).unwrap();
    let api = kube_apiserver_lite::ApiServer::bind("127.0.0.1:0", None)
        .await
        .unwrap();
    let control = api.spawn();
    let client = kube::Client::try_from(kube::Config::new(control.url().parse().unwrap())).unwrap();
    let node = Node::new("rst", 211).unwrap();
    let runner = node.add_pod("rst", "runner").unwrap();
    // A process in the pod netns, as a running container would be.
    let _sleeper = ChildGuard::spawn("rst-sleeper", {
        let mut cmd = runner.ns.command("sleep");
        cmd.arg("600");
        cmd
    })
    .unwrap();
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": QUIET}})).unwrap();
    let namespaces = Api::<Namespace>::all(client.clone());
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let uid = create_pod_in(&client, QUIET, "node211", "runner", json!({})).await;
    let pods: Api<KPod> = Api::namespaced(client.clone(), QUIET);
    pods.patch_status(
        "runner",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running", "podIP": runner.ip,
                                         "podIPs": [{"ip": runner.ip}]}})),
    )
    .await
    .unwrap();
    std::fs::write(
        dir.path().join("quiet.yaml"),
        format!(
            "workloads:\n{}",
            workload_in(&runner, &uid, "HBONE", QUIET, "node211")
        ),
    )
    .unwrap();
    let backend = tokio::task::spawn_blocking(Backend::detect).await.unwrap();
    let key = format!("{QUIET}/runner");

    let first_sock = dir.path().join("first/ztunnel.sock");
    let first = agent(&client, "node211", &first_sock, backend).await;
    let mut ztunnel = tokio::task::block_in_place(|| {
        start_ztunnel_with(&node, dir.path(), &first_sock, "quiet.yaml")
    });
    // Not ambient yet: nothing happens.
    first.enroller.reconcile(&key).await.unwrap();
    assert!(!owned_v4(&runner, backend).contains("ISTIO"));
    // Labelling the namespace enrolls the running pod (netns found through /proc).
    namespaces
        .patch(
            QUIET,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"istio.io/dataplane-mode": "ambient"}}})),
        )
        .await
        .unwrap();
    wait_cache(&first.cache, "the namespace label", |c| {
        c.namespace(QUIET).is_some_and(|n| {
            n.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("istio.io/dataplane-mode"))
                .is_some_and(|v| v == "ambient")
        })
    })
    .await;
    first.enroller.reconcile(&key).await.unwrap();
    // What the agent renders (the redirection crate's golden file holds the same).
    let golden = InpodRules::default().rule_set(IpFamily::V4).render();
    assert_eq!(owned_v4(&runner, backend), golden);
    assert!(first.zds.is_enrolled(&uid));

    // The agent goes away (rules stay); someone breaks a rule meanwhile.
    first.cancel.cancel();
    ztunnel.kill();
    runner
        .ns
        .exec(&[
            &backend.restore_binary(IpFamily::V4).replace("-restore", ""),
            "-t",
            "nat",
            "-F",
            "ISTIO_OUTPUT",
        ])
        .unwrap();
    assert_ne!(owned_v4(&runner, backend), golden);

    // A new agent: restores from the annotation, repairs, and replays to ztunnel.
    let second_sock = dir.path().join("second/ztunnel.sock");
    let second = agent(&client, "node211", &second_sock, backend).await;
    wait_cache(&second.cache, "the annotation", |c| {
        c.cached_pod(&key)
            .is_some_and(|p| mesh_kube::pod::is_redirected(&p))
    })
    .await;
    assert_eq!(second.enroller.restore(true).await, 1);
    assert_eq!(owned_v4(&runner, backend), golden);
    assert!(second.zds.is_enrolled(&uid));
    let _ztunnel = tokio::task::block_in_place(|| {
        start_ztunnel_with(&node, dir.path(), &second_sock, "quiet.yaml")
    });
    let dumped = tokio::task::block_in_place(|| dump_pods(&node));
    assert!(dumped.to_string().contains(&uid), "{dumped}");

    // A malformed peer on the same socket is dropped; the real ztunnel keeps working.
    let bad = shared_types::zds_transport::SeqpacketStream::connect(&second_sock).unwrap();
    bad.send(b"\x08\x07garbage", None).await.unwrap();
    let mut buf = [0u8; 64];
    let eof = tokio::time::timeout(Duration::from_secs(5), bad.recv(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(eof.len, 0);
    assert_eq!(second.zds.connections(), 1);
    second.zds.del(&uid).await.unwrap();
    second.cancel.cancel();
    control.shutdown();
}
