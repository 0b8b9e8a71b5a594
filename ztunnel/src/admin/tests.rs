//! The admin server over real HTTP: the dump's shape (recorded for istioctl-lite's
//! contract test), `/logging`, `/quitquitquit`, the profile and the rest.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;
use crate::discovery::local::parse_local_config;
use crate::identity::{CertificateAuthority, Identity};
use crate::proxy::connections::{ConnectionDump, Direction, Shown};
use mesh_runtime::http_server::{Limits, Server};
use mesh_runtime::logging::{Format, Settings};

/// Two pods behind a Service (one unhealthy), a VM, and a policy.
const STATE: &str = r#"
workloads:
- uid: Kubernetes//Pod/demo/client-0
  name: client-0
  namespace: demo
  serviceAccount: client
  workloadIps: ["10.244.1.5"]
  protocol: HBONE
  node: node-1
  canonicalName: client
  canonicalRevision: v1
  workloadName: client
  workloadType: deployment
- uid: Kubernetes//Pod/demo/echo-0
  name: echo-0
  namespace: demo
  serviceAccount: echo
  workloadIps: ["10.244.2.7"]
  protocol: HBONE
  node: node-2
  services:
    demo/echo.demo.svc.cluster.local: {80: 8080}
- uid: Kubernetes//Pod/demo/echo-1
  name: echo-1
  namespace: demo
  serviceAccount: echo
  workloadIps: ["10.244.2.8"]
  protocol: HBONE
  node: node-2
  status: Unhealthy
  services:
    demo/echo.demo.svc.cluster.local: {80: 8080}
- name: db-vm
  namespace: legacy
  workloadIps: ["10.0.5.9"]
  node: vm-1
services:
- name: echo
  namespace: demo
  hostname: echo.demo.svc.cluster.local
  vips: ["/10.96.0.20"]
  ports: {80: 8080}
  ipFamilies: IPv4
policies:
- name: allow-client
  namespace: demo
  scope: Namespace
  action: Allow
  rules:
  - - - principals: [!Exact cluster.local/ns/demo/sa/client]
        destinationPorts: [8080]
"#;

/// The config a default `ztunnel` command line gives, with the node named.
fn config() -> crate::config::Config {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        config: crate::config::Config,
    }
    let mut config = Cli::try_parse_from(["ztunnel"]).unwrap().config;
    config.node_name = "node-1".into();
    config.xds_address = "istiod.istio-system.svc:15012".into();
    config.ca_address = "istiod.istio-system.svc:15012".into();
    config
}

struct Fixture {
    admin: Admin,
    addr: SocketAddr,
    connections: Arc<ConnectionManager>,
    _stop: tokio_util::sync::DropGuard,
}

async fn serve(logging: Option<LogHandle>) -> Fixture {
    let state = StateStore::new();
    state.replace_source("local", parse_local_config(STATE).unwrap());
    let ca = CertificateAuthority::generate_self_signed("cluster.local").unwrap();
    let certs = SecretManager::from_ca(ca, Duration::from_secs(3600));
    certs
        .fetch(&Identity::new("cluster.local", "demo", "client"))
        .await
        .unwrap();
    let connections = ConnectionManager::new();
    let pods = vec![PodSummary {
        uid: "0ebd766a-734d-4908-8995-cfa2e598d3ff".into(),
        name: "client-0".into(),
        namespace: "demo".into(),
        service_account: "client".into(),
        identity: "spiffe://cluster.local/ns/demo/sa/client".into(),
        netns_inode: 4026532551,
        state: "Up",
    }];
    let admin = Admin {
        state,
        certs,
        logging,
        shutdown: CancellationToken::new(),
        drained: CancellationToken::new(),
        drain_deadline: Duration::from_secs(2),
        config: config::config(&config()),
        local_config: None,
        workload_state: {
            let connections = connections.clone();
            Arc::new(move || workload_state(&pods, &connections))
        },
        profile_duration: Duration::from_millis(300),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let handler = {
        let admin = admin.clone();
        move |req: Request| {
            let admin = admin.clone();
            async move { admin.handle(req).await }
        }
    };
    tokio::spawn(Server::new(handler, Limits::default(), stop.clone()).serve_tcp(listener));
    Fixture {
        admin,
        addr,
        connections,
        _stop: stop.drop_guard(),
    }
}

/// (status, headers, body) of one request.
async fn call(addr: SocketAddr, method: &str, path: &str) -> (u16, String, Vec<u8>) {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(
        format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).await.unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, head, raw[split + 4..].to_vec())
}

async fn text_of(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let (status, _, body) = call(addr, method, path).await;
    (status, String::from_utf8(body).unwrap())
}

fn testdata(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../istioctl-lite/testdata")
        .join(name)
}

/// Values that change between runs (certificates, the toolchain), made fixed.
fn stable(mut dump: Value) -> Value {
    for cert in dump["certificates"].as_array_mut().into_iter().flatten() {
        for list in ["certChain", "rootCerts"] {
            for c in cert[list].as_array_mut().into_iter().flatten() {
                assert!(c["serialNumber"]
                    .as_str()
                    .unwrap()
                    .bytes()
                    .all(|b| b.is_ascii_digit()));
                c["serialNumber"] = json!("68528906629480349065949924107662330363");
                c["validFrom"] = json!("2026-12-04T00:00:00Z");
                c["expirationTime"] = json!("2026-12-05T00:00:00Z");
                c["pem"] = json!("LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==");
            }
        }
    }
    dump["version"]["rustVersion"] = json!("1.95.0");
    dump
}

#[tokio::test]
async fn the_dump_has_istios_shape_and_is_recorded_for_istioctl() {
    let f = serve(None).await;
    // A live connection of the pod shows under its workload state.
    let _conn = f.connections.track(
        None,
        Some(Shown {
            workload: ("demo".into(), "client-0".into()),
            direction: Direction::Outbound,
            dump: ConnectionDump {
                src: "10.244.1.5:41234".into(),
                original_dst: Some("10.96.0.20:80".into()),
                actual_dst: "10.244.2.7:8080".into(),
                protocol: "HBONE",
            },
        }),
    );
    let (status, head, body) = call(f.addr, "GET", "/config_dump").await;
    assert_eq!(status, 200);
    assert!(head.contains("content-type: application/json"), "{head}");
    let text = String::from_utf8(body).unwrap();
    let dump: Value = serde_json::from_str(&text).unwrap();
    // Keys sorted at every level: re-sorting changes nothing.
    assert_eq!(
        serde_json::to_string_pretty(&views::sorted(dump.clone())).unwrap(),
        text
    );
    let keys: Vec<&str> = dump
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "certificates",
            "config",
            "policies",
            "services",
            "stagedServices",
            "staticConfig",
            "version",
            "workloadState",
            "workloads"
        ]
    );
    let echo = &dump["workloads"][1];
    assert_eq!(
        echo["services"],
        json!(["demo/echo.demo.svc.cluster.local"])
    );
    assert_eq!(dump["workloads"][3]["uid"], "Kubernetes//Pod/legacy/db-vm");
    let service = &dump["services"][0];
    assert_eq!(
        service["endpoints"]["Kubernetes//Pod/demo/echo-1"],
        json!({"port": {"80": 8080}, "status": "Unhealthy", "workloadUid": "Kubernetes//Pod/demo/echo-1"})
    );
    assert_eq!(service["canonical"], false);
    let cert = &dump["certificates"][0];
    assert_eq!(cert["state"], "Available");
    use base64::Engine as _;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(cert["certChain"][0]["pem"].as_str().unwrap())
        .unwrap();
    assert!(pem.starts_with(b"-----BEGIN CERTIFICATE-----"));
    let state = &dump["workloadState"]["0ebd766a-734d-4908-8995-cfa2e598d3ff"];
    assert_eq!(state["state"], "Up");
    assert_eq!(
        state["connections"]["outbound"][0]["actualDst"],
        "10.244.2.7:8080"
    );
    assert_eq!(
        dump["config"]["adminAddr"],
        json!({"SocketAddr": "127.0.0.1:15000"})
    );
    // istioctl-lite's contract test and golden tables read this recording.
    let recorded = serde_json::to_string_pretty(&stable(dump)).unwrap() + "\n";
    test_support::golden::assert_golden(&testdata("ztunnel-dump.json"), &recorded);
}

#[tokio::test]
async fn certificates_show_initializing_and_unavailable_states() {
    let f = serve(None).await;
    let dump = f.admin.config_dump();
    assert_eq!(dump["certificates"].as_array().unwrap().len(), 1);
    use crate::identity::manager::CertState;
    let id = |sa: &str| Identity::new("cluster.local", "demo", sa);
    let shown = certs::certificates(vec![
        (
            id("b"),
            CertState::Unavailable("the CA is unreachable".into()),
        ),
        (id("a"), CertState::Initializing),
    ]);
    assert_eq!(shown[0]["state"], "Initializing");
    assert_eq!(shown[1]["state"], "Unavailable: the CA is unreachable");
    assert_eq!(shown[1]["certChain"], json!([]));
    assert_eq!(shown[1]["identity"], "spiffe://cluster.local/ns/demo/sa/b");
}

/// Lines written through the process-wide test subscriber of this test.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

struct LineWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'w> tracing_subscriber::fmt::MakeWriter<'w> for Lines {
    type Writer = LineWriter;
    fn make_writer(&'w self) -> LineWriter {
        LineWriter(self.0.clone())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn logging_changes_the_level_live_and_refuses_bad_input() {
    let lines = Lines::default();
    let settings = Settings {
        default_filter: "info".into(),
        strip_prefix: Some("ztunnel::"),
        format: Format::Plain,
    };
    let (subscriber, handle, _) = mesh_runtime::logging::subscriber(&settings, lines.clone());
    let _default = tracing::subscriber::set_default(subscriber);
    let f = serve(Some(handle)).await;

    let (status, body) = text_of(f.addr, "GET", "/logging").await;
    assert_eq!(status, 405);
    assert!(
        body.starts_with("Invalid HTTP method\n \nusage: POST /logging"),
        "{body}"
    );
    assert_eq!(
        text_of(f.addr, "POST", "/logging").await,
        (200, "current log level is info\n".into())
    );
    tracing::debug!(target: "access", "before");
    let (status, body) = text_of(f.addr, "POST", "/logging?level=access=debug").await;
    assert_eq!(
        (status, body.as_str()),
        (200, "current log level is access=debug,info\n")
    );
    tracing::debug!(target: "access", "after");
    let written = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    assert!(
        !written.contains("\tbefore\t") && written.contains("\tafter\t"),
        "{written}"
    );

    for bad in [
        "level=access:debug",
        "level=warning",
        "level=INFO",
        "level=a%3D%5B",
    ] {
        let (status, body) = text_of(f.addr, "POST", &format!("/logging?{bad}")).await;
        assert_eq!(status, 400, "{bad}");
        assert!(body.starts_with("Invalid level provided: "), "{body}");
        assert!(body.ends_with(logging::HELP), "{body}");
    }
    assert_eq!(
        text_of(f.addr, "POST", "/logging").await.1,
        "current log level is access=debug,info\n",
        "a refused request changed the level"
    );
    assert_eq!(
        text_of(f.addr, "POST", "/logging?level=warn&reset").await,
        (200, "current log level is warn\n".into())
    );
}

#[tokio::test]
async fn quitquitquit_drains_then_answers() {
    let f = serve(None).await;
    assert_eq!(call(f.addr, "GET", "/quitquitquit").await.0, 405);
    assert!(!f.admin.shutdown.is_cancelled());
    // The app: on shutdown, drain (here 200 ms), then say so.
    let (shutdown, drained) = (f.admin.shutdown.clone(), f.admin.drained.clone());
    tokio::spawn(async move {
        shutdown.cancelled().await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        drained.cancel();
    });
    let started = std::time::Instant::now();
    let (status, body) = text_of(f.addr, "POST", "/quitquitquit").await;
    assert_eq!((status, body.as_str()), (200, "shutdown now\n"));
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert!(f.admin.shutdown.is_cancelled());
}

#[tokio::test]
async fn the_profile_is_a_pprof_protobuf() {
    let f = serve(None).await;
    let (status, _, body) = call(f.addr, "GET", "/debug/pprof/profile").await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    use ::pprof::protos::Message as _;
    let profile = ::pprof::protos::Profile::decode(body.as_slice()).unwrap();
    assert_eq!(profile.sample_type.len(), 2);
}

#[tokio::test]
async fn the_index_and_unknown_paths() {
    let f = serve(None).await;
    let (status, head, body) = call(f.addr, "GET", "/").await;
    assert_eq!(status, 200);
    assert!(head.contains("text/html"));
    assert!(String::from_utf8(body).unwrap().contains("/config_dump"));
    let (status, _, body) = call(f.addr, "GET", "/nope").await;
    assert_eq!((status, body.len()), (404, 0));
}
