//! One async lock per pod key (the CNI path and the queue's workers must not work on
//! the same pod at once). An entry lives only while someone holds or waits for its
//! lock: the last guard to go removes it, so pod churn does not grow the map. (A
//! [`PodLocks::lock`] future dropped while waiting, which only happens at shutdown, may
//! leave its entry until the key is locked and released again.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::OwnedMutexGuard;

type Map = HashMap<String, Arc<tokio::sync::Mutex<()>>>;

#[derive(Clone, Default)]
pub struct PodLocks {
    map: Arc<Mutex<Map>>,
}

fn lock(m: &Mutex<Map>) -> MutexGuard<'_, Map> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Holds one pod's lock; dropping it releases the lock and, if nobody else holds or
/// waits for it, removes the entry.
pub struct PodLockGuard {
    key: String,
    map: Arc<Mutex<Map>>,
    guard: Option<OwnedMutexGuard<()>>,
}

impl PodLocks {
    pub fn new() -> Self {
        Self::default()
    }

    /// Waits for `key`'s lock.
    pub async fn lock(&self, key: &str) -> PodLockGuard {
        // The clone taken here (under the map lock) is what keeps the entry alive
        // while we wait: a guard dropped meanwhile sees it and leaves the entry.
        let mutex = lock(&self.map).entry(key.to_string()).or_default().clone();
        PodLockGuard {
            key: key.to_string(),
            map: self.map.clone(),
            guard: Some(mutex.lock_owned().await),
        }
    }

    /// Entries in the map (held or awaited locks).
    pub fn len(&self) -> usize {
        lock(&self.map).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for PodLockGuard {
    fn drop(&mut self) {
        // Release first, so our own reference no longer counts.
        drop(self.guard.take());
        let mut map = lock(&self.map);
        // Only the map's reference left: nobody holds or waits. Checked under the map
        // lock, so nobody can take a new reference meanwhile.
        if map
            .get(&self.key)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            map.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn entries_go_with_the_last_guard() {
        let locks = PodLocks::new();
        for i in 0..50 {
            let guard = locks.lock(&format!("ns/pod-{i}")).await;
            assert_eq!(locks.len(), 1);
            drop(guard);
        }
        assert!(locks.is_empty());
    }

    #[tokio::test]
    async fn a_waiter_keeps_the_entry_and_the_lock_serializes() {
        let locks = PodLocks::new();
        let first = locks.lock("ns/a").await;
        let waiter = tokio::spawn({
            let locks = locks.clone();
            async move {
                let _g = locks.lock("ns/a").await;
                "got it"
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "the second locker must wait");
        drop(first);
        // The waiter held a reference: the entry stayed for it, then went with it.
        assert_eq!(waiter.await.unwrap(), "got it");
        assert!(locks.is_empty());
    }
}
