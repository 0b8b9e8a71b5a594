//! What can go wrong loading, writing or using the CA.

use std::path::{Path, PathBuf};

use shared_types::identity::IdentityError;

use crate::plugin_files::ROOT_CERT_FILE;

/// Why the CA could not be loaded, written or used.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// A CA file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file that could not be read.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The CA directory could not be created or a CA file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The directory or file that could not be written.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A CA file was read but its contents are unusable (malformed PEM, not X.509,
    /// not a CA certificate, unsupported key or algorithm).
    #[error("{path}: {reason}")]
    Invalid {
        /// The offending file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The CA key does not match the public key of the CA certificate.
    #[error("the private key in {key} does not belong to the certificate in {cert}")]
    KeyMismatch {
        /// The private key file.
        key: PathBuf,
        /// The CA certificate file.
        cert: PathBuf,
    },
    /// The loaded CA could not issue a probe leaf that verifies against its roots.
    #[error("{dir}: leaves issued by this CA do not verify against {ROOT_CERT_FILE}: {reason}")]
    Chain {
        /// The plug-in CA directory.
        dir: PathBuf,
        /// Why the probe leaf failed.
        reason: String,
    },
    /// A leaf was requested at or after the CA certificate's expiry.
    #[error("the CA certificate expired at {not_after}")]
    Expired {
        /// The CA's expiry, human-readable.
        not_after: String,
    },
    /// The requested validity cannot be encoded: before 1970, past the year 9999,
    /// not after its start, or a lifetime that overflows.
    #[error("invalid validity for a certificate: {0}")]
    Validity(&'static str),
    /// The identity's SPIFFE URI does not parse back, so peers would refuse the leaf.
    #[error("cannot issue a certificate for {id:?}: {source}")]
    Identity {
        /// The SPIFFE URI that was refused.
        id: String,
        /// Why it does not parse.
        #[source]
        source: IdentityError,
    },
    /// Generating a key, building a SAN or signing a certificate failed.
    #[error("cannot sign {what}: {source}")]
    Sign {
        /// What was being made.
        what: String,
        /// The rcgen error.
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
