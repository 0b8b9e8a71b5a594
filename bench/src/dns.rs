//! ztunnel's DNS proxy, from one pod with the node agent's DNS capture rules: a Service
//! name answered by ztunnel inside the pod against a name the upstream holds, asked of
//! the upstream directly, side by side on the same pod; then how many Service answers
//! per second one ztunnel gives to several concurrent clients.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use hickory_proto::op::Message;
use hickory_proto::rr::RecordType;
use local_cluster::dns::{
    addresses, pod_resolv_conf, query_bytes, Upstream, EXTERNAL_IP, EXTERNAL_NAME, UPSTREAM_IP,
};
use local_cluster::mesh;
use local_cluster::zds_agent::FakeAgent;
use redirection::rules::InpodRules;
use shared_types::constants::{DEFAULT_PACKET_MARK, ZTUNNEL_DEFAULT_WORKER_THREADS};
use shared_types::zds::WorkloadInfo;
use test_support::poll::wait_for;
use test_support::topology::Node;

use crate::report::{added, percentile, single, Figure};
use crate::Plan;
use test_support::procfs::{clock_ticks, cpu_ticks};

const SERVICE: &str = "server.demo.svc.cluster.local.";
const VIP: &str = "10.96.0.10";
/// Concurrent load clients, and the queries each keeps outstanding.
const CLIENTS: usize = 2;
const WINDOW: usize = 32;

pub fn run(plan: &Plan) -> Result<Vec<Figure>> {
    eprintln!("dns: one pod with DNS capture, the test upstream behind its node...");
    let dir = tempfile::tempdir()?;
    let ca = dir.path().join("ca");
    mesh::ca_init(&ca)?;
    let node = Node::new("bd", 1)?;
    let upstream = Upstream::start(&node.ns, "bd", false)?;
    node.ns.set_resolv_conf(&pod_resolv_conf(
        UPSTREAM_IP,
        "istio-system",
        "cluster.local",
    ))?;
    let pod = node.add_pod("bd", "client")?;
    pod.ns
        .set_resolv_conf(&pod_resolv_conf(UPSTREAM_IP, "demo", "cluster.local"))?;
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "workloads:\n- uid: uid-client\n  name: client\n  namespace: demo\n  serviceAccount: client\n  workloadIps: [\"{}\"]\n  protocol: HBONE\n  node: node1\nservices:\n- name: server\n  namespace: demo\n  hostname: server.demo.svc.cluster.local\n  vips: [\"/{VIP}\"]\n  ports:\n    9000: 9000\n",
            pod.ip
        ),
    )?;
    let agent = FakeAgent::start(&dir.path().join("ztunnel.sock"))?;
    let ztunnel = mesh::start_shared_ztunnel(
        &node.ns,
        &agent.socket,
        &ca,
        &config,
        &[("NODE_NAME", "node1")],
    )?;
    local_cluster::inpod::capture(
        &pod,
        &InpodRules {
            dns_capture: true,
            ..Default::default()
        },
    )?;
    let info = WorkloadInfo {
        name: "client".into(),
        namespace: "demo".into(),
        service_account: "client".into(),
    };
    if let Err(reason) = agent.add("uid-client", info, &pod.ns.path())?.0 {
        bail!("ztunnel refused the pod: {reason}");
    }
    wait_for(
        "ztunnel's DNS proxy in the pod",
        Duration::from_secs(5),
        || {
            let udp = pod.ns.stdout(&["ss", "-Hlun"]).ok()?;
            udp.contains("127.0.0.1:15053").then_some(())
        },
    )
    .with_context(|| format!("ztunnel log:\n{}", ztunnel.log()))?;

    // Every socket is made in the pod and used from plain threads. The direct one
    // carries ztunnel's mark, so capture skips it exactly as it skips ztunnel's own.
    let server = SocketAddr::new(UPSTREAM_IP.parse()?, 53);
    let (captured, direct, load) = pod.ns.run_inside(|| -> Result<_> {
        let connected = |mark: Option<u32>| -> Result<UdpSocket> {
            let socket = UdpSocket::bind("0.0.0.0:0")?;
            if let Some(mark) = mark {
                set_mark(&socket, mark)?;
            }
            socket.connect(server)?;
            socket.set_read_timeout(Some(Duration::from_secs(2)))?;
            Ok(socket)
        };
        let load = (0..CLIENTS)
            .map(|_| connected(None))
            .collect::<Result<Vec<_>>>()?;
        Ok((
            connected(None)?,
            connected(Some(DEFAULT_PACKET_MARK))?,
            load,
        ))
    })??;
    let service_query = query_bytes(0, SERVICE, RecordType::A, None)?;
    let external_query = query_bytes(0, EXTERNAL_NAME, RecordType::A, None)?;
    // Each path answers what it should: the VIP from ztunnel, 192.0.2.1 from upstream.
    expect(
        &captured,
        &service_query,
        VIP.parse()?,
        "the captured query",
    )?;
    expect(
        &direct,
        &external_query,
        IpAddr::V4(EXTERNAL_IP),
        "the direct query",
    )?;

    eprintln!(
        "dns: {} queries each way, a Service name through ztunnel against the upstream...",
        plan.pings
    );
    let mut buf = vec![0u8; 4096];
    for id in 0..200 {
        round_trip(&captured, &service_query, id, &mut buf)?;
        round_trip(&direct, &external_query, id, &mut buf)?;
    }
    // Interleaved, so both see the same machine at the same moments.
    let (mut via_ztunnel, mut to_upstream) = (Vec::new(), Vec::new());
    for i in 0..plan.pings {
        let id = i as u16;
        via_ztunnel.push(round_trip(&captured, &service_query, id, &mut buf)?.0);
        to_upstream.push(round_trip(&direct, &external_query, id, &mut buf)?.0);
    }

    let secs = plan.dns_load_secs;
    eprintln!("dns: {CLIENTS} clients x {WINDOW} outstanding queries for {secs} s...");
    let cpu_before = cpu_ticks(ztunnel.pid());
    let started = Instant::now();
    let until = started + Duration::from_secs(secs);
    let answered: u64 = std::thread::scope(|scope| -> Result<u64> {
        let handles: Vec<_> = load
            .iter()
            .map(|socket| scope.spawn(|| flood(socket, &service_query, until)))
            .collect();
        let mut total = 0;
        for handle in handles {
            total += handle
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
        }
        Ok(total)
    })?;
    let elapsed = started.elapsed().as_secs_f64();
    let vcpu = (cpu_ticks(ztunnel.pid()) - cpu_before) as f64 / clock_ticks() / elapsed;
    let workers = std::env::var("ZTUNNEL_WORKER_THREADS")
        .unwrap_or_else(|_| ZTUNNEL_DEFAULT_WORKER_THREADS.to_string());

    let p = |samples: &[f64], q| percentile(samples, q);
    let mut figures = vec![
        added(
            "DNS added latency p50 (Service via ztunnel)",
            p(&to_upstream, 0.5),
            p(&via_ztunnel, 0.5),
            "<= 50 µs added",
        ),
        added(
            "DNS added latency p99 (Service via ztunnel)",
            p(&to_upstream, 0.99),
            p(&via_ztunnel, 0.99),
            "",
        ),
        single(
            &format!("DNS Service answers/s ({workers} ztunnel worker)"),
            "ans/s",
            answered as f64 / elapsed,
            ">= 50,000 on one worker",
        ),
        single("ztunnel CPU while answering", "vCPU", vcpu, ""),
        // On a small machine the clients share the cores: this is what one busy
        // worker would answer, whether or not the clients kept it busy.
        single(
            "DNS Service answers per ztunnel CPU-second",
            "ans/s",
            if vcpu > 0.0 {
                answered as f64 / (vcpu * elapsed)
            } else {
                0.0
            },
            "",
        ),
    ];
    figures[0].samples_direct = to_upstream;
    figures[0].samples_mesh = via_ztunnel;
    drop(ztunnel);
    drop(upstream);
    Ok(figures)
}

/// `SO_MARK` on `socket` (needs CAP_NET_ADMIN, as the benchmark runs as root).
fn set_mark(socket: &UdpSocket, mark: u32) -> Result<()> {
    // SAFETY: setsockopt on an fd we own, with a pointer to a live u32 and its size.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MARK,
            (&mark as *const u32).cast(),
            std::mem::size_of::<u32>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        bail!("SO_MARK: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// One query on a connected socket; checks the answer holds exactly `want`.
fn expect(socket: &UdpSocket, query: &[u8], want: IpAddr, what: &str) -> Result<()> {
    let mut buf = vec![0u8; 4096];
    let (_, n) = round_trip(socket, query, 0xbeef, &mut buf)?;
    let answer = Message::from_vec(&buf[..n]).with_context(|| format!("{what}: unparseable"))?;
    ensure!(
        addresses(&answer) == [want],
        "{what} should be answered with {want}: {answer:?}"
    );
    Ok(())
}

/// Round trip of one query (id `id`) in µs, and the answer's length in `buf`; stale
/// answers to earlier ids are skipped.
fn round_trip(socket: &UdpSocket, query: &[u8], id: u16, buf: &mut [u8]) -> Result<(f64, usize)> {
    let mut query = query.to_vec();
    query[..2].copy_from_slice(&id.to_be_bytes());
    let started = Instant::now();
    socket.send(&query).context("sending a query")?;
    loop {
        let n = socket
            .recv(buf)
            .with_context(|| format!("no answer to query {id} within 2 s"))?;
        if n >= 12 && buf[..2] == id.to_be_bytes() {
            return Ok((started.elapsed().as_secs_f64() * 1e6, n));
        }
    }
}

/// Keeps [`WINDOW`] queries outstanding on `socket` until `until`; returns the number
/// of good answers (NOERROR with at least one record). A window lost in a burst is
/// sent again after 100 ms.
fn flood(socket: &UdpSocket, query: &[u8], until: Instant) -> Result<u64> {
    socket.set_read_timeout(Some(Duration::from_millis(100)))?;
    let mut query = query.to_vec();
    let mut id = 0u16;
    let mut send = |socket: &UdpSocket| -> Result<()> {
        id = id.wrapping_add(1);
        query[..2].copy_from_slice(&id.to_be_bytes());
        socket.send(&query)?;
        Ok(())
    };
    for _ in 0..WINDOW {
        send(socket)?;
    }
    let mut answered = 0;
    let mut buf = [0u8; 1500];
    while Instant::now() < until {
        match socket.recv(&mut buf) {
            Ok(n) => {
                let good = n >= 12
                    && buf[2] & 0x80 != 0
                    && buf[3] & 0x0f == 0
                    && u16::from_be_bytes([buf[6], buf[7]]) > 0;
                answered += u64::from(good);
                send(socket)?;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                for _ in 0..WINDOW {
                    send(socket)?;
                }
            }
            Err(e) => return Err(e).context("receiving answers"),
        }
    }
    Ok(answered)
}
