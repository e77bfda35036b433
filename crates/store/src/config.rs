//! The flags every stateful service (scanner, catalog, purger, lifecycle)
//! shares about where its JukeBoxes, their registries and the shared state
//! are, each with its environment fallback (`#[command(flatten)]` in a
//! service's `Config`, beside the runtime's `SharedConfig` for logs and
//! trust).

use vynil_script::ScriptLimits;

use crate::StoreSettings;

/// The framework version (`--vynil-version`) when none is configured: the
/// version of upstream's default agent image, which runs the agent Jobs.
/// Scanner, catalog and purger share this one setting.
pub const DEFAULT_VYNIL_VERSION: &str = "0.7.7";

#[derive(Debug, Clone, clap::Args)]
pub struct StoreConfig {
    /// JukeBoxes (and their status) from the Kubernetes API, through the
    /// kubeconfig or the in-cluster service account, instead of files.
    #[arg(long, env = "VYNIL_KUBERNETES")]
    pub kubernetes: bool,
    /// Directory of JukeBox YAML files (outside a cluster).
    #[arg(long, env = "VYNIL_JUKEBOX_DIR", default_value = "jukeboxes")]
    pub jukebox_dir: std::path::PathBuf,
    /// Redis shared by replicas; state stays in process memory when absent.
    /// With `--redis-sentinels`, only its user, password and database count
    /// (the primary's address comes from the sentinels).
    #[arg(long, env = "REDIS_URL")]
    pub redis_url: Option<String>,
    /// Sentinels (`host:port,…`) that name the Redis primary and follow it
    /// across failovers, instead of one address.
    #[arg(long = "redis-sentinels", env = "REDIS_SENTINELS", value_delimiter = ',')]
    pub redis_sentinels: Vec<String>,
    /// The primary's name in the sentinels' configuration.
    #[arg(long, env = "REDIS_MASTER_NAME", default_value = "mymaster")]
    pub redis_master_name: String,
    /// The sentinels' own password, when they require one.
    #[arg(long, env = "REDIS_SENTINEL_PASSWORD")]
    pub redis_sentinel_password: Option<String>,
    /// Replicas that must have a lease or a fenced write before the work it
    /// guards starts (`WAIT`): 1 with sentinels, 0 without (a managed Redis
    /// with replicas behind one address may ask for 1).
    #[arg(long, env = "REDIS_WAIT_REPLICAS")]
    pub redis_wait_replicas: Option<u32>,
    /// How long a fenced write waits for those replicas before the work is
    /// refused (and retried).
    #[arg(long, env = "REDIS_WAIT_TIMEOUT_MS", default_value_t = 1000)]
    pub redis_wait_timeout_ms: u64,
    /// The framework version consumers run (scanner, catalog and purger agree on it).
    #[arg(long, env = "VYNIL_VERSION", default_value = DEFAULT_VYNIL_VERSION)]
    pub vynil_version: semver::Version,
    /// A `.dockerconfigjson` document with the registries' credentials
    /// (outside a cluster; inside, JukeBox pull secrets).
    #[arg(long, env = "VYNIL_DOCKERCONFIG")]
    pub dockerconfig: Option<std::path::PathBuf>,
    /// Registries reached over plain http; every other one over https.
    #[arg(long = "insecure-registry", env = "VYNIL_INSECURE_REGISTRIES", value_delimiter = ',')]
    pub insecure_registries: Vec<String>,
    /// `REGISTRY=HOST`: HOST may receive REGISTRY's credentials although it
    /// is not on the registry's site (a token service or GitLab API
    /// elsewhere); by default they go only to the registry's own site.
    #[arg(long = "credential-host", env = "VYNIL_CREDENTIAL_HOSTS", value_delimiter = ',', value_parser = credential_host)]
    pub credential_hosts: Vec<(String, String)>,
    /// A larger manifest is refused unread past this size, and reported (a
    /// Vynil package manifest is a few KiB).
    #[arg(long, env = "VYNIL_MAX_MANIFEST_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_manifest_bytes: usize,
    /// An unreferenced blob of an OCI image layout younger than this many
    /// seconds is kept by a purge's garbage collection: a copy in progress
    /// (`skopeo`, `oras`) writes its blobs before its index names them.
    #[arg(long, env = "VYNIL_LAYOUT_GC_GRACE_SECONDS", default_value_t = 3600)]
    pub layout_gc_grace_seconds: u64,
    /// Operations a cluster-provided Rhai script (JukeBox `source.script`,
    /// package `value_script` and `prefly`) may run before it is stopped
    /// and reported.
    #[arg(long, env = "VYNIL_MAX_SCRIPT_OPERATIONS", default_value_t = ScriptLimits::DEFAULT_MAX_OPERATIONS)]
    pub max_script_operations: u64,
    /// This replica's pod, named in the Events it reports and the leases it
    /// holds (the Downward API sets `POD_NAME` in a cluster).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
}

/// `--credential-host REGISTRY=HOST`.
fn credential_host(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((registry, host)) if !registry.trim().is_empty() && !host.trim().is_empty() => {
            Ok((registry.trim().to_string(), host.trim().to_string()))
        }
        _ => Err(format!("{text:?}: expected REGISTRY=HOST, e.g. registry.example.com=auth.example.net")),
    }
}

impl StoreConfig {
    /// This replica's name among its service's replicas: `--pod-name` when
    /// given, else `<service>-<random>`. It names the leases the replica
    /// holds, so an operator (or a test) reading a lease knows which pod has it.
    pub fn replica_name(&self, service: &str) -> String {
        self.pod_name.clone().unwrap_or_else(|| format!("{service}-{:016x}", fastrand::u64(..)))
    }

    /// How registries are reached, as these flags say (insecure registries,
    /// the manifest size limit); the rest are the registry client's defaults.
    pub fn transport(&self) -> vynil_registry::TransportConfig {
        vynil_registry::TransportConfig {
            insecure_registries: self.insecure_registries.clone(),
            max_manifest_bytes: self.max_manifest_bytes,
            layout_gc_grace: std::time::Duration::from_secs(self.layout_gc_grace_seconds),
            credential_hosts: self.credential_hosts.clone(),
            ..vynil_registry::TransportConfig::default()
        }
    }

    /// The shared Redis these flags name, if any: the sentinels' primary, or
    /// the one at `--redis-url`.
    pub fn redis(&self) -> Option<crate::RedisTarget> {
        let sentinels: Vec<String> =
            self.redis_sentinels.iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
        let target = if sentinels.is_empty() {
            crate::RedisTarget::url(self.redis_url.clone()?)
        } else {
            crate::RedisTarget::sentinel(sentinels, &self.redis_master_name, self.redis_url.clone())
                .with_sentinel_password(self.redis_sentinel_password.clone())
        };
        let replicas = self.redis_wait_replicas.unwrap_or(target.replication().replicas);
        let timeout = std::time::Duration::from_millis(self.redis_wait_timeout_ms);
        Some(target.with_replication(crate::primary::Replication { replicas, timeout }))
    }

    /// Whether the Redis primary answers ([`crate::primary::reachable`]),
    /// when these flags name a Redis: what the service's health reports.
    pub fn redis_health(&self) -> Option<tokio::sync::watch::Receiver<bool>> {
        self.redis().map(|_| crate::primary::reachable())
    }

    /// What a cluster-provided script may do, as these flags say.
    pub fn scripts(&self) -> ScriptLimits {
        ScriptLimits::new(self.max_script_operations)
    }

    /// Where JukeBoxes live, as these flags say, for the service presenting
    /// itself as `user_agent` (`vynil_runtime::user_agent!()` in the service).
    pub fn store_settings(&self, user_agent: &str) -> StoreSettings {
        StoreSettings::from_flags(
            self.kubernetes,
            &self.jukebox_dir,
            self.redis(),
            user_agent,
            self.pod_name.as_deref(),
        )
    }
}
