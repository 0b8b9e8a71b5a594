//! `CreateCertificate`: authenticate, authorize impersonation, check the CSR, sign.

pub mod authn;
pub mod authz;

use std::sync::Arc;
use std::time::Duration;

use mesh_ca::{CertificateAuthority, CertificateRequest};
use shared_types::istio::ca::{IstioCertificateRequest, IstioCertificateResponse};
use shared_types::istio::ca_service::IstioCertificateService;
use tonic::{Request, Response, Status};

use crate::metrics::Metrics;
use authn::TokenAuthenticator;
use authz::NodeAuthorizer;

pub struct CaService {
    pub ca: Arc<CertificateAuthority>,
    pub authn: Arc<TokenAuthenticator>,
    pub authz: NodeAuthorizer,
    pub default_ttl: Duration,
    pub max_ttl: Duration,
    pub metrics: Arc<Metrics>,
}

impl IstioCertificateService for CaService {
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        self.metrics.csr_count.inc();
        let caller = self
            .authn
            .authenticate(request.metadata())
            .await
            .map_err(|e| {
                tracing::info!(reason = e.reason(), error = %e, "certificate request refused");
                self.metrics.authentication_failure(e.reason());
                match e {
                    authn::AuthnError::Review(_) => Status::unavailable(e.to_string()),
                    _ => Status::unauthenticated(e.to_string()),
                }
            })?;
        let request = request.into_inner();
        let identity = match request.impersonated_identity() {
            Some(requested) => self.authz.authorize(&caller, requested).map_err(|e| {
                tracing::info!(caller = %caller.identity, requested, reason = e.reason(), error = %e, "impersonation refused");
                self.metrics.authentication_failure(e.reason());
                Status::unauthenticated(e.to_string())
            })?,
            None => caller.identity.clone(),
        };
        let ttl = self.ttl(request.validity_duration).inspect_err(|_| {
            self.metrics.csr_parsing_error("ttl");
        })?;
        let csr = CertificateRequest::parse_pem(&request.csr).map_err(|e| {
            self.metrics.csr_parsing_error("csr");
            Status::invalid_argument(e.to_string())
        })?;
        if csr.requested_uris() != [identity.to_uri()] {
            // Istio ignores the CSR's SAN too; the authenticated identity is what counts.
            tracing::debug!(%identity, requested = ?csr.requested_uris(), "CSR SAN ignored");
        }
        // Signing (RSA roots especially) is CPU work; keep it off the I/O threads.
        let ca = self.ca.clone();
        let id = identity.clone();
        let issued =
            tokio::task::spawn_blocking(move || ca.issue_for_key(csr.public_key(), &id, ttl))
                .await
                .map_err(|_| Status::internal("signing was interrupted"))?
                .map_err(|e| {
                    self.metrics.csr_sign_errors.inc();
                    tracing::warn!(%identity, error = %e, "cannot sign a certificate");
                    Status::internal(format!("cannot sign: {e}"))
                })?;
        self.metrics.success_cert_issuance.inc();
        tracing::debug!(caller = %caller.identity, %identity, serial = %issued.serial, "issued a workload certificate");
        Ok(Response::new(IstioCertificateResponse {
            cert_chain: issued.to_pem_list(),
        }))
    }
}

impl CaService {
    /// ≤ 0 asks for the default, as in Istio; more than the maximum is refused.
    fn ttl(&self, requested: i64) -> Result<Duration, Status> {
        let Ok(secs @ 1..) = u64::try_from(requested) else {
            return Ok(self.default_ttl);
        };
        let ttl = Duration::from_secs(secs);
        if ttl > self.max_ttl {
            return Err(Status::invalid_argument(format!(
                "requested TTL {secs}s is greater than the max allowed TTL {}s (MAX_WORKLOAD_CERT_TTL)",
                self.max_ttl.as_secs()
            )));
        }
        Ok(ttl)
    }
}
