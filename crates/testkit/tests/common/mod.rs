//! What the fake API server's tests share.

use std::time::Duration;

pub type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Waits until `check` holds (the fake does some things asynchronously, as
/// a real server does: garbage collection, namespace termination), at most
/// five seconds.
pub async fn eventually<F, Fut>(check: F, what: &str) -> TestResult
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..500 {
        if check().await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err(format!("never happened: {what}").into())
}
