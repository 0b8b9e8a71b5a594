//! The mesh's certificate authority, in one place for everyone who signs or asks.
//!
//! - [`Identity`]: the SPIFFE id Istio gives a service account.
//! - [`CertificateAuthority`]: Istio's plug-in CA files (`cacerts`), leaves for
//!   identities, and CSRs signed for an identity the caller has authenticated.
//!
//! Three users share it: istiod-lite (the CA service), `istioctl-lite ca init`, and
//! ztunnel's standalone mode for VMs. ztunnel's CA client builds its CSRs here too.

pub mod ca;
pub mod csr;
pub mod identity;

pub use ca::{
    pem_encode, verify_chain, CaError, CertificateAuthority, IssuedChain, RootKey,
    ServingCertificate, WorkloadCertificate,
};
pub use csr::{CertificateRequest, CsrError};
pub use identity::{Identity, IdentityError};
