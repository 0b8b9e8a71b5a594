//! ztunnel's worker threads (`ztunnel::workers`) with real sockets on loopback: each
//! connection runs wholly on one worker, the least loaded one.

use std::net::SocketAddr;
use std::thread::ThreadId;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use ztunnel::drain::Drain;
use ztunnel::proxy::accept_loop;
use ztunnel::workers;

/// Where a connection's handler ran, and where a task it spawned ran.
#[derive(Debug)]
struct Placement {
    worker: usize,
    thread: ThreadId,
    spawned_worker: usize,
    spawned_thread: ThreadId,
    first_byte: u8,
}

enum Event {
    Started(Placement),
    Closed,
}

fn here() -> (usize, ThreadId) {
    (workers::current(), std::thread::current().id())
}

/// Connects and sends `byte`; returns the client and where the handler ran.
async fn connect(
    addr: SocketAddr,
    events: &mut mpsc::UnboundedReceiver<Event>,
    byte: u8,
) -> (TcpStream, Placement) {
    let mut client = TcpStream::connect(addr).await.unwrap();
    client.write_all(&[byte]).await.unwrap();
    match tokio::time::timeout(Duration::from_secs(10), events.recv()).await {
        Ok(Some(Event::Started(placement))) => (client, placement),
        _ => panic!("connection {byte} was not handled"),
    }
}

#[test]
fn each_connection_runs_wholly_on_the_least_loaded_worker() {
    workers::run(2, async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (events_tx, mut events) = mpsc::unbounded_channel();
        // The proxies' own accept loop, with a handler that reports where it runs and
        // holds the connection until the client closes it.
        tokio::spawn(accept_loop(
            listener,
            Drain::new(),
            "test",
            move |mut stream, _| {
                let events = events_tx.clone();
                async move {
                    let (worker, thread) = here();
                    let (spawned_worker, spawned_thread) =
                        tokio::spawn(async { here() }).await.unwrap();
                    let mut byte = [0u8; 1];
                    // The adopted socket works on its new worker.
                    stream.read_exact(&mut byte).await.unwrap();
                    let _ = events.send(Event::Started(Placement {
                        worker,
                        thread,
                        spawned_worker,
                        spawned_thread,
                        first_byte: byte[0],
                    }));
                    let _ = stream.read(&mut byte).await;
                    let _ = events.send(Event::Closed);
                }
            },
        ));
        let (first, on_first) = connect(addr, &mut events, 1).await;
        let (_second, on_second) = connect(addr, &mut events, 2).await;
        for (placement, byte) in [(&on_first, 1), (&on_second, 2)] {
            assert_eq!(placement.first_byte, byte);
            assert_eq!(
                (placement.spawned_worker, placement.spawned_thread),
                (placement.worker, placement.thread),
                "a task spawned by a connection stays on its worker: {placement:?}"
            );
        }
        assert_eq!(on_first.worker, 0, "{on_first:?}");
        assert_eq!(
            on_second.worker, 1,
            "the busy worker is passed over: {on_second:?}"
        );
        assert_ne!(on_first.thread, on_second.thread);

        // Once the first connection is over, its worker is the least loaded again.
        drop(first);
        let closed = tokio::time::timeout(Duration::from_secs(10), events.recv()).await;
        assert!(matches!(closed, Ok(Some(Event::Closed))));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (_third, on_third) = connect(addr, &mut events, 3).await;
        assert_eq!(on_third.worker, 0, "{on_third:?}");
    })
    .unwrap();
}
