//! Istio AuthorizationPolicy objects -> our L4 [`Authorization`].
//!
//! Follows istiod's conversion for ztunnel: each policy rule becomes one of our rules,
//! whose clauses are its `to` operations (any), its `from` sources (any), and one
//! clause per `when` condition. The L4 subset is enforced; HTTP attributes are not
//! visible to ztunnel:
//! - ALLOW: a rule using any HTTP attribute never matches (dropped, as istiod does).
//! - DENY: deliberately safer than Istio. istiod keeps such a rule minus its HTTP parts,
//!   but a part left empty then never matches in ztunnel, so a DENY on e.g. `methods`
//!   alone is silently void. Here a part that only had HTTP attributes is treated as
//!   "matches anything", so the rule denies at L4 (more than requested, never less).
//!
//! Both cases are logged and listed in the policy's `warnings` in `/config_dump`.

use std::collections::{BTreeMap, BTreeSet};

use kube::core::DynamicObject;
use kube::ResourceExt;

use super::convert::selects;
use mesh_model::authorization_policy::{list, Condition, From, Operation, Rule, Spec, To};
use mesh_model::serde_util::cidr_list;
use mesh_model::{Action, Authorization, RbacMatch, Scope, ServiceAccountMatch, StringMatch};

/// Istio's dry-run annotation: evaluate and log, never enforce.
const DRY_RUN_ANNOTATION: &str = "istio.io/dry-run";

/// `when` keys ztunnel can evaluate (istiod's list); any other key is an HTTP attribute.
const L4_WHEN_KEYS: &[&str] = &[
    "source.ip",
    "source.namespace",
    "source.principal",
    "destination.ip",
    "destination.port",
];

/// A converted policy and how it selects workloads.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvertedPolicy {
    pub authorization: Authorization,
    /// `spec.selector.matchLabels` of a WorkloadSelector-scoped policy; empty labels
    /// select every pod in scope (the sidecar semantics; safer than selecting none).
    selector: Option<BTreeMap<String, String>>,
    /// Selector policies in the root namespace select workloads in every namespace.
    all_namespaces: bool,
}

impl ConvertedPolicy {
    /// Whether a workload in `namespace` with `labels` must list this policy in its
    /// `authorizationPolicies` (only WorkloadSelector-scoped policies are listed).
    pub fn selects(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        let Some(selector) = &self.selector else {
            return false;
        };
        (self.all_namespaces || self.authorization.namespace == namespace)
            && selects(selector, labels)
    }
}

/// Why a policy is not enforced by ztunnel at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotConverted {
    #[error("the object has no name or namespace")]
    NoName,
    #[error("it binds to targetRefs (a waypoint's policy, not ztunnel's)")]
    TargetRefs,
    #[error("ztunnel does not enforce the {0} action")]
    UnsupportedAction(String),
    #[error("invalid spec: {0}")]
    InvalidSpec(String),
}

/// Converts one AuthorizationPolicy; `root_namespace` makes selector-less policies Global.
pub fn convert(obj: &DynamicObject, root_namespace: &str) -> Result<ConvertedPolicy, NotConverted> {
    let name = obj.metadata.name.clone().filter(|n| !n.is_empty());
    let namespace = obj.metadata.namespace.clone().filter(|n| !n.is_empty());
    let (Some(name), Some(namespace)) = (name, namespace) else {
        return Err(NotConverted::NoName);
    };
    let spec: Spec = match obj.data.get("spec") {
        None | Some(serde_json::Value::Null) => Spec::default(),
        Some(v) => serde_json::from_value(v.clone())
            .map_err(|e| NotConverted::InvalidSpec(e.to_string()))?,
    };
    if spec.targets().next().is_some() {
        return Err(NotConverted::TargetRefs);
    }
    let action = match spec.action.as_deref().unwrap_or("") {
        "" | "ALLOW" => Action::Allow,
        "DENY" => Action::Deny,
        other @ ("AUDIT" | "CUSTOM") => return Err(NotConverted::UnsupportedAction(other.into())),
        other => {
            return Err(NotConverted::InvalidSpec(format!(
                "unknown action {other:?}"
            )))
        }
    };
    let selector = spec
        .selector
        .as_ref()
        .map(|s| s.match_labels.clone().unwrap_or_default());
    let scope = match (&selector, namespace == root_namespace) {
        (Some(_), _) => Scope::WorkloadSelector,
        (None, true) => Scope::Global,
        (None, false) => Scope::Namespace,
    };

    let mut warnings = Vec::new();
    let mut rules = Vec::new();
    for (i, rule) in spec.rules.iter().flatten().enumerate() {
        let mut out = RuleConverter {
            action,
            namespace: &namespace,
            at: format!("rules[{i}]"),
            l7: BTreeSet::new(),
            warnings: &mut warnings,
        };
        if let Some(r) = out.convert(rule) {
            rules.push(r);
        }
    }
    let dry_run = obj
        .annotations()
        .get(DRY_RUN_ANNOTATION)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    Ok(ConvertedPolicy {
        authorization: Authorization {
            name,
            namespace: namespace.clone(),
            scope,
            action,
            rules,
            dry_run,
            warnings,
        },
        selector,
        all_namespaces: namespace == root_namespace,
    })
}

/// Converts one policy rule; collects the warnings of that rule.
struct RuleConverter<'a> {
    action: Action,
    namespace: &'a str,
    at: String,
    /// HTTP attributes this rule uses.
    l7: BTreeSet<String>,
    warnings: &'a mut Vec<String>,
}

type Clause = Vec<RbacMatch>;

impl RuleConverter<'_> {
    /// The rule's clauses, or `None` when the rule can never match at L4.
    fn convert(&mut self, rule: &Rule) -> Option<Vec<Clause>> {
        let mut clauses = Vec::new();
        if let Some(to) = rule.to.as_ref().filter(|t| !t.is_empty()) {
            let parts = to.iter().map(|t| self.operation(t)).collect();
            clauses.extend(self.clause(parts));
        }
        if let Some(from) = rule.from.as_ref().filter(|f| !f.is_empty()) {
            let parts = from.iter().map(|f| self.source(f)).collect();
            clauses.extend(self.clause(parts));
        }
        for cond in rule.when.iter().flatten() {
            let part = self.condition(cond);
            clauses.extend(self.clause(vec![part]));
        }
        if self.l7.is_empty() {
            return Some(clauses);
        }
        let found = self.l7.iter().cloned().collect::<Vec<_>>().join(", ");
        match self.action {
            Action::Allow => {
                self.warn(format!(
                    "HTTP attributes ({found}) cannot be enforced by ztunnel: \
                     this ALLOW rule never matches (use a waypoint for HTTP rules)"
                ));
                None
            }
            Action::Deny => {
                self.warn(format!(
                    "HTTP attributes ({found}) cannot be enforced by ztunnel: \
                     this DENY rule is enforced at L4 without them, denying more than requested"
                ));
                Some(clauses)
            }
        }
    }

    /// A clause from its alternatives: (match, whether the alternative had HTTP
    /// attributes). For DENY, an alternative left empty by dropping HTTP attributes
    /// matches anything, so the whole clause always holds and is left out.
    fn clause(&mut self, parts: Vec<(RbacMatch, bool)>) -> Option<Clause> {
        let widened = parts.iter().any(|(m, had_l7)| *had_l7 && m.is_empty());
        if self.action == Action::Deny && widened {
            return None;
        }
        Some(parts.into_iter().map(|(m, _)| m).collect())
    }

    fn operation(&mut self, to: &To) -> (RbacMatch, bool) {
        let default = Operation::default();
        let op = to.operation.as_ref().unwrap_or(&default);
        let l7 = op.l7_fields();
        self.l7.extend(l7.iter().map(|s| s.to_string()));
        let m = RbacMatch {
            destination_ports: self.ports(&op.ports),
            not_destination_ports: self.ports(&op.not_ports),
            ..Default::default()
        };
        (m, !l7.is_empty())
    }

    fn source(&mut self, from: &From) -> (RbacMatch, bool) {
        let Some(s) = from.source.as_ref() else {
            return (RbacMatch::default(), false);
        };
        let l7 = s.l7_fields();
        self.l7.extend(l7.iter().map(|s| s.to_string()));
        let m = RbacMatch {
            principals: string_matches(list(&s.principals)),
            not_principals: string_matches(list(&s.not_principals)),
            namespaces: string_matches(list(&s.namespaces)),
            not_namespaces: string_matches(list(&s.not_namespaces)),
            service_accounts: self.service_accounts(list(&s.service_accounts)),
            not_service_accounts: self.service_accounts(list(&s.not_service_accounts)),
            source_ips: self.cidrs(list(&s.ip_blocks)),
            not_source_ips: self.cidrs(list(&s.not_ip_blocks)),
            ..Default::default()
        };
        (m, !l7.is_empty())
    }

    fn condition(&mut self, c: &Condition) -> (RbacMatch, bool) {
        let key = c.key.as_deref().unwrap_or("");
        if !L4_WHEN_KEYS.contains(&key) {
            self.l7.insert(format!("when {key}"));
            return (RbacMatch::default(), true);
        }
        let (values, not_values) = (list(&c.values), list(&c.not_values));
        let mut m = RbacMatch::default();
        match key {
            "source.ip" => {
                m.source_ips = self.cidrs(values);
                m.not_source_ips = self.cidrs(not_values);
            }
            "source.namespace" => {
                m.namespaces = string_matches(values);
                m.not_namespaces = string_matches(not_values);
            }
            "source.principal" => {
                m.principals = string_matches(values);
                m.not_principals = string_matches(not_values);
            }
            "destination.ip" => {
                m.destination_ips = self.cidrs(values);
                m.not_destination_ips = self.cidrs(not_values);
            }
            _ => {
                m.destination_ports = self.ports(&c.values);
                m.not_destination_ports = self.ports(&c.not_values);
            }
        }
        (m, false)
    }

    /// Ports as numbers; invalid entries are skipped with a warning (istiod skips them).
    fn ports(&mut self, values: &Option<Vec<String>>) -> Vec<u16> {
        let mut out = Vec::new();
        for v in list(values) {
            match v.trim().parse::<u16>() {
                Ok(p) => out.push(p),
                Err(_) => self.warn(format!("ignoring invalid port {v:?}")),
            }
        }
        out
    }

    fn cidrs(&mut self, values: &[String]) -> Vec<ipnet::IpNet> {
        let mut out = Vec::new();
        for v in values.iter().filter(|v| !v.is_empty()) {
            match cidr_list::parse(v) {
                Ok(n) => out.push(n),
                Err(_) => self.warn(format!("ignoring invalid IP block {v:?}")),
            }
        }
        out
    }

    /// `sa` (in the policy's namespace) or `namespace/sa`.
    fn service_accounts(&self, values: &[String]) -> Vec<ServiceAccountMatch> {
        values
            .iter()
            .map(|v| {
                let (ns, sa) = v.split_once('/').unwrap_or((self.namespace, v));
                ServiceAccountMatch {
                    namespace: ns.to_string(),
                    service_account: sa.to_string(),
                }
            })
            .collect()
    }

    fn warn(&mut self, message: String) {
        self.warnings.push(format!("{}: {message}", self.at));
    }
}

/// Istio's string forms: `*` any non-empty value, `*abc` suffix, `abc*` prefix, else exact.
pub fn string_match(v: &str) -> StringMatch {
    if v == "*" {
        StringMatch::Presence
    } else if let Some(suffix) = v.strip_prefix('*') {
        StringMatch::Suffix(suffix.to_string())
    } else if let Some(prefix) = v.strip_suffix('*') {
        StringMatch::Prefix(prefix.to_string())
    } else {
        StringMatch::Exact(v.to_string())
    }
}

fn string_matches(values: &[String]) -> Vec<StringMatch> {
    values.iter().map(|v| string_match(v)).collect()
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
