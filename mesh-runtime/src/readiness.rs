//! Readiness as a set of named blockers: ready when none is left.
//!
//! Each part of a binary blocks readiness under its own name until it works (a
//! certificate fetched, a cache synced, a socket listening), either for a start-up
//! step with a guard ([`Readiness::register`]) or by name when it may block again later
//! ([`Readiness::block`] / [`Readiness::unblock`]), so a new part joins without touching
//! the others. The probe endpoint answers from [`Readiness::response`].

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};

use http::StatusCode;

use crate::http_server::{text, Response};

/// What readiness still waits for. Cheap to clone; clones share the set.
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    pending: Arc<Mutex<BTreeSet<String>>>,
}

/// Held by a start-up step; readiness no longer waits for it once dropped.
#[must_use = "readiness waits for this step until the guard is dropped"]
#[derive(Debug)]
pub struct BlockReady {
    readiness: Readiness,
    name: String,
}

impl Drop for BlockReady {
    fn drop(&mut self) {
        self.readiness.unblock(&self.name);
    }
}

impl Readiness {
    /// Ready, with nothing to wait for yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Blocks readiness until the returned guard is dropped.
    pub fn register(&self, what: &str) -> BlockReady {
        self.block(what);
        BlockReady {
            readiness: self.clone(),
            name: what.to_owned(),
        }
    }

    /// Blocks readiness until [`Readiness::unblock`] with the same name.
    pub fn block(&self, what: &str) {
        self.lock().insert(what.to_owned());
    }

    /// Stops waiting for `what` (nothing happens if it was not blocking).
    pub fn unblock(&self, what: &str) {
        self.lock().remove(what);
    }

    /// Whether nothing blocks readiness.
    pub fn is_ready(&self) -> bool {
        self.lock().is_empty()
    }

    /// What readiness still waits for, sorted.
    pub fn pending(&self) -> Vec<String> {
        self.lock().iter().cloned().collect()
    }

    /// The probe's answer: 200 `ready`, or 503 naming what it still waits for.
    pub fn response(&self) -> Response {
        let pending = self.pending();
        if pending.is_empty() {
            text(StatusCode::OK, "ready\n")
        } else {
            text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: waiting for {}\n", pending.join(", ")),
            )
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeSet<String>> {
        // A panic elsewhere must not take the probe endpoint down with it.
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_when_no_blocker_or_guard_is_left() {
        let r = Readiness::new();
        assert!(r.is_ready());
        r.block("cni-config");
        let guard = r.clone().register("sockets");
        assert_eq!(r.pending(), ["cni-config", "sockets"]);
        assert_eq!(r.response().status(), StatusCode::SERVICE_UNAVAILABLE);
        drop(guard);
        r.unblock("sockets");
        assert!(!r.is_ready());
        r.unblock("cni-config");
        assert!(r.is_ready());
        assert_eq!(r.response().status(), StatusCode::OK);
    }
}
