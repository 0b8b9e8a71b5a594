//! The real [`CmdAddHandler`]: a pod that is not ambient starts at once; an ambient
//! pod starts only once it is enrolled (fail closed), retried with backoff until the
//! CNI event timeout, which is shorter than the plugin's own.

use crate::enroll::{EnrollError, Enroller};
use crate::http_server::BoxFuture;
use crate::queue::Backoff;
use crate::uds::event::{CmdAddError, CmdAddHandler};
use shared_types::cni::CniPluginAddEvent;
use std::net::IpAddr;
use std::path::PathBuf;
use tokio::time::Instant;

pub struct EnrollOnAdd {
    pub enroller: Enroller,
    pub backoff: Backoff,
}

impl EnrollOnAdd {
    pub fn new(enroller: Enroller) -> Self {
        EnrollOnAdd {
            enroller,
            backoff: Backoff::default(),
        }
    }

    async fn run(&self, event: CniPluginAddEvent) -> Result<(), CmdAddError> {
        let e = &self.enroller;
        let key = format!("{}/{}", event.pod_namespace, event.pod_name);
        let deadline = Instant::now() + e.config.cni_event_timeout;
        let pod = loop {
            match e.kube.pod(&key).await {
                Ok(Some(pod)) => break pod,
                Ok(None) => return Err(CmdAddError::Failed(format!("pod {key} not found"))),
                Err(err) if Instant::now() >= deadline => {
                    return Err(CmdAddError::Failed(format!("looking up pod {key}: {err}")))
                }
                Err(err) => {
                    tracing::info!(pod = %key, "looking up the pod: {err}");
                    tokio::time::sleep(self.backoff.initial * 5).await;
                }
            }
        };
        let namespace = e
            .kube
            .namespace_or_get(&event.pod_namespace)
            .await
            .ok()
            .flatten();
        let decision = e.config.selection.decide(&pod, namespace.as_deref());
        if !decision.is_ambient() {
            tracing::info!(pod = %key, ?decision, "pod ADD: not ambient");
            return Ok(());
        }
        let mut ips: Vec<IpAddr> = event.ips.iter().map(|c| c.address.ip).collect();
        if ips.is_empty() {
            ips = crate::enroll::pod_ips(&pod);
        }
        let netns = PathBuf::from(&event.netns);
        let mut failures = 0;
        loop {
            let result = {
                let _guard = e.pod_lock(&key).await;
                e.enroll(&pod, Some(&netns), &ips).await
            };
            let err: EnrollError = match result {
                Ok(()) => return Ok(()),
                Err(err) => err,
            };
            failures += 1;
            let delay = self.backoff.delay(failures);
            if Instant::now() + delay >= deadline {
                e.report_failure(&pod, &err).await;
                return Err(CmdAddError::Failed(format!(
                    "pod {key} could not be enrolled in ambient within {:?}: {err}",
                    e.config.cni_event_timeout
                )));
            }
            tokio::time::sleep(delay).await;
        }
    }
}

impl CmdAddHandler for EnrollOnAdd {
    fn handle(&self, event: CniPluginAddEvent) -> BoxFuture<Result<(), CmdAddError>> {
        let this = EnrollOnAdd {
            enroller: self.enroller.clone(),
            backoff: self.backoff,
        };
        Box::pin(async move { this.run(event).await })
    }
}
