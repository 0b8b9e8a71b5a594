//! Golden tables and structured outputs for both dumps (ours, recorded by ztunnel's
//! admin test, and Istio's fixture).

use super::*;
use crate::configdump::Dump;
use std::path::PathBuf;

fn testdata(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(name)
}

/// A moment inside every certificate's validity in both recorded dumps.
fn now() -> OffsetDateTime {
    OffsetDateTime::parse("2026-12-04T12:00:00Z", &Rfc3339).unwrap()
}

fn all_workloads() -> View {
    View::Workloads {
        address: None,
        namespace: None,
        node: None,
    }
}

fn views() -> Vec<(&'static str, View)> {
    vec![
        ("workloads", all_workloads()),
        ("services", View::Services { namespace: None }),
        ("policies", View::Policies { namespace: None }),
        // A ztunnel's dump has no routes: the header alone.
        ("routes", View::Routes { namespace: None }),
        ("certificates", View::Certificates),
        (
            "connections",
            View::Connections {
                namespace: None,
                direction: String::new(),
                raw: false,
            },
        ),
        ("all", View::All),
    ]
}

fn out(dump: &str, view: &View, format: Output) -> String {
    let raw = std::fs::read_to_string(testdata(dump)).unwrap();
    let parsed = Dump::parse(&raw).unwrap();
    render(&raw, &parsed, view, format, now()).unwrap()
}

#[test]
fn tables_match_golden_for_both_dumps() {
    for (prefix, dump) in [
        ("ztunnel", "ztunnel-dump.json"),
        ("istio", "istio-dump.json"),
    ] {
        for (name, view) in views() {
            test_support::golden::assert_golden(
                &testdata(&format!("{prefix}-{name}.txt")),
                &out(dump, &view, Output::Table),
            );
        }
    }
}

#[test]
fn structured_outputs_match_golden() {
    for (prefix, dump) in [
        ("ztunnel", "ztunnel-dump.json"),
        ("istio", "istio-dump.json"),
    ] {
        for (name, view) in [
            ("workloads", all_workloads()),
            ("services", View::Services { namespace: None }),
            ("certificates", View::Certificates),
            (
                "connections",
                View::Connections {
                    namespace: None,
                    direction: String::new(),
                    raw: false,
                },
            ),
        ] {
            test_support::golden::assert_golden(
                &testdata(&format!("{prefix}-{name}.json")),
                &out(dump, &view, Output::Json),
            );
        }
        test_support::golden::assert_golden(
            &testdata(&format!("{prefix}-services.yaml")),
            &out(dump, &View::Services { namespace: None }, Output::Yaml),
        );
    }
    // `all -o json` is the dump as ztunnel wrote it.
    let raw = std::fs::read_to_string(testdata("istio-dump.json")).unwrap();
    assert_eq!(
        out("istio-dump.json", &View::All, Output::Json).trim_end(),
        raw.trim_end()
    );
}

#[test]
fn filters_select_as_istioctl() {
    let view = View::Workloads {
        address: None,
        namespace: Some("DEMO".into()),
        node: Some("node-2".into()),
    };
    let table = out("ztunnel-dump.json", &view, Output::Table);
    assert_eq!(table.lines().count(), 3, "{table}");
    assert!(table.contains("echo-0") && table.contains("echo-1"));
    let view = View::Workloads {
        address: Some("10.0.5.9".into()),
        namespace: None,
        node: None,
    };
    let table = out("ztunnel-dump.json", &view, Output::Table);
    assert!(
        table.contains("db-vm") && table.lines().count() == 2,
        "{table}"
    );
    let only_in = View::Connections {
        namespace: None,
        direction: "inbound".into(),
        raw: true,
    };
    assert_eq!(
        out("ztunnel-dump.json", &only_in, Output::Table)
            .lines()
            .count(),
        1
    );
    let raw = View::Connections {
        namespace: None,
        direction: "outbound".into(),
        raw: true,
    };
    let table = out("ztunnel-dump.json", &raw, Output::Table);
    assert!(table.contains("10.96.0.20:80"), "{table}");
}

#[test]
fn services_count_healthy_endpoints_by_their_workloads() {
    let table = out(
        "ztunnel-dump.json",
        &View::Services { namespace: None },
        Output::Table,
    );
    assert!(table.contains(" 1/2\n"), "{table}");
    let table = out(
        "istio-dump.json",
        &View::Services { namespace: None },
        Output::Table,
    );
    assert!(
        table.contains(" 2/2\n") && table.contains(" 0/0\n"),
        "{table}"
    );
}

#[test]
fn serials_print_in_hex_and_expired_certificates_are_not_valid() {
    assert_eq!(
        decimal_to_hex("68528906629480349065949924107662330363"),
        "338e2ff514a2cb55beee7069d14f09fb"
    );
    assert_eq!(decimal_to_hex("255"), "ff");
    assert_eq!(decimal_to_hex("0"), "0");
    assert_eq!(decimal_to_hex("4294967296"), "100000000");
    assert_eq!(decimal_to_hex("x1"), "x1");
    let raw = std::fs::read_to_string(testdata("istio-dump.json")).unwrap();
    let dump = Dump::parse(&raw).unwrap();
    let later = OffsetDateTime::parse("2040-01-01T00:00:00Z", &Rfc3339).unwrap();
    let table = render(&raw, &dump, &View::Certificates, Output::Table, later).unwrap();
    assert!(!table.contains("true"), "{table}");
}

#[test]
fn waypoints_resolve_to_service_names() {
    let raw = std::fs::read_to_string(testdata("ztunnel-dump.json")).unwrap();
    let mut dump = Dump::parse(&raw).unwrap();
    dump.workloads[0].waypoint = Some(GatewayAddress {
        destination: "/10.96.0.20".into(),
    });
    dump.workloads[1].waypoint = Some(GatewayAddress {
        destination: "/1.2.3.4".into(),
    });
    let table = render(&raw, &dump, &all_workloads(), Output::Table, now()).unwrap();
    assert!(
        table.contains(" echo ") && table.contains(" NA "),
        "{table}"
    );
}

fn routes() -> View {
    View::Routes { namespace: None }
}

/// `route` of a waypoint's dump: an HTTPRoute (a header match to a weighted split,
/// a redirect that takes precedence by its longer prefix), a TCPRoute, and a route
/// whose path does not compile.
#[test]
fn a_waypoints_routes_are_one_row_per_rule_in_precedence_order() {
    let table = out("waypoint-dump.json", &routes(), Output::Table);
    let want = "\
NAMESPACE ROUTE   KIND      PARENT            RULE                MATCHES                                           FILTERS         BACKENDS
demo      db      TCPRoute  demo/db:5432      demo.db.0           *                                                 -               db-primary:5432=1
demo      reviews HTTPRoute demo/reviews:9080 demo.reviews.1      Prefix /old                                       RequestRedirect (redirect 302)
demo      reviews HTTPRoute demo/reviews:9080 demo.reviews.canary hdr x-version=v2                                  -               reviews-v1:9080=90,reviews-v2:9080=10
demo      broken  HTTPRoute -                 -                   INVALID: rule 0: path \"old\" does not start with / -               -
";
    assert_eq!(table, want);
    test_support::golden::assert_golden(&testdata("waypoint-routes.txt"), &table);
    // `--route-namespace`, case-insensitive as the other filters.
    let demo = View::Routes {
        namespace: Some("DEMO".into()),
    };
    assert_eq!(out("waypoint-dump.json", &demo, Output::Table), want);
    let other = View::Routes {
        namespace: Some("other".into()),
    };
    assert_eq!(
        out("waypoint-dump.json", &other, Output::Table),
        "NAMESPACE ROUTE KIND PARENT RULE MATCHES FILTERS BACKENDS\n"
    );
}

#[test]
fn routes_json_is_the_raw_section_and_all_shows_the_table() {
    let raw = std::fs::read_to_string(testdata("waypoint-dump.json")).unwrap();
    let json = out("waypoint-dump.json", &routes(), Output::Json);
    test_support::golden::assert_golden(&testdata("waypoint-routes.json"), &json);
    let section: Value = serde_json::from_str(&raw).unwrap();
    let printed: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(printed, section["waypointRoutes"]);
    // Same keys in the same order as the dump (ztunnel sorts them).
    let compact = |v: &Value| serde_json::to_string(v).unwrap();
    assert_eq!(compact(&printed), compact(&section["waypointRoutes"]));
    let yaml = out("waypoint-dump.json", &routes(), Output::Yaml);
    let from_yaml: Value = serde_yaml::from_str(&yaml).unwrap();
    assert_eq!(from_yaml, section["waypointRoutes"]);
    // Filtered, still the raw entries.
    let other = View::Routes {
        namespace: Some("other".into()),
    };
    assert_eq!(out("waypoint-dump.json", &other, Output::Json), "[]\n");
    // `all`: the routes after the policies, only in a dump that has them.
    let all = out("waypoint-dump.json", &View::All, Output::Table);
    let table = out("waypoint-dump.json", &routes(), Output::Table);
    let policies = "\nNAMESPACE POLICY NAME ACTION SCOPE\n";
    assert!(
        all.contains(&format!("{policies}\n{table}\nCERTIFICATE NAME")),
        "{all}"
    );
    for dump in ["istio-dump.json", "ztunnel-dump.json"] {
        let all = out(dump, &View::All, Output::Table);
        assert!(!all.contains("ROUTE"), "{dump}: {all}");
    }
}
