//! The catalog's state: an in-process snapshot of every cache entry, filled
//! from the JukeBox store (status is the signal, never scan Jobs: upstream
//! #17) and shared through Redis when configured, so every replica answers
//! from memory and follows changes within milliseconds.

use std::{
    collections::HashMap,
    sync::{
        Arc, RwLock,
        atomic::{AtomicBool, Ordering},
    },
};
use tracing::Instrument;

use tokio::sync::broadcast;
use vynil_rules::{Viewer, catalog::CatalogRole};
use vynil_store::{JukeboxRecord, JukeboxStore, StoreChange};

use vynil_store::package_cache::{Entry, Message, PackageCache};

use crate::CatalogError;

/// A change of one entry: its new hash, or `None` when removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub jukebox: String,
    pub hash: Option<String>,
}

/// The health service name under which the cache's state is reported: NOT_SERVING
/// while the catalog serves from its snapshot only. The server as a whole
/// stays SERVING (it keeps answering), so a Redis blip un-readies no pod.
pub const CACHE_HEALTH: &str = "vynil.catalog.v1.Catalog/cache";

/// A JukeBox as the catalog serves it: its cache entry, and each package's
/// roles for the entry's own channel (the only one it answers), computed once
/// per change. Every read used to clone the whole entry and recompute every
/// repository's view; now it shares this.
#[derive(Debug)]
pub struct Served {
    entry: Entry,
    roles: Vec<Vec<CatalogRole>>,
}

impl Served {
    fn new(entry: Entry, framework: &semver::Version) -> Self {
        let viewer = Viewer { channel: entry.channel, framework: framework.clone() };
        let roles = vynil_rules::catalog::with_recalls(
            vynil_rules::catalog::roles_under(&entry.packages, &viewer, entry.verify_mode()),
            &entry.packages,
            &vynil_crds::RecalledRevision::rules(&entry.recalls),
        );
        Self { entry, roles }
    }

    /// The roles of each of [`Entry::packages`], in order.
    pub fn roles(&self) -> &[Vec<CatalogRole>] {
        &self.roles
    }
}

impl std::ops::Deref for Served {
    type Target = Entry;
    fn deref(&self) -> &Entry {
        &self.entry
    }
}

#[derive(Debug)]
pub struct Catalog {
    snapshot: RwLock<HashMap<String, Arc<Served>>>,
    loaded: AtomicBool,
    resync_due: AtomicBool,
    /// `true` while the shared cache answers (`false`: degraded, serving
    /// from the snapshot); health reports it under [`CACHE_HEALTH`].
    cache_healthy: tokio::sync::watch::Sender<bool>,
    cache: Arc<dyn PackageCache>,
    store: Arc<dyn JukeboxStore>,
    changes: broadcast::Sender<Change>,
    pub framework: semver::Version,
    pub metrics: crate::metrics::CatalogMetrics,
}

impl Catalog {
    /// The catalog with the cache `redis` names (memory without one).
    pub async fn new(
        store: Arc<dyn JukeboxStore>,
        redis: Option<&vynil_store::RedisTarget>,
        framework: semver::Version,
    ) -> Result<Self, CatalogError> {
        Ok(Self::with_cache(store, vynil_store::package_cache::open(redis).await?, framework))
    }

    pub fn with_cache(
        store: Arc<dyn JukeboxStore>,
        cache: Arc<dyn PackageCache>,
        framework: semver::Version,
    ) -> Self {
        let (changes, _) = broadcast::channel(1024);
        Self {
            snapshot: RwLock::default(),
            loaded: AtomicBool::new(false),
            resync_due: AtomicBool::new(false),
            cache_healthy: tokio::sync::watch::Sender::new(true),
            cache,
            store,
            changes,
            framework,
            metrics: crate::metrics::CatalogMetrics::default(),
        }
    }

    /// An entry, or `Unavailable` when nothing was ever loaded (never "not found").
    pub fn entry(&self, jukebox: &str) -> Result<Option<Arc<Served>>, CatalogError> {
        use crate::metrics::LookupResult;
        if !self.loaded.load(Ordering::Acquire) {
            self.metrics.lookup(LookupResult::not_loaded);
            return Err(CatalogError::Unavailable("the catalog has not loaded yet; retry".into()));
        }
        let entry = self.snapshot.read().unwrap_or_else(|p| p.into_inner()).get(jukebox).cloned();
        self.metrics.lookup(if entry.is_some() { LookupResult::hit } else { LookupResult::miss });
        Ok(entry)
    }

    /// JukeBox sources the store could not read (they have no entry).
    pub async fn skipped(&self) -> Vec<vynil_store::SkippedSource> {
        self.store.skipped().await
    }

    pub fn entries(&self) -> Result<Vec<Arc<Served>>, CatalogError> {
        if !self.loaded.load(Ordering::Acquire) {
            return Err(CatalogError::Unavailable("the catalog has not loaded yet; retry".into()));
        }
        let mut entries: Vec<Arc<Served>> =
            self.snapshot.read().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        entries.sort_by(|a, b| a.jukebox.cmp(&b.jukebox));
        Ok(entries)
    }

    pub fn is_degraded(&self) -> bool {
        !*self.cache_healthy.borrow()
    }

    /// Follows the cache's health (for `grpc.health.v1`).
    pub fn cache_health(&self) -> tokio::sync::watch::Receiver<bool> {
        self.cache_healthy.subscribe()
    }

    fn set_degraded(&self, degraded: bool) {
        self.cache_healthy.send_if_modified(|healthy| std::mem::replace(healthy, !degraded) == degraded);
        self.metrics.degraded.set(i64::from(degraded));
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    fn apply(&self, jukebox: &str, entry: Option<Entry>) {
        let held =
            self.snapshot.read().unwrap_or_else(|p| p.into_inner()).get(jukebox).map(|e| e.hash.clone());
        let hash = entry.as_ref().map(|e| e.hash.clone());
        if held == hash {
            return;
        }
        // Roles are computed here, once per change, outside the lock.
        let served = entry.map(|entry| Arc::new(Served::new(entry, &self.framework)));
        let mut snapshot = self.snapshot.write().unwrap_or_else(|p| p.into_inner());
        match served {
            Some(served) => snapshot.insert(jukebox.to_string(), served),
            None => snapshot.remove(jukebox),
        };
        drop(snapshot);
        let _ = self.changes.send(Change { jukebox: jukebox.to_string(), hash });
    }

    /// Brings one JukeBox's entry in line with its status. A failure (store
    /// or Redis unreachable) marks the catalog degraded: answers go on from
    /// the snapshot, and the follower resyncs until it succeeds.
    pub async fn ingest(&self, jukebox: &str) -> Result<(), CatalogError> {
        let result = self.try_ingest(jukebox).await;
        self.set_degraded(result.is_err());
        result
    }

    /// A change of the store's feed: the record it carries, else read.
    async fn ingest_change(&self, change: StoreChange) -> Result<(), CatalogError> {
        let result = match change {
            StoreChange::Resync => return Ok(()),
            StoreChange::Named(name) => self.try_ingest(&name).await,
            StoreChange::Applied(record) => {
                let name = record.name.clone();
                self.absorb(&name, Some(*record)).await
            }
            StoreChange::Deleted(name) => self.absorb(&name, None).await,
        };
        self.set_degraded(result.is_err());
        result
    }

    async fn try_ingest(&self, jukebox: &str) -> Result<(), CatalogError> {
        let record = self.store.get(jukebox).await.map_err(|e| CatalogError::Unavailable(e.to_string()))?;
        self.absorb(jukebox, record).await
    }

    /// `jukebox` as it is now (`None`: gone) into the shared cache and the snapshot.
    async fn absorb(&self, jukebox: &str, record: Option<JukeboxRecord>) -> Result<(), CatalogError> {
        let mut cause = None;
        let entry = record.and_then(|r| {
            r.status.map(|status| {
                cause = status.traceparent.clone();
                Entry::from_status(&r.name, &r.spec, &status)
            })
        });
        match &entry {
            Some(entry) if self.cache.upsert_if_changed(entry).await? => {
                // What wrote the status (a scan) caused this write: link to it.
                if let Some(cause) = &cause {
                    vynil_runtime::link(&tracing::Span::current(), cause);
                }
                if let Some(lag) = entry
                    .last_change_time
                    .as_deref()
                    .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                    .map(|t| jiff::Timestamp::now().duration_since(t).as_secs_f64())
                {
                    self.metrics.freshness_lag.observe(lag.max(0.0));
                }
                self.metrics.upserts.inc()
            }
            Some(_) => self.metrics.skipped_identical.inc(),
            None if self.cache.remove(jukebox).await? => self.metrics.removals.inc(),
            None => 0,
        };
        self.apply(jukebox, entry);
        Ok(())
    }

    /// Full resync: every JukeBox of the store, and removal of the others.
    pub async fn resync(&self) -> Result<(), CatalogError> {
        let records = self.store.list().await.map_err(|e| CatalogError::Unavailable(e.to_string()))?;
        let names: Vec<String> = records.iter().map(|r| r.name.clone()).collect();
        // The list holds every record: no read of each.
        for record in records {
            let name = record.name.clone();
            let absorbed = self.absorb(&name, Some(record)).await;
            self.set_degraded(absorbed.is_err());
            absorbed?;
        }
        let mut stale: Vec<String> =
            self.snapshot.read().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
        stale.extend(self.cache.all().await?.into_keys());
        stale.retain(|n| !names.contains(n));
        stale.sort();
        stale.dedup();
        // The list is authoritative: what it lacks is gone, without a read.
        for name in stale {
            let removed = self.absorb(&name, None).await;
            self.set_degraded(removed.is_err());
            removed?;
        }
        self.loaded.store(true, Ordering::Release);
        Ok(())
    }

    /// Follows store changes (and other replicas' cache writes) until the
    /// process ends; resyncs after a failure and every `resync_every` (a
    /// JukeBox file removed announces nothing).
    pub async fn follow(self: Arc<Self>, resync_every: std::time::Duration) {
        const FIRST_RETRY: std::time::Duration = std::time::Duration::from_millis(500);
        const LAST_RETRY: std::time::Duration = std::time::Duration::from_secs(30);
        let mut store_changes = self.store.subscribe();
        let mut invalidations = self.cache.invalidations();
        let mut retry = FIRST_RETRY;
        loop {
            if self.resync_due.swap(false, Ordering::AcqRel)
                || !self.loaded.load(Ordering::Acquire)
                || self.is_degraded()
            {
                if let Err(error) = self.resync().await {
                    tracing::warn!(%error, retry_in = ?retry, "catalog resync failed; serving the last snapshot");
                    self.set_degraded(true);
                    // Back off, unless a subscription resumes meanwhile
                    // (Redis is back, or a failover was followed): then at once.
                    let resumed = tokio::select! {
                        () = tokio::time::sleep(retry) => false,
                        Some(Message::Resumed) = invalidations.recv() => true,
                        Ok(StoreChange::Resync) = store_changes.recv() => true,
                    };
                    retry = if resumed { FIRST_RETRY } else { (retry * 2).min(LAST_RETRY) };
                    continue;
                }
                retry = FIRST_RETRY;
                self.set_degraded(false);
            }
            tokio::select! {
                change = store_changes.recv() => match change {
                    Ok(StoreChange::Resync) => self.resync_due.store(true, Ordering::Release),
                    Ok(change) => {
                        let name = change.name().unwrap_or_default().to_string();
                        let span = tracing::info_span!("catalog_ingest", jukebox = %name);
                        if let Err(error) = self.ingest_change(change).instrument(span).await {
                            tracing::warn!(%name, %error, "cannot ingest a status change; will resync");
                        }
                    }
                    // Missed notifications: a full resync repairs whatever differs.
                    Err(broadcast::error::RecvError::Lagged(_)) => self.resync_due.store(true, Ordering::Release),
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                Some(message) = invalidations.recv() => match message {
                    Message::Payload(name) => self.reload(&name).await,
                    // Resubscribed (an outage, a failover): what other
                    // replicas wrote meanwhile is read again, once.
                    Message::Resumed => self.resync_due.store(true, Ordering::Release),
                },
                _ = tokio::time::sleep(resync_every) => self.resync_due.store(true, Ordering::Release),
            }
        }
    }

    /// Another replica wrote `jukebox`: read it back into the snapshot.
    async fn reload(&self, jukebox: &str) {
        match self.cache.get(jukebox).await {
            Ok(entry) => self.apply(jukebox, entry),
            Err(error) => tracing::warn!(%jukebox, %error, "cannot reload a cache entry"),
        }
    }
}
