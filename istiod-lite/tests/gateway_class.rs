//! The GatewayClass `istio-waypoint`, against the local API server: created once the
//! Gateway API CRDs are installed (not before: the kind is not served), accepted,
//! put back after a deletion, and only our controller's classes are touched.

use std::time::Duration;

use istiod_lite::kube::gateway_class::{self, accepted, MESH_CONTROLLER};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::Client;
use kube_apiserver_lite::{ApiServer, Options};
use serde_json::json;
use shared_types::constants::WAYPOINT_CLASS;
use test_support::poll::eventually;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(20);

async fn class(api: &Api<DynamicObject>, name: &str) -> Option<DynamicObject> {
    api.get_opt(name).await.ok().flatten()
}

#[tokio::test]
async fn the_waypoint_class_appears_with_the_crds_and_comes_back_when_deleted() {
    let server = ApiServer::bind_with("127.0.0.1:0", Options::default())
        .await
        .unwrap();
    let client = Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let _control = server.spawn();
    let stop = CancellationToken::new();
    let _stop_on_exit = stop.clone().drop_guard();
    tokio::spawn(gateway_class::run(client.clone(), stop.clone()));

    // No CRDs yet: nothing to create, and no error that stops the controller.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in test_support::crds::shipped().unwrap() {
        crds.create(
            &PostParams::default(),
            &serde_json::from_value(crd).unwrap(),
        )
        .await
        .unwrap();
    }
    let classes = Api::<DynamicObject>::all_with(client.clone(), &gateway_class::resource());
    let first = wait_accepted(&classes, WAYPOINT_CLASS, None).await;
    assert_eq!(first.data["spec"]["controllerName"], MESH_CONTROLLER);
    let condition = &first.data["status"]["conditions"][0];
    assert_eq!(condition["reason"], "Accepted");
    assert!(condition["lastTransitionTime"]
        .as_str()
        .is_some_and(|t| t.ends_with('Z')));

    classes
        .delete(WAYPOINT_CLASS, &DeleteParams::default())
        .await
        .unwrap();
    wait_accepted(&classes, WAYPOINT_CLASS, first.metadata.uid).await;

    // Another controller's class is left alone; one of ours (created after it, so
    // seen after it) is accepted.
    for (name, controller) in [("theirs", "example.com/gateway"), ("mine", MESH_CONTROLLER)] {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": {"name": name},
            "spec": {"controllerName": controller},
        }))
        .unwrap();
        classes.create(&PostParams::default(), &obj).await.unwrap();
    }
    wait_accepted(&classes, "mine", None).await;
    let theirs = class(&classes, "theirs").await.unwrap();
    assert!(!accepted(&theirs), "{theirs:?}");
    // The CRD's default, as kube-apiserver fills it in: no controller answered.
    assert_eq!(theirs.data["status"]["conditions"][0]["reason"], "Pending");
}

/// Waits until class `name` (another object than `replaced`, by uid) is accepted.
async fn wait_accepted(
    classes: &Api<DynamicObject>,
    name: &str,
    replaced: Option<String>,
) -> DynamicObject {
    let (api, key) = (classes.clone(), name.to_owned());
    eventually(&format!("GatewayClass {name} accepted"), WAIT, move || {
        let (api, key, replaced) = (api.clone(), key.clone(), replaced.clone());
        async move {
            class(&api, &key)
                .await
                .is_some_and(|c| c.metadata.uid != replaced && accepted(&c))
        }
    })
    .await;
    class(classes, name).await.unwrap()
}
