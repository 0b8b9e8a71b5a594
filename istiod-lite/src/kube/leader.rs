//! Leader election over a `coordination.k8s.io/v1` Lease, for the work only one
//! replica may do (publishing the root ConfigMap in every namespace).
//!
//! The algorithm is client-go's: read the Lease; take it when it is free or its holder
//! stopped renewing it for a whole lease duration, renew it while holding it, and
//! write only with the resourceVersion read, so of two replicas racing for it the API
//! server lets exactly one win (409 Conflict for the other). Expiry is judged by when
//! this replica last saw the Lease change, not by the holder's clock. A replica that
//! shuts down releases the Lease so another takes over at once.
//!
//! kube-lease-manager (the kube 5 crate) settles races through server-side-apply
//! field ownership, which the local API server our tests run against does not model,
//! and kube-leader-election still targets kube 4: hence these few lines.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Istio's name for the Lease of istiod's namespace controller (the root ConfigMaps).
pub const NAMESPACE_CONTROLLER_LEASE: &str = "istio-namespace-controller-election";

#[derive(Clone, Debug)]
pub struct Settings {
    pub namespace: String,
    pub lease_name: String,
    /// Unique per replica: the pod name and a per-process suffix.
    pub identity: String,
    /// How long a holder that stopped renewing keeps the Lease.
    pub lease_duration: Duration,
}

impl Settings {
    /// How often the holder renews and the others look: client-go's 2 s for its
    /// default 15 s lease, in proportion.
    fn retry_period(&self) -> Duration {
        (self.lease_duration * 2 / 15).max(Duration::from_millis(50))
    }
}

/// Runs `work` while this replica leads, and stops it as soon as it does not: two
/// replicas never fight over the objects it writes.
pub async fn while_leading<F, Fut>(
    mut leading: watch::Receiver<bool>,
    shutdown: CancellationToken,
    mut work: F,
) where
    F: FnMut(CancellationToken) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    loop {
        if leading.wait_for(|l| *l).await.is_err() {
            return;
        }
        let stop = shutdown.child_token();
        tokio::select! {
            () = work(stop.clone()) => return,
            _ = leading.wait_for(|l| !*l) => stop.cancel(),
        }
    }
}

/// A unique identity for this process: `<pod>_<nanoseconds since the epoch, hex>`.
pub fn identity(pod_name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{pod_name}_{nanos:x}")
}

/// Runs the election until `shutdown`; the receiver is true while this replica leads.
pub fn start(
    client: Client,
    settings: Settings,
    shutdown: CancellationToken,
) -> watch::Receiver<bool> {
    let (leading, rx) = watch::channel(false);
    tokio::spawn(run(
        Api::namespaced(client, &settings.namespace),
        settings,
        leading,
        shutdown,
    ));
    rx
}

/// What this replica last saw of the Lease, and when it saw it change.
struct Observed {
    holder: String,
    renew_time: Option<MicroTime>,
    at: Instant,
}

async fn run(
    api: Api<Lease>,
    settings: Settings,
    leading: watch::Sender<bool>,
    shutdown: CancellationToken,
) {
    let mut observed: Option<Observed> = None;
    // When the holder last renewed successfully: it steps down if it cannot renew
    // for a lease duration (others may have taken the Lease by then).
    let mut renewed_at = Instant::now();
    loop {
        let result = try_acquire_or_renew(&api, &settings, &mut observed).await;
        let now_leading = match result {
            Ok(leads) => {
                if leads {
                    renewed_at = Instant::now();
                }
                leads
            }
            Err(e) => {
                warn!(lease = %settings.lease_name, error = %e, "cannot read or write the leader Lease");
                *leading.borrow() && renewed_at.elapsed() < settings.lease_duration
            }
        };
        if leading.send_replace(now_leading) != now_leading {
            if now_leading {
                info!(lease = %settings.lease_name, identity = %settings.identity, "became the leader");
            } else {
                info!(lease = %settings.lease_name, identity = %settings.identity, "lost the leadership");
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(settings.retry_period()) => {}
        }
    }
    if *leading.borrow() {
        leading.send_replace(false);
        release(&api, &settings).await;
    }
}

/// One round of client-go's `tryAcquireOrRenew`: true if this replica holds the Lease.
async fn try_acquire_or_renew(
    api: &Api<Lease>,
    settings: &Settings,
    observed: &mut Option<Observed>,
) -> Result<bool, kube::Error> {
    let now = MicroTime(Timestamp::now());
    let Some(mut lease) = api.get_opt(&settings.lease_name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(settings.lease_name.clone()),
                namespace: Some(settings.namespace.clone()),
                ..Default::default()
            },
            spec: Some(held_by(settings, now.clone(), now, 0)),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            // Another replica created it first.
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let changed = observed
        .as_ref()
        .is_none_or(|o| o.holder != holder || o.renew_time != spec.renew_time);
    if changed {
        *observed = Some(Observed {
            holder: holder.clone(),
            renew_time: spec.renew_time.clone(),
            at: Instant::now(),
        });
    }
    let ours = holder == settings.identity;
    let expired = observed
        .as_ref()
        .is_some_and(|o| o.at.elapsed() >= settings.lease_duration);
    if !ours && !holder.is_empty() && !expired {
        return Ok(false);
    }
    let (acquired, transitions) = if ours {
        (
            spec.acquire_time.clone().unwrap_or(now.clone()),
            spec.lease_transitions.unwrap_or(0),
        )
    } else {
        debug!(lease = %settings.lease_name, previous = %holder, "taking over the Lease");
        (now.clone(), spec.lease_transitions.unwrap_or(0) + 1)
    };
    lease.spec = Some(held_by(settings, acquired, now, transitions));
    // The resourceVersion read above: a concurrent write makes this one fail.
    match api
        .replace(&settings.lease_name, &PostParams::default(), &lease)
        .await
    {
        Ok(written) => {
            *observed = Some(Observed {
                holder: settings.identity.clone(),
                renew_time: written.spec.and_then(|s| s.renew_time),
                at: Instant::now(),
            });
            Ok(true)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

fn held_by(
    settings: &Settings,
    acquired: MicroTime,
    renewed: MicroTime,
    transitions: i32,
) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(settings.identity.clone()),
        lease_duration_seconds: Some(
            i32::try_from(settings.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX),
        ),
        acquire_time: Some(acquired),
        renew_time: Some(renewed),
        lease_transitions: Some(transitions),
        ..Default::default()
    }
}

/// Gives the Lease up (client-go's ReleaseOnCancel): another replica takes it at once.
async fn release(api: &Api<Lease>, settings: &Settings) {
    let Ok(Some(mut lease)) = api.get_opt(&settings.lease_name).await else {
        return;
    };
    let Some(spec) = lease.spec.as_mut() else {
        return;
    };
    if spec.holder_identity.as_deref() != Some(&settings.identity) {
        return;
    }
    spec.holder_identity = None;
    spec.renew_time = None;
    spec.acquire_time = None;
    match api
        .replace(&settings.lease_name, &PostParams::default(), &lease)
        .await
    {
        Ok(_) => info!(lease = %settings.lease_name, "released the leader Lease"),
        Err(e) => {
            warn!(lease = %settings.lease_name, error = %e, "cannot release the leader Lease")
        }
    }
}
