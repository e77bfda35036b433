//! The scanner's work loop: claim a JukeBox's requests under its lease, run
//! them, write the status with compare-and-set (re-merging on a lost race),
//! and keep the scan records that `GetScan`/`WatchScan` read.

use std::{sync::Arc, time::Duration};

use tokio::sync::{Notify, mpsc};
use vynil_crds::{JukeBoxStatus, coded_message};
use vynil_index::{ConditionalCache, IndexReader, Location};
use vynil_registry::{CredentialStore, RegistryClient};
use vynil_rules::{ScanScope, scan::Repository};
use vynil_store::{
    JukeboxEvent, JukeboxRecord, JukeboxStore, ScannerStore,
    lease::{Fence, Lease, new_token},
};

use crate::{
    ScannerError,
    engine::{self, EngineSettings, Progress, ScanOutput},
    metrics::{Cause, Jukebox, Outcome, ScannerMetrics, cause},
    requests::{RecordState, RequestQueue, ScanItem, ScanRecord},
    schedule,
    signatures::policy_of,
};

const WRITE_ATTEMPTS: usize = 8;

/// The scanner: shared by the gRPC service and the work loop.
#[derive(Debug)]
pub struct Scanner {
    pub store: Arc<dyn ScannerStore>,
    pub queue: Arc<dyn RequestQueue>,
    pub client: RegistryClient,
    /// The last bytes and `ETag` of every index file read, for conditional reads.
    pub index_cache: ConditionalCache,
    pub settings: EngineSettings,
    pub holder: String,
    pub lease: Duration,
    pub poll: Duration,
    /// A push event's scan waits until no push came for this long...
    pub settle: Duration,
    /// ...but no longer than this after the first push of the burst.
    pub settle_limit: Duration,
    pub wake: Notify,
    pub metrics: ScannerMetrics,
    /// What `GET /metrics` serves (Prometheus' registry, not an OCI one).
    pub exported_metrics: Arc<vynil_runtime::metrics::Registry>,
    /// Where `ExportIndex` may write (`--export-destination`).
    pub exports: crate::export::Destinations,
}

impl Scanner {
    /// Records a scan request (validated); returns its id and whether it
    /// joined an existing request.
    pub async fn request(&self, jukebox: &str, scope: ScanScope) -> Result<(String, bool), ScannerError> {
        if self.store.get(jukebox).await?.is_none() {
            return Err(ScannerError::NotFound(no_jukebox(&*self.store, jukebox).await));
        }
        // Touched before the request exists: a worker woken by it sees the burst going on.
        if matches!(scope, ScanScope::Repository(_)) {
            self.queue.touch(jukebox, jiff::Timestamp::now().as_millisecond()).await?;
        }
        let (id, joined) = self.queue.submit(jukebox, &scope).await?;
        if !joined {
            let record = ScanRecord {
                id: id.clone(),
                state: RecordState::Queued,
                trace: vynil_runtime::traceparent().unwrap_or_default(),
                requested_at_ms: jiff::Timestamp::now().as_millisecond(),
                ..ScanRecord::of(jukebox, &scope)
            };
            self.queue.put_record(&record, None).await?;
            self.queue.announce(jukebox).await?;
        }
        self.wake.notify_one();
        Ok((id, joined))
    }

    /// A registry event for `repository`: a repository-scoped scan for each
    /// JukeBox whose source contains it, as `(jukebox, scan id, joined)`.
    /// A JukeBox whose source cannot be read is skipped (its own scans say
    /// why).
    pub async fn notify(&self, repository: &Repository) -> Result<Vec<(String, String, bool)>, ScannerError> {
        let reference = vynil_registry::RepositoryRef::new(&repository.0, &repository.1)?;
        let mut scans = Vec::new();
        for record in self.store.list().await? {
            let Ok(source) = vynil_store::source_of(&record.spec, self.settings.scripts) else { continue };
            if !source.contains(&reference) {
                continue;
            }
            let (id, joined) = self.request(&record.name, ScanScope::Repository(repository.clone())).await?;
            scans.push((record.name, id, joined));
        }
        Ok(scans)
    }

    /// Runs until `shutdown` resolves: claims and runs whatever is pending.
    pub async fn work(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        // Requests made on other replicas wake this one at once (pub/sub);
        // the poll is what repairs a missed message.
        let mut wakeups = self.queue.wakeups().await;
        loop {
            let mut next = self.poll;
            match self.queue.with_work().await {
                Ok(jukeboxes) => {
                    for jukebox in jukeboxes {
                        match self.run_claimed(&jukebox).await {
                            Ok(Some(settling)) => next = next.min(settling),
                            Ok(None) => {}
                            Err(error) => {
                                tracing::warn!(%jukebox, %error, "scan round failed; retrying later")
                            }
                        }
                    }
                }
                Err(error) => tracing::warn!(%error, "cannot read the scan requests; retrying"),
            }
            tokio::select! {
                _ = &mut shutdown => return,
                _ = self.wake.notified() => {}
                message = woken(&mut wakeups) => if message.is_none() {
                    wakeups = None;
                },
                _ = tokio::time::sleep(next) => {}
            }
        }
    }

    /// How long `jukebox`'s queued requests still wait, when they are all
    /// repository-scoped (push events): until no push came for the settle
    /// time, at most the settle limit after the first. The pushes of one
    /// burst join the queued request and make one scan, not one each; a
    /// steady stream of pushes still scans every settle limit. A full or
    /// partial request never waits.
    async fn settling(&self, jukebox: &str) -> Option<Duration> {
        let items = self.queue.pending(jukebox).await.ok()?;
        if items.is_empty() || items.iter().any(|i| !matches!(i.scope, ScanScope::Repository(_))) {
            return None;
        }
        let touched = self.queue.touched(jukebox).await.ok().flatten();
        let mut first = i64::MAX;
        for item in &items {
            // A record not written yet (its request is being made): the burst's last touch.
            let record = self.queue.record(&item.id).await.ok().flatten();
            first = first.min(record.map_or(touched.unwrap_or(0), |r| r.requested_at_ms));
        }
        let last = touched.unwrap_or(first).max(first);
        let now = jiff::Timestamp::now().as_millisecond();
        still_settling(first, last, now, self.settle, self.settle_limit)
    }

    /// Claims and runs `jukebox`'s requests until none is left, or until
    /// what is left settles: `Some(how long)` then.
    async fn run_claimed(&self, jukebox: &str) -> Result<Option<Duration>, ScannerError> {
        loop {
            if let Some(settling) = self.settling(jukebox).await {
                return Ok(Some(settling));
            }
            let token = new_token(&self.holder);
            let Some(items) = self.queue.claim(jukebox, &token, self.lease).await? else {
                return Ok(None);
            };
            let lease = Lease::adopt(self.queue.leases(), vec![jukebox.to_string()], token, self.lease);
            match self.run_items(jukebox, &items, &lease).await {
                Err(ScannerError::LeaseLost(why)) => {
                    // Another replica runs these items now: write nothing more.
                    tracing::warn!(%jukebox, %why, "scan abandoned");
                    self.metrics.scans.get_or_create(&Outcome { outcome: "abandoned".into() }).inc();
                    return Ok(None);
                }
                result => result?,
            }
            self.queue.complete(jukebox, lease.token()).await?;
        }
    }

    /// A full item satisfies every item claimed with it; partial ones run in turn.
    async fn run_items(&self, jukebox: &str, items: &[ScanItem], lease: &Lease) -> Result<(), ScannerError> {
        if items.iter().any(|i| i.scope == ScanScope::Full) {
            let ids: Vec<String> = items.iter().map(|i| i.id.clone()).collect();
            return self.traced_scan(jukebox, ScanScope::Full, &ids, lease).await;
        }
        for item in items {
            self.traced_scan(jukebox, item.scope.clone(), std::slice::from_ref(&item.id), lease).await?;
        }
        Ok(())
    }

    /// [`Self::run_scan`] in a span continuing the trace of the request that
    /// queued it (the first that carried one), linked to the others'.
    async fn traced_scan(
        &self,
        jukebox: &str,
        scope: ScanScope,
        ids: &[String],
        lease: &Lease,
    ) -> Result<(), ScannerError> {
        use tracing::Instrument;
        let span = tracing::info_span!(
            "scan",
            %jukebox,
            scope = %scope,
            scan_ids = ?ids,
        );
        let mut parented = false;
        for id in ids {
            let trace = self.queue.record(id).await.ok().flatten().map(|r| r.trace).unwrap_or_default();
            match (trace.is_empty(), parented) {
                (true, _) => {}
                (false, false) => {
                    vynil_runtime::follow(&span, &trace);
                    parented = true;
                }
                (false, true) => vynil_runtime::link(&span, &trace),
            }
        }
        self.run_scan(jukebox, scope, ids, lease).instrument(span).await
    }

    /// One scan under `lease`: every write it makes (records, status, Event)
    /// is fenced by it, and a lost lease ends it with `LeaseLost`.
    async fn run_scan(
        &self,
        jukebox: &str,
        scope: ScanScope,
        ids: &[String],
        lease: &Lease,
    ) -> Result<(), ScannerError> {
        let fence = lease.fence(jukebox);
        let started_at = jiff::Timestamp::now().to_string();
        let clock = std::time::Instant::now();
        let base = ScanRecord {
            state: RecordState::Running,
            started_at: started_at.clone(),
            ..ScanRecord::of(jukebox, &scope)
        };
        self.put_records(ids, &base, &fence).await?;
        let Some(record) = self.store.get(jukebox).await? else {
            let mut gone = base.clone();
            gone.state = RecordState::Failed;
            gone.errors = vec![("jukebox".into(), format!("JukeBox {jukebox} no longer exists"))];
            self.put_records(ids, &gone, &fence).await?;
            return Ok(());
        };

        let output = self.scan_source(&record, &scope, ids, &base, &fence).await;

        let write = self.write_status(jukebox, &output, &scope, lease).await;
        if let Err(ScannerError::LeaseLost(why)) = write {
            return Err(ScannerError::LeaseLost(why));
        }
        let errors = output.errors();
        let mut last = base.clone();
        last.state = match (&output, &write, errors.is_empty()) {
            (_, Err(_), _) | (ScanOutput::SourceFailed(_) | ScanOutput::SourceRefused(_), _, _) => {
                RecordState::Failed
            }
            (_, _, true) => RecordState::Succeeded,
            _ => RecordState::PartiallyFailed,
        };
        last.errors = errors;
        if let Err(error) = &write {
            last.errors.push(("status".into(), error.to_string()));
        }
        last.finished_at = jiff::Timestamp::now().to_string();
        self.finish_records(jukebox, ids, &last, &fence).await?;
        self.record_metrics(jukebox, ids, &last, clock.elapsed().as_secs_f64()).await;
        tracing::info!(%jukebox, state = %last.state, seconds = clock.elapsed().as_secs_f64(), "scan finished");
        let event = scan_event(&write, &output, &scope, &last.errors);
        if let Some(event) = event {
            lease.check().await?;
            self.store.record_event(jukebox, &event).await;
        }
        write.map(|_| ())
    }

    /// Scans `record`'s source (an index, or its registries), writing each
    /// progress to the scan's records from a task, so the engine never waits
    /// on Redis.
    async fn scan_source(
        &self,
        record: &JukeboxRecord,
        scope: &ScanScope,
        ids: &[String],
        base: &ScanRecord,
        fence: &Fence,
    ) -> ScanOutput {
        let (progress_tx, mut progress_rx) = mpsc::unbounded_channel::<Progress>();
        let writer = {
            let (queue, ids, base, fence) = (self.queue.clone(), ids.to_vec(), base.clone(), fence.clone());
            tokio::spawn(async move {
                while let Some(progress) = progress_rx.recv().await {
                    for id in &ids {
                        let _ = queue.put_record(&with_progress(&base, id, &progress), Some(&fence)).await;
                    }
                }
            })
        };
        let on_progress = move |p: &Progress| {
            let _ = progress_tx.send(p.clone());
        };
        let output = match crate::index::location_of(&record.spec) {
            Some((location, secret)) => match self.index_reader(location, secret.as_deref()).await {
                Ok(reader) => crate::index::scan(&reader, &self.settings, record, scope, &on_progress).await,
                Err(unreadable) => unreadable,
            },
            None => match (self.client_for(record).await, policy_of(record, &*self.store).await) {
                (Ok(client), Ok(verification)) => {
                    let verification = verification.as_ref();
                    engine::scan(&client, &self.settings, record, scope, verification, &on_progress).await
                }
                (Err(unreadable), _) => unreadable,
                (_, Err(unusable)) => unusable.into(),
            },
        };
        drop(on_progress);
        let _ = writer.await;
        output
    }

    /// Every record of the scan says how it ended (each keeps the progress
    /// it was given).
    async fn finish_records(
        &self,
        jukebox: &str,
        ids: &[String],
        last: &ScanRecord,
        fence: &Fence,
    ) -> Result<(), ScannerError> {
        for id in ids {
            let mut final_record = self.queue.record(id).await.ok().flatten().unwrap_or_else(|| last.clone());
            final_record.id = id.clone();
            final_record.state = last.state;
            final_record.errors = last.errors.clone();
            final_record.finished_at = last.finished_at.clone();
            if !self.queue.put_record(&final_record, Some(fence)).await? {
                return Err(ScannerError::LeaseLost(format!("scan records of {jukebox}")));
            }
        }
        Ok(())
    }

    /// The scan's figures: its outcome and duration, its failures by
    /// cause, the tags seen and manifests read.
    async fn record_metrics(&self, jukebox: &str, ids: &[String], last: &ScanRecord, seconds: f64) {
        self.metrics.scanned(jukebox, last.state.as_str(), seconds);
        let ended = jiff::Timestamp::now().as_second();
        self.metrics.last_scan.get_or_create(&Jukebox { jukebox: jukebox.to_string() }).set(ended);
        for (_, why) in &last.errors {
            self.metrics.repository_failures.get_or_create(&Cause { cause: cause(why).to_string() }).inc();
        }
        let first = ids.first().map(String::as_str).unwrap_or_default();
        if let Ok(Some(progress)) = self.queue.record(first).await {
            self.metrics.tags_seen.inc_by(progress.tags_seen);
            self.metrics.manifests_read.inc_by(progress.manifests_read);
        }
    }

    /// The registry client for this JukeBox: with its pull secret's
    /// credentials when it names one (read afresh: a rotated secret counts at
    /// once); an unusable secret fails this JukeBox's scan, readably, and
    /// one it may not name refuses it.
    async fn client_for(&self, record: &JukeboxRecord) -> Result<RegistryClient, ScanOutput> {
        let Some(secret) = record.spec.pull_secret.as_deref().filter(|s| !s.is_empty()) else {
            return Ok(self.client.clone());
        };
        let document = match self.store.pull_secret(secret).await {
            Ok(Some(document)) => document,
            Ok(None) => return Ok(self.client.clone()),
            Err(e) => return Err(ScanOutput::unreadable(e, Some("E_PULL_SECRET"), "")),
        };
        let failed = |why: String| ScanOutput::SourceFailed(coded_message("E_PULL_SECRET", &why));
        let credentials = CredentialStore::from_dockerconfigjson(&document)
            .map_err(|e| failed(format!("pull secret {secret:?}: {e}")))?;
        self.client.with_credentials(&credentials).map_err(|e| ScanOutput::SourceFailed(e.to_string()))
    }

    /// Exports JukeBox `jukebox`'s OCI source as an index at `destination`
    /// (`crate::export`), with Secret `secret`'s credentials for it.
    pub async fn export(
        &self,
        jukebox: &str,
        destination: &str,
        secret: Option<&str>,
    ) -> Result<crate::export::Exported, ScannerError> {
        let record = self
            .store
            .get(jukebox)
            .await?
            .ok_or_else(|| ScannerError::NotFound(format!("no JukeBox {jukebox:?}")))?;
        let source =
            vynil_store::source_of(&record.spec, self.settings.scripts).map_err(ScannerError::Config)?;
        self.exports.check(destination)?;
        let mut location = Location::parse(destination)?;
        if let Some(secret) = secret {
            location = location.with_secret(secret, &self.store.requested_secret(secret).await?)?;
        }
        let client = self.client_for(&record).await.map_err(|unreadable| {
            ScannerError::Config(unreadable.source_problem().unwrap_or_default().into())
        })?;
        crate::export::export(&client, &self.settings, &source, &location).await
    }

    /// The reader of an index source, with its Secret's credentials when it
    /// names one (`crate::index::credentialed`).
    async fn index_reader(
        &self,
        location: Location,
        secret: Option<&str>,
    ) -> Result<IndexReader, ScanOutput> {
        let location = crate::index::credentialed(&*self.store, location, secret).await?;
        IndexReader::open(location, self.index_cache.clone())
            .map_err(|e| ScanOutput::SourceFailed(e.to_string()))
    }

    /// Writes the status `change` computes from the current record
    /// (compare-and-set, recomputed from a fresh read on a lost race); `None`
    /// or an identical status writes nothing. Returns the status now stored.
    pub async fn amend_status(
        &self,
        jukebox: &str,
        change: impl Fn(&JukeboxRecord, jiff::Timestamp) -> Option<JukeBoxStatus>,
    ) -> Result<Option<JukeBoxStatus>, ScannerError> {
        self.amend_status_under(jukebox, None, change).await
    }

    /// [`Scanner::amend_status`] by a worker holding `lease`: each write is
    /// made only right after the lease was checked.
    async fn amend_status_under(
        &self,
        jukebox: &str,
        lease: Option<&Lease>,
        change: impl Fn(&JukeboxRecord, jiff::Timestamp) -> Option<JukeBoxStatus>,
    ) -> Result<Option<JukeBoxStatus>, ScannerError> {
        for _ in 0..WRITE_ATTEMPTS {
            let Some(record) = self.store.get(jukebox).await? else {
                return Err(ScannerError::NotFound(format!("no JukeBox {jukebox:?} (deleted meanwhile?)")));
            };
            let Some(mut status) = change(&record, jiff::Timestamp::now())
                .filter(|s| !record.status.as_ref().is_some_and(|r| r.same_content(s)))
            else {
                return Ok(record.status);
            };
            // Only a write that changes content carries the trace: an
            // unchanged scan writes nothing, not even a new trace context.
            status.traceparent = vynil_runtime::traceparent();
            if let Some(lease) = lease {
                lease.check().await?;
            }
            match self.store.write_status(jukebox, &record.status_version, &status).await {
                Ok(_) => return Ok(Some(status)),
                Err(vynil_store::StoreError::Conflict(_)) => continue,
                Err(other) => return Err(other.into()),
            }
        }
        Err(ScannerError::Conflict(jukebox.to_string()))
    }

    /// Waits until scan `id` has an outcome (its status write is done by then).
    pub async fn wait_for_outcome(&self, id: &str) {
        loop {
            if let Ok(Some(record)) = self.queue.record(id).await
                && record.is_final()
            {
                return;
            }
            tokio::time::sleep(self.poll.min(Duration::from_millis(200))).await;
        }
    }

    /// The scan's result merged into the status (again into a fresher one
    /// after a lost race). Returns the number of packages the status lists.
    async fn write_status(
        &self,
        jukebox: &str,
        output: &ScanOutput,
        scope: &ScanScope,
        lease: &Lease,
    ) -> Result<usize, ScannerError> {
        let status = self
            .amend_status_under(jukebox, Some(lease), |record, now| {
                let problem = schedule::problem(&record.spec.schedule);
                let previous = record.status.as_ref();
                engine::new_status(previous, output, scope, problem.as_deref(), record.generation, now)
            })
            .await?;
        Ok(status.map_or(0, |s| s.packages.len()))
    }

    async fn put_records(
        &self,
        ids: &[String],
        base: &ScanRecord,
        fence: &Fence,
    ) -> Result<(), ScannerError> {
        for id in ids {
            let mut record = base.clone();
            record.id = id.clone();
            match self.queue.put_record(&record, Some(fence)).await {
                Ok(true) => {}
                Ok(false) => {
                    return Err(ScannerError::LeaseLost(format!("scan records of {}", base.jukebox)));
                }
                Err(error) => tracing::warn!(%error, "cannot record scan progress"),
            }
        }
        Ok(())
    }
}

/// "no JukeBox x", naming the sources the store skipped (one may be it).
async fn no_jukebox(store: &dyn JukeboxStore, jukebox: &str) -> String {
    let skipped = store.skipped().await;
    if skipped.is_empty() {
        return format!("no JukeBox {jukebox:?}");
    }
    let list = skipped.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
    format!("no JukeBox {jukebox:?}; skipped, and perhaps meant: {list}")
}

fn describe(errors: &[(String, String)]) -> String {
    errors.iter().map(|(what, why)| format!("{what}: {why}")).collect::<Vec<_>>().join("; ")
}

fn with_progress(base: &ScanRecord, id: &str, p: &Progress) -> ScanRecord {
    ScanRecord {
        id: id.to_string(),
        repositories_done: p.repositories_done,
        repositories_total: p.repositories_total,
        tags_seen: p.tags_seen,
        manifests_read: p.manifests_read,
        errors: p.errors.clone(),
        ..base.clone()
    }
}

/// How long a burst whose first push came at `first` and last at `last`
/// (Unix ms) still waits at `now`: until `settle` after the last, and never
/// past `limit` after the first; `None` when it is time to scan.
fn still_settling(first: i64, last: i64, now: i64, settle: Duration, limit: Duration) -> Option<Duration> {
    let millis = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    let due = last.saturating_add(millis(settle)).min(first.saturating_add(millis(limit)));
    let remaining = due.saturating_sub(now);
    (remaining > 0).then(|| Duration::from_millis(u64::try_from(remaining).unwrap_or(0)))
}

/// The next announcement, or never when there is none to follow.
async fn woken(
    wakeups: &mut Option<tokio::sync::mpsc::Receiver<vynil_store::pubsub::Message>>,
) -> Option<vynil_store::pubsub::Message> {
    match wakeups {
        Some(wakeups) => wakeups.recv().await,
        None => std::future::pending().await,
    }
}

/// The Event a scan reports, if any: what it found, or why it failed.
fn scan_event(
    write: &Result<usize, ScannerError>,
    output: &ScanOutput,
    scope: &ScanScope,
    errors: &[(String, String)],
) -> Option<JukeboxEvent> {
    match (write, output, scope) {
        (Ok(_), ScanOutput::NothingToScan, _) => None,
        (Ok(_), _, _) if !errors.is_empty() => Some(JukeboxEvent::scan(false, describe(errors))),
        (Ok(_), _, ScanScope::Partial(filter)) => {
            Some(JukeboxEvent::scan(true, format!("Partial scan updated filter: {filter}")))
        }
        (Ok(_), _, ScanScope::Repository(_)) => {
            Some(JukeboxEvent::scan(true, format!("Repository scan updated {scope}")))
        }
        (Ok(count), _, ScanScope::Full) => Some(JukeboxEvent::scan(true, format!("Found {count} packages"))),
        (Err(_), _, _) => Some(JukeboxEvent::scan(false, describe(errors))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_settles_after_its_last_push_but_never_past_its_limit() {
        let (settle, limit) = (Duration::from_millis(200), Duration::from_millis(2000));
        assert_eq!(still_settling(0, 0, 50, settle, limit), Some(Duration::from_millis(150)));
        assert_eq!(still_settling(0, 0, 200, settle, limit), None, "quiet for the settle time");
        assert_eq!(still_settling(0, 1500, 1600, settle, limit), Some(Duration::from_millis(100)));
        assert_eq!(still_settling(0, 1950, 2000, settle, limit), None, "the limit after the first push");
        assert_eq!(still_settling(0, 0, 0, Duration::ZERO, limit), None, "no settle: at once");
    }
}
