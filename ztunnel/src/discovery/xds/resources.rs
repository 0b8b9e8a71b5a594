//! What the client holds: every resource istiod sent, by type and name, with its
//! version, and the [`ProxyState`] they make up. Applying a response is pure, so it
//! is tested (and fuzzed) without a network.

use std::collections::HashMap;

use prost::Message;
use shared_types::istio::security::{self, AUTHORIZATION_TYPE_URL};
use shared_types::istio::workload::{self, ADDRESS_TYPE_URL};
use shared_types::istio::xds::{DeltaDiscoveryResponse, Resource};
use shared_types::waypoint::{
    WaypointPolicy, WaypointRoute, WAYPOINT_POLICY_TYPE_URL, WAYPOINT_ROUTE_TYPE_URL,
};

use crate::state::ProxyState;
use mesh_model::xds::{self as convert, Converted};

/// The types ztunnel subscribes to, in the order it asks for them.
pub const TYPES: [&str; 2] = [ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL];
/// What a waypoint subscribes to: ztunnel's types, then its policies and routes.
pub const WAYPOINT_TYPES: [&str; 4] = [
    ADDRESS_TYPE_URL,
    AUTHORIZATION_TYPE_URL,
    WAYPOINT_POLICY_TYPE_URL,
    WAYPOINT_ROUTE_TYPE_URL,
];

/// The route kinds a waypoint serves (GAMMA).
const ROUTE_KINDS: [&str; 3] = ["HTTPRoute", "GRPCRoute", "TCPRoute"];

/// One refused resource (or a refused response, with an empty name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceError {
    pub name: String,
    pub reason: String,
}

impl std::fmt::Display for ResourceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.name.is_empty() {
            f.write_str(&self.reason)
        } else {
            write!(f, "{}: {}", self.name, self.reason)
        }
    }
}

/// What a resource name became in the state.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Key {
    Workload(String),
    Service(String),
    Policy(String),
    WaypointPolicy(String),
    WaypointRoute(String),
}

#[derive(Debug, Clone)]
struct Held {
    version: String,
    key: Key,
}

#[derive(Debug, Clone)]
pub struct Resources {
    /// The types subscribed to ([`TYPES`] or [`WAYPOINT_TYPES`]).
    types: &'static [&'static str],
    state: ProxyState,
    /// type URL -> resource name -> what we hold of it.
    held: HashMap<&'static str, HashMap<String, Held>>,
}

impl Default for Resources {
    fn default() -> Self {
        Self::new(&TYPES)
    }
}

/// One decoded resource.
enum Decoded {
    Istio(Converted),
    WaypointPolicy(WaypointPolicy),
    WaypointRoute(WaypointRoute),
}

impl Resources {
    pub fn new(types: &'static [&'static str]) -> Self {
        Resources {
            types,
            state: ProxyState::default(),
            held: HashMap::new(),
        }
    }

    /// The types subscribed to, in the order they are asked for.
    pub fn types(&self) -> &'static [&'static str] {
        self.types
    }

    pub fn state(&self) -> &ProxyState {
        &self.state
    }

    /// Name -> version of every resource held of `type_url`, for
    /// `initial_resource_versions` on a reconnect.
    pub fn versions(&self, type_url: &str) -> HashMap<String, String> {
        self.held
            .get(type_url)
            .into_iter()
            .flatten()
            .map(|(name, held)| (name.clone(), held.version.clone()))
            .collect()
    }

    /// Applies one response: every valid resource is added or replaced, every removed
    /// name dropped. Invalid resources keep their previous version and are returned.
    pub fn apply(&mut self, response: DeltaDiscoveryResponse) -> Vec<ResourceError> {
        let Some(type_url) = self.types.iter().copied().find(|t| *t == response.type_url) else {
            return vec![ResourceError {
                name: String::new(),
                reason: format!("type {:?} was not subscribed to", response.type_url),
            }];
        };
        let mut errors = Vec::new();
        for resource in response.resources {
            let name = resource.name.clone();
            let version = resource.version.clone();
            match decode(type_url, resource) {
                Ok(converted) => self.insert(type_url, name, version, converted),
                Err(reason) => errors.push(ResourceError { name, reason }),
            }
        }
        for name in response.removed_resources {
            self.remove(type_url, &name);
        }
        errors
    }

    fn insert(&mut self, type_url: &'static str, name: String, version: String, value: Decoded) {
        let value = match value {
            Decoded::Istio(value) => value,
            Decoded::WaypointPolicy(p) => {
                let key = Key::WaypointPolicy(format!("{}/{}", p.namespace, p.name));
                self.replace(type_url, &name, &key);
                self.state.insert_waypoint_policy(p);
                self.held
                    .entry(type_url)
                    .or_default()
                    .insert(name, Held { version, key });
                return;
            }
            Decoded::WaypointRoute(r) => {
                let key = Key::WaypointRoute(r.key());
                self.replace(type_url, &name, &key);
                self.state.insert_waypoint_route(r);
                self.held
                    .entry(type_url)
                    .or_default()
                    .insert(name, Held { version, key });
                return;
            }
        };
        let key = match value {
            Converted::Workload(w) => {
                let key = Key::Workload(w.uid.clone());
                self.replace(type_url, &name, &key);
                self.state.insert_workload(*w);
                key
            }
            Converted::Service(s) => {
                let key = Key::Service(s.key());
                self.replace(type_url, &name, &key);
                self.state.insert_service(*s);
                key
            }
            Converted::Policy(p) => {
                let key = Key::Policy(p.key());
                self.replace(type_url, &name, &key);
                self.state.insert_policy(*p);
                key
            }
        };
        self.held
            .entry(type_url)
            .or_default()
            .insert(name, Held { version, key });
    }

    /// Before `name` is stored as `key`: drops what `name` stood for if that was
    /// something else (a name whose uid or kind changed).
    fn replace(&mut self, type_url: &str, name: &str, key: &Key) {
        let old = self.held.get(type_url).and_then(|m| m.get(name));
        if let Some(old) = old.filter(|old| old.key != *key).map(|o| o.key.clone()) {
            self.drop_key(&old);
        }
    }

    fn remove(&mut self, type_url: &str, name: &str) {
        if let Some(held) = self.held.get_mut(type_url).and_then(|m| m.remove(name)) {
            self.drop_key(&held.key);
        }
    }

    fn drop_key(&mut self, key: &Key) {
        match key {
            Key::Workload(uid) => {
                self.state.remove_workload(uid);
            }
            Key::Service(key) => {
                self.state.remove_service(key);
            }
            Key::Policy(key) => {
                self.state.remove_policy(key);
            }
            Key::WaypointPolicy(key) => {
                self.state.remove_waypoint_policy(key);
            }
            Key::WaypointRoute(key) => {
                self.state.remove_waypoint_route(key);
            }
        }
    }
}

fn decode(type_url: &str, resource: Resource) -> Result<Decoded, String> {
    if resource.name.is_empty() {
        return Err("the resource has no name".into());
    }
    let body = resource.resource.ok_or("the resource has no body")?;
    if body.type_url != type_url {
        return Err(format!(
            "the body is a {:?}, not a {type_url:?}",
            body.type_url
        ));
    }
    let bad = |e: prost::DecodeError| format!("cannot decode: {e}");
    match type_url {
        ADDRESS_TYPE_URL => {
            let address = workload::Address::decode(body.value.as_slice()).map_err(bad)?;
            convert::address(address)
                .map(Decoded::Istio)
                .map_err(|e| e.to_string())
        }
        WAYPOINT_POLICY_TYPE_URL => {
            let policy = WaypointPolicy::decode(body.value.as_slice()).map_err(bad)?;
            if policy.name.is_empty() || policy.namespace.is_empty() {
                return Err("the policy has no name or namespace".into());
            }
            serde_json::from_str::<serde_json::Value>(&policy.spec_json)
                .map_err(|e| format!("the policy's spec is not JSON: {e}"))?;
            Ok(Decoded::WaypointPolicy(policy))
        }
        WAYPOINT_ROUTE_TYPE_URL => {
            let route = WaypointRoute::decode(body.value.as_slice()).map_err(bad)?;
            if route.kind.is_empty() || route.name.is_empty() || route.namespace.is_empty() {
                return Err("the route has no kind, name or namespace".into());
            }
            if !ROUTE_KINDS.contains(&route.kind.as_str()) {
                return Err(format!("the route's kind {:?} is not served", route.kind));
            }
            serde_json::from_str::<serde_json::Value>(&route.spec_json)
                .map_err(|e| format!("the route's spec is not JSON: {e}"))?;
            Ok(Decoded::WaypointRoute(route))
        }
        _ => {
            let policy = security::Authorization::decode(body.value.as_slice()).map_err(bad)?;
            convert::authorization(policy)
                .map(|p| Decoded::Istio(Converted::Policy(Box::new(p))))
                .map_err(|e| e.to_string())
        }
    }
}

#[cfg(test)]
#[path = "resources_tests.rs"]
mod tests;
