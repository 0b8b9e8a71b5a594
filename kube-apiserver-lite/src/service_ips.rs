//! ClusterIP allocation for Services, with Kubernetes' dual-stack fields:
//! `spec.ipFamilyPolicy` (`SingleStack` by default, `PreferDualStack`,
//! `RequireDualStack`), `spec.ipFamilies` and `spec.clusterIPs`, against the
//! cluster's Service ranges (`--service-cluster-ip-range`, primary family first).

use shared_types::net::IpFamily;
use std::collections::HashSet;
use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::{json, Value};

use super::errors::ApiError;

/// The default Service range of a single-stack cluster.
pub const DEFAULT_RANGE: &str = "10.96.0.0/16";
/// Addresses below this offset in a range are left for well-known Services.
const FIRST_OFFSET: u128 = 11;
/// How far into a range allocation looks (a test cluster never has more Services).
const MAX_OFFSET: u128 = 65_535;

/// The cluster's Service ranges, primary first; at most one per family.
#[derive(Debug, Clone)]
pub struct ServiceRanges(Vec<IpNet>);

impl Default for ServiceRanges {
    fn default() -> Self {
        ServiceRanges(vec![DEFAULT_RANGE.parse().expect("a valid constant")])
    }
}

impl std::str::FromStr for ServiceRanges {
    type Err = String;

    /// `10.96.0.0/16` or `10.96.0.0/16,fd00:10:96::/112`, as kube-apiserver's flag.
    fn from_str(s: &str) -> Result<Self, String> {
        let ranges = s
            .split(',')
            .map(|r| r.trim().parse::<IpNet>().map_err(|e| format!("{r:?}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let families: HashSet<bool> = ranges.iter().map(|r| r.addr().is_ipv4()).collect();
        if ranges.is_empty() || ranges.len() > 2 || families.len() != ranges.len() {
            return Err(format!("{s:?}: one range, or two of different families"));
        }
        Ok(ServiceRanges(ranges))
    }
}

impl ServiceRanges {
    fn range(&self, family: IpFamily) -> Option<&IpNet> {
        self.0.iter().find(|r| IpFamily::of(&r.addr()) == family)
    }

    fn primary(&self) -> IpFamily {
        IpFamily::of(&self.0[0].addr())
    }

    fn dual_stack(&self) -> bool {
        self.0.len() == 2
    }

    /// Fills `spec.ipFamilyPolicy`, `spec.ipFamilies`, `spec.clusterIPs` and
    /// `spec.clusterIP` of a new Service, allocating what was not given; `used` holds
    /// every address already taken. Errors are the API's 422 Invalid.
    pub fn assign(&self, svc: &mut Value, used: &HashSet<String>) -> Result<(), ApiError> {
        let name = svc
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let invalid = |message: String| ApiError::invalid("Service", &name, message);
        let spec = svc.pointer("/spec").cloned().unwrap_or(json!({}));
        if spec["type"].as_str() == Some("ExternalName") {
            return Ok(());
        }
        let policy = spec["ipFamilyPolicy"].as_str().unwrap_or("SingleStack");
        if !matches!(
            policy,
            "SingleStack" | "PreferDualStack" | "RequireDualStack"
        ) {
            return Err(invalid(format!(
                "spec.ipFamilyPolicy: Unsupported value: {policy:?}: supported values: \"PreferDualStack\", \"RequireDualStack\", \"SingleStack\""
            )));
        }
        // Given addresses: `clusterIPs`, else `clusterIP`; "None" is headless.
        let given: Vec<String> = match spec["clusterIPs"].as_array() {
            Some(ips) => ips
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
            None => spec["clusterIP"]
                .as_str()
                .into_iter()
                .map(str::to_owned)
                .collect(),
        };
        let given: Vec<String> = given.into_iter().filter(|ip| !ip.is_empty()).collect();
        let headless = given.first().is_some_and(|ip| ip == "None");
        let given_ips = if headless {
            Vec::new()
        } else {
            given
                .iter()
                .map(|ip| {
                    ip.parse::<IpAddr>().map_err(|_| {
                        invalid(format!(
                            "spec.clusterIPs: Invalid value: {ip:?}: must be a valid IP address"
                        ))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?
        };

        let mut families = match spec["ipFamilies"].as_array() {
            Some(list) => list
                .iter()
                .map(|f| {
                    f.as_str().and_then(IpFamily::from_kube_name).ok_or_else(|| {
                        invalid(format!("spec.ipFamilies: Unsupported value: {f}: supported values: \"IPv4\", \"IPv6\""))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?,
            None => given_ips.iter().map(IpFamily::of).collect(),
        };
        if families.is_empty() {
            families.push(self.primary());
        }
        if families.len() > 2 || (families.len() == 2 && families[0] == families[1]) {
            return Err(invalid(
                "spec.ipFamilies: Invalid value: at most one of each family".into(),
            ));
        }
        if families.len() == 2 && policy == "SingleStack" {
            return Err(invalid(
                "spec.ipFamilyPolicy: Invalid value: \"SingleStack\": must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified".into(),
            ));
        }
        if policy == "RequireDualStack" && !self.dual_stack() {
            return Err(invalid(
                "spec.ipFamilyPolicy: Invalid value: \"RequireDualStack\": this cluster is not configured for dual-stack services".into(),
            ));
        }
        if policy != "SingleStack" && self.dual_stack() && families.len() == 1 {
            let other = if families[0] == IpFamily::V4 {
                IpFamily::V6
            } else {
                IpFamily::V4
            };
            families.push(other);
        }
        for (family, ip) in families.iter().zip(&given_ips) {
            if IpFamily::of(ip) != *family {
                return Err(invalid(format!(
                    "spec.clusterIPs: Invalid value: {ip:?}: expected an {} address",
                    family.kube_name()
                )));
            }
        }

        let mut cluster_ips = Vec::new();
        if headless {
            cluster_ips.push("None".to_owned());
        } else {
            for (i, family) in families.iter().enumerate() {
                let range = self.range(*family).ok_or_else(|| {
                    invalid(format!(
                        "spec.ipFamilies[{i}]: Invalid value: \"{}\": not configured on this cluster",
                        family.kube_name()
                    ))
                })?;
                let ip = match given_ips.get(i) {
                    Some(ip) => ip.to_string(),
                    None => allocate(range, used).ok_or_else(|| {
                        invalid(format!("spec.clusterIPs: no free address in {range}"))
                    })?,
                };
                cluster_ips.push(ip);
            }
        }
        let families: Vec<&str> = families.iter().map(|f| f.kube_name()).collect();
        if let Some(spec) = svc.get_mut("spec").and_then(Value::as_object_mut) {
            spec.insert("ipFamilyPolicy".into(), json!(policy));
            spec.insert("ipFamilies".into(), json!(families));
            spec.insert("clusterIP".into(), json!(cluster_ips[0]));
            spec.insert("clusterIPs".into(), json!(cluster_ips));
        }
        Ok(())
    }
}

/// The first free address of `range` from [`FIRST_OFFSET`].
fn allocate(range: &IpNet, used: &HashSet<String>) -> Option<String> {
    let base = match range.network() {
        IpAddr::V4(ip) => u128::from(u32::from(ip)),
        IpAddr::V6(ip) => u128::from(ip),
    };
    (FIRST_OFFSET..MAX_OFFSET)
        .map(|offset| match range {
            IpNet::V4(_) => u32::try_from(base + offset)
                .ok()
                .map(|n| IpAddr::from(std::net::Ipv4Addr::from(n))),
            IpNet::V6(_) => Some(IpAddr::from(std::net::Ipv6Addr::from(base + offset))),
        })
        .take_while(|ip| ip.is_some_and(|ip| range.contains(&ip)))
        .flatten()
        .map(|ip| ip.to_string())
        .find(|ip| !used.contains(ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assign(ranges: &str, spec: Value, used: &[&str]) -> Result<Value, ApiError> {
        let ranges: ServiceRanges = ranges.parse().unwrap();
        let used = used.iter().map(|s| s.to_string()).collect();
        let mut svc = json!({"metadata": {"name": "s"}, "spec": spec});
        ranges.assign(&mut svc, &used)?;
        Ok(svc["spec"].clone())
    }

    const DUAL: &str = "10.96.0.0/16,fd00:10:96::/112";

    #[test]
    fn single_stack_by_default_in_the_primary_family() {
        let spec = assign(DEFAULT_RANGE, json!({}), &["10.96.0.11"]).unwrap();
        assert_eq!(spec["clusterIP"], "10.96.0.12");
        assert_eq!(spec["clusterIPs"], json!(["10.96.0.12"]));
        assert_eq!(spec["ipFamilies"], json!(["IPv4"]));
        assert_eq!(spec["ipFamilyPolicy"], "SingleStack");
        let spec = assign(DUAL, json!({}), &[]).unwrap();
        assert_eq!(spec["ipFamilies"], json!(["IPv4"]));
    }

    #[test]
    fn dual_stack_policies_allocate_both_families_in_the_asked_order() {
        let spec = assign(DUAL, json!({"ipFamilyPolicy": "PreferDualStack"}), &[]).unwrap();
        assert_eq!(spec["clusterIPs"], json!(["10.96.0.11", "fd00:10:96::b"]));
        assert_eq!(spec["ipFamilies"], json!(["IPv4", "IPv6"]));
        let spec = assign(
            DUAL,
            json!({"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv6"]}),
            &["fd00:10:96::b"],
        )
        .unwrap();
        assert_eq!(spec["clusterIPs"], json!(["fd00:10:96::c", "10.96.0.11"]));
        assert_eq!(spec["clusterIP"], "fd00:10:96::c");
        // PreferDualStack on a single-stack cluster: one family, no error.
        let spec = assign(
            DEFAULT_RANGE,
            json!({"ipFamilyPolicy": "PreferDualStack"}),
            &[],
        )
        .unwrap();
        assert_eq!(spec["ipFamilies"], json!(["IPv4"]));
        // IPv6 only.
        let spec = assign(DUAL, json!({"ipFamilies": ["IPv6"]}), &[]).unwrap();
        assert_eq!(spec["clusterIPs"], json!(["fd00:10:96::b"]));
    }

    #[test]
    fn given_addresses_are_kept_and_headless_stays_headless() {
        let spec = assign(DUAL, json!({"clusterIP": "fd00:10:96::99"}), &[]).unwrap();
        assert_eq!(spec["ipFamilies"], json!(["IPv6"]));
        let spec = assign(
            DUAL,
            json!({"ipFamilyPolicy": "PreferDualStack", "clusterIPs": ["10.96.1.1"]}),
            &[],
        )
        .unwrap();
        assert_eq!(spec["clusterIPs"], json!(["10.96.1.1", "fd00:10:96::b"]));
        let spec = assign(DUAL, json!({"clusterIP": "None"}), &[]).unwrap();
        assert_eq!(spec["clusterIPs"], json!(["None"]));
    }

    #[test]
    fn impossible_requests_are_invalid_with_the_field_named() {
        let err = |ranges, spec| {
            assign(ranges, spec, &[]).unwrap_err().to_status()["message"].to_string()
        };
        assert!(
            err(DEFAULT_RANGE, json!({"ipFamilyPolicy": "RequireDualStack"}))
                .contains("not configured for dual-stack")
        );
        assert!(err(DEFAULT_RANGE, json!({"ipFamilies": ["IPv6"]})).contains("spec.ipFamilies[0]"));
        assert!(err(DUAL, json!({"ipFamilies": ["IPv4", "IPv6"]})).contains("SingleStack"));
        assert!(err(DUAL, json!({"ipFamilies": ["IPv5"]})).contains("Unsupported value"));
        assert!(err(DUAL, json!({"ipFamilyPolicy": "Both"})).contains("Unsupported value"));
        assert!(err(DUAL, json!({"clusterIP": "10.96.0.300"})).contains("valid IP"));
        assert!(err(
            DUAL,
            json!({"ipFamilies": ["IPv6"], "clusterIP": "10.96.0.20"})
        )
        .contains("expected an IPv6"));
        assert!("10.96.0.0/16,10.97.0.0/16"
            .parse::<ServiceRanges>()
            .is_err());
        assert!("nonsense".parse::<ServiceRanges>().is_err());
    }
}
