//! Admin endpoints on 127.0.0.1:15000, as in Istio's ztunnel: `/config_dump`,
//! `/logging`, `/quitquitquit`.

use std::sync::Arc;
use std::time::SystemTime;

use http::{Method, StatusCode};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::identity::{SecretManager, WorkloadCertificate};
use crate::state::StateStore;
use crate::telemetry::LogHandle;
use mesh_runtime::http_server::{json as json_response, text, Request, Response};

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
    pub async fn handle(&self, request: Request) -> Response {
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

    fn logging(&self, request: &Request) -> Response {
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
    mesh_ca::pem_encode("CERTIFICATE", der)
}

fn rfc3339(t: SystemTime) -> String {
    time::OffsetDateTime::from(t)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{CertificateAuthority, Identity};
    use bytes::Bytes;
    use std::time::Duration;

    async fn admin() -> Admin {
        let ca = CertificateAuthority::generate_self_signed("cluster.local").unwrap();
        let certs = SecretManager::from_ca(ca, Duration::from_secs(3600));
        certs
            .fetch(&Identity::new("cluster.local", "ns", "sa"))
            .await
            .unwrap();
        Admin {
            state: StateStore::new(),
            certs,
            logging: None,
            shutdown: CancellationToken::new(),
            config: json!({"proxyMode": "Dedicated"}),
            extra: Arc::new(serde_json::Map::new),
        }
    }

    fn request(method: Method, path: &str, query: Option<&str>) -> Request {
        Request {
            method,
            path: path.into(),
            query: query.map(str::to_owned),
            headers: Default::default(),
            body: Bytes::new(),
        }
    }

    #[tokio::test]
    async fn config_dump_has_istio_keys_and_certificates() {
        let admin = admin().await;
        let dump = admin.config_dump();
        for key in [
            "workloads",
            "services",
            "policies",
            "certificates",
            "config",
            "version",
        ] {
            assert!(dump.get(key).is_some(), "missing {key}: {dump}");
        }
        let cert = &dump["certificates"][0];
        assert_eq!(cert["identity"], "spiffe://cluster.local/ns/ns/sa/sa");
        assert_eq!(cert["state"], "Available");
        assert!(cert["certChain"][0]["pem"]
            .as_str()
            .unwrap()
            .starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(cert["certChain"][0]["expirationTime"]
            .as_str()
            .unwrap()
            .ends_with('Z'));
        let response = admin
            .handle(request(Method::GET, "/config_dump", None))
            .await;
        assert_eq!(response.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn quitquitquit_requests_shutdown() {
        let admin = admin().await;
        assert_eq!(
            admin
                .handle(request(Method::GET, "/quitquitquit", None))
                .await
                .status(),
            StatusCode::NOT_FOUND
        );
        assert!(!admin.shutdown.is_cancelled());
        assert_eq!(
            admin
                .handle(request(Method::POST, "/quitquitquit", None))
                .await
                .status(),
            StatusCode::OK
        );
        assert!(admin.shutdown.is_cancelled());
    }

    #[tokio::test]
    async fn logging_changes_the_filter_and_refuses_bad_levels() {
        let (filter, handle) =
            tracing_subscriber::reload::Layer::new(tracing_subscriber::EnvFilter::new("info"));
        let _subscriber =
            tracing_subscriber::layer::SubscriberExt::with(tracing_subscriber::registry(), filter);
        let mut admin = admin().await;
        admin.logging = Some(LogHandle::from_handle(handle));
        let ok = admin
            .handle(request(Method::POST, "/logging", Some("level=debug")))
            .await;
        assert_eq!(ok.status(), StatusCode::OK);
        let bad = admin
            .handle(request(
                Method::POST,
                "/logging",
                Some("level=ztunnel=[bogus"),
            ))
            .await;
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
        let missing = admin.handle(request(Method::POST, "/logging", None)).await;
        assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    }
}
