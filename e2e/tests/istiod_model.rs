//! The model against a real HTTP API server (e2e's kube-apiserver-lite, in-process on
//! 127.0.0.1): objects created with kube-rs become xDS resources that, applied by
//! ztunnel's own client code, show up in a ztunnel StateStore; changes and deletions
//! are followed, a 410 re-list and API server restarts neither lose nor duplicate
//! state, and readiness waits for the first complete sync. No root needed.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;
use test_support::poll::eventually;

use istiod_lite::kube::pods::PodIndex;
use istiod_lite::model::{self, Options};
use istiod_lite::xds::store::{Changes, ResourceStore};
use k8s_openapi::api::core::v1::{Namespace, Pod, Service as KubeService};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::Client;
use kube_apiserver_lite::{ApiServer, Control};
use mesh_runtime::readiness::Readiness;
use serde_json::json;
use shared_types::istio::xds::{
    resource, DeltaDiscoveryResponse, ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL,
};
use tokio_util::sync::CancellationToken;
use ztunnel::discovery::xds::Resources;
use ztunnel::discovery::FirstSync;
use ztunnel::state::{Action, Protocol, Scope, StateStore};

const WAIT: Duration = Duration::from_secs(20);

fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "ztunnel=debug".into()),
        )
        .with_test_writer()
        .try_init();
}

fn client_for(url: &str) -> Client {
    Client::try_from(kube::Config::new(url.parse().expect("url"))).expect("client")
}

/// The API server with the mesh's CRDs (kept across restarts by `state_file`).
async fn serve(addr: &str, state_file: Option<PathBuf>) -> (Control, Client) {
    let server = ApiServer::bind(addr, state_file).await.expect("bind");
    let client = client_for(&server.url());
    let control = server.spawn();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in test_support::crds::shipped().expect("the shipped CRDs") {
        let crd = serde_json::from_value(crd).expect("a CRD");
        match crds.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("create CRD: {e}"),
        }
    }
    (control, client)
}

async fn stop(control: &Control) {
    control.shutdown();
    control.stopped().await;
}

/// Starts the model against `client`, and a ztunnel state that follows what it
/// publishes; readiness waits for the model's first sync.
fn discover(client: &Client, readiness: &Readiness) -> (StateStore, FirstSync, CancellationToken) {
    let state = StateStore::new();
    let cancel = CancellationToken::new();
    let resources = ResourceStore::default();
    let synced = model::start(
        client.clone(),
        Options::default(),
        resources.clone(),
        PodIndex::default(),
        cancel.clone(),
    );
    let (followed, first_sync) = tokio::sync::watch::channel(false);
    tokio::spawn(follow(
        resources,
        synced,
        (readiness.register("model"), followed),
        state.clone(),
        cancel.clone(),
    ));
    (state, FirstSync::new(first_sync), cancel)
}

/// What a ztunnel streaming from `resources` holds: each change since the last one
/// applied as a delta response, by ztunnel's own client code, then published. Once
/// the model's first sync is applied, `ready` is released and flagged.
async fn follow(
    resources: ResourceStore,
    mut model_synced: tokio::sync::watch::Receiver<bool>,
    ready: (
        mesh_runtime::readiness::BlockReady,
        tokio::sync::watch::Sender<bool>,
    ),
    state: StateStore,
    cancel: CancellationToken,
) {
    let mut ready = Some(ready);
    let mut held = Resources::default();
    let mut seen = 0;
    let mut changes = resources.subscribe();
    loop {
        // Read first: the model publishes before it says it is synced.
        let model_done = *model_synced.borrow_and_update();
        let (changed, generation) = resources.changes_since(seen);
        seen = generation;
        for type_url in [AUTHORIZATION_TYPE_URL, ADDRESS_TYPE_URL] {
            let names: Vec<String> = match &changed {
                Changes::Names(names) => names
                    .get(type_url)
                    .into_iter()
                    .flatten()
                    .map(|n| n.to_string())
                    .collect(),
                Changes::Everything => resources
                    .all(type_url)
                    .keys()
                    .map(|n| n.to_string())
                    .chain(held.versions(type_url).into_keys())
                    .collect(),
            };
            let mut response = DeltaDiscoveryResponse {
                type_url: type_url.into(),
                ..Default::default()
            };
            for name in names {
                match resources.get(type_url, &name) {
                    Some(entry) => {
                        let body = entry.body.clone();
                        response
                            .resources
                            .push(resource(name, entry.version(), body))
                    }
                    None => response.removed_resources.push(name),
                }
            }
            let refused = held.apply(response);
            assert!(refused.is_empty(), "ztunnel refused {refused:?}");
        }
        if generation > 0 {
            state.replace_source("xds", held.state().clone());
        }
        if model_done {
            if let Some((block, flag)) = ready.take() {
                drop(block);
                flag.send_replace(true);
            }
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            changed = changes.changed() => if changed.is_err() { return },
            changed = model_synced.changed() => if changed.is_err() { return },
        }
    }
}

async fn synced(d: &FirstSync) {
    tokio::time::timeout(WAIT, d.wait_synced())
        .await
        .expect("initial sync timed out");
}

async fn namespace(client: &Client, name: &str) {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("create namespace");
}

/// A Running, Ready pod with `ip` (set through the pods/status subresource).
async fn pod(
    client: &Client,
    ns: &str,
    name: &str,
    labels: serde_json::Value,
    ip: &str,
    hbone: bool,
) {
    let annotations = if hbone {
        json!({"ambient.istio.io/redirection": "enabled"})
    } else {
        json!({})
    };
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations},
        "spec": {
            "serviceAccountName": "web",
            "nodeName": "node-1",
            "containers": [{"name": "app", "image": "app", "ports": [{"name": "http", "containerPort": 8080}]}],
        },
    }))
    .unwrap();
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &p)
        .await
        .expect("create pod");
    let status = json!({"status": {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True"}],
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("patch pod status");
}

async fn delete_pod(client: &Client, ns: &str, name: &str) {
    Api::<Pod>::namespaced(client.clone(), ns)
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete pod");
}

async fn service(client: &Client, ns: &str, name: &str, vip: &str) {
    let s: KubeService = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "clusterIP": vip, "clusterIPs": [vip],
            "selector": {"app": "web"},
            "ports": [{"name": "http", "port": 80, "targetPort": "http"}, {"name": "admin", "port": 9000, "targetPort": 9090}],
        },
    }))
    .unwrap();
    Api::<KubeService>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &s)
        .await
        .expect("create service");
}

fn policies(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &model::authorization_policy_resource())
}

async fn policy(client: &Client, ns: &str, name: &str, spec: serde_json::Value) {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))
    .unwrap();
    policies(client, ns)
        .create(&PostParams::default(), &obj)
        .await
        .expect("create policy");
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Names of the workloads in the store, sorted; one entry per workload.
fn workload_names(store: &StateStore) -> Vec<String> {
    let snap = store.snapshot();
    let mut names: Vec<String> = snap.workloads().map(|w| w.name.clone()).collect();
    names.sort();
    names
}

const SVC_KEY: &str = "app/web.app.svc.cluster.local";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovers_objects_and_follows_changes() {
    init_logs();
    let (control, client) = serve("127.0.0.1:0", None).await;
    namespace(&client, "app").await;
    namespace(&client, "istio-system").await;
    pod(
        &client,
        "app",
        "web-1",
        json!({"app": "web"}),
        "10.0.0.1",
        true,
    )
    .await;
    pod(
        &client,
        "app",
        "web-2",
        json!({"app": "web"}),
        "10.0.0.2",
        false,
    )
    .await;
    service(&client, "app", "web", "10.96.0.10").await;
    policy(&client, "app", "allow-client", json!({
        "selector": {"matchLabels": {"app": "web"}},
        "rules": [{"from": [{"source": {"namespaces": ["client"], "principals": ["cluster.local/ns/client/*"]}}],
                   "to": [{"operation": {"ports": ["8080"]}}]}],
    }))
    .await;
    policy(&client, "istio-system", "no-deletes", json!({
        "action": "DENY",
        "rules": [{"to": [{"operation": {"methods": ["DELETE"]}}], "from": [{"source": {"namespaces": ["untrusted"]}}]}],
    }))
    .await;

    let readiness = Readiness::new();
    let (store, d, cancel) = discover(&client, &readiness);
    synced(&d).await;
    assert!(
        readiness.is_ready(),
        "readiness released after the first sync"
    );

    // Workloads.
    let w1 = store.workload_by_ip(ip("10.0.0.1")).expect("web-1");
    assert_eq!(w1.uid, "Kubernetes//Pod/app/web-1");
    assert_eq!(w1.protocol, Protocol::Hbone);
    assert_eq!(w1.service_account, "web");
    assert_eq!(w1.node, "node-1");
    assert_eq!(w1.authorization_policies, vec!["app/allow-client"]);
    assert_eq!(
        w1.services[SVC_KEY].get(&80),
        Some(&8080),
        "named targetPort"
    );
    assert_eq!(w1.services[SVC_KEY].get(&9000), Some(&9090));
    assert_eq!(
        store.workload_by_ip(ip("10.0.0.2")).unwrap().protocol,
        Protocol::Tcp
    );

    // Services and endpoints.
    let svc = store
        .service_by_vip(ip("10.96.0.10"))
        .expect("service by VIP");
    assert_eq!(svc.hostname, "web.app.svc.cluster.local");
    let eps: Vec<(String, u16)> = store
        .service_endpoints(&svc, 80)
        .iter()
        .map(|(w, p)| (w.name.clone(), *p))
        .collect();
    assert_eq!(eps, vec![("web-1".into(), 8080), ("web-2".into(), 8080)]);

    // Policies.
    let snap = store.snapshot();
    let allow = snap.policy("app/allow-client").expect("allow policy");
    assert_eq!(
        (allow.scope, allow.action),
        (Scope::WorkloadSelector, Action::Allow)
    );
    let deny = snap.policy("istio-system/no-deletes").expect("deny policy");
    assert_eq!((deny.scope, deny.action), (Scope::Global, Action::Deny));
    assert_eq!(deny.rules[0].len(), 1, "L7 `to` dropped, `from` kept");
    // What was dropped (the `to`'s HTTP attributes) is logged by istiod-lite: xDS has
    // no field for it (policy_tests checks the warnings themselves).
    assert!(deny.warnings.is_empty());

    // Changes: relabel web-2 out of the service, delete web-1, change the policy.
    let gen = store.generation();
    Api::<Pod>::namespaced(client.clone(), "app")
        .patch(
            "web-2",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app": "other"}}})),
        )
        .await
        .unwrap();
    delete_pod(&client, "app", "web-1").await;
    policies(&client, "app")
        .patch(
            "allow-client",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"action": "DENY"}})),
        )
        .await
        .unwrap();
    eventually("changes followed", WAIT, || {
        store.workload_by_ip(ip("10.0.0.1")).is_none()
            && store
                .workload_by_ip(ip("10.0.0.2"))
                .is_some_and(|w| w.services.is_empty())
            && store
                .snapshot()
                .policy("app/allow-client")
                .is_some_and(|p| p.action == Action::Deny)
    })
    .await;
    assert!(store.generation() > gen);
    assert!(store
        .workload_by_ip(ip("10.0.0.2"))
        .unwrap()
        .authorization_policies
        .is_empty());

    // Deletions.
    Api::<KubeService>::namespaced(client.clone(), "app")
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    policies(&client, "istio-system")
        .delete("no-deletes", &DeleteParams::default())
        .await
        .unwrap();
    eventually("deletions followed", WAIT, || {
        let snap = store.snapshot();
        store.service_by_vip(ip("10.96.0.10")).is_none()
            && snap.policy("istio-system/no-deletes").is_none()
    })
    .await;
    assert_eq!(workload_names(&store), vec!["web-2"]);

    // A pod that finished is no longer a workload.
    Api::<Pod>::namespaced(client.clone(), "app")
        .patch_status(
            "web-2",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
        )
        .await
        .unwrap();
    eventually("finished pod removed", WAIT, || {
        workload_names(&store).is_empty()
    })
    .await;

    cancel.cancel();
    stop(&control).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relists_after_410_without_losing_or_duplicating_state() {
    init_logs();
    let (control, client) = serve("127.0.0.1:0", None).await;
    namespace(&client, "app").await;
    for (name, addr) in [("a", "10.0.1.1"), ("b", "10.0.1.2")] {
        pod(&client, "app", name, json!({"app": "web"}), addr, true).await;
    }
    policy(&client, "app", "gone-while-away", json!({"action": "DENY"})).await;
    let readiness = Readiness::new();
    let (store, d, cancel) = discover(&client, &readiness);
    synced(&d).await;
    assert_eq!(workload_names(&store), vec!["a", "b"]);

    // While every watch is away: delete b and the policy, add c, then compact the
    // event log so the resuming watches get 410 and must re-list.
    let pause = control.pause_watches();
    delete_pod(&client, "app", "b").await;
    pod(&client, "app", "c", json!({"app": "web"}), "10.0.1.3", true).await;
    policies(&client, "app")
        .delete("gone-while-away", &DeleteParams::default())
        .await
        .unwrap();
    control.compact();
    drop(pause);

    eventually("re-listed state", WAIT, || {
        workload_names(&store) == ["a", "c"]
            && store.snapshot().policy("app/gone-while-away").is_none()
    })
    .await;
    assert!(
        control.stats().expired_watches > 0,
        "the watches were answered 410"
    );
    assert_eq!(
        store.snapshot().counts(),
        (2, 0, 0),
        "nothing lost, nothing duplicated"
    );
    assert!(store.workload_by_ip(ip("10.0.1.2")).is_none());
    assert_eq!(store.workload_by_ip(ip("10.0.1.3")).unwrap().name, "c");

    // The watches are live again after the re-list.
    pod(&client, "app", "d", json!({}), "10.0.1.4", false).await;
    eventually("pod after re-list", WAIT, || {
        workload_names(&store) == ["a", "c", "d"]
    })
    .await;

    cancel.cancel();
    stop(&control).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_api_server_restarts() {
    init_logs();
    let dir = tempfile::tempdir().unwrap();
    let state_file = dir.path().join("apiserver.json");
    // Nothing listens yet: discovery retries with backoff and readiness waits.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let client = client_for(&format!("http://{addr}"));
    let readiness = Readiness::new();
    let (store, d, cancel) = discover(&client, &readiness);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!readiness.is_ready() && !d.is_synced());
    assert_eq!(readiness.pending(), vec!["model"]);

    let (control, _) = serve(&addr, Some(state_file.clone())).await;
    namespace(&client, "app").await;
    pod(&client, "app", "a", json!({"app": "web"}), "10.0.2.1", true).await;
    service(&client, "app", "web", "10.96.0.20").await;
    synced(&d).await;
    assert!(readiness.is_ready());
    eventually("first pod", WAIT, || workload_names(&store) == ["a"]).await;

    // Restart with the state file: objects and resourceVersions survive; the watches
    // resume and state is neither lost nor duplicated.
    stop(&control).await;
    let gen = store.generation();
    let (control, _) = serve(&addr, Some(state_file.clone())).await;
    pod(&client, "app", "b", json!({"app": "web"}), "10.0.2.2", true).await;
    eventually("pod after restart", WAIT, || {
        workload_names(&store) == ["a", "b"]
    })
    .await;
    assert!(store.generation() > gen);
    let svc = store.service_by_vip(ip("10.96.0.20")).unwrap();
    assert_eq!(store.service_endpoints(&svc, 80).len(), 2);

    // Restart, and delete while the watches are still away (held, then 410).
    stop(&control).await;
    let (control, _) = serve(&addr, Some(state_file.clone())).await;
    let pause = control.pause_watches();
    delete_pod(&client, "app", "a").await;
    control.compact();
    drop(pause);
    eventually("deleted while disconnected", WAIT, || {
        workload_names(&store) == ["b"]
    })
    .await;

    // A fresh server without state (e.g. a new cluster's etcd): everything is gone.
    stop(&control).await;
    let (control, client2) = serve(&addr, None).await;
    eventually("empty cluster", WAIT, || store.snapshot().is_empty()).await;
    namespace(&client2, "app").await;
    pod(&client2, "app", "z", json!({}), "10.0.2.9", false).await;
    eventually("new cluster's pod", WAIT, || {
        workload_names(&store) == ["z"]
    })
    .await;

    cancel.cancel();
    stop(&control).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesces_bursts_of_events() {
    init_logs();
    let (control, client) = serve("127.0.0.1:0", None).await;
    namespace(&client, "burst").await;
    let readiness = Readiness::new();
    let (store, d, cancel) = discover(&client, &readiness);
    synced(&d).await;
    let before = store.generation();
    // 40 pods, each a create and a status update: 80 watch events in a burst.
    let creates = (0..40).map(|i| {
        let client = client.clone();
        async move {
            let addr = format!("10.0.3.{}", i + 1);
            pod(&client, "burst", &format!("p{i}"), json!({}), &addr, false).await
        }
    });
    futures::future::join_all(creates).await;
    eventually("all pods", WAIT, || store.snapshot().counts().0 == 40).await;
    let rebuilds = store.generation() - before;
    assert!(rebuilds < 40, "{rebuilds} publishes for 80 events");
    cancel.cancel();
    stop(&control).await;
}

/// A PeerAuthentication, created through the v1beta1 API (discovery watches v1).
async fn peer_authn(client: &Client, ns: &str, name: &str, spec: serde_json::Value) {
    let mut ar = model::peer_authn::resource();
    ar.version = "v1beta1".into();
    ar.api_version = "security.istio.io/v1beta1".into();
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "security.istio.io/v1beta1",
        "kind": "PeerAuthentication",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))
    .unwrap();
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar)
        .create(&PostParams::default(), &obj)
        .await
        .expect("create peer authentication");
}

async fn delete_peer_authn(client: &Client, ns: &str, name: &str) {
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &model::peer_authn::resource())
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete peer authentication");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_authentication_strict_refuses_plaintext_and_follows_changes() {
    use ztunnel::state::ConnectionAttrs;
    init_logs();
    let (control, client) = serve("127.0.0.1:0", None).await;
    namespace(&client, "app").await;
    namespace(&client, "istio-system").await;
    pod(
        &client,
        "app",
        "web",
        json!({"app": "web"}),
        "10.0.4.1",
        true,
    )
    .await;
    pod(&client, "app", "db", json!({"app": "db"}), "10.0.4.2", true).await;
    let readiness = Readiness::new();
    let (store, d, cancel) = discover(&client, &readiness);
    synced(&d).await;

    // Plaintext (no identity) to `ip:8080`: the reason it is refused, if it is.
    let plaintext = |ip_: &str| {
        let dst = store.workload_by_ip(ip(ip_)).expect("workload");
        let attrs = ConnectionAttrs {
            src_identity: None,
            src_ip: ip("10.9.9.9"),
            dst: format!("{ip_}:8080").parse().unwrap(),
        };
        store.authorize(&attrs, &dst).err().map(|d| d.reason())
    };
    assert_eq!(plaintext("10.0.4.1"), None, "PERMISSIVE by default");

    peer_authn(
        &client,
        "istio-system",
        "default",
        json!({"mtls": {"mode": "STRICT"}}),
    )
    .await;
    eventually("mesh-wide STRICT", WAIT, || {
        plaintext("10.0.4.1") == Some("strict_mtls") && plaintext("10.0.4.2") == Some("strict_mtls")
    })
    .await;
    let snap = store.snapshot();
    let strict = snap
        .policy("istio-system/istio_converted_static_strict")
        .expect("the static STRICT policy");
    assert_eq!(
        (strict.scope, strict.action),
        (Scope::WorkloadSelector, Action::Deny)
    );

    // A workload policy takes web out of STRICT; db inherits the mesh's.
    peer_authn(
        &client,
        "app",
        "web-permissive",
        json!({
            "selector": {"matchLabels": {"app": "web"}},
            "mtls": {"mode": "PERMISSIVE"},
        }),
    )
    .await;
    eventually("web PERMISSIVE", WAIT, || plaintext("10.0.4.1").is_none()).await;
    assert_eq!(plaintext("10.0.4.2"), Some("strict_mtls"));

    // The mesh policy goes: db is PERMISSIVE again.
    delete_peer_authn(&client, "istio-system", "default").await;
    eventually("mesh policy gone", WAIT, || plaintext("10.0.4.2").is_none()).await;
    cancel.cancel();
    stop(&control).await;
}

/// `istio.io/use-waypoint` on a namespace binds its services to that waypoint, and its
/// pods too once the waypoint's Gateway says `istio.io/waypoint-for: all`; a pod's own
/// `none` opts it out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn use_waypoint_labels_bind_services_and_pods() {
    init_logs();
    let (control, client) = serve("127.0.0.1:0", None).await;
    namespace(&client, "wp").await;
    pod(
        &client,
        "wp",
        "web",
        json!({"app": "web"}),
        "10.0.9.5",
        true,
    )
    .await;
    service(&client, "wp", "web", "10.96.9.10").await;
    let readiness = Readiness::new();
    let (store, d, cancel) = discover(&client, &readiness);
    synced(&d).await;
    let service_waypoint = |store: &StateStore| {
        store
            .service_by_vip(ip("10.96.9.10"))
            .and_then(|s| s.waypoint.clone())
            .map(|w| w.destination.to_string())
    };
    let pod_waypoint = |store: &StateStore| {
        store
            .workload_by_ip(ip("10.0.9.5"))
            .and_then(|w| w.waypoint.clone())
            .map(|w| w.destination.to_string())
    };
    assert_eq!(service_waypoint(&store), None);
    assert_eq!(pod_waypoint(&store), None);

    let labels = |value: &str| json!({"metadata": {"labels": {"istio.io/use-waypoint": value}}});
    Api::<Namespace>::all(client.clone())
        .patch(
            "wp",
            &PatchParams::default(),
            &Patch::Merge(labels("waypoint")),
        )
        .await
        .expect("label the namespace");
    // No Gateway yet: Istio's default `waypoint-for: service`.
    eventually("the namespace's waypoint", WAIT, || {
        service_waypoint(&store).is_some()
    })
    .await;
    assert_eq!(
        service_waypoint(&store).as_deref(),
        Some("wp/waypoint.wp.svc.cluster.local")
    );
    assert_eq!(pod_waypoint(&store), None);
    let gateways = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        "wp",
        &istiod_lite::model::gateway_resource(),
    );
    let gateway: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "waypoint", "namespace": "wp", "labels": {"istio.io/waypoint-for": "all"}},
        "spec": {"gatewayClassName": "istio-waypoint",
                 "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]},
    }))
    .unwrap();
    gateways
        .create(&PostParams::default(), &gateway)
        .await
        .expect("create the Gateway");
    eventually("the pod bound by waypoint-for: all", WAIT, || {
        pod_waypoint(&store).is_some()
    })
    .await;

    Api::<Pod>::namespaced(client.clone(), "wp")
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(labels("none")),
        )
        .await
        .expect("label the pod");
    eventually("the pod's opt-out", WAIT, || pod_waypoint(&store).is_none()).await;
    assert!(service_waypoint(&store).is_some());
    cancel.cancel();
    stop(&control).await;
}
