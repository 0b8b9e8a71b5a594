//! Builds a kube client the way kubectl does: `--kubeconfig`, else $KUBECONFIG or
//! ~/.kube/config, else in-cluster; `--context` picks the context.

use anyhow::{Context, Result};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::cli::Global;

pub async fn client(global: &Global) -> Result<Client> {
    let options = KubeConfigOptions {
        context: global.context.clone(),
        ..Default::default()
    };
    let config = match &global.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .with_context(|| format!("invalid kubeconfig {}", path.display()))?
        }
        None if global.context.is_some() => Config::from_kubeconfig(&options)
            .await
            .context("cannot load the kubeconfig context")?,
        None => Config::infer()
            .await
            .context("no kubeconfig found (use --kubeconfig or set KUBECONFIG)")?,
    };
    Client::try_from(config).context("cannot build a Kubernetes client")
}
