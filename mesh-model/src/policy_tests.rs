//! Table tests for single-policy matching and the policy YAML encoding.

use super::*;

fn id(td: &str, ns: &str, sa: &str) -> Identity {
    Identity {
        trust_domain: td.into(),
        namespace: ns.into(),
        service_account: sa.into(),
    }
}

/// 127.0.0.1 -> 127.0.0.2:8080, no identity.
fn plaintext() -> ConnectionAttrs {
    ConnectionAttrs {
        src_identity: None,
        src_ip: "127.0.0.1".parse().unwrap(),
        dst: "127.0.0.2:8080".parse().unwrap(),
    }
}

/// 127.0.0.1 (td/ns/namespace/sa/account) -> 127.0.0.2:8080.
fn tls() -> ConnectionAttrs {
    ConnectionAttrs {
        src_identity: Some(id("td", "namespace", "account")),
        ..plaintext()
    }
}

/// 127.0.0.3 (td-alt/ns/ns-alt/sa/sa-alt) -> 127.0.0.4:9090.
fn tls_alt() -> ConnectionAttrs {
    ConnectionAttrs {
        src_identity: Some(id("td-alt", "ns-alt", "sa-alt")),
        src_ip: "127.0.0.3".parse().unwrap(),
        dst: "127.0.0.4:9090".parse().unwrap(),
    }
}

fn allow(rules: Vec<Vec<Vec<RbacMatch>>>) -> Authorization {
    Authorization {
        name: "p".into(),
        namespace: "ns".into(),
        scope: Scope::Global,
        action: Action::Allow,
        rules,
        dry_run: false,
        warnings: Vec::new(),
    }
}

fn single(m: RbacMatch) -> Authorization {
    allow(vec![vec![vec![m]]])
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn exact(s: &str) -> StringMatch {
    StringMatch::Exact(s.into())
}

/// (case, match, expected for [plaintext, tls, tls_alt])
fn field_cases() -> Vec<(&'static str, RbacMatch, [bool; 3])> {
    let sa = ServiceAccountMatch {
        namespace: "namespace".into(),
        service_account: "account".into(),
    };
    vec![
        (
            "namespaces",
            RbacMatch {
                namespaces: vec![exact("namespace")],
                ..Default::default()
            },
            [false, true, false],
        ),
        (
            "not_namespaces",
            RbacMatch {
                not_namespaces: vec![exact("namespace")],
                ..Default::default()
            },
            [true, false, true],
        ),
        (
            "namespaces_presence",
            RbacMatch {
                namespaces: vec![StringMatch::Presence],
                ..Default::default()
            },
            [false, true, true],
        ),
        (
            "service_accounts",
            RbacMatch {
                service_accounts: vec![sa.clone()],
                ..Default::default()
            },
            [false, true, false],
        ),
        (
            "not_service_accounts",
            RbacMatch {
                not_service_accounts: vec![sa],
                ..Default::default()
            },
            [true, false, true],
        ),
        (
            "principals",
            RbacMatch {
                principals: vec![exact("td/ns/namespace/sa/account")],
                ..Default::default()
            },
            [false, true, false],
        ),
        (
            "principals_with_scheme_never_match",
            RbacMatch {
                principals: vec![exact("spiffe://td/ns/namespace/sa/account")],
                ..Default::default()
            },
            [false, false, false],
        ),
        (
            "principals_prefix",
            RbacMatch {
                principals: vec![StringMatch::Prefix("td/ns/namespace/".into())],
                ..Default::default()
            },
            [false, true, false],
        ),
        (
            "principals_suffix",
            RbacMatch {
                principals: vec![StringMatch::Suffix("/sa/sa-alt".into())],
                ..Default::default()
            },
            [false, false, true],
        ),
        (
            "principals_presence",
            RbacMatch {
                principals: vec![StringMatch::Presence],
                ..Default::default()
            },
            [false, true, true],
        ),
        (
            "not_principals",
            RbacMatch {
                not_principals: vec![exact("td/ns/namespace/sa/account")],
                ..Default::default()
            },
            [true, false, true],
        ),
        (
            "not_principals_presence_rejects_any_identity",
            RbacMatch {
                not_principals: vec![StringMatch::Presence],
                ..Default::default()
            },
            [true, false, false],
        ),
        (
            "source_ips",
            RbacMatch {
                source_ips: vec![net("127.0.0.1/32")],
                ..Default::default()
            },
            [true, true, false],
        ),
        (
            "source_ips_cidr",
            RbacMatch {
                source_ips: vec![net("127.0.0.0/24")],
                ..Default::default()
            },
            [true, true, true],
        ),
        (
            "not_source_ips",
            RbacMatch {
                not_source_ips: vec![net("127.0.0.1/32")],
                ..Default::default()
            },
            [false, false, true],
        ),
        (
            "destination_ips",
            RbacMatch {
                destination_ips: vec![net("127.0.0.2/32")],
                ..Default::default()
            },
            [true, true, false],
        ),
        (
            "not_destination_ips",
            RbacMatch {
                not_destination_ips: vec![net("127.0.0.2/32")],
                ..Default::default()
            },
            [false, false, true],
        ),
        (
            "destination_ports",
            RbacMatch {
                destination_ports: vec![8080],
                ..Default::default()
            },
            [true, true, false],
        ),
        (
            "not_destination_ports",
            RbacMatch {
                not_destination_ports: vec![8080],
                ..Default::default()
            },
            [false, false, true],
        ),
        (
            "all_fields_must_hold",
            RbacMatch {
                namespaces: vec![exact("namespace")],
                destination_ports: vec![9090],
                ..Default::default()
            },
            [false, false, false],
        ),
        (
            "positive_and_negative_same_field",
            RbacMatch {
                source_ips: vec![net("127.0.0.0/8")],
                not_source_ips: vec![net("127.0.0.3/32")],
                ..Default::default()
            },
            [true, true, false],
        ),
    ]
}

#[test]
fn each_field_and_its_negation() {
    let conns = [plaintext(), tls(), tls_alt()];
    for (case, m, want) in field_cases() {
        let pol = single(m);
        for (conn, want) in conns.iter().zip(want) {
            assert_eq!(pol.matches(conn), want, "{case}: {conn}");
        }
    }
}

#[test]
fn empty_shapes_follow_istio() {
    // No rules: matches nothing (an ALLOW policy without rules denies everything).
    assert!(!allow(vec![]).matches(&tls()));
    // A rule with no clauses, or with an empty clause: matches everything.
    assert!(allow(vec![vec![]]).matches(&plaintext()));
    assert!(allow(vec![vec![vec![]]]).matches(&plaintext()));
    // A clause whose only match is empty: matches nothing.
    assert!(!single(RbacMatch::default()).matches(&tls()));
}

#[test]
fn rules_any_clauses_all_matches_any() {
    let ns = |n: &str| RbacMatch {
        namespaces: vec![exact(n)],
        ..Default::default()
    };
    let port = |p: u16| RbacMatch {
        destination_ports: vec![p],
        ..Default::default()
    };
    // One rule: (ns a OR ns namespace) AND port 8080.
    let pol = allow(vec![vec![vec![ns("a"), ns("namespace")], vec![port(8080)]]]);
    assert!(pol.matches(&tls()));
    assert!(!pol.matches(&tls_alt())); // wrong ns and port
    let wrong_port = ConnectionAttrs {
        dst: "127.0.0.2:1".parse().unwrap(),
        ..tls()
    };
    assert!(!pol.matches(&wrong_port));
    // An empty match beside a real one is skipped, the real one still decides.
    let pol = allow(vec![vec![vec![RbacMatch::default(), ns("ns-alt")]]]);
    assert!(pol.matches(&tls_alt()));
    assert!(!pol.matches(&tls()));
    // Two rules: either may match.
    let pol = allow(vec![vec![vec![ns("namespace")]], vec![vec![ns("ns-alt")]]]);
    assert!(pol.matches(&tls()) && pol.matches(&tls_alt()));
    assert!(!pol.matches(&plaintext()));
}

#[test]
fn string_match_kinds() {
    let cases = [
        (exact("foo"), "foo", true),
        (exact("foo"), "foobar", false),
        (exact("foo"), "", false),
        (StringMatch::Prefix("foo".into()), "foobar", true),
        (StringMatch::Prefix("foo".into()), "barfoo", false),
        (StringMatch::Suffix("foo".into()), "barfoo", true),
        (StringMatch::Suffix("foo".into()), "foobar", false),
        (StringMatch::Presence, "x", true),
        (StringMatch::Presence, "", false),
    ];
    for (m, v, want) in cases {
        assert_eq!(m.matches(v), want, "{m:?} vs {v:?}");
    }
}

#[test]
fn string_match_yaml_tags() {
    let v: Vec<StringMatch> = serde_yaml::from_str(
        "- !Exact cluster.local/ns/default/sa/client\n- !Prefix a\n- !Suffix b\n\
         - !Presence\n- !Presence []\n- Presence\n- Exact: c\n",
    )
    .unwrap();
    assert_eq!(
        v,
        vec![
            exact("cluster.local/ns/default/sa/client"),
            StringMatch::Prefix("a".into()),
            StringMatch::Suffix("b".into()),
            StringMatch::Presence,
            StringMatch::Presence,
            StringMatch::Presence,
            exact("c"),
        ]
    );
    // Round trip through YAML and JSON keeps Istio's encoding.
    let yaml = serde_yaml::to_string(&v[..4].to_vec()).unwrap();
    assert!(
        yaml.contains("!Exact cluster.local/ns/default/sa/client"),
        "{yaml}"
    );
    assert!(yaml.contains("!Presence []"), "{yaml}");
    assert_eq!(
        serde_yaml::from_str::<Vec<StringMatch>>(&yaml).unwrap(),
        v[..4]
    );
    let json = serde_json::to_string(&v[..4]).unwrap();
    assert!(json.contains(r#"{"Presence":[]}"#), "{json}");
    assert_eq!(
        serde_json::from_str::<Vec<StringMatch>>(&json).unwrap(),
        v[..4]
    );

    // Like Istio (serde derive), `!Exact` with no value is the empty string.
    let empty: Vec<StringMatch> = serde_yaml::from_str("- !Exact\n").unwrap();
    assert_eq!(empty, vec![exact("")]);
    for bad in ["- !Regex a\n", "- plain\n", "- !Exact [a]\n"] {
        assert!(
            serde_yaml::from_str::<Vec<StringMatch>>(bad).is_err(),
            "{bad}"
        );
    }
}

#[test]
fn invalid_cidr_is_a_clear_error() {
    let err = serde_yaml::from_str::<RbacMatch>("sourceIps: [10.0.0.0/33]\n").unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("invalid CIDR \"10.0.0.0/33\""), "{msg}");
    assert!(err.location().is_some());
    // A bare IP means a single host.
    let m: RbacMatch = serde_yaml::from_str("sourceIps: [10.1.2.3, \"fd00::1\"]\n").unwrap();
    assert_eq!(m.source_ips, vec![net("10.1.2.3/32"), net("fd00::1/128")]);
}

#[test]
fn policy_yaml_fields() {
    let yaml = r#"
name: p
namespace: ns
scope: WorkloadSelector
action: Deny
dryRun: true
rules:
- - - notPrincipals: [!Presence ]
      notServiceAccounts: [{namespace: a, serviceAccount: b}]
      notDestinationIps: [10.0.0.0/8]
"#;
    let p: Authorization = serde_yaml::from_str(yaml).unwrap();
    assert_eq!(p.key(), "ns/p");
    assert_eq!(p.scope, Scope::WorkloadSelector);
    assert_eq!(p.action, Action::Deny);
    assert!(p.dry_run);
    assert_eq!(p.rules[0][0][0].not_principals, vec![StringMatch::Presence]);
    assert!(
        serde_yaml::from_str::<Authorization>("name: p\nscope: Mesh\naction: Allow\n").is_err()
    );
}
