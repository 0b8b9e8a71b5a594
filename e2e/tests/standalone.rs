//! Standalone (dedicated-mode) ztunnels carrying real traffic between two
//! namespaces; see `local_cluster::standalone` for the topology.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::Duration;

use anyhow::Result;
use local_cluster::mesh::{self, metric_sum, ztunnel_metrics};
use local_cluster::standalone::*;
use test_support::netns::Netns;
use test_support::poll::wait_for;
use test_support::process::ChildGuard;

#[test]
fn hundred_megabytes_cross_hbone_with_spiffe_identities() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let mesh = Standalone::new("s1")?;
    const SIZE: u64 = 100 * 1024 * 1024;
    let answer = mesh.send(&format!("{SERVER_IP}:9000"), SIZE)?;
    assert_eq!(answer["bytes"], SIZE, "sink saw a different byte count");

    let source = ztunnel_metrics(&mesh.a)?;
    let dest = ztunnel_metrics(&mesh.b)?;
    let identities = [
        ("source_principal", CLIENT_PRINCIPAL),
        ("destination_principal", SERVER_PRINCIPAL),
        ("connection_security_policy", "mutual_tls"),
    ];
    let mut src_labels = vec![("reporter", "source")];
    src_labels.extend(identities);
    let mut dst_labels = vec![("reporter", "destination")];
    dst_labels.extend(identities);
    assert!(
        metric_sum(&source, "istio_tcp_received_bytes_total", &src_labels) >= SIZE as f64,
        "{source}"
    );
    assert!(
        metric_sum(&dest, "istio_tcp_received_bytes_total", &dst_labels) >= SIZE as f64,
        "{dest}"
    );
    assert!(metric_sum(&dest, "istio_tcp_connections_opened_total", &dst_labels) >= 1.0);
    assert_eq!(
        metric_sum(&dest, "istio_tcp_connections_opened_total", &dst_labels),
        metric_sum(&dest, "istio_tcp_connections_closed_total", &dst_labels),
        "every connection was closed"
    );

    // Through the service VIP: port 80 maps to the endpoint's 9000.
    let answer = mesh.send(&format!("{SERVICE_VIP}:80"), 4096)?;
    assert_eq!(answer["bytes"], 4096);
    let source = ztunnel_metrics(&mesh.a)?;
    assert!(
        metric_sum(
            &source,
            "istio_tcp_connections_opened_total",
            &[("destination_service", "echo.vms.svc.cluster.local")]
        ) >= 1.0,
        "{source}"
    );
    // The pool reused one HBONE connection for all of this.
    assert_eq!(
        metric_sum(&source, "ztunnel_hbone_pool_connections", &[]),
        1.0,
        "{source}"
    );

    // IPv6 is captured too (`capture apply --ipv6` → `[::1]:15001`) and crosses its
    // own HBONE connection to `[SERVER_IP6]:15008`, with the same identities. Every
    // listener, ztunnel's own servers included (a kubelet may probe readiness over
    // IPv6), has a socket of each family.
    for ns in [&mesh.a, &mesh.b] {
        let ports = ns.stdout(&["ss", "-Hltn"])?;
        for socket in [
            "127.0.0.1:15001",
            "[::1]:15001",
            "0.0.0.0:15008",
            "[::]:15008",
            "[::1]:15000",
            "[::]:15020",
            "[::]:15021",
        ] {
            assert!(
                ports.contains(socket),
                "{} lacks {socket}: {ports}",
                ns.name()
            );
        }
    }
    let answer = mesh.send(&format!("[{SERVER_IP6}]:9000"), SIZE / 10)?;
    assert_eq!(answer["bytes"], SIZE / 10);
    let dest = ztunnel_metrics(&mesh.b)?;
    assert!(
        metric_sum(&dest, "istio_tcp_received_bytes_total", &dst_labels) >= 1.1 * SIZE as f64,
        "{dest}"
    );
    let source = ztunnel_metrics(&mesh.a)?;
    assert_eq!(
        metric_sum(&source, "ztunnel_hbone_pool_connections", &[]),
        2.0,
        "one pooled connection per destination address: {source}"
    );
    Ok(())
}

#[test]
fn deny_policy_closes_live_connections_and_is_counted() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let mesh = Standalone::new("s2")?;
    let app = test_support::built_binary("e2e-app")?;
    let mut cmd = mesh.a.command(app.to_str().unwrap());
    cmd.args([
        "ping",
        "--connect",
        &format!("{SERVER_IP}:9001"),
        "--count",
        "100000",
        "--interval-ms",
        "10",
    ]);
    let mut pinger = ChildGuard::spawn(&format!("ping-{}", mesh.a.name()), cmd)?;
    wait_for(
        "the long-lived connection to be up",
        Duration::from_secs(10),
        || {
            let dest = ztunnel_metrics(&mesh.b).ok()?;
            (metric_sum(
                &dest,
                "istio_tcp_received_bytes_total",
                &[("reporter", "destination")],
            ) > 64.0)
                .then_some(())
        },
    )?;

    mesh.set_policies(
        r#"- name: deny-client
  namespace: vms
  scope: Namespace
  action: Deny
  rules:
  - - - principals:
        - !Exact cluster.local/ns/vms/sa/client"#,
    )?;
    let status = pinger
        .wait_timeout(Duration::from_secs(10))
        .expect("the live connection was closed after the policy change");
    assert_eq!(
        status.code(),
        Some(3),
        "ping saw its connection closed: {}",
        pinger.log()
    );
    assert!(
        mesh.send(&format!("{SERVER_IP}:9000"), 10).is_err(),
        "new connections are denied"
    );

    let dest = ztunnel_metrics(&mesh.b)?;
    assert!(
        metric_sum(&dest, "ztunnel_policy_revoked_connections_total", &[]) >= 1.0,
        "{dest}"
    );
    assert!(
        metric_sum(
            &dest,
            "ztunnel_errors_total",
            &[("reason", "policy_denied")]
        ) >= 1.0,
        "{dest}"
    );
    assert!(
        metric_sum(
            &dest,
            "istio_tcp_connections_failed_total",
            &[
                ("response_flags", "DENY"),
                ("source_principal", CLIENT_PRINCIPAL)
            ]
        ) >= 1.0,
        "{dest}"
    );

    // Lifting the policy lets traffic through again.
    mesh.set_policies("")?;
    wait_for(
        "traffic after the policy is lifted",
        Duration::from_secs(10),
        || mesh.send(&format!("{SERVER_IP}:9000"), 10).ok(),
    )?;
    Ok(())
}

#[test]
fn capture_rules_apply_idempotently_and_remove_cleanly() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let ns = Netns::new("cap")?;
    let ztunnel = test_support::built_binary("ztunnel")?;
    let ztunnel = ztunnel.to_str().unwrap();
    let before = ns.stdout(&["iptables-save", "-t", "nat"])?;
    ns.exec(&[ztunnel, "capture", "apply", "--exclude-port", "22"])?;
    ns.exec(&[ztunnel, "capture", "apply", "--exclude-port", "22"])?;
    let rules = ns.stdout(&["iptables-save", "-t", "nat"])?;
    assert_eq!(
        rules.matches("-A OUTPUT -j ISTIO_OUTPUT").count(),
        1,
        "{rules}"
    );
    assert!(
        rules.contains("-A ISTIO_OUTPUT -m mark --mark 0x539/0xfff -j RETURN"),
        "{rules}"
    );
    assert!(
        rules.contains("-A ISTIO_OUTPUT -p tcp -m tcp --dport 22 -j RETURN"),
        "{rules}"
    );
    assert!(
        rules.contains("-A ISTIO_OUTPUT -p tcp -j REDIRECT --to-ports 15001"),
        "{rules}"
    );
    ns.exec(&[ztunnel, "capture", "remove"])?;
    let after = ns.stdout(&["iptables-save", "-t", "nat"])?;
    assert!(!after.contains("ISTIO"), "{after}");
    let strip = |s: &str| {
        s.lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(strip(&before), strip(&after));
    Ok(())
}

#[test]
fn sigterm_drains_in_flight_connections_and_refuses_new_ones() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let mut mesh = Standalone::new("s3")?;
    let app = test_support::built_binary("e2e-app")?;
    // About 1.5 s of round trips: shorter than ztunnel's default 5 s drain deadline.
    let mut cmd = mesh.a.command(app.to_str().unwrap());
    cmd.args([
        "ping",
        "--connect",
        &format!("{SERVER_IP}:{ECHO_PORT}"),
        "--count",
        "150",
        "--interval-ms",
        "10",
    ]);
    let mut pinger = ChildGuard::spawn(&format!("drain-ping-{}", mesh.a.name()), cmd)?;
    wait_for("the connection to be up", Duration::from_secs(10), || {
        let source = ztunnel_metrics(&mesh.a).ok()?;
        (metric_sum(
            &source,
            "istio_tcp_received_bytes_total",
            &[("reporter", "source")],
        ) > 64.0)
            .then_some(())
    })?;

    mesh.ztunnel_a.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        mesh.send(&format!("{SERVER_IP}:{SINK_PORT}"), 10).is_err(),
        "a draining ztunnel accepts no new connections"
    );
    let status = pinger
        .wait_timeout(Duration::from_secs(10))
        .expect("ping finished");
    assert!(
        status.success(),
        "the in-flight connection finished: {}",
        pinger.log()
    );
    let exit = mesh
        .ztunnel_a
        .wait_timeout(Duration::from_secs(10))
        .expect("ztunnel exited after draining");
    assert!(exit.success(), "{}", mesh.ztunnel_a.log());
    assert!(mesh.ztunnel_a.log().contains("draining"));
    Ok(())
}

/// A port with no app behind it: the close test listens there itself.
const CLOSE_PORT: u16 = 9300;

/// Apps close through the mesh as they would directly (istio/ztunnel#1887): a
/// half-close (FIN) crosses HBONE as a half-close in each direction, the other
/// direction keeps flowing, and no end sends an RST; an app's RST (SO_LINGER 0)
/// reaches the other app as an RST, not as a clean end of data.
#[test]
fn fin_crosses_the_mesh_as_fin_and_rst_as_rst() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let mesh = Standalone::new("s8")?;
    let listener = mesh
        .b
        .run_inside(|| TcpListener::bind(("0.0.0.0", CLOSE_PORT)))??;
    let connect = || -> Result<(TcpStream, TcpStream)> {
        let client = mesh
            .a
            .run_inside(|| TcpStream::connect((SERVER_IP, CLOSE_PORT)))??;
        let (server, _) = listener.accept()?;
        for end in [&client, &server] {
            end.set_read_timeout(Some(Duration::from_secs(10)))?;
        }
        Ok((client, server))
    };
    let resets_before = [tcp_resets_sent(&mesh.a)?, tcp_resets_sent(&mesh.b)?];

    // The client closes first, then the server; then the other way round.
    for client_first in [true, false] {
        let (mut client, mut server) = connect()?;
        let (first, second) = if client_first {
            (&mut client, &mut server)
        } else {
            (&mut server, &mut client)
        };
        first.write_all(b"request")?;
        first.shutdown(Shutdown::Write)?;
        let mut got = Vec::new();
        second.read_to_end(&mut got)?;
        assert_eq!(got, b"request", "the half-close arrived after the data");
        // The half-closed connection still carries the answer back.
        second.write_all(b"response")?;
        second.shutdown(Shutdown::Write)?;
        let mut got = Vec::new();
        first.read_to_end(&mut got)?;
        assert_eq!(got, b"response", "client_first={client_first}");
    }
    // Both ztunnels end their copies once both directions are closed; an RST from
    // either (or from a kernel answering a socket ztunnel dropped early) shows here.
    for ztunnel in [&mesh.a, &mesh.b] {
        // The set-up's connection and these two.
        wait_for("every connection closed", Duration::from_secs(10), || {
            let text = ztunnel_metrics(ztunnel).ok()?;
            let count = |name| metric_sum(&text, name, &[]);
            let opened = count("istio_tcp_connections_opened_total");
            (opened >= 3.0 && count("istio_tcp_connections_closed_total") == opened).then_some(())
        })?;
    }
    assert_eq!(
        [tcp_resets_sent(&mesh.a)?, tcp_resets_sent(&mesh.b)?],
        resets_before,
        "graceful closes sent no RST in either namespace"
    );

    for client_resets in [true, false] {
        let (client, server) = connect()?;
        let (resetting, mut other) = if client_resets {
            (client, server)
        } else {
            (server, client)
        };
        // One byte across first, so both copies are running.
        (&resetting).write_all(b"x")?;
        let mut byte = [0u8; 1];
        other.read_exact(&mut byte)?;
        socket2::SockRef::from(&resetting).set_linger(Some(Duration::ZERO))?;
        drop(resetting);
        let read = other.read(&mut byte);
        assert_eq!(
            read.as_ref().map_err(|e| e.kind()),
            Err(ErrorKind::ConnectionReset),
            "client_resets={client_resets}: the other app saw {read:?}"
        );
    }
    Ok(())
}

/// New connections at 1,200 a second for a minute through one ztunnel pair (about
/// the rate that drove Istio's ztunnel to 2 vCPU, istio/ztunnel#1288), each 1 KiB
/// each way: none fails, every one is counted closed, and both ztunnels are back to
/// the descriptors they held before.
#[test]
fn connection_churn_fails_nothing_and_leaks_no_descriptor() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    const RATE: u32 = 1200;
    const DURATION: Duration = Duration::from_secs(60);
    const WORKERS: u32 = 12;
    let mesh = Standalone::new("s9")?;
    // The client closes first, so each connection leaves a TIME_WAIT behind in A
    // (the app's socket) and in B (ztunnel's socket to the app): 72,000 of them in a
    // minute outnumber the default ephemeral ports, directly as through the mesh.
    for ns in [&mesh.a, &mesh.b] {
        ns.exec(&["sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1"])?;
        ns.exec(&["sysctl", "-qw", "net.ipv4.ip_local_port_range=1024 65000"])?;
    }
    let ztunnels = [mesh.ztunnel_a.pid(), mesh.ztunnel_b.pid()];
    // Warm-up: whatever a ztunnel opens once for good (per worker thread, say) is
    // not a leak; the level after it is what the churn must come back to.
    let target = format!("{SERVER_IP}:{ECHO_PORT}");
    mesh.a
        .run_inside(|| churn(&target, 0, 1, 200, Duration::from_secs(1)))?;
    // The pool may add HBONE connections under the load (a connection's stream limit):
    // they stay until their idle timeout, one socket in each ztunnel, and are no leak.
    let pooled = || -> Result<usize> {
        let source = ztunnel_metrics(&mesh.a)?;
        Ok(metric_sum(&source, "ztunnel_hbone_pool_connections", &[]) as usize)
    };
    let pooled_before = pooled()?;
    let fds_before = ztunnels.map(test_support::procfs::open_fds);

    let started = std::time::Instant::now();
    let outcomes: Vec<(u64, Vec<String>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|worker| {
                let (mesh, target) = (&mesh, &target);
                scope.spawn(move || {
                    mesh.a
                        .run_inside(|| churn(target, worker, WORKERS, RATE, DURATION))
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker").expect("setns"))
            .collect()
    });
    let elapsed = started.elapsed();
    let ok: u64 = outcomes.iter().map(|(ok, _)| ok).sum();
    let failures: Vec<&String> = outcomes.iter().flat_map(|(_, f)| f).collect();
    println!(
        "churn: {ok} connections in {elapsed:.1?} ({:.0}/s), {} failed",
        ok as f64 / elapsed.as_secs_f64(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} connections failed, the first: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );

    let labels = [("reporter", "destination")];
    wait_for(
        "every connection counted closed",
        Duration::from_secs(10),
        || {
            let dest = ztunnel_metrics(&mesh.b).ok()?;
            let opened = metric_sum(&dest, "istio_tcp_connections_opened_total", &labels);
            let closed = metric_sum(&dest, "istio_tcp_connections_closed_total", &labels);
            (opened >= ok as f64 && closed == opened).then_some(())
        },
    )?;
    let expected = || -> Option<[_; 2]> {
        let grown = pooled().ok()?.checked_sub(pooled_before)?;
        Some(fds_before.clone().map(|mut kinds| {
            *kinds.entry("socket".to_owned()).or_default() += grown;
            kinds
        }))
    };
    wait_for(
        "both ztunnels back to their descriptors",
        Duration::from_secs(10),
        || (Some(ztunnels.map(test_support::procfs::open_fds)) == expected()).then_some(()),
    )
    .map_err(|e| {
        e.context(format!(
            "pooled HBONE connections {pooled_before} before, {:?} now; \
             descriptors before {fds_before:#?}, now {:#?}",
            pooled().ok(),
            ztunnels.map(test_support::procfs::open_fds)
        ))
    })?;
    Ok(())
}

/// One of `workers` clients together opening `rate` connections a second for
/// `duration`, each sending 1 KiB, half-closing and reading the echo to its end.
/// Returns how many went right, and what went wrong with the others.
fn churn(
    target: &str,
    worker: u32,
    workers: u32,
    rate: u32,
    duration: Duration,
) -> (u64, Vec<String>) {
    let interval = Duration::from_secs(1) * workers / rate;
    let start = std::time::Instant::now() + interval * worker / workers;
    let payload = [7u8; 1024];
    let (mut ok, mut failed) = (0, Vec::new());
    for i in 0.. {
        let due = start + interval * i;
        if due.duration_since(start) >= duration {
            break;
        }
        std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
        let round_trip = || -> std::io::Result<()> {
            let addr = target.parse().expect("address");
            let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
            stream.set_read_timeout(Some(Duration::from_secs(5)))?;
            stream.write_all(&payload)?;
            stream.shutdown(Shutdown::Write)?;
            let mut echoed = Vec::with_capacity(payload.len());
            stream.read_to_end(&mut echoed)?;
            if echoed.len() != payload.len() {
                return Err(std::io::Error::other(format!(
                    "{} bytes echoed",
                    echoed.len()
                )));
            }
            Ok(())
        };
        match round_trip() {
            Ok(()) => ok += 1,
            Err(e) => failed.push(format!("#{i} of worker {worker}: {e}")),
        }
    }
    (ok, failed)
}

/// The kernel's count of TCP RSTs sent from `ns` (every socket in it).
fn tcp_resets_sent(ns: &Netns) -> Result<u64> {
    let out = ns.stdout(&["nstat", "--ignore", "--noupdate", "--zeros", "TcpOutRsts"])?;
    out.lines()
        .find_map(|line| line.strip_prefix("TcpOutRsts"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no TcpOutRsts in nstat's output: {out}"))
}

#[test]
/// A waypoint named but not known (no workload or Service of that name): traffic is
/// refused rather than sent around it. (Through a real waypoint: `waypoint.rs`.)
fn traffic_to_an_unresolvable_waypoint_is_refused() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let mesh = Standalone::new("wp")?;
    let vip = format!("{SERVICE_VIP}:80");
    let direct = format!("{SERVER_IP}:{SINK_PORT}");
    assert_eq!(mesh.send(&vip, 10)?["bytes"], 10);
    const WAYPOINT: &str =
        "  waypoint:\n    destination: vms/waypoint.vms.svc.cluster.local\n    hboneMtlsPort: 15008\n";

    // The service names a waypoint: connections to its VIP are refused (going
    // around the waypoint would skip its L7 policy); the workload itself is not bound.
    let service_bound = local_config("").replace(
        "  hostname: echo.vms.svc.cluster.local\n",
        &format!("  hostname: echo.vms.svc.cluster.local\n{WAYPOINT}"),
    );
    mesh.set_config(&service_bound)?;
    wait_for("the service to be refused", Duration::from_secs(10), || {
        mesh.send(&vip, 10).is_err().then_some(())
    })?;
    assert_eq!(mesh.send(&direct, 10)?["bytes"], 10);
    let source = ztunnel_metrics(&mesh.a)?;
    assert!(
        metric_sum(
            &source,
            "ztunnel_errors_total",
            &[("reason", "waypoint_unavailable")]
        ) >= 1.0,
        "{source}"
    );

    // The workload names one too: direct connections are refused as well.
    let workload_bound =
        service_bound.replace("  node: vm-b\n", &format!("  node: vm-b\n{WAYPOINT}"));
    mesh.set_config(&workload_bound)?;
    wait_for(
        "the workload to be refused",
        Duration::from_secs(10),
        || mesh.send(&direct, 10).is_err().then_some(()),
    )?;
    assert!(
        mesh.ztunnel_a
            .log()
            .contains("the destination's waypoint has no ready instance"),
        "{}",
        mesh.ztunnel_a.log()
    );

    // Without the waypoints, traffic flows again.
    mesh.set_policies("")?;
    wait_for("traffic without waypoints", Duration::from_secs(10), || {
        mesh.send(&vip, 10).ok()
    })?;
    Ok(())
}

#[test]
fn the_vms_dns_proxy_answers_mesh_services_on_the_host() -> Result<()> {
    use hickory_proto::rr::RecordType;
    use local_cluster::dns::{addresses, ask_udp};
    use std::net::{IpAddr, SocketAddr, UdpSocket};

    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let mesh = Standalone::new("s4")?;
    // Dedicated mode: one proxy on the VM itself, ISTIO_META_DNS_PROXY_ADDR's default.
    let proxy: SocketAddr = "127.0.0.1:15053".parse()?;
    let socket = mesh.a.run_inside(|| UdpSocket::bind("127.0.0.1:0"))??;
    let ask = |name: &str, rtype| ask_udp(&socket, proxy, name, rtype, Duration::from_secs(2));
    let vip: IpAddr = SERVICE_VIP.parse()?;

    let answer = ask("echo.vms.svc.cluster.local.", RecordType::A)?;
    assert_eq!(addresses(&answer), [vip]);
    assert!(answer.authoritative(), "{answer:?}");
    // A short name expands from the VM's own namespace (PROXY_WORKLOAD_INFO's).
    assert_eq!(addresses(&ask("echo.", RecordType::A)?), [vip]);
    // The service has no IPv6 VIP: an empty answer, not NXDOMAIN.
    let aaaa = ask("echo.vms.svc.cluster.local.", RecordType::AAAA)?;
    assert!(aaaa.answers().is_empty(), "{aaaa:?}");
    assert_eq!(
        aaaa.response_code(),
        hickory_proto::op::ResponseCode::NoError
    );

    let metrics = ztunnel_metrics(&mesh.a)?;
    assert_eq!(
        metric_sum(
            &metrics,
            "istio_dns_requests_total",
            &[("request_protocol", "udp")]
        ),
        3.0,
        "{metrics}"
    );
    Ok(())
}

/// istioctl-lite's `ztunnel-config` tables, fed a live ztunnel's `/config_dump` (not a
/// hand-written one), so the dump and its parser cannot drift apart.
#[test]
fn istioctl_lite_reads_a_live_ztunnels_config_dump() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let mesh = Standalone::new("s5")?;
    let dump = mesh::http_get(&mesh.a, "http://127.0.0.1:15000/config_dump")?;
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("dump.json");
    std::fs::write(&file, &dump)?;
    let istioctl = test_support::built_binary("istioctl-lite")?;
    let table = |section: &str| -> Result<Vec<Vec<String>>> {
        let out = std::process::Command::new(&istioctl)
            .args(["ztunnel-config", section, "-f"])
            .arg(&file)
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "{section}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8(out.stdout)?
            .lines()
            .map(|l| l.split_whitespace().map(str::to_owned).collect())
            .collect())
    };
    let row = |rows: &[Vec<String>], first: &[&str]| {
        rows.iter()
            .any(|r| r.len() >= first.len() && r[..first.len()] == *first)
    };

    let workloads = table("workloads")?;
    assert_eq!(
        workloads[0][..3],
        ["NAMESPACE", "POD", "NAME"],
        "{workloads:?}"
    );
    for (name, ips, node) in [
        ("client-vm", [CLIENT_IP, CLIENT_IP6], "vm-a"),
        ("server-vm", [SERVER_IP, SERVER_IP6], "vm-b"),
    ] {
        let ips = ips.join(","); // both families, as istioctl prints them
        assert!(
            row(&workloads, &["vms", name, &ips, node, "None", "HBONE"]),
            "{name}: {workloads:?}"
        );
    }
    let services = table("services")?;
    assert!(
        row(&services, &["vms", "echo", SERVICE_VIP, "None", "1/1"]),
        "{services:?}"
    );
    // A dedicated ztunnel serves no pods: the pod table is its header alone.
    let pods = table("connections")?;
    assert_eq!(pods.len(), 1, "{pods:?}");
    assert_eq!(pods[0][..3], ["WORKLOAD", "DIRECTION", "LOCAL"]);
    Ok(())
}

/// A VM whose CA cannot answer at start is not fatal: ztunnel keeps running, not
/// ready, and keeps asking (readiness waits for the workload's first certificate).
#[test]
fn a_vm_whose_ca_is_unreachable_stays_up_unready_and_keeps_asking() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    mesh::ca_init(&dir.path().join("ca"))?;
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "workloads:\n- uid: uid-vm\n  name: vm\n  namespace: vms\n  serviceAccount: vm\n  workloadIps: [\"10.54.0.1\"]\n  protocol: HBONE\n  node: vm\n",
    )?;
    let token = dir.path().join("istio-token");
    std::fs::write(&token, "not-a-real-token")?;
    let vm = Netns::new("nca")?;
    let mut cmd = vm.command(
        test_support::built_binary("ztunnel")?
            .to_str()
            .unwrap_or_default(),
    );
    cmd.env("PROXY_MODE", "dedicated")
        .env("PROXY_WORKLOAD_INFO", "vms/vm/vm")
        .env("XDS_ADDRESS", "")
        .env("LOCAL_XDS_PATH", &config)
        // Nothing listens there: the VM's namespace has only its loopback.
        .env("CA_ADDRESS", "127.0.0.1:15012")
        .env("CA_ROOT_CA", dir.path().join("ca/root-cert.pem"))
        .env("AUTH_TOKEN", &token);
    let mut ztunnel = ChildGuard::spawn("ztunnel-nca", cmd)?;
    let failures = || -> f64 {
        let metrics = ztunnel_metrics(&vm).unwrap_or_default();
        metric_sum(
            &metrics,
            "ztunnel_certificate_fetch_failures_total",
            &[("reason", "unavailable")],
        )
    };
    wait_for(
        "three failed certificate fetches",
        Duration::from_secs(20),
        || (failures() >= 3.0).then_some(()),
    )
    .map_err(|e| anyhow::anyhow!("{e}\n{}", ztunnel.log()))?;
    assert_eq!(
        ztunnel.wait_timeout(Duration::from_millis(200)),
        None,
        "{}",
        ztunnel.log()
    );
    let ready = mesh::http_get(&vm, "http://127.0.0.1:15021/healthz/ready");
    assert!(ready.is_err(), "ready without a certificate: {ready:?}");
    Ok(())
}
