//! Instances: their state and blocking reason, why (explain), and the
//! named, confirmed escape hatch of a delete without package hooks.

use axum::{
    Json,
    extract::{Path, Query, State, rejection::JsonRejection, rejection::QueryRejection},
};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use vynil_proto::lifecycle::v1 as pb;

use super::{
    App, Ctx, Done, Errors, PageQuery, body, check_label, check_subdomain, failed, inputs::Input, non_empty,
    query,
};
use crate::{downstream::Service, error::ApiError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum InstanceKind {
    Tenant,
    Service,
    System,
}

impl InstanceKind {
    fn parse(value: &str) -> Result<Self, ApiError> {
        match value {
            "tenant" => Ok(Self::Tenant),
            "service" => Ok(Self::Service),
            "system" => Ok(Self::System),
            other => {
                Err(ApiError::bad_request("kind", format!("{other:?} is not tenant, service or system")))
            }
        }
    }

    fn to_proto(self) -> i32 {
        (match self {
            Self::Tenant => pb::InstanceKind::Tenant,
            Self::Service => pb::InstanceKind::Service,
            Self::System => pb::InstanceKind::System,
        }) as i32
    }

    fn from_proto(value: i32) -> Option<Self> {
        match pb::InstanceKind::try_from(value) {
            Ok(pb::InstanceKind::Tenant) => Some(Self::Tenant),
            Ok(pb::InstanceKind::Service) => Some(Self::Service),
            Ok(pb::InstanceKind::System) => Some(Self::System),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum InstanceState {
    Unknown,
    Pending,
    Suspended,
    Blocked,
    UpToDate,
    Installing,
    Retrying,
    Invalid,
    Deleting,
    Queued,
    /// An upgrade waits for a maintenance window or the end of a freeze (`blocked` says until when).
    Waiting,
    /// An upgrade waits for an operator's approval (`approve-upgrade` with the explanation's `approval_fingerprint`).
    PendingApproval,
}

impl InstanceState {
    fn from_proto(value: i32) -> Self {
        match pb::InstanceState::try_from(value) {
            Ok(pb::InstanceState::Pending) => Self::Pending,
            Ok(pb::InstanceState::Suspended) => Self::Suspended,
            Ok(pb::InstanceState::Blocked) => Self::Blocked,
            Ok(pb::InstanceState::UpToDate) => Self::UpToDate,
            Ok(pb::InstanceState::Installing) => Self::Installing,
            Ok(pb::InstanceState::Retrying) => Self::Retrying,
            Ok(pb::InstanceState::Invalid) => Self::Invalid,
            Ok(pb::InstanceState::Deleting) => Self::Deleting,
            Ok(pb::InstanceState::Queued) => Self::Queued,
            Ok(pb::InstanceState::Waiting) => Self::Waiting,
            Ok(pb::InstanceState::PendingApproval) => Self::PendingApproval,
            _ => Self::Unknown,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct InstanceRef {
    pub kind: Option<InstanceKind>,
    pub namespace: String,
    pub name: String,
}

fn reference(r: Option<pb::InstanceRef>) -> InstanceRef {
    let r = r.unwrap_or_default();
    InstanceRef { kind: InstanceKind::from_proto(r.kind), namespace: r.namespace, name: r.name }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HistoryEntry {
    pub tag: String,
    pub digest: String,
    pub installed_at: String,
}

fn history(entries: Vec<pb::HistoryEntry>) -> Vec<HistoryEntry> {
    entries
        .into_iter()
        .map(|h| HistoryEntry { tag: h.tag, digest: h.digest, installed_at: h.installed_at })
        .collect()
}

/// When blocked: the criterion, the code (e.g. E_PACKAGE_GONE) and the message.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Blocker {
    pub criterion: String,
    pub code: Option<String>,
    pub reason: String,
}

fn blocker(criterion: String, code: String, reason: String) -> Option<Blocker> {
    (!criterion.is_empty() || !reason.is_empty()).then(|| Blocker {
        criterion,
        code: non_empty(code),
        reason,
    })
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Instance {
    #[serde(rename = "ref")]
    pub reference: InstanceRef,
    pub jukebox: String,
    pub category: String,
    pub package: String,
    pub tag: Option<String>,
    pub stage: String,
    pub errors: Vec<String>,
    pub state: InstanceState,
    pub blocked: Option<Blocker>,
    pub installed_registry: Option<String>,
    pub installed_image: Option<String>,
    pub installed_digest: Option<String>,
    /// The tag the agent Job in flight installs.
    pub target_tag: Option<String>,
    pub history: Vec<HistoryEntry>,
    /// Revisions quarantined for this instance after an upgrade to them failed.
    pub quarantined: Vec<Quarantine>,
}

/// What became of a failed upgrade once its revision was quarantined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RollbackState {
    Unknown,
    /// Back to `from_tag` on its own: the failed runs applied nothing.
    Automatic,
    /// Holds (`E_UPGRADE_FAILED`) until an operator rolls back or clears it.
    AwaitingOperator,
    /// An operator asked for the rollback.
    Approved,
}

/// A revision quarantined for one instance.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Quarantine {
    pub tag: String,
    pub digest: Option<String>,
    /// The revision installed when the upgrade failed: where a rollback goes.
    pub from_tag: String,
    pub reason: String,
    pub at: String,
    pub rollback: RollbackState,
    /// Why it awaits an operator, or who approved the rollback.
    pub rollback_detail: Option<String>,
}

fn quarantine(q: pb::Quarantine) -> Quarantine {
    let rollback = match pb::RollbackState::try_from(q.rollback) {
        Ok(pb::RollbackState::Automatic) => RollbackState::Automatic,
        Ok(pb::RollbackState::AwaitingOperator) => RollbackState::AwaitingOperator,
        Ok(pb::RollbackState::Approved) => RollbackState::Approved,
        _ => RollbackState::Unknown,
    };
    Quarantine {
        tag: q.tag,
        digest: non_empty(q.digest),
        from_tag: q.from_tag,
        reason: q.reason,
        at: q.at,
        rollback,
        rollback_detail: non_empty(q.rollback_detail),
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct InstanceList {
    pub items: Vec<Instance>,
    pub next_page_token: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct InstanceQuery {
    #[param(value_type = Option<InstanceKind>)]
    pub kind: Option<String>,
    pub namespace: Option<String>,
    pub jukebox: Option<String>,
    pub limit: Option<usize>,
    pub page_token: Option<String>,
}

#[utoipa::path(get, path = "/api/v1/instances", tag = "instances", params(InstanceQuery),
    responses((status = 200, body = InstanceList), Errors), security(("bearer" = []), ("session" = [])))]
pub async fn list_instances(
    State(app): State<App>,
    Ctx(ctx): Ctx,
    filters: Result<Query<InstanceQuery>, QueryRejection>,
) -> Result<Json<InstanceList>, ApiError> {
    let filters = query(filters)?;
    let kind = filters.kind.as_deref().map(InstanceKind::parse).transpose()?;
    if let Some(namespace) = &filters.namespace {
        check_label("namespace", namespace)?;
    }
    if let Some(jukebox) = &filters.jukebox {
        check_subdomain("jukebox", jukebox)?;
    }
    let page = app.pages.slice(&PageQuery { limit: filters.limit, page_token: filters.page_token })?;
    let request = pb::ListInstancesRequest {
        kind: kind.map(InstanceKind::to_proto).unwrap_or_default(),
        namespace: filters.namespace.unwrap_or_default(),
        jukebox: filters.jukebox.unwrap_or_default(),
        page_size: page.size(),
        page_token: page.token(),
    };
    let request = app.services.request(&ctx, request);
    let answer =
        app.services.lifecycle()?.list_instances(request).await.map_err(failed(Service::Lifecycle))?;
    let answer = answer.into_inner();
    let next_page_token = answer.next_page_token;
    let items = answer
        .instances
        .into_iter()
        .map(|i| Instance {
            reference: reference(i.r#ref),
            jukebox: i.jukebox,
            category: i.category,
            package: i.package,
            tag: non_empty(i.tag),
            stage: i.stage,
            errors: i.errors,
            state: InstanceState::from_proto(i.state),
            blocked: blocker(i.blocked_by, i.blocking_code, i.blocking_reason),
            installed_registry: non_empty(i.installed_registry),
            installed_image: non_empty(i.installed_image),
            installed_digest: non_empty(i.installed_digest),
            target_tag: non_empty(i.target_tag),
            history: history(i.history),
            quarantined: i.quarantined.into_iter().map(quarantine).collect(),
        })
        .collect();
    let next_page_token = non_empty(next_page_token);
    Ok(Json(InstanceList { items, next_page_token }))
}

fn instance_ref(kind: &str, namespace: &str, name: &str) -> Result<pb::InstanceRef, ApiError> {
    let kind = InstanceKind::parse(kind)?;
    check_label("namespace", namespace)?;
    check_subdomain("name", name)?;
    Ok(pb::InstanceRef { kind: kind.to_proto(), namespace: namespace.into(), name: name.into() })
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Explanation {
    #[serde(rename = "ref")]
    pub reference: InstanceRef,
    pub summary: String,
    pub details: Vec<String>,
    pub state: InstanceState,
    pub from_tag: Option<String>,
    /// What this step installs (the next waypoint on the way to `latest_tag`).
    pub to_tag: Option<String>,
    pub latest_tag: Option<String>,
    pub blocked: Option<Blocker>,
    /// What a delete without package hooks would delete, and leave for a human.
    pub children_to_delete: Vec<String>,
    pub children_left: Vec<String>,
    /// What `allow-delete-without-package` requires as `fingerprint`.
    pub children_fingerprint: String,
    pub history: Vec<HistoryEntry>,
    pub quarantined: Vec<Quarantine>,
    /// When the state is `pending_approval`: what `approve-upgrade` must name.
    pub approval_fingerprint: Option<String>,
    pub approval_options_hash: Option<String>,
    /// What the JukeBox holds back from the instance: recalled or too young
    /// revisions newer than `to_tag`, in words ("0.1.10 becomes selectable at …").
    #[serde(default)]
    pub withheld: Vec<String>,
    /// The installed revision is recalled: in words, with what moving away installs.
    #[serde(default)]
    pub recalled: Option<String>,
}

#[utoipa::path(get, path = "/api/v1/instances/{kind}/{namespace}/{name}/explain", tag = "instances",
    params(("kind" = InstanceKind, Path), ("namespace" = String, Path), ("name" = String, Path)),
    responses((status = 200, body = Explanation), Errors), security(("bearer" = []), ("session" = [])))]
pub async fn explain(
    State(app): State<App>,
    Ctx(ctx): Ctx,
    Path((kind, namespace, name)): Path<(String, String, String)>,
) -> Result<Json<Explanation>, ApiError> {
    let reference_ = instance_ref(&kind, &namespace, &name)?;
    let request = app.services.request(&ctx, pb::ExplainRequest { r#ref: Some(reference_) });
    let e =
        app.services.lifecycle()?.explain(request).await.map_err(failed(Service::Lifecycle))?.into_inner();
    Ok(Json(Explanation {
        reference: reference(e.r#ref),
        summary: e.summary,
        details: e.details,
        state: InstanceState::from_proto(e.state),
        from_tag: non_empty(e.from_tag),
        to_tag: non_empty(e.to_tag),
        latest_tag: non_empty(e.latest_tag),
        blocked: blocker(e.blocked_by, e.blocking_code, e.blocking_reason),
        children_to_delete: e.children_to_delete,
        children_left: e.children_left,
        children_fingerprint: e.children_fingerprint,
        history: history(e.history),
        quarantined: e.quarantined.into_iter().map(quarantine).collect(),
        approval_fingerprint: non_empty(e.approval_fingerprint),
        approval_options_hash: non_empty(e.approval_options_hash),
        withheld: e.withheld,
        recalled: non_empty(e.recalled),
    }))
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct AllowDeleteRequest {
    /// Exactly `<kind>/<namespace>/<name>`.
    pub confirm: String,
    /// The `children_fingerprint` of the explanation the human read.
    pub fingerprint: String,
    #[serde(default)]
    pub reason: String,
}

#[utoipa::path(post, path = "/api/v1/instances/{kind}/{namespace}/{name}/allow-delete-without-package",
    tag = "instances",
    params(("kind" = InstanceKind, Path), ("namespace" = String, Path), ("name" = String, Path)),
    request_body = AllowDeleteRequest,
    responses((status = 200, body = Done), Errors), security(("bearer" = []), ("session" = [])))]
pub async fn allow_delete_without_package(
    State(app): State<App>,
    Ctx(ctx): Ctx,
    Path((kind, namespace, name)): Path<(String, String, String)>,
    request: Result<Json<AllowDeleteRequest>, JsonRejection>,
) -> Result<Json<Done>, ApiError> {
    let reference_ = instance_ref(&kind, &namespace, &name)?;
    let request = body(request)?;
    let request = pb::AllowDeleteWithoutPackageRequest {
        r#ref: Some(reference_),
        confirm: request.confirm,
        caller: String::new(),
        reason: request.reason,
        fingerprint: request.fingerprint,
    };
    let request = app.services.request(&ctx, request);
    let answer = app
        .services
        .lifecycle()?
        .allow_delete_without_package(request)
        .await
        .map_err(failed(Service::Lifecycle))?;
    Ok(Json(Done { done: answer.into_inner().annotated }))
}

/// An operator's decision on a failed upgrade.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct UpgradeDecision {
    /// The quarantined tag; absent: the one failed upgrade awaiting an operator.
    #[serde(default)]
    pub tag: Option<String>,
    #[serde(default)]
    pub reason: String,
}

#[utoipa::path(post, path = "/api/v1/instances/{kind}/{namespace}/{name}/rollback", tag = "instances",
    params(("kind" = InstanceKind, Path), ("namespace" = String, Path), ("name" = String, Path)),
    request_body = UpgradeDecision,
    responses((status = 200, body = Quarantine, description = "the quarantine, its rollback approved"), Errors),
    security(("bearer" = []), ("session" = [])))]
pub async fn roll_back(
    State(app): State<App>,
    Ctx(ctx): Ctx,
    Path((kind, namespace, name)): Path<(String, String, String)>,
    request: Result<Json<UpgradeDecision>, JsonRejection>,
) -> Result<Json<Quarantine>, ApiError> {
    let (reference_, tag, reason) = decided(&kind, &namespace, &name, request)?;
    let request = pb::RollBackRequest { r#ref: Some(reference_), tag, caller: String::new(), reason };
    let request = app.services.request(&ctx, request);
    let answer = app.services.lifecycle()?.roll_back(request).await.map_err(failed(Service::Lifecycle))?;
    Ok(Json(quarantine(answer.into_inner().quarantine.unwrap_or_default())))
}

#[utoipa::path(post, path = "/api/v1/instances/{kind}/{namespace}/{name}/clear-quarantine", tag = "instances",
    params(("kind" = InstanceKind, Path), ("namespace" = String, Path), ("name" = String, Path)),
    request_body = UpgradeDecision,
    responses((status = 200, body = Quarantine, description = "the quarantine removed"), Errors),
    security(("bearer" = []), ("session" = [])))]
pub async fn clear_quarantine(
    State(app): State<App>,
    Ctx(ctx): Ctx,
    Path((kind, namespace, name)): Path<(String, String, String)>,
    request: Result<Json<UpgradeDecision>, JsonRejection>,
) -> Result<Json<Quarantine>, ApiError> {
    let (reference_, tag, reason) = decided(&kind, &namespace, &name, request)?;
    let request = pb::ClearQuarantineRequest { r#ref: Some(reference_), tag, caller: String::new(), reason };
    let request = app.services.request(&ctx, request);
    let answer =
        app.services.lifecycle()?.clear_quarantine(request).await.map_err(failed(Service::Lifecycle))?;
    Ok(Json(quarantine(answer.into_inner().cleared.unwrap_or_default())))
}

/// The instance, the tag (checked as the document declares it; "": none
/// named) and the reason of an operator's decision.
fn decided(
    kind: &str,
    namespace: &str,
    name: &str,
    request: Result<Json<UpgradeDecision>, JsonRejection>,
) -> Result<(pb::InstanceRef, String, String), ApiError> {
    let reference_ = instance_ref(kind, namespace, name)?;
    let decision = body(request)?;
    let tag = match decision.tag {
        Some(tag) => Input::Tag.check("tag", &tag).map(|()| tag)?,
        None => String::new(),
    };
    Ok((reference_, tag, decision.reason))
}

/// An operator's approval of the upgrade awaiting it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct ApproveRequest {
    /// The explanation's `approval_fingerprint`: the step reviewed.
    pub fingerprint: String,
    #[serde(default)]
    pub reason: String,
}

/// The upgrade approved.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Approved {
    pub from_tag: String,
    pub to_tag: String,
    pub fingerprint: String,
}

#[utoipa::path(post, path = "/api/v1/instances/{kind}/{namespace}/{name}/approve-upgrade", tag = "instances",
    params(("kind" = InstanceKind, Path), ("namespace" = String, Path), ("name" = String, Path)),
    request_body = ApproveRequest,
    responses((status = 200, body = Approved), Errors), security(("bearer" = []), ("session" = [])))]
pub async fn approve_upgrade(
    State(app): State<App>,
    Ctx(ctx): Ctx,
    Path((kind, namespace, name)): Path<(String, String, String)>,
    request: Result<Json<ApproveRequest>, JsonRejection>,
) -> Result<Json<Approved>, ApiError> {
    let reference_ = instance_ref(&kind, &namespace, &name)?;
    let approval = body(request)?;
    if approval.fingerprint.is_empty() {
        return Err(ApiError::bad_request(
            "fingerprint",
            "is required: the explanation's approval_fingerprint, the step you reviewed",
        ));
    }
    let request = pb::ApproveUpgradeRequest {
        r#ref: Some(reference_),
        fingerprint: approval.fingerprint,
        caller: String::new(),
        reason: approval.reason,
    };
    let request = app.services.request(&ctx, request);
    let answer =
        app.services.lifecycle()?.approve_upgrade(request).await.map_err(failed(Service::Lifecycle))?;
    let a = answer.into_inner();
    Ok(Json(Approved { from_tag: a.from_tag, to_tag: a.to_tag, fingerprint: a.fingerprint }))
}
