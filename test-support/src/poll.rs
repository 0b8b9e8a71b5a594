//! Polling until a condition holds: [`wait_for`] for blocking tests, [`eventually`] for
//! tests on a tokio runtime. Every wait in a test goes through one of these, with a
//! name for the failure message and an explicit timeout.

use std::time::{Duration, Instant};

use anyhow::Result;

/// Polls `check` every 20 ms until it returns `Some`, or fails after `timeout`.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            anyhow::bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls the async `check` until it holds; panics after `timeout`. The async twin of
/// [`wait_for`], for tests that run on a tokio runtime.
pub async fn eventually<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
