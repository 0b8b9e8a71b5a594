//! The enrollment engine against forged or confused input (root only): a local API
//! server, pods as namespaces (`test_support::topology`), and a fake ztunnel on our ZDS socket that
//! acks everything, so anything that got past the agent's checks would be enrolled.
//!
//! - CNI ADDs that name a pod of another node, carry a wrong UID, point at a netns
//!   that does not hold the pod's IP (or holds another pod's), at the host's netns, or
//!   at a path outside `CNI_NETNS_DIR` are answered 400 with the reason, and no rule
//!   appears in any netns;
//! - a pod's netns is held by fd: after the pid its `/proc` path named is reused by
//!   another pod's process, the ZDS replay and the removal still act on the pod's own
//!   netns;
//! - the per-pod lock map is empty after pods come and go.

mod common;

use cni_agent::enrollment::cmdadd::EnrollOnAdd;
use cni_agent::enrollment::eligibility::Selection;
use cni_agent::enrollment::enroll::{Enroller, PodEnrollmentConfig};
use cni_agent::enrollment::kube::KubeCache;
use cni_agent::enrollment::queue::{Backoff, WorkQueue};
use cni_agent::ops::metrics::Metrics;
use cni_agent::plugin_api::peer::{PeerGate, SOCKET_ZDS};
use cni_agent::plugin_api::{self, event::CmdAddHandler};
use cni_agent::zds::ZdsServer;
use common::{access, capture_subscriber, exchange, Answer};
use k8s_openapi::api::core::v1::{Namespace, Pod as KPod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use mesh_runtime::netns::netns_inode;
use prost::Message;
use redirection::rules::{InpodRules, IpFamily};
use redirection::save::SavedTables;
use redirection::{Backend, Mode, Redirector};
use serde_json::json;
use shared_types::cni::{CniPluginAddEvent, GoIpNet, PodIpConfig};
use shared_types::zds::{workload_request::Payload, WorkloadRequest, WorkloadResponse, ZdsHello};
use shared_types::zds_transport::SeqpacketStream;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use test_support::poll::eventually;
use test_support::process::ChildGuard;
use test_support::topology::{Node, Pod};
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;

const NS: &str = "shop";

/// A fake ztunnel: acks every request and records "add:<uid>:<netns inode>",
/// "keep:<uid>", "del:<uid>" and "snap".
struct FakeZtunnel {
    seen: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeZtunnel {
    async fn connect(path: &Path) -> FakeZtunnel {
        let stream = SeqpacketStream::connect(path).unwrap();
        stream
            .send(&ZdsHello::v1().encode_to_vec(), None)
            .await
            .unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let task = tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            while let Ok(d) = stream.recv(&mut buf).await {
                if d.len == 0 {
                    break;
                }
                let entry = match WorkloadRequest::decode(&buf[..d.len]).unwrap().payload {
                    Some(Payload::Add(a)) => {
                        let file = std::fs::File::from(d.fds.into_iter().next().unwrap());
                        format!("add:{}:{}", a.uid, file.metadata().unwrap().ino())
                    }
                    Some(Payload::Keep(k)) => format!("keep:{}", k.uid),
                    Some(Payload::Del(x)) => format!("del:{}", x.uid),
                    Some(Payload::SnapshotSent(_)) => "snap".into(),
                    None => "empty".into(),
                };
                record.lock().unwrap().push(entry);
                let _ = stream
                    .send(&WorkloadResponse::ack().encode_to_vec(), None)
                    .await;
            }
        });
        FakeZtunnel { seen, task }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for FakeZtunnel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Agent {
    enroller: Enroller,
    cache: KubeCache,
    zds: ZdsServer,
    sock: PathBuf,
    backend: Backend,
    cancel: CancellationToken,
}

async fn agent(
    client: &kube::Client,
    node: &str,
    dir: &Path,
    host_proc: PathBuf,
    timeout: Duration,
) -> Agent {
    let cancel = CancellationToken::new();
    let sock = dir.join("zds/ztunnel.sock");
    let zds = ZdsServer::bind(&sock, PeerGate::new(SOCKET_ZDS, 0, &Metrics::new())).unwrap();
    tokio::spawn({
        let (zds, cancel) = (zds.clone(), cancel.clone());
        async move { zds.run(cancel).await }
    });
    let (changes, _rx) = tokio::sync::mpsc::unbounded_channel();
    let cache = KubeCache::start(client.clone(), node, changes, cancel.clone());
    assert!(cache.wait_synced().await);
    let backend = tokio::task::spawn_blocking(Backend::detect).await.unwrap();
    let enroller = Enroller::new(
        PodEnrollmentConfig {
            selection: Selection::default(),
            host_proc,
            netns_dir: "/var/run/netns".into(),
            dns_capture: false,
            ipv6: false,
            cni_event_timeout: timeout,
        },
        cache.clone(),
        zds.clone(),
        Redirector::new(Mode::Iptables(backend)),
        None,
        Metrics::new(),
        WorkQueue::new(Backoff::default()),
    );
    Agent {
        enroller,
        cache,
        zds,
        sock,
        backend,
        cancel,
    }
}

fn rules_v4(pod: &Pod, backend: Backend) -> String {
    pod.ns
        .stdout(&[&backend.save_binary(IpFamily::V4)])
        .unwrap()
}

fn owned_v4(pod: &Pod, backend: Backend) -> String {
    let set = InpodRules::default().rule_set(IpFamily::V4);
    SavedTables::parse(&rules_v4(pod, backend))
        .unwrap()
        .owned_view(&set)
}

/// What the agent renders for a default pod (the redirection crate's golden file).
fn golden() -> String {
    InpodRules::default().rule_set(IpFamily::V4).render()
}

fn event(name: &str, uid: &str, netns: &str, ip: &str) -> CniPluginAddEvent {
    CniPluginAddEvent {
        netns: netns.into(),
        pod_name: name.into(),
        pod_namespace: NS.into(),
        ips: vec![PodIpConfig {
            interface: Some(0),
            address: GoIpNet::parse_cidr(&format!("{ip}/24")).unwrap(),
            gateway: None,
        }],
        pod_uid: uid.into(),
        container_id: "c1".into(),
        if_name: "eth0".into(),
    }
}

async fn ambient_namespace(client: &kube::Client) {
    let ns: Namespace = serde_json::from_value(
        json!({"metadata": {"name": NS, "labels": {"istio.io/dataplane-mode": "ambient"}}}),
    )
    .unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
}

/// Creates pod `name` bound to `node`; with `ip`, its status says Running with it.
async fn create_pod(client: &kube::Client, node: &str, name: &str, ip: Option<&str>) -> String {
    let api: Api<KPod> = Api::namespaced(client.clone(), NS);
    let pod: KPod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {"nodeName": node, "serviceAccountName": name,
                 "containers": [{"name": "app", "image": "app"}]},
    }))
    .unwrap();
    let uid = api
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    if let Some(ip) = ip {
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running", "podIP": ip,
                                             "podIPs": [{"ip": ip}]}})),
        )
        .await
        .unwrap();
    }
    uid
}

async fn post(sock: &Path, event: &CniPluginAddEvent) -> Answer {
    let stream = UnixStream::connect(sock).await.unwrap();
    let body = serde_json::to_vec(event).unwrap();
    exchange(stream, "POST", "/cmdadd", &body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_adds_are_refused_before_any_rule_and_locks_are_pruned() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let api = kube_apiserver_lite::ApiServer::bind("127.0.0.1:0", None)
        .await
        .unwrap();
    let control = api.spawn();
    let client = kube::Client::try_from(kube::Config::new(control.url().parse().unwrap())).unwrap();
    let node = Node::new("frg", 212).unwrap();
    let web = node.add_pod("frg", "web").unwrap();
    let intruder = node.add_pod("frg", "intr").unwrap();
    let stray = node.add_pod("frg", "stray").unwrap();
    ambient_namespace(&client).await;
    let web_uid = create_pod(&client, "node212", "web", None).await;
    // The intruder's netns holds db's IP: db is a live pod of this node.
    create_pod(&client, "node212", "db", Some(&intruder.ip)).await;
    let far_uid = create_pod(&client, "node-far", "far", None).await;

    let a = agent(
        &client,
        "node212",
        dir.path(),
        "/proc".into(),
        Duration::from_secs(3),
    )
    .await;
    eventually("db in the cache", Duration::from_secs(10), || {
        a.cache.cached_pod(&format!("{NS}/db")).is_some()
    })
    .await;
    let ztunnel = FakeZtunnel::connect(&a.sock).await;
    eventually("the fake ztunnel", Duration::from_secs(10), || {
        a.zds.connections() == 1
    })
    .await;
    let handler: Arc<dyn CmdAddHandler> = Arc::new(EnrollOnAdd::new(a.enroller.clone()));
    let run_dir = dir.path().join("run");
    let servers = plugin_api::start(&run_dir, handler, &access(), a.cancel.clone()).unwrap();
    let sock = servers.event_socket.clone();
    let path = |p: &Pod| p.ns.path().display().to_string();

    let refusals = [
        (
            "a pod of another node",
            event("far", &far_uid, &path(&stray), &stray.ip),
            "is bound to node node-far, not to this node node212",
        ),
        (
            "a wrong UID",
            event(
                "web",
                "6f1b2c3d-0000-4000-8000-000000000000",
                &path(&web),
                &web.ip,
            ),
            "the ADD names UID 6f1b2c3d-0000-4000-8000-000000000000",
        ),
        (
            "a netns without the pod's IP",
            event("web", &web_uid, &path(&intruder), &web.ip),
            "holds none of the IPs",
        ),
        (
            "another pod's IP",
            event("web", &web_uid, &path(&intruder), &intruder.ip),
            "belongs to pod shop/db",
        ),
        (
            "the host's netns",
            // Our own process: the agent's (host) netns.
            event(
                "web",
                &web_uid,
                &format!("/proc/{}/ns/net", std::process::id()),
                &web.ip,
            ),
            "is the host's network namespace",
        ),
        (
            "a path outside CNI_NETNS_DIR",
            event(
                "web",
                &web_uid,
                &dir.path().join("netns").display().to_string(),
                &web.ip,
            ),
            "is outside CNI_NETNS_DIR",
        ),
        (
            "a path with ..",
            event(
                "web",
                &web_uid,
                &format!("/var/run/netns/../netns/{}", web.ns.name()),
                &web.ip,
            ),
            "without . or ..",
        ),
    ];
    for (what, event, reason) in refusals {
        let answer = post(&sock, &event).await;
        assert_eq!(answer.status, 400, "{what}: {answer:?}");
        assert!(answer.body.contains(reason), "{what}: {answer:?}");
        for pod in [&web, &intruder, &stray] {
            let rules = rules_v4(pod, a.backend);
            assert!(
                !rules.contains("ISTIO"),
                "{what}: rules in {}:\n{rules}",
                pod.name
            );
        }
    }
    assert!(a.enroller.enrolled(&format!("{NS}/web")).is_none());
    assert!(a.enroller.enrolled(&format!("{NS}/far")).is_none());
    assert!(a.zds.enrolled().is_empty());
    assert_eq!(ztunnel.seen(), ["snap"], "ztunnel was handed nothing");
    let metrics = a.enroller.metrics.encode();
    assert!(
        metrics.contains("istio_cni_enrollment_failures_total{reason=\"cni_add_refused\"} 7"),
        "{metrics}"
    );

    // The genuine ADD goes through, with the netns it checked.
    let answer = post(&sock, &event("web", &web_uid, &path(&web), &web.ip)).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(owned_v4(&web, a.backend), golden());
    let web_inode = netns_inode(&web.ns.path()).unwrap();
    assert_eq!(
        ztunnel.seen(),
        ["snap".to_string(), format!("add:{web_uid}:{web_inode}")]
    );

    // Churn: pods enrolled at once, then deleted; no lock entry survives them.
    let mut churn = Vec::new();
    for i in 0..6 {
        let name = format!("ch{i}");
        let pod = node.add_pod("frg", &name).unwrap();
        let uid = create_pod(&client, "node212", &name, None).await;
        churn.push((pod, uid));
    }
    let adds = churn.iter().map(|(pod, uid)| {
        let event = event(&pod.name, uid, &path(pod), &pod.ip);
        let sock = sock.clone();
        async move { post(&sock, &event).await }
    });
    for answer in futures::future::join_all(adds).await {
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    let pods: Api<KPod> = Api::namespaced(client.clone(), NS);
    for (pod, _) in &churn {
        pods.delete(&pod.name, &DeleteParams::default())
            .await
            .unwrap();
    }
    for (pod, _) in &churn {
        let key = format!("{NS}/{}", pod.name);
        eventually("the deletion", Duration::from_secs(10), || {
            a.cache.cached_pod(&key).is_none()
        })
        .await;
        a.enroller.reconcile(&key).await.unwrap();
        assert!(a.enroller.enrolled(&key).is_none());
    }
    assert_eq!(a.enroller.pod_locks_len(), 0, "the lock map kept entries");
    a.cancel.cancel();
    control.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn netns_is_held_by_fd_across_pid_reuse() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let api = kube_apiserver_lite::ApiServer::bind("127.0.0.1:0", None)
        .await
        .unwrap();
    let control = api.spawn();
    let client = kube::Client::try_from(kube::Config::new(control.url().parse().unwrap())).unwrap();
    let node = Node::new("pid", 213).unwrap();
    let alpha = node.add_pod("pid", "alpha").unwrap();
    let beta = node.add_pod("pid", "beta").unwrap();
    ambient_namespace(&client).await;
    let alpha_uid = create_pod(&client, "node213", "alpha", Some(&alpha.ip)).await;
    let beta_uid = create_pod(&client, "node213", "beta", Some(&beta.ip)).await;
    let sleeper = |pod: &Pod, name: &str| {
        let mut cmd = pod.ns.command("sleep");
        cmd.arg("600");
        ChildGuard::spawn(name, cmd).unwrap()
    };
    // `ip netns exec` execs the command: the child's pid is the sleeper's.
    let mut alpha_proc = sleeper(&alpha, "pid-alpha-sleep");
    let beta_proc = sleeper(&beta, "pid-beta-sleep");
    let alpha_inode = netns_inode(&alpha.ns.path()).unwrap();
    let beta_inode = netns_inode(&beta.ns.path()).unwrap();
    eventually(
        "the sleepers to enter their netns",
        Duration::from_secs(10),
        || {
            let of = |pid: u32| netns_inode(Path::new(&format!("/proc/{pid}/ns/net"))).ok();
            of(alpha_proc.pid()) == Some(alpha_inode) && of(beta_proc.pid()) == Some(beta_inode)
        },
    )
    .await;

    // The host's /proc as the agent sees it, with one pod process: pid 4242.
    let proc_root = dir.path().join("proc");
    std::fs::create_dir_all(proc_root.join("1/ns")).unwrap();
    std::os::unix::fs::symlink("/proc/1/ns/net", proc_root.join("1/ns/net")).unwrap();
    std::fs::create_dir_all(proc_root.join("4242/ns")).unwrap();
    let pid_link = proc_root.join("4242/ns/net");
    std::os::unix::fs::symlink(format!("/proc/{}/ns/net", alpha_proc.pid()), &pid_link).unwrap();

    let a = agent(
        &client,
        "node213",
        dir.path(),
        proc_root,
        Duration::from_secs(3),
    )
    .await;
    let first = FakeZtunnel::connect(&a.sock).await;
    eventually("the fake ztunnel", Duration::from_secs(10), || {
        a.zds.connections() == 1
    })
    .await;
    // alpha runs already: found through <proc>/4242/ns/net. beta through its CNI ADD.
    let alpha_key = format!("{NS}/alpha");
    eventually("the pods in the cache", Duration::from_secs(10), || {
        a.cache.cached_pod(&alpha_key).is_some()
            && a.cache.cached_pod(&format!("{NS}/beta")).is_some()
    })
    .await;
    a.enroller.reconcile(&alpha_key).await.unwrap();
    let beta_event = event(
        "beta",
        &beta_uid,
        &beta.ns.path().display().to_string(),
        &beta.ip,
    );
    EnrollOnAdd::new(a.enroller.clone())
        .handle(beta_event)
        .await
        .unwrap();
    assert_eq!(owned_v4(&alpha, a.backend), golden());
    assert_eq!(owned_v4(&beta, a.backend), golden());
    assert!(first
        .seen()
        .contains(&format!("add:{alpha_uid}:{alpha_inode}")));

    // alpha's process exits and its pid goes to a process of beta.
    alpha_proc.kill();
    std::fs::remove_file(&pid_link).unwrap();
    std::os::unix::fs::symlink(format!("/proc/{}/ns/net", beta_proc.pid()), &pid_link).unwrap();
    assert_eq!(netns_inode(&pid_link).unwrap(), beta_inode);

    // A restarted ztunnel gets each pod's own netns back.
    drop(first);
    eventually(
        "the first connection to go",
        Duration::from_secs(10),
        || a.zds.connections() == 0,
    )
    .await;
    let second = FakeZtunnel::connect(&a.sock).await;
    eventually("the snapshot", Duration::from_secs(10), || {
        second.seen().last().is_some_and(|s| s == "snap")
    })
    .await;
    let mut replay = second.seen();
    replay.sort();
    let mut expected = vec![
        format!("add:{alpha_uid}:{alpha_inode}"),
        format!("add:{beta_uid}:{beta_inode}"),
        "snap".to_string(),
    ];
    expected.sort();
    assert_eq!(replay, expected, "replay must carry each pod's own netns");

    // alpha opts out: its rules go, beta's stay.
    Api::<KPod>::namespaced(client.clone(), NS)
        .patch(
            "alpha",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"istio.io/dataplane-mode": "none"}}})),
        )
        .await
        .unwrap();
    eventually("the label in the cache", Duration::from_secs(10), || {
        a.cache.cached_pod(&alpha_key).is_some_and(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("istio.io/dataplane-mode"))
                .is_some_and(|v| v == "none")
        })
    })
    .await;
    a.enroller.reconcile(&alpha_key).await.unwrap();
    assert!(
        !rules_v4(&alpha, a.backend).contains("ISTIO"),
        "alpha's rules stayed"
    );
    assert_eq!(
        owned_v4(&beta, a.backend),
        golden(),
        "beta's rules were touched"
    );
    assert!(second.seen().contains(&format!("del:{alpha_uid}")));

    // beta is deleted: its netns goes with its sandbox, and the log says so.
    let (capture, subscriber) = capture_subscriber();
    let beta_key = format!("{NS}/beta");
    Api::<KPod>::namespaced(client.clone(), NS)
        .delete("beta", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the deletion", Duration::from_secs(10), || {
        a.cache.cached_pod(&beta_key).is_none()
    })
    .await;
    {
        let _log = tracing::subscriber::set_default(subscriber);
        a.enroller.reconcile(&beta_key).await.unwrap();
    }
    let said = capture.events().iter().any(|e| {
        e.field("message")
            .is_some_and(|m| m.contains("network namespace and the redirection rules in it"))
    });
    assert!(said, "{:?}", capture.events());
    assert!(a.enroller.enrolled(&beta_key).is_none());
    assert_eq!(a.enroller.pod_locks_len(), 0);
    a.cancel.cancel();
    control.shutdown();
}
