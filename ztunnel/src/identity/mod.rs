//! Workload identities and the certificates that prove them.
//!
//! Identities live in `shared-types`, the CA itself in the `mesh-ca` crate, shared with
//! istiod-lite and istioctl-lite. Here: the [`SecretManager`], which caches one
//! leaf per identity, and where its leaves come from ([`source`]): the mesh CA
//! files on a VM, or istiod's certificate service over gRPC.

pub mod caclient;
pub mod manager;
pub mod source;

pub use manager::SecretManager;
pub use mesh_ca::{CaError, CertificateAuthority, WorkloadCertificate};
pub use shared_types::identity::{Identity, IdentityError};
pub use source::CertificateSource;
