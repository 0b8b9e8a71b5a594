//! Kubernetes Pods and Services -> our [`Workload`]s and [`Service`]s.
//!
//! Mirrors what istiod sends ztunnel for Kubernetes objects (its `ambient` index), so a
//! cluster without istiod sees the same state: the same uids, hostnames, VIP forms and
//! per-workload service port maps. Everything here is a pure function of the objects,
//! which keeps it unit-testable and lets a rebuild be compared with the previous one.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Pod, Service as KubeService, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use shared_types::constants::{
    GATEWAY_MANAGED_LABEL, HBONE_PORT, USE_WAYPOINT_LABEL, USE_WAYPOINT_NAMESPACE_LABEL,
    WAYPOINT_CONTROLLER,
};
use tracing::debug;

use super::policy::ConvertedPolicy;
use super::Options;
use mesh_model::service::{AppProtocol, IpFamilies, NamespacedHostname, NetworkAddress};
use mesh_model::workload::{GatewayAddress, GatewayDestination, NetworkMode};
use mesh_model::{HealthStatus, Protocol, Service, Workload};

/// `<name>.<namespace>.svc.<cluster domain>`.
pub fn service_hostname(name: &str, namespace: &str, cluster_domain: &str) -> String {
    format!("{name}.{namespace}.svc.{cluster_domain}")
}

/// A Service as far as endpoints go: its key and selector, and each port's target
/// (a number, or a container port name resolved per pod).
#[derive(Debug, Clone)]
pub struct ServiceInfo {
    pub service: Service,
    pub selector: BTreeMap<String, String>,
    pub targets: Vec<(u16, Target)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Port(u16),
    Named(String),
}

/// Converts a Service; `None` for objects with nothing to route (ExternalName, no name).
pub fn service(svc: &KubeService, opts: &Options) -> Option<ServiceInfo> {
    let name = svc.metadata.name.as_deref().filter(|n| !n.is_empty())?;
    let namespace = svc
        .metadata
        .namespace
        .as_deref()
        .filter(|n| !n.is_empty())?;
    let spec = svc.spec.as_ref()?;
    if spec.type_.as_deref() == Some("ExternalName") {
        debug!(service = %format!("{namespace}/{name}"), "skipping ExternalName service");
        return None;
    }
    let mut targets = Vec::new();
    let mut ports = HashMap::new();
    let mut app_protocols = HashMap::new();
    for p in spec.ports.iter().flatten() {
        let Some((port, target)) = service_port(p) else {
            continue;
        };
        if let Some(protocol) = app_protocol(p) {
            app_protocols.insert(port, protocol);
        }
        // Istio's form: a named target port is 0 on the service (resolved per workload).
        ports.insert(
            port,
            match &target {
                Target::Port(t) => *t,
                Target::Named(_) => 0,
            },
        );
        targets.push((port, target));
    }
    Some(ServiceInfo {
        service: Service {
            name: name.to_string(),
            namespace: namespace.to_string(),
            hostname: service_hostname(name, namespace, &opts.cluster_domain),
            vips: service_vips(svc),
            ports,
            ip_families: ip_families(spec.ip_families.as_deref().unwrap_or_default()),
            app_protocols,
            ..Default::default()
        },
        selector: spec.selector.clone().unwrap_or_default(),
        targets,
    })
}

/// A port's application protocol as Istio reads it: `appProtocol` if set, else the
/// port name's prefix (`http`, `http-web`, `grpc-api`, ...). Only the protocols a
/// waypoint parses are kept; the rest is TCP.
fn app_protocol(p: &ServicePort) -> Option<AppProtocol> {
    let declared = match p.app_protocol.as_deref().filter(|a| !a.is_empty()) {
        Some(app_protocol) => app_protocol.to_ascii_lowercase(),
        None => {
            let name = p.name.as_deref()?;
            name.split('-').next().unwrap_or(name).to_ascii_lowercase()
        }
    };
    Some(match declared.as_str() {
        "http" => AppProtocol::Http11,
        "http2" | "h2c" | "kubernetes.io/h2c" => AppProtocol::Http2,
        "grpc" | "grpc-web" => AppProtocol::Grpc,
        _ => return None,
    })
}

/// (service port, target). An unset target port means the service port (Kubernetes'
/// defaulting); invalid numbers are skipped.
fn service_port(p: &ServicePort) -> Option<(u16, Target)> {
    let port = u16::try_from(p.port).ok().filter(|p| *p != 0)?;
    let target = match &p.target_port {
        None => Target::Port(port),
        Some(IntOrString::Int(0)) => Target::Port(port),
        Some(IntOrString::Int(n)) => Target::Port(u16::try_from(*n).ok()?),
        Some(IntOrString::String(s)) => match s.parse::<u16>() {
            Ok(n) if n != 0 => Target::Port(n),
            _ if s.is_empty() => Target::Port(port),
            _ => Target::Named(s.clone()),
        },
    };
    Some((port, target))
}

/// `spec.ipFamilies` as Istio publishes it: one family, both (`DUAL`), or unset
/// (`AUTOMATIC`) when the API server filled in none.
fn ip_families(families: &[String]) -> Option<IpFamilies> {
    let has = |f: &str| families.iter().any(|x| x == f);
    match (has("IPv4"), has("IPv6")) {
        (true, true) => Some(IpFamilies::Dual),
        (true, false) => Some(IpFamilies::IPv4),
        (false, true) => Some(IpFamilies::IPv6),
        (false, false) => None,
    }
}

/// ClusterIPs (not `None`), plus load-balancer ingress IPs, in the default network.
fn service_vips(svc: &KubeService) -> Vec<NetworkAddress> {
    let spec = svc.spec.as_ref();
    let mut ips: Vec<&str> = spec
        .and_then(|s| s.cluster_ips.as_ref())
        .filter(|ips| !ips.is_empty())
        .map(|ips| ips.iter().map(String::as_str).collect())
        .or_else(|| {
            spec.and_then(|s| s.cluster_ip.as_deref())
                .map(|ip| vec![ip])
        })
        .unwrap_or_default();
    if spec.and_then(|s| s.type_.as_deref()) == Some("LoadBalancer") {
        let ingress = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref());
        ips.extend(
            ingress
                .into_iter()
                .flatten()
                .filter_map(|i| i.ip.as_deref()),
        );
    }
    let mut out: Vec<NetworkAddress> = ips
        .into_iter()
        .filter_map(|ip| ip.parse::<IpAddr>().ok())
        .map(|address| NetworkAddress {
            network: String::new(),
            address,
        })
        .collect();
    out.dedup();
    out
}

/// Namespace name -> its labels.
pub type NamespaceLabels = HashMap<String, BTreeMap<String, String>>;

/// The traffic a waypoint takes, as Istio's `istio.io/waypoint-for` values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WaypointFor {
    /// Traffic addressed to Services (Istio's default).
    #[default]
    Service,
    /// Traffic addressed to pods directly.
    Workload,
    All,
    None,
}

impl WaypointFor {
    /// The label's value; anything else is Istio's default.
    pub fn parse(value: &str) -> Self {
        match value {
            "workload" => WaypointFor::Workload,
            "all" => WaypointFor::All,
            "none" => WaypointFor::None,
            _ => WaypointFor::Service,
        }
    }

    fn services(self) -> bool {
        matches!(self, WaypointFor::Service | WaypointFor::All)
    }

    fn workloads(self) -> bool {
        matches!(self, WaypointFor::Workload | WaypointFor::All)
    }
}

/// What binds Services and pods to waypoints: the `istio.io/use-waypoint` labels of
/// namespaces (objects carry their own), and what each waypoint's Gateway takes.
#[derive(Clone, Debug, Default)]
pub struct WaypointBindings {
    pub namespaces: NamespaceLabels,
    /// `(namespace, name)` of each `istio-waypoint` Gateway -> its `waypoint-for`.
    pub gateways: HashMap<(String, String), WaypointFor>,
}

impl WaypointBindings {
    /// The waypoint of a Service (`workload` false) or a pod (`workload` true) in
    /// `namespace` with `labels`. A waypoint whose Gateway is not (yet) known is taken
    /// as Istio's default Gateway (`waypoint-for: service`): its Services are bound,
    /// and refused by the proxies until it runs, rather than let through without its
    /// policy (Istio leaves them unbound).
    pub fn waypoint(
        &self,
        namespace: &str,
        labels: Option<&BTreeMap<String, String>>,
        workload: bool,
        cluster_domain: &str,
    ) -> Option<GatewayAddress> {
        let (waypoint_namespace, name) =
            waypoint_ref(namespace, labels, self.namespaces.get(namespace))?;
        let takes = self
            .gateways
            .get(&(waypoint_namespace.clone(), name.clone()))
            .copied()
            .unwrap_or_default();
        let bound = if workload {
            takes.workloads()
        } else {
            takes.services()
        };
        bound.then(|| waypoint_address(&waypoint_namespace, &name, cluster_domain))
    }
}

/// The waypoint `(namespace, name)` an object in `namespace` with `labels` names, as
/// istiod resolves the `istio.io/use-waypoint` labels: the object's own label, else
/// its namespace's (`none` opts out); a waypoint never uses one.
pub fn waypoint_ref(
    namespace: &str,
    labels: Option<&BTreeMap<String, String>>,
    namespace_labels: Option<&BTreeMap<String, String>>,
) -> Option<(String, String)> {
    if labels
        .and_then(|l| l.get(GATEWAY_MANAGED_LABEL))
        .is_some_and(|v| v == WAYPOINT_CONTROLLER)
    {
        return None;
    }
    // The object's own label wins, `none` included.
    let source = labels
        .filter(|l| l.contains_key(USE_WAYPOINT_LABEL))
        .or(namespace_labels)?;
    let name = source.get(USE_WAYPOINT_LABEL)?.trim();
    if name.is_empty() || name == "none" {
        return None;
    }
    let waypoint_namespace = source
        .get(USE_WAYPOINT_NAMESPACE_LABEL)
        .map(|n| n.trim())
        .filter(|n| !n.is_empty())
        .unwrap_or(namespace);
    Some((waypoint_namespace.to_string(), name.to_string()))
}

/// A waypoint's address in Istio's workload API: its Service, reached on HBONE.
pub fn waypoint_address(namespace: &str, name: &str, cluster_domain: &str) -> GatewayAddress {
    GatewayAddress {
        destination: GatewayDestination::Hostname(NamespacedHostname {
            namespace: namespace.to_string(),
            hostname: service_hostname(name, namespace, cluster_domain),
        }),
        hbone_mtls_port: HBONE_PORT,
    }
}

/// Services by one label of their selector, so a pod is matched only against the
/// Services that could select it: a rebuild is O(pods × their labels), not
/// O(pods × Services).
#[derive(Default)]
pub struct ServiceIndex<'a> {
    by_label: HashMap<(&'a str, &'a str), Vec<&'a ServiceInfo>>,
}

impl<'a> ServiceIndex<'a> {
    pub fn new(services: impl IntoIterator<Item = &'a ServiceInfo>) -> Self {
        let mut by_label: HashMap<_, Vec<_>> = HashMap::new();
        for svc in services {
            // An empty selector selects no pod (its endpoints are managed by hand).
            if let Some((key, value)) = svc.selector.iter().next() {
                by_label
                    .entry((key.as_str(), value.as_str()))
                    .or_default()
                    .push(svc);
            }
        }
        ServiceIndex { by_label }
    }

    /// The Services in `namespace` whose selector matches `labels`.
    fn selecting<'l>(
        &'l self,
        namespace: &'l str,
        labels: &'l BTreeMap<String, String>,
    ) -> impl Iterator<Item = &'a ServiceInfo> + 'l {
        labels
            .iter()
            .filter_map(|(k, v)| self.by_label.get(&(k.as_str(), v.as_str())))
            .flatten()
            .copied()
            .filter(move |svc| svc.service.namespace == namespace && selects(&svc.selector, labels))
    }
}

/// Converts a pod into a workload; `None` when it is not one: finished (only Running
/// and Pending pods count, as in istiod), no IP yet, or no name.
pub fn pod(
    pod: &Pod,
    services: &ServiceIndex,
    policies: &[ConvertedPolicy],
    opts: &Options,
) -> Option<Workload> {
    let name = pod.metadata.name.as_deref().filter(|n| !n.is_empty())?;
    let namespace = pod
        .metadata
        .namespace
        .as_deref()
        .filter(|n| !n.is_empty())?;
    let status = pod.status.as_ref()?;
    if !matches!(status.phase.as_deref(), Some("Running" | "Pending")) {
        return None;
    }
    let ips = mesh_kube::pod::ips(pod);
    if ips.is_empty() {
        return None;
    }
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let redirected = mesh_kube::pod::is_redirected(pod);
    let service_account = mesh_kube::pod::service_account(pod);
    let (workload_name, workload_type) = workload_name_and_type(pod, name);
    let (canonical_name, canonical_revision) = canonical(&labels, &workload_name);

    let mut authorization_policies: Vec<String> = policies
        .iter()
        .filter(|p| p.selects(namespace, &labels))
        .map(|p| p.authorization.key())
        .collect();
    authorization_policies.sort();
    authorization_policies.dedup();

    Some(Workload {
        uid: mesh_model::workload::pod_uid(&opts.cluster_id, namespace, name),
        name: name.to_string(),
        namespace: namespace.to_string(),
        service_account: service_account.to_string(),
        trust_domain: opts.trust_domain.clone(),
        workload_ips: ips,
        // A host-network pod shares the node's addresses: its traffic is never captured.
        protocol: if redirected && !host_network {
            Protocol::Hbone
        } else {
            Protocol::Tcp
        },
        node: spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        status: if pod_ready(pod) {
            HealthStatus::Healthy
        } else {
            HealthStatus::Unhealthy
        },
        authorization_policies,
        services: pod_services(pod, namespace, &labels, services),
        network_mode: if host_network {
            NetworkMode::HostNetwork
        } else {
            NetworkMode::Standard
        },
        workload_name,
        workload_type: workload_type.to_string(),
        canonical_name,
        canonical_revision,
        cluster_id: opts.cluster_id.clone(),
        ..Default::default()
    })
}

/// `status.podIPs`, else `status.podIP`; unparsable entries are skipped.
fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// `{"ns/hostname": {svcPort: targetPort}}` for every Service in the pod's namespace
/// whose non-empty selector matches its labels. A named target port is looked up in
/// the pod's TCP container ports; when the pod lacks it, that port is left out (istiod
/// does the same).
fn pod_services(
    pod: &Pod,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    services: &ServiceIndex,
) -> HashMap<String, HashMap<u16, u16>> {
    let mut out = HashMap::new();
    for svc in services.selecting(namespace, labels) {
        let ports = svc
            .targets
            .iter()
            .filter_map(|(port, target)| match target {
                Target::Port(t) => Some((*port, *t)),
                Target::Named(n) => named_port(pod, n).map(|t| (*port, t)),
            })
            .collect();
        out.insert(svc.service.key(), ports);
    }
    out
}

fn named_port(pod: &Pod, name: &str) -> Option<u16> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| {
            p.name.as_deref() == Some(name) && p.protocol.as_deref().unwrap_or("TCP") == "TCP"
        })
        .and_then(|p| u16::try_from(p.container_port).ok())
}

/// Whether every `selector` label is on the object (an empty selector selects all).
pub fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The owning Deployment / Job / CronJob name from owner references, as istiod does:
/// a ReplicaSet `<deploy>-<hash>` with the pod's `pod-template-hash` names a Deployment.
fn workload_name_and_type(pod: &Pod, name: &str) -> (String, &'static str) {
    let labels = pod.metadata.labels.as_ref();
    let Some(owner) = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
    else {
        return (name.to_string(), "pod");
    };
    match owner.kind.as_str() {
        "ReplicaSet" => {
            let hash = labels.and_then(|l| l.get("pod-template-hash"));
            match hash.and_then(|h| owner.name.strip_suffix(&format!("-{h}"))) {
                Some(deploy) => (deploy.to_string(), "deployment"),
                None => (owner.name.clone(), "pod"),
            }
        }
        "Job" => {
            // A CronJob's jobs are `<cronjob>-<schedule time>`.
            let cron = owner
                .name
                .rsplit_once('-')
                .filter(|(_, t)| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
                .map(|(c, _)| c.to_string());
            match cron {
                Some(c) => (c, "cronjob"),
                None => (owner.name.clone(), "job"),
            }
        }
        _ => (name.to_string(), "pod"),
    }
}

/// Istio's canonical service name and revision labels, with their usual fallbacks.
fn canonical(labels: &BTreeMap<String, String>, workload_name: &str) -> (String, String) {
    let first = |keys: &[&str]| keys.iter().find_map(|k| labels.get(*k).cloned());
    let name = first(&[
        "service.istio.io/canonical-name",
        "app.kubernetes.io/name",
        "app",
    ])
    .unwrap_or_else(|| workload_name.to_string());
    let revision = first(&[
        "service.istio.io/canonical-revision",
        "app.kubernetes.io/version",
        "version",
    ])
    .unwrap_or_else(|| "latest".to_string());
    (name, revision)
}

#[cfg(test)]
#[path = "convert_tests.rs"]
mod tests;
