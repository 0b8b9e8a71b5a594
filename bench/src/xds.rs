//! istiod-lite's xDS for a large mesh: the local API server holds many pods, Services
//! and AuthorizationPolicies; hundreds of simulated ztunnels (each its own HTTP/2
//! connection over TLS and its own delta ADS stream, authenticated as a ztunnel)
//! sync, then single pods change. Measured on the client side: the initial sync per
//! client, the time from one pod change to every client having ACKed it, and what
//! each change costs on the wire; on istiod-lite: RSS and CPU. The real binary, the
//! set-up of the CA section. Needs no root.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::stream::{self, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::Client;
use prost::Message;
use serde_json::json;
use shared_types::istio::xds::{
    string_struct, ztunnel_node_id, AggregatedDiscoveryServiceClient, DeltaDiscoveryRequest, Node,
    ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::ca::{self, Fixture};
use crate::report::{percentile, single, Figure};
use crate::xds_failover;
use crate::Plan;
use test_support::procfs::{clock_ticks, cpu_ticks, rss_kib};

const NS: &str = "app";
/// Concurrent API requests while filling the cluster.
const FILL: usize = 32;
const WAIT: Duration = Duration::from_secs(120);
/// No response for this long: the streams are idle.
const QUIET: Duration = Duration::from_secs(1);

pub fn run(plan: &Plan) -> Result<Vec<Figure>> {
    eprintln!(
        "xDS: {} pods, {} Services, {} policies; {} ztunnel streams...",
        plan.xds_pods, plan.xds_services, plan.xds_policies, plan.xds_clients
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(measure(plan))
}

/// What one client saw of one response.
struct Seen {
    client: usize,
    at: Instant,
    names: Vec<String>,
    bytes: usize,
}

async fn measure(plan: &Plan) -> Result<Vec<Figure>> {
    let mut f = ca::start().await?;
    fill(&f.client, plan).await?;
    let expected = plan.xds_pods + plan.xds_services;
    wait_for_resources(&f, expected).await?;

    let ztunnel_uid = Api::<Pod>::namespaced(f.client.clone(), "istio-system")
        .get("ztunnel-1")
        .await?
        .metadata
        .uid
        .context("ztunnel-1 has no uid")?;
    let token = ca::pod_token(&f.client, &ztunnel_uid).await?;
    let model_rss_mib = rss_kib(f.istiod.pid()) as f64 / 1024.0;

    // Every client connects and subscribes at once, as ztunnels do after an istiod
    // restart; each reports every response it ACKs.
    let (seen_tx, mut seen) = mpsc::unbounded_channel::<Seen>();
    let started = Instant::now();
    let cpu_before = cpu_ticks(f.istiod.pid());
    let mut synced_ms = Vec::new();
    let mut clients = Vec::new();
    for client in 0..plan.xds_clients {
        let channel = ca::channel(&f.root_pem, f.grpc_port).await?;
        clients.push(tokio::spawn(stream_client(
            client,
            channel,
            token.clone(),
            seen_tx.clone(),
        )));
    }
    // Initial sync: a response of each type.
    let mut types = vec![0u8; plan.xds_clients];
    let mut initial_bytes = 0usize;
    while types.iter().any(|t| *t < 2) {
        let s = next(&mut seen).await?;
        types[s.client] += 1;
        initial_bytes += s.bytes;
        if types[s.client] == 2 {
            synced_ms.push(s.at.duration_since(started).as_secs_f64() * 1000.0);
        }
    }
    let sync_cpu = ticks_secs(cpu_ticks(f.istiod.pid()).saturating_sub(cpu_before));
    // The tail of the fill (late pod statuses) reaches the clients too: let it pass.
    while tokio::time::timeout(QUIET, seen.recv()).await.is_ok() {}

    // One pod at a time changes (a new label: a new canonical revision).
    let pods: Api<Pod> = Api::namespaced(f.client.clone(), NS);
    let (mut all_acked_ms, mut per_client_bytes, mut per_push_resources) =
        (Vec::new(), Vec::new(), Vec::new());
    let cpu_before = cpu_ticks(f.istiod.pid());
    for change in 0..plan.xds_changes {
        let name = format!("p-{}", change * 7 % plan.xds_pods);
        let uid = format!("Kubernetes//Pod/{NS}/{name}");
        let patch = json!({"metadata": {"labels": {"version": format!("v{}", change + 2)}}});
        let t0 = Instant::now();
        pods.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        let mut got = vec![false; plan.xds_clients];
        let mut last = t0;
        while got.iter().any(|g| !g) {
            let s = next(&mut seen).await?;
            if s.at < t0 || !s.names.contains(&uid) {
                continue;
            }
            got[s.client] = true;
            last = last.max(s.at);
            per_client_bytes.push(s.bytes as f64);
            per_push_resources.push(s.names.len() as f64);
        }
        all_acked_ms.push(last.duration_since(t0).as_secs_f64() * 1000.0);
    }
    let change_cpu = ticks_secs(cpu_ticks(f.istiod.pid()).saturating_sub(cpu_before));
    let rss_mib = rss_kib(f.istiod.pid()) as f64 / 1024.0;
    for client in clients {
        client.abort();
    }

    let n = plan.xds_clients;
    let resources = expected + plan.xds_policies;
    let changes = plan.xds_changes.max(1) as f64;
    let failover = xds_failover::measure(&mut f, &token, plan.xds_failover_clients).await?;
    let mut figures = vec![
        single(
            &format!("xDS initial sync per client, {resources} resources, {n} at once, p50"),
            "ms",
            percentile(&synced_ms, 0.5),
            "",
        ),
        single(
            &format!("xDS initial sync per client, {n} at once, p99"),
            "ms",
            percentile(&synced_ms, 0.99),
            "",
        ),
        single(
            "xDS bytes of one initial sync per client",
            "KiB",
            initial_bytes as f64 / n.max(1) as f64 / 1024.0,
            "",
        ),
        single(
            &format!("xDS one pod change to all {n} clients ACKed, p50"),
            "ms",
            percentile(&all_acked_ms, 0.5),
            "",
        ),
        single(
            &format!("xDS one pod change to all {n} clients ACKed, p99"),
            "ms",
            percentile(&all_acked_ms, 0.99),
            "<= 500 ms",
        ),
        single(
            "xDS resources per push for one pod change",
            "",
            percentile(&per_push_resources, 1.0),
            "1 (that pod only)",
        ),
        single(
            "xDS bytes per client per pod change",
            "B",
            percentile(&per_client_bytes, 0.5),
            "",
        ),
        single(
            &format!("istiod-lite CPU for the initial sync of {n} clients"),
            "s",
            sync_cpu,
            "",
        ),
        single(
            &format!("istiod-lite CPU per pod change pushed to {n} clients"),
            "ms",
            change_cpu / changes * 1000.0,
            "",
        ),
        single(
            "istiod-lite RSS with the mesh, no stream",
            "MiB",
            model_rss_mib,
            "",
        ),
        single(
            &format!("istiod-lite RSS with the mesh and {n} streams"),
            "MiB",
            rss_mib,
            "<= 300 MiB",
        ),
    ];
    figures.extend(failover);
    Ok(figures)
}

async fn next(seen: &mut mpsc::UnboundedReceiver<Seen>) -> Result<Seen> {
    tokio::time::timeout(WAIT, seen.recv())
        .await
        .context("no xDS response in time")?
        .context("every client stopped")
}

fn ticks_secs(ticks: u64) -> f64 {
    ticks as f64 / clock_ticks()
}

/// One simulated ztunnel: subscribes to both types, ACKs every response, reports it.
async fn stream_client(
    client: usize,
    channel: Channel,
    token: String,
    seen: mpsc::UnboundedSender<Seen>,
) -> Result<()> {
    let (requests, rx) = mpsc::channel(4);
    let node = Node {
        id: ztunnel_node_id(
            &format!("10.0.{}.{}", client / 256, client % 256),
            &format!("ztunnel-{client}"),
            "istio-system",
        ),
        metadata: Some(string_struct([("NAMESPACE", "istio-system")])),
        ..Default::default()
    };
    for type_url in [ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL] {
        requests
            .send(DeltaDiscoveryRequest {
                node: Some(node.clone()),
                type_url: type_url.into(),
                ..Default::default()
            })
            .await?;
    }
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse()?);
    let mut responses = AggregatedDiscoveryServiceClient::new(channel)
        .max_decoding_message_size(256 << 20)
        .delta_aggregated_resources(request)
        .await?
        .into_inner();
    while let Some(response) = responses.message().await? {
        let at = Instant::now();
        let bytes = response.encoded_len();
        let names = response.resources.iter().map(|r| r.name.clone()).collect();
        requests
            .send(DeltaDiscoveryRequest {
                type_url: response.type_url.clone(),
                response_nonce: response.nonce.clone(),
                ..Default::default()
            })
            .await?;
        if seen
            .send(Seen {
                client,
                at,
                names,
                bytes,
            })
            .is_err()
        {
            break;
        }
    }
    Ok(())
}

/// The mesh: pods spread over the Services by label, each Service selecting its pods,
/// and workload-selector policies.
async fn fill(client: &Client, plan: &Plan) -> Result<()> {
    let post = PostParams::default();
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    stream::iter(0..plan.xds_services)
        .map(|i| {
            let services = services.clone();
            let post = post.clone();
            async move {
                let svc: Service = serde_json::from_value(json!({
                    "metadata": {"name": format!("svc-{i}"), "namespace": NS},
                    "spec": {
                        "clusterIP": format!("10.96.{}.{}", i / 250, i % 250 + 1),
                        "selector": {"app": format!("svc-{i}")},
                        "ports": [{"port": 80, "targetPort": 8080}],
                    },
                }))?;
                services.create(&post, &svc).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(FILL)
        .try_collect::<Vec<()>>()
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    stream::iter(0..plan.xds_pods)
        .map(|i| {
            let pods = pods.clone();
            let post = post.clone();
            let services = plan.xds_services.max(1);
            async move {
                let name = format!("p-{i}");
                let ip = format!("10.{}.{}.{}", 100 + i / 65536, i / 256 % 256, i % 256);
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {
                        "name": name, "namespace": NS,
                        "labels": {"app": format!("svc-{}", i % services), "version": "v1"},
                        "annotations": {"ambient.istio.io/redirection": "enabled"},
                    },
                    "spec": {"serviceAccountName": "sa-0", "nodeName": format!("n{}", i % 50),
                             "containers": [{"name": "c", "image": "x"}]},
                }))?;
                pods.create(&post, &pod).await?;
                let status = json!({"status": {
                    "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                    "conditions": [{"type": "Ready", "status": "True"}],
                }});
                pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(FILL)
        .try_collect::<Vec<()>>()
        .await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in test_support::crds::shipped()? {
        crds.create(&post, &serde_json::from_value(crd)?).await?;
    }
    let gvk = GroupVersionKind::gvk("security.istio.io", "v1", "AuthorizationPolicy");
    let policies: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NS, &ApiResource::from_gvk(&gvk));
    for i in 0..plan.xds_policies {
        let policy: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "security.istio.io/v1",
            "kind": "AuthorizationPolicy",
            "metadata": {"name": format!("allow-{i}"), "namespace": NS},
            "spec": {
                "selector": {"matchLabels": {"app": format!("svc-{}", i % plan.xds_services.max(1))}},
                "rules": [{"from": [{"source": {"namespaces": [format!("ns-{i}")]}}]}],
            },
        }))?;
        policies.create(&post, &policy).await?;
    }
    Ok(())
}

/// Until istiod-lite serves every pod and Service (`pilot_xds_resources`).
async fn wait_for_resources(f: &Fixture, expected: usize) -> Result<()> {
    let url = format!("127.0.0.1:{}", f.metrics_port);
    let deadline = Instant::now() + WAIT;
    loop {
        let served = tokio::task::spawn_blocking({
            let url = url.clone();
            move || ca::http_get(&url, "/metrics")
        })
        .await?
        .map(|text| {
            local_cluster::mesh::metric_sum(
                &text,
                "pilot_xds_resources",
                &[("type", ADDRESS_TYPE_URL)],
            )
        })
        .unwrap_or_default();
        // The model may not have listed the extra CA pods' workloads yet: at least.
        if served as usize >= expected {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("istiod-lite serves {served} Address resources, expected {expected}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
