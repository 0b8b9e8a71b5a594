//! Projected volumes the way kubelet keeps them: a service-account token from
//! TokenRequest, bound to a pod and rewritten before it expires (at 80 % of its
//! lifetime, kubelet's rule), and a ConfigMap key kept in step with the API.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};

use crate::api::Api;

const SYNC_EVERY: Duration = Duration::from_millis(500);

/// What to project, and where.
#[derive(Clone, Debug)]
pub struct ProjectedToken {
    pub namespace: String,
    pub service_account: String,
    pub audience: String,
    pub expiration_secs: i64,
    /// (name, uid) of the pod the token is bound to.
    pub pod: (String, String),
    pub path: PathBuf,
}

#[derive(Clone, Debug)]
pub struct ProjectedConfigMap {
    pub namespace: String,
    pub name: String,
    pub key: String,
    pub path: PathBuf,
}

/// The refresher thread; stopped on drop.
pub struct Projector {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Projector {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Projector {
    /// Writes the token now and waits for the ConfigMap (up to `wait`), then keeps
    /// both fresh in the background.
    pub fn start(
        api: Api,
        token: ProjectedToken,
        configmap: ProjectedConfigMap,
        wait: Duration,
    ) -> Result<Self> {
        let mut refresh_at = write_token(&api, &token)?;
        test_support::poll::wait_for(
            &format!("ConfigMap {}/{}", configmap.namespace, configmap.name),
            wait,
            || {
                sync_configmap(&api, &configmap)
                    .ok()
                    .filter(|written| *written)
            },
        )?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(SYNC_EVERY);
                    if SystemTime::now() >= refresh_at {
                        if let Ok(next) = write_token(&api, &token) {
                            refresh_at = next;
                        }
                    }
                    let _ = sync_configmap(&api, &configmap);
                }
            })
        };
        Ok(Projector {
            stop,
            thread: Some(thread),
        })
    }
}

/// Requests and writes a token; returns when kubelet would refresh it.
pub(super) fn write_token(api: &Api, t: &ProjectedToken) -> Result<SystemTime> {
    let issued = SystemTime::now();
    let (token, expires) = api
        .request_token(
            &t.namespace,
            &t.service_account,
            // No audience: the API server's own (a token for talking to it).
            &[t.audience.as_str()][..usize::from(!t.audience.is_empty())],
            t.expiration_secs,
            Some((t.pod.0.as_str(), t.pod.1.as_str())),
        )
        .with_context(|| format!("TokenRequest for {}/{}", t.namespace, t.service_account))?;
    write_atomically(&t.path, token.as_bytes())?;
    let lifetime = expires.duration_since(issued).unwrap_or_default();
    Ok(issued + lifetime.mul_f64(0.8))
}

/// Writes the key's value if it changed; `Ok(true)` once the file holds it.
fn sync_configmap(api: &Api, c: &ProjectedConfigMap) -> Result<bool> {
    let cm = api.get(&format!(
        "/api/v1/namespaces/{}/configmaps/{}",
        c.namespace, c.name
    ))?;
    let Some(value) = cm["data"][&c.key].as_str() else {
        return Ok(false);
    };
    if std::fs::read_to_string(&c.path).ok().as_deref() != Some(value) {
        write_atomically(&c.path, value.as_bytes())?;
    }
    Ok(true)
}

/// Projected volumes are swapped atomically, so readers never see half a file.
pub(super) fn write_atomically(path: &Path, contents: &[u8]) -> Result<()> {
    let dir = path.parent().context("projected file has no directory")?;
    std::fs::create_dir_all(dir)?;
    mesh_runtime::fs::write_atomic(path, contents, 0o644)?;
    Ok(())
}
