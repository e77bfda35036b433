//! The purger: type-aware, usage-aware registry retention (upstream #12 A).
//!
//! `Plan` reads a repository and asks the rules crate what to keep — exactly
//! the rules the scanner uses, so a purge never deletes what any consumer
//! could be shown — plus what lifecycle says instances use. `Execute` deletes
//! only after a confirmation naming the target and the plan's fingerprint,
//! refuses a stale plan, and reports only deletions it verified. Registry
//! space returns after the registry's own garbage collection: deleted
//! manifests are "eligible for garbage collection" (see `docs/purger.md`).

mod config;
mod executor;
mod grpc;
mod metrics;
mod planner;
mod schedule;
mod store;

use std::{collections::HashMap, future::Future, sync::Arc, time::Duration};

use tokio::sync::mpsc;
use vynil_proto::purger::v1::purger_server::PurgerServer;
use vynil_registry::{
    CredentialStore, InMemoryMetadataCache, RegistryClient, RepositoryRef, TransportConfig,
};
use vynil_rules::RetentionConfig;
use vynil_runtime::{GrpcServer, ServedService, Shutdown};

pub use config::{Config, RetentionFile};
pub use grpc::PurgerService;
pub use store::{
    DeletionState, MemoryStore, PlanStore, RedisStore, ReportState, RepositoryPlan, StoredOutcome,
    StoredPlan, StoredReport,
};
use vynil_store::{JukeboxStore, lease::Lease};

/// Errors of the purger, mapped to gRPC codes in one place (`grpc.rs`).
#[derive(Debug, thiserror::Error)]
pub enum PurgerError {
    #[error("{0}")]
    Config(String),
    #[error("store unavailable: {0}; retry when it is back")]
    Store(String),
    #[error(transparent)]
    Registry(#[from] vynil_registry::RegistryError),
    #[error(transparent)]
    Rules(#[from] vynil_rules::RulesError),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("refused: {0}")]
    Refused(String),
    #[error("refused: the repository changed since planning ({}); make a new plan", .0.join("; "))]
    Stale(Vec<String>),
    #[error("refused: {0} is excluded from purges by the retention config")]
    Excluded(String),
    #[error("{0}")]
    Busy(String),
    #[error("the execution lease on {0} was lost to another replica; this execution stopped")]
    LeaseLost(String),
    /// A record the shared state lost (`vynil_store::epoch`).
    #[error("{0}")]
    Lost(String),
    #[error("the status of {0} changed concurrently; retry")]
    Conflict(String),
    #[error(transparent)]
    Serve(#[from] vynil_runtime::RuntimeError),
}

impl From<vynil_store::lease::LeaseError> for PurgerError {
    fn from(error: vynil_store::lease::LeaseError) -> Self {
        match error {
            vynil_store::lease::LeaseError::Lost(what) => PurgerError::LeaseLost(what),
            vynil_store::lease::LeaseError::Store(store) => store.into(),
        }
    }
}

impl From<vynil_store::StoreError> for PurgerError {
    fn from(error: vynil_store::StoreError) -> Self {
        match error {
            vynil_store::StoreError::Config(why) => PurgerError::Config(why),
            vynil_store::StoreError::Conflict(name) => PurgerError::Conflict(name),
            vynil_store::StoreError::Lost(what) => PurgerError::Lost(what),
            vynil_store::StoreError::Unavailable(why) => PurgerError::Store(why),
        }
    }
}

/// The purger's state, shared by every request.
#[derive(Debug)]
pub struct Purger {
    client: RegistryClient,
    store: Arc<dyn PlanStore>,
    jukeboxes: Arc<dyn JukeboxStore>,
    lifecycle: Vec<String>,
    /// Re-read at every plan and execution, so a plan made under other pins,
    /// exclusions or framework version is refused as stale.
    retention_path: Option<std::path::PathBuf>,
    framework: semver::Version,
    /// What a JukeBox's `source.script` may do.
    scripts: vynil_store::script::ScriptLimits,
    schedules: Vec<config::Schedule>,
    plan_ttl: Duration,
    max_plan_tags: usize,
    /// A repository with more tags is refused unread (`--max-tags-per-repository`).
    max_tags: usize,
    concurrency: usize,
    lease: Duration,
    owner: String,
    metrics: metrics::PurgerMetrics,
    /// What `GET /metrics` serves (Prometheus' registry, not an OCI one).
    exported_metrics: Arc<vynil_runtime::metrics::Registry>,
}

/// A plan that passed the checks, and the lease that guards its execution.
pub struct Prepared {
    plan: StoredPlan,
    lease: Lease,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared").field("plan", &self.plan.id).finish_non_exhaustive()
    }
}

impl Purger {
    pub async fn from_config(config: &Config) -> Result<Self, PurgerError> {
        let jukeboxes =
            vynil_store::open(&config.shared.store_settings(vynil_runtime::user_agent!())).await?;
        Self::from_config_with_store(config, jukeboxes).await
    }

    /// The purger over a JukeBox store opened by the caller (local mode shares one).
    pub async fn from_config_with_store(
        config: &Config,
        jukeboxes: Arc<dyn JukeboxStore>,
    ) -> Result<Self, PurgerError> {
        config.check_lease()?;
        let retention_file = RetentionFile::load(config.retention_config.as_ref())?;
        RetentionConfig::new(config.shared.vynil_version.clone(), &retention_file.pinned)?;
        let credentials = CredentialStore::from_file(config.shared.dockerconfig.as_deref())?;
        let transport = TransportConfig {
            timeout: Duration::from_secs(config.registry_timeout_seconds.max(1)),
            ..config.shared.transport()
        };
        let client = RegistryClient::new(transport, credentials, Arc::new(InMemoryMetadataCache::default()))?;
        let store: Arc<dyn PlanStore> = match &config.shared.redis_url {
            Some(url) => Arc::new(RedisStore::connect(url).await?),
            None => Arc::new(MemoryStore::default()),
        };
        let (metrics, exported_metrics) = metrics::PurgerMetrics::register(&client.counters());
        Ok(Self {
            metrics,
            exported_metrics,
            client,
            store,
            jukeboxes,
            lifecycle: config.lifecycle_endpoint.clone(),
            retention_path: config.retention_config.clone(),
            framework: config.shared.vynil_version.clone(),
            scripts: config.shared.scripts(),
            schedules: retention_file.schedules,
            plan_ttl: config.plan_ttl(),
            max_plan_tags: config.max_plan_tags,
            max_tags: config.max_tags_per_repository,
            concurrency: config.delete_concurrency,
            lease: config.lease(),
            owner: config.shared.replica_name("purger"),
        })
    }

    /// The retention inputs as they are now: pins and framework, exclusions.
    fn inputs(&self) -> Result<(RetentionConfig, Vec<String>), PurgerError> {
        let file = RetentionFile::load(self.retention_path.as_ref())?;
        let retention = RetentionConfig::new(self.framework.clone(), &file.pinned)?;
        Ok((retention, file.excluded_repositories))
    }

    /// Under any alias of the repository (`vynil_rules::repository`).
    fn is_excluded(&self, repo: &RepositoryRef) -> Result<bool, PurgerError> {
        Ok(vynil_rules::repository::listed(&self.inputs()?.1, &repo.registry, &repo.repository))
    }

    async fn plan_one(&self, repo: &RepositoryRef) -> Result<RepositoryPlan, PurgerError> {
        let tags = planner::snapshot(&self.client, repo, self.max_tags).await?;
        let usage = planner::usage(&self.lifecycle, repo).await;
        planner::plan_repository(repo, &tags, &usage, &self.inputs()?.0)
    }

    async fn store_plan(
        &self,
        target: String,
        repositories: Vec<RepositoryPlan>,
    ) -> Result<StoredPlan, PurgerError> {
        let id = self.store.epoch().await?.new_id(store::PLAN_ID_PREFIX);
        let plan = planner::assemble(id, target, repositories, jiff::Timestamp::now(), self.plan_ttl);
        self.store.put_plan(&plan, self.plan_ttl).await?;
        self.metrics.plans.inc();
        let deletions: usize = plan.repositories.iter().map(|r| r.deletions.len()).sum();
        self.metrics.planned_deletions.inc_by(deletions as u64);
        tracing::info!(plan = %plan.id, target = %plan.target, deletions, "planned");
        Ok(plan)
    }

    /// Plans one repository and stores the plan for `plan_ttl`.
    #[tracing::instrument(skip(self), fields(repository = %repo))]
    pub async fn plan(&self, repo: &RepositoryRef) -> Result<StoredPlan, PurgerError> {
        self.check_named(repo).await?;
        if self.is_excluded(repo)? {
            return Err(PurgerError::Excluded(repo.to_string()));
        }
        let plan = self.plan_one(repo).await?;
        self.check_size(&repo.to_string(), plan.entries.len())?;
        self.store_plan(repo.to_string(), vec![plan]).await
    }

    /// Refuses a repository no JukeBox's source names (under any of its
    /// names), before any registry is read: the purger reads, and an admin
    /// may delete in, only what the control plane was given, never a
    /// registry a caller names (an unreachable one answered "unavailable").
    async fn check_named(&self, repo: &RepositoryRef) -> Result<(), PurgerError> {
        for record in self.jukeboxes.list().await? {
            let source = vynil_store::source_of(&record.spec, self.scripts);
            if source.is_ok_and(|source| source.contains(repo)) {
                return Ok(());
            }
        }
        Err(PurgerError::NotFound(format!(
            "{repo} is in no JukeBox's source: plan a repository a JukeBox lists (or the whole JukeBox), or add it \
             to a JukeBox's source first"
        )))
    }

    /// Plans every repository the JukeBox's source names (but excluded ones).
    #[tracing::instrument(skip(self))]
    pub async fn plan_jukebox(&self, name: &str) -> Result<StoredPlan, PurgerError> {
        let record = self
            .jukeboxes
            .get(name)
            .await?
            .ok_or_else(|| PurgerError::NotFound(format!("no JukeBox {name:?}")))?;
        let source =
            vynil_store::source_of(&record.spec, self.scripts).map_err(PurgerError::InvalidArgument)?;
        let target = format!("jukebox/{name}");
        let (mut plans, mut tags) = (Vec::new(), 0);
        for repo in self.client.enumerate(&source).await? {
            if !self.is_excluded(&repo)? {
                let plan = self.plan_one(&repo).await?;
                tags += plan.entries.len();
                // Checked as it grows: an oversized plan is never held whole.
                self.check_size(&target, tags)?;
                plans.push(plan);
            }
        }
        self.store_plan(target, plans).await
    }

    /// A plan of `target` holding `tags` tags, within `--max-plan-tags`.
    fn check_size(&self, target: &str, tags: usize) -> Result<(), PurgerError> {
        if tags <= self.max_plan_tags {
            return Ok(());
        }
        Err(PurgerError::Refused(format!(
            "the plan of {target} holds {tags} tags or more, over --max-plan-tags {}: plan its repositories one \
             at a time, or raise the limit",
            self.max_plan_tags
        )))
    }

    pub async fn get_plan(&self, id: &str) -> Result<StoredPlan, PurgerError> {
        if let Some(plan) = self.store.get_plan(id).await? {
            return Ok(plan);
        }
        let missing = self.store.epoch().await?.missing(id, store::PLAN_ID_PREFIX);
        Err(match missing.lost(&format!("plan {id:?}"), "make a new plan") {
            Some(lost) => lost.into(),
            None => {
                PurgerError::NotFound(format!("no plan {id:?}: it expired or never existed; make a new plan"))
            }
        })
    }

    /// The report of a plan's execution: complete, or — while it runs or
    /// after it was interrupted — the verified outcomes journaled so far.
    pub async fn get_report(&self, plan_id: &str) -> Result<StoredReport, PurgerError> {
        let Some(mut report) = self.store.get_report(plan_id).await? else {
            // A plan lost or expired says so; one still kept was never executed.
            self.get_plan(plan_id).await?;
            return Err(PurgerError::NotFound(format!(
                "no report for plan {plan_id:?}: it was never executed"
            )));
        };
        if report.state != ReportState::Running {
            return Ok(report);
        }
        report.outcomes = self
            .store
            .journaled(plan_id)
            .await?
            .into_iter()
            .filter(|o| o.state != DeletionState::Deleting)
            .collect();
        let plan = self.store.get_plan(plan_id).await?;
        let names: Vec<String> =
            plan.map(|p| p.repositories.iter().map(RepositoryPlan::lease_name).collect()).unwrap_or_default();
        let leases = self.store.leases();
        let mut held = false;
        for name in &names {
            held |= leases.holder(name).await?.is_some();
        }
        if !held {
            report.state = ReportState::Interrupted;
        }
        Ok(report)
    }

    /// Every check before anything is deleted: confirmation, leases, staleness.
    pub async fn prepare(&self, request: &executor::ExecuteRequest) -> Result<Prepared, PurgerError> {
        let prepared = self.checked(request).await;
        if prepared.is_err() {
            self.metrics.refusals.inc();
        }
        prepared
    }

    async fn checked(&self, request: &executor::ExecuteRequest) -> Result<Prepared, PurgerError> {
        let plan = self.get_plan(&request.plan_id).await?;
        executor::check_confirmation(&plan, request)?;
        let names: Vec<String> = plan.repositories.iter().map(RepositoryPlan::lease_name).collect();
        let Some(lease) = Lease::acquire(self.store.leases(), names, &self.owner, self.lease).await? else {
            return Err(PurgerError::Busy(format!(
                "another execution holds a repository of plan {}; retry when it ends (its lease expires within {}s if it died)",
                plan.id,
                self.lease.as_secs()
            )));
        };
        if let Err(error) = self.still_valid(&plan, request).await {
            lease.release().await;
            return Err(error);
        }
        Ok(Prepared { plan, lease })
    }

    /// Re-reads every repository and what instances use; refuses a stale plan.
    async fn still_valid(
        &self,
        plan: &StoredPlan,
        request: &executor::ExecuteRequest,
    ) -> Result<(), PurgerError> {
        let (retention, excluded) = self.inputs()?;
        let mut changes = Vec::new();
        for repository in &plan.repositories {
            let repo = RepositoryRef::new(&repository.registry, &repository.repository)?;
            if vynil_rules::repository::listed(&excluded, &repo.registry, &repo.repository) {
                return Err(PurgerError::Excluded(repo.to_string()));
            }
            let fresh = planner::snapshot(&self.client, &repo, self.max_tags).await?;
            let usage = planner::usage(&self.lifecycle, &repo).await;
            let usage_lost =
                !repository.usage_unknown && matches!(usage, vynil_rules::retention::Usage::Unknown);
            if usage_lost && !request.acknowledge_usage_unknown {
                return Err(PurgerError::Refused(
                    "lifecycle cannot confirm what instances use now: retry, or acknowledge_usage_unknown"
                        .into(),
                ));
            }
            // Every input counts, not only the tags: pins and framework too.
            if retention.fingerprint() != repository.config_fingerprint {
                changes.push(format!(
                    "{}: the retention inputs changed since planning (pinned tags or the framework version --vynil-version)",
                    repository.name()
                ));
            }
            changes.extend(executor::staleness(repository, &fresh, &usage));
        }
        if changes.is_empty() { Ok(()) } else { Err(PurgerError::Stale(changes)) }
    }

    /// Deletes, journals, reports; releases the leases at the end. Every
    /// write is fenced by the lease: a worker that lost it stops.
    pub async fn run(
        &self,
        prepared: Prepared,
        request: executor::ExecuteRequest,
        progress: mpsc::Sender<StoredOutcome>,
    ) -> Result<StoredReport, PurgerError> {
        let Prepared { plan, lease } = prepared;
        let started_at = jiff::Timestamp::now().to_string();
        let fence = lease.fence(lease.names().first().map(String::as_str).unwrap_or_default());
        let mut report = executor::report(&plan, &request.caller, started_at, Vec::new());
        report.state = ReportState::Running;
        // Executed before: the first execution keeps its name and time,
        // this one is recorded beside it.
        if let Some(previous) = self.store.get_report(&plan.id).await? {
            let attempt = store::Attempt { by: report.executed_by, at: report.started_at };
            (report.executed_by, report.started_at) = (previous.executed_by, previous.started_at);
            report.later = previous.later;
            report.later.push(attempt);
        }
        let result = self.run_under(&plan, &lease, &fence, report, &progress).await;
        if matches!(result, Err(PurgerError::LeaseLost(_))) {
            // Another execution holds the repositories: nothing more from here.
            tracing::warn!(plan = %plan.id, "execution abandoned: the lease was lost");
            return result;
        }
        lease.release().await;
        self.record_event(&plan, &request.caller, &result).await;
        result
    }

    /// The audit record of an execution, as an Event on each JukeBox it
    /// concerns (the JukeBox a `jukebox/<name>` plan names, or those listing
    /// the repository): in a cluster it outlives a Redis without persistence.
    async fn record_event(
        &self,
        plan: &StoredPlan,
        caller: &str,
        result: &Result<StoredReport, PurgerError>,
    ) {
        let note = match result {
            Ok(report) => {
                let count = |state| report.count(state);
                format!(
                    "Purge of {} (plan {}, fingerprint {}) executed by {caller}: {} deleted (eligible for registry garbage collection), {} already gone, {} failed",
                    plan.target,
                    plan.id,
                    plan.fingerprint,
                    count(DeletionState::Deleted),
                    count(DeletionState::AlreadyGone),
                    count(DeletionState::Failed)
                )
            }
            Err(error) => format!("Purge of {} (plan {}) by {caller} stopped: {error}", plan.target, plan.id),
        };
        let failures = result.as_ref().map_or(true, |r| r.count(DeletionState::Failed) > 0);
        let event = vynil_store::JukeboxEvent::purge(failures, note);
        for jukebox in self.jukeboxes_of(plan).await {
            self.jukeboxes.record_event(&jukebox, &event).await;
        }
    }

    async fn jukeboxes_of(&self, plan: &StoredPlan) -> Vec<String> {
        if let Some(name) = plan.target.strip_prefix("jukebox/") {
            return vec![name.to_string()];
        }
        let records = match self.jukeboxes.list().await {
            Ok(records) => records,
            Err(error) => {
                tracing::warn!(plan = %plan.id, %error, "cannot list JukeBoxes: the purge Event is not recorded");
                return Vec::new();
            }
        };
        records
            .into_iter()
            .filter(|record| {
                let packages = record.status.as_ref().map(|s| s.packages.as_slice()).unwrap_or_default();
                plan.repositories
                    .iter()
                    .any(|r| packages.iter().any(|p| p.registry == r.registry && p.image == r.repository))
            })
            .map(|record| record.name)
            .collect()
    }

    async fn run_under(
        &self,
        plan: &StoredPlan,
        lease: &Lease,
        fence: &vynil_store::lease::Fence,
        running: StoredReport,
        progress: &mpsc::Sender<StoredOutcome>,
    ) -> Result<StoredReport, PurgerError> {
        let lost = || PurgerError::LeaseLost(plan.target.clone());
        if !self.store.put_report(&running, fence).await? {
            return Err(lost());
        }
        let journaled: HashMap<String, StoredOutcome> =
            self.store.journaled(&plan.id).await?.into_iter().map(|o| (o.digest.clone(), o)).collect();
        let execution = executor::Execution {
            client: &self.client,
            store: &self.store,
            lease,
            plan_id: &plan.id,
            concurrency: self.concurrency,
            journaled: &journaled,
        };
        let mut outcomes = Vec::new();
        for repository in &plan.repositories {
            outcomes.extend(execution.delete_repository(repository, progress).await?);
            // An OCI image layout's unreferenced blobs (what a crash between
            // an index rewrite and its blob removal left) go now; a registry
            // collects its own garbage.
            if let Ok(repo) = RepositoryRef::new(&repository.registry, &repository.repository)
                && let Err(error) = self.client.collect_garbage(&repo).await
            {
                tracing::warn!(%error, repository = %repo, "cannot remove the layout's unreferenced blobs");
            }
        }
        let report = StoredReport {
            outcomes,
            state: ReportState::Completed,
            finished_at: jiff::Timestamp::now().to_string(),
            ..running
        };
        if !self.store.put_report(&report, fence).await? {
            return Err(lost());
        }
        for outcome in &report.outcomes {
            let state = outcome.state.as_str().to_string();
            self.metrics.deletions.get_or_create(&metrics::State { state }).inc();
        }
        let count = |state| report.count(state);
        tracing::info!(
            target: "audit",
            plan = %plan.id,
            target_name = %plan.target,
            fingerprint = %plan.fingerprint,
            executed_by = %report.executed_by,
            deleted = count(DeletionState::Deleted),
            failed = count(DeletionState::Failed),
            "purge executed (deleted manifests are eligible for registry garbage collection)"
        );
        Ok(report)
    }

    /// Plans and executes, as a scheduled purge does.
    pub async fn execute_as(&self, plan: &StoredPlan, caller: &str) -> Result<StoredReport, PurgerError> {
        let request = executor::ExecuteRequest {
            plan_id: plan.id.clone(),
            confirm: plan.target.clone(),
            fingerprint: plan.fingerprint.clone(),
            acknowledge_usage_unknown: false,
            caller: caller.to_string(),
        };
        let prepared = self.prepare(&request).await?;
        let (progress, mut sink) = mpsc::channel(64);
        let drain = tokio::spawn(async move { while sink.recv().await.is_some() {} });
        let report = self.run(prepared, request, progress).await;
        let _ = drain.await;
        report
    }
}

/// Binds, serves until `shutdown` resolves, then drains.
pub async fn run(config: Config, shutdown: impl Future<Output = ()> + Send) -> Result<(), PurgerError> {
    let server = GrpcServer::bind(config.listen).await?;
    run_on(server, config, shutdown).await
}

/// [`run`] on a server the caller bound (on port 0, its address known
/// before anything dials it).
pub async fn run_on(
    server: GrpcServer,
    config: Config,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), PurgerError> {
    let purger = Purger::from_config(&config).await?;
    serve(server, config, purger, shutdown).await
}

/// [`run_on`] over a JukeBox store opened by the caller.
pub async fn run_with_store(
    server: GrpcServer,
    config: Config,
    jukeboxes: Arc<dyn JukeboxStore>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), PurgerError> {
    let purger = Purger::from_config_with_store(&config, jukeboxes).await?;
    serve(server, config, purger, shutdown).await
}

async fn serve(
    server: GrpcServer,
    config: Config,
    purger: Purger,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), PurgerError> {
    let trust = vynil_runtime::Trust::from_config(&config.shared.trust, server.local_addr()?)
        .map_err(|e| PurgerError::Config(e.to_string()))?;
    let purger = Arc::new(purger);
    let server = server.with_metrics(purger.exported_metrics.clone());
    let drain = Shutdown::new();
    let scheduler = tokio::spawn(schedule::run_all(purger.clone(), drain.clone()));
    let service = ServedService::new(PurgerServer::new(PurgerService::new(purger, trust)));
    let served = server.serve(vec![service], drain.after(shutdown)).await;
    drain.trigger();
    let _ = scheduler.await;
    served?;
    Ok(())
}
