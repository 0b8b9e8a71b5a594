//! The local cluster's workload machinery, driven with the real kubectl: the
//! DaemonSet and Deployment controllers (placement, rolling updates within their
//! budgets, status that `kubectl rollout status` reads, garbage collection) and the
//! kubelet stand-in running containers from their spec (env from every source,
//! restart policy with back-off, HTTP readiness and liveness probes, graceful stop).
//! Root only; each test builds its own cluster, one at a time.

use std::time::{Duration, Instant};

use local_cluster::cluster::LocalCluster;
use local_cluster::controllers::ready;
use serde_json::Value;
use test_support::poll::wait_for;

const T: Duration = Duration::from_secs(20);
const NS: &str = "wl";

fn cluster(tag: &str) -> Option<LocalCluster> {
    if !test_support::can_run_root_tests() {
        return None;
    }
    let c = LocalCluster::start(tag).unwrap();
    c.create_namespace(NS, &[]).unwrap();
    Some(c)
}

fn pods(c: &LocalCluster, selector: &str) -> Vec<Value> {
    c.api()
        .list(&format!(
            "/api/v1/namespaces/{NS}/pods?labelSelector={}",
            kube_apiserver_lite::query_escape(selector)
        ))
        .unwrap()
}

/// Samples the pods of `selector` until `count` of them are ready and none has the
/// old revision (`hash_label` = `old`); the most pods and the fewest ready ones seen.
fn watch_rollout(
    c: &LocalCluster,
    selector: &str,
    count: usize,
    (hash_label, old): (&str, &str),
) -> (usize, Option<usize>) {
    let samples = sample_until(
        &format!("the rollout of {selector}"),
        || pods(c, selector),
        |p| p.len() == count && p.iter().all(|p| ready(p) && label(p, hash_label) != old),
    );
    let most = samples.iter().map(Vec::len).max().unwrap_or_default();
    let fewest_ready = samples
        .iter()
        .map(|s| s.iter().filter(|p| ready(p)).count())
        .min();
    (most, fewest_ready)
}

fn label<'a>(pod: &'a Value, key: &str) -> &'a str {
    pod["metadata"]["labels"][key].as_str().unwrap_or_default()
}

/// A container serving `dir` over HTTP on `port` (python's http.server), after
/// printing `VERSION` and creating `dir/ready`; readiness is `GET /ready`.
fn web_container(dir: &str, port: u16) -> String {
    format!(
        r#"
        - name: web
          image: e2e-app:local
          command: ["sh", "-c"]
          args: ["echo version=$VERSION; mkdir -p {dir}/$(POD_NAME); touch {dir}/$(POD_NAME)/ready; exec python3 -m http.server {port} --directory {dir}/$(POD_NAME)"]
          env:
            - {{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}
            - {{name: VERSION, value: "1"}}
          ports: [{{name: http, containerPort: {port}}}]
          readinessProbe:
            httpGet: {{path: /ready, port: http}}
            periodSeconds: 1
"#
    )
}

/// Samples `f` every 50 ms until `done` holds, returning every sample.
fn sample_until<S>(what: &str, mut f: impl FnMut() -> S, done: impl Fn(&S) -> bool) -> Vec<S> {
    let deadline = Instant::now() + T;
    let mut samples = Vec::new();
    loop {
        let s = f();
        let finished = done(&s);
        samples.push(s);
        if finished {
            return samples;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_daemonset_runs_on_every_node_it_tolerates_and_rolls_node_by_node() {
    let Some(c) = cluster("wds") else { return };
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().display().to_string();
    c.kubectl(&["taint", "nodes", "node-2", "dedicated=infra:NoSchedule"])
        .unwrap();
    let manifest = |name: &str, tolerate: bool| {
        let tolerations = if tolerate {
            "      tolerations: [{operator: Exists}]\n"
        } else {
            ""
        };
        format!(
            r#"apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: {name}, namespace: {NS}}}
spec:
  selector: {{matchLabels: {{app: {name}}}}}
  updateStrategy: {{type: RollingUpdate, rollingUpdate: {{maxUnavailable: 1}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      nodeSelector: {{kubernetes.io/os: linux}}
{tolerations}      containers:{}"#,
            web_container(&dir, 8080)
        )
    };
    c.kubectl_apply(&manifest("everywhere", true)).unwrap();
    c.kubectl_apply(&manifest("untainted", false)).unwrap();
    for ds in ["everywhere", "untainted"] {
        c.kubectl(&[
            "-n",
            NS,
            "rollout",
            "status",
            &format!("ds/{ds}"),
            "--timeout=60s",
        ])
        .unwrap();
    }
    let nodes = |selector: &str| -> Vec<String> {
        let mut n: Vec<String> = pods(&c, selector)
            .iter()
            .map(|p| {
                p["spec"]["nodeName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect();
        n.sort();
        n
    };
    assert_eq!(nodes("app=everywhere"), ["node-1", "node-2"]);
    assert_eq!(
        nodes("app=untainted"),
        ["node-1"],
        "node-2's taint is not tolerated"
    );
    let ds: Value = serde_json::from_str(
        &c.kubectl(&["-n", NS, "get", "ds", "everywhere", "-o", "json"])
            .unwrap(),
    )
    .unwrap();
    let status = &ds["status"];
    for field in [
        "desiredNumberScheduled",
        "numberReady",
        "numberAvailable",
        "updatedNumberScheduled",
    ] {
        assert_eq!(status[field], 2, "{field}: {status}");
    }
    assert_eq!(status["observedGeneration"], ds["metadata"]["generation"]);
    let first_hash = label(&pods(&c, "app=everywhere")[0], "controller-revision-hash").to_owned();

    // A template change rolls one node at a time: never both without a ready pod.
    c.kubectl(&["-n", NS, "set", "env", "ds/everywhere", "VERSION=2"])
        .unwrap();
    let (_, fewest_ready) = watch_rollout(
        &c,
        "app=everywhere",
        2,
        ("controller-revision-hash", &first_hash),
    );
    assert_eq!(fewest_ready, Some(1), "maxUnavailable 1 of 2 nodes");
    c.kubectl(&[
        "-n",
        NS,
        "rollout",
        "status",
        "ds/everywhere",
        "--timeout=60s",
    ])
    .unwrap();
    for p in pods(&c, "app=everywhere") {
        let name = p["metadata"]["name"].as_str().unwrap();
        let log = c.pod_log(NS, name).unwrap_or_default();
        assert!(log.contains("version=2"), "{name}: {log}");
    }

    // Deleting the DaemonSet takes its pods (garbage collection).
    c.kubectl(&["-n", NS, "delete", "ds", "everywhere"])
        .unwrap();
    wait_for("the DaemonSet's pods to go", T, || {
        pods(&c, "app=everywhere").is_empty().then_some(())
    })
    .unwrap();
    c.shutdown().unwrap();
}

#[test]
fn a_deployment_keeps_its_replicas_and_rolls_within_surge_and_unavailable() {
    let Some(c) = cluster("wdp") else { return };
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().display().to_string();
    let manifest = format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: {NS}}}
spec:
  replicas: 3
  selector: {{matchLabels: {{app: web}}}}
  strategy: {{type: RollingUpdate, rollingUpdate: {{maxSurge: 1, maxUnavailable: 0}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      containers:{}"#,
        web_container(&dir, 8080)
    );
    c.kubectl_apply(&manifest).unwrap();
    c.kubectl(&["-n", NS, "rollout", "status", "deploy/web", "--timeout=60s"])
        .unwrap();
    let running = pods(&c, "app=web");
    assert_eq!(running.len(), 3);
    let on_node_1 = running
        .iter()
        .filter(|p| p["spec"]["nodeName"] == "node-1")
        .count();
    assert!(
        (1..=2).contains(&on_node_1),
        "spread over both nodes: {on_node_1} on node-1"
    );
    let first_hash = label(&running[0], "pod-template-hash").to_owned();

    c.kubectl(&["-n", NS, "set", "env", "deploy/web", "VERSION=2"])
        .unwrap();
    let (most, fewest_ready) = watch_rollout(&c, "app=web", 3, ("pod-template-hash", &first_hash));
    assert_eq!(
        most, 4,
        "maxSurge 1: at most 4 pods, and the surge was used"
    );
    assert_eq!(
        fewest_ready,
        Some(3),
        "maxUnavailable 0: 3 ready pods throughout"
    );
    c.kubectl(&["-n", NS, "rollout", "status", "deploy/web", "--timeout=60s"])
        .unwrap();
    let d: Value = serde_json::from_str(
        &c.kubectl(&["-n", NS, "get", "deploy", "web", "-o", "json"])
            .unwrap(),
    )
    .unwrap();
    for field in [
        "replicas",
        "updatedReplicas",
        "readyReplicas",
        "availableReplicas",
    ] {
        assert_eq!(d["status"][field], 3, "{field}: {}", d["status"]);
    }
    let available = d["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Available")
        .cloned();
    assert_eq!(available.map(|a| a["status"].clone()), Some("True".into()));

    c.kubectl(&[
        "-n",
        NS,
        "patch",
        "deploy",
        "web",
        "-p",
        r#"{"spec":{"replicas":1}}"#,
    ])
    .unwrap();
    wait_for("scale down to 1", T, || {
        (pods(&c, "app=web").len() == 1).then_some(())
    })
    .unwrap();
    c.kubectl(&["-n", NS, "delete", "deploy", "web"]).unwrap();
    wait_for("the Deployment's pods to go", T, || {
        pods(&c, "app=web").is_empty().then_some(())
    })
    .unwrap();
    c.shutdown().unwrap();
}

fn pod_json(c: &LocalCluster, name: &str) -> Value {
    c.get_pod(NS, name).unwrap()
}

fn container_status(c: &LocalCluster, name: &str) -> Value {
    pod_json(c, name)["status"]["containerStatuses"][0].clone()
}

/// Waits until pod `name`'s container waits with `reason`; its message.
fn waiting_message(c: &LocalCluster, name: &str, reason: &str) -> String {
    let status = wait_for(reason, T, || {
        let s = container_status(c, name);
        (s["state"]["waiting"]["reason"] == reason).then_some(s)
    })
    .unwrap();
    status["state"]["waiting"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn containers_restart_by_policy_and_probes_drive_ready_and_restarts() {
    let Some(c) = cluster("wrs") else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let manifest = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: crasher, namespace: {NS}}}
spec:
  nodeName: node-1
  containers:
    - {{name: c, image: e2e-app:local, command: [sh, -c, "echo attempt; exit 3"]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: once, namespace: {NS}}}
spec:
  nodeName: node-2
  restartPolicy: OnFailure
  containers:
    - {{name: c, image: e2e-app:local, command: [sh, -c, "echo done"]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: probed, namespace: {NS}}}
spec:
  nodeName: node-2
  containers:
    - name: web
      image: e2e-app:local
      command: [sh, -c, "mkdir -p {d}/www; touch {d}/www/alive; echo started; exec python3 -m http.server 8080 --directory {d}/www"]
      readinessProbe: {{httpGet: {{path: /ready, port: 8080}}, periodSeconds: 1}}
      livenessProbe: {{httpGet: {{path: /alive, port: 8080}}, periodSeconds: 1, failureThreshold: 2}}
"#
    );
    c.kubectl_apply(&manifest).unwrap();

    // Always: restarted with a growing back-off, counted, and shown as kubectl shows it.
    let status = wait_for("two restarts", T, || {
        let s = container_status(&c, "crasher");
        (s["restartCount"].as_u64() >= Some(2)).then_some(s)
    })
    .unwrap();
    assert_eq!(status["lastState"]["terminated"]["exitCode"], 3, "{status}");
    wait_for("CrashLoopBackOff", T, || {
        let s = container_status(&c, "crasher");
        (s["state"]["waiting"]["reason"] == "CrashLoopBackOff").then_some(())
    })
    .unwrap();
    let table = c
        .kubectl(&["-n", NS, "get", "pod", "crasher", "--no-headers"])
        .unwrap();
    let restarts: u64 = table
        .split_whitespace()
        .nth(3)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    assert!(restarts >= 2, "kubectl's RESTARTS column: {table}");

    // OnFailure: a clean exit is not restarted; the pod Succeeded.
    wait_for("pod once to succeed", T, || {
        (pod_json(&c, "once")["status"]["phase"] == "Succeeded").then_some(())
    })
    .unwrap();
    assert_eq!(container_status(&c, "once")["restartCount"], 0);

    // Readiness: not Ready while GET /ready is 404; Ready once it answers.
    std::thread::sleep(Duration::from_secs(2));
    assert!(!ready(&pod_json(&c, "probed")), "GET /ready answers 404");
    std::fs::write(dir.path().join("www/ready"), "").unwrap();
    wait_for("probed to be Ready", T, || {
        ready(&pod_json(&c, "probed")).then_some(())
    })
    .unwrap();

    // Liveness: two failed GET /alive restart the container (which recreates it).
    std::fs::remove_file(dir.path().join("www/alive")).unwrap();
    wait_for("a liveness restart", T, || {
        (container_status(&c, "probed")["restartCount"] == 1).then_some(())
    })
    .unwrap();
    // The kubelet's events say what happened, as kubectl shows them.
    let crasher_events = c
        .kubectl(&[
            "-n",
            NS,
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=crasher",
        ])
        .unwrap();
    for reason in ["Started", "BackOff"] {
        assert!(
            crasher_events.contains(reason),
            "{reason}:\n{crasher_events}"
        );
    }
    let describe = wait_for("the liveness events", T, || {
        let d = c.kubectl(&["-n", NS, "describe", "pod", "probed"]).ok()?;
        (d.contains("Liveness probe failed") && d.contains("Killing")).then_some(d)
    })
    .unwrap();
    assert!(describe.contains("Unhealthy"), "{describe}");
    wait_for("probed to be Ready again", T, || {
        ready(&pod_json(&c, "probed")).then_some(())
    })
    .unwrap();
    c.shutdown().unwrap();
}

#[test]
fn containers_get_their_environment_from_every_source_and_stop_gracefully() {
    let Some(c) = cluster("wenv") else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let manifest = format!(
        r#"apiVersion: v1
kind: ConfigMap
metadata: {{name: settings, namespace: {NS}}}
data: {{LEVEL: debug, MODE: from-configmap}}
---
apiVersion: v1
kind: Secret
metadata: {{name: creds, namespace: {NS}}}
stringData: {{TOKEN: s3cret}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: runner, namespace: {NS}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: env, namespace: {NS}, labels: {{app: env}}}}
spec:
  nodeName: node-1
  serviceAccountName: runner
  terminationGracePeriodSeconds: 5
  containers:
    - name: main
      image: e2e-app:local
      command: [sh, -c]
      args: ["env | sort; trap 'echo term > {d}/term; exit 0' TERM; while true; do sleep 0.1; done"]
      resources: {{limits: {{cpu: 1500m, memory: 64Mi}}}}
      envFrom:
        - configMapRef: {{name: settings}}
        - {{secretRef: {{name: creds}}, prefix: S_}}
      env:
        - {{name: MODE, value: from-env}}
        - {{name: LVL, valueFrom: {{configMapKeyRef: {{name: settings, key: LEVEL}}}}}}
        - {{name: TOKEN, valueFrom: {{secretKeyRef: {{name: creds, key: TOKEN}}}}}}
        - {{name: MY_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}
        - {{name: MY_NS, valueFrom: {{fieldRef: {{fieldPath: metadata.namespace}}}}}}
        - {{name: MY_NODE, valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}}}
        - {{name: MY_SA, valueFrom: {{fieldRef: {{fieldPath: spec.serviceAccountName}}}}}}
        - {{name: MY_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}
        - {{name: HOST_IP, valueFrom: {{fieldRef: {{fieldPath: status.hostIP}}}}}}
        - {{name: CPU, valueFrom: {{resourceFieldRef: {{resource: limits.cpu}}}}}}
        - {{name: MEM_MI, valueFrom: {{resourceFieldRef: {{resource: limits.memory, divisor: 1Mi}}}}}}
        - {{name: URL, value: "http://$(MY_IP):80"}}
      lifecycle:
        preStop: {{exec: {{command: [sh, -c, "echo $MY_NAME > {d}/prestop"]}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: missing, namespace: {NS}}}
spec:
  nodeName: node-2
  containers:
    - name: main
      image: e2e-app:local
      command: [sleep, "3600"]
      env:
        - {{name: X, valueFrom: {{configMapKeyRef: {{name: absent, key: k}}}}}}
"#
    );
    c.kubectl_apply(&manifest).unwrap();
    let pod = c.wait_pod_running(NS, "env", T).unwrap();
    let log = wait_for("the env listing", T, || {
        c.pod_log(NS, "env").filter(|l| l.contains("URL="))
    })
    .unwrap();
    let expected = [
        "LEVEL=debug".to_owned(),
        "MODE=from-env".to_owned(),
        "S_TOKEN=s3cret".to_owned(),
        "LVL=debug".to_owned(),
        "TOKEN=s3cret".to_owned(),
        "MY_NAME=env".to_owned(),
        format!("MY_NS={NS}"),
        "MY_NODE=node-1".to_owned(),
        "MY_SA=runner".to_owned(),
        format!("MY_IP={}", pod.ip),
        format!("HOST_IP={}", c.node(1).ip()),
        "CPU=2".to_owned(),
        "MEM_MI=64".to_owned(),
        format!("URL=http://{}:80", pod.ip),
    ];
    for line in &expected {
        assert!(
            log.lines().any(|l| l == line),
            "{line} missing from:\n{log}"
        );
    }
    assert!(
        !log.lines()
            .any(|l| l.starts_with("CARGO") || l.starts_with("RUST_")),
        "the test's own environment leaked into the container:\n{log}"
    );

    // A missing ConfigMap: the container waits with kubelet's reason.
    let message = waiting_message(&c, "missing", "CreateContainerConfigError");
    assert!(message.contains("absent"), "{message}");

    // Deletion: preStop runs, then SIGTERM, which the container handles.
    c.kubectl(&["-n", NS, "delete", "pod", "env"]).unwrap();
    wait_for("the kubelet to let go of the pod", T, || {
        c.pod(NS, "env").is_none().then_some(())
    })
    .unwrap();
    c.settle();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("prestop"))
            .unwrap_or_default()
            .trim(),
        "env"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("term"))
            .unwrap_or_default()
            .trim(),
        "term"
    );
    c.shutdown().unwrap();
}

#[test]
fn a_container_runs_in_its_own_root_with_its_volumes_user_and_capabilities() {
    let Some(c) = cluster("wvol") else { return };
    let script = "cat /config/LEVEL; echo; stat -c mode=%a /secrets/TOKEN; cat /secrets/TOKEN; echo; \
        wc -c < /var/run/secrets/tokens/istio-token; echo hi > /scratch/x && echo scratch-ok; \
        touch /rootfile 2>/dev/null || echo root-ro; touch /config/x 2>/dev/null || echo config-ro; \
        echo from-pod > /var/run/demo/file; id -u; grep CapEff /proc/self/status; \
        ip addr add 192.0.2.1/32 dev lo 2>/dev/null && echo netadmin-ok || echo netadmin-denied; \
        ls /usr/local/bin; echo end; sleep 3600";
    let pod = |name: &str, node: &str, security: &str| {
        format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {NS}}}
spec:
  nodeName: {node}
  containers:
    - name: main
      image: e2e-app:local
      command: [sh, -c, "{script}"]
      securityContext: {security}
      volumeMounts:
        - {{name: config, mountPath: /config, readOnly: true}}
        - {{name: creds, mountPath: /secrets}}
        - {{name: token, mountPath: /var/run/secrets/tokens}}
        - {{name: scratch, mountPath: /scratch}}
        - {{name: demo, mountPath: /var/run/demo}}
  volumes:
    - {{name: config, configMap: {{name: settings}}}}
    - {{name: creds, secret: {{secretName: creds, defaultMode: 256}}}}
    - {{name: token, projected: {{sources: [{{serviceAccountToken: {{path: istio-token, audience: istio-ca, expirationSeconds: 3600}}}}]}}}}
    - {{name: scratch, emptyDir: {{}}}}
    - {{name: demo, hostPath: {{path: /var/run/demo, type: DirectoryOrCreate}}}}
"#
        )
    };
    let manifest = format!(
        r#"apiVersion: v1
kind: ConfigMap
metadata: {{name: settings, namespace: {NS}}}
data: {{LEVEL: debug}}
---
apiVersion: v1
kind: Secret
metadata: {{name: creds, namespace: {NS}}}
stringData: {{TOKEN: s3cret}}
---
{}---
{}---
apiVersion: v1
kind: Pod
metadata: {{name: distroless, namespace: {NS}}}
spec:
  nodeName: node-1
  containers:
    - {{name: main, image: "ghcr.io/ambient-rs/ambient-rs:0.1.0", command: [sh, -c, "true"]}}
"#,
        pod(
            "admin",
            "node-1",
            "{readOnlyRootFilesystem: true, capabilities: {drop: [ALL], add: [NET_ADMIN]}}"
        ),
        pod(
            "plain",
            "node-2",
            "{runAsUser: 1000, runAsGroup: 1000, capabilities: {drop: [ALL]}}"
        ),
    );
    c.kubectl_apply(&manifest).unwrap();
    let log_of = |name: &str| {
        wait_for(&format!("{name}'s output"), T, || {
            c.pod_log(NS, name).filter(|l| l.contains("end\n"))
        })
        .unwrap_or_else(|e| {
            panic!(
                "{e}: {:?}\nlog: {:?}\nevents: {:?}",
                c.get_pod(NS, name).map(|p| p["status"].clone()),
                c.pod_log(NS, name),
                c.pod_events(NS, name)
            )
        })
    };
    let admin = log_of("admin");
    for line in [
        "debug",
        "mode=400",
        "s3cret",
        "scratch-ok",
        "root-ro",
        "config-ro",
        "0",
        "CapEff:\t0000000000001000",
        "netadmin-ok",
        "e2e-app",
    ] {
        assert!(
            admin.lines().any(|l| l == line),
            "{line:?} missing:\n{admin}"
        );
    }
    let token_bytes: usize = admin
        .lines()
        .nth(3)
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0);
    assert!(token_bytes > 100, "a projected token: {admin}");
    // The hostPath is the node's own directory.
    let on_node = c.node(1).root_dir().join("var/run/demo/file");
    assert_eq!(std::fs::read_to_string(on_node).unwrap(), "from-pod\n");

    let plain = log_of("plain");
    for line in ["1000", "CapEff:\t0000000000000000", "netadmin-denied"] {
        assert!(
            plain.lines().any(|l| l == line),
            "{line:?} missing:\n{plain}"
        );
    }
    // The mesh's image is distroless: no shell to run.
    let message = waiting_message(&c, "distroless", "CreateContainerError");
    assert!(message.contains("not found in image"), "{message}");
    c.shutdown().unwrap();
}

#[test]
fn kubectl_logs_in_every_form() {
    let Some(c) = cluster("wlog") else { return };
    let manifest = format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: talker, namespace: {NS}}}
spec:
  selector: {{matchLabels: {{app: talker}}}}
  template:
    metadata:
      labels: {{app: talker}}
      annotations: {{kubectl.kubernetes.io/default-container: main}}
    spec:
      containers:
        - {{name: main, image: e2e-app:local, command: [sh, -c, "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done"]}}
        - {{name: side, image: e2e-app:local, command: [sh, -c, "echo side-hello >&2; sleep 3600"]}}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: greeter, namespace: {NS}}}
spec:
  selector: {{matchLabels: {{app: greeter}}}}
  template:
    metadata: {{labels: {{app: greeter}}}}
    spec:
      containers:
        - {{name: main, image: e2e-app:local, command: [sh, -c, "echo hello from $NODE; sleep 3600"],
            env: [{{name: NODE, valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}}}]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: crash, namespace: {NS}}}
spec:
  nodeName: node-2
  containers:
    - {{name: c, image: e2e-app:local, command: [sh, -c, "echo run-$(cat /proc/sys/kernel/random/uuid); sleep 1; exit 1"]}}
"#
    );
    c.kubectl_apply(&manifest).unwrap();
    c.kubectl(&[
        "-n",
        NS,
        "rollout",
        "status",
        "deploy/talker",
        "--timeout=60s",
    ])
    .unwrap();
    let talker = pods(&c, "app=talker")[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let logs = |args: &[&str]| -> String {
        let mut argv = vec!["-n", NS, "logs"];
        argv.extend(args);
        c.kubectl(&argv)
            .unwrap_or_else(|e| panic!("kubectl logs {args:?}: {e:#}"))
    };
    wait_for("a few ticks", T, || {
        logs(&[talker.as_str()]).contains("tick 5").then_some(())
    })
    .unwrap();

    // The pod, a container, the Deployment and a selector (the default container).
    assert!(logs(&[talker.as_str()]).starts_with("tick 1\ntick 2\n"));
    assert_eq!(
        logs(&[talker.as_str(), "-c", "side"]),
        "side-hello\n",
        "stderr is logged too"
    );
    assert!(logs(&["deploy/talker"]).starts_with("tick 1\n"));
    assert!(logs(&["-l", "app=talker"]).contains("tick 3\n"));

    // tailLines, timestamps, limitBytes, sinceSeconds.
    let tail = logs(&[talker.as_str(), "--tail=2"]);
    assert_eq!(tail.lines().count(), 2, "{tail}");
    let stamped = logs(&[talker.as_str(), "--tail=1", "--timestamps"]);
    let (ts, line) = stamped.trim_end().split_once(' ').unwrap();
    assert!(
        time::OffsetDateTime::parse(ts, &time::format_description::well_known::Rfc3339).is_ok(),
        "{stamped}"
    );
    assert!(line.starts_with("tick"), "{stamped}");
    assert_eq!(logs(&[talker.as_str(), "--limit-bytes=6"]), "tick 1");
    let all = logs(&[talker.as_str()]).lines().count();
    let recent = logs(&[talker.as_str(), "--since=1s"]).lines().count();
    assert!(
        (1..all).contains(&recent),
        "--since=1s: {recent} of {all} lines"
    );

    // -f streams lines written after the call began.
    let last_tick = |text: &str| -> u64 {
        text.lines()
            .filter_map(|l| l.strip_prefix("tick ")?.parse().ok())
            .max()
            .unwrap_or(0)
    };
    let before = last_tick(&logs(&[talker.as_str()]));
    let out = c
        .control_plane
        .ns
        .command("timeout")
        .args(["3", "kubectl", "--kubeconfig"])
        .arg(c.kubeconfig())
        .args(["-n", NS, "logs", "-f", &talker])
        .output()
        .unwrap();
    let followed = String::from_utf8_lossy(&out.stdout);
    assert!(
        last_tick(&followed) >= before + 5,
        "followed up to tick {} (it was at {before} when the call began): {}",
        last_tick(&followed),
        String::from_utf8_lossy(&out.stderr)
    );

    // A DaemonSet through its selector: one of its pods.
    assert!(logs(&["ds/greeter"]).starts_with("hello from node-"));

    // --previous after a restart: the instance before, not this one.
    wait_for("crash to restart", T, || {
        (container_status(&c, "crash")["restartCount"].as_u64() >= Some(2)).then_some(())
    })
    .unwrap();
    let previous = logs(&["crash", "--previous"]);
    let current = logs(&["crash"]);
    assert!(
        previous.starts_with("run-") && current.starts_with("run-"),
        "{previous} {current}"
    );
    assert_ne!(previous, current, "each instance has its own log");

    // Errors kubectl users know.
    let err = c
        .kubectl(&["-n", NS, "logs", &talker, "-c", "nope"])
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("container nope is not valid"),
        "{err:#}"
    );
    c.shutdown().unwrap();
}
