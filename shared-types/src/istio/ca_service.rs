//! `istio.v1.auth.IstioCertificateService` over gRPC: the server istiod-lite runs and
//! the client ztunnel calls, with Istio's method path.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::server::{NamedService, UnaryService};
use tonic::Status;
use tonic_prost::ProstCodec;

use super::ca::{
    IstioCertificateRequest, IstioCertificateResponse, CREATE_CERTIFICATE, MAX_REQUEST_BYTES,
    SERVICE,
};

/// The CA as a server implements it.
pub trait IstioCertificateService: Send + Sync + 'static {
    /// Answers one `CreateCertificate` call: the signed chain, or a gRPC status saying why
    /// the request is refused.
    fn create_certificate(
        &self,
        request: tonic::Request<IstioCertificateRequest>,
    ) -> impl std::future::Future<
        Output = Result<tonic::Response<IstioCertificateResponse>, tonic::Status>,
    > + Send;
}

/// Routes `CreateCertificate` to an [`IstioCertificateService`]; add it to a
/// `tonic::transport::Server`. Any other path answers `Unimplemented`.
#[derive(Debug)]
pub struct IstioCertificateServiceServer<T> {
    inner: Arc<T>,
}

impl<T> IstioCertificateServiceServer<T> {
    /// Serves `inner`, shared with any clones of the server.
    pub fn new(inner: Arc<T>) -> Self {
        IstioCertificateServiceServer { inner }
    }
}

impl<T> Clone for IstioCertificateServiceServer<T> {
    fn clone(&self) -> Self {
        IstioCertificateServiceServer {
            inner: self.inner.clone(),
        }
    }
}

impl<T> NamedService for IstioCertificateServiceServer<T> {
    const NAME: &'static str = SERVICE;
}

impl<T, B> Service<http::Request<B>> for IstioCertificateServiceServer<T>
where
    T: IstioCertificateService,
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != CREATE_CERTIFICATE {
            return Box::pin(async { Ok(Status::unimplemented("").into_http()) });
        }
        let method = CreateCertificate(self.inner.clone());
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(ProstCodec::default())
                .apply_max_message_size_config(Some(MAX_REQUEST_BYTES), None);
            Ok(grpc.unary(method, request).await)
        })
    }
}

struct CreateCertificate<T>(Arc<T>);

impl<T: IstioCertificateService> UnaryService<IstioCertificateRequest> for CreateCertificate<T> {
    type Response = IstioCertificateResponse;
    type Future = BoxFuture<tonic::Response<IstioCertificateResponse>, Status>;

    fn call(&mut self, request: tonic::Request<IstioCertificateRequest>) -> Self::Future {
        let inner = self.0.clone();
        Box::pin(async move { inner.create_certificate(request).await })
    }
}

/// A client of the CA over a tonic channel.
#[derive(Clone, Debug)]
pub struct IstioCertificateServiceClient {
    inner: tonic::client::Grpc<tonic::transport::Channel>,
}

impl IstioCertificateServiceClient {
    /// A client that sends its calls over `channel`.
    pub fn new(channel: tonic::transport::Channel) -> Self {
        IstioCertificateServiceClient {
            inner: tonic::client::Grpc::new(channel),
        }
    }

    /// Calls `CreateCertificate`; the caller puts its credentials ([`super::metadata`]) in
    /// `request`'s metadata. Fails with `Unavailable` when the CA cannot be reached.
    pub async fn create_certificate(
        &mut self,
        request: tonic::Request<IstioCertificateRequest>,
    ) -> Result<tonic::Response<IstioCertificateResponse>, Status> {
        self.inner
            .ready()
            .await
            .map_err(|e| Status::unavailable(format!("the CA is not reachable: {e}")))?;
        let path = http::uri::PathAndQuery::from_static(CREATE_CERTIFICATE);
        self.inner.unary(request, path, ProstCodec::default()).await
    }
}
