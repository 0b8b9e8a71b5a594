//! `proxy-status`: every ztunnel and waypoint connected to istiod-lite and how far each
//! xDS type is in sync, from istiod's `istio.io/debug/syncz` (envoy `ClientConfig`s),
//! as `istioctl proxy-status` shows it.

use anyhow::{Context, Result};
use prost::Message;
use serde::Serialize;
use shared_types::istio::xds::{
    string_field, ClientConfig, ConfigStatus, Struct, ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL,
    ROUTER_NODE, SYNCZ_TYPE_URL,
};
use shared_types::waypoint::{WAYPOINT_POLICY_TYPE_URL, WAYPOINT_ROUTE_TYPE_URL};

use crate::cli::{Global, Output, ProxyStatusArgs};
use crate::output::{print_structured, Table};
use crate::xds;

/// One type on one proxy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TypeSync {
    pub state: &'static str,
    pub version: String,
    pub nonce_sent: String,
    pub nonce_acked: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub nack: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProxySync {
    pub name: String,
    /// `ztunnel`, or `waypoint` for a node id of type `router`.
    pub proxy_type: &'static str,
    pub identity: String,
    pub address: TypeSync,
    pub authorization: TypeSync,
    /// Only waypoints subscribe to their policies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waypoint_policy: Option<TypeSync>,
    /// Only waypoints subscribe to their routes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waypoint_route: Option<TypeSync>,
}

pub async fn run(global: &Global, args: &ProxyStatusArgs) -> Result<()> {
    let responses =
        xds::fetch_from_every_replica(global, &args.xds, &args.istio_namespace, SYNCZ_TYPE_URL)
            .await?;
    let mut proxies = responses
        .iter()
        .flat_map(|r| &r.resources)
        .map(|r| {
            let body = r
                .resource
                .as_ref()
                .context("a syncz resource without a body")?;
            let config = ClientConfig::decode(body.value.as_slice())
                .with_context(|| format!("istiod's status of {} is not a ClientConfig", r.name))?;
            Ok(proxy_sync(&config))
        })
        .collect::<Result<Vec<_>>>()?;
    proxies.sort_by(|a, b| a.name.cmp(&b.name));
    match global.output {
        Output::Table => print!("{}", table(&proxies)),
        format => print_structured(format, &proxies)?,
    }
    Ok(())
}

fn proxy_sync(config: &ClientConfig) -> ProxySync {
    let node = config.node.clone().unwrap_or_default();
    let identity = node
        .metadata
        .as_ref()
        .and_then(|md| string_field(md, "identity"))
        .unwrap_or_default()
        .to_owned();
    let of = |type_url: &str| {
        let Some(t) = config
            .generic_xds_configs
            .iter()
            .find(|t| t.type_url == type_url)
        else {
            return TypeSync {
                state: "NOT SENT",
                version: String::new(),
                nonce_sent: String::new(),
                nonce_acked: String::new(),
                nack: String::new(),
            };
        };
        let details = t
            .xds_config
            .as_ref()
            .and_then(|any| Struct::decode(any.value.as_slice()).ok())
            .unwrap_or_default();
        let field = |k: &str| string_field(&details, k).unwrap_or_default().to_owned();
        TypeSync {
            state: match ConfigStatus::try_from(t.config_status) {
                Ok(ConfigStatus::Synced) => "SYNCED",
                Ok(ConfigStatus::Stale) => "STALE",
                Ok(ConfigStatus::Error) => "NACK",
                Ok(ConfigStatus::NotSent) => "NOT SENT",
                _ => "UNKNOWN",
            },
            version: t.version_info.clone(),
            nonce_sent: field("nonce_sent"),
            nonce_acked: field("nonce_acked"),
            nack: field("nack"),
        }
    };
    let waypoint = node.id.split('~').next() == Some(ROUTER_NODE);
    ProxySync {
        proxy_type: if waypoint { "waypoint" } else { "ztunnel" },
        identity,
        address: of(ADDRESS_TYPE_URL),
        authorization: of(AUTHORIZATION_TYPE_URL),
        waypoint_policy: waypoint.then(|| of(WAYPOINT_POLICY_TYPE_URL)),
        waypoint_route: waypoint.then(|| of(WAYPOINT_ROUTE_TYPE_URL)),
        name: node.id,
    }
}

fn table(proxies: &[ProxySync]) -> String {
    let mut t = Table::new(
        3,
        &[
            "NAME",
            "TYPE",
            "IDENTITY",
            "ADDRESS",
            "AUTHORIZATION",
            "WAYPOINT POLICY",
            "WAYPOINT ROUTE",
            "VERSION",
            "NONCE (SENT/ACKED)",
        ],
    );
    for p in proxies {
        let nonces = |s: &TypeSync| format!("{}/{}", s.nonce_sent, s.nonce_acked);
        t.row(vec![
            p.name.clone(),
            p.proxy_type.to_owned(),
            p.identity.clone(),
            p.address.state.to_owned(),
            p.authorization.state.to_owned(),
            p.waypoint_policy
                .as_ref()
                .map_or("-", |s| s.state)
                .to_owned(),
            p.waypoint_route
                .as_ref()
                .map_or("-", |s| s.state)
                .to_owned(),
            p.address.version.clone(),
            format!("{} {}", nonces(&p.address), nonces(&p.authorization)),
        ]);
    }
    t.render()
}
