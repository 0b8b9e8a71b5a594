//! The standalone topology ([`crate::standalone`]) with a waypoint: a third namespace
//! W, behind B (`10.10.1.0/24`, B forwarding between its two links), runs the
//! `waypoint` binary as workload `vms/waypoint` (service account `waypoint`). The
//! echo Service is bound to it, and gains an HTTP/1.1 port (8080 -> B's `e2e-app
//! http` on 9002), so A's traffic to the Service's VIP goes A's ztunnel -> waypoint ->
//! B's ztunnel. Everything is configured as for Istio's ztunnel: one local config the
//! three proxies read, the waypoint's policies and routes from a file of Kubernetes
//! objects (`WAYPOINT_CONFIG_PATH`). Two more Services, `echo-v1` and `echo-v2`
//! (HTTP port 8080, not bound), are backends for routes: [`WaypointMesh::start_versions`]
//! runs their servers in B.

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::mesh;
use crate::standalone::{local_config, Standalone, SERVICE_VIP};
use test_support::netns::{link, Netns};
use test_support::process::ChildGuard;

pub const WAYPOINT_IP: &str = "10.10.1.2";
/// B's address on the waypoint's link.
const B_WAYPOINT_LINK_IP: &str = "10.10.1.1";
pub const WAYPOINT_VIP: &str = "10.96.0.20";
pub const WAYPOINT_PRINCIPAL: &str = "spiffe://cluster.local/ns/vms/sa/waypoint";
/// The echo Service's HTTP/1.1 port, and B's HTTP server behind it.
pub const HTTP_PORT: u16 = 8080;
pub const HTTP_TARGET_PORT: u16 = 9002;
/// The echo Service's gRPC port (HTTP/2 without TLS), for a server a test runs in B.
pub const GRPC_PORT: u16 = 8081;
pub const GRPC_TARGET_PORT: u16 = 9003;
/// The route backends `echo-v1` and `echo-v2`: their VIPs, and B's servers behind
/// their port [`HTTP_PORT`].
pub const VERSIONS: [(&str, &str, u16); 2] =
    [("v1", "10.96.0.31", 9012), ("v2", "10.96.0.32", 9013)];

/// The standalone local config with the waypoint: its workload and Service, the echo
/// Service bound to it (`bind_service`) and/or the server workload (`bind_workload`).
pub fn waypoint_config(bind_service: bool, bind_workload: bool) -> String {
    let waypoint = "  waypoint:\n    destination: vms/waypoint.vms.svc.cluster.local\n    hboneMtlsPort: 15008\n";
    let mut config = local_config("")
        .replace(
            "      80: 9000\n",
            &format!(
                "      80: 9000\n      {HTTP_PORT}: {HTTP_TARGET_PORT}\n      {GRPC_PORT}: {GRPC_TARGET_PORT}\n"
            ),
        )
        .replace(
            "  ports:\n    80: 9000\n",
            &format!(
                "  ports:\n    80: 9000\n    {HTTP_PORT}: {HTTP_TARGET_PORT}\n    {GRPC_PORT}: {GRPC_TARGET_PORT}\n  appProtocols:\n    {HTTP_PORT}: HTTP11\n    {GRPC_PORT}: GRPC\n"
            ),
        );
    if bind_service {
        config = config.replace(
            "  hostname: echo.vms.svc.cluster.local\n",
            &format!("  hostname: echo.vms.svc.cluster.local\n{waypoint}"),
        );
    }
    if bind_workload {
        config = config.replace("  node: vm-b\n", &format!("  node: vm-b\n{waypoint}"));
    }
    let workload = format!(
        "- uid: Kubernetes//v1/Pod/vms/waypoint\n  name: waypoint\n  namespace: vms\n  serviceAccount: waypoint\n  workloadIps: [\"{WAYPOINT_IP}\"]\n  protocol: HBONE\n  node: vm-w\n  services:\n    \"vms/waypoint.vms.svc.cluster.local\":\n      15008: 15008\n"
    );
    let mut service = format!(
        "- name: waypoint\n  namespace: vms\n  hostname: waypoint.vms.svc.cluster.local\n  vips: [\"/{WAYPOINT_VIP}\"]\n  ports:\n    15008: 15008\n"
    );
    for (version, vip, target) in VERSIONS {
        service.push_str(&format!(
            "- name: echo-{version}\n  namespace: vms\n  hostname: echo-{version}.vms.svc.cluster.local\n  vips: [\"/{vip}\"]\n  ports:\n    {HTTP_PORT}: {target}\n  appProtocols:\n    {HTTP_PORT}: HTTP11\n"
        ));
        // B's workload is an endpoint of each, beside the echo Service.
        config = config.replace(
            "    \"vms/echo.vms.svc.cluster.local\":\n",
            &format!("    \"vms/echo-{version}.vms.svc.cluster.local\":\n      {HTTP_PORT}: {target}\n    \"vms/echo.vms.svc.cluster.local\":\n"),
        );
    }
    config
        .replacen("workloads:\n", &format!("workloads:\n{workload}"), 1)
        .replacen(
            "services:\n- name: echo",
            &format!("services:\n{service}- name: echo"),
            1,
        )
}

/// `e2e-app http` in `b` on [`HTTP_TARGET_PORT`], with `args` too.
fn start_http_server(b: &Netns, args: &[&str]) -> Result<ChildGuard> {
    start_named_server(b, "echo", HTTP_TARGET_PORT, args)
}

/// `e2e-app http --name <name>` in `b` on `port`.
fn start_named_server(b: &Netns, name: &str, port: u16, args: &[&str]) -> Result<ChildGuard> {
    let app = test_support::built_binary("e2e-app")?;
    let mut cmd = b.command(app.to_str().context("path")?);
    cmd.args([
        "http",
        "--name",
        name,
        "--listen",
        &format!("0.0.0.0:{port}"),
    ]);
    cmd.args(args);
    ChildGuard::spawn(&format!("http-{name}-{}", b.name()), cmd)
}

/// The waypoint of `mesh`, in `w`, with `env`.
fn start(w: &Netns, mesh: &Standalone, env: &[(String, String)]) -> Result<ChildGuard> {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let ca = mesh.dir.path().join("ca");
    mesh::start_waypoint(w, "vms/waypoint/waypoint", &ca, &mesh.config, &env)
}

pub struct WaypointMesh {
    // Fields drop in declaration order: the processes first, then the mesh.
    pub waypoint: ChildGuard,
    /// B's HTTP server behind the Service's HTTP port.
    http_server: ChildGuard,
    /// B's servers behind `echo-v1` and `echo-v2`, once started.
    version_servers: Vec<ChildGuard>,
    pub w: Netns,
    /// The waypoint's `WAYPOINT_CONFIG_PATH`.
    pub objects: PathBuf,
    /// The waypoint's extra environment, for restarts.
    env: Vec<(String, String)>,
    pub mesh: Standalone,
}

impl WaypointMesh {
    /// The topology, with `objects` (a YAML stream of AuthorizationPolicies and
    /// routes) for the waypoint; the echo Service is bound to it.
    pub fn new(tag: &str, objects: &str) -> Result<Self> {
        Self::with_env(tag, objects, &[])
    }

    /// [`WaypointMesh::new`], with more environment for the waypoint.
    pub fn with_env(tag: &str, objects: &str, env: &[(&str, &str)]) -> Result<Self> {
        let mesh = Standalone::new(tag)?;
        mesh.set_config(&waypoint_config(true, false))?;
        let w = Netns::new(&format!("{tag}w"))?;
        link(
            &mesh.b,
            &format!("{B_WAYPOINT_LINK_IP}/24"),
            &w,
            &format!("{WAYPOINT_IP}/24"),
        )?;
        mesh.b.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
        mesh.a.exec(&[
            "ip",
            "route",
            "add",
            "10.10.1.0/24",
            "via",
            crate::standalone::SERVER_IP,
        ])?;
        w.exec(&[
            "ip",
            "route",
            "add",
            "10.10.0.0/24",
            "via",
            B_WAYPOINT_LINK_IP,
        ])?;
        let http_server = start_http_server(&mesh.b, &[])?;
        let objects_path = mesh.dir.path().join("waypoint-objects.yaml");
        std::fs::write(&objects_path, objects)?;
        let mut env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.push((
            "WAYPOINT_CONFIG_PATH".into(),
            objects_path.to_str().context("path")?.into(),
        ));
        env.push(("GATEWAY_NAME".into(), "waypoint".into()));
        let waypoint = start(&w, &mesh, &env)?;
        Ok(WaypointMesh {
            waypoint,
            http_server,
            version_servers: Vec::new(),
            w,
            objects: objects_path,
            env,
            mesh,
        })
    }

    /// Replaces B's HTTP server with one started with `args` too (`e2e-app http`'s
    /// options, e.g. `--body-bytes`).
    pub fn restart_http_server(&mut self, args: &[&str]) -> Result<()> {
        self.http_server.kill();
        self.http_server = start_http_server(&self.mesh.b, args)?;
        Ok(())
    }

    /// Starts B's servers behind `echo-v1` and `echo-v2` (answers name `v1`, `v2`),
    /// with `args` too (`e2e-app http`'s options).
    pub fn start_versions(&mut self, args: &[&str]) -> Result<()> {
        for (version, _, port) in VERSIONS {
            let server = start_named_server(&self.mesh.b, version, port, args)?;
            self.version_servers.push(server);
        }
        Ok(())
    }

    /// Replaces the waypoint's objects (policies and routes) and returns once the
    /// waypoint has read the file (took it or refused it).
    pub fn set_objects(&self, yaml: &str) -> Result<()> {
        let before = mesh::config_loads(&self.w)?;
        mesh_runtime::fs::write_atomic(&self.objects, yaml.as_bytes(), 0o644)?;
        test_support::poll::wait_for(
            "the waypoint to read its new objects",
            std::time::Duration::from_secs(10),
            || (mesh::config_loads(&self.w).ok()? > before).then_some(()),
        )
    }

    /// A kept-alive HTTP/1.1 client in A (captured, so through A's ztunnel) to the
    /// echo Service's HTTP port, running `f`.
    pub fn with_client<R: Send>(
        &self,
        f: impl FnOnce(&mut test_support::http::KeepAlive) -> Result<R> + Send,
    ) -> Result<R> {
        self.mesh.a.run_inside(move || {
            let mut client = test_support::http::KeepAlive::connect(Self::http_vip())?;
            f(&mut client)
        })?
    }

    /// Kills the waypoint (as a crashed pod) and starts it again; returns once the
    /// new one is ready.
    pub fn restart_waypoint(&mut self) -> Result<()> {
        self.waypoint.kill();
        self.waypoint = start(&self.w, &self.mesh, &self.env)?;
        Ok(())
    }

    /// The echo Service's HTTP port, as A's apps address it.
    pub fn http_vip() -> std::net::SocketAddr {
        format!("{SERVICE_VIP}:{HTTP_PORT}")
            .parse()
            .expect("address")
    }

    /// One HTTP request from A (captured, so through A's ztunnel): `(status, body)`.
    pub fn request(&self, method: &str, path: &str, headers: &[&str]) -> Result<(u16, String)> {
        let (method, path) = (method.to_owned(), path.to_owned());
        let headers: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
        let answer = self.mesh.a.run_inside(move || {
            let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
            test_support::http::request(Self::http_vip(), &method, &path, &headers)
        })??;
        Ok(answer)
    }
}
