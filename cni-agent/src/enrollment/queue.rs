//! A keyed work queue (key = pod `ns/name`): a key waits at most once (dedup), is never
//! handled by two workers at once, and a failed key comes back after an exponential
//! backoff. Handlers reconcile from current state, so they are idempotent.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{watch, Notify};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// Delay before retry number `failures` (1 = first retry).
    pub fn delay(&self, failures: u32) -> Duration {
        let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(20));
        self.initial.saturating_mul(factor).min(self.max)
    }
}

#[derive(Default)]
struct State {
    ready: VecDeque<String>,
    queued: HashSet<String>,
    processing: HashSet<String>,
    /// Added again while being processed: requeued when done.
    dirty: HashSet<String>,
    failures: HashMap<String, u32>,
    delayed: usize,
}

struct Inner {
    state: Mutex<State>,
    notify: Notify,
    backoff: Backoff,
    depth: watch::Sender<usize>,
}

#[derive(Clone)]
pub struct WorkQueue {
    inner: Arc<Inner>,
}

impl WorkQueue {
    pub fn new(backoff: Backoff) -> Self {
        WorkQueue {
            inner: Arc::new(Inner {
                state: Mutex::default(),
                notify: Notify::new(),
                backoff,
                depth: watch::channel(0).0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish(&self, state: &State) {
        self.inner
            .depth
            .send_replace(state.ready.len() + state.delayed);
    }

    /// Queues `key` unless it already waits.
    pub fn add(&self, key: &str) {
        let mut state = self.lock();
        if state.processing.contains(key) {
            state.dirty.insert(key.to_string());
            return;
        }
        if state.queued.insert(key.to_string()) {
            state.ready.push_back(key.to_string());
            self.publish(&state);
            drop(state);
            self.inner.notify.notify_one();
        }
    }

    /// Keys waiting (ready or backing off).
    pub fn depth(&self) -> usize {
        let state = self.lock();
        state.ready.len() + state.delayed
    }

    pub fn watch_depth(&self) -> watch::Receiver<usize> {
        self.inner.depth.subscribe()
    }

    /// The next key to handle; call [`WorkQueue::done`] with it afterwards.
    pub async fn next(&self) -> String {
        loop {
            let notified = self.inner.notify.notified();
            {
                let mut state = self.lock();
                if let Some(key) = state.ready.pop_front() {
                    state.queued.remove(&key);
                    state.processing.insert(key.clone());
                    self.publish(&state);
                    if !state.ready.is_empty() {
                        self.inner.notify.notify_one();
                    }
                    return key;
                }
            }
            notified.await;
        }
    }

    /// Ends handling of `key`: success forgets its failures, failure retries it after
    /// the backoff. Returns the retry delay, if any.
    pub fn done(&self, key: &str, ok: bool) -> Option<Duration> {
        let mut state = self.lock();
        state.processing.remove(key);
        let requeue_now = state.dirty.remove(key);
        let delay = if ok {
            state.failures.remove(key);
            None
        } else {
            let failures = state.failures.entry(key.to_string()).or_insert(0);
            *failures += 1;
            Some(self.inner.backoff.delay(*failures))
        };
        drop(state);
        match delay {
            Some(delay) if !requeue_now => {
                self.lock().delayed += 1;
                let queue = self.clone();
                let key = key.to_string();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    queue.lock().delayed -= 1;
                    queue.add(&key);
                });
            }
            _ if requeue_now => self.add(key),
            _ => {}
        }
        delay
    }

    /// Forgets the failure history of `key` (the object went away).
    pub fn forget(&self, key: &str) {
        self.lock().failures.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let b = Backoff::default();
        assert_eq!(b.delay(1), Duration::from_millis(100));
        assert_eq!(b.delay(2), Duration::from_millis(200));
        assert_eq!(b.delay(4), Duration::from_millis(800));
        assert_eq!(b.delay(20), Duration::from_secs(30));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(30));
    }

    #[tokio::test]
    async fn pending_keys_are_deduplicated_and_failures_retried() {
        let q = WorkQueue::new(Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(50),
        });
        q.add("a/x");
        q.add("a/y");
        q.add("a/x");
        assert_eq!(q.depth(), 2);
        let first = q.next().await;
        assert_eq!(first, "a/x");
        // Added while processing: comes back once it is done, not in parallel.
        q.add("a/x");
        assert_eq!(q.next().await, "a/y");
        assert_eq!(q.done("a/y", true), None);
        assert_eq!(q.done("a/x", true), None);
        assert_eq!(q.next().await, "a/x");
        // Failures come back later, each time later.
        assert_eq!(q.done("a/x", false), Some(Duration::from_millis(20)));
        assert_eq!(q.depth(), 1);
        let started = tokio::time::Instant::now();
        assert_eq!(q.next().await, "a/x");
        assert!(started.elapsed() >= Duration::from_millis(15));
        assert_eq!(q.done("a/x", false), Some(Duration::from_millis(40)));
        assert_eq!(q.next().await, "a/x");
        assert_eq!(q.done("a/x", false), Some(Duration::from_millis(50)));
        assert_eq!(q.next().await, "a/x");
        assert_eq!(q.done("a/x", true), None);
        assert_eq!(q.depth(), 0);
    }
}
