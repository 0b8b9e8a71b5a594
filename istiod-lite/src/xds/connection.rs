//! One delta ADS stream: its subscriptions, what the client holds of each type (name
//! -> version, from `initial_resource_versions` and from what was sent), and the
//! pushes that bring it up to date.
//!
//! A push sends only resources whose version differs from what the client holds, and
//! removals for names it holds that are gone. Sent versions count as held at once: a
//! NACKed resource is not resent until it changes (the NACK is logged and counted),
//! so a client that refuses something is never pushed the same thing in a loop.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use shared_types::istio::xds::{resource, DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::{Status, Streaming};

use super::metrics::XdsMetrics;
use super::status::Registration;
use super::store::{parse_version, CatchUp, Changes, Entry, ResourceStore, Versions, View};
use super::TYPES;

/// The client went away: the stream is over.
struct Gone;

type Responses = mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>;

/// What the stream wants of one type.
#[derive(Debug, Default)]
struct Subscription {
    wildcard: bool,
    /// Names followed (on demand): asked for, or resolved from a key asked for.
    names: BTreeSet<Arc<str>>,
    /// What the client holds. Once a wildcard stream is up to date this is a clone of
    /// the store's versions, so it costs nothing of its own.
    held: Versions,
}

impl Subscription {
    fn wants(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
    }
}

/// Which names a diff looks at.
enum Scope {
    /// Every resource, and every held name.
    Everything,
    /// Names that changed in the store since the stream's last push.
    Changed(Vec<Arc<str>>),
    /// Names (or on-demand keys) the client just asked for: each is answered, an
    /// unknown one as removed (the xDS spec's "does not exist").
    Requested(Vec<Arc<str>>),
}

/// One response being built.
#[derive(Default)]
struct Diff {
    resources: Vec<Resource>,
    removed: Vec<String>,
}

impl Diff {
    fn is_empty(&self) -> bool {
        self.resources.is_empty() && self.removed.is_empty()
    }

    /// Sends `entry` unless the client holds this version. Sent counts as held.
    fn send(&mut self, sub: &mut Subscription, entry: &Entry) {
        if sub.held.get(&entry.name) == Some(&entry.digest) {
            return;
        }
        sub.held.insert(entry.name.clone(), entry.digest);
        let mut r = resource(&*entry.name, entry.version(), entry.body.clone());
        if !sub.wildcard {
            // An on-demand client learns which of its keys this answers.
            r.aliases = entry.aliases.clone();
        }
        self.resources.push(r);
    }

    /// Sends `entry` and, to an on-demand client, what it needs with it (a Service's
    /// endpoints), which the stream then follows too.
    fn follow(&mut self, sub: &mut Subscription, view: &View, entry: &Entry) {
        self.send(sub, entry);
        if sub.wildcard {
            return;
        }
        sub.names.insert(entry.name.clone());
        for name in &entry.related {
            if sub.names.insert(name.clone()) {
                if let Some(related) = view.get(name) {
                    self.send(sub, related);
                }
            }
        }
    }

    fn remove(&mut self, sub: &mut Subscription, name: &str, even_if_not_held: bool) {
        if sub.held.remove(name).is_some() || even_if_not_held {
            self.removed.push(name.to_owned());
        }
    }

    fn build(sub: &mut Subscription, view: &View, scope: Scope) -> Diff {
        let mut diff = Diff::default();
        // After a full comparison or a catch-up, a wildcard stream holds the view.
        let holds_view = sub.wildcard && !matches!(scope, Scope::Requested(_));
        match scope {
            Scope::Everything if sub.wildcard => {
                for entry in view.entries.values() {
                    diff.send(sub, entry);
                }
                let gone: Vec<Arc<str>> = sub
                    .held
                    .keys()
                    .filter(|name| !view.versions.contains_key(*name))
                    .cloned()
                    .collect();
                for name in gone {
                    diff.remove(sub, &name, false);
                }
            }
            Scope::Everything => {
                let names: Vec<Arc<str>> = sub.names.iter().cloned().collect();
                diff.answer(sub, view, names);
                // What the client said it held and does not follow is forgotten.
                let followed = &sub.names;
                sub.held.retain(|name, _| followed.contains(name));
            }
            Scope::Changed(names) => {
                for name in names {
                    if !sub.wants(&name) {
                        continue;
                    }
                    match view.get(&name) {
                        Some(entry) => diff.follow(sub, view, entry),
                        None => diff.remove(sub, &name, false),
                    }
                }
            }
            Scope::Requested(names) => diff.answer(sub, view, names),
        }
        if holds_view {
            sub.held = view.versions.clone();
        }
        diff
    }

    fn answer(&mut self, sub: &mut Subscription, view: &View, names: Vec<Arc<str>>) {
        for name in names {
            // Not a name: an on-demand key (`network/IP`) is answered with the
            // resource it names, which the stream then follows.
            match view.get(&name).or_else(|| view.resolve(&name)) {
                Some(entry) => self.follow(sub, view, entry),
                None => {
                    // Not followed: asking again later asks again.
                    sub.names.remove(&name);
                    self.remove(sub, &name, true);
                }
            }
        }
    }
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
            } else {
                let name: Arc<str> = name.into();
                if sub.names.insert(name.clone()) {
                    added.push(name);
                }
            }
        }
        for name in request.resource_names_unsubscribe {
            if name == "*" {
                sub.wildcard = false;
            } else {
                sub.names.remove(&*name);
            }
        }
        if !first {
            // The client forgets what it unsubscribed from.
            let (wildcard, names) = (sub.wildcard, &sub.names);
            sub.held.retain(|held, _| wildcard || names.contains(held));
        }
        let scope = if first {
            Scope::Everything
        } else {
            Scope::Requested(added)
        };
        let view = self.store.view(type_url);
        // The first request of a type is always answered, even with nothing: it is
        // what tells the client it is in sync.
        self.push(type_url, &view, scope, first, None, responses)
            .await
    }

    /// Brings every subscribed type up to date with the store.
    async fn push_changes(&mut self, responses: &Responses) -> Result<(), Gone> {
        let since = self.seen;
        let CatchUp {
            changes,
            generation,
            views,
        } = self.store.catch_up(since);
        self.seen = generation;
        let changed_at = self.store.published_at(since + 1);
        let types: Vec<&'static str> = self.subscriptions.keys().copied().collect();
        for type_url in types {
            let scope = match &changes {
                Changes::Everything => Scope::Everything,
                Changes::Names(names) => match names.get(type_url) {
                    Some(names) => Scope::Changed(names.iter().cloned().collect()),
                    None => continue,
                },
            };
            let view = views.get(type_url).cloned().unwrap_or_default();
            self.push(type_url, &view, scope, false, changed_at, responses)
                .await?;
        }
        Ok(())
    }

    async fn push(
        &mut self,
        type_url: &'static str,
        view: &View,
        scope: Scope,
        even_if_empty: bool,
        changed_at: Option<std::time::Instant>,
        responses: &Responses,
    ) -> Result<(), Gone> {
        let Some(sub) = self.subscriptions.get_mut(type_url) else {
            return Ok(());
        };
        let diff = Diff::build(sub, view, scope);
        if diff.is_empty() && !even_if_empty {
            return Ok(());
        }
        self.nonces += 1;
        let nonce = format!("{:x}", self.nonces);
        let generation = self.seen;
        let (sent, gone) = (diff.resources.len(), diff.removed.len());
        let response = DeltaDiscoveryResponse {
            system_version_info: generation.to_string(),
            type_url: type_url.to_owned(),
            resources: diff.resources,
            removed_resources: diff.removed,
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
