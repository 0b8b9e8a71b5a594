//! One delta ADS stream: its subscriptions, what the client holds of each type (name
//! -> version, from `initial_resource_versions` and from what was sent), and the
//! pushes that bring it up to date.
//!
//! A push sends only resources whose version differs from what the client holds, and
//! removals for names it holds that are gone. Sent versions count as held at once: a
//! NACKed resource is not resent until it changes (the NACK is logged and counted),
//! so a client that refuses something is never pushed the same thing in a loop.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use shared_types::istio::xds::{resource, DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::{Status, Streaming};

use super::metrics::XdsMetrics;
use super::status::Registration;
use super::store::{parse_version, Changes, Entry, ResourceStore};
use super::TYPES;

/// The client went away: the stream is over.
struct Gone;

type Responses = mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>;

/// What the stream wants of one type.
#[derive(Debug, Default)]
struct Subscription {
    wildcard: bool,
    names: BTreeSet<String>,
    /// What the client holds: name -> version (digest).
    held: HashMap<Arc<str>, u64>,
}

impl Subscription {
    fn wants(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
    }
}

/// Which names a diff looks at.
enum Scope {
    Everything,
    Names(Vec<Arc<str>>),
}

pub struct Connection {
    store: ResourceStore,
    debounce: Duration,
    registration: Registration,
    metrics: Arc<XdsMetrics>,
    subscriptions: BTreeMap<&'static str, Subscription>,
    /// The store generation this stream is up to date with.
    seen: u64,
    nonces: u64,
}

impl Connection {
    pub fn new(
        store: ResourceStore,
        debounce: Duration,
        registration: Registration,
        metrics: Arc<XdsMetrics>,
    ) -> Self {
        Connection {
            store,
            debounce,
            registration,
            metrics,
            subscriptions: BTreeMap::new(),
            seen: 0,
            nonces: 0,
        }
    }

    pub async fn serve(
        mut self,
        first: DeltaDiscoveryRequest,
        mut requests: Streaming<DeltaDiscoveryRequest>,
        responses: Responses,
    ) {
        self.metrics.connected.inc();
        let mut changes = self.store.subscribe();
        self.seen = *changes.borrow_and_update();
        let node = self.registration.update(|s| s.node_id.clone());
        let mut push_at: Option<Instant> = None;
        let mut result = self.handle(first, &responses).await;
        while result.is_ok() {
            let debounced = async {
                match push_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            result = tokio::select! {
                request = requests.message() => match request {
                    Ok(Some(request)) => self.handle(request, &responses).await,
                    Ok(None) => Err(Gone),
                    Err(status) => {
                        tracing::debug!(%node, error = %status, "xDS stream broke");
                        Err(Gone)
                    }
                },
                changed = changes.changed(), if push_at.is_none() => match changed {
                    Ok(()) => {
                        push_at = Some(Instant::now() + self.debounce);
                        Ok(())
                    }
                    Err(_) => Err(Gone),
                },
                () = debounced => {
                    push_at = None;
                    changes.borrow_and_update();
                    self.push_changes(&responses).await
                }
            };
        }
        self.metrics.connected.dec();
        tracing::info!(%node, "xDS stream closed");
    }

    async fn handle(
        &mut self,
        request: DeltaDiscoveryRequest,
        responses: &Responses,
    ) -> Result<(), Gone> {
        let Some(type_url) = TYPES.into_iter().find(|t| *t == request.type_url) else {
            tracing::debug!(type_url = %request.type_url, "request for a type not served; ignored");
            return Ok(());
        };
        if !request.response_nonce.is_empty() {
            let nack = request.error_detail.map(|status| status.message);
            if let Some(reason) = &nack {
                tracing::warn!(node = %self.registration.update(|s| s.node_id.clone()), type_url, nonce = %request.response_nonce, "NACK: {reason}");
                self.metrics
                    .rejects
                    .get_or_create(&XdsMetrics::type_label(type_url))
                    .inc();
            }
            self.registration
                .answered(type_url, &request.response_nonce, nack);
            if request.resource_names_subscribe.is_empty()
                && request.resource_names_unsubscribe.is_empty()
            {
                return Ok(());
            }
        }

        let first = !self.subscriptions.contains_key(type_url);
        let sub = self.subscriptions.entry(type_url).or_default();
        if first {
            // An empty first subscription is a wildcard one.
            sub.wildcard = request.resource_names_subscribe.is_empty();
            sub.held = request
                .initial_resource_versions
                .into_iter()
                // Not one of our versions: it differs from every one, so it is resent.
                .map(|(name, v)| (name.into(), parse_version(&v).unwrap_or(u64::MAX)))
                .collect();
        }
        let mut added = Vec::new();
        for name in request.resource_names_subscribe {
            if name == "*" {
                sub.wildcard = true;
            } else if sub.names.insert(name.clone()) {
                added.push(name.into());
            }
        }
        for name in request.resource_names_unsubscribe {
            if name == "*" {
                sub.wildcard = false;
            } else {
                sub.names.remove(&name);
            }
        }
        // The client forgets what it unsubscribed from.
        sub.held
            .retain(|held, _| sub.wildcard || sub.names.contains(&**held));
        let scope = if first {
            Scope::Everything
        } else {
            Scope::Names(added)
        };
        // The first request of a type is always answered, even with nothing: it is
        // what tells the client it is in sync.
        self.push(type_url, scope, first, None, responses).await
    }

    /// Brings every subscribed type up to date with the store.
    async fn push_changes(&mut self, responses: &Responses) -> Result<(), Gone> {
        let since = self.seen;
        let (changes, generation) = self.store.changes_since(since);
        self.seen = generation;
        let changed_at = self.store.published_at(since + 1);
        let types: Vec<&'static str> = self.subscriptions.keys().copied().collect();
        for type_url in types {
            let scope = match &changes {
                Changes::Everything => Scope::Everything,
                Changes::Names(names) => match names.get(type_url) {
                    Some(names) => Scope::Names(names.iter().cloned().collect()),
                    None => continue,
                },
            };
            self.push(type_url, scope, false, changed_at, responses)
                .await?;
        }
        Ok(())
    }

    async fn push(
        &mut self,
        type_url: &'static str,
        scope: Scope,
        even_if_empty: bool,
        changed_at: Option<std::time::Instant>,
        responses: &Responses,
    ) -> Result<(), Gone> {
        let Some(sub) = self.subscriptions.get_mut(type_url) else {
            return Ok(());
        };
        let mut resources = Vec::new();
        let mut removed = Vec::new();
        let mut consider = |name: &Arc<str>, entry: Option<&Arc<Entry>>, sub: &mut Subscription| {
            if !sub.wants(name) {
                return;
            }
            match entry {
                Some(entry) if sub.held.get(name) != Some(&entry.digest) => {
                    sub.held.insert(entry.name.clone(), entry.digest);
                    let mut r = resource(&**name, entry.version(), entry.body.clone());
                    if !sub.wildcard {
                        // An on-demand client learns which of its keys this answers.
                        r.aliases = entry.aliases.clone();
                    }
                    resources.push(r);
                }
                Some(_) => {}
                None => {
                    if sub.held.remove(name).is_some() {
                        removed.push(name.to_string());
                    }
                }
            }
        };
        match scope {
            Scope::Everything => {
                let current = self.store.all(type_url);
                let gone: Vec<Arc<str>> = sub
                    .held
                    .keys()
                    .filter(|name| !current.contains_key(*name))
                    .cloned()
                    .collect();
                for (name, entry) in &current {
                    consider(name, Some(entry), sub);
                }
                for name in &gone {
                    consider(name, None, sub);
                }
            }
            Scope::Names(names) => {
                for name in &names {
                    match self.store.get(type_url, name) {
                        Some(entry) => consider(name, Some(&entry), sub),
                        // Not a name: an on-demand key (`network/IP`) is answered with
                        // the resource it names, which the stream then follows.
                        None => match self.store.resolve(type_url, name) {
                            Some(entry) => {
                                sub.names.insert(entry.name.to_string());
                                consider(&entry.name, Some(&entry), sub);
                            }
                            None => consider(name, None, sub),
                        },
                    }
                }
            }
        }
        if resources.is_empty() && removed.is_empty() && !even_if_empty {
            return Ok(());
        }
        self.nonces += 1;
        let nonce = format!("{:x}", self.nonces);
        let generation = self.seen;
        let (sent, gone) = (resources.len(), removed.len());
        let response = DeltaDiscoveryResponse {
            system_version_info: generation.to_string(),
            type_url: type_url.to_owned(),
            resources,
            removed_resources: removed,
            nonce: nonce.clone(),
            ..Default::default()
        };
        self.registration.sent(type_url, &nonce, generation);
        responses.send(Ok(response)).await.map_err(|_| Gone)?;
        let labels = XdsMetrics::type_label(type_url);
        self.metrics.pushes.get_or_create(&labels).inc();
        if let Some(at) = changed_at {
            self.metrics
                .push_time
                .get_or_create(&labels)
                .observe(at.elapsed().as_secs_f64());
        }
        tracing::debug!(type_url, %nonce, sent, removed = gone, "xDS push");
        Ok(())
    }
}
