//! Which keys the local config understands, so unknown ones can be reported.
//!
//! Parsing ignores unknown keys (a file from a newer Istio must still load), but a typo
//! like `serviceAcount` would silently fall back to a default; listing them in a warning
//! makes that visible. A unit test keeps these lists equal to the structs' fields.

use serde_yaml::Value;

pub(super) const TOP: &[&str] = &["workloads", "services", "policies"];

pub(super) const WORKLOAD: &[&str] = &[
    "uid",
    "name",
    "namespace",
    "serviceAccount",
    "trustDomain",
    "workloadIps",
    "protocol",
    "node",
    "network",
    "status",
    "authorizationPolicies",
    "services",
    "waypoint",
    "networkGateway",
    "networkMode",
    "workloadName",
    "workloadType",
    "canonicalName",
    "canonicalRevision",
    "hostname",
    "nativeTunnel",
    "applicationTunnel",
    "clusterId",
    "locality",
    "capacity",
];

pub(super) const SERVICE: &[&str] = &[
    "name",
    "namespace",
    "hostname",
    "vips",
    "ports",
    "subjectAltNames",
    "endpoints",
    "waypoint",
    "loadBalancer",
    "ipFamilies",
    "canonical",
    "appProtocols",
];

/// Service keys of ours, not Istio's: a file using them is for our proxies only.
#[cfg(test)]
pub(super) const SERVICE_EXTENSIONS: &[&str] = &["appProtocols"];

pub(super) const POLICY: &[&str] = &["name", "namespace", "scope", "action", "rules", "dryRun"];

pub(super) const MATCH: &[&str] = &[
    "namespaces",
    "notNamespaces",
    "serviceAccounts",
    "notServiceAccounts",
    "principals",
    "notPrincipals",
    "sourceIps",
    "notSourceIps",
    "destinationIps",
    "notDestinationIps",
    "destinationPorts",
    "notDestinationPorts",
];

/// Paths (`workloads[0].serviceAcount`) of keys the config has but we do not read.
pub(super) fn unknown_fields(doc: &Value) -> Vec<String> {
    let mut out = Vec::new();
    check_map(doc, "", TOP, &mut out);
    let list = |key: &str| {
        doc.get(key)
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
    };
    for (i, w) in list("workloads").enumerate() {
        check_map(w, &format!("workloads[{i}]"), WORKLOAD, &mut out);
    }
    for (i, s) in list("services").enumerate() {
        check_map(s, &format!("services[{i}]"), SERVICE, &mut out);
    }
    for (i, p) in list("policies").enumerate() {
        let at = format!("policies[{i}]");
        check_map(p, &at, POLICY, &mut out);
        let seq = |v: Option<&Value>| v.and_then(Value::as_sequence).cloned().unwrap_or_default();
        for (r, rule) in seq(p.get("rules")).iter().enumerate() {
            for (c, clause) in seq(Some(rule)).iter().enumerate() {
                for (m, mat) in seq(Some(clause)).iter().enumerate() {
                    check_map(mat, &format!("{at}.rules[{r}][{c}][{m}]"), MATCH, &mut out);
                }
            }
        }
    }
    out
}

fn check_map(v: &Value, at: &str, known: &[&str], out: &mut Vec<String>) {
    let Some(map) = v.as_mapping() else {
        return;
    };
    for key in map.keys() {
        let name = match key.as_str() {
            Some(s) => s.to_string(),
            None => format!("{key:?}"),
        };
        if !known.contains(&name.as_str()) {
            out.push(if at.is_empty() {
                name
            } else {
                format!("{at}.{name}")
            });
        }
    }
}
