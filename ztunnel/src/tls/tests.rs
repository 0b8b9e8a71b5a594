//! Real handshakes (HBONE's, [`connect`] and [`accept`], over an in-memory duplex
//! pipe) for every accept/refuse case.

use std::io;
use std::net::Ipv4Addr;
use std::time::{Duration, SystemTime};

use rcgen::{CertificateParams, KeyPair, SanType};
use rustls::client::ClientConnectionData;
use rustls::pki_types::ServerName;
use rustls::server::ServerConnectionData;
use rustls::CipherSuite;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::*;
use crate::identity::CertificateAuthority;

const DAY: Duration = Duration::from_secs(24 * 3600);

fn ca() -> CertificateAuthority {
    CertificateAuthority::generate_self_signed("cluster.local").unwrap()
}

fn client_id() -> Identity {
    Identity::new("cluster.local", "default", "client")
}

fn server_id() -> Identity {
    Identity::new("cluster.local", "default", "server")
}

fn expired(ca: &CertificateAuthority, id: &Identity) -> WorkloadCertificate {
    let now = SystemTime::now();
    ca.issue_with_validity(id, now - 2 * DAY, now - DAY)
        .unwrap()
}

type Outcome = (
    io::Result<TlsStream<ClientConnectionData, DuplexStream>>,
    io::Result<TlsStream<ServerConnectionData, DuplexStream>>,
);

async fn handshake(client: Arc<ClientConfig>, server: Arc<ServerConfig>) -> Outcome {
    let (c, s) = tokio::io::duplex(64 * 1024);
    // An IP, as the HBONE pool passes; the verifier ignores it.
    let name = ServerName::IpAddress(Ipv4Addr::LOCALHOST.into());
    let both = async { tokio::join!(connect(client, name, c), accept(server, s)) };
    tokio::time::timeout(Duration::from_secs(10), both)
        .await
        .expect("handshake hung")
}

/// The client refuses the server; the server then sees the alert.
async fn client_refuses(client: Arc<ClientConfig>, server: Arc<ServerConfig>, want: &str) {
    let (c, s) = handshake(client, server).await;
    let Err(err) = c else {
        panic!("the client must refuse")
    };
    let err = err.to_string();
    assert!(err.contains(want), "client error {err:?} lacks {want:?}");
    assert!(s.is_err(), "the server must fail too");
}

/// The server refuses the client. In TLS 1.3 the client may already consider the
/// handshake done; it must then see the alert on its first read.
async fn server_refuses(client: Arc<ClientConfig>, server: Arc<ServerConfig>, want: &str) {
    let (c, s) = handshake(client, server).await;
    let Err(err) = s else {
        panic!("the server must refuse")
    };
    let err = err.to_string();
    assert!(err.contains(want), "server error {err:?} lacks {want:?}");
    // The client finished its side before the server checked its certificate: its
    // first read gets the server's alert, not just a closed connection.
    let err = match c {
        Ok(mut c) => c.read(&mut [0u8; 1]).await.unwrap_err(),
        Err(e) => e,
    };
    assert!(err.to_string().contains("alert"), "client error {err}");
}

#[tokio::test]
async fn mutual_handshake_yields_both_identities() {
    let ca = ca();
    let client = ca.issue(&client_id(), DAY).unwrap();
    let server = ca.issue(&server_id(), DAY).unwrap();
    let other = Identity::new("cluster.local", "other", "server");
    let (c, s) = handshake(
        client_config(&client, vec![other, server_id()]).unwrap(),
        server_config(&server).unwrap(),
    )
    .await;
    let (mut c, mut s) = (c.unwrap(), s.unwrap());

    assert_eq!(c.peer_identity(), Some(&server_id()));
    assert_eq!(s.peer_identity(), Some(&client_id()));
    let suites = [
        CipherSuite::TLS13_AES_256_GCM_SHA384,
        CipherSuite::TLS13_AES_128_GCM_SHA256,
    ];
    for (alpn, suite) in [
        (c.alpn_protocol(), c.negotiated_cipher_suite()),
        (s.alpn_protocol(), s.negotiated_cipher_suite()),
    ] {
        assert_eq!(alpn, Some(ALPN_H2));
        assert!(suites.contains(&suite.suite()), "{suite:?}");
        assert!(suite.tls13().is_some());
    }

    c.write_all(b"ping").await.unwrap();
    c.flush().await.unwrap();
    let mut buf = [0u8; 4];
    s.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping");
    s.write_all(b"pong").await.unwrap();
    s.flush().await.unwrap();
    c.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"pong");
}

#[tokio::test]
async fn client_refuses_unexpected_server_identity() {
    let ca = ca();
    let client = ca.issue(&client_id(), DAY).unwrap();
    let server = ca
        .issue(&Identity::new("cluster.local", "default", "impostor"), DAY)
        .unwrap();
    client_refuses(
        client_config(&client, vec![server_id()]).unwrap(),
        server_config(&server).unwrap(),
        "server identity spiffe://cluster.local/ns/default/sa/impostor is not the expected \
         spiffe://cluster.local/ns/default/sa/server",
    )
    .await;
}

#[tokio::test]
async fn server_refuses_client_from_another_trust_domain() {
    let ca = ca();
    let client = ca
        .issue(&Identity::new("other.domain", "default", "client"), DAY)
        .unwrap();
    let server = ca.issue(&server_id(), DAY).unwrap();
    server_refuses(
        client_config(&client, vec![server_id()]).unwrap(),
        server_config(&server).unwrap(),
        "client identity spiffe://other.domain/ns/default/sa/client is not in the trust domain \
         cluster.local",
    )
    .await;
}

#[tokio::test]
async fn client_refuses_expired_server_leaf() {
    let ca = ca();
    let client = ca.issue(&client_id(), DAY).unwrap();
    let server = expired(&ca, &server_id());
    client_refuses(
        client_config(&client, vec![server_id()]).unwrap(),
        server_config(&server).unwrap(),
        "certificate expired",
    )
    .await;
}

#[tokio::test]
async fn server_refuses_expired_client_leaf() {
    let ca = ca();
    let client = expired(&ca, &client_id());
    let server = ca.issue(&server_id(), DAY).unwrap();
    server_refuses(
        client_config(&client, vec![server_id()]).unwrap(),
        server_config(&server).unwrap(),
        "certificate expired",
    )
    .await;
}

#[tokio::test]
async fn server_refuses_client_leaf_from_another_root() {
    let client = ca().issue(&client_id(), DAY).unwrap();
    let server = ca().issue(&server_id(), DAY).unwrap();
    // The client trusts the server's root, so only the server's check can fail.
    let trusting = client_builder(&server, vec![server_id()])
        .unwrap()
        .with_client_auth_cert(client.chain.clone(), client.private_key())
        .unwrap();
    server_refuses(
        Arc::new(finish_client(trusting)),
        server_config(&server).unwrap(),
        // Both roots are named O=cluster.local: the issuer name matches, the signature not.
        "BadSignature",
    )
    .await;
}

#[tokio::test]
async fn client_refuses_server_leaf_from_another_root() {
    let client = ca().issue(&client_id(), DAY).unwrap();
    let server = ca().issue(&server_id(), DAY).unwrap();
    client_refuses(
        client_config(&client, vec![server_id()]).unwrap(),
        server_config(&server).unwrap(),
        // Both roots are named O=cluster.local: the issuer name matches, the signature not.
        "BadSignature",
    )
    .await;
}

#[tokio::test]
async fn server_requires_a_client_certificate() {
    let ca = ca();
    let client = ca.issue(&client_id(), DAY).unwrap();
    let server = ca.issue(&server_id(), DAY).unwrap();
    let anonymous = client_builder(&client, vec![server_id()])
        .unwrap()
        .with_no_client_auth();
    server_refuses(
        Arc::new(finish_client(anonymous)),
        server_config(&server).unwrap(),
        "peer sent no certificates",
    )
    .await;
}

#[tokio::test]
async fn server_refuses_tls12() {
    let ca = ca();
    let client = ca.issue(&client_id(), DAY).unwrap();
    let server = ca.issue(&server_id(), DAY).unwrap();
    let provider = Arc::new(aws_lc_rs::default_provider());
    let verifier = ExpectedIdentityVerifier::new(
        root_store(&client.roots).unwrap(),
        vec![server_id()],
        &provider,
    );
    let tls12 = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_auth_cert(client.chain.clone(), client.private_key())
        .unwrap();
    let (c, s) = handshake(Arc::new(tls12), server_config(&server).unwrap()).await;
    assert!(c.is_err() && s.is_err());
}

#[test]
fn client_config_needs_an_expected_identity() {
    let client = ca().issue(&client_id(), DAY).unwrap();
    let err = client_config(&client, vec![]).unwrap_err();
    assert!(matches!(err, TlsError::NoExpectedIdentity), "{err}");
}

#[test]
fn identity_from_cert_is_strict() {
    let leaf = ca().issue(&client_id(), DAY).unwrap();
    assert_eq!(identity_from_cert(&leaf.chain[0]).unwrap(), client_id());

    let garbage = CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01]);
    assert!(matches!(
        identity_from_cert(&garbage),
        Err(TlsError::BadCertificate(_))
    ));

    let cert_with = |sans: Vec<SanType>| {
        let mut params = CertificateParams::default();
        params.subject_alt_names = sans;
        let key = KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().clone()
    };
    let uri = |s: &str| SanType::URI(s.try_into().unwrap());
    let dns_only = cert_with(vec![SanType::DnsName("example.com".try_into().unwrap())]);
    assert!(matches!(
        identity_from_cert(&dns_only),
        Err(TlsError::UriSanCount(0))
    ));
    let two = cert_with(vec![uri(&client_id().to_uri()), uri(&server_id().to_uri())]);
    assert!(matches!(
        identity_from_cert(&two),
        Err(TlsError::UriSanCount(2))
    ));
    let https = cert_with(vec![uri("https://cluster.local/ns/a/sa/b")]);
    assert!(matches!(
        identity_from_cert(&https),
        Err(TlsError::BadIdentity(_))
    ));
}
