//! The scanner service: reads registries and records in JukeBox status what each consumer may be shown.
//!
//! This crate is the library behind the `vynil-scanner` binary: its configuration
//! and its gRPC server. RPCs not implemented yet answer `UNIMPLEMENTED`.

use std::{future::Future, net::SocketAddr};

use vynil_proto::scanner::v1::scanner_server::{Scanner, ScannerServer};
use vynil_runtime::{GrpcServer, RuntimeError, ServedService};

/// Configuration of the scanner service: flags, each with an environment fallback.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "vynil-scanner",
    version,
    about = "reads registries and records in JukeBox status what each consumer may be shown."
)]
pub struct Config {
    /// Address the gRPC server listens on.
    #[arg(long, env = "VYNIL_SCANNER_LISTEN", default_value = "0.0.0.0:50052")]
    pub listen: SocketAddr,
}

/// The gRPC service. Every RPC still answers `UNIMPLEMENTED`.
#[derive(Debug, Default)]
pub struct ScannerService;

#[tonic::async_trait]
impl Scanner for ScannerService {}

/// Binds, serves until `shutdown` resolves, then drains.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), RuntimeError> {
    let server = GrpcServer::bind(config.listen).await?;
    let service = ServedService::new(ScannerServer::new(ScannerService));
    server.serve(vec![service], shutdown).await
}
