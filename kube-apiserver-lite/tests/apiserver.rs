//! kube-apiserver-lite against real clients: kube-rs (CRUD, patches, the status
//! subresource, watchers with selectors, 410 recovery, restarts of the real binary)
//! and, when installed (scripts/install-chart-tools.sh), a real kubectl.
//! No root needed: everything listens on 127.0.0.1.

mod support;

use support::*;
use test_support::poll::eventually;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, ResourceExt};
use kube_apiserver_lite::Options;
use serde_json::json;
use test_support::process::ChildGuard;
use tokio::sync::{mpsc, watch as state_channel};

async fn client_from_kubeconfig(path: &Path) -> Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).expect("read kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("kubeconfig");
    Client::try_from(config).expect("client")
}

fn pod(name: &str, node: &str, app: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "app:1"}]},
    }))
    .expect("pod")
}

fn namespace(name: &str) -> Namespace {
    serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace")
}

fn name_of(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

#[tokio::test]
async fn kube_client_crud_patches_and_status() {
    let (control, client) = start(Options::default()).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(&PostParams::default(), &namespace("demo"))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "demo");
    let created = pods
        .create(&PostParams::default(), &pod("web", "node1", "web"))
        .await
        .unwrap();
    let meta = &created.metadata;
    assert!(meta.uid.as_deref().is_some_and(|u| u.len() == 36));
    assert!(meta.creation_timestamp.is_some());
    assert_eq!(meta.namespace.as_deref(), Some("demo"));
    let rv: u64 = meta.resource_version.as_deref().unwrap().parse().unwrap();
    assert_eq!(
        api_code(
            pods.create(&PostParams::default(), &pod("web", "node1", "web"))
                .await
                .unwrap_err()
        ),
        409
    );
    assert_eq!(api_code(pods.get("missing").await.unwrap_err()), 404);
    let no_ns: Api<Pod> = Api::namespaced(client.clone(), "nope");
    assert_eq!(
        api_code(
            no_ns
                .create(&PostParams::default(), &pod("x", "n", "x"))
                .await
                .unwrap_err()
        ),
        404
    );

    // List with selectors, and the list's resourceVersion.
    pods.create(&PostParams::default(), &pod("db", "node2", "db"))
        .await
        .unwrap();
    let list = pods
        .list(&ListParams::default().labels("app in (web,x)"))
        .await
        .unwrap();
    assert_eq!(list.items.iter().map(name_of).collect::<Vec<_>>(), ["web"]);
    assert!(list.metadata.resource_version.is_some());
    let on_node2 = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields("spec.nodeName=node2,metadata.namespace=demo"))
        .await
        .unwrap();
    assert_eq!(
        on_node2.items.iter().map(name_of).collect::<Vec<_>>(),
        ["db"]
    );

    // Merge, strategic merge, JSON patch and server-side apply.
    let merged = pods
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"tier": "front"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        merged.labels().get("tier").map(String::as_str),
        Some("front")
    );
    assert!(
        merged
            .metadata
            .resource_version
            .as_deref()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > rv
    );
    let strategic = pods
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"containers": [{"name": "proxy", "image": "p:1"}]}})),
        )
        .await
        .unwrap();
    let containers = &strategic.spec.as_ref().unwrap().containers;
    assert_eq!(containers.len(), 2, "strategic merge appends by name");
    let json_patch = http::Request::patch("/api/v1/namespaces/demo/pods/web")
        .header("content-type", "application/json-patch+json")
        .body(
            serde_json::to_vec(&json!([
                {"op": "add", "path": "/metadata/annotations", "value": {"a": "1"}}
            ]))
            .unwrap(),
        )
        .unwrap();
    let patched: Pod = client.request(json_patch).await.unwrap();
    assert_eq!(
        patched.annotations().get("a").map(String::as_str),
        Some("1")
    );
    let apply = PatchParams::apply("e2e-test").force();
    let applied = pods
        .patch(
            "web",
            &apply,
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "web", "labels": {"applied": "yes"}},
            })),
        )
        .await
        .unwrap();
    assert_eq!(
        applied.labels().get("applied").map(String::as_str),
        Some("yes")
    );
    assert_eq!(applied.labels().get("app").map(String::as_str), Some("web"));
    let created_by_apply = pods
        .patch(
            "batch",
            &apply,
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "batch"},
                "spec": {"containers": [{"name": "c", "image": "c:1"}]},
            })),
        )
        .await
        .unwrap();
    assert!(created_by_apply.metadata.uid.is_some());

    // pods/status: status and annotations change, spec does not.
    let status = pods
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"annotations": {"ambient.istio.io/redirection": "enabled"}},
                "spec": {"nodeName": "elsewhere"},
                "status": {"phase": "Running", "podIP": "10.0.0.5"},
            })),
        )
        .await
        .unwrap();
    assert_eq!(
        status
            .annotations()
            .get("ambient.istio.io/redirection")
            .map(String::as_str),
        Some("enabled")
    );
    assert_eq!(
        status.spec.as_ref().unwrap().node_name.as_deref(),
        Some("node1")
    );
    assert_eq!(
        status.status.as_ref().unwrap().pod_ip.as_deref(),
        Some("10.0.0.5")
    );
    // ...and the main resource does not touch status.
    let main = pods
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Failed"}})),
        )
        .await
        .unwrap();
    assert_eq!(main.status.unwrap().phase.as_deref(), Some("Running"));

    // Replace: a stale resourceVersion conflicts, the current one wins.
    let mut stale = created.clone();
    stale.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
    assert_eq!(
        api_code(
            pods.replace("web", &PostParams::default(), &stale)
                .await
                .unwrap_err()
        ),
        409
    );
    let mut current = pods.get("web").await.unwrap();
    current.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
    let replaced = pods
        .replace("web", &PostParams::default(), &current)
        .await
        .unwrap();
    assert_eq!(replaced.labels().len(), 1);

    // Delete returns the object; the namespace goes Terminating, then takes its pods.
    let deleted = pods.delete("db", &DeleteParams::default()).await.unwrap();
    assert!(deleted.left().is_some_and(|p| name_of(&p) == "db"));
    assert_eq!(api_code(pods.get("db").await.unwrap_err()), 404);
    namespaces
        .delete("demo", &DeleteParams::default())
        .await
        .unwrap();
    eventually("namespace demo to go", WAIT, || async {
        namespaces.get_opt("demo").await.unwrap().is_none()
    })
    .await;
    assert!(namespaces.get_opt("demo").await.unwrap().is_none());
    assert!(pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .is_empty());
    control.shutdown();
    control.stopped().await;
}

/// Forwards a watcher's events (errors dropped: the watcher retries by itself).
fn spawn_watcher(
    api: Api<Pod>,
    config: watcher::Config,
) -> mpsc::UnboundedReceiver<watcher::Event<Pod>> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stream = watcher(api, config).default_backoff().boxed();
        while let Some(event) = stream.next().await {
            if let Ok(event) = event {
                if tx.send(event).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

/// The next event, described as "init", "init-apply NAME", "init-done", "apply NAME"
/// or "delete NAME".
async fn next(rx: &mut mpsc::UnboundedReceiver<watcher::Event<Pod>>) -> String {
    let event = tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("a watcher event in time")
        .expect("watcher running");
    match event {
        watcher::Event::Init => "init".into(),
        watcher::Event::InitApply(p) => format!("init-apply {}", name_of(&p)),
        watcher::Event::InitDone => "init-done".into(),
        watcher::Event::Apply(p) => format!("apply {}", name_of(&p)),
        watcher::Event::Delete(p) => format!("delete {}", name_of(&p)),
    }
}

#[tokio::test]
async fn watcher_follows_field_and_label_selectors() {
    let options = Options {
        bookmark_interval: Duration::from_millis(100),
        ..Options::default()
    };
    let (control, client) = start(options).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod("early", "node1", "web"))
        .await
        .unwrap();
    let config = watcher::Config::default()
        .fields("spec.nodeName=node1")
        .labels("app=web");
    let mut events = spawn_watcher(Api::all(client.clone()), config);
    assert_eq!(next(&mut events).await, "init");
    assert_eq!(next(&mut events).await, "init-apply early");
    assert_eq!(next(&mut events).await, "init-done");

    let merge = |labels: serde_json::Value| Patch::Merge(json!({"metadata": {"labels": labels}}));
    let pp = PatchParams::default();
    pods.create(&PostParams::default(), &pod("a", "node1", "web"))
        .await
        .unwrap();
    assert_eq!(next(&mut events).await, "apply a");
    // Other node, other app: nothing for this watcher.
    pods.create(&PostParams::default(), &pod("b", "node2", "web"))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("c", "node1", "db"))
        .await
        .unwrap();
    pods.patch("a", &pp, &merge(json!({"extra": "1"})))
        .await
        .unwrap();
    assert_eq!(next(&mut events).await, "apply a");
    // c enters the selector, a leaves it.
    pods.patch("c", &pp, &merge(json!({"app": "web"})))
        .await
        .unwrap();
    assert_eq!(next(&mut events).await, "apply c");
    pods.patch("a", &pp, &merge(json!({"app": "db"})))
        .await
        .unwrap();
    assert_eq!(next(&mut events).await, "delete a");
    // Changes to objects outside the selector stay invisible, deletes of members show.
    pods.delete("a", &DeleteParams::default()).await.unwrap();
    pods.delete("b", &DeleteParams::default()).await.unwrap();
    pods.delete("c", &DeleteParams::default()).await.unwrap();
    assert_eq!(next(&mut events).await, "delete c");
    // Bookmarks reach the watcher (it asks for them), but produce no events.
    let before = control.stats().bookmarks;
    test_support::poll::eventually(
        "two more bookmarks sent",
        Duration::from_secs(10),
        || async { control.stats().bookmarks >= before + 2 },
    )
    .await;
    assert!(events.try_recv().is_err());
    control.shutdown();
}

/// The set of pod names a watcher believes exist, kept the way a reflector does, and
/// how many times it (re-)listed.
fn track(api: Api<Pod>) -> state_channel::Receiver<(BTreeSet<String>, usize)> {
    let (tx, rx) = state_channel::channel((BTreeSet::new(), 0));
    let mut events = spawn_watcher(api, watcher::Config::default());
    tokio::spawn(async move {
        let mut known = BTreeSet::new();
        let mut buffer = BTreeSet::new();
        let mut lists = 0;
        while let Some(event) = events.recv().await {
            match event {
                watcher::Event::Init => {
                    buffer.clear();
                    lists += 1;
                }
                watcher::Event::InitApply(p) => {
                    assert!(buffer.insert(name_of(&p)), "duplicate in a list");
                }
                watcher::Event::InitDone => known = std::mem::take(&mut buffer),
                watcher::Event::Apply(p) => {
                    known.insert(name_of(&p));
                }
                watcher::Event::Delete(p) => {
                    known.remove(&name_of(&p));
                }
            }
            if tx.send((known.clone(), lists)).is_err() {
                return;
            }
        }
    });
    rx
}

async fn wait_state(
    rx: &mut state_channel::Receiver<(BTreeSet<String>, usize)>,
    want: &[&str],
) -> usize {
    let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
    let result = tokio::time::timeout(WAIT, rx.wait_for(|(known, _)| *known == want))
        .await
        .map(|r| r.map(|state| state.1));
    match result {
        Ok(Ok(lists)) => lists,
        _ => panic!("watcher never saw {want:?}; it has {:?}", rx.borrow().0),
    }
}

#[tokio::test]
async fn watcher_relists_after_410_without_losing_or_duplicating() {
    let options = Options {
        event_log_capacity: 3,
        bookmark_interval: Duration::from_millis(100),
        ..Options::default()
    };
    let (control, client) = start(options).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");

    // A raw watch from a compacted resourceVersion: an ERROR event with 410 Expired.
    for name in ["x1", "x2", "x3", "x4"] {
        pods.create(&PostParams::default(), &pod(name, "n", "x"))
            .await
            .unwrap();
    }
    let mut raw = pods
        .watch(&WatchParams::default(), "1")
        .await
        .unwrap()
        .boxed();
    match raw.next().await {
        Some(Ok(WatchEvent::Error(status))) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"))
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    for name in ["x1", "x2", "x3", "x4"] {
        pods.delete(name, &DeleteParams::default()).await.unwrap();
    }

    pods.create(&PostParams::default(), &pod("p0", "n", "x"))
        .await
        .unwrap();
    let mut state = track(pods.clone());
    assert_eq!(wait_state(&mut state, &["p0"]).await, 1);
    let expired_before = control.stats().expired_watches;
    {
        // The watcher is away while more changes happen than the log holds.
        let _pause = control.pause_watches();
        for name in ["p1", "p2", "p3", "p4", "p5"] {
            pods.create(&PostParams::default(), &pod(name, "n", "x"))
                .await
                .unwrap();
        }
        pods.delete("p0", &DeleteParams::default()).await.unwrap();
        pods.patch(
            "p1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"v": "2"}}})),
        )
        .await
        .unwrap();
    }
    let lists = wait_state(&mut state, &["p1", "p2", "p3", "p4", "p5"]).await;
    assert_eq!(lists, 2, "one re-list after the 410");
    assert!(control.stats().expired_watches > expired_before);
    // And it keeps watching afterwards.
    pods.create(&PostParams::default(), &pod("p6", "n", "x"))
        .await
        .unwrap();
    wait_state(&mut state, &["p1", "p2", "p3", "p4", "p5", "p6"]).await;
    control.shutdown();
}

fn start_binary(name: &str, port: u16, state: Option<&Path>, kubeconfig: &Path) -> ChildGuard {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kube-apiserver-lite"));
    cmd.args([
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--bookmark-interval",
        "1",
    ])
    .arg("--print-kubeconfig")
    .arg(kubeconfig);
    if let Some(state) = state {
        cmd.arg("--state-file").arg(state);
    }
    ChildGuard::spawn(name, cmd).expect("start kube-apiserver-lite")
}

#[tokio::test]
async fn binary_restart_with_state_file_and_watcher_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let kubeconfig = dir.path().join("kubeconfig");
    let port = free_port();
    let mut server = start_binary("apiserver-lite-1", port, Some(&state), &kubeconfig);
    let deadline = std::time::Instant::now() + WAIT;
    while !kubeconfig.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "no kubeconfig: {}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let client = client_from_kubeconfig(&kubeconfig).await;
    wait_ready(&client, &server).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(&PostParams::default(), &namespace("restart"))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "restart");
    let before = pods
        .create(&PostParams::default(), &pod("before", "n", "x"))
        .await
        .unwrap();
    let mut state_rx = track(Api::all(client.clone()));
    assert_eq!(wait_state(&mut state_rx, &["before"]).await, 1);

    // Crash and restart with the state file: objects and versions survive, and the
    // watcher resumes its watch without re-listing.
    server.kill();
    let server = start_binary("apiserver-lite-2", port, Some(&state), &kubeconfig);
    wait_ready(&client, &server).await;
    let again = pods.get("before").await.unwrap();
    assert_eq!(again.metadata.uid, before.metadata.uid);
    assert_eq!(
        again.metadata.resource_version,
        before.metadata.resource_version
    );
    let after = pods
        .create(&PostParams::default(), &pod("after", "n", "x"))
        .await
        .unwrap();
    let rv = |p: &Pod| {
        p.metadata
            .resource_version
            .as_deref()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    assert!(rv(&after) > rv(&before));
    assert_eq!(wait_state(&mut state_rx, &["after", "before"]).await, 1);

    // Restart without state: the watcher's resourceVersion is unknown there (410),
    // so it re-lists and forgets the pods that no longer exist.
    drop(server);
    let server = start_binary("apiserver-lite-3", port, None, &kubeconfig);
    wait_ready(&client, &server).await;
    assert_eq!(wait_state(&mut state_rx, &[]).await, 2);
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_label_annotate_apply_create_delete() {
    let Some(bin) = kubectl() else {
        return;
    };
    let (control, client) = start(Options::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let k = Kubectl::for_server(bin, &control.url(), dir.path());
    let manifest = dir.path().join("demo.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: demo\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: demo\n  labels:\n    app: web\n\
         spec:\n  nodeName: node1\n  containers:\n  - name: web\n    image: nginx\n",
    )
    .unwrap();
    let manifest = manifest.to_str().unwrap();

    let out = k.run(&["create", "-f", manifest]).await;
    assert!(
        out.contains("namespace/demo created") && out.contains("pod/web created"),
        "{out}"
    );
    let out = k.run(&["get", "pods", "-A"]).await;
    assert!(
        out.contains("demo") && out.contains("web") && out.contains("Pending"),
        "{out}"
    );
    let out = k.run(&["get", "ns", "-o", "yaml"]).await;
    assert!(
        out.contains("kind: Namespace") && out.contains("name: demo"),
        "{out}"
    );

    k.run(&["label", "ns", "demo", "istio.io/dataplane-mode=ambient"])
        .await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = namespaces.get("demo").await.unwrap();
    assert_eq!(
        ns.labels()
            .get("istio.io/dataplane-mode")
            .map(String::as_str),
        Some("ambient")
    );

    k.run(&[
        "annotate",
        "pod",
        "-n",
        "demo",
        "web",
        "example.com/note=hi",
    ])
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "demo");
    let web = pods.get("web").await.unwrap();
    assert_eq!(
        web.annotations()
            .get("example.com/note")
            .map(String::as_str),
        Some("hi")
    );

    let out = k.run(&["apply", "--server-side", "-f", manifest]).await;
    assert!(out.contains("serverside-applied"), "{out}");
    let out = k.run(&["apply", "-f", manifest]).await;
    assert!(out.contains("pod/web configured"), "{out}");
    // Typed `create` commands send protobuf.
    k.run(&["create", "namespace", "extra"]).await;
    assert!(namespaces.get_opt("extra").await.unwrap().is_some());
    let out = k
        .run(&[
            "get",
            "pod",
            "web",
            "-n",
            "demo",
            "-o",
            "jsonpath={.spec.nodeName}",
        ])
        .await;
    assert_eq!(out, "node1");

    k.run(&["delete", "pod", "-n", "demo", "web"]).await;
    assert!(pods.get_opt("web").await.unwrap().is_none());
    k.run(&["delete", "-f", manifest, "--ignore-not-found"])
        .await;
    k.run(&["delete", "ns", "extra"]).await;
    assert!(namespaces.get_opt("extra").await.unwrap().is_none());
    assert!(namespaces.get_opt("demo").await.unwrap().is_none());
    control.shutdown();
}
