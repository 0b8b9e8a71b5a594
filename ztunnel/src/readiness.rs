//! Readiness on 15021: ready once every startup task has reported in.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use http::StatusCode;

use crate::http::{text, SimpleRequest, SimpleResponse};

/// Tasks that must finish before ztunnel reports ready.
#[derive(Clone, Default)]
pub struct Readiness {
    pending: Arc<Mutex<BTreeSet<String>>>,
}

/// Held by a startup task; ready once every one is dropped.
pub struct BlockReady {
    readiness: Readiness,
    name: String,
}

impl Drop for BlockReady {
    fn drop(&mut self) {
        self.readiness.lock().remove(&self.name);
    }
}

impl Readiness {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn register(&self, name: &str) -> BlockReady {
        self.lock().insert(name.to_owned());
        BlockReady {
            readiness: self.clone(),
            name: name.to_owned(),
        }
    }

    pub fn pending(&self) -> Vec<String> {
        self.lock().iter().cloned().collect()
    }

    pub fn is_ready(&self) -> bool {
        self.lock().is_empty()
    }

    pub async fn handle(&self, request: SimpleRequest) -> SimpleResponse {
        if request.path != "/healthz/ready" {
            return text(StatusCode::NOT_FOUND, "not found\n");
        }
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

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}
