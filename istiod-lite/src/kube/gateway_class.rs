//! The GatewayClass `istio-waypoint`, as istiod keeps it: created when the Gateway API
//! CRDs are installed, put back when deleted, and marked `Accepted` (with every other
//! class naming our controller). Users then only write a `Gateway` with
//! `gatewayClassName: istio-waypoint`. Only the leader among istiod's replicas does this.

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::{Api, Client, ResourceExt};
use mesh_kube::watch::{events, updates, IfAbsent, Update};
use serde_json::json;
use shared_types::constants::WAYPOINT_CLASS;
use tokio_util::sync::CancellationToken;

/// The controller Istio's waypoint classes name; we answer for it.
pub const MESH_CONTROLLER: &str = "istio.io/mesh-controller";

/// The GatewayClass kind, served only while the Gateway API CRDs are installed.
pub fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "GatewayClass"),
        "gatewayclasses",
    )
}

/// Watches every GatewayClass until `shutdown`: creates `istio-waypoint` when a list
/// lacks it or it is deleted, and accepts the classes of our controller.
pub async fn run(client: Client, shutdown: CancellationToken) {
    let api = Api::<DynamicObject>::all_with(client, &resource());
    let classes = events(api.clone(), Default::default());
    let mut classes = std::pin::pin!(updates("gatewayclasses", classes, IfAbsent::Empty));
    let mut listed_waypoint_class = false;
    loop {
        let update = tokio::select! {
            () = shutdown.cancelled() => return,
            Some(update) = classes.next() => update,
            else => return,
        };
        match update {
            Update::Relisting => listed_waypoint_class = false,
            Update::Listed(class) | Update::Applied(class) => {
                listed_waypoint_class |= class.name_any() == WAYPOINT_CLASS;
                if ours(&class) && !accepted(&class) {
                    accept(&api, &class).await;
                }
            }
            Update::Synced if !listed_waypoint_class => create(&api).await,
            Update::Deleted(class) if class.name_any() == WAYPOINT_CLASS => create(&api).await,
            Update::Synced | Update::Deleted(_) => {}
        }
    }
}

/// The class istiod creates.
pub fn waypoint_class() -> DynamicObject {
    DynamicObject::new(WAYPOINT_CLASS, &resource()).data(json!({
        "spec": {
            "controllerName": MESH_CONTROLLER,
            "description": "The default Istio waypoint GatewayClass",
        },
    }))
}

fn ours(class: &DynamicObject) -> bool {
    class.data["spec"]["controllerName"] == MESH_CONTROLLER
}

/// Whether the class carries `Accepted=True` for its current generation.
pub fn accepted(class: &DynamicObject) -> bool {
    let generation = class.metadata.generation;
    class.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| {
            c["type"] == "Accepted"
                && c["status"] == "True"
                && c["observedGeneration"].as_i64() == generation
        })
}

/// Creates the waypoint class. Failures (the CRD not installed yet, a lost race with
/// another writer) are logged; the next list or deletion retries.
async fn create(api: &Api<DynamicObject>) {
    match api.create(&PostParams::default(), &waypoint_class()).await {
        Ok(_) => tracing::info!(class = WAYPOINT_CLASS, "created the waypoint GatewayClass"),
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(kube::Error::Api(status)) if status.code == 404 => tracing::debug!(
            "GatewayClass is not served (Gateway API CRDs not installed); not creating {WAYPOINT_CLASS}"
        ),
        Err(e) => tracing::warn!(class = WAYPOINT_CLASS, error = %e, "cannot create the GatewayClass"),
    }
}

/// Writes `Accepted=True` for the class's current generation, as Istio's controller does.
async fn accept(api: &Api<DynamicObject>, class: &DynamicObject) {
    let name = class.name_any();
    let status = json!({"status": {"conditions": [{
        "type": "Accepted",
        "status": "True",
        "reason": "Accepted",
        "message": "Handled by Istio controller",
        "observedGeneration": class.metadata.generation,
        "lastTransitionTime": Time(Timestamp::now()),
    }]}});
    match api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
    {
        Ok(_) => tracing::info!(class = %name, "accepted the GatewayClass"),
        Err(e) => tracing::warn!(class = %name, error = %e, "cannot write the GatewayClass status"),
    }
}
