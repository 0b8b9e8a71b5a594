//! How a container of a pod is launched: its command, args and environment from the
//! spec, its root and mounts (for pods that get one), its identity; and the pod as
//! the ServiceAccount admission completes it (`kube-api-access`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::sandbox::Sandbox;
use super::NodeInfo;
use super::{container_env, runtime};
use crate::api::Api;
use crate::images;

/// The container's process: the image's program, its args and its environment as
/// kubelet builds them (`CreateContainerConfigError` when they cannot be resolved).
pub(super) fn container_command(
    api: &Api,
    node: &NodeInfo,
    sandbox: &Sandbox,
    pod: &Value,
    container: &Value,
) -> Result<Command> {
    let words = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect()
    };
    let host_ips = [node.host_ip.clone()];
    let rt = container_env::PodRuntime {
        pod_ips: &sandbox.ips,
        host_ips: &host_ips,
        node_cpu_millis: node_cpu_millis(),
        node_memory_bytes: node_memory_bytes(),
    };
    let env =
        container_env::resolve(api, pod, container, &rt).context("CreateContainerConfigError")?;
    let command = container_env::expand_args(&words(&container["command"]), &env);
    let args = container_env::expand_args(&words(&container["args"]), &env);
    // A container is a process tree (`sh -c` forks its commands): its own process
    // group (ChildGuard::spawn_group), stopped whole, as a runtime stops its cgroup.
    let image = container["image"].as_str().unwrap_or_default();
    // The built image's own root filesystem (make image), else the workspace's binaries.
    let image_root = images::built_rootfs_for(image)?;
    let (program, rootfs) = match image_root {
        Some(image_root) => {
            let program = images::program_in_image(&image_root, image, command.first())?;
            let rootfs = image_container_rootfs(sandbox, container, image_root)?;
            (program, Some(rootfs))
        }
        None => {
            let program = images::program_for(image, command.first().map(String::as_str))?;
            let rootfs = container_rootfs(sandbox, pod, container, image, &program)?;
            // In its own root the image's binaries are in /usr/local/bin.
            let program = match (&rootfs, program.is_absolute()) {
                (Some(_), true) => {
                    PathBuf::from("/usr/local/bin").join(program.file_name().unwrap_or_default())
                }
                _ => program,
            };
            (program, rootfs)
        }
    };
    // Without a command, the image's entrypoint gets the args.
    let argv: Vec<String> = std::iter::once(program.to_string_lossy().into_owned())
        .chain(command.iter().skip(1).cloned())
        .chain(args)
        .collect();
    let identity =
        if pod["spec"]["securityContext"].is_null() && container["securityContext"].is_null() {
            runtime::Identity::default()
        } else {
            runtime::Identity::of(pod, container).context("CreateContainerConfigError")?
        };
    let mut outer = Command::new("ip");
    outer.args(["netns", "exec", sandbox.netns_name()]);
    let mut cmd = runtime::command(outer, rootfs.as_ref(), &identity, &argv)?;
    // An image's root: its config's PATH, as a runtime sets it.
    let path = match rootfs.as_ref().and_then(|fs| fs.image.as_ref()) {
        Some(_) => images::IMAGE_PATH.join(":").into(),
        None => std::env::var_os("PATH").unwrap_or_default(),
    };
    cmd.env_clear()
        .env("PATH", path)
        .env(
            "HOSTNAME",
            pod["metadata"]["name"].as_str().unwrap_or_default(),
        )
        // kubelet's service variables for the API server, which `env` may override.
        .env("KUBERNETES_SERVICE_HOST", node.api_addr.ip().to_string())
        .env("KUBERNETES_SERVICE_PORT", node.api_addr.port().to_string())
        .envs(env)
        .env(test_support::owner::OWNER_ENV, &node.owner);
    Ok(cmd)
}

/// Where kubelet mounts a pod's API credentials.
const API_ACCESS_MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The pod as the ServiceAccount admission plugin completes it: a `kube-api-access`
/// projected volume (token, `kube-root-ca.crt`, namespace) mounted read-only in every
/// container, unless `automountServiceAccountToken` is false on the pod (else on its
/// ServiceAccount). Only for pods in their own root ([`own_root`]): the others see
/// the host's files anyway.
pub(super) fn with_api_access(api: &Api, pod: &Value) -> Value {
    let mut pod = pod.clone();
    let namespace = pod["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default")
        .to_owned();
    let sa = pod["spec"]["serviceAccountName"]
        .as_str()
        .unwrap_or("default")
        .to_owned();
    let automount = match pod["spec"]["automountServiceAccountToken"].as_bool() {
        Some(set) => set,
        None => api
            .get_opt(&format!(
                "/api/v1/namespaces/{namespace}/serviceaccounts/{sa}"
            ))
            .ok()
            .flatten()
            .and_then(|sa| sa["automountServiceAccountToken"].as_bool())
            .unwrap_or(true),
    };
    if !automount || !own_root(&pod) {
        return pod;
    }
    let volume = "kube-api-access";
    if !pod["spec"]["volumes"].is_array() {
        pod["spec"]["volumes"] = json!([]);
    }
    let Some(volumes) = pod["spec"]["volumes"].as_array_mut() else {
        return pod;
    };
    volumes.push(json!({"name": volume, "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
    ]}}));
    for c in pod["spec"]["containers"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        let mounts = c["volumeMounts"].as_array().cloned().unwrap_or_default();
        if mounts.iter().all(|m| m["mountPath"] != API_ACCESS_MOUNT) {
            let mut mounts = mounts;
            mounts.push(json!({"name": volume, "mountPath": API_ACCESS_MOUNT, "readOnly": true}));
            c["volumeMounts"] = json!(mounts);
        }
    }
    pod
}

/// Whether the pod's containers run in roots of their own: pods with volumes, and
/// pods of distroless images. The e2e suite's other pods share the host's files.
fn own_root(pod: &Value) -> bool {
    let has_volumes = pod["spec"]["volumes"]
        .as_array()
        .is_some_and(|v| !v.is_empty());
    let distroless = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| {
            images::image(c["image"].as_str().unwrap_or_default()).is_ok_and(|i| !i.distro_tools)
        });
    has_volumes || distroless
}

/// The container's own root: for a distroless image (nothing of the host's but its
/// libraries), and for any pod with volumes (mounted at their paths in it). Other
/// test pods share the host's filesystem view, as their tests need.
fn container_rootfs(
    sandbox: &Sandbox,
    pod: &Value,
    container: &Value,
    image: &str,
    program: &Path,
) -> Result<Option<runtime::Rootfs>> {
    let distroless = !images::image(image)?.distro_tools;
    let has_volumes = pod["spec"]["volumes"]
        .as_array()
        .is_some_and(|v| !v.is_empty());
    if !distroless && !has_volumes {
        return Ok(None);
    }
    let name = container["name"].as_str().unwrap_or_default();
    let root = sandbox.dir.join("containers").join(name);
    std::fs::create_dir_all(&root)?;
    let mut binaries = images::binaries_of(image)?;
    if program.is_absolute() && !binaries.iter().any(|b| b == program) {
        binaries.push(program.to_owned());
    }
    Ok(Some(runtime::Rootfs {
        root,
        image: None,
        binaries,
        mounts: sandbox
            .volumes
            .mounts(container)
            .context("CreateContainerConfigError")?,
        read_only_root: container["securityContext"]["readOnlyRootFilesystem"] == true,
        working_dir: container["workingDir"].as_str().map(str::to_owned),
    }))
}

/// The root of a container of the built image: its unpacked layers under the pod's
/// volumes.
fn image_container_rootfs(
    sandbox: &Sandbox,
    container: &Value,
    image_root: PathBuf,
) -> Result<runtime::Rootfs> {
    let name = container["name"].as_str().unwrap_or_default();
    let root = sandbox.dir.join("containers").join(name);
    std::fs::create_dir_all(&root)?;
    Ok(runtime::Rootfs {
        root,
        image: Some(image_root),
        binaries: Vec::new(),
        mounts: sandbox
            .volumes
            .mounts(container)
            .context("CreateContainerConfigError")?,
        read_only_root: container["securityContext"]["readOnlyRootFilesystem"] == true,
        working_dir: container["workingDir"].as_str().map(str::to_owned),
    })
}

fn node_cpu_millis() -> u64 {
    std::thread::available_parallelism().map_or(1, |n| n.get()) as u64 * 1000
}

fn node_memory_bytes() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}
