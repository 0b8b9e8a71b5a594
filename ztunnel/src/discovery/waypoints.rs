//! Waypoints are not supported yet. A workload or service that names one (Istio's
//! `waypoint` field, or the `istio.io/use-waypoint` label in Kubernetes) would have its
//! L7 policy enforced by that waypoint; reaching it directly would bypass that policy,
//! so the proxies refuse its traffic. Discovery says so once per resource.

use std::collections::BTreeMap;

use tracing::warn;

use crate::state::workload::GatewayAddress;
use crate::state::{ProxyState, Service, Workload};

/// `"workload ns/name"` / `"service ns/hostname"` -> the waypoint it names, for every
/// waypoint-bound resource.
pub fn bound<'a>(
    workloads: impl IntoIterator<Item = &'a Workload>,
    services: impl IntoIterator<Item = &'a Service>,
) -> BTreeMap<String, String> {
    let named = |w: &Option<GatewayAddress>| w.as_ref().map(|w| w.destination.to_string());
    let mut out = BTreeMap::new();
    for w in workloads {
        if let Some(waypoint) = named(&w.waypoint) {
            out.insert(format!("workload {w}"), waypoint);
        }
    }
    for s in services {
        if let Some(waypoint) = named(&s.waypoint) {
            out.insert(format!("service {}", s.key()), waypoint);
        }
    }
    out
}

/// [`bound`] over everything a source holds.
pub fn bound_in(state: &ProxyState) -> BTreeMap<String, String> {
    bound(
        state.workloads().map(|w| w.as_ref()),
        state.services().map(|s| s.as_ref()),
    )
}

/// Warns once per waypoint-bound resource of one source (again only if it names
/// another waypoint, or stops and starts naming one).
#[derive(Debug, Default)]
pub struct WaypointWarnings {
    warned: BTreeMap<String, String>,
}

impl WaypointWarnings {
    /// Logs the resources of `source` not reported before; returns them.
    pub fn report(&mut self, source: &str, now: BTreeMap<String, String>) -> Vec<String> {
        let mut new = Vec::new();
        for (resource, waypoint) in &now {
            if self.warned.get(resource) != Some(waypoint) {
                warn!(source, %resource, %waypoint,
                    "names a waypoint, which this ztunnel does not support: its traffic is refused (reaching it directly would bypass the waypoint's L7 policy)");
                new.push(resource.clone());
            }
        }
        self.warned = now;
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waypoint() -> Option<GatewayAddress> {
        serde_yaml::from_str("destination: ns/wp.ns.svc.cluster.local\nhboneMtlsPort: 15008")
            .unwrap()
    }

    #[test]
    fn each_bound_resource_is_reported_once() {
        let bound_wl = Workload {
            name: "a".into(),
            namespace: "ns".into(),
            waypoint: waypoint(),
            ..Default::default()
        };
        let free_wl = Workload {
            name: "b".into(),
            namespace: "ns".into(),
            ..Default::default()
        };
        let svc = Service {
            namespace: "ns".into(),
            hostname: "s.ns.svc.cluster.local".into(),
            waypoint: waypoint(),
            ..Default::default()
        };
        let mut warnings = WaypointWarnings::default();
        let all = bound([&bound_wl, &free_wl], [&svc]);
        assert_eq!(
            all.keys().collect::<Vec<_>>(),
            ["service ns/s.ns.svc.cluster.local", "workload ns/a"]
        );
        assert_eq!(warnings.report("local", all.clone()).len(), 2);
        assert!(
            warnings.report("local", all).is_empty(),
            "once per resource"
        );
        // Dropped and named again: reported again.
        assert!(warnings.report("local", bound([&free_wl], [])).is_empty());
        assert_eq!(
            warnings.report("local", bound([&bound_wl], [])),
            ["workload ns/a"]
        );
    }
}
