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

mod engine;
pub mod export;
mod grpc;
mod index;
mod metrics;
mod requests;
mod schedule;
mod triggers;
mod worker;

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use vynil_proto::scanner::v1::scanner_server::ScannerServer;
use vynil_registry::{CredentialStore, InMemoryMetadataCache, MetadataCache, RegistryClient};
use vynil_runtime::{GrpcServer, ServedService, Shutdown};

pub use engine::{EngineSettings, ScanOutput, new_status};
pub use grpc::ScannerService;
pub use requests::{MemoryQueue, RecordState, RedisQueue, RequestQueue, ScanRecord};
pub use triggers::{Triggers, read_force_scan};
pub use vynil_store::{
    CHANGES_CHANNEL, JukeboxRecord, JukeboxStore, LocalStore, ScannerStore, StoreSettings,
};
pub use worker::Scanner;

/// Configuration of the scanner: flags, each with an environment fallback.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "vynil-scanner", version, about = "Scans registries into JukeBox status")]
pub struct Config {
    /// Without a command, the scanner serves; `export` writes an index and exits.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Address the gRPC server listens on.
    #[arg(long, env = "VYNIL_SCANNER_LISTEN", default_value = "0.0.0.0:50052")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub shared: vynil_runtime::SharedConfig,
    #[command(flatten)]
    pub store: vynil_store::StoreConfig,
    #[command(flatten)]
    pub limits: ScanLimits,
    /// A scan holds its JukeBox for this long, renewed while alive.
    #[arg(long, env = "VYNIL_SCAN_LEASE_SECONDS", default_value_t = 30)]
    pub scan_lease_seconds: u64,
    /// How often pending requests are looked for (requests made on another
    /// replica wake this one at once through Redis; the poll repairs a
    /// missed announcement).
    #[arg(long, env = "VYNIL_SCAN_POLL_MILLISECONDS", default_value_t = 1000)]
    pub poll_milliseconds: u64,
    /// A scan caused by a registry push waits until no push came for this
    /// long, so the other pushes of a burst join it (one scan, not one per
    /// tag)...
    #[arg(long, env = "VYNIL_PUSH_SETTLE_MILLISECONDS", default_value_t = 200)]
    pub push_settle_milliseconds: u64,
    /// ...and no longer than this after the burst's first push.
    #[arg(long, env = "VYNIL_PUSH_SETTLE_LIMIT_MILLISECONDS", default_value_t = 2000)]
    pub push_settle_limit_milliseconds: u64,
    /// At most this long after a schedule's tick, chosen at random per tick,
    /// so JukeBoxes sharing a schedule do not hit registries at once.
    #[arg(long, env = "VYNIL_SCHEDULE_JITTER_MILLISECONDS", default_value_t = 0)]
    pub schedule_jitter_milliseconds: u64,
    /// Full pass over JukeBoxes for force-scan and schedules (repairs missed
    /// notifications).
    #[arg(long, env = "VYNIL_TRIGGER_RESYNC_SECONDS", default_value_t = 30)]
    pub trigger_resync_seconds: u64,
    /// Where `ExportIndex` may write: each an exact destination or a prefix
    /// of it ending at a `/` (`https://charts.example/vynil`,
    /// `s3://bucket/indexes`, `/srv/index`). Without one, no export is
    /// accepted: the caller names the destination and the scanner writes
    /// there with the credentials it is given.
    #[arg(long = "export-destination", env = "VYNIL_EXPORT_DESTINATIONS", value_delimiter = ',')]
    pub export_destinations: Vec<String>,
}

/// How much one scan (or export) may read, and how much at once.
#[derive(Debug, Clone, clap::Args)]
pub struct ScanLimits {
    /// A repository with more tags is reported, not scanned.
    #[arg(long, env = "VYNIL_MAX_TAGS_PER_REPOSITORY", default_value_t = 10_000)]
    pub max_tags_per_repository: usize,
    /// A JukeBox whose source names more repositories fails its scan (its
    /// catalog is kept): a Harbor project or a script gone wrong must not
    /// scan a whole registry.
    #[arg(long, env = "VYNIL_MAX_REPOSITORIES_PER_JUKEBOX", default_value_t = 1_000)]
    pub max_repositories_per_jukebox: usize,
    /// Repositories scanned at once within a JukeBox.
    #[arg(long, env = "VYNIL_REPOSITORY_CONCURRENCY", default_value_t = 4)]
    pub repository_concurrency: usize,
    /// Manifests read at once within a repository, ahead of the descent
    /// (HEADs for tags seen before, GETs for new ones): a first scan of a
    /// large repository costs about its reads divided by this. Lower it for
    /// registries with strict rate limits.
    #[arg(long, env = "VYNIL_MANIFEST_READ_AHEAD", default_value_t = 8)]
    pub manifest_read_ahead: usize,
    /// Manifest metadata kept in process memory without `--redis-url`
    /// (entries, and as many tag digests; the least used are evicted and
    /// read again when next needed). Redis entries expire instead.
    #[arg(long, env = "VYNIL_METADATA_CACHE_ENTRIES", default_value_t = InMemoryMetadataCache::DEFAULT_CAPACITY)]
    pub metadata_cache_entries: usize,
}

impl ScanLimits {
    /// The engine's settings for consumers running `framework`.
    pub fn settings(
        &self,
        framework: semver::Version,
        scripts: vynil_script::ScriptLimits,
    ) -> EngineSettings {
        EngineSettings {
            framework,
            scripts,
            max_tags_per_repository: self.max_tags_per_repository,
            max_repositories: self.max_repositories_per_jukebox,
            repository_concurrency: self.repository_concurrency,
            read_ahead: self.manifest_read_ahead,
        }
    }
}

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
        match &config.store.redis_url {
            Some(url) => {
                let cache = Arc::new(vynil_store::metadata_cache::RedisMetadataCache::connect(url).await?);
                let index_cache = vynil_index::ConditionalCache::new(cache.clone());
                (Arc::new(RedisQueue::connect(url).await?), cache, index_cache)
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
    let server = server.with_metrics(scanner.exported_metrics.clone());
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
