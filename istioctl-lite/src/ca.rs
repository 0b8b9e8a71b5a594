//! `ca init`: the `cacerts` Secret in Istio's plug-in CA layout, from a fresh root
//! (an RSA-2048 self-signed root made in-process by `mesh-ca`, as Istio's istiod makes
//! when it finds no cacerts) or from files.

use std::path::Path;

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;

use crate::apply::FIELD_MANAGER;
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
    let (secret, origin) = match &args.from_dir {
        Some(dir) => (
            secret_from_dir(dir, &args.namespace, SECRET_NAME)?,
            format!("from {}", dir.display()),
        ),
        None => (
            fresh_root_secret(&args.namespace, SECRET_NAME, &args.trust_domain)?,
            fresh_root_description(&args.trust_domain),
        ),
    };
    api.patch(
        SECRET_NAME,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&secret),
    )
    .await
    .context("cannot write the cacerts Secret")?;
    println!(
        "✔ Secret {}/{SECRET_NAME} written ({origin})",
        args.namespace
    );
    Ok(())
}

pub fn fresh_root_description(trust_domain: &str) -> String {
    format!("a fresh self-signed RSA-2048 root, trust domain {trust_domain}")
}

/// A fresh RSA-2048 self-signed root (ten years, O=<trust domain>) as Secret `name`,
/// in the plug-in layout. The key never touches disk outside a private tempdir.
pub fn fresh_root_secret(namespace: &str, name: &str, trust_domain: &str) -> Result<Secret> {
    let ca = mesh_ca::CertificateAuthority::generate_root(trust_domain, mesh_ca::RootKey::Rsa2048)
        .context("cannot generate the root CA")?;
    let tmp = tempfile::tempdir()?;
    ca.write(tmp.path())
        .context("cannot write the root CA files")?;
    secret_from_dir(tmp.path(), namespace, name)
}

/// Creates Secret `name` with a fresh root unless it exists; never replaces one (a
/// concurrent creator wins). Returns whether this call created it.
pub async fn create_if_missing(
    client: &Client,
    namespace: &str,
    name: &str,
    trust_domain: &str,
) -> Result<bool> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    if api.get_opt(name).await?.is_some() {
        return Ok(false);
    }
    let secret = fresh_root_secret(namespace, name, trust_domain)?;
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match api.create(&params, &secret).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e).with_context(|| format!("cannot create Secret {namespace}/{name}")),
    }
}

/// Reads the four PEM files; each must exist and look like PEM.
pub fn secret_from_dir(dir: &Path, namespace: &str, name: &str) -> Result<Secret> {
    let mut data = std::collections::BTreeMap::new();
    for file in FILES {
        let path = dir.join(file);
        let bytes =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        if !String::from_utf8_lossy(&bytes).contains("-----BEGIN ") {
            bail!("{} is not PEM", path.display());
        }
        data.insert(file.to_string(), ByteString(bytes));
    }
    let mut secret = Secret {
        data: Some(data),
        type_: Some("Opaque".into()),
        ..Default::default()
    };
    secret.metadata.name = Some(name.into());
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
        assert!(secret_from_dir(dir.path(), "ns", SECRET_NAME).is_err());
        std::fs::write(dir.path().join(FILES[3]), "-----BEGIN X-----\n").unwrap();
        let s = secret_from_dir(dir.path(), "ns", SECRET_NAME).unwrap();
        assert_eq!(s.data.unwrap().len(), 4);
    }

    #[test]
    fn fresh_root_is_rsa_and_self_signed() {
        let s = fresh_root_secret("ns", "other", "example.org").unwrap();
        assert_eq!(s.metadata.name.as_deref(), Some("other"));
        let data = s.data.unwrap();
        let key = String::from_utf8_lossy(&data["ca-key.pem"].0).into_owned();
        assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"), "{key}");
        let (_, pem) = x509_parser::pem::parse_x509_pem(&data["root-cert.pem"].0).unwrap();
        let cert = pem.parse_x509().unwrap();
        assert_eq!(cert.subject(), cert.issuer());
        assert!(cert.is_ca());
        assert_eq!(
            cert.public_key().algorithm.algorithm,
            x509_parser::oid_registry::OID_PKCS1_RSAENCRYPTION
        );
        assert_eq!(data["ca-cert.pem"].0, data["root-cert.pem"].0);
    }
}
