use super::*;

const CLIENT: &str = "spiffe://cluster.local/ns/apps/sa/client";
const OTHER: &str = "spiffe://cluster.local/ns/other/sa/robot";

fn waypoint() -> WaypointRef {
    WaypointRef {
        namespace: "apps".into(),
        name: "waypoint".into(),
        root_namespace: "istio-system".into(),
    }
}

fn policies(yaml: &str) -> Policies {
    Policies::for_waypoint(parse_policies(yaml).unwrap(), &waypoint())
}

/// A policy on the waypoint's Gateway with `spec` (YAML, indented under `spec:`).
fn on_gateway(name: &str, spec: &str) -> String {
    format!(
        "---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: {name}, namespace: apps}}\nspec:\n  targetRefs: [{{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}}]\n{spec}\n"
    )
}

struct Request<'a> {
    principal: &'a str,
    method: &'a str,
    path: &'a str,
    headers: HeaderMap,
    service: Option<(&'a str, &'a str)>,
}

impl Default for Request<'_> {
    fn default() -> Self {
        Request {
            principal: CLIENT,
            method: "GET",
            path: "/",
            headers: HeaderMap::new(),
            service: Some(("apps", "echo")),
        }
    }
}

fn eval(p: &Policies, r: &Request, http: bool) -> Decision {
    let attrs = Attributes {
        source_principal: Some(r.principal),
        source_ip: "10.0.0.1".parse().unwrap(),
        destination_ip: "10.96.0.10".parse().unwrap(),
        destination_port: 80,
        service: r.service,
        http: http.then_some(HttpAttributes {
            method: r.method,
            path: r.path,
            host: "echo.apps.svc.cluster.local:80",
            headers: &r.headers,
        }),
    };
    p.evaluate(&attrs)
}

fn allowed(p: &Policies, r: &Request) -> bool {
    eval(p, r, true) == Decision::Allow
}

#[test]
fn without_policies_everything_is_allowed() {
    assert!(allowed(&Policies::default(), &Request::default()));
}

#[test]
fn deny_comes_first_then_an_allow_must_match() {
    let p = policies(&format!(
        "{}{}",
        on_gateway(
            "deny-admin",
            "  action: DENY\n  rules: [{to: [{operation: {paths: [\"/admin*\"]}}]}]"
        ),
        on_gateway(
            "allow-get",
            "  rules: [{to: [{operation: {methods: [GET, HEAD]}}]}]"
        )
    ));
    assert_eq!(p.len(), 2);
    assert!(allowed(&p, &Request::default()));
    assert_eq!(
        eval(
            &p,
            &Request {
                path: "/admin/users",
                ..Default::default()
            },
            true
        ),
        Decision::Deny {
            policy: Some("apps.deny-admin".into())
        }
    );
    // Not denied, but no ALLOW matches.
    assert_eq!(
        eval(
            &p,
            &Request {
                method: "POST",
                ..Default::default()
            },
            true
        ),
        Decision::Deny { policy: None }
    );
}

#[test]
fn paths_match_exactly_by_prefix_or_by_suffix() {
    let p = policies(&on_gateway(
        "paths",
        "  rules: [{to: [{operation: {paths: [/exact, \"/api/*\", \"*.png\"]}}]}]",
    ));
    for (path, ok) in [
        ("/exact", true),
        ("/exact/more", false),
        ("/api/v1", true),
        ("/img/logo.png", true),
        ("/other", false),
    ] {
        let r = Request {
            path,
            ..Default::default()
        };
        assert_eq!(allowed(&p, &r), ok, "{path}");
    }
}

#[test]
fn sources_by_principal_namespace_and_their_negations() {
    let p = policies(&on_gateway(
        "from",
        "  rules: [{from: [{source: {principals: [\"cluster.local/ns/apps/*\"], notNamespaces: [other]}}]}]",
    ));
    assert!(allowed(&p, &Request::default()));
    let other = Request {
        principal: OTHER,
        ..Default::default()
    };
    assert!(!allowed(&p, &other));
    let p = policies(&on_gateway(
        "ns",
        "  action: DENY\n  rules: [{from: [{source: {namespaces: [other]}}]}]",
    ));
    assert!(!allowed(&p, &other));
    assert!(allowed(&p, &Request::default()));
}

#[test]
fn when_conditions_read_headers_and_the_source() {
    let p = policies(&on_gateway(
        "when",
        "  rules: [{when: [{key: \"request.headers[x-user]\", values: [alice]}, {key: source.namespace, notValues: [other]}]}]",
    ));
    let mut alice = Request::default();
    alice.headers.insert("x-user", "alice".parse().unwrap());
    assert!(allowed(&p, &alice));
    assert!(!allowed(&p, &Request::default()), "no header");
    let mut bob = Request::default();
    bob.headers.insert("x-user", "bob".parse().unwrap());
    assert!(!allowed(&p, &bob));
}

#[test]
fn service_targeted_policies_apply_to_that_service_only() {
    let yaml = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: echo-only, namespace: apps}\nspec:\n  targetRefs: [{kind: Service, group: \"\", name: echo}]\n  action: DENY\n  rules: [{to: [{operation: {methods: [DELETE]}}]}]\n";
    let p = policies(yaml);
    let delete = |service| Request {
        method: "DELETE",
        service,
        ..Default::default()
    };
    assert!(!allowed(&p, &delete(Some(("apps", "echo")))));
    assert!(allowed(&p, &delete(Some(("apps", "other")))));
    assert!(allowed(&p, &delete(None)));
}

#[test]
fn only_policies_attached_to_this_waypoint_are_kept() {
    let yaml = format!(
        "{}---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: selector, namespace: apps}}\nspec:\n  selector: {{matchLabels: {{app: echo}}}}\n  action: DENY\n---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: other-gw, namespace: apps}}\nspec:\n  targetRefs: [{{group: gateway.networking.k8s.io, kind: Gateway, name: elsewhere}}]\n  action: DENY\n---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: class, namespace: istio-system}}\nspec:\n  targetRefs: [{{group: gateway.networking.k8s.io, kind: GatewayClass, name: istio-waypoint}}]\n  action: DENY\n  rules: [{{to: [{{operation: {{paths: [/secret]}}}}]}}]\n",
        on_gateway("mine", "  action: DENY\n  rules: [{to: [{operation: {paths: [/mine]}}]}]")
    );
    let p = policies(&yaml);
    assert_eq!(p.len(), 2, "{p:?}");
    for path in ["/mine", "/secret"] {
        let r = Request {
            path,
            ..Default::default()
        };
        assert!(!allowed(&p, &r), "{path}");
    }
}

#[test]
fn tcp_traffic_meets_http_rules_by_denying_more() {
    let deny = policies(&on_gateway(
        "deny-post",
        "  action: DENY\n  rules: [{to: [{operation: {methods: [POST]}}]}]",
    ));
    assert_ne!(eval(&deny, &Request::default(), false), Decision::Allow);
    let allow = policies(&on_gateway(
        "allow-get",
        "  rules: [{to: [{operation: {methods: [GET]}}]}]",
    ));
    assert_ne!(eval(&allow, &Request::default(), false), Decision::Allow);
    let by_principal = policies(&on_gateway(
        "allow-client",
        "  rules: [{from: [{source: {principals: [cluster.local/ns/apps/sa/client]}}]}]",
    ));
    assert_eq!(
        eval(&by_principal, &Request::default(), false),
        Decision::Allow
    );
}

#[test]
fn unreadable_policies_fail_closed_and_unsupported_actions_are_refused() {
    let broken_deny = policies(&on_gateway(
        "bad",
        "  action: DENY\n  rules: [{when: [{key: connection.unknown, values: [x]}]}]",
    ));
    assert!(!allowed(&broken_deny, &Request::default()));
    let broken_allow = policies(&on_gateway("bad", "  rules: 7"));
    assert!(!allowed(&broken_allow, &Request::default()));
    let custom = policies(&on_gateway(
        "ext",
        "  action: CUSTOM\n  provider: {name: opa}\n  rules: [{to: [{operation: {paths: [/x]}}]}]",
    ));
    assert!(
        !allowed(&custom, &Request::default()),
        "CUSTOM denies all it targets"
    );
    let err = parse_policies(&on_gateway("audit", "  action: AUDIT")).unwrap_err();
    assert!(err.to_string().contains("AUDIT"), "{err}");
    let json = Policy::from_json("apps".into(), "j".into(), r#"{"action":"DENY","targetRefs":[{"group":"gateway.networking.k8s.io","kind":"Gateway","name":"waypoint"}],"rules":[{"to":[{"operation":{"methods":["GET"]}}]}]}"#).unwrap();
    assert!(!allowed(
        &Policies::for_waypoint(vec![json], &waypoint()),
        &Request::default()
    ));
    let err = parse_policies("kind: ConfigMap\nmetadata: {name: x}\n").unwrap_err();
    assert!(
        err.to_string().contains("is not one a waypoint applies"),
        "{err}"
    );
    assert!(parse_policies(": : :").is_err());
}
