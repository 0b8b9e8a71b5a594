//! The mesh's certificate authority, in one place for everyone who signs or asks.
//!
//! - [`CertificateAuthority`] ([`ca`]): leaves for identities, serving certificates,
//!   and CSRs signed for an identity the caller has authenticated;
//! - [`plugin_files`]: Istio's plug-in CA files (`cacerts`), loaded and written;
//! - [`certificates`]: what it hands out, and the chain check peers make;
//! - [`csr`]: certificate signing requests, built and verified.
//!
//! Three users share it: istiod-lite (the CA service), `istioctl-lite ca init`, and
//! ztunnel's standalone mode for VMs. ztunnel's CA client builds its CSRs here too.
//! Identities themselves are `shared_types::identity`.

pub mod ca;
pub mod certificates;
pub mod csr;
mod error;
mod pem;
pub mod plugin_files;
mod validity;

pub use ca::{CertificateAuthority, RootKey};
pub use certificates::{verify_chain, IssuedChain, ServingCertificate, WorkloadCertificate};
pub use csr::{CertificateRequest, CsrError};
pub use error::CaError;
pub use pem::pem_encode;
