//! kube-apiserver-lite's service account token APIs against real clients: TokenRequest
//! and TokenReview through kube-rs, SelfSubjectReview and `kubectl create token` /
//! `kubectl auth whoami` through a real kubectl (when installed), and the signing key
//! surviving a restart of the real binary. No root needed: everything is on 127.0.0.1.

mod support;

use support::*;

use std::path::Path;
use std::process::Command;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenReview, TokenReviewStatus};
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, PostParams};
use kube::Client;
use kube_apiserver_lite::{Options, DEFAULT_ISSUER};
use serde_json::{json, Value};
use test_support::process::ChildGuard;

const NS: &str = "default";

async fn create_sa(client: &Client, name: &str) -> ServiceAccount {
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap()
}

async fn create_pod(client: &Client, name: &str, sa: &str, node: &str) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"serviceAccountName": sa, "nodeName": node,
                 "containers": [{"name": "app", "image": "app:1"}]},
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
}

async fn create_node(client: &Client, name: &str) -> Node {
    let node: Node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap()
}

fn uid<K: kube::Resource>(obj: &K) -> String {
    obj.meta().uid.clone().expect("uid")
}

fn token_request(audiences: &[&str], seconds: Option<i64>, pod: Option<(&str, &str)>) -> Value {
    let mut spec = json!({"audiences": audiences});
    if let Some(seconds) = seconds {
        spec["expirationSeconds"] = json!(seconds);
    }
    if let Some((name, uid)) = pod {
        spec["boundObjectRef"] =
            json!({"kind": "Pod", "apiVersion": "v1", "name": name, "uid": uid});
    }
    json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "metadata": {}, "spec": spec})
}

/// A token through kube-rs' TokenRequest call.
async fn request_token(
    client: &Client,
    sa: &str,
    body: Value,
) -> Result<TokenRequest, kube::Error> {
    let request: TokenRequest = serde_json::from_value(body).unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), NS)
        .create_token_request(sa, &PostParams::default(), &request)
        .await
}

async fn token(client: &Client, sa: &str, audiences: &[&str], pod: Option<(&str, &str)>) -> String {
    request_token(client, sa, token_request(audiences, None, pod))
        .await
        .unwrap()
        .status
        .unwrap()
        .token
}

/// A TokenReview through kube-rs (`Api::<TokenReview>::all(..).create(..)`).
async fn review(client: &Client, token: &str, audiences: &[&str]) -> TokenReviewStatus {
    let review: TokenReview = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "metadata": {}, "spec": {"token": token, "audiences": audiences},
    }))
    .unwrap();
    Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .expect("review status")
}

async fn refused(client: &Client, token: &str, audiences: &[&str]) -> String {
    let status = review(client, token, audiences).await;
    assert_ne!(status.authenticated, Some(true), "{status:?}");
    status.error.unwrap_or_default()
}

/// The claims of a JWT (no verification: that is the server's job).
fn claims(token: &str) -> Value {
    let payload = token.split('.').nth(1).expect("a JWT");
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).expect("base64url")).expect("JSON")
}

/// A raw request; the status and the JSON answer.
async fn raw(
    client: &Client,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Value) {
    let mut request = http::Request::builder().method(method).uri(path);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(kube::client::Body::from(body.as_bytes().to_vec()))
        .unwrap();
    let response = client.send(request).await.expect("request sent");
    let status = response.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .expect("answer body")
        .to_bytes();
    let answer = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{method} {path}: answer is not JSON ({e}): {bytes:?}"));
    (status, answer)
}

#[tokio::test]
async fn pod_bound_token_reviews_with_pod_and_node_extras() {
    let (control, client) = start(Options::default()).await;
    let sa = create_sa(&client, "ztunnel").await;
    let node = create_node(&client, "node1").await;
    let pod = create_pod(&client, "zt-1", "ztunnel", "node1").await;
    let pod_uid = uid(&pod);

    let answer = request_token(
        &client,
        "ztunnel",
        token_request(&["istio-ca"], Some(43200), Some(("zt-1", &pod_uid))),
    )
    .await
    .unwrap();
    assert_eq!(answer.spec.expiration_seconds, Some(43200));
    let status = answer.status.unwrap();
    let c = claims(&status.token);
    assert_eq!(c["iss"], DEFAULT_ISSUER);
    assert_eq!(c["sub"], "system:serviceaccount:default:ztunnel");
    assert_eq!(c["aud"], json!(["istio-ca"]));
    let (iat, nbf, exp) = (
        c["iat"].as_i64().unwrap(),
        c["nbf"].as_i64().unwrap(),
        c["exp"].as_i64().unwrap(),
    );
    assert_eq!((nbf, exp - iat), (iat, 43200));
    assert_eq!(status.expiration_timestamp.0.as_second(), exp);
    assert_eq!(c["jti"].as_str().unwrap().len(), 36);
    assert_eq!(
        c["kubernetes.io"],
        json!({
            "namespace": "default",
            "serviceaccount": {"name": "ztunnel", "uid": uid(&sa)},
            "pod": {"name": "zt-1", "uid": pod_uid},
            "node": {"name": "node1", "uid": uid(&node)},
        })
    );

    let verdict = review(&client, &status.token, &["istio-ca", "other"]).await;
    assert_eq!(verdict.authenticated, Some(true), "{verdict:?}");
    assert_eq!(verdict.audiences, Some(vec!["istio-ca".to_string()]));
    let user = verdict.user.unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some("system:serviceaccount:default:ztunnel")
    );
    assert_eq!(user.uid, Some(uid(&sa)));
    assert_eq!(
        user.groups.unwrap(),
        [
            "system:serviceaccounts",
            "system:serviceaccounts:default",
            "system:authenticated"
        ]
    );
    let extra = user.extra.unwrap();
    let one = |k: &str| {
        extra
            .get(&format!("authentication.kubernetes.io/{k}"))
            .cloned()
    };
    assert_eq!(one("pod-name"), Some(vec!["zt-1".to_string()]));
    assert_eq!(one("pod-uid"), Some(vec![pod_uid.clone()]));
    assert_eq!(one("node-name"), Some(vec!["node1".to_string()]));
    assert_eq!(one("node-uid"), Some(vec![uid(&node)]));
    assert_eq!(
        one("credential-id"),
        Some(vec![format!("JTI={}", c["jti"].as_str().unwrap())])
    );

    // Defaults: one hour, the issuer as audience; an unbound token has no pod extras. A
    // pod on a node without a Node object gets the node name only.
    let plain = request_token(&client, "ztunnel", token_request(&[], None, None))
        .await
        .unwrap();
    assert_eq!(plain.spec.audiences, [DEFAULT_ISSUER]);
    assert_eq!(plain.spec.expiration_seconds, Some(3600));
    let plain = plain.status.unwrap().token;
    let c = claims(&plain);
    assert_eq!(c["aud"], json!([DEFAULT_ISSUER]));
    assert!(c["kubernetes.io"].get("pod").is_none());
    let verdict = review(&client, &plain, &[]).await;
    assert_eq!(verdict.authenticated, Some(true), "{verdict:?}");
    assert!(!verdict
        .user
        .unwrap()
        .extra
        .unwrap()
        .contains_key("authentication.kubernetes.io/pod-name"));
    let far = create_pod(&client, "zt-2", "ztunnel", "node-without-object").await;
    let t = token(
        &client,
        "ztunnel",
        &["istio-ca"],
        Some(("zt-2", &uid(&far))),
    )
    .await;
    assert_eq!(
        claims(&t)["kubernetes.io"]["node"],
        json!({"name": "node-without-object"})
    );
    control.shutdown();
}

#[tokio::test]
async fn review_refuses_wrong_audience_expired_garbage_and_revoked() {
    let (control, client) = start(Options::default()).await;
    create_sa(&client, "app").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod = create_pod(&client, "web", "app", "node1").await;
    let bound = token(&client, "app", &["istio-ca"], Some(("web", &uid(&pod)))).await;

    let err = refused(&client, &bound, &["other"]).await;
    assert_eq!(
        err,
        "[invalid bearer token, token audiences [\"istio-ca\"] is invalid for the target audiences [\"other\"]]"
    );
    // No audiences in the review: the server's own, which this token lacks.
    assert!(refused(&client, &bound, &[]).await.contains(DEFAULT_ISSUER));

    // Expired: a token the TokenRequest API would not issue (min 600 s), signed by the
    // server's key; past go-jose's one-minute leeway.
    let mut old = claims(&bound);
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    old["iat"] = json!(now - 3600);
    old["nbf"] = json!(now - 3600);
    old["exp"] = json!(now - 120);
    let expired = control.sign_token(&old).unwrap();
    assert_eq!(
        refused(&client, &expired, &["istio-ca"]).await,
        "[invalid bearer token, service account token has expired]"
    );
    old["nbf"] = json!(now + 600);
    old["exp"] = json!(now + 3600);
    let early = control.sign_token(&old).unwrap();
    assert!(refused(&client, &early, &["istio-ca"])
        .await
        .contains("not valid yet"));

    // Garbage, a tampered payload, and another issuer's token.
    assert_eq!(
        refused(&client, "garbage", &["istio-ca"]).await,
        "invalid bearer token"
    );
    let mut parts: Vec<String> = bound.split('.').map(str::to_string).collect();
    let mut forged = claims(&bound);
    forged["sub"] = json!("system:serviceaccount:kube-system:admin");
    parts[1] = URL_SAFE_NO_PAD.encode(forged.to_string());
    assert!(refused(&client, &parts.join("."), &["istio-ca"])
        .await
        .contains("cryptographic primitive"));
    let mut foreign = claims(&bound);
    foreign["iss"] = json!("https://elsewhere.example");
    let foreign = control.sign_token(&foreign).unwrap();
    assert_eq!(
        refused(&client, &foreign, &["istio-ca"]).await,
        "invalid bearer token"
    );

    // The pod goes: its tokens go with it, also when a new pod takes the name.
    assert_eq!(
        review(&client, &bound, &["istio-ca"]).await.authenticated,
        Some(true)
    );
    pods.delete("web", &DeleteParams::default()).await.unwrap();
    assert_eq!(
        refused(&client, &bound, &["istio-ca"]).await,
        "[invalid bearer token, service account token has been invalidated]"
    );
    let again = create_pod(&client, "web", "app", "node1").await;
    let err = refused(&client, &bound, &["istio-ca"]).await;
    assert!(
        err.contains(&format!(
            "pod UID ({}) does not match claim ({})",
            uid(&again),
            uid(&pod)
        )),
        "{err}"
    );

    // The service account goes, or comes back as another one.
    let unbound = token(&client, "app", &["istio-ca"], None).await;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    accounts
        .delete("app", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(
        refused(&client, &unbound, &["istio-ca"]).await,
        "[invalid bearer token, serviceaccounts \"app\" not found]"
    );
    create_sa(&client, "app").await;
    assert!(refused(&client, &unbound, &["istio-ca"])
        .await
        .contains("service account UID"));
    control.shutdown();
}

#[tokio::test]
async fn token_request_refusals_match_the_real_server() {
    let (control, client) = start(Options::default()).await;
    create_sa(&client, "app").await;
    create_sa(&client, "other").await;
    let pod = create_pod(&client, "web", "app", "node1").await;
    let code = |r: Result<TokenRequest, kube::Error>| api_code(r.unwrap_err());

    let short = request_token(&client, "app", token_request(&[], Some(599), None))
        .await
        .unwrap_err();
    match short {
        kube::Error::Api(s) => {
            assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
            assert!(
                s.message
                    .contains("may not specify a duration less than 10 minutes"),
                "{}",
                s.message
            );
        }
        other => panic!("{other}"),
    }
    assert!(
        request_token(&client, "app", token_request(&[], Some(600), None))
            .await
            .is_ok()
    );
    assert_eq!(
        code(request_token(&client, "nobody", token_request(&[], None, None)).await),
        404
    );
    assert_eq!(
        code(request_token(&client, "app", token_request(&[], None, Some(("gone", "")))).await),
        404
    );
    assert_eq!(
        code(
            request_token(
                &client,
                "app",
                token_request(&[], None, Some(("web", "stale-uid")))
            )
            .await
        ),
        409
    );
    // The pod runs as "app", not as "other".
    assert_eq!(
        code(
            request_token(
                &client,
                "other",
                token_request(&[], None, Some(("web", &uid(&pod))))
            )
            .await
        ),
        400
    );
    let mut secret = token_request(&[], None, None);
    secret["spec"]["boundObjectRef"] = json!({"kind": "Secret", "apiVersion": "v1", "name": "s"});
    assert_eq!(code(request_token(&client, "app", secret).await), 400);
    let mut named = token_request(&[], None, None);
    named["metadata"] = json!({"name": "other"});
    assert_eq!(code(request_token(&client, "app", named).await), 422);

    // Bad bodies and verbs: Status objects, never a panic.
    let json_ct = [("content-type", "application/json")];
    let (status, answer) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/serviceaccounts/app/token",
        &json_ct,
        "{nope",
    )
    .await;
    assert_eq!(
        (status, answer["reason"].as_str()),
        (400, Some("BadRequest"))
    );
    let (status, _) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/serviceaccounts/app/token",
        &json_ct,
        r#"{"spec": {"audiences": "not-a-list", "expirationSeconds": "x"}}"#,
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) = raw(
        &client,
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        &json_ct,
        r#"{"spec": {}}"#,
    )
    .await;
    assert_eq!(status, 400, "a review needs a token");
    let (status, _) = raw(
        &client,
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        &json_ct,
        "[1]",
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) = raw(
        &client,
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        &json_ct,
        r#"{"kind": "Pod", "spec": {"token": "x"}}"#,
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) = raw(
        &client,
        "GET",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        &[],
        "",
    )
    .await;
    assert_eq!(status, 405);
    let (status, _) = raw(
        &client,
        "GET",
        "/api/v1/namespaces/default/serviceaccounts/app/token",
        &[],
        "",
    )
    .await;
    assert_eq!(status, 405);
    let (status, _) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/pods/web/token",
        &json_ct,
        "{}",
    )
    .await;
    assert_eq!(status, 404);
    control.shutdown();
}

#[tokio::test]
async fn discovery_oidc_and_self_subject_review() {
    let (control, client) = start(Options::default()).await;
    let sa = create_sa(&client, "app").await;

    // Discovery: the review resources (create only) and the token subresource.
    let (_, group) = raw(&client, "GET", "/apis/authentication.k8s.io/v1", &[], "").await;
    let names: Vec<&str> = group["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["tokenreviews", "selfsubjectreviews"]);
    assert_eq!(group["resources"][0]["verbs"], json!(["create"]));
    let (_, core) = raw(&client, "GET", "/api/v1", &[], "").await;
    let sub = core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "serviceaccounts/token")
        .unwrap();
    assert_eq!(sub["kind"], "TokenRequest");
    let discovery = kube::Discovery::new(client.clone()).run().await.unwrap();
    assert!(discovery.has_group("authentication.k8s.io"));

    // OIDC: the JWKS key verifies the tokens.
    let (_, oidc) = raw(&client, "GET", "/.well-known/openid-configuration", &[], "").await;
    assert_eq!(oidc["issuer"], DEFAULT_ISSUER);
    assert_eq!(
        oidc["jwks_uri"],
        format!("{}/openid/v1/jwks", control.url())
    );
    let (_, jwks) = raw(&client, "GET", "/openid/v1/jwks", &[], "").await;
    let key = &jwks["keys"][0];
    let t = token(&client, "app", &[], None).await;
    let header = jsonwebtoken::decode_header(&t).unwrap();
    assert_eq!(header.kid.as_deref(), key["kid"].as_str());
    let decoding = jsonwebtoken::DecodingKey::from_ec_components(
        key["x"].as_str().unwrap(),
        key["y"].as_str().unwrap(),
    )
    .unwrap();
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::ES256);
    validation.set_audience(&[DEFAULT_ISSUER]);
    validation.set_issuer(&[DEFAULT_ISSUER]);
    jsonwebtoken::decode::<Value>(&t, &decoding, &validation).unwrap();

    // SelfSubjectReview: the bearer token's user; none means the (unauthenticated) admin.
    let body = r#"{"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}"#;
    let json_ct = ("content-type", "application/json");
    let bearer = format!("Bearer {t}");
    let path = "/apis/authentication.k8s.io/v1/selfsubjectreviews";
    let (status, me) = raw(
        &client,
        "POST",
        path,
        &[json_ct, ("authorization", &bearer)],
        body,
    )
    .await;
    assert_eq!(status, 201);
    assert_eq!(
        me["status"]["userInfo"]["username"],
        "system:serviceaccount:default:app"
    );
    assert_eq!(me["status"]["userInfo"]["uid"], json!(uid(&sa)));
    let (_, anonymous) = raw(&client, "POST", path, &[json_ct], body).await;
    assert_eq!(anonymous["status"]["userInfo"]["username"], "system:admin");
    let (status, answer) = raw(
        &client,
        "POST",
        path,
        &[json_ct, ("authorization", "Bearer garbage")],
        body,
    )
    .await;
    assert_eq!(
        (status, answer["reason"].as_str()),
        (401, Some("Unauthorized"))
    );
    control.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_token_and_auth_whoami() {
    let Some(bin) = kubectl() else {
        return;
    };
    let (control, client) = start(Options::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let k = Kubectl::for_server(bin, &control.url(), dir.path());
    k.run(&["create", "serviceaccount", "app"]).await;
    let pod = create_pod(&client, "web", "app", "node1").await;

    // `kubectl create token` posts a protobuf TokenRequest.
    let pod_uid = uid(&pod);
    let t = k
        .run(&[
            "create",
            "token",
            "app",
            "--duration",
            "10m",
            "--bound-object-kind",
            "Pod",
            "--bound-object-name",
            "web",
            "--bound-object-uid",
            &pod_uid,
        ])
        .await;
    let t = t.trim();
    let c = claims(t);
    assert_eq!(c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap(), 600);
    assert_eq!(c["kubernetes.io"]["pod"]["uid"], json!(pod_uid));
    assert_eq!(c["aud"], json!([DEFAULT_ISSUER]));

    // kubectl sends a token only over TLS: the same port answers https.
    let https = control.https_url();
    let tls = ["--server", https.as_str(), "--insecure-skip-tls-verify"];
    let mut args = tls.to_vec();
    args.extend(["auth", "whoami", "-o", "json", "--token", t]);
    let me: Value = serde_json::from_str(&k.run(&args).await).unwrap();
    assert_eq!(
        me["status"]["userInfo"]["username"],
        "system:serviceaccount:default:app"
    );
    assert_eq!(
        me["status"]["userInfo"]["extra"]["authentication.kubernetes.io/pod-name"],
        json!(["web"])
    );
    let table = k
        .run(&[tls[0], tls[1], tls[2], "auth", "whoami", "--token", t])
        .await;
    assert!(
        table.contains("system:serviceaccount:default:app"),
        "{table}"
    );
    // Without a token (plain http, as the kubeconfig says): the admin.
    let admin = k.run(&["auth", "whoami"]).await;
    assert!(admin.contains("system:admin"), "{admin}");
    control.shutdown();
}

fn start_binary(name: &str, port: u16, state: &Path) -> ChildGuard {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kube-apiserver-lite"));
    cmd.args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--state-file")
        .arg(state);
    ChildGuard::spawn(name, cmd).expect("start kube-apiserver-lite")
}

#[tokio::test]
async fn tokens_survive_a_restart_with_the_state_file() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let port = free_port();
    let mut server = start_binary("apiserver-tokens-1", port, &state);
    let client = client_for(&format!("http://127.0.0.1:{port}"));
    wait_ready(&client, &server).await;
    create_sa(&client, "app").await;
    let t = token(&client, "app", &["istio-ca"], None).await;
    let key = dir.path().join("state.sa.key");
    assert!(
        key.exists(),
        "the signing key is kept beside the state file"
    );

    server.kill();
    let server = start_binary("apiserver-tokens-2", port, &state);
    wait_ready(&client, &server).await;
    let verdict = review(&client, &t, &["istio-ca"]).await;
    assert_eq!(verdict.authenticated, Some(true), "{verdict:?}");
    drop(server);

    // A server without that key (a fresh state) does not accept the token.
    let other_state = dir.path().join("other.json");
    let server = start_binary("apiserver-tokens-3", port, &other_state);
    wait_ready(&client, &server).await;
    create_sa(&client, "app").await;
    assert!(refused(&client, &t, &["istio-ca"])
        .await
        .contains("cryptographic primitive"));
    drop(server);
}
