//! The routes of every Service, each rule's matches ordered by the Gateway API's
//! precedence, and the choice of the rule a request takes.
//!
//! Precedence, as the spec orders HTTPRoute rules (GRPCRoute's method match is a path
//! match here, so the same order serves both): an `Exact` path, then the longest
//! `PathPrefix`, then a regular expression (implementation-specific; Istio ranks it
//! last too); then a method match; then the most header matches; then the most query
//! matches; then the oldest route, then the route first by `namespace/name`; then the
//! rule, then the match, in the order written.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::sync::Arc;

use super::{Match, PathMatch, Route, RouteKind, Rule};

/// A request, as far as route matching reads it.
pub struct RequestView<'a> {
    pub method: &'a str,
    /// Without the query.
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub headers: &'a http::HeaderMap,
}

/// The rule a request or connection takes.
#[derive(Debug, Clone, Copy)]
pub struct Selected<'a> {
    pub route: &'a Route,
    pub rule: &'a Rule,
    /// The match that selected the rule (`None`: a rule without matches).
    pub matched: Option<&'a Match>,
}

#[derive(Debug)]
struct Entry {
    route: Arc<Route>,
    rule: usize,
    matched: Option<usize>,
    /// The parent's port: the entry applies to that port of the Service only.
    port: Option<u16>,
}

impl Entry {
    fn selected(&self) -> Selected<'_> {
        let rule = &self.route.rules[self.rule];
        Selected {
            route: &self.route,
            rule,
            matched: self.matched.map(|i| &rule.matches[i]),
        }
    }

    fn applies_to(&self, port: u16) -> bool {
        self.port.is_none_or(|p| p == port)
    }
}

/// Every route in force, by the Service it is bound to.
#[derive(Debug, Default)]
pub struct RouteTable {
    routes: Vec<Arc<Route>>,
    /// HTTP and gRPC entries, in precedence order, by the parent's namespace and name.
    http: ByService,
    tcp: ByService,
}

type ByService = HashMap<String, HashMap<String, Vec<Entry>>>;

impl RouteTable {
    pub fn new(routes: impl IntoIterator<Item = Route>) -> Self {
        let mut table = RouteTable::default();
        for route in routes {
            let route = Arc::new(route);
            for parent in &route.parents {
                let by_service = match route.kind {
                    RouteKind::Tcp => &mut table.tcp,
                    RouteKind::Http | RouteKind::Grpc => &mut table.http,
                };
                let entries = by_service
                    .entry(parent.namespace.clone())
                    .or_default()
                    .entry(parent.name.clone())
                    .or_default();
                for (i, rule) in route.rules.iter().enumerate() {
                    let matched: Vec<Option<usize>> = if rule.matches.is_empty() {
                        vec![None]
                    } else {
                        (0..rule.matches.len()).map(Some).collect()
                    };
                    entries.extend(matched.into_iter().map(|matched| Entry {
                        route: route.clone(),
                        rule: i,
                        matched,
                        port: parent.port,
                    }));
                }
            }
            table.routes.push(route);
        }
        for by_name in table.http.values_mut().chain(table.tcp.values_mut()) {
            for entries in by_name.values_mut() {
                entries.sort_by_cached_key(|e| precedence(&e.route, e.rule, e.matched));
            }
        }
        table
    }

    /// Every route, in the order given.
    pub fn routes(&self) -> &[Arc<Route>] {
        &self.routes
    }

    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// Whether any HTTP or gRPC route is bound to the Service's `port`: then a request
    /// no rule matches gets 404, as the spec requires.
    pub fn has_http(&self, service: (&str, &str), port: u16) -> bool {
        self.entries(&self.http, service)
            .iter()
            .any(|e| e.applies_to(port))
    }

    /// The HTTP or gRPC rule `request` to the Service's `port` takes.
    pub fn http(
        &self,
        service: (&str, &str),
        port: u16,
        request: &RequestView,
    ) -> Option<Selected<'_>> {
        self.entries(&self.http, service)
            .iter()
            .filter(|e| e.applies_to(port))
            .find(|e| {
                e.matched
                    .is_none_or(|i| matches(&e.route.rules[e.rule].matches[i], request))
            })
            .map(Entry::selected)
    }

    /// The TCPRoute rule a connection to the Service's `port` takes (the first rule of
    /// the route first in precedence).
    pub fn tcp(&self, service: (&str, &str), port: u16) -> Option<Selected<'_>> {
        self.entries(&self.tcp, service)
            .iter()
            .find(|e| e.applies_to(port))
            .map(Entry::selected)
    }

    fn entries<'a>(&self, map: &'a ByService, (namespace, name): (&str, &str)) -> &'a [Entry] {
        map.get(namespace)
            .and_then(|by_name| by_name.get(name))
            .map_or(&[], Vec::as_slice)
    }
}

/// Where one match of a rule stands among the rules bound to a Service: lower sorts
/// first (takes precedence). For views that list rules in the waypoint's order.
pub type Precedence = (
    Reverse<(u8, usize)>,
    Reverse<(bool, usize, usize)>,
    String,
    String,
    String,
    usize,
    usize,
);

/// The [`Precedence`] of match `matched` of rule `rule` of `route` (`None`: a rule
/// without matches, which stands as `PathPrefix /`).
pub fn precedence(route: &Route, rule: usize, matched: Option<usize>) -> Precedence {
    let default = Match::default();
    let m = matched
        .and_then(|i| route.rules.get(rule)?.matches.get(i))
        .unwrap_or(&default);
    let path = match &m.path {
        PathMatch::Exact(p) => (2, p.len()),
        PathMatch::Prefix(p) => (1, p.len()),
        PathMatch::Regex(_) => (0, 0),
    };
    (
        Reverse(path),
        Reverse((m.method.is_some(), m.headers.len(), m.query.len())),
        route.created.clone(),
        route.namespace.clone(),
        route.name.clone(),
        rule,
        matched.unwrap_or(0),
    )
}

/// Whether `request` satisfies every condition of `m`.
pub(super) fn matches(m: &Match, request: &RequestView) -> bool {
    let path_ok = match &m.path {
        PathMatch::Exact(p) => request.path == p,
        PathMatch::Prefix(p) => prefix_matches(p, request.path),
        PathMatch::Regex(re) => re.is_match(request.path),
    };
    path_ok
        && m.method
            .as_deref()
            .is_none_or(|want| want == request.method)
        && m.headers.iter().all(|(name, want)| {
            request
                .headers
                .get(name.as_str())
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| want.matches(v))
        })
        && m.query
            .iter()
            .all(|(name, want)| query_value(request.query, name).is_some_and(|v| want.matches(v)))
}

/// `PathPrefix` matching by path elements: `/foo` and `/foo/` match `/foo`, `/foo/`
/// and `/foo/bar`, not `/foobar`.
pub(crate) fn prefix_matches(prefix: &str, path: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    if prefix.is_empty() {
        return true;
    }
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// The first value of query parameter `name` (names compared exactly, values as sent).
fn query_value<'a>(query: Option<&'a str>, name: &str) -> Option<&'a str> {
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then_some(v)
    })
}
