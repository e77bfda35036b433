//! Waiting on an event, never on a time that should hold it: what every
//! test harness of the workspace shares (a deadline only guards a hang).

use std::{
    future::Future,
    net::SocketAddr,
    time::{Duration, Instant},
};

/// How long a wait may take before it fails: a hang guard, not a figure.
const HANG_GUARD: Duration = Duration::from_secs(60);

/// Polls `check` until it answers `Some`, or fails naming `what`.
pub async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, mut check: impl FnMut() -> F) -> T {
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A channel to the gRPC server at `addr`, once it answers.
pub async fn channel(addr: SocketAddr) -> tonic::transport::Channel {
    let endpoint = format!("http://{addr}");
    eventually(&format!("{addr} to answer"), || async {
        tonic::transport::Channel::from_shared(endpoint.clone()).ok()?.connect().await.ok()
    })
    .await
}
