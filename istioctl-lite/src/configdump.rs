//! ztunnel's `/config_dump` as istioctl decodes it: the fields its Go structs name,
//! read the way Go's `encoding/json` reads them (unknown keys ignored, missing or
//! null ones left at their zero value, a wrong type an error, each list section
//! given as an array or as an object whose values are taken), and written back the
//! way Go writes them (struct field order, `omitempty` where Istio has it, nil
//! lists and maps as `null`). The same reader takes our ztunnel's dump and Istio's.
//! A waypoint's dump (ztunnel's admin server) adds `waypointRoutes`, which Istio's
//! has not: read when present, left out when written back empty.
//!
//! Self-contained (serde only) so the fuzz target compiles it as is.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Why a dump could not be read.
#[derive(Debug)]
pub struct DumpError(pub String);

impl std::fmt::Display for DumpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DumpError {}

/// The sections istioctl reads; the rest of the dump is kept only as raw text.
#[derive(Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Dump {
    pub workloads: Vec<Workload>,
    pub services: Vec<Service>,
    pub policies: Vec<Policy>,
    pub certificates: Vec<CertsDump>,
    /// Pod uid -> state, as the in-pod workload manager reports it.
    pub workload_state: BTreeMap<String, WorkloadState>,
    /// A waypoint's Gateway API routes (none in a ztunnel's dump, nor in Istio's).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub waypoint_routes: Vec<WaypointRoute>,
}

/// One route of a waypoint's `waypointRoutes` (ztunnel's `waypoint_sections`), its
/// fields in the dump's (sorted) key order so that `-o json` writes it back as read.
#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct WaypointRoute {
    pub creation_timestamp: String,
    pub generation: i64,
    /// `HTTPRoute`, `GRPCRoute` or `TCPRoute`.
    pub kind: String,
    pub name: String,
    pub namespace: String,
    /// The route's spec as Kubernetes stores it, compiled only when shown: a spec
    /// the waypoint cannot compile is one invalid route, not an unreadable dump.
    pub spec: Value,
}

/// A waypoint or network gateway: only where it is reached.
#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct GatewayAddress {
    pub destination: String,
}

#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct Locality {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub region: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub zone: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub subzone: String,
}

#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct ApplicationTunnel {
    pub protocol: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

/// istioctl's `ZtunnelWorkload`, field for field.
#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Workload {
    pub uid: String,
    pub workload_ips: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waypoint: Option<GatewayAddress>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_gateway: Option<GatewayAddress>,
    pub protocol: String,
    pub name: String,
    pub namespace: String,
    pub service_account: String,
    pub workload_name: String,
    pub workload_type: String,
    pub canonical_name: String,
    pub canonical_revision: String,
    pub cluster_id: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub trust_domain: String,
    pub locality: Locality,
    pub node: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub network: String,
    pub status: String,
    pub hostname: String,
    pub capacity: u32,
    pub application_tunnel: ApplicationTunnel,
    #[serde(skip_serializing_if = "vec_is_empty")]
    pub authorization_policies: Option<Vec<String>>,
}

impl Workload {
    /// The IPs (none when the dump had none).
    pub fn ips(&self) -> &[String] {
        self.workload_ips.as_deref().unwrap_or_default()
    }
}

#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct LoadBalancer {
    pub mode: String,
    pub routing_preferences: Option<Vec<String>>,
    pub health_policy: String,
}

/// istioctl's `ZtunnelEndpoint`.
#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Endpoint {
    pub workload_uid: String,
    pub service: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub address: String,
    pub port: Option<BTreeMap<String, u16>>,
}

/// istioctl's `ZtunnelService`.
#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Service {
    pub name: String,
    pub namespace: String,
    pub hostname: String,
    pub vips: Option<Vec<String>>,
    pub ports: Option<BTreeMap<String, i64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancer>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waypoint: Option<GatewayAddress>,
    pub endpoints: Option<BTreeMap<String, Option<Endpoint>>>,
    #[serde(skip_serializing_if = "vec_is_empty")]
    pub subject_alt_names: Option<Vec<String>>,
    pub ip_families: String,
}

impl Service {
    /// The VIPs (`network/ip`).
    pub fn vip_list(&self) -> &[String] {
        self.vips.as_deref().unwrap_or_default()
    }
}

/// A string match, as serde writes Istio's enum: `{"Exact": ".."}`.
#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct StringMatch {
    #[serde(rename = "Exact", skip_serializing_if = "String::is_empty")]
    pub exact: String,
    #[serde(rename = "Suffix", skip_serializing_if = "String::is_empty")]
    pub suffix: String,
    #[serde(rename = "Prefix", skip_serializing_if = "String::is_empty")]
    pub prefix: String,
    #[serde(rename = "Presence", skip_serializing_if = "Option::is_none")]
    pub presence: Option<Value>,
}

#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceAccountMatch {
    pub namespace: String,
    pub service_account: String,
}

/// istioctl's `PolicyMatch`: every field `omitempty`.
#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct PolicyMatch {
    #[serde(skip_serializing_if = "vec_is_empty")]
    pub namespaces: Option<Vec<StringMatch>>,
    #[serde(skip_serializing_if = "vec_is_empty")]
    pub not_namespaces: Option<Vec<StringMatch>>,
    #[serde(skip_serializing_if = "vec_is_empty")]
    pub principals: Option<Vec<StringMatch>>,
    #[serde(skip_serializing_if = "vec_is_empty")]
    pub not_principals: Option<Vec<StringMatch>>,
    #[serde(skip_serializing_if = "vec_is_empty")]
    pub source_ips: Option<Vec<String>>,
    #[serde(skip_serializing_if = "vec_is_empty")]
    pub not_source_ips: Option<Vec<String>>,
    #[serde(skip_serializing_if = "vec_is_empty")]
    pub destination_ips: Option<Vec<String>>,
    #[serde(skip_serializing_if = "vec_is_empty")]
    pub not_destination_ips: Option<Vec<String>>,
    #[serde(skip_serializing_if = "vec_is_empty")]
    pub destination_ports: Option<Vec<u16>>,
    #[serde(skip_serializing_if = "vec_is_empty")]
    pub not_destination_ports: Option<Vec<u16>>,
    #[serde(skip_serializing_if = "vec_is_empty")]
    pub service_accounts: Option<Vec<ServiceAccountMatch>>,
    #[serde(skip_serializing_if = "vec_is_empty")]
    pub not_service_accounts: Option<Vec<ServiceAccountMatch>>,
}

/// A Go `[]T` that may be nil, or hold nil pointers: `rules` is `[][][]*PolicyMatch`.
pub type GoList<T> = Option<Vec<Option<T>>>;

/// istioctl's `ZtunnelPolicy`.
#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Policy {
    pub name: String,
    pub namespace: String,
    pub scope: String,
    pub action: String,
    pub rules: GoList<Vec<Option<Vec<Option<PolicyMatch>>>>>,
}

/// One certificate of a chain.
#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Cert {
    pub pem: String,
    /// Decimal.
    pub serial_number: String,
    pub valid_from: String,
    pub expiration_time: String,
}

/// istioctl's `CertsDump`.
#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct CertsDump {
    pub identity: String,
    pub state: String,
    pub cert_chain: Option<Vec<Option<Cert>>>,
    pub root_certs: Option<Vec<Option<Cert>>>,
}

/// One connection of a pod.
#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Connection {
    pub src: String,
    pub original_dst: String,
    pub actual_dst: String,
    pub protocol: String,
}

#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct Connections {
    pub inbound: Option<Vec<Connection>>,
    pub outbound: Option<Vec<Connection>>,
}

#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct WorkloadInfo {
    pub name: String,
    pub namespace: String,
    pub trust_domain: String,
    pub service_account: String,
}

/// istioctl's `WorkloadState`.
#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct WorkloadState {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub state: String,
    pub connections: Connections,
    pub info: WorkloadInfo,
}

fn vec_is_empty<T>(v: &Option<Vec<T>>) -> bool {
    v.as_ref().is_none_or(Vec::is_empty)
}

/// Go leaves a field untouched when the JSON has `null`: dropping null keys gives
/// serde the same zero values.
fn drop_nulls(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(drop_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

/// A list section given as an object: its values, in key order.
fn as_list(section: &mut Value) {
    if let Value::Object(map) = section {
        let values: Vec<Value> = std::mem::take(map).into_iter().map(|(_, v)| v).collect();
        *section = Value::Array(values);
    }
}

impl Dump {
    /// Reads a dump of our ztunnel or of Istio's.
    pub fn parse(text: &str) -> Result<Dump, DumpError> {
        let mut value: Value = serde_json::from_str(text)
            .map_err(|e| DumpError(format!("the config dump is not JSON: {e}")))?;
        let Some(map) = value.as_object_mut() else {
            return Err(DumpError("the config dump is not a JSON object".into()));
        };
        // Go matches keys case-insensitively: `workloadstate` is how istioctl tags it.
        if let Some(state) = map.remove("workloadstate") {
            map.entry("workloadState").or_insert(state);
        }
        for section in [
            "workloads",
            "services",
            "policies",
            "certificates",
            "waypointRoutes",
        ] {
            if let Some(v) = map.get_mut(section) {
                as_list(v);
            }
        }
        // Read on its own, so that an error names the entry.
        let routes = map.remove("waypointRoutes").filter(|r| !r.is_null());
        drop_nulls(&mut value);
        let unmarshal = |e: String| {
            DumpError(format!(
                "error unmarshalling config dump response from ztunnel: {e}"
            ))
        };
        let mut dump: Dump = serde_json::from_value(value).map_err(|e| unmarshal(e.to_string()))?;
        if let Some(mut routes) = routes {
            drop_nulls(&mut routes);
            dump.waypoint_routes = waypoint_routes(routes).map_err(unmarshal)?;
        }
        Ok(dump)
    }
}

/// The `waypointRoutes` section, an error naming the entry that is not a route.
fn waypoint_routes(section: Value) -> Result<Vec<WaypointRoute>, String> {
    let Value::Array(items) = section else {
        return serde_json::from_value(section).map_err(|e| format!("waypointRoutes: {e}"));
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            serde_json::from_value(item).map_err(|e| format!("waypointRoutes[{i}]: {e}"))
        })
        .collect()
}

#[cfg(test)]
#[path = "configdump_tests.rs"]
mod tests;
