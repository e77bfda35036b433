//! Executing a plan: refuse unless the caller named the target and the
//! fingerprint (and acknowledged unknown usage), take the repository's lease,
//! re-read the repository and refuse a stale plan, then delete by digest —
//! subjects before their orphaned artifacts, with bounded concurrency — and
//! report only verified outcomes. Each outcome is journaled as it happens,
//! and each DELETE is journaled (`deleting`) right before it is sent, so a
//! crashed execution run again converges into one complete report: what the
//! first run verified is reported as its `deleted` (with its time), what it
//! sent but never heard back about is `deleted` by it once a HEAD shows it
//! gone, and nothing is deleted twice. Every DELETE and journal write is made
//! under the execution's lease, checked right before (see `vynil_store::lease`).

use std::{collections::HashMap, sync::Arc};

use futures::StreamExt;
use tokio::sync::mpsc;
use vynil_registry::{DeletionOutcome, RegistryClient, RepositoryRef};
use vynil_rules::retention::{PlannedDeletion, PlannedTag, RepositoryTag, Usage, changes_since_planning};

use vynil_store::lease::Lease;

use crate::{
    PurgerError, metrics,
    plan_store::{
        self, DeletionState, PlanStore, ReportState, RepositoryPlan, StoredDeletion, StoredOutcome,
        StoredPlan, StoredReport,
    },
    planner,
    purger::{LeasedPlan, Purger},
};

/// What Execute was asked.
#[derive(Debug, Clone)]
pub struct ExecuteRequest {
    pub plan_id: String,
    pub confirm: String,
    pub fingerprint: String,
    pub acknowledge_usage_unknown: bool,
    pub caller: String,
}

/// Checks the confirmation against the plan.
pub fn check_confirmation(plan: &StoredPlan, request: &ExecuteRequest) -> Result<(), PurgerError> {
    if request.confirm != plan.target {
        return Err(PurgerError::Refused(format!(
            "confirm must name the target exactly: {:?} (got {:?})",
            plan.target, request.confirm
        )));
    }
    if request.fingerprint != plan.fingerprint {
        return Err(PurgerError::Refused(format!(
            "the fingerprint does not match plan {} ({}): get the plan again and confirm what it says",
            plan.id, plan.fingerprint
        )));
    }
    if plan.usage_unknown && !request.acknowledge_usage_unknown {
        return Err(PurgerError::Refused(
            "this plan was made without knowing which revisions instances use (lifecycle unreachable): acknowledge_usage_unknown is required".into(),
        ));
    }
    Ok(())
}

/// What changed since planning (the rules' [`changes_since_planning`]).
pub fn staleness(plan: &RepositoryPlan, fresh: &[RepositoryTag], usage: &Usage) -> Vec<String> {
    let planned: Vec<PlannedTag<'_>> =
        plan.entries.iter().map(|e| PlannedTag { tag: &e.tag, digest: &e.digest, keep: e.keep }).collect();
    let deletions: Vec<PlannedDeletion<'_>> =
        plan.deletions.iter().map(|d| PlannedDeletion { digest: &d.digest, tags: &d.tags }).collect();
    changes_since_planning(&plan.name(), &planned, &deletions, fresh, usage)
}

/// One execution of a plan, under its lease: what every deletion needs.
pub struct Execution<'a> {
    pub client: &'a RegistryClient,
    pub store: &'a Arc<dyn PlanStore>,
    pub lease: &'a Lease,
    pub plan_id: &'a str,
    pub concurrency: usize,
    /// What earlier runs of this plan journaled, by digest.
    pub journaled: &'a HashMap<String, StoredOutcome>,
}

impl Execution<'_> {
    /// Deletes what one repository's plan deletes. The caller has checked
    /// confirmation and staleness.
    pub async fn delete_repository(
        &self,
        plan: &RepositoryPlan,
        progress: &mpsc::Sender<StoredOutcome>,
    ) -> Result<Vec<StoredOutcome>, PurgerError> {
        let repo = RepositoryRef::new(&plan.registry, &plan.repository)?;
        let lease_name = plan.lease_name();
        let mut outcomes = Vec::new();
        for artifacts in [false, true] {
            let phase: Vec<StoredDeletion> =
                plan.deletions.iter().filter(|d| d.artifacts_only == artifacts).cloned().collect();
            let (repo, lease_name) = (&repo, lease_name.as_str());
            let mut results = futures::stream::iter(phase)
                .map(|deletion| async move { self.delete_one(repo, lease_name, &deletion).await })
                .buffer_unordered(self.concurrency.max(1));
            while let Some(outcome) = results.next().await {
                let outcome = outcome?;
                self.journal(lease_name, &outcome).await?;
                audit(self.plan_id, &outcome);
                let _ = progress.send(outcome.clone()).await;
                outcomes.push(outcome);
            }
        }
        Ok(outcomes)
    }

    /// Journals `outcome` under the lease on `lease_name`; a lost lease stops.
    async fn journal(&self, lease_name: &str, outcome: &StoredOutcome) -> Result<(), PurgerError> {
        if self.store.journal(self.plan_id, outcome, &self.lease.fence(lease_name)).await? {
            Ok(())
        } else {
            Err(PurgerError::LeaseLost(lease_name.to_string()))
        }
    }

    async fn delete_one(
        &self,
        repo: &RepositoryRef,
        lease_name: &str,
        deletion: &StoredDeletion,
    ) -> Result<StoredOutcome, PurgerError> {
        let earlier = self.journaled.get(&deletion.digest);
        if let Some(done) = earlier.filter(|e| e.state == DeletionState::Deleted) {
            let note = "verified by an earlier run of this plan".to_string();
            return Ok(StoredOutcome { note, ..done.clone() });
        }
        let outcome = match self.client.head_digest(repo, &deletion.digest).await {
            Ok(None) => match earlier.filter(|e| e.state == DeletionState::Deleting) {
                // The earlier run sent this DELETE and died before the answer.
                Some(sent) => {
                    let note = format!("deleted by an earlier run of this plan (DELETE sent at {})", sent.at);
                    return Ok(StoredOutcome { state: DeletionState::Deleted, note, ..sent.clone() });
                }
                // Already gone (someone else): no DELETE.
                None => DeletionOutcome::AlreadyGone,
            },
            Ok(Some(_)) => {
                self.lease.check().await?;
                self.journal(lease_name, &record(repo, deletion, DeletionState::Deleting)).await?;
                self.client.delete_digest(repo, &deletion.digest, &deletion.tags).await
            }
            Err(error) => DeletionOutcome::Failed {
                status: None,
                code: "UNVERIFIABLE".into(),
                message: format!("cannot check the digest before deleting: {error}"),
            },
        };
        Ok(match outcome {
            DeletionOutcome::Deleted { .. } => record(repo, deletion, DeletionState::Deleted),
            DeletionOutcome::AlreadyGone => record(repo, deletion, DeletionState::AlreadyGone),
            DeletionOutcome::Failed { status, code, message } => StoredOutcome {
                http_status: status,
                error_code: code,
                error_message: message,
                ..record(repo, deletion, DeletionState::Failed)
            },
        })
    }
}

/// The outcome `state` of `deletion`, stamped now.
fn record(repo: &RepositoryRef, deletion: &StoredDeletion, state: DeletionState) -> StoredOutcome {
    StoredOutcome {
        registry: repo.registry.clone(),
        repository: repo.repository.clone(),
        digest: deletion.digest.clone(),
        tags: deletion.tags.clone(),
        state,
        http_status: None,
        error_code: String::new(),
        error_message: String::new(),
        at: jiff::Timestamp::now().to_string(),
        note: String::new(),
    }
}

fn audit(plan_id: &str, outcome: &StoredOutcome) {
    tracing::info!(
        target: "audit",
        plan = %plan_id,
        repository = %format!("{}/{}", outcome.registry, outcome.repository),
        digest = %outcome.digest,
        tags = ?outcome.tags,
        state = %outcome.state.as_str(),
        status = ?outcome.http_status,
        code = %outcome.error_code,
        "purge deletion"
    );
}

pub fn report(
    plan: &StoredPlan,
    caller: &str,
    started_at: String,
    outcomes: Vec<StoredOutcome>,
) -> StoredReport {
    StoredReport {
        plan_id: plan.id.clone(),
        target: plan.target.clone(),
        fingerprint: plan.fingerprint.clone(),
        executed_by: caller.to_string(),
        started_at,
        finished_at: jiff::Timestamp::now().to_string(),
        outcomes,
        state: ReportState::Completed,
        later: Vec::new(),
    }
}

impl Purger {
    /// Every check before anything is deleted: confirmation, leases, staleness.
    pub async fn prepare(&self, request: &ExecuteRequest) -> Result<LeasedPlan, PurgerError> {
        let prepared = self.checked(request).await;
        if prepared.is_err() {
            self.metrics.refusals.inc();
        }
        prepared
    }

    async fn checked(&self, request: &ExecuteRequest) -> Result<LeasedPlan, PurgerError> {
        let plan = self.get_plan(&request.plan_id).await?;
        check_confirmation(&plan, request)?;
        let names: Vec<String> = plan.repositories.iter().map(RepositoryPlan::lease_name).collect();
        let Some(lease) = Lease::acquire(self.store.leases(), names, &self.owner, self.lease).await? else {
            return Err(PurgerError::Busy(format!(
                "another execution holds a repository of plan {}; retry when it ends (its lease expires within {}s if it died)",
                plan.id,
                self.lease.as_secs()
            )));
        };
        if let Err(error) = self.still_valid(&plan, request).await {
            lease.release().await;
            return Err(error);
        }
        Ok(LeasedPlan { plan, lease })
    }

    /// Re-reads every repository and what instances use; refuses a stale plan.
    async fn still_valid(&self, plan: &StoredPlan, request: &ExecuteRequest) -> Result<(), PurgerError> {
        let (retention, excluded) = self.inputs()?;
        let mut changes = Vec::new();
        for repository in &plan.repositories {
            let repo = RepositoryRef::new(&repository.registry, &repository.repository)?;
            if vynil_rules::repository::listed(&excluded, &repo.registry, &repo.repository) {
                return Err(PurgerError::Excluded(repo.to_string()));
            }
            let fresh = planner::snapshot(&self.client, &repo, self.max_tags).await?;
            let usage = planner::usage(&self.lifecycle, &repo).await;
            let usage_lost =
                !repository.usage_unknown && matches!(usage, vynil_rules::retention::Usage::Unknown);
            if usage_lost && !request.acknowledge_usage_unknown {
                return Err(PurgerError::Refused(
                    "lifecycle cannot confirm what instances use now: retry, or acknowledge_usage_unknown"
                        .into(),
                ));
            }
            // Every input counts, not only the tags: pins and framework too.
            if retention.fingerprint() != repository.config_fingerprint {
                changes.push(format!(
                    "{}: the retention inputs changed since planning (pinned tags or the framework version --vynil-version)",
                    repository.name()
                ));
            }
            changes.extend(staleness(repository, &fresh, &usage));
        }
        if changes.is_empty() { Ok(()) } else { Err(PurgerError::Stale(changes)) }
    }

    /// Deletes, journals, reports; releases the leases at the end. Every
    /// write is fenced by the lease: a worker that lost it stops.
    pub async fn run(
        &self,
        prepared: LeasedPlan,
        request: ExecuteRequest,
        progress: mpsc::Sender<StoredOutcome>,
    ) -> Result<StoredReport, PurgerError> {
        let LeasedPlan { plan, lease } = prepared;
        let started_at = jiff::Timestamp::now().to_string();
        let fence = lease.fence(lease.names().first().map(String::as_str).unwrap_or_default());
        let mut report = report(&plan, &request.caller, started_at, Vec::new());
        report.state = ReportState::Running;
        // Executed before: the first execution keeps its name and time,
        // this one is recorded beside it.
        if let Some(previous) = self.store.get_report(&plan.id).await? {
            let attempt = plan_store::Attempt { by: report.executed_by, at: report.started_at };
            (report.executed_by, report.started_at) = (previous.executed_by, previous.started_at);
            report.later = previous.later;
            report.later.push(attempt);
        }
        let result = self.run_under(&plan, &lease, &fence, report, &progress).await;
        if matches!(result, Err(PurgerError::LeaseLost(_))) {
            // Another execution holds the repositories: nothing more from here.
            tracing::warn!(plan = %plan.id, "execution abandoned: the lease was lost");
            return result;
        }
        lease.release().await;
        self.record_event(&plan, &request.caller, &result).await;
        result
    }

    /// The audit record of an execution, as an Event on each JukeBox it
    /// concerns (the JukeBox a `jukebox/<name>` plan names, or those listing
    /// the repository): in a cluster it outlives a Redis without persistence.
    async fn record_event(
        &self,
        plan: &StoredPlan,
        caller: &str,
        result: &Result<StoredReport, PurgerError>,
    ) {
        let note = match result {
            Ok(report) => {
                let count = |state| report.count(state);
                format!(
                    "Purge of {} (plan {}, fingerprint {}) executed by {caller}: {} deleted (eligible for registry garbage collection), {} already gone, {} failed",
                    plan.target,
                    plan.id,
                    plan.fingerprint,
                    count(DeletionState::Deleted),
                    count(DeletionState::AlreadyGone),
                    count(DeletionState::Failed)
                )
            }
            Err(error) => format!("Purge of {} (plan {}) by {caller} stopped: {error}", plan.target, plan.id),
        };
        let failures = result.as_ref().map_or(true, |r| r.count(DeletionState::Failed) > 0);
        let event = vynil_store::JukeboxEvent::purge(failures, note);
        for jukebox in self.jukeboxes_of(plan).await {
            self.jukeboxes.record_event(&jukebox, &event).await;
        }
    }

    async fn jukeboxes_of(&self, plan: &StoredPlan) -> Vec<String> {
        if let Some(name) = plan.target.strip_prefix("jukebox/") {
            return vec![name.to_string()];
        }
        let records = match self.jukeboxes.list().await {
            Ok(records) => records,
            Err(error) => {
                tracing::warn!(plan = %plan.id, %error, "cannot list JukeBoxes: the purge Event is not recorded");
                return Vec::new();
            }
        };
        records
            .into_iter()
            .filter(|record| {
                let packages = record.status.as_ref().map(|s| s.packages.as_slice()).unwrap_or_default();
                plan.repositories
                    .iter()
                    .any(|r| packages.iter().any(|p| p.registry == r.registry && p.image == r.repository))
            })
            .map(|record| record.name)
            .collect()
    }

    async fn run_under(
        &self,
        plan: &StoredPlan,
        lease: &Lease,
        fence: &vynil_store::lease::Fence,
        running: StoredReport,
        progress: &mpsc::Sender<StoredOutcome>,
    ) -> Result<StoredReport, PurgerError> {
        let lost = || PurgerError::LeaseLost(plan.target.clone());
        if !self.store.put_report(&running, fence).await? {
            return Err(lost());
        }
        let journaled: HashMap<String, StoredOutcome> =
            self.store.journaled(&plan.id).await?.into_iter().map(|o| (o.digest.clone(), o)).collect();
        let execution = Execution {
            client: &self.client,
            store: &self.store,
            lease,
            plan_id: &plan.id,
            concurrency: self.concurrency,
            journaled: &journaled,
        };
        let mut outcomes = Vec::new();
        for repository in &plan.repositories {
            outcomes.extend(execution.delete_repository(repository, progress).await?);
            // An OCI image layout's unreferenced blobs (what a crash between
            // an index rewrite and its blob removal left) go now; a registry
            // collects its own garbage.
            if let Ok(repo) = RepositoryRef::new(&repository.registry, &repository.repository)
                && let Err(error) = self.client.collect_garbage(&repo).await
            {
                tracing::warn!(%error, repository = %repo, "cannot remove the layout's unreferenced blobs");
            }
        }
        let report = StoredReport {
            outcomes,
            state: ReportState::Completed,
            finished_at: jiff::Timestamp::now().to_string(),
            ..running
        };
        if !self.store.put_report(&report, fence).await? {
            return Err(lost());
        }
        for outcome in &report.outcomes {
            let state = outcome.state.as_str().to_string();
            self.metrics.deletions.get_or_create(&metrics::State { state }).inc();
        }
        let count = |state| report.count(state);
        tracing::info!(
            target: "audit",
            plan = %plan.id,
            target_name = %plan.target,
            fingerprint = %plan.fingerprint,
            executed_by = %report.executed_by,
            deleted = count(DeletionState::Deleted),
            failed = count(DeletionState::Failed),
            "purge executed (deleted manifests are eligible for registry garbage collection)"
        );
        Ok(report)
    }

    /// Plans and executes, as a scheduled purge does.
    pub async fn execute_as(&self, plan: &StoredPlan, caller: &str) -> Result<StoredReport, PurgerError> {
        let request = ExecuteRequest {
            plan_id: plan.id.clone(),
            confirm: plan.target.clone(),
            fingerprint: plan.fingerprint.clone(),
            acknowledge_usage_unknown: false,
            caller: caller.to_string(),
        };
        let prepared = self.prepare(&request).await?;
        let (progress, mut sink) = mpsc::channel(64);
        let drain = tokio::spawn(async move { while sink.recv().await.is_some() {} });
        let report = self.run(prepared, request, progress).await;
        let _ = drain.await;
        report
    }
}
