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
mod store;

use std::{future::Future, sync::Arc, time::Duration};

use tokio::sync::mpsc;
use vynil_proto::purger::v1::purger_server::PurgerServer;
use vynil_registry::{
    CredentialStore, Credentials, InMemoryMetadataCache, RegistryClient, RepositoryRef,
    TransportConfig,
};
use vynil_rules::RetentionConfig;
use vynil_runtime::{GrpcServer, ServedService};

pub use config::{Config, RetentionFile};
pub use grpc::{CALLER_HEADER, PurgerService};
pub use store::{MemoryStore, PlanStore, RedisStore, StoredOutcome, StoredPlan, StoredReport};

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
    #[error("{0}")]
    Unimplemented(String),
    #[error(transparent)]
    Serve(#[from] vynil_runtime::RuntimeError),
}

/// The purger's state, shared by every request.
#[derive(Debug)]
pub struct Purger {
    client: RegistryClient,
    store: Arc<dyn PlanStore>,
    lifecycle: Option<String>,
    retention: RetentionConfig,
    excluded: Vec<String>,
    plan_ttl: Duration,
    concurrency: usize,
    lease: Duration,
    owner: String,
    metrics: metrics::PurgerMetrics,
    registry: Arc<vynil_runtime::metrics::Registry>,
}

/// A plan that passed the checks, and the lease that guards its execution.
pub struct Prepared {
    plan: StoredPlan,
    _lease: executor::LeaseKeeper,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("plan", &self.plan.id)
            .finish_non_exhaustive()
    }
}

impl Purger {
    pub async fn from_config(config: &Config) -> Result<Self, PurgerError> {
        let retention_file = RetentionFile::load(config.retention_config.as_ref())?;
        let retention =
            RetentionConfig::new(config.shared.vynil_version.clone(), &retention_file.pinned)?;
        let credentials = match &config.dockerconfig {
            Some(path) => credentials_from(path, &config.shared.insecure_registries)?,
            None => CredentialStore::default(),
        };
        let transport = TransportConfig {
            insecure_registries: config.shared.insecure_registries.clone(),
            timeout: Duration::from_secs(config.registry_timeout_seconds.max(1)),
            ..TransportConfig::default()
        };
        let client = RegistryClient::new(
            transport,
            credentials,
            Arc::new(InMemoryMetadataCache::default()),
        )?;
        let store: Arc<dyn PlanStore> = match &config.shared.redis_url {
            Some(url) => Arc::new(RedisStore::connect(url).await?),
            None => Arc::new(MemoryStore::default()),
        };
        let (metrics, registry) = metrics::PurgerMetrics::register();
        Ok(Self {
            metrics,
            registry,
            client,
            store,
            lifecycle: config.lifecycle_endpoint.clone(),
            retention,
            excluded: retention_file.excluded_repositories,
            plan_ttl: config.plan_ttl(),
            concurrency: config.delete_concurrency,
            lease: config.lease(),
            owner: format!("purger-{:016x}", fastrand::u64(..)),
        })
    }

    fn check_excluded(&self, repo: &RepositoryRef) -> Result<(), PurgerError> {
        let name = repo.to_string();
        if self.excluded.contains(&name) {
            return Err(PurgerError::Excluded(name));
        }
        Ok(())
    }

    /// Plans `repo` and stores the plan for `plan_ttl`.
    #[tracing::instrument(skip(self), fields(repository = %repo))]
    pub async fn plan(&self, repo: &RepositoryRef) -> Result<StoredPlan, PurgerError> {
        self.check_excluded(repo)?;
        let tags = planner::snapshot(&self.client, repo).await?;
        let usage = planner::usage(self.lifecycle.as_deref(), repo).await;
        let plan = planner::make_plan(
            repo,
            &tags,
            &usage,
            &self.retention,
            jiff::Timestamp::now(),
            self.plan_ttl,
        )?;
        self.store.put_plan(&plan, self.plan_ttl).await?;
        self.metrics.plans.inc();
        tracing::info!(plan = %plan.id, keep = plan.entries.iter().filter(|e| e.keep).count(), delete = plan.deletions.len(), "planned");
        Ok(plan)
    }

    pub async fn get_plan(&self, id: &str) -> Result<StoredPlan, PurgerError> {
        self.store.get_plan(id).await?.ok_or_else(|| {
            PurgerError::NotFound(format!(
                "no plan {id:?}: it expired or never existed; make a new plan"
            ))
        })
    }

    pub async fn get_report(&self, plan_id: &str) -> Result<StoredReport, PurgerError> {
        self.store.get_report(plan_id).await?.ok_or_else(|| {
            PurgerError::NotFound(format!(
                "no report for plan {plan_id:?}: it was not executed to the end"
            ))
        })
    }

    /// Every check before anything is deleted: confirmation, lease, staleness.
    pub async fn prepare(
        &self,
        request: &executor::ExecuteRequest,
    ) -> Result<Prepared, PurgerError> {
        let plan = self.get_plan(&request.plan_id).await?;
        executor::check_confirmation(&plan, request)?;
        let repo = RepositoryRef::new(&plan.registry, &plan.repository)?;
        self.check_excluded(&repo)?;
        if !self
            .store
            .acquire(&plan.target, &self.owner, self.lease)
            .await?
        {
            return Err(PurgerError::Busy(format!(
                "another execution holds {}; retry when it ends (its lease expires within {}s if it died)",
                plan.target,
                self.lease.as_secs()
            )));
        }
        let lease = executor::LeaseKeeper::start(
            self.store.clone(),
            plan.target.clone(),
            self.owner.clone(),
            self.lease,
        );
        let checked = async {
            let fresh = planner::snapshot(&self.client, &repo).await?;
            let usage = planner::usage(self.lifecycle.as_deref(), &repo).await;
            if !plan.usage_unknown && matches!(usage, vynil_rules::retention::Usage::Unknown) && !request.acknowledge_usage_unknown {
                return Err(PurgerError::Refused(
                    "lifecycle cannot confirm what instances use now: retry, or acknowledge_usage_unknown".into(),
                ));
            }
            let changes = executor::staleness(&plan, &fresh, &usage);
            if changes.is_empty() { Ok(()) } else { Err(PurgerError::Stale(changes)) }
        }
        .await;
        if let Err(error) = checked {
            let _ = self.store.release(&plan.target, &self.owner).await;
            return Err(error);
        }
        Ok(Prepared {
            plan,
            _lease: lease,
        })
    }

    /// Deletes, journals, reports; releases the lease at the end.
    pub async fn run(
        &self,
        prepared: Prepared,
        request: executor::ExecuteRequest,
        progress: mpsc::Sender<StoredOutcome>,
    ) -> Result<StoredReport, PurgerError> {
        let started_at = jiff::Timestamp::now().to_string();
        let plan = &prepared.plan;
        let result =
            executor::delete_all(&self.client, &self.store, plan, self.concurrency, &progress)
                .await;
        let released = self.store.release(&plan.target, &self.owner).await;
        let report = executor::report(plan, &request.caller, started_at, result?);
        for outcome in &report.outcomes {
            self.metrics
                .deletions
                .get_or_create(&metrics::State {
                    state: outcome.state.clone(),
                })
                .inc();
        }
        self.store.put_report(&report).await?;
        released?;
        tracing::info!(
            target: "audit",
            plan = %plan.id,
            repository = %plan.target,
            fingerprint = %plan.fingerprint,
            executed_by = %request.caller,
            deleted = report.outcomes.iter().filter(|o| o.state == "deleted").count(),
            failed = report.outcomes.iter().filter(|o| o.state == "failed").count(),
            "purge executed (deleted manifests are eligible for registry garbage collection)"
        );
        Ok(report)
    }
}

fn credentials_from(
    path: &std::path::Path,
    registries: &[String],
) -> Result<CredentialStore, PurgerError> {
    let document = std::fs::read(path).map_err(|e| {
        PurgerError::Config(format!(
            "cannot read the dockerconfig {}: {e}",
            path.display()
        ))
    })?;
    let mut store = CredentialStore::default();
    #[derive(serde::Deserialize)]
    struct Auths {
        #[serde(default)]
        auths: std::collections::HashMap<String, serde_json::Value>,
    }
    let auths: Auths = serde_json::from_slice(&document).map_err(|_| {
        PurgerError::Config(format!(
            "{} is not a dockerconfigjson document",
            path.display()
        ))
    })?;
    for registry in auths.auths.keys().chain(registries) {
        store.set(
            registry,
            Credentials::from_dockerconfigjson(&document, registry)?,
        );
    }
    Ok(store)
}

/// Binds, serves until `shutdown` resolves, then drains.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), anyhow::Error> {
    let purger = Arc::new(Purger::from_config(&config).await?);
    let server = GrpcServer::bind(config.listen)
        .await?
        .with_metrics(purger.registry.clone());
    let service = ServedService::new(PurgerServer::new(PurgerService { purger }));
    server.serve(vec![service], shutdown).await?;
    Ok(())
}
