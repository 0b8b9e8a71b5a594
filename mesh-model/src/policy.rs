//! L4 authorization policies and how one policy matches one connection.
//!
//! The shape is Istio's ztunnel `Authorization` (rules -> clauses -> matches) so the local
//! file loads unchanged; Kubernetes AuthorizationPolicies will be converted into the same
//! type. Combining several policies (DENY before ALLOW) lives in `snapshot.rs`.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use serde::de::{self, Deserializer, EnumAccess, IgnoredAny, MapAccess, VariantAccess, Visitor};
use serde::ser::{SerializeTupleVariant, Serializer};
use serde::{Deserialize, Serialize};

use super::serde_util::{cidr_list, null_as_default};
use shared_types::identity::Identity;

/// A string matcher, written in YAML as a tag: `!Exact a`, `!Prefix a`, `!Suffix a`,
/// `!Presence` (any non-empty value). The map form `{Exact: a}` and JSON are accepted too.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StringMatch {
    /// The value equals this string.
    Exact(String),
    /// The value starts with this string.
    Prefix(String),
    /// The value ends with this string.
    Suffix(String),
    /// Any non-empty value.
    Presence,
}

impl StringMatch {
    /// Whether `value` satisfies this matcher.
    pub fn matches(&self, value: &str) -> bool {
        match self {
            StringMatch::Exact(s) => value == s,
            StringMatch::Prefix(s) => value.starts_with(s.as_str()),
            StringMatch::Suffix(s) => value.ends_with(s.as_str()),
            StringMatch::Presence => !value.is_empty(),
        }
    }
}

const STRING_MATCH_VARIANTS: &[&str] = &["Exact", "Prefix", "Suffix", "Presence"];

impl Serialize for StringMatch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Same encoding serde derives for Istio's enum: `!Exact x` in YAML,
        // `{"Exact":"x"}` in JSON, and `Presence()` as an empty tuple variant.
        match self {
            StringMatch::Exact(v) => s.serialize_newtype_variant("StringMatch", 0, "Exact", v),
            StringMatch::Prefix(v) => s.serialize_newtype_variant("StringMatch", 1, "Prefix", v),
            StringMatch::Suffix(v) => s.serialize_newtype_variant("StringMatch", 2, "Suffix", v),
            StringMatch::Presence => s
                .serialize_tuple_variant("StringMatch", 3, "Presence", 0)?
                .end(),
        }
    }
}

impl<'de> Deserialize<'de> for StringMatch {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;

        fn build<E: de::Error>(tag: &str, value: Option<String>) -> Result<StringMatch, E> {
            let need = |v: Option<String>| {
                v.ok_or_else(|| E::custom(format!("!{tag} needs a string value")))
            };
            Ok(match tag {
                "Exact" => StringMatch::Exact(need(value)?),
                "Prefix" => StringMatch::Prefix(need(value)?),
                "Suffix" => StringMatch::Suffix(need(value)?),
                "Presence" => StringMatch::Presence,
                other => return Err(E::unknown_variant(other, STRING_MATCH_VARIANTS)),
            })
        }

        impl<'de> Visitor<'de> for V {
            type Value = StringMatch;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string match: !Exact, !Prefix, !Suffix or !Presence")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<StringMatch, E> {
                match v {
                    "Presence" => Ok(StringMatch::Presence),
                    _ => Err(E::custom(format!(
                        "string match {v:?} has no tag; write `!Exact {v}` (or !Prefix, !Suffix)"
                    ))),
                }
            }
            fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<StringMatch, A::Error> {
                let (tag, variant): (String, _) = data.variant()?;
                if tag == "Presence" {
                    // Istio's `Presence()` carries nothing: accept `!Presence`, `!Presence []`...
                    variant.newtype_variant::<IgnoredAny>()?;
                    return build(&tag, None);
                }
                if !STRING_MATCH_VARIANTS.contains(&tag.as_str()) {
                    return Err(de::Error::unknown_variant(&tag, STRING_MATCH_VARIANTS));
                }
                let value: String = variant.newtype_variant()?;
                build(&tag, Some(value))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<StringMatch, A::Error> {
                let tag: String = map
                    .next_key()?
                    .ok_or_else(|| de::Error::custom("empty string match"))?;
                let out = if tag == "Presence" {
                    map.next_value::<IgnoredAny>()?;
                    build(&tag, None)?
                } else {
                    build(&tag, Some(map.next_value::<String>()?))?
                };
                if map.next_key::<IgnoredAny>()?.is_some() {
                    return Err(de::Error::custom("a string match has exactly one kind"));
                }
                Ok(out)
            }
        }
        d.deserialize_any(V)
    }
}

/// `{namespace, serviceAccount}`: matches a source identity regardless of trust domain.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAccountMatch {
    /// Namespace of the source identity.
    pub namespace: String,
    /// Service account of the source identity.
    pub service_account: String,
}

impl ServiceAccountMatch {
    /// Whether `id` has this namespace and service account, in any trust domain.
    pub fn matches(&self, id: &Identity) -> bool {
        id.namespace == self.namespace && id.service_account == self.service_account
    }
}

/// Which workloads a policy applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Scope {
    /// Every workload (Istio sends this for policies in the root namespace).
    Global,
    /// Workloads in the policy's namespace.
    Namespace,
    /// Workloads that list the policy in their `authorizationPolicies`.
    WorkloadSelector,
}

/// What a policy does to the connections it matches (`action: Allow|Deny`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Action {
    /// Let matching connections through; once an enforced (not dry-run) ALLOW policy applies
    /// to a workload, connections no such policy matches are refused. `ALLOW` is accepted too.
    #[serde(alias = "ALLOW")]
    Allow,
    /// Refuse matching connections; checked before any ALLOW policy. `DENY` is accepted too.
    #[serde(alias = "DENY")]
    Deny,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::Allow => "ALLOW",
            Action::Deny => "DENY",
        })
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scope::Global => "Global",
            Scope::Namespace => "Namespace",
            Scope::WorkloadSelector => "WorkloadSelector",
        })
    }
}

/// One match: every populated field must hold, and no `not*` field may hit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RbacMatch {
    /// `namespaces`: the source identity's namespace must match one of these (fails
    /// without an identity, i.e. for plaintext).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub namespaces: Vec<StringMatch>,
    /// `notNamespaces`: the source identity's namespace must match none of these.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub not_namespaces: Vec<StringMatch>,
    /// `serviceAccounts`: the source identity must be one of these service accounts
    /// (fails without an identity).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub service_accounts: Vec<ServiceAccountMatch>,
    /// `notServiceAccounts`: the source identity must be none of these service accounts.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub not_service_accounts: Vec<ServiceAccountMatch>,
    /// `principals`: the source principal (`<trust domain>/ns/<ns>/sa/<sa>`, without
    /// `spiffe://`) must match one of these (fails without an identity).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub principals: Vec<StringMatch>,
    /// `notPrincipals`: the source principal must match none of these.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub not_principals: Vec<StringMatch>,
    /// `sourceIps`: the source IP must be in one of these CIDRs.
    #[serde(default, with = "cidr_list", skip_serializing_if = "Vec::is_empty")]
    pub source_ips: Vec<IpNet>,
    /// `notSourceIps`: the source IP must be in none of these CIDRs.
    #[serde(default, with = "cidr_list", skip_serializing_if = "Vec::is_empty")]
    pub not_source_ips: Vec<IpNet>,
    /// `destinationIps`: the destination IP must be in one of these CIDRs.
    #[serde(default, with = "cidr_list", skip_serializing_if = "Vec::is_empty")]
    pub destination_ips: Vec<IpNet>,
    /// `notDestinationIps`: the destination IP must be in none of these CIDRs.
    #[serde(default, with = "cidr_list", skip_serializing_if = "Vec::is_empty")]
    pub not_destination_ips: Vec<IpNet>,
    /// `destinationPorts`: the destination port must be one of these.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub destination_ports: Vec<u16>,
    /// `notDestinationPorts`: the destination port must be none of these.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub not_destination_ports: Vec<u16>,
}

impl RbacMatch {
    /// An empty match constrains nothing; Istio treats it as matching nothing (it is
    /// skipped), so a clause made only of empty matches fails.
    pub fn is_empty(&self) -> bool {
        *self == RbacMatch::default()
    }

    fn matches(&self, conn: &ConnectionAttrs) -> bool {
        let id = conn.src_identity.as_ref();
        // Identity-based predicates are false without an identity: the positive list
        // fails and the negative list does not hit (Istio's behaviour for plaintext).
        let principal = id.map(|i| i.principal());
        let ns_match = |m: &StringMatch| id.is_some_and(|i| m.matches(&i.namespace));
        let sa_match = |m: &ServiceAccountMatch| id.is_some_and(|i| m.matches(i));
        let principal_match = |m: &StringMatch| principal.as_deref().is_some_and(|p| m.matches(p));
        let dst_ip = conn.dst.ip();
        let dst_port = conn.dst.port();

        field(&self.namespaces, &self.not_namespaces, ns_match)
            && field(&self.service_accounts, &self.not_service_accounts, sa_match)
            && field(&self.principals, &self.not_principals, principal_match)
            && field(&self.source_ips, &self.not_source_ips, |n| {
                n.contains(&conn.src_ip)
            })
            && field(&self.destination_ips, &self.not_destination_ips, |n| {
                n.contains(&dst_ip)
            })
            && field(&self.destination_ports, &self.not_destination_ports, |p| {
                *p == dst_port
            })
    }
}

/// One field pair: the positive list (if any) must hit, the negative list must not.
fn field<T>(positive: &[T], negative: &[T], mut hit: impl FnMut(&T) -> bool) -> bool {
    (positive.is_empty() || positive.iter().any(&mut hit)) && !negative.iter().any(hit)
}

/// An L4 authorization policy, source-neutral.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Authorization {
    /// Policy name (e.g. the AuthorizationPolicy's `metadata.name`).
    pub name: String,
    /// Namespace the policy lives in; with `name` it forms the policy's key.
    #[serde(default)]
    pub namespace: String,
    /// Which workloads the policy applies to: Global, Namespace or WorkloadSelector.
    pub scope: Scope,
    /// Whether a match allows or denies the connection.
    pub action: Action,
    /// Rules (any) -> clauses (all) -> matches (any). No rules: the policy matches nothing.
    #[serde(default, deserialize_with = "null_as_default")]
    pub rules: Vec<Vec<Vec<RbacMatch>>>,
    /// Istio's `istio.io/dry-run`: evaluated and logged, never enforced.
    #[serde(default)]
    pub dry_run: bool,
    /// How the source policy was changed to fit L4 (e.g. HTTP attributes dropped), so
    /// `/config_dump` shows what is really enforced. Never affects matching.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub warnings: Vec<String>,
}

impl Authorization {
    /// `namespace/name`, how workloads reference the policy.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether the connection matches this policy (regardless of its action).
    pub fn matches(&self, conn: &ConnectionAttrs) -> bool {
        self.rules.iter().any(|rule| {
            rule.iter().all(|clause| {
                // An empty clause holds; otherwise one non-empty match in it must hold.
                clause.is_empty() || clause.iter().any(|m| !m.is_empty() && m.matches(conn))
            })
        })
    }
}

/// What policy is evaluated against. `src_identity` None = plaintext (no peer identity).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConnectionAttrs {
    /// The peer's identity from its HBONE client certificate; `None` for plaintext.
    pub src_identity: Option<Identity>,
    /// The connection's source IP.
    pub src_ip: IpAddr,
    /// The destination workload address and port the connection is for.
    pub dst: SocketAddr,
}

impl fmt::Display for ConnectionAttrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.src_identity {
            Some(id) => write!(f, "{}({})->{}", self.src_ip, id.principal(), self.dst),
            None => write!(f, "{}(plaintext)->{}", self.src_ip, self.dst),
        }
    }
}

/// Istio's name for the policy that refuses plaintext under an effective STRICT
/// PeerAuthentication (in the root namespace; workloads under STRICT list it).
pub const STATIC_STRICT_POLICY: &str = "istio_converted_static_strict";
/// Prefix of a PeerAuthentication converted with port-level exceptions.
pub const CONVERTED_PEER_AUTHN_PREFIX: &str = "converted_peer_authentication_";

/// Whether a policy key (`namespace/name`) names a converted PeerAuthentication, i.e. a
/// denial by it is a STRICT mTLS refusal rather than an AuthorizationPolicy's.
pub fn is_peer_authentication(key: &str) -> bool {
    let name = key.rsplit_once('/').map_or(key, |(_, n)| n);
    name == STATIC_STRICT_POLICY || name.starts_with(CONVERTED_PEER_AUTHN_PREFIX)
}

/// Why a connection was refused (HBONE answers 401, plaintext is closed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// A DENY policy matched; holds its `namespace/name` key.
    #[error("denied by policy {0}")]
    ByDeny(String),
    /// ALLOW policies apply to the destination, but none matched.
    #[error("no ALLOW policy matched")]
    NoAllowMatch,
}

impl Denied {
    /// The `ztunnel_errors_total` reason: `strict_mtls` for a STRICT PeerAuthentication
    /// refusing plaintext, `policy_denied` otherwise.
    pub fn reason(&self) -> &'static str {
        match self {
            Denied::ByDeny(key) if is_peer_authentication(key) => "strict_mtls",
            _ => "policy_denied",
        }
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
