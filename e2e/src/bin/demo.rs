//! `make demo`: the standalone mesh, explained as it runs.
//!
//! Two "VMs" (network namespaces joined by a veth pair), each with a dedicated
//! ztunnel configured only through Istio's environment variables and an Istio
//! local-config file. The client VM's outbound TCP is captured with iptables; the
//! demo shows the bytes crossing mutual-TLS HBONE with SPIFFE identities, then a
//! policy closing the door. Everything is torn down at the end.

use std::time::Duration;

use anyhow::{bail, Result};
use e2e::mesh::{metric_sum, ztunnel_metrics};
use e2e::process::wait_for;
use e2e::standalone::*;

fn main() -> Result<()> {
    if !e2e::can_run_root_tests() {
        bail!("the demo builds network namespaces: run it as root (sudo make demo)");
    }
    step("Building two isolated hosts: client-vm (10.10.0.1) and server-vm (10.10.0.2)");
    let mesh = Standalone::new("demo")?;
    println!("   each runs a dedicated ztunnel: PROXY_MODE=dedicated, PROXY_WORKLOAD_INFO=vms/<name>/<sa>,");
    println!("   CA_CERTS_DIR (a fresh root from `ztunnel ca init`), LOCAL_XDS_PATH (Istio's local config format).");
    println!("   client-vm's outbound TCP is redirected to its ztunnel by `ztunnel capture apply`.");

    step("The client sends 10 MiB to the server's port 9000, as a plain TCP app would");
    let answer = mesh.send(&format!("{SERVER_IP}:{SINK_PORT}"), 10 * 1024 * 1024)?;
    println!("   the server received {} bytes, SHA-256 {}…", answer["bytes"], &answer["sha256"].as_str().unwrap_or("")[..16]);

    step("What the server's ztunnel saw (its Prometheus metrics, Istio's names)");
    let dest = ztunnel_metrics(&mesh.b)?;
    let labels = [("reporter", "destination"), ("connection_security_policy", "mutual_tls")];
    println!("   istio_tcp_received_bytes_total over mutual TLS: {}", metric_sum(&dest, "istio_tcp_received_bytes_total", &labels));
    for line in dest.lines().filter(|l| l.starts_with("istio_tcp_connections_opened_total")) {
        println!("   {line}");
    }
    println!("   -> the bytes crossed an HBONE tunnel (HTTP/2 CONNECT over mTLS on port 15008),");
    println!("      from {CLIENT_PRINCIPAL} to {SERVER_PRINCIPAL}.");

    step("Through the service VIP 10.96.0.10:80 (mapped to the endpoint's port 9000)");
    let answer = mesh.send(&format!("{SERVICE_VIP}:80"), 4096)?;
    println!("   the server received {} bytes via echo.vms.svc.cluster.local", answer["bytes"]);

    step("An AuthorizationPolicy denies the client's identity (edit of the local config file)");
    mesh.set_policies(
        "- name: deny-client\n  namespace: vms\n  scope: Namespace\n  action: Deny\n  rules:\n  - - - principals:\n        - !Exact cluster.local/ns/vms/sa/client",
    )?;
    wait_for("the policy to apply", Duration::from_secs(10), || {
        mesh.send(&format!("{SERVER_IP}:{SINK_PORT}"), 10).err()
    })?;
    let dest = ztunnel_metrics(&mesh.b)?;
    println!(
        "   the connection was refused; denials counted by the server's ztunnel: {}",
        metric_sum(&dest, "ztunnel_errors_total", &[("reason", "policy_denied")])
    );

    step("Tearing everything down");
    drop(mesh);
    println!("   done: no namespace, link, rule or process is left behind.");
    Ok(())
}

fn step(text: &str) {
    println!("\n== {text}");
}
