//! Per-identity certificate cache.
//!
//! Every HBONE handshake needs the local workload's leaf; asking for one per
//! connection would be wasteful, so leaves are cached per identity, shared by all
//! pods with that identity. Each identity gets a refresher task that renews at
//! half-life (as Istio does) and retries with backoff; while renewal fails, the
//! current leaf keeps serving until it expires, so a control-plane outage shorter
//! than half a lifetime breaks nothing. Connections never wait on a renewal: only
//! the very first leaf of an identity, or one that has expired, is awaited.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::task::AbortHandle;

use super::source::{CertError, CertificateSource};
use super::{Identity, WorkloadCertificate};
use crate::metrics::ErrorLabels;

const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Counters the manager keeps (registered by [`crate::metrics::Metrics`]).
#[derive(Clone, Default)]
pub struct CertMetrics {
    pub fetched: Counter,
    pub failures: Family<ErrorLabels, Counter>,
}

/// Caches one leaf per identity and keeps it fresh. Cheap to clone.
#[derive(Clone)]
pub struct SecretManager {
    inner: Arc<Inner>,
}

struct Inner {
    source: CertificateSource,
    lifetime: Duration,
    metrics: CertMetrics,
    slots: Mutex<HashMap<Identity, Arc<Slot>>>,
}

/// One identity's leaf, the lock that makes concurrent first fetches one request,
/// and its refresher.
#[derive(Default)]
struct Slot {
    current: Mutex<Option<Held>>,
    fetching: tokio::sync::Mutex<()>,
    refresher: Mutex<Option<AbortHandle>>,
    /// Why the last first fetch failed, while there is no leaf (`/config_dump`).
    last_error: Mutex<Option<String>>,
}

/// Where one identity's leaf stands, as `/config_dump` shows it (Istio's states).
#[derive(Clone, Debug)]
pub enum CertState {
    /// A leaf is held (it may have expired while renewals fail).
    Available(Arc<WorkloadCertificate>),
    /// The first leaf is being fetched.
    Initializing,
    /// The first fetch failed; the error's text.
    Unavailable(String),
}

#[derive(Clone)]
struct Held {
    cert: Arc<WorkloadCertificate>,
    /// Half of the lifetime left when it arrived. Counted from arrival, not from
    /// not_before, which CAs backdate for clock skew.
    refresh_at: SystemTime,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(task) = lock(&self.refresher).take() {
            task.abort();
        }
    }
}

impl SecretManager {
    /// `lifetime` is what is asked for (Istio's SECRET_TTL); a CA may grant less.
    pub fn new(source: CertificateSource, lifetime: Duration, metrics: CertMetrics) -> Self {
        SecretManager {
            inner: Arc::new(Inner {
                source,
                lifetime,
                metrics,
                slots: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Leaves signed by a CA on this machine (VMs without a control plane, tests).
    pub fn from_ca(ca: super::CertificateAuthority, lifetime: Duration) -> Self {
        let source = CertificateSource::Local(Arc::new(ca));
        Self::new(source, lifetime, CertMetrics::default())
    }

    /// The leaf for `id`: the cached one while valid, else a new one (awaited).
    pub async fn fetch(&self, id: &Identity) -> Result<Arc<WorkloadCertificate>, CertError> {
        let slot = self.slot(id);
        if let Some(cert) = valid(&slot) {
            return Ok(cert);
        }
        let _one_at_a_time = slot.fetching.lock().await;
        if let Some(cert) = valid(&slot) {
            return Ok(cert);
        }
        let cert = match self.inner.request(id).await {
            Ok(cert) => cert,
            Err(e) => {
                *lock(&slot.last_error) = Some(e.to_string());
                return Err(e);
            }
        };
        *lock(&slot.last_error) = None;
        self.store(id, &slot, cert.clone());
        Ok(cert)
    }

    /// Every identity asked for, with where its leaf stands, sorted by identity.
    pub fn states(&self) -> Vec<(Identity, CertState)> {
        let slots: Vec<(Identity, Arc<Slot>)> = self
            .slots()
            .iter()
            .map(|(id, slot)| (id.clone(), slot.clone()))
            .collect();
        let mut states: Vec<_> = slots
            .into_iter()
            .map(|(id, slot)| {
                let state = match (lock(&slot.current).as_ref(), lock(&slot.last_error).clone()) {
                    (Some(held), _) => CertState::Available(held.cert.clone()),
                    (None, Some(error)) => CertState::Unavailable(error),
                    (None, None) => CertState::Initializing,
                };
                (id, state)
            })
            .collect();
        states.sort_by(|a, b| a.0.cmp(&b.0));
        states
    }

    /// All cached leaves, sorted by identity (for `/config_dump`).
    pub fn certificates(&self) -> Vec<Arc<WorkloadCertificate>> {
        let slots: Vec<Arc<Slot>> = self.slots().values().cloned().collect();
        let mut certs: Vec<_> = slots
            .iter()
            .filter_map(|s| lock(&s.current).as_ref().map(|h| h.cert.clone()))
            .collect();
        certs.sort_by(|a, b| a.identity.cmp(&b.identity));
        certs
    }

    /// Drops the leaf and stops renewing it, e.g. when the last pod with `id`
    /// leaves the node.
    pub fn forget(&self, id: &Identity) {
        self.slots().remove(id);
    }

    fn slot(&self, id: &Identity) -> Arc<Slot> {
        self.slots().entry(id.clone()).or_default().clone()
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<Identity, Arc<Slot>>> {
        lock(&self.inner.slots)
    }

    /// Keeps `cert` and makes sure a refresher runs for the identity.
    fn store(&self, id: &Identity, slot: &Arc<Slot>, cert: Arc<WorkloadCertificate>) {
        *lock(&slot.current) = Some(Held::new(cert));
        let mut refresher = lock(&slot.refresher);
        if refresher.is_none() {
            let task = tokio::spawn(refresh_loop(
                Arc::downgrade(&self.inner),
                Arc::downgrade(slot),
                id.clone(),
            ));
            *refresher = Some(task.abort_handle());
        }
    }
}

impl Inner {
    async fn request(&self, id: &Identity) -> Result<Arc<WorkloadCertificate>, CertError> {
        match self.source.fetch(id, self.lifetime).await {
            Ok(cert) => {
                self.metrics.fetched.inc();
                tracing::info!(identity = %id, serial = %cert.serial, expires = ?cert.not_after, "fetched workload certificate");
                Ok(Arc::new(cert))
            }
            Err(e) => {
                self.metrics
                    .failures
                    .get_or_create(&ErrorLabels { reason: e.reason() })
                    .inc();
                Err(e)
            }
        }
    }
}

impl Held {
    fn new(cert: Arc<WorkloadCertificate>) -> Self {
        let now = SystemTime::now();
        let left = cert.not_after.duration_since(now).unwrap_or_default();
        Held {
            refresh_at: now + left / 2,
            cert,
        }
    }
}

/// The current leaf if it has not expired.
fn valid(slot: &Slot) -> Option<Arc<WorkloadCertificate>> {
    let current = lock(&slot.current);
    let held = current.as_ref()?;
    (SystemTime::now() < held.cert.not_after).then(|| held.cert.clone())
}

/// Renews at half-life, retrying with backoff; the old leaf serves meanwhile.
/// Ends when the identity is forgotten (its slot dropped) or the manager is gone.
async fn refresh_loop(inner: std::sync::Weak<Inner>, slot: std::sync::Weak<Slot>, id: Identity) {
    let mut backoff = RETRY_MIN;
    loop {
        let Some(refresh_at) = slot
            .upgrade()
            .and_then(|s| lock(&s.current).as_ref().map(|h| h.refresh_at))
        else {
            return;
        };
        if let Ok(wait) = refresh_at.duration_since(SystemTime::now()) {
            tokio::time::sleep(wait).await;
        }
        let (Some(inner), Some(slot)) = (inner.upgrade(), slot.upgrade()) else {
            return;
        };
        let result = {
            let _one_at_a_time = slot.fetching.lock().await;
            inner.request(&id).await
        };
        match result {
            Ok(cert) => {
                *lock(&slot.current) = Some(Held::new(cert));
                backoff = RETRY_MIN;
            }
            Err(e) => {
                let expires = lock(&slot.current).as_ref().map(|h| h.cert.not_after);
                tracing::warn!(identity = %id, error = %e, ?expires, retry_in = ?backoff, "certificate renewal failed; the current certificate keeps serving");
                drop((inner, slot));
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RETRY_MAX);
            }
        }
    }
}

/// A poisoned lock only means another thread panicked mid-update; the data is
/// still consistent, so keep serving.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::CertificateAuthority;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    fn manager(lifetime: Duration) -> (SecretManager, CertMetrics) {
        let ca = CertificateAuthority::generate_self_signed("cluster.local").unwrap();
        let metrics = CertMetrics::default();
        let source = CertificateSource::Local(Arc::new(ca));
        let manager = SecretManager::new(source, lifetime, metrics.clone());
        (manager, metrics)
    }

    fn id(sa: &str) -> Identity {
        Identity::new("cluster.local", "default", sa)
    }

    #[tokio::test]
    async fn caches_per_identity() {
        let (certs, metrics) = manager(DAY);
        let first = certs.fetch(&id("a")).await.unwrap();
        assert!(Arc::ptr_eq(&first, &certs.fetch(&id("a")).await.unwrap()));
        assert_eq!(metrics.fetched.get(), 1);
        certs.fetch(&id("b")).await.unwrap();
        assert_eq!(metrics.fetched.get(), 2);
    }

    #[tokio::test]
    async fn renews_at_half_life_without_being_asked() {
        // The CA backdates not_before by a minute; half-life counts from arrival.
        let (certs, metrics) = manager(Duration::from_secs(2));
        let first = certs.fetch(&id("a")).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1600)).await;
        assert!(metrics.fetched.get() >= 2, "renewed in the background");
        let second = certs.fetch(&id("a")).await.unwrap();
        assert_ne!(first.serial, second.serial);
        assert!(second.not_after > first.not_after);
    }

    #[tokio::test]
    async fn lists_sorted_and_forgets() {
        let (certs, _) = manager(DAY);
        for sa in ["c", "a", "b"] {
            certs.fetch(&id(sa)).await.unwrap();
        }
        let listed: Vec<_> = certs
            .certificates()
            .iter()
            .map(|c| c.identity.clone())
            .collect();
        assert_eq!(listed, vec![id("a"), id("b"), id("c")]);
        let b = certs.fetch(&id("b")).await.unwrap();
        certs.forget(&id("b"));
        assert_eq!(certs.certificates().len(), 2);
        assert!(!Arc::ptr_eq(&b, &certs.fetch(&id("b")).await.unwrap()));
    }

    #[tokio::test]
    async fn concurrent_first_fetches_share_one_leaf() {
        let (certs, metrics) = manager(DAY);
        let fetches = (0..8).map(|_| {
            let certs = certs.clone();
            tokio::spawn(async move { certs.fetch(&id("a")).await.unwrap() })
        });
        let leaves = futures::future::join_all(fetches).await;
        let leaves: Vec<_> = leaves.into_iter().map(Result::unwrap).collect();
        assert!(leaves.iter().all(|l| Arc::ptr_eq(l, &leaves[0])));
        assert_eq!(metrics.fetched.get(), 1);
    }

    #[tokio::test]
    async fn failures_are_counted_by_reason() {
        let (certs, metrics) = manager(DAY);
        let bad = Identity::new("cluster.local", "a/b", "c");
        assert!(certs.fetch(&bad).await.is_err());
        let failures = metrics
            .failures
            .get_or_create(&ErrorLabels { reason: "local_ca" })
            .get();
        assert_eq!(failures, 1);
    }
}
