//! istioctl's XDS connection to istiod: TLS verified against the mesh root (from
//! `--cert-dir` or the `istio-ca-root-cert` ConfigMap), or unverified (`--insecure`),
//! or none (`--plaintext`); a bearer token (`--token`, else a TokenRequest for the
//! `default` service account of istiod's namespace, audience istio-ca, as istioctl
//! does); and one delta ADS request answered once, by one istiod or by each replica.

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use kube::api::{Api, ListParams, PostParams};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use shared_types::istio::xds::{
    string_struct, AggregatedDiscoveryServiceClient, DeltaDiscoveryRequest, DeltaDiscoveryResponse,
    Node,
};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::cli::{Global, XdsArgs};
use crate::kubeclient;

const AUDIENCE: &str = "istio-ca";
const ROOT_CONFIGMAP: &str = "istio-ca-root-cert";

/// Each istiod replica's answer to one request of `type_url`. Every replica knows
/// only the proxies connected to it, so when `--xds-address` names istiod's Service
/// in `ns` (the default) each ready pod of it is asked in turn, by its pod IP with the
/// Service's name for TLS, as istioctl asks every istiod pod. Otherwise (or when no
/// pod can be listed) the one address given is asked.
pub async fn fetch_from_every_replica(
    global: &Global,
    args: &XdsArgs,
    ns: &str,
    type_url: &str,
) -> Result<Vec<DeltaDiscoveryResponse>> {
    let replicas = match service_host(&args.xds_address, ns) {
        Some((host, port)) => replica_addresses(global, ns)
            .await
            .unwrap_or_default()
            .into_iter()
            .map(|ip| {
                let mut replica = args.clone();
                replica.xds_address = format!("{ip}:{port}");
                replica.xds_san = Some(args.xds_san.clone().unwrap_or_else(|| host.clone()));
                replica
            })
            .collect(),
        None => Vec::new(),
    };
    if replicas.is_empty() {
        return Ok(vec![fetch(global, args, ns, type_url).await?]);
    }
    let mut answers = Vec::new();
    let mut failures = Vec::new();
    for replica in &replicas {
        match fetch(global, replica, ns, type_url).await {
            Ok(answer) => answers.push(answer),
            Err(e) => failures.push(format!("{}: {e:#}", replica.xds_address)),
        }
    }
    if answers.is_empty() {
        bail!("no istiod replica answered: {}", failures.join("; "));
    }
    for failure in failures {
        eprintln!("warning: istiod replica {failure}");
    }
    Ok(answers)
}

/// `(host, port)` of `address` when its host is istiod's Service in `ns`.
fn service_host(address: &str, ns: &str) -> Option<(String, String)> {
    let (host, port) = address.rsplit_once(':')?;
    let service = format!("istiod.{ns}.svc");
    (host == service || host == format!("{service}.cluster.local"))
        .then(|| (host.to_owned(), port.to_owned()))
}

/// The pod IPs of istiod's ready replicas (label `app=istiod`).
async fn replica_addresses(global: &Global, ns: &str) -> Result<Vec<String>> {
    let pods: Api<Pod> = Api::namespaced(kubeclient::client(global).await?, ns);
    let list = pods
        .list(&ListParams::default().labels("app=istiod"))
        .await?;
    Ok(list
        .items
        .iter()
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect())
}

/// Sends one request of `type_url` to istiod (in namespace `ns`) and returns its
/// first answer.
pub async fn fetch(
    global: &Global,
    args: &XdsArgs,
    ns: &str,
    type_url: &str,
) -> Result<DeltaDiscoveryResponse> {
    let work = async {
        let token = match &args.token {
            Some(token) => token.clone(),
            None => token_request(global, ns).await?,
        };
        let channel = channel(global, args, ns).await?;
        let request = DeltaDiscoveryRequest {
            node: Some(Node {
                id: format!("istioctl~0.0.0.0~istioctl.{ns}~{ns}.svc.cluster.local"),
                metadata: Some(string_struct([("NAMESPACE", ns)])),
                ..Default::default()
            }),
            type_url: type_url.to_owned(),
            ..Default::default()
        };
        let mut request = tonic::Request::new(tokio_stream::iter([request]));
        let bearer = format!("Bearer {token}")
            .parse()
            .context("the token is not valid header text")?;
        request.metadata_mut().insert("authorization", bearer);
        let mut responses = AggregatedDiscoveryServiceClient::new(channel)
            .delta_aggregated_resources(request)
            .await
            .map_err(|s| {
                anyhow::anyhow!(
                    "istiod refused the XDS request ({:?}): {}",
                    s.code(),
                    s.message()
                )
            })?
            .into_inner();
        match responses.message().await {
            Ok(Some(response)) => Ok(response),
            Ok(None) => bail!("istiod closed the stream without an answer"),
            Err(s) => bail!("the XDS stream failed ({:?}): {}", s.code(), s.message()),
        }
    };
    tokio::time::timeout(args.timeout, work)
        .await
        .with_context(|| {
            format!(
                "no answer from {} within {:?} (--timeout)",
                args.xds_address, args.timeout
            )
        })?
}

async fn token_request(global: &Global, namespace: &str) -> Result<String> {
    let client = kubeclient::client(global).await?;
    let request: TokenRequest = serde_json::from_value(serde_json::json!({
        "spec": {"audiences": [AUDIENCE], "expirationSeconds": 600}
    }))?;
    let answer: TokenRequest = Api::<ServiceAccount>::namespaced(client, namespace)
        .create_subresource("token", "default", &PostParams::default(), &request)
        .await
        .with_context(|| {
            format!("cannot get a token for {namespace}/default (TokenRequest); pass --token")
        })?;
    answer
        .status
        .map(|s| s.token)
        .context("the TokenRequest answer holds no token")
}

async fn channel(global: &Global, args: &XdsArgs, ns: &str) -> Result<Channel> {
    let address = args.xds_address.clone();
    let endpoint = Endpoint::from_shared(format!("http://{address}"))
        .with_context(|| format!("--xds-address {address:?}"))?
        .connect_timeout(args.timeout);
    if args.plaintext {
        return endpoint
            .connect()
            .await
            .with_context(|| format!("cannot connect to {address}"));
    }
    let tls = Arc::new(tls_config(global, args, ns).await?);
    let host = address
        .rsplit_once(':')
        .map_or(address.as_str(), |(host, _)| host)
        .trim_matches(['[', ']'])
        .to_owned();
    let name = ServerName::try_from(args.xds_san.clone().unwrap_or(host))
        .context("--xds-san is not a valid name")?;
    // TLS is done here so that --insecure and --xds-san apply; tonic speaks h2 on top.
    let connector = tower::service_fn(move |_: Uri| {
        let (tls, name, address) = (tls.clone(), name.clone(), address.clone());
        async move {
            let tcp = TcpStream::connect(&address).await?;
            let stream = TlsConnector::from(tls).connect(name, tcp).await?;
            Ok::<_, std::io::Error>(TokioIo::new(stream))
        }
    });
    endpoint
        .connect_with_connector(connector)
        .await
        .with_context(|| format!("cannot reach istiod at {}", args.xds_address))
}

async fn tls_config(global: &Global, args: &XdsArgs, ns: &str) -> Result<ClientConfig> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let mut config = if args.insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
            .with_no_client_auth()
    } else {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(root_pem(global, args, ns).await?.as_bytes()) {
            roots
                .add(cert.context("the mesh root is not PEM")?)
                .context("the mesh root is not a usable certificate")?;
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

async fn root_pem(global: &Global, args: &XdsArgs, ns: &str) -> Result<String> {
    if let Some(dir) = &args.cert_dir {
        let path = dir.join("root-cert.pem");
        return std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()));
    }
    let client = kubeclient::client(global).await?;
    let cm = Api::<ConfigMap>::namespaced(client, ns)
        .get(ROOT_CONFIGMAP)
        .await
        .with_context(|| {
            format!(
                "cannot read ConfigMap {ns}/{ROOT_CONFIGMAP} (or pass --cert-dir or --insecure)"
            )
        })?;
    cm.data
        .and_then(|mut d| d.remove("root-cert.pem"))
        .with_context(|| format!("ConfigMap {ns}/{ROOT_CONFIGMAP} has no root-cert.pem"))
}

/// `--insecure`: any certificate is accepted; signatures are still checked so the
/// handshake is well formed.
#[derive(Debug)]
struct NoVerification(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
