//! ztunnel's side of delta xDS: what a hostile or broken control plane sends. Every
//! response is applied without a panic; every refused resource is named (a name from
//! the response, or none for a refused type); a refused resource leaves what was held
//! under its name as it was; and removing every held name empties the state.
//!
//! The client is a waypoint's, so it holds the waypoint's policy and route types too.
//!
//! Input: byte 0 picks the shape. Even: the rest is one resource body under the
//! name "r", as an Address (byte 0 < 86), an Authorization (< 172), a waypoint policy
//! (< 214) or a waypoint route. Odd: the rest is a whole `DeltaDiscoveryResponse`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use shared_types::istio::xds::{
    resource, Any, DeltaDiscoveryResponse, ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL,
};
use shared_types::waypoint::{WAYPOINT_POLICY_TYPE_URL, WAYPOINT_ROUTE_TYPE_URL};
use ztunnel::discovery::xds::{Resources, WAYPOINT_TYPES};

fn one_resource(type_url: &str, body: &[u8]) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        type_url: type_url.into(),
        nonce: "1".into(),
        resources: vec![resource(
            "r",
            "fuzz",
            Any {
                type_url: type_url.into(),
                value: body.to_vec(),
            },
        )],
        ..Default::default()
    }
}

fuzz_target!(|input: &[u8]| {
    let [shape, bytes @ ..] = input else { return };
    let response = if shape % 2 == 0 {
        let type_url = match *shape {
            0..86 => ADDRESS_TYPE_URL,
            86..172 => AUTHORIZATION_TYPE_URL,
            172..214 => WAYPOINT_POLICY_TYPE_URL,
            _ => WAYPOINT_ROUTE_TYPE_URL,
        };
        one_resource(type_url, bytes)
    } else {
        match DeltaDiscoveryResponse::decode(bytes) {
            Ok(response) => response,
            Err(_) => return,
        }
    };

    let mut resources = Resources::new(&WAYPOINT_TYPES);
    let before = resources.versions(&response.type_url);
    let names: Vec<String> = response.resources.iter().map(|r| r.name.clone()).collect();
    let removed = response.removed_resources.clone();
    let type_url = response.type_url.clone();
    let errors = resources.apply(response);
    for e in &errors {
        assert!(
            (e.name.is_empty() && errors.len() == 1) || names.contains(&e.name),
            "refused {e}, a name the response does not hold"
        );
    }
    let after = resources.versions(&type_url);
    for name in after.keys() {
        assert!(
            names.contains(name) || before.contains_key(name),
            "{name} appeared"
        );
    }
    for name in &removed {
        assert!(!after.contains_key(name), "{name} was removed yet is held");
    }

    let everything = DeltaDiscoveryResponse {
        type_url: type_url.clone(),
        removed_resources: after.into_keys().collect(),
        ..Default::default()
    };
    resources.apply(everything);
    assert_eq!(
        resources.state().counts(),
        (0, 0, 0),
        "removing every name left state behind"
    );
    assert!(
        resources.state().waypoint_policies().next().is_none(),
        "removing every name left a waypoint policy behind"
    );
    assert!(
        resources.state().waypoint_routes().next().is_none(),
        "removing every name left a waypoint route behind"
    );
});
