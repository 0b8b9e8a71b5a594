//! `/debug/pprof/profile`: a CPU profile in pprof's protobuf format, sampled at
//! 1000 Hz for a fixed time (10 s, as Istio's ztunnel), with the `pprof` crate.

use std::time::Duration;

use http::StatusCode;
use mesh_runtime::http_server::{text, Response};
use pprof::protos::Message as _;

/// How long Istio's ztunnel samples.
pub const PROFILE_DURATION: Duration = Duration::from_secs(10);

/// Samples the whole process for `duration` and answers the encoded profile.
pub async fn profile(duration: Duration) -> Response {
    let guard = match pprof::ProfilerGuardBuilder::default()
        .frequency(1000)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()
    {
        Ok(guard) => guard,
        Err(e) => return failed(e),
    };
    tokio::time::sleep(duration).await;
    let encoded = guard
        .report()
        .build()
        .and_then(|report| report.pprof())
        .map(|profile| profile.encode_to_vec());
    match encoded {
        Ok(bytes) => {
            let mut response = http::Response::new(http_body_util::Full::new(bytes.into()));
            *response.status_mut() = StatusCode::OK;
            response
        }
        Err(e) => failed(e),
    }
}

fn failed(e: pprof::Error) -> Response {
    text(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("failed to build profile: {e}\n"),
    )
}
