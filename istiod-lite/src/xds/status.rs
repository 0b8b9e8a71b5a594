//! Who is connected and how far each proxy is in sync, per type: what
//! `istioctl-lite proxy-status` shows (Istio's SYNCED / STALE / NOT SENT).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SyncState {
    /// The last response sent was ACKed.
    Synced,
    /// A response is waiting for its ACK, or was NACKed.
    Stale,
    /// Nothing of this type was sent yet.
    NotSent,
}

/// One type on one stream.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TypeStatus {
    pub nonce_sent: String,
    pub nonce_acked: String,
    /// The store generation of the last response sent.
    pub version: u64,
    /// The client's reason, when the last answer was a NACK.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nacked: Option<String>,
}

impl TypeStatus {
    pub fn state(&self) -> SyncState {
        if self.nonce_sent.is_empty() {
            SyncState::NotSent
        } else if self.nonce_acked == self.nonce_sent && self.nacked.is_none() {
            SyncState::Synced
        } else {
            SyncState::Stale
        }
    }
}

/// One connected proxy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProxyStatus {
    pub node_id: String,
    pub identity: String,
    pub connected_at: u64,
    pub types: BTreeMap<String, TypeStatus>,
}

#[derive(Clone, Default)]
pub struct Connections {
    streams: Arc<Mutex<BTreeMap<u64, Arc<Mutex<ProxyStatus>>>>>,
    next: Arc<AtomicU64>,
}

impl Connections {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Mutex<ProxyStatus>>>> {
        self.streams.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new stream; it is listed until the registration is dropped.
    pub fn register(&self, node_id: &str, identity: String) -> Registration {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let status = Arc::new(Mutex::new(ProxyStatus {
            node_id: node_id.to_owned(),
            identity,
            connected_at: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            types: BTreeMap::new(),
        }));
        self.lock().insert(id, status.clone());
        Registration {
            id,
            connections: self.clone(),
            status,
        }
    }

    /// Every connected proxy, by node id.
    pub fn snapshot(&self) -> Vec<ProxyStatus> {
        let mut all: Vec<ProxyStatus> = self
            .lock()
            .values()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).clone())
            .collect();
        all.sort_by(|a, b| a.node_id.cmp(&b.node_id));
        all
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

/// A stream's entry in [`Connections`]; removed on drop.
pub struct Registration {
    id: u64,
    connections: Connections,
    status: Arc<Mutex<ProxyStatus>>,
}

impl Registration {
    pub fn update<T>(&self, f: impl FnOnce(&mut ProxyStatus) -> T) -> T {
        f(&mut self.status.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn sent(&self, type_url: &str, nonce: &str, version: u64) {
        self.update(|s| {
            let t = s.types.entry(type_url.to_owned()).or_default();
            t.nonce_sent = nonce.to_owned();
            t.version = version;
        });
    }

    /// An ACK (`nack` None) or a NACK of `nonce`.
    pub fn answered(&self, type_url: &str, nonce: &str, nack: Option<String>) {
        self.update(|s| {
            let t = s.types.entry(type_url.to_owned()).or_default();
            if nack.is_none() {
                t.nonce_acked = nonce.to_owned();
            }
            // Only an answer to the latest response says where the proxy stands.
            if nonce == t.nonce_sent {
                t.nacked = nack;
            }
        });
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.connections.lock().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_state_follows_nonces_and_nacks() {
        let connections = Connections::default();
        let r = connections.register(
            "ztunnel~10.0.0.1~z.istio-system~istio-system.svc.cluster.local",
            "spiffe://td/ns/istio-system/sa/ztunnel".into(),
        );
        let state = |t: &str| {
            connections.snapshot()[0]
                .types
                .get(t)
                .cloned()
                .unwrap_or_default()
                .state()
        };
        assert_eq!(state("A"), SyncState::NotSent);
        r.sent("A", "1", 3);
        assert_eq!(state("A"), SyncState::Stale);
        r.answered("A", "1", None);
        assert_eq!(state("A"), SyncState::Synced);
        r.sent("A", "2", 4);
        r.answered("A", "2", Some("bad resource".into()));
        assert_eq!(state("A"), SyncState::Stale);
        r.sent("A", "3", 5);
        r.answered("A", "3", None);
        assert_eq!(state("A"), SyncState::Synced);
        drop(r);
        assert!(connections.is_empty());
    }
}
