//! Where plans, journals, reports and execution leases live: Redis when
//! configured (shared by replicas, survives a crash), else process memory.
//! Keys carry a schema version so a later layout can live beside this one.
//! Journal and report writes of an execution are fenced by its lease
//! (`vynil_store::lease`): a worker that lost it cannot write them.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use vynil_store::redis_error;
use vynil_store::{
    epoch::Epoch,
    lease::{Fence, LeaseStore, MemoryLeases, RedisLeases, run_fenced},
};

use crate::PurgerError;

const PREFIX: &str = "vynil:v1:purger";
const REPORT_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// A plan as stored: what the rules decided, and what Execute needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredPlan {
    pub id: String,
    /// What `confirm` must name: `registry/repository`, or `jukebox/<name>`.
    pub target: String,
    /// Of every repository's inputs, in order.
    pub fingerprint: String,
    pub usage_unknown: bool,
    pub created_at: String,
    pub expires_at: String,
    pub repositories: Vec<RepositoryPlan>,
}

/// The plan of one repository.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RepositoryPlan {
    pub registry: String,
    pub repository: String,
    pub fingerprint: String,
    /// [`vynil_rules::RetentionConfig::fingerprint`] of the inputs it was made with.
    #[serde(default)]
    pub config_fingerprint: String,
    pub usage_unknown: bool,
    pub entries: Vec<StoredEntry>,
    pub deletions: Vec<StoredDeletion>,
}

impl RepositoryPlan {
    /// `registry/repository`, as the plan names it.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// The name of its execution lease: the repository's identity, so two
    /// executions under two aliases of one repository exclude each other.
    pub fn lease_name(&self) -> String {
        vynil_rules::repository::canonical(&self.registry, &self.repository)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredEntry {
    pub tag: String,
    pub digest: String,
    pub keep: bool,
    pub reasons: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredDeletion {
    pub digest: String,
    pub tags: Vec<String>,
    pub artifacts_only: bool,
}

/// Where a deletion stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeletionState {
    /// Journaled right before the DELETE is sent (never reported): a rerun
    /// that finds the digest gone knows this execution deleted it.
    Deleting,
    /// Deleted and verified gone.
    Deleted,
    AlreadyGone,
    Failed,
}

impl DeletionState {
    pub fn as_str(self) -> &'static str {
        match self {
            DeletionState::Deleting => "deleting",
            DeletionState::Deleted => "deleted",
            DeletionState::AlreadyGone => "already_gone",
            DeletionState::Failed => "failed",
        }
    }
}

/// One outcome, as journaled and reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredOutcome {
    pub registry: String,
    pub repository: String,
    pub digest: String,
    pub tags: Vec<String>,
    pub state: DeletionState,
    pub http_status: Option<u16>,
    pub error_code: String,
    pub error_message: String,
    /// RFC 3339: when verified (for `deleting`, when the DELETE was sent).
    #[serde(default)]
    pub at: String,
    /// How it is known, when not by this run alone.
    #[serde(default)]
    pub note: String,
}

/// Where an execution stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReportState {
    Running,
    Completed,
    /// Running, but no execution holds its repositories any more.
    Interrupted,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredReport {
    pub plan_id: String,
    pub target: String,
    pub fingerprint: String,
    pub executed_by: String,
    pub started_at: String,
    pub finished_at: String,
    pub outcomes: Vec<StoredOutcome>,
    #[serde(default = "completed")]
    pub state: ReportState,
    /// Executions of the same plan after the first (`executed_by` and
    /// `started_at` stay the first's), oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub later: Vec<Attempt>,
}

/// One later execution of a plan: who, when it started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    pub by: String,
    pub at: String,
}

impl StoredReport {
    /// How many outcomes are in `state`.
    pub fn count(&self, state: DeletionState) -> usize {
        self.outcomes.iter().filter(|o| o.state == state).count()
    }
}

fn completed() -> ReportState {
    ReportState::Completed
}

#[async_trait::async_trait]
pub trait PlanStore: Send + Sync + std::fmt::Debug {
    async fn put_plan(&self, plan: &StoredPlan, ttl: Duration) -> Result<(), PurgerError>;
    async fn get_plan(&self, id: &str) -> Result<Option<StoredPlan>, PurgerError>;
    /// Journals `outcome` while `fence` holds (`false`: the lease is lost, nothing written).
    async fn journal(
        &self,
        plan_id: &str,
        outcome: &StoredOutcome,
        fence: &Fence,
    ) -> Result<bool, PurgerError>;
    async fn journaled(&self, plan_id: &str) -> Result<Vec<StoredOutcome>, PurgerError>;
    /// Writes `report` while `fence` holds (`false`: the lease is lost, nothing written).
    async fn put_report(&self, report: &StoredReport, fence: &Fence) -> Result<bool, PurgerError>;
    async fn get_report(&self, plan_id: &str) -> Result<Option<StoredReport>, PurgerError>;
    /// Where execution leases live (one per repository, `registry/repository`).
    fn leases(&self) -> Arc<dyn LeaseStore>;
    /// The current life of the store's state (`vynil_store::epoch`).
    async fn epoch(&self) -> Result<Epoch, PurgerError>;
}

/// What every plan id starts with (then its [`Epoch`] and a random part).
pub const PLAN_ID_PREFIX: &str = "plan-";

fn key(kind: &str, id: &str) -> String {
    format!("{PREFIX}:{kind}:{id}")
}

fn encode<T: Serialize>(value: &T) -> Result<String, PurgerError> {
    serde_json::to_string(value).map_err(|e| PurgerError::Store(format!("cannot encode: {e}")))
}

fn decode<T: for<'de> Deserialize<'de>>(text: &str) -> Result<T, PurgerError> {
    serde_json::from_str(text).map_err(|e| PurgerError::Store(format!("stored record is unreadable: {e}")))
}

/// The Redis store.
#[derive(Clone)]
pub struct RedisStore {
    connection: vynil_store::RedisConnection,
    leases: Arc<RedisLeases>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RedisStore")
    }
}

impl RedisStore {
    pub async fn connect(target: &vynil_store::RedisTarget) -> Result<Self, PurgerError> {
        let connection = target.connect().await?;
        let leases = Arc::new(RedisLeases::new(connection.clone(), &format!("{PREFIX}:lease")));
        Ok(Self { connection, leases })
    }
}

/// Under the fence: one journal field, with the journal's expiry.
const JOURNAL: &str = r"
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[4])
return 1";

/// Under the fence: the report.
const REPORT: &str = r"
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
return 1";

#[async_trait::async_trait]
impl PlanStore for RedisStore {
    async fn put_plan(&self, plan: &StoredPlan, ttl: Duration) -> Result<(), PurgerError> {
        let mut c = self.connection.clone();
        Ok(c.set_ex::<_, _, ()>(key("plan", &plan.id), encode(plan)?, ttl.as_secs().max(1))
            .await
            .map_err(redis_error)?)
    }

    async fn get_plan(&self, id: &str) -> Result<Option<StoredPlan>, PurgerError> {
        let mut c = self.connection.clone();
        let text: Option<String> = c.get(key("plan", id)).await.map_err(redis_error)?;
        text.as_deref().map(decode).transpose()
    }

    async fn journal(
        &self,
        plan_id: &str,
        outcome: &StoredOutcome,
        fence: &Fence,
    ) -> Result<bool, PurgerError> {
        let (journal, body, ttl) =
            (key("journal", plan_id), encode(outcome)?, REPORT_TTL.as_secs().to_string());
        let args = [outcome.digest.as_str(), body.as_str(), ttl.as_str()];
        Ok(run_fenced(&self.connection, Some(fence), JOURNAL, &[&journal], &args).await?)
    }

    async fn journaled(&self, plan_id: &str) -> Result<Vec<StoredOutcome>, PurgerError> {
        let mut c = self.connection.clone();
        let all: HashMap<String, String> = c.hgetall(key("journal", plan_id)).await.map_err(redis_error)?;
        all.values().map(|v| decode(v)).collect()
    }

    async fn put_report(&self, report: &StoredReport, fence: &Fence) -> Result<bool, PurgerError> {
        let (target, body, ttl) =
            (key("report", &report.plan_id), encode(report)?, REPORT_TTL.as_secs().to_string());
        Ok(run_fenced(&self.connection, Some(fence), REPORT, &[&target], &[&body, &ttl]).await?)
    }

    async fn get_report(&self, plan_id: &str) -> Result<Option<StoredReport>, PurgerError> {
        let mut c = self.connection.clone();
        let text: Option<String> = c.get(key("report", plan_id)).await.map_err(redis_error)?;
        text.as_deref().map(decode).transpose()
    }

    fn leases(&self) -> Arc<dyn LeaseStore> {
        self.leases.clone()
    }

    async fn epoch(&self) -> Result<Epoch, PurgerError> {
        Ok(Epoch::of_redis(&self.connection).await?)
    }
}

/// The in-memory store of a single process: its state lives as long as the process.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Mutex<Memory>>,
    leases: Arc<MemoryLeases>,
    epoch: Epoch,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self { inner: Arc::default(), leases: Arc::default(), epoch: Epoch::random() }
    }
}

#[derive(Debug, Default)]
struct Memory {
    plans: HashMap<String, (StoredPlan, Instant)>,
    journals: HashMap<String, HashMap<String, StoredOutcome>>,
    reports: HashMap<String, StoredReport>,
}

impl MemoryStore {
    fn with<T>(&self, f: impl FnOnce(&mut Memory) -> T) -> T {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    async fn holds(&self, fence: &Fence) -> Result<bool, PurgerError> {
        Ok(self.leases.holder(&fence.key).await?.as_deref() == Some(fence.token.as_str()))
    }
}

#[async_trait::async_trait]
impl PlanStore for MemoryStore {
    async fn put_plan(&self, plan: &StoredPlan, ttl: Duration) -> Result<(), PurgerError> {
        self.with(|m| m.plans.insert(plan.id.clone(), (plan.clone(), Instant::now() + ttl)));
        Ok(())
    }

    async fn get_plan(&self, id: &str) -> Result<Option<StoredPlan>, PurgerError> {
        Ok(self
            .with(|m| m.plans.get(id).filter(|(_, until)| *until > Instant::now()).map(|(p, _)| p.clone())))
    }

    async fn journal(
        &self,
        plan_id: &str,
        outcome: &StoredOutcome,
        fence: &Fence,
    ) -> Result<bool, PurgerError> {
        if !self.holds(fence).await? {
            return Ok(false);
        }
        self.with(|m| {
            m.journals
                .entry(plan_id.to_string())
                .or_default()
                .insert(outcome.digest.clone(), outcome.clone());
        });
        Ok(true)
    }

    async fn journaled(&self, plan_id: &str) -> Result<Vec<StoredOutcome>, PurgerError> {
        Ok(self.with(|m| m.journals.get(plan_id).map(|j| j.values().cloned().collect()).unwrap_or_default()))
    }

    async fn put_report(&self, report: &StoredReport, fence: &Fence) -> Result<bool, PurgerError> {
        if !self.holds(fence).await? {
            return Ok(false);
        }
        self.with(|m| m.reports.insert(report.plan_id.clone(), report.clone()));
        Ok(true)
    }

    async fn get_report(&self, plan_id: &str) -> Result<Option<StoredReport>, PurgerError> {
        Ok(self.with(|m| m.reports.get(plan_id).cloned()))
    }

    fn leases(&self) -> Arc<dyn LeaseStore> {
        self.leases.clone()
    }

    async fn epoch(&self) -> Result<Epoch, PurgerError> {
        Ok(self.epoch)
    }
}
