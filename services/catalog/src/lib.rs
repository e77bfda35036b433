//! The catalog service: the package cache; answers which package revision to install or clean up, from JukeBox status.
//!
//! This crate is the library behind the `vynil-catalog` binary: its configuration
//! and its gRPC server. RPCs not implemented yet answer `UNIMPLEMENTED`.

use std::{future::Future, net::SocketAddr};

use vynil_proto::catalog::v1::catalog_server::{Catalog, CatalogServer};
use vynil_runtime::{GrpcServer, RuntimeError, ServedService};

/// Configuration of the catalog service: flags, each with an environment fallback.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "vynil-catalog",
    version,
    about = "the package cache; answers which package revision to install or clean up, from JukeBox status."
)]
pub struct Config {
    /// Address the gRPC server listens on.
    #[arg(long, env = "VYNIL_CATALOG_LISTEN", default_value = "0.0.0.0:50051")]
    pub listen: SocketAddr,
}

/// The gRPC service. Every RPC still answers `UNIMPLEMENTED`.
#[derive(Debug, Default)]
pub struct CatalogService;

#[tonic::async_trait]
impl Catalog for CatalogService {}

/// Binds, serves until `shutdown` resolves, then drains.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), RuntimeError> {
    let server = GrpcServer::bind(config.listen).await?;
    let service = ServedService::new(CatalogServer::new(CatalogService));
    server.serve(vec![service], shutdown).await
}
