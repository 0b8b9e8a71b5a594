use std::time::Duration;

use http::{HeaderMap, Uri};
use mesh_model::route::{Backend, Route, ServiceRef};
use serde_json::json;

use super::*;

fn rule_of(rules: serde_json::Value) -> mesh_model::route::Rule {
    let spec =
        json!({"parentRefs": [{"group": "", "kind": "Service", "name": "echo"}], "rules": rules});
    Route::from_spec("HTTPRoute", "shop", "r", &spec.to_string())
        .unwrap()
        .rules
        .remove(0)
}

#[test]
fn header_modifier_sets_adds_and_removes() {
    let rule = rule_of(
        json!([{"filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {
        "set": [{"name": "x-set", "value": "new"}],
        "add": [{"name": "x-add", "value": "two"}, {"name": "x-fresh", "value": "1"}],
        "remove": ["x-gone"]}}]}]),
    );
    let mesh_model::route::Filter::RequestHeaders(m) = &rule.filters[0] else {
        panic!()
    };
    let mut headers = HeaderMap::new();
    headers.insert("x-set", "old".parse().unwrap());
    headers.insert("x-add", "one".parse().unwrap());
    headers.insert("x-gone", "bye".parse().unwrap());
    modify_headers(m, &mut headers);
    assert_eq!(headers["x-set"], "new");
    assert_eq!(headers["x-add"], "one,two");
    assert_eq!(headers["x-fresh"], "1");
    assert!(!headers.contains_key("x-gone"));
}

/// The spec's redirect examples: the port from the filter, the scheme's well-known
/// one, or the Service's; a prefix replaced; the query kept.
#[test]
fn redirect_locations() {
    let redirect = |filter: serde_json::Value| {
        let rule = rule_of(
            json!([{"matches": [{"path": {"type": "PathPrefix", "value": "/old"}}],
            "filters": [{"type": "RequestRedirect", "requestRedirect": filter}]}]),
        );
        let mesh_model::route::Filter::Redirect(r) = &rule.filters[0] else {
            panic!()
        };
        let mut headers = HeaderMap::new();
        headers.insert("host", "echo.shop:8080".parse().unwrap());
        let uri: Uri = "/old/page?x=1".parse().unwrap();
        redirect_location(r, &uri, &headers, rule.matches.first(), 8080)
    };
    assert_eq!(redirect(json!({})), "http://echo.shop:8080/old/page?x=1");
    assert_eq!(
        redirect(json!({"scheme": "https"})),
        "https://echo.shop/old/page?x=1"
    );
    assert_eq!(
        redirect(json!({"hostname": "example.com", "port": 80})),
        "http://example.com/old/page?x=1"
    );
    assert_eq!(
        redirect(json!({"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/new"}})),
        "http://echo.shop:8080/new/page?x=1"
    );
    assert_eq!(
        redirect(json!({"path": {"type": "ReplaceFullPath", "replaceFullPath": "/moved"}})),
        "http://echo.shop:8080/moved?x=1"
    );
}

#[test]
fn rewrites_replace_the_matched_prefix_or_the_whole_path() {
    let rewrite_to = |path: serde_json::Value, uri: &str| {
        let rule = rule_of(
            json!([{"matches": [{"path": {"type": "PathPrefix", "value": "/old/"}}],
            "filters": [{"type": "URLRewrite", "urlRewrite": {"hostname": "new.host", "path": path}}]}]),
        );
        let mesh_model::route::Filter::Rewrite(r) = &rule.filters[0] else {
            panic!()
        };
        let (mut parts, ()) = http::Request::get(uri).body(()).unwrap().into_parts();
        rewrite(r, &mut parts, rule.matches.first());
        assert_eq!(parts.headers["host"], "new.host");
        parts.uri.to_string()
    };
    let prefix = json!({"type": "ReplacePrefixMatch", "replacePrefixMatch": "/new"});
    assert_eq!(rewrite_to(prefix.clone(), "/old/a/b?q=1"), "/new/a/b?q=1");
    assert_eq!(rewrite_to(prefix, "/old"), "/new");
    let root = json!({"type": "ReplacePrefixMatch", "replacePrefixMatch": "/"});
    assert_eq!(rewrite_to(root.clone(), "/old/a"), "/a");
    assert_eq!(rewrite_to(root, "/old"), "/");
    let full = json!({"type": "ReplaceFullPath", "replaceFullPath": "/fixed"});
    assert_eq!(rewrite_to(full, "/old/a?q=1"), "/fixed?q=1");
}

fn backend(name: &str, weight: u32) -> Backend {
    Backend {
        service: ServiceRef {
            namespace: "shop".into(),
            name: name.into(),
            port: None,
        },
        weight,
        filters: Vec::new(),
        unsupported: None,
    }
}

/// A 90/10 split over many picks lands within a percent or so of 90/10; weight 0
/// is never picked; all weights 0 picks nothing.
#[test]
fn weighted_backends() {
    let backends = [backend("v1", 90), backend("v2", 10), backend("never", 0)];
    let mut v2 = 0;
    for _ in 0..100_000 {
        match pick_backend(&backends).unwrap().service.name.as_str() {
            "v2" => v2 += 1,
            "v1" => {}
            other => panic!("picked {other}"),
        }
    }
    assert!((9_000..11_000).contains(&v2), "{v2}");
    assert!(pick_backend(&[backend("a", 0)]).is_none());
    assert!(pick_backend(&[]).is_none());
}

#[test]
fn retry_policy_defaults_to_istios() {
    let default = RetryPolicy::of(None);
    assert_eq!(default.attempts, 2);
    assert_eq!(default.codes, [503]);
    let rule =
        rule_of(json!([{"retry": {"attempts": 4, "codes": [500, 502], "backoff": "100ms"}}]));
    let explicit = RetryPolicy::of(rule.retry.as_ref());
    assert_eq!(explicit.attempts, 4);
    assert_eq!(explicit.codes, [500, 502]);
    // Codes without attempts: Istio's number of attempts.
    let rule = rule_of(json!([{"retry": {"codes": [500]}}]));
    assert_eq!(RetryPolicy::of(rule.retry.as_ref()).attempts, 2);
    // Doubling, with jitter down to half, capped at ten times the back-off.
    for n in 1..8 {
        let wait = explicit.wait(n);
        let full = Duration::from_millis(100 * (1 << (n - 1).min(4))).min(Duration::from_secs(1));
        assert!(wait <= full && wait >= full / 2, "retry {n}: {wait:?}");
    }
}

/// Retries in flight to one backend: at least 3, else 20 % of its requests.
#[test]
fn retry_budget() {
    let budget = RetryBudget::default();
    let mut guards: Vec<_> = (0..10).map(|_| budget.request("shop/echo")).collect();
    let allowed = guards
        .iter_mut()
        .map(|g| g.retry())
        .filter(|ok| *ok)
        .count();
    assert_eq!(allowed, 3);
    // A request already retrying keeps its slot.
    assert!(guards[0].retry());
    let mut more: Vec<_> = (0..40).map(|_| budget.request("shop/echo")).collect();
    let allowed = more.iter_mut().map(|g| g.retry()).filter(|ok| *ok).count();
    assert_eq!(allowed, 50 * 20 / 100 - 3);
    // Another backend has its own budget.
    assert!(budget.request("shop/other").retry());
    drop(guards);
    drop(more);
    assert!(budget.inflight.lock().unwrap().is_empty());
}
