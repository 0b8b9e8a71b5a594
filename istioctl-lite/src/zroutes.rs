//! `ztunnel-config route`: the Gateway API routes of a waypoint's dump, compiled as
//! the waypoint compiles them (`mesh_model::route`), one row per rule, in the order
//! the waypoint tries them for each Service they are bound to. A route that does
//! not compile (which the waypoint does not apply) is one `INVALID` row with the
//! error.
//!
//! Self-contained (the dump's types and mesh-model only) so the fuzz target compiles
//! it with the dump parser.

use mesh_model::route::{
    precedence, Backend, Filter, Match, PathMatch, Precedence, Route, RouteKind, Rule, ValueMatch,
};

use crate::configdump::WaypointRoute;

/// The columns.
pub const HEADER: [&str; 8] = [
    "NAMESPACE",
    "ROUTE",
    "KIND",
    "PARENT",
    "RULE",
    "MATCHES",
    "FILTERS",
    "BACKENDS",
];

/// The rows of `routes`: for each parent Service (by namespace and name), its
/// HTTP and gRPC rules, then its TCP rules, in precedence order; then the rules of
/// routes bound to no Service (which the waypoint never applies); then the routes
/// that do not compile, in the order given.
pub fn rows<'a>(routes: impl IntoIterator<Item = &'a WaypointRoute>) -> Vec<Vec<String>> {
    let mut ranked: Vec<Ranked> = Vec::new();
    let mut invalid = Vec::new();
    for entry in routes {
        match compile(entry) {
            Ok(route) => rank(&route, &mut ranked),
            Err(error) => invalid.push(vec![
                or_dash(&entry.namespace),
                or_dash(&entry.name),
                or_dash(&entry.kind),
                "-".into(),
                "-".into(),
                format!("INVALID: {}", one_line(&error)),
                "-".into(),
                "-".into(),
            ]),
        }
    }
    // Stable: a route bound to several ports of a Service keeps its parents' order.
    ranked.sort_by(|a, b| {
        (&a.group, a.rank.is_none(), &a.rank).cmp(&(&b.group, b.rank.is_none(), &b.rank))
    });
    ranked
        .into_iter()
        .map(|r| r.cells)
        .chain(invalid)
        .map(|cells| cells.iter().map(|c| clean(c)).collect())
        .collect()
}

/// The route as the waypoint compiles it, its creation time deciding ties.
pub fn compile(entry: &WaypointRoute) -> Result<Route, String> {
    let spec = entry.spec.to_string();
    let mut route = Route::from_spec(&entry.kind, &entry.namespace, &entry.name, &spec)
        .map_err(|e| e.to_string())?;
    route.created = entry.creation_timestamp.clone();
    Ok(route)
}

struct Ranked {
    /// Bound to no Service; the parent's namespace and name; TCP.
    group: (bool, String, String, bool),
    /// `None`: a route without rules (after the rules of its group).
    rank: Option<Precedence>,
    cells: Vec<String>,
}

/// A rule takes its place at its match first in precedence (the waypoint tries
/// each match of a rule at its own place; a row shows them together).
fn rule_precedence(route: &Route, rule: usize) -> Precedence {
    (0..route.rules[rule].matches.len())
        .map(|m| precedence(route, rule, Some(m)))
        .min()
        .unwrap_or_else(|| precedence(route, rule, None))
}

fn rank(route: &Route, out: &mut Vec<Ranked>) {
    let tcp = route.kind == RouteKind::Tcp;
    let parents: Vec<_> = if route.parents.is_empty() {
        vec![None]
    } else {
        route.parents.iter().map(Some).collect()
    };
    for parent in parents {
        let group = match parent {
            Some(p) => (false, p.namespace.clone(), p.name.clone(), tcp),
            None => (true, String::new(), String::new(), tcp),
        };
        let parent = parent.map_or_else(|| "-".to_owned(), ToString::to_string);
        let cells = |rule: String, matches: String, filters: String, backends: String| {
            vec![
                route.namespace.clone(),
                route.name.clone(),
                route.kind.as_str().to_owned(),
                parent.clone(),
                rule,
                matches,
                filters,
                backends,
            ]
        };
        if route.rules.is_empty() {
            out.push(Ranked {
                group: group.clone(),
                rank: None,
                cells: cells("-".into(), "(no rules)".into(), "-".into(), "-".into()),
            });
        }
        for (i, rule) in route.rules.iter().enumerate() {
            out.push(Ranked {
                group: group.clone(),
                rank: Some(rule_precedence(route, i)),
                cells: cells(
                    format!("{}.{}.{}", route.namespace, route.name, rule.name),
                    matches_text(rule),
                    filters_text(rule),
                    backends_text(&route.namespace, rule),
                ),
            });
        }
    }
}

/// `*` for a rule that takes every request, else its matches joined by ` | `.
fn matches_text(rule: &Rule) -> String {
    if rule.matches.is_empty() {
        return "*".into();
    }
    let texts: Vec<String> = rule.matches.iter().map(match_text).collect();
    texts.join(" | ")
}

/// `Exact /x`, `Prefix /api`, `Regex <re>`, the method, `hdr <name>=<value>` (`~<re>`
/// for a regex), `query <name>=<value>`; the default `Prefix /` only when alone.
fn match_text(m: &Match) -> String {
    let mut parts = Vec::new();
    let more = m.method.is_some() || !m.headers.is_empty() || !m.query.is_empty();
    match &m.path {
        PathMatch::Exact(p) => parts.push(format!("Exact {p}")),
        PathMatch::Prefix(p) if p == "/" && more => {}
        PathMatch::Prefix(p) => parts.push(format!("Prefix {p}")),
        PathMatch::Regex(re) => parts.push(format!("Regex {}", pattern(re.as_str()))),
    }
    parts.extend(m.method.clone());
    for (name, value) in &m.headers {
        parts.push(format!("hdr {name}{}", value_text(value)));
    }
    for (name, value) in &m.query {
        parts.push(format!("query {name}{}", value_text(value)));
    }
    parts.join(" ")
}

fn value_text(v: &ValueMatch) -> String {
    match v {
        ValueMatch::Exact(value) => format!("={value}"),
        ValueMatch::Regex(re) => format!("~{}", pattern(re.as_str())),
    }
}

/// The pattern as written (the compiler anchors it as `^(?:<pattern>)$`).
fn pattern(anchored: &str) -> &str {
    anchored
        .strip_prefix("^(?:")
        .and_then(|p| p.strip_suffix(")$"))
        .unwrap_or(anchored)
}

fn filter_kind(f: &Filter) -> &'static str {
    match f {
        Filter::RequestHeaders(_) => "RequestHeaderModifier",
        Filter::ResponseHeaders(_) => "ResponseHeaderModifier",
        Filter::Redirect(_) => "RequestRedirect",
        Filter::Rewrite(_) => "URLRewrite",
        Filter::Mirror(_) => "RequestMirror",
    }
}

/// The filter kinds, and `UNSUPPORTED` when the rule has one the waypoint does not
/// implement (its requests get 500).
fn filters_text(rule: &Rule) -> String {
    let mut kinds: Vec<&str> = rule.filters.iter().map(filter_kind).collect();
    if rule.unsupported.is_some() {
        kinds.push("UNSUPPORTED");
    }
    if kinds.is_empty() {
        "-".into()
    } else {
        kinds.join(",")
    }
}

/// `svc:port=weight` (`ns/svc` in another namespace than the route's), each
/// backend's own filters in brackets; `(parent)` without backends (the request goes
/// to the Service it was sent to); `(redirect <status>)` when the waypoint answers
/// with a redirect instead.
fn backends_text(namespace: &str, rule: &Rule) -> String {
    let redirect = rule.filters.iter().find_map(|f| match f {
        Filter::Redirect(r) => Some(r.status),
        _ => None,
    });
    if let Some(status) = redirect {
        return format!("(redirect {status})");
    }
    if rule.backends.is_empty() {
        return "(parent)".into();
    }
    let texts: Vec<String> = rule
        .backends
        .iter()
        .map(|b| backend_text(namespace, b))
        .collect();
    texts.join(",")
}

fn backend_text(namespace: &str, b: &Backend) -> String {
    let mut text = if b.service.namespace == namespace {
        b.service.name.clone()
    } else {
        format!("{}/{}", b.service.namespace, b.service.name)
    };
    if let Some(port) = b.service.port {
        text.push_str(&format!(":{port}"));
    }
    text.push_str(&format!("={}", b.weight));
    let mut extra: Vec<&str> = b.filters.iter().map(filter_kind).collect();
    if b.unsupported.is_some() {
        extra.push("UNSUPPORTED");
    }
    if !extra.is_empty() {
        text.push_str(&format!("[{}]", extra.join(",")));
    }
    text
}

fn or_dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_owned()
    }
}

/// Whitespace runs (a regex error spans lines) as one space.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Control characters escaped, so that a cell stays on its line.
fn clean(cell: &str) -> String {
    cell.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
#[path = "zroutes_tests.rs"]
mod tests;
