//! What every service process of the control plane shares, so that each
//! service's `main.rs` stays a few lines: serving gRPC with `grpc.health.v1` and
//! server reflection, stopping gracefully on SIGTERM, and setting up tracing.
//!
//! Health follows the process: a service is reported `SERVING` once it listens
//! and `NOT_SERVING` as soon as shutdown starts, so load balancers drain it
//! before in-flight calls are cut.

pub mod cron;
mod errors;
pub mod files;
mod grpc;
pub mod metrics;
pub mod pages;
mod shutdown;
mod signal;
mod telemetry;
pub mod trust;

pub use errors::{Classify, Failure, ToStatus, code};
pub use grpc::{GrpcServer, REDIS_PRIMARY_HEALTH, ServedService};
pub use shutdown::Shutdown;
pub use signal::termination_signal;
pub use telemetry::{
    LogConfig, LogFormat, Telemetry, TraceContext, TracedChannel, extract, follow, init_tracing, inject,
    link, traced, traceparent,
};
pub use trust::{Caller, ServiceCredentials, Trust, TrustConfig};

/// Errors of process set-up and serving.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("cannot listen on {addr}: {source} (is another process using that port? set another address)")]
    Bind { addr: std::net::SocketAddr, source: std::io::Error },
    #[error("cannot build gRPC server reflection from the compiled descriptors: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
    #[error("cannot install the signal handler: {0}")]
    Signal(std::io::Error),
    #[error(transparent)]
    Trust(#[from] trust::TrustError),
}

/// `<crate name>/<version>` of the crate invoking it: the user agent a service
/// presents to the APIs it calls (Kubernetes audit logs name it).
#[macro_export]
macro_rules! user_agent {
    () => {
        concat!(env!("CARGO_PKG_NAME"), "/", env!("CARGO_PKG_VERSION"))
    };
}

/// Flags every service process shares, each with its environment fallback
/// (`#[command(flatten)]` in a service's `Config`; where state lives is the
/// store's `StoreConfig`).
#[derive(Debug, Clone, clap::Args)]
pub struct SharedConfig {
    #[command(flatten)]
    pub log: LogConfig,
    #[command(flatten)]
    pub trust: TrustConfig,
}
