//! Wires istiod-lite's parts together and runs them until SIGTERM.

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use anyhow::Context;
use mesh_ca::CertificateAuthority;
use shared_types::istio::ca::IstioCertificateServiceServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::ca::authn::TokenAuthenticator;
use crate::ca::authz::NodeAuthorizer;
use crate::ca::CaService;
use crate::config::Config;
use crate::kube::pods::{watch_pods, PodIndex};
use crate::kube::root_publisher;
use crate::metrics::Metrics;
use crate::ops::{self, Ready};
use crate::server::{self, ServingCert};

/// Ready once the pod index has synced: before that, every impersonation would
/// be refused for want of knowing the pods.
struct Readiness {
    pods: PodIndex,
}

impl Ready for Readiness {
    fn missing(&self) -> Option<String> {
        (!self.pods.is_synced()).then(|| "the pod index has not synced yet".to_owned())
    }
}

pub async fn run(config: Config) -> anyhow::Result<()> {
    let ca = CertificateAuthority::load(&config.ca_certs_dir).with_context(|| {
        format!(
            "loading the mesh CA from {} (Istio's plug-in CA files, from the cacerts Secret)",
            config.ca_certs_dir.display()
        )
    })?;
    let ca = Arc::new(ca);
    let metrics = Arc::new(Metrics::default());
    if let Ok(expiry) = ca.not_after().duration_since(UNIX_EPOCH) {
        metrics
            .root_cert_expiry
            .set(i64::try_from(expiry.as_secs()).unwrap_or(i64::MAX));
    }
    let shutdown = CancellationToken::new();
    let client = ::kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (in-cluster service account or KUBECONFIG)")?;

    let pods = PodIndex::default();
    tokio::spawn(watch_pods(client.clone(), pods.clone(), shutdown.clone()));
    tokio::spawn(root_publisher::run(
        client.clone(),
        ca.roots_pem(),
        shutdown.clone(),
    ));

    ops::serve_metrics(config.monitoring_addr, metrics.clone(), shutdown.clone())
        .await
        .with_context(|| format!("binding the monitoring port {}", config.monitoring_addr))?;
    let readiness = Arc::new(Readiness { pods: pods.clone() });
    ops::serve_readiness(config.ready_addr, readiness, shutdown.clone())
        .await
        .with_context(|| format!("binding the readiness port {}", config.ready_addr))?;

    let service = CaService {
        ca: ca.clone(),
        authn: TokenAuthenticator::new(
            client.clone(),
            config.token_audiences.clone(),
            config.cluster_id.clone(),
            config.trust_domain.clone(),
            pods.clone(),
        ),
        authz: NodeAuthorizer::new(
            &config.trusted_node_accounts,
            config.trust_domain.clone(),
            pods.clone(),
        )
        .map_err(anyhow::Error::msg)?,
        default_ttl: config.default_cert_ttl,
        max_ttl: config.max_cert_ttl,
        metrics: metrics.clone(),
    };
    let serving = ServingCert::start(
        ca.clone(),
        config.serving_names(),
        config.serving_cert_ttl,
        shutdown.clone(),
    )
    .context("issuing the serving certificate")?;
    let listener = TcpListener::bind(config.grpc_addr)
        .await
        .with_context(|| format!("binding {}", config.grpc_addr))?;
    let incoming = server::incoming(listener, server::tls_acceptor(serving)?, shutdown.clone());
    info!(addr = %config.grpc_addr, trust_domain = %config.trust_domain, "istiod-lite serving the CA");

    let grpc = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(10)))
        .add_service(IstioCertificateServiceServer::new(Arc::new(service)))
        .serve_with_incoming_shutdown(incoming, {
            let shutdown = shutdown.clone();
            async move { shutdown.cancelled().await }
        });
    tokio::select! {
        result = grpc => result.context("the gRPC server failed")?,
        () = wait_for_signal() => {}
    }
    shutdown.cancel();
    info!("istiod-lite stopped");
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => info!("SIGTERM received"),
                _ = tokio::signal::ctrl_c() => info!("SIGINT received"),
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
