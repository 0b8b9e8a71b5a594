//! `ProxyState`: one immutable, indexed snapshot of workloads, services and policies.
//!
//! Proxies look things up on every connection, so every lookup they make is a hash hit:
//! workloads by uid / IP / name, services by VIP / key, endpoints by service key, and
//! policies by key / namespace. Builders insert into a fresh value; once it is handed
//! to the `StateStore` it is only read (shared behind an `Arc`).

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use rand::seq::IndexedRandom;
use tracing::{debug, info};

use super::policy::{Action, Authorization, ConnectionAttrs, Denied, Scope};
use super::service::{Endpoint, Service};
use super::workload::{GatewayAddress, GatewayDestination, NetworkMode, Workload};
use shared_types::waypoint::{WaypointPolicy, WaypointRoute};

#[derive(Debug, Default, Clone)]
pub struct ProxyState {
    workloads: HashMap<String, Arc<Workload>>,
    /// Usually one workload per IP; several only while an IP is being reused.
    workloads_by_ip: HashMap<IpAddr, Vec<Arc<Workload>>>,
    workloads_by_name: HashMap<(String, String), Arc<Workload>>,
    services: HashMap<String, Arc<Service>>,
    services_by_vip: HashMap<IpAddr, Arc<Service>>,
    /// Hostname -> keys of the services with it (one per namespace that defines it).
    services_by_hostname: HashMap<String, BTreeSet<String>>,
    /// Service key -> uids of workloads whose own `services` map names it.
    endpoints: HashMap<String, BTreeSet<String>>,
    policies: HashMap<String, Arc<Authorization>>,
    /// Namespace -> keys of Namespace-scoped policies in it.
    policies_by_namespace: HashMap<String, BTreeSet<String>>,
    global_policies: BTreeSet<String>,
    /// Waypoint policies (Istio AuthorizationPolicies with `targetRefs`), by
    /// `namespace/name`; only a waypoint subscribes to them.
    waypoint_policies: HashMap<String, Arc<WaypointPolicy>>,
    /// Waypoint routes (Gateway API routes bound to Services), by `kind/namespace/name`;
    /// only a waypoint subscribes to them.
    waypoint_routes: HashMap<String, Arc<WaypointRoute>>,
}

impl ProxyState {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces (by uid) a workload. An empty uid is filled with
    /// [`Workload::effective_uid`] so it can be found and dumped.
    pub fn insert_workload(&mut self, mut workload: Workload) {
        if workload.uid.is_empty() {
            workload.uid = workload.effective_uid();
        }
        self.insert_workload_arc(Arc::new(workload));
    }

    fn insert_workload_arc(&mut self, w: Arc<Workload>) {
        self.remove_workload(&w.uid);
        if w.network_mode != NetworkMode::HostNetwork {
            for ip in &w.workload_ips {
                self.workloads_by_ip.entry(*ip).or_default().push(w.clone());
            }
        }
        if !w.name.is_empty() {
            self.workloads_by_name
                .insert((w.namespace.clone(), w.name.clone()), w.clone());
        }
        for svc in w.services.keys() {
            self.endpoints
                .entry(svc.clone())
                .or_default()
                .insert(w.uid.clone());
        }
        self.workloads.insert(w.uid.clone(), w);
    }

    pub fn remove_workload(&mut self, uid: &str) -> Option<Arc<Workload>> {
        let old = self.workloads.remove(uid)?;
        for ip in &old.workload_ips {
            if let Some(list) = self.workloads_by_ip.get_mut(ip) {
                list.retain(|w| w.uid != old.uid);
                if list.is_empty() {
                    self.workloads_by_ip.remove(ip);
                }
            }
        }
        let name_key = (old.namespace.clone(), old.name.clone());
        if self
            .workloads_by_name
            .get(&name_key)
            .is_some_and(|w| w.uid == old.uid)
        {
            self.workloads_by_name.remove(&name_key);
        }
        for svc in old.services.keys() {
            if let Some(set) = self.endpoints.get_mut(svc) {
                set.remove(&old.uid);
                if set.is_empty() {
                    self.endpoints.remove(svc);
                }
            }
        }
        Some(old)
    }

    /// Adds or replaces (by `namespace/hostname`) a service.
    pub fn insert_service(&mut self, service: Service) {
        self.insert_service_arc(Arc::new(service));
    }

    fn insert_service_arc(&mut self, s: Arc<Service>) {
        let key = s.key();
        self.remove_service(&key);
        for vip in &s.vips {
            self.services_by_vip.insert(vip.address, s.clone());
        }
        self.services_by_hostname
            .entry(s.hostname.clone())
            .or_default()
            .insert(key.clone());
        self.services.insert(key, s);
    }

    pub fn remove_service(&mut self, key: &str) -> Option<Arc<Service>> {
        let old = self.services.remove(key)?;
        if let Some(keys) = self.services_by_hostname.get_mut(&old.hostname) {
            keys.remove(key);
            if keys.is_empty() {
                self.services_by_hostname.remove(&old.hostname);
            }
        }
        for vip in &old.vips {
            if self
                .services_by_vip
                .get(&vip.address)
                .is_some_and(|s| Arc::ptr_eq(s, &old))
            {
                self.services_by_vip.remove(&vip.address);
            }
        }
        Some(old)
    }

    /// Adds or replaces (by `namespace/name`) a policy.
    pub fn insert_policy(&mut self, policy: Authorization) {
        self.insert_policy_arc(Arc::new(policy));
    }

    fn insert_policy_arc(&mut self, p: Arc<Authorization>) {
        let key = p.key();
        self.remove_policy(&key);
        match p.scope {
            Scope::Global => {
                self.global_policies.insert(key.clone());
            }
            Scope::Namespace => {
                self.policies_by_namespace
                    .entry(p.namespace.clone())
                    .or_default()
                    .insert(key.clone());
            }
            // Selected workloads name the policy themselves.
            Scope::WorkloadSelector => {}
        }
        self.policies.insert(key, p);
    }

    pub fn remove_policy(&mut self, key: &str) -> Option<Arc<Authorization>> {
        let old = self.policies.remove(key)?;
        self.global_policies.remove(key);
        if let Some(set) = self.policies_by_namespace.get_mut(&old.namespace) {
            set.remove(key);
            if set.is_empty() {
                self.policies_by_namespace.remove(&old.namespace);
            }
        }
        Some(old)
    }

    pub fn insert_waypoint_policy(&mut self, policy: WaypointPolicy) {
        let key = format!("{}/{}", policy.namespace, policy.name);
        self.waypoint_policies.insert(key, Arc::new(policy));
    }

    pub fn remove_waypoint_policy(&mut self, key: &str) -> Option<Arc<WaypointPolicy>> {
        self.waypoint_policies.remove(key)
    }

    /// Every waypoint policy, by key.
    pub fn waypoint_policies(&self) -> impl Iterator<Item = &Arc<WaypointPolicy>> {
        self.waypoint_policies.values()
    }

    /// Adds or replaces (by `kind/namespace/name`) a waypoint route.
    pub fn insert_waypoint_route(&mut self, route: WaypointRoute) {
        self.waypoint_routes.insert(route.key(), Arc::new(route));
    }

    pub fn remove_waypoint_route(&mut self, key: &str) -> Option<Arc<WaypointRoute>> {
        self.waypoint_routes.remove(key)
    }

    /// Every waypoint route, in no particular order.
    pub fn waypoint_routes(&self) -> impl Iterator<Item = &Arc<WaypointRoute>> {
        self.waypoint_routes.values()
    }

    /// Adds everything from `other`; its entries win on key collisions.
    pub fn merge_from(&mut self, other: &ProxyState) {
        for w in other.workloads.values() {
            self.insert_workload_arc(w.clone());
        }
        for s in other.services.values() {
            self.insert_service_arc(s.clone());
        }
        for p in other.policies.values() {
            self.insert_policy_arc(p.clone());
        }
        for (key, p) in &other.waypoint_policies {
            self.waypoint_policies.insert(key.clone(), p.clone());
        }
        for (key, r) in &other.waypoint_routes {
            self.waypoint_routes.insert(key.clone(), r.clone());
        }
    }

    pub fn workloads(&self) -> impl Iterator<Item = &Arc<Workload>> {
        self.workloads.values()
    }

    pub fn services(&self) -> impl Iterator<Item = &Arc<Service>> {
        self.services.values()
    }

    pub fn policies(&self) -> impl Iterator<Item = &Arc<Authorization>> {
        self.policies.values()
    }

    pub fn workload_by_uid(&self, uid: &str) -> Option<Arc<Workload>> {
        self.workloads.get(uid).cloned()
    }

    /// The workload owning `ip`. When an IP is claimed twice (a pod replaced by another),
    /// prefer a pod over other kinds, then an HBONE workload, then the newest entry.
    pub fn workload_by_ip(&self, ip: IpAddr) -> Option<Arc<Workload>> {
        let list = self.workloads_by_ip.get(&ip)?;
        list.iter()
            .enumerate()
            .max_by_key(|(i, w)| (w.uid.contains("//Pod/"), w.is_hbone(), *i))
            .map(|(_, w)| w.clone())
    }

    pub fn workload_by_name(&self, namespace: &str, name: &str) -> Option<Arc<Workload>> {
        self.workloads_by_name
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    pub fn service_by_vip(&self, ip: IpAddr) -> Option<Arc<Service>> {
        self.services_by_vip.get(&ip).cloned()
    }

    /// By `namespace/hostname`.
    pub fn service_by_key(&self, key: &str) -> Option<Arc<Service>> {
        self.services.get(key).cloned()
    }

    /// The service named `hostname` as a client in `namespace` sees it: its own
    /// namespace's if it has one, else the first by namespace (Istio's preference when
    /// several namespaces define one hostname, e.g. ServiceEntries).
    pub fn service_by_hostname(&self, hostname: &str, namespace: &str) -> Option<Arc<Service>> {
        let keys = self.services_by_hostname.get(hostname)?;
        let own = format!("{namespace}/{hostname}");
        let key = keys.get(&own).or_else(|| keys.first())?;
        self.services.get(key).cloned()
    }

    /// By `namespace/name`.
    pub fn policy(&self, key: &str) -> Option<Arc<Authorization>> {
        self.policies.get(key).cloned()
    }

    /// Endpoints of `svc` usable for service port `port`, sorted by uid: (workload,
    /// target port). Target port = the workload's own mapping, else the service's, else
    /// `port`. Unhealthy workloads are skipped unless the service's health policy is
    /// `AllowAll`.
    pub fn service_endpoints(&self, svc: &Service, port: u16) -> Vec<(Arc<Workload>, u16)> {
        let key = svc.key();
        self.endpoint_workloads(svc)
            .into_iter()
            .map(|(w, listed)| {
                let target = listed
                    .and_then(|ep| ep.port.get(&port).copied().filter(|p| *p != 0))
                    .or_else(|| w.service_target_port(&key, port))
                    .unwrap_or_else(|| svc.default_target_port(port));
                (w, target)
            })
            .collect()
    }

    /// The workloads behind `svc` that may receive traffic, sorted by uid: those whose
    /// own `services` map names it, then those the service lists itself (Istio's
    /// `endpoints` map, returned beside the workload). Unhealthy ones are skipped unless
    /// the service's health policy is `AllowAll`.
    pub fn endpoint_workloads<'s>(
        &self,
        svc: &'s Service,
    ) -> Vec<(Arc<Workload>, Option<&'s Endpoint>)> {
        let mut out: Vec<(Arc<Workload>, Option<&Endpoint>)> = Vec::new();
        let mut seen = BTreeSet::new();
        for uid in self.endpoints.get(&svc.key()).into_iter().flatten() {
            let Some(w) = self.workloads.get(uid) else {
                continue;
            };
            if svc.accepts_endpoint(w.status) {
                seen.insert(uid.as_str());
                out.push((w.clone(), None));
            }
        }
        for ep in svc.endpoints.values() {
            if seen.contains(ep.workload_uid.as_str()) {
                continue;
            }
            let Some(w) = self.workloads.get(&ep.workload_uid) else {
                continue;
            };
            if svc.accepts_endpoint(ep.status) && svc.accepts_endpoint(w.status) {
                seen.insert(ep.workload_uid.as_str());
                out.push((w.clone(), Some(ep)));
            }
        }
        out.sort_by(|a, b| a.0.uid.cmp(&b.0.uid));
        out
    }

    /// Every workload whose own `services` map names `svc`, healthy or not, by uid
    /// (for `/config_dump`).
    pub fn service_members(&self, svc: &Service) -> Vec<Arc<Workload>> {
        self.endpoints
            .get(&svc.key())
            .into_iter()
            .flatten()
            .filter_map(|uid| self.workloads.get(uid).cloned())
            .collect()
    }

    /// The workloads a waypoint (or any gateway) address stands for: the workload at
    /// its address, or the endpoints of the Service it names (by hostname or VIP).
    pub fn gateway_workloads(&self, gateway: &GatewayAddress) -> Vec<Arc<Workload>> {
        let service = match &gateway.destination {
            GatewayDestination::Address(a) => {
                if let Some(w) = self.workload_by_ip(a.address) {
                    return vec![w];
                }
                self.service_by_vip(a.address)
            }
            GatewayDestination::Hostname(h) => self.service_by_hostname(&h.hostname, &h.namespace),
        };
        service
            .map(|svc| {
                self.endpoint_workloads(&svc)
                    .into_iter()
                    .map(|(w, _)| w)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A random endpoint among [`Self::service_endpoints`].
    pub fn pick_endpoint(&self, svc: &Service, port: u16) -> Option<(Arc<Workload>, u16)> {
        self.service_endpoints(svc, port)
            .choose(&mut rand::rng())
            .cloned()
    }

    /// Policies that apply to `dst`, sorted by key: Global ones, Namespace ones of its
    /// namespace, and the WorkloadSelector ones it lists. Keys it lists that are not
    /// (yet) known are skipped.
    pub fn policies_for(&self, dst: &Workload) -> Vec<Arc<Authorization>> {
        let mut keys: BTreeSet<&str> = self.global_policies.iter().map(String::as_str).collect();
        if let Some(ns) = self.policies_by_namespace.get(&dst.namespace) {
            keys.extend(ns.iter().map(String::as_str));
        }
        keys.extend(dst.authorization_policies.iter().map(String::as_str));
        keys.into_iter()
            .filter_map(|k| {
                let p = self.policies.get(k);
                if p.is_none() {
                    debug!(policy = k, workload = %dst, "skipping unknown policy");
                }
                p.cloned()
            })
            .collect()
    }

    /// Istio's L4 decision for a connection to `dst`: any matching DENY denies; no
    /// ALLOW policy allows; otherwise an ALLOW must match. Dry-run policies are only
    /// logged.
    pub fn authorize(&self, conn: &ConnectionAttrs, dst: &Workload) -> Result<(), Denied> {
        let policies = self.policies_for(dst);
        for p in policies.iter().filter(|p| p.action == Action::Deny) {
            if p.matches(conn) {
                if p.dry_run {
                    info!(policy = %p.key(), %conn, "dry-run DENY policy would deny");
                    continue;
                }
                debug!(policy = %p.key(), %conn, "denied by policy");
                return Err(Denied::ByDeny(p.key()));
            }
        }
        let (dry_run, enforced): (Vec<_>, Vec<_>) = policies
            .iter()
            .filter(|p| p.action == Action::Allow)
            .partition(|p| p.dry_run);
        for p in dry_run {
            if !p.matches(conn) {
                info!(policy = %p.key(), %conn, "dry-run ALLOW policy would not match");
            }
        }
        if enforced.is_empty() || enforced.iter().any(|p| p.matches(conn)) {
            return Ok(());
        }
        debug!(%conn, workload = %dst, "no ALLOW policy matched");
        Err(Denied::NoAllowMatch)
    }

    /// `{"workloads": [..], "services": [..], "policies": [..]}`, each sorted by key.
    pub fn dump(&self) -> serde_json::Value {
        let mut workloads: Vec<_> = self.workloads.values().collect();
        workloads.sort_by(|a, b| a.uid.cmp(&b.uid));
        let mut services: Vec<_> = self.services.iter().collect();
        services.sort_by(|a, b| a.0.cmp(b.0));
        let mut policies: Vec<_> = self.policies.iter().collect();
        policies.sort_by(|a, b| a.0.cmp(b.0));
        serde_json::json!({
            "workloads": workloads,
            "services": services.into_iter().map(|(_, s)| s).collect::<Vec<_>>(),
            "policies": policies.into_iter().map(|(_, p)| p).collect::<Vec<_>>(),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.workloads.is_empty() && self.services.is_empty() && self.policies.is_empty()
    }

    /// (workloads, services, policies) counts, for logs.
    pub fn counts(&self) -> (usize, usize, usize) {
        (
            self.workloads.len(),
            self.services.len(),
            self.policies.len(),
        )
    }
}

#[cfg(test)]
#[path = "snapshot_tests.rs"]
mod tests;
