//! istiod-lite's certificate service under load: CreateCertificate latency and
//! certificates per second, ECDSA P-256 leaves signed by an RSA-2048 root (what
//! Istio's self-signed CA makes). Each client has its own HTTP/2 connection, as
//! many ztunnels would, and asks for the identities of pods on its node. The real
//! binary against the in-process local API server (TokenRequest/TokenReview), gRPC
//! over TLS on loopback: the set-up of istiod-lite/tests/ca_service.rs. Needs no root.

use std::collections::HashSet;
use std::net::TcpListener;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::Client;
use kube_apiserver_lite::{write_kubeconfig, ApiServer, Options};
use mesh_ca::{CertificateAuthority, RootKey, WorkloadCertificate};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivatePkcs8KeyDer};
use serde_json::json;
use shared_types::identity::Identity;
use shared_types::istio::ca::IstioCertificateRequest;
use shared_types::istio::ca_service::IstioCertificateServiceClient;
use test_support::owner::{owner_marker, OWNER_ENV};
use test_support::poll::wait_for;
use test_support::process::ChildGuard;
use tokio::sync::Barrier;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

use crate::report::{percentile, ratio, single, Figure};
use crate::Plan;
use test_support::procfs::{clock_ticks, cpu_ticks};

const TRUST_DOMAIN: &str = "cluster.local";
/// Workloads on the node, one service account (so one identity) each.
const IDENTITIES: usize = 50;
const NODE: &str = "n1";
const WAIT: Duration = Duration::from_secs(20);

pub fn run(plan: &Plan) -> Result<Vec<Figure>> {
    eprintln!(
        "CA: {} CreateCertificate from {} clients, RSA-2048 root...",
        plan.ca_requests, plan.ca_clients
    );
    // The API server is served on this runtime: blocking waits run off it.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(measure(plan))
}

/// One prepared request: the CSR is made before the clock starts.
struct Job {
    id: Identity,
    key: PrivatePkcs8KeyDer<'static>,
    csr: String,
}

impl Job {
    fn new(i: usize) -> Result<Job> {
        let id = Identity::new(TRUST_DOMAIN, "app", format!("sa-{}", i % IDENTITIES));
        let (key, csr) = mesh_ca::csr::new_csr(&id)?;
        Ok(Job { id, key, csr })
    }

    /// A ztunnel's request: its own pod-bound token, the workload's identity.
    fn request(&self, token: &str) -> Result<tonic::Request<IstioCertificateRequest>> {
        let body = IstioCertificateRequest {
            csr: self.csr.clone(),
            validity_duration: 0,
            metadata: None,
        }
        .with_impersonated_identity(&self.id.to_uri());
        let mut request = tonic::Request::new(body);
        let md = request.metadata_mut();
        md.insert("authorization", format!("Bearer {token}").parse()?);
        md.insert("clusterid", "Kubernetes".parse()?);
        Ok(request)
    }
}

/// An answered job.
struct Issued {
    job: Job,
    took: Duration,
    chain: Vec<String>,
}

/// istiod-lite and the local API server it reads (shared with the xDS section).
pub struct Fixture {
    pub client: Client,
    pub root_pem: String,
    pub grpc_port: u16,
    pub metrics_port: u16,
    // Dropped last: the process, then the files it reads.
    pub istiod: ChildGuard,
    _dir: tempfile::TempDir,
}

async fn measure(plan: &Plan) -> Result<Vec<Figure>> {
    let f = start().await?;
    let ztunnel_uid = Api::<Pod>::namespaced(f.client.clone(), "istio-system")
        .get("ztunnel-1")
        .await?
        .metadata
        .uid
        .context("ztunnel-1 has no uid")?;
    let token = pod_token(&f.client, &ztunnel_uid).await?;

    let mut channels = Vec::new();
    for _ in 0..plan.ca_clients.max(1) {
        channels.push(channel(&f.root_pem, f.grpc_port).await?);
    }

    // Cold against warm: a new token costs istiod-lite one TokenReview; the same
    // token again is answered from its review cache.
    let mut first = IstioCertificateServiceClient::new(channels[0].clone());
    let (mut cold_ms, mut warm_ms, mut issued) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..plan.ca_cold {
        let fresh = pod_token(&f.client, &ztunnel_uid).await?;
        for times in [&mut cold_ms, &mut warm_ms] {
            let job = Job::new(i)?;
            let answer = call(&mut first, &fresh, job).await?;
            times.push(answer.took.as_secs_f64() * 1000.0);
            issued.push(answer);
        }
    }

    // The load: every CSR made first; request i goes to client i % clients.
    let clients = channels.len();
    let mut jobs: Vec<Vec<Job>> = (0..clients).map(|_| Vec::new()).collect();
    for i in 0..plan.ca_requests {
        jobs[i % clients].push(Job::new(i)?);
    }
    let token: Arc<str> = token.into();
    let barrier = Arc::new(Barrier::new(clients + 1));
    let mut tasks = Vec::new();
    let channels_for_paced = channels.clone();
    for (c, (channel, jobs)) in channels.into_iter().zip(jobs).enumerate() {
        let (token, barrier) = (token.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let mut grpc = IstioCertificateServiceClient::new(channel);
            // Connected and served once already (and the token reviewed): the
            // steady state of ztunnels renewing, not their start.
            let warm_up = call(&mut grpc, &token, Job::new(c)?).await;
            barrier.wait().await;
            warm_up?;
            let mut answers = Vec::with_capacity(jobs.len());
            for job in jobs {
                answers.push(call(&mut grpc, &token, job).await?);
            }
            anyhow::Ok(answers)
        }));
    }
    barrier.wait().await;
    let (started, cpu_before) = (Instant::now(), cpu_ticks(f.istiod.pid()));
    let mut load = Vec::new();
    for task in tasks {
        load.extend(task.await??);
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu_secs = cpu_ticks(f.istiod.pid()).saturating_sub(cpu_before) as f64 / clock_ticks();

    // Every leaf as a ztunnel would check it: its identity, its key, the root.
    let roots: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(f.root_pem.as_bytes()).collect::<Result<_, _>>()?;
    let mut identities = HashSet::new();
    let mut latency_ms = Vec::new();
    for answer in load {
        latency_ms.push(answer.took.as_secs_f64() * 1000.0);
        identities.insert(check(answer, &roots)?);
    }
    for answer in issued {
        check(answer, &roots)?;
    }
    let pct = |p| percentile(&latency_ms, p);
    let mut figures = vec![
        single(
            &format!("CA CreateCertificate p50, {clients} clients"),
            "ms",
            pct(0.5),
            "",
        ),
        single(
            &format!("CA CreateCertificate p99, {clients} clients"),
            "ms",
            pct(0.99),
            "<= 5 ms",
        ),
        single(
            &format!("CA certificates/s, {clients} clients, RSA root"),
            "certs/s",
            plan.ca_requests as f64 / wall,
            ">= 1000/s",
        ),
        single(
            "istiod-lite CPU per certificate",
            "ms",
            cpu_secs * 1000.0 / plan.ca_requests.max(1) as f64,
            "",
        ),
        single(
            &format!("CA distinct identities in {} leaves", latency_ms.len()),
            "ids",
            identities.len() as f64,
            "",
        ),
    ];
    figures[1].samples_mesh = latency_ms;
    figures.push(paced(plan, &channels_for_paced, &token, &roots).await?);
    if plan.ca_cold > 0 {
        let mut cold = ratio(
            "CA request, new token (TokenReview) vs cached",
            "ms",
            warm_ms,
            cold_ms,
            "",
        );
        cold.ratio_kind = "new/cached";
        figures.push(cold);
    }
    Ok(figures)
}

/// Latency at a fixed rate (open loop): request i is due at start + i/rate on client
/// i % clients, and its latency counts from when it was due, so a slow answer is not
/// hidden by the requests it delayed. Closed-loop latency above is mostly queueing
/// behind the other clients; this is what a ztunnel sees at a given load.
async fn paced(
    plan: &Plan,
    channels: &[Channel],
    token: &Arc<str>,
    roots: &[CertificateDer<'static>],
) -> Result<Figure> {
    let clients = channels.len();
    let mut jobs: Vec<Vec<(usize, Job)>> = (0..clients).map(|_| Vec::new()).collect();
    for i in 0..plan.ca_paced_requests {
        jobs[i % clients].push((i, Job::new(i)?));
    }
    let start = tokio::time::Instant::now() + Duration::from_millis(50);
    let rate = plan.ca_paced_rate;
    let mut tasks = Vec::new();
    for (channel, jobs) in channels.iter().cloned().zip(jobs) {
        let token = token.clone();
        tasks.push(tokio::spawn(async move {
            let mut grpc = IstioCertificateServiceClient::new(channel);
            let mut answers = Vec::with_capacity(jobs.len());
            for (i, job) in jobs {
                let due = start + Duration::from_secs_f64(i as f64 / rate);
                tokio::time::sleep_until(due).await;
                let mut answer = call(&mut grpc, &token, job).await?;
                answer.took = due.elapsed();
                answers.push(answer);
            }
            anyhow::Ok(answers)
        }));
    }
    let mut latency_ms = Vec::new();
    for task in tasks {
        for answer in task.await?? {
            latency_ms.push(answer.took.as_secs_f64() * 1000.0);
            check(answer, roots)?;
        }
    }
    let mut figure = single(
        &format!("CA CreateCertificate p99 at {rate:.0}/s, {clients} clients"),
        "ms",
        percentile(&latency_ms, 0.99),
        "<= 5 ms",
    );
    figure.samples_mesh = latency_ms;
    Ok(figure)
}

/// The local API server with a node's pods, and istiod-lite ready to sign.
pub async fn start() -> Result<Fixture> {
    let server = ApiServer::bind_with("127.0.0.1:0", Options::default()).await?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    write_kubeconfig(&kubeconfig, &server.url())?;
    let client = Client::try_from(kube::Config::new(server.url().parse()?))?;
    server.spawn();

    let post = PostParams::default();
    for ns in ["istio-system", "app"] {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
        Api::all(client.clone()).create(&post, &ns).await?;
    }
    let mut pods = vec![("istio-system", "ztunnel-1".to_owned(), "ztunnel".to_owned())];
    pods.extend((0..IDENTITIES).map(|i| ("app", format!("pod-{i}"), format!("sa-{i}"))));
    for (ns, name, sa) in &pods {
        let account: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": sa, "namespace": ns}}))?;
        Api::namespaced(client.clone(), ns)
            .create(&post, &account)
            .await?;
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name},
            "spec": {"serviceAccountName": sa, "nodeName": NODE, "containers": [{"name": "c", "image": "x"}]},
            "status": {"phase": "Running"},
        }))?;
        Api::namespaced(client.clone(), ns)
            .create(&post, &pod)
            .await?;
    }

    let ca_dir = dir.path().join("cacerts");
    CertificateAuthority::generate_root(TRUST_DOMAIN, RootKey::Rsa2048)?.write(&ca_dir)?;
    let root_pem = std::fs::read_to_string(ca_dir.join("root-cert.pem"))?;
    let replica = spawn_replica(dir.path(), "istiod-0").await?;
    Ok(Fixture {
        client,
        root_pem,
        grpc_port: replica.grpc_port,
        metrics_port: replica.metrics_port,
        istiod: replica.process,
        _dir: dir,
    })
}

/// One istiod-lite process on loopback ports of its own.
pub struct Replica {
    pub process: ChildGuard,
    pub grpc_port: u16,
    pub metrics_port: u16,
}

impl Fixture {
    /// Another replica of the same control plane (same CA, same API server).
    pub async fn start_replica(&self, pod: &str) -> Result<Replica> {
        spawn_replica(self._dir.path(), pod).await
    }
}

/// Starts istiod-lite as pod `pod` with the CA and kubeconfig under `dir`; returns
/// once it is ready.
async fn spawn_replica(dir: &std::path::Path, pod: &str) -> Result<Replica> {
    let (grpc_port, metrics_port, ready_port) = (free_port()?, free_port()?, free_port()?);
    let mut cmd = Command::new(test_support::built_binary("istiod-lite")?);
    cmd.env("CA_CERTS_DIR", dir.join("cacerts"))
        .env("KUBECONFIG", dir.join("kubeconfig"))
        .env("POD_NAME", pod)
        .env("GRPC_ADDR", format!("127.0.0.1:{grpc_port}"))
        .env("MONITORING_ADDR", format!("127.0.0.1:{metrics_port}"))
        .env("READY_ADDR", format!("127.0.0.1:{ready_port}"))
        .env("RUST_LOG", "info")
        .env(OWNER_ENV, owner_marker());
    let istiod = ChildGuard::spawn(&format!("istiod-lite-bench-{grpc_port}"), cmd)?;
    let ready = format!("127.0.0.1:{ready_port}");
    let process = tokio::task::spawn_blocking(move || {
        match wait_for("istiod-lite to be ready", WAIT, || {
            http_get(&ready, "/ready")
        }) {
            Ok(_) => Ok(istiod),
            Err(e) => Err(anyhow!("{e}; istiod-lite log:\n{}", istiod.log())),
        }
    })
    .await??;
    Ok(Replica {
        process,
        grpc_port,
        metrics_port,
    })
}

/// A token for ztunnel-1, bound to its pod, for the CA's audience.
pub async fn pod_token(client: &Client, pod_uid: &str) -> Result<String> {
    let request: TokenRequest = serde_json::from_value(json!({
        "spec": {
            "audiences": ["istio-ca"],
            "expirationSeconds": 3600,
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "ztunnel-1", "uid": pod_uid},
        }
    }))?;
    let answer: TokenRequest = Api::<ServiceAccount>::namespaced(client.clone(), "istio-system")
        .create_subresource("token", "ztunnel", &PostParams::default(), &request)
        .await?;
    Ok(answer
        .status
        .context("TokenRequest answered no status")?
        .token)
}

/// Its own HTTP/2 connection, checked against the mesh root as ztunnel does.
pub async fn channel(root_pem: &str, port: u16) -> Result<Channel> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(root_pem))
        .domain_name("istiod.istio-system.svc");
    Ok(Channel::from_shared(format!("https://127.0.0.1:{port}"))?
        .tls_config(tls)?
        .connect()
        .await?)
}

/// One CreateCertificate, timed from send to answer (client side).
async fn call(grpc: &mut IstioCertificateServiceClient, token: &str, job: Job) -> Result<Issued> {
    let request = job.request(token)?;
    let started = Instant::now();
    let answer = grpc.create_certificate(request).await;
    let took = started.elapsed();
    let chain = answer
        .map_err(|status| anyhow!("CreateCertificate for {} refused: {status:?}", job.id))?
        .into_inner()
        .cert_chain;
    Ok(Issued { job, took, chain })
}

/// The leaf names the identity asked for, certifies the CSR's key and chains to the
/// root; returns the identity.
fn check(answer: Issued, roots: &[CertificateDer<'static>]) -> Result<String> {
    let chain = answer
        .chain
        .iter()
        .map(|pem| CertificateDer::from_pem_slice(pem.as_bytes()))
        .collect::<Result<Vec<_>, _>>()?;
    let id = answer.job.id.to_uri();
    WorkloadCertificate::from_issued(&answer.job.id, chain, roots.to_vec(), answer.job.key)
        .map_err(|e| anyhow!("the certificate issued for {id} is wrong: {e}"))?;
    Ok(id)
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `GET path` on a loopback `addr`: the response (head and body) if it is a 200.
pub fn http_get(addr: &str, path: &str) -> Option<String> {
    test_support::http::get_ok(addr.parse().ok()?, path)
}
