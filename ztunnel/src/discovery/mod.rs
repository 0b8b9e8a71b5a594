//! Discovery: where workloads, services and policies come from.
//!
//! Every source builds a complete [`crate::state::ProxyState`] and hands it to the
//! [`crate::state::StateStore`] under its own name, so sources never see each other's
//! data. `local` reads Istio's `LOCAL_XDS_PATH` file; `xds` is a delta xDS client of
//! istiod (`XDS_ADDRESS`).

pub mod local;
mod local_fields;
pub mod xds;

use tokio::sync::watch;

pub use local::{parse_local_config, watch_file, watch_local_file, DiscoveryError, WatchedFile};

/// Handle on a source that fills the store in the background: whether its first
/// complete state has been published.
#[derive(Clone)]
pub struct FirstSync {
    synced: watch::Receiver<bool>,
}

impl FirstSync {
    pub fn new(synced: watch::Receiver<bool>) -> Self {
        FirstSync { synced }
    }

    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Waits for the first complete state; false if the source stopped before it.
    pub async fn wait_synced(&self) -> bool {
        let mut rx = self.synced.clone();
        let synced = rx.wait_for(|s| *s).await.is_ok();
        synced
    }
}
