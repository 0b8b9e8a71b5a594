//! Admin endpoints on 127.0.0.1:15000, as Istio's ztunnel serves them:
//! `/config_dump` (Istio's shape, [`dump`]), `/logging` ([`logging`]),
//! `/quitquitquit` (a graceful drain), `/debug/pprof/profile` ([`pprof`]) and an
//! index page.

pub mod certs;
pub mod config;
pub mod logging;
pub mod pprof;
pub mod views;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, StatusCode};
use http_body_util::Full;
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use crate::discovery::local::parse_local_config;
use crate::identity::SecretManager;
use crate::inpod::statemanager::PodSummary;
use crate::proxy::connections::ConnectionManager;
use crate::state::StateStore;
use mesh_runtime::http_server::{json as json_response, Request, Response};
use mesh_runtime::logging::LogHandle;

/// Produces `workloadState`: the pods this ztunnel serves, keyed by pod uid.
pub type WorkloadStateFn = Arc<dyn Fn() -> Map<String, Value> + Send + Sync>;

/// What the admin server reads and controls.
#[derive(Clone)]
pub struct Admin {
    /// Workloads, services and policies.
    pub state: StateStore,
    /// The workload certificates.
    pub certs: SecretManager,
    /// The live log filter; `None` when logging is not ours to change.
    pub logging: Option<LogHandle>,
    /// Fired by `/quitquitquit`: the process drains and exits.
    pub shutdown: CancellationToken,
    /// Fired by the app once the drain after a shutdown is done.
    pub drained: CancellationToken,
    /// How long `/quitquitquit` waits for the drain (Istio's `selfTerminationDeadline`).
    pub drain_deadline: Duration,
    /// The `config` section ([`config::config`]).
    pub config: Value,
    /// `LOCAL_XDS_PATH`, shown parsed as `staticConfig`.
    pub local_config: Option<PathBuf>,
    /// The `workloadState` section.
    pub workload_state: WorkloadStateFn,
    /// How long `/debug/pprof/profile` samples.
    pub profile_duration: Duration,
}

const INDEX: &str = "<!DOCTYPE html>\n<html><head><title>ztunnel admin</title></head><body>\n<h1>ztunnel admin</h1>\n<ul>\n<li><a href=\"/config_dump\">/config_dump</a>: workloads, services, policies, certificates, workload state, config</li>\n<li>POST /logging[?level=&lt;level&gt;[&amp;reset]]: list or change the log level</li>\n<li>POST /quitquitquit: drain and exit</li>\n<li><a href=\"/debug/pprof/profile\">/debug/pprof/profile</a>: a 10 s CPU profile (pprof)</li>\n</ul>\n</body></html>\n";

impl Admin {
    /// Answers one request (routing by path, as Istio's ztunnel).
    pub async fn handle(&self, request: Request) -> Response {
        match request.path.as_str() {
            "/config_dump" => json_response(&self.config_dump()),
            "/logging" => logging::handle(&request, self.logging.as_ref()),
            "/quitquitquit" if request.method == Method::POST => self.quit().await,
            "/quitquitquit" => empty(StatusCode::METHOD_NOT_ALLOWED),
            "/debug/pprof/profile" => pprof::profile(self.profile_duration).await,
            "/" => {
                let mut response = mesh_runtime::http_server::text(StatusCode::OK, INDEX);
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/html; charset=utf-8"),
                );
                response
            }
            _ => empty(StatusCode::NOT_FOUND),
        }
    }

    /// Starts the shutdown and answers once the drain is done or its deadline passed.
    async fn quit(&self) -> Response {
        self.shutdown.cancel();
        match tokio::time::timeout(self.drain_deadline, self.drained.cancelled()).await {
            Ok(()) => tracing::info!("Shutdown completed gracefully"),
            Err(_) => tracing::warn!(
                "Graceful shutdown did not complete in {:?}, terminating now",
                self.drain_deadline
            ),
        }
        mesh_runtime::http_server::text(StatusCode::OK, "shutdown now\n")
    }

    /// The whole dump: Istio's sections, keys sorted at every level.
    pub fn config_dump(&self) -> Value {
        let mut dump = views::state_sections(&self.state.snapshot());
        dump.insert(
            "certificates".into(),
            certs::certificates(self.certs.states()),
        );
        dump.insert(
            "workloadState".into(),
            Value::Object((self.workload_state)()),
        );
        // Nothing is ever staged here (Istio stages endpoints of services not yet known).
        dump.insert("stagedServices".into(), json!({}));
        dump.insert("staticConfig".into(), self.static_config());
        dump.insert("config".into(), self.config.clone());
        dump.insert("version".into(), config::version());
        views::sorted(Value::Object(dump))
    }

    /// The local config file's contents, as loaded now (empty without one, or when
    /// it does not parse: the last good one is what the state holds).
    fn static_config(&self) -> Value {
        let parsed = self
            .local_config
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|text| parse_local_config(&text).ok());
        match parsed {
            Some(state) => Value::Object(views::state_sections(&state)),
            None => json!({"workloads": [], "services": [], "policies": []}),
        }
    }
}

/// `workloadState` from the pods served and their live connections: Istio's `state`,
/// `info` and `connections`, plus our `identity` and `netnsInode`.
pub fn workload_state(pods: &[PodSummary], connections: &ConnectionManager) -> Map<String, Value> {
    pods.iter()
        .map(|pod| {
            let (inbound, outbound) = connections.of_workload(&pod.namespace, &pod.name);
            let entry = json!({
                "state": pod.state,
                "info": {
                    "name": pod.name,
                    "namespace": pod.namespace,
                    "serviceAccount": pod.service_account,
                },
                "connections": {"inbound": inbound, "outbound": outbound},
                "identity": pod.identity,
                "netnsInode": pod.netns_inode,
            });
            (pod.uid.clone(), entry)
        })
        .collect()
}

fn empty(status: StatusCode) -> Response {
    let mut response = http::Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests;
