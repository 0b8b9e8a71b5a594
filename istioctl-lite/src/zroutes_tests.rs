//! The rows of `ztunnel-config route`: how rules are ordered and written.

use super::*;
use serde_json::{json, Value};

fn route(kind: &str, namespace: &str, name: &str, created: &str, spec: Value) -> WaypointRoute {
    WaypointRoute {
        creation_timestamp: created.into(),
        generation: 1,
        kind: kind.into(),
        name: name.into(),
        namespace: namespace.into(),
        spec,
    }
}

fn parent(name: &str) -> Value {
    json!({"group": "", "kind": "Service", "name": name})
}

/// The (RULE, MATCHES, FILTERS, BACKENDS) cells.
fn cells(routes: &[WaypointRoute]) -> Vec<[String; 4]> {
    rows(routes)
        .into_iter()
        .map(|r| {
            assert_eq!(r.len(), HEADER.len(), "{r:?}");
            [r[4].clone(), r[5].clone(), r[6].clone(), r[7].clone()]
        })
        .collect()
}

#[test]
fn rules_are_in_precedence_order_per_service() {
    let older = route(
        "HTTPRoute",
        "demo",
        "b-older",
        "2025-01-01T00:00:00Z",
        json!({"parentRefs": [parent("web")], "rules": [
            {"matches": [{"path": {"type": "PathPrefix", "value": "/api"}}]},
        ]}),
    );
    let newer = route(
        "HTTPRoute",
        "demo",
        "a-newer",
        "2025-06-01T00:00:00Z",
        json!({"parentRefs": [parent("web")], "rules": [
            {"name": "catch-all"},
            {"name": "same-as-older", "matches": [{"path": {"type": "PathPrefix", "value": "/api"}}]},
            {"name": "exact", "matches": [
                {"path": {"type": "PathPrefix", "value": "/"}},
                {"path": {"type": "Exact", "value": "/api/login"}},
            ]},
            {"name": "regex", "matches": [{"path": {"type": "RegularExpression", "value": "/v[0-9]+/.*"}}]},
            {"name": "long-prefix", "matches": [{"path": {"type": "PathPrefix", "value": "/api/v1"}, "method": "POST"}]},
        ]}),
    );
    let got: Vec<String> = cells(&[newer, older])
        .into_iter()
        .map(|c| c[0].clone())
        .collect();
    assert_eq!(
        got,
        [
            // Its Exact match ranks the rule first.
            "demo.a-newer.exact",
            "demo.a-newer.long-prefix",
            // Equal prefixes: the older route first.
            "demo.b-older.0",
            "demo.a-newer.same-as-older",
            "demo.a-newer.catch-all",
            "demo.a-newer.regex",
        ]
    );
}

#[test]
fn matches_filters_and_backends_are_compact() {
    let r = route(
        "HTTPRoute",
        "demo",
        "web",
        "",
        json!({"parentRefs": [parent("web"), {"group": "", "kind": "Service", "name": "web", "namespace": "other", "port": 8080}], "rules": [{
            "matches": [
                {"path": {"type": "Exact", "value": "/x"}, "method": "GET"},
                {"headers": [{"name": "X-V", "value": "v2"}, {"type": "RegularExpression", "name": "x-r", "value": "a.*"}],
                 "queryParams": [{"name": "a", "value": "b"}]},
                {"path": {"type": "RegularExpression", "value": "/v[0-9]+"}},
            ],
            "filters": [
                {"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "x", "value": "1"}]}},
                {"type": "ExtensionRef", "extensionRef": {"group": "g", "kind": "K", "name": "n"}},
            ],
            "backendRefs": [
                {"name": "v1", "port": 80, "weight": 3},
                {"name": "v2", "namespace": "other", "weight": 0,
                 "filters": [{"type": "ResponseHeaderModifier", "responseHeaderModifier": {"remove": ["x"]}}]},
                {"group": "example.com", "kind": "Bucket", "name": "b", "port": 1},
            ],
        }]}),
    );
    let rows = rows(&[r]);
    // One row per parent, each parent as the waypoint keys it.
    let parents: Vec<&str> = rows.iter().map(|r| r[3].as_str()).collect();
    assert_eq!(parents, ["demo/web", "other/web:8080"]);
    assert_eq!(
        rows[0][4..],
        [
            "demo.web.0",
            "Exact /x GET | hdr x-v=v2 hdr x-r~a.* query a=b | Regex /v[0-9]+",
            "RequestHeaderModifier,UNSUPPORTED",
            "v1:80=3,other/v2=0[ResponseHeaderModifier],b:1=1[UNSUPPORTED]",
        ]
    );
}

#[test]
fn grpc_tcp_and_routes_without_rules_or_services() {
    let grpc = route(
        "GRPCRoute",
        "demo",
        "rpc",
        "",
        json!({"parentRefs": [parent("rpc")], "rules": [
            {"matches": [{"method": {"service": "pkg.Svc", "method": "Get"}}], "backendRefs": [{"name": "rpc-v2", "port": 50051}]},
            {"matches": [{"method": {"method": "List"}}]},
        ]}),
    );
    let tcp = route(
        "TCPRoute",
        "demo",
        "db",
        "",
        json!({"parentRefs": [parent("rpc")], "rules": [{"backendRefs": [{"name": "db", "port": 5432}]}]}),
    );
    let empty = route(
        "HTTPRoute",
        "demo",
        "empty",
        "",
        json!({"parentRefs": [parent("rpc")]}),
    );
    let gateway_only = route(
        "HTTPRoute",
        "demo",
        "ingress",
        "",
        json!({"parentRefs": [{"name": "gw"}], "rules": [{}]}),
    );
    let rows = rows(&[gateway_only, tcp, empty, grpc]);
    let got: Vec<Vec<&str>> = rows
        .iter()
        .map(|r| r[2..].iter().map(String::as_str).collect())
        .collect();
    assert_eq!(
        got,
        [
            // The Service's HTTP and gRPC rules, its routes without rules, then TCP.
            vec![
                "GRPCRoute",
                "demo/rpc",
                "demo.rpc.0",
                "Exact /pkg.Svc/Get",
                "-",
                "rpc-v2:50051=1"
            ],
            vec![
                "GRPCRoute",
                "demo/rpc",
                "demo.rpc.1",
                "Regex /[^/]+/List",
                "-",
                "(parent)"
            ],
            vec!["HTTPRoute", "demo/rpc", "-", "(no rules)", "-", "-"],
            vec!["TCPRoute", "demo/rpc", "demo.db.0", "*", "-", "db:5432=1"],
            // Bound to no Service: the waypoint never applies it.
            vec!["HTTPRoute", "-", "demo.ingress.0", "*", "-", "(parent)"],
        ]
    );
}

#[test]
fn routes_that_do_not_compile_are_one_invalid_row_each() {
    let routes = [
        route(
            "HTTPRoute",
            "demo",
            "bad-regex",
            "",
            json!({"parentRefs": [parent("web")], "rules": [
                {"matches": [{"path": {"type": "RegularExpression", "value": "(["}}]},
            ]}),
        ),
        route("UDPRoute", "demo", "udp", "", json!({})),
        route("HTTPRoute", "demo", "not-an-object", "", json!("spec")),
        route("", "", "", "", Value::Null),
        route(
            "HTTPRoute",
            "demo",
            "ok",
            "",
            json!({"parentRefs": [parent("web")], "rules": [{}]}),
        ),
    ];
    let rows = rows(&routes);
    assert_eq!(rows.len(), 5, "{rows:?}");
    assert_eq!(rows[0][1], "ok");
    for row in &rows[1..] {
        assert_eq!(row[3..5], ["-", "-"], "{row:?}");
        assert!(row[5].starts_with("INVALID: "), "{row:?}");
        assert!(row.iter().all(|c| !c.contains('\n')), "{row:?}");
    }
    assert!(
        rows[1][5].contains("rule 0: invalid regular expression \"([\""),
        "{:?}",
        rows[1]
    );
    assert!(
        rows[2][5].contains("unknown route kind \"UDPRoute\""),
        "{:?}",
        rows[2]
    );
    assert!(
        rows[3][5].contains("the spec does not parse"),
        "{:?}",
        rows[3]
    );
    assert_eq!(rows[4][..3], ["-", "-", "-"]);
}

#[test]
fn control_characters_stay_on_the_line() {
    let r = route(
        "HTTPRoute",
        "demo",
        "web",
        "",
        json!({"parentRefs": [parent("web")], "rules": [
            {"matches": [{"path": {"type": "Exact", "value": "/a\nb\tc"}}]},
        ]}),
    );
    assert_eq!(rows(&[r])[0][5], "Exact /a\\nb\\tc");
}
