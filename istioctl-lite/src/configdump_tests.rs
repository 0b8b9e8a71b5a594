//! The contract: Istio's ztunnel dump (the shared fixture) and ours (recorded by
//! ztunnel's admin test) go through one parser and one shape comparison.

use super::*;
use std::path::PathBuf;

fn testdata(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(name)
}

fn read(name: &str) -> String {
    std::fs::read_to_string(testdata(name)).unwrap()
}

#[test]
fn the_testdata_copy_is_the_shared_fixture() {
    let shared = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/fixtures/istio-ztunnel-config-dump.json");
    match std::fs::read_to_string(&shared) {
        Ok(text) => assert_eq!(
            text,
            read("istio-dump.json"),
            "refresh testdata/istio-dump.json"
        ),
        Err(_) => eprintln!("{} not present: comparing the copy only", shared.display()),
    }
}

#[test]
fn both_dumps_parse() {
    let istio = Dump::parse(&read("istio-dump.json")).unwrap();
    assert_eq!(istio.workloads.len(), 7);
    assert_eq!(istio.services[0].endpoints.as_ref().unwrap().len(), 2);
    assert_eq!(istio.certificates[0].state, "Available");
    let pod = &istio.workload_state["0ebd766a-734d-4908-8995-cfa2e598d3ff"];
    assert_eq!((pod.info.name.as_str(), pod.state.as_str()), ("s", "Up"));

    let ours = Dump::parse(&read("ztunnel-dump.json")).unwrap();
    assert_eq!(ours.workloads.len(), 4);
    assert_eq!(ours.services[0].endpoints.as_ref().unwrap().len(), 2);
    assert_eq!(ours.policies[0].action, "Allow");
    let principal = ours.policies[0].rules.as_ref().unwrap()[0]
        .as_ref()
        .unwrap()[0]
        .as_ref()
        .unwrap()[0]
        .as_ref()
        .unwrap()
        .principals
        .as_ref()
        .unwrap()[0]
        .exact
        .clone();
    assert_eq!(principal, "cluster.local/ns/demo/sa/client");
    let pod = &ours.workload_state["0ebd766a-734d-4908-8995-cfa2e598d3ff"];
    assert_eq!(
        pod.connections.outbound.as_ref().unwrap()[0].protocol,
        "HBONE"
    );
}

/// The JSON type of a value, as the comparison sees it.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Where `ours` does not have `istio`'s shape: at every path Istio defines, the
/// same JSON type (null in either is "not set" and matches), and in objects Istio
/// always writes (every element of a list has the key) the key present. Lists are
/// compared element-wise against the union of Istio's elements; objects keyed by
/// data (`endpoints`, `workloadState`, ports) compare their values likewise.
fn shape_diff(path: &str, istio: &Value, ours: &Value, keyed: bool, out: &mut Vec<String>) {
    if istio.is_null() || ours.is_null() {
        return;
    }
    if kind(istio) != kind(ours) {
        out.push(format!(
            "{path}: Istio has {}, ours {}",
            kind(istio),
            kind(ours)
        ));
        return;
    }
    match (istio, ours) {
        (Value::Array(a), Value::Array(b)) => {
            for (i, mine) in b.iter().enumerate() {
                for theirs in a {
                    shape_diff(&format!("{path}[{i}]"), theirs, mine, false, out);
                }
            }
        }
        (Value::Object(a), Value::Object(b)) if keyed => {
            for (k, mine) in b {
                for theirs in a.values() {
                    shape_diff(&format!("{path}.{k}"), theirs, mine, false, out);
                }
            }
        }
        // An externally tagged enum (`{"Localhost": ..}` / `{"SocketAddr": ..}`):
        // another variant is the same type.
        (Value::Object(a), Value::Object(b))
            if a.len() == 1
                && b.len() == 1
                && a.keys()
                    .chain(b.keys())
                    .all(|k| k.starts_with(char::is_uppercase))
                && a.keys().next() != b.keys().next() => {}
        (Value::Object(a), Value::Object(b)) => {
            for (k, theirs) in a {
                let data_keyed = matches!(
                    k.as_str(),
                    "endpoints"
                        | "workloadState"
                        | "port"
                        | "ports"
                        | "stagedServices"
                        | "proxyMetadata"
                );
                match b.get(k) {
                    Some(mine) => shape_diff(&format!("{path}.{k}"), theirs, mine, data_keyed, out),
                    None => out.push(format!("{path}.{k}: missing")),
                }
            }
        }
        _ => {}
    }
}

/// Keys Istio's ztunnel leaves out when empty (`skip_serializing_if` in its
/// `src/state/workload.rs` and `service.rs`), though the fixture's entries all have them.
const SKIPPED_WHEN_EMPTY: [&str; 9] = [
    "uid",
    "trustDomain",
    "serviceAccount",
    "canonicalName",
    "canonicalRevision",
    "workloadName",
    "workloadType",
    "node",
    "ipFamilies",
];

/// Keys every element of Istio's list has (the ones it always writes).
fn always(list: &[Value]) -> Vec<String> {
    let Some(first) = list.first().and_then(Value::as_object) else {
        return Vec::new();
    };
    first
        .keys()
        .filter(|k| list.iter().all(|e| e.get(k.as_str()).is_some()))
        .filter(|k| !SKIPPED_WHEN_EMPTY.contains(&k.as_str()))
        .cloned()
        .collect()
}

#[test]
fn our_dump_has_istios_shape() {
    let istio: Value = serde_json::from_str(&read("istio-dump.json")).unwrap();
    let ours: Value = serde_json::from_str(&read("ztunnel-dump.json")).unwrap();
    let mut diffs = Vec::new();
    // Every top-level section Istio writes, with its type.
    for (k, v) in istio.as_object().unwrap() {
        match ours.get(k) {
            Some(mine) if kind(mine) == kind(v) => {}
            other => diffs.push(format!("{k}: {other:?}")),
        }
    }
    // The sections istioctl reads: same types everywhere, Istio's always-written keys.
    for section in ["workloads", "services", "policies", "certificates"] {
        let (theirs, mine) = (
            istio[section].as_array().unwrap(),
            ours[section].as_array().unwrap(),
        );
        assert!(!mine.is_empty(), "{section}: our recording is empty");
        for (i, element) in mine.iter().enumerate() {
            for key in always(theirs) {
                if element.get(&key).is_none() {
                    diffs.push(format!("{section}[{i}].{key}: missing"));
                }
            }
            for theirs in theirs {
                let (mut a, b) = (theirs.clone(), element);
                // Optional keys (not on every element) only need their type to match.
                if let (Some(a), Some(b)) = (a.as_object_mut(), b.as_object()) {
                    a.retain(|k, _| b.contains_key(k));
                }
                shape_diff(&format!("{section}[{i}]"), &a, b, false, &mut diffs);
            }
        }
    }
    shape_diff(
        "workloadState",
        &istio["workloadState"],
        &ours["workloadState"],
        true,
        &mut diffs,
    );
    shape_diff(
        "staticConfig",
        &istio["staticConfig"],
        &ours["staticConfig"],
        false,
        &mut diffs,
    );
    shape_diff(
        "version",
        &istio["version"],
        &ours["version"],
        false,
        &mut diffs,
    );
    // `config`: Istio's settings we have must carry Istio's types (we lack some,
    // listed in docs/admin.md).
    let theirs = istio["config"].as_object().unwrap();
    for (k, mine) in ours["config"].as_object().unwrap() {
        if let Some(theirs) = theirs.get(k) {
            let keyed = k == "proxyMetadata";
            shape_diff(&format!("config.{k}"), theirs, mine, keyed, &mut diffs);
        }
    }
    assert!(
        diffs.is_empty(),
        "our dump differs from Istio's shape:\n{}",
        diffs.join("\n")
    );
}

#[test]
fn the_comparison_catches_a_wrong_shape() {
    let istio: Value = serde_json::from_str(&read("istio-dump.json")).unwrap();
    let mut ours = istio.clone();
    ours["workloads"][0]["services"] = serde_json::json!({"default/s": {"80": 80}});
    ours["services"][0]["endpoints"]["x"] = serde_json::json!({"port": [1]});
    let mut diffs = Vec::new();
    shape_diff("", &istio, &ours, false, &mut diffs);
    assert!(
        diffs.iter().any(|d| d.contains("workloads[0].services")),
        "{diffs:?}"
    );
    assert!(
        diffs.iter().any(|d| d.contains("endpoints.x.port")),
        "{diffs:?}"
    );
}

#[test]
fn parsing_is_lenient_as_go_but_types_must_match() {
    let d = Dump::parse(
        r#"{"workloads":{"a":{"name":"a","extra":1,"node":null}},"services":null,"version":{}}"#,
    )
    .unwrap();
    assert_eq!(d.workloads[0].name, "a");
    assert!(d.services.is_empty());
    assert!(Dump::parse("[]").is_err());
    assert!(Dump::parse("nope").is_err());
    let err = Dump::parse(r#"{"workloads": 3}"#).unwrap_err().to_string();
    assert!(
        err.starts_with("error unmarshalling config dump response from ztunnel"),
        "{err}"
    );
    assert!(Dump::parse(r#"{"workloads": [{"capacity": "one"}]}"#).is_err());
}

#[test]
fn a_waypoints_routes_are_read_and_ztunnel_dumps_have_none() {
    let waypoint = Dump::parse(&read("waypoint-dump.json")).unwrap();
    let keys: Vec<String> = waypoint
        .waypoint_routes
        .iter()
        .map(|r| format!("{}/{}/{}", r.kind, r.namespace, r.name))
        .collect();
    assert_eq!(
        keys,
        [
            "HTTPRoute/demo/broken",
            "HTTPRoute/demo/reviews",
            "TCPRoute/demo/db"
        ]
    );
    let reviews = &waypoint.waypoint_routes[1];
    assert_eq!(
        (reviews.generation, reviews.creation_timestamp.as_str()),
        (2, "2025-01-01T00:00:00Z")
    );
    assert_eq!(reviews.spec["rules"][0]["name"], "canary");
    for name in ["istio-dump.json", "ztunnel-dump.json"] {
        let dump = Dump::parse(&read(name)).unwrap();
        assert!(dump.waypoint_routes.is_empty(), "{name}");
        // Written back without the section, as before.
        let written = serde_json::to_value(&dump).unwrap();
        assert!(written.get("waypointRoutes").is_none(), "{name}");
    }
}

#[test]
fn route_entries_are_checked_one_by_one() {
    // As the other list sections: an object's values, null as absent.
    let d =
        Dump::parse(r#"{"waypointRoutes": {"x": {"kind": "TCPRoute", "name": "db", "extra": 1}}}"#)
            .unwrap();
    assert_eq!(d.waypoint_routes[0].name, "db");
    assert!(Dump::parse(r#"{"waypointRoutes": null}"#)
        .unwrap()
        .waypoint_routes
        .is_empty());
    // Any spec is read: whether it compiles is the view's to show.
    let d = Dump::parse(r#"{"waypointRoutes": [{"kind": "Nope", "spec": "text"}]}"#).unwrap();
    assert_eq!(d.waypoint_routes[0].spec, "text");
    // A wrong type names the entry.
    for (text, want) in [
        (
            r#"{"waypointRoutes": [{"name": "a"}, {"kind": 3}]}"#,
            "waypointRoutes[1]: invalid type: integer `3`, expected a string",
        ),
        (
            r#"{"waypointRoutes": [7]}"#,
            "waypointRoutes[0]: invalid type",
        ),
        (
            r#"{"waypointRoutes": "all"}"#,
            "waypointRoutes: invalid type",
        ),
        (
            r#"{"waypointRoutes": [{"generation": "2"}]}"#,
            "waypointRoutes[0]: invalid type",
        ),
    ] {
        let err = Dump::parse(text).unwrap_err().to_string();
        assert!(
            err.starts_with("error unmarshalling config dump response from ztunnel: ")
                && err.contains(want),
            "{text}: {err}"
        );
    }
    // Every other section is still read as before.
    assert!(Dump::parse(r#"{"waypointRoutes": [], "workloads": 3}"#).is_err());
}
