//! The record layer against rustls' own (tokio-rustls and rustls' buffered connection on
//! the other end) and against itself: data both ways in records split across reads,
//! key updates either side asks for, data that rides with the handshake, close_notify,
//! and what a broken peer sends refused.

use std::io::Write;
use std::net::Ipv4Addr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::*;
use crate::identity::CertificateAuthority;
use crate::tls::{client_config, server_config};

/// Small enough that most records arrive in pieces.
const PIPE: usize = 1000;

fn configs() -> (Arc<ClientConfig>, Arc<ServerConfig>) {
    let ca = CertificateAuthority::generate_self_signed("cluster.local").unwrap();
    let day = Duration::from_secs(24 * 3600);
    let server_id = Identity::new("cluster.local", "default", "server");
    let client = ca
        .issue(&Identity::new("cluster.local", "default", "client"), day)
        .unwrap();
    let server = ca.issue(&server_id, day).unwrap();
    (
        client_config(&client, vec![server_id]).unwrap(),
        server_config(&server).unwrap(),
    )
}

fn name() -> ServerName<'static> {
    ServerName::IpAddress(Ipv4Addr::LOCALHOST.into())
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// `data` from `w` to `r`, written and read at once (the pipe holds little).
async fn one_way(w: &mut (impl AsyncWrite + Unpin), r: &mut (impl AsyncRead + Unpin), data: &[u8]) {
    let mut got = vec![0; data.len()];
    let (wrote, read) = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(
            async {
                w.write_all(data).await?;
                w.flush().await
            },
            r.read_exact(&mut got)
        )
    })
    .await
    .expect("transfer hung");
    wrote.unwrap();
    read.unwrap();
    assert!(got == data, "{} bytes arrived changed", data.len());
}

async fn both_ways(
    a: &mut (impl AsyncRead + AsyncWrite + Unpin),
    b: &mut (impl AsyncRead + AsyncWrite + Unpin),
) {
    for (i, len) in [1, 100, 16 * 1024, 16 * 1024 + 1, 300_000]
        .into_iter()
        .enumerate()
    {
        one_way(a, b, &pattern(len, i as u8)).await;
        one_way(b, a, &pattern(len, 100 + i as u8)).await;
    }
}

/// Ours against rustls' record layer: plain traffic, a key update rustls asks for
/// (we answer with ours), one we ask for, ours at a low record count, then each
/// side's close_notify seen by the other as the end of the stream.
async fn against_rustls<D: Unpin, R: AsyncRead + AsyncWrite + Unpin>(
    ours: &mut TlsStream<D, DuplexStream>,
    theirs: &mut R,
    refresh_theirs: impl Fn(&mut R),
) {
    both_ways(ours, theirs).await;
    refresh_theirs(theirs);
    both_ways(ours, theirs).await;
    ours.request_key_update();
    both_ways(ours, theirs).await;
    ours.set_key_update_after(3);
    both_ways(ours, theirs).await;

    ours.shutdown().await.unwrap();
    let mut rest = Vec::new();
    theirs.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
    theirs.shutdown().await.unwrap();
    assert_eq!(
        ours.read(&mut [0; 8]).await.unwrap(),
        0,
        "close_notify is the end"
    );
}

#[tokio::test]
async fn our_client_and_a_rustls_server_interoperate() {
    let (client, server) = configs();
    let (c, s) = tokio::io::duplex(PIPE);
    let (ours, theirs) = tokio::join!(
        connect(client, name(), c),
        TlsAcceptor::from(server).accept(s)
    );
    let (mut ours, mut theirs) = (ours.unwrap(), theirs.unwrap());
    against_rustls(&mut ours, &mut theirs, |t| {
        t.get_mut().1.refresh_traffic_keys().unwrap()
    })
    .await;
}

#[tokio::test]
async fn a_rustls_client_and_our_server_interoperate() {
    let (client, server) = configs();
    let (c, s) = tokio::io::duplex(PIPE);
    let (theirs, ours) = tokio::join!(
        TlsConnector::from(client).connect(name(), c),
        accept(server, s)
    );
    let (mut ours, mut theirs) = (ours.unwrap(), theirs.unwrap());
    assert_eq!(
        ours.peer_identity(),
        Some(&Identity::new("cluster.local", "default", "client"))
    );
    against_rustls(&mut ours, &mut theirs, |t| {
        t.get_mut().1.refresh_traffic_keys().unwrap()
    })
    .await;
}

#[tokio::test]
async fn our_ends_change_keys_every_few_records() {
    let (client, server) = configs();
    let (c, s) = tokio::io::duplex(PIPE);
    let (c, s) = tokio::join!(connect(client, name(), c), accept(server, s));
    let (mut c, mut s) = (c.unwrap(), s.unwrap());
    c.set_key_update_after(1);
    s.set_key_update_after(2);
    both_ways(&mut c, &mut s).await;
    c.request_key_update();
    s.request_key_update();
    both_ways(&mut c, &mut s).await;
    c.shutdown().await.unwrap();
    assert_eq!(s.read(&mut [0; 8]).await.unwrap(), 0);
    // Writing after our close_notify is an error, not a record the peer drops.
    assert!(c.write_all(b"late").await.is_err());
}

/// A client's first bytes right behind its Finished, in the same read as it, reach
/// the server's reader first, before anything after them.
#[tokio::test]
async fn data_riding_with_the_handshake_is_read_first() {
    let (client, server) = configs();
    let (mut c, s) = tokio::io::duplex(64 * 1024);
    let server = tokio::spawn(async move {
        let mut tls = accept(server, s).await.unwrap();
        let mut got = vec![0; 11 + 300_000];
        tls.read_exact(&mut got).await.unwrap();
        got
    });
    let mut conn = rustls::ClientConnection::new(client, name()).unwrap();
    let mut wire = Vec::new();
    let mut buf = vec![0; 64 * 1024];
    while conn.is_handshaking() {
        while conn.wants_write() {
            conn.write_tls(&mut wire).unwrap();
        }
        if !conn.is_handshaking() {
            break;
        }
        c.write_all(&wire).await.unwrap();
        wire.clear();
        let n = c.read(&mut buf).await.unwrap();
        conn.read_tls(&mut &buf[..n]).unwrap();
        conn.process_new_packets().unwrap();
    }
    // The Finished, the first bytes and more, in one write.
    let more = pattern(300_000, 7);
    conn.set_buffer_limit(None);
    conn.writer().write_all(b"early bird ").unwrap();
    conn.writer().write_all(&more).unwrap();
    while conn.wants_write() {
        conn.write_tls(&mut wire).unwrap();
    }
    let writing = async {
        c.write_all(&wire).await.unwrap();
        c
    };
    let (got, _c) = tokio::join!(server, writing);
    let got = got.unwrap();
    assert_eq!(&got[..11], b"early bird ");
    assert!(got[11..] == more[..]);
}

/// What a broken or hostile peer sends after the handshake: each fails the read
/// side with a clear error (again on every later read), never a panic, never data.
#[tokio::test]
async fn a_peers_bad_records_are_refused() {
    let cases: [(&[u8], &str); 4] = [
        (&[23, 3, 3, 0, 32, 1, 2, 3], "bad_record_mac"),
        (&[22, 3, 3, 0, 5, 1, 2, 3, 4, 5], "type 22"),
        (&[23, 3, 3, 0xff, 0xff], "65535 bytes"),
        (&[23, 3, 3, 0, 1, 0], "1 bytes"),
    ];
    for (bytes, want) in cases {
        let (client, server) = configs();
        let (c, s) = tokio::io::duplex(64 * 1024);
        let (ours, theirs) = tokio::join!(
            connect(client, name(), c),
            TlsAcceptor::from(server).accept(s)
        );
        let (mut ours, mut theirs) = (ours.unwrap(), theirs.unwrap());
        let mut bytes = bytes.to_vec();
        bytes.resize(bytes.len().max(5 + 32), 0xab);
        theirs.get_mut().0.write_all(&bytes).await.unwrap();
        for _ in 0..2 {
            let err = ours.read(&mut [0; 64]).await.unwrap_err();
            assert!(err.to_string().contains(want), "{err} lacks {want:?}");
        }
    }

    // The peer's TCP closing with no close_notify: an unexpected end, not a clean one.
    let (client, server) = configs();
    let (c, s) = tokio::io::duplex(64 * 1024);
    let (ours, theirs) = tokio::join!(
        connect(client, name(), c),
        TlsAcceptor::from(server).accept(s)
    );
    let mut ours = ours.unwrap();
    drop(theirs);
    let err = ours.read(&mut [0; 64]).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
}

/// A client that sends garbage instead of a ClientHello: the handshake fails with an
/// error, the client gets a fatal alert, and nothing panics (rustls asserts that it
/// sends one fatal alert at most).
#[tokio::test]
async fn garbage_instead_of_a_handshake_is_refused_with_an_alert() {
    let (_, server) = configs();
    // Not TLS at all; a handshake record holding a ServerHello (type 2).
    for garbage in [
        &b"GET / HTTP/1.1\r\n\r\n"[..],
        &[22, 3, 1, 0, 4, 2, 0, 0, 0],
    ] {
        let (mut c, s) = tokio::io::duplex(64 * 1024);
        c.write_all(garbage).await.unwrap();
        let accepting = tokio::time::timeout(Duration::from_secs(10), accept(server.clone(), s));
        let err = accepting
            .await
            .expect("refused at once")
            .err()
            .expect("refused");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        let mut alert = Vec::new();
        c.read_to_end(&mut alert).await.unwrap();
        assert_eq!(alert.first(), Some(&21), "an alert record: {alert:?}");
    }
}
