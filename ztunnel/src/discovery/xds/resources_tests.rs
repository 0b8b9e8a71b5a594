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
