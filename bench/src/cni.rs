//! The CNI plugin's own cost: exec to exit of `istio-cni` ADD (with an agent that
//! answers at once) against Debian's reference `loopback` plugin, run alternately.

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use test_support::netns::Netns;

use crate::report::{ratio, Figure};
use crate::Plan;

pub fn run(plan: &Plan) -> Result<Vec<Figure>> {
    eprintln!(
        "CNI: {} ADDs of istio-cni and of loopback...",
        plan.cni_runs
    );
    let dir = tempfile::tempdir()?;
    let run_dir = dir.path().join("run");
    std::fs::create_dir_all(&run_dir)?;
    let agent = UnixListener::bind(run_dir.join(shared_types::constants::PLUGIN_EVENT_SOCKET))?;
    std::thread::spawn(move || answer_200(agent));
    let pod = Netns::new("cnib")?;
    let plugin = test_support::built_binary("istio-cni")?;
    let loopback = test_support::cni_reference_plugin_dir().join("loopback");

    let prev = r#"{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/x"}],"ips":[{"address":"10.244.1.10/24","gateway":"10.244.1.1","interface":0}]}"#;
    let ours = format!(
        r#"{{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"istio-cni","ambient_enabled":true,"cni_agent_run_dir":"{}","prevResult":{prev}}}"#,
        run_dir.display()
    );
    let theirs = r#"{"cniVersion":"1.0.0","name":"lo","type":"loopback"}"#.to_owned();
    let (mut ours_ms, mut theirs_ms) = (Vec::new(), Vec::new());
    for i in 0..plan.cni_runs {
        ours_ms.push(exec_add(&plugin, &ours, &pod, i)?);
        theirs_ms.push(exec_add(&loopback, &theirs, &pod, i)?);
    }
    let mut figures = vec![ratio(
        "CNI ADD exec to exit, istio-cni vs loopback (median)",
        "ms",
        theirs_ms.clone(),
        ours_ms.clone(),
        "within 2x of loopback",
    )];
    figures[0].ratio_kind = "ours/reference";
    Ok(figures)
}

/// Runs one ADD and returns its wall time in milliseconds.
fn exec_add(binary: &std::path::Path, netconf: &str, pod: &Netns, i: usize) -> Result<f64> {
    let started = Instant::now();
    let mut child = Command::new(binary)
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", format!("bench{i}"))
        .env("CNI_NETNS", pod.path())
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", binary.parent().context("plugin dir")?)
        .env(
            "CNI_ARGS",
            format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=pod-{i};K8S_POD_UID=uid-{i}"
            ),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(netconf.as_bytes())?;
    let out = child.wait_with_output()?;
    let took = started.elapsed().as_secs_f64() * 1000.0;
    if !out.status.success() {
        bail!(
            "{} ADD failed: {}",
            binary.display(),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    Ok(took)
}

/// A node agent that admits every pod at once.
fn answer_200(listener: UnixListener) {
    for stream in listener.incoming().flatten() {
        let mut stream = stream;
        let mut buf = [0u8; 8192];
        let mut request = Vec::new();
        // Read the head and the body the Content-Length announces.
        while let Ok(n) = stream.read(&mut buf) {
            if n == 0 {
                break;
            }
            request.extend_from_slice(&buf[..n]);
            if complete(&request) {
                break;
            }
        }
        let _ =
            stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    }
}

fn complete(request: &[u8]) -> bool {
    let text = String::from_utf8_lossy(request);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    let length = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().to_owned())
        })
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    body.len() >= length
}
