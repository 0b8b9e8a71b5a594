use prost::Message;
use shared_types::istio::security as pb_sec;
use shared_types::istio::workload as pb;
use shared_types::istio::xds::{self, Any, DeltaDiscoveryResponse, Resource};

use super::*;

fn workload_resource(name: &str, ip: [u8; 4], version: &str) -> Resource {
    let address = pb::Address {
        r#type: Some(pb::address::Type::Workload(pb::Workload {
            uid: name.into(),
            name: name.rsplit('/').next().unwrap().into(),
            namespace: "shop".into(),
            addresses: vec![ip.to_vec()],
            ..Default::default()
        })),
    };
    resource(name, version, ADDRESS_TYPE_URL, address.encode_to_vec())
}

fn resource(name: &str, version: &str, type_url: &str, value: Vec<u8>) -> Resource {
    let body = Any {
        type_url: type_url.into(),
        value,
    };
    xds::resource(name, version, body)
}

fn response(type_url: &str, resources: Vec<Resource>, removed: &[&str]) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        type_url: type_url.into(),
        nonce: "n".into(),
        resources,
        removed_resources: removed.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

const A: &str = "Kubernetes//Pod/shop/a";
const B: &str = "Kubernetes//Pod/shop/b";

#[test]
fn resources_are_added_replaced_and_removed_by_name() {
    let mut r = Resources::default();
    let errors = r.apply(response(
        ADDRESS_TYPE_URL,
        vec![
            workload_resource(A, [10, 0, 0, 1], "1"),
            workload_resource(B, [10, 0, 0, 2], "1"),
        ],
        &[],
    ));
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(r.state().counts(), (2, 0, 0));

    // A new version of A moves its IP; the old IP no longer resolves.
    r.apply(response(
        ADDRESS_TYPE_URL,
        vec![workload_resource(A, [10, 0, 0, 9], "2")],
        &[],
    ));
    assert!(r
        .state()
        .workload_by_ip("10.0.0.1".parse().unwrap())
        .is_none());
    assert_eq!(
        r.state()
            .workload_by_ip("10.0.0.9".parse().unwrap())
            .unwrap()
            .uid,
        A
    );
    assert_eq!(r.versions(ADDRESS_TYPE_URL)[A], "2");

    r.apply(response(ADDRESS_TYPE_URL, vec![], &[B, "never-sent"]));
    assert_eq!(r.state().counts(), (1, 0, 0));
    assert!(!r.versions(ADDRESS_TYPE_URL).contains_key(B));
}

#[test]
fn a_bad_resource_is_reported_and_does_not_poison_the_rest() {
    let mut r = Resources::default();
    r.apply(response(
        ADDRESS_TYPE_URL,
        vec![workload_resource(A, [10, 0, 0, 1], "1")],
        &[],
    ));
    let garbage = resource(B, "1", ADDRESS_TYPE_URL, vec![0xff, 0xff, 0xff]);
    let wrong_type = resource("shop/p", "1", AUTHORIZATION_TYPE_URL, vec![]);
    let bad_a = {
        let mut a = workload_resource(A, [10, 0, 0, 1], "2");
        // Five address bytes: the new version is refused, the old one stays.
        let body = pb::Address {
            r#type: Some(pb::address::Type::Workload(pb::Workload {
                uid: A.into(),
                addresses: vec![vec![1, 2, 3, 4, 5]],
                ..Default::default()
            })),
        };
        a.resource.as_mut().unwrap().value = body.encode_to_vec();
        a
    };
    let good = workload_resource("Kubernetes//Pod/shop/c", [10, 0, 0, 3], "1");
    let errors = r.apply(response(
        ADDRESS_TYPE_URL,
        vec![garbage, wrong_type, bad_a, good],
        &[],
    ));
    let named: Vec<&str> = errors.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(named, vec![B, "shop/p", A], "{errors:?}");
    assert!(errors[0].reason.contains("decode"), "{}", errors[0]);
    assert!(errors[2].reason.contains("addresses"), "{}", errors[2]);
    assert_eq!(r.state().counts(), (2, 0, 0));
    assert_eq!(r.versions(ADDRESS_TYPE_URL)[A], "1");
    assert!(r
        .state()
        .workload_by_ip("10.0.0.1".parse().unwrap())
        .is_some());
}

#[test]
fn services_and_policies_live_beside_workloads() {
    let mut r = Resources::default();
    let svc = pb::Address {
        r#type: Some(pb::address::Type::Service(pb::Service {
            name: "web".into(),
            namespace: "shop".into(),
            hostname: "web.shop.svc.cluster.local".into(),
            ..Default::default()
        })),
    };
    let name = "shop/web.shop.svc.cluster.local";
    r.apply(response(
        ADDRESS_TYPE_URL,
        vec![resource(name, "1", ADDRESS_TYPE_URL, svc.encode_to_vec())],
        &[],
    ));
    let policy = pb_sec::Authorization {
        name: "deny".into(),
        namespace: "shop".into(),
        action: pb_sec::Action::Deny as i32,
        ..Default::default()
    };
    r.apply(response(
        AUTHORIZATION_TYPE_URL,
        vec![resource(
            "shop/deny",
            "1",
            AUTHORIZATION_TYPE_URL,
            policy.encode_to_vec(),
        )],
        &[],
    ));
    assert_eq!(r.state().counts(), (0, 1, 1));
    // A removal is per type: the policy's name under Address removes nothing.
    r.apply(response(ADDRESS_TYPE_URL, vec![], &["shop/deny"]));
    assert_eq!(r.state().counts(), (0, 1, 1));
    r.apply(response(AUTHORIZATION_TYPE_URL, vec![], &["shop/deny"]));
    r.apply(response(ADDRESS_TYPE_URL, vec![], &[name]));
    assert_eq!(r.state().counts(), (0, 0, 0));
}

#[test]
fn a_type_never_subscribed_is_refused_whole() {
    let mut r = Resources::default();
    let errors = r.apply(response(
        "type.googleapis.com/envoy.config.cluster.v3.Cluster",
        vec![workload_resource(A, [10, 0, 0, 1], "1")],
        &[],
    ));
    assert_eq!(errors.len(), 1);
    assert!(errors[0].reason.contains("not subscribed"));
    assert_eq!(r.state().counts(), (0, 0, 0));
}

fn waypoint_route(kind: &str, name: &str, spec_json: &str) -> WaypointRoute {
    WaypointRoute {
        kind: kind.into(),
        name: name.into(),
        namespace: "shop".into(),
        spec_json: spec_json.into(),
        generation: 1,
        created: "2024-01-01T00:00:00Z".into(),
    }
}

fn route_resource(route: &WaypointRoute, version: &str) -> Resource {
    resource(
        &route.key(),
        version,
        WAYPOINT_ROUTE_TYPE_URL,
        route.encode_to_vec(),
    )
}

fn routes(r: &Resources) -> Vec<(String, String)> {
    let mut out: Vec<_> = r
        .state()
        .waypoint_routes()
        .map(|r| (r.key(), r.spec_json.clone()))
        .collect();
    out.sort();
    out
}

#[test]
fn waypoint_routes_are_added_replaced_and_removed_by_name() {
    let mut r = Resources::new(&WAYPOINT_TYPES);
    let http = waypoint_route("HTTPRoute", "web", r#"{"rules":[]}"#);
    let tcp = waypoint_route("TCPRoute", "db", "{}");
    let errors = r.apply(response(
        WAYPOINT_ROUTE_TYPE_URL,
        vec![route_resource(&http, "1"), route_resource(&tcp, "1")],
        &[],
    ));
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(
        routes(&r),
        vec![
            ("HTTPRoute/shop/web".into(), r#"{"rules":[]}"#.into()),
            ("TCPRoute/shop/db".into(), "{}".into()),
        ]
    );

    let replaced = waypoint_route("HTTPRoute", "web", r#"{"rules":[{}]}"#);
    r.apply(response(
        WAYPOINT_ROUTE_TYPE_URL,
        vec![route_resource(&replaced, "2")],
        &[],
    ));
    assert_eq!(routes(&r)[0].1, r#"{"rules":[{}]}"#);
    assert_eq!(
        r.versions(WAYPOINT_ROUTE_TYPE_URL)["HTTPRoute/shop/web"],
        "2"
    );

    r.apply(response(
        WAYPOINT_ROUTE_TYPE_URL,
        vec![],
        &["TCPRoute/shop/db", "never-sent"],
    ));
    assert_eq!(routes(&r).len(), 1);
    assert!(!r
        .versions(WAYPOINT_ROUTE_TYPE_URL)
        .contains_key("TCPRoute/shop/db"));
    // The policies' type holds nothing of the routes.
    assert!(r.state().waypoint_policies().next().is_none());
}

#[test]
fn a_bad_waypoint_route_is_refused_and_the_old_version_kept() {
    let mut r = Resources::new(&WAYPOINT_TYPES);
    let good = waypoint_route("GRPCRoute", "api", "{}");
    r.apply(response(
        WAYPOINT_ROUTE_TYPE_URL,
        vec![route_resource(&good, "1")],
        &[],
    ));
    let not_json = route_resource(&waypoint_route("GRPCRoute", "api", "{rules"), "2");
    let bad_kind = route_resource(&waypoint_route("TLSRoute", "tls", "{}"), "1");
    let no_kind = route_resource(&waypoint_route("", "anon", "{}"), "1");
    let no_namespace = {
        let mut route = waypoint_route("HTTPRoute", "nowhere", "{}");
        route.namespace.clear();
        route_resource(&route, "1")
    };
    let garbage = resource("HTTPRoute/shop/x", "1", WAYPOINT_ROUTE_TYPE_URL, vec![0xff]);
    let errors = r.apply(response(
        WAYPOINT_ROUTE_TYPE_URL,
        vec![not_json, bad_kind, no_kind, no_namespace, garbage],
        &[],
    ));
    let reasons: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(errors.len(), 5, "{reasons:?}");
    assert!(reasons[0].contains("not JSON"), "{reasons:?}");
    assert!(reasons[1].contains("TLSRoute"), "{reasons:?}");
    assert!(reasons[2].contains("no kind"), "{reasons:?}");
    assert!(
        reasons[3].contains("no kind, name or namespace"),
        "{reasons:?}"
    );
    assert!(reasons[4].contains("decode"), "{reasons:?}");
    assert_eq!(routes(&r), vec![("GRPCRoute/shop/api".into(), "{}".into())]);
    assert_eq!(
        r.versions(WAYPOINT_ROUTE_TYPE_URL)["GRPCRoute/shop/api"],
        "1"
    );
}

#[test]
fn waypoint_routes_are_merged_into_another_state() {
    let mut r = Resources::new(&WAYPOINT_TYPES);
    let route = waypoint_route("HTTPRoute", "web", "{}");
    r.apply(response(
        WAYPOINT_ROUTE_TYPE_URL,
        vec![route_resource(&route, "1")],
        &[],
    ));
    let mut merged = ProxyState::default();
    merged.merge_from(r.state());
    let keys: Vec<String> = merged.waypoint_routes().map(|r| r.key()).collect();
    assert_eq!(keys, vec!["HTTPRoute/shop/web"]);
}
