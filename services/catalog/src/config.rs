//! The catalog's flags, each with its environment fallback.

use std::net::SocketAddr;

/// Configuration of the catalog service: flags, each with an environment fallback.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "vynil-catalog", version, about = "The package cache of the Vynil control plane")]
pub struct Config {
    /// Address the gRPC server listens on.
    #[arg(long, env = "VYNIL_CATALOG_LISTEN", default_value = "0.0.0.0:50051")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub shared: vynil_runtime::SharedConfig,
    #[command(flatten)]
    pub store: vynil_store::StoreConfig,
    /// Full resync period (repairs missed notifications and removed files).
    #[arg(long, env = "VYNIL_CATALOG_RESYNC_SECONDS", default_value_t = 30)]
    pub resync_seconds: u64,
}
