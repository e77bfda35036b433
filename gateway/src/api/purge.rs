//! Purge plans: make one, read it with every tag's reasons, execute it with
//! the named confirmation (progress as server-sent events), read the report.

use std::convert::Infallible;

use axum::{
    Json,
    extract::{Path, State, rejection::JsonRejection},
    http::{HeaderMap, StatusCode, header},
    response::{
        IntoResponse, Response,
        sse::{Event, KeepAlive, Sse},
    },
};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use vynil_proto::purger::v1 as pb;

use super::{App, Ctx, Errors, body, check_subdomain, failed, json_event, non_empty};
use crate::{downstream::Service, error::ApiError};

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RepositoryTarget {
    /// Registry host, e.g. `registry.example:5000`.
    pub registry: String,
    pub repository: String,
}

/// Exactly one of `repository` and `jukebox`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct PlanRequest {
    pub repository: Option<RepositoryTarget>,
    /// Every repository of this JukeBox.
    pub jukebox: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PlanEntry {
    pub registry: String,
    pub repository: String,
    pub tag: String,
    pub digest: String,
    pub keep: bool,
    /// Every reason that applies ("head of beta", "installed by ns/name", "superseded"…).
    pub reasons: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Plan {
    pub plan_id: String,
    /// What `confirm` must name exactly to execute.
    pub target: String,
    pub fingerprint: String,
    /// Installed revisions could not be obtained: executing needs `acknowledge_usage_unknown`.
    pub usage_unknown: bool,
    pub entries: Vec<PlanEntry>,
    pub keep_count: u32,
    pub delete_count: u32,
    pub created_at: String,
    pub expires_at: String,
}

impl From<pb::PurgePlan> for Plan {
    fn from(p: pb::PurgePlan) -> Self {
        Self {
            plan_id: p.plan_id,
            target: p.target,
            fingerprint: p.fingerprint,
            usage_unknown: p.usage_unknown,
            entries: p
                .entries
                .into_iter()
                .map(|e| PlanEntry {
                    registry: e.registry,
                    repository: e.repository,
                    tag: e.tag,
                    digest: e.digest,
                    keep: e.keep,
                    reasons: e.reasons,
                })
                .collect(),
            keep_count: p.keep_count,
            delete_count: p.delete_count,
            created_at: p.created_at,
            expires_at: p.expires_at,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct ExecuteRequest {
    /// The plan's `target`, typed by the human who confirms.
    pub confirm: String,
    /// The plan's `fingerprint`: a plan that changed since is refused (409).
    pub fingerprint: String,
    #[serde(default)]
    pub acknowledge_usage_unknown: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeletionState {
    Unknown,
    /// Deleted and verified gone: eligible for the registry's garbage collection.
    Deleted,
    AlreadyGone,
    Failed,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DeletionOutcome {
    pub registry: String,
    pub repository: String,
    pub digest: String,
    pub tags: Vec<String>,
    pub state: DeletionState,
    pub http_status: Option<u32>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    pub at: String,
    pub note: Option<String>,
}

impl From<pb::DeletionOutcome> for DeletionOutcome {
    fn from(o: pb::DeletionOutcome) -> Self {
        let state = match pb::DeletionState::try_from(o.state) {
            Ok(pb::DeletionState::Deleted) => DeletionState::Deleted,
            Ok(pb::DeletionState::AlreadyGone) => DeletionState::AlreadyGone,
            Ok(pb::DeletionState::Failed) => DeletionState::Failed,
            _ => DeletionState::Unknown,
        };
        Self {
            registry: o.registry,
            repository: o.repository,
            digest: o.digest,
            tags: o.tags,
            state,
            http_status: (o.http_status != 0).then_some(o.http_status),
            error_code: non_empty(o.error_code),
            error_message: non_empty(o.error_message),
            at: o.at,
            note: non_empty(o.note),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReportState {
    Unknown,
    Running,
    Completed,
    /// The execution stopped before its end: execute the same plan again to finish.
    Interrupted,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Report {
    pub plan_id: String,
    pub target: String,
    pub fingerprint: String,
    /// The authenticated principal who executed it.
    pub executed_by: String,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub outcomes: Vec<DeletionOutcome>,
    pub state: ReportState,
    pub note: Option<String>,
    /// Executions of the same plan after the first (`executed_by` and
    /// `started_at` stay the first's), oldest first.
    pub later_executions: Vec<ExecutionAttempt>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ExecutionAttempt {
    /// The authenticated principal.
    pub by: String,
    /// RFC 3339.
    pub at: String,
}

impl From<pb::PurgeReport> for Report {
    fn from(r: pb::PurgeReport) -> Self {
        let state = match pb::ReportState::try_from(r.state) {
            Ok(pb::ReportState::Running) => ReportState::Running,
            Ok(pb::ReportState::Completed) => ReportState::Completed,
            Ok(pb::ReportState::Interrupted) => ReportState::Interrupted,
            _ => ReportState::Unknown,
        };
        Self {
            plan_id: r.plan_id,
            target: r.target,
            fingerprint: r.fingerprint,
            executed_by: r.executed_by,
            started_at: r.started_at,
            finished_at: non_empty(r.finished_at),
            outcomes: r.outcomes.into_iter().map(DeletionOutcome::from).collect(),
            state,
            note: non_empty(r.note),
            later_executions: r
                .later_executions
                .into_iter()
                .map(|a| ExecutionAttempt { by: a.by, at: a.at })
                .collect(),
        }
    }
}

fn check_plan_id(id: &str) -> Result<(), ApiError> {
    super::check_id("plan_id", id)
}

#[utoipa::path(post, path = "/api/v1/purge/plans", tag = "purge", request_body = PlanRequest,
    responses((status = 201, body = Plan), Errors), security(("bearer" = []), ("session" = [])))]
pub async fn create_plan(
    State(app): State<App>,
    Ctx(ctx): Ctx,
    request: Result<Json<PlanRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<Plan>), ApiError> {
    let target = match body(request)? {
        PlanRequest { repository: Some(r), jukebox: None } => {
            if r.registry.is_empty() || r.repository.is_empty() {
                return Err(ApiError::bad_request("repository", "needs both registry and repository"));
            }
            pb::plan_request::Target::Repository(pb::Repository {
                registry: r.registry,
                repository: r.repository,
            })
        }
        PlanRequest { repository: None, jukebox: Some(name) } => {
            check_subdomain("jukebox", &name)?;
            pb::plan_request::Target::Jukebox(name)
        }
        _ => return Err(ApiError::bad_request("body", "give exactly one of `repository` and `jukebox`")),
    };
    let request = app.services.request(&ctx, pb::PlanRequest { target: Some(target) });
    let plan = app.services.purger()?.plan(request).await.map_err(failed(Service::Purger))?;
    Ok((StatusCode::CREATED, Json(plan.into_inner().into())))
}

#[utoipa::path(get, path = "/api/v1/purge/plans/{plan_id}", tag = "purge", params(("plan_id" = String, Path)),
    responses((status = 200, body = Plan), Errors), security(("bearer" = []), ("session" = [])))]
pub async fn get_plan(
    State(app): State<App>,
    Ctx(ctx): Ctx,
    Path(plan_id): Path<String>,
) -> Result<Json<Plan>, ApiError> {
    check_plan_id(&plan_id)?;
    let request = app.services.request(&ctx, pb::GetPlanRequest { plan_id });
    let plan = app.services.purger()?.get_plan(request).await.map_err(failed(Service::Purger))?;
    Ok(Json(plan.into_inner().into()))
}

#[utoipa::path(get, path = "/api/v1/purge/plans/{plan_id}/report", tag = "purge",
    params(("plan_id" = String, Path)),
    responses((status = 200, body = Report), Errors), security(("bearer" = []), ("session" = [])))]
pub async fn get_report(
    State(app): State<App>,
    Ctx(ctx): Ctx,
    Path(plan_id): Path<String>,
) -> Result<Json<Report>, ApiError> {
    check_plan_id(&plan_id)?;
    let request = app.services.request(&ctx, pb::GetReportRequest { plan_id });
    let report = app.services.purger()?.get_report(request).await.map_err(failed(Service::Purger))?;
    Ok(Json(report.into_inner().into()))
}

/// Executes: refusals (wrong confirmation, stale plan, usage not
/// acknowledged) are answered as statuses before anything is deleted; then
/// `outcome` events, one per digest, and a final `report` event. A client
/// that accepts only `application/json` gets the report alone, at the end.
#[utoipa::path(post, path = "/api/v1/purge/plans/{plan_id}/execute", tag = "purge",
    params(("plan_id" = String, Path)), request_body = ExecuteRequest,
    responses((status = 200, description = "`outcome` events (a DeletionOutcome each), then a `report` event (a Report); an `error` event if the execution fails after it started", content_type = "text/event-stream", body = Report), Errors),
    security(("bearer" = []), ("session" = [])))]
pub async fn execute(
    State(app): State<App>,
    Ctx(ctx): Ctx,
    Path(plan_id): Path<String>,
    headers: HeaderMap,
    request: Result<Json<ExecuteRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    check_plan_id(&plan_id)?;
    let request = body(request)?;
    if request.confirm.is_empty() {
        return Err(ApiError::bad_request("confirm", "name the plan's target to confirm"));
    }
    let request = pb::ExecuteRequest {
        plan_id,
        confirm: request.confirm,
        fingerprint: request.fingerprint,
        acknowledge_usage_unknown: request.acknowledge_usage_unknown,
    };
    let permit = app.streams.open(&ctx)?;
    let request = app.services.request(&ctx, request);
    let stream = app.services.purger()?.execute(request).await.map_err(failed(Service::Purger))?.into_inner();
    let wants_events = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_none_or(|accept| !accept.contains("application/json") || accept.contains("text/event-stream"));
    if !wants_events {
        let mut stream = stream;
        while let Some(progress) = stream.next().await {
            let progress = progress.map_err(failed(Service::Purger))?;
            if let Some(pb::execute_progress::Event::Report(report)) = progress.event {
                return Ok(Json(Report::from(report)).into_response());
            }
        }
        return Err(ApiError::internal("the purger's execution ended without a report"));
    }
    let request_id = ctx.request_id.clone();
    let events = stream.map(move |item| {
        let _held = &permit;
        Ok::<Event, Infallible>(match item {
            Ok(pb::ExecuteProgress { event: Some(pb::execute_progress::Event::Outcome(o)) }) => {
                json_event("outcome", &DeletionOutcome::from(o))
            }
            Ok(pb::ExecuteProgress { event: Some(pb::execute_progress::Event::Report(r)) }) => {
                json_event("report", &Report::from(r))
            }
            Ok(pb::ExecuteProgress { event: None }) => Event::default().comment("empty progress"),
            Err(status) => {
                json_event("error", &ApiError::from_status(Service::Purger.name(), &status).body(&request_id))
            }
        })
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()).into_response())
}
