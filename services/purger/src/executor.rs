//! Executing a plan: refuse unless the caller named the target and the
//! fingerprint (and acknowledged unknown usage), take the repository's lease,
//! re-read the repository and refuse a stale plan, then delete by digest —
//! subjects before their orphaned artifacts, with bounded concurrency — and
//! report only verified outcomes. Each outcome is journaled as it happens, so
//! a crashed execution run again converges: what is already gone is seen by
//! a HEAD and never deleted twice.

use std::{collections::HashMap, sync::Arc, time::Duration};

use futures::StreamExt;
use tokio::sync::mpsc;
use vynil_registry::{DeletionOutcome, RegistryClient, RepositoryRef};
use vynil_rules::retention::{RepositoryTag, Usage};

use crate::{
    PurgerError,
    store::{PlanStore, RepositoryPlan, StoredDeletion, StoredOutcome, StoredPlan, StoredReport},
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

/// What changed since planning, from a fresh read of the repository and of
/// usage. Tags the plan deletes may be gone (deleted by an earlier run).
pub fn staleness(plan: &RepositoryPlan, fresh: &[RepositoryTag], usage: &Usage) -> Vec<String> {
    let now: HashMap<&str, &str> = fresh.iter().map(|t| (t.name.as_str(), t.digest.as_str())).collect();
    let planned: HashMap<&str, &str> =
        plan.entries.iter().map(|e| (e.tag.as_str(), e.digest.as_str())).collect();
    let mut changes = Vec::new();
    for entry in &plan.entries {
        match now.get(entry.tag.as_str()) {
            Some(digest) if *digest != entry.digest => {
                changes.push(format!("{} now points to {digest} (planned {})", entry.tag, entry.digest))
            }
            None if entry.keep => {
                changes.push(format!("{}: kept tag {} disappeared", plan.name(), entry.tag))
            }
            _ => {}
        }
    }
    for tag in fresh {
        if !planned.contains_key(tag.name.as_str()) {
            changes.push(format!("{}: {} was pushed since planning", plan.name(), tag.name));
        }
    }
    if let Usage::Known(used) = usage {
        for deletion in &plan.deletions {
            for revision in used {
                if revision.digest.as_deref() == Some(deletion.digest.as_str())
                    || deletion.tags.contains(&revision.tag)
                {
                    changes.push(format!("{} is now used by {}", revision.tag, revision.instance));
                }
            }
        }
    }
    changes
}

/// Deletes what one repository's plan deletes. The caller holds the lease
/// and has checked confirmation and staleness.
pub async fn delete_all(
    client: &RegistryClient,
    store: &Arc<dyn PlanStore>,
    plan_id: &str,
    plan: &RepositoryPlan,
    concurrency: usize,
    progress: &mpsc::Sender<StoredOutcome>,
) -> Result<Vec<StoredOutcome>, PurgerError> {
    let repo = RepositoryRef::new(&plan.registry, &plan.repository)?;
    let mut outcomes = Vec::new();
    for artifacts in [false, true] {
        let phase: Vec<StoredDeletion> =
            plan.deletions.iter().filter(|d| d.artifacts_only == artifacts).cloned().collect();
        let mut results = futures::stream::iter(phase)
            .map(|deletion| {
                let (client, repo) = (client.clone(), repo.clone());
                async move { delete_one(&client, &repo, &deletion).await }
            })
            .buffer_unordered(concurrency.max(1));
        while let Some(outcome) = results.next().await {
            store.journal(plan_id, &outcome).await?;
            audit(plan_id, &outcome);
            let _ = progress.send(outcome.clone()).await;
            outcomes.push(outcome);
        }
    }
    Ok(outcomes)
}

async fn delete_one(
    client: &RegistryClient,
    repo: &RepositoryRef,
    deletion: &StoredDeletion,
) -> StoredOutcome {
    let outcome = match client.head_digest(repo, &deletion.digest).await {
        // Already gone (an earlier run, or someone else): no DELETE.
        Ok(None) => DeletionOutcome::AlreadyGone,
        Ok(Some(_)) => client.delete_digest(repo, &deletion.digest, &deletion.tags).await,
        Err(error) => DeletionOutcome::Failed {
            status: None,
            code: "UNVERIFIABLE".into(),
            message: format!("cannot check the digest before deleting: {error}"),
        },
    };
    let (state, http_status, error_code, error_message) = match outcome {
        DeletionOutcome::Deleted { .. } => ("deleted", None, String::new(), String::new()),
        DeletionOutcome::AlreadyGone => ("already_gone", None, String::new(), String::new()),
        DeletionOutcome::Failed { status, code, message } => ("failed", status, code, message),
    };
    StoredOutcome {
        registry: repo.registry.clone(),
        repository: repo.repository.clone(),
        digest: deletion.digest.clone(),
        tags: deletion.tags.clone(),
        state: state.into(),
        http_status,
        error_code,
        error_message,
    }
}

fn audit(plan_id: &str, outcome: &StoredOutcome) {
    tracing::info!(
        target: "audit",
        plan = %plan_id,
        repository = %format!("{}/{}", outcome.registry, outcome.repository),
        digest = %outcome.digest,
        tags = ?outcome.tags,
        state = %outcome.state,
        status = ?outcome.http_status,
        code = %outcome.error_code,
        "purge deletion"
    );
}

/// Keeps renewing the leases of `targets` until dropped.
pub struct LeaseKeeper {
    task: tokio::task::JoinHandle<()>,
}

impl LeaseKeeper {
    pub fn start(store: Arc<dyn PlanStore>, targets: Vec<String>, owner: String, ttl: Duration) -> Self {
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(ttl / 3).await;
                for target in &targets {
                    if !matches!(store.acquire(target, &owner, ttl).await, Ok(true)) {
                        tracing::warn!(%target, "lost the execution lease");
                    }
                }
            }
        });
        Self { task }
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        self.task.abort();
    }
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
    }
}
