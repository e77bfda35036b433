//! The gRPC face of the purger: conversions to the wire types, and the one
//! place where errors become `Status` codes.

use std::{pin::Pin, sync::Arc};

use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use vynil_proto::purger::v1::{
    DeletionOutcome, DeletionState, ExecuteProgress, ExecuteRequest, GetPlanRequest, GetReportRequest,
    PlanEntry, PlanRequest, PurgePlan, PurgeReport, ReportState, execute_progress::Event,
    plan_request::Target, purger_server::Purger as PurgerApi,
};
use vynil_registry::RepositoryRef;
use vynil_runtime::{Classify, Failure, ToStatus};

use crate::{
    Purger, PurgerError, executor,
    plan_store::{self, StoredOutcome, StoredPlan, StoredReport},
};

impl Classify for PurgerError {
    fn failure(&self) -> Failure {
        match self {
            PurgerError::NotFound(_) => Failure::Missing,
            PurgerError::InvalidArgument(_) => Failure::BadInput,
            PurgerError::Refused(_)
            | PurgerError::Stale(_)
            | PurgerError::Excluded(_)
            | PurgerError::Config(_) => Failure::Refused,
            PurgerError::Busy(_) | PurgerError::Conflict(_) | PurgerError::LeaseLost(_) => {
                Failure::Concurrent
            }
            PurgerError::Store(_) => Failure::Transient,
            PurgerError::Lost(_) => Failure::Lost,
            PurgerError::Registry(e) => e.failure(),
            PurgerError::Rules(e) => e.failure(),
            PurgerError::Serve(e) => e.failure(),
        }
    }
}

impl From<PurgerError> for Status {
    fn from(error: PurgerError) -> Self {
        error.to_status()
    }
}

pub fn plan_to_proto(plan: &StoredPlan) -> PurgePlan {
    let entries = || plan.repositories.iter().flat_map(|r| r.entries.iter().map(move |e| (r, e)));
    PurgePlan {
        plan_id: plan.id.clone(),
        target: plan.target.clone(),
        fingerprint: plan.fingerprint.clone(),
        usage_unknown: plan.usage_unknown,
        keep_count: entries().filter(|(_, e)| e.keep).count() as u32,
        delete_count: entries().filter(|(_, e)| !e.keep).count() as u32,
        entries: entries()
            .map(|(r, e)| PlanEntry {
                registry: r.registry.clone(),
                repository: r.repository.clone(),
                tag: e.tag.clone(),
                digest: e.digest.clone(),
                keep: e.keep,
                reasons: e.reasons.clone(),
            })
            .collect(),
        created_at: plan.created_at.clone(),
        expires_at: plan.expires_at.clone(),
    }
}

fn outcome_to_proto(o: &StoredOutcome) -> DeletionOutcome {
    let state = match o.state {
        plan_store::DeletionState::Deleted => DeletionState::Deleted,
        plan_store::DeletionState::AlreadyGone => DeletionState::AlreadyGone,
        plan_store::DeletionState::Failed => DeletionState::Failed,
        // Journal-only; never reported as an outcome.
        plan_store::DeletionState::Deleting => DeletionState::Unspecified,
    };
    DeletionOutcome {
        registry: o.registry.clone(),
        repository: o.repository.clone(),
        digest: o.digest.clone(),
        tags: o.tags.clone(),
        state: state as i32,
        http_status: o.http_status.map(u32::from).unwrap_or_default(),
        error_code: o.error_code.clone(),
        error_message: o.error_message.clone(),
        at: o.at.clone(),
        note: o.note.clone(),
    }
}

pub fn report_to_proto(report: &StoredReport) -> PurgeReport {
    PurgeReport {
        plan_id: report.plan_id.clone(),
        target: report.target.clone(),
        fingerprint: report.fingerprint.clone(),
        executed_by: report.executed_by.clone(),
        started_at: report.started_at.clone(),
        finished_at: report.finished_at.clone(),
        outcomes: report.outcomes.iter().map(outcome_to_proto).collect(),
        later_executions: report
            .later
            .iter()
            .map(|a| vynil_proto::purger::v1::ExecutionAttempt { by: a.by.clone(), at: a.at.clone() })
            .collect(),
        state: match report.state {
            plan_store::ReportState::Running => ReportState::Running,
            plan_store::ReportState::Completed => ReportState::Completed,
            plan_store::ReportState::Interrupted => ReportState::Interrupted,
        } as i32,
        note: match report.state {
            plan_store::ReportState::Running => "an execution is running: the outcomes so far".into(),
            plan_store::ReportState::Completed => String::new(),
            plan_store::ReportState::Interrupted => format!(
                "interrupted: the execution stopped before its end; these {} outcomes were verified; Execute plan {} again to finish (nothing is deleted twice)",
                report.outcomes.len(),
                report.plan_id
            ),
        },
    }
}

/// The gRPC service over a shared [`Purger`].
#[derive(Debug, Clone)]
pub struct PurgerService {
    purger: Arc<Purger>,
    trust: vynil_runtime::Trust,
}

impl PurgerService {
    /// Serves `purger`, believing callers as `trust` says.
    pub fn new(purger: Arc<Purger>, trust: vynil_runtime::Trust) -> Self {
        Self { purger, trust }
    }
}

type ProgressStream = Pin<Box<dyn Stream<Item = Result<ExecuteProgress, Status>> + Send>>;

#[tonic::async_trait]
impl PurgerApi for PurgerService {
    #[tracing::instrument(skip_all)]
    async fn plan(&self, request: Request<PlanRequest>) -> Result<Response<PurgePlan>, Status> {
        // A plan reads the registry and the cluster and is stored: privileged.
        self.trust.privileged(&request, "purge Plan").map_err(|e| e.to_status())?;
        let target =
            request.into_inner().target.ok_or_else(|| Status::invalid_argument("a target is required"))?;
        let plan = match target {
            Target::Repository(r) => {
                let repo = RepositoryRef::new(&r.registry, &r.repository).map_err(PurgerError::from)?;
                self.purger.plan(&repo).await?
            }
            Target::Jukebox(name) => self.purger.plan_jukebox(&name).await?,
        };
        Ok(Response::new(plan_to_proto(&plan)))
    }

    async fn get_plan(&self, request: Request<GetPlanRequest>) -> Result<Response<PurgePlan>, Status> {
        let plan = self.purger.get_plan(&request.into_inner().plan_id).await?;
        Ok(Response::new(plan_to_proto(&plan)))
    }

    #[tracing::instrument(skip_all)]
    async fn execute(&self, request: Request<ExecuteRequest>) -> Result<Response<ProgressStream>, Status> {
        // Who executes: believed only with the service token (the gateway).
        let caller = self.trust.privileged(&request, "purge Execute").map_err(|e| e.to_status())?.to_string();
        let request = request.into_inner();
        let execute = executor::ExecuteRequest {
            plan_id: request.plan_id,
            confirm: request.confirm,
            fingerprint: request.fingerprint,
            acknowledge_usage_unknown: request.acknowledge_usage_unknown,
            caller,
        };
        // Refusals are answered before the stream starts.
        let prepared = self.purger.prepare(&execute).await?;
        let (sender, receiver) = mpsc::channel(64);
        let (progress, mut outcomes) = mpsc::channel::<StoredOutcome>(64);
        let purger = self.purger.clone();
        // The execution finishes even if the client goes away.
        let run = tokio::spawn(async move { purger.run(prepared, execute, progress).await });
        tokio::spawn(async move {
            while let Some(outcome) = outcomes.recv().await {
                let event = Event::Outcome(outcome_to_proto(&outcome));
                let _ = sender.send(Ok(ExecuteProgress { event: Some(event) })).await;
            }
            let last = match run.await {
                Ok(Ok(report)) => {
                    Ok(ExecuteProgress { event: Some(Event::Report(report_to_proto(&report))) })
                }
                Ok(Err(error)) => Err(Status::from(error)),
                Err(join) => Err(Status::internal(format!("execution task failed: {join}"))),
            };
            let _ = sender.send(last).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }

    async fn get_report(&self, request: Request<GetReportRequest>) -> Result<Response<PurgeReport>, Status> {
        let report = self.purger.get_report(&request.into_inner().plan_id).await?;
        Ok(Response::new(report_to_proto(&report)))
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;
    use vynil_store::StoreError;

    use super::*;

    #[test]
    fn shared_failures_answer_the_codes_every_service_answers() {
        let timeout = vynil_registry::RegistryError::Timeout { what: "tags".into(), seconds: 1, attempts: 1 };
        assert_eq!(Status::from(PurgerError::Registry(timeout)).code(), Code::Unavailable);
        assert_eq!(Status::from(PurgerError::from(StoreError::Conflict("box".into()))).code(), Code::Aborted);
        assert_eq!(
            Status::from(PurgerError::from(StoreError::Unavailable("r".into()))).code(),
            Code::Unavailable
        );
    }
}
