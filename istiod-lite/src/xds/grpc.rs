//! The ADS service as tonic mounts it, with our own framing of the delta responses.
//!
//! tonic encodes a streaming response into one buffer per stream that keeps the
//! capacity of the largest message it ever held. A ztunnel's first response is the
//! whole mesh (megabytes), so 500 streams would keep 500 such buffers for their whole
//! lives. Here each response is framed in an allocation of its own, freed once h2 has
//! written it. Requests are still decoded by tonic; every other method is the
//! generated server's.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http_body::Frame;
use prost::Message;
use shared_types::istio::xds::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer, DeltaDiscoveryRequest,
    DeltaDiscoveryResponse,
};
use tokio::sync::mpsc;
use tonic::codec::{Codec, Streaming};
use tonic::codegen::{Body, BoxFuture, Service, StdError};
use tonic::metadata::{MetadataMap, GRPC_CONTENT_TYPE};
use tonic::server::NamedService;
use tonic::Status;

use super::AdsService;

const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// A request is a subscription or an ACK: far below this.
const MAX_REQUEST_BYTES: usize = 1 << 20;

/// gRPC's message prefix: a compression flag and a big-endian length.
const PREFIX: usize = 5;

#[derive(Clone)]
pub struct AdsServer {
    ads: Arc<AdsService>,
    generated: AggregatedDiscoveryServiceServer<AdsService>,
}

impl AdsServer {
    pub fn new(ads: AdsService) -> Self {
        let ads = Arc::new(ads);
        AdsServer {
            generated: AggregatedDiscoveryServiceServer::from_arc(ads.clone())
                .max_decoding_message_size(MAX_REQUEST_BYTES),
            ads,
        }
    }
}

impl NamedService for AdsServer {
    const NAME: &'static str = <AggregatedDiscoveryServiceServer<AdsService> as NamedService>::NAME;
}

impl<B> Service<http::Request<B>> for AdsServer
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != DELTA_PATH {
            return self.generated.call(request);
        }
        let ads = self.ads.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let decoder =
                tonic_prost::ProstCodec::<DeltaDiscoveryResponse, DeltaDiscoveryRequest>::default()
                    .decoder();
            let requests = Streaming::new_request(decoder, body, None, Some(MAX_REQUEST_BYTES));
            let request = tonic::Request::from_parts(
                MetadataMap::from_headers(parts.headers),
                parts.extensions,
                requests,
            );
            Ok(match ads.delta_aggregated_resources(request).await {
                Ok(responses) => {
                    let body = Framed {
                        responses: Some(responses.into_inner().into_inner()),
                    };
                    let mut response = http::Response::new(tonic::body::Body::new(body));
                    response
                        .headers_mut()
                        .insert(http::header::CONTENT_TYPE, GRPC_CONTENT_TYPE);
                    response
                }
                Err(status) => status.into_http(),
            })
        })
    }
}

/// The response body: one data frame per message, then the status as trailers.
struct Framed {
    responses: Option<mpsc::Receiver<Result<DeltaDiscoveryResponse, Status>>>,
}

impl http_body::Body for Framed {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let Some(responses) = self.responses.as_mut() else {
            return Poll::Ready(None);
        };
        let status = match ready!(responses.poll_recv(cx)) {
            Some(Ok(message)) => return Poll::Ready(Some(Ok(Frame::data(frame(&message))))),
            Some(Err(status)) => status,
            None => Status::ok(""),
        };
        self.responses = None;
        let mut trailers = http::HeaderMap::new();
        Poll::Ready(Some(
            status
                .add_header(&mut trailers)
                .map(|()| Frame::trailers(trailers)),
        ))
    }
}

/// One length-prefixed, uncompressed gRPC message in a buffer of its own.
fn frame(message: &DeltaDiscoveryResponse) -> Bytes {
    let len = message.encoded_len();
    let mut buf = BytesMut::with_capacity(PREFIX + len);
    buf.put_u8(0);
    // A response is far below 4 GiB; the client's own limit refuses anything close.
    buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    message
        .encode(&mut buf)
        .expect("a BytesMut grows as needed");
    buf.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared_types::istio::xds::resource;

    #[test]
    fn a_frame_is_the_grpc_prefix_then_the_message() {
        let message = DeltaDiscoveryResponse {
            nonce: "1".into(),
            resources: vec![resource("a", "v", Default::default())],
            ..Default::default()
        };
        let framed = frame(&message);
        assert_eq!(framed[0], 0, "not compressed");
        let len = u32::from_be_bytes(framed[1..PREFIX].try_into().unwrap()) as usize;
        assert_eq!(len, framed.len() - PREFIX);
        assert_eq!(
            DeltaDiscoveryResponse::decode(&framed[PREFIX..]).unwrap(),
            message
        );
    }
}
