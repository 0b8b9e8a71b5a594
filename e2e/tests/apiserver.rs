//! kube-apiserver-lite against real clients: kube-rs (CRUD, patches, the status
//! subresource, watchers with selectors, 410 recovery, restarts of the real binary)
//! and, when installed (scripts/install-kubectl.sh), a real kubectl.
//! No root needed: everything listens on 127.0.0.1.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use e2e::apiserver::{write_kubeconfig, ApiServer, Control, Options};
use e2e::process::ChildGuard;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use serde_json::json;
use tokio::sync::{mpsc, watch as state_channel};

const WAIT: Duration = Duration::from_secs(20);

/// An in-process server on a free port and a kube-rs client for it.
async fn start(options: Options) -> (Control, Client) {
    let server = ApiServer::bind_with("127.0.0.1:0", options)
        .await
        .expect("bind");
    let client = client_for(&server.url());
    (server.spawn(), client)
}

fn client_for(url: &str) -> Client {
    let config = kube::Config::new(url.parse().expect("server url"));
    Client::try_from(config).expect("client")
}

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

fn api_code(err: kube::Error) -> u16 {
    match err {
        kube::Error::Api(status) => status.code,
        other => panic!("expected an API error, got {other}"),
    }
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
    assert_eq!(on_node2.items.iter().map(name_of).collect::<Vec<_>>(), ["db"]);

    // Merge, strategic merge, JSON patch and server-side apply.
    let merged = pods
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"tier": "front"}}})),
        )
        .await
        .unwrap();
    assert_eq!(merged.labels().get("tier").map(String::as_str), Some("front"));
    assert!(merged.metadata.resource_version.as_deref().unwrap().parse::<u64>().unwrap() > rv);
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
    assert_eq!(patched.annotations().get("a").map(String::as_str), Some("1"));
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
    assert_eq!(applied.labels().get("applied").map(String::as_str), Some("yes"));
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
    assert_eq!(status.spec.as_ref().unwrap().node_name.as_deref(), Some("node1"));
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

    // Istio AuthorizationPolicy, stored once, served as v1 and v1beta1.
    let gvk = GroupVersionKind::gvk("security.istio.io", "v1", "AuthorizationPolicy");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "authorizationpolicies");
    let policies: Api<DynamicObject> = Api::namespaced_with(client.clone(), "demo", &ar);
    let policy: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
        "metadata": {"name": "deny-all"}, "spec": {"action": "DENY", "rules": [{}]},
    }))
    .unwrap();
    policies
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    let beta = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("security.istio.io", "v1beta1", "AuthorizationPolicy"),
        "authorizationpolicies",
    );
    let beta_policies: Api<DynamicObject> = Api::namespaced_with(client.clone(), "demo", &beta);
    let seen = beta_policies.get("deny-all").await.unwrap();
    assert_eq!(
        seen.types.unwrap().api_version,
        "security.istio.io/v1beta1"
    );
    assert_eq!(seen.data["spec"]["action"], "DENY");

    // Delete returns the object; the namespace goes Terminating, then takes its pods.
    let deleted = pods.delete("db", &DeleteParams::default()).await.unwrap();
    assert!(deleted.left().is_some_and(|p| name_of(&p) == "db"));
    assert_eq!(api_code(pods.get("db").await.unwrap_err()), 404);
    namespaces
        .delete("demo", &DeleteParams::default())
        .await
        .unwrap();
    e2e::process::wait_for("namespace demo to go", WAIT, || None::<()>.or_else(|| {
        let probe = futures::executor::block_on(async { tokio::time::timeout(Duration::from_secs(1), namespaces.get_opt("demo")).await });
        matches!(probe, Ok(Ok(None))).then_some(())
    }))
    .ok();
    assert!(namespaces.get_opt("demo").await.unwrap().is_none());
    assert!(pods.list(&ListParams::default()).await.unwrap().items.is_empty());
    control.shutdown();
    control.stopped().await;
}
