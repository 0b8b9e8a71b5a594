//! Publishes the mesh root as ConfigMap `istio-ca-root-cert` (key `root-cert.pem`)
//! in every namespace, as istiod does, and puts it back when someone deletes or
//! edits it. Workloads and ztunnel mount it to verify istiod and each other. Only the
//! leader among istiod's replicas does this.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{ObjectMeta, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use mesh_kube::watch::{events, updates, IfAbsent, Update};
use tokio_util::sync::CancellationToken;

pub const ROOT_CONFIGMAP: &str = "istio-ca-root-cert";
pub const ROOT_KEY: &str = "root-cert.pem";
const FIELD_MANAGER: &str = "istiod-lite";

/// Watches namespaces and the root ConfigMaps; writes only where the content differs.
pub async fn run(client: Client, root_pem: String, shutdown: CancellationToken) {
    let namespaces = events(Api::<Namespace>::all(client.clone()), Default::default());
    let configmaps = events(
        Api::<ConfigMap>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={ROOT_CONFIGMAP}")),
    );
    let mut namespaces = std::pin::pin!(updates("namespaces", namespaces, IfAbsent::Wait));
    let mut configmaps = std::pin::pin!(updates("configmaps", configmaps, IfAbsent::Wait));
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            Some(update) = namespaces.next() => match update {
                Update::Applied(ns) | Update::Listed(ns) => {
                    ensure(&client, &ns.name_any(), &root_pem).await
                }
                Update::Deleted(_) | Update::Relisting | Update::Synced => {}
            },
            Some(update) = configmaps.next() => match update {
                // A deleted or edited root is put back, as istiod does.
                Update::Deleted(cm) => {
                    if let Some(ns) = cm.namespace() {
                        ensure(&client, &ns, &root_pem).await;
                    }
                }
                Update::Applied(cm) | Update::Listed(cm) if !holds(&cm, &root_pem) => {
                    if let Some(ns) = cm.namespace() {
                        ensure(&client, &ns, &root_pem).await;
                    }
                }
                _ => {}
            },
            else => return,
        }
    }
}

fn holds(cm: &ConfigMap, root_pem: &str) -> bool {
    cm.data
        .as_ref()
        .and_then(|d| d.get(ROOT_KEY))
        .map(String::as_str)
        == Some(root_pem)
}

/// Writes the ConfigMap unless it already holds the root. Failures are logged
/// and retried on the next event for the namespace.
async fn ensure(client: &Client, namespace: &str, root_pem: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    match api.get_opt(ROOT_CONFIGMAP).await {
        Ok(Some(cm)) if holds(&cm, root_pem) => return,
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(%namespace, error = %e, "cannot read the root ConfigMap");
            return;
        }
    }
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(ROOT_CONFIGMAP.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([(
                "istio.io/config".to_owned(),
                "true".to_owned(),
            )])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(ROOT_KEY.to_owned(), root_pem.to_owned())])),
        ..Default::default()
    };
    let params = PatchParams::apply(FIELD_MANAGER).force();
    match api.patch(ROOT_CONFIGMAP, &params, &Patch::Apply(&cm)).await {
        Ok(_) => tracing::info!(%namespace, "published the mesh root as {ROOT_CONFIGMAP}"),
        // A namespace being deleted refuses new objects; nothing to do.
        Err(e) => tracing::warn!(%namespace, error = %e, "cannot publish the root ConfigMap"),
    }
}
