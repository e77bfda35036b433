//! The request queue in memory: one process, lost with it (local mode without Redis, tests).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use vynil_rules::ScanScope;
use vynil_store::{
    epoch::Epoch,
    lease::{Fence, LeaseStore, MemoryLeases},
};

use super::*;
use crate::ScannerError;

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
