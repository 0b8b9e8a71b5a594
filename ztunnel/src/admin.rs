//! Admin endpoints on 127.0.0.1:15000, as in Istio's ztunnel: `/config_dump`,
//! `/logging`, `/quitquitquit`.

use std::sync::Arc;
use std::time::SystemTime;

use http::{Method, StatusCode};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::http::{json as json_response, text, SimpleRequest, SimpleResponse};
use crate::identity::{SecretManager, WorkloadCertificate};
use crate::state::StateStore;
use crate::telemetry::LogHandle;

/// What the admin server reads and controls.
#[derive(Clone)]
pub struct Admin {
    pub state: StateStore,
    pub certs: SecretManager,
    pub logging: Option<LogHandle>,
    /// Fired by `/quitquitquit`: the process drains and exits.
    pub shutdown: CancellationToken,
    /// The effective configuration, as shown under `config`.
    pub config: Value,
    /// Extra sections (e.g. in-pod workloads) contributed by other parts.
    pub extra: Arc<dyn Fn() -> serde_json::Map<String, Value> + Send + Sync>,
}

impl Admin {
    pub async fn handle(&self, request: SimpleRequest) -> SimpleResponse {
        match (request.method.clone(), request.path.as_str()) {
            (Method::GET, "/config_dump") => json_response(&self.config_dump()),
            (_, "/logging") => self.logging(&request),
            (Method::POST, "/quitquitquit") => {
                self.shutdown.cancel();
                text(StatusCode::OK, "OK\n")
            }
            (Method::GET, "/") => text(
                StatusCode::OK,
                "ztunnel admin:\n  GET  /config_dump\n  GET  /logging\n  POST /logging?level=<filter>\n  POST /quitquitquit\n",
            ),
            _ => text(StatusCode::NOT_FOUND, "not found\n"),
        }
    }

    /// Istio's keys: workloads, services, policies, certificates, config, version.
    pub fn config_dump(&self) -> Value {
        let mut dump = match self.state.dump() {
            Value::Object(map) => map,
            _ => serde_json::Map::new(),
        };
        let certificates: Vec<Value> = self
            .certs
            .certificates()
            .iter()
            .map(|c| certificate_json(c))
            .collect();
        dump.insert("certificates".into(), Value::Array(certificates));
        dump.insert("config".into(), self.config.clone());
        dump.insert(
            "version".into(),
            json!({"name": "ztunnel", "version": env!("CARGO_PKG_VERSION"), "rustVersion": "stable"}),
        );
        dump.extend((self.extra)());
        Value::Object(dump)
    }

    fn logging(&self, request: &SimpleRequest) -> SimpleResponse {
        let Some(logging) = &self.logging else {
            return text(
                StatusCode::NOT_IMPLEMENTED,
                "logging is not controllable in this process\n",
            );
        };
        let level = request
            .query
            .as_deref()
            .unwrap_or_default()
            .split('&')
            .find_map(|kv| kv.strip_prefix("level="));
        match (&request.method, level) {
            (&Method::POST, Some(level)) => match logging.set(level) {
                Ok(()) => text(
                    StatusCode::OK,
                    format!("current log level is {}\n", logging.current()),
                ),
                Err(e) => text(StatusCode::BAD_REQUEST, format!("{e}\n")),
            },
            (&Method::POST, None) => text(
                StatusCode::BAD_REQUEST,
                "usage: POST /logging?level=<filter>\n",
            ),
            _ => text(
                StatusCode::OK,
                format!("current log level is {}\n", logging.current()),
            ),
        }
    }
}

fn certificate_json(cert: &WorkloadCertificate) -> Value {
    let chain: Vec<Value> = cert
        .chain
        .iter()
        .enumerate()
        .map(|(i, der)| {
            let mut entry = json!({ "pem": pem(der) });
            if i == 0 {
                entry["serialNumber"] = json!(cert.serial);
                entry["validFrom"] = json!(rfc3339(cert.not_before));
                entry["expirationTime"] = json!(rfc3339(cert.not_after));
            }
            entry
        })
        .collect();
    let roots: Vec<Value> = cert
        .roots
        .iter()
        .map(|der| json!({ "pem": pem(der) }))
        .collect();
    let state = if SystemTime::now() < cert.not_after {
        "Available"
    } else {
        "Expired"
    };
    json!({
        "identity": cert.identity.to_uri(),
        "state": state,
        "certChain": chain,
        "rootCerts": roots,
    })
}

fn pem(der: &[u8]) -> String {
    crate::identity::ca::pem_encode("CERTIFICATE", der)
}

fn rfc3339(t: SystemTime) -> String {
    time::OffsetDateTime::from(t)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}
