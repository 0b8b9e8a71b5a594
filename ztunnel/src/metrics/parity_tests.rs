//! Every metric Istio's ztunnel exposes that we expose too has Istio's name, type and
//! label set (`testdata/istio-metrics.txt`, taken from Istio's source); every one we
//! do not expose is named in docs/admin.md.

use std::collections::BTreeMap;
use std::path::Path;

use super::*;
use crate::dns::metrics::DnsLabels;
use crate::state::workload::Workload;

/// (type, label names) of each metric in Istio's list.
fn istio_metrics() -> BTreeMap<String, (String, Vec<String>)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/istio-metrics.txt");
    let text = std::fs::read_to_string(path).unwrap();
    let mut vars = BTreeMap::new();
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        if let Some((var, value)) = line.split_once(" = ") {
            vars.insert(var.trim().to_owned(), value.trim().to_owned());
            continue;
        }
        let cells: Vec<&str> = line.split_whitespace().collect();
        let labels = match cells[2] {
            "-" => String::new(),
            var if var.starts_with('$') => vars[var].clone(),
            list => list.to_owned(),
        };
        let labels = labels
            .split(',')
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect();
        out.insert(cells[0].to_owned(), (cells[1].to_owned(), labels));
    }
    out
}

/// (type, label names of its first sample) of each sample name in our exposition.
fn ours(exposition: &str) -> BTreeMap<String, (String, Vec<String>)> {
    let mut types = BTreeMap::new();
    let mut out = BTreeMap::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            types.insert(name.to_owned(), kind.to_owned());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (name, labels) = match line.split_once('{') {
            Some((name, rest)) => (name, rest.split_once('}').unwrap().0),
            None => (line.split_once(' ').unwrap().0, ""),
        };
        let (family, kind) = types
            .iter()
            .filter(|(base, _)| name.starts_with(base.as_str()))
            .max_by_key(|(base, _)| base.len())
            .map(|(b, k)| (b.clone(), k.clone()))
            .unwrap();
        let sample = if kind == "histogram" {
            family
        } else {
            name.to_owned()
        };
        let names: Vec<String> = labels
            .split("\",")
            .filter_map(|kv| kv.split_once('=').map(|(k, _)| k.to_owned()))
            .filter(|k| k != "le")
            .collect();
        out.entry(sample).or_insert((kind, names));
    }
    out
}

/// Our registry with one series in every family, as traffic fills them.
fn exposition() -> String {
    let metrics = Metrics::new();
    let workload = Workload {
        name: "w".into(),
        namespace: "ns".into(),
        ..Default::default()
    };
    let traffic = TrafficLabels::new(Reporter::source).with_destination(Some(&workload));
    for family in [
        &metrics.connections_opened,
        &metrics.connections_closed,
        &metrics.connections_failed,
        &metrics.received_bytes,
        &metrics.sent_bytes,
    ] {
        family.get_or_create(&traffic).inc();
    }
    let dns = DnsLabels {
        request_query_type: "a".into(),
        request_protocol: "udp",
        source_canonical_service: "s".into(),
        source_canonical_revision: "v".into(),
    };
    metrics.dns.requests.get_or_create(&dns).inc();
    metrics.dns.upstream_requests.get_or_create(&dns).inc();
    metrics.dns.upstream_failures.get_or_create(&dns).inc();
    metrics
        .dns
        .upstream_duration
        .get_or_create(&dns)
        .observe(0.01);
    let url = crate::discovery::xds::XdsMetrics::url("type");
    metrics.xds.messages.get_or_create(&url).inc();
    metrics.xds.message_bytes.get_or_create(&url).inc();
    metrics.xds.total_size.inc();
    metrics.xds.nacks.get_or_create(&url).inc();
    metrics
        .xds
        .terminations
        .get_or_create(&crate::discovery::xds::metrics::TerminationLabels { reason: "Error" })
        .inc();
    metrics.encode()
}

#[test]
fn what_we_share_with_istio_has_its_names_types_and_labels() {
    let istio = istio_metrics();
    let ours = ours(&exposition());
    let mut shared = 0;
    for (name, (kind, labels)) in &ours {
        if let Some((istio_kind, istio_labels)) = istio.get(name) {
            assert_eq!(kind, istio_kind, "{name}: type");
            assert_eq!(labels, istio_labels, "{name}: labels");
            shared += 1;
        } else {
            // Ours alone: never under Istio's `istio_` prefix, where it would read as Istio's.
            assert!(!name.starts_with("istio_"), "{name} is not one of Istio's");
        }
    }
    assert_eq!(shared, 13, "{ours:?}");
}

#[test]
fn the_ones_we_do_not_expose_are_documented() {
    let ours = ours(&exposition());
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/admin.md"))
            .unwrap();
    for name in istio_metrics().keys().filter(|n| !ours.contains_key(*n)) {
        assert!(
            docs.contains(&format!("`{name}`")),
            "docs/admin.md does not list {name}"
        );
    }
}
