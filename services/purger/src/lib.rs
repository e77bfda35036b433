//! The purger service: type-aware, usage-aware registry retention with plans, named confirmation and verified deletion.
//!
//! This crate is the library behind the `vynil-purger` binary: its configuration
//! and its gRPC server. RPCs not implemented yet answer `UNIMPLEMENTED`.

use std::{future::Future, net::SocketAddr};

use vynil_proto::purger::v1::purger_server::{Purger, PurgerServer};
use vynil_runtime::{GrpcServer, RuntimeError, ServedService};

/// Configuration of the purger service: flags, each with an environment fallback.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "vynil-purger",
    version,
    about = "type-aware, usage-aware registry retention with plans, named confirmation and verified deletion."
)]
pub struct Config {
    /// Address the gRPC server listens on.
    #[arg(long, env = "VYNIL_PURGER_LISTEN", default_value = "0.0.0.0:50053")]
    pub listen: SocketAddr,
}

/// The gRPC service. Every RPC still answers `UNIMPLEMENTED`.
#[derive(Debug, Default)]
pub struct PurgerService;

#[tonic::async_trait]
impl Purger for PurgerService {}

/// Binds, serves until `shutdown` resolves, then drains.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), RuntimeError> {
    let server = GrpcServer::bind(config.listen).await?;
    let service = ServedService::new(PurgerServer::new(PurgerService));
    server.serve(vec![service], shutdown).await
}
