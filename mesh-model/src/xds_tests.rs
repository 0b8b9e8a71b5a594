use std::collections::BTreeMap;

use shared_types::istio::security as pb_sec;
use shared_types::istio::workload as pb;

use super::*;
use crate::ConnectionAttrs;

fn full_workload() -> pb::Workload {
    pb::Workload {
        uid: "Kubernetes//Pod/shop/web-0".into(),
        name: "web-0".into(),
        namespace: "shop".into(),
        addresses: vec![
            vec![10, 0, 0, 5],
            "fd00::5"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets()
                .to_vec(),
        ],
        network: "net1".into(),
        tunnel_protocol: pb::TunnelProtocol::Hbone as i32,
        trust_domain: "td".into(),
        service_account: "web".into(),
        waypoint: Some(pb::GatewayAddress {
            destination: Some(pb::gateway_address::Destination::Hostname(
                pb::NamespacedHostname {
                    namespace: "shop".into(),
                    hostname: "wp.shop.svc.cluster.local".into(),
                },
            )),
            hbone_mtls_port: 15008,
        }),
        node: "node-1".into(),
        workload_type: pb::WorkloadType::Deployment as i32,
        workload_name: "web".into(),
        services: BTreeMap::from([(
            "shop/web.shop.svc.cluster.local".into(),
            pb::PortList {
                ports: vec![pb::Port {
                    service_port: 80,
                    target_port: 8080,
                    app_protocol: 0,
                }],
            },
        )]),
        authorization_policies: vec!["shop/allow-web".into()],
        status: pb::WorkloadStatus::Unhealthy as i32,
        cluster_id: "Kubernetes".into(),
        locality: Some(pb::Locality {
            region: "r".into(),
            zone: "z".into(),
            subzone: String::new(),
        }),
        capacity: Some(3),
        ..Default::default()
    }
}

#[test]
fn a_workload_keeps_every_field_we_act_on() {
    let w = workload(full_workload()).unwrap();
    assert_eq!(w.uid, "Kubernetes//Pod/shop/web-0");
    assert_eq!(
        w.workload_ips,
        vec![
            "10.0.0.5".parse::<IpAddr>().unwrap(),
            "fd00::5".parse::<IpAddr>().unwrap()
        ]
    );
    assert!(w.is_hbone());
    assert_eq!(w.identity().to_uri(), "spiffe://td/ns/shop/sa/web");
    assert_eq!(w.status, HealthStatus::Unhealthy);
    assert_eq!(w.workload_type, "deployment");
    assert_eq!(
        w.service_target_port("shop/web.shop.svc.cluster.local", 80),
        Some(8080)
    );
    assert_eq!(w.authorization_policies, vec!["shop/allow-web"]);
    assert_eq!(w.waypoint.unwrap().to_owned().hbone_mtls_port, 15008);
    assert_eq!(w.locality.zone, "z");
    assert_eq!(w.capacity, 3);
    // Unset capacity is Istio's 1, not 0.
    let mut bare = full_workload();
    bare.capacity = None;
    assert_eq!(workload(bare).unwrap().capacity, 1);
}

#[test]
fn a_bad_field_is_named_not_defaulted() {
    type Breaker = Box<dyn Fn(&mut pb::Workload)>;
    let cases: Vec<(Breaker, &str)> = vec![
        (Box::new(|w| w.uid.clear()), "no uid"),
        (Box::new(|w| w.addresses.push(vec![1, 2, 3])), "addresses"),
        (Box::new(|w| w.tunnel_protocol = 9), "tunnel_protocol"),
        (
            Box::new(|w| w.tunnel_protocol = pb::TunnelProtocol::LegacyIstioMtls as i32),
            "LEGACY_ISTIO_MTLS",
        ),
        (Box::new(|w| w.status = -1), "status"),
        (
            Box::new(|w| {
                w.services
                    .values_mut()
                    .for_each(|l| l.ports[0].target_port = 70000)
            }),
            "70000",
        ),
        (
            Box::new(|w| w.waypoint.as_mut().unwrap().destination = None),
            "waypoint",
        ),
    ];
    for (break_it, expected) in cases {
        let mut w = full_workload();
        break_it(&mut w);
        let e = workload(w).unwrap_err().to_string();
        assert!(e.contains(expected), "{e:?} should name {expected:?}");
    }
}

/// `shop/web.shop.svc.cluster.local` on 10.96.0.10, no ports.
fn web_service() -> pb::Service {
    pb::Service {
        name: "web".into(),
        namespace: "shop".into(),
        hostname: "web.shop.svc.cluster.local".into(),
        addresses: vec![pb::NetworkAddress {
            network: String::new(),
            address: vec![10, 96, 0, 10],
            length: None,
        }],
        ..Default::default()
    }
}

#[test]
fn a_service_and_its_load_balancing() {
    let s = service(pb::Service {
        ports: vec![pb::Port {
            service_port: 80,
            target_port: 8080,
            app_protocol: 0,
        }],
        load_balancing: Some(pb::LoadBalancing {
            routing_preference: vec![
                pb::load_balancing::Scope::Network as i32,
                pb::load_balancing::Scope::Node as i32,
            ],
            mode: pb::load_balancing::Mode::Failover as i32,
            health_policy: pb::load_balancing::HealthPolicy::AllowAll as i32,
        }),
        ip_families: pb::IpFamilies::Ipv4Only as i32,
        ..web_service()
    })
    .unwrap();
    assert_eq!(s.key(), "shop/web.shop.svc.cluster.local");
    assert_eq!(s.vips[0].to_string(), "/10.96.0.10");
    assert_eq!(s.default_target_port(80), 8080);
    assert!(s.accepts_endpoint(HealthStatus::Unhealthy));
    let lb = s.load_balancer.unwrap();
    assert_eq!(
        lb.routing_preferences,
        vec![LoadBalancerScope::Network, LoadBalancerScope::Node]
    );
    assert_eq!(lb.mode, Some(LoadBalancerMode::Failover));
    assert_eq!(s.ip_families, Some(IpFamilies::IPv4));

    let e = service(pb::Service {
        namespace: "shop".into(),
        ..Default::default()
    })
    .unwrap_err();
    assert!(e.to_string().contains("hostname"), "{e}");
}

fn exact(s: &str) -> pb_sec::StringMatch {
    pb_sec::StringMatch {
        match_type: Some(pb_sec::string_match::MatchType::Exact(s.into())),
    }
}

#[test]
fn a_policy_matches_as_istio_reads_it() {
    let policy = authorization(pb_sec::Authorization {
        name: "deny-v6".into(),
        namespace: "shop".into(),
        scope: pb_sec::Scope::Namespace as i32,
        action: pb_sec::Action::Deny as i32,
        rules: vec![pb_sec::Rule {
            clauses: vec![
                pb_sec::Clause {
                    matches: vec![pb_sec::Match {
                        source_ips: vec![pb_sec::Address {
                            address: "fd00::"
                                .parse::<std::net::Ipv6Addr>()
                                .unwrap()
                                .octets()
                                .to_vec(),
                            length: 64,
                        }],
                        ..Default::default()
                    }],
                },
                pb_sec::Clause {
                    matches: vec![pb_sec::Match {
                        not_namespaces: vec![exact("trusted")],
                        destination_ports: vec![8080],
                        ..Default::default()
                    }],
                },
            ],
        }],
        dry_run: false,
    })
    .unwrap();
    assert_eq!(policy.key(), "shop/deny-v6");
    assert_eq!(policy.action, Action::Deny);
    assert_eq!(policy.scope, Scope::Namespace);
    let conn = |src: &str, port| ConnectionAttrs {
        src_identity: None,
        src_ip: src.parse().unwrap(),
        dst: std::net::SocketAddr::new("10.0.0.5".parse().unwrap(), port),
    };
    assert!(policy.matches(&conn("fd00::7", 8080)));
    assert!(!policy.matches(&conn("fd01::7", 8080)), "outside the CIDR");
    assert!(!policy.matches(&conn("fd00::7", 9090)), "another port");
}

#[test]
fn a_bad_policy_is_named() {
    let base = || pb_sec::Authorization {
        name: "p".into(),
        namespace: "shop".into(),
        ..Default::default()
    };
    let with_match = |m: pb_sec::Match| pb_sec::Authorization {
        rules: vec![pb_sec::Rule {
            clauses: vec![pb_sec::Clause { matches: vec![m] }],
        }],
        ..base()
    };
    let cases = [
        (
            pb_sec::Authorization {
                action: 7,
                ..base()
            },
            "action",
        ),
        (
            pb_sec::Authorization {
                name: String::new(),
                ..base()
            },
            "no name",
        ),
        (
            with_match(pb_sec::Match {
                source_ips: vec![pb_sec::Address {
                    address: vec![10, 0, 0, 0],
                    length: 33,
                }],
                ..Default::default()
            }),
            "source_ips",
        ),
        (
            with_match(pb_sec::Match {
                principals: vec![pb_sec::StringMatch { match_type: None }],
                ..Default::default()
            }),
            "principals",
        ),
        (
            with_match(pb_sec::Match {
                not_destination_ports: vec![65536],
                ..Default::default()
            }),
            "not_destination_ports",
        ),
    ];
    for (policy, expected) in cases {
        let e = authorization(policy).unwrap_err().to_string();
        assert!(e.contains(expected), "{e:?} should name {expected:?}");
    }
}

#[test]
fn encoding_then_decoding_gives_the_same_values_and_bytes_are_stable() {
    let w = workload(full_workload()).unwrap();
    let encoded = encode_workload(&w);
    let Converted::Workload(back) = address(encoded.clone()).unwrap() else {
        panic!("a workload")
    };
    assert_eq!(*back, w);
    // Same value, same bytes: a rebuild that changes nothing gets the same version.
    use prost::Message;
    let again = encode_workload(&workload(full_workload()).unwrap());
    assert_eq!(encoded.encode_to_vec(), again.encode_to_vec());

    let mut s = service(pb::Service {
        ports: (1..20)
            .map(|p| pb::Port {
                service_port: p,
                target_port: p + 8000,
                app_protocol: 0,
            })
            .collect(),
        ip_families: pb::IpFamilies::Dual as i32,
        ..web_service()
    })
    .unwrap();
    s.canonical = true;
    let Converted::Service(back) = address(encode_service(&s)).unwrap() else {
        panic!("a service")
    };
    assert_eq!(*back, s);

    let policy = Authorization {
        name: "p".into(),
        namespace: "shop".into(),
        scope: Scope::WorkloadSelector,
        action: Action::Deny,
        rules: vec![vec![vec![RbacMatch {
            namespaces: vec![StringMatch::Prefix("a".into()), StringMatch::Presence],
            not_principals: vec![StringMatch::Suffix("/sa/x".into())],
            source_ips: vec!["fd00::/64".parse().unwrap()],
            not_destination_ips: vec!["10.0.0.0/8".parse().unwrap()],
            destination_ports: vec![80, 443],
            service_accounts: vec![ServiceAccountMatch {
                namespace: "ns".into(),
                service_account: "sa".into(),
            }],
            ..Default::default()
        }]]],
        dry_run: true,
        warnings: vec![],
    };
    assert_eq!(
        authorization(encode_authorization(&policy)).unwrap(),
        policy
    );
}
