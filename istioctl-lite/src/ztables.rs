//! istioctl's `ztunnel-config` tables, column for column (headers, sort order,
//! `None` waypoints, `healthy/total` endpoints, Leaf/Root certificate rows).

use anyhow::Result;
use serde::Serialize;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::cli::{ConfigSection, Output, ZtunnelConfigArgs};
use crate::configdump::{Cert, Dump, Service, Workload};
use crate::output::{print_structured, Table};

/// Filters, as istioctl's `--node`, `--workload-namespace`, `--address`.
#[derive(Debug, Default, Clone)]
pub struct Filter {
    pub node: Option<String>,
    pub namespace: Option<String>,
    pub address: Option<String>,
}

impl Filter {
    pub fn from_args(args: &ZtunnelConfigArgs) -> Self {
        Filter {
            node: args.node.clone(),
            namespace: args.workload_namespace.clone(),
            address: args.address.clone(),
        }
    }

    fn namespace_ok(&self, ns: &str) -> bool {
        self.namespace
            .as_ref()
            .is_none_or(|n| n.eq_ignore_ascii_case(ns))
    }

    fn workload_ok(&self, w: &Workload) -> bool {
        self.namespace_ok(&w.namespace)
            && self
                .node
                .as_ref()
                .is_none_or(|n| n.eq_ignore_ascii_case(&w.node))
            && self
                .address
                .as_ref()
                .is_none_or(|a| w.workload_ips.iter().any(|ip| ip.eq_ignore_ascii_case(a)))
    }
}

/// Prints one section (or all, each preceded by a blank line like istioctl).
pub fn print(dump: &Dump, section: ConfigSection, filter: &Filter, format: Output) -> Result<()> {
    if format != Output::Table {
        return print_structured(format, &structured(dump, section, filter));
    }
    print!(
        "{}",
        render(dump, section, filter, OffsetDateTime::now_utc())
    );
    Ok(())
}

/// Table text; `now` decides certificate validity (fixed in tests).
pub fn render(dump: &Dump, section: ConfigSection, filter: &Filter, now: OffsetDateTime) -> String {
    match section {
        ConfigSection::Workloads => workloads(dump, filter),
        ConfigSection::Services => services(dump, filter),
        ConfigSection::Policies => policies(dump, filter),
        ConfigSection::Certificates => certificates(dump, now),
        ConfigSection::Connections => connections(dump, filter),
        ConfigSection::All => [
            workloads(dump, filter),
            services(dump, filter),
            policies(dump, filter),
            certificates(dump, now),
            connections(dump, filter),
        ]
        .iter()
        .map(|t| format!("\n{t}"))
        .collect(),
    }
}

fn structured(dump: &Dump, section: ConfigSection, filter: &Filter) -> serde_json::Value {
    let value = match section {
        ConfigSection::Workloads => serde_json::to_value(filtered_workloads(dump, filter)),
        ConfigSection::Services => serde_json::to_value(filtered_services(dump, filter)),
        ConfigSection::Policies => serde_json::to_value(filtered_policies(dump, filter)),
        ConfigSection::Certificates => serde_json::to_value(&dump.certificates),
        ConfigSection::Connections => serde_json::to_value(filtered_pods(dump, filter)),
        ConfigSection::All => serde_json::to_value(dump),
    };
    value.unwrap_or_default()
}

fn filtered_workloads<'a>(dump: &'a Dump, filter: &Filter) -> Vec<&'a Workload> {
    let mut out: Vec<&Workload> = dump
        .workloads
        .iter()
        .filter(|w| filter.workload_ok(w))
        .collect();
    out.sort_by(|a, b| {
        (format!("{}.{}", a.namespace, a.name), &a.node)
            .cmp(&(format!("{}.{}", b.namespace, b.name), &b.node))
    });
    out
}

fn filtered_services<'a>(dump: &'a Dump, filter: &Filter) -> Vec<&'a Service> {
    let mut out: Vec<&Service> = dump
        .services
        .iter()
        .filter(|s| filter.namespace_ok(&s.namespace))
        .collect();
    out.sort_by(|a, b| {
        (&a.namespace, &a.name, &a.hostname).cmp(&(&b.namespace, &b.name, &b.hostname))
    });
    out
}

fn filtered_policies<'a>(dump: &'a Dump, filter: &Filter) -> Vec<&'a crate::configdump::Policy> {
    let mut out: Vec<_> = dump
        .policies
        .iter()
        .filter(|p| filter.namespace_ok(&p.namespace))
        .collect();
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}

fn filtered_pods<'a>(dump: &'a Dump, filter: &Filter) -> Vec<&'a crate::configdump::PodSummary> {
    let mut out: Vec<_> = dump
        .pods
        .iter()
        .filter(|p| filter.namespace_ok(&p.namespace))
        .collect();
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}

/// The waypoint's service name, `None` without one, `NA` if it is unknown.
fn waypoint_name(
    waypoint: Option<&crate::configdump::GatewayAddress>,
    services: &[Service],
) -> String {
    let Some(w) = waypoint else {
        return "None".into();
    };
    services
        .iter()
        .find(|s| {
            format!("{}/{}", s.namespace, s.hostname) == w.destination
                || s.vips.contains(&w.destination)
        })
        .map(|s| s.name.clone())
        .unwrap_or_else(|| "NA".into())
}

fn workloads(dump: &Dump, filter: &Filter) -> String {
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
    for w in filtered_workloads(dump, filter) {
        let address = if w.workload_ips.is_empty() {
            w.hostname.clone()
        } else {
            w.workload_ips.join(",")
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

fn healthy(status: Option<&str>) -> bool {
    matches!(status, None | Some("") | Some("Healthy"))
}

/// `healthy/total` from the service's endpoints, else from the workloads that name it.
fn endpoints(svc: &Service, workloads: &[Workload]) -> String {
    let (ok, total) = if !svc.endpoints.is_empty() {
        let ok = svc
            .endpoints
            .values()
            .filter(|e| healthy(e.get("status").and_then(|s| s.as_str())))
            .count();
        (ok, svc.endpoints.len())
    } else {
        let key = format!("{}/{}", svc.namespace, svc.hostname);
        let members: Vec<&Workload> = workloads
            .iter()
            .filter(|w| w.services.contains_key(&key))
            .collect();
        let ok = members.iter().filter(|w| healthy(Some(&w.status))).count();
        (ok, members.len())
    };
    format!("{ok}/{total}")
}

fn services(dump: &Dump, filter: &Filter) -> String {
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
    for s in filtered_services(dump, filter) {
        let vip = s
            .vips
            .first()
            .map(|v| v.split_once('/').map(|(_, ip)| ip).unwrap_or(v).to_string())
            .unwrap_or_default();
        t.row(vec![
            s.namespace.clone(),
            s.name.clone(),
            vip,
            waypoint_name(s.waypoint.as_ref(), &dump.services),
            endpoints(s, &dump.workloads),
        ]);
    }
    t.render()
}

fn policies(dump: &Dump, filter: &Filter) -> String {
    let mut t = Table::new(1, &["NAMESPACE", "POLICY NAME", "ACTION", "SCOPE"]);
    for p in filtered_policies(dump, filter) {
        t.row(vec![
            p.namespace.clone(),
            p.name.clone(),
            p.action.clone(),
            p.scope.clone(),
        ]);
    }
    t.render()
}

/// Serial and validity of a chain entry: the dump's fields, else read from its PEM
/// (our dump only annotates the leaf).
#[derive(Debug, Default, Serialize, PartialEq)]
struct CertFacts {
    serial: String,
    not_before: String,
    not_after: String,
}

fn facts(cert: &Cert) -> CertFacts {
    let mut f = CertFacts {
        serial: cert.serial_number.to_lowercase(),
        not_before: cert.valid_from.clone(),
        not_after: cert.expiration_time.clone(),
    };
    if f.serial.is_empty() || f.not_before.is_empty() || f.not_after.is_empty() {
        if let Ok((_, pem)) = x509_parser::pem::parse_x509_pem(cert.pem.as_bytes()) {
            if let Ok(x509) = pem.parse_x509() {
                let fmt = |t: x509_parser::time::ASN1Time| {
                    t.to_datetime().format(&Rfc3339).unwrap_or_default()
                };
                if f.serial.is_empty() {
                    f.serial = x509
                        .tbs_certificate
                        .raw_serial()
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect();
                }
                if f.not_before.is_empty() {
                    f.not_before = fmt(x509.validity().not_before);
                }
                if f.not_after.is_empty() {
                    f.not_after = fmt(x509.validity().not_after);
                }
            }
        }
    }
    f
}

fn valid_at(f: &CertFacts, now: OffsetDateTime) -> bool {
    match (
        OffsetDateTime::parse(&f.not_before, &Rfc3339),
        OffsetDateTime::parse(&f.not_after, &Rfc3339),
    ) {
        (Ok(from), Ok(to)) => now > from && now < to,
        _ => false,
    }
}

fn na(s: String) -> String {
    if s.is_empty() {
        "NA".into()
    } else {
        s
    }
}

fn certificates(dump: &Dump, now: OffsetDateTime) -> String {
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
            "Unavailable".to_string()
        } else {
            c.state.clone()
        };
        if c.cert_chain.is_empty() {
            t.row(vec![
                c.identity.clone(),
                "NA".into(),
                state,
                "false".into(),
                "NA".into(),
                "NA".into(),
                "NA".into(),
            ]);
            continue;
        }
        for (i, cert) in c.cert_chain.iter().enumerate() {
            let kind = if i == 0 { "Leaf" } else { "Root" };
            let f = facts(cert);
            let valid = valid_at(&f, now);
            t.row(vec![
                c.identity.clone(),
                kind.into(),
                state.clone(),
                valid.to_string(),
                na(f.serial),
                na(f.not_after),
                na(f.not_before),
            ]);
        }
    }
    t.render()
}

/// Our dump has no connection list; this shows the pods ztunnel serves (their
/// netns proxies), from the dump's `pods` key.
fn connections(dump: &Dump, filter: &Filter) -> String {
    let mut t = Table::new(1, &["NAMESPACE", "POD NAME", "STATE", "IDENTITY", "UID"]);
    for p in filtered_pods(dump, filter) {
        t.row(vec![
            p.namespace.clone(),
            p.name.clone(),
            na(p.state.clone()),
            na(p.identity.clone()),
            p.uid.clone(),
        ]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn testdata(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("testdata")
            .join(name)
    }

    fn dump() -> Dump {
        Dump::parse(&std::fs::read_to_string(testdata("dump.json")).unwrap()).unwrap()
    }

    /// A moment inside every certificate's validity in the recorded dump.
    fn now() -> OffsetDateTime {
        OffsetDateTime::parse("2026-11-30T12:00:00Z", &Rfc3339).unwrap()
    }

    /// Compares with `testdata/<name>`; `UPDATE_GOLDEN=1` rewrites it.
    fn golden(name: &str, got: &str) {
        test_support::golden::assert_golden(&testdata(name), got);
    }

    #[test]
    fn workloads_table_matches_golden() {
        golden(
            "workloads.txt",
            &render(&dump(), ConfigSection::Workloads, &Filter::default(), now()),
        );
    }

    #[test]
    fn services_table_matches_golden() {
        golden(
            "services.txt",
            &render(&dump(), ConfigSection::Services, &Filter::default(), now()),
        );
    }

    #[test]
    fn policies_table_matches_golden() {
        golden(
            "policies.txt",
            &render(&dump(), ConfigSection::Policies, &Filter::default(), now()),
        );
    }

    #[test]
    fn certificates_table_matches_golden() {
        golden(
            "certificates.txt",
            &render(
                &dump(),
                ConfigSection::Certificates,
                &Filter::default(),
                now(),
            ),
        );
    }

    #[test]
    fn connections_table_matches_golden() {
        golden(
            "connections.txt",
            &render(
                &dump(),
                ConfigSection::Connections,
                &Filter::default(),
                now(),
            ),
        );
    }

    #[test]
    fn all_matches_golden() {
        golden(
            "all.txt",
            &render(&dump(), ConfigSection::All, &Filter::default(), now()),
        );
    }

    #[test]
    fn filters_select_workloads() {
        let f = Filter {
            node: Some("node-a".into()),
            namespace: Some("demo".into()),
            address: None,
        };
        let out = render(&dump(), ConfigSection::Workloads, &f, now());
        assert_eq!(out.lines().count(), 2, "{out}");
        assert!(out.contains("client-7d9f8c6b5-abcde"));
        let f = Filter {
            address: Some("10.244.1.9".into()),
            ..Default::default()
        };
        let out = render(&dump(), ConfigSection::Workloads, &f, now());
        assert!(out.contains("db-0") && out.lines().count() == 2, "{out}");
    }

    #[test]
    fn expired_certificates_are_not_valid() {
        let later = OffsetDateTime::parse("2040-01-01T00:00:00Z", &Rfc3339).unwrap();
        let out = render(
            &dump(),
            ConfigSection::Certificates,
            &Filter::default(),
            later,
        );
        assert!(!out.contains("true"), "{out}");
    }

    #[test]
    fn waypoints_resolve_to_service_names() {
        let mut d = dump();
        d.workloads[0].waypoint = Some(crate::configdump::GatewayAddress {
            destination: "/10.96.0.10".into(),
            ..Default::default()
        });
        d.workloads[1].waypoint = Some(crate::configdump::GatewayAddress {
            destination: "/1.2.3.4".into(),
            ..Default::default()
        });
        let out = render(&d, ConfigSection::Workloads, &Filter::default(), now());
        assert!(out.contains(" echo ") && out.contains(" NA "), "{out}");
    }
}
