//! istiod-lite's model keeps no memory from a re-list: through some eighty 410 re-lists
//! of 300 pods (what every API server restart or compaction causes), the live heap does
//! not trend upward once warm. Counted exactly by a global allocator that tracks
//! live bytes, beside the RSS the soak samples. The API server (kube-apiserver-lite)
//! runs in-process too: its objects are the same every round and its event log is
//! compacted, so it adds no growth of its own. No root needed.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use istiod_lite::kube::pods::PodIndex;
use istiod_lite::model::{self, Options};
use istiod_lite::xds::store::ResourceStore;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::Client;
use kube_apiserver_lite::ApiServer;
use serde_json::json;
use shared_types::istio::xds::ADDRESS_TYPE_URL;
use tokio_util::sync::CancellationToken;

/// The system allocator, counting the bytes live.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const PODS: usize = 300;
const ROUNDS: usize = 24;
/// Rounds that reach the steady state (connection pools, buffers sized to a whole
/// list, the xDS change log filling to its bound) before the trend is judged.
const WARM_UP_ROUNDS: usize = 4;
/// A leak this fast per round (a round re-lists 3-5 times) fails the test.
const LEAK_KIB_PER_ROUND: f64 = 40.0;
const WAIT: Duration = Duration::from_secs(30);

fn live_kib() -> isize {
    LIVE.load(Ordering::Relaxed) / 1024
}

async fn create_pod(api: &Api<Pod>, name: &str, ip: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "churn", "labels": {"app": "web"},
                     "annotations": {"ambient.istio.io/redirection": "enabled"}},
        "spec": {"serviceAccountName": "web", "nodeName": "node-1",
                 "containers": [{"name": "app", "image": "app"}]},
    }))
    .unwrap();
    api.create(&PostParams::default(), &pod).await.unwrap();
    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                                   "conditions": [{"type": "Ready", "status": "True"}]}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// Waits until the model publishes `count` addresses.
async fn published(store: &ResourceStore, count: usize) {
    test_support::poll::eventually("the model follows", WAIT, || {
        store.len(ADDRESS_TYPE_URL) == count
    })
    .await;
}

/// The least-squares slope of `ys` against their index.
fn trend(ys: &[isize]) -> f64 {
    let n = ys.len() as f64;
    let mean_x = (n - 1.0) / 2.0;
    let mean_y = ys.iter().sum::<isize>() as f64 / n;
    let (mut num, mut den) = (0.0, 0.0);
    for (x, &y) in ys.iter().enumerate() {
        let dx = x as f64 - mean_x;
        num += dx * (y as f64 - mean_y);
        den += dx * dx;
    }
    num / den
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relists_leave_no_memory_behind_in_the_model() {
    let server = ApiServer::bind("127.0.0.1:0", None).await.unwrap();
    let client = Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let control = server.spawn();
    // The mesh's CRDs, so every one of the model's five watches is served and re-lists.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in test_support::crds::shipped().unwrap() {
        let crd = serde_json::from_value(crd).unwrap();
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "churn"}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "churn");
    for i in 0..PODS {
        create_pod(
            &pods,
            &format!("web-{i}"),
            &format!("10.1.{}.{}", i / 250, i % 250 + 1),
        )
        .await;
    }
    let store = ResourceStore::default();
    let cancel = CancellationToken::new();
    let mut synced = model::start(
        client.clone(),
        Options::default(),
        store.clone(),
        PodIndex::default(),
        cancel.clone(),
    );
    synced.wait_for(|s| *s).await.unwrap();
    published(&store, PODS).await;

    // Each round: a pod comes while the watches are away and the log is compacted, so
    // the watches are answered 410 and re-list (those admitted before the compaction
    // resume instead); the pod is then deleted (the watches are live again and the
    // model has rebuilt).
    let mut live = Vec::new();
    for round in 0..ROUNDS {
        let expired = control.stats().expired_watches;
        let pause = control.pause_watches();
        create_pod(&pods, "marker", "10.9.9.9").await;
        control.compact();
        drop(pause);
        test_support::poll::eventually("a watch re-listed", WAIT, || {
            control.stats().expired_watches > expired
        })
        .await;
        published(&store, PODS + 1).await;
        pods.delete("marker", &DeleteParams::default())
            .await
            .unwrap();
        published(&store, PODS).await;
        control.compact();
        live.push(live_kib());
        eprintln!(
            "round {round}: live heap {} KiB, RSS {} KiB",
            live_kib(),
            test_support::procfs::rss_kib(std::process::id())
        );
    }
    // Each sample moves by a few hundred KiB with what is in flight, so the judge is
    // the trend (least squares) over the rounds after warm-up: a re-list that kept
    // anything would lift it round after round.
    let relists = control.stats().expired_watches;
    assert!(relists >= ROUNDS as u64, "only {relists} re-lists");
    let slope = trend(&live[WARM_UP_ROUNDS..]);
    assert!(
        slope < LEAK_KIB_PER_ROUND,
        "the live heap grows {slope:.0} KiB a round over {relists} re-lists: {live:?}"
    );
    cancel.cancel();
    control.shutdown();
    control.stopped().await;
}
