//! Durable scan requests: one scan per JukeBox at a time across replicas.
//!
//! A request is recorded before anyone runs it (so it survives a restart and
//! any replica may run it), then claimed under a lease that expires with its
//! holder: a replica that dies mid-scan leaves its items "running", and the
//! next claimer, once the lease has expired, runs them again.
//!
//! A request is satisfied only by a scan that starts after it was made, so a
//! tag pushed just before a request is always seen by its scan: it joins a
//! queued full scan or a queued identical partial one (two replicas asked at
//! once scan once), and otherwise queues behind whatever runs. At most one
//! scan runs and one is queued per JukeBox: the queued items are claimed
//! together, and any full item among them makes that one full scan.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};
use vynil_rules::{ScanFilter, ScanScope};
use vynil_store::{
    epoch::Epoch,
    lease::{Fence, LeaseStore, MemoryLeases, RedisLeases, run_fenced},
};

use vynil_store::redis_error;

use crate::ScannerError;

const PREFIX: &str = "vynil:v1:scanner";
const RECORD_TTL: Duration = Duration::from_secs(24 * 3600);
const FULL: &str = "full";
/// What every scan id starts with (then its [`Epoch`] and a random part).
const ID_PREFIX: &str = "scan-";

/// What one claimed item asks: a full, partial or repository-scoped scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanItem {
    pub id: String,
    pub scope: ScanScope,
}

/// The queue's field for a request (its serialised form): identical
/// requests share a field, so a burst of them queues one scan.
fn field(scope: &ScanScope) -> String {
    match scope {
        ScanScope::Full => FULL.to_string(),
        ScanScope::Partial(filter) => format!("partial:{filter}"),
        // `|` appears in neither a registry host nor a repository name.
        ScanScope::Repository((registry, repository)) => format!("repository:{registry}|{repository}"),
    }
}

/// An item read back from the queue; a field that no longer parses (written
/// by another version) is dropped with a warning rather than run as full.
fn item(field: &str, id: &str) -> Option<ScanItem> {
    let unreadable = |why: &dyn std::fmt::Display| {
        tracing::warn!(%id, %field, %why, "a queued scan request is unreadable; dropped");
    };
    let scope = if field == FULL {
        ScanScope::Full
    } else if let Some(raw) = field.strip_prefix("partial:") {
        match ScanFilter::parse(raw) {
            Ok(filter) => ScanScope::Partial(filter),
            Err(error) => {
                unreadable(&error);
                return None;
            }
        }
    } else if let Some((registry, repository)) =
        field.strip_prefix("repository:").and_then(|r| r.split_once('|'))
    {
        ScanScope::Repository((registry.to_string(), repository.to_string()))
    } else {
        unreadable(&"unknown kind (written by another version?)");
        return None;
    };
    Some(ScanItem { id: id.to_string(), scope })
}

/// Where a scan stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordState {
    #[default]
    Queued,
    Running,
    Succeeded,
    /// Some repositories failed; their previous entries were kept.
    PartiallyFailed,
    Failed,
}

impl RecordState {
    pub fn as_str(self) -> &'static str {
        match self {
            RecordState::Queued => "queued",
            RecordState::Running => "running",
            RecordState::Succeeded => "succeeded",
            RecordState::PartiallyFailed => "partially_failed",
            RecordState::Failed => "failed",
        }
    }

    pub fn is_final(self) -> bool {
        matches!(self, RecordState::Succeeded | RecordState::PartiallyFailed | RecordState::Failed)
    }
}

impl std::fmt::Display for RecordState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The state of one scan, as `GetScan` and `WatchScan` show it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScanRecord {
    pub id: String,
    pub jukebox: String,
    /// A partial scan's filter; empty otherwise.
    pub filter: String,
    /// A repository-scoped scan's `(registry, repository)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<(String, String)>,
    pub state: RecordState,
    pub repositories_done: u32,
    pub repositories_total: u32,
    pub tags_seen: u64,
    pub manifests_read: u64,
    pub errors: Vec<(String, String)>,
    pub started_at: String,
    pub finished_at: String,
    /// W3C `traceparent` of the request that queued the scan: the scan's
    /// span continues that trace whichever replica runs it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub trace: String,
    /// Unix milliseconds the request was queued (what a push burst settles on).
    #[serde(default)]
    pub requested_at_ms: i64,
}

impl ScanRecord {
    /// A record of `jukebox` for a scan of `scope`.
    pub fn of(jukebox: &str, scope: &ScanScope) -> Self {
        Self {
            jukebox: jukebox.to_string(),
            filter: scope.filter().map(ToString::to_string).unwrap_or_default(),
            repository: match scope {
                ScanScope::Repository(repository) => Some(repository.clone()),
                _ => None,
            },
            ..Self::default()
        }
    }

    pub fn is_final(&self) -> bool {
        self.state.is_final()
    }
}

#[async_trait::async_trait]
pub trait RequestQueue: Send + Sync + std::fmt::Debug {
    /// Records a request; returns its scan id and whether it joined an existing one.
    async fn submit(&self, jukebox: &str, scope: &ScanScope) -> Result<(String, bool), ScannerError>;
    /// Takes the JukeBox's lease for `token` and the items to run now, if any.
    async fn claim(
        &self,
        jukebox: &str,
        token: &str,
        lease: Duration,
    ) -> Result<Option<Vec<ScanItem>>, ScannerError>;
    /// Where the JukeBox leases `claim` takes live (renewed and checked there).
    fn leases(&self) -> Arc<dyn LeaseStore>;
    /// Tells every replica's worker that `jukebox` has a new request (once
    /// its record is written, so the worker that runs it finds its trace).
    async fn announce(&self, _jukebox: &str) -> Result<(), ScannerError> {
        Ok(())
    }
    /// Announcements of requests made by any replica; `None` where there is
    /// no other replica (memory) or the announcements cannot be followed.
    async fn wakeups(&self) -> Option<tokio::sync::mpsc::Receiver<vynil_store::pubsub::Message>> {
        None
    }
    /// The claimed items are done: forget them and release the lease, if
    /// `token` still holds it.
    async fn complete(&self, jukebox: &str, token: &str) -> Result<(), ScannerError>;
    async fn with_work(&self) -> Result<Vec<String>, ScannerError>;
    /// The items queued (not yet claimed) for `jukebox`.
    async fn pending(&self, jukebox: &str) -> Result<Vec<ScanItem>, ScannerError>;
    /// Writes a scan record; under a `fence`, only while its lease holds
    /// (`false`: refused, the lease is lost).
    async fn put_record(&self, record: &ScanRecord, fence: Option<&Fence>) -> Result<bool, ScannerError>;
    async fn record(&self, id: &str) -> Result<Option<ScanRecord>, ScannerError>;
    /// The current life of the queue's state (`vynil_store::epoch`).
    async fn epoch(&self) -> Result<Epoch, ScannerError>;
    /// The record of scan `id`; `NotFound` when it expired or never was,
    /// `Lost` when it was made in a life of the state that is gone.
    async fn find(&self, id: &str) -> Result<ScanRecord, ScannerError> {
        if let Some(record) = self.record(id).await? {
            return Ok(record);
        }
        let missing = self.epoch().await?.missing(id, ID_PREFIX);
        Err(match missing.lost(&format!("scan {id:?}"), "request a new scan") {
            Some(lost) => lost.into(),
            None => ScannerError::NotFound(format!("no scan {id:?} (scan records are kept 24 h)")),
        })
    }
    /// The latest finished scan of a JukeBox (`put_record` of a final record
    /// makes it the latest).
    async fn latest(&self, jukebox: &str) -> Result<Option<ScanRecord>, ScannerError>;
    /// Claims a scheduled tick (`at`: its Unix time) of a JukeBox for this
    /// replica: `true` for exactly one caller per tick, whichever replica asks
    /// first; the claim is forgotten after `keep`.
    async fn claim_tick(&self, jukebox: &str, at: i64, keep: Duration) -> Result<bool, ScannerError>;
    /// Records that a push asked for `jukebox` at `at_ms` (Unix ms): the
    /// burst it belongs to is still going.
    async fn touch(&self, jukebox: &str, at_ms: i64) -> Result<(), ScannerError>;
    /// The last [`RequestQueue::touch`] of `jukebox`, if recent.
    async fn touched(&self, jukebox: &str) -> Result<Option<i64>, ScannerError>;
}

/// How long a touch is remembered.
const TOUCH_TTL: Duration = Duration::from_secs(60);

/// The queue of a single process: its state lives as long as the process.
#[derive(Debug)]
pub struct MemoryQueue {
    inner: Mutex<Memory>,
    leases: Arc<MemoryLeases>,
    epoch: Epoch,
}

impl Default for MemoryQueue {
    fn default() -> Self {
        Self { inner: Mutex::default(), leases: Arc::default(), epoch: Epoch::random() }
    }
}

#[derive(Debug, Default)]
struct Memory {
    pending: HashMap<String, BTreeMap<String, String>>,
    running: HashMap<String, BTreeMap<String, String>>,
    records: HashMap<String, ScanRecord>,
    latest: HashMap<String, String>,
    ticks: HashMap<(String, i64), Instant>,
    touched: HashMap<String, i64>,
}

#[async_trait::async_trait]
impl RequestQueue for MemoryQueue {
    async fn submit(&self, jukebox: &str, scope: &ScanScope) -> Result<(String, bool), ScannerError> {
        let mut m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let wanted = field(scope);
        if let Some(id) = m.pending.get(jukebox).and_then(|t| t.get(FULL)) {
            return Ok((id.clone(), true));
        }
        if let Some(id) = m.pending.get(jukebox).and_then(|t| t.get(&wanted)) {
            return Ok((id.clone(), true));
        }
        let id = self.epoch.new_id(ID_PREFIX);
        m.pending.entry(jukebox.to_string()).or_default().insert(wanted, id.clone());
        Ok((id, false))
    }

    async fn claim(
        &self,
        jukebox: &str,
        token: &str,
        lease: Duration,
    ) -> Result<Option<Vec<ScanItem>>, ScannerError> {
        if !self.leases.acquire(jukebox, token, lease).await? {
            return Ok(None);
        }
        let items = {
            let mut m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let running = m.running.get(jukebox).cloned().unwrap_or_default();
            if running.is_empty() {
                let pending = m.pending.remove(jukebox).unwrap_or_default();
                if !pending.is_empty() {
                    m.running.insert(jukebox.to_string(), pending.clone());
                }
                pending
            } else {
                running
            }
        };
        if items.is_empty() {
            self.leases.release(jukebox, token).await?;
            return Ok(None);
        }
        Ok(Some(items.iter().filter_map(|(f, id)| item(f, id)).collect()))
    }

    fn leases(&self) -> Arc<dyn LeaseStore> {
        self.leases.clone()
    }

    async fn complete(&self, jukebox: &str, token: &str) -> Result<(), ScannerError> {
        if self.leases.holder(jukebox).await?.as_deref() == Some(token) {
            self.inner.lock().unwrap_or_else(|p| p.into_inner()).running.remove(jukebox);
            self.leases.release(jukebox, token).await?;
        }
        Ok(())
    }

    async fn pending(&self, jukebox: &str) -> Result<Vec<ScanItem>, ScannerError> {
        let m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        Ok(m.pending
            .get(jukebox)
            .map(|t| t.iter().filter_map(|(f, id)| item(f, id)).collect())
            .unwrap_or_default())
    }

    async fn with_work(&self) -> Result<Vec<String>, ScannerError> {
        let m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let names: HashSet<&String> = m.pending.keys().chain(m.running.keys()).collect();
        Ok(names.into_iter().cloned().collect())
    }

    async fn put_record(&self, record: &ScanRecord, fence: Option<&Fence>) -> Result<bool, ScannerError> {
        if let Some(fence) = fence
            && self.leases.holder(&fence.key).await?.as_deref() != Some(fence.token.as_str())
        {
            return Ok(false);
        }
        let mut m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if record.is_final() {
            m.latest.insert(record.jukebox.clone(), record.id.clone());
        }
        m.records.insert(record.id.clone(), record.clone());
        Ok(true)
    }

    async fn record(&self, id: &str) -> Result<Option<ScanRecord>, ScannerError> {
        Ok(self.inner.lock().unwrap_or_else(|p| p.into_inner()).records.get(id).cloned())
    }

    async fn epoch(&self) -> Result<Epoch, ScannerError> {
        Ok(self.epoch)
    }

    async fn latest(&self, jukebox: &str) -> Result<Option<ScanRecord>, ScannerError> {
        let m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        Ok(m.latest.get(jukebox).and_then(|id| m.records.get(id)).cloned())
    }

    async fn claim_tick(&self, jukebox: &str, at: i64, keep: Duration) -> Result<bool, ScannerError> {
        let mut m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        m.ticks.retain(|_, until| *until > now);
        Ok(m.ticks.insert((jukebox.to_string(), at), now + keep).is_none())
    }

    async fn touch(&self, jukebox: &str, at_ms: i64) -> Result<(), ScannerError> {
        let mut m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        m.touched.insert(jukebox.to_string(), at_ms);
        Ok(())
    }

    async fn touched(&self, jukebox: &str) -> Result<Option<i64>, ScannerError> {
        Ok(self.inner.lock().unwrap_or_else(|p| p.into_inner()).touched.get(jukebox).copied())
    }
}

/// The queue shared by replicas through Redis (atomic Lua scripts).
#[derive(Clone)]
pub struct RedisQueue {
    client: redis::Client,
    connection: redis::aio::ConnectionManager,
    leases: Arc<RedisLeases>,
}

impl std::fmt::Debug for RedisQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RedisQueue")
    }
}

fn key(kind: &str, jukebox: &str) -> String {
    format!("{PREFIX}:{kind}:{jukebox}")
}

const SUBMIT: &str = r"
local field = ARGV[1]
local id = redis.call('HGET', KEYS[1], 'full')
if id then return {id, 1} end
local existing = redis.call('HGET', KEYS[1], field)
if existing then return {existing, 1} end
redis.call('HSET', KEYS[1], field, ARGV[2])
redis.call('SADD', KEYS[2], ARGV[3])
return {ARGV[2], 0}";

/// Pub/sub channel announcing a new request (payload: the JukeBox): every
/// replica's worker wakes at once instead of at its next poll.
const WAKE_CHANNEL: &str = "vynil:v1:scanner:requests";

const CLAIM: &str = r"
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return false end
local running = redis.call('HGETALL', KEYS[3])
if #running > 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return running
end
local pending = redis.call('HGETALL', KEYS[2])
if #pending == 0 then
  if holder then redis.call('DEL', KEYS[1]) end
  redis.call('SREM', KEYS[4], ARGV[3])
  return false
end
redis.call('HSET', KEYS[3], unpack(pending))
redis.call('DEL', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return pending";

const COMPLETE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
  redis.call('DEL', KEYS[1])
end
return 1";

/// A record, and the JukeBox's latest pointer when final (under a lease's
/// fence when given).
const PUT_RECORD: &str = r"
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
if ARGV[5] == '1' then redis.call('SET', KEYS[3], ARGV[4], 'EX', ARGV[3]) end
return 1";

impl RedisQueue {
    pub async fn connect(url: &str) -> Result<Self, ScannerError> {
        let client = redis::Client::open(url).map_err(redis_error)?;
        let connection = redis::aio::ConnectionManager::new(client.clone()).await.map_err(redis_error)?;
        let leases = Arc::new(RedisLeases::new(connection.clone(), &format!("{PREFIX}:lease")));
        Ok(Self { client, connection, leases })
    }
}

#[async_trait::async_trait]
impl RequestQueue for RedisQueue {
    async fn announce(&self, jukebox: &str) -> Result<(), ScannerError> {
        let mut c = self.connection.clone();
        let _: i64 = redis::cmd("PUBLISH")
            .arg(WAKE_CHANNEL)
            .arg(jukebox)
            .query_async(&mut c)
            .await
            .map_err(redis_error)?;
        Ok(())
    }

    async fn wakeups(&self) -> Option<tokio::sync::mpsc::Receiver<vynil_store::pubsub::Message>> {
        match vynil_store::pubsub::follow(self.client.clone(), WAKE_CHANNEL).await {
            Ok(messages) => Some(messages),
            Err(error) => {
                tracing::warn!(%error, "cannot follow scan requests on pub/sub; polling only");
                None
            }
        }
    }

    async fn submit(&self, jukebox: &str, scope: &ScanScope) -> Result<(String, bool), ScannerError> {
        let mut c = self.connection.clone();
        let (id, joined): (String, i64) = redis::Script::new(SUBMIT)
            .key(key("pending", jukebox))
            .key(format!("{PREFIX}:with-work"))
            .arg(field(scope))
            .arg(self.epoch().await?.new_id(ID_PREFIX))
            .arg(jukebox)
            .invoke_async(&mut c)
            .await
            .map_err(redis_error)?;
        Ok((id, joined == 1))
    }

    async fn claim(
        &self,
        jukebox: &str,
        holder: &str,
        lease: Duration,
    ) -> Result<Option<Vec<ScanItem>>, ScannerError> {
        let mut c = self.connection.clone();
        let claimed: Option<Vec<String>> = redis::Script::new(CLAIM)
            .key(key("lease", jukebox))
            .key(key("pending", jukebox))
            .key(key("running", jukebox))
            .key(format!("{PREFIX}:with-work"))
            .arg(holder)
            .arg(lease.as_millis() as u64)
            .arg(jukebox)
            .invoke_async(&mut c)
            .await
            .map_err(redis_error)?;
        Ok(claimed.map(|flat| flat.chunks(2).filter_map(|pair| item(pair.first()?, pair.get(1)?)).collect()))
    }

    fn leases(&self) -> Arc<dyn LeaseStore> {
        self.leases.clone()
    }

    async fn complete(&self, jukebox: &str, token: &str) -> Result<(), ScannerError> {
        let mut c = self.connection.clone();
        let _: i64 = redis::Script::new(COMPLETE)
            .key(key("lease", jukebox))
            .key(key("running", jukebox))
            .arg(token)
            .invoke_async(&mut c)
            .await
            .map_err(redis_error)?;
        Ok(())
    }

    async fn pending(&self, jukebox: &str) -> Result<Vec<ScanItem>, ScannerError> {
        let mut c = self.connection.clone();
        let fields: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(key("pending", jukebox))
            .query_async(&mut c)
            .await
            .map_err(redis_error)?;
        Ok(fields.iter().filter_map(|(f, id)| item(f, id)).collect())
    }

    async fn with_work(&self) -> Result<Vec<String>, ScannerError> {
        use redis::AsyncCommands;
        let mut c = self.connection.clone();
        Ok(c.smembers(format!("{PREFIX}:with-work")).await.map_err(redis_error)?)
    }

    async fn put_record(&self, record: &ScanRecord, fence: Option<&Fence>) -> Result<bool, ScannerError> {
        let body = serde_json::to_string(record).map_err(|e| ScannerError::Store(e.to_string()))?;
        let (scan, latest) = (key("scan", &record.id), key("latest", &record.jukebox));
        let (ttl, last) = (RECORD_TTL.as_secs().to_string(), if record.is_final() { "1" } else { "0" });
        let args = [body.as_str(), ttl.as_str(), record.id.as_str(), last];
        Ok(run_fenced(&self.connection, fence, PUT_RECORD, &[&scan, &latest], &args).await?)
    }

    async fn latest(&self, jukebox: &str) -> Result<Option<ScanRecord>, ScannerError> {
        use redis::AsyncCommands;
        let mut c = self.connection.clone();
        let id: Option<String> = c.get(key("latest", jukebox)).await.map_err(redis_error)?;
        match id {
            Some(id) => self.record(&id).await,
            None => Ok(None),
        }
    }

    async fn record(&self, id: &str) -> Result<Option<ScanRecord>, ScannerError> {
        use redis::AsyncCommands;
        let mut c = self.connection.clone();
        let text: Option<String> = c.get(key("scan", id)).await.map_err(redis_error)?;
        text.map(|t| {
            serde_json::from_str(&t).map_err(|e| ScannerError::Store(format!("scan record unreadable: {e}")))
        })
        .transpose()
    }

    async fn epoch(&self) -> Result<Epoch, ScannerError> {
        Ok(Epoch::of_redis(&self.connection).await?)
    }

    async fn claim_tick(&self, jukebox: &str, at: i64, keep: Duration) -> Result<bool, ScannerError> {
        let mut c = self.connection.clone();
        let claimed: Option<String> = redis::cmd("SET")
            .arg(format!("{}:{at}", key("tick", jukebox)))
            .arg(1)
            .arg("NX")
            .arg("PX")
            .arg(keep.as_millis().max(1) as u64)
            .query_async(&mut c)
            .await
            .map_err(redis_error)?;
        Ok(claimed.is_some())
    }

    async fn touch(&self, jukebox: &str, at_ms: i64) -> Result<(), ScannerError> {
        let mut c = self.connection.clone();
        let _: () = redis::cmd("SET")
            .arg(key("touched", jukebox))
            .arg(at_ms)
            .arg("PX")
            .arg(TOUCH_TTL.as_millis() as u64)
            .query_async(&mut c)
            .await
            .map_err(redis_error)?;
        Ok(())
    }

    async fn touched(&self, jukebox: &str) -> Result<Option<i64>, ScannerError> {
        let mut c = self.connection.clone();
        Ok(redis::cmd("GET").arg(key("touched", jukebox)).query_async(&mut c).await.map_err(redis_error)?)
    }
}
