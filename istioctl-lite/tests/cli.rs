//! Runs the real binary against the e2e crate's local API server (no controllers:
//! the test plays the Deployment and DaemonSet controllers and the node agent by
//! patching status and annotations).

use std::path::{Path, PathBuf};
use std::process::Output;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::Client;

const BIN: &str = env!("CARGO_BIN_EXE_istioctl-lite");

struct Cluster {
    kubeconfig: PathBuf,
    client: Client,
    _control: kube_apiserver_lite::Control,
    _dir: tempfile::TempDir,
}

async fn cluster() -> Cluster {
    let server = kube_apiserver_lite::ApiServer::bind("127.0.0.1:0", None)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    kube_apiserver_lite::write_kubeconfig(&kubeconfig, &server.url()).unwrap();
    let control = server.spawn();
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = Client::try_from(config).unwrap();
    Cluster {
        kubeconfig,
        client,
        _control: control,
        _dir: dir,
    }
}

async fn run(kubeconfig: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::new(BIN);
    if let Some(k) = kubeconfig {
        cmd.arg("--kubeconfig").arg(k);
    }
    let out = cmd.args(args).output().await.unwrap();
    eprintln!(
        "$ istioctl-lite {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn helm_missing() -> bool {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("helm").is_file()))
        .unwrap_or(false);
    !test_support::prerequisite(
        found,
        "helm is not on PATH (scripts/install-chart-tools.sh installs it)",
    )
}

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(name)
}

const INSTALL: &[&str] = &["install", "--set", "image.tag=test"];

fn with<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
    base.iter().chain(extra).copied().collect()
}

async fn mark_ready(client: &Client, name: &str) {
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), "istio-system");
    let generation = api.get(name).await.unwrap().metadata.generation;
    let status = serde_json::json!({"status": {"desiredNumberScheduled": 1, "numberReady": 1, "currentNumberScheduled": 1, "updatedNumberScheduled": 1, "numberMisscheduled": 0, "observedGeneration": generation}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// What the Deployment controller reports once every one of istiod's pods is up.
async fn mark_available(client: &Client, name: &str) {
    let api: Api<Deployment> = Api::namespaced(client.clone(), "istio-system");
    let n = api
        .get(name)
        .await
        .unwrap()
        .spec
        .unwrap()
        .replicas
        .unwrap_or(1);
    let generation = api.get(name).await.unwrap().metadata.generation;
    let status = serde_json::json!({"status": {"replicas": n, "updatedReplicas": n, "readyReplicas": n, "availableReplicas": n, "observedGeneration": generation}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The certificate in `pem`, parsed.
fn with_cert<T>(pem: &[u8], f: impl FnOnce(&x509_parser::certificate::X509Certificate) -> T) -> T {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).unwrap();
    let cert = pem.parse_x509().unwrap();
    f(&cert)
}

/// A self-signed RSA CA certificate with O=`trust_domain`, and a PKCS#8 key.
fn assert_rsa_root(
    data: &std::collections::BTreeMap<String, k8s_openapi::ByteString>,
    trust_domain: &str,
) {
    assert_eq!(data.len(), 4);
    let key = String::from_utf8_lossy(&data["ca-key.pem"].0).into_owned();
    assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"), "{key}");
    with_cert(&data["root-cert.pem"].0, |cert| {
        assert!(cert.is_ca());
        assert_eq!(cert.subject(), cert.issuer(), "self-signed");
        assert_eq!(
            cert.public_key().algorithm.algorithm,
            x509_parser::oid_registry::OID_PKCS1_RSAENCRYPTION,
            "RSA, as Istio's self-signed root"
        );
        let x509_parser::public_key::PublicKey::RSA(rsa) = cert.public_key().parsed().unwrap()
        else {
            panic!("not an RSA key");
        };
        assert_eq!(rsa.key_size(), 2048);
        let org: Vec<&str> = cert
            .subject()
            .iter_organization()
            .map(|o| o.as_str().unwrap())
            .collect();
        assert_eq!(org, [trust_domain]);
    });
    assert_eq!(data["ca-cert.pem"].0, data["root-cert.pem"].0);
}

#[tokio::test]
async fn install_is_idempotent_waits_for_readiness_and_uninstalls() {
    if helm_missing() {
        return;
    }
    let c = cluster().await;
    let k = Some(c.kubeconfig.as_path());

    let out = run(k, &with(INSTALL, &["--wait=false"])).await;
    assert!(out.status.success());
    let text = stdout(&out);
    assert!(
        text.contains("Secret istio-system/cacerts created"),
        "no CA existed, so install made one: {text}"
    );
    // The control plane goes first.
    let first = |what: &str| text.find(what).unwrap_or_else(|| panic!("{what}: {text}"));
    assert!(first("Deployment/istiod applied") < first("DaemonSet/istio-cni-node applied"));
    assert!(first("Deployment/istiod applied") < first("DaemonSet/ztunnel applied"));

    let ds: Api<DaemonSet> = Api::namespaced(c.client.clone(), "istio-system");
    let deploy: Api<Deployment> = Api::namespaced(c.client.clone(), "istio-system");
    let svc: Api<Service> = Api::namespaced(c.client.clone(), "istio-system");
    let sa: Api<ServiceAccount> = Api::namespaced(c.client.clone(), "istio-system");
    let cm: Api<ConfigMap> = Api::namespaced(c.client.clone(), "istio-system");
    let secrets: Api<Secret> = Api::namespaced(c.client.clone(), "istio-system");
    let ztunnel = ds.get("ztunnel").await.unwrap();
    let image = ztunnel.spec.unwrap().template.spec.unwrap().containers[0]
        .image
        .clone()
        .unwrap();
    assert!(image.ends_with(":test"), "--set reached the chart: {image}");
    ds.get("istio-cni-node").await.unwrap();
    sa.get("ztunnel").await.unwrap();
    sa.get("istio-cni").await.unwrap();
    cm.get("istio-cni-config").await.unwrap();
    Api::<Namespace>::all(c.client.clone())
        .get("istio-system")
        .await
        .unwrap();

    // The control plane: Deployment, Service, account and RBAC, and the CA it mounts.
    let istiod = deploy.get("istiod").await.unwrap();
    let pod = istiod.spec.unwrap().template.spec.unwrap();
    let image = pod.containers[0].image.clone().unwrap();
    assert!(
        image.ends_with(":test"),
        "--set reached istiod-lite: {image}"
    );
    let mounted = pod
        .volumes
        .unwrap_or_default()
        .into_iter()
        .find_map(|v| v.secret.and_then(|s| s.secret_name));
    assert_eq!(mounted.as_deref(), Some("cacerts"));
    let ports: Vec<i32> = svc
        .get("istiod")
        .await
        .unwrap()
        .spec
        .unwrap()
        .ports
        .unwrap()
        .iter()
        .map(|p| p.port)
        .collect();
    assert!(ports.contains(&15012), "{ports:?}");
    sa.get("istiod").await.unwrap();
    let roles: Api<DynamicObject> = Api::all_with(c.client.clone(), &cluster_role_resource());
    let role = roles.get("istiod").await.unwrap();
    let reviews_tokens = role.data["rules"].as_array().unwrap().iter().any(|r| {
        r["apiGroups"] == serde_json::json!(["authentication.k8s.io"])
            && r["resources"] == serde_json::json!(["tokenreviews"])
            && r["verbs"].as_array().unwrap().contains(&"create".into())
    });
    assert!(reviews_tokens, "istiod may create TokenReviews: {role:?}");
    let bindings: Api<DynamicObject> =
        Api::all_with(c.client.clone(), &cluster_role_binding_resource());
    bindings.get("istiod").await.unwrap();
    let ca = secrets.get("cacerts").await.unwrap().data.unwrap();
    assert_rsa_root(&ca, "cluster.local");

    // Idempotent: a second run converges on the same objects and keeps the CA.
    let out = run(k, &with(INSTALL, &["--wait=false"])).await;
    assert!(out.status.success());
    assert!(stdout(&out).contains("Secret istio-system/cacerts present"));
    assert_eq!(secrets.get("cacerts").await.unwrap().data.unwrap(), ca);

    // Nothing makes istiod available: the wait times out on it, before the data plane.
    let out = run(k, &with(INSTALL, &["--timeout", "2s"])).await;
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("timed out") && err.contains("Deployment istio-system/istiod"),
        "{err}"
    );
    assert!(
        err.contains("… Deployment istio-system/istiod: 0/2 available"),
        "{err}"
    );
    assert!(!stdout(&out).contains("DaemonSet/ztunnel applied"));

    // istiod is up, the DaemonSets are not: the wait moves on and times out on them.
    mark_available(&c.client, "istiod").await;
    let out = run(k, &with(INSTALL, &["--timeout", "3s"])).await;
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("✔ Deployment istio-system/istiod: 2/2 available"),
        "{err}"
    );
    assert!(
        err.contains("timed out") && err.contains("DaemonSet istio-system/ztunnel"),
        "{err}"
    );
    assert!(stdout(&out).contains("DaemonSet/ztunnel applied"));

    mark_ready(&c.client, "ztunnel").await;
    mark_ready(&c.client, "istio-cni-node").await;
    let out = run(k, &with(INSTALL, &["--timeout", "20s"])).await;
    assert!(out.status.success());
    assert!(stdout(&out).contains("installation complete"));
    let progress = stderr(&out);
    assert!(
        progress.contains("DaemonSet istio-system/ztunnel: 1/1 ready")
            && progress.contains("Deployment istio-system/istiod: 2/2 available"),
        "{progress}"
    );

    // ztunnel gets everything over xDS: no RBAC of its own. The CNI agent's is applied.
    assert!(roles.get_opt("ztunnel").await.unwrap().is_none());
    assert!(
        roles.get_opt("istio-cni").await.unwrap().is_some(),
        "RBAC is applied too"
    );

    // No DaemonSet controller here to roll the agents to uninstallOnExit (e2e's
    // charts test covers that roll): delete them as they are.
    let out = run(k, &["uninstall", "--keep-cni-config"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(ds.get_opt("ztunnel").await.unwrap().is_none());
    assert!(ds.get_opt("istio-cni-node").await.unwrap().is_none());
    assert!(sa.get_opt("ztunnel").await.unwrap().is_none());
    assert!(sa.get_opt("istio-cni").await.unwrap().is_none());
    assert!(cm.get_opt("istio-cni-config").await.unwrap().is_none());
    assert!(roles.get_opt("istio-cni").await.unwrap().is_none());
    assert!(deploy.get_opt("istiod").await.unwrap().is_none());
    assert!(svc.get_opt("istiod").await.unwrap().is_none());
    assert!(sa.get_opt("istiod").await.unwrap().is_none());
    assert!(roles.get_opt("istiod").await.unwrap().is_none());
    assert!(bindings.get_opt("istiod").await.unwrap().is_none());
    // Never the CA: the identities it issued outlive a reinstall.
    assert_eq!(secrets.get("cacerts").await.unwrap().data.unwrap(), ca);
    assert!(stdout(&out).contains("Secret istio-system/cacerts kept"));
}

#[tokio::test]
async fn install_keeps_a_plugged_in_ca_and_follows_the_chart_values() {
    if helm_missing() {
        return;
    }
    let c = cluster().await;
    let k = Some(c.kubeconfig.as_path());
    let namespaces: Api<Namespace> = Api::all(c.client.clone());
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "istio-system"}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let out = run(k, &["ca", "init", "--trust-domain", "corp.example"]).await;
    assert!(out.status.success());
    let secrets: Api<Secret> = Api::namespaced(c.client.clone(), "istio-system");
    let plugged = secrets.get("cacerts").await.unwrap().data.unwrap();

    let out = run(
        k,
        &with(
            INSTALL,
            &["--wait=false", "--set", "trustDomain=corp.example"],
        ),
    )
    .await;
    assert!(out.status.success());
    assert!(stdout(&out).contains("Secret istio-system/cacerts present"));
    assert_eq!(
        secrets.get("cacerts").await.unwrap().data.unwrap(),
        plugged,
        "an existing CA is never replaced"
    );
    // An unprefixed value goes to the charts that have it (not cni, whose schema
    // would refuse it).
    let deploy: Api<Deployment> = Api::namespaced(c.client.clone(), "istio-system");
    let env = deploy
        .get("istiod")
        .await
        .unwrap()
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .containers[0]
        .env
        .clone()
        .unwrap_or_default();
    let trust_domain = env.iter().find(|e| e.name == "TRUST_DOMAIN");
    assert_eq!(
        trust_domain.and_then(|e| e.value.as_deref()),
        Some("corp.example")
    );

    // Another Secret name: install makes a root for it, in the chart's trust domain.
    let out = run(
        k,
        &with(
            INSTALL,
            &[
                "--wait=false",
                "--set",
                "istiod.caSecretName=plugged",
                "--set",
                "istiod.trustDomain=mesh.example",
            ],
        ),
    )
    .await;
    assert!(out.status.success());
    assert!(stdout(&out).contains("Secret istio-system/plugged created"));
    assert_rsa_root(
        &secrets.get("plugged").await.unwrap().data.unwrap(),
        "mesh.example",
    );
}

fn cluster_role_resource() -> kube::api::ApiResource {
    kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", "ClusterRole"),
        "clusterroles",
    )
}

fn cluster_role_binding_resource() -> kube::api::ApiResource {
    kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding"),
        "clusterrolebindings",
    )
}

#[tokio::test]
async fn install_dry_run_prints_the_charts_and_writes_nothing() {
    if helm_missing() {
        return;
    }
    let out = run(None, &["install", "--dry-run"]).await;
    assert!(out.status.success());
    let text = stdout(&out);
    assert!(
        text.contains("kind: DaemonSet")
            && text.contains("name: ztunnel")
            && text.contains("name: istio-cni-node")
            && text.contains("kind: Deployment")
            && text.contains("name: istiod")
    );
    assert!(!text.contains("kind: Secret"), "the CA is not rendered");

    let c = cluster().await;
    let out = run(Some(&c.kubeconfig), &["install", "--dry-run"]).await;
    assert!(out.status.success());
    assert!(stderr(&out).contains("not written by --dry-run"));
    let secrets: Api<Secret> = Api::namespaced(c.client.clone(), "istio-system");
    assert!(secrets.get_opt("cacerts").await.unwrap().is_none());
    let namespaces: Api<Namespace> = Api::all(c.client.clone());
    assert!(namespaces.get_opt("istio-system").await.unwrap().is_none());
}

async fn make_pod(client: &Client, name: &str, annotation: Option<&str>, host_network: bool) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "demo");
    let mut pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "app", "image": "app"}], "hostNetwork": host_network},
    });
    if let Some(a) = annotation {
        pod["metadata"]["annotations"] = serde_json::json!({"ambient.istio.io/redirection": a});
    }
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod).unwrap(),
    )
    .await
    .unwrap();
    let status = serde_json::json!({"status": {"phase": "Running"}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

#[tokio::test]
async fn dataplane_mode_labels_and_reports_enrollment() {
    let c = cluster().await;
    let k = Some(c.kubeconfig.as_path());
    let namespaces: Api<Namespace> = Api::all(c.client.clone());
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "demo"}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    make_pod(&c.client, "enrolled", Some("enabled"), false).await;
    make_pod(&c.client, "waiting", None, false).await;
    make_pod(&c.client, "host", None, true).await;

    let out = run(k, &["dataplane-mode", "enable", "demo", "--timeout", "1s"]).await;
    assert!(!out.status.success(), "a pod is not enrolled");
    let text = stdout(&out);
    assert!(
        text.contains("enrolled enabled") && text.contains("waiting  absent"),
        "{text}"
    );
    assert!(
        !text.contains("host"),
        "hostNetwork pods are not enrolled: {text}"
    );
    let labels = namespaces
        .get("demo")
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap_or_default();
    assert_eq!(
        labels.get("istio.io/dataplane-mode").map(String::as_str),
        Some("ambient")
    );

    // The agent catches up.
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "demo");
    let patch = serde_json::json!({"metadata": {"annotations": {"ambient.istio.io/redirection": "enabled"}}});
    pods.patch("waiting", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let out = run(
        k,
        &[
            "-o",
            "json",
            "dataplane-mode",
            "enable",
            "demo",
            "--timeout",
            "5s",
        ],
    )
    .await;
    assert!(out.status.success());
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report.as_array().map(Vec::len), Some(2));

    let out = run(k, &["dataplane-mode", "disable", "demo", "--timeout", "1s"]).await;
    assert!(!out.status.success(), "pods still carry the annotation");
    let labels = namespaces
        .get("demo")
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap_or_default();
    assert!(!labels.contains_key("istio.io/dataplane-mode"));
}

#[tokio::test]
async fn ca_init_creates_the_plugin_secret() {
    let c = cluster().await;
    let k = Some(c.kubeconfig.as_path());
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "ca-cert.pem",
        "ca-key.pem",
        "root-cert.pem",
        "cert-chain.pem",
    ] {
        std::fs::write(dir.path().join(name), format!("-----BEGIN {name}-----\n")).unwrap();
    }
    let from = dir.path().to_str().unwrap();
    let namespaces: Api<Namespace> = Api::all(c.client.clone());
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "istio-system"}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let out = run(k, &["ca", "init", "--from-dir", from]).await;
    assert!(out.status.success());
    let secrets: Api<Secret> = Api::namespaced(c.client.clone(), "istio-system");
    let data = secrets.get("cacerts").await.unwrap().data.unwrap();
    assert_eq!(data.len(), 4);
    assert!(String::from_utf8_lossy(&data["ca-key.pem"].0).contains("BEGIN ca-key.pem"));
    // A second run leaves the existing Secret alone.
    let out = run(k, &["ca", "init", "--from-dir", from]).await;
    assert!(out.status.success() && stdout(&out).contains("already exists"));

    // A fresh root, made in-process: RSA-2048, as Istio's self-signed root.
    let out = run(
        k,
        &["ca", "init", "--overwrite", "--trust-domain", "example.org"],
    )
    .await;
    assert!(out.status.success());
    assert!(stdout(&out).contains("RSA-2048"), "{}", stdout(&out));
    let data = secrets.get("cacerts").await.unwrap().data.unwrap();
    let root = String::from_utf8_lossy(&data["root-cert.pem"].0).into_owned();
    assert!(root.starts_with("-----BEGIN CERTIFICATE-----"), "{root}");
    assert_rsa_root(&data, "example.org");
}

#[tokio::test]
async fn ztunnel_config_prints_istio_tables_from_both_dumps() {
    for (prefix, file) in [
        ("ztunnel", "ztunnel-dump.json"),
        ("istio", "istio-dump.json"),
    ] {
        let dump = testdata(file);
        let dump = dump.to_str().unwrap();
        // Istio's subcommands, and their aliases.
        for (sections, golden) in [
            (&["workload", "workloads", "w"][..], "workloads"),
            (&["service", "services", "svc", "s"][..], "services"),
            (&["policy", "policies", "pol", "p"][..], "policies"),
            (&["connections", "cons"][..], "connections"),
        ] {
            for section in sections {
                let out = run(None, &["zc", section, "-f", dump, "-o", "short"]).await;
                assert!(
                    out.status.success(),
                    "{section}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                assert_eq!(
                    stdout(&out),
                    std::fs::read_to_string(testdata(&format!("{prefix}-{golden}.txt"))).unwrap(),
                    "{prefix} {section}"
                );
            }
        }
        // `all` prints every section; its certificates' VALID CERT column follows the
        // wall clock, so the golden with a pinned clock is the unit tests' to check.
        let all = stdout(&run(None, &["zc", "all", "-f", dump, "-o", "short"]).await);
        for golden in ["workloads", "services", "policies", "connections"] {
            let section = std::fs::read_to_string(testdata(&format!("{prefix}-{golden}.txt")));
            assert!(
                all.contains(&section.unwrap()),
                "{prefix} all: {golden}\n{all}"
            );
        }
        assert!(all.contains("\nCERTIFICATE NAME "), "{all}");
        let out = run(None, &["ztunnel-config", "certs", "-f", dump]).await;
        assert!(stdout(&out).starts_with("CERTIFICATE NAME "));
        // `all -o json` is the dump as it was read.
        let out = run(None, &["ztunnel-config", "all", "-f", dump, "-o", "json"]).await;
        let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(all["workloadState"].is_object(), "{prefix}");
    }
    let dump = testdata("ztunnel-dump.json");
    let dump = dump.to_str().unwrap();
    let out = run(
        None,
        &[
            "zc",
            "workloads",
            "-f",
            dump,
            "--workload-namespace",
            "legacy",
            "-o",
            "json",
        ],
    )
    .await;
    let workloads: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(workloads[0]["name"], "db-vm");
    assert_eq!(workloads.as_array().map(Vec::len), Some(1));
    let out = run(None, &["zc", "workloads", "-f", "/nonexistent/dump.json"]).await;
    assert!(!out.status.success());
    // Istio's argument checks.
    let out = run(None, &["zc", "workloads", "-f", dump, "--node", "n1"]).await;
    assert!(String::from_utf8_lossy(&out.stderr).contains("at most one of"));
    let out = run(None, &["zc", "log", "--level", "info", "--reset"]).await;
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--level cannot be combined with --reset")
    );
    let out = run(None, &["zc", "log", "--level", "loud"]).await;
    assert!(String::from_utf8_lossy(&out.stderr).contains("unrecognized logging level: loud"));
}

/// `zc log` against a live admin endpoint: POST /logging?level=.. and the answer
/// under the ztunnel's name; a refusal is Istio's "unexpected status code".
#[tokio::test]
async fn ztunnel_config_log_posts_to_the_admin_port() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut req = vec![0u8; 2048];
            let n = s.read(&mut req).await.unwrap();
            let head = String::from_utf8_lossy(&req[..n])
                .lines()
                .next()
                .unwrap_or("")
                .to_owned();
            let answer: &[u8] = if head.contains("level=loud")
                || head.contains("level=access:debug")
            {
                b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\n\r\nInvalid level provided"
            } else {
                b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\ncurrent log level is access=debug,info\n"
            };
            record.lock().unwrap().push(head);
            s.write_all(answer).await.unwrap();
        }
    });
    let out = run(
        None,
        &[
            "zc",
            "log",
            "--ztunnel-admin",
            &addr,
            "--level",
            "access=debug",
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout(&out),
        format!("{addr}:\ncurrent log level is access=debug,info\n\n")
    );
    let out = run(None, &["zc", "log", "--ztunnel-admin", &addr, "-r"]).await;
    assert!(out.status.success());
    let out = run(
        None,
        &[
            "zc",
            "log",
            "--ztunnel-admin",
            &addr,
            "--level",
            "access:debug",
        ],
    )
    .await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unexpected status code: 400"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            "POST /logging?level=access=debug HTTP/1.0",
            "POST /logging?level=info&reset HTTP/1.0",
            "POST /logging?level=access:debug HTTP/1.0",
        ]
    );
}

/// Serves `body` as every answer of a fake admin port; its address.
async fn admin_server(body: String) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut req = vec![0u8; 2048];
            let _ = s.read(&mut req).await;
            let answer = format!("HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n{body}");
            let _ = s.write_all(answer.as_bytes()).await;
        }
    });
    addr
}

/// `zc route`: a waypoint's routes from a file, its admin address, or its pod (the
/// waypoints istiod deploys, in the context's namespace or the one named).
#[tokio::test]
async fn ztunnel_config_route_shows_a_waypoints_routes() {
    let dump = testdata("waypoint-dump.json");
    let dump = dump.to_str().unwrap();
    let golden = std::fs::read_to_string(testdata("waypoint-routes.txt")).unwrap();
    for alias in ["route", "routes", "r"] {
        let out = run(None, &["zc", alias, "-f", dump]).await;
        assert!(out.status.success(), "{alias}: {}", stderr(&out));
        assert_eq!(stdout(&out), golden, "{alias}");
    }
    let out = run(None, &["zc", "route", "-f", dump, "-o", "json"]).await;
    let routes: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(routes[1]["spec"]["rules"][0]["name"], "canary");
    // `all` has the table too.
    let all = stdout(&run(None, &["zc", "all", "-f", dump]).await);
    assert!(all.contains(&golden), "{all}");
    // Istio's dump has no routes: the header alone.
    let istio = testdata("istio-dump.json");
    let out = run(None, &["zc", "route", "-f", istio.to_str().unwrap()]).await;
    assert!(out.status.success());
    assert_eq!(
        stdout(&out),
        "NAMESPACE ROUTE KIND PARENT RULE MATCHES FILTERS BACKENDS\n"
    );
    let out = run(None, &["zc", "route", "-f", dump, "--from-control-plane"]).await;
    assert!(!out.status.success());
    // Through the admin port, named or found as the waypoint's pod.
    let addr = admin_server(std::fs::read_to_string(testdata("waypoint-dump.json")).unwrap()).await;
    let out = run(None, &["zc", "route", "--ztunnel-admin", &addr]).await;
    assert_eq!(stdout(&out), golden, "{}", stderr(&out));
    let c = cluster().await;
    let k = Some(c.kubeconfig.as_path());
    let namespaces: Api<Namespace> = Api::all(c.client.clone());
    for ns in ["demo", "istio-system"] {
        let ns: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "demo");
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "waypoint-7d9f", "labels": {
            "gateway.networking.k8s.io/gateway-name": "waypoint",
            "gateway.istio.io/managed": "istio.io-mesh-controller",
        }},
        "spec": {"containers": [{"name": "istio-proxy", "image": "waypoint"}]},
    });
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod).unwrap(),
    )
    .await
    .unwrap();
    let status = serde_json::json!({"status": {"phase": "Running", "podIP": "127.0.0.1"}});
    pods.patch_status(
        "waypoint-7d9f",
        &PatchParams::default(),
        &Patch::Merge(&status),
    )
    .await
    .unwrap();
    let port = addr.rsplit_once(':').unwrap().1;
    for args in [
        &[
            "zc",
            "route",
            "waypoint-7d9f.demo",
            "--proxy-admin-port",
            port,
        ][..],
        &["zc", "route", "-n", "demo", "--proxy-admin-port", port],
    ] {
        let out = run(k, args).await;
        assert_eq!(stdout(&out), golden, "{args:?}: {}", stderr(&out));
    }
    let out = run(k, &["zc", "route", "nope.demo", "--proxy-admin-port", port]).await;
    assert!(
        stderr(&out).contains("no waypoint pod nope in namespace demo"),
        "{}",
        stderr(&out)
    );
    // A waypoint is not a ztunnel: `workloads` does not find it.
    let out = run(k, &["zc", "workloads", "waypoint-7d9f.demo"]).await;
    assert!(!out.status.success());
}

#[tokio::test]
async fn every_command_has_help() {
    for args in [
        &["--help"][..],
        &["install", "--help"],
        &["uninstall", "--help"],
        &["ca", "init", "--help"],
        &["dataplane-mode", "enable", "--help"],
        &["dataplane-mode", "disable", "--help"],
        &["ztunnel-config", "--help"],
        &["ztunnel-config", "log", "--help"],
        &["zc", "workload", "--help"],
        &["zc", "route", "--help"],
        &["precheck", "--help"],
        &["waypoint", "--help"],
        &["waypoint", "apply", "--help"],
        &["waypoint", "generate", "--help"],
        &["waypoint", "list", "--help"],
        &["waypoint", "delete", "--help"],
        &["waypoint", "status", "--help"],
    ] {
        let out = run(None, args).await;
        assert!(
            out.status.success() && stdout(&out).contains("Usage:"),
            "{args:?}"
        );
    }
}

#[tokio::test]
async fn precheck_reports_cluster_facts() {
    let c = cluster().await;
    let out = run(Some(&c.kubeconfig), &["precheck", "--skip-node"]).await;
    assert!(out.status.success());
    let text = stdout(&out);
    assert!(
        text.contains("✔ API server reachable") && text.contains("no existing DaemonSet ztunnel"),
        "{text}"
    );
}

/// One of the base chart's CRDs as shipped, by name.
fn shipped_crd(name: &str) -> serde_json::Value {
    test_support::crds::shipped()
        .unwrap()
        .into_iter()
        .find(|c| c["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{name} is shipped"))
}

#[tokio::test]
async fn install_adds_missing_crds_keeps_newer_ones_and_purge_removes_only_its_own() {
    if helm_missing() {
        return;
    }
    let c = cluster().await;
    let k = Some(c.kubeconfig.as_path());
    let crds: Api<CustomResourceDefinition> = Api::all(c.client.clone());
    const AP: &str = "authorizationpolicies.security.istio.io";
    const PA: &str = "peerauthentications.security.istio.io";
    const GATEWAYS: &str = "gateways.gateway.networking.k8s.io";

    let out = run(k, &["precheck", "--skip-node"]).await;
    let text = stdout(&out);
    assert!(
        out.status.success(),
        "missing CRDs are not an error: {text}"
    );
    let row = |text: &str, name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} row: {text}"))
            .to_string()
    };
    assert!(text.contains("CRD ") && text.contains("RESULT"), "{text}");
    assert!(
        row(&text, AP).ends_with("missing: install adds it"),
        "{text}"
    );
    assert!(text.contains("⚠ CRDs not installed:"), "{text}");

    // A platform's newer Gateway API, and Istio's base chart's PeerAuthentication.
    let mut gateways = shipped_crd(GATEWAYS);
    gateways["metadata"]["annotations"]["gateway.networking.k8s.io/bundle-version"] =
        "v1.4.0".into();
    let mut pa = shipped_crd(PA);
    pa["metadata"]["annotations"] = serde_json::json!({"meta.helm.sh/release-name": "istio-base"});
    pa["spec"]["versions"][0]["served"] = false.into();
    for crd in [gateways, pa] {
        crds.create(
            &PostParams::default(),
            &serde_json::from_value(crd).unwrap(),
        )
        .await
        .unwrap();
    }
    let out = run(k, &["precheck", "--skip-node", "-o", "json"]).await;
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let verdict = |name: &str| {
        report["crds"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(verdict(GATEWAYS)["verdict"], "newer");
    assert_eq!(verdict(GATEWAYS)["installed"]["bundle"], "v1.4.0");
    assert_eq!(verdict(PA)["verdict"], "older");
    assert_eq!(verdict(PA)["owner"], "helm release istio-base");
    assert_eq!(verdict(AP)["verdict"], "missing");

    let out = run(k, &with(INSTALL, &["--wait=false"])).await;
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        text.contains(&format!("CustomResourceDefinition/{AP} applied (base)")),
        "{text}"
    );
    assert!(
        text.contains(&format!("CustomResourceDefinition/{PA} applied (base)")),
        "{text}"
    );
    assert!(
        text.contains(&format!("CustomResourceDefinition/{GATEWAYS} kept")),
        "{text}"
    );
    let kept = crds.get(GATEWAYS).await.unwrap();
    assert_eq!(
        kept.metadata.annotations.unwrap()["gateway.networking.k8s.io/bundle-version"],
        "v1.4.0",
        "never downgraded"
    );
    // The CRDs come before the control plane, and their kinds are served at once.
    assert!(text.find(AP).unwrap() < text.find("Deployment/istiod").unwrap());
    let policy: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
        "metadata": {"name": "deny", "namespace": "istio-system"},
        "spec": {"action": "DENY", "rules": [{}]},
    }))
    .unwrap();
    let ap = kube::discovery::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        "security.istio.io",
        "v1",
        "AuthorizationPolicy",
    ));
    Api::<DynamicObject>::namespaced_with(c.client.clone(), "istio-system", &ap)
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();

    let out = run(k, &["uninstall", "--keep-cni-config"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        crds.get_opt(AP).await.unwrap().is_some(),
        "kept without --purge"
    );

    let out = run(k, &["uninstall", "--keep-cni-config", "--purge"]).await;
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(crds.get_opt(AP).await.unwrap().is_none(), "{text}");
    assert!(
        crds.get_opt(GATEWAYS).await.unwrap().is_some(),
        "newer: not ours: {text}"
    );
    assert!(crds.get_opt(PA).await.unwrap().is_some(), "Istio's: {text}");
    assert!(
        text.contains(&format!(
            "CustomResourceDefinition/{PA} kept: Helm release istio-base installed it"
        )),
        "{text}"
    );
}

/// The Gateway API (and the mesh's other) CRDs, so the server serves Gateways.
async fn install_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in test_support::crds::shipped().unwrap() {
        crds.create(
            &PostParams::default(),
            &serde_json::from_value(crd).unwrap(),
        )
        .await
        .unwrap();
    }
}

async fn make_namespace(client: &Client, name: &str) {
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
}

fn gateways(client: &Client, ns: &str) -> Api<DynamicObject> {
    let gateway = kube::discovery::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "Gateway"),
        "gateways",
    );
    Api::namespaced_with(client.clone(), ns, &gateway)
}

/// A Gateway of another class than istio-waypoint (an ingress, say).
async fn make_other_gateway(client: &Client, ns: &str, name: &str) {
    let obj: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"gatewayClassName": "istio", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]},
    }))
    .unwrap();
    gateways(client, ns)
        .create(&PostParams::default(), &obj)
        .await
        .unwrap();
}

/// What the control plane reports once the waypoint's proxy is deployed (or not).
async fn set_programmed(client: &Client, ns: &str, name: &str, status: &str) {
    let reason = if status == "True" {
        "Programmed"
    } else {
        "NoResources"
    };
    let patch = serde_json::json!({"status": {"conditions": [
        {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "Resource accepted", "lastTransitionTime": "2026-01-01T00:00:00Z"},
        {"type": "Programmed", "status": status, "reason": reason, "message": "Resource programmed", "lastTransitionTime": "2026-01-01T00:00:00Z"},
    ]}});
    gateways(client, ns)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

async fn gateway_names(client: &Client, ns: &str) -> Vec<String> {
    let mut names: Vec<String> = gateways(client, ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|g| g.metadata.name.unwrap())
        .collect();
    names.sort();
    names
}

async fn namespace_labels(client: &Client, ns: &str) -> std::collections::BTreeMap<String, String> {
    Api::<Namespace>::all(client.clone())
        .get(ns)
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap_or_default()
}

#[tokio::test]
async fn waypoint_apply_creates_istios_gateway_idempotently_and_enrolls() {
    let c = cluster().await;
    let k = Some(c.kubeconfig.as_path());
    make_namespace(&c.client, "demo").await;

    // No Gateway API yet: Istio's error, nothing else touched.
    let out = run(k, &["waypoint", "apply", "-n", "demo"]).await;
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("missing Kubernetes Gateway CRDs need to be installed"),
        "{}",
        stderr(&out)
    );
    install_crds(&c.client).await;

    let out = run(k, &["waypoint", "apply", "-n", "demo"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "✅ waypoint demo/waypoint applied\n");
    let api = gateways(&c.client, "demo");
    let gw = api.get("waypoint").await.unwrap();
    assert_eq!(
        gw.metadata.labels.clone().unwrap_or_default(),
        [("istio.io/waypoint-for".to_string(), "service".to_string())].into()
    );
    assert_eq!(gw.data["spec"]["gatewayClassName"], "istio-waypoint");
    let listeners = gw.data["spec"]["listeners"].as_array().unwrap();
    assert_eq!(listeners.len(), 1, "{listeners:?}");
    assert_eq!(listeners[0]["name"], "mesh");
    assert_eq!(listeners[0]["port"], 15008);
    assert_eq!(listeners[0]["protocol"], "HBONE");
    assert_eq!(gateway_names(&c.client, "demo").await, ["waypoint"]);
    assert!(
        !namespace_labels(&c.client, "demo")
            .await
            .contains_key("istio.io/use-waypoint"),
        "no --enroll-namespace"
    );

    // Idempotent: the same object, unchanged.
    let out = run(k, &["waypoint", "apply", "-n", "demo"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "✅ waypoint demo/waypoint applied\n");
    let again = api.get("waypoint").await.unwrap();
    assert_eq!(again.metadata.uid, gw.metadata.uid);
    assert_eq!(again.metadata.generation, gw.metadata.generation);
    assert_eq!(again.data["spec"], gw.data["spec"]);
    assert_eq!(gateway_names(&c.client, "demo").await, ["waypoint"]);

    // --for and --enroll-namespace (the namespace is not ambient: a warning).
    let out = run(
        k,
        &[
            "waypoint",
            "apply",
            "-n",
            "demo",
            "--name",
            "w2",
            "--for",
            "workload",
            "--enroll-namespace",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "✅ waypoint demo/w2 applied\n✅ namespace demo labeled with \"istio.io/use-waypoint: w2\"\n"
    );
    assert!(
        stderr(&out).contains("namespace is not enrolled in ambient"),
        "{}",
        stderr(&out)
    );
    let w2 = api.get("w2").await.unwrap();
    assert_eq!(
        w2.metadata.labels.unwrap()["istio.io/waypoint-for"],
        "workload"
    );
    assert_eq!(
        namespace_labels(&c.client, "demo").await["istio.io/use-waypoint"],
        "w2"
    );

    // Another waypoint for an enrolled namespace: Istio's warning, nothing applied...
    let enroll_w3 = [
        "waypoint",
        "apply",
        "-n",
        "demo",
        "--name",
        "w3",
        "--enroll-namespace",
    ];
    let out = run(k, &enroll_w3).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("namespace (demo) already has an enrolled Waypoint (w2)"),
        "{}",
        stderr(&out)
    );
    assert_eq!(gateway_names(&c.client, "demo").await, ["w2", "waypoint"]);
    assert_eq!(
        namespace_labels(&c.client, "demo").await["istio.io/use-waypoint"],
        "w2"
    );
    // ... unless --overwrite. An ambient namespace gets no warning.
    let patch = serde_json::json!({"metadata": {"labels": {"istio.io/dataplane-mode": "ambient"}}});
    Api::<Namespace>::all(c.client.clone())
        .patch("demo", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let out = run(k, &with(&enroll_w3, &["--overwrite"])).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("Warning"), "{}", stderr(&out));
    assert_eq!(
        namespace_labels(&c.client, "demo").await["istio.io/use-waypoint"],
        "w3"
    );
    assert_eq!(
        gateway_names(&c.client, "demo").await,
        ["w2", "w3", "waypoint"]
    );

    // -o json prints the applied object; --revision labels it.
    let out = run(
        k,
        &[
            "-o", "json", "waypoint", "apply", "-n", "demo", "--name", "w4", "--for", "all", "-r",
            "canary",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["kind"], "Gateway");
    assert_eq!(printed["metadata"]["name"], "w4");
    assert_eq!(
        printed["metadata"]["labels"]["istio.io/waypoint-for"],
        "all"
    );
    assert_eq!(printed["metadata"]["labels"]["istio.io/rev"], "canary");
    assert!(printed["metadata"]["uid"].is_string(), "the server's copy");

    // The kubeconfig's namespace when -n is not given; Istio's checks.
    let out = run(k, &["waypoint", "apply"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "✅ waypoint default/waypoint applied\n");
    assert_eq!(gateway_names(&c.client, "default").await, ["waypoint"]);
    let out = run(k, &["waypoint", "apply", "-n", "demo", "--name", "none"]).await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("'none' is a reserved value"));
    let out = run(k, &["waypoint", "apply", "-n", "nowhere"]).await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("namespace: nowhere not found"));
    let out = run(k, &["waypoint", "apply", "-n", "demo", "--for", "pods"]).await;
    assert!(!out.status.success());
    // Another class's Gateway of that name is not taken over.
    make_other_gateway(&c.client, "demo", "ingress").await;
    let out = run(k, &["waypoint", "apply", "-n", "demo", "--name", "ingress"]).await;
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("Gateway demo/ingress exists and is not a waypoint"),
        "{}",
        stderr(&out)
    );
    let ingress = api.get("ingress").await.unwrap();
    assert_eq!(ingress.data["spec"]["gatewayClassName"], "istio");
    assert!(ingress.metadata.labels.unwrap_or_default().is_empty());
    api.delete("ingress", &Default::default()).await.unwrap();
    assert_eq!(
        gateway_names(&c.client, "demo").await,
        ["w2", "w3", "w4", "waypoint"]
    );

    // generate prints the same Gateway and writes nothing.
    let out = run(
        None,
        &["waypoint", "generate", "-n", "demo", "--name", "w5"],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let generated: serde_json::Value = serde_yaml::from_slice(&out.stdout).unwrap();
    assert_eq!(
        generated,
        serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": "w5", "namespace": "demo", "labels": {"istio.io/waypoint-for": "service"}},
            "spec": {"gatewayClassName": "istio-waypoint", "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]},
        })
    );
    assert!(api.get_opt("w5").await.unwrap().is_none());
}

#[tokio::test]
async fn waypoint_list_shows_istios_columns() {
    let c = cluster().await;
    let k = Some(c.kubeconfig.as_path());
    install_crds(&c.client).await;
    make_namespace(&c.client, "demo").await;
    make_namespace(&c.client, "other").await;
    make_namespace(&c.client, "empty").await;
    for args in [
        &["-n", "demo"][..],
        &[
            "-n", "demo", "--name", "rev", "-r", "canary", "--for", "all",
        ],
        &["-n", "other", "--name", "east"],
    ] {
        let out = run(k, &with(&["waypoint", "apply"], args)).await;
        assert!(out.status.success(), "{}", stderr(&out));
    }
    make_other_gateway(&c.client, "demo", "ingress").await;
    set_programmed(&c.client, "demo", "waypoint", "True").await;
    set_programmed(&c.client, "other", "east", "False").await;

    let out = run(k, &["waypoint", "list", "-n", "demo"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    // `rev` has no controller's status yet: the CRD's default, Unknown.
    assert_eq!(
        stdout(&out),
        "NAME         REVISION     TRAFFIC TYPE     PROGRAMMED\n\
         rev          canary       all              Unknown\n\
         waypoint     default      service          True\n"
    );
    let out = run(k, &["waypoint", "list", "-A"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "NAMESPACE     NAME         REVISION     TRAFFIC TYPE     PROGRAMMED\n\
         demo          rev          canary       all              Unknown\n\
         demo          waypoint     default      service          True\n\
         other         east         default      service          False\n"
    );
    let out = run(k, &["waypoint", "list", "--all-namespaces", "-n", "demo"]).await;
    assert!(!out.status.success(), "-A and -n conflict");
    let out = run(k, &["waypoint", "list", "-n", "empty"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "No waypoints found.\n");

    let out = run(k, &["waypoint", "list", "-n", "demo", "-o", "json"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["rev", "waypoint"], "no ingress: {listed}");
    let out = run(k, &["waypoint", "list", "-A", "-o", "yaml"]).await;
    let listed: serde_json::Value = serde_yaml::from_slice(&out.stdout).unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(3));
}

#[tokio::test]
async fn waypoint_delete_only_deletes_waypoints() {
    let c = cluster().await;
    let k = Some(c.kubeconfig.as_path());
    install_crds(&c.client).await;
    make_namespace(&c.client, "demo").await;
    make_namespace(&c.client, "other").await;
    for args in [
        &["-n", "demo", "--name", "a"][..],
        &["-n", "demo", "--name", "b"],
        &["-n", "demo", "--name", "c", "-r", "canary"],
        &["-n", "demo", "--name", "d"],
        &["-n", "other", "--name", "a"],
    ] {
        let out = run(k, &with(&["waypoint", "apply"], args)).await;
        assert!(out.status.success(), "{}", stderr(&out));
    }
    make_other_gateway(&c.client, "demo", "ingress").await;
    let all = ["a", "b", "c", "d", "ingress"];

    // Another class's Gateway, or a missing one: refused, by name, nothing deleted.
    let out = run(k, &["waypoint", "delete", "-n", "demo", "a", "ingress"]).await;
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("Gateway demo/ingress is not a waypoint"),
        "{}",
        stderr(&out)
    );
    let out = run(k, &["waypoint", "delete", "-n", "demo", "a", "missing"]).await;
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("waypoint demo/missing not found"),
        "{}",
        stderr(&out)
    );
    assert_eq!(gateway_names(&c.client, "demo").await, all);
    // Istio's argument checks.
    let out = run(k, &["waypoint", "delete", "-n", "demo"]).await;
    assert!(!out.status.success());
    let out = run(k, &["waypoint", "delete", "-n", "demo", "--all", "a"]).await;
    assert!(!out.status.success());
    assert_eq!(gateway_names(&c.client, "demo").await, all);

    let out = run(k, &["waypoint", "delete", "-n", "demo", "a"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "waypoint demo/a deleted\n");
    assert_eq!(
        gateway_names(&c.client, "demo").await,
        ["b", "c", "d", "ingress"]
    );
    assert_eq!(gateway_names(&c.client, "other").await, ["a"]);

    let out = run(k, &["waypoint", "delete", "-n", "demo", "-r", "canary"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "waypoint demo/c deleted\n");
    assert_eq!(
        gateway_names(&c.client, "demo").await,
        ["b", "d", "ingress"]
    );

    let out = run(k, &["waypoint", "delete", "-n", "demo", "--all"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "waypoint demo/b deleted\nwaypoint demo/d deleted\n"
    );
    assert_eq!(gateway_names(&c.client, "demo").await, ["ingress"]);
    assert_eq!(gateway_names(&c.client, "other").await, ["a"]);
    let out = run(k, &["waypoint", "delete", "-n", "demo", "--all"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "No waypoints found.\n");

    let out = run(k, &["-o", "json", "waypoint", "delete", "-n", "other", "a"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let deleted: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        deleted,
        serde_json::json!([{"namespace": "other", "name": "a"}])
    );
    assert!(gateway_names(&c.client, "other").await.is_empty());
}

#[tokio::test]
async fn waypoint_apply_and_status_wait_for_programmed() {
    let c = cluster().await;
    let k = Some(c.kubeconfig.as_path());
    install_crds(&c.client).await;
    make_namespace(&c.client, "demo").await;

    // Nobody programs it: a clear error after the timeout, with its conditions.
    let started = std::time::Instant::now();
    let out = run(
        k,
        &[
            "waypoint",
            "apply",
            "-n",
            "demo",
            "--wait",
            "--timeout",
            "2s",
        ],
    )
    .await;
    assert!(!out.status.success());
    assert!(started.elapsed() >= std::time::Duration::from_secs(2));
    let err = stderr(&out);
    assert!(
        err.contains(
            "timed out while waiting for waypoint demo/waypoint to be Programmed after 2s"
        ) && err.contains("Programmed=Unknown (Pending: Waiting for controller)"),
        "{err}"
    );
    assert_eq!(stdout(&out), "✅ waypoint demo/waypoint applied\n");

    // status: the conditions as they are; with --wait, the same timeout error.
    let out = run(k, &["waypoint", "status", "-n", "demo"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "NAME         STATUS      TYPE           REASON      MESSAGE\n\
         waypoint     Unknown     Accepted       Pending     Waiting for controller\n\
         waypoint     Unknown     Programmed     Pending     Waiting for controller\n"
    );
    let out = run(
        k,
        &[
            "waypoint",
            "status",
            "-n",
            "demo",
            "--wait",
            "--waypoint-timeout",
            "1s",
        ],
    )
    .await;
    assert!(!out.status.success());
    assert!(
        stderr(&out)
            .contains("timed out while retrieving status for waypoint demo/waypoint after 1s")
            && stderr(&out).contains("Programmed=Unknown (Pending: Waiting for controller)"),
        "{}",
        stderr(&out)
    );

    // The control plane programs w2 a while after it appears: apply --wait returns then.
    let client = c.client.clone();
    let controller = tokio::spawn(async move {
        let api = gateways(&client, "demo");
        while api.get_opt("w2").await.unwrap().is_none() {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        set_programmed(&client, "demo", "w2", "True").await;
    });
    let started = std::time::Instant::now();
    let out = run(
        k,
        &[
            "waypoint",
            "apply",
            "-n",
            "demo",
            "--name",
            "w2",
            "-w",
            "--timeout",
            "30s",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(1500),
        "it waited"
    );
    assert_eq!(
        stdout(&out),
        "✅ waypoint demo/w2 applied\n✅ waypoint demo/w2 is ready!\n"
    );
    controller.await.unwrap();

    let out = run(
        k,
        &["waypoint", "status", "-n", "demo", "--name", "w2", "--wait"],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "NAME     STATUS     TYPE           REASON         MESSAGE\n\
         w2       True       Accepted       Accepted       Resource accepted\n\
         w2       True       Programmed     Programmed     Resource programmed\n"
    );
    let out = run(
        k,
        &[
            "-o", "json", "waypoint", "status", "-n", "demo", "--name", "w2",
        ],
    )
    .await;
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report[0]["programmed"], true);
    assert_eq!(report[0]["conditions"][1]["type"], "Programmed");
    let out = run(
        k,
        &["waypoint", "status", "-n", "demo", "--name", "missing"],
    )
    .await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("waypoint demo/missing not found"));
}
