//! Workloads, services and policies in Istio's `/config_dump` shape, which differs
//! from the local-config shape the model serializes to: a workload's `services` is a
//! list of `namespace/hostname`, a service carries its `endpoints` keyed by workload
//! uid, and fields Istio always writes are written even at their defaults.

use serde_json::{json, Map, Value};

use crate::state::{ProxyState, Service, Workload};
use shared_types::constants::{DEFAULT_SERVICE_ACCOUNT, DEFAULT_TRUST_DOMAIN};

/// The cluster Istio's ztunnel assumes when discovery names none.
const DEFAULT_CLUSTER_ID: &str = "Kubernetes";

/// `{"workloads": [..], "services": [..], "policies": [..]}` of `state`, sorted as
/// Istio sorts them (workloads by uid, services by hostname, policies by key).
pub fn state_sections(state: &ProxyState) -> Map<String, Value> {
    let mut workloads: Vec<&Workload> = state.workloads().map(|w| w.as_ref()).collect();
    workloads.sort_by(|a, b| a.uid.cmp(&b.uid));
    let mut services: Vec<&Service> = state.services().map(|s| s.as_ref()).collect();
    services.sort_by(|a, b| (&a.hostname, &a.namespace).cmp(&(&b.hostname, &b.namespace)));
    let mut policies: Vec<_> = state.policies().collect();
    policies.sort_by_key(|p| p.key());
    let mut out = Map::new();
    out.insert(
        "workloads".into(),
        workloads.into_iter().map(workload).collect(),
    );
    out.insert(
        "services".into(),
        services.into_iter().map(|s| service(s, state)).collect(),
    );
    out.insert(
        "policies".into(),
        policies
            .into_iter()
            .map(|p| serde_json::to_value(p.as_ref()).unwrap_or_default())
            .collect(),
    );
    waypoint_sections(state, &mut out);
    out
}

/// A waypoint's own resources, as it holds them: `waypointPolicies` and
/// `waypointRoutes` (each with its spec as Kubernetes stores it), sorted by key.
/// Only a waypoint subscribes to them, so a ztunnel's dump keeps Istio's sections.
fn waypoint_sections(state: &ProxyState, out: &mut Map<String, Value>) {
    let spec = |json: &str| serde_json::from_str::<Value>(json).unwrap_or(Value::Null);
    let mut policies: Vec<_> = state.waypoint_policies().collect();
    policies.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    if !policies.is_empty() {
        let list = policies
            .iter()
            .map(|p| json!({"namespace": p.namespace, "name": p.name, "spec": spec(&p.spec_json)}));
        out.insert("waypointPolicies".into(), list.collect());
    }
    let mut routes: Vec<_> = state.waypoint_routes().collect();
    routes.sort_by_key(|r| r.key());
    if !routes.is_empty() {
        let list = routes.iter().map(|r| {
            json!({
                "kind": r.kind,
                "namespace": r.namespace,
                "name": r.name,
                "generation": r.generation,
                "creationTimestamp": r.created,
                "spec": spec(&r.spec_json),
            })
        });
        out.insert("waypointRoutes".into(), list.collect());
    }
}

fn or_default<'a>(value: &'a str, default: &'a str) -> &'a str {
    if value.is_empty() {
        default
    } else {
        value
    }
}

/// One workload as Istio dumps it.
pub fn workload(w: &Workload) -> Value {
    let mut out = match serde_json::to_value(w) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    };
    let mut services: Vec<&String> = w.services.keys().collect();
    services.sort();
    if services.is_empty() {
        out.remove("services");
    } else {
        out.insert("services".into(), json!(services));
    }
    // Istio writes these always, filling the defaults discovery left empty.
    out.insert("uid".into(), json!(w.effective_uid()));
    out.insert(
        "trustDomain".into(),
        json!(or_default(&w.trust_domain, DEFAULT_TRUST_DOMAIN)),
    );
    out.insert(
        "serviceAccount".into(),
        json!(or_default(&w.service_account, DEFAULT_SERVICE_ACCOUNT)),
    );
    out.insert(
        "clusterId".into(),
        json!(or_default(&w.cluster_id, DEFAULT_CLUSTER_ID)),
    );
    out.insert("networkMode".into(), json!(w.network_mode));
    Value::Object(out)
}

/// One service as Istio dumps it, with its endpoints: the workloads that name it,
/// then those it lists itself, keyed by workload uid.
pub fn service(s: &Service, state: &ProxyState) -> Value {
    let mut out = match serde_json::to_value(s) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    };
    let mut endpoints = Map::new();
    for w in state.service_members(s) {
        let mut ports: Vec<(u16, u16)> = w
            .services
            .get(&s.key())
            .map(|p| p.iter().map(|(k, v)| (*k, *v)).collect())
            .unwrap_or_default();
        ports.sort();
        let port: Map<String, Value> = ports
            .into_iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        endpoints.insert(
            w.uid.clone(),
            json!({"workloadUid": w.uid, "port": port, "status": w.status}),
        );
    }
    for (uid, ep) in &s.endpoints {
        if !endpoints.contains_key(uid) {
            endpoints.insert(uid.clone(), serde_json::to_value(ep).unwrap_or_default());
        }
    }
    out.insert("endpoints".into(), Value::Object(endpoints));
    out.insert("canonical".into(), json!(s.canonical));
    // Every service is visible mesh-wide here (exportTo is not implemented).
    out.insert("visibility".into(), json!("Public"));
    Value::Object(out)
}

/// `value` with the keys of every object sorted, as Istio's ztunnel writes its dump
/// (it goes through a `serde_json::Value` whose maps are sorted).
pub fn sorted(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}
