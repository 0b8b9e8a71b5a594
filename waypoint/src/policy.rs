//! L7 authorization: Istio's AuthorizationPolicy, evaluated per HTTP request (or per
//! connection for TCP) as Istio's waypoint does.
//!
//! A waypoint enforces the policies that attach to it by `targetRefs`: to its own
//! Gateway, to the `istio-waypoint` GatewayClass (from the root namespace: every
//! waypoint), or to a Service (requests for that Service only). Selector and
//! namespace-wide policies are ztunnel's, never the waypoint's.
//!
//! Order, as Istio: a matching DENY denies; else, with no ALLOW policy in force, the
//! request is allowed; else it needs a matching ALLOW. CUSTOM (external authorization)
//! and AUDIT are not built: a CUSTOM policy denies everything it targets (it would
//! otherwise let through what the external check may refuse), an AUDIT policy is
//! refused when loaded (it only logs). A policy that cannot be read fails closed: an
//! ALLOW that matches nothing, a DENY that matches everything.
//!
//! For TCP traffic the HTTP attributes are unknown: a rule that needs one never
//! matches in an ALLOW policy and always matches in a DENY policy (denying more,
//! never less; Istio's rule for TCP filter chains).

use std::net::IpAddr;

use http::HeaderMap;
use ipnet::IpNet;
use mesh_model::authorization_policy::{list, Condition, From, Operation, Rule, Spec, TargetRef};
use serde::Deserialize;
use shared_types::constants::WAYPOINT_CLASS;
use tracing::warn;

use crate::objects::parse_objects;
pub use crate::objects::LoadError;

/// The Gateway API group of a waypoint's Gateway and GatewayClass.
const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";

/// Which waypoint this is, for `targetRefs`.
#[derive(Clone, Debug)]
pub struct WaypointRef {
    /// The Gateway's namespace and name.
    pub namespace: String,
    pub name: String,
    /// The mesh's root namespace (GatewayClass-wide policies live there).
    pub root_namespace: String,
}

/// What the request (or connection) offers for matching.
#[derive(Clone, Debug)]
pub struct Attributes<'a> {
    /// `spiffe://td/ns/x/sa/y` of the peer that opened the tunnel to us.
    pub source_principal: Option<&'a str>,
    pub source_ip: IpAddr,
    pub destination_ip: IpAddr,
    pub destination_port: u16,
    /// The Service addressed, as (namespace, name).
    pub service: Option<(&'a str, &'a str)>,
    /// `None` for TCP traffic.
    pub http: Option<HttpAttributes<'a>>,
}

#[derive(Clone, Debug)]
pub struct HttpAttributes<'a> {
    pub method: &'a str,
    /// The path without the query string.
    pub path: &'a str,
    /// The Host header (or `:authority`).
    pub host: &'a str,
    pub headers: &'a HeaderMap,
}

/// The outcome, with the policy that decided it (`namespace.name`) when one did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Deny { policy: Option<String> },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Allow,
    Deny,
}

/// One AuthorizationPolicy, ready to evaluate.
#[derive(Clone, Debug)]
pub struct Policy {
    pub namespace: String,
    pub name: String,
    action: Action,
    targets: Vec<TargetRef>,
    rules: Vec<Rule>,
    /// Set when the policy could not be read: it fails closed (see the module doc).
    broken: Option<String>,
}

/// The fields of a spec that say where it attaches, read alone from a spec that does
/// not parse whole.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Attachment {
    #[serde(default)]
    action: Option<String>,
    #[serde(default)]
    target_ref: Option<TargetRef>,
    #[serde(default)]
    target_refs: Option<Vec<TargetRef>>,
}

/// Reads a YAML stream of AuthorizationPolicy objects (or `List`s of them), as
/// `kubectl apply -f` takes them ([`crate::objects`]), and compiles them.
pub fn parse_policies(yaml: &str) -> Result<Vec<Policy>, LoadError> {
    parse_objects(yaml)?
        .policies
        .into_iter()
        .map(|p| Policy::from_json(p.namespace, p.name, &p.spec_json))
        .collect()
}

impl Policy {
    /// A policy from its spec as JSON (as the waypoint's xDS resource carries it).
    pub fn from_json(namespace: String, name: String, spec: &str) -> Result<Policy, LoadError> {
        let spec: serde_yaml::Value = serde_yaml::from_str(spec)?;
        Policy::from_spec(namespace, name, spec)
    }

    /// A policy from its spec as Kubernetes stores it.
    pub fn from_spec(
        namespace: String,
        name: String,
        spec: serde_yaml::Value,
    ) -> Result<Policy, LoadError> {
        let key = format!("{namespace}/{name}");
        let (spec, broken) = match serde_yaml::from_value::<Spec>(spec.clone()) {
            Ok(spec) => {
                let broken = validate(&spec);
                (spec, broken)
            }
            // Where it attaches and its action may still be readable: then it fails
            // closed there (else it attaches nowhere, as it names nothing we can read).
            Err(e) => {
                let attachment = serde_yaml::from_value::<Attachment>(spec).unwrap_or_default();
                let spec = Spec {
                    action: attachment.action,
                    target_ref: attachment.target_ref,
                    target_refs: attachment.target_refs,
                    ..Spec::default()
                };
                (spec, Some(format!("invalid spec: {e}")))
            }
        };
        let (action, broken) = match spec.action.as_deref().unwrap_or("ALLOW") {
            "" | "ALLOW" => (Action::Allow, broken),
            "DENY" => (Action::Deny, broken),
            "CUSTOM" => (
                Action::Deny,
                Some("the CUSTOM action (external authorization) is not supported".into()),
            ),
            other => return Err(LoadError::UnsupportedAction(key, other.to_owned())),
        };
        if let Some(reason) = &broken {
            warn!(policy = %key, %reason, "policy cannot be read: it fails closed");
        }
        Ok(Policy {
            namespace,
            name,
            action,
            targets: spec.targets().cloned().collect(),
            rules: spec.rules.unwrap_or_default(),
            broken,
        })
    }

    fn key(&self) -> String {
        format!("{}.{}", self.namespace, self.name)
    }

    /// Whether this policy is the waypoint's at all (a `targetRefs` to it, its class,
    /// or some Service in its namespace).
    fn attaches_to(&self, waypoint: &WaypointRef) -> bool {
        self.targets.iter().any(|t| {
            let group = t.group.as_deref().unwrap_or("");
            let kind = t.kind.as_deref().unwrap_or("");
            let name = t.name.as_deref().unwrap_or("");
            match (group, kind) {
                (GATEWAY_GROUP, "Gateway") => {
                    self.namespace == waypoint.namespace && name == waypoint.name
                }
                (GATEWAY_GROUP, "GatewayClass") => {
                    self.namespace == waypoint.root_namespace && name == WAYPOINT_CLASS
                }
                ("" | "core", "Service") => true,
                _ => false,
            }
        })
    }

    /// Whether it applies to this request: Gateway or GatewayClass targets always,
    /// Service targets when the request is for that Service.
    fn applies(&self, attrs: &Attributes) -> bool {
        self.targets.iter().any(|t| {
            let kind = t.kind.as_deref().unwrap_or("");
            match kind {
                "Service" => attrs.service.is_some_and(|(ns, name)| {
                    ns == self.namespace && Some(name) == t.name.as_deref()
                }),
                _ => true,
            }
        })
    }

    fn matches(&self, attrs: &Attributes) -> bool {
        if self.broken.is_some() {
            return self.action == Action::Deny;
        }
        // Unknown HTTP attributes (TCP) resolve so as to deny more.
        let unknown = self.action == Action::Deny;
        self.rules.iter().any(|r| rule_matches(r, attrs, unknown))
    }
}

/// What makes a spec unreadable for us: a `when` key we do not evaluate.
fn validate(spec: &Spec) -> Option<String> {
    for rule in spec.rules.iter().flatten() {
        for c in rule.when.iter().flatten() {
            let key = c.key.as_deref().unwrap_or("");
            if !known_condition(key) {
                return Some(format!("condition key {key:?} is not supported"));
            }
        }
    }
    None
}

fn known_condition(key: &str) -> bool {
    header_name(key).is_some()
        || key.starts_with("request.auth.")
        || matches!(
            key,
            "source.ip"
                | "remote.ip"
                | "source.namespace"
                | "source.principal"
                | "destination.ip"
                | "destination.port"
        )
}

/// `request.headers[name]` -> `name`.
fn header_name(key: &str) -> Option<&str> {
    key.strip_prefix("request.headers[")?.strip_suffix(']')
}

/// The policies of one waypoint.
#[derive(Clone, Debug, Default)]
pub struct Policies {
    policies: Vec<Policy>,
}

impl Policies {
    /// Keeps those of `all` that attach to `waypoint`.
    pub fn for_waypoint(all: Vec<Policy>, waypoint: &WaypointRef) -> Self {
        Policies {
            policies: all
                .into_iter()
                .filter(|p| p.attaches_to(waypoint))
                .collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.policies.len()
    }

    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }

    pub fn evaluate(&self, attrs: &Attributes) -> Decision {
        let applying = || self.policies.iter().filter(|p| p.applies(attrs));
        if let Some(deny) = applying().find(|p| p.action == Action::Deny && p.matches(attrs)) {
            return Decision::Deny {
                policy: Some(deny.key()),
            };
        }
        let mut allows = applying().filter(|p| p.action == Action::Allow).peekable();
        if allows.peek().is_none() {
            return Decision::Allow;
        }
        if allows.any(|p| p.matches(attrs)) {
            Decision::Allow
        } else {
            Decision::Deny { policy: None }
        }
    }
}

fn rule_matches(rule: &Rule, attrs: &Attributes, unknown: bool) -> bool {
    let any_or_empty = |n: usize, f: &dyn Fn(usize) -> bool| n == 0 || (0..n).any(f);
    let from = rule.from.as_deref().unwrap_or_default();
    let to = rule.to.as_deref().unwrap_or_default();
    any_or_empty(from.len(), &|i| source_matches(&from[i], attrs))
        && any_or_empty(to.len(), &|i| {
            to[i]
                .operation
                .as_ref()
                .is_none_or(|op| operation_matches(op, attrs, unknown))
        })
        && rule
            .when
            .iter()
            .flatten()
            .all(|c| condition_matches(c, attrs, unknown))
}

/// A positive list (empty: no constraint) and a negative one (none may match).
fn both(values: &[String], not_values: &[String], test: impl Fn(&str) -> bool) -> bool {
    (values.is_empty() || values.iter().any(|v| test(v))) && !not_values.iter().any(|v| test(v))
}

fn source_matches(from: &From, attrs: &Attributes) -> bool {
    let Some(s) = &from.source else {
        return true;
    };
    let principal = attrs
        .source_principal
        .map(|p| p.strip_prefix("spiffe://").unwrap_or(p));
    let namespace = principal.and_then(principal_namespace);
    // `namespace/account`, built only for a rule that names service accounts.
    let service_account = || {
        principal.and_then(|p| {
            let (ns, sa) = (principal_namespace(p)?, p.rsplit_once("/sa/")?.1);
            Some(format!("{ns}/{sa}"))
        })
    };
    let has = |value: Option<&str>, pattern: &str| value.is_some_and(|v| glob(pattern, v));
    both(list(&s.principals), list(&s.not_principals), |p| {
        has(principal, p)
    }) && both(list(&s.namespaces), list(&s.not_namespaces), |n| {
        has(namespace, n)
    }) && both(
        list(&s.service_accounts),
        list(&s.not_service_accounts),
        |sa| has(service_account().as_deref(), sa),
    ) && both(list(&s.ip_blocks), list(&s.not_ip_blocks), |b| {
        in_block(b, attrs.source_ip)
    }) && both(
        list(&s.remote_ip_blocks),
        list(&s.not_remote_ip_blocks),
        |b| in_block(b, attrs.source_ip),
    ) && both(
        // No RequestAuthentication: a request never has a request principal.
        list(&s.request_principals),
        list(&s.not_request_principals),
        |_| false,
    )
}

fn principal_namespace(principal: &str) -> Option<&str> {
    let rest = principal.split_once("/ns/")?.1;
    Some(rest.split('/').next().unwrap_or(rest))
}

fn operation_matches(op: &Operation, attrs: &Attributes, unknown: bool) -> bool {
    let port = attrs.destination_port.to_string();
    if !both(list(&op.ports), list(&op.not_ports), |p| p == port) {
        return false;
    }
    let Some(http) = &attrs.http else {
        let needs_http = [
            &op.hosts,
            &op.not_hosts,
            &op.methods,
            &op.not_methods,
            &op.paths,
            &op.not_paths,
        ]
        .iter()
        .any(|l| !list(l).is_empty());
        return !needs_http || unknown;
    };
    let host = http.host.to_ascii_lowercase();
    let host_matches = |pattern: &str| {
        let pattern = pattern.to_ascii_lowercase();
        // A Host header may carry the port; Istio matches with and without it.
        glob(&pattern, &host)
            || host
                .rsplit_once(':')
                .is_some_and(|(bare, _)| glob(&pattern, bare))
    };
    both(list(&op.hosts), list(&op.not_hosts), host_matches)
        && both(list(&op.methods), list(&op.not_methods), |m| {
            m == "*" || m == http.method
        })
        && both(list(&op.paths), list(&op.not_paths), |p| glob(p, http.path))
}

fn condition_matches(c: &Condition, attrs: &Attributes, unknown: bool) -> bool {
    let key = c.key.as_deref().unwrap_or("");
    let principal = attrs
        .source_principal
        .map(|p| p.strip_prefix("spiffe://").unwrap_or(p));
    let values = list(&c.values);
    let not_values = list(&c.not_values);
    let value_is = |value: Option<&str>| {
        both(values, not_values, |pattern| {
            value.is_some_and(|v| glob(pattern, v))
        })
    };
    if let Some(name) = header_name(key) {
        let Some(http) = &attrs.http else {
            return unknown;
        };
        let value = http.headers.get(name).and_then(|v| v.to_str().ok());
        return value_is(value);
    }
    match key {
        "source.ip" | "remote.ip" => both(values, not_values, |b| in_block(b, attrs.source_ip)),
        "destination.ip" => both(values, not_values, |b| in_block(b, attrs.destination_ip)),
        "source.namespace" => value_is(principal.and_then(principal_namespace)),
        "source.principal" => value_is(principal),
        "destination.port" => value_is(Some(&attrs.destination_port.to_string())),
        // request.auth.*: no RequestAuthentication, so no claim is ever present.
        _ => value_is(None),
    }
}

/// Istio's string match: `*` any non-empty value, `prefix*`, `*suffix`, else exact.
fn glob(pattern: &str, value: &str) -> bool {
    if pattern == "*" {
        return !value.is_empty();
    }
    if let Some(prefix) = pattern.strip_suffix('*') {
        return value.starts_with(prefix);
    }
    if let Some(suffix) = pattern.strip_prefix('*') {
        return value.ends_with(suffix);
    }
    pattern == value
}

/// `10.0.0.0/8` or a bare address.
fn in_block(block: &str, ip: IpAddr) -> bool {
    if let Ok(net) = block.parse::<IpNet>() {
        return net.contains(&ip);
    }
    block.parse::<IpAddr>().is_ok_and(|b| b == ip)
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
