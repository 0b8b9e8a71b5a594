//! Which workspace binary a container image runs: the one explicit table shared by
//! the kubelet stand-in and the chart tests. The charts' image holds every binary of
//! the mesh (the container's `command` picks one), as a multi-binary image would.

use std::path::PathBuf;

use anyhow::{bail, Result};

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
