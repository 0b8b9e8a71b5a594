//! Service account tokens, served as the real kube-apiserver serves them: TokenRequest
//! (`POST /api/v1/namespaces/<ns>/serviceaccounts/<name>/token`), TokenReview and
//! SelfSubjectReview (`POST /apis/authentication.k8s.io/v1/...`), and the OIDC discovery
//! documents (`/.well-known/openid-configuration`, `/openid/v1/jwks`).
//!
//! Tokens are ES256 JWTs carrying the claims Kubernetes writes (iss, sub, aud, exp, iat,
//! nbf, jti and `kubernetes.io`). A review checks, in the real authenticator's order, the
//! issuer, the signature, the audiences, the time window (with go-jose's one-minute
//! leeway), and that the service account and a bound pod still exist with the UIDs in the
//! token; failures carry the real server's messages, so istiod-style callers see what a
//! real cluster would tell them. The signing key is generated on first start and, with a
//! state file, kept beside it so tokens stay valid across restarts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use http::{Method, Response};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::errors::{ApiError, ApiResult};
use super::handlers::{decode_body, Ctx};
use super::meta;
use super::resources;
use super::routes::{self, Body};
use super::store::Store;

/// `iss` of the tokens unless configured otherwise (kubeadm's and kind's default); it is
/// also the audience a token gets, and a review expects, when none is named.
pub const DEFAULT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

const GROUP: &str = "authentication.k8s.io";
const API_VERSION: &str = "authentication.k8s.io/v1";
/// `spec.expirationSeconds` when the request leaves it out (the API's default).
const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
/// The real server's validation bounds: 10 minutes to 2^32 seconds.
const MIN_EXPIRATION_SECONDS: i64 = 600;
const MAX_EXPIRATION_SECONDS: i64 = 1 << 32;
/// go-jose's `DefaultLeeway`, which the service account authenticator applies to
/// exp, nbf and iat.
const LEEWAY_SECONDS: i64 = 60;
/// The authenticator's generic failure; specific causes are appended as
/// `[invalid bearer token, <cause>]`, as the real server's error aggregate prints them.
const INVALID: &str = "invalid bearer token";

/// The key file kept beside a state file (`state.json` → `state.sa.key`).
pub fn key_file_beside(state_file: &Path) -> PathBuf {
    state_file.with_extension("sa.key")
}

/// The server's token signer: an ECDSA P-256 key and the issuer it signs as.
pub struct Signer {
    issuer: String,
    kid: String,
    encoding: EncodingKey,
    decoding: DecodingKey,
    /// The uncompressed public point (0x04 || x || y), for the JWKS.
    public: Vec<u8>,
}

impl Signer {
    /// Loads the PKCS#8 PEM key at `key_file`, creating it when missing; without a file
    /// the key lives in memory only (tokens die with the process, as the objects do).
    pub fn open(issuer: String, key_file: Option<&Path>) -> std::io::Result<Signer> {
        let key = match key_file {
            Some(path) if path.exists() => load_key(path)?,
            Some(path) => {
                let key = generate_key()?;
                save_key(path, &key)?;
                key
            }
            None => generate_key()?,
        };
        Ok(Self::from_key(issuer, &key))
    }

    fn from_key(issuer: String, key: &rcgen::KeyPair) -> Signer {
        use rcgen::PublicKeyData;
        // Kubernetes' key id: the unpadded base64url SHA-256 of the DER public key.
        let kid = URL_SAFE_NO_PAD.encode(Sha256::digest(key.subject_public_key_info()));
        let public = key.public_key_raw().to_vec();
        Signer {
            issuer,
            kid,
            encoding: EncodingKey::from_ec_der(&key.serialize_der()),
            decoding: DecodingKey::from_ec_der(&public),
            public,
        }
    }

    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// Signs `claims` as they are (ES256, with the key id in the header, no `typ`, like
    /// Kubernetes' tokens).
    pub fn sign(&self, claims: &Value) -> ApiResult<String> {
        let mut header = Header::new(Algorithm::ES256);
        header.typ = None;
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.encoding)
            .map_err(|e| ApiError::internal(format!("failed to generate token: {e}")))
    }

    /// `/openid/v1/jwks`.
    pub fn jwks(&self) -> Value {
        let coordinate = |range: std::ops::Range<usize>| {
            URL_SAFE_NO_PAD.encode(self.public.get(range).unwrap_or_default())
        };
        json!({"keys": [{
            "use": "sig", "kty": "EC", "kid": self.kid, "crv": "P-256", "alg": "ES256",
            "x": coordinate(1..33), "y": coordinate(33..65),
        }]})
    }

    /// `/.well-known/openid-configuration`; `server_url` is where the JWKS is served.
    pub fn openid_configuration(&self, server_url: &str) -> Value {
        json!({
            "issuer": self.issuer,
            "jwks_uri": format!("{server_url}/openid/v1/jwks"),
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["ES256"],
        })
    }

    fn validation(&self, verify_signature: bool) -> Validation {
        let mut v = Validation::new(Algorithm::ES256);
        // Time and audience are checked below, with the real server's rules and messages.
        v.validate_exp = false;
        v.validate_nbf = false;
        v.validate_aud = false;
        v.required_spec_claims.clear();
        if !verify_signature {
            v.insecure_disable_signature_validation();
        }
        v
    }

    /// Authenticates `token` for `audiences` (empty: the issuer) the way Kubernetes'
    /// service account authenticator does. The error is TokenReview's `status.error`.
    fn authenticate(
        &self,
        store: &Store,
        token: &str,
        audiences: &[String],
    ) -> Result<Authenticated, String> {
        // Not one of our tokens at all: the authenticator declines without a cause.
        let claims: Claims = jsonwebtoken::decode(token, &self.decoding, &self.validation(false))
            .map_err(|_| INVALID.to_string())?
            .claims;
        if claims.iss != self.issuer {
            return Err(INVALID.into());
        }
        let invalid = |cause: String| format!("[{INVALID}, {cause}]");
        jsonwebtoken::decode::<Value>(token, &self.decoding, &self.validation(true))
            .map_err(|_| invalid("go-jose/go-jose: error in cryptographic primitive".into()))?;

        let implicit = vec![self.issuer.clone()];
        let token_auds = if claims.aud.is_empty() {
            &implicit
        } else {
            &claims.aud
        };
        let wanted = if audiences.is_empty() {
            &implicit
        } else {
            audiences
        };
        let granted: Vec<String> = token_auds
            .iter()
            .filter(|a| wanted.contains(a))
            .cloned()
            .collect();
        if granted.is_empty() {
            return Err(invalid(format!(
                "token audiences {} is invalid for the target audiences {}",
                go_quote(token_auds),
                go_quote(wanted)
            )));
        }

        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        if claims.nbf.is_some_and(|nbf| now + LEEWAY_SECONDS < nbf) {
            return Err(invalid("service account token is not valid yet".into()));
        }
        if claims.exp.is_some_and(|exp| now - LEEWAY_SECONDS > exp) {
            return Err(invalid("service account token has expired".into()));
        }
        if claims.iat.is_some_and(|iat| now + LEEWAY_SECONDS < iat) {
            return Err(invalid(
                "service account token is issued in the future".into(),
            ));
        }

        let k8s = claims.kubernetes;
        let ns = k8s.namespace.as_str();
        let sa = &k8s.serviceaccount;
        let Some(account) = get(store, "serviceaccounts", ns, &sa.name) else {
            return Err(invalid(format!("serviceaccounts {:?} not found", sa.name)));
        };
        if uid_of(&account) != sa.uid {
            return Err(invalid(format!(
                "service account UID ({}) does not match claim ({})",
                uid_of(&account),
                sa.uid
            )));
        }
        let mut user = UserInfo::service_account(ns, &sa.name, &sa.uid);
        if let Some(pod_ref) = &k8s.pod {
            // Deleting the pod revokes its tokens; a new pod of the same name is another pod.
            let Some(pod) = get(store, "pods", ns, &pod_ref.name) else {
                return Err(invalid("service account token has been invalidated".into()));
            };
            if uid_of(&pod) != pod_ref.uid {
                return Err(invalid(format!(
                    "pod UID ({}) does not match claim ({})",
                    uid_of(&pod),
                    pod_ref.uid
                )));
            }
            if !pod_ref.name.is_empty() && !pod_ref.uid.is_empty() {
                user.extra("pod-name", &pod_ref.name);
                user.extra("pod-uid", &pod_ref.uid);
            }
            // For a pod-bound token the node is taken from the claims, not looked up.
            if let Some(node) = k8s.node.as_ref().filter(|n| !n.name.is_empty()) {
                user.extra("node-name", &node.name);
                if !node.uid.is_empty() {
                    user.extra("node-uid", &node.uid);
                }
            }
        }
        if let Some(jti) = claims.jti.filter(|j| !j.is_empty()) {
            user.extra("credential-id", &format!("JTI={jti}"));
        }
        Ok(Authenticated {
            user,
            audiences: granted,
        })
    }
}

fn generate_key() -> std::io::Result<rcgen::KeyPair> {
    rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(std::io::Error::other)
}

fn load_key(path: &Path) -> std::io::Result<rcgen::KeyPair> {
    let invalid = |msg: String| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: {msg}", path.display()),
        )
    };
    let pem = std::fs::read_to_string(path)?;
    let key = rcgen::KeyPair::from_pem(&pem).map_err(|e| invalid(e.to_string()))?;
    if key.algorithm() != &rcgen::PKCS_ECDSA_P256_SHA256 {
        return Err(invalid("not an ECDSA P-256 key (PKCS#8 PEM)".into()));
    }
    Ok(key)
}

/// Writes the key readable by its owner only, via a temporary file (never half a key).
fn save_key(path: &Path, key: &rcgen::KeyPair) -> std::io::Result<()> {
    mesh_runtime::fs::write_atomic_with_mode(path, key.serialize_pem().as_bytes(), 0o600)
}

/// Go's `%q` of a string slice (`["a" "b"]`), as the real error messages print audiences.
fn go_quote(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", quoted.join(" "))
}

fn uid_of(obj: &Value) -> &str {
    obj.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// A core/v1 object from the store.
fn get(store: &Store, plural: &str, ns: &str, name: &str) -> Option<Value> {
    store.get(resources::builtin("", "v1", plural)?, ns, name)
}

/// The claims a review reads; other claims are ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Claims {
    iss: String,
    #[serde(deserialize_with = "one_or_many")]
    aud: Vec<String>,
    exp: Option<i64>,
    nbf: Option<i64>,
    iat: Option<i64>,
    jti: Option<String>,
    #[serde(rename = "kubernetes.io")]
    kubernetes: KubernetesClaims,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct KubernetesClaims {
    namespace: String,
    serviceaccount: ObjectRef,
    pod: Option<ObjectRef>,
    node: Option<ObjectRef>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ObjectRef {
    name: String,
    uid: String,
}

/// `aud` may be a single string (RFC 7519), which Kubernetes accepts too.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Aud {
        One(String),
        Many(Vec<String>),
        None(()),
    }
    Ok(match Aud::deserialize(d)? {
        Aud::One(s) => vec![s],
        Aud::Many(v) => v,
        Aud::None(()) => Vec::new(),
    })
}

/// `status.user` of a TokenReview / `status.userInfo` of a SelfSubjectReview.
#[derive(Debug, Clone, PartialEq)]
struct UserInfo {
    username: String,
    uid: String,
    groups: Vec<String>,
    extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    fn service_account(ns: &str, name: &str, uid: &str) -> Self {
        UserInfo {
            username: format!("system:serviceaccount:{ns}:{name}"),
            uid: uid.to_string(),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{ns}"),
                "system:authenticated".into(),
            ],
            extra: BTreeMap::new(),
        }
    }

    /// Who a request without a token is. This server does not authenticate, so such a
    /// caller can do everything: it is shown as the cluster admin, named as k3s names
    /// its admin client certificate ("system:admin" in "system:masters").
    fn admin() -> Self {
        UserInfo {
            username: "system:admin".into(),
            uid: String::new(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
            extra: BTreeMap::new(),
        }
    }

    fn extra(&mut self, key: &str, value: &str) {
        self.extra.insert(
            format!("authentication.kubernetes.io/{key}"),
            vec![value.to_string()],
        );
    }

    fn to_json(&self) -> Value {
        let mut out = json!({"username": self.username, "groups": self.groups});
        if !self.uid.is_empty() {
            out["uid"] = json!(self.uid);
        }
        if !self.extra.is_empty() {
            out["extra"] = json!(self.extra);
        }
        out
    }
}

#[derive(Debug)]
struct Authenticated {
    user: UserInfo,
    audiences: Vec<String>,
}

/// Serves the routes this module owns: `serviceaccounts/<name>/token` and every path of
/// the authentication.k8s.io group. `None` for anything else.
pub(super) fn dispatch(ctx: &Ctx<'_>, method: &Method) -> Option<ApiResult<Response<Body>>> {
    let r = &ctx.route;
    let token_request = r.rs.group.is_empty()
        && r.rs.plural == "serviceaccounts"
        && r.subresource.as_deref() == Some("token");
    if !token_request && r.rs.group != GROUP {
        return None;
    }
    let not_found = ApiError::path_not_found;
    let result = match (token_request, r.rs.plural) {
        _ if method != Method::POST => Err(ApiError::method_not_allowed(method.as_str())),
        (true, _) => match (&r.namespace, &r.name) {
            (Some(ns), Some(name)) => request_token(ctx, ns, name),
            _ => Err(not_found()),
        },
        (false, _) if r.name.is_some() || r.subresource.is_some() => Err(not_found()),
        (false, "tokenreviews") => token_review(ctx),
        (false, "selfsubjectreviews") => self_subject_review(ctx),
        (false, _) => Err(not_found()),
    };
    Some(result)
}

/// The body as an object of `kind` (kind and apiVersion may be left out).
fn body_of(ctx: &Ctx<'_>, kind: &str) -> ApiResult<Value> {
    let body = decode_body(ctx)?;
    if !body.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    if let Some(k) = body.get("kind").and_then(Value::as_str) {
        if k != kind {
            return Err(ApiError::bad_request(format!(
                "the kind in the body ({k}) does not match the resource ({kind})"
            )));
        }
    }
    if let Some(v) = body.get("apiVersion").and_then(Value::as_str) {
        if v != API_VERSION {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({API_VERSION})"
            )));
        }
    }
    Ok(body)
}

fn spec_of<T: serde::de::DeserializeOwned + Default>(body: &Value, kind: &str) -> ApiResult<T> {
    match body.get("spec") {
        None | Some(Value::Null) => Ok(T::default()),
        Some(spec) => serde_json::from_value(spec.clone())
            .map_err(|e| ApiError::bad_request(format!("invalid {kind} spec: {e}"))),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct TokenRequestSpec {
    audiences: Option<Vec<String>>,
    expiration_seconds: Option<i64>,
    bound_object_ref: Option<BoundObjectRef>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct BoundObjectRef {
    kind: String,
    api_version: String,
    name: String,
    uid: String,
}

/// `ApiError::invalid` for a TokenRequest, worded as the real server words it.
fn invalid_request(name: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::invalid("TokenRequest.authentication.k8s.io", name, message)
}

fn request_token(ctx: &Ctx<'_>, ns: &str, sa_name: &str) -> ApiResult<Response<Body>> {
    let body = body_of(ctx, "TokenRequest")?;
    let spec: TokenRequestSpec = spec_of(&body, "TokenRequest")?;
    for (field, url_value) in [("name", sa_name), ("namespace", ns)] {
        let value = body
            .pointer(&format!("/metadata/{field}"))
            .and_then(Value::as_str)
            .unwrap_or("");
        if !value.is_empty() && value != url_value {
            return Err(invalid_request(
                sa_name,
                format!("metadata.{field}: Invalid value: {value:?}: must match the service account {field} if specified"),
            ));
        }
    }
    let store = &ctx.shared.store;
    let account = get(store, "serviceaccounts", ns, sa_name)
        .ok_or_else(|| ApiError::not_found("", "serviceaccounts", sa_name))?;
    let signer = &ctx.shared.tokens;
    let audiences = spec
        .audiences
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| vec![signer.issuer.clone()]);
    let expiration = spec
        .expiration_seconds
        .unwrap_or(DEFAULT_EXPIRATION_SECONDS);
    if expiration < MIN_EXPIRATION_SECONDS {
        return Err(invalid_request(
            "",
            format!("spec.expirationSeconds: Invalid value: {expiration}: may not specify a duration less than 10 minutes"),
        ));
    }
    if expiration > MAX_EXPIRATION_SECONDS {
        return Err(invalid_request(
            "",
            "spec.expirationSeconds: Too long: may not specify a duration larger than 2^32 seconds",
        ));
    }
    let bound = spec
        .bound_object_ref
        .as_ref()
        .map(|r| bound_pod(store, ns, sa_name, r))
        .transpose()?;

    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let exp = now + expiration;
    let mut k8s = json!({
        "namespace": ns,
        "serviceaccount": {"name": sa_name, "uid": uid_of(&account)},
    });
    if let Some((pod, node)) = &bound {
        k8s["pod"] = json!({"name": meta::name_of(pod), "uid": uid_of(pod)});
        if let Some(node) = node {
            k8s["node"] = node.clone();
        }
    }
    let claims = json!({
        "aud": audiences,
        "exp": exp,
        "iat": now,
        "iss": signer.issuer,
        "jti": meta::new_uid(),
        "kubernetes.io": k8s,
        "nbf": now,
        "sub": format!("system:serviceaccount:{ns}:{sa_name}"),
    });
    let token = signer.sign(&claims)?;
    let mut spec_out = json!({"audiences": audiences, "expirationSeconds": expiration});
    if let Some(r) = &spec.bound_object_ref {
        spec_out["boundObjectRef"] =
            json!({"kind": r.kind, "apiVersion": r.api_version, "name": r.name, "uid": r.uid});
    }
    Ok(routes::json_response(
        201,
        &json!({
            "apiVersion": API_VERSION,
            "kind": "TokenRequest",
            "metadata": {"name": sa_name, "namespace": ns, "creationTimestamp": rfc3339(now)},
            "spec": spec_out,
            "status": {"token": token, "expirationTimestamp": rfc3339(exp)},
        }),
    ))
}

/// The pod a token is bound to, and the `node` claim when the pod is scheduled (its uid
/// only when the Node object exists, as the real server does).
fn bound_pod(
    store: &Store,
    ns: &str,
    sa_name: &str,
    r: &BoundObjectRef,
) -> ApiResult<(Value, Option<Value>)> {
    let (group, version) = r
        .api_version
        .split_once('/')
        .unwrap_or(("", &r.api_version));
    match (group, r.kind.as_str()) {
        ("", "Pod") => {}
        ("", kind @ ("Secret" | "Node")) => {
            return Err(ApiError::bad_request(format!(
                "cannot bind token to a {kind}: kube-apiserver-lite binds tokens to pods only"
            )))
        }
        (_, kind) => {
            return Err(ApiError::bad_request(format!(
                "cannot bind token to object of type {group}/{version}, Kind={kind}"
            )))
        }
    }
    let pod =
        get(store, "pods", ns, &r.name).ok_or_else(|| ApiError::not_found("", "pods", &r.name))?;
    let pod_sa = pod
        .pointer("/spec/serviceAccountName")
        .or_else(|| pod.pointer("/spec/serviceAccount"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        // What the ServiceAccount admission plugin fills in on a real server.
        .unwrap_or("default");
    if pod_sa != sa_name {
        return Err(ApiError::bad_request(format!(
            "cannot bind token for serviceaccount {sa_name:?} to pod running with different serviceaccount name."
        )));
    }
    if !r.uid.is_empty() && r.uid != uid_of(&pod) {
        return Err(ApiError {
            code: 409,
            reason: "Conflict",
            message: format!(
                "Operation cannot be fulfilled on Pod {:?}: the UID in the bound object reference ({}) does not match the UID in record. The object might have been deleted and then recreated",
                r.name, r.uid
            ),
            details: Some(Box::new(crate::errors::Details {
                name: r.name.clone(),
                kind: "Pod".into(),
                ..Default::default()
            })),
        });
    }
    let node = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(|name| match get(store, "nodes", "", name) {
            Some(node) => json!({"name": name, "uid": uid_of(&node)}),
            None => json!({"name": name}),
        });
    Ok((pod, node))
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TokenReviewSpec {
    token: String,
    audiences: Option<Vec<String>>,
}

fn token_review(ctx: &Ctx<'_>) -> ApiResult<Response<Body>> {
    let body = body_of(ctx, "TokenReview")?;
    let spec: TokenReviewSpec = spec_of(&body, "TokenReview")?;
    if spec.token.is_empty() {
        return Err(ApiError::bad_request(
            "token is required for TokenReview in authentication",
        ));
    }
    let audiences = spec.audiences.unwrap_or_default();
    let status = match ctx
        .shared
        .tokens
        .authenticate(&ctx.shared.store, &spec.token, &audiences)
    {
        Ok(auth) => json!({
            "authenticated": true,
            "user": auth.user.to_json(),
            "audiences": auth.audiences,
        }),
        Err(error) => json!({"authenticated": false, "user": {}, "error": error}),
    };
    let mut spec_out = json!({"token": spec.token});
    if !audiences.is_empty() {
        spec_out["audiences"] = json!(audiences);
    }
    // 201 whatever the verdict: the review itself was created.
    Ok(routes::json_response(
        201,
        &json!({
            "apiVersion": API_VERSION,
            "kind": "TokenReview",
            "metadata": body.get("metadata").cloned().unwrap_or_else(|| json!({})),
            "spec": spec_out,
            "status": status,
        }),
    ))
}

/// `kubectl auth whoami`: the caller's identity from its bearer token. A token that does
/// not authenticate fails the whole request with 401, as on a real server.
fn self_subject_review(ctx: &Ctx<'_>) -> ApiResult<Response<Body>> {
    body_of(ctx, "SelfSubjectReview")?;
    let user = match bearer_token(&ctx.authorization) {
        None => UserInfo::admin(),
        Some(token) => {
            ctx.shared
                .tokens
                .authenticate(&ctx.shared.store, token, &[])
                .map_err(|error| {
                    tracing::debug!(%error, "SelfSubjectReview: token refused");
                    unauthorized()
                })?
                .user
        }
    };
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    Ok(routes::json_response(
        201,
        &json!({
            "apiVersion": API_VERSION,
            "kind": "SelfSubjectReview",
            "metadata": {"creationTimestamp": rfc3339(now)},
            "status": {"userInfo": user.to_json()},
        }),
    ))
}

fn bearer_token(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

fn unauthorized() -> ApiError {
    ApiError {
        code: 401,
        reason: "Unauthorized",
        message: "Unauthorized".into(),
        details: None,
    }
}

fn rfc3339(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Change;

    fn store_with(objects: &[(&str, &str, &str)]) -> Store {
        let store = Store::open(None, 100, Default::default(), Default::default()).unwrap();
        for (plural, ns, name) in objects {
            let rs = resources::builtin("", "v1", plural).unwrap();
            let obj = json!({"metadata": {"name": name}, "spec": {"serviceAccountName": "sa", "nodeName": "n1"}});
            store
                .mutate(rs, ns, name, false, |_| Ok(Change::Create(obj)))
                .unwrap();
        }
        store
    }

    fn uid(store: &Store, plural: &str, ns: &str, name: &str) -> String {
        uid_of(&get(store, plural, ns, name).unwrap()).to_string()
    }

    fn claims(store: &Store, aud: &[&str], exp_in: i64) -> Value {
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        json!({
            "iss": DEFAULT_ISSUER, "aud": aud, "sub": "system:serviceaccount:default:sa",
            "iat": now, "nbf": now, "exp": now + exp_in, "jti": "j1",
            "kubernetes.io": {
                "namespace": "default",
                "serviceaccount": {"name": "sa", "uid": uid(store, "serviceaccounts", "default", "sa")},
                "pod": {"name": "p", "uid": uid(store, "pods", "default", "p")},
                "node": {"name": "n1"},
            },
        })
    }

    #[test]
    fn authenticates_and_refuses_like_kubernetes() {
        let signer = Signer::open(DEFAULT_ISSUER.into(), None).unwrap();
        let store = store_with(&[
            ("serviceaccounts", "default", "sa"),
            ("pods", "default", "p"),
        ]);
        let good = signer.sign(&claims(&store, &["istio-ca"], 600)).unwrap();
        let auth = signer
            .authenticate(&store, &good, &["istio-ca".into()])
            .unwrap();
        assert_eq!(auth.user.username, "system:serviceaccount:default:sa");
        assert_eq!(auth.audiences, ["istio-ca"]);
        let extra = &auth.user.extra;
        assert_eq!(extra["authentication.kubernetes.io/pod-name"], ["p"]);
        assert_eq!(extra["authentication.kubernetes.io/node-name"], ["n1"]);
        assert_eq!(
            extra["authentication.kubernetes.io/credential-id"],
            ["JTI=j1"]
        );
        assert!(!extra.contains_key("authentication.kubernetes.io/node-uid"));

        let err = signer.authenticate(&store, &good, &[]).unwrap_err();
        assert_eq!(
            err,
            format!("[invalid bearer token, token audiences [\"istio-ca\"] is invalid for the target audiences [\"{DEFAULT_ISSUER}\"]]")
        );
        // Expiry honours the one-minute leeway.
        let late = signer.sign(&claims(&store, &["a"], -30)).unwrap();
        assert!(signer.authenticate(&store, &late, &["a".into()]).is_ok());
        let expired = signer.sign(&claims(&store, &["a"], -61)).unwrap();
        assert_eq!(
            signer
                .authenticate(&store, &expired, &["a".into()])
                .unwrap_err(),
            "[invalid bearer token, service account token has expired]"
        );
        // Another key, another issuer, garbage.
        let other = Signer::open(DEFAULT_ISSUER.into(), None).unwrap();
        let forged = other.sign(&claims(&store, &["a"], 600)).unwrap();
        assert!(signer
            .authenticate(&store, &forged, &["a".into()])
            .unwrap_err()
            .contains("cryptographic primitive"));
        let mut foreign = claims(&store, &["a"], 600);
        foreign["iss"] = json!("https://elsewhere");
        let foreign = signer.sign(&foreign).unwrap();
        for token in [foreign.as_str(), "garbage", "a.b.c", ""] {
            assert_eq!(
                signer.authenticate(&store, token, &[]).unwrap_err(),
                INVALID
            );
        }
    }

    #[test]
    fn key_survives_in_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = key_file_beside(&dir.path().join("state.json"));
        assert_eq!(path.file_name().unwrap(), "state.sa.key");
        let first = Signer::open(DEFAULT_ISSUER.into(), Some(&path)).unwrap();
        let again = Signer::open(DEFAULT_ISSUER.into(), Some(&path)).unwrap();
        assert_eq!(first.kid, again.kid);
        assert_eq!(first.jwks(), again.jwks());
        let token = first.sign(&json!({"iss": DEFAULT_ISSUER})).unwrap();
        assert!(
            jsonwebtoken::decode::<Value>(&token, &again.decoding, &again.validation(true)).is_ok()
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::write(&path, "not a key").unwrap();
        assert!(Signer::open(DEFAULT_ISSUER.into(), Some(&path)).is_err());
    }

    #[test]
    fn helpers() {
        assert_eq!(go_quote(&["a".into(), "b".into()]), "[\"a\" \"b\"]");
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token(""), None);
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        let jwks = Signer::open("x".into(), None).unwrap().jwks();
        assert_eq!(jwks["keys"][0]["x"].as_str().unwrap().len(), 43);
    }
}
