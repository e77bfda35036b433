//! What starts a scan besides the `Scan` RPC, replacing upstream's operator
//! bookkeeping of scan Jobs and CronJobs (the source of upstream #17 and #9):
//!
//! - the `vynil.solidite.fr/force-scan` annotation: `true` or empty asks for
//!   a full scan, any other value for a partial one (validated: an invalid
//!   filter becomes an `Updated=False` condition and the annotation is
//!   removed). A valid request's annotation is removed **after** the scan's
//!   outcome is recorded, and only if it still has the value served, so a
//!   scanner dying mid-scan leaves it for the next one, and a newer request
//!   is never lost;
//! - `spec.schedule`: one timer per JukeBox (see `schedule`), restarted when
//!   the expression changes; an invalid one is reported in `Ready=False`.
//!
//! Every replica follows the store's change notifications (plus a periodic
//! full pass); requests go through the durable queue, so replicas that see
//! the same annotation join one scan.

use std::{collections::HashMap, sync::Arc, time::Duration};

use tokio::sync::broadcast::error::RecvError;
use vynil_crds::annotations::FORCE_SCAN;
use vynil_rules::{ScanFilter, ScanScope};
use vynil_runtime::Shutdown;
use vynil_store::{JukeboxRecord, StoreChange};

use crate::{Scanner, engine, schedule};

/// A `force-scan` value, read by the rules (`None`: a full scan), or the
/// condition message explaining why it was refused.
pub fn read_force_scan(value: &str) -> Result<Option<ScanFilter>, String> {
    ScanFilter::from_request(value).map_err(|e| {
        vynil_crds::coded_message(
            "E_INVALID_SCAN_FILTER",
            &format!("force-scan {:?} is not `true`, `<category>` or `<category>/<name>`: {e}", value.trim()),
        )
    })
}

/// Per-JukeBox trigger state of this replica.
#[derive(Debug)]
pub struct Triggers {
    scanner: Arc<Scanner>,
    jitter: Duration,
    /// The expression each timer runs, and what stops it (no timer for an
    /// invalid one).
    schedules: HashMap<String, (String, Option<Shutdown>)>,
    /// Stops every timer with the service.
    shutdown: Shutdown,
    /// The force-scan value already requested, per JukeBox.
    served: HashMap<String, String>,
    /// JukeBoxes taken over from upstream's operator by this replica.
    taken_over: std::collections::HashSet<String>,
    /// The signature policy last seen, per JukeBox.
    policies: HashMap<String, Option<vynil_crds::VerifyPolicy>>,
}

impl Drop for Triggers {
    fn drop(&mut self) {
        for (_, timer) in self.schedules.values() {
            if let Some(timer) = timer {
                timer.trigger();
            }
        }
    }
}

impl Triggers {
    pub fn new(scanner: Arc<Scanner>, jitter: Duration, shutdown: Shutdown) -> Self {
        Self {
            scanner,
            jitter,
            schedules: HashMap::new(),
            served: HashMap::new(),
            taken_over: Default::default(),
            policies: HashMap::new(),
            shutdown,
        }
    }

    /// Follows every JukeBox until the service's shutdown.
    pub async fn run(mut self, resync: Duration) {
        let shutdown = self.shutdown.signaled();
        tokio::pin!(shutdown);
        let mut changes = self.scanner.store.subscribe();
        self.observe_all().await;
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                change = changes.recv() => match change {
                    Ok(StoreChange::Applied(record)) => self.observe_record(*record).await,
                    Ok(StoreChange::Named(name)) => self.observe(&name).await,
                    Ok(StoreChange::Deleted(name)) => self.forget(&name),
                    Ok(StoreChange::Resync) | Err(RecvError::Lagged(_)) => self.observe_all().await,
                    Err(RecvError::Closed) => return,
                },
                _ = tokio::time::sleep(resync) => self.observe_all().await,
            }
        }
    }

    pub async fn observe_all(&mut self) {
        match self.scanner.store.list().await {
            Ok(records) => {
                let names: Vec<String> = records.iter().map(|r| r.name.clone()).collect();
                for record in records {
                    self.observe_record(record).await;
                }
                let gone: Vec<String> =
                    self.schedules.keys().filter(|n| !names.contains(n)).cloned().collect();
                for name in gone {
                    self.forget(&name);
                }
            }
            Err(error) => tracing::warn!(%error, "cannot list JukeBoxes; triggers retry at the next change"),
        }
    }

    async fn observe(&mut self, name: &str) {
        match self.scanner.store.get(name).await {
            Ok(Some(record)) => self.observe_record(record).await,
            Ok(None) => self.forget(name),
            Err(error) => tracing::warn!(jukebox = %name, %error, "cannot read a changed JukeBox"),
        }
    }

    fn forget(&mut self, name: &str) {
        if let Some((_, Some(timer))) = self.schedules.remove(name) {
            timer.trigger();
        }
        self.served.remove(name);
        self.taken_over.remove(name);
        self.policies.remove(name);
    }

    async fn observe_record(&mut self, record: JukeboxRecord) {
        self.take_over(&record).await;
        self.follow_schedule(&record).await;
        self.follow_force_scan(&record).await;
        self.follow_verify(&record).await;
    }

    /// A changed signature policy (mode, keys, keys' Secret) asks for a full
    /// scan: the verdicts in the status are the old keys'. The evidence is
    /// cached, so it costs no signature read.
    async fn follow_verify(&mut self, record: &JukeboxRecord) {
        let policy = record.spec.verify.clone();
        let Some(previous) = self.policies.insert(record.name.clone(), policy.clone()) else { return };
        if previous != policy
            && let Err(error) = self.scanner.request(&record.name, ScanScope::Full).await
        {
            tracing::warn!(jukebox = %record.name, %error, "cannot ask for the scan a new signature policy needs");
        }
    }

    /// Once per JukeBox (and again when it is deleted with upstream's
    /// finalizer on it): remove what upstream's operator left (`vynil_store::takeover`).
    async fn take_over(&mut self, record: &JukeboxRecord) {
        if self.taken_over.contains(&record.name) && !record.upstream_finalizer_pending {
            return;
        }
        match self.scanner.store.retire_upstream(&record.name).await {
            Ok(_) => {
                self.taken_over.insert(record.name.clone());
            }
            Err(error) => {
                tracing::warn!(jukebox = %record.name, %error, "cannot retire upstream's scan objects; retrying at the next pass")
            }
        }
    }

    async fn follow_schedule(&mut self, record: &JukeboxRecord) {
        let (name, expression) = (&record.name, &record.spec.schedule);
        if self.schedules.get(name).is_some_and(|(current, _)| current == expression) {
            return;
        }
        if let Some((_, Some(timer))) = self.schedules.remove(name) {
            timer.trigger();
        }
        match schedule::parse(expression) {
            Ok(cron) => {
                let timer = self.shutdown.child();
                let run = run_schedule(self.scanner.clone(), name.clone(), cron, self.jitter, timer.clone());
                tokio::spawn(run);
                self.schedules.insert(name.clone(), (expression.clone(), Some(timer)));
            }
            Err(problem) => {
                self.schedules.insert(name.clone(), (expression.clone(), None));
                let written = self
                    .scanner
                    .amend_status(name, |record, now| {
                        let status = record.status.clone().unwrap_or_default();
                        Some(engine::with_schedule_problem(status, &problem, record.generation, now))
                    })
                    .await;
                if let Err(error) = written {
                    tracing::warn!(jukebox = %name, %error, "cannot report the invalid schedule");
                }
            }
        }
    }

    async fn follow_force_scan(&mut self, record: &JukeboxRecord) {
        let name = &record.name;
        let Some(value) = record.annotations.get(FORCE_SCAN) else {
            self.served.remove(name);
            return;
        };
        if self.served.get(name) == Some(value) {
            return;
        }
        self.served.insert(name.clone(), value.clone());
        let filter = match read_force_scan(value) {
            Ok(filter) => filter,
            Err(why) => {
                let written = self
                    .scanner
                    .amend_status(name, |record, now| {
                        let status = record.status.clone().unwrap_or_default();
                        Some(engine::failed_status(status, &why, record.generation, now))
                    })
                    .await;
                match written {
                    Ok(_) => self.remove_annotation(name, value).await,
                    Err(error) => {
                        tracing::warn!(jukebox = %name, %error, "cannot report the invalid force-scan; retrying");
                        self.served.remove(name);
                    }
                }
                return;
            }
        };
        match self.scanner.request(name, ScanScope::from_filter(filter.clone())).await {
            Ok((id, joined)) => {
                let filter = filter.map(|f| f.to_string()).unwrap_or_default();
                tracing::info!(jukebox = %name, %id, joined, %filter, "force-scan requested");
                let (scanner, name, value) = (self.scanner.clone(), name.clone(), value.clone());
                tokio::spawn(async move {
                    scanner.wait_for_outcome(&id).await;
                    Triggers::remove_annotation_with(&scanner, &name, &value).await;
                });
            }
            Err(error) => {
                tracing::warn!(jukebox = %name, %error, "cannot request the forced scan; retrying");
                self.served.remove(name);
            }
        }
    }

    async fn remove_annotation(&self, name: &str, value: &str) {
        Self::remove_annotation_with(&self.scanner, name, value).await;
    }

    async fn remove_annotation_with(scanner: &Scanner, name: &str, value: &str) {
        match scanner.store.remove_annotation(name, FORCE_SCAN, value).await {
            Ok(removed) => tracing::debug!(jukebox = %name, removed, "force-scan served"),
            Err(error) => {
                tracing::warn!(jukebox = %name, %error, "cannot remove force-scan; it stays for a retry")
            }
        }
    }
}

/// Requests a full scan of `jukebox` at each tick this replica claims, until
/// `stop`. Each replica times every schedule; at a tick, the replica that
/// claims it (see `RequestQueue::claim_tick`) requests a full scan, so a tick
/// scans once however many replicas run. An optional jitter spreads the scans
/// of JukeBoxes sharing a schedule (`0 * * * *`) over a few seconds.
async fn run_schedule(
    scanner: Arc<Scanner>,
    jukebox: String,
    cron: croner::Cron,
    jitter: Duration,
    stop: Shutdown,
) {
    vynil_runtime::cron::every(&cron, jitter, &stop, |at| {
        let (scanner, jukebox) = (scanner.clone(), jukebox.clone());
        async move {
            // Claims outlive any clock skew between replicas.
            match scanner.queue.claim_tick(&jukebox, at, Duration::from_secs(3600)).await {
                Ok(true) => match scanner.request(&jukebox, vynil_rules::ScanScope::Full).await {
                    Ok((id, joined)) => tracing::info!(%jukebox, %id, joined, "scheduled scan requested"),
                    Err(error) => tracing::warn!(%jukebox, %error, "cannot request the scheduled scan"),
                },
                Ok(false) => tracing::debug!(%jukebox, "tick already claimed by another replica"),
                Err(error) => tracing::warn!(%jukebox, %error, "cannot claim the scheduled tick; skipped"),
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invalid_force_scan_is_a_coded_condition_message() {
        for value in ["apps/x/y", "/x", "apps/", "a b"] {
            let why = read_force_scan(value).unwrap_err();
            assert!(why.starts_with("[E_INVALID_SCAN_FILTER] force-scan"), "{why}");
        }
    }
}
