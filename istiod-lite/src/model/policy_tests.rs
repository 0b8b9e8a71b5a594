use kube::core::DynamicObject;

use super::*;
use mesh_model::ConnectionAttrs;
use shared_types::identity::Identity;

fn convert_yaml(y: &str) -> Result<ConvertedPolicy, NotConverted> {
    let obj: DynamicObject = serde_yaml::from_str(y).unwrap();
    convert(&obj, "istio-system")
}

fn policy(y: &str) -> Authorization {
    convert_yaml(y).unwrap().authorization
}

fn with_spec(ns: &str, spec: &str) -> String {
    format!(
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n\
         metadata: {{name: p, namespace: {ns}, resourceVersion: \"7\"}}\nspec:\n{spec}"
    )
}

fn conn(from: Option<(&str, &str)>, src: &str, dst: &str) -> ConnectionAttrs {
    ConnectionAttrs {
        src_identity: from.map(|(ns, sa)| Identity::new("cluster.local", ns, sa)),
        src_ip: src.parse().unwrap(),
        dst: dst.parse().unwrap(),
    }
}

fn exact(s: &str) -> StringMatch {
    StringMatch::Exact(s.into())
}

#[test]
fn scope_follows_namespace_and_selector() {
    let global = policy(&with_spec("istio-system", "  action: DENY\n"));
    assert_eq!((global.scope, global.action), (Scope::Global, Action::Deny));
    assert_eq!(global.key(), "istio-system/p");

    let ns = policy(&with_spec("app", "  {}\n"));
    assert_eq!((ns.scope, ns.action), (Scope::Namespace, Action::Allow));
    assert!(ns.rules.is_empty(), "spec {{}} is Istio's allow-nothing");

    let sel = convert_yaml(&with_spec("app", "  selector: {matchLabels: {app: web}}\n")).unwrap();
    assert_eq!(sel.authorization.scope, Scope::WorkloadSelector);
    let labels = |kv: &[(&str, &str)]| {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>()
    };
    assert!(sel.selects("app", &labels(&[("app", "web"), ("x", "y")])));
    assert!(!sel.selects("app", &labels(&[("app", "db")])));
    assert!(!sel.selects("other", &labels(&[("app", "web")])));

    let root_sel = convert_yaml(&with_spec(
        "istio-system",
        "  selector: {matchLabels: {app: web}}\n",
    ))
    .unwrap();
    assert_eq!(root_sel.authorization.scope, Scope::WorkloadSelector);
    assert!(root_sel.selects("any", &labels(&[("app", "web")])));
    let empty_sel = convert_yaml(&with_spec("app", "  selector: {}\n")).unwrap();
    assert_eq!(empty_sel.authorization.scope, Scope::WorkloadSelector);
    assert!(
        empty_sel.selects("app", &labels(&[])),
        "empty matchLabels select all"
    );
    assert!(!empty_sel.selects("other", &labels(&[])));

    // Namespace- and mesh-wide policies are found by scope, never listed on workloads.
    let ns_wide = convert_yaml(&with_spec("app", "  {}\n")).unwrap();
    assert!(!ns_wide.selects("app", &labels(&[])));
}

#[test]
fn from_fields_map_to_matches() {
    let p = policy(&with_spec(
        "app",
        "  rules:\n  - from:\n    - source:\n        principals: [cluster.local/ns/a/sa/b, \"*/sa/admin\", \"spiffe-ish*\", \"*\"]\n\
         \x20       notPrincipals: [cluster.local/ns/a/sa/bad]\n\
         \x20       namespaces: [a, \"team-*\"]\n        notNamespaces: [kube-system]\n\
         \x20       serviceAccounts: [local-sa, other/sa2]\n        notServiceAccounts: [evil]\n\
         \x20       ipBlocks: [10.0.0.0/8, 192.168.1.1]\n        notIpBlocks: [10.1.0.0/16]\n\
         \x20   - source: {namespaces: [b]}\n",
    ));
    assert_eq!(p.rules.len(), 1);
    let clauses = &p.rules[0];
    assert_eq!(clauses.len(), 1, "one from clause");
    let m = &clauses[0][0];
    assert_eq!(
        m.principals,
        vec![
            exact("cluster.local/ns/a/sa/b"),
            StringMatch::Suffix("/sa/admin".into()),
            StringMatch::Prefix("spiffe-ish".into()),
            StringMatch::Presence,
        ]
    );
    assert_eq!(m.not_principals, vec![exact("cluster.local/ns/a/sa/bad")]);
    assert_eq!(
        m.namespaces,
        vec![exact("a"), StringMatch::Prefix("team-".into())]
    );
    assert_eq!(m.not_namespaces, vec![exact("kube-system")]);
    assert_eq!(
        m.service_accounts,
        vec![
            ServiceAccountMatch {
                namespace: "app".into(),
                service_account: "local-sa".into()
            },
            ServiceAccountMatch {
                namespace: "other".into(),
                service_account: "sa2".into()
            },
        ]
    );
    assert_eq!(m.not_service_accounts[0].namespace, "app");
    assert_eq!(
        m.source_ips,
        vec![
            "10.0.0.0/8".parse().unwrap(),
            "192.168.1.1/32".parse().unwrap()
        ]
    );
    assert_eq!(m.not_source_ips, vec!["10.1.0.0/16".parse().unwrap()]);
    assert_eq!(
        clauses[0][1].namespaces,
        vec![exact("b")],
        "sources are alternatives"
    );
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
}

#[test]
fn to_and_when_become_separate_clauses() {
    let p = policy(&with_spec(
        "app",
        "  action: ALLOW\n  rules:\n  - from: [{source: {namespaces: [a]}}]\n\
         \x20   to: [{operation: {ports: [\"80\", \"8080\"], notPorts: [\"81\"]}}]\n\
         \x20   when:\n    - {key: source.ip, values: [10.0.0.1], notValues: [10.0.0.2]}\n\
         \x20   - {key: destination.port, values: [\"80\"]}\n\
         \x20   - {key: destination.ip, notValues: [10.9.9.9]}\n\
         \x20   - {key: source.principal, values: [\"*\"]}\n\
         \x20   - {key: source.namespace, notValues: [x]}\n",
    ));
    let clauses = &p.rules[0];
    assert_eq!(clauses.len(), 7, "to, from, and one per condition");
    assert_eq!(clauses[0][0].destination_ports, vec![80, 8080]);
    assert_eq!(clauses[0][0].not_destination_ports, vec![81]);
    assert_eq!(clauses[1][0].namespaces, vec![exact("a")]);
    assert_eq!(
        clauses[2][0].source_ips,
        vec!["10.0.0.1/32".parse().unwrap()]
    );
    assert_eq!(
        clauses[2][0].not_source_ips,
        vec!["10.0.0.2/32".parse().unwrap()]
    );
    assert_eq!(clauses[3][0].destination_ports, vec![80]);
    assert_eq!(
        clauses[4][0].not_destination_ips,
        vec!["10.9.9.9/32".parse().unwrap()]
    );
    assert_eq!(clauses[5][0].principals, vec![StringMatch::Presence]);
    assert_eq!(clauses[6][0].not_namespaces, vec![exact("x")]);

    assert!(p.matches(&conn(Some(("a", "s")), "10.0.0.1", "10.0.0.9:80")));
    assert!(
        !p.matches(&conn(Some(("a", "s")), "10.0.0.1", "10.0.0.9:8080")),
        "when port"
    );
    assert!(
        !p.matches(&conn(Some(("b", "s")), "10.0.0.1", "10.0.0.9:80")),
        "namespace"
    );
    assert!(
        !p.matches(&conn(Some(("a", "s")), "10.0.0.2", "10.0.0.9:80")),
        "source ip"
    );
    assert!(
        !p.matches(&conn(None, "10.0.0.1", "10.0.0.9:80")),
        "plaintext"
    );
}

#[test]
fn empty_rule_matches_everything_and_no_rules_nothing() {
    let all = policy(&with_spec("app", "  rules: [{}]\n"));
    assert_eq!(all.rules, vec![Vec::<Vec<RbacMatch>>::new()]);
    assert!(all.matches(&conn(None, "1.2.3.4", "10.0.0.1:1")));
    let none = policy(&with_spec("app", "  rules: []\n"));
    assert!(!none.matches(&conn(None, "1.2.3.4", "10.0.0.1:1")));
}

#[test]
fn l7_allow_rule_never_matches() {
    let p = policy(&with_spec(
        "app",
        "  rules:\n  - to: [{operation: {methods: [GET], ports: [\"80\"]}}]\n\
         \x20 - from: [{source: {requestPrincipals: [\"*\"]}}]\n\
         \x20 - when: [{key: \"request.headers[x-user]\", values: [bob]}]\n\
         \x20 - from: [{source: {namespaces: [ok]}}]\n",
    ));
    assert_eq!(p.rules.len(), 1, "only the L4 rule is kept");
    assert_eq!(p.rules[0][0][0].namespaces, vec![exact("ok")]);
    assert!(!p.matches(&conn(Some(("x", "s")), "1.1.1.1", "10.0.0.1:80")));
    assert_eq!(p.warnings.len(), 3, "{:?}", p.warnings);
    assert!(
        p.warnings[0].starts_with("rules[0]: HTTP attributes (methods)"),
        "{}",
        p.warnings[0]
    );
    assert!(p.warnings[0].contains("never matches"));
    assert!(p.warnings[2].contains("when request.headers[x-user]"));

    // Every rule HTTP-only: the ALLOW policy still exists and matches nothing, so the
    // workloads it covers deny everything not allowed by another policy (Istio).
    let only_l7 = policy(&with_spec(
        "app",
        "  rules: [{to: [{operation: {paths: [/admin]}}]}]\n",
    ));
    assert!(only_l7.rules.is_empty());
    assert!(!only_l7.matches(&conn(Some(("x", "s")), "1.1.1.1", "10.0.0.1:80")));
}

#[test]
fn l7_only_deny_denies_at_l4() {
    let p = policy(&with_spec(
        "app",
        "  action: DENY\n  rules:\n  - to: [{operation: {methods: [DELETE]}}]\n",
    ));
    assert_eq!(
        p.rules,
        vec![Vec::<Vec<RbacMatch>>::new()],
        "widened to match all"
    );
    assert!(p.matches(&conn(Some(("x", "s")), "1.1.1.1", "10.0.0.1:80")));
    assert!(p.matches(&conn(None, "1.1.1.1", "10.0.0.1:22")));
    assert!(
        p.warnings[0].contains("denying more than requested"),
        "{:?}",
        p.warnings
    );

    // L7 mixed with L4: the L4 parts still narrow the rule.
    let mixed = policy(&with_spec(
        "app",
        "  action: DENY\n  rules:\n  - from: [{source: {namespaces: [bad]}}]\n\
         \x20   to: [{operation: {methods: [POST], ports: [\"80\"]}}]\n\
         \x20   when: [{key: \"request.auth.claims[iss]\", values: [x]}]\n",
    ));
    assert_eq!(
        mixed.rules[0].len(),
        2,
        "to (ports only) and from; when dropped"
    );
    assert!(mixed.matches(&conn(Some(("bad", "s")), "1.1.1.1", "10.0.0.1:80")));
    assert!(!mixed.matches(&conn(Some(("bad", "s")), "1.1.1.1", "10.0.0.1:81")));
    assert!(!mixed.matches(&conn(Some(("good", "s")), "1.1.1.1", "10.0.0.1:80")));

    // One HTTP-only alternative among L4 ones makes the whole clause match anything.
    let alt = policy(&with_spec(
        "app",
        "  action: DENY\n  rules:\n  - to: [{operation: {ports: [\"80\"]}}, {operation: {paths: [/x]}}]\n\
         \x20   from: [{source: {namespaces: [bad]}}]\n",
    ));
    assert_eq!(alt.rules[0].len(), 1);
    assert!(alt.matches(&conn(Some(("bad", "s")), "1.1.1.1", "10.0.0.1:9999")));
}

#[test]
fn unsupported_policies_are_not_converted() {
    for action in ["AUDIT", "CUSTOM"] {
        let e = convert_yaml(&with_spec("app", &format!("  action: {action}\n"))).unwrap_err();
        assert_eq!(e, NotConverted::UnsupportedAction(action.into()));
    }
    assert!(matches!(
        convert_yaml(&with_spec("app", "  action: MAYBE\n")),
        Err(NotConverted::InvalidSpec(_))
    ));
    let e = convert_yaml(&with_spec(
        "app",
        "  targetRefs: [{kind: Service, group: \"\", name: web}]\n",
    ));
    assert_eq!(e.unwrap_err(), NotConverted::TargetRefs);
    let e = convert_yaml(&with_spec(
        "app",
        "  targetRef: {kind: Gateway, group: gateway.networking.k8s.io, name: wp}\n",
    ));
    assert_eq!(e.unwrap_err(), NotConverted::TargetRefs);
    assert!(matches!(
        convert_yaml(&with_spec("app", "  rules: 5\n")),
        Err(NotConverted::InvalidSpec(_))
    ));
}

#[test]
fn invalid_values_are_skipped_with_warnings_and_nulls_are_absent() {
    let p = policy(&with_spec(
        "app",
        "  selector: null\n  rules:\n  - to: [{operation: {ports: [\"80\", http, \"70000\"], methods: null}}]\n\
         \x20   from: [{source: {ipBlocks: [nope, 10.0.0.0/8], principals: null}}]\n",
    ));
    assert_eq!(p.scope, Scope::Namespace);
    assert_eq!(p.rules[0][0][0].destination_ports, vec![80]);
    assert_eq!(
        p.rules[0][1][0].source_ips,
        vec!["10.0.0.0/8".parse().unwrap()]
    );
    assert_eq!(p.warnings.len(), 3, "{:?}", p.warnings);
    assert!(p
        .warnings
        .iter()
        .all(|w| w.starts_with("rules[0]: ignoring invalid")));
}

#[test]
fn dry_run_annotation_and_dump_shape() {
    let p = policy(
        "metadata:\n  name: d\n  namespace: app\n  annotations: {istio.io/dry-run: \"true\"}\n\
         spec:\n  action: DENY\n  rules: [{to: [{operation: {methods: [GET]}}]}]\n",
    );
    assert!(p.dry_run);
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(json["scope"], "Namespace");
    assert_eq!(json["action"], "Deny");
    assert!(json["warnings"][0]
        .as_str()
        .unwrap()
        .contains("HTTP attributes"));
    let clean = policy(&with_spec("app", "  rules: [{}]\n"));
    assert!(serde_json::to_value(&clean)
        .unwrap()
        .get("warnings")
        .is_none());
}

#[test]
fn string_forms() {
    assert_eq!(string_match("*"), StringMatch::Presence);
    assert_eq!(
        string_match("*.local"),
        StringMatch::Suffix(".local".into())
    );
    assert_eq!(string_match("ns-*"), StringMatch::Prefix("ns-".into()));
    assert_eq!(string_match("exact"), exact("exact"));
}
