//! Node authorization: may this caller have a certificate for that identity?
//!
//! A node proxy (ztunnel) asks for the identities of the pods it serves. It may,
//! only if: its service account is trusted for this; the requested identity is a
//! SPIFFE id of this trust domain; its token is bound to a pod that still exists
//! with the same UID and service account; and a pod with the requested identity
//! runs on that pod's node. So a compromised node can mint only the identities of
//! pods scheduled on it.

use std::collections::HashSet;

use shared_types::identity::Identity;

use super::authn::Caller;
use crate::kube::pods::PodIndex;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthzError {
    #[error("{0} may not impersonate other identities (not in CA_TRUSTED_NODE_ACCOUNTS)")]
    UntrustedCaller(Identity),
    #[error("the requested identity {0:?} is not a SPIFFE id of this trust domain")]
    BadIdentity(String),
    #[error("impersonation needs a token bound to the caller's pod")]
    NotPodBound,
    #[error("the caller's pod {0} is gone, or now belongs to another service account")]
    CallerPodGone(String),
    #[error("no pod with identity {identity} runs on node {node}")]
    NoPodOnNode { identity: Identity, node: String },
}

impl AuthzError {
    pub fn reason(&self) -> &'static str {
        match self {
            AuthzError::UntrustedCaller(_) => "untrusted_caller",
            AuthzError::BadIdentity(_) => "bad_identity",
            AuthzError::NotPodBound => "not_pod_bound",
            AuthzError::CallerPodGone(_) => "caller_pod_gone",
            AuthzError::NoPodOnNode { .. } => "no_pod_on_node",
        }
    }
}

/// `CA_TRUSTED_NODE_ACCOUNTS`: `namespace/name` entries, as (namespace, name);
/// malformed ones are refused up front.
pub fn node_accounts(trusted: &[String]) -> Result<HashSet<(String, String)>, String> {
    trusted
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(|s| match s.split_once('/') {
            Some((ns, sa)) if !ns.is_empty() && !sa.is_empty() && !sa.contains('/') => {
                Ok((ns.to_owned(), sa.to_owned()))
            }
            _ => Err(format!(
                "CA_TRUSTED_NODE_ACCOUNTS: {s:?} is not <namespace>/<service-account>"
            )),
        })
        .collect()
}

pub struct NodeAuthorizer {
    /// (namespace, service account)
    trusted: HashSet<(String, String)>,
    trust_domain: String,
    pods: PodIndex,
}

impl NodeAuthorizer {
    pub fn new(trusted: HashSet<(String, String)>, trust_domain: String, pods: PodIndex) -> Self {
        NodeAuthorizer {
            trusted,
            trust_domain,
            pods,
        }
    }

    /// The identity to issue for, if `caller` may have `requested`.
    pub fn authorize(&self, caller: &Caller, requested: &str) -> Result<Identity, AuthzError> {
        let me = &caller.identity;
        if !self
            .trusted
            .contains(&(me.namespace.clone(), me.service_account.clone()))
        {
            return Err(AuthzError::UntrustedCaller(me.clone()));
        }
        let identity: Identity = requested
            .parse()
            .map_err(|_| AuthzError::BadIdentity(requested.to_owned()))?;
        if identity.trust_domain != self.trust_domain {
            return Err(AuthzError::BadIdentity(requested.to_owned()));
        }
        let bound = caller.pod.as_ref().ok_or(AuthzError::NotPodBound)?;
        let pod = self
            .pods
            .get(&me.namespace, &bound.name)
            .filter(|p| p.uid == bound.uid && p.service_account == me.service_account)
            .ok_or_else(|| AuthzError::CallerPodGone(format!("{}/{}", me.namespace, bound.name)))?;
        if !self
            .pods
            .identity_on_node(&pod.node, &identity.namespace, &identity.service_account)
        {
            return Err(AuthzError::NoPodOnNode {
                identity,
                node: pod.node,
            });
        }
        Ok(identity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::authn::BoundPod;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    fn pod(ns: &str, name: &str, uid: &str, sa: &str, node: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name, "uid": uid},
            "spec": {"serviceAccountName": sa, "nodeName": node, "containers": []},
        }))
        .unwrap()
    }

    fn setup() -> NodeAuthorizer {
        let pods = PodIndex::default();
        pods.replace_all(&[
            pod("istio-system", "ztunnel-1", "z1", "ztunnel", "n1"),
            pod("istio-system", "ztunnel-2", "z2", "ztunnel", "n2"),
            pod("app", "client", "c1", "client", "n1"),
            pod("app", "server", "s1", "server", "n2"),
        ]);
        NodeAuthorizer::new(
            node_accounts(&["istio-system/ztunnel".into()]).unwrap(),
            "cluster.local".into(),
            pods,
        )
    }

    fn caller(ns: &str, sa: &str, pod: Option<(&str, &str)>) -> Caller {
        Caller {
            identity: Identity::new("cluster.local", ns, sa),
            pod: pod.map(|(name, uid)| BoundPod {
                name: name.into(),
                uid: uid.into(),
            }),
        }
    }

    const CLIENT: &str = "spiffe://cluster.local/ns/app/sa/client";

    #[test]
    fn a_node_proxy_gets_the_identities_of_its_own_pods_only() {
        let authz = setup();
        let z1 = caller("istio-system", "ztunnel", Some(("ztunnel-1", "z1")));
        assert_eq!(authz.authorize(&z1, CLIENT).unwrap().to_uri(), CLIENT);
        let err = authz
            .authorize(&z1, "spiffe://cluster.local/ns/app/sa/server")
            .unwrap_err();
        assert_eq!(err.reason(), "no_pod_on_node");
    }

    #[test]
    fn every_refusal_has_its_reason() {
        let authz = setup();
        let cases = [
            (
                caller("app", "client", Some(("client", "c1"))),
                CLIENT,
                "untrusted_caller",
            ),
            (
                caller("istio-system", "ztunnel", None),
                CLIENT,
                "not_pod_bound",
            ),
            (
                caller("istio-system", "ztunnel", Some(("ztunnel-1", "old-uid"))),
                CLIENT,
                "caller_pod_gone",
            ),
            (
                caller("istio-system", "ztunnel", Some(("ztunnel-9", "z9"))),
                CLIENT,
                "caller_pod_gone",
            ),
            (
                caller("istio-system", "ztunnel", Some(("ztunnel-1", "z1"))),
                "spiffe://other.td/ns/app/sa/client",
                "bad_identity",
            ),
            (
                caller("istio-system", "ztunnel", Some(("ztunnel-1", "z1"))),
                "not-an-id",
                "bad_identity",
            ),
        ];
        for (caller, requested, reason) in cases {
            let err = authz.authorize(&caller, requested).unwrap_err();
            assert_eq!(err.reason(), reason, "{caller:?} {requested}: {err}");
        }
    }

    #[test]
    fn empty_trust_list_refuses_all_and_bad_entries_are_errors() {
        let none = NodeAuthorizer::new(
            node_accounts(&[]).unwrap(),
            "cluster.local".into(),
            PodIndex::default(),
        );
        let z1 = caller("istio-system", "ztunnel", Some(("ztunnel-1", "z1")));
        assert_eq!(
            none.authorize(&z1, CLIENT).unwrap_err().reason(),
            "untrusted_caller"
        );
        assert!(node_accounts(&["ztunnel".into()]).is_err());
    }
}
