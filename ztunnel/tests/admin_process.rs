//! The ztunnel binary's admin port, as an operator uses it: a dedicated ztunnel on
//! loopback logging JSON (the charts' `logAsJson`), its `/config_dump`, a live
//! `/logging` change, and `/quitquitquit` draining it to a clean exit.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ztunnel::identity::CertificateAuthority;

/// A port nothing listens on now (bound, then released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP/1.0 exchange: (status, body).
fn call(addr: SocketAddr, method: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut tcp = TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(Duration::from_secs(20)))?;
    write!(tcp, "{method} {path} HTTP/1.0\r\nContent-Length: 0\r\n\r\n")?;
    let mut raw = String::new();
    tcp.read_to_string(&mut raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_owned()))
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_running_ztunnel_dumps_logs_json_and_quits_gracefully() {
    let dir = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::generate_self_signed("cluster.local").unwrap();
    ca.write(&dir.path().join("ca")).unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "workloads:\n- uid: uid-vm\n  name: vm\n  namespace: vms\n  serviceAccount: vm\n  workloadIps: [\"127.0.0.1\"]\n  protocol: HBONE\n",
    )
    .unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let log = dir.path().join("stdout.log");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ztunnel"));
    cmd.env_clear()
        .env("PROXY_MODE", "dedicated")
        .env("PROXY_WORKLOAD_INFO", "vms/vm/vm")
        .env("CA_CERTS_DIR", dir.path().join("ca"))
        .env("LOCAL_XDS_PATH", &config)
        .env("LOG_FORMAT", "json")
        .env("RUST_LOG", "info")
        .env("PACKET_MARK", "0")
        .env("IPV6_ENABLED", "false")
        .env("ISTIO_META_DNS_CAPTURE", "false")
        .env("TERMINATION_GRACE_PERIOD", "2s")
        .env("ADMIN_ADDR", admin.to_string());
    for (var, port) in [
        ("STATS_ADDR", free_port()),
        ("READINESS_ADDR", free_port()),
        ("OUTBOUND_ADDR", free_port()),
        ("INBOUND_ADDR", free_port()),
        ("INBOUND_PLAINTEXT_ADDR", free_port()),
    ] {
        cmd.env(var, format!("127.0.0.1:{port}"));
    }
    cmd.stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::inherit());
    let mut ztunnel = Killed(cmd.spawn().unwrap());

    // The dump, once the workload's certificate is there.
    let started = Instant::now();
    let dump: serde_json::Value = loop {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no dump in time"
        );
        if let Ok((200, body)) = call(admin, "GET", "/config_dump") {
            let dump: serde_json::Value = serde_json::from_str(&body).unwrap();
            if dump["certificates"][0]["state"] == "Available" {
                break dump;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(dump["workloads"][0]["uid"], "uid-vm");
    assert_eq!(dump["staticConfig"]["workloads"][0]["name"], "vm");
    assert_eq!(dump["workloadState"], serde_json::json!({}));
    assert_eq!(dump["config"]["proxyMode"], "Dedicated");

    // A live level change, and a refused one that changes nothing.
    assert_eq!(
        call(admin, "POST", "/logging?level=access=debug").unwrap(),
        (200, "current log level is access=debug,info\n".into())
    );
    assert_eq!(
        call(admin, "POST", "/logging?level=access:debug")
            .unwrap()
            .0,
        400
    );
    assert_eq!(
        call(admin, "POST", "/logging").unwrap().1,
        "current log level is access=debug,info\n"
    );

    // Drain, answer, exit.
    assert_eq!(
        call(admin, "POST", "/quitquitquit").unwrap(),
        (200, "shutdown now\n".into())
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = ztunnel.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "ztunnel did not exit");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");

    // Every line is Istio's JSON.
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    for line in &lines {
        for key in ["level", "time", "scope", "message"] {
            assert!(line.get(key).is_some(), "{key} missing: {line}");
        }
    }
    let messages: Vec<&str> = lines.iter().filter_map(|l| l["message"].as_str()).collect();
    assert!(
        messages.contains(&"new log filter is access=debug,info"),
        "{messages:?}"
    );
    assert!(
        messages.contains(&"Shutdown completed gracefully"),
        "{messages:?}"
    );
    assert!(messages.contains(&"ztunnel stopped"), "{messages:?}");
}
