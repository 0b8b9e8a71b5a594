//! ztunnel's worker threads: one single-threaded runtime per worker, and each
//! accepted connection runs wholly on one of them.
//!
//! On a work-stealing runtime the tasks of one connection (its copy, the HTTP/2
//! connection driver it sends through, the tasks of the streams that driver serves)
//! drift between workers: every wakeup across threads costs a futex call and the h2
//! connection state bounces between caches. Measured with two workers on two cores,
//! that nearly doubled context switches per byte and cost 10–15 % of throughput
//! against one worker. Pinning a connection to one worker keeps its work on one
//! core; load is balanced per connection instead, at accept.

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::runtime::{Builder, Handle};
use tokio_util::sync::CancellationToken;

thread_local! {
    /// On a worker's thread: all the workers, and which one this thread is.
    static THIS_THREAD: RefCell<Option<(Arc<[Worker]>, usize)>> = const { RefCell::new(None) };
}

/// One worker: its runtime, and how many connections it runs now.
#[derive(Clone)]
pub struct Worker {
    index: usize,
    runtime: Handle,
    connections: Arc<AtomicUsize>,
}

/// Runs `main` on the calling thread as worker 0, with `count - 1` more workers on
/// threads of their own, and returns what `main` returns. Connections accepted
/// through [`pick`] on any worker are spread over all of them.
pub fn run<F: Future>(count: usize, main: F) -> io::Result<F::Output> {
    let mut runtimes = (0..count.max(1))
        .map(|_| Builder::new_current_thread().enable_all().build())
        .collect::<io::Result<Vec<_>>>()?;
    let workers: Arc<[Worker]> = runtimes
        .iter()
        .enumerate()
        .map(|(index, r)| Worker {
            index,
            runtime: r.handle().clone(),
            connections: Arc::default(),
        })
        .collect();
    let first = runtimes.remove(0);
    let stop = CancellationToken::new();
    let mut threads = Vec::new();
    for (index, runtime) in (1..).zip(runtimes) {
        let (workers, stop) = (workers.clone(), stop.clone());
        threads.push(
            std::thread::Builder::new()
                .name(format!("ztunnel-worker-{index}"))
                .spawn(move || {
                    THIS_THREAD.set(Some((workers, index)));
                    // Runs the tasks handed to it until `main` is done.
                    runtime.block_on(stop.cancelled());
                    runtime.shutdown_background();
                })?,
        );
    }
    THIS_THREAD.set(Some((workers, 0)));
    let output = first.block_on(main);
    THIS_THREAD.set(None);
    stop.cancel();
    for thread in threads {
        let _ = thread.join();
    }
    Ok(output)
}

/// The worker running the caller: 0 outside [`run`]'s threads.
pub fn current() -> usize {
    THIS_THREAD.with_borrow(|this| this.as_ref().map_or(0, |(_, index)| *index))
}

/// The worker for a new connection: the one running the fewest, the first of those
/// on a tie (so light traffic stays on few threads and few pooled connections).
/// Outside [`run`]'s threads (tests), the current runtime.
pub fn pick() -> Worker {
    THIS_THREAD
        .with_borrow(|this| {
            let (workers, _) = this.as_ref()?;
            workers
                .iter()
                .min_by_key(|w| w.connections.load(Ordering::Relaxed))
                .cloned()
        })
        .unwrap_or_else(|| Worker {
            index: 0,
            runtime: Handle::current(),
            connections: Arc::default(),
        })
}

impl Worker {
    /// Moves `stream` to this worker's reactor, so that its readiness wakes this
    /// worker and not the one that accepted it. A stream accepted on this worker
    /// stays registered as it is (moving costs three `epoll_ctl` calls).
    pub fn adopt(&self, stream: TcpStream) -> io::Result<TcpStream> {
        if self.index == current() {
            return Ok(stream);
        }
        let stream = stream.into_std()?;
        let _context = self.runtime.enter();
        TcpStream::from_std(stream)
    }

    /// `connection`, counted against this worker until it ends or is dropped.
    pub fn counted<F: Future>(&self, connection: F) -> impl Future<Output = F::Output> {
        self.connections.fetch_add(1, Ordering::Relaxed);
        let done = Decrement(self.connections.clone());
        async move {
            let _done = done;
            connection.await
        }
    }

    pub fn runtime(&self) -> &Handle {
        &self.runtime
    }
}

struct Decrement(Arc<AtomicUsize>);

impl Drop for Decrement {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
