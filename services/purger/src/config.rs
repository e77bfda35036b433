//! Flags (each with an environment fallback) and the retention file.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use serde::Deserialize;

use crate::PurgerError;

/// Configuration of the purger.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "vynil-purger", version, about = "Type-aware, usage-aware registry retention")]
pub struct Config {
    /// Address the gRPC server listens on.
    #[arg(long, env = "VYNIL_PURGER_LISTEN", default_value = "0.0.0.0:50053")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub shared: vynil_runtime::SharedConfig,
    #[command(flatten)]
    pub store: vynil_store::StoreConfig,
    /// The lifecycle service, asked which revisions instances use; repeat it
    /// once per cluster sharing the registries (any unreachable one makes
    /// usage unknown). Without it plans say "usage unknown" and executing
    /// needs an acknowledgement.
    #[arg(long, env = "VYNIL_LIFECYCLE_ENDPOINT", value_delimiter = ',')]
    pub lifecycle_endpoint: Vec<String>,
    /// Retention settings (YAML): `pinned` tag patterns, `excluded_repositories`.
    #[arg(long, env = "VYNIL_RETENTION_CONFIG")]
    pub retention_config: Option<PathBuf>,
    /// How long a plan can be executed after it was made.
    #[arg(long, env = "VYNIL_PLAN_TTL_SECONDS", default_value_t = 3600)]
    pub plan_ttl_seconds: u64,
    /// Tags one plan may hold across its repositories: a larger plan is
    /// refused before it is stored (plan a JukeBox's repositories one at a
    /// time, or raise it). The default holds ten repositories at the
    /// scanner's `--max-tags-per-repository`: a stored plan costs about 270
    /// bytes per tag in one Redis value and the planner about 800 bytes per
    /// tag at its peak (bench P9), so 100 000 tags are about 26 MiB stored
    /// and 80 MiB planned, where 1 000 000 were 254 MiB (half Redis's
    /// largest value) and 775 MiB.
    #[arg(long, env = "VYNIL_MAX_PLAN_TAGS", default_value_t = 100_000)]
    pub max_plan_tags: usize,
    /// A repository with more tags is refused before any is read, its
    /// listing stopped at the cap (the scanner's flag, the same default).
    #[arg(long, env = "VYNIL_MAX_TAGS_PER_REPOSITORY", default_value_t = 10_000)]
    pub max_tags_per_repository: usize,
    /// DELETEs in flight at once.
    #[arg(long, env = "VYNIL_DELETE_CONCURRENCY", default_value_t = 4)]
    pub delete_concurrency: usize,
    /// An execution holds its repository for this long, renewed while alive;
    /// a crashed holder releases it when it expires.
    #[arg(long, env = "VYNIL_EXECUTION_LEASE_SECONDS", default_value_t = 30)]
    pub execution_lease_seconds: u64,
    /// Per registry request timeout. A DELETE is sent once, right after the
    /// execution lease was checked: the lease must outlast twice this (the
    /// DELETE and a token fetch), or the purger refuses to start.
    #[arg(long, env = "VYNIL_REGISTRY_TIMEOUT_SECONDS", default_value_t = 10)]
    pub registry_timeout_seconds: u64,
}

impl Config {
    pub fn plan_ttl(&self) -> Duration {
        Duration::from_secs(self.plan_ttl_seconds)
    }

    pub fn lease(&self) -> Duration {
        Duration::from_secs(self.execution_lease_seconds.max(1))
    }

    /// A lease no longer than twice the registry timeout could expire while
    /// a DELETE sent under it is still on its way: refused.
    pub fn check_lease(&self) -> Result<(), crate::PurgerError> {
        if self.execution_lease_seconds > 2 * self.registry_timeout_seconds.max(1) {
            return Ok(());
        }
        Err(crate::PurgerError::Config(format!(
            "--execution-lease-seconds ({}) must exceed twice --registry-timeout-seconds ({}): a DELETE sent right after the lease check must land before the lease can expire",
            self.execution_lease_seconds, self.registry_timeout_seconds
        )))
    }
}

/// The retention file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionFile {
    /// Tag glob patterns never deleted.
    #[serde(default)]
    pub pinned: Vec<String>,
    /// `registry/repository` never purged.
    #[serde(default)]
    pub excluded_repositories: Vec<String>,
    /// Scheduled purges of whole JukeBoxes.
    #[serde(default)]
    pub schedules: Vec<Schedule>,
}

/// A scheduled purge: a fresh plan each time, executed only within limits;
/// beyond them the plan is kept for a human to read and execute.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Schedule {
    pub jukebox: String,
    /// Cron expression, 5 fields (or 6 with seconds first).
    pub cron: String,
    /// At most this many digests deleted in one run.
    pub max_deletions: usize,
    /// At most this share (0–100) of a repository's tags deleted in one run.
    #[serde(default = "full_percent")]
    pub max_percent: f64,
}

fn full_percent() -> f64 {
    100.0
}

impl RetentionFile {
    pub fn load(path: Option<&PathBuf>) -> Result<Self, PurgerError> {
        let Some(path) = path else {
            return Ok(Self::default());
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            PurgerError::Config(format!("cannot read the retention config {}: {e}", path.display()))
        })?;
        serde_yaml_ng::from_str(&text)
            .map_err(|e| PurgerError::Config(format!("retention config {} is invalid: {e}", path.display())))
    }
}
