//! Where workload certificates come from.

use std::sync::Arc;
use std::time::Duration;

use super::caclient::{CaClient, CaClientError};
use super::{CaError, CertificateAuthority, Identity, WorkloadCertificate};

/// The mesh CA's files on this machine (a VM without a control plane), or istiod's
/// certificate service (`CA_ADDRESS`): the key never leaves istiod then.
#[derive(Clone)]
pub enum CertificateSource {
    Local(Arc<CertificateAuthority>),
    Remote(Arc<CaClient>),
}

/// Why a certificate could not be had.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error(transparent)]
    Local(#[from] CaError),
    #[error(transparent)]
    Remote(#[from] CaClientError),
}

impl CertError {
    /// A short, bounded label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            CertError::Local(_) => "local_ca",
            CertError::Remote(e) => e.reason(),
        }
    }
}

impl CertificateSource {
    pub async fn fetch(
        &self,
        id: &Identity,
        lifetime: Duration,
    ) -> Result<WorkloadCertificate, CertError> {
        match self {
            CertificateSource::Local(ca) => Ok(ca.issue(id, lifetime)?),
            CertificateSource::Remote(client) => Ok(client.fetch(id, lifetime).await?),
        }
    }
}
