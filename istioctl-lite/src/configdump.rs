//! ztunnel's `/config_dump`: typed (leniently: unknown keys are kept, missing ones
//! default) and fetched from a file, an admin address, or the ztunnel pod on a node.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::cli::{Global, ZtunnelConfigArgs};
use crate::{kubeclient, xds};

/// ztunnel's admin port; it binds 127.0.0.1 unless ADMIN_ADDR says otherwise.
pub const ADMIN_PORT: u16 = 15000;

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Dump {
    pub workloads: Vec<Workload>,
    pub services: Vec<Service>,
    pub policies: Vec<Policy>,
    pub certificates: Vec<CertsDump>,
    /// The pods whose netns this ztunnel serves (our addition; shared mode only).
    pub pods: Vec<PodSummary>,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Workload {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub workload_ips: Vec<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub hostname: String,
    pub node: String,
    pub protocol: String,
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waypoint: Option<GatewayAddress>,
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub services: Map<String, Value>,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct GatewayAddress {
    pub destination: String,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Service {
    pub name: String,
    pub namespace: String,
    pub hostname: String,
    pub vips: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waypoint: Option<GatewayAddress>,
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub endpoints: Map<String, Value>,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Policy {
    pub name: String,
    pub namespace: String,
    pub scope: String,
    pub action: String,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CertsDump {
    pub identity: String,
    pub state: String,
    pub cert_chain: Vec<Cert>,
    pub root_certs: Vec<Cert>,
}

#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Cert {
    pub pem: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub serial_number: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub valid_from: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub expiration_time: String,
}

#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodSummary {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub service_account: String,
    pub identity: String,
    pub state: String,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

impl Dump {
    pub fn parse(text: &str) -> Result<Dump> {
        let value: Value = serde_json::from_str(text).context("the config dump is not JSON")?;
        if !value.is_object() {
            bail!("the config dump is not a JSON object");
        }
        serde_json::from_value(value).context("the config dump has an unexpected shape")
    }
}

/// From `-f`, `--ztunnel-admin`, or the ztunnel pod found through the API.
pub async fn load(global: &Global, args: &ZtunnelConfigArgs) -> Result<Dump> {
    let text = if args.from_control_plane {
        from_control_plane(global, args).await?
    } else if let Some(file) = &args.file {
        read_file(file)?
    } else if let Some(addr) = &args.ztunnel_admin {
        http_get(addr, "/config_dump").await?
    } else {
        let addr = locate_ztunnel(global, args).await?;
        http_get(&addr, "/config_dump").await.with_context(|| {
            format!(
                "cannot reach ztunnel's admin at {addr}; it binds 127.0.0.1 unless ADMIN_ADDR=0.0.0.0:{ADMIN_PORT}: \
                 use `kubectl port-forward -n {} <ztunnel pod> {ADMIN_PORT}` and --ztunnel-admin 127.0.0.1:{ADMIN_PORT}",
                args.istio_namespace
            )
        })?
    };
    Dump::parse(&text)
}

/// The control plane's view, in `/config_dump`'s shape: every Address and
/// Authorization resource istiod-lite serves, decoded as ztunnel decodes them.
async fn from_control_plane(global: &Global, args: &ZtunnelConfigArgs) -> Result<String> {
    use mesh_model::xds::{address, authorization, Converted};
    use prost::Message;
    use shared_types::istio::security;
    use shared_types::istio::workload;
    use shared_types::istio::xds::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};

    let ns = &args.istio_namespace;
    let bodies = |response: shared_types::istio::xds::DeltaDiscoveryResponse| {
        response
            .resources
            .into_iter()
            .filter_map(|r| Some((r.name, r.resource?.value)))
            .collect::<Vec<_>>()
    };
    let (mut workloads, mut services, mut policies) = (Vec::new(), Vec::new(), Vec::new());
    let addresses = xds::fetch(global, &args.xds, ns, ADDRESS_TYPE_URL).await?;
    for (name, value) in bodies(addresses) {
        let decoded = workload::Address::decode(value.as_slice())
            .map_err(|e| e.to_string())
            .and_then(|a| address(a).map_err(|e| e.to_string()))
            .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        match decoded {
            Converted::Workload(w) => workloads.push(serde_json::to_value(&w)?),
            Converted::Service(s) => services.push(serde_json::to_value(&s)?),
            Converted::Policy(_) => {}
        }
    }
    let found = xds::fetch(global, &args.xds, ns, AUTHORIZATION_TYPE_URL).await?;
    for (name, value) in bodies(found) {
        let policy = security::Authorization::decode(value.as_slice())
            .map_err(|e| e.to_string())
            .and_then(|p| authorization(p).map_err(|e| e.to_string()))
            .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        policies.push(serde_json::to_value(&policy)?);
    }
    let dump = serde_json::json!({
        "workloads": workloads,
        "services": services,
        "policies": policies,
    });
    Ok(dump.to_string())
}

fn read_file(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

/// `podIP:15000` of the `app=ztunnel` pod on `--node` (or the only one).
async fn locate_ztunnel(global: &Global, args: &ZtunnelConfigArgs) -> Result<String> {
    let client = kubeclient::client(global)
        .await
        .context("no dump source: pass -f FILE or --ztunnel-admin ADDR, or a working kubeconfig")?;
    let pods: Api<Pod> = Api::namespaced(client, &args.istio_namespace);
    let list = pods
        .list(&ListParams::default().labels("app=ztunnel"))
        .await
        .context("cannot list ztunnel pods")?;
    let node_of = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default()
    };
    let candidates: Vec<&Pod> = list
        .items
        .iter()
        .filter(|p| args.node.as_ref().is_none_or(|n| &node_of(p) == n))
        .collect();
    let pod = match candidates.as_slice() {
        [one] => *one,
        [] => bail!(
            "no ztunnel pod (label app=ztunnel) in {}{}",
            args.istio_namespace,
            args.node
                .as_ref()
                .map(|n| format!(" on node {n}"))
                .unwrap_or_default()
        ),
        many => bail!(
            "{} ztunnel pods; pick one with --node ({})",
            many.len(),
            many.iter()
                .map(|p| node_of(p))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .context("the ztunnel pod has no IP yet")?;
    Ok(if ip.contains(':') {
        format!("[{ip}]:{ADMIN_PORT}")
    } else {
        format!("{ip}:{ADMIN_PORT}")
    })
}

/// A minimal HTTP/1.0 GET (the admin API is plain HTTP and closes after the body).
pub async fn http_get(addr: &str, path: &str) -> Result<String> {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("cannot connect to {addr}"))?;
        stream
            .write_all(
                format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: application/json\r\n\r\n")
                    .as_bytes(),
            )
            .await?;
        let mut buf = Vec::new();
        stream.read_to_end(&mut buf).await?;
        anyhow::Ok(buf)
    };
    let buf = tokio::time::timeout(Duration::from_secs(10), fetch)
        .await
        .with_context(|| format!("timed out reading http://{addr}{path}"))??;
    let text = String::from_utf8(buf).context("non-UTF-8 answer")?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("malformed HTTP answer")?;
    let status = head.split_whitespace().nth(1).unwrap_or_default();
    if status != "200" {
        bail!("GET http://{addr}{path}: HTTP {status}");
    }
    Ok(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_is_lenient_but_rejects_non_objects() {
        let d = Dump::parse(r#"{"workloads":[{"name":"a","extra":1}],"version":{}}"#).unwrap();
        assert_eq!(d.workloads[0].name, "a");
        assert!(d.services.is_empty());
        assert!(Dump::parse("[]").is_err());
        assert!(Dump::parse("nope").is_err());
        assert!(Dump::parse(r#"{"workloads": 3}"#).is_err());
        // Fields the dump did not carry are not invented on output.
        let out = serde_json::to_value(&d.workloads[0]).unwrap();
        assert!(out.get("waypoint").is_none() && out.get("services").is_none());
        assert_eq!(out["extra"], 1);
    }

    #[tokio::test]
    async fn http_get_reads_the_body() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut req = [0u8; 1024];
            let _ = s.read(&mut req).await;
            s.write_all(b"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n{\"ok\":1}")
                .await
                .unwrap();
        });
        assert_eq!(http_get(&addr, "/config_dump").await.unwrap(), "{\"ok\":1}");
    }
}
