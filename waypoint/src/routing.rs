//! What a route rule does to a request, apart from sending it: header changes,
//! redirects and rewrites, the choice of a weighted backend, and when to retry (with
//! a budget, so a failing backend is not hammered).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue, HOST};
use http::uri::{PathAndQuery, Uri};
use mesh_model::route::{
    Backend, HeaderModifier, Match, PathMatch, PathModifier, Redirect, Retry, Rewrite,
};
use rand::Rng;

/// Istio's default retry policy, for a rule that sets none: two retries, on a
/// connection failure, a reset before the response, or a 503.
const DEFAULT_ATTEMPTS: u32 = 2;
const DEFAULT_CODES: &[u16] = &[503];
/// Envoy's base retry back-off; doubled on each retry, up to ten times the base.
const DEFAULT_BACKOFF: Duration = Duration::from_millis(25);
/// The retry budget, as Envoy's: retries in flight to one backend may be 20 % of its
/// requests in flight, and at least 3.
const BUDGET_PERCENT: usize = 20;
const BUDGET_MIN: usize = 3;

/// Applies a `RequestHeaderModifier` or `ResponseHeaderModifier`. `add` joins a value
/// to an existing header with a comma, as the spec's example shows.
pub fn modify_headers(m: &HeaderModifier, headers: &mut HeaderMap) {
    // The names and values were checked when the route compiled.
    let pair = |(name, value): &(String, String)| {
        Some((
            HeaderName::from_bytes(name.as_bytes()).ok()?,
            HeaderValue::from_str(value).ok()?,
        ))
    };
    for (name, value) in m.set.iter().filter_map(pair) {
        headers.insert(name, value);
    }
    for (name, value) in m.add.iter().filter_map(pair) {
        let joined = headers.get(&name).and_then(|old| {
            let mut v = old.as_bytes().to_vec();
            v.push(b',');
            v.extend_from_slice(value.as_bytes());
            HeaderValue::from_bytes(&v).ok()
        });
        headers.insert(name, joined.unwrap_or(value));
    }
    for name in &m.remove {
        headers.remove(name.as_str());
    }
}

/// The path after a `ReplaceFullPath` or `ReplacePrefixMatch` (`matched`: the rule's
/// match, whose prefix is the part replaced).
fn modified_path(modifier: &PathModifier, path: &str, matched: Option<&Match>) -> String {
    match modifier {
        PathModifier::Full(full) => full.clone(),
        PathModifier::Prefix(replacement) => {
            let prefix = match matched.map(|m| &m.path) {
                Some(PathMatch::Prefix(p)) => p.trim_end_matches('/'),
                _ => "",
            };
            let rest = path.get(prefix.len()..).unwrap_or("");
            if rest.is_empty() {
                replacement.clone()
            } else {
                format!("{}{rest}", replacement.trim_end_matches('/'))
            }
        }
    }
}

fn with_query(path: &str, uri: &Uri) -> String {
    match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_owned(),
    }
}

/// The request's host without its port.
fn host_of(headers: &HeaderMap, uri: &Uri) -> String {
    let host = headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| uri.authority().map(|a| a.as_str()))
        .unwrap_or_default();
    match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h.to_owned(),
        _ => host.to_owned(),
    }
}

/// The `Location` of a `RequestRedirect`. The port, as the spec derives it: the
/// filter's; else the scheme's well-known one when the filter names a scheme; else
/// the Service port the request came to. A scheme's well-known port is not written.
pub fn redirect_location(
    r: &Redirect,
    uri: &Uri,
    headers: &HeaderMap,
    matched: Option<&Match>,
    service_port: u16,
) -> String {
    let scheme = r.scheme.as_deref().unwrap_or("http");
    let host = r.hostname.clone().unwrap_or_else(|| host_of(headers, uri));
    let port = r.port.unwrap_or(match r.scheme.as_deref() {
        Some("https") => 443,
        Some(_) => 80,
        None => service_port,
    });
    let default_port = if scheme == "https" { 443 } else { 80 };
    let authority = if port == default_port {
        host
    } else {
        format!("{host}:{port}")
    };
    let path = match &r.path {
        Some(m) => modified_path(m, uri.path(), matched),
        None => uri.path().to_owned(),
    };
    format!("{scheme}://{authority}{}", with_query(&path, uri))
}

/// Applies a `URLRewrite` to the request's head.
pub fn rewrite(r: &Rewrite, parts: &mut http::request::Parts, matched: Option<&Match>) {
    if let Some(host) = &r.hostname {
        if let Ok(value) = HeaderValue::from_str(host) {
            parts.headers.insert(HOST, value);
        }
    }
    if let Some(m) = &r.path {
        let path = with_query(&modified_path(m, parts.uri.path(), matched), &parts.uri);
        let mut uri = std::mem::take(&mut parts.uri).into_parts();
        uri.path_and_query = PathAndQuery::try_from(path).ok();
        parts.uri = Uri::from_parts(uri).unwrap_or_default();
    }
}

/// A backend at random by weight; `None` when every weight is 0.
pub fn pick_backend(backends: &[Backend]) -> Option<&Backend> {
    let total: u64 = backends.iter().map(|b| u64::from(b.weight)).sum();
    if total == 0 {
        return None;
    }
    let mut at = rand::rng().random_range(0..total);
    backends.iter().find(|b| {
        let weight = u64::from(b.weight);
        if at < weight {
            true
        } else {
            at -= weight;
            false
        }
    })
}

/// Whether a request is mirrored, for a mirror of `fraction` (0 to 1).
pub fn sampled(fraction: f64) -> bool {
    fraction >= 1.0 || (fraction > 0.0 && rand::rng().random_bool(fraction))
}

/// When a request is tried again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first try.
    pub attempts: u32,
    /// Response codes retried (connection failures and resets always are).
    pub codes: Vec<u16>,
    pub backoff: Duration,
}

impl RetryPolicy {
    /// The rule's `retry`, or Istio's default (its attempts too when the rule's
    /// `retry` leaves them out).
    pub fn of(retry: Option<&Retry>) -> Self {
        match retry {
            Some(r) => RetryPolicy {
                attempts: r.attempts.unwrap_or(DEFAULT_ATTEMPTS),
                codes: r.codes.clone(),
                backoff: r.backoff.unwrap_or(DEFAULT_BACKOFF),
            },
            None => RetryPolicy {
                attempts: DEFAULT_ATTEMPTS,
                codes: DEFAULT_CODES.to_vec(),
                backoff: DEFAULT_BACKOFF,
            },
        }
    }

    /// The wait before retry `n` (1-based): the back-off doubled each time, at most
    /// ten times it, with jitter (up to the wait itself) so retries do not align.
    pub fn wait(&self, n: u32) -> Duration {
        let base = self.backoff.saturating_mul(1 << n.saturating_sub(1).min(4));
        let capped = base.min(self.backoff.saturating_mul(10));
        if capped.is_zero() {
            return capped;
        }
        let millis = capped.as_millis().min(u128::from(u64::MAX)) as u64;
        Duration::from_millis(millis / 2 + rand::rng().random_range(0..=millis / 2))
    }
}

/// Requests and retries in flight, per backend Service.
#[derive(Clone, Default)]
pub struct RetryBudget {
    inflight: Arc<Mutex<HashMap<String, InFlight>>>,
}

#[derive(Default)]
struct InFlight {
    requests: usize,
    retries: usize,
}

impl RetryBudget {
    fn with<T>(&self, backend: &str, f: impl FnOnce(&mut InFlight) -> T) -> T {
        let mut map = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        let entry = map.entry(backend.to_owned()).or_default();
        let out = f(entry);
        if entry.requests == 0 && entry.retries == 0 {
            map.remove(backend);
        }
        out
    }

    /// Counts a request to `backend` until the guard drops.
    pub fn request(&self, backend: &str) -> BudgetGuard {
        self.with(backend, |e| e.requests += 1);
        BudgetGuard {
            budget: self.clone(),
            backend: backend.to_owned(),
            retrying: false,
        }
    }
}

/// One request in flight; holds a retry once [`BudgetGuard::retry`] allowed one.
pub struct BudgetGuard {
    budget: RetryBudget,
    backend: String,
    retrying: bool,
}

impl BudgetGuard {
    /// Whether the budget allows this request another try.
    pub fn retry(&mut self) -> bool {
        if self.retrying {
            return true;
        }
        let allowed = self.budget.with(&self.backend, |e| {
            let limit = (e.requests * BUDGET_PERCENT / 100).max(BUDGET_MIN);
            let ok = e.retries < limit;
            if ok {
                e.retries += 1;
            }
            ok
        });
        self.retrying = allowed;
        allowed
    }
}

impl Drop for BudgetGuard {
    fn drop(&mut self) {
        let retrying = self.retrying;
        self.budget.with(&self.backend, |e| {
            e.requests -= 1;
            if retrying {
                e.retries -= 1;
            }
        });
    }
}

#[cfg(test)]
#[path = "routing_tests.rs"]
mod tests;
