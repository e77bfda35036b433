//! The scanner: reads registries and records, in each JukeBox's status, what
//! consumers may be shown — computed by the rules crate (waypoints and the
//! type-aware view), merged so a partial or failed scan keeps what it does not
//! own. Scans run here (no scan Jobs), requested through `Scan` and recorded
//! durably: one scan per JukeBox at a time across replicas.
//!
//! JukeBoxes come from the store the flags choose (Kubernetes with
//! `--kubernetes`, else YAML files with status in memory or Redis). Scans are
//! requested by `Scan`, the `force-scan` annotation and `spec.schedule`
//! (`triggers`); a JukeBox's pull secret gives the credentials of its scans.

mod config;
mod engine;
pub mod export;
mod grpc;
mod index;
mod metrics;
mod recalls;
mod requests;
mod schedule;
mod signatures;
mod triggers;
mod worker;

use std::{future::Future, sync::Arc, time::Duration};

use vynil_proto::scanner::v1::scanner_server::ScannerServer;
use vynil_registry::{CredentialStore, InMemoryMetadataCache, MetadataCache, RegistryClient};
use vynil_runtime::{GrpcServer, ServedService, Shutdown};

pub use config::{Config, ScanLimits};
pub use engine::{EngineSettings, ScanOutput, new_status};
pub use grpc::ScannerService;
pub use requests::{MemoryQueue, RecordState, RedisQueue, RequestQueue, ScanRecord};
pub use triggers::{Triggers, read_force_scan};
pub use vynil_store::{
    CHANGES_CHANNEL, JukeboxRecord, JukeboxStore, LocalStore, ScannerStore, StoreSettings,
};
pub use worker::Scanner;

#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Scans a JukeBox file's OCI source and writes an index (`index.yaml`
    /// and package files) that http and s3 JukeBoxes of any maturity and
    /// framework version consume.
    Export(export::ExportArgs),
}

/// Errors of the scanner, mapped to gRPC codes in `grpc.rs`.
#[derive(Debug, thiserror::Error)]
pub enum ScannerError {
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    NotFound(String),
    #[error("store unavailable: {0}; retry when it is back")]
    Store(String),
    #[error("the status of {0} changed concurrently too many times; retry")]
    Conflict(String),
    #[error("{0}: the scan lease was lost to another replica, which runs the scan now")]
    LeaseLost(String),
    /// A record the shared state lost (`vynil_store::epoch`).
    #[error("{0}")]
    Lost(String),
    #[error(transparent)]
    Rules(#[from] vynil_rules::RulesError),
    #[error(transparent)]
    Registry(#[from] vynil_registry::RegistryError),
    #[error(transparent)]
    Index(#[from] vynil_index::IndexError),
    #[error(transparent)]
    Serve(#[from] vynil_runtime::RuntimeError),
}

impl From<vynil_store::StoreError> for ScannerError {
    fn from(error: vynil_store::StoreError) -> Self {
        match error {
            vynil_store::StoreError::Config(why) => ScannerError::Config(why),
            vynil_store::StoreError::SecretRefused(refused) => ScannerError::Config(refused.to_string()),
            vynil_store::StoreError::Unavailable(why) => ScannerError::Store(why),
            vynil_store::StoreError::Conflict(name) => ScannerError::Conflict(name),
            vynil_store::StoreError::Lost(what) => ScannerError::Lost(what),
        }
    }
}

impl From<vynil_store::lease::LeaseError> for ScannerError {
    fn from(error: vynil_store::lease::LeaseError) -> Self {
        match error {
            vynil_store::lease::LeaseError::Lost(what) => ScannerError::LeaseLost(what),
            vynil_store::lease::LeaseError::Store(store) => store.into(),
        }
    }
}

/// The store the flags name.
async fn open_store(config: &Config) -> Result<Arc<dyn ScannerStore>, ScannerError> {
    Ok(vynil_store::open(&config.store.store_settings(vynil_runtime::user_agent!())).await?)
}

/// Builds the scanner from its configuration.
pub async fn build(config: &Config) -> Result<Arc<Scanner>, ScannerError> {
    build_with_store(config, open_store(config).await?).await
}

/// Builds the scanner over a store opened by the caller (local mode shares one).
pub async fn build_with_store(
    config: &Config,
    store: Arc<dyn ScannerStore>,
) -> Result<Arc<Scanner>, ScannerError> {
    let (queue, cache, index_cache): (Arc<dyn RequestQueue>, Arc<dyn MetadataCache>, _) =
        match &config.store.redis() {
            Some(target) => {
                let cache = Arc::new(vynil_store::metadata_cache::RedisMetadataCache::connect(target).await?);
                let index_cache = vynil_index::ConditionalCache::new(cache.clone());
                (Arc::new(RedisQueue::connect(target).await?), cache, index_cache)
            }
            None => (
                Arc::new(MemoryQueue::default()),
                Arc::new(InMemoryMetadataCache::with_capacity(config.limits.metadata_cache_entries)),
                vynil_index::ConditionalCache::default(),
            ),
        };
    let credentials = CredentialStore::from_file(config.store.dockerconfig.as_deref())?;
    let client = RegistryClient::new(config.store.transport(), credentials, cache)?;
    let (metrics, exported_metrics) = metrics::ScannerMetrics::register(&client.counters());
    Ok(Arc::new(Scanner {
        metrics,
        exported_metrics,
        store,
        queue,
        client,
        index_cache,
        settings: config.limits.settings(config.store.vynil_version.clone(), config.store.scripts()),
        holder: config.store.replica_name("scanner"),
        lease: Duration::from_secs(config.scan_lease_seconds.max(1)),
        poll: Duration::from_millis(config.poll_milliseconds.max(10)),
        settle: Duration::from_millis(config.push_settle_milliseconds),
        settle_limit: Duration::from_millis(config.push_settle_limit_milliseconds),
        wake: tokio::sync::Notify::new(),
        exports: export::Destinations::new(&config.export_destinations),
    }))
}

/// Binds, serves and works until `shutdown` resolves, then drains (or runs
/// the command the configuration names).
pub async fn run(config: Config, shutdown: impl Future<Output = ()> + Send) -> Result<(), ScannerError> {
    if let Some(Command::Export(args)) = config.command {
        return export::run_cli(args).await;
    }
    let server = GrpcServer::bind(config.listen).await?;
    run_on(server, config, shutdown).await
}

/// [`run`] on a server the caller bound (on port 0, its address known
/// before anything dials it).
pub async fn run_on(
    server: GrpcServer,
    config: Config,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ScannerError> {
    let store = open_store(&config).await?;
    run_with_store(server, config, store, shutdown).await
}

/// [`run_on`] over a store opened by the caller.
pub async fn run_with_store(
    server: GrpcServer,
    config: Config,
    store: Arc<dyn ScannerStore>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ScannerError> {
    let scanner = build_with_store(&config, store).await?;
    let listen = server.local_addr()?;
    let server =
        server.with_metrics(scanner.exported_metrics.clone()).with_redis_primary(config.store.redis_health());
    let drain = Shutdown::new();
    let worker = tokio::spawn(scanner.clone().work(drain.signaled()));
    let jitter = Duration::from_millis(config.schedule_jitter_milliseconds);
    let triggers = Triggers::new(scanner.clone(), jitter, drain.clone());
    let triggers = tokio::spawn(triggers.run(Duration::from_secs(config.trigger_resync_seconds.max(1))));
    let trust = vynil_runtime::Trust::from_config(&config.shared.trust, listen)
        .map_err(|e| ScannerError::Config(e.to_string()))?;
    let service = ServedService::new(
        ScannerServer::new(ScannerService { scanner, trust }),
        vynil_proto::FILE_DESCRIPTOR_SET,
    );
    let served = server.serve(vec![service], drain.after(shutdown)).await;
    drain.trigger();
    let _ = worker.await;
    let _ = triggers.await;
    served?;
    Ok(())
}
