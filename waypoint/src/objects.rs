//! `WAYPOINT_CONFIG_PATH`: the Kubernetes objects a waypoint without a control plane
//! applies (a VM, the tests): a YAML stream of AuthorizationPolicy, HTTPRoute,
//! GRPCRoute and TCPRoute objects (or `List`s of them), as `kubectl apply -f` takes
//! them, followed as the file changes.
//!
//! Each object becomes the xDS resource istiod-lite would send for it
//! ([`WaypointPolicy`], [`WaypointRoute`]) in the state store's `waypoint-file`
//! source, so the waypoint reads file and control plane the same way. Unlike what
//! comes over xDS, a file with an object the waypoint cannot apply is refused whole
//! (with the object named), so a typo is seen when the file is written.

use std::path::PathBuf;

use mesh_model::route::{Route, RouteError};
use serde::Deserialize;
use shared_types::waypoint::{WaypointPolicy, WaypointRoute};
use ztunnel::discovery::{DiscoveryError, WatchedFile};
use ztunnel::state::ProxyState;

use crate::policy::Policy;

/// The state store's source for the file.
pub const SOURCE: &str = "waypoint-file";

/// Why the file (or one object in it) is refused.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("policy {0}: the {1} action is not supported by this waypoint")]
    UnsupportedAction(String, String),
    #[error("reading the objects: {0}")]
    Yaml(#[from] serde_yaml::Error),
    #[error(
        "{0}: kind {1:?} is not one a waypoint applies (AuthorizationPolicy, HTTPRoute, GRPCRoute, TCPRoute)"
    )]
    UnsupportedKind(String, String),
    #[error("{kind} {namespace}/{name}: {error}")]
    Route {
        kind: String,
        namespace: String,
        name: String,
        error: RouteError,
    },
}

/// The objects of one file, as their xDS resources.
#[derive(Debug, Default)]
pub struct Objects {
    pub policies: Vec<WaypointPolicy>,
    pub routes: Vec<WaypointRoute>,
}

impl Objects {
    pub fn into_state(self) -> ProxyState {
        let mut state = ProxyState::default();
        for p in self.policies {
            state.insert_waypoint_policy(p);
        }
        for r in self.routes {
            state.insert_waypoint_route(r);
        }
        state
    }
}

#[derive(Deserialize)]
struct Object {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    metadata: Metadata,
    #[serde(default)]
    spec: Option<serde_json::Value>,
    /// A `List` of objects.
    #[serde(default)]
    items: Vec<Object>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Metadata {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    generation: Option<i64>,
    #[serde(default)]
    creation_timestamp: Option<String>,
}

/// Reads a YAML stream of objects. One without a namespace is in `default`, as
/// `kubectl apply` would put it.
pub fn parse_objects(yaml: &str) -> Result<Objects, LoadError> {
    let mut out = Objects::default();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let value = serde_yaml::Value::deserialize(doc)?;
        if value.is_null() {
            continue;
        }
        let object: Object = serde_yaml::from_value(value)?;
        collect(object, &mut out)?;
    }
    Ok(out)
}

fn collect(object: Object, out: &mut Objects) -> Result<(), LoadError> {
    let namespace = || {
        object
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into())
    };
    let spec_json = object
        .spec
        .clone()
        .unwrap_or(serde_json::Value::Null)
        .to_string();
    match object.kind.as_str() {
        "List" | "AuthorizationPolicyList" | "HTTPRouteList" | "GRPCRouteList" | "TCPRouteList" => {
            for item in object.items {
                collect(item, out)?;
            }
        }
        "AuthorizationPolicy" => {
            // Compiled here only to refuse what the waypoint cannot enforce.
            Policy::from_json(namespace(), object.metadata.name.clone(), &spec_json)?;
            out.policies.push(WaypointPolicy {
                name: object.metadata.name,
                namespace: namespace(),
                spec_json,
            });
        }
        kind @ ("HTTPRoute" | "GRPCRoute" | "TCPRoute") => {
            let ns = namespace();
            let name = object.metadata.name.clone();
            Route::from_spec(kind, &ns, &name, &spec_json).map_err(|error| LoadError::Route {
                kind: kind.into(),
                namespace: ns.clone(),
                name: name.clone(),
                error,
            })?;
            out.routes.push(WaypointRoute {
                kind: kind.into(),
                name,
                namespace: ns,
                spec_json,
                generation: object.metadata.generation.unwrap_or(1),
                created: object.metadata.creation_timestamp.unwrap_or_default(),
            });
        }
        other => {
            return Err(LoadError::UnsupportedKind(
                object.metadata.name,
                other.to_owned(),
            ))
        }
    }
    Ok(())
}

fn parse_file(bytes: &[u8]) -> Result<ProxyState, DiscoveryError> {
    let text = String::from_utf8(bytes.to_vec())?;
    parse_objects(&text)
        .map(Objects::into_state)
        .map_err(|e| DiscoveryError::Invalid(e.to_string()))
}

fn describe(state: &ProxyState) -> String {
    format!(
        "{} AuthorizationPolicies, {} routes",
        state.waypoint_policies().count(),
        state.waypoint_routes().count()
    )
}

/// The file, for [`ztunnel::discovery::watch_file`].
pub fn watched(path: PathBuf) -> WatchedFile {
    WatchedFile {
        path,
        source: SOURCE,
        parse: parse_file,
        describe,
    }
}
