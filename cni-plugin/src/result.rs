//! The `prevResult` we pass on, and its conversion between spec versions.
//!
//! Conversion follows libcni's converters: 0.3.0/0.3.1/0.4.0 share one shape where each
//! IP carries `"version":"4"|"6"`; 1.x drops that field (we derive it from the address
//! when converting down) and 1.1 adds interface `mtu`/`socketPath`/`pciID`, which the 0.x
//! shape cannot carry. Everything else, including fields we do not know, is passed on
//! untouched: the plugin never changes the network result.

use crate::error::{CniError, Code};
use crate::version::SpecVersion;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use shared_types::cni::{GoIpNet, PodIpConfig};
use std::net::IpAddr;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CniResult {
    #[serde(rename = "cniVersion", default)]
    pub cni_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interfaces: Option<Vec<Interface>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ips: Option<Vec<IpConfig>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routes: Option<Vec<Route>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<Value>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Interface {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// 1.1 only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// 1.1 only.
    #[serde(
        rename = "socketPath",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub socket_path: Option<String>,
    /// 1.1 only.
    #[serde(rename = "pciID", default, skip_serializing_if = "Option::is_none")]
    pub pci_id: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IpConfig {
    /// 0.3.x/0.4.0 only: `"4"` or `"6"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<u32>,
    /// CIDR with the host address, e.g. `10.1.0.5/24`.
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Routes have one shape in every version (libcni shares the type); we only check `dst`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Route {
    pub dst: String,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl CniResult {
    /// What ADD prints when there is no `prevResult`.
    pub fn empty(version: SpecVersion) -> Self {
        CniResult {
            cni_version: version.as_str().to_string(),
            interfaces: None,
            ips: None,
            routes: None,
            dns: None,
            extra: Map::new(),
        }
    }

    /// Decodes a `prevResult`. Its own `cniVersion` says which shape it has (the
    /// netconf's when absent, as libcni assumes); an unsupported one is code 1, an
    /// undecodable one code 6, impossible addresses code 7.
    pub fn parse(raw: &Value, conf_version: SpecVersion) -> Result<Self, CniError> {
        let own = raw.get("cniVersion").and_then(Value::as_str).unwrap_or("");
        let source = if own.is_empty() {
            conf_version
        } else {
            SpecVersion::parse(own).ok_or_else(|| {
                CniError::new(
                    Code::IncompatibleVersion,
                    format!("prevResult has unsupported cniVersion {own:?}"),
                )
            })?
        };
        let mut result: CniResult = serde_json::from_value(raw.clone()).map_err(|e| {
            CniError::new(
                Code::DecodingFailure,
                format!("failed to decode prevResult: {e}"),
            )
        })?;
        result.cni_version = source.as_str().to_string();
        result.validate()?;
        Ok(result)
    }

    fn validate(&self) -> Result<(), CniError> {
        let invalid = |msg: String| CniError::new(Code::InvalidNetworkConfig, msg);
        for ip in self.ips.iter().flatten() {
            GoIpNet::parse_cidr(&ip.address).map_err(|e| invalid(format!("prevResult: {e}")))?;
            if let Some(gw) = &ip.gateway {
                gw.parse::<IpAddr>()
                    .map_err(|_| invalid(format!("prevResult: invalid gateway {gw:?}")))?;
            }
        }
        for route in self.routes.iter().flatten() {
            GoIpNet::parse_cidr(&route.dst)
                .map_err(|e| invalid(format!("prevResult route: {e}")))?;
        }
        Ok(())
    }

    /// The same result in the shape of `target`.
    pub fn convert(mut self, target: SpecVersion) -> Self {
        let source_legacy = SpecVersion::parse(&self.cni_version)
            .map(SpecVersion::is_legacy)
            .unwrap_or(false);
        for ip in self.ips.iter_mut().flatten() {
            if !target.is_legacy() {
                ip.version = None;
            } else if !source_legacy || ip.version.is_none() {
                ip.version = Some(ip_family(&ip.address).to_string());
            }
        }
        if target.is_legacy() {
            for intf in self.interfaces.iter_mut().flatten() {
                intf.mtu = None;
                intf.socket_path = None;
                intf.pci_id = None;
            }
        }
        self.cni_version = target.as_str().to_string();
        self
    }

    /// The result's addresses in the agent's event encoding.
    pub fn pod_ips(&self) -> Vec<PodIpConfig> {
        self.ips
            .iter()
            .flatten()
            .filter_map(|ip| {
                PodIpConfig::from_cidr(&ip.address, ip.gateway.as_deref(), ip.interface).ok()
            })
            .collect()
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_string())
    }
}

/// `"4"` or `"6"`, as libcni derives it (an IPv4-mapped IPv6 address counts as 4).
fn ip_family(cidr: &str) -> &'static str {
    let ip = cidr.split('/').next().unwrap_or("");
    match ip.parse::<IpAddr>() {
        Ok(IpAddr::V6(v6)) if v6.to_ipv4_mapped().is_none() => "6",
        _ => "4",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn legacy(version: &str) -> Value {
        json!({
            "cniVersion": version,
            "interfaces": [
                {"name": "cni0", "mac": "00:11:22:33:44:55"},
                {"name": "eth0", "mac": "99:88:77:66:55:44", "sandbox": "/var/run/netns/p"}
            ],
            "ips": [
                {"version": "4", "interface": 1, "address": "10.1.0.5/24", "gateway": "10.1.0.1"},
                {"version": "6", "interface": 1, "address": "fd00::5/64"}
            ],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}],
            "dns": {"nameservers": ["10.1.0.1"]}
        })
    }

    fn modern(version: &str) -> Value {
        let mut v = legacy(version);
        for ip in v["ips"].as_array_mut().unwrap() {
            ip.as_object_mut().unwrap().remove("version");
        }
        v
    }

    fn convert(raw: &Value, conf: SpecVersion) -> Value {
        let r = CniResult::parse(raw, conf).unwrap().convert(conf);
        serde_json::from_str(&r.to_json()).unwrap()
    }

    #[test]
    fn every_pair_of_versions_converts() {
        let shape = |v: SpecVersion| {
            if v.is_legacy() {
                legacy(v.as_str())
            } else {
                modern(v.as_str())
            }
        };
        for from in SpecVersion::SUPPORTED {
            for to in SpecVersion::SUPPORTED {
                assert_eq!(convert(&shape(from), to), shape(to), "{from} -> {to}");
            }
        }
    }

    #[test]
    fn same_version_is_untouched_including_unknown_fields() {
        let mut raw = modern("1.1.0");
        raw["interfaces"][1]["mtu"] = json!(1450);
        raw["interfaces"][1]["socketPath"] = json!("/run/sock");
        raw["routes"][0]["priority"] = json!(10);
        raw["x-vendor"] = json!({"k": [1, 2]});
        raw["ips"][0]["x-extra"] = json!(true);
        assert_eq!(convert(&raw, SpecVersion::V1_1_0), raw);
        assert_eq!(
            convert(&raw, SpecVersion::V1_0_0)["interfaces"][1]["mtu"],
            1450
        );
        // The 0.x shape has no interface mtu/socketPath; routes keep their attributes.
        let down = convert(&raw, SpecVersion::V0_4_0);
        assert!(down["interfaces"][1].get("mtu").is_none());
        assert!(down["interfaces"][1].get("socketPath").is_none());
        assert_eq!(down["routes"][0]["priority"], 10);
        assert_eq!(down["x-vendor"], raw["x-vendor"]);
        assert_eq!(down["ips"][0]["version"], "4");
    }

    #[test]
    fn missing_prev_version_means_config_version() {
        let mut raw = legacy("0.4.0");
        raw.as_object_mut().unwrap().remove("cniVersion");
        let r = CniResult::parse(&raw, SpecVersion::V0_4_0).unwrap();
        assert_eq!(r.cni_version, "0.4.0");
        let out = convert(&raw, SpecVersion::V0_4_0);
        assert_eq!(out, legacy("0.4.0"));
    }

    #[test]
    fn legacy_without_version_field_gets_one() {
        let raw = modern("0.3.1");
        assert_eq!(convert(&raw, SpecVersion::V0_3_1), legacy("0.3.1"));
    }

    #[test]
    fn ipv4_mapped_counts_as_4() {
        assert_eq!(ip_family("::ffff:10.0.0.1/120"), "4");
        assert_eq!(ip_family("fd00::1/64"), "6");
        assert_eq!(ip_family("10.0.0.1/8"), "4");
    }

    #[test]
    fn empty_result() {
        for v in SpecVersion::SUPPORTED {
            let json: Value = serde_json::from_str(&CniResult::empty(v).to_json()).unwrap();
            assert_eq!(json, json!({"cniVersion": v.as_str()}));
        }
    }

    #[test]
    fn bad_prev_results() {
        let conf = SpecVersion::V1_0_0;
        let code = |raw: Value| CniResult::parse(&raw, conf).unwrap_err().code;
        assert_eq!(
            code(json!({"cniVersion": "0.2.0", "ip4": {}})),
            Code::IncompatibleVersion
        );
        assert_eq!(
            code(json!({"cniVersion": "1.0.0", "ips": "x"})),
            Code::DecodingFailure
        );
        assert_eq!(
            code(json!({"cniVersion": "1.0.0", "ips": [{}]})),
            Code::DecodingFailure
        );
        assert_eq!(code(json!("text")), Code::DecodingFailure);
        assert_eq!(
            code(json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.1"}]})),
            Code::InvalidNetworkConfig
        );
        assert_eq!(
            code(
                json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.1/24", "gateway": "x"}]})
            ),
            Code::InvalidNetworkConfig
        );
        assert_eq!(
            code(json!({"cniVersion": "1.0.0", "routes": [{"dst": "10.0.0.0/33"}]})),
            Code::InvalidNetworkConfig
        );
    }

    #[test]
    fn pod_ips_for_the_agent() {
        let r = CniResult::parse(&modern("1.0.0"), SpecVersion::V1_0_0).unwrap();
        let ips = r.pod_ips();
        assert_eq!(ips.len(), 2);
        assert_eq!(ips[0].address.to_string(), "10.1.0.5/24");
        assert_eq!(ips[0].interface, Some(1));
        assert_eq!(ips[0].gateway, Some("10.1.0.1".parse().unwrap()));
    }
}
