//! `ca init`: the `cacerts` Secret in Istio's plug-in CA layout, from a fresh root
//! (made by the `ztunnel` binary, the one place that knows how) or from files.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Api, Patch, PatchParams};

use crate::apply::FIELD_MANAGER;
use crate::charts::find_on_path;
use crate::cli::{CaInitArgs, Global};
use crate::kubeclient;

pub const SECRET_NAME: &str = "cacerts";
pub const FILES: [&str; 4] = [
    "ca-cert.pem",
    "ca-key.pem",
    "root-cert.pem",
    "cert-chain.pem",
];

pub async fn init(global: &Global, args: &CaInitArgs) -> Result<()> {
    let client = kubeclient::client(global).await?;
    let api: Api<Secret> = Api::namespaced(client, &args.namespace);
    if !args.overwrite && api.get_opt(SECRET_NAME).await?.is_some() {
        println!(
            "✔ Secret {}/{SECRET_NAME} already exists; left alone (--overwrite replaces it)",
            args.namespace
        );
        return Ok(());
    }
    let tmp;
    let dir: &Path = match &args.from_dir {
        Some(dir) => dir,
        None => {
            tmp = tempfile::tempdir()?;
            generate(tmp.path(), &args.trust_domain)?;
            tmp.path()
        }
    };
    let secret = secret_from_dir(dir, &args.namespace)?;
    api.patch(
        SECRET_NAME,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&secret),
    )
    .await
    .context("cannot write the cacerts Secret")?;
    println!("✔ Secret {}/{SECRET_NAME} written", args.namespace);
    Ok(())
}

/// `ztunnel` beside this binary, else on PATH.
fn ztunnel_binary() -> Result<PathBuf> {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("ztunnel")))
        .filter(|p| p.is_file())
        .or_else(|| find_on_path("ztunnel"))
        .context("the ztunnel binary is needed to generate a root (not beside istioctl-lite nor on PATH); or pass --from-dir")
}

fn generate(dir: &Path, trust_domain: &str) -> Result<()> {
    let ztunnel = ztunnel_binary()?;
    let out = Command::new(&ztunnel)
        .args(["ca", "init", "--trust-domain", trust_domain, "--out"])
        .arg(dir)
        .output()
        .with_context(|| format!("cannot run {}", ztunnel.display()))?;
    if !out.status.success() {
        bail!(
            "ztunnel ca init failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Reads the four PEM files; each must exist and look like PEM.
pub fn secret_from_dir(dir: &Path, namespace: &str) -> Result<Secret> {
    let mut data = std::collections::BTreeMap::new();
    for name in FILES {
        let path = dir.join(name);
        let bytes =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        if !String::from_utf8_lossy(&bytes).contains("-----BEGIN ") {
            bail!("{} is not PEM", path.display());
        }
        data.insert(name.to_string(), ByteString(bytes));
    }
    let mut secret = Secret {
        data: Some(data),
        type_: Some("Opaque".into()),
        ..Default::default()
    };
    secret.metadata.name = Some(SECRET_NAME.into());
    secret.metadata.namespace = Some(namespace.into());
    let mut value = serde_json::to_value(&secret)?;
    value["apiVersion"] = "v1".into();
    value["kind"] = "Secret".into();
    Ok(serde_json::from_value(value)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_plugin_layout_and_rejects_gaps() {
        let dir = tempfile::tempdir().unwrap();
        for name in &FILES[..3] {
            std::fs::write(dir.path().join(name), "-----BEGIN X-----\n").unwrap();
        }
        assert!(secret_from_dir(dir.path(), "ns").is_err());
        std::fs::write(dir.path().join(FILES[3]), "-----BEGIN X-----\n").unwrap();
        let s = secret_from_dir(dir.path(), "ns").unwrap();
        assert_eq!(s.data.unwrap().len(), 4);
    }
}
