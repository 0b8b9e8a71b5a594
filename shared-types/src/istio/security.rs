//! `istio.security` (Istio's `authorization.proto`): the L4 `Authorization` resources
//! istiod sends ztunnels over delta xDS, with Istio's field numbers. The resource
//! name is `namespace/name`.

use prost::{Enumeration, Message};

/// `type.googleapis.com/istio.security.Authorization`.
pub const AUTHORIZATION_TYPE_URL: &str = "type.googleapis.com/istio.security.Authorization";

#[derive(Clone, PartialEq, Message)]
pub struct Authorization {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub namespace: String,
    #[prost(enumeration = "Scope", tag = "3")]
    pub scope: i32,
    #[prost(enumeration = "Action", tag = "4")]
    pub action: i32,
    /// Any rule matches the policy.
    #[prost(message, repeated, tag = "5")]
    pub rules: Vec<Rule>,
    #[prost(bool, tag = "6")]
    pub dry_run: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
#[repr(i32)]
pub enum Scope {
    Global = 0,
    Namespace = 1,
    WorkloadSelector = 2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
#[repr(i32)]
pub enum Action {
    Allow = 0,
    Deny = 1,
}

/// Every clause must hold.
#[derive(Clone, PartialEq, Message)]
pub struct Rule {
    #[prost(message, repeated, tag = "1")]
    pub clauses: Vec<Clause>,
}

/// Any match holds the clause.
#[derive(Clone, PartialEq, Message)]
pub struct Clause {
    #[prost(message, repeated, tag = "2")]
    pub matches: Vec<Match>,
}

/// Every populated field must hold; no `not_*` field may hit.
#[derive(Clone, PartialEq, Message)]
pub struct Match {
    #[prost(message, repeated, tag = "1")]
    pub namespaces: Vec<StringMatch>,
    #[prost(message, repeated, tag = "2")]
    pub not_namespaces: Vec<StringMatch>,
    #[prost(message, repeated, tag = "3")]
    pub principals: Vec<StringMatch>,
    #[prost(message, repeated, tag = "4")]
    pub not_principals: Vec<StringMatch>,
    #[prost(message, repeated, tag = "5")]
    pub source_ips: Vec<Address>,
    #[prost(message, repeated, tag = "6")]
    pub not_source_ips: Vec<Address>,
    #[prost(message, repeated, tag = "7")]
    pub destination_ips: Vec<Address>,
    #[prost(message, repeated, tag = "8")]
    pub not_destination_ips: Vec<Address>,
    #[prost(uint32, repeated, tag = "9")]
    pub destination_ports: Vec<u32>,
    #[prost(uint32, repeated, tag = "10")]
    pub not_destination_ports: Vec<u32>,
    #[prost(message, repeated, tag = "11")]
    pub service_accounts: Vec<ServiceAccountMatch>,
    #[prost(message, repeated, tag = "12")]
    pub not_service_accounts: Vec<ServiceAccountMatch>,
}

/// A CIDR: 4 or 16 address bytes and a prefix length.
#[derive(Clone, PartialEq, Message)]
pub struct Address {
    #[prost(bytes = "vec", tag = "1")]
    pub address: Vec<u8>,
    #[prost(uint32, tag = "2")]
    pub length: u32,
}

#[derive(Clone, PartialEq, Message)]
pub struct ServiceAccountMatch {
    #[prost(string, tag = "1")]
    pub namespace: String,
    #[prost(string, tag = "2")]
    pub service_account: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct StringMatch {
    #[prost(oneof = "string_match::MatchType", tags = "1, 2, 3, 4")]
    pub match_type: Option<string_match::MatchType>,
}

pub mod string_match {
    use prost::Oneof;

    #[derive(Clone, PartialEq, Oneof)]
    pub enum MatchType {
        #[prost(string, tag = "1")]
        Exact(String),
        #[prost(string, tag = "2")]
        Prefix(String),
        #[prost(string, tag = "3")]
        Suffix(String),
        /// Any non-empty value (`google.protobuf.Empty`).
        #[prost(message, tag = "4")]
        Presence(()),
    }
}
