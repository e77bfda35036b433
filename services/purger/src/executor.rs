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
    PurgerError,
    store::{
        DeletionState, PlanStore, ReportState, RepositoryPlan, StoredDeletion, StoredOutcome, StoredPlan,
        StoredReport,
    },
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
