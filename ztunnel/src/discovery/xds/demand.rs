//! On-demand Address lookups (`XDS_ON_DEMAND`) on the stream, as Istio's ztunnel
//! does them.
//!
//! The Address subscription starts empty (`*` subscribed and unsubscribed); a lookup
//! that misses subscribes its key (`network/IP`) and waits for istiod's answer: the
//! resource it names (with the key among its aliases), or the key as removed when
//! nothing has it. istiod then follows what it answered with, so later changes come
//! as pushes. A key answered as unknown is not followed, so asking again later asks
//! istiod again.

use std::collections::HashMap;

use shared_types::istio::xds::DeltaDiscoveryResponse;

use crate::state::demand::Waiter;

/// Keys asked for and not answered yet.
#[derive(Debug, Default)]
pub struct Pending {
    waiting: HashMap<String, Vec<Waiter>>,
}

impl Pending {
    /// Registers a waiter; true if `key` is new and must be sent to istiod.
    pub fn add(&mut self, key: String, waiter: Waiter) -> bool {
        let waiters = self.waiting.entry(key).or_default();
        waiters.push(waiter);
        waiters.len() == 1
    }

    /// Every key still waiting: sent again on a new stream.
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.waiting.keys()
    }

    /// The keys an Address response answers: each resource's name and aliases, and
    /// each removed name. Read before the response is applied.
    pub fn answered_by(response: &DeltaDiscoveryResponse) -> Vec<String> {
        response
            .resources
            .iter()
            .flat_map(|r| std::iter::once(&r.name).chain(&r.aliases))
            .chain(&response.removed_resources)
            .cloned()
            .collect()
    }

    /// Wakes whoever waits for `keys` (their answer is in the state now).
    pub fn answer(&mut self, keys: &[String]) {
        for key in keys {
            for waiter in self.waiting.remove(key).into_iter().flatten() {
                let _ = waiter.send(());
            }
        }
        // Waiters that gave up (timed out) are dropped with their keys' next answer.
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared_types::istio::xds::resource;
    use tokio::sync::oneshot;

    #[test]
    fn a_response_answers_names_aliases_and_removals() {
        let mut r = resource("Kubernetes//Pod/a/p", "1", Default::default());
        r.aliases = vec!["/10.0.0.1".into()];
        let response = DeltaDiscoveryResponse {
            resources: vec![r],
            removed_resources: vec!["/10.9.9.9".into()],
            ..Default::default()
        };
        let mut pending = Pending::default();
        let (a, mut a_rx) = oneshot::channel();
        let (b, mut b_rx) = oneshot::channel();
        let (c, mut c_rx) = oneshot::channel();
        let (d, mut d_rx) = oneshot::channel();
        assert!(pending.add("/10.0.0.1".into(), a));
        assert!(!pending.add("/10.0.0.1".into(), b), "asked once");
        assert!(pending.add("/10.9.9.9".into(), c));
        assert!(pending.add("/10.0.0.2".into(), d));
        pending.answer(&Pending::answered_by(&response));
        assert!(a_rx.try_recv().is_ok() && b_rx.try_recv().is_ok());
        assert!(c_rx.try_recv().is_ok());
        assert!(d_rx.try_recv().is_err(), "not answered");
        assert_eq!(pending.keys().collect::<Vec<_>>(), vec!["/10.0.0.2"]);
    }
}
