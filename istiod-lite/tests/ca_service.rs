//! istiod-lite's certificate service against real clients: the real binary, the
//! local API server (TokenRequest/TokenReview), gRPC over real TLS on loopback.
//! Every refusal the issue names is made and found counted under its reason.

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::Client;
use kube_apiserver_lite::{write_kubeconfig, ApiServer, Control, Options};
use mesh_ca::{CertificateAuthority, CsrError};
use serde_json::json;
use shared_types::identity::Identity;
use shared_types::istio::ca::IstioCertificateRequest;
use shared_types::istio::ca_service::IstioCertificateServiceClient;
use test_support::poll::eventually;
use test_support::poll::wait_for;
use test_support::process::ChildGuard;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};
use tonic::{Code, Status};

const TD: &str = "cluster.local";
const WAIT: Duration = Duration::from_secs(20);

struct Fixture {
    _dir: tempfile::TempDir,
    apiserver: Control,
    client: Client,
    istiod: ChildGuard,
    grpc: Channel,
    metrics_url: String,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn http_get(url: &str) -> Option<String> {
    let (addr, path) = url.strip_prefix("http://")?.split_once('/')?;
    test_support::http::get_ok(addr.parse().ok()?, &format!("/{path}"))
}

fn pod(ns: &str, name: &str, sa: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name},
        "spec": {"serviceAccountName": sa, "nodeName": node, "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Running"},
    }))
    .unwrap()
}

async fn start() -> Fixture {
    let server = ApiServer::bind_with("127.0.0.1:0", Options::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    write_kubeconfig(&kubeconfig, &server.url()).unwrap();
    let client = Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let apiserver = server.spawn();

    for ns in ["istio-system", "app"] {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        Api::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
    }
    for (ns, sa) in [
        ("istio-system", "ztunnel"),
        ("app", "client"),
        ("app", "server"),
    ] {
        let sa: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": sa, "namespace": ns}})).unwrap();
        Api::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &sa)
            .await
            .unwrap();
    }
    for (ns, name, sa, node) in [
        ("istio-system", "ztunnel-1", "ztunnel", "n1"),
        ("istio-system", "ztunnel-2", "ztunnel", "n2"),
        ("app", "client", "client", "n1"),
        ("app", "server", "server", "n2"),
    ] {
        Api::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &pod(ns, name, sa, node))
            .await
            .unwrap();
    }

    let ca_dir = dir.path().join("cacerts");
    CertificateAuthority::generate_self_signed(TD)
        .unwrap()
        .write(&ca_dir)
        .unwrap();
    let (grpc_port, metrics_port, ready_port) = (free_port(), free_port(), free_port());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_istiod-lite"));
    cmd.env("CA_CERTS_DIR", &ca_dir)
        .env("KUBECONFIG", &kubeconfig)
        .env("GRPC_ADDR", format!("127.0.0.1:{grpc_port}"))
        .env("MONITORING_ADDR", format!("127.0.0.1:{metrics_port}"))
        .env("READY_ADDR", format!("127.0.0.1:{ready_port}"))
        .env("MAX_WORKLOAD_CERT_TTL", "48h")
        .env(
            test_support::owner::OWNER_ENV,
            test_support::owner::owner_marker(),
        );
    let istiod = ChildGuard::spawn(&format!("istiod-lite-{grpc_port}"), cmd).unwrap();
    let ready = format!("http://127.0.0.1:{ready_port}/ready");
    // Blocking waits run off the runtime: the API server is served on it.
    let istiod = tokio::task::spawn_blocking(move || {
        match wait_for("istiod-lite ready", WAIT, || http_get(&ready)) {
            Ok(_) => istiod,
            Err(e) => panic!("{e}\n{}", istiod.log()),
        }
    })
    .await
    .unwrap();

    let grpc = channel(&ca_dir, grpc_port).await;
    Fixture {
        _dir: dir,
        apiserver,
        client,
        istiod,
        grpc,
        metrics_url: format!("http://127.0.0.1:{metrics_port}/metrics"),
    }
}

async fn channel(ca_dir: &Path, port: u16) -> Channel {
    let root = std::fs::read_to_string(ca_dir.join("root-cert.pem")).unwrap();
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(root))
        .domain_name("istiod.istio-system.svc");
    Channel::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap()
}

impl Fixture {
    async fn token(&self, ns: &str, sa: &str, audience: &str, pod: Option<&str>) -> String {
        let bound = match pod {
            Some(name) => {
                let p: Pod = Api::namespaced(self.client.clone(), ns)
                    .get(name)
                    .await
                    .unwrap();
                json!({"kind": "Pod", "apiVersion": "v1", "name": name, "uid": p.metadata.uid})
            }
            None => serde_json::Value::Null,
        };
        let request: TokenRequest = serde_json::from_value(json!({
            "spec": {"audiences": [audience], "expirationSeconds": 3600, "boundObjectRef": bound}
        }))
        .unwrap();
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), ns);
        let answer: TokenRequest = api
            .create_subresource("token", sa, &PostParams::default(), &request)
            .await
            .unwrap();
        answer.status.unwrap().token
    }

    /// CreateCertificate with a CSR for `csr_for`, as a ztunnel would send it.
    async fn request(
        &self,
        token: Option<&str>,
        cluster: &str,
        csr_for: &Identity,
        impersonate: Option<&str>,
        ttl_secs: i64,
    ) -> Result<Vec<String>, Status> {
        let (_key, csr) = mesh_ca::csr::new_csr(csr_for).unwrap();
        self.request_raw(token, cluster, csr, impersonate, ttl_secs)
            .await
    }

    async fn request_raw(
        &self,
        token: Option<&str>,
        cluster: &str,
        csr: String,
        impersonate: Option<&str>,
        ttl_secs: i64,
    ) -> Result<Vec<String>, Status> {
        let mut body = IstioCertificateRequest {
            csr,
            validity_duration: ttl_secs,
            metadata: None,
        };
        if let Some(id) = impersonate {
            body = body.with_impersonated_identity(id);
        }
        let mut request = tonic::Request::new(body);
        if let Some(token) = token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        request
            .metadata_mut()
            .insert("clusterid", cluster.parse().unwrap());
        let mut client = IstioCertificateServiceClient::new(self.grpc.clone());
        client
            .create_certificate(request)
            .await
            .map(|r| r.into_inner().cert_chain)
    }

    fn metric(&self, line_prefix: &str) -> f64 {
        let text = http_get(&self.metrics_url).unwrap_or_default();
        text.lines()
            .find(|l| l.starts_with(line_prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    fn refusals(&self, reason: &str) -> f64 {
        self.metric(&format!(
            "citadel_server_authentication_failure_count_total{{reason=\"{reason}\"}}"
        ))
    }
}

fn id(ns: &str, sa: &str) -> Identity {
    Identity::new(TD, ns, sa)
}

fn uri_sans(pem: &str) -> Vec<String> {
    use rustls_pki_types::pem::PemObject;
    let der = rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    cert.subject_alternative_name()
        .unwrap()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::URI(u) => Some(u.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

const CLIENT: &str = "spiffe://cluster.local/ns/app/sa/client";
const SERVER: &str = "spiffe://cluster.local/ns/app/sa/server";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_proxy_gets_its_own_pods_identities_and_every_refusal_is_counted() {
    let f = start().await;
    let z1 = f
        .token("istio-system", "ztunnel", "istio-ca", Some("ztunnel-1"))
        .await;
    let ztunnel = id("istio-system", "ztunnel");

    // Allowed: a pod with that identity runs on the caller's node. Leaf first, root last.
    let chain = f
        .request(
            Some(&z1),
            "Kubernetes",
            &id("app", "client"),
            Some(CLIENT),
            0,
        )
        .await
        .unwrap();
    assert_eq!(chain.len(), 2, "{chain:?}");
    assert_eq!(uri_sans(&chain[0]), [CLIENT]);
    assert!(chain
        .iter()
        .all(|p| p.ends_with("-----END CERTIFICATE-----\n")));

    let expect_refused = |result: Result<Vec<String>, Status>, code: Code, what: &str| {
        let status = result.expect_err(what);
        assert_eq!(status.code(), code, "{what}: {status:?}");
    };
    // A pod of another node.
    expect_refused(
        f.request(Some(&z1), "Kubernetes", &ztunnel, Some(SERVER), 0)
            .await,
        Code::Unauthenticated,
        "impersonating a pod on another node",
    );
    // An untrusted service account, with a good pod-bound token.
    let client_token = f.token("app", "client", "istio-ca", Some("client")).await;
    expect_refused(
        f.request(
            Some(&client_token),
            "Kubernetes",
            &id("app", "client"),
            Some(SERVER),
            0,
        )
        .await,
        Code::Unauthenticated,
        "impersonating with an untrusted account",
    );
    // A token bound to no pod.
    let unbound = f.token("istio-system", "ztunnel", "istio-ca", None).await;
    expect_refused(
        f.request(Some(&unbound), "Kubernetes", &ztunnel, Some(CLIENT), 0)
            .await,
        Code::Unauthenticated,
        "a token not bound to a pod",
    );
    // A wrong audience.
    let wrong_aud = f
        .token(
            "istio-system",
            "ztunnel",
            "something-else",
            Some("ztunnel-1"),
        )
        .await;
    expect_refused(
        f.request(Some(&wrong_aud), "Kubernetes", &ztunnel, Some(CLIENT), 0)
            .await,
        Code::Unauthenticated,
        "a wrong audience",
    );
    // An expired token (signed by the API server's own key, as it would have issued it).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let pod: Pod = Api::namespaced(f.client.clone(), "istio-system")
        .get("ztunnel-1")
        .await
        .unwrap();
    let sa: ServiceAccount = Api::namespaced(f.client.clone(), "istio-system")
        .get("ztunnel")
        .await
        .unwrap();
    let expired = f
        .apiserver
        .sign_token(&json!({
            "iss": f.apiserver.service_account_issuer(),
            "sub": "system:serviceaccount:istio-system:ztunnel",
            "aud": ["istio-ca"],
            "iat": now - 7200, "nbf": now - 7200, "exp": now - 3600,
            "kubernetes.io": {
                "namespace": "istio-system",
                "serviceaccount": {"name": "ztunnel", "uid": sa.metadata.uid},
                "pod": {"name": "ztunnel-1", "uid": pod.metadata.uid},
            },
        }))
        .unwrap();
    expect_refused(
        f.request(Some(&expired), "Kubernetes", &ztunnel, Some(CLIENT), 0)
            .await,
        Code::Unauthenticated,
        "an expired token",
    );
    // No token; an unknown cluster; garbage.
    expect_refused(
        f.request(None, "Kubernetes", &ztunnel, Some(CLIENT), 0)
            .await,
        Code::Unauthenticated,
        "no token",
    );
    expect_refused(
        f.request(Some(&z1), "west", &ztunnel, Some(CLIENT), 0)
            .await,
        Code::Unauthenticated,
        "an unknown cluster",
    );
    expect_refused(
        f.request(Some("not.a.jwt"), "Kubernetes", &ztunnel, None, 0)
            .await,
        Code::Unauthenticated,
        "a garbage token",
    );
    // A token bound to a pod that was deleted since.
    let z2 = f
        .token("istio-system", "ztunnel", "istio-ca", Some("ztunnel-2"))
        .await;
    Api::<Pod>::namespaced(f.client.clone(), "istio-system")
        .delete("ztunnel-2", &DeleteParams::default())
        .await
        .unwrap();
    // The API server invalidates the token at once; istiod-lite's pod index sees the
    // deletion a moment later, and from then on names the refusal for what it is.
    eventually(
        "the deletion to reach istiod-lite's pod index",
        WAIT,
        || async {
            let refused = f
                .request(Some(&z2), "Kubernetes", &ztunnel, Some(SERVER), 0)
                .await
                .is_err();
            refused && f.refusals("bound_pod_gone") >= 1.0
        },
    )
    .await;

    for reason in [
        "no_pod_on_node",
        "untrusted_caller",
        "not_pod_bound",
        "wrong_audience",
        "expired_token",
        "no_token",
        "unknown_cluster",
        "invalid_token",
        "bound_pod_gone",
    ] {
        assert!(
            f.refusals(reason) >= 1.0,
            "{reason} not counted:\n{}",
            f.istiod.log()
        );
    }
    assert_eq!(
        f.metric("citadel_server_success_cert_issuance_count_total"),
        1.0
    );
}

/// A CSR with a weak key is refused by name over gRPC; a TokenReview the API server
/// cannot answer is `Unavailable` (the client retries), counted as `review_failed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weak_keys_and_unanswerable_reviews_get_their_own_codes() {
    let f = start().await;
    let token = f.token("app", "client", "istio-ca", Some("client")).await;
    // Made with `openssl req -new -newkey rsa:512`: ring cannot sign with such a key.
    let rsa512 = include_str!("testdata/rsa512.csr").to_owned();
    let status = f
        .request_raw(Some(&token), "Kubernetes", rsa512, None, 0)
        .await
        .expect_err("an RSA-512 CSR");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("RSA-512"), "{status:?}");

    // A token never reviewed yet, asked about once the API server is gone.
    let fresh = f.token("app", "server", "istio-ca", Some("server")).await;
    f.apiserver.shutdown();
    f.apiserver.stopped().await;
    let status = f
        .request(Some(&fresh), "Kubernetes", &id("app", "server"), None, 0)
        .await
        .expect_err("no API server to review the token");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(f.refusals("review_failed"), 1.0, "{}", f.istiod.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leaf_carries_the_callers_identity_not_the_csrs() {
    let f = start().await;
    let token = f.token("app", "client", "istio-ca", Some("client")).await;
    // The CSR asks for ztunnel's identity; the caller is app/client.
    let chain = f
        .request(
            Some(&token),
            "Kubernetes",
            &id("istio-system", "ztunnel"),
            None,
            3600,
        )
        .await
        .unwrap();
    assert_eq!(uri_sans(&chain[0]), [CLIENT]);

    // TTL over MAX_WORKLOAD_CERT_TTL (48h here), a garbage CSR, an oversized one.
    let status = f
        .request(
            Some(&token),
            "Kubernetes",
            &id("app", "client"),
            None,
            49 * 3600,
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("max allowed TTL"), "{status:?}");
    for (csr, want) in [
        ("garbage".to_owned(), "PEM"),
        (
            "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"
                .to_owned(),
            "PKCS#10",
        ),
        (
            "x".repeat(20_000),
            &CsrError::TooLarge { len: 20_000 }.to_string()[..12],
        ),
    ] {
        let status = f
            .request_raw(Some(&token), "Kubernetes", csr, None, 0)
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(want), "{want}: {status:?}");
    }
    // A message far over the limit is refused before it is decoded.
    let status = f
        .request_raw(Some(&token), "Kubernetes", "x".repeat(200_000), None, 0)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(f.metric("citadel_server_csr_parsing_err_count_total{reason=\"csr\"}") >= 3.0);

    // istiod-lite publishes the root in every namespace.
    let root = std::fs::read_to_string(f._dir.path().join("cacerts/root-cert.pem")).unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(f.client.clone(), "app");
    let published = || async {
        let cm = cms.get_opt("istio-ca-root-cert").await.ok().flatten();
        cm.and_then(|cm| cm.data)
            .is_some_and(|d| d.get("root-cert.pem") == Some(&root))
    };
    eventually("istio-ca-root-cert in app", WAIT, published).await;
    // ... and puts it back when it is edited or deleted.
    let edit = json!({"data": {"root-cert.pem": "not the root"}});
    cms.patch(
        "istio-ca-root-cert",
        &PatchParams::default(),
        &Patch::Merge(&edit),
    )
    .await
    .unwrap();
    eventually("the edited root put back", WAIT, published).await;
    cms.delete("istio-ca-root-cert", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the deleted root put back", WAIT, published).await;
}
