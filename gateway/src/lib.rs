//! The gateway: the only HTTP/JSON entry point for humans, the CLI and CI. It
//! authenticates, authorises and forwards to the services over gRPC; it never
//! writes to Kubernetes itself.
//!
//! Today it serves `/healthz` and answers `501 Not Implemented` with a JSON body
//! for every API route, so that clients see a clear answer rather than fake data.

use std::{future::Future, net::SocketAddr};

use axum::{Json, Router, http::StatusCode, routing::get};
use serde_json::json;

/// Gateway configuration: flags, each with an environment fallback.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "vynil-gateway", version, about = "HTTP/JSON front of the Vynil control plane")]
pub struct Config {
    /// Address the HTTP server listens on.
    #[arg(long, env = "VYNIL_GATEWAY_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub log: vynil_runtime::LogConfig,
}

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("cannot listen on {addr}: {source} (is another process using that port? set --listen)")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("HTTP server failed: {0}")]
    Serve(std::io::Error),
}

/// The HTTP routes.
pub fn router() -> Router {
    Router::new().route("/healthz", get(|| async { "ok" })).fallback(|| async {
        (
            StatusCode::NOT_IMPLEMENTED,
            Json(json!({
                "code": "NOT_IMPLEMENTED",
                "message": "this gateway route is not implemented yet",
            })),
        )
    })
}

/// Serves until `shutdown` resolves, then drains.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), GatewayError> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| GatewayError::Bind { addr: config.listen, source })?;
    tracing::info!(address = %config.listen, "serving HTTP");
    axum::serve(listener, router()).with_graceful_shutdown(shutdown).await.map_err(GatewayError::Serve)
}
