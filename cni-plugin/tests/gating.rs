//! The ADD gate against a fake node agent: who waits, what the agent's answers become,
//! and what happens when the agent is down. No root needed: the plugin never opens the
//! pod's netns itself.

mod common;

use common::{pod_args, run_plugin, FakeServer, Reply};
use serde_json::{json, Value};
use shared_types::cni::{
    AmbientEnablementState, CniPluginAddEvent, PluginLogEntry, ENABLEMENT_STATE_FILE,
};
use shared_types::constants::{PLUGIN_EVENT_SOCKET, PLUGIN_LOG_SOCKET};
use std::path::Path;
use std::time::{Duration, SystemTime};

fn prev_result() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "interfaces": [
            {"name": "cni0", "mac": "0a:58:0a:f4:00:01"},
            {"name": "eth0", "mac": "0a:58:0a:f4:00:05", "sandbox": "/var/run/netns/cni-test-pod"}
        ],
        "ips": [{"interface": 1, "address": "10.244.0.5/24", "gateway": "10.244.0.1"}],
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.244.0.1"}],
        "dns": {}
    })
}

fn netconf(run_dir: &Path, extra: Value) -> Value {
    let mut conf = json!({
        "cniVersion": "1.0.0",
        "name": "k8s-pod-network",
        "type": "istio-cni",
        "ambient_enabled": true,
        "cni_agent_run_dir": run_dir,
        "agent_timeout_seconds": 5,
        "prevResult": prev_result(),
    });
    for (k, v) in extra.as_object().unwrap() {
        conf[k] = v.clone();
    }
    conf
}

fn write_state(run_dir: &Path, ambient: &[&str]) {
    let state = AmbientEnablementState::new(
        ambient.iter().map(|s| s.to_string()).collect(),
        vec!["kube-system".into()],
        SystemTime::now(),
    );
    std::fs::write(
        run_dir.join(ENABLEMENT_STATE_FILE),
        serde_json::to_vec(&state).unwrap(),
    )
    .unwrap();
}

#[test]
fn agent_200_admits_the_pod_and_gets_the_event() {
    let dir = common::run_dir();
    let agent = FakeServer::start(
        &dir.path().join(PLUGIN_EVENT_SOCKET),
        Reply::Status(200, ""),
    );
    let run = run_plugin(
        "ADD",
        &netconf(dir.path(), json!({})),
        &pod_args("shop", "web-0"),
    );
    run.success();
    assert_eq!(run.json(), prev_result());

    let requests = agent.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(
        (requests[0].method.as_str(), requests[0].path.as_str()),
        ("POST", "/cmdadd")
    );
    let raw: Value = serde_json::from_slice(&requests[0].body).unwrap();
    // Istio's field names and Go encodings for the shared fields.
    assert_eq!(raw["Netns"], "/var/run/netns/cni-test-pod");
    assert_eq!(raw["PodName"], "web-0");
    assert_eq!(raw["PodNamespace"], "shop");
    assert_eq!(
        raw["IPs"],
        json!([{"Interface": 1, "Address": {"IP": "10.244.0.5", "Mask": "////AA=="}, "Gateway": "10.244.0.1"}])
    );
    let event: CniPluginAddEvent = serde_json::from_value(raw).unwrap();
    assert_eq!(event.pod_uid, "uid-web-0");
    assert_eq!(event.container_id, "0123456789abcdef");
    assert_eq!(event.if_name, "eth0");
}

#[test]
fn agent_refusal_is_a_retryable_error_with_its_reason() {
    for (status, body) in [
        (500, "ztunnel has not acked the pod"),
        (400, "bad event"),
        (503, ""),
    ] {
        let dir = common::run_dir();
        let _agent = FakeServer::start(
            &dir.path().join(PLUGIN_EVENT_SOCKET),
            Reply::Status(status, body),
        );
        let run = run_plugin(
            "ADD",
            &netconf(dir.path(), json!({})),
            &pod_args("shop", "web-0"),
        );
        let e = run.error(11);
        let msg = e["msg"].as_str().unwrap();
        assert!(
            msg.contains(&dir.path().join(PLUGIN_EVENT_SOCKET).display().to_string()),
            "{msg}"
        );
        assert!(msg.contains("refused pod shop/web-0"), "{msg}");
        assert!(msg.contains(&format!("HTTP {status}")), "{msg}");
        assert!(msg.contains(body), "{msg}");
        assert!(
            msg.contains("kubectl -n istio-system logs ds/istio-cni-node"),
            "{msg}"
        );
        assert_eq!(e["cniVersion"], "1.0.0");
    }
}

#[test]
fn silent_agent_times_out_with_a_retryable_error() {
    let dir = common::run_dir();
    let _agent = FakeServer::start(&dir.path().join(PLUGIN_EVENT_SOCKET), Reply::Silent);
    let conf = netconf(dir.path(), json!({"agent_timeout_seconds": 1}));
    let run = run_plugin("ADD", &conf, &pod_args("shop", "web-0"));
    let e = run.error(11);
    assert!(
        e["msg"]
            .as_str()
            .unwrap()
            .contains("did not answer within 1s"),
        "{e}"
    );
    assert!(run.elapsed >= Duration::from_secs(1), "{:?}", run.elapsed);
    assert!(run.elapsed < Duration::from_secs(4), "{:?}", run.elapsed);
}

#[test]
fn agent_down_and_namespace_ambient_fails_closed() {
    let dir = common::run_dir();
    write_state(dir.path(), &["shop"]);
    let run = run_plugin(
        "ADD",
        &netconf(dir.path(), json!({})),
        &pod_args("shop", "web-0"),
    );
    let e = run.error(11);
    let msg = e["msg"].as_str().unwrap();
    assert!(msg.contains("unreachable"), "{msg}");
    assert!(msg.contains(PLUGIN_EVENT_SOCKET), "{msg}");
    assert!(msg.contains("namespace shop is ambient"), "{msg}");
    assert!(run.elapsed < Duration::from_secs(2));
}

#[test]
fn agent_down_and_namespace_not_ambient_passes() {
    let dir = common::run_dir();
    write_state(dir.path(), &["other"]);
    let run = run_plugin(
        "ADD",
        &netconf(dir.path(), json!({})),
        &pod_args("shop", "web-0"),
    );
    run.success();
    assert_eq!(run.json(), prev_result());
    assert!(run.stderr.contains("not ambient"), "{}", run.stderr);
}

#[test]
fn stale_socket_file_counts_as_agent_down() {
    let dir = common::run_dir();
    // A socket file left behind by a dead agent: connection refused.
    drop(std::os::unix::net::UnixListener::bind(dir.path().join(PLUGIN_EVENT_SOCKET)).unwrap());
    write_state(dir.path(), &[]);
    run_plugin(
        "ADD",
        &netconf(dir.path(), json!({})),
        &pod_args("shop", "web-0"),
    )
    .success();
    write_state(dir.path(), &["shop"]);
    run_plugin(
        "ADD",
        &netconf(dir.path(), json!({})),
        &pod_args("shop", "web-0"),
    )
    .error(11);
}

#[test]
fn agent_down_without_usable_state_fails_closed() {
    let dir = common::run_dir();
    let run = run_plugin(
        "ADD",
        &netconf(dir.path(), json!({})),
        &pod_args("shop", "web-0"),
    );
    let msg = run.error(11)["msg"].as_str().unwrap().to_string();
    assert!(
        msg.contains(ENABLEMENT_STATE_FILE) && msg.contains("missing"),
        "{msg}"
    );

    for corrupt in [
        &b"{not json"[..],
        br#"{"version":99,"writtenAt":"x","ambientNamespaces":[]}"#,
    ] {
        std::fs::write(dir.path().join(ENABLEMENT_STATE_FILE), corrupt).unwrap();
        let run = run_plugin(
            "ADD",
            &netconf(dir.path(), json!({})),
            &pod_args("shop", "web-0"),
        );
        let msg = run.error(11)["msg"].as_str().unwrap().to_string();
        assert!(msg.contains("unusable"), "{msg}");
    }
}

#[test]
fn pods_that_never_wait_pass_with_no_agent_and_no_state() {
    let dir = common::run_dir();
    let cases = [
        (json!({}), pod_args("kube-system", "coredns-abc")),
        (json!({}), pod_args("istio-system", "ztunnel-x7k2p")),
        (json!({}), pod_args("istio-system", "istio-cni-node-9qz")),
        (
            json!({"exclude_namespaces": ["infra"]}),
            pod_args("infra", "db-0"),
        ),
        (json!({"ambient_enabled": false}), pod_args("shop", "web-0")),
        (json!({}), String::new()),
        (
            json!({}),
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop".to_string(),
        ),
    ];
    for (extra, args) in cases {
        let run = run_plugin("ADD", &netconf(dir.path(), extra.clone()), &args);
        run.success();
        assert_eq!(run.json(), prev_result(), "{extra} {args}");
        assert!(run.elapsed < Duration::from_secs(2));
    }
    // Same pod names outside the system namespace do wait (and fail closed here).
    run_plugin(
        "ADD",
        &netconf(dir.path(), json!({})),
        &pod_args("shop", "ztunnel-x7k2p"),
    )
    .error(11);
}

#[test]
fn log_lines_are_teed_to_the_agent() {
    let dir = common::run_dir();
    let _agent = FakeServer::start(
        &dir.path().join(PLUGIN_EVENT_SOCKET),
        Reply::Status(200, ""),
    );
    let sink = FakeServer::start(&dir.path().join(PLUGIN_LOG_SOCKET), Reply::Status(200, ""));
    let conf = netconf(dir.path(), json!({"plugin_log_level": "debug"}));
    run_plugin("ADD", &conf, &pod_args("shop", "web-0")).success();

    let requests = sink.requests();
    assert_eq!(requests.len(), 1, "one batch per invocation");
    assert_eq!(
        (requests[0].method.as_str(), requests[0].path.as_str()),
        ("POST", "/log")
    );
    // A JSON array of JSON-encoded entries (Istio's UDS log format).
    let lines: Vec<String> = serde_json::from_slice(&requests[0].body).unwrap();
    assert!(lines.len() >= 2, "{lines:?}");
    for line in &lines {
        let entry: PluginLogEntry = serde_json::from_str(line).unwrap();
        assert!(["debug", "info", "warn", "error"].contains(&entry.level.as_str()));
        assert!(
            entry.time.len() >= 20 && entry.time.ends_with('Z'),
            "{}",
            entry.time
        );
        assert!(!entry.msg.is_empty());
        assert_eq!(entry.fields["containerID"], "0123456789abcdef");
    }
    let last: PluginLogEntry = serde_json::from_str(lines.last().unwrap()).unwrap();
    assert_eq!(last.fields["pod"], "shop/web-0");
    assert!(last.msg.contains("admitted"), "{}", last.msg);

    // Failures reach the agent too, at error level with the CNI message.
    let dir = common::run_dir();
    let _agent = FakeServer::start(
        &dir.path().join(PLUGIN_EVENT_SOCKET),
        Reply::Status(500, "no ack"),
    );
    let sink = FakeServer::start(&dir.path().join(PLUGIN_LOG_SOCKET), Reply::Status(200, ""));
    run_plugin(
        "ADD",
        &netconf(dir.path(), json!({})),
        &pod_args("shop", "web-0"),
    )
    .error(11);
    let lines: Vec<String> = serde_json::from_slice(&sink.requests()[0].body).unwrap();
    let entry: PluginLogEntry = serde_json::from_str(lines.last().unwrap()).unwrap();
    assert_eq!(entry.level, "error");
    assert!(entry.msg.contains("no ack"), "{}", entry.msg);
}

#[test]
fn an_admitted_pod_sends_no_log_batch_at_the_default_level() {
    let dir = common::run_dir();
    let agent = FakeServer::start(
        &dir.path().join(PLUGIN_EVENT_SOCKET),
        Reply::Status(200, ""),
    );
    let sink = FakeServer::start(&dir.path().join(PLUGIN_LOG_SOCKET), Reply::Status(200, ""));
    run_plugin(
        "ADD",
        &netconf(dir.path(), json!({})),
        &pod_args("shop", "web-0"),
    )
    .success();
    assert_eq!(agent.requests().len(), 1, "the pod was gated");
    assert!(
        sink.requests().is_empty(),
        "nothing at info or above to send, so no second connection to the agent"
    );
}

#[test]
fn a_slow_log_sink_delays_the_plugin_only_briefly() {
    let dir = common::run_dir();
    let _sink = FakeServer::start(&dir.path().join(PLUGIN_LOG_SOCKET), Reply::Silent);
    let conf = netconf(
        dir.path(),
        json!({"ambient_enabled": false, "plugin_log_level": "debug"}),
    );
    let run = run_plugin("ADD", &conf, &pod_args("shop", "web-0"));
    run.success();
    assert!(
        run.elapsed < Duration::from_millis(1500),
        "{:?}",
        run.elapsed
    );
}
