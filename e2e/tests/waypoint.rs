//! The waypoint between two standalone ztunnels (see `local_cluster::waypoint`): real
//! namespaces, the capture rules, mutual TLS on both hops, Istio's policy objects.

#[path = "support/hbone_client.rs"]
mod hbone_client;

use std::time::Duration;

use anyhow::Result;
use local_cluster::mesh::{metric_sum, ztunnel_metrics};
use local_cluster::standalone::{CLIENT_PRINCIPAL, SERVER_IP, SERVICE_VIP};
use local_cluster::waypoint::*;
use test_support::poll::wait_for;

/// The waypoint's policies: no `/admin` for anyone, nothing for `x-user: mallory`,
/// GET and HEAD from the client only, and no TCP to the Service's port 80 at all.
const POLICIES: &str = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-admin, namespace: vms}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}]
  action: DENY
  rules:
  - to: [{operation: {paths: ["/admin*"]}}]
  - when: [{key: "request.headers[x-user]", values: [mallory]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: client-reads, namespace: vms}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}]
  action: ALLOW
  rules:
  - from: [{source: {principals: [cluster.local/ns/vms/sa/client]}}]
    to: [{operation: {methods: [GET, HEAD], ports: ["8080", "9002"]}}]
"#;

#[test]
fn http_requests_are_authorized_one_by_one_at_the_waypoint() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let wp = WaypointMesh::new("wph", POLICIES)?;
    // The first request may race the ztunnels' reload of the config naming the waypoint.
    wait_for(
        "a request through the waypoint",
        Duration::from_secs(10),
        || {
            wp.request("GET", "/hello", &[])
                .ok()
                .filter(|(s, _)| *s == 200)
        },
    )?;
    let (status, body) = wp.request("GET", "/hello?x=1", &["x-user: alice"])?;
    assert_eq!(status, 200, "{body}");
    let seen: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(seen["path"], "/hello");
    assert_eq!(seen["headers"]["x-user"], "alice");

    for (method, path, header, why) in [
        ("GET", "/admin/users", None, "DENY by path"),
        ("GET", "/hello", Some("x-user: mallory"), "DENY by header"),
        ("POST", "/hello", None, "no ALLOW for POST"),
    ] {
        let headers: Vec<&str> = header.into_iter().collect();
        let (status, body) = wp.request(method, path, &headers)?;
        assert_eq!(
            (status, body.as_str()),
            (403, "RBAC: access denied"),
            "{why}"
        );
    }

    // Each hop, from its own metrics: A tunnelled to the waypoint's identity, the
    // waypoint reported each request, B saw the waypoint's identity.
    let a = ztunnel_metrics(&wp.mesh.a)?;
    assert!(
        metric_sum(
            &a,
            "istio_tcp_connections_opened_total",
            &[
                ("reporter", "source"),
                ("destination_principal", WAYPOINT_PRINCIPAL)
            ]
        ) >= 1.0,
        "{a}"
    );
    let w = ztunnel_metrics(&wp.w)?;
    let requests = |code: &str| {
        metric_sum(
            &w,
            "istio_requests_total",
            &[
                ("reporter", "waypoint"),
                ("response_code", code),
                ("source_principal", CLIENT_PRINCIPAL),
                ("destination_service", "echo.vms.svc.cluster.local"),
                ("request_protocol", "http"),
            ],
        )
    };
    assert!(requests("200") >= 2.0, "{w}");
    assert_eq!(requests("403"), 3.0, "{w}");
    assert!(
        w.contains("istio_request_duration_milliseconds_bucket"),
        "{w}"
    );
    let b = ztunnel_metrics(&wp.mesh.b)?;
    assert!(
        metric_sum(
            &b,
            "istio_tcp_connections_opened_total",
            &[
                ("reporter", "destination"),
                ("source_principal", WAYPOINT_PRINCIPAL)
            ]
        ) >= 1.0,
        "{b}"
    );
    // Every tunnel to the waypoint ended cleanly: when its HTTP server closes a
    // connection first, the stream stays open until A's side ends it too (as TCP's
    // half-close), so A's ztunnel logs no failed connection.
    let log = wp.mesh.ztunnel_a.log();
    assert!(!log.contains("\terror\taccess"), "{log}");
    Ok(())
}

#[test]
fn tcp_to_a_bound_service_passes_the_waypoint_and_its_policy() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    // Only the HTTP port is allowed: TCP to port 80 matches no ALLOW rule.
    let wp = WaypointMesh::new("wpt", POLICIES)?;
    let vip = format!("{SERVICE_VIP}:80");
    wait_for(
        "the waypoint to refuse TCP",
        Duration::from_secs(10),
        || {
            let w = ztunnel_metrics(&wp.w).ok()?;
            (wp.mesh.send(&vip, 10).is_err()
                && metric_sum(
                    &w,
                    "istio_tcp_connections_failed_total",
                    &[("reporter", "waypoint"), ("response_flags", "DENY")],
                ) >= 1.0)
                .then_some(())
        },
    )?;

    // Without policies, TCP flows through it, counted as the waypoint's.
    let wp2 = WaypointMesh::new("wpu", "")?;
    let answer = wp2.mesh.send(&vip, 100_000)?;
    assert_eq!(answer["bytes"], 100_000);
    let w = ztunnel_metrics(&wp2.w)?;
    assert!(
        metric_sum(
            &w,
            "istio_tcp_received_bytes_total",
            &[
                ("reporter", "waypoint"),
                ("source_principal", CLIENT_PRINCIPAL)
            ]
        ) >= 100_000.0,
        "{w}"
    );
    Ok(())
}

#[test]
fn workload_addressed_traffic_goes_through_the_workloads_waypoint() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let wp = WaypointMesh::new("wpw", POLICIES)?;
    wp.mesh.set_config(&waypoint_config(false, true))?;
    let direct: std::net::SocketAddr = format!("{SERVER_IP}:{HTTP_TARGET_PORT}").parse()?;
    let get = |path: &str| {
        let path = path.to_owned();
        wp.mesh
            .a
            .run_inside(move || test_support::http::request(direct, "GET", &path, &[]))
    };
    wait_for(
        "the admin path to be denied",
        Duration::from_secs(10),
        || get("/admin").ok()?.ok().filter(|(s, _)| *s == 403),
    )?;
    assert_eq!(get("/hello")??.0, 200);
    Ok(())
}

#[test]
fn a_waypoint_without_an_instance_refuses_traffic_rather_than_be_bypassed() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let wp = WaypointMesh::new("wpd", "")?;
    wait_for(
        "a request through the waypoint",
        Duration::from_secs(10),
        || wp.request("GET", "/", &[]).ok().filter(|(s, _)| *s == 200),
    )?;
    let from_client = || -> Result<f64> {
        let b = ztunnel_metrics(&wp.mesh.b)?;
        Ok(metric_sum(
            &b,
            "istio_tcp_connections_opened_total",
            &[
                ("reporter", "destination"),
                ("source_principal", CLIENT_PRINCIPAL),
            ],
        ))
    };
    let before = from_client()?;
    // The waypoint's workload leaves discovery (its pod deleted): the Service still
    // names the waypoint, so its traffic is refused, not sent straight to B.
    let gone = waypoint_config(true, false).replace(
        &format!("  workloadIps: [\"{WAYPOINT_IP}\"]\n"),
        "  workloadIps: []\n",
    );
    wp.mesh.set_config(&gone)?;
    wait_for("the Service to be refused", Duration::from_secs(10), || {
        wp.request("GET", "/", &[]).is_err().then_some(())
    })?;
    let a = ztunnel_metrics(&wp.mesh.a)?;
    assert!(
        metric_sum(
            &a,
            "ztunnel_errors_total",
            &[("reason", "waypoint_unavailable")]
        ) >= 1.0,
        "{a}"
    );
    assert_eq!(
        from_client()?,
        before,
        "nothing reached B around the waypoint"
    );
    Ok(())
}

/// Garbage at the waypoint, from B (no capture there) with a mesh certificate:
/// each case is refused and counted, and good requests are served throughout.
#[test]
fn bad_hbone_and_http_at_the_waypoint_are_refused_and_counted() -> Result<()> {
    use http::{Method, StatusCode};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let wp = WaypointMesh::with_env("wpb", "", &[("HEADER_READ_TIMEOUT", "1s")])?;
    let tls = hbone_client::client_tls(&wp.mesh.dir.path().join("ca"))?;
    let hbone = format!("{WAYPOINT_IP}:15008");
    let vip = WaypointMesh::http_vip().to_string();
    let errors = |reason: &str| -> f64 {
        let w = ztunnel_metrics(&wp.w).unwrap_or_default();
        metric_sum(&w, "ztunnel_errors_total", &[("reason", reason)])
    };
    let outcome = wp.mesh.b.run_inside(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let mut h2 = hbone_client::h2_session(tls, &hbone, &vip).await.unwrap();
            // Authorities it does not serve, or that are not addresses.
            let unserved = hbone_client::status(&mut h2, Method::CONNECT, "10.96.0.99:80").await;
            let malformed = hbone_client::status(&mut h2, Method::CONNECT, "echo:80").await;
            let not_connect =
                hbone_client::status(&mut h2, Method::GET, "http://10.96.0.10/").await;

            // Inside a good tunnel: bytes that are not HTTP, a head too large, a head
            // that never ends. hyper answers what it can and closes.
            let tunnel = |h2: h2::client::SendRequest<bytes::Bytes>, vip: String| async move {
                let request = http::Request::builder()
                    .method(Method::CONNECT)
                    .uri(vip.as_str())
                    .body(())
                    .unwrap();
                let mut ready = h2.ready().await.unwrap();
                let (response, send) = ready.send_request(request, false).unwrap();
                let response = response.await.unwrap();
                assert_eq!(response.status(), StatusCode::OK);
                ztunnel::hbone::io::H2Io::new(ztunnel::hbone::stream::H2Stream::new(
                    send,
                    response.into_body(),
                ))
            };
            let answer = |mut io: ztunnel::hbone::io::H2Io, bytes: Vec<u8>| async move {
                let _ = io.write_all(&bytes).await;
                let mut out = Vec::new();
                let _ = tokio::time::timeout(
                    std::time::Duration::from_secs(5),
                    io.read_to_end(&mut out),
                )
                .await;
                String::from_utf8_lossy(&out).into_owned()
            };
            let garbage = answer(
                tunnel(h2.clone(), vip.clone()).await,
                b"\x16\x03\x01 hello\r\n\r\n".to_vec(),
            )
            .await;
            let mut huge = b"GET / HTTP/1.1\r\nHost: x\r\nx-big: ".to_vec();
            huge.extend(std::iter::repeat_n(b'a', 100 * 1024));
            huge.extend(b"\r\n\r\n");
            let oversized = answer(tunnel(h2.clone(), vip.clone()).await, huge).await;
            let slow = answer(
                tunnel(h2.clone(), vip.clone()).await,
                b"GET / HTTP/1.1\r\nHost: x\r\n".to_vec(),
            )
            .await;
            let good = answer(
                tunnel(h2.clone(), vip.clone()).await,
                b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(),
            )
            .await;
            (
                unserved,
                malformed,
                not_connect,
                garbage,
                oversized,
                slow,
                good,
            )
        })
    })?;
    let (unserved, malformed, not_connect, garbage, oversized, slow, good) = outcome;
    assert_eq!(unserved, StatusCode::BAD_REQUEST);
    assert_eq!(malformed, StatusCode::BAD_REQUEST);
    assert_eq!(not_connect, StatusCode::METHOD_NOT_ALLOWED);
    assert!(garbage.starts_with("HTTP/1.1 400"), "{garbage:?}");
    assert!(oversized.starts_with("HTTP/1.1 431"), "{oversized:?}");
    assert!(
        slow.starts_with("HTTP/1.1 408") || slow.is_empty(),
        "{slow:?}"
    );
    assert!(good.starts_with("HTTP/1.1 200"), "{good:?}");
    assert!(errors("authority_not_served") >= 1.0);
    assert!(errors("bad_authority") >= 1.0);
    assert!(errors("not_connect") >= 1.0);
    assert!(
        errors("http_protocol") >= 3.0,
        "garbage, oversized and slow heads"
    );
    // Still serving the mesh's own traffic.
    assert_eq!(wp.request("GET", "/after", &[])?.0, 200);
    Ok(())
}

/// A gRPC port (HTTP/2 without TLS): requests multiplexed on one client connection
/// are authorized one by one, the server's `grpc-status` is counted as Istio's label.
#[test]
fn grpc_requests_share_a_connection_are_authorized_one_by_one_and_routed() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    // Only the DENY: without an ALLOW, what it does not match is allowed.
    let deny_only = POLICIES.split("---").next().unwrap_or_default();
    let wp = WaypointMesh::new("wpg", deny_only)?;
    // The server in B: h2 with prior knowledge, answering each request's path, with a
    // gRPC status in the headers (a trailers-only answer).
    let listener = wp
        .mesh
        .b
        .run_inside(move || std::net::TcpListener::bind(format!("0.0.0.0:{GRPC_TARGET_PORT}")))??;
    listener.set_nonblocking(true)?;
    let server = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let Ok(mut connection) = h2::server::handshake(tcp).await else {
                        return;
                    };
                    while let Some(Ok((request, mut respond))) = connection.accept().await {
                        let response = http::Response::builder()
                            .header("content-type", "application/grpc")
                            .header("grpc-status", "0")
                            .body(())
                            .unwrap();
                        if let Ok(mut send) = respond.send_response(response, false) {
                            let path = request.uri().path().to_owned();
                            let _ = send.send_data(bytes::Bytes::from(path), true);
                        }
                    }
                });
            }
        })
    });
    let vip: std::net::SocketAddr = format!("{SERVICE_VIP}:{GRPC_PORT}").parse()?;
    let statuses = wp.mesh.a.run_inside(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let tcp = tokio::net::TcpStream::connect(vip).await?;
            let (client, connection) = h2::client::handshake(tcp).await?;
            tokio::spawn(connection);
            let ask = |path: &'static str| {
                let client = client.clone();
                async move {
                    let request = http::Request::builder()
                        .method("POST")
                        .uri(format!("http://{vip}{path}"))
                        .header("content-type", "application/grpc")
                        .body(())?;
                    let mut ready = client.ready().await?;
                    let (response, _) = ready.send_request(request, true)?;
                    let response = response.await?;
                    anyhow::Ok(response.status().as_u16())
                }
            };
            // At once, on the one connection.
            let (ok, denied) = tokio::join!(ask("/echo.Echo/Say"), ask("/admin.Admin/Drop"));
            anyhow::Ok((ok?, denied?))
        })
    })??;
    assert_eq!(statuses, (200, 403));
    let w = ztunnel_metrics(&wp.w)?;
    let requests = |code: &str, grpc: &str| {
        metric_sum(
            &w,
            "istio_requests_total",
            &[
                ("reporter", "waypoint"),
                ("request_protocol", "grpc"),
                ("response_code", code),
                ("grpc_response_status", grpc),
            ],
        )
    };
    assert_eq!(
        (requests("200", "0"), requests("403", "-")),
        (1.0, 1.0),
        "{w}"
    );

    // A GRPCRoute on the port: by service and method, a filter it cannot apply (500),
    // and a call no rule matches (404).
    let route = format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {{name: grpc, namespace: vms}}\nspec:\n  parentRefs: [{{group: \"\", kind: Service, name: echo, port: {GRPC_PORT}}}]\n  rules:\n  - matches: [{{method: {{service: echo.Echo, method: Say}}}}]\n  - matches: [{{method: {{type: RegularExpression, service: \"other\\\\..*\"}}}}]\n    filters: [{{type: ExtensionRef, extensionRef: {{group: example.com, kind: Plugin, name: x}}}}]\n"
    );
    wp.set_objects(&format!("{deny_only}{route}"))?;
    let statuses = wp.mesh.a.run_inside(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(async move {
                let tcp = tokio::net::TcpStream::connect(vip).await?;
                let (client, connection) = h2::client::handshake(tcp).await?;
                tokio::spawn(connection);
                let mut statuses = Vec::new();
                for path in ["/echo.Echo/Say", "/other.Svc/Call", "/echo.Echo/Shout"] {
                    let request = http::Request::builder()
                        .method("POST")
                        .uri(format!("http://{vip}{path}"))
                        .header("content-type", "application/grpc")
                        .body(())?;
                    let mut ready = client.clone().ready().await?;
                    let (response, _) = ready.send_request(request, true)?;
                    statuses.push(response.await?.status().as_u16());
                }
                anyhow::Ok(statuses)
            })
    })??;
    assert_eq!(statuses, [200, 500, 404]);
    let w = ztunnel_metrics(&wp.w)?;
    assert_eq!(
        metric_sum(
            &w,
            "istio_requests_total",
            &[("request_protocol", "grpc"), ("route_name", "vms.grpc.0")]
        ),
        1.0,
        "{w}"
    );
    drop(server);
    Ok(())
}

/// A waypoint killed while a client sends requests: requests fail while it is down
/// and succeed again once it is back, and none reaches B around it meanwhile.
#[test]
fn a_waypoint_restarted_under_load_is_never_bypassed() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let mut wp = WaypointMesh::new("wpk", "")?;
    wait_for(
        "a request through the waypoint",
        Duration::from_secs(10),
        || wp.request("GET", "/", &[]).ok().filter(|(s, _)| *s == 200),
    )?;
    let from_client = |wp: &WaypointMesh| -> Result<f64> {
        let b = ztunnel_metrics(&wp.mesh.b)?;
        Ok(metric_sum(
            &b,
            "istio_tcp_connections_opened_total",
            &[
                ("reporter", "destination"),
                ("source_principal", CLIENT_PRINCIPAL),
            ],
        ))
    };
    let around_before = from_client(&wp)?;
    // The load: requests one after another from A until told to stop.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let a = wp.mesh.a.path();
    let load = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            test_support::netns::run_in(&a, move || {
                let (mut ok, mut failed) = (0u32, 0u32);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match test_support::http::request(WaypointMesh::http_vip(), "GET", "/load", &[])
                    {
                        Ok((200, _)) => ok += 1,
                        _ => failed += 1,
                    }
                }
                (ok, failed)
            })
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    wp.restart_waypoint()?;
    // Served again by the new waypoint.
    wait_for(
        "requests through the new waypoint",
        Duration::from_secs(10),
        || {
            let w = ztunnel_metrics(&wp.w).ok()?;
            (metric_sum(&w, "istio_requests_total", &[("response_code", "200")]) >= 20.0)
                .then_some(())
        },
    )?;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = load.join().expect("the load thread")?;
    eprintln!(
        "restart under load: {ok} requests answered, {failed} failed while the waypoint was down"
    );
    assert!(ok >= 20, "{ok} answered");
    assert_eq!(
        from_client(&wp)?,
        around_before,
        "a request reached B around the waypoint"
    );
    Ok(())
}
