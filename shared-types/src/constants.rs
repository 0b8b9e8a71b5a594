//! Istio's public names, ports and marks. Changing any of these breaks drop-in
//! compatibility with Istio's own components.

/// Label (namespace or pod) that enrolls workloads in ambient mode.
pub const DATAPLANE_MODE_LABEL: &str = "istio.io/dataplane-mode";
/// Value of [`DATAPLANE_MODE_LABEL`] that enrolls a namespace or pod in ambient.
pub const DATAPLANE_MODE_AMBIENT: &str = "ambient";
/// Value of [`DATAPLANE_MODE_LABEL`] that keeps a pod out of ambient, even in an ambient
/// namespace.
pub const DATAPLANE_MODE_NONE: &str = "none";

/// Pod annotation the node agent writes once redirection is live.
pub const REDIRECTION_ANNOTATION: &str = "ambient.istio.io/redirection";
/// [`REDIRECTION_ANNOTATION`] value once the pod's traffic is redirected and ztunnel
/// serves it.
pub const REDIRECTION_ENABLED: &str = "enabled";
/// [`REDIRECTION_ANNOTATION`] value when the pod's rules are in place but ztunnel has
/// not taken the pod yet.
pub const REDIRECTION_PENDING: &str = "pending";
/// Pod annotation; `"true"` leaves inbound traffic uncaptured, so only outbound
/// traffic goes through ztunnel.
pub const BYPASS_INBOUND_CAPTURE_ANNOTATION: &str = "ambient.istio.io/bypass-inbound-capture";
/// Pod annotation overriding the node's DNS-capture setting: `"true"` turns capture on,
/// any other value off.
pub const DNS_CAPTURE_ANNOTATION: &str = "ambient.istio.io/dns-capture";
/// Present on sidecar-injected pods, which ambient never captures.
pub const SIDECAR_STATUS_ANNOTATION: &str = "sidecar.istio.io/status";

/// Label naming the waypoint of a pod, a Service or (for all of its pods and Services)
/// a namespace. `none` opts a pod or Service out of its namespace's.
pub const USE_WAYPOINT_LABEL: &str = "istio.io/use-waypoint";
/// The waypoint's namespace, when not the labelled object's own.
pub const USE_WAYPOINT_NAMESPACE_LABEL: &str = "istio.io/use-waypoint-namespace";
/// On a waypoint's Gateway: the traffic it takes (`service`, `workload`, `all`, `none`).
pub const WAYPOINT_FOR_LABEL: &str = "istio.io/waypoint-for";
/// The GatewayClass of waypoints.
pub const WAYPOINT_CLASS: &str = "istio-waypoint";
/// On every object of a waypoint istiod deploys, with value [`WAYPOINT_CONTROLLER`].
pub const GATEWAY_MANAGED_LABEL: &str = "gateway.istio.io/managed";
/// [`GATEWAY_MANAGED_LABEL`]'s value: istiod's gateway deployment controller.
pub const WAYPOINT_CONTROLLER: &str = "istio.io-mesh-controller";
/// The Gateway API's label on a Gateway's objects, naming the Gateway.
pub const GATEWAY_NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";

/// Namespace of the control plane and of the mesh's node DaemonSets (ztunnel, istio-cni).
pub const SYSTEM_NAMESPACE: &str = "istio-system";
/// Trust domain of SPIFFE identities when none is configured.
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";
/// The service account of a pod that names none.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";

/// Outbound capture inside each pod netns.
pub const OUTBOUND_CAPTURE_PORT: u16 = 15001;
/// Inbound plaintext capture (sources without mesh identity).
pub const INBOUND_PLAINTEXT_PORT: u16 = 15006;
/// Inbound HBONE: mutual TLS + HTTP/2 CONNECT.
pub const HBONE_PORT: u16 = 15008;
/// ztunnel's DNS proxy, where captured DNS queries (port 53) are redirected.
pub const DNS_CAPTURE_PORT: u16 = 15053;
/// ztunnel's admin server (e.g. `/config_dump`), bound to localhost.
pub const ZTUNNEL_ADMIN_PORT: u16 = 15000;
/// ztunnel's Prometheus metrics (`/stats/prometheus`).
pub const ZTUNNEL_METRICS_PORT: u16 = 15020;
/// ztunnel's readiness endpoint (`/healthz/ready`).
pub const ZTUNNEL_READINESS_PORT: u16 = 15021;
/// The node agent's health probes (`/healthz`, `/readyz`).
pub const AGENT_HEALTH_PORT: u16 = 8000;
/// ztunnel's worker threads when `ZTUNNEL_WORKER_THREADS` is unset (Istio's default too).
pub const ZTUNNEL_DEFAULT_WORKER_THREADS: usize = 2;
/// The node agent's Prometheus metrics (`/metrics`).
pub const AGENT_METRICS_PORT: u16 = 15014;

/// Ports ztunnel itself listens on; traffic addressed to them is refused so a
/// misrouted packet can never loop through the proxy.
pub const PROXY_PORTS: [u16; 3] = [OUTBOUND_CAPTURE_PORT, INBOUND_PLAINTEXT_PORT, HBONE_PORT];

/// `SO_MARK` ztunnel sets on every socket it owns (`PACKET_MARK`), so capture skips it.
pub const DEFAULT_PACKET_MARK: u32 = 0x539;
/// Connmark that tags connections owned by ztunnel.
pub const CONNMARK: u32 = 0x111;
/// Bits of the connmark the mesh uses; the other bits are left alone.
pub const CONNMARK_MASK: u32 = 0xfff;
/// Policy-routing table for ztunnel's transparent sockets.
pub const ROUTE_TABLE: u32 = 100;
/// Priority of the `ip rule` that sends [`CONNMARK`]-marked packets to [`ROUTE_TABLE`].
pub const ROUTE_RULE_PRIORITY: u32 = 32764;

/// Source address kubelet probes are SNATed to, so in-pod rules let them through.
pub const PROBE_SNAT_IPV4: &str = "169.254.7.127";
/// IPv6 counterpart of [`PROBE_SNAT_IPV4`].
pub const PROBE_SNAT_IPV6: &str = "fd16:9254:7127:1337:ffff:ffff:ffff:ffff";

/// Default CNI run dir on the node: the plugin's sockets and the enablement state.
pub const DEFAULT_CNI_RUN_DIR: &str = "/var/run/istio-cni";
/// Default CNI config dir, where the agent adds `istio-cni` to the primary network's
/// chain.
pub const DEFAULT_CNI_CONF_DIR: &str = "/etc/cni/net.d";
/// Default CNI bin dir, where the agent installs the `istio-cni` plugin binary.
pub const DEFAULT_CNI_BIN_DIR: &str = "/opt/cni/bin";
/// Default path of the ZDS socket: the node agent listens on it, ztunnel connects.
pub const DEFAULT_ZDS_SOCKET: &str = "/var/run/ztunnel/ztunnel.sock";
/// Socket in the run dir on which the agent receives the plugin's ADD events.
pub const PLUGIN_EVENT_SOCKET: &str = "pluginevent.sock";
/// Socket in the run dir on which the agent receives the plugin's log lines.
pub const PLUGIN_LOG_SOCKET: &str = "log.sock";
/// Type name of our entry in the CNI chain.
pub const CNI_PLUGIN_TYPE: &str = "istio-cni";
