//! Polling until a condition holds: [`wait_for`] for blocking tests, [`eventually`] for
//! tests on a tokio runtime (with a plain or an async check). Every wait in a test
//! goes through one of these, with a name for the failure message and an explicit
//! timeout.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::Result;

/// How often a condition is checked again.
const INTERVAL: Duration = Duration::from_millis(20);

/// Polls `check` until it returns `Some`, or fails after `timeout`.
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
        std::thread::sleep(INTERVAL);
    }
}

/// Polls `check` until it holds; panics after `timeout`. The async twin of
/// [`wait_for`]: `check` is a closure returning `bool` or a future of one.
pub async fn eventually<M>(what: &str, timeout: Duration, mut check: impl Check<M>) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !check.holds().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(INTERVAL).await;
    }
}

/// A condition [`eventually`] polls: a closure returning `bool` ([`Plain`]) or a future
/// of one ([`Async`]).
pub trait Check<M> {
    /// Whether the condition holds now.
    fn holds(&mut self) -> impl Future<Output = bool>;
}

/// [`Check`] marker of a closure returning `bool`.
pub struct Plain;

/// [`Check`] marker of a closure returning a future.
pub struct Async;

impl<F: FnMut() -> bool> Check<Plain> for F {
    fn holds(&mut self) -> impl Future<Output = bool> {
        std::future::ready(self())
    }
}

impl<F, Fut> Check<Async> for F
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    fn holds(&mut self) -> impl Future<Output = bool> {
        self()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn plain_and_async_checks_are_polled_until_they_hold() {
        let mut n = 0;
        eventually("a plain check", Duration::from_secs(5), || {
            n += 1;
            n == 3
        })
        .await;
        let start = std::time::Instant::now();
        eventually("an async check", Duration::from_secs(5), || async {
            start.elapsed() > Duration::from_millis(50)
        })
        .await;
        let failed = tokio::spawn(eventually("never", Duration::from_millis(50), || false));
        assert!(failed.await.is_err(), "a check that never holds fails");
        assert_eq!(wait_for("now", Duration::ZERO, || Some(7)).unwrap(), 7);
        assert!(wait_for("never", Duration::ZERO, || None::<()>).is_err());
    }
}
