//! The xDS section's failover figure: two istiod-lite replicas of the filled mesh
//! behind a Service, and real ztunnel xDS clients streaming through it. The replica
//! holding the most streams is killed; for each client that lost its stream, the
//! time from the kill until it has a response of each type from the survivor (it is
//! SYNCED again: it sent `initial_resource_versions`, so nothing else comes).
//!
//! The Service is a forwarder on loopback in kube-proxy's old userspace mode: a new
//! connection goes round-robin to a replica, and to the next one when that refuses.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use ztunnel::control_plane::{ControlPlaneConfig, RootCa, TokenSource};
use ztunnel::discovery::xds::{self, NodeIdentity, XdsConfig, XdsMetrics};
use ztunnel::state::StateStore;

use crate::ca::Fixture;
use crate::report::{percentile, single, Figure};
use shared_types::istio::xds::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};

const WAIT: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(2);

/// Streams through the Service per backend, as the forwarder counts them.
type Active = Arc<Vec<AtomicUsize>>;

pub async fn measure(f: &mut Fixture, token: &str, clients: usize) -> Result<Vec<Figure>> {
    let mut other = f.start_replica("istiod-1").await?;
    let backends = [f.grpc_port, other.grpc_port];
    let active: Active = Arc::new(backends.iter().map(|_| AtomicUsize::new(0)).collect());
    let cancel = CancellationToken::new();
    let service = forward(backends.to_vec(), active.clone(), cancel.clone()).await?;

    let mut metrics = Vec::new();
    let mut synced = Vec::new();
    for i in 0..clients {
        let m = Arc::new(XdsMetrics::default());
        synced.push(xds::start(
            config(service, &f.root_pem, token, i),
            StateStore::new(),
            m.clone(),
            None,
            cancel.clone(),
        )?);
        metrics.push(m);
    }
    for s in &synced {
        if !tokio::time::timeout(WAIT, s.wait_synced()).await? {
            bail!("a client never synced");
        }
    }
    let victim = if active[0].load(Ordering::Relaxed) >= active[1].load(Ordering::Relaxed) {
        0
    } else {
        1
    };
    let lost = active[victim].load(Ordering::Relaxed);
    let before: Vec<(u64, u64, u64)> = metrics.iter().map(|m| counts(m)).collect();

    let killed = Instant::now();
    if victim == 0 {
        f.istiod.kill();
    } else {
        other.process.kill();
    }
    let mut resynced_ms: Vec<Option<f64>> = vec![None; clients];
    while resynced_ms.iter().flatten().count() < lost {
        if killed.elapsed() > WAIT {
            bail!(
                "only {} of {lost} clients resynced",
                resynced_ms.iter().flatten().count()
            );
        }
        for (i, m) in metrics.iter().enumerate() {
            let (addresses, policies, broken) = counts(m);
            let (a0, p0, b0) = before[i];
            if resynced_ms[i].is_none() && broken > b0 && addresses > a0 && policies > p0 {
                resynced_ms[i] = Some(killed.elapsed().as_secs_f64() * 1000.0);
            }
        }
        tokio::time::sleep(POLL).await;
    }
    cancel.cancel();
    let times: Vec<f64> = resynced_ms.into_iter().flatten().collect();
    Ok(vec![
        single(
            &format!("xDS failover: replica killed to its {lost} of {clients} clients SYNCED on the other, p50"),
            "ms",
            percentile(&times, 0.5),
            "",
        ),
        single(
            "xDS failover: replica killed to its clients SYNCED on the other, p99",
            "ms",
            percentile(&times, 0.99),
            "<= 2000 ms",
        ),
    ])
}

/// (Address responses, Authorization responses, broken streams) one client has seen.
fn counts(m: &XdsMetrics) -> (u64, u64, u64) {
    let messages = |url| m.messages.get_or_create(&XdsMetrics::url(url)).get();
    let broken = m
        .terminations
        .get_or_create(&xds::metrics::TerminationLabels { reason: "Error" })
        .get();
    (
        messages(ADDRESS_TYPE_URL),
        messages(AUTHORIZATION_TYPE_URL),
        broken,
    )
}

fn config(service: u16, root_pem: &str, token: &str, i: usize) -> XdsConfig {
    XdsConfig {
        control_plane: ControlPlaneConfig {
            address: format!("127.0.0.1:{service}"),
            root_ca: RootCa::Pem(root_pem.to_owned()),
            token: TokenSource::Literal(token.to_owned()),
            cluster_id: "Kubernetes".into(),
            alt_hostname: Some("istiod.istio-system.svc".into()),
            extra_headers: vec![],
            packet_mark: 0,
        },
        node: NodeIdentity {
            node_type: "ztunnel",
            pod_name: format!("ztunnel-{i}"),
            pod_namespace: "istio-system".into(),
            instance_ip: format!("10.0.{}.{}", i / 256, i % 256),
            node_name: format!("node-{i}"),
            cluster_id: "Kubernetes".into(),
            extra_metadata: vec![],
        },
        on_demand: None,
        types: &xds::TYPES,
    }
}

/// The Service: accepts on a loopback port and forwards each connection to the
/// backends, round-robin, skipping one that refuses.
async fn forward(backends: Vec<u16>, active: Active, cancel: CancellationToken) -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let next = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        loop {
            let mut client = tokio::select! {
                () = cancel.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok((client, _)) => client,
                    Err(_) => continue,
                },
            };
            let (backends, active, next) = (backends.clone(), active.clone(), next.clone());
            tokio::spawn(async move {
                let start = next.fetch_add(1, Ordering::Relaxed);
                for k in 0..backends.len() {
                    let b = (start + k) % backends.len();
                    let Ok(mut upstream) = TcpStream::connect(("127.0.0.1", backends[b])).await
                    else {
                        continue;
                    };
                    active[b].fetch_add(1, Ordering::Relaxed);
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                    active[b].fetch_sub(1, Ordering::Relaxed);
                    return;
                }
            });
        }
    });
    Ok(port)
}
