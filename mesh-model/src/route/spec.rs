//! The Gateway API route specs as Kubernetes stores them (`gateway.networking.k8s.io`
//! v1 HTTPRoute and GRPCRoute, v1alpha2 TCPRoute), as far as the waypoint reads them.
//!
//! Every field is optional and `null` reads as absent, so anything the API server
//! accepted parses; unknown fields are ignored (newer versions add some). Filter types
//! are kept as strings: one the waypoint does not implement must answer 500, not be
//! skipped, so it has to survive parsing.

use serde::Deserialize;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteSpec {
    pub parent_refs: Option<Vec<ParentRef>>,
    pub hostnames: Option<Vec<String>>,
    pub rules: Option<Vec<RuleSpec>>,
}

/// `ParentReference`: for a mesh route, group `""` and kind `Service`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ParentRef {
    pub group: Option<String>,
    pub kind: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub section_name: Option<String>,
    pub port: Option<u16>,
}

/// One rule of any of the three kinds (the fields one kind lacks stay absent).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuleSpec {
    pub name: Option<String>,
    pub matches: Option<Vec<MatchSpec>>,
    pub filters: Option<Vec<FilterSpec>>,
    pub backend_refs: Option<Vec<BackendRefSpec>>,
    pub timeouts: Option<TimeoutsSpec>,
    pub retry: Option<RetrySpec>,
}

/// `HTTPRouteMatch` or `GRPCRouteMatch`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MatchSpec {
    /// HTTPRoute's path match.
    pub path: Option<PathMatchSpec>,
    /// HTTPRoute's `method` is a string; GRPCRoute's is a [`GrpcMethodSpec`].
    pub method: Option<MethodSpec>,
    pub headers: Option<Vec<ValueMatchSpec>>,
    pub query_params: Option<Vec<ValueMatchSpec>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum MethodSpec {
    Http(String),
    Grpc(GrpcMethodSpec),
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrpcMethodSpec {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub service: Option<String>,
    pub method: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PathMatchSpec {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub value: Option<String>,
}

/// A header or query parameter match.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ValueMatchSpec {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub name: Option<String>,
    pub value: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FilterSpec {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub request_header_modifier: Option<HeaderModifierSpec>,
    pub response_header_modifier: Option<HeaderModifierSpec>,
    pub request_redirect: Option<RedirectSpec>,
    pub url_rewrite: Option<RewriteSpec>,
    pub request_mirror: Option<MirrorSpec>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeaderModifierSpec {
    pub set: Option<Vec<HeaderSpec>>,
    pub add: Option<Vec<HeaderSpec>>,
    pub remove: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct HeaderSpec {
    pub name: Option<String>,
    pub value: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RedirectSpec {
    pub scheme: Option<String>,
    pub hostname: Option<String>,
    pub path: Option<PathModifierSpec>,
    pub port: Option<u16>,
    pub status_code: Option<u16>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RewriteSpec {
    pub hostname: Option<String>,
    pub path: Option<PathModifierSpec>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PathModifierSpec {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub replace_full_path: Option<String>,
    pub replace_prefix_match: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MirrorSpec {
    pub backend_ref: Option<BackendRefSpec>,
    pub percent: Option<u32>,
    pub fraction: Option<FractionSpec>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct FractionSpec {
    pub numerator: Option<u32>,
    pub denominator: Option<u32>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendRefSpec {
    pub group: Option<String>,
    pub kind: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub port: Option<u16>,
    pub weight: Option<u32>,
    pub filters: Option<Vec<FilterSpec>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TimeoutsSpec {
    pub request: Option<String>,
    pub backend_request: Option<String>,
}

/// `HTTPRouteRetry` (Gateway API v1.2, experimental channel; Istio reads it).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetrySpec {
    pub codes: Option<Vec<u16>>,
    pub attempts: Option<u32>,
    pub backoff: Option<String>,
}
