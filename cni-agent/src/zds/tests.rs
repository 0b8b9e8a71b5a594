//! The server against in-process fake ztunnels speaking the wire protocol.

use super::*;
use prost::Message;
use shared_types::zds::{workload_request::Payload, WorkloadResponse, ZdsHello};
use shared_types::zds_transport::SeqpacketStream;
use std::sync::Mutex as StdMutex;

/// How a fake answers each request.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Ack,
    Nack,
    Silent,
    /// Refuses the first add of each pod, takes it the next time.
    NackFirstAdd,
}

/// A fake ztunnel: records what it got ("add:uid:fd", "del:uid", "keep:uid", "snap").
struct Fake {
    seen: Arc<StdMutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Fake {
    async fn connect(path: &Path, mode: Mode) -> Fake {
        let stream = SeqpacketStream::connect(path).unwrap();
        stream
            .send(&ZdsHello::v1().encode_to_vec(), None)
            .await
            .unwrap();
        let seen = Arc::new(StdMutex::new(Vec::new()));
        let record = seen.clone();
        let task = tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            while let Ok(d) = stream.recv(&mut buf).await {
                if d.len == 0 {
                    break;
                }
                let request = WorkloadRequest::decode(&buf[..d.len]).unwrap();
                let entry = match request.payload.unwrap() {
                    Payload::Add(a) => format!("add:{}:{}", a.uid, d.fds.len()),
                    Payload::Del(x) => format!("del:{}", x.uid),
                    Payload::Keep(k) => format!("keep:{}", k.uid),
                    Payload::SnapshotSent(_) => "snap".to_string(),
                };
                let first = !record.lock().unwrap().contains(&entry);
                record.lock().unwrap().push(entry.clone());
                let answer = match mode {
                    Mode::Silent if entry != "snap" => continue,
                    Mode::Nack if entry != "snap" => WorkloadResponse::nack("no"),
                    Mode::NackFirstAdd if first && entry.starts_with("add:") => {
                        WorkloadResponse::nack("no certificate yet")
                    }
                    _ => WorkloadResponse::ack(),
                };
                let _ = stream.send(&answer.encode_to_vec(), None).await;
            }
        });
        Fake { seen, task }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

fn info(name: &str) -> WorkloadInfo {
    WorkloadInfo {
        name: name.into(),
        namespace: "ns".into(),
        service_account: "sa".into(),
    }
}

fn own_netns() -> Arc<NetnsHandle> {
    Arc::new(NetnsHandle::open("/proc/self/ns/net").unwrap())
}

async fn start(timeout: Duration) -> (tempfile::TempDir, ZdsServer, CancellationToken) {
    let dir = tempfile::tempdir().unwrap();
    // SAFETY: geteuid has no preconditions.
    let us = unsafe { libc::geteuid() };
    let gate = PeerGate::new(
        crate::plugin_api::peer::SOCKET_ZDS,
        us,
        &crate::ops::metrics::Metrics::new(),
    );
    let server =
        ZdsServer::bind_with_timeout(&dir.path().join("sub/ztunnel.sock"), timeout, gate).unwrap();
    let cancel = CancellationToken::new();
    let run = server.clone();
    let stop = cancel.clone();
    tokio::spawn(async move { run.run(stop).await });
    (dir, server, cancel)
}

async fn wait_connections(server: &ZdsServer, n: usize) {
    let mut count = server.watch_connections();
    tokio::time::timeout(Duration::from_secs(5), count.wait_for(|c| *c == n))
        .await
        .expect("connection count")
        .unwrap();
}

#[tokio::test]
async fn add_goes_to_newest_del_to_all_and_replay_on_connect() {
    let (_dir, server, cancel) = start(Duration::from_secs(2)).await;
    let netns = own_netns();
    assert!(matches!(
        server.add("u0", info("p0"), &netns).await,
        Err(ZdsError::NotConnected(_))
    ));
    let first = Fake::connect(server.path(), Mode::Ack).await;
    wait_connections(&server, 1).await;
    server.add("u1", info("p1"), &netns).await.unwrap();
    // A pod registered without a netns is replayed as keep.
    server.register(
        "u2",
        EnrolledPod {
            info: info("p2"),
            netns: None,
        },
    );
    let second = Fake::connect(server.path(), Mode::Ack).await;
    wait_connections(&server, 2).await;
    assert_eq!(second.seen(), ["add:u1:1", "keep:u2", "snap"]);
    server.add("u3", info("p3"), &netns).await.unwrap();
    server.del("u1").await.unwrap();
    assert_eq!(first.seen(), ["snap", "add:u1:1", "del:u1"]);
    assert_eq!(
        second.seen(),
        ["add:u1:1", "keep:u2", "snap", "add:u3:1", "del:u1"]
    );
    assert!(!server.is_enrolled("u1") && server.is_enrolled("u3"));
    // The newest goes away: adds fall back to the older connection.
    second.task.abort();
    drop(second);
    wait_connections(&server, 1).await;
    server.add("u4", info("p4"), &netns).await.unwrap();
    assert_eq!(first.seen().last().unwrap(), "add:u4:1");
    cancel.cancel();
}

#[tokio::test]
async fn nack_is_reported_and_keeps_the_connection() {
    let (_dir, server, cancel) = start(Duration::from_secs(2)).await;
    let _fake = Fake::connect(server.path(), Mode::Nack).await;
    wait_connections(&server, 1).await;
    assert_eq!(
        server.add("u1", info("p1"), &own_netns()).await,
        Err(ZdsError::Nack("no".into()))
    );
    assert!(!server.is_enrolled("u1"));
    assert_eq!(server.connections(), 1);
    cancel.cancel();
}

#[tokio::test]
async fn replayed_pods_ztunnel_refused_are_retried_until_taken() {
    let (_dir, server, cancel) = start(Duration::from_secs(2)).await;
    let netns = own_netns();
    for (uid, name) in [("u1", "p1"), ("u2", "p2")] {
        server.register(
            uid,
            EnrolledPod {
                info: info(name),
                netns: Some(netns.clone()),
            },
        );
    }
    let fake = Fake::connect(server.path(), Mode::NackFirstAdd).await;
    wait_connections(&server, 1).await;
    // u2 is un-enrolled before the retry: only u1 is sent again.
    server.del("u2").await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while fake.seen().len() < 5 {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", fake.seen());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        fake.seen(),
        ["add:u1:1", "add:u2:1", "snap", "del:u2", "add:u1:1"]
    );
    // Taken: nothing more is sent.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(fake.seen().len(), 5, "{:?}", fake.seen());
    cancel.cancel();
}

#[tokio::test]
async fn malformed_peers_are_dropped_without_affecting_others() {
    let (_dir, server, cancel) = start(Duration::from_millis(300)).await;
    let good = Fake::connect(server.path(), Mode::Ack).await;
    wait_connections(&server, 1).await;

    // A bad hello: dropped during the greeting, never counted.
    let bad = SeqpacketStream::connect(server.path()).unwrap();
    bad.send(b"\xff\xff\xff", None).await.unwrap();
    let mut buf = [0u8; 64];
    let eof = tokio::time::timeout(Duration::from_secs(2), bad.recv(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(eof.len, 0);
    // A peer that never says hello times out.
    let mute = SeqpacketStream::connect(server.path()).unwrap();
    let eof = tokio::time::timeout(Duration::from_secs(2), mute.recv(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(eof.len, 0);

    // Garbage between requests: that connection is removed.
    let noisy = SeqpacketStream::connect(server.path()).unwrap();
    noisy
        .send(&ZdsHello::v1().encode_to_vec(), None)
        .await
        .unwrap();
    noisy.recv(&mut buf).await.unwrap(); // snapshot_sent
    noisy
        .send(&WorkloadResponse::ack().encode_to_vec(), None)
        .await
        .unwrap();
    wait_connections(&server, 2).await;
    noisy.send(b"garbage", None).await.unwrap();
    wait_connections(&server, 1).await;

    // A silent peer: the request times out and the peer is dropped.
    let silent = Fake::connect(server.path(), Mode::Silent).await;
    wait_connections(&server, 2).await;
    assert!(matches!(
        server.add("u1", info("p1"), &own_netns()).await,
        Err(ZdsError::Timeout(_))
    ));
    wait_connections(&server, 1).await;
    drop(silent);

    // The good one never noticed.
    server.add("u2", info("p2"), &own_netns()).await.unwrap();
    assert_eq!(good.seen(), ["snap", "add:u2:1"]);
    cancel.cancel();
}

#[tokio::test]
async fn socket_is_0600() {
    use std::os::unix::fs::PermissionsExt;
    let (_dir, server, cancel) = start(Duration::from_secs(2)).await;
    let mode = std::fs::metadata(server.path())
        .unwrap()
        .permissions()
        .mode()
        & 0o7777;
    assert_eq!(mode, ZDS_SOCKET_MODE);
    assert_eq!(ZDS_SOCKET_MODE, 0o600);
    cancel.cancel();
}
