//! The client of istiod's certificate service (`CA_ADDRESS`).
//!
//! For each identity: a fresh P-256 key and CSR, `CreateCertificate` with the
//! node's service-account token (re-read for every call, since kubelet rotates
//! it), and in shared mode `ImpersonatedIdentity` naming the pod's identity. The
//! answer is only accepted if its leaf carries exactly that identity, certifies
//! the key we sent, and chains to the root it came with.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use shared_types::istio::ca::{IstioCertificateRequest, IstioCertificateServiceClient};
use shared_types::istio::metadata;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Uri};
use tonic::Code;

use super::{Identity, WorkloadCertificate};
use crate::socket;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Istio's control-plane keepalive: a ping every 30 s, dead after 10 s unanswered.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings, with Istio's environment names.
#[derive(Clone, Debug)]
pub struct CaClientConfig {
    /// `CA_ADDRESS`; `https://` is added when no scheme is given.
    pub address: String,
    /// `CA_ROOT_CA`: the root that istiod's serving certificate chains to.
    pub root_ca: RootCa,
    /// `AUTH_TOKEN`.
    pub token: TokenSource,
    /// `ISTIO_META_CLUSTER_ID` / `CLUSTER_ID`, sent as the `clusterid` header.
    pub cluster_id: String,
    /// `ALT_CA_HOSTNAME`: the name istiod's certificate is checked against when
    /// the address is not that name (an IP, a tunnel).
    pub alt_hostname: Option<String>,
    /// Shared mode asks for its pods' identities, not its own.
    pub impersonate: bool,
    /// `CA_HEADER_<name>=<value>`: extra request headers.
    pub extra_headers: Vec<(String, String)>,
    /// SO_MARK on the connection, so a VM's own capture rules skip it.
    pub packet_mark: u32,
}

/// `CA_ROOT_CA`: an existing path is a file; anything else is inline PEM.
#[derive(Clone, Debug)]
pub enum RootCa {
    File(PathBuf),
    Pem(String),
}

impl FromStr for RootCa {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "SYSTEM" {
            return Err("CA_ROOT_CA=SYSTEM (the OS trust store) is not supported: give the mesh root as a file or inline PEM".into());
        }
        let path = PathBuf::from(s);
        if path.is_file() {
            Ok(RootCa::File(path))
        } else if s.contains("-----BEGIN CERTIFICATE-----") {
            Ok(RootCa::Pem(s.to_owned()))
        } else {
            Err(format!(
                "CA_ROOT_CA {s:?} is neither an existing file nor PEM (istiod's root; Istio mounts it from the ConfigMap istio-ca-root-cert)"
            ))
        }
    }
}

impl RootCa {
    fn pem(&self) -> Result<String, CaClientError> {
        let pem = match self {
            RootCa::File(path) => std::fs::read_to_string(path).map_err(|e| {
                CaClientError::Config(format!("cannot read CA_ROOT_CA {}: {e}", path.display()))
            })?,
            RootCa::Pem(pem) => pem.clone(),
        };
        match CertificateDer::pem_slice_iter(pem.as_bytes()).next() {
            Some(Ok(_)) => Ok(pem),
            _ => Err(CaClientError::Config(
                "CA_ROOT_CA holds no PEM certificate".into(),
            )),
        }
    }
}

/// `AUTH_TOKEN`: an existing path is a token file (re-read for every call);
/// anything else is the token itself.
#[derive(Clone, Debug)]
pub enum TokenSource {
    File(PathBuf),
    Literal(String),
    None,
}

impl TokenSource {
    pub fn from_setting(value: Option<&str>, default_path: &str) -> Self {
        match value {
            Some(v) if PathBuf::from(v).is_file() => TokenSource::File(v.into()),
            Some(v) if !v.is_empty() => TokenSource::Literal(v.to_owned()),
            _ if PathBuf::from(default_path).is_file() => TokenSource::File(default_path.into()),
            _ => TokenSource::None,
        }
    }

    fn read(&self) -> Result<Option<String>, CaClientError> {
        match self {
            TokenSource::File(path) => std::fs::read_to_string(path)
                .map(|t| Some(t.trim().to_owned()))
                .map_err(|e| CaClientError::Token(format!("{}: {e}", path.display()))),
            TokenSource::Literal(token) => Ok(Some(token.clone())),
            TokenSource::None => Ok(None),
        }
    }
}

/// Why a certificate request failed.
#[derive(Debug, thiserror::Error)]
pub enum CaClientError {
    #[error("CA client configuration: {0}")]
    Config(String),
    #[error("cannot read the service-account token {0}")]
    Token(String),
    #[error("cannot build the CSR: {0}")]
    Csr(#[from] mesh_ca::CsrError),
    #[error("the CA is unreachable: {0}")]
    Unavailable(String),
    #[error("the CA refused the request ({code:?}): {message}")]
    Refused { code: Code, message: String },
    #[error("the CA's answer is not usable: {0}")]
    BadResponse(String),
}

impl CaClientError {
    pub fn reason(&self) -> &'static str {
        match self {
            CaClientError::Config(_) => "config",
            CaClientError::Token(_) => "token",
            CaClientError::Csr(_) => "csr",
            CaClientError::Unavailable(_) => "unavailable",
            CaClientError::Refused { code, .. } if *code == Code::Unauthenticated => {
                "unauthenticated"
            }
            CaClientError::Refused { .. } => "refused",
            CaClientError::BadResponse(_) => "bad_response",
        }
    }
}

/// One channel to istiod (connected lazily, reconnected by tonic) shared by all fetches.
pub struct CaClient {
    channel: Channel,
    config: CaClientConfig,
    headers: Vec<(AsciiMetadataKey, AsciiMetadataValue)>,
}

impl CaClient {
    pub fn new(config: CaClientConfig) -> Result<Self, CaClientError> {
        let address = if config.address.contains("://") {
            config.address.clone()
        } else {
            format!("https://{}", config.address)
        };
        let uri: Uri = address
            .parse()
            .map_err(|e| CaClientError::Config(format!("CA_ADDRESS {address:?}: {e}")))?;
        let host = uri
            .host()
            .ok_or_else(|| CaClientError::Config(format!("CA_ADDRESS {address:?} has no host")))?;
        let server_name = config
            .alt_hostname
            .clone()
            .unwrap_or_else(|| host.trim_matches(['[', ']']).to_owned());
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(config.root_ca.pem()?))
            .domain_name(server_name);
        let endpoint = Endpoint::from(uri)
            .tls_config(tls)
            .map_err(|e| CaClientError::Config(format!("TLS: {e}")))?
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        let mark = config.packet_mark;
        let channel = endpoint.connect_with_connector_lazy(tower::service_fn(move |uri: Uri| {
            connect_marked(uri, mark)
        }));
        let headers = config
            .extra_headers
            .iter()
            .map(|(k, v)| {
                let key = AsciiMetadataKey::from_str(&k.to_ascii_lowercase()).map_err(|_| {
                    CaClientError::Config(format!("CA_HEADER_{k}: bad header name"))
                })?;
                let value = AsciiMetadataValue::from_str(v)
                    .map_err(|_| CaClientError::Config(format!("CA_HEADER_{k}: bad value")))?;
                Ok((key, value))
            })
            .collect::<Result<_, CaClientError>>()?;
        Ok(CaClient {
            channel,
            config,
            headers,
        })
    }

    /// A leaf for `id`, valid for `lifetime` unless the CA shortens it.
    pub async fn fetch(
        &self,
        id: &Identity,
        lifetime: Duration,
    ) -> Result<WorkloadCertificate, CaClientError> {
        let (key, csr) = mesh_ca::csr::new_csr(id)?;
        let mut body = IstioCertificateRequest {
            csr,
            validity_duration: i64::try_from(lifetime.as_secs()).unwrap_or(i64::MAX),
            metadata: None,
        };
        if self.config.impersonate {
            body = body.with_impersonated_identity(&id.to_uri());
        }
        let mut request = tonic::Request::new(body);
        let md = request.metadata_mut();
        if let Some(token) = self.config.token.read()? {
            let bearer = AsciiMetadataValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| CaClientError::Token("the token is not valid header text".into()))?;
            md.insert(metadata::AUTHORIZATION, bearer);
        }
        let cluster = AsciiMetadataValue::from_str(&self.config.cluster_id)
            .map_err(|_| CaClientError::Config("CLUSTER_ID is not valid header text".into()))?;
        md.insert(metadata::CLUSTER_ID, cluster);
        for (key, value) in &self.headers {
            md.insert(key.clone(), value.clone());
        }

        let mut client = IstioCertificateServiceClient::new(self.channel.clone());
        let response =
            client
                .create_certificate(request)
                .await
                .map_err(|status| match status.code() {
                    Code::Unavailable
                    | Code::DeadlineExceeded
                    | Code::Cancelled
                    | Code::Unknown => CaClientError::Unavailable(status.message().to_owned()),
                    code => CaClientError::Refused {
                        code,
                        message: status.message().to_owned(),
                    },
                })?;
        into_certificate(id, response.into_inner().cert_chain, key)
    }
}

/// Leaf first, then its chain, then the roots. Every element is read whole: Istio's
/// istiod sends its root bundle as one last element, istiod-lite one certificate per
/// element. The trailing self-signed certificates are the roots (at least the last
/// one), so every root of a bundle is trusted, as during a root rotation.
fn into_certificate(
    id: &Identity,
    pems: Vec<String>,
    key: rustls::pki_types::PrivatePkcs8KeyDer<'static>,
) -> Result<WorkloadCertificate, CaClientError> {
    let mut certs = Vec::with_capacity(pems.len());
    for pem in &pems {
        let before = certs.len();
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            certs.push(cert.map_err(|e| {
                CaClientError::BadResponse(format!("a chain element is not PEM: {e}"))
            })?);
        }
        if certs.len() == before {
            return Err(CaClientError::BadResponse(
                "a chain element holds no certificate".into(),
            ));
        }
    }
    if certs.len() < 2 {
        return Err(CaClientError::BadResponse(format!(
            "expected the leaf and the root, got {} certificates",
            certs.len()
        )));
    }
    let more_roots = certs[1..certs.len() - 1]
        .iter()
        .rev()
        .take_while(|c| self_signed(c))
        .count();
    let roots = certs.split_off(certs.len() - 1 - more_roots);
    WorkloadCertificate::from_issued(id, certs, roots, key).map_err(CaClientError::BadResponse)
}

fn self_signed(cert: &CertificateDer<'_>) -> bool {
    x509_parser::parse_x509_certificate(cert)
        .is_ok_and(|(_, x509)| x509.subject().as_raw() == x509.issuer().as_raw())
}

/// TCP to istiod with ztunnel's packet mark; TLS is layered on top by tonic.
async fn connect_marked(uri: Uri, mark: u32) -> std::io::Result<TokioIo<tokio::net::TcpStream>> {
    let host = uri.host().unwrap_or_default().trim_matches(['[', ']']);
    let port = uri.port_u16().unwrap_or(443);
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port)).await?.collect();
    let mut last = std::io::Error::other(format!("{host} resolves to no address"));
    for addr in addrs {
        let socket = socket::into_tokio_socket(socket::marked_socket(addr, mark)?)?;
        match socket.connect(addr).await {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                return Ok(TokioIo::new(stream));
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_ca_is_a_file_or_inline_pem_never_system() {
        let ca = mesh_ca::CertificateAuthority::generate_self_signed("cluster.local").unwrap();
        let pem = ca.roots_pem();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("root-cert.pem");
        std::fs::write(&file, &pem).unwrap();
        assert!(matches!(
            file.to_str().unwrap().parse(),
            Ok(RootCa::File(_))
        ));
        assert!(matches!(pem.parse(), Ok(RootCa::Pem(_))));
        assert!("SYSTEM".parse::<RootCa>().is_err());
        assert!("/no/such/file".parse::<RootCa>().is_err());
        let garbage = RootCa::Pem("-----BEGIN CERTIFICATE-----\n!!\n".into());
        assert!(garbage.pem().is_err());
    }

    #[test]
    fn token_is_a_file_reread_each_time_or_a_literal() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("istio-token");
        std::fs::write(&file, "first\n").unwrap();
        let source = TokenSource::from_setting(file.to_str(), "/nonexistent");
        assert_eq!(source.read().unwrap().as_deref(), Some("first"));
        std::fs::write(&file, "rotated").unwrap();
        assert_eq!(source.read().unwrap().as_deref(), Some("rotated"));
        let literal = TokenSource::from_setting(Some("abc"), "/nonexistent");
        assert_eq!(literal.read().unwrap().as_deref(), Some("abc"));
        let default = TokenSource::from_setting(None, file.to_str().unwrap());
        assert!(matches!(default, TokenSource::File(_)));
        assert!(matches!(
            TokenSource::from_setting(None, "/nonexistent"),
            TokenSource::None
        ));
    }

    /// A root bundle of two (a rotation): the leaf verifies whichever root issued it,
    /// and both roots are trusted, in istiod-lite's shape and in Istio's.
    #[test]
    fn every_root_of_a_bundle_is_trusted() {
        let td = "cluster.local";
        let dir = tempfile::tempdir().unwrap();
        let issuing = mesh_ca::CertificateAuthority::generate_self_signed(td).unwrap();
        let other = mesh_ca::CertificateAuthority::generate_self_signed(td).unwrap();
        issuing.write(dir.path()).unwrap();
        let bundle = issuing.roots_pem() + &other.roots_pem();
        std::fs::write(dir.path().join("root-cert.pem"), &bundle).unwrap();
        let ca = mesh_ca::CertificateAuthority::load(dir.path()).unwrap();

        let id = Identity::new(td, "a", "b");
        let (key, csr) = mesh_ca::csr::new_csr(&id).unwrap();
        let csr = mesh_ca::csr::CertificateRequest::parse_pem(&csr).unwrap();
        let issued = ca
            .issue_for_key(csr.public_key(), &id, std::time::Duration::from_secs(600))
            .unwrap();
        let leaf_pem = issued.to_pem_list().remove(0);
        for (shape, pems) in [
            ("one per element", issued.to_pem_list()),
            ("bundle last", vec![leaf_pem.clone(), bundle.clone()]),
        ] {
            let cert = into_certificate(&id, pems, key.clone_key())
                .unwrap_or_else(|e| panic!("{shape}: {e}"));
            assert_eq!(cert.chain.len(), 1, "{shape}");
            let roots: std::collections::BTreeSet<&[u8]> =
                cert.roots.iter().map(|r| r.as_ref()).collect();
            assert_eq!(roots.len(), 2, "{shape}");
        }
    }

    #[test]
    fn answers_without_leaf_and_root_are_refused() {
        let id = Identity::new("cluster.local", "a", "b");
        let (key, _) = mesh_ca::csr::new_csr(&id).unwrap();
        let err = into_certificate(&id, vec![], key.clone_key()).unwrap_err();
        assert_eq!(err.reason(), "bad_response");
        let err = into_certificate(&id, vec!["junk".into(), "junk".into()], key).unwrap_err();
        assert_eq!(err.reason(), "bad_response");
    }
}
