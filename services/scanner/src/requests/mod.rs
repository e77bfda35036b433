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

mod memory_queue;
mod redis_queue;

use std::{sync::Arc, time::Duration};

use serde::{Deserialize, Serialize};
use vynil_rules::{ScanFilter, ScanScope};
use vynil_store::{
    epoch::Epoch,
    lease::{Fence, LeaseStore},
};

use crate::ScannerError;

pub use memory_queue::MemoryQueue;
pub use redis_queue::RedisQueue;

const PREFIX: &str = "vynil:v1:scanner";
const RECORD_TTL: Duration = Duration::from_secs(24 * 3600);
const FULL: &str = "full";
/// What every scan id starts with (then its [`Epoch`] and a random part).
const ID_PREFIX: &str = "scan-";
/// How long a touch is remembered.
const TOUCH_TTL: Duration = Duration::from_secs(60);

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
