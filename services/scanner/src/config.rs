//! The scanner's flags, each with its environment fallback.

use std::net::SocketAddr;

use vynil_registry::InMemoryMetadataCache;

use crate::{Command, EngineSettings};

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
