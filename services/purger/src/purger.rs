//! The purger's state and its planning: reading a repository (or every
//! repository a JukeBox names), asking the rules crate and the lifecycle what
//! to keep, and storing the plan. Executing a plan is `crate::executor`'s.

use std::{sync::Arc, time::Duration};

use vynil_registry::{
    CredentialStore, InMemoryMetadataCache, RegistryClient, RepositoryRef, TransportConfig,
};
use vynil_rules::RetentionConfig;
use vynil_store::{JukeboxStore, lease::Lease};

use crate::{
    Config, PurgerError, RetentionFile, config, metrics,
    plan_store::{
        self, DeletionState, MemoryStore, PlanStore, RedisStore, ReportState, RepositoryPlan, StoredPlan,
        StoredReport,
    },
    planner,
};

/// The purger's state, shared by every request.
#[derive(Debug)]
pub struct Purger {
    pub(crate) client: RegistryClient,
    pub(crate) store: Arc<dyn PlanStore>,
    pub(crate) jukeboxes: Arc<dyn JukeboxStore>,
    pub(crate) lifecycle: Vec<String>,
    /// Re-read at every plan and execution, so a plan made under other pins,
    /// exclusions or framework version is refused as stale.
    pub(crate) retention_path: Option<std::path::PathBuf>,
    pub(crate) framework: semver::Version,
    /// What a JukeBox's `source.script` may do.
    pub(crate) scripts: vynil_script::ScriptLimits,
    pub(crate) schedules: Vec<config::Schedule>,
    pub(crate) plan_ttl: Duration,
    pub(crate) max_plan_tags: usize,
    /// A repository with more tags is refused unread (`--max-tags-per-repository`).
    pub(crate) max_tags: usize,
    pub(crate) concurrency: usize,
    pub(crate) lease: Duration,
    pub(crate) owner: String,
    pub(crate) metrics: metrics::PurgerMetrics,
    /// What `GET /metrics` serves (Prometheus' registry, not an OCI one).
    pub(crate) exported_metrics: Arc<vynil_runtime::metrics::Registry>,
}

/// A plan that passed the checks, and the lease that guards its execution.
pub struct LeasedPlan {
    pub(crate) plan: StoredPlan,
    pub(crate) lease: Lease,
}

impl std::fmt::Debug for LeasedPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeasedPlan").field("plan", &self.plan.id).finish_non_exhaustive()
    }
}

impl Purger {
    pub async fn from_config(config: &Config) -> Result<Self, PurgerError> {
        let jukeboxes = vynil_store::open(&config.store.store_settings(vynil_runtime::user_agent!())).await?;
        Self::from_config_with_store(config, jukeboxes).await
    }

    /// The purger over a JukeBox store opened by the caller (local mode shares one).
    pub async fn from_config_with_store(
        config: &Config,
        jukeboxes: Arc<dyn JukeboxStore>,
    ) -> Result<Self, PurgerError> {
        config.check_lease()?;
        let retention_file = RetentionFile::load(config.retention_config.as_ref())?;
        RetentionConfig::new(config.store.vynil_version.clone(), &retention_file.pinned)?;
        let credentials = CredentialStore::from_file(config.store.dockerconfig.as_deref())?;
        let transport = TransportConfig {
            timeout: Duration::from_secs(config.registry_timeout_seconds.max(1)),
            ..config.store.transport()
        };
        let client = RegistryClient::new(transport, credentials, Arc::new(InMemoryMetadataCache::default()))?;
        let store: Arc<dyn PlanStore> = match &config.store.redis() {
            Some(target) => Arc::new(RedisStore::connect(target).await?),
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
            framework: config.store.vynil_version.clone(),
            scripts: config.store.scripts(),
            schedules: retention_file.schedules,
            plan_ttl: config.plan_ttl(),
            max_plan_tags: config.max_plan_tags,
            max_tags: config.max_tags_per_repository,
            concurrency: config.delete_concurrency,
            lease: config.lease(),
            owner: config.store.replica_name("purger"),
        })
    }

    /// The retention inputs as they are now: pins and framework, exclusions.
    pub(crate) fn inputs(&self) -> Result<(RetentionConfig, Vec<String>), PurgerError> {
        let file = RetentionFile::load(self.retention_path.as_ref())?;
        let retention = RetentionConfig::new(self.framework.clone(), &file.pinned)?;
        Ok((retention, file.excluded_repositories))
    }

    /// Under any alias of the repository (`vynil_rules::repository`).
    pub(crate) fn is_excluded(&self, repo: &RepositoryRef) -> Result<bool, PurgerError> {
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
        let id = self.store.epoch().await?.new_id(plan_store::PLAN_ID_PREFIX);
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
        // Planned as the JukeBox writes it, whatever alias the caller wrote.
        let repo = &self.check_named(repo).await?;
        if self.is_excluded(repo)? {
            return Err(PurgerError::Excluded(repo.to_string()));
        }
        let plan = self.plan_one(repo).await?;
        self.check_size(&repo.to_string(), plan.entries.len())?;
        self.store_plan(repo.to_string(), vec![plan]).await
    }

    /// The entry of the JukeBox source naming `repo` (under any of its
    /// names), or a refusal before any registry is read: the purger reads,
    /// and an admin may delete in, only what the control plane was given,
    /// never a registry a caller names (an unreachable one answered
    /// "unavailable").
    pub(crate) async fn check_named(&self, repo: &RepositoryRef) -> Result<RepositoryRef, PurgerError> {
        for record in self.jukeboxes.list().await? {
            let source = vynil_store::source_of(&record.spec, self.scripts);
            if let Some(entry) = source.ok().and_then(|source| source.entry_for(repo)) {
                return Ok(entry);
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
    pub(crate) fn check_size(&self, target: &str, tags: usize) -> Result<(), PurgerError> {
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
        let missing = self.store.epoch().await?.missing(id, plan_store::PLAN_ID_PREFIX);
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
}
