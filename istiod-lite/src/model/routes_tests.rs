use serde_json::json;

use super::*;

fn route(namespace: &str, name: &str, parent_refs: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "generation": 3,
            "creationTimestamp": "2024-05-06T07:08:09Z",
        },
        "spec": {
            "parentRefs": parent_refs,
            "rules": [{"backendRefs": [{"name": "web-v2", "port": 80}]}],
        },
        "status": {"parents": []},
    }))
    .unwrap()
}

const HTTP: &RouteKind = &ROUTE_KINDS[0];
const TCP: &RouteKind = &ROUTE_KINDS[2];

#[test]
fn route_kinds_are_the_gateway_apis() {
    let kinds: Vec<String> = ROUTE_KINDS
        .iter()
        .map(|k| {
            let r = k.resource();
            format!("{} {} {}", r.api_version, r.kind, r.plural)
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "gateway.networking.k8s.io/v1 HTTPRoute httproutes",
            "gateway.networking.k8s.io/v1 GRPCRoute grpcroutes",
            "gateway.networking.k8s.io/v1alpha2 TCPRoute tcproutes",
        ]
    );
}

#[test]
fn a_route_bound_to_a_service_carries_its_spec_generation_and_creation() {
    let r = route(
        "shop",
        "web",
        json!([{"group": "", "kind": "Service", "name": "web", "port": 80}]),
    );
    let converted = waypoint_route(HTTP, &r).unwrap();
    assert_eq!(converted.key(), "HTTPRoute/shop/web");
    assert_eq!(converted.generation, 3);
    assert_eq!(converted.created, "2024-05-06T07:08:09Z");
    let spec: Value = serde_json::from_str(&converted.spec_json).unwrap();
    assert_eq!(spec, r.data["spec"], "the spec as stored, nothing else");
}

#[test]
fn only_service_parents_with_the_core_group_written_out_bind_a_route() {
    let not_gamma = [
        // A Gateway (the CRD's default group and kind).
        json!([{"name": "waypoint"}]),
        json!([{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw"}]),
        // The group left out defaults to the Gateway API's.
        json!([{"kind": "Service", "name": "web"}]),
        json!([{"group": "", "kind": "ServiceImport", "name": "web"}]),
        json!([]),
        json!(null),
    ];
    for parents in not_gamma {
        assert_eq!(
            waypoint_route(HTTP, &route("shop", "r", parents.clone())),
            None,
            "{parents}"
        );
    }
    let mixed = json!([
        {"name": "gw"},
        {"group": "", "kind": "Service", "name": "web"},
    ]);
    assert!(waypoint_route(HTTP, &route("shop", "r", mixed)).is_some());
}

#[test]
fn routes_of_every_kind_are_sorted_by_key() {
    let gamma = json!([{"group": "", "kind": "Service", "name": "web"}]);
    let (b, a, gw) = (
        route("shop", "b", gamma.clone()),
        route("shop", "a", gamma.clone()),
        route("shop", "gw", json!([{"name": "gateway"}])),
    );
    let tcp = route("db", "z", gamma);
    let built = waypoint_routes([(HTTP, &b), (TCP, &tcp), (HTTP, &gw), (HTTP, &a)]);
    let keys: Vec<String> = built.iter().map(WaypointRoute::key).collect();
    assert_eq!(
        keys,
        ["HTTPRoute/shop/a", "HTTPRoute/shop/b", "TCPRoute/db/z"]
    );
}
