//! Reaching ztunnels (and waypoints, which run ztunnel's admin server): the dump
//! from a file, an admin address, the pod a name or `--node` picks, or the control
//! plane's view over XDS; and plain HTTP to their admin port.

use std::io::Read as _;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use shared_types::constants::{GATEWAY_MANAGED_LABEL, WAYPOINT_CONTROLLER};

use crate::cli::{DumpSource, Global};
use crate::{kubeclient, xds};

/// Which pods a pod name or `--node` picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proxy {
    /// `app=ztunnel`, in `-n`, else `--istio-namespace`.
    Ztunnel,
    /// The waypoints istiod deploys (`gateway.istio.io/managed`), in `-n`, else the
    /// kubeconfig context's namespace.
    Waypoint,
}

impl Proxy {
    fn name(self) -> &'static str {
        match self {
            Proxy::Ztunnel => "ztunnel",
            Proxy::Waypoint => "waypoint",
        }
    }

    fn selector(self) -> String {
        match self {
            Proxy::Ztunnel => "app=ztunnel".into(),
            Proxy::Waypoint => format!("{GATEWAY_MANAGED_LABEL}={WAYPOINT_CONTROLLER}"),
        }
    }
}

/// A ztunnel's admin endpoint and what to call it in messages (`pod.namespace`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub name: String,
    pub addr: String,
}

/// The raw dump text `source` names, the pod being a `proxy`. `single` is Istio's
/// `enforceSinglePod`: without a pod or `--node`, more than one pod is an error.
pub async fn load(
    global: &Global,
    source: &DumpSource,
    single: bool,
    proxy: Proxy,
) -> Result<String> {
    check_one_source(source)?;
    if source.from_control_plane {
        if proxy == Proxy::Waypoint {
            bail!("--from-control-plane has no waypoint routes: read a waypoint's dump (pod, --ztunnel-admin or -f)");
        }
        return control_plane_dump(global, source).await;
    }
    if let Some(file) = &source.file {
        return read_file(file);
    }
    let targets = targets_of(global, source, proxy).await?;
    let target = match targets.as_slice() {
        [one] => one,
        [] => bail!("no pods found"),
        [first, ..] if !single => first,
        _ => bail!("{} pod name or --node must be set", proxy.name()),
    };
    http_get(&target.addr, "/config_dump")
        .await
        .with_context(|| format!("failed to execute command on {} Ztunnel", target.name))
}

/// Istio's argument check: at most one of a file, a node, a pod name (and our
/// admin address).
pub fn check_one_source(source: &DumpSource) -> Result<()> {
    let given = [
        source.file.is_some(),
        source.node.is_some(),
        source.pod.is_some(),
        source.ztunnel_admin.is_some(),
    ];
    if given.iter().filter(|g| **g).count() > 1 {
        bail!("at most one of --file, --node, --ztunnel-admin, or pod name must be passed");
    }
    Ok(())
}

/// The control plane's view, in `/config_dump`'s shape: every Address and
/// Authorization resource istiod-lite serves, decoded as ztunnel decodes them.
async fn control_plane_dump(global: &Global, source: &DumpSource) -> Result<String> {
    use mesh_model::xds::{address, authorization, Converted};
    use prost::Message;
    use shared_types::istio::security;
    use shared_types::istio::workload;
    use shared_types::istio::xds::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};

    let ns = &source.istio_namespace;
    let bodies = |response: shared_types::istio::xds::DeltaDiscoveryResponse| {
        response
            .resources
            .into_iter()
            .filter_map(|r| Some((r.name, r.resource?.value)))
            .collect::<Vec<_>>()
    };
    let (mut workloads, mut services, mut policies) = (Vec::new(), Vec::new(), Vec::new());
    let addresses = xds::fetch(global, &source.xds, ns, ADDRESS_TYPE_URL).await?;
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
    let found = xds::fetch(global, &source.xds, ns, AUTHORIZATION_TYPE_URL).await?;
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

fn read_file(path: &std::path::Path) -> Result<String> {
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        return Ok(text);
    }
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

/// The ztunnels `source` names: its admin address, the pod named, the one on
/// `--node`, or every ztunnel pod (`app=ztunnel`), sorted by name.
pub async fn targets(global: &Global, source: &DumpSource) -> Result<Vec<Target>> {
    targets_of(global, source, Proxy::Ztunnel).await
}

/// As [`targets`], for pods of `proxy`.
async fn targets_of(global: &Global, source: &DumpSource, proxy: Proxy) -> Result<Vec<Target>> {
    if let Some(addr) = &source.ztunnel_admin {
        return Ok(vec![Target {
            name: addr.clone(),
            addr: addr.clone(),
        }]);
    }
    let client = kubeclient::client(global)
        .await
        .context("no dump source: pass -f FILE or --ztunnel-admin ADDR, or a working kubeconfig")?;
    let mut namespace = source.namespace.clone().unwrap_or_else(|| match proxy {
        Proxy::Ztunnel => source.istio_namespace.clone(),
        Proxy::Waypoint => client.default_namespace().to_owned(),
    });
    let mut name = None;
    if let Some(pod) = &source.pod {
        let pod = pod.strip_prefix("pod/").unwrap_or(pod);
        match pod.split_once('.') {
            Some((n, ns)) => {
                name = Some(n.to_owned());
                namespace = ns.to_owned();
            }
            None => name = Some(pod.to_owned()),
        }
    }
    let pods: Api<Pod> = Api::namespaced(client, &namespace);
    let list = pods
        .list(&ListParams::default().labels(&proxy.selector()))
        .await
        .with_context(|| format!("cannot list {} pods", proxy.name()))?;
    let node_of = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.clone());
    let mut found: Vec<&Pod> = list
        .items
        .iter()
        .filter(|p| name.is_none() || p.metadata.name == name)
        .filter(|p| source.node.is_none() || node_of(p) == source.node)
        .collect();
    if let Some(name) = &name {
        if found.is_empty() {
            match proxy {
                Proxy::Ztunnel => {
                    bail!("workloads command is only supported by Ztunnel proxies: {name}")
                }
                Proxy::Waypoint => bail!(
                    "no waypoint pod {name} in namespace {namespace} (pods labelled {})",
                    proxy.selector()
                ),
            }
        }
    }
    found.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    found
        .into_iter()
        .map(|p| {
            let ip = p
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.clone())
                .with_context(|| format!("the {} pod has no IP yet", proxy.name()))?;
            let host = if ip.contains(':') {
                format!("[{ip}]")
            } else {
                ip
            };
            Ok(Target {
                name: format!(
                    "{}.{namespace}",
                    p.metadata.name.as_deref().unwrap_or_default()
                ),
                addr: format!("{host}:{}", source.proxy_admin_port),
            })
        })
        .collect()
}

/// `GET` returning the body of a 200 answer.
pub async fn http_get(addr: &str, path: &str) -> Result<String> {
    let (status, body) = request(addr, "GET", path).await?;
    if status != 200 {
        bail!("GET http://{addr}{path}: HTTP {status}");
    }
    Ok(body)
}

/// One HTTP/1.0 request (the admin API is plain HTTP and closes after the body):
/// the status and the body.
pub async fn request(addr: &str, method: &str, path: &str) -> Result<(u16, String)> {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("cannot connect to {addr}"))?;
        stream
            .write_all(
                format!("{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: 0\r\n\r\n")
                    .as_bytes(),
            )
            .await?;
        let mut buf = Vec::new();
        stream.read_to_end(&mut buf).await?;
        anyhow::Ok(buf)
    };
    let buf = tokio::time::timeout(Duration::from_secs(30), fetch)
        .await
        .with_context(|| format!("timed out reading http://{addr}{path}"))??;
    let text = String::from_utf8(buf).context("non-UTF-8 answer")?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("malformed HTTP answer")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("malformed HTTP status line")?;
    Ok((status, body.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

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
