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

use tokio::sync::broadcast;
use vynil_store::JukeboxStore;

use crate::{
    CatalogError,
    cache::{CHANGES, Entry, RedisCache},
};

/// A change of one entry: its new hash, or `None` when removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub jukebox: String,
    pub hash: Option<String>,
}

#[derive(Debug)]
pub struct Catalog {
    snapshot: RwLock<HashMap<String, Entry>>,
    loaded: AtomicBool,
    resync_due: AtomicBool,
    degraded: AtomicBool,
    redis: Option<(redis::Client, RedisCache)>,
    store: Arc<dyn JukeboxStore>,
    changes: broadcast::Sender<Change>,
    pub framework: semver::Version,
    pub metrics: crate::metrics::CatalogMetrics,
}

impl Catalog {
    pub async fn new(
        store: Arc<dyn JukeboxStore>,
        redis_url: Option<&str>,
        framework: semver::Version,
    ) -> Result<Self, CatalogError> {
        let redis = match redis_url {
            Some(url) => {
                let client =
                    redis::Client::open(url).map_err(|e| CatalogError::Unavailable(format!("Redis: {e}")))?;
                let cache = RedisCache::connect(&client).await?;
                Some((client, cache))
            }
            None => None,
        };
        let (changes, _) = broadcast::channel(1024);
        Ok(Self {
            snapshot: RwLock::default(),
            loaded: AtomicBool::new(false),
            resync_due: AtomicBool::new(false),
            degraded: AtomicBool::new(false),
            redis,
            store,
            changes,
            framework,
            metrics: crate::metrics::CatalogMetrics::default(),
        })
    }

    /// An entry, or `Unavailable` when nothing was ever loaded (never "not found").
    pub fn entry(&self, jukebox: &str) -> Result<Option<Entry>, CatalogError> {
        if !self.loaded.load(Ordering::Acquire) {
            return Err(CatalogError::Unavailable("the catalog has not loaded yet; retry".into()));
        }
        Ok(self.snapshot.read().unwrap_or_else(|p| p.into_inner()).get(jukebox).cloned())
    }

    pub fn entries(&self) -> Result<Vec<Entry>, CatalogError> {
        if !self.loaded.load(Ordering::Acquire) {
            return Err(CatalogError::Unavailable("the catalog has not loaded yet; retry".into()));
        }
        let mut entries: Vec<Entry> =
            self.snapshot.read().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        entries.sort_by(|a, b| a.jukebox.cmp(&b.jukebox));
        Ok(entries)
    }

    pub fn is_degraded(&self) -> bool {
        self.degraded.load(Ordering::Acquire)
    }

    fn set_degraded(&self, degraded: bool) {
        self.degraded.store(degraded, Ordering::Release);
        self.metrics.degraded.set(i64::from(degraded));
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    fn apply(&self, jukebox: &str, entry: Option<Entry>) {
        let mut snapshot = self.snapshot.write().unwrap_or_else(|p| p.into_inner());
        let changed = snapshot.get(jukebox).map(|e| &e.hash) != entry.as_ref().map(|e| &e.hash);
        let hash = entry.as_ref().map(|e| e.hash.clone());
        match entry {
            Some(entry) => snapshot.insert(jukebox.to_string(), entry),
            None => snapshot.remove(jukebox),
        };
        drop(snapshot);
        if changed {
            let _ = self.changes.send(Change { jukebox: jukebox.to_string(), hash });
        }
    }

    /// Brings one JukeBox's entry in line with its status. A failure (store
    /// or Redis unreachable) marks the catalog degraded: answers go on from
    /// the snapshot, and the follower resyncs until it succeeds.
    pub async fn ingest(&self, jukebox: &str) -> Result<(), CatalogError> {
        let result = self.try_ingest(jukebox).await;
        self.set_degraded(result.is_err());
        result
    }

    async fn try_ingest(&self, jukebox: &str) -> Result<(), CatalogError> {
        let record = self.store.get(jukebox).await.map_err(|e| CatalogError::Unavailable(e.to_string()))?;
        let entry = record.and_then(|r| {
            r.status.map(|status| Entry::from_status(&r.name, r.spec.pull_secret.clone(), &status))
        });
        if let Some((_, cache)) = &self.redis {
            match &entry {
                Some(entry) if cache.upsert_if_changed(entry).await? => self.metrics.upserts.inc(),
                Some(_) => self.metrics.skipped_identical.inc(),
                None if cache.remove(jukebox).await? => self.metrics.removals.inc(),
                None => 0,
            };
        }
        self.apply(jukebox, entry);
        Ok(())
    }

    /// Full resync: every JukeBox of the store, and removal of the others.
    pub async fn resync(&self) -> Result<(), CatalogError> {
        let records = self.store.list().await.map_err(|e| CatalogError::Unavailable(e.to_string()))?;
        let names: Vec<String> = records.iter().map(|r| r.name.clone()).collect();
        for name in &names {
            self.ingest(name).await?;
        }
        let mut stale: Vec<String> =
            self.snapshot.read().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
        if let Some((_, cache)) = &self.redis {
            stale.extend(cache.all().await?.into_keys());
        }
        stale.retain(|n| !names.contains(n));
        stale.sort();
        stale.dedup();
        for name in stale {
            self.ingest(&name).await?;
        }
        self.loaded.store(true, Ordering::Release);
        Ok(())
    }

    /// Follows store changes (and other replicas' cache writes) until the
    /// process ends; resyncs after a failure and every `resync_every` (a
    /// JukeBox file removed announces nothing).
    pub async fn follow(self: Arc<Self>, resync_every: std::time::Duration) {
        let mut store_changes = self.store.subscribe();
        let mut invalidations = self.invalidations().await;
        loop {
            if self.resync_due.swap(false, Ordering::AcqRel)
                || !self.loaded.load(Ordering::Acquire)
                || self.is_degraded()
            {
                if let Err(error) = self.resync().await {
                    tracing::warn!(%error, "catalog resync failed; serving the last snapshot");
                    self.set_degraded(true);
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                    continue;
                }
                self.set_degraded(false);
            }
            tokio::select! {
                name = store_changes.recv() => match name {
                    Ok(name) if name.is_empty() => self.resync_due.store(true, Ordering::Release),
                    Ok(name) => {
                        if let Err(error) = self.ingest(&name).await {
                            tracing::warn!(%name, %error, "cannot ingest a status change; will resync");
                        }
                    }
                    // Missed notifications: a full resync repairs whatever differs.
                    Err(broadcast::error::RecvError::Lagged(_)) => self.resync_due.store(true, Ordering::Release),
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                Some(name) = invalidations.recv() => self.reload(&name).await,
                _ = tokio::time::sleep(resync_every) => self.resync_due.store(true, Ordering::Release),
            }
        }
    }

    /// Another replica wrote `jukebox`: read it back into the snapshot.
    async fn reload(&self, jukebox: &str) {
        if let Some((_, cache)) = &self.redis {
            match cache.get(jukebox).await {
                Ok(entry) => self.apply(jukebox, entry),
                Err(error) => tracing::warn!(%jukebox, %error, "cannot reload a cache entry"),
            }
        }
    }

    async fn invalidations(&self) -> tokio::sync::mpsc::Receiver<String> {
        let (sender, receiver) = tokio::sync::mpsc::channel(1024);
        if let Some((client, _)) = &self.redis {
            let client = client.clone();
            tokio::spawn(async move {
                use futures::StreamExt;
                loop {
                    if let Ok(mut pubsub) = client.get_async_pubsub().await {
                        if pubsub.subscribe(CHANGES).await.is_ok() {
                            let mut messages = pubsub.into_on_message();
                            while let Some(message) = messages.next().await {
                                let payload: String = message.get_payload().unwrap_or_default();
                                let name = payload.split(' ').next().unwrap_or_default().to_string();
                                if sender.send(name).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
            });
        }
        receiver
    }
}
