//! Wires istiod-lite's parts together and runs them until SIGTERM.

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use anyhow::Context;
use mesh_ca::CertificateAuthority;
use shared_types::istio::ca_service::IstioCertificateServiceServer;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::ca::authn::TokenAuthenticator;
use crate::ca::authz::{node_accounts, NodeAuthorizer};
use crate::ca::CaService;
use crate::config::Config;
use crate::kube::pods::PodIndex;
use crate::kube::{gateway_class, leader, root_publisher, route_status, waypoints};
use crate::metrics::Metrics;
use crate::model;
use crate::ops;
use crate::server::{self, ServingCert};
use crate::xds::grpc::AdsServer;
use crate::xds::{self, AdsService, Connections, ResourceStore, XdsMetrics};
use mesh_runtime::readiness::Readiness;

/// Ready once the pod index and the model have synced (before that, every
/// impersonation would be refused for want of knowing the pods, and ztunnels would be
/// sent a partial mesh) and the gRPC port serves (behind a Service, a replica gets
/// connections only once it can take them).
const READY_POD_INDEX: &str = "the pod index";
const READY_MODEL: &str = "the model's first list of every kind";
const READY_GRPC: &str = "the gRPC port";

/// Keeps `pilot_xds_resources{type}` at the store's counts.
async fn count_resources(store: ResourceStore, metrics: Arc<Metrics>, shutdown: CancellationToken) {
    let mut changes = store.subscribe();
    loop {
        for type_url in xds::TYPES {
            let count = i64::try_from(store.len(type_url)).unwrap_or(i64::MAX);
            metrics
                .xds
                .resources
                .get_or_create(&XdsMetrics::type_label(type_url))
                .set(count);
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = changes.changed() => if changed.is_err() { return },
        }
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

    let readiness = Readiness::new();
    readiness.block(READY_POD_INDEX);
    readiness.block(READY_MODEL);
    let grpc_ready = readiness.register(READY_GRPC);
    ops::serve_readiness(config.ready_addr, readiness.clone(), shutdown.clone())
        .with_context(|| format!("binding the readiness port {}", config.ready_addr))?;

    // Fed by the model's pod watch (started below).
    let pods = PodIndex::default();
    tokio::spawn({
        let (pods, readiness) = (pods.clone(), readiness.clone());
        async move {
            pods.wait_synced().await;
            readiness.unblock(READY_POD_INDEX);
        }
    });
    // Work for one replica at a time: the root ConfigMap in every namespace.
    let leading = leader::start(
        client.clone(),
        leader::Settings {
            namespace: config.namespace.clone(),
            lease_name: leader::NAMESPACE_CONTROLLER_LEASE.into(),
            identity: leader::identity(&config.pod_name),
            lease_duration: config.leader_lease_duration,
        },
        shutdown.clone(),
    );
    tokio::spawn(leader::while_leading(leading.clone(), shutdown.clone(), {
        let (client, root_pem) = (client.clone(), ca.roots_pem());
        move |stop| root_publisher::run(client.clone(), root_pem.clone(), stop)
    }));
    tokio::spawn(leader::while_leading(leading.clone(), shutdown.clone(), {
        let client = client.clone();
        move |stop| gateway_class::run(client.clone(), stop)
    }));
    let waypoint_settings = waypoints::Settings {
        image: config.waypoint_image.clone(),
        istiod_address: format!(
            "istiod.{}.svc:{}",
            config.namespace,
            config.grpc_addr.port()
        ),
        trust_domain: config.trust_domain.clone(),
        cluster_id: config.cluster_id.clone(),
    };
    tokio::spawn(leader::while_leading(leading.clone(), shutdown.clone(), {
        let client = client.clone();
        move |stop| waypoints::run(client.clone(), waypoint_settings.clone(), stop)
    }));
    tokio::spawn(leader::while_leading(leading, shutdown.clone(), {
        let (client, domain) = (client.clone(), config.domain_suffix.clone());
        move |stop| route_status::run(client.clone(), domain.clone(), stop)
    }));

    ops::serve_metrics(config.monitoring_addr, metrics.clone(), shutdown.clone())
        .with_context(|| format!("binding the monitoring port {}", config.monitoring_addr))?;
    let resources = ResourceStore::default();
    let mut model_synced = model::start(
        client.clone(),
        model::Options {
            cluster_id: config.cluster_id.clone(),
            trust_domain: config.trust_domain.clone(),
            cluster_domain: config.domain_suffix.clone(),
            root_namespace: config.namespace.clone(),
        },
        resources.clone(),
        pods.clone(),
        shutdown.clone(),
    );
    tokio::spawn(count_resources(
        resources.clone(),
        metrics.clone(),
        shutdown.clone(),
    ));
    tokio::spawn({
        let readiness = readiness.clone();
        async move {
            if model_synced.wait_for(|synced| *synced).await.is_ok() {
                readiness.unblock(READY_MODEL);
            }
        }
    });

    let authn = Arc::new(TokenAuthenticator::new(
        client.clone(),
        config.token_audiences.clone(),
        config.cluster_id.clone(),
        config.trust_domain.clone(),
        pods.clone(),
    ));
    let node_accounts = node_accounts(&config.trusted_node_accounts).map_err(anyhow::Error::msg)?;
    let service = CaService {
        ca: ca.clone(),
        authn: authn.clone(),
        authz: NodeAuthorizer::new(
            node_accounts.clone(),
            config.trust_domain.clone(),
            pods.clone(),
        ),
        default_ttl: config.default_cert_ttl,
        max_ttl: config.max_cert_ttl,
        metrics: metrics.clone(),
    };
    let ads = AdsService {
        store: resources.clone(),
        authn,
        trusted: node_accounts,
        pods: pods.clone(),
        system_namespace: config.namespace.clone(),
        debounce: config.debounce,
        connections: Connections::default(),
        metrics: metrics.xds.clone(),
    };
    let serving = ServingCert::start(
        ca.clone(),
        config.serving_names(),
        config.serving_cert_ttl,
        shutdown.clone(),
    )
    .context("issuing the serving certificate")?;
    let listener = mesh_runtime::listen::bind(config.grpc_addr)
        .with_context(|| format!("binding {}", config.grpc_addr))?;
    drop(grpc_ready);
    let incoming = server::incoming(listener, server::tls_acceptor(serving)?, shutdown.clone());
    info!(addr = %config.grpc_addr, trust_domain = %config.trust_domain, "istiod-lite serving the CA and xDS");

    let grpc = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(10)))
        .add_service(IstioCertificateServiceServer::new(Arc::new(service)))
        .add_service(AdsServer::new(ads))
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
