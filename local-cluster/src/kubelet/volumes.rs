//! A pod's volumes as kubelet provides them: `hostPath` on the node's own tree,
//! `configMap` and `secret` written as files (with `items` and `defaultMode`),
//! `projected` service-account tokens (TokenRequest, bound to the pod, renewed at
//! 80 % of their lifetime), ConfigMaps, Secrets and the downward API's name and
//! namespace, and `emptyDir`. [`PodVolumes::mounts`] turns a container's
//! `volumeMounts` into the runtime's bind mounts.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use crate::api::Api;
use crate::kubelet::container_env::ObjectSource;
use crate::kubelet::projected::{write_atomically, write_token, ProjectedToken};
use crate::kubelet::runtime::Mount;

/// Host paths that are the machine's own on every node (the kernel's views, and the
/// namespaces and locks all nodes share); every other `hostPath` is under the node's
/// tree.
const SHARED_HOST_PATHS: &[&str] = &[
    "/proc",
    "/sys",
    "/dev",
    "/var/run/netns",
    "/run/netns",
    "/run/xtables.lock",
];

pub struct PodVolumes {
    /// Volume name → its files on the host (a directory, or a hostPath file).
    sources: BTreeMap<String, PathBuf>,
    /// Tokens to renew, with when.
    tokens: Vec<(ProjectedToken, SystemTime)>,
    /// The pod's `fsGroup`, and the volumes it owns (all but hostPaths).
    fs_group: Option<(u32, Vec<PathBuf>)>,
}

impl PodVolumes {
    /// Materializes every volume of `pod` under `dir`; `node_root` is the node's own
    /// filesystem tree. A missing ConfigMap or Secret that is not optional fails, as
    /// kubelet's `FailedMount`.
    pub fn prepare(api: &Api, node_root: &Path, pod: &Value, dir: &Path) -> Result<Self> {
        let fs_group = pod["spec"]["securityContext"]["fsGroup"]
            .as_u64()
            .map(u32::try_from)
            .transpose()
            .context("fsGroup")?;
        let mut volumes = PodVolumes {
            sources: BTreeMap::new(),
            tokens: Vec::new(),
            fs_group: fs_group.map(|gid| (gid, Vec::new())),
        };
        for v in pod["spec"]["volumes"].as_array().into_iter().flatten() {
            let name = v["name"].as_str().context("a volume without a name")?;
            let path = volumes
                .materialize(api, pod, v, &dir.join(name), node_root)
                .with_context(|| format!("MountVolume.SetUp failed for volume {name:?}"))?;
            if let (Some((_, owned)), false) = (&mut volumes.fs_group, v["hostPath"].is_object()) {
                owned.push(path.clone());
            }
            volumes.sources.insert(name.to_owned(), path);
        }
        volumes.apply_fs_group()?;
        Ok(volumes)
    }

    /// One volume's files on the host.
    fn materialize(
        &mut self,
        api: &Api,
        pod: &Value,
        v: &Value,
        path: &Path,
        node_root: &Path,
    ) -> Result<PathBuf> {
        let namespace = pod["metadata"]["namespace"].as_str().unwrap_or("default");
        if let Some(host) = v["hostPath"].as_object() {
            return host_path(node_root, host);
        }
        std::fs::create_dir_all(path)?;
        if v["emptyDir"].is_object() {
            // Nothing to write.
        } else if v["configMap"].is_object() {
            write_keys(
                api,
                namespace,
                "configmaps",
                &v["configMap"],
                path,
                mode(v, "configMap"),
            )?;
        } else if let Some(s) = v["secret"].as_object() {
            let mut reference = Value::Object(s.clone());
            reference["name"] = s.get("secretName").cloned().unwrap_or_default();
            write_keys(
                api,
                namespace,
                "secrets",
                &reference,
                path,
                mode(v, "secret"),
            )?;
        } else if v["projected"].is_object() {
            self.project(api, pod, &v["projected"], path)?;
        } else {
            bail!("this kubelet knows hostPath, configMap, secret, projected and emptyDir volumes");
        }
        Ok(path.to_owned())
    }

    /// The container's `volumeMounts` (with `subPath` and `readOnly`) as bind mounts.
    pub fn mounts(&self, container: &Value) -> Result<Vec<Mount>> {
        container["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| {
                let name = m["name"].as_str().unwrap_or_default();
                let mut source = self
                    .sources
                    .get(name)
                    .ok_or_else(|| anyhow!("volumeMount {name:?} names no volume of the pod"))?
                    .clone();
                if let Some(sub) = m["subPath"].as_str().filter(|s| !s.is_empty()) {
                    if sub.starts_with('/') || sub.split('/').any(|p| p == "..") {
                        bail!("subPath {sub:?} must be relative and stay inside the volume");
                    }
                    source = source.join(sub);
                }
                Ok(Mount {
                    source,
                    target: m["mountPath"].as_str().unwrap_or_default().to_owned(),
                    read_only: m["readOnly"] == true,
                })
            })
            .collect()
    }

    /// kubelet's volume ownership for `fsGroup`: the group owns every file and may
    /// read it (and write it in writable volumes); directories are setgid, so files
    /// made later belong to the group too.
    fn apply_fs_group(&self) -> Result<()> {
        let Some((gid, owned)) = &self.fs_group else {
            return Ok(());
        };
        for root in owned {
            set_group_ownership(root, *gid)?;
        }
        Ok(())
    }

    /// Renews the tokens that are due.
    pub fn refresh(&mut self, api: &Api) {
        let now = SystemTime::now();
        let mut renewed = false;
        for (token, at) in &mut self.tokens {
            if now >= *at {
                if let Ok(next) = write_token(api, token) {
                    *at = next;
                    renewed = true;
                }
            }
        }
        if renewed {
            let _ = self.apply_fs_group();
        }
    }

    fn project(&mut self, api: &Api, pod: &Value, projected: &Value, dir: &Path) -> Result<()> {
        let meta = &pod["metadata"];
        let namespace = meta["namespace"].as_str().unwrap_or("default");
        let default_mode = projected["defaultMode"].as_u64().unwrap_or(0o644) as u32;
        for source in projected["sources"].as_array().into_iter().flatten() {
            if let Some(t) = source["serviceAccountToken"].as_object() {
                let token = ProjectedToken {
                    namespace: namespace.to_owned(),
                    service_account: pod["spec"]["serviceAccountName"]
                        .as_str()
                        .unwrap_or("default")
                        .to_owned(),
                    // The API server's own audience when none is asked for.
                    audience: t
                        .get("audience")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                    expiration_secs: t
                        .get("expirationSeconds")
                        .and_then(Value::as_i64)
                        .unwrap_or(3607),
                    pod: (
                        meta["name"].as_str().unwrap_or_default().to_owned(),
                        meta["uid"].as_str().unwrap_or_default().to_owned(),
                    ),
                    path: dir.join(t.get("path").and_then(Value::as_str).unwrap_or("token")),
                };
                let at = write_token(api, &token)?;
                self.tokens.push((token, at));
            } else if source["configMap"].is_object() {
                write_keys(
                    api,
                    namespace,
                    "configmaps",
                    &source["configMap"],
                    dir,
                    default_mode,
                )?;
            } else if source["secret"].is_object() {
                write_keys(
                    api,
                    namespace,
                    "secrets",
                    &source["secret"],
                    dir,
                    default_mode,
                )?;
            } else if let Some(items) = source["downwardAPI"]["items"].as_array() {
                for item in items {
                    let field = item["fieldRef"]["fieldPath"].as_str().unwrap_or_default();
                    let value = match field {
                        "metadata.name" => meta["name"].as_str(),
                        "metadata.namespace" => meta["namespace"].as_str(),
                        "metadata.uid" => meta["uid"].as_str(),
                        _ => bail!("downwardAPI fieldPath {field:?} is not supported here"),
                    };
                    let path = dir.join(item["path"].as_str().unwrap_or(field));
                    write_atomically(&path, value.unwrap_or_default().as_bytes())?;
                }
            } else {
                bail!("unsupported projected source: {source}");
            }
        }
        Ok(())
    }
}

/// `defaultMode` of a configMap or secret volume (0644 when unset).
fn mode(volume: &Value, kind: &str) -> u32 {
    volume[kind]["defaultMode"].as_u64().unwrap_or(0o644) as u32
}

/// `fsGroup` ownership of the tree at `path` (as kubelet's SetVolumeOwnership): group
/// `gid`; files gain group read (and write unless read-only by mode, as ConfigMap,
/// Secret and projected files are), directories group access and setgid.
fn set_group_ownership(path: &Path, gid: u32) -> Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    std::os::unix::fs::lchown(path, None, Some(gid))
        .with_context(|| format!("chown {}", path.display()))?;
    let mode = meta.permissions().mode();
    let group = if meta.is_dir() {
        0o2000 | 0o050 | (mode & 0o020)
    } else if mode & 0o200 == 0 {
        0o040
    } else {
        0o060
    };
    std::fs::set_permissions(
        path,
        std::fs::Permissions::from_mode((mode & 0o7777) | group),
    )?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            set_group_ownership(&entry?.path(), gid)?;
        }
    }
    Ok(())
}

/// A ConfigMap's or Secret's keys (or its `items`) as files in `dir`.
fn write_keys(
    api: &Api,
    namespace: &str,
    kind: &str,
    reference: &Value,
    dir: &Path,
    default_mode: u32,
) -> Result<()> {
    let name = reference["name"].as_str().unwrap_or_default();
    let Some(object) = ObjectSource::get(api, kind, namespace, name)? else {
        if reference["optional"] == true {
            return Ok(());
        }
        bail!(
            "{} {name:?} not found",
            if kind == "secrets" {
                "secret"
            } else {
                "configmap"
            }
        );
    };
    let mut data: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (k, v) in object["data"].as_object().into_iter().flatten() {
        let text = v.as_str().unwrap_or_default();
        let bytes = if kind == "secrets" {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.decode(text)?
        } else {
            text.as_bytes().to_vec()
        };
        data.insert(k.clone(), bytes);
    }
    let items: Vec<(String, String, u32)> = match reference["items"].as_array() {
        Some(items) => items
            .iter()
            .map(|i| {
                let key = i["key"].as_str().unwrap_or_default().to_owned();
                let path = i["path"].as_str().unwrap_or(&key).to_owned();
                let mode = i["mode"].as_u64().map_or(default_mode, |m| m as u32);
                (key, path, mode)
            })
            .collect(),
        None => data
            .keys()
            .map(|k| (k.clone(), k.clone(), default_mode))
            .collect(),
    };
    for (key, path, mode) in items {
        let bytes = data
            .get(&key)
            .ok_or_else(|| anyhow!("{kind} {name:?} has no key {key:?}"))?;
        if path.starts_with('/') || path.split('/').any(|p| p == "..") {
            bail!("item path {path:?} must be relative and stay inside the volume");
        }
        let file = dir.join(&path);
        write_atomically(&file, bytes)?;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// A `hostPath` on the node: created or checked by its `type`.
fn host_path(node_root: &Path, host: &serde_json::Map<String, Value>) -> Result<PathBuf> {
    let path = host
        .get("path")
        .and_then(Value::as_str)
        .context("hostPath without a path")?;
    if !path.starts_with('/') || path.split('/').any(|p| p == "..") {
        bail!("hostPath {path:?} must be absolute and plain");
    }
    let shared = SHARED_HOST_PATHS
        .iter()
        .any(|p| path == *p || path.starts_with(&format!("{p}/")));
    let on_node = if shared {
        PathBuf::from(path)
    } else {
        node_root.join(path.trim_start_matches('/'))
    };
    let kind = host.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "DirectoryOrCreate" | "" if !on_node.exists() => std::fs::create_dir_all(&on_node)?,
        "FileOrCreate" if !on_node.exists() => {
            if let Some(parent) = on_node.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::File::create(&on_node)?;
        }
        "Directory" | "DirectoryOrCreate" if !on_node.is_dir() => {
            bail!("hostPath type check failed: {path} is not a directory")
        }
        "File" | "FileOrCreate" if !on_node.is_file() => {
            bail!("hostPath type check failed: {path} is not a file")
        }
        "Socket"
            if !std::fs::metadata(&on_node)
                .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type())) =>
        {
            bail!("hostPath type check failed: {path} is not a socket file")
        }
        _ => {}
    }
    Ok(on_node)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn obj(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn host_paths_map_onto_the_node_and_check_their_type() {
        let root = tempfile::tempdir().unwrap();
        let dir = host_path(
            root.path(),
            &obj(json!({"path": "/etc/cni/net.d", "type": "DirectoryOrCreate"})),
        )
        .unwrap();
        assert_eq!(dir, root.path().join("etc/cni/net.d"));
        assert!(dir.is_dir());
        let lock = host_path(
            root.path(),
            &obj(json!({"path": "/var/lib/x.lock", "type": "FileOrCreate"})),
        )
        .unwrap();
        assert!(lock.is_file());
        assert_eq!(
            host_path(
                root.path(),
                &obj(json!({"path": "/proc", "type": "Directory"}))
            )
            .unwrap(),
            PathBuf::from("/proc")
        );
        let missing = host_path(
            root.path(),
            &obj(json!({"path": "/opt/cni/bin", "type": "Directory"})),
        );
        assert!(missing.unwrap_err().to_string().contains("not a directory"));
        assert!(host_path(root.path(), &obj(json!({"path": "/a/../../etc"}))).is_err());
    }
}
