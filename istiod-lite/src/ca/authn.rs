//! Who is calling: the bearer token, checked by the API server (TokenReview).
//!
//! As istiod does it: `authorization: Bearer <token>` and `clusterid` from the
//! request metadata, a TokenReview with the accepted audiences, and the reviewed
//! username `system:serviceaccount:<ns>:<sa>` as the caller's identity. Why a
//! token was refused is worked out only after the API server refused it, from
//! the token's own claims, so the reason counted says what to fix.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::PostParams;
use kube::{Api, Client};
use serde::Deserialize;
use shared_types::identity::Identity;
use shared_types::istio::metadata;
use tonic::metadata::MetadataMap;

use crate::kube::pods::PodIndex;

const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";
const POD_UID_EXTRA: &str = "authentication.kubernetes.io/pod-uid";
/// A reviewed token is trusted this long without asking again: certificate
/// bursts (a node starting) cost one review per token, not one per pod. Bound
/// pods are still checked against the pod index on every request.
const REVIEW_CACHE_TTL: Duration = Duration::from_secs(30);
const REVIEW_CACHE_MAX: usize = 10_000;

/// The authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub identity: Identity,
    /// The pod the token is bound to, if it is bound to one.
    pub pod: Option<BoundPod>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundPod {
    pub name: String,
    pub uid: String,
}

/// Why a caller was not authenticated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthnError {
    #[error("no bearer token in the `authorization` metadata")]
    NoToken,
    #[error("the caller names cluster {0:?}, but this control plane serves only its own")]
    UnknownCluster(String),
    #[error("the token is not for any accepted audience ({0})")]
    WrongAudience(String),
    #[error("the token has expired")]
    Expired,
    #[error("the pod the token is bound to no longer exists (or was replaced)")]
    BoundPodGone,
    #[error("the token was not accepted: {0}")]
    InvalidToken(String),
    #[error("the token could not be reviewed (API server): {0}")]
    Review(String),
}

impl AuthnError {
    pub fn reason(&self) -> &'static str {
        match self {
            AuthnError::NoToken => "no_token",
            AuthnError::UnknownCluster(_) => "unknown_cluster",
            AuthnError::WrongAudience(_) => "wrong_audience",
            AuthnError::Expired => "expired_token",
            AuthnError::BoundPodGone => "bound_pod_gone",
            AuthnError::InvalidToken(_) => "invalid_token",
            AuthnError::Review(_) => "review_failed",
        }
    }
}

pub struct TokenAuthenticator {
    client: Client,
    audiences: Vec<String>,
    cluster_id: String,
    trust_domain: String,
    pods: PodIndex,
    /// Reviewed tokens and until when their review holds.
    cache: Mutex<HashMap<String, (Caller, Instant)>>,
}

impl TokenAuthenticator {
    pub fn new(
        client: Client,
        audiences: Vec<String>,
        cluster_id: String,
        trust_domain: String,
        pods: PodIndex,
    ) -> Self {
        TokenAuthenticator {
            client,
            audiences,
            cluster_id,
            trust_domain,
            pods,
            cache: Mutex::default(),
        }
    }

    pub async fn authenticate(&self, md: &MetadataMap) -> Result<Caller, AuthnError> {
        if let Some(cluster) = md.get(metadata::CLUSTER_ID).and_then(|v| v.to_str().ok()) {
            // Empty means "this cluster", as in Istio.
            if !cluster.is_empty() && cluster != self.cluster_id {
                return Err(AuthnError::UnknownCluster(cluster.to_owned()));
            }
        }
        let token = md
            .get(metadata::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(AuthnError::NoToken)?;
        let caller = match self.cached(token) {
            Some(caller) => caller,
            None => {
                let caller = self.review(token).await?;
                self.remember(token, &caller);
                caller
            }
        };
        // A cached review must not outlive the pod its token is bound to.
        if let Some(pod) = &caller.pod {
            let alive = self
                .pods
                .get(&caller.identity.namespace, &pod.name)
                .is_some_and(|p| p.uid == pod.uid);
            if !alive {
                return Err(AuthnError::BoundPodGone);
            }
        }
        Ok(caller)
    }

    async fn review(&self, token: &str) -> Result<Caller, AuthnError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: Some(self.audiences.clone()),
            },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let status = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| AuthnError::Review(e.to_string()))?
            .status
            .unwrap_or_default();
        if status.authenticated != Some(true) {
            let error = status.error.unwrap_or_else(|| "not authenticated".into());
            return Err(self.why_refused(token, error));
        }
        let user = status.user.unwrap_or_default();
        let username = user.username.unwrap_or_default();
        let identity =
            service_account_identity(&self.trust_domain, &username).ok_or_else(|| {
                AuthnError::InvalidToken(format!("{username:?} is not a service account"))
            })?;
        let extra = user.extra.unwrap_or_default();
        let first = |key: &str| extra.get(key).and_then(|v| v.first()).cloned();
        let pod = match (first(POD_NAME_EXTRA), first(POD_UID_EXTRA)) {
            (Some(name), Some(uid)) => Some(BoundPod { name, uid }),
            _ => None,
        };
        Ok(Caller { identity, pod })
    }

    /// The API server said no; the token's claims say why (they are only read,
    /// never trusted, here).
    fn why_refused(&self, token: &str, error: String) -> AuthnError {
        let Some(claims) = Claims::peek(token) else {
            return AuthnError::InvalidToken(error);
        };
        if claims.exp.is_some_and(|exp| exp <= unix_now()) {
            return AuthnError::Expired;
        }
        if !claims.aud.iter().any(|a| self.audiences.contains(a)) {
            return AuthnError::WrongAudience(claims.aud.join(","));
        }
        if let Some(k8s) = &claims.kubernetes {
            if let Some(pod) = &k8s.pod {
                let alive = self
                    .pods
                    .get(&k8s.namespace, &pod.name)
                    .is_some_and(|p| p.uid == pod.uid);
                if !alive {
                    return AuthnError::BoundPodGone;
                }
            }
        }
        AuthnError::InvalidToken(error)
    }

    fn cached(&self, token: &str) -> Option<Caller> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let (caller, until) = cache.get(token)?;
        (Instant::now() < *until).then(|| caller.clone())
    }

    fn remember(&self, token: &str, caller: &Caller) {
        let now = Instant::now();
        let until = now + review_ttl(token, unix_now());
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= REVIEW_CACHE_MAX {
            cache.retain(|_, (_, until)| *until > now);
            if cache.len() >= REVIEW_CACHE_MAX {
                cache.clear();
            }
        }
        cache.insert(token.to_owned(), (caller.clone(), until));
    }
}

/// How long a positive review of `token` is reused: [`REVIEW_CACHE_TTL`], but never
/// past the token's own expiry (the API server has vouched for the token, so its
/// `exp` claim can be believed).
fn review_ttl(token: &str, now_unix: u64) -> Duration {
    match Claims::peek(token).and_then(|c| c.exp) {
        Some(exp) => Duration::from_secs(exp.saturating_sub(now_unix)).min(REVIEW_CACHE_TTL),
        None => REVIEW_CACHE_TTL,
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `system:serviceaccount:<ns>:<sa>` → `spiffe://<td>/ns/<ns>/sa/<sa>`.
pub fn service_account_identity(trust_domain: &str, username: &str) -> Option<Identity> {
    let rest = username.strip_prefix("system:serviceaccount:")?;
    let (ns, sa) = rest.split_once(':')?;
    let id = Identity::new(trust_domain, ns, sa);
    // Only names that make a valid SPIFFE id.
    id.to_uri().parse::<Identity>().ok()
}

/// The claims of a Kubernetes service-account JWT that explain a refusal.
/// `pub` (with [`Claims::peek`]) for the fuzz target (fuzz/fuzz_targets/jwt_claims.rs).
#[derive(Debug, Default, Deserialize)]
pub struct Claims {
    pub exp: Option<u64>,
    #[serde(default, deserialize_with = "one_or_many")]
    pub aud: Vec<String>,
    #[serde(rename = "kubernetes.io")]
    pub kubernetes: Option<KubernetesClaims>,
}

#[derive(Debug, Deserialize)]
pub struct KubernetesClaims {
    #[serde(default)]
    pub namespace: String,
    pub pod: Option<PodClaim>,
}

#[derive(Debug, Deserialize)]
pub struct PodClaim {
    pub name: String,
    pub uid: String,
}

impl Claims {
    /// Decodes the payload without verifying it (the API server verified, and refused).
    pub fn peek(token: &str) -> Option<Claims> {
        let payload = token.split('.').nth(1)?;
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload.trim_end_matches('='))
            .ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: serde_json::Value) -> String {
        let enc = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        format!(
            "{}.{}.sig",
            enc(br#"{"alg":"ES256"}"#),
            enc(claims.to_string().as_bytes())
        )
    }

    #[test]
    fn usernames_map_to_spiffe_ids() {
        let id = service_account_identity(
            "cluster.local",
            "system:serviceaccount:istio-system:ztunnel",
        );
        assert_eq!(
            id.unwrap().to_uri(),
            "spiffe://cluster.local/ns/istio-system/sa/ztunnel"
        );
        assert!(service_account_identity("cluster.local", "system:node:n1").is_none());
        assert!(service_account_identity("cluster.local", "system:serviceaccount:a").is_none());
        assert!(service_account_identity("cluster.local", "system:serviceaccount:a/b:c").is_none());
    }

    #[test]
    fn claims_are_read_leniently() {
        let c = Claims::peek(&jwt(serde_json::json!({"aud": "x", "exp": 5}))).unwrap();
        assert_eq!(c.aud, ["x"]);
        assert_eq!(c.exp, Some(5));
        let c = Claims::peek(&jwt(serde_json::json!({
            "aud": ["a", "b"],
            "kubernetes.io": {"namespace": "ns", "pod": {"name": "p", "uid": "u"}}
        })))
        .unwrap();
        assert_eq!(c.kubernetes.unwrap().pod.unwrap().uid, "u");
        assert!(Claims::peek("garbage").is_none());
        assert!(Claims::peek("a.!!!.c").is_none());
    }

    #[test]
    fn a_review_is_reused_no_longer_than_the_token_lives() {
        let expiring = |exp: u64| jwt(serde_json::json!({"aud": "istio-ca", "exp": exp}));
        assert_eq!(
            review_ttl(&expiring(1_000_005), 1_000_000),
            Duration::from_secs(5)
        );
        assert_eq!(review_ttl(&expiring(1_000_000), 1_000_000), Duration::ZERO);
        assert_eq!(
            review_ttl(&expiring(2_000_000), 1_000_000),
            REVIEW_CACHE_TTL
        );
        assert_eq!(
            review_ttl(&jwt(serde_json::json!({})), 1_000_000),
            REVIEW_CACHE_TTL
        );
    }
}
