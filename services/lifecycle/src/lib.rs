//! The lifecycle service: the controllers of Tenant, Service and System instances, and their agent Jobs.
//!
//! This crate is the library behind the `vynil-lifecycle` binary: its configuration
//! and its gRPC server. RPCs not implemented yet answer `UNIMPLEMENTED`.

use std::{future::Future, net::SocketAddr};

use vynil_proto::lifecycle::v1::lifecycle_server::{Lifecycle, LifecycleServer};
use vynil_runtime::{GrpcServer, RuntimeError, ServedService};

/// Configuration of the lifecycle service: flags, each with an environment fallback.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "vynil-lifecycle",
    version,
    about = "the controllers of Tenant, Service and System instances, and their agent Jobs."
)]
pub struct Config {
    /// Address the gRPC server listens on.
    #[arg(long, env = "VYNIL_LIFECYCLE_LISTEN", default_value = "0.0.0.0:50054")]
    pub listen: SocketAddr,
}

/// The gRPC service. Every RPC still answers `UNIMPLEMENTED`.
#[derive(Debug, Default)]
pub struct LifecycleService;

#[tonic::async_trait]
impl Lifecycle for LifecycleService {}

/// Binds, serves until `shutdown` resolves, then drains.
pub async fn run(config: Config, shutdown: impl Future<Output = ()> + Send) -> Result<(), RuntimeError> {
    let server = GrpcServer::bind(config.listen).await?;
    let service = ServedService::new(LifecycleServer::new(LifecycleService));
    server.serve(vec![service], shutdown).await
}
