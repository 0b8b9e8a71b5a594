//! Server-side printing: `kubectl get` asks for `as=Table` and prints the columns the
//! server chooses, so the common types get the columns a real cluster shows.

use serde_json::{json, Value};

use super::meta;
use super::resources::Resource;

/// Whether the Accept header asks for a meta.k8s.io Table.
pub fn wants_table(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table"))
}

struct Column {
    name: &'static str,
    kind: &'static str,
    priority: u8,
    cell: fn(&Value) -> Value,
}

fn columns(rs: &Resource) -> Vec<Column> {
    let name = Column {
        name: "Name",
        kind: "string",
        priority: 0,
        cell: |o| json!(meta::name_of(o)),
    };
    let age = Column {
        name: "Age",
        kind: "string",
        priority: 0,
        cell: age,
    };
    match (rs.group, rs.plural) {
        ("", "pods") => vec![
            name,
            Column {
                name: "Ready",
                kind: "string",
                priority: 0,
                cell: pod_ready,
            },
            Column {
                name: "Status",
                kind: "string",
                priority: 0,
                cell: pod_status,
            },
            Column {
                name: "Restarts",
                kind: "string",
                priority: 0,
                cell: pod_restarts,
            },
            age,
            Column {
                name: "IP",
                kind: "string",
                priority: 1,
                cell: |o| str_at(o, "/status/podIP", "<none>"),
            },
            Column {
                name: "Node",
                kind: "string",
                priority: 1,
                cell: |o| str_at(o, "/spec/nodeName", "<none>"),
            },
        ],
        ("", "namespaces") => vec![
            name,
            Column {
                name: "Status",
                kind: "string",
                priority: 0,
                cell: |o| str_at(o, "/status/phase", ""),
            },
            age,
        ],
        ("", "services") => vec![
            name,
            Column {
                name: "Type",
                kind: "string",
                priority: 0,
                cell: |o| str_at(o, "/spec/type", "ClusterIP"),
            },
            Column {
                name: "Cluster-IP",
                kind: "string",
                priority: 0,
                cell: |o| str_at(o, "/spec/clusterIP", "<none>"),
            },
            Column {
                name: "Ports",
                kind: "string",
                priority: 0,
                cell: service_ports,
            },
            age,
        ],
        ("", "nodes") => vec![
            name,
            Column {
                name: "Status",
                kind: "string",
                priority: 0,
                cell: node_ready,
            },
            age,
        ],
        // `kubectl get events`: what happened to which object, and when last.
        ("", "events") => vec![
            Column {
                name: "Last Seen",
                kind: "string",
                priority: 0,
                cell: event_last_seen,
            },
            Column {
                name: "Type",
                kind: "string",
                priority: 0,
                cell: |o| str_at(o, "/type", ""),
            },
            Column {
                name: "Reason",
                kind: "string",
                priority: 0,
                cell: |o| str_at(o, "/reason", ""),
            },
            Column {
                name: "Object",
                kind: "string",
                priority: 0,
                cell: event_object,
            },
            Column {
                name: "Message",
                kind: "string",
                priority: 0,
                cell: |o| str_at(o, "/message", ""),
            },
        ],
        ("apps", "daemonsets") => vec![
            name,
            Column {
                name: "Desired",
                kind: "integer",
                priority: 0,
                cell: |o| int_at(o, "/status/desiredNumberScheduled"),
            },
            Column {
                name: "Ready",
                kind: "integer",
                priority: 0,
                cell: |o| int_at(o, "/status/numberReady"),
            },
            age,
        ],
        _ => vec![name, age],
    }
}

/// A Table of `objects`; each row carries the full object (kubectl reads the namespace
/// and labels from it for `-A`, `--show-labels` and `-L`).
pub fn render(rs: &Resource, objects: &[Value], resource_version: &str) -> Value {
    let cols = columns(rs);
    let definitions: Vec<Value> = cols
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "type": c.kind,
                "format": if c.name == "Name" { "name" } else { "" },
                "description": "",
                "priority": c.priority,
            })
        })
        .collect();
    let rows: Vec<Value> = objects
        .iter()
        .map(
            |o| json!({"cells": cols.iter().map(|c| (c.cell)(o)).collect::<Vec<_>>(), "object": o}),
        )
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": definitions,
        "rows": rows,
    })
}

fn str_at(o: &Value, pointer: &str, default: &str) -> Value {
    json!(o
        .pointer(pointer)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or(default))
}

fn int_at(o: &Value, pointer: &str) -> Value {
    json!(o.pointer(pointer).and_then(Value::as_i64).unwrap_or(0))
}

fn age(o: &Value) -> Value {
    since(o, "/metadata/creationTimestamp")
}

fn event_last_seen(o: &Value) -> Value {
    for at in [
        "/lastTimestamp",
        "/eventTime",
        "/metadata/creationTimestamp",
    ] {
        if o.pointer(at).and_then(Value::as_str).is_some() {
            return since(o, at);
        }
    }
    json!("<unknown>")
}

/// `pod/name`, as kubectl names an event's object.
fn event_object(o: &Value) -> Value {
    let kind = o
        .pointer("/involvedObject/kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_ascii_lowercase();
    let name = o
        .pointer("/involvedObject/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    json!(format!("{kind}/{name}"))
}

/// The time since the timestamp at `pointer`, as kubectl prints ages.
fn since(o: &Value, pointer: &str) -> Value {
    let Some(secs) = o
        .pointer(pointer)
        .and_then(Value::as_str)
        .and_then(meta::age_seconds)
    else {
        return json!("<unknown>");
    };
    json!(match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    })
}

fn container_statuses(o: &Value) -> &[Value] {
    o.pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn pod_ready(o: &Value) -> Value {
    let total = o
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let ready = container_statuses(o)
        .iter()
        .filter(|s| s.get("ready").and_then(Value::as_bool) == Some(true))
        .count();
    json!(format!("{ready}/{total}"))
}

/// kubectl's STATUS: the phase (or `status.reason`), overridden by a container's
/// waiting or terminated reason (`ContainerCreating`, `CrashLoopBackOff`, `Error`).
fn pod_status(o: &Value) -> Value {
    if o.pointer("/metadata/deletionTimestamp").is_some() {
        return json!("Terminating");
    }
    let mut reason = o
        .pointer("/status/reason")
        .or_else(|| o.pointer("/status/phase"))
        .and_then(Value::as_str)
        .unwrap_or("Unknown")
        .to_owned();
    let mut running = false;
    for c in container_statuses(o).iter().rev() {
        let state = &c["state"];
        if let Some(waiting) = state["waiting"]["reason"]
            .as_str()
            .filter(|r| !r.is_empty())
        {
            reason = waiting.to_owned();
        } else if let Some(done) = state["terminated"]["reason"]
            .as_str()
            .filter(|r| !r.is_empty())
        {
            reason = done.to_owned();
        } else if state["running"].is_object() && c["ready"] == true {
            running = true;
        }
    }
    if reason == "Completed" && running {
        reason = "Running".into();
    }
    json!(reason)
}

fn pod_restarts(o: &Value) -> Value {
    let restarts: i64 = container_statuses(o)
        .iter()
        .filter_map(|s| s.get("restartCount").and_then(Value::as_i64))
        .sum();
    json!(restarts.to_string())
}

fn service_ports(o: &Value) -> Value {
    let ports: Vec<String> = o
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|p| {
            let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
            let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
            format!("{port}/{proto}")
        })
        .collect();
    json!(if ports.is_empty() {
        "<none>".to_string()
    } else {
        ports.join(",")
    })
}

fn node_ready(o: &Value) -> Value {
    let ready = o
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| {
            c.get("type").and_then(Value::as_str) == Some("Ready")
                && c.get("status").and_then(Value::as_str) == Some("True")
        });
    json!(if ready { "Ready" } else { "NotReady" })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::find;

    #[test]
    fn pod_table() {
        let pods = find("", "v1", "pods").unwrap();
        let pod = json!({"metadata": {"name": "p", "creationTimestamp": meta::now_rfc3339()},
            "spec": {"containers": [{"name": "a"}], "nodeName": "node1"},
            "status": {"phase": "Running", "containerStatuses": [{"ready": true, "restartCount": 2}]}});
        let t = render(pods, &[pod], "5");
        assert_eq!(
            t["rows"][0]["cells"],
            json!(["p", "1/1", "Running", "2", "0s", "<none>", "node1"])
        );
        assert_eq!(t["columnDefinitions"].as_array().unwrap().len(), 7);
        assert!(wants_table(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        ));
        assert!(!wants_table("application/json"));
    }
}
