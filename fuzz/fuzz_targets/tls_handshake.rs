//! HBONE's TLS handshake driver (`ztunnel::tls::accept`, rustls' unbuffered API under
//! it) on what a client sends before its handshake is done: any bytes, then the end
//! of the stream. The driver refuses them, with rustls' alert where it has one, or
//! sees the end while it waits for more; it never panics (rustls asserts that a
//! connection sends one fatal alert at most) and never completes a handshake.

#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tokio::io::AsyncWriteExt;
use tokio::runtime::Runtime;
use ztunnel::identity::{CertificateAuthority, Identity};

fn server_config() -> Arc<rustls::ServerConfig> {
    static CONFIG: OnceLock<Arc<rustls::ServerConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let ca = CertificateAuthority::generate_self_signed("cluster.local").expect("a CA");
            let id = Identity::new("cluster.local", "default", "server");
            let cert = ca.issue(&id, Duration::from_secs(3600)).expect("a leaf");
            ztunnel::tls::server_config(&cert).expect("a server config")
        })
        .clone()
}

fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    // What the pipe holds, so the client's write never waits for the server.
    if data.len() > 60 * 1024 {
        return;
    }
    runtime().block_on(async {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        client.write_all(data).await.expect("the pipe holds it");
        client.shutdown().await.expect("closed");
        let accepting = ztunnel::tls::accept(server_config(), server);
        let outcome = tokio::time::timeout(Duration::from_secs(10), accepting)
            .await
            .expect("the handshake ends when the client's bytes do");
        assert!(outcome.is_err(), "a handshake completed without a client");
    });
});
