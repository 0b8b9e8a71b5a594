//! The `status.parents` of a route bound to Services (GAMMA), as istiod writes it
//! (`pilot/pkg/config/kube/gateway`: `createRouteStatus` and `setConditions` in
//! conditions.go, `referenceAllowed` and `buildDestination` in conversion.go): one
//! entry per Service `parentRefs` entry, naming Istio's controller, with `Accepted` and
//! `ResolvedRefs`. Entries of other controllers, and of ours for other kinds of parent,
//! are left as they are. Pure, so the controller ([`super::route_status`]) only reads
//! and writes.
//!
//! Where we differ from istiod: a spec the waypoint cannot compile is `Accepted`
//! False (`UnsupportedValue`, the Gateway API's reason for it; istiod reports its own
//! translation errors under `ResolvedRefs`); `ResolvedWaypoints` (whether the parent is
//! bound to a waypoint) is not written. As istiod, cross-namespace backends of a mesh
//! route need no ReferenceGrant (it enforces them for Gateway parents only).

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::core::DynamicObject;
use kube::ResourceExt;
use serde_json::{json, Value};

use crate::model::routes::is_service_parent;

/// The controller name istiod writes on the routes it handles.
pub const GATEWAY_CONTROLLER: &str = "istio.io/gateway-controller";

/// A Service, by `(namespace, name)`.
pub type ServiceKey = (String, String);

/// One condition as computed, before it meets the stored one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Condition {
    ok: bool,
    reason: String,
    message: String,
}

impl Condition {
    fn ok(reason: &str, message: &str) -> Self {
        Condition {
            ok: true,
            reason: reason.into(),
            message: message.into(),
        }
    }

    fn failed(reason: &str, message: String) -> Self {
        Condition {
            ok: false,
            reason: reason.into(),
            message,
        }
    }
}

/// The route's new `status.parents`. `services` holds every Service there is;
/// `compiled` is whether the waypoint compiles the spec (its error otherwise);
/// `domain` is the cluster's DNS domain (backends are named by hostname); `now` stamps
/// the conditions that change status.
pub fn parents_status(
    route: &DynamicObject,
    services: &HashSet<ServiceKey>,
    compiled: Result<(), String>,
    domain: &str,
    now: &Time,
) -> Vec<Value> {
    let namespace = route.namespace().unwrap_or_default();
    let generation = route.metadata.generation;
    let current: Vec<Value> = route.data["status"]["parents"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let exists = |ns: &str, name: &str| services.contains(&(ns.to_owned(), name.to_owned()));
    let resolved = resolved_refs(route, &namespace, domain, &exists);

    // Ours, by parent: one entry per distinct Service parentRef.
    let mut wanted: BTreeMap<String, (Value, BTreeMap<&str, Condition>)> = BTreeMap::new();
    for parent in route.data["spec"]["parentRefs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| is_service_parent(p))
    {
        let name = parent["name"].as_str().unwrap_or_default();
        let parent_namespace = parent["namespace"].as_str().unwrap_or(&namespace);
        let accepted = if !exists(parent_namespace, name) {
            Condition::failed(
                "NoMatchingParent",
                format!("parent service: {} not found", go_quote(name)),
            )
        } else if let Err(e) = &compiled {
            Condition::failed("UnsupportedValue", e.clone())
        } else {
            Condition::ok("Accepted", "Route was valid")
        };
        let conditions =
            BTreeMap::from([("Accepted", accepted), ("ResolvedRefs", resolved.clone())]);
        wanted.insert(
            parent_ref_key(parent, &namespace),
            (parent.clone(), conditions),
        );
    }

    // As istiod: our existing entries are rewritten in place, new ones appended (in
    // descending key order), stale ones dropped; everything else is kept.
    let ours = |entry: &Value| {
        entry["controllerName"] == GATEWAY_CONTROLLER && is_service_parent(&entry["parentRef"])
    };
    let mut out = Vec::with_capacity(current.len() + wanted.len());
    for entry in &current {
        if !ours(entry) {
            out.push(entry.clone());
            continue;
        }
        let key = parent_ref_key(&entry["parentRef"], &namespace);
        if let Some((parent, conditions)) = wanted.remove(&key) {
            out.push(parent_status(
                parent,
                &entry["conditions"],
                conditions,
                generation,
                now,
            ));
        }
    }
    for (parent, conditions) in wanted.into_values().rev() {
        out.push(parent_status(
            parent,
            &Value::Null,
            conditions,
            generation,
            now,
        ));
    }
    out
}

/// istiod's key for a parent reference: `group/kind/name/section/port.namespace`.
fn parent_ref_key(parent: &Value, route_namespace: &str) -> String {
    format!(
        "{}/{}/{}/{}/{}.{}",
        parent["group"]
            .as_str()
            .unwrap_or("gateway.networking.k8s.io"),
        parent["kind"].as_str().unwrap_or("Gateway"),
        parent["name"].as_str().unwrap_or_default(),
        parent["sectionName"].as_str().unwrap_or_default(),
        parent["port"].as_u64().unwrap_or_default(),
        parent["namespace"].as_str().unwrap_or(route_namespace),
    )
}

fn parent_status(
    parent: Value,
    existing: &Value,
    conditions: BTreeMap<&str, Condition>,
    generation: Option<i64>,
    now: &Time,
) -> Value {
    json!({
        "parentRef": parent,
        "controllerName": GATEWAY_CONTROLLER,
        "conditions": set_conditions(existing, conditions, generation, now),
    })
}

/// istiod's `setConditions`: each condition replaces the stored one of its type (others
/// are kept, in place); one whose status did not change keeps its
/// `lastTransitionTime`, and one unchanged altogether is kept as stored.
fn set_conditions(
    existing: &Value,
    conditions: BTreeMap<&str, Condition>,
    generation: Option<i64>,
    now: &Time,
) -> Vec<Value> {
    let mut out: Vec<Value> = existing.as_array().cloned().unwrap_or_default();
    for (kind, c) in conditions {
        let status = if c.ok { "True" } else { "False" };
        let mut condition = json!({
            "type": kind,
            "status": status,
            "observedGeneration": generation,
            "lastTransitionTime": now,
            "reason": c.reason,
            "message": c.message,
        });
        match out.iter_mut().find(|old| old["type"] == kind) {
            None => out.push(condition),
            Some(old) if old["status"] == status => {
                let unchanged = old["reason"] == condition["reason"]
                    && old["message"] == condition["message"]
                    && old["observedGeneration"] == condition["observedGeneration"];
                if !unchanged {
                    condition["lastTransitionTime"] = old["lastTransitionTime"].clone();
                    *old = condition;
                }
            }
            Some(old) => *old = condition,
        }
    }
    out
}

/// `ResolvedRefs` for the whole route: istiod's checks of every backend with a weight
/// (and of every request mirror), the last failure reported, a rule's backend and
/// mirror failures joined.
fn resolved_refs(
    route: &DynamicObject,
    namespace: &str,
    domain: &str,
    exists: &dyn Fn(&str, &str) -> bool,
) -> Condition {
    let mut failure = None;
    for rule in route.data["spec"]["rules"].as_array().into_iter().flatten() {
        let backends = rule["backendRefs"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        let weighted = backends
            .iter()
            .filter(|b| b["weight"].as_i64().unwrap_or(1) != 0);
        let backend = weighted
            .filter_map(|b| backend_failure(b, namespace, domain, exists))
            .last();
        let mirror = rule["filters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f.get("requestMirror"))
            .filter_map(|m| backend_failure(&m["backendRef"], namespace, domain, exists))
            .last();
        let joined = match (backend, mirror) {
            (Some(mut b), Some(m)) => {
                b.message = format!("{}; {}", b.message, m.message);
                Some(b)
            }
            (b, m) => b.or(m),
        };
        failure = joined.or(failure);
    }
    failure.unwrap_or_else(|| Condition::ok("ResolvedRefs", "All references resolved"))
}

/// Why a backend reference does not resolve, in istiod's words.
fn backend_failure(
    backend: &Value,
    namespace: &str,
    domain: &str,
    exists: &dyn Fn(&str, &str) -> bool,
) -> Option<Condition> {
    let group = backend["group"].as_str().unwrap_or_default();
    let kind = backend["kind"].as_str().unwrap_or("Service");
    if !group.is_empty() || kind != "Service" {
        return Some(Condition::failed(
            "InvalidKind",
            format!(
                "referencing unsupported backendRef: group {} kind {}",
                go_quote(backend["group"].as_str().unwrap_or_default()),
                go_quote(backend["kind"].as_str().unwrap_or_default()),
            ),
        ));
    }
    let name = backend["name"].as_str().unwrap_or_default();
    let backend_namespace = backend["namespace"].as_str().unwrap_or(namespace);
    (!exists(backend_namespace, name)).then(|| {
        Condition::failed(
            "BackendNotFound",
            format!("backend({name}.{backend_namespace}.svc.{domain}) not found"),
        )
    })
}

/// Go's `%q` of a string, as istiod's messages quote names (JSON's quoting agrees for
/// the names Kubernetes allows).
fn go_quote(s: &str) -> String {
    Value::from(s).to_string()
}

#[cfg(test)]
#[path = "route_parents_tests.rs"]
mod tests;
