//! Waypoints, as istiod's gateway deployment controller makes them: for every Gateway
//! of class `istio-waypoint`, a ServiceAccount, a Deployment running the `waypoint`
//! binary and a Service (HBONE on 15008), all named after the Gateway and owned by it,
//! and the Gateway's status: `Accepted`, `Programmed` once a waypoint pod is ready, and
//! the Service's address. Only the leader among istiod's replicas does this.
//!
//! The objects are server-side applied (field manager `istiod-lite`) whenever the
//! Gateway's generation changes, so an edit to them is put back then. Owner references
//! let Kubernetes' garbage collector remove them with the Gateway; they are also
//! deleted here when the Gateway's deletion is seen (for clusters without one).

use std::collections::HashMap;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Service, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use mesh_kube::watch::{events, updates, IfAbsent, Update};
use serde_json::{json, Value};
use shared_types::constants::{
    DATAPLANE_MODE_LABEL, DATAPLANE_MODE_NONE, GATEWAY_MANAGED_LABEL, GATEWAY_NAME_LABEL,
    HBONE_PORT, WAYPOINT_CLASS, WAYPOINT_CONTROLLER, ZTUNNEL_METRICS_PORT, ZTUNNEL_READINESS_PORT,
};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::FIELD_MANAGER;
use crate::model::gateway_resource;

/// What every waypoint is configured with.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The image holding the `waypoint` binary.
    pub image: String,
    /// istiod-lite's CA and xDS address (`istiod.<namespace>.svc:15012`).
    pub istiod_address: String,
    pub trust_domain: String,
    pub cluster_id: String,
}

/// A Gateway, by `(namespace, name)`.
type Key = (String, String);

/// Reconciles until `shutdown`.
pub async fn run(client: Client, settings: Settings, shutdown: CancellationToken) {
    let gateways_api = Api::<DynamicObject>::all_with(client.clone(), &gateway_resource());
    let deployments_api = Api::<Deployment>::all(client.clone());
    let managed = watcher::Config::default()
        .labels(&format!("{GATEWAY_MANAGED_LABEL}={WAYPOINT_CONTROLLER}"));
    let gateways = updates(
        "gateways",
        events(gateways_api, Default::default()),
        IfAbsent::Empty,
    );
    let deployments = updates(
        "waypoint deployments",
        events(deployments_api, managed),
        IfAbsent::Wait,
    );
    let mut gateways = std::pin::pin!(gateways);
    let mut deployments = std::pin::pin!(deployments);
    let mut controller = Controller {
        client,
        settings,
        gateways: HashMap::new(),
        ready: HashMap::new(),
        applied: HashMap::new(),
        status_written: HashMap::new(),
    };
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            Some(update) = gateways.next() => controller.gateway(update).await,
            Some(update) = deployments.next() => controller.deployment(update).await,
            else => return,
        }
    }
}

struct Controller {
    client: Client,
    settings: Settings,
    /// The waypoint Gateways seen.
    gateways: HashMap<Key, DynamicObject>,
    /// Whether each waypoint's Deployment has a ready pod.
    ready: HashMap<Key, bool>,
    /// The Gateway generation whose objects were last applied.
    applied: HashMap<Key, i64>,
    /// The status last written (programmed, address), so unchanged ones are not.
    status_written: HashMap<Key, (bool, Option<String>)>,
}

fn key_of<K: ResourceExt>(object: &K) -> Key {
    (object.namespace().unwrap_or_default(), object.name_any())
}

fn is_waypoint(gateway: &DynamicObject) -> bool {
    gateway.data["spec"]["gatewayClassName"] == WAYPOINT_CLASS
}

impl Controller {
    async fn gateway(&mut self, update: Update<DynamicObject>) {
        match update {
            Update::Listed(gateway) | Update::Applied(gateway) => {
                let key = key_of(&gateway);
                if !is_waypoint(&gateway) {
                    // Not (or no longer) ours; what it had is left to its new owner.
                    self.gateways.remove(&key);
                    return;
                }
                self.gateways.insert(key.clone(), gateway);
                self.reconcile(&key).await;
            }
            Update::Deleted(gateway) => {
                let key = key_of(&gateway);
                if self.gateways.remove(&key).is_some() {
                    self.delete_objects(&key).await;
                }
                self.applied.remove(&key);
                self.status_written.remove(&key);
            }
            Update::Relisting | Update::Synced => {}
        }
    }

    async fn deployment(&mut self, update: Update<Deployment>) {
        let (deployment, exists) = match update {
            Update::Listed(d) | Update::Applied(d) => (d, true),
            Update::Deleted(d) => (d, false),
            Update::Relisting | Update::Synced => return,
        };
        let Some(gateway) = deployment.labels().get(GATEWAY_NAME_LABEL).cloned() else {
            return;
        };
        let key = (deployment.namespace().unwrap_or_default(), gateway);
        let ready = exists
            && deployment
                .status
                .as_ref()
                .and_then(|s| s.ready_replicas)
                .is_some_and(|n| n > 0);
        self.ready.insert(key.clone(), ready);
        if self.gateways.contains_key(&key) {
            // A Deployment deleted under a live Gateway is put back.
            if !exists {
                self.applied.remove(&key);
            }
            self.reconcile(&key).await;
        }
    }

    /// Applies the waypoint's objects (when the Gateway changed) and writes its status.
    async fn reconcile(&mut self, key: &Key) {
        let Some(gateway) = self.gateways.get(key).cloned() else {
            return;
        };
        let generation = gateway.metadata.generation.unwrap_or_default();
        let mut address = self.status_written.get(key).and_then(|s| s.1.clone());
        if self.applied.get(key) != Some(&generation) {
            match self.apply_objects(&gateway).await {
                Ok(cluster_ip) => {
                    address = cluster_ip;
                    self.applied.insert(key.clone(), generation);
                    info!(gateway = %format!("{}/{}", key.0, key.1), "waypoint objects applied");
                }
                Err(e) => {
                    warn!(gateway = %format!("{}/{}", key.0, key.1), error = %e, "cannot apply the waypoint's objects");
                    return;
                }
            }
        }
        let programmed = self.ready.get(key).copied().unwrap_or(false);
        let status = (programmed, address);
        if self.status_written.get(key) == Some(&status) {
            return;
        }
        match self.write_status(&gateway, &status).await {
            Ok(()) => {
                self.status_written.insert(key.clone(), status);
            }
            Err(e) => {
                warn!(gateway = %format!("{}/{}", key.0, key.1), error = %e, "cannot write the Gateway's status")
            }
        }
    }

    /// Server-side applies the ServiceAccount, Service and Deployment; returns the
    /// Service's cluster IP.
    async fn apply_objects(&self, gateway: &DynamicObject) -> kube::Result<Option<String>> {
        let (namespace, name) = key_of(gateway);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let objects = waypoint_objects(gateway, &self.settings);
        Api::<ServiceAccount>::namespaced(self.client.clone(), &namespace)
            .patch(&name, &params, &Patch::Apply(&objects.service_account))
            .await?;
        let service = Api::<Service>::namespaced(self.client.clone(), &namespace)
            .patch(&name, &params, &Patch::Apply(&objects.service))
            .await?;
        Api::<Deployment>::namespaced(self.client.clone(), &namespace)
            .patch(&name, &params, &Patch::Apply(&objects.deployment))
            .await?;
        Ok(service
            .spec
            .and_then(|s| s.cluster_ip)
            .filter(|ip| !ip.is_empty() && ip != "None"))
    }

    async fn delete_objects(&self, (namespace, name): &Key) {
        let params = DeleteParams::default();
        let results = [
            Api::<Deployment>::namespaced(self.client.clone(), namespace)
                .delete(name, &params)
                .await
                .map(drop),
            Api::<Service>::namespaced(self.client.clone(), namespace)
                .delete(name, &params)
                .await
                .map(drop),
            Api::<ServiceAccount>::namespaced(self.client.clone(), namespace)
                .delete(name, &params)
                .await
                .map(drop),
        ];
        for result in results {
            match result {
                Ok(()) | Err(kube::Error::Api(_)) => {}
                Err(e) => {
                    warn!(gateway = %format!("{namespace}/{name}"), error = %e, "cannot delete a waypoint object")
                }
            }
        }
        info!(gateway = %format!("{namespace}/{name}"), "waypoint objects deleted with their Gateway");
    }

    async fn write_status(
        &self,
        gateway: &DynamicObject,
        (programmed, address): &(bool, Option<String>),
    ) -> kube::Result<()> {
        let (namespace, name) = key_of(gateway);
        let api = Api::<DynamicObject>::namespaced_with(
            self.client.clone(),
            &namespace,
            &gateway_resource(),
        );
        let status = gateway_status(gateway, *programmed, address.as_deref());
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map(drop)
    }
}

/// The objects of one waypoint, as JSON for server-side apply.
pub struct WaypointObjects {
    pub service_account: Value,
    pub service: Value,
    pub deployment: Value,
}

/// Renders the waypoint of `gateway` (the template Istio's controller fills for its
/// Envoy waypoints, with our binary in it).
pub fn waypoint_objects(gateway: &DynamicObject, settings: &Settings) -> WaypointObjects {
    let (namespace, name) = key_of(gateway);
    let owner = json!([{
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "name": name,
        "uid": gateway.metadata.uid.clone().unwrap_or_default(),
    }]);
    let labels = json!({
        GATEWAY_NAME_LABEL: name,
        GATEWAY_MANAGED_LABEL: WAYPOINT_CONTROLLER,
    });
    let metadata = |kind_labels: Value| {
        json!({
            "name": name,
            "namespace": namespace,
            "labels": kind_labels,
            "ownerReferences": owner,
        })
    };
    let service_account = json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(labels.clone()),
    });
    let service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(labels.clone()),
        "spec": {
            "type": "ClusterIP",
            "selector": {GATEWAY_NAME_LABEL: name},
            "ports": [
                {"name": "status-port", "port": ZTUNNEL_READINESS_PORT, "protocol": "TCP", "appProtocol": "http"},
                {"name": "mesh", "port": HBONE_PORT, "protocol": "TCP"},
            ],
        },
    });
    let mut pod_labels = labels.clone();
    // Not captured by ztunnel: the waypoint terminates HBONE itself.
    pod_labels[DATAPLANE_MODE_LABEL] = json!(DATAPLANE_MODE_NONE);
    pod_labels["sidecar.istio.io/inject"] = json!("false");
    let field = |path: &str| json!({"fieldRef": {"fieldPath": path}});
    let env = json!([
        {"name": "POD_NAME", "valueFrom": field("metadata.name")},
        {"name": "POD_NAMESPACE", "valueFrom": field("metadata.namespace")},
        {"name": "INSTANCE_IP", "valueFrom": field("status.podIP")},
        {"name": "SERVICE_ACCOUNT", "valueFrom": field("spec.serviceAccountName")},
        {"name": "NODE_NAME", "valueFrom": field("spec.nodeName")},
        {"name": "PROXY_WORKLOAD_INFO", "value": "$(POD_NAMESPACE)/$(POD_NAME)/$(SERVICE_ACCOUNT)"},
        {"name": "GATEWAY_NAME", "value": name},
        {"name": "CA_ADDRESS", "value": settings.istiod_address},
        {"name": "XDS_ADDRESS", "value": settings.istiod_address},
        {"name": "DISCOVERY_SOURCE", "value": "xds"},
        {"name": "TRUST_DOMAIN", "value": settings.trust_domain},
        {"name": "CLUSTER_ID", "value": settings.cluster_id},
        {"name": "ISTIO_META_CLUSTER_ID", "value": settings.cluster_id},
        {"name": "RUST_LOG", "value": "info"},
    ]);
    let deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(labels.clone()),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {GATEWAY_NAME_LABEL: name}},
            "template": {
                "metadata": {
                    "labels": pod_labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": ZTUNNEL_METRICS_PORT.to_string(),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {
                    "serviceAccountName": name,
                    "terminationGracePeriodSeconds": 30,
                    "containers": [{
                        "name": "istio-proxy",
                        "image": settings.image,
                        "command": ["waypoint"],
                        "ports": [
                            {"name": "mesh", "containerPort": HBONE_PORT, "protocol": "TCP"},
                            {"name": "http-envoy-prom", "containerPort": ZTUNNEL_METRICS_PORT, "protocol": "TCP"},
                            {"name": "status-port", "containerPort": ZTUNNEL_READINESS_PORT, "protocol": "TCP"},
                        ],
                        "readinessProbe": {
                            "httpGet": {"path": "/healthz/ready", "port": ZTUNNEL_READINESS_PORT},
                            "periodSeconds": 2,
                            "failureThreshold": 3,
                        },
                        "env": env,
                        "securityContext": {
                            "allowPrivilegeEscalation": false,
                            "readOnlyRootFilesystem": true,
                            "runAsNonRoot": true,
                            "runAsUser": 1337,
                            "runAsGroup": 1337,
                            "capabilities": {"drop": ["ALL"]},
                        },
                        "volumeMounts": [
                            {"name": "istiod-ca-cert", "mountPath": "/var/run/secrets/istio", "readOnly": true},
                            {"name": "istio-token", "mountPath": "/var/run/secrets/tokens", "readOnly": true},
                            {"name": "tmp", "mountPath": "/tmp"},
                        ],
                    }],
                    "volumes": [
                        {"name": "istio-token", "projected": {"sources": [{"serviceAccountToken": {
                            "path": "istio-token", "expirationSeconds": 43200, "audience": "istio-ca",
                        }}]}},
                        {"name": "istiod-ca-cert", "configMap": {"name": "istio-ca-root-cert"}},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    });
    WaypointObjects {
        service_account,
        service,
        deployment,
    }
}

/// The Gateway's status: Accepted, Programmed (a waypoint pod is ready), the Service's
/// address.
pub fn gateway_status(gateway: &DynamicObject, programmed: bool, address: Option<&str>) -> Value {
    let generation = gateway.metadata.generation;
    let now = Time(Timestamp::now());
    let condition = |kind: &str, ok: bool, reason: &str, message: &str| {
        json!({
            "type": kind,
            "status": if ok { "True" } else { "False" },
            "reason": reason,
            "message": message,
            "observedGeneration": generation,
            "lastTransitionTime": now,
        })
    };
    let programmed = if programmed {
        condition(
            "Programmed",
            true,
            "Programmed",
            "Resource programmed, assigned to service(s)",
        )
    } else {
        condition(
            "Programmed",
            false,
            "NoResources",
            "The waypoint has no ready pod yet",
        )
    };
    let addresses: Vec<Value> = address
        .map(|ip| json!({"type": "IPAddress", "value": ip}))
        .into_iter()
        .collect();
    json!({"status": {
        "conditions": [
            condition("Accepted", true, "Accepted", "Resource accepted"),
            programmed,
        ],
        "addresses": addresses,
    }})
}
