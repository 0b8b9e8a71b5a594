//! The model in Istio's xDS form (`istio.workload.Address`, `istio.security.Authorization`),
//! both ways: istiod-lite encodes, ztunnel decodes.
//!
//! Decoding reads from the network: a field out of range, an address of the wrong
//! length or an enum value we do not know is an error naming the field, never a panic
//! and never a silent default, so the resource can be NACKed by name. Encoding is
//! deterministic (maps ordered), so equal values give equal bytes and equal versions.

use std::collections::HashMap;
use std::net::IpAddr;

use ipnet::IpNet;
use shared_types::istio::security as pb_sec;
use shared_types::istio::workload as pb;

use crate::policy::{Action, RbacMatch, Scope, ServiceAccountMatch, StringMatch};
use crate::service::{
    AppProtocol, IpFamilies, LoadBalancer, LoadBalancerHealthPolicy, LoadBalancerMode,
    LoadBalancerScope, NamespacedHostname, NetworkAddress,
};
use crate::workload::{
    ApplicationTunnel, ApplicationTunnelProtocol, GatewayAddress, GatewayDestination, HealthStatus,
    Locality, NetworkMode, Protocol,
};
use crate::{Authorization, Service, Workload};

/// Why one resource was refused; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConvertError(String);

fn err<T>(what: impl Into<String>) -> Result<T, ConvertError> {
    Err(ConvertError(what.into()))
}

/// One resource of either type, converted.
#[derive(Debug, Clone, PartialEq)]
pub enum Converted {
    /// A workload `Address`.
    Workload(Box<Workload>),
    /// A service `Address`.
    Service(Box<Service>),
    /// An `Authorization` policy.
    Policy(Box<Authorization>),
}

/// An `Address` resource: a workload or a service.
pub fn address(address: pb::Address) -> Result<Converted, ConvertError> {
    match address.r#type {
        Some(pb::address::Type::Workload(w)) => Ok(Converted::Workload(Box::new(workload(w)?))),
        Some(pb::address::Type::Service(s)) => Ok(Converted::Service(Box::new(service(s)?))),
        None => err("the address is neither a workload nor a service"),
    }
}

/// A closed proto enum: an unknown number is an error naming the field.
fn known<E: TryFrom<i32>>(value: i32, field: &str) -> Result<E, ConvertError> {
    E::try_from(value).or_else(|_| err(format!("{field}: unknown value {value}")))
}

fn ip(bytes: &[u8], field: &str) -> Result<IpAddr, ConvertError> {
    if let Ok(v4) = <[u8; 4]>::try_from(bytes) {
        return Ok(v4.into());
    }
    if let Ok(v6) = <[u8; 16]>::try_from(bytes) {
        return Ok(v6.into());
    }
    err(format!(
        "{field}: an IP address has 4 or 16 bytes, not {}",
        bytes.len()
    ))
}

fn port(value: u32, field: &str) -> Result<u16, ConvertError> {
    u16::try_from(value).or_else(|_| err(format!("{field}: port {value} is out of range")))
}

fn network_address(a: pb::NetworkAddress, field: &str) -> Result<NetworkAddress, ConvertError> {
    Ok(NetworkAddress {
        network: a.network,
        address: ip(&a.address, field)?,
    })
}

fn gateway(g: pb::GatewayAddress, field: &str) -> Result<GatewayAddress, ConvertError> {
    let destination = match g.destination {
        Some(pb::gateway_address::Destination::Address(a)) => {
            GatewayDestination::Address(network_address(a, field)?)
        }
        Some(pb::gateway_address::Destination::Hostname(h)) => {
            if h.namespace.is_empty() || h.hostname.is_empty() {
                return err(format!("{field}: a hostname needs a namespace and a name"));
            }
            GatewayDestination::Hostname(NamespacedHostname {
                namespace: h.namespace,
                hostname: h.hostname,
            })
        }
        None => return err(format!("{field}: no destination")),
    };
    Ok(GatewayAddress {
        destination,
        hbone_mtls_port: port(g.hbone_mtls_port, field)?,
    })
}

fn port_map(ports: &[pb::Port], field: &str) -> Result<HashMap<u16, u16>, ConvertError> {
    ports
        .iter()
        .map(|p| Ok((port(p.service_port, field)?, port(p.target_port, field)?)))
        .collect()
}

/// The declared application protocols of `ports` (unknown ones are left out).
fn app_protocols(ports: &[pb::Port]) -> Result<HashMap<u16, AppProtocol>, ConvertError> {
    let mut out = HashMap::new();
    for p in ports {
        let protocol = match pb::AppProtocol::try_from(p.app_protocol) {
            Ok(pb::AppProtocol::Http11) => AppProtocol::Http11,
            Ok(pb::AppProtocol::Http2) => AppProtocol::Http2,
            Ok(pb::AppProtocol::Grpc) => AppProtocol::Grpc,
            Ok(pb::AppProtocol::Unknown) | Err(_) => continue,
        };
        out.insert(port(p.service_port, "ports")?, protocol);
    }
    Ok(out)
}

/// A `Workload`. It needs a uid; sidecar workloads (`LEGACY_ISTIO_MTLS`) are refused.
pub fn workload(w: pb::Workload) -> Result<Workload, ConvertError> {
    if w.uid.is_empty() {
        return err("workload has no uid");
    }
    let protocol = match known(w.tunnel_protocol, "tunnel_protocol")? {
        pb::TunnelProtocol::None => Protocol::Tcp,
        pb::TunnelProtocol::Hbone => Protocol::Hbone,
        pb::TunnelProtocol::LegacyIstioMtls => {
            return err("tunnel_protocol LEGACY_ISTIO_MTLS (sidecars) is not supported")
        }
    };
    let status = match known(w.status, "status")? {
        pb::WorkloadStatus::Healthy => HealthStatus::Healthy,
        pb::WorkloadStatus::Unhealthy => HealthStatus::Unhealthy,
    };
    let network_mode = match known(w.network_mode, "network_mode")? {
        pb::NetworkMode::Standard => NetworkMode::Standard,
        pb::NetworkMode::HostNetwork => NetworkMode::HostNetwork,
    };
    let workload_type = match known(w.workload_type, "workload_type")? {
        pb::WorkloadType::Deployment => "deployment",
        pb::WorkloadType::Cronjob => "cronjob",
        pb::WorkloadType::Pod => "pod",
        pb::WorkloadType::Job => "job",
    };
    let application_tunnel = w
        .application_tunnel
        .map(|t| {
            let protocol = match known(t.protocol, "application_tunnel.protocol")? {
                pb::application_tunnel::Protocol::None => ApplicationTunnelProtocol::None,
                pb::application_tunnel::Protocol::Proxy => ApplicationTunnelProtocol::Proxy,
            };
            let port = port(t.port, "application_tunnel.port")?;
            Ok(ApplicationTunnel {
                protocol,
                port: (port != 0).then_some(port),
            })
        })
        .transpose()?;
    let services = w
        .services
        .into_iter()
        .map(|(key, list)| {
            let ports = port_map(&list.ports, &format!("services[{key}]"))?;
            Ok((key, ports))
        })
        .collect::<Result<_, ConvertError>>()?;
    Ok(Workload {
        workload_ips: w
            .addresses
            .iter()
            .map(|a| ip(a, "addresses"))
            .collect::<Result<_, _>>()?,
        waypoint: w.waypoint.map(|g| gateway(g, "waypoint")).transpose()?,
        network_gateway: w
            .network_gateway
            .map(|g| gateway(g, "network_gateway"))
            .transpose()?,
        uid: w.uid,
        name: w.name,
        namespace: w.namespace,
        service_account: w.service_account,
        trust_domain: w.trust_domain,
        protocol,
        node: w.node,
        network: w.network,
        status,
        authorization_policies: w.authorization_policies,
        services,
        network_mode,
        workload_name: w.workload_name,
        workload_type: workload_type.into(),
        canonical_name: w.canonical_name,
        canonical_revision: w.canonical_revision,
        hostname: w.hostname,
        native_tunnel: w.native_tunnel,
        application_tunnel,
        cluster_id: w.cluster_id,
        locality: w
            .locality
            .map(|l| Locality {
                region: l.region,
                zone: l.zone,
                subzone: l.subzone,
            })
            .unwrap_or_default(),
        capacity: w.capacity.unwrap_or(1),
    })
}

/// A `Service`. It needs a namespace and a hostname; endpoints listed on the service
/// have no xDS field, so none are set.
pub fn service(s: pb::Service) -> Result<Service, ConvertError> {
    if s.namespace.is_empty() || s.hostname.is_empty() {
        return err("service needs a namespace and a hostname");
    }
    let load_balancer = s
        .load_balancing
        .map(|lb| {
            let routing_preferences = lb
                .routing_preference
                .into_iter()
                .filter_map(|scope| {
                    use pb::load_balancing::Scope as S;
                    match known(scope, "load_balancing.routing_preference") {
                        Ok(S::UnspecifiedScope) => None,
                        Ok(S::Region) => Some(Ok(LoadBalancerScope::Region)),
                        Ok(S::Zone) => Some(Ok(LoadBalancerScope::Zone)),
                        Ok(S::Subzone) => Some(Ok(LoadBalancerScope::Subzone)),
                        Ok(S::Node) => Some(Ok(LoadBalancerScope::Node)),
                        Ok(S::Cluster) => Some(Ok(LoadBalancerScope::Cluster)),
                        Ok(S::Network) => Some(Ok(LoadBalancerScope::Network)),
                        Err(e) => Some(Err(e)),
                    }
                })
                .collect::<Result<_, _>>()?;
            use pb::load_balancing::{HealthPolicy, Mode};
            let mode = match known(lb.mode, "load_balancing.mode")? {
                Mode::UnspecifiedMode => None,
                Mode::Strict => Some(LoadBalancerMode::Strict),
                Mode::Failover => Some(LoadBalancerMode::Failover),
                Mode::Passthrough => Some(LoadBalancerMode::Passthrough),
            };
            let health_policy = match known(lb.health_policy, "load_balancing.health_policy")? {
                HealthPolicy::OnlyHealthy => LoadBalancerHealthPolicy::OnlyHealthy,
                HealthPolicy::AllowAll => LoadBalancerHealthPolicy::AllowAll,
            };
            Ok(LoadBalancer {
                routing_preferences,
                mode,
                health_policy,
            })
        })
        .transpose()?;
    let ip_families = match known(s.ip_families, "ip_families")? {
        pb::IpFamilies::Automatic => None,
        pb::IpFamilies::Ipv4Only => Some(IpFamilies::IPv4),
        pb::IpFamilies::Ipv6Only => Some(IpFamilies::IPv6),
        pb::IpFamilies::Dual => Some(IpFamilies::Dual),
    };
    Ok(Service {
        vips: s
            .addresses
            .into_iter()
            .map(|a| network_address(a, "addresses"))
            .collect::<Result<_, _>>()?,
        ports: port_map(&s.ports, "ports")?,
        app_protocols: app_protocols(&s.ports)?,
        waypoint: s.waypoint.map(|g| gateway(g, "waypoint")).transpose()?,
        name: s.name,
        namespace: s.namespace,
        hostname: s.hostname,
        subject_alt_names: s.subject_alt_names,
        endpoints: HashMap::new(),
        load_balancer,
        ip_families,
        canonical: s.canonical,
    })
}

/// An `Authorization` policy. It needs a name.
pub fn authorization(a: pb_sec::Authorization) -> Result<Authorization, ConvertError> {
    if a.name.is_empty() {
        return err("policy has no name");
    }
    let scope = match known(a.scope, "scope")? {
        pb_sec::Scope::Global => Scope::Global,
        pb_sec::Scope::Namespace => Scope::Namespace,
        pb_sec::Scope::WorkloadSelector => Scope::WorkloadSelector,
    };
    let action = match known(a.action, "action")? {
        pb_sec::Action::Allow => Action::Allow,
        pb_sec::Action::Deny => Action::Deny,
    };
    let rules = a
        .rules
        .into_iter()
        .map(|rule| {
            rule.clauses
                .into_iter()
                .map(|clause| clause.matches.into_iter().map(rbac_match).collect())
                .collect()
        })
        .collect::<Result<_, _>>()?;
    Ok(Authorization {
        name: a.name,
        namespace: a.namespace,
        scope,
        action,
        rules,
        dry_run: a.dry_run,
        warnings: Vec::new(),
    })
}

fn rbac_match(m: pb_sec::Match) -> Result<RbacMatch, ConvertError> {
    let strings = |list: Vec<pb_sec::StringMatch>, field: &str| {
        list.into_iter()
            .map(|s| string_match(s, field))
            .collect::<Result<Vec<_>, _>>()
    };
    let cidrs = |list: Vec<pb_sec::Address>, field: &str| {
        list.into_iter()
            .map(|a| cidr(a, field))
            .collect::<Result<Vec<_>, _>>()
    };
    let ports = |list: Vec<u32>, field: &str| {
        list.into_iter()
            .map(|p| port(p, field))
            .collect::<Result<Vec<_>, _>>()
    };
    let accounts = |list: Vec<pb_sec::ServiceAccountMatch>| {
        list.into_iter()
            .map(|sa| ServiceAccountMatch {
                namespace: sa.namespace,
                service_account: sa.service_account,
            })
            .collect()
    };
    Ok(RbacMatch {
        namespaces: strings(m.namespaces, "namespaces")?,
        not_namespaces: strings(m.not_namespaces, "not_namespaces")?,
        principals: strings(m.principals, "principals")?,
        not_principals: strings(m.not_principals, "not_principals")?,
        service_accounts: accounts(m.service_accounts),
        not_service_accounts: accounts(m.not_service_accounts),
        source_ips: cidrs(m.source_ips, "source_ips")?,
        not_source_ips: cidrs(m.not_source_ips, "not_source_ips")?,
        destination_ips: cidrs(m.destination_ips, "destination_ips")?,
        not_destination_ips: cidrs(m.not_destination_ips, "not_destination_ips")?,
        destination_ports: ports(m.destination_ports, "destination_ports")?,
        not_destination_ports: ports(m.not_destination_ports, "not_destination_ports")?,
    })
}

fn string_match(s: pb_sec::StringMatch, field: &str) -> Result<StringMatch, ConvertError> {
    use pb_sec::string_match::MatchType;
    match s.match_type {
        Some(MatchType::Exact(v)) => Ok(StringMatch::Exact(v)),
        Some(MatchType::Prefix(v)) => Ok(StringMatch::Prefix(v)),
        Some(MatchType::Suffix(v)) => Ok(StringMatch::Suffix(v)),
        Some(MatchType::Presence(())) => Ok(StringMatch::Presence),
        None => err(format!("{field}: a string match with no kind")),
    }
}

fn cidr(a: pb_sec::Address, field: &str) -> Result<IpNet, ConvertError> {
    let address = ip(&a.address, field)?;
    let length = u8::try_from(a.length).unwrap_or(u8::MAX);
    IpNet::new(address, length).or_else(|_| {
        err(format!(
            "{field}: prefix length {} is too long for {address}",
            a.length
        ))
    })
}

/// The `Address` resource of a workload (its name is the uid).
pub fn encode_workload(w: &Workload) -> pb::Address {
    let workload_type = match w.workload_type.as_str() {
        "cronjob" => pb::WorkloadType::Cronjob,
        "pod" => pb::WorkloadType::Pod,
        "job" => pb::WorkloadType::Job,
        _ => pb::WorkloadType::Deployment,
    };
    let workload = pb::Workload {
        uid: w.uid.clone(),
        name: w.name.clone(),
        namespace: w.namespace.clone(),
        addresses: w.workload_ips.iter().map(ip_bytes).collect(),
        hostname: w.hostname.clone(),
        network: w.network.clone(),
        tunnel_protocol: match w.protocol {
            Protocol::Tcp => pb::TunnelProtocol::None,
            Protocol::Hbone => pb::TunnelProtocol::Hbone,
        } as i32,
        trust_domain: w.trust_domain.clone(),
        service_account: w.service_account.clone(),
        waypoint: w.waypoint.as_ref().map(encode_gateway),
        network_gateway: w.network_gateway.as_ref().map(encode_gateway),
        node: w.node.clone(),
        canonical_name: w.canonical_name.clone(),
        canonical_revision: w.canonical_revision.clone(),
        workload_type: workload_type as i32,
        workload_name: w.workload_name.clone(),
        native_tunnel: w.native_tunnel,
        application_tunnel: w
            .application_tunnel
            .as_ref()
            .map(|t| pb::ApplicationTunnel {
                protocol: match t.protocol {
                    ApplicationTunnelProtocol::None => pb::application_tunnel::Protocol::None,
                    ApplicationTunnelProtocol::Proxy => pb::application_tunnel::Protocol::Proxy,
                } as i32,
                port: t.port.map_or(0, u32::from),
            }),
        services: w
            .services
            .iter()
            .map(|(key, ports)| {
                let list = pb::PortList {
                    ports: encode_ports(ports, &HashMap::new()),
                };
                (key.clone(), list)
            })
            .collect(),
        authorization_policies: w.authorization_policies.clone(),
        status: match w.status {
            HealthStatus::Healthy => pb::WorkloadStatus::Healthy,
            HealthStatus::Unhealthy => pb::WorkloadStatus::Unhealthy,
        } as i32,
        cluster_id: w.cluster_id.clone(),
        locality: (w.locality != Locality::default()).then(|| pb::Locality {
            region: w.locality.region.clone(),
            zone: w.locality.zone.clone(),
            subzone: w.locality.subzone.clone(),
        }),
        network_mode: match w.network_mode {
            NetworkMode::Standard => pb::NetworkMode::Standard,
            NetworkMode::HostNetwork => pb::NetworkMode::HostNetwork,
        } as i32,
        capacity: (w.capacity != 1).then_some(w.capacity),
    };
    pb::Address {
        r#type: Some(pb::address::Type::Workload(workload)),
    }
}

/// The `Address` resource of a service (its name is `namespace/hostname`). Endpoints
/// listed on the service itself (a local-config form) have no xDS field and are left out.
pub fn encode_service(s: &Service) -> pb::Address {
    use pb::load_balancing::{HealthPolicy, Mode, Scope as S};
    let service = pb::Service {
        name: s.name.clone(),
        namespace: s.namespace.clone(),
        hostname: s.hostname.clone(),
        addresses: s
            .vips
            .iter()
            .map(|v| pb::NetworkAddress {
                network: v.network.clone(),
                address: ip_bytes(&v.address),
                length: None,
            })
            .collect(),
        ports: encode_ports(&s.ports, &s.app_protocols),
        subject_alt_names: s.subject_alt_names.clone(),
        waypoint: s.waypoint.as_ref().map(encode_gateway),
        load_balancing: s.load_balancer.as_ref().map(|lb| pb::LoadBalancing {
            routing_preference: lb
                .routing_preferences
                .iter()
                .map(|scope| match scope {
                    LoadBalancerScope::Region => S::Region,
                    LoadBalancerScope::Zone => S::Zone,
                    LoadBalancerScope::Subzone => S::Subzone,
                    LoadBalancerScope::Node => S::Node,
                    LoadBalancerScope::Cluster => S::Cluster,
                    LoadBalancerScope::Network => S::Network,
                } as i32)
                .collect(),
            mode: match lb.mode {
                None => Mode::UnspecifiedMode,
                Some(LoadBalancerMode::Standard) => Mode::UnspecifiedMode,
                Some(LoadBalancerMode::Strict) => Mode::Strict,
                Some(LoadBalancerMode::Failover) => Mode::Failover,
                Some(LoadBalancerMode::Passthrough) => Mode::Passthrough,
            } as i32,
            health_policy: match lb.health_policy {
                LoadBalancerHealthPolicy::OnlyHealthy => HealthPolicy::OnlyHealthy,
                LoadBalancerHealthPolicy::AllowAll => HealthPolicy::AllowAll,
            } as i32,
        }),
        ip_families: match s.ip_families {
            None => pb::IpFamilies::Automatic,
            Some(IpFamilies::IPv4) => pb::IpFamilies::Ipv4Only,
            Some(IpFamilies::IPv6) => pb::IpFamilies::Ipv6Only,
            Some(IpFamilies::Dual) => pb::IpFamilies::Dual,
        } as i32,
        canonical: s.canonical,
        ingress_use_waypoint: false,
    };
    pb::Address {
        r#type: Some(pb::address::Type::Service(service)),
    }
}

/// The `Authorization` resource of a policy (its name is `namespace/name`). The
/// conversion `warnings` have no xDS field: the control plane logs them.
pub fn encode_authorization(a: &Authorization) -> pb_sec::Authorization {
    pb_sec::Authorization {
        name: a.name.clone(),
        namespace: a.namespace.clone(),
        scope: match a.scope {
            Scope::Global => pb_sec::Scope::Global,
            Scope::Namespace => pb_sec::Scope::Namespace,
            Scope::WorkloadSelector => pb_sec::Scope::WorkloadSelector,
        } as i32,
        action: match a.action {
            Action::Allow => pb_sec::Action::Allow,
            Action::Deny => pb_sec::Action::Deny,
        } as i32,
        rules: a
            .rules
            .iter()
            .map(|rule| pb_sec::Rule {
                clauses: rule
                    .iter()
                    .map(|clause| pb_sec::Clause {
                        matches: clause.iter().map(encode_match).collect(),
                    })
                    .collect(),
            })
            .collect(),
        dry_run: a.dry_run,
    }
}

fn encode_match(m: &RbacMatch) -> pb_sec::Match {
    let strings = |list: &[StringMatch]| list.iter().map(encode_string_match).collect();
    let cidrs = |list: &[IpNet]| {
        list.iter()
            .map(|net| pb_sec::Address {
                address: ip_bytes(&net.addr()),
                length: u32::from(net.prefix_len()),
            })
            .collect()
    };
    let accounts = |list: &[ServiceAccountMatch]| {
        list.iter()
            .map(|sa| pb_sec::ServiceAccountMatch {
                namespace: sa.namespace.clone(),
                service_account: sa.service_account.clone(),
            })
            .collect()
    };
    let ports = |list: &[u16]| list.iter().map(|p| u32::from(*p)).collect();
    pb_sec::Match {
        namespaces: strings(&m.namespaces),
        not_namespaces: strings(&m.not_namespaces),
        principals: strings(&m.principals),
        not_principals: strings(&m.not_principals),
        source_ips: cidrs(&m.source_ips),
        not_source_ips: cidrs(&m.not_source_ips),
        destination_ips: cidrs(&m.destination_ips),
        not_destination_ips: cidrs(&m.not_destination_ips),
        destination_ports: ports(&m.destination_ports),
        not_destination_ports: ports(&m.not_destination_ports),
        service_accounts: accounts(&m.service_accounts),
        not_service_accounts: accounts(&m.not_service_accounts),
    }
}

fn encode_string_match(m: &StringMatch) -> pb_sec::StringMatch {
    use pb_sec::string_match::MatchType;
    let match_type = match m {
        StringMatch::Exact(v) => MatchType::Exact(v.clone()),
        StringMatch::Prefix(v) => MatchType::Prefix(v.clone()),
        StringMatch::Suffix(v) => MatchType::Suffix(v.clone()),
        StringMatch::Presence => MatchType::Presence(()),
    };
    pb_sec::StringMatch {
        match_type: Some(match_type),
    }
}

fn encode_gateway(g: &GatewayAddress) -> pb::GatewayAddress {
    let destination = match &g.destination {
        GatewayDestination::Address(a) => {
            pb::gateway_address::Destination::Address(pb::NetworkAddress {
                network: a.network.clone(),
                address: ip_bytes(&a.address),
                length: None,
            })
        }
        GatewayDestination::Hostname(h) => {
            pb::gateway_address::Destination::Hostname(pb::NamespacedHostname {
                namespace: h.namespace.clone(),
                hostname: h.hostname.clone(),
            })
        }
    };
    pb::GatewayAddress {
        destination: Some(destination),
        hbone_mtls_port: u32::from(g.hbone_mtls_port),
    }
}

/// Service port order, so equal maps encode alike.
fn encode_ports(ports: &HashMap<u16, u16>, protocols: &HashMap<u16, AppProtocol>) -> Vec<pb::Port> {
    let mut out: Vec<pb::Port> = ports
        .iter()
        .map(|(service_port, target_port)| pb::Port {
            service_port: u32::from(*service_port),
            target_port: u32::from(*target_port),
            app_protocol: match protocols.get(service_port) {
                None => pb::AppProtocol::Unknown,
                Some(AppProtocol::Http11) => pb::AppProtocol::Http11,
                Some(AppProtocol::Http2) => pb::AppProtocol::Http2,
                Some(AppProtocol::Grpc) => pb::AppProtocol::Grpc,
            } as i32,
        })
        .collect();
    out.sort_by_key(|p| p.service_port);
    out
}

fn ip_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

#[cfg(test)]
#[path = "xds_tests.rs"]
mod tests;
