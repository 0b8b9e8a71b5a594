//! What a container image runs. Two sources, one table:
//! - the image `make image` built (`target/image`, scripts/image/build.sh): its OCI
//!   layers are unpacked once and every container of it gets that root filesystem,
//!   as a runtime's snapshotter gives it ([`BuiltImage`]);
//! - else (fast local iteration) the workspace's binaries: the table below maps the
//!   image's name to them, and the kubelet stand-in places them in a root of its own.
//!
//! [`mesh_image`] picks the source once per process (`MESH_IMAGE=image|binaries`
//! forces one). The charts' image holds every binary of the mesh (the container's
//! `command` picks one), as a multi-binary image would.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

/// One image: the workspace binaries it holds, and whether it is built on a
/// distribution (so `sh`, `sleep` and the like come from the host's `PATH`).
pub struct Image {
    /// The charts' `image.hub`/`image.name`, no tag.
    pub repository: &'static str,
    pub binaries: &'static [&'static str],
    pub distro_tools: bool,
}

pub const IMAGES: &[Image] = &[
    // Distroless: only the mesh's binaries.
    Image {
        repository: "ghcr.io/ambient-rs/ambient-rs",
        binaries: &[
            "cni-agent",
            "istio-cni",
            "ztunnel",
            "istiod-lite",
            "istioctl-lite",
            "waypoint",
        ],
        distro_tools: false,
    },
    // The test application of the e2e suite, on a Debian base.
    Image {
        repository: "e2e-app",
        binaries: &["e2e-app"],
        distro_tools: true,
    },
];

/// `hub/name:tag@digest` → `hub/name`.
pub fn repository(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    match image.rfind(':') {
        // A colon after the last slash starts the tag; one before it is a registry port.
        Some(colon) if image[colon..].find('/').is_none() => &image[..colon],
        _ => image,
    }
}

/// The program a container of `image` runs for `command[0]` (or the image's only
/// binary when the container gives no command): a workspace binary in this build's
/// target directory, or a distribution tool resolved through `PATH`.
pub fn program_for(image: &str, command: Option<&str>) -> Result<PathBuf> {
    let image_def = self::image(image)?;
    let name = match (command, image_def.binaries) {
        (Some(cmd), _) => cmd.rsplit('/').next().unwrap_or(cmd),
        (None, [only]) => only,
        (None, _) => bail!(
            "image {image:?} holds several binaries: the container must name one in `command`"
        ),
    };
    if image_def.binaries.contains(&name) {
        return test_support::built_binary(name);
    }
    match command {
        Some(cmd) if image_def.distro_tools => Ok(PathBuf::from(cmd)),
        // What a runtime reports for an entrypoint the image lacks.
        _ => bail!("exec: {name:?}: executable file not found in image {image:?}"),
    }
}

/// The charts' image, built by `make image`: an OCI image layout and what
/// scripts/image/build.sh says of it (`image.env`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltImage {
    /// `make image`'s output directory (`target/image`).
    pub dir: PathBuf,
    /// `ghcr.io/ambient-rs/ambient-rs`.
    pub repository: String,
    /// Its tag: the workspace version.
    pub version: String,
    /// The commit it was built from (`org.opencontainers.image.revision`).
    pub revision: String,
    /// The manifest's digest, `sha256:<hex>`.
    pub digest: String,
}

impl BuiltImage {
    /// The image in `dir`, if `make image` wrote one there.
    pub fn open(dir: &Path) -> Result<Option<Self>> {
        let env_file = dir.join("image.env");
        let text = match std::fs::read_to_string(&env_file) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", env_file.display())),
        };
        let vars: BTreeMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
        let var = |k: &str| -> Result<String> {
            vars.get(k)
                .map(|v| v.to_string())
                .with_context(|| format!("{} lacks {k}", env_file.display()))
        };
        let image = BuiltImage {
            dir: dir.to_owned(),
            repository: var("IMAGE_REPOSITORY")?,
            version: var("IMAGE_VERSION")?,
            revision: var("IMAGE_REVISION")?,
            digest: var("IMAGE_DIGEST")?,
        };
        if image.digest_hex().len() != 64 {
            bail!(
                "{}: IMAGE_DIGEST {:?} is no sha256 digest",
                env_file.display(),
                image.digest
            );
        }
        Ok(Some(image))
    }

    /// `repository:version@digest`.
    pub fn reference(&self) -> String {
        format!("{}:{}@{}", self.repository, self.version, self.digest)
    }

    /// The OCI image layout.
    pub fn layout(&self) -> PathBuf {
        self.dir.join("oci")
    }

    /// The OCI archive (`podman load -i`).
    pub fn archive(&self) -> PathBuf {
        self.dir
            .join(format!("ambient-rs-{}.oci.tar", self.version))
    }

    fn digest_hex(&self) -> &str {
        self.digest.strip_prefix("sha256:").unwrap_or_default()
    }

    /// A blob of the layout, checked against its digest.
    fn blob(&self, digest: &str) -> Result<Vec<u8>> {
        let hex = digest
            .strip_prefix("sha256:")
            .with_context(|| format!("unsupported digest {digest:?}"))?;
        let path = self.layout().join("blobs/sha256").join(hex);
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        let actual = format!("{:x}", Sha256::digest(&bytes));
        if actual != hex {
            bail!(
                "{} has digest sha256:{actual}, not {digest}",
                path.display()
            );
        }
        Ok(bytes)
    }

    /// The manifest (checked against the digest) and the layer blobs it lists, in order.
    pub fn layers(&self) -> Result<Vec<PathBuf>> {
        let manifest: serde_json::Value =
            serde_json::from_slice(&self.blob(&self.digest)?).context("the image manifest")?;
        let mut layers = Vec::new();
        for layer in manifest["layers"].as_array().into_iter().flatten() {
            let media = layer["mediaType"].as_str().unwrap_or_default();
            if media != "application/vnd.oci.image.layer.v1.tar+gzip" {
                bail!("layer media type {media:?}: only gzip tar layers are unpacked");
            }
            let digest = layer["digest"].as_str().unwrap_or_default();
            self.blob(digest)?;
            let hex = digest.trim_start_matches("sha256:");
            layers.push(self.layout().join("blobs/sha256").join(hex));
        }
        if layers.is_empty() {
            bail!("the image manifest {} lists no layer", self.digest);
        }
        Ok(layers)
    }

    /// Whether `image_ref` names this image: its repository, with its tag or none,
    /// and its digest or none.
    pub fn serves(&self, image_ref: &str) -> bool {
        let (name, digest) = match image_ref.split_once('@') {
            Some((name, digest)) => (name, Some(digest)),
            None => (image_ref, None),
        };
        let repo = repository(name);
        let tag = name[repo.len()..].strip_prefix(':');
        repo == self.repository
            && tag.is_none_or(|t| t == self.version)
            && digest.is_none_or(|d| d == self.digest)
    }

    /// The image's root filesystem: its layers unpacked, once per digest, under
    /// `<dir>/rootfs/<hex>` (a container's root is an overlay on it). Concurrent
    /// callers (test processes) each unpack into a directory of their own and the
    /// first rename wins.
    pub fn rootfs(&self) -> Result<PathBuf> {
        let cache = self.dir.join("rootfs");
        let done = cache.join(self.digest_hex());
        if done.is_dir() {
            return Ok(done);
        }
        std::fs::create_dir_all(&cache)?;
        let staging = cache.join(format!(".{}.{}", self.digest_hex(), std::process::id()));
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir(&staging)?;
        let unpacked = (|| -> Result<()> {
            for layer in self.layers()? {
                let out = Command::new("tar")
                    .args([
                        "--extract",
                        "--gzip",
                        "--same-permissions",
                        "--numeric-owner",
                    ])
                    .arg("--file")
                    .arg(&layer)
                    .arg("--directory")
                    .arg(&staging)
                    .output()
                    .context("running tar")?;
                if !out.status.success() {
                    bail!(
                        "unpacking {}: {}",
                        layer.display(),
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                }
                if has_whiteout(&staging)? {
                    bail!(
                        "layer {} has whiteouts: only additive layers are unpacked",
                        layer.display()
                    );
                }
            }
            Ok(())
        })();
        if let Err(e) = unpacked {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(e);
        }
        if std::fs::rename(&staging, &done).is_err() {
            // Another process was first: its tree is the same image.
            std::fs::remove_dir_all(&staging)?;
        }
        Ok(done)
    }
}

/// Whether an unpacked tree holds an OCI whiteout (`.wh.*`).
fn has_whiteout(dir: &Path) -> Result<bool> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(".wh.") {
            return Ok(true);
        }
        if entry.file_type()?.is_dir() && has_whiteout(&entry.path())? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Where `make image` writes the image: `IMAGE_OUT`, else this workspace's
/// `target/image`.
pub fn image_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("IMAGE_OUT") {
        return PathBuf::from(dir);
    }
    let bin = test_support::workspace_binary("ztunnel");
    // target/<profile>/ztunnel → target/image
    bin.parent()
        .and_then(Path::parent)
        .map(|target| target.join("image"))
        .unwrap_or_else(|| PathBuf::from("target/image"))
}

/// What the mesh's pods run: the built image, or the workspace's binaries.
#[derive(Debug, Clone)]
pub enum MeshImage {
    /// `make image`'s image, unpacked into every container's root.
    Built(BuiltImage),
    /// The workspace's binaries placed in the container's root; why the image is not
    /// used.
    Binaries(String),
}

impl std::fmt::Display for MeshImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MeshImage::Built(image) => write!(
                f,
                "the image {} (make image, {}), its layers unpacked as each container's root",
                image.reference(),
                image.dir.display()
            ),
            MeshImage::Binaries(why) => {
                write!(f, "the workspace's binaries in /usr/local/bin ({why})")
            }
        }
    }
}

/// The source of the mesh's image for this process, chosen once:
/// `MESH_IMAGE=image` needs the built image, `MESH_IMAGE=binaries` never uses it;
/// unset, the built image is used when it is at least as new as the workspace's
/// binaries (else it would run yesterday's code: `make image` refreshes it).
pub fn mesh_image() -> Result<MeshImage> {
    static CHOICE: OnceLock<Result<MeshImage, String>> = OnceLock::new();
    CHOICE
        .get_or_init(|| choose_mesh_image(&image_dir()).map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn choose_mesh_image(dir: &Path) -> Result<MeshImage> {
    let forced = std::env::var("MESH_IMAGE").unwrap_or_default();
    let built = BuiltImage::open(dir)?;
    match (forced.as_str(), built) {
        ("binaries", _) => Ok(MeshImage::Binaries("MESH_IMAGE=binaries".into())),
        ("image", Some(image)) => Ok(MeshImage::Built(image)),
        ("image", None) => bail!(
            "MESH_IMAGE=image, but {} holds no image: run `make image`",
            dir.display()
        ),
        ("", None) => Ok(MeshImage::Binaries(format!(
            "no image in {}: `make image` builds it",
            dir.display()
        ))),
        ("", Some(image)) => {
            let built_at = std::fs::metadata(dir.join("image.env"))?.modified()?;
            let newer: Vec<String> = IMAGES[0]
                .binaries
                .iter()
                .map(|b| test_support::workspace_binary(b))
                .filter(|p| {
                    std::fs::metadata(p)
                        .and_then(|m| m.modified())
                        .is_ok_and(|t| t > built_at)
                })
                .map(|p| p.display().to_string())
                .collect();
            if newer.is_empty() {
                Ok(MeshImage::Built(image))
            } else {
                Ok(MeshImage::Binaries(format!(
                    "the image in {} is older than {}: `make image` refreshes it, \
                     MESH_IMAGE=image uses it anyway",
                    dir.display(),
                    newer.join(", ")
                )))
            }
        }
        (other, _) => bail!("MESH_IMAGE={other:?}: want image or binaries"),
    }
}

/// The unpacked root filesystem a container of `image_ref` gets, when the mesh runs
/// from the built image and `image_ref` is it; `ErrImagePull` when the mesh runs
/// from the built image and `image_ref` names another tag or digest of it (a node
/// has only what was built).
pub fn built_rootfs_for(image_ref: &str) -> Result<Option<PathBuf>> {
    if repository(image_ref) != IMAGES[0].repository {
        return Ok(None);
    }
    match mesh_image()? {
        MeshImage::Binaries(_) => Ok(None),
        MeshImage::Built(image) if image.serves(image_ref) => Ok(Some(image.rootfs()?)),
        MeshImage::Built(image) => Err(UnknownImage(format!(
            "{image_ref} (this node has {} only)",
            image.reference()
        ))
        .into()),
    }
}

/// The program a container of the built image runs for `command[0]`, as a runtime
/// resolves it in the image: a path as given, a name through the image's `PATH`.
pub fn program_in_image(
    image_root: &Path,
    image: &str,
    command: Option<&String>,
) -> Result<PathBuf> {
    let Some(cmd) = command else {
        bail!("image {image:?} holds several binaries: the container must name one in `command`");
    };
    // Never followed: an absolute link in the image points into the image, not the host.
    let exists = |p: &Path| {
        let inside = p.strip_prefix("/").unwrap_or(p);
        std::fs::symlink_metadata(image_root.join(inside)).is_ok()
    };
    if cmd.contains('/') {
        let path = PathBuf::from(cmd);
        if path.is_absolute() && exists(&path) {
            return Ok(path);
        }
    } else {
        for dir in IMAGE_PATH {
            let path = Path::new(dir).join(cmd);
            if exists(&path) {
                return Ok(path);
            }
        }
    }
    bail!("exec: {cmd:?}: executable file not found in image {image:?}")
}

/// The built image's `PATH` (its config's `Env`, scripts/image/build.sh).
pub const IMAGE_PATH: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// An image no registry here has: the kubelet reports `ErrImagePull`.
#[derive(Debug, thiserror::Error)]
#[error("failed to pull image {0:?}: not in the harness's image table (e2e/src/cluster/images.rs)")]
pub struct UnknownImage(pub String);

/// The image's entry in the table.
pub fn image(image: &str) -> Result<&'static Image> {
    let repo = repository(image);
    IMAGES
        .iter()
        .find(|i| i.repository == repo)
        .ok_or_else(|| UnknownImage(image.to_owned()).into())
}

/// Every binary of the image, as built (the files placed in its `/usr/local/bin`).
pub fn binaries_of(image_ref: &str) -> Result<Vec<PathBuf>> {
    image(image_ref)?
        .binaries
        .iter()
        .map(|b| test_support::built_binary(b))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_drops_tag_and_digest_but_not_a_port() {
        assert_eq!(
            repository("ghcr.io/ambient-rs/ambient-rs:0.1.0"),
            "ghcr.io/ambient-rs/ambient-rs"
        );
        assert_eq!(repository("reg:5000/a/b@sha256:00"), "reg:5000/a/b");
        assert_eq!(repository("reg:5000/a/b:v1"), "reg:5000/a/b");
        assert_eq!(repository("e2e-app"), "e2e-app");
    }

    #[test]
    fn unknown_images_and_commands_are_refused() {
        let unknown = program_for("docker.io/istio/ztunnel:1.24", Some("ztunnel")).unwrap_err();
        assert!(unknown.is::<UnknownImage>(), "{unknown}");
        let err = program_for(
            "ghcr.io/ambient-rs/ambient-rs:0.1.0",
            Some("pilot-discovery"),
        )
        .unwrap_err();
        assert!(err.to_string().contains("not found in image"), "{err}");
        assert!(program_for("ghcr.io/ambient-rs/ambient-rs:0.1.0", None).is_err());
        // Distroless: no shell, unlike the test application's Debian base.
        assert!(program_for("ghcr.io/ambient-rs/ambient-rs:0.1.0", Some("sh")).is_err());
        assert_eq!(
            program_for("e2e-app:local", Some("sh")).unwrap(),
            PathBuf::from("sh")
        );
    }
}
