//! `istio.security` (Istio's `authorization.proto`): the L4 `Authorization` resources
//! istiod sends ztunnels over delta xDS, with Istio's field numbers. The resource
//! name is `namespace/name`.

use prost::{Enumeration, Message};

/// `type.googleapis.com/istio.security.Authorization`.
pub const AUTHORIZATION_TYPE_URL: &str = "type.googleapis.com/istio.security.Authorization";

/// An L4 authorization policy, as istiod derives it from an `AuthorizationPolicy` (or
/// from a STRICT `PeerAuthentication`).
#[derive(Clone, PartialEq, Message)]
pub struct Authorization {
    /// Name of the source policy.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Namespace of the source policy; with [`Scope::Namespace`], the namespace it applies to.
    #[prost(string, tag = "2")]
    pub namespace: String,
    /// Which workloads the policy applies to ([`Scope`]).
    #[prost(enumeration = "Scope", tag = "3")]
    pub scope: i32,
    /// What to do when a rule matches ([`Action`]); `Allow` when unset.
    #[prost(enumeration = "Action", tag = "4")]
    pub action: i32,
    /// Any rule matches the policy.
    #[prost(message, repeated, tag = "5")]
    pub rules: Vec<Rule>,
    /// Dry run (`istio.io/dry-run`): the policy is evaluated and logged, never enforced.
    #[prost(bool, tag = "6")]
    pub dry_run: bool,
}

/// Which workloads a policy applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
#[repr(i32)]
pub enum Scope {
    /// Every workload in the mesh, in any namespace.
    Global = 0,
    /// Every workload in the policy's namespace.
    Namespace = 1,
    /// Only the workloads its selector picks; they list the policy in their
    /// `authorization_policies`.
    WorkloadSelector = 2,
}

/// What a policy does with a connection its rules match.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
#[repr(i32)]
pub enum Action {
    /// Allow the connection.
    Allow = 0,
    /// Deny the connection.
    Deny = 1,
}

/// Every clause must hold.
#[derive(Clone, PartialEq, Message)]
pub struct Rule {
    /// The clauses, derived from the source rule's `from`, `to` and `when`.
    #[prost(message, repeated, tag = "1")]
    pub clauses: Vec<Clause>,
}

/// Any match holds the clause.
#[derive(Clone, PartialEq, Message)]
pub struct Clause {
    /// The alternative matches.
    #[prost(message, repeated, tag = "2")]
    pub matches: Vec<Match>,
}

/// Every populated field must hold; no `not_*` field may hit.
#[derive(Clone, PartialEq, Message)]
pub struct Match {
    /// Source namespaces; one must match.
    #[prost(message, repeated, tag = "1")]
    pub namespaces: Vec<StringMatch>,
    /// Source namespaces none of which may match.
    #[prost(message, repeated, tag = "2")]
    pub not_namespaces: Vec<StringMatch>,
    /// Source principals (`<trust-domain>/ns/<namespace>/sa/<account>`); one must match.
    #[prost(message, repeated, tag = "3")]
    pub principals: Vec<StringMatch>,
    /// Source principals none of which may match.
    #[prost(message, repeated, tag = "4")]
    pub not_principals: Vec<StringMatch>,
    /// Source CIDRs; one must contain the client's address.
    #[prost(message, repeated, tag = "5")]
    pub source_ips: Vec<Address>,
    /// Source CIDRs none of which may contain the client's address.
    #[prost(message, repeated, tag = "6")]
    pub not_source_ips: Vec<Address>,
    /// Destination CIDRs; one must contain the destination address.
    #[prost(message, repeated, tag = "7")]
    pub destination_ips: Vec<Address>,
    /// Destination CIDRs none of which may contain the destination address.
    #[prost(message, repeated, tag = "8")]
    pub not_destination_ips: Vec<Address>,
    /// Destination ports; one must match.
    #[prost(uint32, repeated, tag = "9")]
    pub destination_ports: Vec<u32>,
    /// Destination ports none of which may match.
    #[prost(uint32, repeated, tag = "10")]
    pub not_destination_ports: Vec<u32>,
    /// Source service accounts; one must match.
    #[prost(message, repeated, tag = "11")]
    pub service_accounts: Vec<ServiceAccountMatch>,
    /// Source service accounts none of which may match.
    #[prost(message, repeated, tag = "12")]
    pub not_service_accounts: Vec<ServiceAccountMatch>,
}

/// A CIDR: 4 or 16 address bytes and a prefix length.
#[derive(Clone, PartialEq, Message)]
pub struct Address {
    /// The network address, 4 (IPv4) or 16 (IPv6) bytes.
    #[prost(bytes = "vec", tag = "1")]
    pub address: Vec<u8>,
    /// Prefix length in bits.
    #[prost(uint32, tag = "2")]
    pub length: u32,
}

/// A service account, by namespace and name, matched against the source's identity.
#[derive(Clone, PartialEq, Message)]
pub struct ServiceAccountMatch {
    /// Namespace of the service account.
    #[prost(string, tag = "1")]
    pub namespace: String,
    /// Name of the service account.
    #[prost(string, tag = "2")]
    pub service_account: String,
}

/// A condition on a string: exact, prefix, suffix or presence.
#[derive(Clone, PartialEq, Message)]
pub struct StringMatch {
    /// The kind of comparison and its operand.
    #[prost(oneof = "string_match::MatchType", tags = "1, 2, 3, 4")]
    pub match_type: Option<string_match::MatchType>,
}

/// Types nested in [`StringMatch`].
pub mod string_match {
    use prost::Oneof;

    /// How a [`StringMatch`](super::StringMatch) compares.
    #[derive(Clone, PartialEq, Oneof)]
    pub enum MatchType {
        /// Equal to this string.
        #[prost(string, tag = "1")]
        Exact(String),
        /// Starts with this string.
        #[prost(string, tag = "2")]
        Prefix(String),
        /// Ends with this string.
        #[prost(string, tag = "3")]
        Suffix(String),
        /// Any non-empty value (`google.protobuf.Empty`).
        #[prost(message, tag = "4")]
        Presence(()),
    }
}
