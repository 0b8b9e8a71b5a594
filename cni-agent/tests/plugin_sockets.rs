//! The plugin sockets with a real client over the socket: answers for good, malformed,
//! oversized and misrouted requests, file modes, stale sockets, log re-emission, and the
//! health probes.

mod common;

use cni_agent::ops::health;
use cni_agent::plugin_api::{self, event::CmdAddError, event::CmdAddHandler};
use common::{access, capture_subscriber, exchange, mode, Answer};
use mesh_runtime::readiness::Readiness;
use shared_types::cni::CniPluginAddEvent;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::net::{TcpStream, UnixStream};
use tokio_util::sync::CancellationToken;

const GOOD_EVENT: &str = r#"{"Netns":"/var/run/netns/cni-1","PodName":"web-0","PodNamespace":"shop",
  "IPs":[{"Interface":0,"Address":{"IP":"10.1.0.5","Mask":"////AA=="},"Gateway":"10.1.0.1"}],
  "PodUID":"uid-1","ContainerID":"abc","IfName":"eth0"}"#;

/// Records the events it gets and answers by pod name: `fail` -> 500, `bad` -> 400,
/// `panic` -> panics, anything else -> 200.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<CniPluginAddEvent>>>);

impl Recorder {
    fn handler(&self) -> Arc<dyn CmdAddHandler> {
        let seen = self.0.clone();
        Arc::new(move |event: CniPluginAddEvent| {
            let seen = seen.clone();
            async move {
                let name = event.pod_name.clone();
                seen.lock().unwrap().push(event);
                match name.as_str() {
                    "fail" => Err(CmdAddError::Failed("ztunnel has not acked the pod".into())),
                    "bad" => Err(CmdAddError::BadRequest("pod unknown".into())),
                    "panic" => panic!("handler bug"),
                    _ => Ok(()),
                }
            }
        })
    }

    fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

struct Agent {
    _dir: tempfile::TempDir,
    run_dir: PathBuf,
    cancel: CancellationToken,
    recorder: Recorder,
}

impl Agent {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let run_dir = dir.path().join("run/istio-cni");
        let recorder = Recorder::default();
        let cancel = CancellationToken::new();
        plugin_api::start(&run_dir, recorder.handler(), &access(), cancel.clone()).unwrap();
        Agent {
            _dir: dir,
            run_dir,
            cancel,
            recorder,
        }
    }

    async fn post(&self, socket: &str, path: &str, body: &[u8]) -> Answer {
        self.send(socket, "POST", path, body).await
    }

    async fn send(&self, socket: &str, method: &str, path: &str, body: &[u8]) -> Answer {
        let stream = UnixStream::connect(self.run_dir.join(socket))
            .await
            .unwrap();
        exchange(stream, method, path, body).await
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

fn event_named(name: &str) -> String {
    GOOD_EVENT.replace("web-0", name)
}

#[tokio::test]
async fn good_event_is_handed_to_the_handler_and_answered_200() {
    let agent = Agent::start();
    let answer = agent
        .post("pluginevent.sock", "/cmdadd", GOOD_EVENT.as_bytes())
        .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let seen = agent.recorder.0.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        (seen[0].pod_name.as_str(), seen[0].pod_namespace.as_str()),
        ("web-0", "shop")
    );
    assert_eq!(seen[0].ips[0].address.to_string(), "10.1.0.5/24");
}

#[tokio::test]
async fn istio_plugin_event_without_our_fields_is_accepted() {
    let agent = Agent::start();
    let body = br#"{"Netns":"/proc/1/ns/net","PodName":"a","PodNamespace":"b","IPs":null}"#;
    assert_eq!(
        agent.post("pluginevent.sock", "/cmdadd", body).await.status,
        200
    );
}

#[tokio::test]
async fn malformed_json_is_400_and_reaches_no_handler() {
    let agent = Agent::start();
    for body in [&b"{not json"[..], b"[]", b"", br#"{"PodName":"a"}"#] {
        let answer = agent.post("pluginevent.sock", "/cmdadd", body).await;
        assert_eq!(answer.status, 400, "{answer:?}");
        assert!(answer.body.contains("invalid ADD event"), "{answer:?}");
    }
    let missing = GOOD_EVENT.replace("\"web-0\"", "\"\"");
    let answer = agent
        .post("pluginevent.sock", "/cmdadd", missing.as_bytes())
        .await;
    assert_eq!(answer.status, 400);
    assert!(answer.body.contains("missing PodName"), "{answer:?}");
    assert_eq!(agent.recorder.count(), 0);
}

#[tokio::test]
async fn handler_errors_map_to_400_and_500_with_the_message() {
    let agent = Agent::start();
    let answer = agent
        .post(
            "pluginevent.sock",
            "/cmdadd",
            event_named("fail").as_bytes(),
        )
        .await;
    assert_eq!(answer.status, 500);
    assert_eq!(answer.body, "ztunnel has not acked the pod");
    let answer = agent
        .post("pluginevent.sock", "/cmdadd", event_named("bad").as_bytes())
        .await;
    assert_eq!((answer.status, answer.body.as_str()), (400, "pod unknown"));
    let answer = agent
        .post(
            "pluginevent.sock",
            "/cmdadd",
            event_named("panic").as_bytes(),
        )
        .await;
    assert_eq!(answer.status, 500, "a panicking handler still answers");
    // The server survives all of it.
    assert_eq!(
        agent
            .post("pluginevent.sock", "/cmdadd", GOOD_EVENT.as_bytes())
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn oversized_bodies_are_413() {
    let agent = Agent::start();
    let big = vec![b' '; 100 * 1024];
    let answer = agent.post("pluginevent.sock", "/cmdadd", &big).await;
    assert_eq!(answer.status, 413, "{answer:?}");
    // Without Content-Length (chunked), the limit still holds.
    let stream = UnixStream::connect(agent.run_dir.join("pluginevent.sock"))
        .await
        .unwrap();
    let answer = chunked_post(stream, "/cmdadd", &big).await;
    assert_eq!(answer.status, 413, "{answer:?}");
    assert_eq!(agent.recorder.count(), 0);
}

async fn chunked_post(stream: UnixStream, path: &str, body: &[u8]) -> Answer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: agent\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    .into_bytes();
    for chunk in body.chunks(8192) {
        request.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        request.extend_from_slice(chunk);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"0\r\n\r\n");
    let (mut read, mut write) = tokio::io::split(stream);
    let writer = tokio::spawn(async move { write.write_all(&request).await });
    let mut raw = Vec::new();
    let _ = read.read_to_end(&mut raw).await;
    let _ = writer.await;
    common::parse_answer(&raw)
}

#[tokio::test]
async fn unknown_paths_are_404_and_wrong_methods_405() {
    let agent = Agent::start();
    assert_eq!(
        agent
            .post("pluginevent.sock", "/cmddel", b"{}")
            .await
            .status,
        404
    );
    assert_eq!(agent.post("log.sock", "/cmdadd", b"[]").await.status, 404);
    let answer = agent.send("pluginevent.sock", "GET", "/cmdadd", b"").await;
    assert_eq!(answer.status, 405);
    assert_eq!(agent.send("log.sock", "GET", "/log", b"").await.status, 405);
}

#[tokio::test]
async fn run_dir_and_socket_modes() {
    let agent = Agent::start();
    let expected_dir = access().run_dir_mode();
    assert_eq!(mode(&agent.run_dir), expected_dir);
    assert!(expected_dir == 0o700 || expected_dir == 0o711);
    for socket in ["pluginevent.sock", "log.sock"] {
        let path = agent.run_dir.join(socket);
        assert!(std::fs::metadata(&path).unwrap().file_type().is_socket());
        assert_eq!(mode(&path), 0o600, "{socket}");
    }
    // Nothing else was left in the run dir (the staging dirs are gone).
    let mut names: Vec<_> = std::fs::read_dir(&agent.run_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["log.sock", "pluginevent.sock"]);
}

#[tokio::test]
async fn an_existing_open_run_dir_is_closed_down() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("istio-cni");
    // What kubelet makes of a `DirectoryOrCreate` hostPath.
    std::fs::create_dir(&run_dir).unwrap();
    std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cancel = CancellationToken::new();
    plugin_api::start(
        &run_dir,
        Recorder::default().handler(),
        &access(),
        cancel.clone(),
    )
    .unwrap();
    assert_eq!(mode(&run_dir), access().run_dir_mode());
    assert_eq!(mode(&run_dir.join("pluginevent.sock")), 0o600);
    cancel.cancel();
}

#[tokio::test]
async fn stale_sockets_are_replaced_other_files_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path();
    // A previous agent's socket, nobody listening any more.
    drop(std::os::unix::net::UnixListener::bind(run_dir.join("pluginevent.sock")).unwrap());
    let cancel = CancellationToken::new();
    plugin_api::start(
        run_dir,
        Recorder::default().handler(),
        &access(),
        cancel.clone(),
    )
    .unwrap();
    let stream = UnixStream::connect(run_dir.join("pluginevent.sock"))
        .await
        .unwrap();
    assert_eq!(
        exchange(stream, "POST", "/cmdadd", GOOD_EVENT.as_bytes())
            .await
            .status,
        200
    );
    cancel.cancel();

    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join("log.sock"), b"not a socket").unwrap();
    let err = plugin_api::start(
        other.path(),
        Recorder::default().handler(),
        &access(),
        CancellationToken::new(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("not a socket"), "{err}");
    assert!(Path::new(&other.path().join("log.sock")).is_file());
}

#[tokio::test(flavor = "current_thread")]
async fn plugin_log_lines_are_reemitted_under_cni_plugin() {
    let (capture, subscriber) = capture_subscriber();
    let _guard = tracing::subscriber::set_default(subscriber);
    let agent = Agent::start();
    let batch = serde_json::to_vec(&[
        r#"{"level":"info","time":"2026-05-01T12:00:00.000001Z","msg":"node agent admitted the pod","pod":"shop/web-0"}"#,
        r#"{"level":"error","time":"2026-05-01T12:00:00.000002Z","msg":"boom"}"#,
    ])
    .unwrap();
    let answer = agent.post("log.sock", "/log", &batch).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let events: Vec<_> = capture
        .events()
        .into_iter()
        .filter(|e| e.target == "cni-plugin")
        .collect();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0].level, tracing::Level::INFO);
    assert_eq!(
        events[0].field("message"),
        Some("node agent admitted the pod")
    );
    assert_eq!(events[0].field("time"), Some("2026-05-01T12:00:00.000001Z"));
    assert_eq!(events[0].field("extra"), Some(r#"{"pod":"shop/web-0"}"#));
    assert_eq!(events[1].level, tracing::Level::ERROR);

    let answer = agent
        .post("log.sock", "/log", b"{\"not\":\"an array\"}")
        .await;
    assert_eq!(answer.status, 400);
}

#[tokio::test]
async fn health_probes_follow_readiness() {
    let readiness = Readiness::new();
    readiness.block("cni-config");
    let listener = health::bind(0).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let cancel = CancellationToken::new();
    tokio::spawn(health::serve(listener, readiness.clone(), cancel.clone()));
    let get = |path: &'static str| async move {
        let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        exchange(stream, "GET", path, b"").await
    };
    assert_eq!(get("/healthz").await.status, 200);
    let answer = get("/readyz").await;
    assert_eq!(answer.status, 503);
    assert!(answer.body.contains("cni-config"), "{answer:?}");
    readiness.unblock("cni-config");
    assert_eq!(get("/readyz").await.status, 200);
    assert_eq!(get("/metrics").await.status, 404);
    cancel.cancel();
}
