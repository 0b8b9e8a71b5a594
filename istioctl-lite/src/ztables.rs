//! What `istioctl ztunnel-config` prints, column for column: the tables (`-o
//! short`), their filters and sort orders, and the `-o json|yaml` forms (istioctl's
//! Go structs re-marshalled with a 4-space indent, or the raw dump for `all`); and
//! ours, `route`, a waypoint's routes (see [`crate::zroutes`]).

use anyhow::Result;
use serde::Serialize;
use serde_json::Value;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::cli::Output;
use crate::configdump::{
    Cert, Dump, GatewayAddress, Policy, Service, WaypointRoute, Workload, WorkloadState,
};
use crate::output::Table;
use crate::zroutes;

/// One view of the dump, with its filters (istioctl's flags of each subcommand).
#[derive(Debug, Clone)]
pub enum View {
    Workloads {
        address: Option<String>,
        namespace: Option<String>,
        node: Option<String>,
    },
    Services {
        namespace: Option<String>,
    },
    Policies {
        namespace: Option<String>,
    },
    /// A waypoint's routes.
    Routes {
        namespace: Option<String>,
    },
    Certificates,
    Connections {
        namespace: Option<String>,
        direction: String,
        raw: bool,
    },
    All,
}

/// What to print for `view` of the dump `raw` in `format`; `now` decides
/// certificate validity.
pub fn render(
    raw: &str,
    dump: &Dump,
    view: &View,
    format: Output,
    now: OffsetDateTime,
) -> Result<String> {
    match (view, format) {
        (View::All, Output::Json) => Ok(format!("{}\n", raw.trim_end())),
        (View::All, Output::Yaml) => {
            let value: Value = serde_json::from_str(raw)?;
            Ok(serde_yaml::to_string(&crate::ztables::sorted(value))?)
        }
        (_, Output::Json) => go_json(&structured(dump, view)?),
        (_, Output::Yaml) => Ok(serde_yaml::to_string(&sorted(structured(dump, view)?))?),
        (_, Output::Table) => Ok(table(dump, view, now)),
    }
}

/// Go's `json.MarshalIndent(v, "", "    ")`, then a newline.
fn go_json(value: &Value) -> Result<String> {
    let mut out = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
    value.serialize(&mut serializer)?;
    Ok(String::from_utf8(out)? + "\n")
}

/// `value` with object keys sorted, as sigs.k8s.io/yaml writes them.
pub fn sorted(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

fn structured(dump: &Dump, view: &View) -> Result<Value> {
    Ok(match view {
        View::Workloads { .. } => serde_json::to_value(unsorted_workloads(dump, view))?,
        View::Services { namespace } => serde_json::to_value(services_of(dump, namespace))?,
        View::Policies { namespace } => serde_json::to_value(policies_of(dump, namespace))?,
        View::Routes { namespace } => serde_json::to_value(routes_of(dump, namespace))?,
        View::Certificates => serde_json::to_value(&dump.certificates)?,
        View::Connections { namespace, .. } => serde_json::to_value(states_of(dump, namespace))?,
        View::All => Value::Null,
    })
}

fn table(dump: &Dump, view: &View, now: OffsetDateTime) -> String {
    match view {
        View::Workloads { .. } => workloads_table(dump, view),
        View::Services { namespace } => services_table(dump, namespace),
        View::Policies { namespace } => policies_table(dump, namespace),
        View::Routes { namespace } => routes_table(dump, namespace),
        View::Certificates => certificates_table(dump, now),
        View::Connections {
            namespace,
            direction,
            raw,
        } => connections_table(dump, namespace, direction, *raw),
        View::All => {
            let none = None;
            let all = View::Workloads {
                address: None,
                namespace: None,
                node: None,
            };
            // A waypoint's routes after the policies; a ztunnel's dump has none.
            let routes = (!dump.waypoint_routes.is_empty()).then(|| routes_table(dump, &none));
            [
                Some(workloads_table(dump, &all)),
                Some(services_table(dump, &none)),
                Some(policies_table(dump, &none)),
                routes,
                Some(certificates_table(dump, now)),
                Some(connections_table(dump, &none, "", false)),
            ]
            .iter()
            .flatten()
            .map(|t| format!("\n{t}"))
            .collect()
        }
    }
}

fn same(filter: &Option<String>, value: &str) -> bool {
    filter
        .as_ref()
        .is_none_or(|f| f.eq_ignore_ascii_case(value))
}

/// Workloads passing the filters, in dump order (istioctl's `-o json` order).
fn unsorted_workloads<'a>(dump: &'a Dump, view: &View) -> Vec<&'a Workload> {
    let View::Workloads {
        address,
        namespace,
        node,
    } = view
    else {
        return Vec::new();
    };
    dump.workloads
        .iter()
        .filter(|w| {
            address
                .as_ref()
                .is_none_or(|a| w.ips().iter().any(|ip| ip.eq_ignore_ascii_case(a)))
                && same(namespace, &w.namespace)
                && same(node, &w.node)
        })
        .collect()
}

fn services_of<'a>(dump: &'a Dump, namespace: &Option<String>) -> Vec<&'a Service> {
    let mut out: Vec<&Service> = dump
        .services
        .iter()
        .filter(|s| same(namespace, &s.namespace))
        .collect();
    out.sort_by(|a, b| {
        (&a.namespace, &a.name, &a.hostname).cmp(&(&b.namespace, &b.name, &b.hostname))
    });
    out
}

fn policies_of<'a>(dump: &'a Dump, namespace: &Option<String>) -> Vec<&'a Policy> {
    let mut out: Vec<&Policy> = dump
        .policies
        .iter()
        .filter(|p| same(namespace, &p.namespace))
        .collect();
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}

/// Routes passing `--route-namespace`, in dump order (the raw section, filtered).
fn routes_of<'a>(dump: &'a Dump, namespace: &Option<String>) -> Vec<&'a WaypointRoute> {
    dump.waypoint_routes
        .iter()
        .filter(|r| same(namespace, &r.namespace))
        .collect()
}

/// Pod states passing `--workload-namespace` (case-sensitive, as istioctl), by
/// namespace then name.
fn states_of<'a>(dump: &'a Dump, namespace: &Option<String>) -> Vec<&'a WorkloadState> {
    let mut out: Vec<&WorkloadState> = dump
        .workload_state
        .values()
        .filter(|s| namespace.as_ref().is_none_or(|n| *n == s.info.namespace))
        .collect();
    out.sort_by(|a, b| (&a.info.namespace, &a.info.name).cmp(&(&b.info.namespace, &b.info.name)));
    out
}

/// The waypoint's service name, `None` without one, `NA` if no service matches.
fn waypoint_name(waypoint: Option<&GatewayAddress>, services: &[Service]) -> String {
    let Some(w) = waypoint else {
        return "None".into();
    };
    services
        .iter()
        .find(|s| {
            format!("{}/{}", s.namespace, s.hostname) == w.destination
                || s.vip_list().contains(&w.destination)
        })
        .map(|s| s.name.clone())
        .unwrap_or_else(|| "NA".into())
}

fn workloads_table(dump: &Dump, view: &View) -> String {
    let mut rows = unsorted_workloads(dump, view);
    rows.sort_by(|a, b| {
        (format!("{}.{}", a.namespace, a.name), &a.node)
            .cmp(&(format!("{}.{}", b.namespace, b.name), &b.node))
    });
    let mut t = Table::new(
        1,
        &[
            "NAMESPACE",
            "POD NAME",
            "ADDRESS",
            "NODE",
            "WAYPOINT",
            "PROTOCOL",
        ],
    );
    for w in rows {
        let address = if w.ips().is_empty() {
            w.hostname.clone()
        } else {
            w.ips().join(",")
        };
        t.row(vec![
            w.namespace.clone(),
            w.name.clone(),
            address,
            w.node.clone(),
            waypoint_name(w.waypoint.as_ref(), &dump.services),
            w.protocol.clone(),
        ]);
    }
    t.render()
}

/// `healthy/total`: every endpoint counts; healthy ones are those whose workload is
/// in the dump with status `Healthy` (istioctl ignores the endpoint's own status).
fn endpoints(svc: &Service, workloads: &[Workload]) -> String {
    let all = svc.endpoints.as_ref();
    let total = all.map_or(0, |e| e.len());
    let healthy = all
        .into_iter()
        .flat_map(|e| e.values().flatten())
        .filter(|e| {
            workloads
                .iter()
                .any(|w| w.uid == e.workload_uid && w.status == "Healthy")
        })
        .count();
    format!("{healthy}/{total}")
}

fn services_table(dump: &Dump, namespace: &Option<String>) -> String {
    let mut t = Table::new(
        1,
        &[
            "NAMESPACE",
            "SERVICE NAME",
            "SERVICE VIP",
            "WAYPOINT",
            "ENDPOINTS",
        ],
    );
    for s in services_of(dump, namespace) {
        let vips: Vec<&str> = s
            .vip_list()
            .iter()
            .map(|v| v.split_once('/').map_or(v.as_str(), |(_, ip)| ip))
            .collect();
        t.row(vec![
            s.namespace.clone(),
            s.name.clone(),
            vips.join(","),
            waypoint_name(s.waypoint.as_ref(), &dump.services),
            endpoints(s, &dump.workloads),
        ]);
    }
    t.render()
}

fn policies_table(dump: &Dump, namespace: &Option<String>) -> String {
    let mut t = Table::new(1, &["NAMESPACE", "POLICY NAME", "ACTION", "SCOPE"]);
    for p in policies_of(dump, namespace) {
        t.row(vec![
            p.namespace.clone(),
            p.name.clone(),
            p.action.clone(),
            p.scope.clone(),
        ]);
    }
    t.render()
}

/// One row per rule, in the order the waypoint tries them ([`zroutes::rows`]).
fn routes_table(dump: &Dump, namespace: &Option<String>) -> String {
    let mut t = Table::new(1, &zroutes::HEADER);
    for row in zroutes::rows(routes_of(dump, namespace)) {
        t.row(row);
    }
    t.render()
}

/// A decimal serial number in lowercase hex (Go's `%x` of a big.Int); the text as
/// is when it is not decimal.
pub fn decimal_to_hex(decimal: &str) -> String {
    if decimal.is_empty() || !decimal.bytes().all(|b| b.is_ascii_digit()) {
        return decimal.to_owned();
    }
    // Base 2^32 limbs, least significant first.
    let mut limbs: Vec<u32> = vec![0];
    for digit in decimal.bytes().map(|b| u64::from(b - b'0')) {
        let mut carry = digit;
        for limb in limbs.iter_mut() {
            let v = u64::from(*limb) * 10 + carry;
            *limb = v as u32;
            carry = v >> 32;
        }
        if carry > 0 {
            limbs.push(carry as u32);
        }
    }
    let mut hex = String::new();
    for (i, limb) in limbs.iter().rev().enumerate() {
        if i == 0 {
            hex.push_str(&format!("{limb:x}"));
        } else {
            hex.push_str(&format!("{limb:08x}"));
        }
    }
    hex
}

fn valid_at(cert: &Cert, now: OffsetDateTime) -> bool {
    match (
        OffsetDateTime::parse(&cert.valid_from, &Rfc3339),
        OffsetDateTime::parse(&cert.expiration_time, &Rfc3339),
    ) {
        (Ok(from), Ok(to)) => now > from && now < to,
        _ => false,
    }
}

fn na(s: &str) -> String {
    if s.is_empty() {
        "NA".into()
    } else {
        s.to_owned()
    }
}

fn certificates_table(dump: &Dump, now: OffsetDateTime) -> String {
    let mut t = Table::new(
        5,
        &[
            "CERTIFICATE NAME",
            "TYPE",
            "STATUS",
            "VALID CERT",
            "SERIAL NUMBER",
            "NOT AFTER",
            "NOT BEFORE",
        ],
    );
    for c in &dump.certificates {
        let state = if c.state.contains("Unavailable") {
            "Unavailable".to_owned()
        } else {
            c.state.clone()
        };
        let chain: Vec<&Cert> = c.cert_chain.iter().flatten().flatten().collect();
        let roots: Vec<&Cert> = c.root_certs.iter().flatten().flatten().collect();
        if chain.is_empty() {
            t.row(
                [&c.identity, "NA", &state, "false", "NA", "NA", "NA"]
                    .map(str::to_owned)
                    .to_vec(),
            );
            continue;
        }
        let mut row = |kind: &str, cert: &Cert| {
            t.row(vec![
                c.identity.clone(),
                kind.to_owned(),
                state.clone(),
                valid_at(cert, now).to_string(),
                decimal_to_hex(&cert.serial_number),
                na(&cert.expiration_time),
                na(&cert.valid_from),
            ]);
        };
        for (i, cert) in chain.iter().enumerate() {
            // The legacy format carried the root last in the chain.
            let kind = match i {
                0 => "Leaf",
                i if i + 1 == chain.len() && roots.is_empty() => "Root",
                _ => "Intermediate",
            };
            row(kind, cert);
        }
        for cert in &roots {
            row("Root", cert);
        }
    }
    t.render()
}

/// `host:port` named after the service whose first VIP, or the workload whose first
/// IP, is `host`.
fn lookup(addr: &str, dump: &Dump) -> String {
    let Some((host, port)) = addr.rsplit_once(':') else {
        return addr.to_owned();
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let first_vip = |s: &Service| {
        s.vip_list().first().map(|v| {
            v.split_once('/')
                .map_or(v.as_str(), |(_, ip)| ip)
                .to_owned()
        })
    };
    if let Some(s) = dump
        .services
        .iter()
        .find(|s| first_vip(s).as_deref() == Some(host))
    {
        return format!("{}:{port}", s.hostname);
    }
    if let Some(w) = dump
        .workloads
        .iter()
        .find(|w| w.ips().first().map(String::as_str) == Some(host))
    {
        return format!("{}.{}:{port}", w.name, w.namespace);
    }
    addr.to_owned()
}

fn connections_table(
    dump: &Dump,
    namespace: &Option<String>,
    direction: &str,
    raw: bool,
) -> String {
    let name = |a: &str| if raw { a.to_owned() } else { lookup(a, dump) };
    let mut t = Table::new(
        1,
        &[
            "WORKLOAD",
            "DIRECTION",
            "LOCAL",
            "REMOTE",
            "REMOTE TARGET",
            "PROTOCOL",
        ],
    );
    for state in states_of(dump, namespace) {
        let workload = format!("{}.{}", state.info.name, state.info.namespace);
        if direction != "outbound" {
            for c in state.connections.inbound.iter().flatten() {
                t.row(vec![
                    workload.clone(),
                    "Inbound".into(),
                    name(&c.actual_dst),
                    name(&c.src),
                    c.original_dst.clone(),
                    c.protocol.clone(),
                ]);
            }
        }
        if direction != "inbound" {
            for c in state.connections.outbound.iter().flatten() {
                t.row(vec![
                    workload.clone(),
                    "Outbound".into(),
                    name(&c.src),
                    name(&c.actual_dst),
                    name(&c.original_dst),
                    c.protocol.clone(),
                ]);
            }
        }
    }
    t.render()
}

#[cfg(test)]
#[path = "ztables_tests.rs"]
mod tests;
