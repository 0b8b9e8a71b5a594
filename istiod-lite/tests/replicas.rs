//! istiod-lite as several replicas: the leader election over a Lease (against the
//! local API server, whose writes conflict on a stale resourceVersion as the real
//! one's do), and the real binary twice, the leader killed.

use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

use istiod_lite::kube::leader::{self, Settings, NAMESPACE_CONTROLLER_LEASE};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, PostParams};
use kube::Client;
use kube_apiserver_lite::{write_kubeconfig, ApiServer, Control, Options};
use mesh_ca::CertificateAuthority;
use serde_json::json;
use test_support::poll::eventually;
use test_support::poll::wait_for;
use test_support::process::ChildGuard;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(20);
const NS: &str = "istio-system";

async fn apiserver() -> (Control, Client, String) {
    let server = ApiServer::bind_with("127.0.0.1:0", Options::default())
        .await
        .unwrap();
    let url = server.url();
    let client = Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    let control = server.spawn();
    create_namespace(&client, NS).await;
    (control, client, url)
}

async fn create_namespace(client: &Client, name: &str) {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
}

async fn holder(client: &Client) -> Option<String> {
    let lease = Api::<Lease>::namespaced(client.clone(), NS)
        .get_opt(NAMESPACE_CONTROLLER_LEASE)
        .await
        .ok()??;
    lease.spec?.holder_identity.filter(|h| !h.is_empty())
}

fn settings(identity: &str) -> Settings {
    Settings {
        namespace: NS.into(),
        lease_name: NAMESPACE_CONTROLLER_LEASE.into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(1),
    }
}

/// Three candidates: exactly one leads at every moment and it is the Lease's holder;
/// when it shuts down it releases the Lease and another takes over.
#[tokio::test]
async fn exactly_one_candidate_leads_and_a_released_lease_is_taken_over() {
    let (_api, client, _) = apiserver().await;
    let mut candidates: Vec<(String, CancellationToken, watch::Receiver<bool>)> = Vec::new();
    for name in ["a", "b", "c"] {
        let cancel = CancellationToken::new();
        let leading = leader::start(client.clone(), settings(name), cancel.clone());
        candidates.push((name.to_owned(), cancel, leading));
    }
    let leaders = |c: &[(String, CancellationToken, watch::Receiver<bool>)]| -> Vec<String> {
        c.iter()
            .filter(|(_, _, l)| *l.borrow())
            .map(|(n, _, _)| n.clone())
            .collect()
    };
    eventually("a leader", WAIT, || async {
        leaders(&candidates).len() == 1
    })
    .await;
    // Over several renewals, never two.
    for _ in 0..40 {
        let now = leaders(&candidates);
        assert!(now.len() <= 1, "two leaders at once: {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = leaders(&candidates).pop().unwrap();
    assert_eq!(holder(&client).await.as_deref(), Some(first.as_str()));

    let i = candidates.iter().position(|(n, _, _)| *n == first).unwrap();
    let (_, cancel, mut stepped_down) = candidates.remove(i);
    cancel.cancel();
    tokio::time::timeout(WAIT, stepped_down.wait_for(|l| !*l))
        .await
        .unwrap()
        .ok();
    eventually("another leader", WAIT, || async {
        leaders(&candidates).len() == 1
    })
    .await;
    let second = leaders(&candidates).pop().unwrap();
    assert_ne!(second, first);
    eventually("the Lease names the new leader", WAIT, || async {
        holder(&client).await.as_deref() == Some(second.as_str())
    })
    .await;
    let lease = Api::<Lease>::namespaced(client.clone(), NS)
        .get(NAMESPACE_CONTROLLER_LEASE)
        .await
        .unwrap();
    assert!(lease.spec.unwrap().lease_transitions.unwrap_or(0) >= 1);
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts the real binary as replica `pod` (its own ports, the shared CA files).
async fn replica(pod: &str, dir: &std::path::Path, kubeconfig: &std::path::Path) -> ChildGuard {
    let (grpc, metrics, ready) = (free_port(), free_port(), free_port());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_istiod-lite"));
    cmd.env("CA_CERTS_DIR", dir.join("cacerts"))
        .env("KUBECONFIG", kubeconfig)
        .env("POD_NAME", pod)
        .env("LEADER_ELECTION_LEASE_DURATION", "1s")
        .env("GRPC_ADDR", format!("127.0.0.1:{grpc}"))
        .env("MONITORING_ADDR", format!("127.0.0.1:{metrics}"))
        .env("READY_ADDR", format!("127.0.0.1:{ready}"))
        .env(
            test_support::owner::OWNER_ENV,
            test_support::owner::owner_marker(),
        );
    let guard = ChildGuard::spawn(&format!("istiod-lite-{pod}-{grpc}"), cmd).unwrap();
    let ready = std::net::SocketAddr::from(([127, 0, 0, 1], ready));
    // Blocking waits run off the runtime: the API server is served on it.
    tokio::task::spawn_blocking(move || {
        match wait_for("replica ready", WAIT, || {
            test_support::http::get_ok(ready, "/ready")
        }) {
            Ok(_) => guard,
            Err(e) => panic!("{e}\n{}", guard.log()),
        }
    })
    .await
    .unwrap()
}

/// Two replicas of the real binary: one holds the Lease and publishes the root;
/// killed (no release), the other takes over within the lease duration and keeps
/// the root in a namespace created after the failover.
#[tokio::test]
async fn when_the_leading_replica_dies_the_other_takes_over_the_root_configmaps() {
    let (_api, client, url) = apiserver().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    write_kubeconfig(&kubeconfig, &url).unwrap();
    let ca = CertificateAuthority::generate_self_signed("cluster.local").unwrap();
    ca.write(&dir.path().join("cacerts")).unwrap();
    let root = ca.roots_pem();
    let mut replicas = vec![
        (
            "istiod-a",
            replica("istiod-a", dir.path(), &kubeconfig).await,
        ),
        (
            "istiod-b",
            replica("istiod-b", dir.path(), &kubeconfig).await,
        ),
    ];

    let published = |ns: &'static str| {
        let (client, root) = (client.clone(), root.clone());
        move || {
            let (client, root) = (client.clone(), root.clone());
            async move {
                Api::<ConfigMap>::namespaced(client, ns)
                    .get_opt("istio-ca-root-cert")
                    .await
                    .ok()
                    .flatten()
                    .and_then(|cm| cm.data)
                    .is_some_and(|d| d.get("root-cert.pem") == Some(&root))
            }
        }
    };
    create_namespace(&client, "app").await;
    eventually("the root in app", WAIT, published("app")).await;
    let first = holder(&client).await.expect("a replica holds the Lease");
    let i = replicas
        .iter()
        .position(|(pod, _)| first.starts_with(&format!("{pod}_")))
        .expect("the holder is one of the replicas");
    let (dead, mut guard) = replicas.remove(i);
    guard.kill();
    drop(guard);

    let survivor = replicas[0].0;
    eventually("the survivor takes the Lease", WAIT, || async {
        holder(&client)
            .await
            .is_some_and(|h| h.starts_with(&format!("{survivor}_")))
    })
    .await;
    create_namespace(&client, "late").await;
    eventually(
        &format!("the root in a namespace created after {dead} died"),
        WAIT,
        published("late"),
    )
    .await;
}
