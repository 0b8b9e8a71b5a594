//! What can go wrong loading, writing or using the CA.

use std::path::{Path, PathBuf};

use shared_types::identity::IdentityError;

use crate::plugin_files::ROOT_CERT_FILE;

/// Why the CA could not be loaded, written or used.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("the private key in {key} does not belong to the certificate in {cert}")]
    KeyMismatch { key: PathBuf, cert: PathBuf },
    #[error("{dir}: leaves issued by this CA do not verify against {ROOT_CERT_FILE}: {reason}")]
    Chain { dir: PathBuf, reason: String },
    #[error("the CA certificate expired at {not_after}")]
    Expired { not_after: String },
    #[error("invalid validity for a certificate: {0}")]
    Validity(&'static str),
    #[error("cannot issue a certificate for {id:?}: {source}")]
    Identity {
        id: String,
        #[source]
        source: IdentityError,
    },
    #[error("cannot sign {what}: {source}")]
    Sign {
        what: String,
        #[source]
        source: rcgen::Error,
    },
}

pub(crate) fn invalid(path: &Path, reason: impl Into<String>) -> CaError {
    CaError::Invalid {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}
