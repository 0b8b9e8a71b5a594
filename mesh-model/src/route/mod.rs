//! Gateway API routes bound to Services (GAMMA): an HTTPRoute, GRPCRoute or TCPRoute
//! whose `parentRefs` name a Service (group `""`, kind `Service`) applies to the traffic
//! a waypoint serves for that Service. [`Route::from_spec`] compiles one from its spec
//! as Kubernetes stores it ([`spec`]); [`RouteTable`] orders the rules of every route
//! by the Gateway API's precedence and picks the one a request takes.
//!
//! istiod-lite compiles routes too, for their status: an error here is the route's
//! `Accepted: False`. What the spec says must answer 500 rather than be skipped (a
//! filter the waypoint does not implement, a backend that is not a Service) compiles
//! into the rule as [`Rule::unsupported`] or [`Backend::unsupported`].

/// The specs as Kubernetes stores them.
pub mod spec;
mod table;

use std::time::Duration;

use regex::{Regex, RegexBuilder};

use spec::{BackendRefSpec, FilterSpec, MatchSpec, MethodSpec, PathModifierSpec, RouteSpec};
pub use table::{precedence, Precedence, RequestView, RouteTable, Selected};

/// Largest compiled regex (the `regex` crate's size limit): a pattern from the API
/// cannot make the waypoint build an automaton of unbounded size.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RouteKind {
    Http,
    Grpc,
    Tcp,
}

impl RouteKind {
    pub fn parse(kind: &str) -> Option<Self> {
        match kind {
            "HTTPRoute" => Some(RouteKind::Http),
            "GRPCRoute" => Some(RouteKind::Grpc),
            "TCPRoute" => Some(RouteKind::Tcp),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RouteKind::Http => "HTTPRoute",
            RouteKind::Grpc => "GRPCRoute",
            RouteKind::Tcp => "TCPRoute",
        }
    }
}

/// Why a route is not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("unknown route kind {0:?} (HTTPRoute, GRPCRoute or TCPRoute)")]
    Kind(String),
    #[error("the spec does not parse: {0}")]
    Spec(String),
    #[error("rule {rule}: {reason}")]
    Rule { rule: usize, reason: String },
}

/// A Service, as a route names it (a parent, a backend or a mirror).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceRef {
    pub namespace: String,
    pub name: String,
    /// A parent without a port covers all of the Service's ports; a backend without one
    /// takes the request's port.
    pub port: Option<u16>,
}

impl ServiceRef {
    /// The Service's hostname in the cluster's domain.
    pub fn hostname(&self, domain: &str) -> String {
        format!("{}.{}.svc.{domain}", self.name, self.namespace)
    }
}

impl std::fmt::Display for ServiceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)?;
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

/// One compiled route.
#[derive(Debug, Clone)]
pub struct Route {
    pub kind: RouteKind,
    pub namespace: String,
    pub name: String,
    /// `metadata.creationTimestamp`: between rules of equal precedence the oldest
    /// route's wins (RFC 3339 strings of one zone sort as times).
    pub created: String,
    /// The Services it is bound to (other parents, such as Gateways, are not ours).
    pub parents: Vec<ServiceRef>,
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone)]
pub struct Rule {
    /// The rule's `name`, or its index: what the request metrics and the log call it.
    pub name: String,
    /// Any of them selects the rule; a rule without matches matches every request
    /// (a `PathPrefix` of `/`).
    pub matches: Vec<Match>,
    pub filters: Vec<Filter>,
    pub backends: Vec<Backend>,
    pub timeouts: Timeouts,
    /// `None`: the waypoint's default retry policy (Istio's).
    pub retry: Option<Retry>,
    /// A filter the waypoint does not implement: requests this rule selects get 500,
    /// as the spec requires of a filter that cannot be applied.
    pub unsupported: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct Match {
    pub path: PathMatch,
    pub method: Option<String>,
    /// Header names lowercase; the first entry for a name is the one in force.
    pub headers: Vec<(String, ValueMatch)>,
    pub query: Vec<(String, ValueMatch)>,
}

#[derive(Debug, Clone)]
pub enum PathMatch {
    Exact(String),
    /// By path elements: `/foo` matches `/foo` and `/foo/bar`, not `/foobar`.
    Prefix(String),
    Regex(Regex),
}

impl Default for PathMatch {
    fn default() -> Self {
        PathMatch::Prefix("/".into())
    }
}

#[derive(Debug, Clone)]
pub enum ValueMatch {
    Exact(String),
    Regex(Regex),
}

impl ValueMatch {
    pub fn matches(&self, value: &str) -> bool {
        match self {
            ValueMatch::Exact(want) => want == value,
            ValueMatch::Regex(re) => re.is_match(value),
        }
    }
}

#[derive(Debug, Clone)]
pub enum Filter {
    RequestHeaders(HeaderModifier),
    ResponseHeaders(HeaderModifier),
    Redirect(Redirect),
    Rewrite(Rewrite),
    Mirror(Mirror),
}

#[derive(Debug, Clone, Default)]
pub struct HeaderModifier {
    pub set: Vec<(String, String)>,
    pub add: Vec<(String, String)>,
    pub remove: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Redirect {
    pub scheme: Option<String>,
    pub hostname: Option<String>,
    pub path: Option<PathModifier>,
    pub port: Option<u16>,
    /// 301 unless the filter says 302 (or another of the spec's codes).
    pub status: u16,
}

#[derive(Debug, Clone)]
pub enum PathModifier {
    Full(String),
    /// Replaces the part of the path the rule's `PathPrefix` matched.
    Prefix(String),
}

#[derive(Debug, Clone, Default)]
pub struct Rewrite {
    pub hostname: Option<String>,
    pub path: Option<PathModifier>,
}

#[derive(Debug, Clone)]
pub struct Mirror {
    pub backend: ServiceRef,
    /// Share of requests mirrored, 0 to 1.
    pub fraction: f64,
}

#[derive(Debug, Clone)]
pub struct Backend {
    pub service: ServiceRef,
    pub weight: u32,
    pub filters: Vec<Filter>,
    /// Not a core Service (or a filter the waypoint does not implement): requests sent
    /// to this backend get 500.
    pub unsupported: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timeouts {
    /// The whole request, retries included (`timeouts.request`).
    pub request: Option<Duration>,
    /// Each try (`timeouts.backendRequest`).
    pub backend_request: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    /// Retries after the first try (0: none; `None`: the proxy's default).
    pub attempts: Option<u32>,
    /// Response codes retried; connection failures and resets are always retried.
    pub codes: Vec<u16>,
    pub backoff: Option<Duration>,
}

impl Route {
    /// Compiles a route of `kind` (`HTTPRoute`, `GRPCRoute`, `TCPRoute`) from its spec.
    pub fn from_spec(
        kind: &str,
        namespace: &str,
        name: &str,
        spec_json: &str,
    ) -> Result<Route, RouteError> {
        let kind = RouteKind::parse(kind).ok_or_else(|| RouteError::Kind(kind.into()))?;
        let spec: RouteSpec =
            serde_json::from_str(spec_json).map_err(|e| RouteError::Spec(e.to_string()))?;
        Self::compile(kind, namespace, name, spec)
    }

    pub fn compile(
        kind: RouteKind,
        namespace: &str,
        name: &str,
        spec: RouteSpec,
    ) -> Result<Route, RouteError> {
        let parents = spec
            .parent_refs
            .iter()
            .flatten()
            .filter(|p| p.group.as_deref() == Some("") && p.kind.as_deref() == Some("Service"))
            .filter_map(|p| {
                Some(ServiceRef {
                    namespace: p.namespace.clone().unwrap_or_else(|| namespace.into()),
                    name: p.name.clone()?,
                    port: p.port,
                })
            })
            .collect();
        let rules = spec
            .rules
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(i, rule)| {
                compile_rule(kind, namespace, i, rule)
                    .map_err(|reason| RouteError::Rule { rule: i, reason })
            })
            .collect::<Result<_, _>>()?;
        Ok(Route {
            kind,
            namespace: namespace.into(),
            name: name.into(),
            created: String::new(),
            parents,
            rules,
        })
    }

    /// `kind/namespace/name`, as the xDS resource is named.
    pub fn key(&self) -> String {
        format!("{}/{}/{}", self.kind.as_str(), self.namespace, self.name)
    }
}

fn compile_rule(
    kind: RouteKind,
    namespace: &str,
    index: usize,
    rule: spec::RuleSpec,
) -> Result<Rule, String> {
    let matches = match kind {
        // A TCPRoute has no matches: its rule takes every connection.
        RouteKind::Tcp => Vec::new(),
        _ => rule
            .matches
            .unwrap_or_default()
            .into_iter()
            .map(|m| compile_match(kind, m))
            .collect::<Result<_, _>>()?,
    };
    let mut unsupported = None;
    let filters = compile_filters(
        kind,
        namespace,
        rule.filters.unwrap_or_default(),
        &matches,
        &mut unsupported,
    )?;
    let backends = rule
        .backend_refs
        .unwrap_or_default()
        .into_iter()
        .map(|b| compile_backend(kind, namespace, b, &matches))
        .collect::<Result<_, _>>()?;
    let timeouts = match rule.timeouts {
        Some(t) => Timeouts {
            request: t.request.as_deref().map(gateway_duration).transpose()?,
            backend_request: t
                .backend_request
                .as_deref()
                .map(gateway_duration)
                .transpose()?,
        },
        None => Timeouts::default(),
    };
    if let (Some(request), Some(backend)) = (timeouts.request, timeouts.backend_request) {
        if backend > request {
            return Err("timeouts.backendRequest is longer than timeouts.request".into());
        }
    }
    let retry = rule
        .retry
        .map(|r| {
            let codes = r.codes.unwrap_or_default();
            if let Some(bad) = codes.iter().find(|c| !(400..=599).contains(*c)) {
                return Err(format!("retry code {bad} is not between 400 and 599"));
            }
            Ok(Retry {
                attempts: r.attempts,
                codes,
                backoff: r.backoff.as_deref().map(gateway_duration).transpose()?,
            })
        })
        .transpose()?;
    Ok(Rule {
        name: rule.name.unwrap_or_else(|| index.to_string()),
        matches,
        filters,
        backends,
        timeouts,
        retry,
        unsupported,
    })
}

fn compile_match(kind: RouteKind, m: MatchSpec) -> Result<Match, String> {
    let path = match (kind, &m.method) {
        (RouteKind::Grpc, Some(MethodSpec::Grpc(method))) => grpc_path(method)?,
        _ => match m.path {
            None => PathMatch::default(),
            Some(p) => {
                let value = p.value.unwrap_or_else(|| "/".into());
                match p.kind.as_deref().unwrap_or("PathPrefix") {
                    "Exact" => PathMatch::Exact(absolute(value)?),
                    "PathPrefix" => PathMatch::Prefix(absolute(value)?),
                    "RegularExpression" => PathMatch::Regex(full_match(&value)?),
                    other => return Err(format!("unknown path match type {other:?}")),
                }
            }
        },
    };
    let method = match m.method {
        Some(MethodSpec::Http(method)) if kind == RouteKind::Http => Some(method),
        Some(MethodSpec::Http(_)) => return Err("a GRPCRoute's method is an object".into()),
        Some(MethodSpec::Grpc(_)) if kind == RouteKind::Http => {
            return Err("an HTTPRoute's method is a string".into())
        }
        _ => None,
    };
    let mut headers: Vec<(String, ValueMatch)> = Vec::new();
    for h in m.headers.unwrap_or_default() {
        let (name, value) = value_match(h)?;
        let name = name.to_ascii_lowercase();
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(format!("invalid header name {name:?}"));
        }
        // The spec: only the first entry for a name is considered.
        if !headers.iter().any(|(n, _)| *n == name) {
            headers.push((name, value));
        }
    }
    let mut query: Vec<(String, ValueMatch)> = Vec::new();
    for q in m.query_params.unwrap_or_default() {
        let (name, value) = value_match(q)?;
        if !query.iter().any(|(n, _)| *n == name) {
            query.push((name, value));
        }
    }
    Ok(Match {
        path,
        method,
        headers,
        query,
    })
}

/// A GRPCRoute method match as a match on the request's path, `/service/method`.
fn grpc_path(m: &spec::GrpcMethodSpec) -> Result<PathMatch, String> {
    let (service, method) = (m.service.as_deref(), m.method.as_deref());
    match m.kind.as_deref().unwrap_or("Exact") {
        "Exact" => {
            for part in [service, method].into_iter().flatten() {
                if part.is_empty() || part.contains('/') {
                    return Err(format!("invalid gRPC service or method {part:?}"));
                }
            }
            Ok(match (service, method) {
                (Some(s), Some(m)) => PathMatch::Exact(format!("/{s}/{m}")),
                (Some(s), None) => PathMatch::Prefix(format!("/{s}")),
                (None, Some(m)) => {
                    PathMatch::Regex(full_match(&format!("/[^/]+/{}", regex::escape(m)))?)
                }
                (None, None) => return Err("a gRPC method match names no service or method".into()),
            })
        }
        "RegularExpression" => {
            let s = service.unwrap_or("[^/]+");
            let m = method.unwrap_or("[^/]+");
            // Compiled on their own first, so an error names the part that is wrong.
            full_match(s)?;
            full_match(m)?;
            Ok(PathMatch::Regex(full_match(&format!("/(?:{s})/(?:{m})"))?))
        }
        other => Err(format!("unknown gRPC method match type {other:?}")),
    }
}

fn absolute(path: String) -> Result<String, String> {
    if !path.starts_with('/') {
        return Err(format!("path {path:?} does not start with /"));
    }
    Ok(path)
}

fn value_match(m: spec::ValueMatchSpec) -> Result<(String, ValueMatch), String> {
    let name = m
        .name
        .filter(|n| !n.is_empty())
        .ok_or("a match has no name")?;
    let value = m.value.unwrap_or_default();
    let matcher = match m.kind.as_deref().unwrap_or("Exact") {
        "Exact" => ValueMatch::Exact(value),
        "RegularExpression" => ValueMatch::Regex(full_match(&value)?),
        other => return Err(format!("unknown match type {other:?} for {name:?}")),
    };
    Ok((name, matcher))
}

/// A regex that must match the whole value (as Envoy's, which Istio configures).
fn full_match(pattern: &str) -> Result<Regex, String> {
    RegexBuilder::new(&format!("^(?:{pattern})$"))
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| format!("invalid regular expression {pattern:?}: {e}"))
}

/// Filters of a rule or a backend. A type the waypoint does not implement sets
/// `unsupported` (its requests get 500); a malformed one is an error.
fn compile_filters(
    kind: RouteKind,
    namespace: &str,
    specs: Vec<FilterSpec>,
    matches: &[Match],
    unsupported: &mut Option<String>,
) -> Result<Vec<Filter>, String> {
    let mut filters = Vec::new();
    for f in specs {
        let kind_name = f.kind.clone().unwrap_or_default();
        let filter = match kind_name.as_str() {
            "RequestHeaderModifier" => Filter::RequestHeaders(header_modifier(
                f.request_header_modifier,
                "requestHeaderModifier",
            )?),
            "ResponseHeaderModifier" => Filter::ResponseHeaders(header_modifier(
                f.response_header_modifier,
                "responseHeaderModifier",
            )?),
            "RequestMirror" => {
                let m = f
                    .request_mirror
                    .ok_or("RequestMirror without requestMirror")?;
                let backend = m.backend_ref.ok_or("RequestMirror without a backendRef")?;
                let fraction = match (m.percent, m.fraction) {
                    (Some(p), _) => f64::from(p.min(100)) / 100.0,
                    (None, Some(f)) => {
                        let denominator = f.denominator.unwrap_or(100);
                        if denominator == 0 {
                            return Err("RequestMirror fraction's denominator is 0".into());
                        }
                        (f64::from(f.numerator.unwrap_or(0)) / f64::from(denominator)).min(1.0)
                    }
                    (None, None) => 1.0,
                };
                let service = service_ref(namespace, &backend)?;
                if service.port.is_none() {
                    return Err("a RequestMirror backendRef needs a port".into());
                }
                Filter::Mirror(Mirror {
                    backend: service,
                    fraction,
                })
            }
            "RequestRedirect" | "URLRewrite" if kind == RouteKind::Http => {
                // A rule without matches matches `PathPrefix /`.
                let prefix_matched = matches
                    .iter()
                    .all(|m| matches!(m.path, PathMatch::Prefix(_)));
                let path = |p: Option<PathModifierSpec>| -> Result<Option<PathModifier>, String> {
                    let Some(p) = p else { return Ok(None) };
                    match p.kind.as_deref() {
                        Some("ReplaceFullPath") => Ok(Some(PathModifier::Full(absolute(
                            p.replace_full_path
                                .ok_or("ReplaceFullPath without replaceFullPath")?,
                        )?))),
                        Some("ReplacePrefixMatch") if prefix_matched => {
                            Ok(Some(PathModifier::Prefix(absolute(
                                p.replace_prefix_match
                                    .ok_or("ReplacePrefixMatch without replacePrefixMatch")?,
                            )?)))
                        }
                        Some("ReplacePrefixMatch") => Err(
                            "ReplacePrefixMatch needs every match of the rule to be a PathPrefix"
                                .into(),
                        ),
                        other => Err(format!("unknown path modifier {other:?}")),
                    }
                };
                if kind_name == "RequestRedirect" {
                    let r = f
                        .request_redirect
                        .ok_or("RequestRedirect without requestRedirect")?;
                    let status = r.status_code.unwrap_or(301);
                    if ![301, 302, 303, 307, 308].contains(&status) {
                        return Err(format!("redirect status {status} is not a redirect"));
                    }
                    if let Some(scheme) = r.scheme.as_deref() {
                        if !matches!(scheme, "http" | "https") {
                            return Err(format!("redirect scheme {scheme:?} is not http or https"));
                        }
                    }
                    Filter::Redirect(Redirect {
                        scheme: r.scheme,
                        hostname: r.hostname,
                        path: path(r.path)?,
                        port: r.port,
                        status,
                    })
                } else {
                    let r = f.url_rewrite.ok_or("URLRewrite without urlRewrite")?;
                    Filter::Rewrite(Rewrite {
                        hostname: r.hostname,
                        path: path(r.path)?,
                    })
                }
            }
            other => {
                // ExtensionRef, CORS, and whatever a newer API adds.
                unsupported.get_or_insert_with(|| format!("filter {other:?} is not supported"));
                continue;
            }
        };
        filters.push(filter);
    }
    let redirects = filters
        .iter()
        .filter(|f| matches!(f, Filter::Redirect(_)))
        .count();
    let rewrites = filters
        .iter()
        .filter(|f| matches!(f, Filter::Rewrite(_)))
        .count();
    if redirects > 0 && rewrites > 0 {
        return Err("RequestRedirect and URLRewrite cannot be used together".into());
    }
    Ok(filters)
}

fn header_modifier(
    spec: Option<spec::HeaderModifierSpec>,
    field: &str,
) -> Result<HeaderModifier, String> {
    let spec = spec.ok_or_else(|| format!("the filter has no {field}"))?;
    let pairs = |list: Option<Vec<spec::HeaderSpec>>| -> Result<Vec<(String, String)>, String> {
        list.unwrap_or_default()
            .into_iter()
            .map(|h| {
                let name = h.name.unwrap_or_default().to_ascii_lowercase();
                let value = h.value.unwrap_or_default();
                http::HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| format!("invalid header name {name:?}"))?;
                http::HeaderValue::from_str(&value)
                    .map_err(|_| format!("invalid value for header {name:?}"))?;
                Ok((name, value))
            })
            .collect()
    };
    let remove = spec
        .remove
        .unwrap_or_default()
        .into_iter()
        .map(|name| {
            let name = name.to_ascii_lowercase();
            http::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("invalid header name {name:?}"))?;
            Ok(name)
        })
        .collect::<Result<_, String>>()?;
    Ok(HeaderModifier {
        set: pairs(spec.set)?,
        add: pairs(spec.add)?,
        remove,
    })
}

fn service_ref(namespace: &str, b: &BackendRefSpec) -> Result<ServiceRef, String> {
    let name = b
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or("a backendRef has no name")?;
    Ok(ServiceRef {
        namespace: b.namespace.clone().unwrap_or_else(|| namespace.into()),
        name,
        port: b.port,
    })
}

fn compile_backend(
    kind: RouteKind,
    namespace: &str,
    b: BackendRefSpec,
    matches: &[Match],
) -> Result<Backend, String> {
    let service = service_ref(namespace, &b)?;
    let mut unsupported = None;
    let core_service = b.group.as_deref().unwrap_or("").is_empty()
        && b.kind.as_deref().unwrap_or("Service") == "Service";
    if !core_service {
        unsupported = Some(format!(
            "backend {}/{} of group {:?} and kind {:?} is not a Service",
            service.namespace,
            service.name,
            b.group.as_deref().unwrap_or(""),
            b.kind.as_deref().unwrap_or("")
        ));
    }
    let filters = compile_filters(
        kind,
        namespace,
        b.filters.unwrap_or_default(),
        matches,
        &mut unsupported,
    )?;
    if filters.iter().any(|f| matches!(f, Filter::Redirect(_))) {
        return Err("a backendRef cannot redirect".into());
    }
    Ok(Backend {
        service,
        weight: b.weight.unwrap_or(1),
        filters,
        unsupported,
    })
}

/// A Gateway API `Duration` (GEP-2257): one to four `<number><unit>` parts, units
/// `h`, `m`, `s`, `ms`, e.g. `1h`, `10s`, `1m30s`, `500ms`; `0s` is zero (no timeout).
pub fn gateway_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {text:?} (e.g. 10s, 500ms, 1m30s)");
    let mut rest = text;
    let mut total = Duration::ZERO;
    let mut parts = 0;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        if digits == 0 || digits > 5 {
            return Err(bad());
        }
        let value: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (Duration::from_millis(1), 2)
        } else if rest.starts_with('h') {
            (Duration::from_secs(3600), 1)
        } else if rest.starts_with('m') {
            (Duration::from_secs(60), 1)
        } else if rest.starts_with('s') {
            (Duration::from_secs(1), 1)
        } else {
            return Err(bad());
        };
        rest = &rest[len..];
        total += unit * value as u32;
        parts += 1;
    }
    if parts == 0 || parts > 4 {
        return Err(bad());
    }
    Ok(total)
}

#[cfg(test)]
mod tests;
