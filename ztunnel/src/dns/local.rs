//! Answers from the mesh's own state: A and AAAA records for service hostnames.

use std::net::IpAddr;
use std::sync::Arc;

use hickory_proto::rr::rdata::{A, AAAA, CNAME};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use rand::seq::SliceRandom;

use super::names::{self, Candidate};
use crate::state::{ProxyState, Service};

/// Istio's TTL for the answers it gives itself.
pub const TTL: u32 = 30;

/// What the local state says about one A or AAAA question.
#[derive(Debug, PartialEq)]
pub enum LocalAnswer {
    /// A mesh name: these records (maybe none: the name has no address of the asked
    /// family, an empty NOERROR).
    Records(Vec<Record>),
    /// Not a mesh name: ask upstream.
    Unknown,
}

/// Settings shared by every pod's DNS server.
#[derive(Debug, Clone)]
pub struct LocalZone {
    pub cluster_domain: String,
    /// False: AAAA questions for mesh names get no address.
    pub ipv6_enabled: bool,
}

impl LocalZone {
    /// The answer for `name` (`qtype` A or AAAA) asked by a client in `namespace`.
    pub fn answer(
        &self,
        state: &ProxyState,
        name: &Name,
        qtype: RecordType,
        namespace: &str,
    ) -> LocalAnswer {
        let want_v4 = match qtype {
            RecordType::A => true,
            RecordType::AAAA => false,
            _ => return LocalAnswer::Unknown,
        };
        let asked = name.to_lowercase().to_ascii();
        let asked = asked.trim_end_matches('.');
        let Some((candidate, service)) = names::candidates(asked, namespace, &self.cluster_domain)
            .into_iter()
            .find_map(|c| self.find(state, &c, namespace).map(|s| (c, s)))
        else {
            return LocalAnswer::Unknown;
        };
        let mut ips = if !want_v4 && !self.ipv6_enabled {
            Vec::new()
        } else {
            self.addresses(state, &service, want_v4)
        };
        ips.shuffle(&mut rand::rng());

        let mut records = Vec::with_capacity(ips.len() + 1);
        let owner = match &candidate.alias {
            Some(alias) => {
                let Ok(target) = Name::from_ascii(format!("{alias}.")) else {
                    return LocalAnswer::Unknown;
                };
                records.push(Record::from_rdata(
                    name.clone(),
                    TTL,
                    RData::CNAME(CNAME(target.clone())),
                ));
                target
            }
            None => name.clone(),
        };
        records.extend(ips.into_iter().map(|ip| {
            let rdata = match ip {
                IpAddr::V4(v4) => RData::A(A(v4)),
                IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
            };
            Record::from_rdata(owner.clone(), TTL, rdata)
        }));
        LocalAnswer::Records(records)
    }

    /// The service a candidate names, exactly or through a wildcard host.
    /// The Kubernetes Services (namespace, hostname) that `name`, asked from
    /// `namespace`, may be: its candidates of the form `<svc>.<ns>.svc.<domain>`.
    pub fn service_hostnames(&self, name: &Name, namespace: &str) -> Vec<(String, String)> {
        let asked = name.to_lowercase().to_ascii();
        let suffix = format!(".svc.{}", self.cluster_domain);
        names::candidates(asked.trim_end_matches('.'), namespace, &self.cluster_domain)
            .into_iter()
            .filter_map(|c| {
                let (service, ns) = c.hostname.strip_suffix(&suffix)?.split_once('.')?;
                (!service.is_empty() && !ns.is_empty() && !ns.contains('.'))
                    .then(|| (ns.to_owned(), c.hostname.clone()))
            })
            .collect()
    }

    fn find(&self, state: &ProxyState, c: &Candidate, namespace: &str) -> Option<Arc<Service>> {
        state
            .service_by_hostname(&c.hostname, namespace)
            .or_else(|| {
                let wildcard = names::wildcard_of(&c.hostname)?;
                state.service_by_hostname(&wildcard, namespace)
            })
    }

    /// The service's VIPs of the asked family; a headless Kubernetes Service's ready
    /// endpoints instead.
    fn addresses(&self, state: &ProxyState, service: &Service, want_v4: bool) -> Vec<IpAddr> {
        let family = |ip: &IpAddr| ip.is_ipv4() == want_v4;
        if !service.vips.is_empty() {
            return service
                .vips
                .iter()
                .map(|vip| vip.address)
                .filter(family)
                .collect();
        }
        if !names::is_kubernetes_service(&service.hostname, &self.cluster_domain) {
            return Vec::new();
        }
        let mut ips: Vec<IpAddr> = state
            .endpoint_workloads(service)
            .into_iter()
            .flat_map(|(w, _)| w.workload_ips.clone())
            .filter(family)
            .collect();
        ips.sort();
        ips.dedup();
        ips
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{HealthStatus, NetworkAddress, Workload};
    use std::collections::HashMap;

    fn zone() -> LocalZone {
        LocalZone {
            cluster_domain: "cluster.local".into(),
            ipv6_enabled: true,
        }
    }

    fn service(ns: &str, hostname: &str, vips: &[&str]) -> Service {
        Service {
            name: hostname.split('.').next().unwrap_or_default().into(),
            namespace: ns.into(),
            hostname: hostname.into(),
            vips: vips
                .iter()
                .map(|v| NetworkAddress {
                    network: String::new(),
                    address: v.parse().unwrap(),
                })
                .collect(),
            ..Default::default()
        }
    }

    fn endpoint(uid: &str, ip: &str, service_key: &str, status: HealthStatus) -> Workload {
        Workload {
            uid: uid.into(),
            name: uid.into(),
            namespace: "demo".into(),
            workload_ips: vec![ip.parse().unwrap()],
            services: HashMap::from([(service_key.to_owned(), HashMap::new())]),
            status,
            ..Default::default()
        }
    }

    fn state() -> ProxyState {
        let mut s = ProxyState::new();
        s.insert_service(service(
            "demo",
            "server.demo.svc.cluster.local",
            &["10.96.0.20", "fd00::20"],
        ));
        s.insert_service(service(
            "demo",
            "v4only.demo.svc.cluster.local",
            &["10.96.0.21"],
        ));
        s.insert_service(service("demo", "db.demo.svc.cluster.local", &[]));
        let key = "demo/db.demo.svc.cluster.local";
        s.insert_workload(endpoint("db-0", "10.244.1.5", key, HealthStatus::Healthy));
        s.insert_workload(endpoint("db-1", "10.244.1.6", key, HealthStatus::Healthy));
        s.insert_workload(endpoint("db-2", "10.244.1.7", key, HealthStatus::Unhealthy));
        // One hostname in two namespaces (ServiceEntries): each client sees its own.
        s.insert_service(service("demo", "api.example.com", &["240.240.0.1"]));
        s.insert_service(service("other", "api.example.com", &["240.240.0.2"]));
        s.insert_service(service("demo", "*.wild.example.com", &["240.240.0.3"]));
        s
    }

    fn ask(name: &str, qtype: RecordType, ns: &str) -> LocalAnswer {
        zone().answer(&state(), &Name::from_ascii(name).unwrap(), qtype, ns)
    }

    fn addresses(answer: &LocalAnswer) -> Vec<String> {
        let LocalAnswer::Records(records) = answer else {
            panic!("expected a local answer, got {answer:?}");
        };
        let mut out: Vec<String> = records
            .iter()
            .filter_map(|r| match r.data() {
                RData::A(a) => Some(a.0.to_string()),
                RData::AAAA(a) => Some(a.0.to_string()),
                _ => None,
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn service_names_answer_with_their_vips_in_each_family() {
        for name in [
            "server.demo.svc.cluster.local.",
            "server.demo.",
            "server.",
            "SERVER.Demo.svc.",
        ] {
            let answer = ask(name, RecordType::A, "demo");
            assert_eq!(addresses(&answer), ["10.96.0.20"], "{name}");
            let LocalAnswer::Records(records) = &answer else {
                unreachable!()
            };
            assert_eq!(records[0].name(), &Name::from_ascii(name).unwrap());
            assert_eq!(records[0].ttl(), TTL);
        }
        assert_eq!(
            addresses(&ask(
                "server.demo.svc.cluster.local.",
                RecordType::AAAA,
                "demo"
            )),
            ["fd00::20"]
        );
        // Short names expand from the client's namespace only.
        assert_eq!(ask("server.", RecordType::A, "other"), LocalAnswer::Unknown);
    }

    #[test]
    fn a_known_name_without_an_address_of_the_family_is_empty() {
        let answer = ask("v4only.demo.svc.cluster.local.", RecordType::AAAA, "demo");
        assert_eq!(answer, LocalAnswer::Records(vec![]));
        let no_v6 = LocalZone {
            ipv6_enabled: false,
            ..zone()
        };
        let name = Name::from_ascii("server.demo.svc.cluster.local.").unwrap();
        assert_eq!(
            no_v6.answer(&state(), &name, RecordType::AAAA, "demo"),
            LocalAnswer::Records(vec![])
        );
    }

    #[test]
    fn unknown_names_and_other_types_go_upstream() {
        assert_eq!(
            ask("nope.demo.svc.cluster.local.", RecordType::A, "demo"),
            LocalAnswer::Unknown
        );
        assert_eq!(
            ask("example.org.", RecordType::A, "demo"),
            LocalAnswer::Unknown
        );
        assert_eq!(
            ask("server.demo.svc.cluster.local.", RecordType::TXT, "demo"),
            LocalAnswer::Unknown
        );
    }

    #[test]
    fn headless_services_answer_their_ready_endpoints() {
        let answer = ask("db.demo.svc.cluster.local.", RecordType::A, "demo");
        assert_eq!(addresses(&answer), ["10.244.1.5", "10.244.1.6"]);
    }

    #[test]
    fn a_stripped_search_domain_answers_through_a_cname() {
        let asked = "server.demo.svc.cluster.local.demo.svc.cluster.local.";
        let LocalAnswer::Records(records) = ask(asked, RecordType::A, "demo") else {
            panic!("expected a local answer");
        };
        let target = Name::from_ascii("server.demo.svc.cluster.local.").unwrap();
        assert_eq!(records[0].name(), &Name::from_ascii(asked).unwrap());
        assert_eq!(records[0].data(), &RData::CNAME(CNAME(target.clone())));
        assert_eq!(records[1].name(), &target);
        assert_eq!(records.len(), 2);
    }

    #[test]
    fn the_clients_namespace_wins_and_wildcards_match() {
        assert_eq!(
            addresses(&ask("api.example.com.", RecordType::A, "demo")),
            ["240.240.0.1"]
        );
        assert_eq!(
            addresses(&ask("api.example.com.", RecordType::A, "other")),
            ["240.240.0.2"]
        );
        // A namespace without its own sees one of the others.
        assert_eq!(
            addresses(&ask("api.example.com.", RecordType::A, "third")).len(),
            1
        );
        assert_eq!(
            addresses(&ask("x.wild.example.com.", RecordType::A, "demo")),
            ["240.240.0.3"]
        );
    }
}
