//! Readiness as a set of named blockers: `/readyz` answers 200 only when none is left.
//! Each part of the agent blocks readiness under its own name until it works (the CNI
//! config written, the sockets listening) and may block it again later, so a later part
//! (enrollment, ztunnel connection) joins without touching the others.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};

#[derive(Clone, Debug, Default)]
pub struct Readiness {
    pending: Arc<Mutex<BTreeSet<String>>>,
}

impl Readiness {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeSet<String>> {
        // A panic elsewhere must not take the health endpoint down with it.
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds readiness back until [`Readiness::unblock`] with the same name.
    pub fn block(&self, what: &str) {
        self.lock().insert(what.to_string());
    }

    pub fn unblock(&self, what: &str) {
        self.lock().remove(what);
    }

    pub fn is_ready(&self) -> bool {
        self.lock().is_empty()
    }

    /// What readiness still waits for, sorted.
    pub fn pending(&self) -> Vec<String> {
        self.lock().iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_when_no_blocker_left() {
        let r = Readiness::new();
        assert!(r.is_ready());
        r.block("cni-config");
        r.clone().block("sockets");
        assert_eq!(r.pending(), ["cni-config", "sockets"]);
        r.unblock("sockets");
        r.unblock("sockets");
        assert!(!r.is_ready());
        r.unblock("cni-config");
        assert!(r.is_ready());
    }
}
