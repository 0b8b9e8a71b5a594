//! On-demand lookups (`XDS_ON_DEMAND`): a proxy that misses an address asks the
//! discovery source for it and waits, as Istio's ztunnel does. The source (xDS)
//! answers through [`Lookups`]; see `discovery::xds::demand`.

use std::net::IpAddr;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

/// How long a connection waits for istiod to answer a lookup before it goes on
/// without (as for an address nobody knows). Covers a reconnect or two.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
/// Lookups queued for the stream; beyond this a lookup does not wait.
const QUEUE: usize = 1024;

/// Told when a lookup's answer is in the state.
pub type Waiter = oneshot::Sender<()>;

/// What the proxies hold to ask for an address.
#[derive(Clone, Debug)]
pub struct Demand {
    network: String,
    lookups: mpsc::Sender<(String, Waiter)>,
}

impl Demand {
    pub fn new(network: String) -> (Demand, Lookups) {
        let (lookups, rx) = mpsc::channel(QUEUE);
        (Demand { network, lookups }, Lookups { rx })
    }

    /// Istio's on-demand key for an address on this ztunnel's network.
    pub fn key(&self, ip: IpAddr) -> String {
        format!("{}/{ip}", self.network)
    }

    /// Asks istiod for `key` and waits until its answer has been applied, or
    /// [`LOOKUP_TIMEOUT`].
    pub async fn fetch(&self, key: String) {
        let (waiter, answered) = oneshot::channel();
        if self.lookups.try_send((key.clone(), waiter)).is_err() {
            tracing::debug!(%key, "on-demand lookup not sent: the queue is full or the client stopped");
            return;
        }
        if tokio::time::timeout(LOOKUP_TIMEOUT, answered)
            .await
            .is_err()
        {
            tracing::debug!(%key, "on-demand lookup not answered in time");
        }
    }
}

/// The source's side: the lookups to send.
#[derive(Debug)]
pub struct Lookups {
    rx: mpsc::Receiver<(String, Waiter)>,
}

impl Lookups {
    pub async fn next(&mut self) -> Option<(String, Waiter)> {
        self.rx.recv().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_network_slash_ip() {
        let (demand, _) = Demand::new(String::new());
        assert_eq!(demand.key("10.0.0.1".parse().unwrap()), "/10.0.0.1");
        let (demand, _) = Demand::new("net-1".into());
        assert_eq!(demand.key("fd00::1".parse().unwrap()), "net-1/fd00::1");
    }
}
