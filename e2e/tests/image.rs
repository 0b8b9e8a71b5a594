//! The image `make image` builds (scripts/image/build.sh, docs/image.md), checked as a
//! user would run it: its contents match the Dockerfile's and the charts', its build
//! is reproducible, and `podman` runs each binary as the charts run it (user,
//! capabilities, read-only root) with the node agent's tools working against a
//! pod-like network namespace.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{bail, Context, Result};
use local_cluster::charts::{containers, install_manifests};
use local_cluster::images::{image_dir, BuiltImage, IMAGES};
use serde_json::Value;
use test_support::netns::Netns;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A bash array of scripts/image/contents.sh.
fn contents(array: &str) -> Vec<String> {
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            ". scripts/image/contents.sh && printf '%s\\n' \"${{{array}[@]}}\""
        ))
        .current_dir(repo_root())
        .output()
        .expect("bash");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn sorted(v: impl IntoIterator<Item = String>) -> Vec<String> {
    v.into_iter().collect::<BTreeSet<_>>().into_iter().collect()
}

/// The Dockerfile builds the same image: the same crates, the same binaries copied,
/// and its root filesystem from the same script (so the same packages); the local
/// cluster's image table lists the same binaries.
#[test]
fn dockerfile_and_make_image_hold_the_same_binaries_and_packages() {
    let dockerfile = std::fs::read_to_string(repo_root().join("Dockerfile")).unwrap();
    let binaries = sorted(contents("BINARIES"));
    let crates = sorted(contents("CRATES"));
    assert!(!binaries.is_empty() && !crates.is_empty());

    // `cargo build ... -p a -p b`: the crates.
    let cargo_build = dockerfile
        .split_once("cargo build")
        .and_then(|(_, rest)| rest.split_once("&&"))
        .expect("the Dockerfile runs cargo build ... &&")
        .0;
    let built: Vec<String> = cargo_build
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|w| w[0] == "-p")
        .map(|w| w[1].to_owned())
        .collect();
    assert_eq!(
        sorted(built),
        crates,
        "the Dockerfile's cargo build -p list"
    );
    // `cp target/release/x ... /out/`: the binaries.
    let copied: Vec<String> = dockerfile
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("target/release/"))
        .map(str::to_owned)
        .collect();
    assert_eq!(
        sorted(copied),
        binaries,
        "the binaries the Dockerfile copies"
    );
    // The packages: the same script, and no package installed any other way.
    assert!(
        dockerfile.contains("scripts/image/rootfs.sh"),
        "the Dockerfile assembles its root with scripts/image/rootfs.sh"
    );
    for line in dockerfile
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
    {
        if line.contains("apt-get install") || line.contains("apt install") {
            // A build tool of the rootfs stage (strip), never a package of the image.
            assert!(
                line.trim_end().ends_with("binutils \\"),
                "the Dockerfile installs: {line}"
            );
        }
    }
    let (_, last_stage) = dockerfile.rsplit_once("\nFROM ").unwrap();
    assert!(
        last_stage.starts_with("scratch") && !last_stage.contains("\nRUN"),
        "the final image is the assembled root alone: {last_stage}"
    );
    // The local cluster's table.
    let charts_image = &IMAGES[0];
    assert_eq!(charts_image.repository, "ghcr.io/ambient-rs/ambient-rs");
    assert_eq!(
        sorted(charts_image.binaries.iter().map(|b| b.to_string())),
        binaries,
        "local-cluster/src/images.rs lists the image's binaries"
    );
}

/// Each chart's default image is `ghcr.io/ambient-rs/ambient-rs:<workspace version>`:
/// Chart.yaml's version and appVersion are the workspace's, image.tag is empty (so
/// appVersion), and the render says so; a packaged chart (MESH_CHARTS=packaged)
/// pins the built image's digest.
#[test]
fn each_chart_defaults_to_the_workspace_version() {
    let version = env!("CARGO_PKG_VERSION");
    for chart in ["cni", "ztunnel", "istiod-lite"] {
        let dir = repo_root().join("manifests/charts").join(chart);
        let meta: Value =
            serde_yaml::from_str(&std::fs::read_to_string(dir.join("Chart.yaml")).unwrap())
                .unwrap();
        assert_eq!(meta["version"], version, "{chart} Chart.yaml version");
        assert_eq!(meta["appVersion"], version, "{chart} Chart.yaml appVersion");
        let values: Value =
            serde_yaml::from_str(&std::fs::read_to_string(dir.join("values.yaml")).unwrap())
                .unwrap();
        assert_eq!(
            values["image"]["tag"], "",
            "{chart}: image.tag defaults to appVersion"
        );
        assert_eq!(values["image"]["hub"], "ghcr.io/ambient-rs");
        assert_eq!(values["image"]["name"], "ambient-rs");
    }
    // The CRD chart has no image, but is released with the others.
    let base: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo_root().join("manifests/charts/base/Chart.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(base["version"], version, "base Chart.yaml version");
    assert_eq!(base["appVersion"], version, "base Chart.yaml appVersion");
    if !test_support::prerequisite(
        Command::new("helm")
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "helm on PATH (scripts/install-chart-tools.sh)",
    ) {
        return;
    }
    let rendered = containers(&install_manifests(&[]).unwrap()).unwrap();
    assert_eq!(rendered.len(), 3, "{rendered:#?}");
    let packaged = std::env::var("MESH_CHARTS").as_deref() == Ok("packaged");
    for c in rendered {
        let want = format!("ghcr.io/ambient-rs/ambient-rs:{version}");
        match c.image.split_once('@') {
            Some((name, digest)) => {
                assert!(
                    packaged,
                    "{}: a digest in the source chart: {}",
                    c.workload, c.image
                );
                assert_eq!(name, want, "{}", c.workload);
                let built = BuiltImage::open(&image_dir()).unwrap().expect("make image");
                assert_eq!(digest, built.digest, "{} pins the built image", c.workload);
            }
            None => {
                assert!(
                    !packaged,
                    "{}: the packaged chart pins no digest",
                    c.workload
                );
                assert_eq!(c.image, want, "{}", c.workload);
            }
        }
    }
}

/// `make image`'s image, or a skip (a failure under CI) saying to build it.
fn built_image() -> Option<BuiltImage> {
    let image = BuiltImage::open(&image_dir()).unwrap();
    test_support::prerequisite(
        image.is_some(),
        &format!("the image in {}: run make image", image_dir().display()),
    )
    .then(|| image.unwrap())
}

fn read_env(dir: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(dir.join("image.env"))
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// A second build from the same inputs (the image's own binaries, the same Debian
/// packages, the same timestamp and revision) gives the same manifest digest, and so
/// the same layer and config bytes.
#[test]
fn a_second_build_from_the_same_inputs_has_the_same_digest() {
    let Some(image) = built_image() else { return };
    let env = read_env(&image.dir);
    let get = |k: &str| env.iter().find(|(n, _)| n == k).unwrap().1.clone();
    let work = tempfile::Builder::new()
        .prefix("zte-image-")
        .tempdir()
        .unwrap();
    // The inputs: the binaries as the image holds them (stripping is idempotent) and
    // the packages apt chose, offline.
    let rootfs = image.rootfs().unwrap();
    let bin = work.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    for b in contents("BINARIES") {
        std::fs::copy(rootfs.join("usr/local/bin").join(&b), bin.join(&b)).unwrap();
    }
    let out = work.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let copied = Command::new("cp")
        .arg("-a")
        .arg(image.dir.join("apt"))
        .arg(out.join("apt"))
        .status()
        .unwrap();
    assert!(copied.success(), "copying the apt cache");
    let build = Command::new(repo_root().join("scripts/image/build.sh"))
        .env("IMAGE_OUT", &out)
        .env("IMAGE_BIN_DIR", &bin)
        .env("IMAGE_APT_OFFLINE", "1")
        .env("IMAGE_REVISION", get("IMAGE_REVISION"))
        .env("SOURCE_DATE_EPOCH", get("IMAGE_SOURCE_DATE_EPOCH"))
        .output()
        .unwrap();
    assert!(
        build.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&build.stdout),
        String::from_utf8_lossy(&build.stderr)
    );
    let again = BuiltImage::open(&out).unwrap().unwrap();
    assert_eq!(
        std::fs::read_to_string(out.join("packages.tsv")).unwrap(),
        std::fs::read_to_string(image.dir.join("packages.tsv")).unwrap()
    );
    assert_eq!(again.digest, image.digest, "two builds, one digest");
    assert_eq!(
        std::fs::read(again.archive()).unwrap(),
        std::fs::read(image.archive()).unwrap(),
        "the OCI archives are the same bytes"
    );
}

/// Podman with the settings that work on these machines (shared/README.md: vfs,
/// runc, cgroupfs, no default ulimits) and a storage of its own, removed at the end.
struct Podman {
    dir: tempfile::TempDir,
}

impl Podman {
    fn new() -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("zte-podman-").tempdir()?;
        std::fs::write(
            dir.path().join("containers.conf"),
            "[containers]\ndefault_ulimits = []\n",
        )?;
        Ok(Podman { dir })
    }

    fn cmd(&self) -> Command {
        let mut cmd = Command::new("podman");
        cmd.env("CONTAINERS_CONF", self.dir.path().join("containers.conf"))
            .arg("--root")
            .arg(self.dir.path().join("root"))
            .arg("--runroot")
            .arg(self.dir.path().join("run"))
            .args([
                "--storage-driver",
                "vfs",
                "--runtime",
                "/usr/sbin/runc",
                "--cgroup-manager",
                "cgroupfs",
            ]);
        cmd
    }

    fn run(&self, args: &[String]) -> Result<Output> {
        let out = self.cmd().args(args).output().context("running podman")?;
        Ok(out)
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        // Containers run with --rm; the images and their storage go with the dir.
        let _ = self.cmd().args(["rmi", "--all", "--force"]).output();
    }
}

/// `podman run` flags for a rendered container's securityContext (the pod's fsGroup
/// too), as a kubelet asks the runtime for them.
fn security_flags(pod: &Value, container: &Value) -> Vec<String> {
    let sc = &container["securityContext"];
    let mut flags = vec!["--read-only".to_owned()];
    assert_eq!(sc["readOnlyRootFilesystem"], true, "{container}");
    let uid = sc["runAsUser"].as_u64().expect("runAsUser");
    let gid = sc["runAsGroup"].as_u64().unwrap_or(0);
    flags.push(format!("--user={uid}:{gid}"));
    if let Some(g) = pod["securityContext"]["fsGroup"].as_u64() {
        flags.push(format!("--group-add={g}"));
    }
    let drop: Vec<&str> = sc["capabilities"]["drop"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        drop,
        ["ALL"],
        "the charts drop every capability: {container}"
    );
    flags.push("--cap-drop=all".into());
    for cap in sc["capabilities"]["add"].as_array().into_iter().flatten() {
        flags.push(format!("--cap-add={}", cap.as_str().unwrap()));
    }
    if sc["allowPrivilegeEscalation"] == false {
        flags.push("--security-opt=no-new-privileges".into());
    }
    flags
}

struct Workload {
    pod: Value,
    container: Value,
}

/// The default render's container of `kind/name`.
fn workload(objects: &[Value], kind: &str, name: &str) -> Workload {
    let w = objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind}/{name} in the render"));
    let pod = w["spec"]["template"]["spec"].clone();
    let container = pod["containers"][0].clone();
    Workload { pod, container }
}

fn ok(out: &Output, what: &str) -> Result<String> {
    if !out.status.success() {
        bail!(
            "{what}: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `podman load` of the archive, then each binary's `--version` and `--help` as its
/// chart runs it, and the node agent's tools (`iptables-save` of both backends,
/// `ipset list`, a restore) inside the image against a pod-like network namespace the
/// test made, as the agent's securityContext allows them; without NET_ADMIN they fail.
#[test]
fn podman_runs_the_image_as_the_charts_run_it() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let Some(image) = built_image() else { return };
    if !test_support::prerequisite(
        Command::new("podman")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "podman (scripts/setup.sh installs it)",
    ) {
        return;
    }
    let podman = Podman::new().unwrap();
    let load = podman
        .run(&[
            "load".into(),
            "--input".into(),
            image.archive().display().to_string(),
        ])
        .unwrap();
    let loaded = ok(&load, "podman load").unwrap();
    let name = format!("{}:{}", image.repository, image.version);
    assert!(
        loaded.contains(&name),
        "podman load names the image: {loaded}"
    );
    let inspect = ok(
        &podman
            .run(&["image".into(), "inspect".into(), name.clone()])
            .unwrap(),
        "podman image inspect",
    )
    .unwrap();
    let inspect: Value = serde_json::from_str(&inspect).unwrap();
    let labels = &inspect[0]["Labels"];
    assert_eq!(
        labels["org.opencontainers.image.version"],
        image.version.as_str()
    );
    assert_eq!(
        labels["org.opencontainers.image.revision"],
        image.revision.as_str()
    );
    assert_eq!(inspect[0]["Digest"], image.digest.as_str(), "{inspect}");

    let objects = install_manifests(&[]).unwrap();
    let version = env!("CARGO_PKG_VERSION");
    let runs = [
        (workload(&objects, "Deployment", "istiod"), "istiod-lite"),
        (workload(&objects, "DaemonSet", "ztunnel"), "ztunnel"),
        (
            workload(&objects, "DaemonSet", "istio-cni-node"),
            "cni-agent",
        ),
    ];
    for (w, binary) in &runs {
        let command = w.container["command"][0].as_str().unwrap();
        assert_eq!(command, *binary, "{}", w.container["name"]);
        for flag in ["--version", "--help"] {
            let mut args: Vec<String> = vec!["run".into(), "--rm".into(), "--network=none".into()];
            args.extend(security_flags(&w.pod, &w.container));
            args.extend([name.clone(), command.to_owned(), flag.to_owned()]);
            let out = ok(&podman.run(&args).unwrap(), &format!("podman {args:?}")).unwrap();
            if flag == "--version" {
                assert_eq!(out.trim(), format!("{binary} {version}"), "{args:?}");
            } else {
                assert!(out.contains("Usage:"), "{args:?}: {out}");
            }
        }
    }
    // The plugin binary the agent copies to the node, and istioctl-lite, run too.
    for binary in ["istio-cni", "istioctl-lite"] {
        let args: Vec<String> = [
            "run",
            "--rm",
            "--network=none",
            "--read-only",
            "--cap-drop=all",
            &name,
            binary,
            "--version",
        ]
        .map(str::to_owned)
        .to_vec();
        let out = podman.run(&args).unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(text.contains(version), "{binary} --version: {text}");
    }
    // Nothing but the mesh's binaries and the agent's tools: no shell, no package manager.
    for absent in ["sh", "bash", "apt-get", "dpkg", "ip", "nft"] {
        let args: Vec<String> = ["run", "--rm", "--network=none", &name, absent]
            .map(str::to_owned)
            .to_vec();
        let out = podman.run(&args).unwrap();
        assert!(!out.status.success(), "{absent} is in the image");
    }

    // A pod's network namespace, with rules of both iptables backends and an ipset
    // made from the host, as the agent finds a node's.
    let pod_ns = Netns::new("img").unwrap();
    pod_ns
        .exec(&["iptables-nft", "-t", "nat", "-N", "ZTE_NFT_CHAIN"])
        .unwrap();
    pod_ns
        .exec(&["iptables-legacy", "-t", "mangle", "-N", "ZTE_LEGACY_CHAIN"])
        .unwrap();
    pod_ns
        .exec(&["ip6tables-nft", "-t", "nat", "-N", "ZTE_NFT6_CHAIN"])
        .unwrap();
    pod_ns
        .exec(&["ipset", "create", "zte-probes-v4", "hash:ip"])
        .unwrap();
    let agent = &runs[2].0;
    let in_pod = |tool: &[&str], security: Vec<String>| -> Result<String> {
        let mut args: Vec<String> = vec![
            "run".into(),
            "--rm".into(),
            "--interactive".into(),
            format!("--network=ns:{}", pod_ns.path().display()),
        ];
        args.extend(security);
        args.push(name.clone());
        args.extend(tool.iter().map(|s| s.to_string()));
        ok(&podman.run(&args)?, &format!("podman {args:?}"))
    };
    let agent_sc = || security_flags(&agent.pod, &agent.container);
    let saved = in_pod(&["iptables-save"], agent_sc()).unwrap();
    assert!(
        saved.contains(":ZTE_NFT_CHAIN"),
        "iptables-save (nft): {saved}"
    );
    let saved = in_pod(&["iptables-legacy-save"], agent_sc()).unwrap();
    assert!(
        saved.contains(":ZTE_LEGACY_CHAIN"),
        "iptables-legacy-save: {saved}"
    );
    let saved = in_pod(&["ip6tables-nft-save"], agent_sc()).unwrap();
    assert!(
        saved.contains(":ZTE_NFT6_CHAIN"),
        "ip6tables-nft-save: {saved}"
    );
    let sets = in_pod(&["ipset", "list", "-name"], agent_sc()).unwrap();
    assert_eq!(sets.trim(), "zte-probes-v4");
    // The agent's own write path: a restore, seen from the host.
    let restore = podman
        .cmd()
        .args(["run", "--rm", "--interactive"])
        .arg(format!("--network=ns:{}", pod_ns.path().display()))
        .args(agent_sc())
        .args([name.as_str(), "iptables-legacy-restore", "--noflush"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(b"*nat\n:ZTE_RESTORED - [0:0]\nCOMMIT\n")?;
            child.wait_with_output()
        })
        .unwrap();
    ok(&restore, "iptables-legacy-restore in the image").unwrap();
    let host_view = pod_ns
        .stdout(&["iptables-legacy-save", "-t", "nat"])
        .unwrap();
    assert!(host_view.contains(":ZTE_RESTORED"), "{host_view}");
    // The capabilities are the chart's and no more: without NET_ADMIN nothing works.
    let without: Vec<String> = agent_sc()
        .into_iter()
        .filter(|f| f != "--cap-add=NET_ADMIN")
        .collect();
    assert!(in_pod(&["iptables-legacy-save"], without.clone()).is_err());
    assert!(in_pod(&["ipset", "list"], without).is_err());
}
