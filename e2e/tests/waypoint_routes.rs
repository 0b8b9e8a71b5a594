//! Gateway API routes at the waypoint (see `local_cluster::waypoint`): HTTPRoutes and
//! a TCPRoute bound to the echo Service, applied from the waypoint's object file,
//! between two standalone ztunnels. The backends are real servers in B (`echo`,
//! `echo-v1`, `echo-v2`) that say who answered, count what they got, and answer as a
//! request's `x-e2e-*` headers ask (a status, a delay, a reset).

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use local_cluster::mesh::{metric_sum, ztunnel_metrics};
use local_cluster::standalone::SERVICE_VIP;
use local_cluster::waypoint::*;
use test_support::http::KeepAlive;
use test_support::poll::wait_for;

/// An HTTPRoute `name` bound to the echo Service's HTTP port, with `rules` (YAML, a
/// list indented under `rules:`).
fn http_route(name: &str, rules: &str) -> String {
    format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: vms}}\nspec:\n  parentRefs: [{{group: \"\", kind: Service, name: echo, port: {HTTP_PORT}}}]\n  rules:\n{rules}\n"
    )
}

fn split(v1: u32, v2: u32) -> String {
    http_route(
        "split",
        &format!("  - backendRefs: [{{name: echo-v1, port: {HTTP_PORT}, weight: {v1}}}, {{name: echo-v2, port: {HTTP_PORT}, weight: {v2}}}]"),
    )
}

/// The `server` that answered.
fn server(body: &str) -> Result<String> {
    let seen: serde_json::Value = serde_json::from_str(body).with_context(|| body.to_owned())?;
    Ok(seen["server"].as_str().unwrap_or_default().to_owned())
}

/// A mesh whose waypoint has `objects`, with the version servers running, once a
/// request goes through.
fn mesh(tag: &str, objects: &str) -> Result<WaypointMesh> {
    let mut wp = WaypointMesh::new(tag, objects)?;
    wp.start_versions(&[])?;
    // The first request may race the ztunnels' reload of the config naming the waypoint.
    wait_for(
        "a request through the waypoint",
        Duration::from_secs(10),
        || {
            wp.request("GET", "/ready", &[])
                .ok()
                .filter(|(s, _)| *s != 503)
        },
    )?;
    Ok(wp)
}

/// How many requests carrying `x-e2e-key: key` the server `version` got (asked
/// through a header-matched rule that sends to it).
fn count(client: &mut KeepAlive, version: &str, key: &str) -> Result<u64> {
    let answer = client.request(
        "GET",
        &format!("/e2e/count?key={key}"),
        &[&format!("x-count-at: {version}")],
    )?;
    let seen: serde_json::Value = serde_json::from_str(&answer.body)?;
    seen["count"].as_u64().context("no count")
}

/// Each match type, the spec's precedence, each filter, and what has no route.
#[test]
fn routes_match_filter_and_redirect_as_the_spec_says() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let rules = format!(
        r#"  - name: by-header
    matches: [{{headers: [{{name: x-version, value: v2}}]}}]
    backendRefs: [{{name: echo-v2, port: {HTTP_PORT}}}]
  - name: by-query
    matches: [{{path: {{type: PathPrefix, value: /v1}}, queryParams: [{{name: canary, value: "1"}}]}}]
    backendRefs: [{{name: echo-v2, port: {HTTP_PORT}}}]
  - name: v1-prefix
    matches: [{{path: {{type: PathPrefix, value: /v1}}}}]
    filters:
    - type: URLRewrite
      urlRewrite: {{path: {{type: ReplacePrefixMatch, replacePrefixMatch: /api}}}}
    - type: RequestHeaderModifier
      requestHeaderModifier: {{set: [{{name: x-routed, value: v1}}], remove: [x-secret]}}
    - type: ResponseHeaderModifier
      responseHeaderModifier: {{add: [{{name: x-served-by, value: waypoint}}]}}
    backendRefs: [{{name: echo-v1, port: {HTTP_PORT}}}]
  - name: exact
    matches: [{{path: {{type: Exact, value: /v1/exact}}}}]
    backendRefs: [{{name: echo, port: {HTTP_PORT}}}]
  - name: regex
    matches: [{{path: {{type: RegularExpression, value: "/items/[0-9]+"}}, method: GET}}]
    backendRefs: [{{name: echo-v2, port: {HTTP_PORT}}}]
  - name: moved
    matches: [{{path: {{type: PathPrefix, value: /old}}}}]
    filters:
    - type: RequestRedirect
      requestRedirect: {{path: {{type: ReplacePrefixMatch, replacePrefixMatch: /new}}, statusCode: 302}}
  - name: custom
    matches: [{{path: {{type: PathPrefix, value: /custom}}}}]
    filters: [{{type: ExtensionRef, extensionRef: {{group: example.com, kind: Plugin, name: x}}}}]
  - name: missing
    matches: [{{path: {{type: PathPrefix, value: /missing}}}}]
    backendRefs: [{{name: no-such-service, port: {HTTP_PORT}}}]
  - name: parent
    matches: [{{path: {{type: PathPrefix, value: /parent}}}}]"#
    );
    let wp = mesh("wrm", &http_route("shop", &rules))?;
    wp.with_client(|c| {
        // Header match, over every path.
        let r = c.request("GET", "/anything", &["x-version: v2"])?;
        ensure!(r.status == 200 && server(&r.body)? == "v2", "{r:?}");
        // Query match outranks the same prefix without one.
        let r = c.request("GET", "/v1/x?canary=1", &[])?;
        ensure!(server(&r.body)? == "v2", "{r:?}");
        // Prefix by path elements, rewritten, headers set and removed, response header
        // added; W3C trace context passes through untouched.
        let traceparent = "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let r = c.request(
            "GET",
            "/v1/users?q=1",
            &["x-secret: s", traceparent, "baggage: k=v"],
        )?;
        let seen: serde_json::Value = serde_json::from_str(&r.body)?;
        ensure!(
            seen["server"] == "v1" && seen["path"] == "/api/users",
            "{r:?}"
        );
        ensure!(seen["query"] == "q=1", "{r:?}");
        ensure!(seen["headers"]["x-routed"] == "v1", "{r:?}");
        ensure!(seen["headers"].get("x-secret").is_none(), "{r:?}");
        ensure!(
            seen["headers"]["traceparent"] == traceparent["traceparent: ".len()..],
            "{r:?}"
        );
        ensure!(seen["headers"]["baggage"] == "k=v", "{r:?}");
        ensure!(r.header("x-served-by") == Some("waypoint"), "{r:?}");
        // `/v1x` is not under the prefix `/v1`.
        let r = c.request("GET", "/v1x", &[])?;
        ensure!(r.status == 404, "{r:?}");
        // Exact outranks the prefix that also matches.
        let r = c.request("GET", "/v1/exact", &[])?;
        ensure!(server(&r.body)? == "echo", "{r:?}");
        // Regex with a method.
        let r = c.request("GET", "/items/42", &[])?;
        ensure!(server(&r.body)? == "v2", "{r:?}");
        let r = c.request("POST", "/items/42", &[])?;
        ensure!(r.status == 404, "a regex rule for GET only: {r:?}");
        // Redirect: the matched prefix replaced, the Service's port kept.
        let r = c.request("GET", "/old/page?x=1", &[])?;
        ensure!(r.status == 302, "{r:?}");
        let location = r.header("location").unwrap_or_default();
        ensure!(
            location.ends_with(&format!(":{HTTP_PORT}/new/page?x=1")),
            "{r:?}"
        );
        // A filter the waypoint does not implement, a backend that does not exist.
        let r = c.request("GET", "/custom", &[])?;
        ensure!(r.status == 500, "{r:?}");
        let r = c.request("GET", "/missing", &[])?;
        ensure!(r.status == 500, "{r:?}");
        // No backendRefs: the Service addressed.
        let r = c.request("GET", "/parent", &[])?;
        ensure!(r.status == 200 && server(&r.body)? == "echo", "{r:?}");
        // Routes are bound and none matches: 404.
        let r = c.request("GET", "/nowhere", &[])?;
        ensure!(r.status == 404, "{r:?}");
        Ok(())
    })?;
    // Per-route labels, and the backend as the destination.
    let w = ztunnel_metrics(&wp.w)?;
    let requests = |route: &str, service: &str, code: &str| {
        metric_sum(
            &w,
            "istio_requests_total",
            &[
                ("reporter", "waypoint"),
                ("route_name", route),
                ("destination_service", service),
                ("response_code", code),
            ],
        )
    };
    assert_eq!(
        requests("vms.shop.v1-prefix", "echo-v1.vms.svc.cluster.local", "200"),
        1.0,
        "{w}"
    );
    assert_eq!(
        requests("vms.shop.by-header", "echo-v2.vms.svc.cluster.local", "200"),
        1.0,
        "{w}"
    );
    assert!(
        metric_sum(
            &w,
            "istio_requests_total",
            &[("response_code", "404"), ("response_flags", "NR")]
        ) >= 3.0,
        "{w}"
    );
    Ok(())
}

/// A 90/10 split measured over 10,000 requests; then the route changes while
/// requests are in flight, and none is lost.
#[test]
fn a_weighted_split_holds_and_a_route_change_loses_no_request() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let wp = mesh("wrs", &split(90, 10))?;
    let v2 = wp.with_client(|c| {
        let mut v2 = 0;
        for _ in 0..10_000 {
            let r = c.request("GET", "/split", &[])?;
            ensure!(r.status == 200, "{r:?}");
            if server(&r.body)? == "v2" {
                v2 += 1;
            }
        }
        Ok(v2)
    })?;
    // 10 % is 1000; ±3 % of the requests is ±300 (the binomial spread is about 30).
    assert!((700..=1300).contains(&v2), "v2 took {v2} of 10000");

    // Four clients keep sending while the split moves to v2 only.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (sent, failed) = std::thread::scope(|s| -> Result<(u64, u64)> {
        let clients: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    wp.with_client(|c| {
                        let (mut sent, mut failed) = (0u64, 0u64);
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                            sent += 1;
                            if !c
                                .request("GET", "/moving", &[])
                                .is_ok_and(|r| r.status == 200)
                            {
                                failed += 1;
                            }
                        }
                        Ok((sent, failed))
                    })
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        wp.set_objects(&split(0, 1))?;
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut total = (0, 0);
        for c in clients {
            let (sent, failed) = c.join().expect("client thread")?;
            total = (total.0 + sent, total.1 + failed);
        }
        Ok(total)
    })?;
    assert!(sent > 100, "only {sent} requests in flight");
    assert_eq!(failed, 0, "{failed} of {sent} lost while the route changed");
    wp.with_client(|c| {
        for _ in 0..50 {
            let r = c.request("GET", "/after", &[])?;
            ensure!(server(&r.body)? == "v2", "{r:?}");
        }
        Ok(())
    })
}

/// Retries and timeouts against servers that fail, reset and stall: the attempts are
/// counted at the server; wall times are only bounded loosely.
#[test]
fn retries_and_timeouts_count_attempts() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let rules = format!(
        r#"  - name: count-v1
    matches: [{{headers: [{{name: x-count-at, value: v1}}]}}]
    retry: {{attempts: 0}}
    backendRefs: [{{name: echo-v1, port: {HTTP_PORT}}}]
  - name: count-v2
    matches: [{{headers: [{{name: x-count-at, value: v2}}]}}]
    retry: {{attempts: 0}}
    backendRefs: [{{name: echo-v2, port: {HTTP_PORT}}}]
  - name: retry-3
    matches: [{{path: {{value: /retry3}}}}]
    retry: {{attempts: 3, codes: [500, 503], backoff: 10ms}}
    backendRefs: [{{name: echo-v1, port: {HTTP_PORT}}}]
  - name: no-retry
    matches: [{{path: {{value: /once}}}}]
    retry: {{attempts: 0}}
    backendRefs: [{{name: echo-v1, port: {HTTP_PORT}}}]
  - name: istio-default
    matches: [{{path: {{value: /default}}}}]
    backendRefs: [{{name: echo-v1, port: {HTTP_PORT}}}]
  - name: deadline
    matches: [{{path: {{value: /slow}}}}]
    timeouts: {{request: 500ms}}
    backendRefs: [{{name: echo-v2, port: {HTTP_PORT}}}]
  - name: per-try
    matches: [{{path: {{value: /per-try}}}}]
    timeouts: {{request: 5s, backendRequest: 200ms}}
    retry: {{attempts: 2, backoff: 10ms}}
    backendRefs: [{{name: echo-v2, port: {HTTP_PORT}}}]
  - name: budget
    matches: [{{path: {{value: /budget}}}}]
    retry: {{attempts: 5, codes: [503], backoff: 10ms}}
    backendRefs: [{{name: echo-v2, port: {HTTP_PORT}}}]"#
    );
    let wp = mesh("wrr", &http_route("retries", &rules))?;
    wp.with_client(|c| {
        // 503 on every try: the first and 3 retries; 500 is listed too.
        for (code, key) in [("503", "r503"), ("500", "r500")] {
            let r = c.request(
                "GET",
                "/retry3",
                &[
                    &format!("x-e2e-status: {code}"),
                    &format!("x-e2e-key: {key}"),
                ],
            )?;
            ensure!(r.status.to_string() == code, "{r:?}");
            ensure!(count(c, "v1", key)? == 4, "{key}");
        }
        // A code not listed is not retried.
        c.request("GET", "/retry3", &["x-e2e-status: 502", "x-e2e-key: r502"])?;
        ensure!(count(c, "v1", "r502")? == 1);
        // attempts: 0 means one try.
        c.request("GET", "/once", &["x-e2e-status: 503", "x-e2e-key: once"])?;
        ensure!(count(c, "v1", "once")? == 1);
        // Without `retry`, Istio's default: two retries on 503 and on a reset.
        c.request("GET", "/default", &["x-e2e-status: 503", "x-e2e-key: d503"])?;
        ensure!(count(c, "v1", "d503")? == 3);
        let r = c.request("GET", "/default", &["x-e2e-reset: 1", "x-e2e-key: dreset"])?;
        ensure!(r.status == 503, "{r:?}");
        ensure!(count(c, "v1", "dreset")? == 3);
        // The request timeout answers 504 well before the server would.
        let started = Instant::now();
        let r = c.request("GET", "/slow", &["x-e2e-delay-ms: 5000", "x-e2e-key: slow"])?;
        ensure!(
            r.status == 504 && r.body == "upstream request timeout",
            "{r:?}"
        );
        ensure!(
            started.elapsed() < Duration::from_secs(4),
            "{:?}",
            started.elapsed()
        );
        ensure!(count(c, "v2", "slow")? == 1);
        // The per-try timeout is retried: three tries of 200 ms, then 504.
        let started = Instant::now();
        let r = c.request(
            "GET",
            "/per-try",
            &["x-e2e-delay-ms: 3000", "x-e2e-key: pertry"],
        )?;
        ensure!(r.status == 504, "{r:?}");
        ensure!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        ensure!(count(c, "v2", "pertry")? == 3);
        Ok(())
    })?;

    // The budget: 30 requests in flight to a backend that always fails may have
    // max(3, 20 %) = 6 retries in flight, not 30 × 5.
    std::thread::scope(|s| -> Result<()> {
        let clients: Vec<_> = (0..30)
            .map(|_| {
                s.spawn(|| {
                    wp.with_client(|c| {
                        c.request(
                            "GET",
                            "/budget",
                            &[
                                "x-e2e-status: 503",
                                "x-e2e-delay-ms: 300",
                                "x-e2e-key: budget",
                            ],
                        )?;
                        Ok(())
                    })
                })
            })
            .collect();
        for c in clients {
            c.join().expect("client thread")?;
        }
        Ok(())
    })?;
    let attempts = wp.with_client(|c| count(c, "v2", "budget"))?;
    assert!(
        (30..=30 + 6 * 5 + 15).contains(&attempts),
        "{attempts} attempts for 30 requests"
    );
    let w = ztunnel_metrics(&wp.w)?;
    assert!(
        metric_sum(&w, "waypoint_retry_budget_exhausted_total", &[]) >= 10.0,
        "{w}"
    );
    assert!(
        metric_sum(
            &w,
            "waypoint_upstream_retries_total",
            &[("reason", "reset")]
        ) >= 2.0,
        "{w}"
    );
    Ok(())
}

/// A TCPRoute sends the Service's TCP port to another Service; a file with a bad
/// route is refused whole, and the waypoint keeps the routes it had.
#[test]
fn a_tcp_route_and_bad_routes() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let tcp_route = format!(
        "---\napiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TCPRoute\nmetadata: {{name: tcp, namespace: vms}}\nspec:\n  parentRefs: [{{group: \"\", kind: Service, name: echo, port: 80}}]\n  rules:\n  - backendRefs: [{{name: echo-v1, port: {HTTP_PORT}}}]\n"
    );
    let wp = mesh("wrt", &format!("{tcp_route}{}", split(0, 1)))?;
    // Raw bytes to the Service's port 80 reach v1's HTTP server, through the waypoint.
    let vip: std::net::SocketAddr = format!("{SERVICE_VIP}:80").parse()?;
    let (status, body) = wp
        .mesh
        .a
        .run_inside(|| test_support::http::request(vip, "GET", "/over-tcp", &[]))??;
    assert_eq!((status, server(&body)?.as_str()), (200, "v1"), "{body}");

    for bad in [
        http_route(
            "bad",
            "  - matches: [{path: {type: RegularExpression, value: \"(unclosed\"}}]",
        ),
        http_route("bad", "  - timeouts: {request: soon}"),
        "kind: ConfigMap\nmetadata: {name: x}\n".to_owned(),
    ] {
        let errors = || -> Result<f64> {
            Ok(metric_sum(
                &ztunnel_metrics(&wp.w)?,
                "ztunnel_local_config_errors_total",
                &[],
            ))
        };
        let before = errors()?;
        wp.set_objects(&format!("{}{bad}", split(1, 0)))?;
        assert_eq!(errors()?, before + 1.0, "{bad}");
        // Still the last good routes: all to v2.
        let (_, body) = wp.request("GET", "/still", &[])?;
        assert_eq!(server(&body)?, "v2", "{bad}");
    }
    let log = wp.waypoint.log();
    assert!(log.contains("invalid regular expression"), "{log}");
    Ok(())
}
