//! Termination signals: Kubernetes sends SIGTERM, a terminal sends SIGINT.

use crate::RuntimeError;

/// Resolves on the first SIGTERM or SIGINT. The handlers are installed when this
/// is called, not when the future is first polled, so no early signal is lost.
pub fn termination_signal() -> Result<impl std::future::Future<Output = ()> + Send, RuntimeError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(RuntimeError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(RuntimeError::Signal)?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
    })
}
