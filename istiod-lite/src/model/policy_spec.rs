//! The `security.istio.io/v1` AuthorizationPolicy spec, as far as we read it.
//!
//! Every field is optional and `null` reads as absent, so anything the API server
//! accepted parses; unknown fields are ignored (newer Istio versions add some).

use std::collections::BTreeMap;

use serde::Deserialize;

/// A list that may be absent or `null`.
pub type List = Option<Vec<String>>;

pub fn list(l: &List) -> &[String] {
    l.as_deref().unwrap_or_default()
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub selector: Option<Selector>,
    pub target_ref: Option<serde_json::Value>,
    pub target_refs: Option<Vec<serde_json::Value>>,
    pub action: Option<String>,
    pub rules: Option<Vec<Rule>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Selector {
    pub match_labels: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Rule {
    pub from: Option<Vec<From>>,
    pub to: Option<Vec<To>>,
    pub when: Option<Vec<Condition>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct From {
    pub source: Option<Source>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Source {
    pub principals: List,
    pub not_principals: List,
    pub request_principals: List,
    pub not_request_principals: List,
    pub namespaces: List,
    pub not_namespaces: List,
    pub service_accounts: List,
    pub not_service_accounts: List,
    pub ip_blocks: List,
    pub not_ip_blocks: List,
    pub remote_ip_blocks: List,
    pub not_remote_ip_blocks: List,
}

impl Source {
    /// Names of the HTTP-only attributes set (ztunnel cannot see them).
    pub fn l7_fields(&self) -> Vec<&'static str> {
        present(&[
            ("requestPrincipals", &self.request_principals),
            ("notRequestPrincipals", &self.not_request_principals),
            ("remoteIpBlocks", &self.remote_ip_blocks),
            ("notRemoteIpBlocks", &self.not_remote_ip_blocks),
        ])
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct To {
    pub operation: Option<Operation>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    pub hosts: List,
    pub not_hosts: List,
    pub ports: List,
    pub not_ports: List,
    pub methods: List,
    pub not_methods: List,
    pub paths: List,
    pub not_paths: List,
}

impl Operation {
    /// Names of the HTTP-only attributes set.
    pub fn l7_fields(&self) -> Vec<&'static str> {
        present(&[
            ("hosts", &self.hosts),
            ("notHosts", &self.not_hosts),
            ("methods", &self.methods),
            ("notMethods", &self.not_methods),
            ("paths", &self.paths),
            ("notPaths", &self.not_paths),
        ])
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    pub key: Option<String>,
    pub values: List,
    pub not_values: List,
}

fn present(fields: &[(&'static str, &List)]) -> Vec<&'static str> {
    fields
        .iter()
        .filter(|(_, l)| !list(l).is_empty())
        .map(|(name, _)| *name)
        .collect()
}
