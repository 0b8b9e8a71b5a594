//! `make demo`: a two-node ambient cluster in network namespaces, explained as it runs.
//! `demo --up` leaves it running until Ctrl-C; `demo --dual-stack` gives pods and
//! Services IPv6 addresses beside IPv4 ones; `demo --standalone` is the two-VM mesh
//! without Kubernetes.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use local_cluster::mesh::{metric_sum, ztunnel_metrics};
use local_cluster::{LocalCluster, MeshInstall, Topology};
use test_support::poll::wait_for;

#[derive(Parser, Debug)]
#[command(about = "The local ambient mesh demo (needs root)")]
struct Args {
    /// Bring the cluster up, show how to use it, and keep it until Ctrl-C.
    #[arg(long)]
    up: bool,
    /// A dual-stack cluster: pods, nodes and Services get IPv6 addresses too.
    #[arg(long)]
    dual_stack: bool,
    /// The standalone demo: two VMs with dedicated ztunnels, no Kubernetes.
    #[arg(long, conflicts_with_all = ["up", "dual_stack"])]
    standalone: bool,
}

const NS: &str = "demo";
const WAIT: Duration = Duration::from_secs(30);

fn main() -> Result<()> {
    let args = Args::parse();
    if !test_support::can_run_root_tests() {
        bail!("the demo builds network namespaces: run it as root (sudo make demo)");
    }
    if args.standalone {
        return standalone_demo();
    }
    step("Building a 2-node Kubernetes cluster in network namespaces");
    // The mesh comes from the charts, installed as a user installs it.
    let cluster = LocalCluster::with_topology(
        "demo",
        Topology {
            dual_stack: args.dual_stack,
            install: MeshInstall::Charts(Vec::new()),
            ..Topology::default()
        },
    )?;
    println!(
        "   control plane: kube-apiserver-lite on {} in namespace {}",
        local_cluster::cluster::API_ADDR,
        cluster.control_plane.ns.name()
    );
    println!(
        "   cluster DNS on {} and a service proxy (kube-proxy's iptables rules) on every node",
        local_cluster::services::cluster_dns::CLUSTER_DNS
    );
    println!("   $ istioctl-lite install     (the istiod-lite, cni and ztunnel charts, rendered by helm, applied)");
    println!(
        "   charts from {}; the mesh's pods run {}",
        local_cluster::charts::charts_dir().display(),
        local_cluster::images::mesh_image()?
    );
    println!("   mesh CA: istiod-lite, Deployment istiod behind Service istiod.istio-system.svc:15012, the only holder of the CA key");
    for node in &cluster.nodes {
        println!(
            "   {}: namespace {}, pods {} on bridge cni0 (made by the CNI bridge plugin), running pods of DaemonSets istio-cni-node (cni-agent, host network) and ztunnel (its own pod network)",
            node.name,
            node.ns.name(),
            node.pod_cidrs().join(" and ")
        );
    }
    let mut confs: Vec<String> = std::fs::read_dir(cluster.node(1).conf_dir())?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    confs.sort();
    println!(
        "   the node agents put istio-cni after the bridge plugin in a chain of their own: /etc/cni/net.d holds {} (the runtime uses the first)",
        confs.join(", ")
    );
    let holders = cluster.node_files_with_ca_key()?;
    if !holders.is_empty() {
        bail!("the CA key is on a node: {holders:?}");
    }
    println!("   no file on any node outside istiod-lite's pods holds the CA key: each ztunnel has only a");
    println!("   projected token (audience istio-ca, bound to its pod) and the root certificate,");
    println!("   and asks istiod-lite for its pods' certificates (ImpersonatedIdentity).");
    step("The ztunnels learn the mesh from istiod-lite over xDS (none reads the API server)");
    let xds = cluster.proxy_status_args();
    let xds: Vec<&str> = xds.iter().map(String::as_str).collect();
    let status = wait_for("both ztunnels SYNCED", Duration::from_secs(30), || {
        let table = cluster.istioctl(&xds).ok()?;
        (table.matches("SYNCED").count() == 4).then_some(table)
    })?;
    println!("   $ istioctl-lite {}", xds.join(" "));
    println!("{}", indent(&status));
    if args.up {
        keep_up(&cluster)?;
        cluster.shutdown()?;
        return no_leftovers();
    }
    cluster_demo(&cluster)?;
    if args.dual_stack {
        ipv6_demo(&cluster)?;
    }
    step("Tearing everything down");
    cluster.shutdown()?;
    no_leftovers()?;
    println!("   done: no namespace, link, rule or process is left behind.");
    Ok(())
}

/// Fails (naming the pids) if any process this run started is still alive: each
/// carries the run's owner marker in its environment.
fn no_leftovers() -> Result<()> {
    let marker = test_support::owner::owner_marker();
    test_support::owner::check_no_leftovers(&marker, Duration::from_secs(3))?;
    println!(
        "   no process marked {}={marker} is left.",
        test_support::owner::OWNER_ENV
    );
    Ok(())
}

fn cluster_demo(c: &LocalCluster) -> Result<()> {
    let app = test_support::built_binary("e2e-app")?;
    let app = app.to_str().context("path")?;

    step(
        "Namespace `demo`: a server pod on node-2 and a client pod on node-1, NOT in the mesh yet",
    );
    c.kubectl(&["create", "namespace", NS])?;
    c.kubectl_apply(&server_manifest())?;
    let server = c.wait_pod_running(NS, "server", WAIT)?;
    // The client opens a new connection every second and prints the server's answer.
    let loop_script = format!(
        "while true; do {app} send --connect {}:9000 --bytes 1000; sleep 1; done",
        server.ip
    );
    c.kubectl_apply(&client_manifest("client", "client", &loop_script))?;
    let client = c.wait_pod_running(NS, "client", WAIT)?;
    println!(
        "{}",
        indent(&c.kubectl(&["get", "pods", "-n", NS, "-o", "wide"])?)
    );
    println!(
        "   the client sends 1000 bytes to the server's sink ({}:9000) every second.",
        server.ip
    );
    let before = pod_facts(c, "client")?;

    step(
        "Enrolling the running pods: kubectl label namespace demo istio.io/dataplane-mode=ambient",
    );
    println!(
        "{}",
        indent(&c.kubectl(&["label", "namespace", NS, "istio.io/dataplane-mode=ambient"])?)
    );
    for pod in ["server", "client"] {
        c.wait_redirection(NS, pod, Some("enabled"), WAIT).context(
            "the node agent did not enroll the pod (no ambient.istio.io/redirection=enabled annotation)",
        )?;
    }
    println!(
        "{}",
        indent(&c.kubectl(&["get", "pods", "-n", NS, "-o", COLUMNS])?)
    );
    println!("   the node agent set up redirection inside each pod's network namespace and handed");
    println!("   the pod to its node's ztunnel, then wrote the annotation.");
    let after = pod_facts(c, "client")?;
    println!("   client before: {before}\n   client after:  {after}");
    if before != after {
        bail!("the client pod changed while it was enrolled");
    }
    println!("   -> same pod UID, same process, zero restarts: enrolled without a restart.");

    step("What the server's ztunnel (node-2) reports (Prometheus metrics, Istio's names)");
    let (src, dst) = (
        "spiffe://cluster.local/ns/demo/sa/client",
        "spiffe://cluster.local/ns/demo/sa/server",
    );
    let labels = [
        ("reporter", "destination"),
        ("connection_security_policy", "mutual_tls"),
        ("source_principal", src),
        ("destination_principal", dst),
    ];
    let bytes = wait_for("mutual-TLS traffic from the client", WAIT, || {
        let m = c.ztunnel_metrics(2).ok()?;
        let b = metric_sum(&m, "istio_tcp_received_bytes_total", &labels);
        (b > 0.0).then_some(b)
    })?;
    println!("   source identity:      {src}");
    println!("   destination identity: {dst}");
    println!("   bytes received over mutual TLS so far: {bytes}");
    let issued = metric_sum(
        &c.istiod_metrics().unwrap_or_default(),
        "citadel_server_success_cert_issuance_count_total",
        &[],
    );
    println!("   certificates istiod-lite issued to the ztunnels so far: {issued}");
    let source_labels = [
        ("reporter", "source"),
        ("source_principal", src),
        ("destination_principal", dst),
    ];
    let source = c.ztunnel_metrics(1).unwrap_or_default();
    let request = metric_sum(&source, "istio_tcp_received_bytes_total", &source_labels);
    let response = metric_sum(&source, "istio_tcp_sent_bytes_total", &source_labels);
    println!("   the client's ztunnel (node-1, reporter=source): {request} request bytes, {response} response bytes.");
    println!("   -> the client's plain TCP now crosses an HBONE tunnel (HTTP/2 CONNECT over mTLS,");
    println!("      port 15008) between the two nodes' ztunnels; the app did not change.");

    step("What the server application sees");
    let answer = wait_for("a fresh answer in the client's log", WAIT, || {
        let log = c.pod_log(NS, "client")?;
        log.lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .map(str::to_owned)
    })?;
    println!("   the client's log (the sink's answer): {answer}");
    println!(
        "   -> the server sees the client's own pod IP ({}), not a proxy's.",
        client.ip
    );

    step("DNS: the client resolves the server by its Service name (ztunnel's DNS proxy)");
    let vips = server_vips(c)?;
    let vip = vips.join(", ");
    let resolved = c.exec_in_pod(NS, "client", &["getent", "hosts", "server"])?;
    println!(
        "   $ getent hosts server        (in the client pod)\n{}",
        indent(resolved.trim())
    );
    if !resolved
        .split_whitespace()
        .any(|word| vips.iter().any(|v| v == word))
    {
        bail!("`server` resolved to {resolved:?}, not the Service's ClusterIP ({vip})");
    }
    let answer = c.send(NS, "client", "server:9000", 1000)?;
    println!("   $ e2e-app send --connect server:9000 --bytes 1000\n      {answer}");
    let queries = metric_sum(
        &c.ztunnel_metrics(1).unwrap_or_default(),
        "istio_dns_requests_total",
        &[],
    );
    println!(
        "   -> the pod's resolver asked 10.96.0.10 (kubelet's clusterDNS, the cluster's DNS);"
    );
    println!("      the node agent's DNS capture sent the query to ztunnel inside the pod instead, which");
    println!("      answered with the Service's ClusterIP ({vip}); node-1's ztunnel has answered {queries} queries.");

    step("An AuthorizationPolicy denying a second client (identity demo/intruder)");
    c.kubectl_apply(&client_manifest("intruder", "intruder", "sleep 3600"))?;
    c.wait_pod_running(NS, "intruder", WAIT)?;
    c.wait_redirection(NS, "intruder", Some("enabled"), WAIT)?;
    let target = format!("{}:9000", server.ip);
    wait_for(
        "the intruder to reach the server before the policy",
        WAIT,
        || c.send(NS, "intruder", &target, 100).ok(),
    )?;
    println!("   before the policy the intruder's connection succeeds.");
    println!("{}", indent(&c.kubectl_apply(DENY_POLICY)?));
    wait_for("the policy to take effect", WAIT, || {
        c.send(NS, "intruder", &target, 100).err()
    })?;
    println!("   the intruder's new connection now fails (ztunnel on node-2 answers 401):");
    let m = c.ztunnel_metrics(2)?;
    println!(
        "   denials counted by node-2's ztunnel: {}",
        metric_sum(&m, "ztunnel_errors_total", &[("reason", "policy_denied")])
    );
    let answer = c.send(NS, "client", &target, 2048)?;
    println!(
        "   the first client still works: the server received {} bytes from {}",
        answer["bytes"], answer["peer"]
    );
    waypoint_demo(c, app)
}

/// L7: a waypoint for the namespace, an HTTP policy on it, its request metrics.
fn waypoint_demo(c: &LocalCluster, app: &str) -> Result<()> {
    step("L7: an HTTP Service `web`, then a waypoint for the namespace (Istio's commands)");
    c.kubectl_apply(WEB_MANIFEST)?;
    c.wait_pod_running(NS, "web", WAIT)?;
    c.wait_redirection(NS, "web", Some("enabled"), WAIT)?;
    let get = |path: &str| -> (String, String) {
        let url = format!("http://web:80{path}");
        match c.exec_in_pod(NS, "client", &[app, "get", &url]) {
            Ok(body) => ("200 OK".to_owned(), body),
            Err(e) => {
                let text = e.to_string();
                let status = text
                    .split("answered ")
                    .nth(1)
                    .and_then(|s| s.lines().next())
                    .unwrap_or("no answer")
                    .to_owned();
                (status, text)
            }
        }
    };
    wait_for("web to answer", WAIT, || {
        (get("/hello").0 == "200 OK").then_some(())
    })?;
    let apply = [
        "waypoint",
        "apply",
        "-n",
        NS,
        "--enroll-namespace",
        "--wait",
    ];
    println!("   $ istioctl-lite {}", apply.join(" "));
    println!("{}", indent(c.istioctl(&apply)?.trim()));
    println!("{}", indent(&c.kubectl(&["get", "gateway", "-n", NS])?));
    let made = [
        "get",
        "deployment,service",
        "-n",
        NS,
        "-l",
        "gateway.networking.k8s.io/gateway-name=waypoint",
    ];
    println!("{}", indent(&c.kubectl(&made)?));
    println!("   istiod-lite made the waypoint's Deployment and Service for the Gateway, and the");
    println!(
        "   namespace's label binds its Services to it: the ztunnels now send traffic for `web`"
    );
    println!(
        "   to the waypoint over HBONE, which forwards each request over HBONE to web's ztunnel."
    );
    println!("{}", indent(&c.kubectl_apply(WAYPOINT_POLICY)?));
    let (status, _) = wait_for("the waypoint to deny /admin", WAIT, || {
        let answer = get("/admin/users");
        answer.0.contains("403").then_some(answer)
    })?;
    println!("   $ e2e-app get http://web/admin/users   (in the client pod)\n      {status}: RBAC: access denied");
    let (status, body) = get("/hello");
    println!(
        "   $ e2e-app get http://web/hello\n      {status}: {}",
        body.trim()
    );
    let waypoint_pod = c
        .pod_names_in(NS)
        .into_iter()
        .find(|n| n.starts_with("waypoint"))
        .context("no waypoint pod")?;
    let ip = c.get_pod(NS, &waypoint_pod)?["status"]["podIP"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let metrics = c.exec_in_pod(
        NS,
        "client",
        &[app, "get", &format!("http://{ip}:15020/metrics")],
    )?;
    println!("   the waypoint's request metrics (Istio's names, reporter=waypoint):");
    for code in ["200", "403"] {
        let n = metric_sum(
            &metrics,
            "istio_requests_total",
            &[
                ("reporter", "waypoint"),
                ("response_code", code),
                ("destination_service", "web.demo.svc.cluster.local"),
            ],
        );
        println!("      istio_requests_total{{response_code=\"{code}\", destination_service=\"web.demo.svc.cluster.local\"}} {n}");
    }
    println!(
        "   -> each HTTP request authorized at the waypoint (its resident memory: {} MiB).",
        rss_mib(c, &waypoint_pod).unwrap_or(0)
    );
    route_demo(c, app, &ip)
}

/// L7 routing at the waypoint: two versions of `web`, and a Gateway API HTTPRoute
/// bound to the `web` Service (GAMMA): a header-matched rule, then a 90/10 split.
fn route_demo(c: &LocalCluster, app: &str, waypoint_ip: &str) -> Result<()> {
    step("L7 routing: an HTTPRoute on `web`: `x-canary: yes` to v2, the rest 90/10 to v1/v2");
    c.kubectl_apply(WEB_VERSIONS_MANIFEST)?;
    for pod in ["web-v1", "web-v2"] {
        c.wait_pod_running(NS, pod, WAIT)?;
        c.wait_redirection(NS, pod, Some("enabled"), WAIT)?;
    }
    println!("{}", indent(&c.kubectl_apply(WEB_ROUTE)?));
    let reasons = [
        "get",
        "httproute",
        "-n",
        NS,
        "web",
        "-o",
        "jsonpath={range .status.parents[*].conditions[*]}{.type}={.status} ({.reason}){\"\\n\"}{end}",
    ];
    let status = wait_for("istiod-lite to accept the route", WAIT, || {
        let out = c.kubectl(&reasons).ok()?;
        (out.contains("Accepted=True") && out.contains("ResolvedRefs=True")).then_some(out)
    })?;
    println!("   the route's status, written by istiod-lite (as Istio writes it):");
    println!("{}", indent(status.trim()));
    let url = "http://web:80/hello";
    let canary = wait_for("the waypoint to apply the route", WAIT, || {
        let body = c
            .exec_in_pod(
                NS,
                "client",
                &[app, "get", "--header", "x-canary: yes", url],
            )
            .ok()?;
        body.contains("\"server\":\"v2\"").then_some(body)
    })?;
    println!(
        "   $ e2e-app get --header 'x-canary: yes' {url}\n      {}",
        canary.trim()
    );
    let answers = c.exec_in_pod(NS, "client", &[app, "get", "--count", "200", url])?;
    let served = |v: &str| answers.matches(&format!("\"server\":\"{v}\"")).count();
    println!(
        "   $ e2e-app get --count 200 {url}\n      v1 answered {}, v2 answered {} (weights 90/10)",
        served("v1"),
        served("v2")
    );
    let metrics = c.exec_in_pod(
        NS,
        "client",
        &[app, "get", &format!("http://{waypoint_ip}:15020/metrics")],
    )?;
    println!(
        "   the waypoint's request metrics, by route rule (namespace.route.index) and backend:"
    );
    for (rule, service) in [
        ("demo.web.0", "web-v2"),
        ("demo.web.1", "web-v1"),
        ("demo.web.1", "web-v2"),
    ] {
        let host = format!("{service}.demo.svc.cluster.local");
        let n = metric_sum(
            &metrics,
            "istio_requests_total",
            &[
                ("reporter", "waypoint"),
                ("route_name", rule),
                ("destination_service", &host),
            ],
        );
        println!("      istio_requests_total{{route_name=\"{rule}\", destination_service=\"{host}\"}} {n}");
    }
    Ok(())
}

/// The resident memory of a pod's first process, MiB.
fn rss_mib(c: &LocalCluster, pod: &str) -> Option<u64> {
    let pid = *c.pod(NS, pod)?.pids.first()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib / 1024)
}

/// An HTTP server pod and its Service: the port's name (`http`) tells the waypoint
/// to read HTTP, as Istio decides.
const WEB_MANIFEST: &str = "apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: demo
  labels: {app: web}
spec:
  nodeName: node-2
  serviceAccountName: web
  containers:
  - name: http
    image: e2e-app:local
    command: [e2e-app, http, --listen, \"0.0.0.0:8080\"]
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: demo
spec:
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: 8080}
";

/// Two versions of `web`, each its own Service (what a route's backends name).
const WEB_VERSIONS_MANIFEST: &str = "apiVersion: v1
kind: Pod
metadata: {name: web-v1, namespace: demo, labels: {app: web-v1}}
spec:
  nodeName: node-2
  serviceAccountName: web
  containers:
  - {name: http, image: \"e2e-app:local\", command: [e2e-app, http, --name, v1, --listen, \"0.0.0.0:8080\"]}
---
apiVersion: v1
kind: Pod
metadata: {name: web-v2, namespace: demo, labels: {app: web-v2}}
spec:
  nodeName: node-1
  serviceAccountName: web
  containers:
  - {name: http, image: \"e2e-app:local\", command: [e2e-app, http, --name, v2, --listen, \"0.0.0.0:8080\"]}
---
apiVersion: v1
kind: Service
metadata: {name: web-v1, namespace: demo}
spec:
  selector: {app: web-v1}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: web-v2, namespace: demo}
spec:
  selector: {app: web-v2}
  ports: [{name: http, port: 80, targetPort: 8080}]
";

/// The Gateway API route on `web` (GAMMA: its parent is the Service).
const WEB_ROUTE: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web, namespace: demo}
spec:
  parentRefs: [{group: \"\", kind: Service, name: web, port: 80}]
  rules:
  - matches: [{headers: [{name: x-canary, value: \"yes\"}]}]
    backendRefs: [{name: web-v2, port: 80}]
  - backendRefs: [{name: web-v1, port: 80, weight: 90}, {name: web-v2, port: 80, weight: 10}]
";

/// Istio's L7 policy for a waypoint: attached to its Gateway by `targetRefs`.
const WAYPOINT_POLICY: &str = "apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: no-admin
  namespace: demo
spec:
  targetRefs:
  - {group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}
  action: DENY
  rules:
  - to: [{operation: {paths: [\"/admin*\"]}}]
";

/// The `server` Service's ClusterIPs (one per family on a dual-stack cluster).
fn server_vips(c: &LocalCluster) -> Result<Vec<String>> {
    let jsonpath = "jsonpath={.spec.clusterIPs[*]}";
    let out = c.kubectl(&["get", "service", "-n", NS, "server", "-o", jsonpath])?;
    Ok(out.split_whitespace().map(str::to_owned).collect())
}

/// The dual-stack part: the same pods over their IPv6 addresses.
fn ipv6_demo(c: &LocalCluster) -> Result<()> {
    step("IPv6: the same pods over their IPv6 addresses (dual-stack cluster)");
    println!(
        "{}",
        indent(&c.kubectl(&[
            "get",
            "pods",
            "-n",
            NS,
            "-o",
            "custom-columns=NAME:.metadata.name,IPS:.status.podIPs[*].ip",
        ])?)
    );
    let ip6 = |pod| -> Result<String> {
        let handle = c.pod(NS, pod).context("no such pod")?;
        handle
            .ips
            .get(1)
            .cloned()
            .context("the pod has no IPv6 address")
    };
    let (server, client) = (ip6("server")?, ip6("client")?);
    let answer = c.send(NS, "client", &format!("[{server}]:9000"), 4096)?;
    println!("   $ e2e-app send --connect [{server}]:9000 --bytes 4096\n      {answer}");
    if !answer["peer"]
        .as_str()
        .unwrap_or_default()
        .starts_with(&format!("[{client}]:"))
    {
        bail!("the server did not see the client's IPv6 address: {answer}");
    }
    println!(
        "   -> captured by the pod's ip6tables rules, carried over HBONE to [{server}]:15008,"
    );
    println!("      and the server sees the client's own IPv6 address.");
    let vips = server_vips(c)?.join(", ");
    let resolved = c.exec_in_pod(NS, "client", &["getent", "ahostsv6", "server"])?;
    println!("   the Service's ClusterIPs (ipFamilyPolicy PreferDualStack): {vips}");
    println!(
        "   $ getent ahostsv6 server     (AAAA from ztunnel's DNS proxy)\n{}",
        indent(resolved.lines().next().unwrap_or_default())
    );
    Ok(())
}

const COLUMNS: &str = "custom-columns=NAME:.metadata.name,NODE:.spec.nodeName,IP:.status.podIP,\
REDIRECTION:.metadata.annotations.ambient\\.istio\\.io/redirection,RESTARTS:.status.containerStatuses[0].restartCount";

const DENY_POLICY: &str = "apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: deny-intruder
  namespace: demo
spec:
  selector:
    matchLabels:
      app: server
  action: DENY
  rules:
  - from:
    - source:
        principals: [\"cluster.local/ns/demo/sa/intruder\"]
";

fn server_manifest() -> String {
    "apiVersion: v1
kind: Pod
metadata:
  name: server
  namespace: demo
  labels: {app: server}
spec:
  nodeName: node-2
  serviceAccountName: server
  containers:
  - name: sink
    image: e2e-app:local
    command: [e2e-app, sink, --listen, \"[::]:9000\"]
  - name: echo
    image: e2e-app:local
    command: [e2e-app, echo, --listen, \"[::]:9001\"]
---
apiVersion: v1
kind: Service
metadata:
  name: server
  namespace: demo
spec:
  ipFamilyPolicy: PreferDualStack
  selector: {app: server}
  ports:
  - {name: tcp-sink, port: 9000}
"
    .to_owned()
}

fn client_manifest(name: &str, sa: &str, script: &str) -> String {
    let script = serde_json::to_string(script).unwrap_or_default();
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: demo
  labels: {{app: {name}}}
spec:
  nodeName: node-1
  serviceAccountName: {sa}
  containers:
  - name: app
    image: e2e-app:local
    command: [sh, -c, {script}]
"
    )
}

/// UID, container pid and restart count of a pod, as one line.
fn pod_facts(c: &LocalCluster, name: &str) -> Result<String> {
    let pod = c.get_pod(NS, name)?;
    let pids = c.pod(NS, name).map(|h| h.pids).unwrap_or_default();
    Ok(format!(
        "uid {} pid {:?} restarts {}",
        pod["metadata"]["uid"].as_str().unwrap_or("?"),
        pids,
        pod["status"]["containerStatuses"][0]["restartCount"]
    ))
}

/// `--up`: how to use the cluster, then wait for Ctrl-C (or SIGTERM).
fn keep_up(c: &LocalCluster) -> Result<()> {
    step("The cluster is up. Paste these in another root shell:");
    for command in c.try_it_commands()? {
        println!("   {command}");
    }
    println!("   (k run is not available, there is no registry: pods use image e2e-app:local)");
    println!(
        "   (the API server listens only inside the cluster's namespaces, hence `ip netns exec`)"
    );
    println!("\n   Press Ctrl-C to tear everything down.");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r,
            _ = term.recv() => Ok(()),
        }
    })?;
    step("Tearing everything down");
    Ok(())
}

fn indent(text: &str) -> String {
    text.trim_end()
        .lines()
        .map(|l| format!("   {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn step(text: &str) {
    println!("\n== {text}");
}

/// The standalone mesh: two "VMs" with dedicated ztunnels, no Kubernetes.
fn standalone_demo() -> Result<()> {
    use local_cluster::standalone::*;
    step("Building two isolated hosts: client-vm (10.10.0.1) and server-vm (10.10.0.2)");
    let mesh = Standalone::new("demo")?;
    println!("   each runs a dedicated ztunnel: PROXY_MODE=dedicated, PROXY_WORKLOAD_INFO=vms/<name>/<sa>,");
    println!("   CA_CERTS_DIR (a fresh root from `ztunnel ca init`), LOCAL_XDS_PATH (Istio's local config format).");
    println!(
        "   client-vm's outbound TCP is redirected to its ztunnel by `ztunnel capture apply`."
    );

    step("The client sends 10 MiB to the server's port 9000, as a plain TCP app would");
    let answer = mesh.send(&format!("{SERVER_IP}:{SINK_PORT}"), 10 * 1024 * 1024)?;
    println!(
        "   the server received {} bytes, SHA-256 {}…",
        answer["bytes"],
        &answer["sha256"].as_str().unwrap_or("")[..16]
    );

    step("What the server's ztunnel saw (its Prometheus metrics, Istio's names)");
    let dest = ztunnel_metrics(&mesh.b)?;
    let labels = [
        ("reporter", "destination"),
        ("connection_security_policy", "mutual_tls"),
    ];
    println!(
        "   istio_tcp_received_bytes_total over mutual TLS: {}",
        metric_sum(&dest, "istio_tcp_received_bytes_total", &labels)
    );
    for line in dest
        .lines()
        .filter(|l| l.starts_with("istio_tcp_connections_opened_total"))
    {
        println!("   {line}");
    }
    println!("   -> the bytes crossed an HBONE tunnel (HTTP/2 CONNECT over mTLS on port 15008),");
    println!("      from {CLIENT_PRINCIPAL} to {SERVER_PRINCIPAL}.");

    step("Through the service VIP 10.96.0.10:80 (mapped to the endpoint's port 9000)");
    let answer = mesh.send(&format!("{SERVICE_VIP}:80"), 4096)?;
    println!(
        "   the server received {} bytes via echo.vms.svc.cluster.local",
        answer["bytes"]
    );

    step("An AuthorizationPolicy denies the client's identity (edit of the local config file)");
    mesh.set_policies(
        "- name: deny-client\n  namespace: vms\n  scope: Namespace\n  action: Deny\n  rules:\n  - - - principals:\n        - !Exact cluster.local/ns/vms/sa/client",
    )?;
    wait_for("the policy to apply", Duration::from_secs(10), || {
        mesh.send(&format!("{SERVER_IP}:{SINK_PORT}"), 10).err()
    })?;
    let dest = ztunnel_metrics(&mesh.b)?;
    println!(
        "   the connection was refused; denials counted by the server's ztunnel: {}",
        metric_sum(
            &dest,
            "ztunnel_errors_total",
            &[("reason", "policy_denied")]
        )
    );

    step("Tearing everything down");
    drop(mesh);
    no_leftovers()?;
    println!("   done: no namespace, link, rule or process is left behind.");
    Ok(())
}
