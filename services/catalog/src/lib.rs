//! The catalog: the package cache, and every "which package?" answer.
//!
//! It follows JukeBox **status** (never scan Jobs: the fix of upstream #17 by
//! design): each status change updates that JukeBox's entry, identical
//! content writes nothing, a deleted JukeBox loses its entry. Answers come from
//! the rules crate over an in-process snapshot; with Redis, replicas share the
//! entries and refresh their snapshots on pub/sub invalidations, and a Redis
//! outage leaves reads working from the last snapshot: health stays SERVING
//! and reports the cache as NOT_SERVING under `vynil.catalog.v1.Catalog/cache`.
//! An answer the catalog cannot give (nothing loaded yet) is `UNAVAILABLE`,
//! never "not found".
//!
//! JukeBoxes come from the store the flags choose: in a cluster
//! (`--kubernetes`) a kube watcher on JukeBoxes, status included; outside one,
//! the local store (YAML files, status written by the scanner).

mod catalog;
mod config;
mod grpc;
mod metrics;

use std::{future::Future, sync::Arc};

use vynil_proto::catalog::v1::catalog_server::CatalogServer;
use vynil_runtime::{GrpcServer, ServedService, Shutdown};
use vynil_store::JukeboxStore;

pub use catalog::{CACHE_HEALTH, Catalog, Change};
pub use config::Config;
pub use grpc::CatalogService;
pub use vynil_store::package_cache::{CHANGES, Entry, MemoryCache, PackageCache, RedisCache};

/// Errors of the catalog, mapped to gRPC codes in `grpc.rs`.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error(transparent)]
    Serve(#[from] vynil_runtime::RuntimeError),
}

impl From<vynil_store::StoreError> for CatalogError {
    fn from(error: vynil_store::StoreError) -> Self {
        CatalogError::Unavailable(error.to_string())
    }
}

/// The store the flags name.
async fn open_store(config: &Config) -> Result<Arc<dyn JukeboxStore>, CatalogError> {
    Ok(vynil_store::open(&config.store.store_settings(vynil_runtime::user_agent!())).await?)
}

/// The catalog over the configured store, loaded once.
pub async fn build(config: &Config) -> Result<Arc<Catalog>, CatalogError> {
    build_with_store(config, open_store(config).await?).await
}

/// The catalog over a store opened by the caller (local mode shares one).
pub async fn build_with_store(
    config: &Config,
    store: Arc<dyn JukeboxStore>,
) -> Result<Arc<Catalog>, CatalogError> {
    let catalog = Arc::new(
        Catalog::new(store, config.store.redis().as_ref(), config.store.vynil_version.clone()).await?,
    );
    if let Err(error) = catalog.resync().await {
        tracing::warn!(%error, "initial catalog load failed; retrying in the background");
    }
    Ok(catalog)
}

/// Binds, serves and follows changes until `shutdown` resolves, then drains.
pub async fn run(config: Config, shutdown: impl Future<Output = ()> + Send) -> Result<(), CatalogError> {
    let server = GrpcServer::bind(config.listen).await?;
    run_on(server, config, shutdown).await
}

/// [`run`] on a server the caller bound (on port 0, its address known
/// before anything dials it).
pub async fn run_on(
    server: GrpcServer,
    config: Config,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), CatalogError> {
    let store = open_store(&config).await?;
    run_with_store(server, config, store, shutdown).await
}

/// [`run_on`] over a store opened by the caller.
pub async fn run_with_store(
    server: GrpcServer,
    config: Config,
    store: Arc<dyn JukeboxStore>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), CatalogError> {
    let catalog = build_with_store(&config, store).await?;
    let drain = Shutdown::new();
    let follow = catalog.clone().follow(std::time::Duration::from_secs(config.resync_seconds.max(1)));
    let stop = drain.signaled();
    let follower = tokio::spawn(async move {
        tokio::select! {
            () = follow => {}
            () = stop => {}
        }
    });
    let server = server
        .with_metrics(catalog.metrics.register())
        .with_component(catalog::CACHE_HEALTH, catalog.cache_health())
        .with_redis_primary(config.store.redis_health());
    let service = CatalogServer::new(CatalogService::new(catalog, drain.clone()));
    let served = server
        .serve(vec![ServedService::new(service, vynil_proto::FILE_DESCRIPTOR_SET)], drain.after(shutdown))
        .await;
    drain.trigger();
    let _ = follower.await;
    served?;
    Ok(())
}
