//! Server-side printing: `kubectl get` asks for `as=Table` and prints the columns the
//! server chooses, so the common types get the columns a real cluster shows.

use serde_json::{json, Value};

use super::crds::PrinterColumn;
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
/// and labels from it for `-A`, `--show-labels` and `-L`). A custom resource's table
/// has its CRD's printer columns (`custom`), after the name.
pub fn render(
    rs: &Resource,
    custom: Option<&[PrinterColumn]>,
    objects: &[Value],
    resource_version: &str,
) -> Value {
    let cols = columns(rs);
    let (definitions, rows) = match custom {
        Some(printer) if !printer.is_empty() => custom_table(printer, objects),
        _ => builtin_table(&cols, objects),
    };
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": definitions,
        "rows": rows,
    })
}

fn builtin_table(cols: &[Column], objects: &[Value]) -> (Vec<Value>, Vec<Value>) {
    let definitions = cols
        .iter()
        .map(|c| definition(c.name, c.kind, c.priority as u64))
        .collect();
    let rows = objects
        .iter()
        .map(
            |o| json!({"cells": cols.iter().map(|c| (c.cell)(o)).collect::<Vec<_>>(), "object": o}),
        )
        .collect();
    (definitions, rows)
}

fn definition(name: &str, kind: &str, priority: u64) -> Value {
    json!({
        "name": name,
        "type": kind,
        "format": if name == "Name" { "name" } else { "" },
        "description": "",
        "priority": priority,
    })
}

/// Name, then each printer column: its JSONPath's values joined by commas, a `date`
/// shown as an age.
fn custom_table(printer: &[PrinterColumn], objects: &[Value]) -> (Vec<Value>, Vec<Value>) {
    let mut definitions = vec![definition("Name", "string", 0)];
    definitions.extend(
        printer
            .iter()
            .map(|c| definition(&c.name, &c.kind, c.priority)),
    );
    let rows = objects
        .iter()
        .map(|o| {
            let mut cells = vec![json!(meta::name_of(o))];
            for c in printer {
                let found = json_path(o, &c.json_path);
                cells.push(match (c.kind.as_str(), found.as_slice()) {
                    (_, []) => Value::Null,
                    ("date", [Value::String(t)]) => since(&json!({"t": t}), "/t"),
                    (_, [one]) => one.clone(),
                    (_, many) => json!(many
                        .iter()
                        .map(|v| v
                            .as_str()
                            .map(String::from)
                            .unwrap_or_else(|| v.to_string()))
                        .collect::<Vec<_>>()
                        .join(",")),
                });
            }
            json!({"cells": cells, "object": o})
        })
        .collect();
    (definitions, rows)
}

/// The values a kubectl JSONPath selects: `.a.b`, `[0]`, `[*]` and filters of the
/// form `[?(@.field=="value")]`, the forms printer columns use.
fn json_path(obj: &Value, path: &str) -> Vec<Value> {
    let mut current = vec![obj.clone()];
    let mut rest = path.trim().trim_start_matches('{').trim_end_matches('}');
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            let field = &after[..end];
            current = current
                .iter()
                .filter_map(|v| v.get(field).cloned())
                .collect();
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix('[') {
            let Some(end) = after.find(']') else {
                return Vec::new();
            };
            let selector = &after[..end];
            rest = &after[end + 1..];
            let items = current
                .iter()
                .filter_map(Value::as_array)
                .flatten()
                .cloned();
            current = if selector == "*" {
                items.collect()
            } else if let Ok(i) = selector.parse::<usize>() {
                current
                    .iter()
                    .filter_map(|v| v.as_array().and_then(|a| a.get(i)).cloned())
                    .collect()
            } else if let Some((field, want)) = selector
                .strip_prefix("?(@.")
                .and_then(|f| f.strip_suffix(')'))
                .and_then(|f| f.split_once("=="))
            {
                let want = want.trim().trim_matches('"').trim_matches('\'');
                items
                    .filter(|item| item.get(field.trim()).and_then(Value::as_str) == Some(want))
                    .collect()
            } else {
                return Vec::new();
            };
        } else {
            return Vec::new();
        }
    }
    current
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
    use crate::resources::builtin as find;

    #[test]
    fn pod_table() {
        let pods = find("", "v1", "pods").unwrap();
        let pod = json!({"metadata": {"name": "p", "creationTimestamp": meta::now_rfc3339()},
            "spec": {"containers": [{"name": "a"}], "nodeName": "node1"},
            "status": {"phase": "Running", "containerStatuses": [{"ready": true, "restartCount": 2}]}});
        let t = render(pods, None, &[pod], "5");
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

    #[test]
    fn printer_columns_follow_their_json_paths() {
        let column = |name: &str, kind: &str, path: &str| PrinterColumn {
            name: name.into(),
            kind: kind.into(),
            json_path: path.into(),
            priority: 0,
        };
        let gateway = json!({"metadata": {"name": "wp"},
            "spec": {"gatewayClassName": "istio-waypoint"},
            "status": {"addresses": [{"value": "10.96.0.9"}, {"value": "fd00::9"}],
                       "conditions": [{"type": "Accepted", "status": "True"}, {"type": "Programmed", "status": "False"}]}});
        let t = render(
            find("", "v1", "pods").unwrap(),
            Some(&[
                column("Class", "string", ".spec.gatewayClassName"),
                column("Address", "string", ".status.addresses[*].value"),
                column(
                    "Programmed",
                    "string",
                    ".status.conditions[?(@.type==\"Programmed\")].status",
                ),
                column("Missing", "string", ".spec.nothing"),
            ]),
            &[gateway],
            "1",
        );
        assert_eq!(
            t["rows"][0]["cells"],
            json!(["wp", "istio-waypoint", "10.96.0.9,fd00::9", "False", null])
        );
    }
}
