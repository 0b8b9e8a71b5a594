use std::time::Duration;

use serde_json::json;

use super::*;

fn http_route(name: &str, rules: serde_json::Value) -> Route {
    route("HTTPRoute", name, rules)
}

fn route(kind: &str, name: &str, rules: serde_json::Value) -> Route {
    let spec = json!({
        "parentRefs": [{"group": "", "kind": "Service", "name": "echo", "port": 80}],
        "rules": rules,
    });
    Route::from_spec(kind, "shop", name, &spec.to_string()).expect("compiles")
}

fn headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
    pairs
        .iter()
        .map(|(k, v)| {
            (
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            )
        })
        .collect()
}

/// The name of the rule `method path?query` with `hdrs` takes, if any.
fn pick(table: &RouteTable, method: &str, uri: &str, hdrs: &[(&str, &str)]) -> Option<String> {
    let (path, query) = match uri.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (uri, None),
    };
    let headers = headers(hdrs);
    let request = RequestView {
        method,
        path,
        query,
        headers: &headers,
    };
    table
        .http(("shop", "echo"), 80, &request)
        .map(|s| format!("{}/{}", s.route.name, s.rule.name))
}

#[test]
fn parents_are_services_only() {
    let spec = json!({"parentRefs": [
        {"group": "", "kind": "Service", "name": "a"},
        {"group": "", "kind": "Service", "name": "b", "namespace": "other", "port": 8080},
        {"name": "gateway"},
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "g"},
    ]});
    let r = Route::from_spec("HTTPRoute", "shop", "r", &spec.to_string()).unwrap();
    let parents: Vec<String> = r.parents.iter().map(|p| p.to_string()).collect();
    assert_eq!(parents, ["shop/a", "other/b:8080"]);
}

#[test]
fn path_prefix_matches_whole_elements() {
    for (prefix, path, want) in [
        ("/abc", "/abc", true),
        ("/abc", "/abc/", true),
        ("/abc", "/abc/def", true),
        ("/abc", "/abcd", false),
        ("/abc/", "/abc", true),
        ("/abc/", "/abc/def", true),
        ("/abc/", "/abcd", false),
        ("/", "/anything", true),
        ("/abc", "/ab", false),
    ] {
        assert_eq!(table::prefix_matches(prefix, path), want, "{prefix} {path}");
    }
}

/// The spec's precedence: Exact, then the longest prefix, then method, then the
/// number of header matches, then the number of query matches.
#[test]
fn precedence_follows_the_spec() {
    let table = RouteTable::new([http_route(
        "r",
        json!([
            {"name": "prefix", "matches": [{"path": {"type": "PathPrefix", "value": "/"}}]},
            {"name": "longer", "matches": [{"path": {"type": "PathPrefix", "value": "/api"}}]},
            {"name": "exact", "matches": [{"path": {"type": "Exact", "value": "/api/v1"}}]},
            {"name": "method", "matches": [{"path": {"type": "PathPrefix", "value": "/api"}, "method": "POST"}]},
            {"name": "header", "matches": [{"path": {"type": "PathPrefix", "value": "/api"},
                "headers": [{"name": "x-canary", "value": "yes"}]}]},
            {"name": "two-headers", "matches": [{"path": {"type": "PathPrefix", "value": "/api"},
                "headers": [{"name": "x-canary", "value": "yes"}, {"name": "x-user", "value": "a"}]}]},
            {"name": "query", "matches": [{"path": {"type": "PathPrefix", "value": "/api"},
                "queryParams": [{"name": "debug", "value": "1"}]}]},
            {"name": "regex", "matches": [{"path": {"type": "RegularExpression", "value": "/api/v[0-9]+/items"}}]},
        ]),
    )]);
    assert_eq!(
        pick(&table, "GET", "/api/v1", &[("x-canary", "yes")]).unwrap(),
        "r/exact"
    );
    assert_eq!(
        pick(&table, "POST", "/api/x", &[("x-canary", "yes")]).unwrap(),
        "r/method"
    );
    assert_eq!(
        pick(
            &table,
            "GET",
            "/api/x",
            &[("x-canary", "yes"), ("x-user", "a")]
        )
        .unwrap(),
        "r/two-headers"
    );
    assert_eq!(
        pick(&table, "GET", "/api/x", &[("X-Canary", "yes")]).unwrap(),
        "r/header"
    );
    assert_eq!(
        pick(&table, "GET", "/api/x?a=b&debug=1", &[]).unwrap(),
        "r/query"
    );
    assert_eq!(pick(&table, "GET", "/api/x", &[]).unwrap(), "r/longer");
    // The longer prefix outranks a regex that matches too.
    assert_eq!(
        pick(&table, "GET", "/api/v2/items", &[]).unwrap(),
        "r/longer"
    );
    assert_eq!(pick(&table, "GET", "/other", &[]).unwrap(), "r/prefix");
}

/// Ties go to the oldest route, then to `namespace/name`, then to rule order.
#[test]
fn ties_go_to_the_oldest_route_then_the_name_then_rule_order() {
    let rules = |name: &str| json!([{"name": name, "matches": [{"path": {"value": "/x"}}]}]);
    let mut older = http_route("zeta", rules("a"));
    older.created = "2026-01-01T00:00:00Z".into();
    let mut newer = http_route("alpha", rules("a"));
    newer.created = "2026-02-01T00:00:00Z".into();
    let table = RouteTable::new([newer.clone(), older]);
    assert_eq!(pick(&table, "GET", "/x", &[]).unwrap(), "zeta/a");
    let mut same_age = http_route("beta", rules("a"));
    same_age.created = newer.created.clone();
    let table = RouteTable::new([same_age, newer]);
    assert_eq!(pick(&table, "GET", "/x", &[]).unwrap(), "alpha/a");
    let table = RouteTable::new([http_route(
        "r",
        json!([
            {"name": "first", "matches": [{"path": {"value": "/x"}}]},
            {"name": "second", "matches": [{"path": {"value": "/x"}}]},
        ]),
    )]);
    assert_eq!(pick(&table, "GET", "/x", &[]).unwrap(), "r/first");
}

#[test]
fn header_query_and_regex_matches() {
    let table = RouteTable::new([http_route(
        "r",
        json!([
            {"name": "re-header", "matches": [{"headers": [
                {"type": "RegularExpression", "name": "x-version", "value": "v[23]"}]}]},
            {"name": "re-query", "matches": [{"queryParams": [
                {"type": "RegularExpression", "name": "id", "value": "[0-9]+"}]}]},
            {"name": "re-path", "matches": [{"path": {"type": "RegularExpression", "value": "/items/[a-z]+"}}]},
        ]),
    )]);
    assert_eq!(
        pick(&table, "GET", "/", &[("x-version", "v3")]).unwrap(),
        "r/re-header"
    );
    // Regexes match the whole value.
    assert_eq!(pick(&table, "GET", "/", &[("x-version", "v33")]), None);
    assert_eq!(pick(&table, "GET", "/?id=42", &[]).unwrap(), "r/re-query");
    assert_eq!(pick(&table, "GET", "/?id=42x", &[]), None);
    assert_eq!(pick(&table, "GET", "/items/abc", &[]).unwrap(), "r/re-path");
    assert_eq!(pick(&table, "GET", "/items/abc/def", &[]), None);
}

/// Several matches in one rule are ORed; conditions within a match are ANDed.
#[test]
fn matches_or_conditions_and() {
    let table = RouteTable::new([http_route(
        "r",
        json!([{"name": "r", "matches": [
            {"path": {"type": "Exact", "value": "/a"}, "method": "GET"},
            {"headers": [{"name": "x-b", "value": "1"}]},
        ]}]),
    )]);
    assert!(pick(&table, "GET", "/a", &[]).is_some());
    assert!(pick(&table, "POST", "/a", &[]).is_none());
    assert!(pick(&table, "POST", "/zzz", &[("x-b", "1")]).is_some());
}

#[test]
fn parent_port_limits_the_route_to_that_port() {
    let table = RouteTable::new([http_route("r", json!([{}]))]);
    let h = http::HeaderMap::new();
    let request = RequestView {
        method: "GET",
        path: "/",
        query: None,
        headers: &h,
    };
    assert!(table.http(("shop", "echo"), 80, &request).is_some());
    assert!(table.http(("shop", "echo"), 81, &request).is_none());
    assert!(table.has_http(("shop", "echo"), 80));
    assert!(!table.has_http(("shop", "echo"), 81));
    assert!(table.http(("shop", "other"), 80, &request).is_none());
}

#[test]
fn grpc_method_matches() {
    let table = RouteTable::new([route(
        "GRPCRoute",
        "g",
        json!([
            {"name": "exact", "matches": [{"method": {"service": "helloworld.Greeter", "method": "SayHello"}}]},
            {"name": "service", "matches": [{"method": {"service": "helloworld.Greeter"}}]},
            {"name": "method-only", "matches": [{"method": {"method": "Check"}}]},
            {"name": "regex", "matches": [{"method": {"type": "RegularExpression", "service": "grpc\\.health\\..*"}}]},
        ]),
    )]);
    assert_eq!(
        pick(&table, "POST", "/helloworld.Greeter/SayHello", &[]).unwrap(),
        "g/exact"
    );
    assert_eq!(
        pick(&table, "POST", "/helloworld.Greeter/SayBye", &[]).unwrap(),
        "g/service"
    );
    assert_eq!(
        pick(&table, "POST", "/x.Y/Check", &[]).unwrap(),
        "g/method-only"
    );
    assert_eq!(
        pick(&table, "POST", "/grpc.health.v1.Health/Watch", &[]).unwrap(),
        "g/regex"
    );
    assert_eq!(pick(&table, "POST", "/other.Svc/Call", &[]), None);
}

#[test]
fn tcp_route_takes_the_connection() {
    let table = RouteTable::new([route(
        "TCPRoute",
        "t",
        json!([{"backendRefs": [{"name": "v2", "port": 9000, "weight": 3}]}]),
    )]);
    let s = table.tcp(("shop", "echo"), 80).unwrap();
    assert_eq!(s.rule.backends[0].service.to_string(), "shop/v2:9000");
    assert_eq!(s.rule.backends[0].weight, 3);
    assert!(table.tcp(("shop", "echo"), 81).is_none());
}

#[test]
fn filters_compile() {
    let r = http_route(
        "r",
        json!([{
            "matches": [{"path": {"type": "PathPrefix", "value": "/old"}}],
            "filters": [
                {"type": "RequestHeaderModifier", "requestHeaderModifier": {
                    "set": [{"name": "X-Set", "value": "1"}], "add": [{"name": "x-add", "value": "2"}],
                    "remove": ["X-Gone"]}},
                {"type": "ResponseHeaderModifier", "responseHeaderModifier": {"set": [{"name": "x-r", "value": "3"}]}},
                {"type": "URLRewrite", "urlRewrite": {"hostname": "new.example", "path": {
                    "type": "ReplacePrefixMatch", "replacePrefixMatch": "/new"}}},
                {"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "shadow", "port": 80}, "percent": 25}},
            ],
            "backendRefs": [{"name": "v1", "port": 80, "weight": 90}, {"name": "v2", "port": 80, "weight": 10}],
            "timeouts": {"request": "2s", "backendRequest": "500ms"},
            "retry": {"attempts": 3, "codes": [503], "backoff": "10ms"},
        }]),
    );
    let rule = &r.rules[0];
    assert_eq!(rule.filters.len(), 4);
    let Filter::RequestHeaders(m) = &rule.filters[0] else {
        panic!()
    };
    assert_eq!(m.set, [("x-set".to_string(), "1".to_string())]);
    assert_eq!(m.remove, ["x-gone"]);
    let Filter::Mirror(mirror) = &rule.filters[3] else {
        panic!()
    };
    assert_eq!(mirror.fraction, 0.25);
    assert_eq!(
        rule.timeouts,
        Timeouts {
            request: Some(Duration::from_secs(2)),
            backend_request: Some(Duration::from_millis(500)),
        }
    );
    assert_eq!(
        rule.retry,
        Some(Retry {
            attempts: Some(3),
            codes: vec![503],
            backoff: Some(Duration::from_millis(10)),
        })
    );
    assert!(rule.unsupported.is_none());
}

/// A filter the waypoint does not implement is not skipped: the rule answers 500.
/// A backend that is not a Service answers 500 for its share.
#[test]
fn unsupported_filters_and_backends_are_kept_as_such() {
    let r = http_route(
        "r",
        json!([{
            "filters": [{"type": "ExtensionRef", "extensionRef": {"group": "x", "kind": "Y", "name": "z"}}],
            "backendRefs": [{"group": "example.com", "kind": "Bucket", "name": "b"}],
        }]),
    );
    assert!(r.rules[0]
        .unsupported
        .as_deref()
        .unwrap()
        .contains("ExtensionRef"));
    assert!(r.rules[0].backends[0]
        .unsupported
        .as_deref()
        .unwrap()
        .contains("Bucket"));
}

#[test]
fn bad_routes_are_refused_with_the_reason() {
    for (spec, reason) in [
        (
            json!({"rules": [{"matches": [{"path": {"type": "RegularExpression", "value": "(unclosed"}}]}]}),
            "invalid regular expression",
        ),
        (
            json!({"rules": [{"matches": [{"path": {"type": "Exact", "value": "relative"}}]}]}),
            "does not start with /",
        ),
        (
            json!({"rules": [{"matches": [{"path": {"type": "Glob", "value": "/x"}}]}]}),
            "unknown path match type",
        ),
        (
            json!({"rules": [{"matches": [{"headers": [{"name": "bad header", "value": "1"}]}]}]}),
            "invalid header name",
        ),
        (
            json!({"rules": [{"timeouts": {"request": "ten seconds"}}]}),
            "invalid duration",
        ),
        (
            json!({"rules": [{"timeouts": {"request": "1s", "backendRequest": "2s"}}]}),
            "longer than",
        ),
        (
            json!({"rules": [{"retry": {"codes": [200]}}]}),
            "not between 400 and 599",
        ),
        (
            json!({"rules": [{"matches": [{"path": {"type": "Exact", "value": "/x"}}],
            "filters": [{"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/y"}}}]}]}),
            "ReplacePrefixMatch needs",
        ),
        (
            json!({"rules": [{"filters": [{"type": "RequestRedirect", "requestRedirect": {"statusCode": 200}}]}]}),
            "not a redirect",
        ),
        (json!({"rules": "not a list"}), "does not parse"),
    ] {
        let err = Route::from_spec("HTTPRoute", "shop", "r", &spec.to_string()).unwrap_err();
        assert!(err.to_string().contains(reason), "{err} (wanted {reason})");
    }
    assert!(matches!(
        Route::from_spec("UDPRoute", "shop", "r", "{}"),
        Err(RouteError::Kind(_))
    ));
    // A pattern whose automaton is too large is refused, not built.
    let huge = json!({"rules": [{"matches": [{"path": {"type": "RegularExpression", "value": "(a{1000}){1000}"}}]}]});
    assert!(Route::from_spec("HTTPRoute", "shop", "r", &huge.to_string()).is_err());
}

#[test]
fn gateway_api_durations() {
    for (text, want) in [
        ("0s", Duration::ZERO),
        ("10s", Duration::from_secs(10)),
        ("500ms", Duration::from_millis(500)),
        ("1h30m", Duration::from_secs(5400)),
        ("1m30s500ms", Duration::from_millis(90_500)),
    ] {
        assert_eq!(gateway_duration(text).unwrap(), want, "{text}");
    }
    for bad in ["", "10", "s", "1.5s", "-1s", "100000s", "1h1h1h1h1h", "1d"] {
        assert!(gateway_duration(bad).is_err(), "{bad}");
    }
}
