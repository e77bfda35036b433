//! The lifecycle's flags, each with its environment fallback.

use std::net::SocketAddr;

use crate::{job, reaper, takeover};

/// Configuration of the lifecycle service: flags, each with an environment fallback.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "vynil-lifecycle",
    version,
    about = "the controllers of Tenant, Service and System instances, and their agent Jobs."
)]
pub struct Config {
    /// Address the gRPC server listens on.
    #[arg(long, env = "VYNIL_LIFECYCLE_LISTEN", default_value = "0.0.0.0:50054")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub shared: vynil_runtime::SharedConfig,
    #[command(flatten)]
    pub store: vynil_store::StoreConfig,
    /// The catalog service (`ResolveInstall`); required with `--kubernetes`.
    #[arg(long, env = "VYNIL_CATALOG_ENDPOINT")]
    pub catalog_endpoint: Option<String>,
    /// The scanner service (`NotifyPush`): asked for a scan of a repository
    /// whose tag moved under a chosen digest; none: the JukeBox's schedule
    /// brings the scan.
    #[arg(long, env = "VYNIL_SCANNER_ENDPOINT")]
    pub scanner_endpoint: Option<String>,
    /// Namespace of the agent Jobs and pull secrets; the client's default
    /// namespace (the pod's in a cluster) when absent.
    #[arg(long, env = "VYNIL_NAMESPACE")]
    pub namespace: Option<String>,
    /// Image of the agent Jobs (upstream's `AGENT_IMAGE`).
    #[arg(long, env = "AGENT_IMAGE", default_value = "docker.io/sebt3/vynil-agent:0.7.7")]
    pub agent_image: String,
    /// ServiceAccount of the agent Jobs (upstream's `AGENT_ACCOUNT`).
    #[arg(long, env = "AGENT_ACCOUNT", default_value = "vynil-agent")]
    pub agent_account: String,
    /// `LOG_LEVEL` of the agent Jobs (upstream's `AGENT_LOG_LEVEL`).
    #[arg(long, env = "AGENT_LOG_LEVEL", default_value = "info")]
    pub agent_log_level: String,
    /// Namespace label naming a namespace's tenant (upstream's `TENANT_LABEL`).
    #[arg(long, env = "TENANT_LABEL", default_value = "vynil.solidite.fr/tenant")]
    pub tenant_label: String,
    /// Agent Jobs tried for one fingerprint before the instance stays failed
    /// (1 min doubling to 1 h between attempts).
    #[arg(long, env = "VYNIL_MAX_INSTALL_ATTEMPTS", default_value_t = 5)]
    pub max_install_attempts: u32,
    /// Image of the reaper Jobs (`delete-without-package`): this project's
    /// `vynil-lifecycle`, whose `reap` subcommand they run.
    #[arg(long, env = "REAPER_IMAGE", default_value = job::DEFAULT_REAPER_IMAGE)]
    pub reaper_image: String,
    /// How often an instance is checked when nothing happens (catalog
    /// changes and Job changes reconcile at once).
    #[arg(long, env = "VYNIL_REQUEUE_SECONDS", default_value_t = 900)]
    pub requeue_seconds: u64,
    /// Agent Jobs running at once, at most (a publish reaching every instance
    /// upgrades them a few at a time).
    #[arg(long, env = "VYNIL_MAX_RUNNING_JOBS", default_value_t = 4)]
    pub max_running_jobs: usize,
    /// Reconciles of one instance kind running at once, at most. Unbounded,
    /// kube-runtime's runner polls every running reconcile and scans the
    /// triggers held for them at each wake: a fleet created at once (all
    /// running, most waiting for a Job slot) cost the square of its size
    /// (bench P7 at 10 000 instances: a third of the lifecycle's CPU).
    #[arg(long, env = "VYNIL_CONCURRENT_RECONCILES", default_value_t = 32)]
    pub concurrent_reconciles: u16,
    /// Duration of the leader Lease; it is renewed every third of it.
    #[arg(long, env = "VYNIL_LEASE_SECONDS", default_value_t = 15)]
    pub lease_seconds: u64,
    /// Re-create a deleted agent Job (re-running the install), as upstream's
    /// 15-minute reconcile does; off: re-runs follow the fingerprint only.
    #[arg(long, env = "VYNIL_RECREATE_DELETED_JOBS", default_value_t = false)]
    pub recreate_deleted_jobs: bool,
    /// Re-run every install when the agent image changes, as upstream does;
    /// off: a new agent image applies at each instance's next change.
    #[arg(long, env = "VYNIL_RERUN_ON_AGENT_IMAGE_CHANGE", default_value_t = false)]
    pub rerun_on_agent_image_change: bool,
    /// A failed upgrade (out of attempts) is quarantined for its instance,
    /// which goes back to the revision it ran when the failed runs applied
    /// nothing, else holds for an operator (`docs/lifecycle.md`, "Failed
    /// upgrades"); false: it stays failed, as upstream's. Per instance:
    /// `vynil.solidite.fr/rollback: "false"`.
    #[arg(long, env = "VYNIL_ROLLBACK_FAILED_UPGRADES", default_value_t = true, action = clap::ArgAction::Set)]
    pub rollback_failed_upgrades: bool,
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Subcommands of the binary besides serving.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Delete an instance's recorded children without package hooks (the
    /// reaper Job's container; see `docs/lifecycle.md`).
    Reap(reaper::ReapArgs),
    /// Record, once, the agent image and framework version upstream's
    /// operator ran, in the ConfigMap `vynil-config` (`docs/migration.md`).
    Takeover(takeover::TakeoverArgs),
}
