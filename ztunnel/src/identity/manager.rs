//! Per-identity certificate cache.
//!
//! Every HBONE handshake needs the local workload's leaf; minting one per
//! connection would be wasteful, so leaves are cached per identity and re-minted
//! lazily on the first fetch past half-life (Istio renews at the same point).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use rustls::pki_types::CertificateDer;

use super::{CaError, CertificateAuthority, Identity, WorkloadCertificate};

/// Where "now" comes from; injectable so tests can jump past half-life instantly.
pub type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// Caches one leaf per identity, re-minting on fetch once past half-life.
/// Cheap to clone (Arc inside). Thread-safe.
#[derive(Clone)]
pub struct SecretManager {
    inner: Arc<Inner>,
}

struct Inner {
    ca: Arc<CertificateAuthority>,
    lifetime: Duration,
    clock: Clock,
    certs: Mutex<HashMap<Identity, Arc<WorkloadCertificate>>>,
}

impl SecretManager {
    /// `lifetime` is the leaf validity; the app uses 24h.
    pub fn new(ca: Arc<CertificateAuthority>, lifetime: Duration) -> Self {
        Self::with_clock(ca, lifetime, Arc::new(SystemTime::now))
    }

    pub fn with_clock(ca: Arc<CertificateAuthority>, lifetime: Duration, clock: Clock) -> Self {
        SecretManager {
            inner: Arc::new(Inner {
                ca,
                lifetime,
                clock,
                certs: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The cached leaf for `id`, minted on first use or once past its refresh time.
    ///
    /// Minting happens under the lock so a burst of connections for a new identity
    /// mints one leaf, not one each; an ECDSA leaf takes well under a millisecond.
    /// If re-minting fails, the old leaf is kept and returned while still valid.
    pub fn fetch(&self, id: &Identity) -> Result<Arc<WorkloadCertificate>, CaError> {
        let now = (self.inner.clock)();
        let mut certs = self.lock();
        let cached = certs.get(id).cloned();
        if let Some(cert) = &cached {
            if now < cert.refresh_at() {
                return Ok(cert.clone());
            }
        }
        match self.inner.ca.issue_at(id, self.inner.lifetime, now) {
            Ok(cert) => {
                let cert = Arc::new(cert);
                certs.insert(id.clone(), cert.clone());
                tracing::debug!(identity = %id, serial = %cert.serial, "issued workload certificate");
                Ok(cert)
            }
            Err(e) => match cached {
                Some(cert) if now < cert.not_after => {
                    tracing::warn!(identity = %id, error = %e, "certificate renewal failed; keeping the current one");
                    Ok(cert)
                }
                _ => Err(e),
            },
        }
    }

    /// All cached leaves, sorted by identity (for `/config_dump`).
    pub fn certificates(&self) -> Vec<Arc<WorkloadCertificate>> {
        let mut certs: Vec<_> = self.lock().values().cloned().collect();
        certs.sort_by(|a, b| a.identity.cmp(&b.identity));
        certs
    }

    /// Drops the cached leaf, e.g. when the last workload with `id` leaves the node.
    pub fn forget(&self, id: &Identity) {
        self.lock().remove(id);
    }

    pub fn roots(&self) -> Vec<CertificateDer<'static>> {
        self.inner.ca.roots()
    }

    /// A poisoned lock only means another thread panicked mid-insert; the map is
    /// still consistent, so keep serving.
    fn lock(&self) -> MutexGuard<'_, HashMap<Identity, Arc<WorkloadCertificate>>> {
        self.inner
            .certs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    /// A manager whose clock the test moves by hand.
    fn manager() -> (SecretManager, Arc<Mutex<SystemTime>>) {
        let now = Arc::new(Mutex::new(SystemTime::now()));
        let clock: Clock = {
            let now = now.clone();
            Arc::new(move || *now.lock().unwrap())
        };
        let ca = CertificateAuthority::generate_self_signed("cluster.local").unwrap();
        (SecretManager::with_clock(Arc::new(ca), DAY, clock), now)
    }

    fn id(sa: &str) -> Identity {
        Identity::new("cluster.local", "default", sa)
    }

    #[test]
    fn caches_until_half_life_then_reissues() {
        let (certs, now) = manager();
        let first = certs.fetch(&id("a")).unwrap();
        assert!(Arc::ptr_eq(&first, &certs.fetch(&id("a")).unwrap()));

        *now.lock().unwrap() = first.refresh_at() - Duration::from_secs(1);
        assert!(Arc::ptr_eq(&first, &certs.fetch(&id("a")).unwrap()));

        *now.lock().unwrap() = first.refresh_at() + Duration::from_secs(1);
        let second = certs.fetch(&id("a")).unwrap();
        assert!(!Arc::ptr_eq(&first, &second));
        assert_ne!(first.serial, second.serial);
        assert!(second.not_after > first.not_after);
        assert!(Arc::ptr_eq(&second, &certs.fetch(&id("a")).unwrap()));
        assert_eq!(certs.certificates().len(), 1);
    }

    #[test]
    fn lists_sorted_and_forgets() {
        let (certs, _) = manager();
        for sa in ["c", "a", "b"] {
            certs.fetch(&id(sa)).unwrap();
        }
        let listed: Vec<_> = certs
            .certificates()
            .iter()
            .map(|c| c.identity.clone())
            .collect();
        assert_eq!(listed, vec![id("a"), id("b"), id("c")]);
        let b = certs.fetch(&id("b")).unwrap();
        certs.forget(&id("b"));
        assert_eq!(certs.certificates().len(), 2);
        assert!(!Arc::ptr_eq(&b, &certs.fetch(&id("b")).unwrap()));
        assert_eq!(certs.roots().len(), 1);
        assert_eq!(b.roots, certs.roots());
    }

    #[test]
    fn fails_once_the_ca_has_expired() {
        let (certs, now) = manager();
        certs.fetch(&id("a")).unwrap();
        *now.lock().unwrap() += Duration::from_secs(11 * 365 * 24 * 3600);
        let err = certs.fetch(&id("a")).unwrap_err();
        assert!(matches!(err, CaError::Expired { .. }), "{err}");
    }

    #[test]
    fn concurrent_fetches_share_one_leaf() {
        let (certs, _) = manager();
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let certs = certs.clone();
                std::thread::spawn(move || certs.fetch(&id("a")).unwrap())
            })
            .collect();
        let leaves: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(leaves.iter().all(|l| Arc::ptr_eq(l, &leaves[0])));
    }
}
