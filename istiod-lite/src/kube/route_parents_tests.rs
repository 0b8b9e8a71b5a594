use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::*;

const DOMAIN: &str = "cluster.local";

fn at(seconds: i64) -> Time {
    Time(Timestamp::from_second(seconds).unwrap())
}

fn services(keys: &[(&str, &str)]) -> HashSet<ServiceKey> {
    keys.iter()
        .map(|(ns, name)| (ns.to_string(), name.to_string()))
        .collect()
}

fn web_parent() -> Value {
    json!({"group": "", "kind": "Service", "name": "web", "port": 80})
}

/// An HTTPRoute in `shop` with `parents`, sending to `backends`, its status `parents`.
fn route(parents: Value, backends: Value, status: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "web", "namespace": "shop", "generation": 4},
        "spec": {"parentRefs": parents, "rules": [{"backendRefs": backends}]},
        "status": {"parents": status},
    }))
    .unwrap()
}

/// The usual case: `web` (a Service parent) sending to `web-v2`, no status yet.
fn web_to_v2() -> DynamicObject {
    route(
        json!([web_parent()]),
        json!([{"name": "web-v2", "port": 80}]),
        json!([]),
    )
}

/// (type, status, reason, message) of each condition of entry `i`.
fn conditions(parents: &[Value], i: usize) -> Vec<(String, String, String, String)> {
    parents[i]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
            (s("type"), s("status"), s("reason"), s("message"))
        })
        .collect()
}

fn condition(
    kind: &str,
    status: &str,
    reason: &str,
    message: &str,
) -> (String, String, String, String) {
    (kind.into(), status.into(), reason.into(), message.into())
}

#[test]
fn a_route_to_existing_services_is_accepted_with_its_refs_resolved() {
    let r = web_to_v2();
    let parents = parents_status(
        &r,
        &services(&[("shop", "web"), ("shop", "web-v2")]),
        Ok(()),
        DOMAIN,
        &at(1000),
    );
    assert_eq!(parents.len(), 1);
    assert_eq!(parents[0]["parentRef"], web_parent(), "the ref as written");
    assert_eq!(parents[0]["controllerName"], "istio.io/gateway-controller");
    assert_eq!(
        conditions(&parents, 0),
        [
            condition("Accepted", "True", "Accepted", "Route was valid"),
            condition(
                "ResolvedRefs",
                "True",
                "ResolvedRefs",
                "All references resolved"
            ),
        ]
    );
    for c in parents[0]["conditions"].as_array().unwrap() {
        assert_eq!(c["observedGeneration"], 4);
        assert_eq!(c["lastTransitionTime"], "1970-01-01T00:16:40Z");
    }
}

#[test]
fn a_missing_parent_service_is_no_matching_parent() {
    let r = web_to_v2();
    let parents = parents_status(&r, &services(&[("shop", "web-v2")]), Ok(()), DOMAIN, &at(0));
    assert_eq!(
        conditions(&parents, 0)[0],
        condition(
            "Accepted",
            "False",
            "NoMatchingParent",
            r#"parent service: "web" not found"#
        )
    );
}

#[test]
fn a_spec_that_does_not_compile_is_not_accepted() {
    let r = web_to_v2();
    let parents = parents_status(
        &r,
        &services(&[("shop", "web"), ("shop", "web-v2")]),
        Err("rule 0: a regular expression does not parse".into()),
        DOMAIN,
        &at(0),
    );
    assert_eq!(
        conditions(&parents, 0),
        [
            condition(
                "Accepted",
                "False",
                "UnsupportedValue",
                "rule 0: a regular expression does not parse"
            ),
            condition(
                "ResolvedRefs",
                "True",
                "ResolvedRefs",
                "All references resolved"
            ),
        ]
    );
}

#[test]
fn backends_that_do_not_resolve_are_reported_as_istiod_words_them() {
    let present = services(&[("shop", "web"), ("other", "db")]);
    let resolved = |backends: Value| {
        let r = route(json!([web_parent()]), backends, json!([]));
        conditions(&parents_status(&r, &present, Ok(()), DOMAIN, &at(0)), 0)[1].clone()
    };
    assert_eq!(
        resolved(json!([{"name": "gone", "port": 80}])),
        condition(
            "ResolvedRefs",
            "False",
            "BackendNotFound",
            "backend(gone.shop.svc.cluster.local) not found"
        )
    );
    // In another namespace: found there, no ReferenceGrant needed (istiod's mesh rule).
    assert_eq!(
        resolved(json!([{"name": "db", "namespace": "other", "port": 5432}])).1,
        "True"
    );
    assert_eq!(
        resolved(
            json!([{"group": "multicluster.x-k8s.io", "kind": "ServiceImport", "name": "web", "port": 80}])
        ),
        condition(
            "ResolvedRefs",
            "False",
            "InvalidKind",
            r#"referencing unsupported backendRef: group "multicluster.x-k8s.io" kind "ServiceImport""#
        )
    );
    // A backend with weight 0 takes no traffic and is not checked.
    assert_eq!(
        resolved(json!([{"name": "web", "port": 80}, {"name": "gone", "port": 80, "weight": 0}])).1,
        "True"
    );
    // The last failure is the one reported.
    assert_eq!(
        resolved(json!([{"name": "a", "port": 80}, {"name": "b", "port": 80}])).3,
        "backend(b.shop.svc.cluster.local) not found"
    );
}

#[test]
fn a_missing_mirror_is_joined_to_the_rules_backend_failure() {
    let mut r = route(
        json!([web_parent()]),
        json!([{"name": "gone", "port": 80}]),
        json!([]),
    );
    r.data["spec"]["rules"][0]["filters"] = json!([{
        "type": "RequestMirror",
        "requestMirror": {"backendRef": {"name": "shadow", "port": 80}},
    }]);
    let parents = parents_status(&r, &services(&[("shop", "web")]), Ok(()), DOMAIN, &at(0));
    assert_eq!(
        conditions(&parents, 0)[1].3,
        "backend(gone.shop.svc.cluster.local) not found; backend(shadow.shop.svc.cluster.local) not found"
    );
}

#[test]
fn only_service_parents_get_an_entry_and_other_controllers_entries_are_kept() {
    let theirs = json!({
        "parentRef": {"name": "ingress"},
        "controllerName": "example.com/gateway",
        "conditions": [{"type": "Accepted", "status": "True"}],
    });
    let parents_refs = json!([
        {"name": "ingress"},
        {"group": "", "kind": "Service", "name": "api"},
        web_parent(),
        web_parent(),
    ]);
    let r = route(parents_refs, json!([]), json!([theirs.clone()]));
    let parents = parents_status(
        &r,
        &services(&[("shop", "web"), ("shop", "api")]),
        Ok(()),
        DOMAIN,
        &at(0),
    );
    let refs: Vec<&Value> = parents.iter().map(|p| &p["parentRef"]).collect();
    // Theirs first, as stored; then ours, one per distinct ref, in istiod's
    // (descending) order of `group/kind/name/section/port.namespace`.
    assert_eq!(
        refs,
        [
            &theirs["parentRef"],
            &web_parent(),
            &json!({"group": "", "kind": "Service", "name": "api"})
        ]
    );
    assert_eq!(parents[0], theirs);
}

#[test]
fn a_status_recomputed_from_itself_is_unchanged() {
    let present = services(&[("shop", "web"), ("shop", "web-v2")]);
    let backends = json!([{"name": "web-v2", "port": 80}]);
    let first = parents_status(
        &route(json!([web_parent()]), backends.clone(), json!([])),
        &present,
        Ok(()),
        DOMAIN,
        &at(1000),
    );
    let again = parents_status(
        &route(json!([web_parent()]), backends, json!(first.clone())),
        &present,
        Ok(()),
        DOMAIN,
        &at(2000),
    );
    assert_eq!(
        again, first,
        "no write loop: nothing changed, nothing to write"
    );
}

#[test]
fn last_transition_time_moves_only_with_the_status() {
    let backends = json!([{"name": "web-v2", "port": 80}]);
    let stored = parents_status(
        &route(json!([web_parent()]), backends.clone(), json!([])),
        &services(&[("shop", "web")]),
        Ok(()),
        DOMAIN,
        &at(1000),
    );
    // The backend appears: ResolvedRefs turns True at 2000, Accepted stays as it was.
    let mut r = route(json!([web_parent()]), backends, json!(stored));
    let parents = parents_status(
        &r,
        &services(&[("shop", "web"), ("shop", "web-v2")]),
        Ok(()),
        DOMAIN,
        &at(2000),
    );
    let times = |parents: &[Value]| -> Vec<Value> {
        parents[0]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["lastTransitionTime"].clone())
            .collect()
    };
    assert_eq!(
        times(&parents),
        [json!("1970-01-01T00:16:40Z"), json!("1970-01-01T00:33:20Z")]
    );

    // A new generation with the same outcome: observedGeneration follows, the time
    // does not.
    r.data["status"]["parents"] = json!(parents.clone());
    r.metadata.generation = Some(5);
    let newer = parents_status(
        &r,
        &services(&[("shop", "web"), ("shop", "web-v2")]),
        Ok(()),
        DOMAIN,
        &at(3000),
    );
    assert_eq!(times(&newer), times(&parents));
    assert!(newer[0]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["observedGeneration"] == 5));
}

#[test]
fn our_entry_for_a_removed_parent_is_dropped() {
    let stale = parents_status(
        &route(json!([web_parent()]), json!([]), json!([])),
        &services(&[("shop", "web")]),
        Ok(()),
        DOMAIN,
        &at(0),
    );
    let r = route(json!([{"name": "ingress"}]), json!([]), json!(stale));
    assert_eq!(
        parents_status(&r, &services(&[("shop", "web")]), Ok(()), DOMAIN, &at(0)),
        Vec::<Value>::new()
    );
}
