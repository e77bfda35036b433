//! One shutdown signal a whole service shares (mini-redis's `shutdown.rs`,
//! linkerd's `drain`): the process's termination future triggers it, and
//! everything long-lived — server-streaming RPCs, background loops — ends
//! when it fires. Without it a graceful drain waits forever on a
//! `WatchCatalog` stream that only its client would ever close.

use std::future::Future;

use tokio_util::sync::CancellationToken;

/// A cloneable shutdown signal; every clone sees the same trigger.
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    token: CancellationToken,
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    /// A signal that fires with this one, and can also be fired alone (to
    /// stop one task, a schedule that changed, while the service goes on).
    pub fn child(&self) -> Shutdown {
        Shutdown { token: self.token.child_token() }
    }

    /// Fires the signal (idempotent).
    pub fn trigger(&self) {
        self.token.cancel();
    }

    pub fn is_triggered(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Resolves once the signal fired; owns what it needs, so it can be
    /// moved into a stream or a task.
    pub fn signaled(&self) -> impl Future<Output = ()> + Send + 'static {
        self.token.clone().cancelled_owned()
    }

    /// Waits for `outer` (the process's termination, a test's stop), then
    /// fires this signal: what to hand the server as its drain future.
    pub fn after<F>(&self, outer: F) -> impl Future<Output = ()> + Send + use<F>
    where
        F: Future<Output = ()> + Send,
    {
        let token = self.token.clone();
        async move {
            tokio::select! {
                () = outer => token.cancel(),
                () = token.cancelled() => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_clone_sees_the_outer_signal() {
        let shutdown = Shutdown::new();
        let waiter = tokio::spawn(shutdown.clone().signaled());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let drain = tokio::spawn(shutdown.after(async move {
            let _ = stopped.await;
        }));
        assert!(!shutdown.is_triggered());
        stop.send(()).ok();
        drain.await.ok();
        waiter.await.ok();
        assert!(shutdown.is_triggered());
    }
}
