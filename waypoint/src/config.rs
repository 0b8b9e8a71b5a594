//! What the waypoint enforces, compiled from what discovery holds: the
//! AuthorizationPolicies attached to it and the routes of the Services it serves
//! (from istiod-lite over xDS, or from `WAYPOINT_CONFIG_PATH`: both are sources of one
//! state store). Recompiled when those change, not at every other push (workloads and
//! services come and go far more often), and swapped whole: a request reads one
//! version from start to end.

use std::sync::{Arc, RwLock};

use mesh_model::route::{Route, RouteTable};
use shared_types::waypoint::{WaypointPolicy, WaypointRoute};
use tracing::{info, warn};
use ztunnel::state::StateStore;

use crate::policy::{Policies, Policy, WaypointRef};

/// The policies and routes in force.
#[derive(Debug, Default)]
pub struct WaypointConfig {
    pub policies: Policies,
    pub routes: RouteTable,
}

/// The config in force; replaced whole when discovery's changes.
pub type SharedConfig = Arc<RwLock<Arc<WaypointConfig>>>;

/// Compiles discovery's resources for `waypoint`. One that does not compile is left
/// out, with a warning (istiod-lite reports it in the route's status too).
fn compile(
    policies: &[Arc<WaypointPolicy>],
    routes: &[Arc<WaypointRoute>],
    waypoint: &WaypointRef,
) -> WaypointConfig {
    let policies = policies
        .iter()
        .filter_map(|p| {
            Policy::from_json(p.namespace.clone(), p.name.clone(), &p.spec_json)
                .inspect_err(|e| {
                    let policy = format!("{}/{}", p.namespace, p.name);
                    warn!(%policy, error = %e, "waypoint policy ignored")
                })
                .ok()
        })
        .collect();
    let routes = routes.iter().filter_map(|r| {
        match Route::from_spec(&r.kind, &r.namespace, &r.name, &r.spec_json) {
            Ok(mut route) => {
                route.created = r.created.clone();
                Some(route)
            }
            Err(e) => {
                warn!(route = %r.key(), error = %e, "route ignored");
                None
            }
        }
    });
    WaypointConfig {
        policies: Policies::for_waypoint(policies, waypoint),
        routes: RouteTable::new(routes),
    }
}

/// Keeps the shared config in step with discovery.
pub struct ConfigFollower {
    state: StateStore,
    changes: tokio::sync::watch::Receiver<u64>,
    waypoint: WaypointRef,
    shared: SharedConfig,
    /// The resources compiled last, held so their addresses identify them (an
    /// unchanged one keeps its `Arc` from one snapshot to the next; a held one cannot
    /// be freed and its address reused by another).
    compiled: Option<Resources>,
}

/// Discovery's waypoint resources, sorted by address.
type Resources = (Vec<Arc<WaypointPolicy>>, Vec<Arc<WaypointRoute>>);

impl ConfigFollower {
    pub fn new(state: StateStore, waypoint: WaypointRef, shared: SharedConfig) -> Self {
        ConfigFollower {
            changes: state.subscribe(),
            state,
            waypoint,
            shared,
            compiled: None,
        }
    }

    /// Recompiles if discovery's policies or routes changed since the last time.
    pub fn refresh(&mut self) {
        let snapshot = self.state.snapshot();
        let policies = by_address(snapshot.waypoint_policies());
        let routes = by_address(snapshot.waypoint_routes());
        let unchanged = self
            .compiled
            .as_ref()
            .is_some_and(|(p, r)| same(p, &policies) && same(r, &routes));
        if unchanged {
            return;
        }
        let config = compile(&policies, &routes, &self.waypoint);
        let gateway = format!("{}/{}", self.waypoint.namespace, self.waypoint.name);
        info!(
            %gateway,
            policies = config.policies.len(),
            routes = config.routes.routes().len(),
            "waypoint config in force"
        );
        *self.shared.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(config);
        self.compiled = Some((policies, routes));
    }

    /// Refreshes after every change, until the state store is dropped.
    pub async fn run(mut self) {
        while self.changes.changed().await.is_ok() {
            self.refresh();
        }
    }
}

fn by_address<'a, T: 'a>(items: impl Iterator<Item = &'a Arc<T>>) -> Vec<Arc<T>> {
    let mut items: Vec<Arc<T>> = items.cloned().collect();
    items.sort_unstable_by_key(|p| Arc::as_ptr(p) as usize);
    items
}

fn same<T>(a: &[Arc<T>], b: &[Arc<T>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| Arc::ptr_eq(x, y))
}
