//! Where plans, journals, reports and execution leases live: Redis when
//! configured (shared by replicas, survives a crash), else process memory.
//! Keys carry a schema version so a later layout can live beside this one.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

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
    pub usage_unknown: bool,
    pub entries: Vec<StoredEntry>,
    pub deletions: Vec<StoredDeletion>,
}

impl RepositoryPlan {
    /// `registry/repository`, the name of its execution lease.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
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

/// One verified outcome, as journaled and reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredOutcome {
    pub registry: String,
    pub repository: String,
    pub digest: String,
    pub tags: Vec<String>,
    /// `deleted`, `already_gone` or `failed`.
    pub state: String,
    pub http_status: Option<u16>,
    pub error_code: String,
    pub error_message: String,
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
}

#[async_trait::async_trait]
pub trait PlanStore: Send + Sync + std::fmt::Debug {
    async fn put_plan(&self, plan: &StoredPlan, ttl: Duration) -> Result<(), PurgerError>;
    async fn get_plan(&self, id: &str) -> Result<Option<StoredPlan>, PurgerError>;
    async fn journal(&self, plan_id: &str, outcome: &StoredOutcome) -> Result<(), PurgerError>;
    async fn journaled(&self, plan_id: &str) -> Result<Vec<StoredOutcome>, PurgerError>;
    async fn put_report(&self, report: &StoredReport) -> Result<(), PurgerError>;
    async fn get_report(&self, plan_id: &str) -> Result<Option<StoredReport>, PurgerError>;
    /// Takes (or renews, for the same `owner`) the lease on `target`.
    async fn acquire(&self, target: &str, owner: &str, ttl: Duration) -> Result<bool, PurgerError>;
    async fn release(&self, target: &str, owner: &str) -> Result<(), PurgerError>;
}

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
    connection: redis::aio::ConnectionManager,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RedisStore")
    }
}

fn redis_error(e: redis::RedisError) -> PurgerError {
    PurgerError::Store(format!("Redis: {e}"))
}

impl RedisStore {
    pub async fn connect(url: &str) -> Result<Self, PurgerError> {
        let client = redis::Client::open(url).map_err(redis_error)?;
        let connection = redis::aio::ConnectionManager::new(client).await.map_err(redis_error)?;
        Ok(Self { connection })
    }
}

const RENEW_OR_ACQUIRE: &str = r"
local current = redis.call('GET', KEYS[1])
if current == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
elseif current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0";

const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0";

#[async_trait::async_trait]
impl PlanStore for RedisStore {
    async fn put_plan(&self, plan: &StoredPlan, ttl: Duration) -> Result<(), PurgerError> {
        let mut c = self.connection.clone();
        c.set_ex::<_, _, ()>(key("plan", &plan.id), encode(plan)?, ttl.as_secs().max(1))
            .await
            .map_err(redis_error)
    }

    async fn get_plan(&self, id: &str) -> Result<Option<StoredPlan>, PurgerError> {
        let mut c = self.connection.clone();
        let text: Option<String> = c.get(key("plan", id)).await.map_err(redis_error)?;
        text.as_deref().map(decode).transpose()
    }

    async fn journal(&self, plan_id: &str, outcome: &StoredOutcome) -> Result<(), PurgerError> {
        let mut c = self.connection.clone();
        let k = key("journal", plan_id);
        c.hset::<_, _, _, ()>(&k, &outcome.digest, encode(outcome)?).await.map_err(redis_error)?;
        c.expire::<_, ()>(&k, REPORT_TTL.as_secs() as i64).await.map_err(redis_error)
    }

    async fn journaled(&self, plan_id: &str) -> Result<Vec<StoredOutcome>, PurgerError> {
        let mut c = self.connection.clone();
        let all: HashMap<String, String> = c.hgetall(key("journal", plan_id)).await.map_err(redis_error)?;
        all.values().map(|v| decode(v)).collect()
    }

    async fn put_report(&self, report: &StoredReport) -> Result<(), PurgerError> {
        let mut c = self.connection.clone();
        c.set_ex::<_, _, ()>(key("report", &report.plan_id), encode(report)?, REPORT_TTL.as_secs())
            .await
            .map_err(redis_error)
    }

    async fn get_report(&self, plan_id: &str) -> Result<Option<StoredReport>, PurgerError> {
        let mut c = self.connection.clone();
        let text: Option<String> = c.get(key("report", plan_id)).await.map_err(redis_error)?;
        text.as_deref().map(decode).transpose()
    }

    async fn acquire(&self, target: &str, owner: &str, ttl: Duration) -> Result<bool, PurgerError> {
        let mut c = self.connection.clone();
        let taken: i64 = redis::Script::new(RENEW_OR_ACQUIRE)
            .key(key("lease", target))
            .arg(owner)
            .arg(ttl.as_millis() as u64)
            .invoke_async(&mut c)
            .await
            .map_err(redis_error)?;
        Ok(taken == 1)
    }

    async fn release(&self, target: &str, owner: &str) -> Result<(), PurgerError> {
        let mut c = self.connection.clone();
        let _: i64 = redis::Script::new(RELEASE)
            .key(key("lease", target))
            .arg(owner)
            .invoke_async(&mut c)
            .await
            .map_err(redis_error)?;
        Ok(())
    }
}

/// The in-memory store of a single process.
#[derive(Debug, Default, Clone)]
pub struct MemoryStore {
    inner: Arc<Mutex<Memory>>,
}

#[derive(Debug, Default)]
struct Memory {
    plans: HashMap<String, (StoredPlan, Instant)>,
    journals: HashMap<String, HashMap<String, StoredOutcome>>,
    reports: HashMap<String, StoredReport>,
    leases: HashMap<String, (String, Instant)>,
}

impl MemoryStore {
    fn with<T>(&self, f: impl FnOnce(&mut Memory) -> T) -> T {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
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

    async fn journal(&self, plan_id: &str, outcome: &StoredOutcome) -> Result<(), PurgerError> {
        self.with(|m| {
            m.journals
                .entry(plan_id.to_string())
                .or_default()
                .insert(outcome.digest.clone(), outcome.clone());
        });
        Ok(())
    }

    async fn journaled(&self, plan_id: &str) -> Result<Vec<StoredOutcome>, PurgerError> {
        Ok(self.with(|m| m.journals.get(plan_id).map(|j| j.values().cloned().collect()).unwrap_or_default()))
    }

    async fn put_report(&self, report: &StoredReport) -> Result<(), PurgerError> {
        self.with(|m| m.reports.insert(report.plan_id.clone(), report.clone()));
        Ok(())
    }

    async fn get_report(&self, plan_id: &str) -> Result<Option<StoredReport>, PurgerError> {
        Ok(self.with(|m| m.reports.get(plan_id).cloned()))
    }

    async fn acquire(&self, target: &str, owner: &str, ttl: Duration) -> Result<bool, PurgerError> {
        Ok(self.with(|m| {
            let now = Instant::now();
            match m.leases.get(target) {
                Some((holder, until)) if holder != owner && *until > now => false,
                _ => {
                    m.leases.insert(target.to_string(), (owner.to_string(), now + ttl));
                    true
                }
            }
        }))
    }

    async fn release(&self, target: &str, owner: &str) -> Result<(), PurgerError> {
        self.with(|m| {
            if m.leases.get(target).is_some_and(|(holder, _)| holder == owner) {
                m.leases.remove(target);
            }
        });
        Ok(())
    }
}
