//! What the `istio-cni` plugin and the node agent exchange on the node: the ADD event the
//! plugin posts on `pluginevent.sock`, the log batch it tees to `log.sock`, and the
//! enablement state the agent persists so the plugin can still decide while the agent
//! is down.
//!
//! The ADD event keeps the JSON field names of Istio's `CNIPluginAddEvent` (Go struct
//! field names, Go encodings for `net.IPNet` and `net.IP`), so either side can talk to
//! Istio's counterpart.

use serde::{Deserialize, Deserializer, Serialize};
use std::net::IpAddr;
use std::time::{SystemTime, UNIX_EPOCH};

/// HTTP path of the ADD event on `pluginevent.sock`.
pub const CNI_ADD_EVENT_PATH: &str = "/cmdadd";
/// HTTP path of the log batch on `log.sock`.
pub const PLUGIN_LOG_PATH: &str = "/log";
/// File in the run dir holding [`AmbientEnablementState`].
pub const ENABLEMENT_STATE_FILE: &str = "ambient-enablement.json";
/// Pod name prefixes of the mesh's own DaemonSets (in the system namespace). Their pods
/// must start before the agent can answer, so the plugin never makes them wait.
pub const MESH_DAEMONSET_POD_PREFIXES: [&str; 2] = ["ztunnel-", "istio-cni-node-"];
/// Namespaces excluded when the netconf does not say otherwise.
pub const DEFAULT_EXCLUDED_NAMESPACES: [&str; 1] = ["kube-system"];

/// Body of `POST /cmdadd`: a pod sandbox got its network and waits for redirection.
///
/// The agent answers 200 once the pod is handled: redirected and acked by ztunnel when it
/// is ambient, or immediately when it is not. 400 means the event is unusable, 500 that
/// enrollment failed; the plugin turns both into a retryable CNI error.
///
/// The first four fields are Istio's; the others are ours and default to empty, so an
/// event from Istio's plugin decodes too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniPluginAddEvent {
    /// `CNI_NETNS`: the pod's network namespace path.
    #[serde(rename = "Netns")]
    pub netns: String,
    /// `K8S_POD_NAME` from CNI_ARGS: the pod's name.
    #[serde(rename = "PodName")]
    pub pod_name: String,
    /// `K8S_POD_NAMESPACE` from CNI_ARGS: the pod's namespace.
    #[serde(rename = "PodNamespace")]
    pub pod_namespace: String,
    /// The IPs of the `prevResult` (Go encodes an empty list as `null`).
    #[serde(rename = "IPs", default, deserialize_with = "null_as_default")]
    pub ips: Vec<PodIpConfig>,
    /// `K8S_POD_UID` from CNI_ARGS (empty if the runtime did not pass it).
    #[serde(rename = "PodUID", default)]
    pub pod_uid: String,
    /// `CNI_CONTAINERID`: the sandbox id.
    #[serde(rename = "ContainerID", default)]
    pub container_id: String,
    /// `CNI_IFNAME`: the pod interface the primary plugin configured.
    #[serde(rename = "IfName", default)]
    pub if_name: String,
}

/// One address of the pod, as Istio's `nodeagent.IPConfig` encodes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodIpConfig {
    /// Index into the CNI result's `interfaces` (Go `*int`, `null` when unknown).
    #[serde(rename = "Interface", default)]
    pub interface: Option<u32>,
    /// The address with its prefix length.
    #[serde(rename = "Address")]
    pub address: GoIpNet,
    /// Go encodes a missing `net.IP` as `""`.
    #[serde(rename = "Gateway", default, with = "go_ip")]
    pub gateway: Option<IpAddr>,
}

impl PodIpConfig {
    /// Builds an entry from a CNI result's `address` (CIDR with the host address) and
    /// optional `gateway`.
    pub fn from_cidr(
        address: &str,
        gateway: Option<&str>,
        interface: Option<u32>,
    ) -> Result<Self, String> {
        let address = GoIpNet::parse_cidr(address)?;
        let gateway = match gateway {
            None | Some("") => None,
            Some(gw) => Some(
                gw.parse()
                    .map_err(|_| format!("invalid gateway address {gw:?}"))?,
            ),
        };
        Ok(PodIpConfig {
            interface,
            address,
            gateway,
        })
    }
}

/// Go's `net.IPNet` in JSON: `{"IP":"10.0.0.5","Mask":"////AA=="}` (the mask is the
/// base64 of its bytes: 4 for IPv4, 16 for IPv6). The IP is the pod's own address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawIpNet", into = "RawIpNet")]
pub struct GoIpNet {
    /// The pod's own address (not the network address).
    pub ip: IpAddr,
    /// Length of the mask in bits (at most 32 for IPv4, 128 for IPv6).
    pub prefix_len: u8,
}

impl GoIpNet {
    /// Parses `10.0.0.5/24` or `fd00::5/64`.
    pub fn parse_cidr(cidr: &str) -> Result<Self, String> {
        let (ip, len) = cidr
            .split_once('/')
            .ok_or_else(|| format!("address {cidr:?} is not in CIDR form"))?;
        let ip: IpAddr = ip
            .parse()
            .map_err(|_| format!("address {cidr:?} has an invalid IP"))?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let prefix_len = len
            .parse::<u8>()
            .ok()
            .filter(|l| *l <= max)
            .ok_or_else(|| format!("address {cidr:?} has an invalid prefix length"))?;
        Ok(GoIpNet { ip, prefix_len })
    }

    fn mask_bytes(&self) -> Vec<u8> {
        let width = if self.ip.is_ipv4() { 4 } else { 16 };
        (0..width)
            .map(|i| {
                let bits = (self.prefix_len as usize).saturating_sub(i * 8).min(8);
                (0xffu16 << (8 - bits)) as u8
            })
            .collect()
    }
}

impl std::fmt::Display for GoIpNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.ip, self.prefix_len)
    }
}

#[derive(Serialize, Deserialize)]
struct RawIpNet {
    #[serde(rename = "IP")]
    ip: String,
    #[serde(rename = "Mask")]
    mask: String,
}

impl From<GoIpNet> for RawIpNet {
    fn from(net: GoIpNet) -> Self {
        RawIpNet {
            ip: net.ip.to_string(),
            mask: base64_encode(&net.mask_bytes()),
        }
    }
}

impl TryFrom<RawIpNet> for GoIpNet {
    type Error = String;

    fn try_from(raw: RawIpNet) -> Result<Self, String> {
        let ip: IpAddr = raw
            .ip
            .parse()
            .map_err(|_| format!("invalid IP {:?}", raw.ip))?;
        let mask =
            base64_decode(&raw.mask).ok_or_else(|| format!("invalid mask {:?}", raw.mask))?;
        let width = if ip.is_ipv4() { 4 } else { 16 };
        if mask.len() != width {
            return Err(format!("mask of {} bytes for {ip}", mask.len()));
        }
        let ones: u32 = mask.iter().map(|b| b.count_ones()).sum();
        let net = GoIpNet {
            ip,
            prefix_len: ones as u8,
        };
        if net.mask_bytes() != mask {
            return Err(format!("non-contiguous mask {:?}", raw.mask));
        }
        Ok(net)
    }
}

/// `Option<IpAddr>` as Go's `net.IP`: `""` (or `null`) is none.
mod go_ip {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::net::IpAddr;

    pub fn serialize<S: Serializer>(ip: &Option<IpAddr>, s: S) -> Result<S::Ok, S::Error> {
        match ip {
            Some(ip) => s.collect_str(ip),
            None => s.serialize_str(""),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<IpAddr>, D::Error> {
        match Option::<String>::deserialize(d)?.as_deref() {
            None | Some("") => Ok(None),
            Some(s) => s.parse().map(Some).map_err(serde::de::Error::custom),
        }
    }
}

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding (what Go's `encoding/json` does for `[]byte`).
fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | ((*b as u32) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let chunks = text.as_bytes().chunks_exact(4);
    if !chunks.remainder().is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    for chunk in chunks {
        let pad = chunk.iter().rev().take_while(|c| **c == b'=').count();
        if pad > 2 {
            return None;
        }
        let mut n = 0u32;
        for (i, c) in chunk[..4 - pad].iter().enumerate() {
            let v = B64.iter().position(|b| b == c)? as u32;
            n |= v << (18 - 6 * i);
        }
        out.extend_from_slice(&n.to_be_bytes()[1..4 - pad]);
    }
    Some(out)
}

/// One log line the plugin tees to the agent. `POST /log` carries a JSON array of
/// strings, each the JSON encoding of one entry (Istio's UDS log format); the agent
/// re-emits them under a `cni-plugin` scope with the original time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PluginLogEntry {
    /// `debug`, `info`, `warn` or `error`.
    pub level: String,
    /// RFC 3339, UTC.
    pub time: String,
    /// The log message.
    pub msg: String,
    /// Context such as `pod`, `containerID`.
    #[serde(flatten)]
    pub fields: serde_json::Map<String, serde_json::Value>,
}

/// Format version of [`AmbientEnablementState`]. Bumped only on an incompatible change;
/// new optional fields keep it (readers ignore unknown fields). A plugin that finds a
/// version it does not know fails closed for pods it would otherwise ask the agent about.
pub const ENABLEMENT_STATE_VERSION: u32 = 1;

/// The agent's last known view of which namespaces are ambient, written (atomically:
/// temp file + rename) to `<run-dir>/ambient-enablement.json` whenever it changes.
///
/// The plugin reads it only when the agent is unreachable, to decide a pod ADD on its
/// own: a namespace listed as ambient fails closed (the runtime retries until the agent
/// is back); any other namespace passes. What it cannot know: a pod that opts in with its
/// own `istio.io/dataplane-mode=ambient` label in a namespace that is not ambient. Such a
/// pod starts unredirected while the agent is down and is enrolled by the agent's pod
/// watch once the agent is back.
///
/// ```json
/// {"version":1,"writtenAt":"2026-05-01T12:00:00.000000Z",
///  "ambientNamespaces":["default","shop"],"excludedNamespaces":["kube-system"]}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AmbientEnablementState {
    /// [`ENABLEMENT_STATE_VERSION`] of the writer.
    pub version: u32,
    /// When the agent wrote the file (RFC 3339, UTC); quoted in the plugin's messages.
    pub written_at: String,
    /// Namespaces labelled `istio.io/dataplane-mode=ambient`, sorted.
    pub ambient_namespaces: Vec<String>,
    /// Namespaces the agent never enrolls, sorted.
    #[serde(default)]
    pub excluded_namespaces: Vec<String>,
}

/// What the persisted state says about one namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamespaceEnablement {
    /// Listed as ambient: the plugin fails closed while the agent is down.
    Ambient,
    /// Listed nowhere: the plugin lets the pod start.
    NotAmbient,
    /// Listed as excluded (this wins over ambient): never enrolled; the plugin lets the pod
    /// start.
    Excluded,
}

impl AmbientEnablementState {
    /// State as of `now`, with both lists sorted and deduplicated.
    pub fn new(ambient: Vec<String>, excluded: Vec<String>, now: SystemTime) -> Self {
        let (mut ambient_namespaces, mut excluded_namespaces) = (ambient, excluded);
        ambient_namespaces.sort();
        ambient_namespaces.dedup();
        excluded_namespaces.sort();
        excluded_namespaces.dedup();
        AmbientEnablementState {
            version: ENABLEMENT_STATE_VERSION,
            written_at: rfc3339_utc(now),
            ambient_namespaces,
            excluded_namespaces,
        }
    }

    /// Decodes the file and rejects versions this build does not understand.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        #[derive(Deserialize)]
        struct Version {
            version: u32,
        }
        let v: Version = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if v.version != ENABLEMENT_STATE_VERSION {
            return Err(format!(
                "format version {} (this plugin reads version {ENABLEMENT_STATE_VERSION})",
                v.version
            ));
        }
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }

    /// How the state classifies `namespace`.
    pub fn namespace(&self, namespace: &str) -> NamespaceEnablement {
        let has = |list: &[String]| list.iter().any(|n| n == namespace);
        if has(&self.excluded_namespaces) {
            NamespaceEnablement::Excluded
        } else if has(&self.ambient_namespaces) {
            NamespaceEnablement::Ambient
        } else {
            NamespaceEnablement::NotAmbient
        }
    }
}

/// `2026-05-01T12:00:00.123456Z`: RFC 3339 in UTC with microseconds, like Istio's logs.
pub fn rfc3339_utc(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3_600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_micros()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn event_matches_istio_go_encoding() {
        let event = CniPluginAddEvent {
            netns: "/var/run/netns/pod".into(),
            pod_name: "web-1".into(),
            pod_namespace: "shop".into(),
            ips: vec![
                PodIpConfig::from_cidr("10.1.0.5/24", Some("10.1.0.1"), Some(2)).unwrap(),
                PodIpConfig::from_cidr("fd00::5/64", None, None).unwrap(),
            ],
            pod_uid: "uid-1".into(),
            container_id: "abc".into(),
            if_name: "eth0".into(),
        };
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "Netns": "/var/run/netns/pod", "PodName": "web-1", "PodNamespace": "shop",
                "IPs": [
                    {"Interface": 2, "Address": {"IP": "10.1.0.5", "Mask": "////AA=="}, "Gateway": "10.1.0.1"},
                    {"Interface": null, "Address": {"IP": "fd00::5", "Mask": "//////////8AAAAAAAAAAA=="}, "Gateway": ""}
                ],
                "PodUID": "uid-1", "ContainerID": "abc", "IfName": "eth0"
            })
        );
        let back: CniPluginAddEvent = serde_json::from_value(json).unwrap();
        assert_eq!(back, event);
    }

    #[test]
    fn decodes_istio_plugin_event() {
        // What Istio's plugin sends: no extra fields, IPs may be null.
        let event: CniPluginAddEvent = serde_json::from_str(
            r#"{"Netns":"/proc/1/ns/net","PodName":"a","PodNamespace":"b","IPs":null}"#,
        )
        .unwrap();
        assert!(event.ips.is_empty());
        assert_eq!(event.pod_uid, "");
        let event: CniPluginAddEvent = serde_json::from_str(
            r#"{"Netns":"n","PodName":"a","PodNamespace":"b","IPs":[{"Interface":null,"Address":{"IP":"10.0.0.7","Mask":"//8AAA=="},"Gateway":null}]}"#,
        )
        .unwrap();
        assert_eq!(event.ips[0].address.to_string(), "10.0.0.7/16");
        assert_eq!(event.ips[0].gateway, None);
    }

    #[test]
    fn rejects_bad_masks() {
        for mask in ["/w8A/w==", "////", "***", "////AA=="] {
            let json = format!(r#"{{"IP":"fd00::1","Mask":"{mask}"}}"#);
            assert!(serde_json::from_str::<GoIpNet>(&json).is_err(), "{mask}");
        }
    }

    #[test]
    fn base64_round_trip() {
        for len in 0..8 {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 + 5) as u8).collect();
            assert_eq!(base64_decode(&base64_encode(&bytes)).unwrap(), bytes);
        }
        assert_eq!(base64_encode(b"Man"), "TWFu");
        assert_eq!(base64_encode(b"Ma"), "TWE=");
    }

    #[test]
    fn enablement_state_round_trip_and_lookup() {
        let state = AmbientEnablementState::new(
            vec!["shop".into(), "default".into()],
            vec!["kube-system".into()],
            UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        );
        let bytes = serde_json::to_vec(&state).unwrap();
        let back = AmbientEnablementState::parse(&bytes).unwrap();
        assert_eq!(back, state);
        assert_eq!(back.written_at, "2023-11-14T22:13:20.000000Z");
        assert_eq!(back.namespace("shop"), NamespaceEnablement::Ambient);
        assert_eq!(back.namespace("other"), NamespaceEnablement::NotAmbient);
        assert_eq!(back.namespace("kube-system"), NamespaceEnablement::Excluded);
        let future = br#"{"version":2,"writtenAt":"x","ambientNamespaces":[]}"#;
        assert!(AmbientEnablementState::parse(future)
            .unwrap_err()
            .contains("version 2"));
    }

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339_utc(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        let leap = UNIX_EPOCH + Duration::from_micros(951_782_400_000_123);
        assert_eq!(rfc3339_utc(leap), "2000-02-29T00:00:00.000123Z");
    }
}
