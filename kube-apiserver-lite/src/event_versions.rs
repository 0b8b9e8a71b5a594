//! One store of Events, two APIs: `core/v1` (`involvedObject`, `message`, `source`,
//! `count`) and `events.k8s.io/v1` (`regarding`, `note`, `reportingController`,
//! `deprecated*`). Objects are stored in the core form and converted at the edge, as
//! kube-apiserver serves one resource through both groups.

use serde_json::{Map, Value};

/// (core field, events.k8s.io field) pairs that carry the same value.
const RENAMED: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
];

/// A stored (core) Event as events.k8s.io/v1 shows it.
pub fn to_events_v1(core: &Value) -> Value {
    let mut out = rename(core, |core_name| {
        RENAMED
            .iter()
            .find(|(c, _)| *c == core_name)
            .map(|(_, n)| *n)
    });
    // Older writers name the reporter only in `source`.
    if out.get("reportingController").is_none() {
        if let Some(component) = core["source"]["component"].as_str() {
            out.insert("reportingController".into(), Value::from(component));
        }
    }
    if out.get("reportingInstance").is_none() {
        if let Some(host) = core["source"]["host"].as_str() {
            out.insert("reportingInstance".into(), Value::from(host));
        }
    }
    Value::Object(out)
}

/// An events.k8s.io/v1 Event in the stored (core) form.
pub fn to_core(v1: &Value) -> Value {
    Value::Object(rename(v1, |new_name| {
        RENAMED
            .iter()
            .find(|(_, n)| *n == new_name)
            .map(|(c, _)| *c)
    }))
}

fn rename(obj: &Value, to: impl Fn(&str) -> Option<&'static str>) -> Map<String, Value> {
    obj.as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (to(k).map_or_else(|| k.clone(), str::to_owned), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn both_forms_carry_the_same_event() {
        let core = json!({"metadata": {"name": "p.1"}, "involvedObject": {"kind": "Pod", "name": "p"},
            "reason": "Failed", "message": "why", "type": "Warning", "count": 2,
            "source": {"component": "kubelet", "host": "node-1"}});
        let v1 = to_events_v1(&core);
        assert_eq!(v1["regarding"]["name"], "p");
        assert_eq!(v1["note"], "why");
        assert_eq!(v1["reportingController"], "kubelet");
        assert_eq!(v1["reportingInstance"], "node-1");
        assert_eq!(v1["deprecatedCount"], 2);
        assert_eq!(to_core(&v1)["involvedObject"], core["involvedObject"]);
        assert_eq!(to_core(&v1)["message"], "why");
    }
}
