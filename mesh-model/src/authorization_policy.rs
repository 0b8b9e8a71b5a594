//! The `security.istio.io/v1` AuthorizationPolicy spec, as far as we read it: istiod-lite
//! converts its L4 part for ztunnel, the waypoint evaluates it whole.
//!
//! Every field is optional and `null` reads as absent, so anything the API server
//! accepted parses; unknown fields are ignored (newer Istio versions add some).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A list that may be absent or `null`.
pub type List = Option<Vec<String>>;

pub fn list(l: &List) -> &[String] {
    l.as_deref().unwrap_or_default()
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub selector: Option<Selector>,
    pub target_ref: Option<TargetRef>,
    pub target_refs: Option<Vec<TargetRef>>,
    pub action: Option<String>,
    pub rules: Option<Vec<Rule>>,
}

impl Spec {
    /// `targetRef` and `targetRefs` together (Istio accepts either).
    pub fn targets(&self) -> impl Iterator<Item = &TargetRef> {
        self.target_ref
            .iter()
            .chain(self.target_refs.iter().flatten())
    }
}

/// A `PolicyTargetReference`: the Gateway (a waypoint) or Service a policy attaches to.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct TargetRef {
    /// `gateway.networking.k8s.io` for a Gateway, `""` (core) for a Service.
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    /// Istio allows only the policy's own namespace; absent means that one.
    #[serde(default)]
    pub namespace: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Selector {
    pub match_labels: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct Rule {
    pub from: Option<Vec<From>>,
    pub to: Option<Vec<To>>,
    pub when: Option<Vec<Condition>>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct From {
    pub source: Option<Source>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
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

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct To {
    pub operation: Option<Operation>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
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

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
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
