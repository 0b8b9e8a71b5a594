//! The connection to istiod that the CA client (`CA_ADDRESS`) and the xDS client
//! (`XDS_ADDRESS`) each hold: TLS to istiod's serving certificate, ztunnel's packet
//! mark, Istio's keepalive, and the headers every call carries (`authorization:
//! Bearer <token>`, re-read each time since kubelet rotates it, `clusterid`, and the
//! `*_HEADER_<name>` extras).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use shared_types::istio::metadata;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Uri};

use crate::socket;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Istio's control-plane keepalive: a ping every 30 s, dead after 10 s unanswered.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings, with Istio's environment names (`CA_*` or `XDS_*`).
#[derive(Clone, Debug)]
pub struct ControlPlaneConfig {
    /// `CA_ADDRESS` / `XDS_ADDRESS`; `https://` is added when no scheme is given.
    pub address: String,
    /// `CA_ROOT_CA` / `XDS_ROOT_CA`: the root istiod's serving certificate chains to.
    pub root_ca: RootCa,
    /// `AUTH_TOKEN`.
    pub token: TokenSource,
    /// `ISTIO_META_CLUSTER_ID` / `CLUSTER_ID`, sent as the `clusterid` header.
    pub cluster_id: String,
    /// `ALT_CA_HOSTNAME` / `ALT_XDS_HOSTNAME`: the name istiod's certificate is
    /// checked against when the address is not that name (an IP, a tunnel).
    pub alt_hostname: Option<String>,
    /// `CA_HEADER_<name>=<value>` / `XDS_HEADER_<name>=<value>`.
    pub extra_headers: Vec<(String, String)>,
    /// SO_MARK on the connection, so a VM's own capture rules skip it.
    pub packet_mark: u32,
}

impl ControlPlaneConfig {
    /// `<prefix>_HEADER_<name>=<value>` pairs of this process's environment.
    pub fn headers_from_env(prefix: &str) -> Vec<(String, String)> {
        let prefix = format!("{prefix}_HEADER_");
        std::env::vars()
            .filter_map(|(k, v)| Some((k.strip_prefix(&prefix)?.to_owned(), v)))
            .collect()
    }
}

/// `*_ROOT_CA`: an existing path is a file; anything else is inline PEM.
#[derive(Clone, Debug)]
pub enum RootCa {
    File(PathBuf),
    Pem(String),
}

impl FromStr for RootCa {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "SYSTEM" {
            return Err("SYSTEM (the OS trust store) is not supported: give the mesh root as a file or inline PEM".into());
        }
        let path = PathBuf::from(s);
        if path.is_file() {
            Ok(RootCa::File(path))
        } else if s.contains("-----BEGIN CERTIFICATE-----") {
            Ok(RootCa::Pem(s.to_owned()))
        } else {
            Err(format!(
                "{s:?} is neither an existing file nor PEM (istiod's root; Istio mounts it from the ConfigMap istio-ca-root-cert)"
            ))
        }
    }
}

impl RootCa {
    fn pem(&self) -> Result<String, ControlPlaneError> {
        let pem = match self {
            RootCa::File(path) => std::fs::read_to_string(path).map_err(|e| {
                ControlPlaneError::Config(format!("cannot read the root {}: {e}", path.display()))
            })?,
            RootCa::Pem(pem) => pem.clone(),
        };
        match CertificateDer::pem_slice_iter(pem.as_bytes()).next() {
            Some(Ok(_)) => Ok(pem),
            _ => Err(ControlPlaneError::Config(
                "the root holds no PEM certificate".into(),
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

    fn read(&self) -> Result<Option<String>, ControlPlaneError> {
        match self {
            TokenSource::File(path) => std::fs::read_to_string(path)
                .map(|t| Some(t.trim().to_owned()))
                .map_err(|e| ControlPlaneError::Token(format!("{}: {e}", path.display()))),
            TokenSource::Literal(token) => Ok(Some(token.clone())),
            TokenSource::None => Ok(None),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    #[error("control plane client configuration: {0}")]
    Config(String),
    #[error("cannot read the service-account token {0}")]
    Token(String),
}

/// One channel to istiod (connected lazily, reconnected by tonic) and the headers
/// every call on it carries.
#[derive(Clone)]
pub struct ControlPlane {
    channel: Channel,
    token: TokenSource,
    headers: Vec<(AsciiMetadataKey, AsciiMetadataValue)>,
}

impl ControlPlane {
    pub fn new(config: &ControlPlaneConfig) -> Result<Self, ControlPlaneError> {
        let bad = |what: String| ControlPlaneError::Config(what);
        let address = if config.address.contains("://") {
            config.address.clone()
        } else {
            format!("https://{}", config.address)
        };
        let uri: Uri = address
            .parse()
            .map_err(|e| bad(format!("address {address:?}: {e}")))?;
        let host = uri
            .host()
            .ok_or_else(|| bad(format!("address {address:?} has no host")))?;
        let server_name = config
            .alt_hostname
            .clone()
            .unwrap_or_else(|| host.trim_matches(['[', ']']).to_owned());
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(config.root_ca.pem()?))
            .domain_name(server_name);
        let endpoint = Endpoint::from(uri)
            .tls_config(tls)
            .map_err(|e| bad(format!("TLS: {e}")))?
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        let mark = config.packet_mark;
        let channel = endpoint.connect_with_connector_lazy(tower::service_fn(move |uri: Uri| {
            connect_marked(uri, mark)
        }));
        let mut headers = Vec::with_capacity(config.extra_headers.len() + 1);
        let cluster = AsciiMetadataValue::from_str(&config.cluster_id)
            .map_err(|_| bad("CLUSTER_ID is not valid header text".into()))?;
        headers.push((AsciiMetadataKey::from_static(metadata::CLUSTER_ID), cluster));
        for (k, v) in &config.extra_headers {
            let key = AsciiMetadataKey::from_str(&k.to_ascii_lowercase())
                .map_err(|_| bad(format!("header {k}: bad name")))?;
            let value = AsciiMetadataValue::from_str(v)
                .map_err(|_| bad(format!("header {k}: bad value")))?;
            headers.push((key, value));
        }
        Ok(ControlPlane {
            channel,
            token: config.token.clone(),
            headers,
        })
    }

    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// `message` as a request with the token (read now) and the fixed headers.
    pub fn request<T>(&self, message: T) -> Result<tonic::Request<T>, ControlPlaneError> {
        let mut request = tonic::Request::new(message);
        let md = request.metadata_mut();
        if let Some(token) = self.token.read()? {
            let bearer =
                AsciiMetadataValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                    ControlPlaneError::Token("the token is not valid header text".into())
                })?;
            md.insert(metadata::AUTHORIZATION, bearer);
        }
        for (key, value) in &self.headers {
            md.insert(key.clone(), value.clone());
        }
        Ok(request)
    }
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
}
