//! The gRPC face of lifecycle, answered from the controllers' watch caches.
//!
//! - `ListInstances`: every instance with lifecycle's last decision (state,
//!   blocking criterion, code and message) and the recorded revision; an
//!   object that does not decode is listed as `INVALID`, not hidden.
//! - `Explain`: what a reconcile would decide now, computed afresh with the
//!   same observation and planner the controller uses (nothing is written).
//! - `ListInstalledRevisions`: the purger's usage input — every installed,
//!   installing (`status.target`) or `initFrom`-pinned revision. Unknown is
//!   not absent: before the caches are synced, or when an instance's
//!   repository cannot be told, the answer is `UNAVAILABLE`, never a shorter
//!   list.
//!
//! Errors become `Status` through the one shared mapping (`Classify`).

use std::sync::Arc;

use kube::{ResourceExt, api::DynamicObject};
use tonic::{Request, Response, Status};
use vynil_proto::lifecycle::v1::{
    AllowDeleteWithoutPackageRequest, AllowDeleteWithoutPackageResponse, ApproveUpgradeRequest,
    ApproveUpgradeResponse, ClearQuarantineRequest, ClearQuarantineResponse, ExplainRequest, ExplainResponse,
    HistoryEntry, InstanceKind as ProtoKind, InstanceRef, InstanceState, InstanceSummary,
    ListInstalledRevisionsRequest, ListInstalledRevisionsResponse, ListInstancesRequest,
    ListInstancesResponse, RollBackRequest, RollBackResponse, lifecycle_server::Lifecycle,
};
use vynil_runtime::{ToStatus, metrics::Registry};

use crate::{
    LifecycleError,
    context::Context,
    install_plan::{self, Outcome},
    instance::{Instance, InstanceKind, proto_reference},
    metrics::LifecycleMetrics,
    operator::{self, Asked},
    uninstall_plan::CleanupAnswer,
};

/// The gRPC service: disabled (local mode) or over running controllers.
#[derive(Debug)]
pub struct LifecycleService {
    context: Result<Arc<Context>, String>,
    exported_metrics: Arc<Registry>,
    trust: vynil_runtime::Trust,
}

impl LifecycleService {
    /// Every RPC answers `FAILED_PRECONDITION` naming `why` (local mode: no cluster).
    pub fn disabled(why: impl Into<String>) -> Self {
        let (_, exported_metrics) = LifecycleMetrics::register();
        Self { context: Err(why.into()), exported_metrics, trust: Default::default() }
    }

    /// Believes callers as `trust` says (`AllowDeleteWithoutPackage` names them).
    pub fn with_trust(self, trust: vynil_runtime::Trust) -> Self {
        Self { trust, ..self }
    }

    pub(crate) fn running(context: Arc<Context>, exported: Arc<Registry>) -> Self {
        Self { context: Ok(context), exported_metrics: exported, trust: Default::default() }
    }

    /// What `GET /metrics` serves.
    pub fn exported_metrics(&self) -> Arc<Registry> {
        self.exported_metrics.clone()
    }

    fn context(&self) -> Result<&Arc<Context>, Status> {
        self.context
            .as_ref()
            .map_err(|why| Status::failed_precondition(format!("lifecycle is disabled: {why}")))
    }
}

fn kinds(filter: i32) -> Result<Vec<InstanceKind>, Status> {
    match ProtoKind::try_from(filter) {
        Ok(ProtoKind::Unspecified) => Ok(InstanceKind::ALL.to_vec()),
        Ok(ProtoKind::Tenant) => Ok(vec![InstanceKind::Tenant]),
        Ok(ProtoKind::Service) => Ok(vec![InstanceKind::Service]),
        Ok(ProtoKind::System) => Ok(vec![InstanceKind::System]),
        Err(_) => Err(Status::invalid_argument("kind must be tenant, service or system")),
    }
}

const APPROVAL: &str = "approval";

/// What an upgrade that waits waits for (as `blocked_by` says it), and why.
fn waiting(outcome: &Outcome) -> Option<(&'static str, &str)> {
    match outcome {
        Outcome::Waiting { why, on, .. } => Some((on.as_str(), why)),
        Outcome::PendingApproval(step) => Some((APPROVAL, &step.why)),
        _ => None,
    }
}

/// State and blocker of an outcome.
fn describe(outcome: &Outcome) -> (InstanceState, Option<&install_plan::Blocker>) {
    match outcome {
        Outcome::Suspended => (InstanceState::Suspended, None),
        Outcome::Deleting { .. } | Outcome::Released => (InstanceState::Deleting, None),
        Outcome::Blocked(blocker) => (InstanceState::Blocked, Some(blocker)),
        Outcome::UpToDate { .. } | Outcome::Adopted { .. } | Outcome::Installed { .. } => {
            (InstanceState::UpToDate, None)
        }
        Outcome::Installing { .. } | Outcome::RollingBack { .. } => (InstanceState::Installing, None),
        Outcome::Queued { .. } => (InstanceState::Queued, None),
        Outcome::Retrying { .. } => (InstanceState::Retrying, None),
        Outcome::Waiting { .. } => (InstanceState::Waiting, None),
        Outcome::PendingApproval(_) => (InstanceState::PendingApproval, None),
    }
}

fn summary_of(kind: InstanceKind, object: &DynamicObject, context: &Context) -> InstanceSummary {
    let mut summary =
        InstanceSummary { r#ref: Some(proto_reference(kind, object)), ..InstanceSummary::default() };
    let instance = match Instance::decode(kind, object) {
        Ok(instance) => instance,
        Err(error) => {
            summary.state = InstanceState::Invalid as i32;
            summary.blocking_reason = error.to_string();
            return summary;
        }
    };
    summary.jukebox = instance.jukebox.clone();
    summary.category = instance.category.clone();
    summary.package = instance.package.clone();
    summary.tag = instance.status.tag.clone().unwrap_or_default();
    summary.stage = instance.status.conditions.last().map(|c| c.condition_type.clone()).unwrap_or_default();
    summary.errors = instance
        .status
        .conditions
        .iter()
        .filter(|c| c.status == vynil_crds::ConditionStatus::False)
        .map(|c| c.message.clone())
        .collect();
    summary.history = history(&instance);
    if let Some(installed) = &instance.status.package {
        summary.installed_registry = installed.registry.clone();
        summary.installed_image = installed.image.clone();
        summary.installed_digest = installed.digest.clone().unwrap_or_default();
    }
    summary.target_tag = instance.status.target.as_ref().map(|t| t.revision.tag.clone()).unwrap_or_default();
    let state = if instance.deleting {
        InstanceState::Deleting
    } else {
        match context.outcome(kind, &instance.namespace, &instance.name) {
            None => InstanceState::Pending,
            Some(outcome) => {
                let (state, blocker) = describe(&outcome);
                if let Some(blocker) = blocker {
                    summary.blocked_by = blocker.criterion.as_str().into();
                    summary.blocking_code = blocker.code.unwrap_or_default().into();
                    summary.blocking_reason = blocker.message.clone();
                }
                if let Some((waits_for, why)) = waiting(&outcome) {
                    (summary.blocked_by, summary.blocking_reason) = (waits_for.into(), why.to_string());
                }
                state
            }
        }
    };
    summary.state = state as i32;
    summary
}

fn history(instance: &Instance) -> Vec<HistoryEntry> {
    let entries = instance.status.package.iter().flat_map(|p| p.history.iter());
    entries
        .map(|h| HistoryEntry {
            tag: h.tag.clone(),
            digest: h.digest.clone().unwrap_or_default(),
            installed_at: h.installed_at.clone().unwrap_or_default(),
        })
        .collect()
}

fn synced(context: &Context) -> Result<(), Status> {
    // A store is ready once its first list completed.
    use futures::FutureExt;
    let ready = InstanceKind::ALL
        .iter()
        .all(|k| context.stores.of(*k).wait_until_ready().now_or_never().is_some_and(|r| r.is_ok()));
    if ready {
        Ok(())
    } else {
        Err(Status::unavailable("lifecycle has not synced its instance caches yet: retry in a few seconds"))
    }
}

#[tonic::async_trait]
impl Lifecycle for LifecycleService {
    async fn list_instances(
        &self,
        request: Request<ListInstancesRequest>,
    ) -> Result<Response<ListInstancesResponse>, Status> {
        let result = async {
            let context = self.context()?;
            synced(context)?;
            let request = request.into_inner();
            let kinds = kinds(request.kind)?;
            let records = context.upgrades.all().await.map_err(|e| e.to_status())?;
            let mut instances = Vec::new();
            for kind in kinds {
                for object in context.stores.of(kind).state() {
                    let mut summary = summary_of(kind, &object, context);
                    if let Some(record) = object.metadata.uid.as_ref().and_then(|uid| records.get(uid)) {
                        summary.quarantined = record.quarantined.iter().map(operator::to_proto).collect();
                    }
                    let namespace_ok = request.namespace.is_empty()
                        || summary.r#ref.as_ref().is_some_and(|r| r.namespace == request.namespace);
                    if namespace_ok && (request.jukebox.is_empty() || summary.jukebox == request.jukebox) {
                        instances.push(summary);
                    }
                }
            }
            instances
                .sort_by_key(|s| s.r#ref.as_ref().map(|r| (r.kind, r.namespace.clone(), r.name.clone())));
            let (instances, next_page_token) =
                vynil_runtime::pages::page(instances, request.page_size, &request.page_token)?;
            Ok(ListInstancesResponse { instances, next_page_token })
        }
        .await;
        result.map(Response::new)
    }

    async fn explain(&self, request: Request<ExplainRequest>) -> Result<Response<ExplainResponse>, Status> {
        let result = async {
            let context = self.context()?;
            synced(context)?;
            let wanted =
                request.into_inner().r#ref.ok_or_else(|| Status::invalid_argument("ref is required"))?;
            explain(context, &wanted).await.map_err(|e| e.to_status())
        }
        .await;
        result.map(Response::new)
    }

    async fn list_installed_revisions(
        &self,
        request: Request<ListInstalledRevisionsRequest>,
    ) -> Result<Response<ListInstalledRevisionsResponse>, Status> {
        let result = async {
            let context = self.context()?;
            synced(context)?;
            let request = request.into_inner();
            crate::usage::installed_revisions(context, &request).await.map_err(|e| e.to_status())
        }
        .await;
        result.map(Response::new)
    }

    async fn allow_delete_without_package(
        &self,
        request: Request<AllowDeleteWithoutPackageRequest>,
    ) -> Result<Response<AllowDeleteWithoutPackageResponse>, Status> {
        let result = async {
            let context = self.context()?;
            synced(context)?;
            let caller =
                self.trust.privileged(&request, "AllowDeleteWithoutPackage").map_err(|e| e.to_status())?;
            allow_delete_without_package(context, request.into_inner(), &caller)
                .await
                .map_err(|e| e.to_status())
        }
        .await;
        result.map(Response::new)
    }

    async fn roll_back(
        &self,
        request: Request<RollBackRequest>,
    ) -> Result<Response<RollBackResponse>, Status> {
        let result = async {
            let context = self.context()?;
            synced(context)?;
            let caller = self.trust.privileged(&request, "RollBack").map_err(|e| e.to_status())?;
            let r = request.into_inner();
            let asked = (r.tag.as_str(), r.caller.as_str(), r.reason.as_str());
            let quarantine =
                operator_decision(context, r.r#ref, asked, &caller, true).await.map_err(|e| e.to_status())?;
            Ok(RollBackResponse { quarantine: Some(quarantine) })
        }
        .await;
        result.map(Response::new)
    }

    async fn approve_upgrade(
        &self,
        request: Request<ApproveUpgradeRequest>,
    ) -> Result<Response<ApproveUpgradeResponse>, Status> {
        let result = async {
            let context = self.context()?;
            synced(context)?;
            let caller = self.trust.privileged(&request, "ApproveUpgrade").map_err(|e| e.to_status())?;
            let r = request.into_inner();
            let wanted = operator::named(r.r#ref).map_err(|e| e.to_status())?;
            let (kind, object) = find(context, &wanted).map_err(|e| e.to_status())?;
            let asked = Asked {
                kind,
                object: &object,
                tag: "",
                caller: caller.recorded(&r.caller),
                reason: &r.reason,
            };
            operator::approve(context, &asked, &r.fingerprint).await.map_err(|e| e.to_status())
        }
        .await;
        result.map(Response::new)
    }

    async fn clear_quarantine(
        &self,
        request: Request<ClearQuarantineRequest>,
    ) -> Result<Response<ClearQuarantineResponse>, Status> {
        let result = async {
            let context = self.context()?;
            synced(context)?;
            let caller = self.trust.privileged(&request, "ClearQuarantine").map_err(|e| e.to_status())?;
            let r = request.into_inner();
            let asked = (r.tag.as_str(), r.caller.as_str(), r.reason.as_str());
            let cleared = operator_decision(context, r.r#ref, asked, &caller, false)
                .await
                .map_err(|e| e.to_status())?;
            Ok(ClearQuarantineResponse { cleared: Some(cleared) })
        }
        .await;
        result.map(Response::new)
    }
}

fn find(
    context: &Context,
    wanted: &InstanceRef,
) -> Result<(InstanceKind, Arc<DynamicObject>), LifecycleError> {
    let kind = match ProtoKind::try_from(wanted.kind) {
        Ok(ProtoKind::Tenant) => InstanceKind::Tenant,
        Ok(ProtoKind::Service) => InstanceKind::Service,
        Ok(ProtoKind::System) => InstanceKind::System,
        _ => return Err(LifecycleError::Invalid("ref.kind must be tenant, service or system".into())),
    };
    context
        .stores
        .of(kind)
        .state()
        .into_iter()
        .find(|o| o.name_any() == wanted.name && o.namespace().as_deref() == Some(wanted.namespace.as_str()))
        .map(|o| (kind, o))
        .ok_or_else(|| {
            LifecycleError::NotFound(format!("no {} {}/{}", kind.kind(), wanted.namespace, wanted.name))
        })
}

async fn explain(context: &Context, wanted: &InstanceRef) -> Result<ExplainResponse, LifecycleError> {
    let (kind, object) = find(context, wanted)?;
    let instance = Instance::decode(kind, &object)?;
    let (instance, record) = crate::ledger::read(instance, context, crate::ledger::Meeting::ReadOnly).await?;
    let mut response = ExplainResponse {
        history: history(&instance),
        r#ref: Some(wanted.clone()),
        from_tag: instance.status.tag.clone().unwrap_or_default(),
        quarantined: record.quarantined.iter().map(operator::to_proto).collect(),
        ..ExplainResponse::default()
    };
    let slot = crate::observe::job_slot(&instance, context).await?;
    let status = instance.object.get("status").cloned().unwrap_or(serde_json::Value::Null);
    let (to_delete, left, fingerprint) = crate::children::preview(&status, &instance.namespace);
    response.children_to_delete = to_delete;
    response.children_left = left;
    response.children_fingerprint = fingerprint;
    if instance.deleting {
        let observed = crate::observe::observe_cleanup(&instance, &slot, context).await?;
        let decision = crate::uninstall_plan::cleanup(&instance, &observed);
        response.state = InstanceState::Deleting as i32;
        if let Outcome::Blocked(blocker) = &decision.outcome {
            response.blocked_by = blocker.criterion.as_str().into();
            response.blocking_code = blocker.code.unwrap_or_default().into();
            response.blocking_reason = blocker.message.clone();
        }
        response.summary = match (&decision.outcome, &observed.answer) {
            (Outcome::Blocked(blocker), _) if blocker.criterion == install_plan::Criterion::ControlPlane => {
                format!("blocked by control_plane: {}", blocker.message)
            }
            (_, answer) => cleanup_summary(&instance, answer),
        };
        response.details = decision.steps.iter().map(install_plan::Step::describe).collect();
        return Ok(response);
    }
    let observed = crate::observe::observe(&instance, record, &slot, context).await?;
    let decision = install_plan::plan(&instance, &observed);
    response.latest_tag = context.catalog.latest_tag(&instance).await?.unwrap_or_default();
    explain_outcome(&mut response, &decision);
    explain_held_back(&mut response, &observed.held_back);
    if let install_plan::Resolution::Package { package, .. } = &observed.resolution
        && let Some(jukebox) = crate::jukeboxes::of(&instance, context).await?
    {
        let listed = jukebox.status.as_ref().map(|s| s.packages.as_slice()).unwrap_or_default();
        let same = vynil_rules::signature::same_verified_digest(listed, package);
        if !same.is_empty() {
            response.details.push(format!(
                "{}:{} is the same signed bytes ({}) as {}: a re-tag; make sure it is the version you mean to run",
                package.image,
                package.tag,
                package.digest.as_deref().unwrap_or_default(),
                same.join(", ")
            ));
        }
    }
    Ok(response)
}

/// What the cleanup would do, from the catalog's answer.
fn cleanup_summary(instance: &Instance, answer: &CleanupAnswer) -> String {
    match answer {
        CleanupAnswer::NothingToDelete => "nothing recorded to undo: the finalizer goes, no Job".into(),
        CleanupAnswer::Revision(request) => {
            let recorded = instance
                .status
                .package
                .as_ref()
                .is_some_and(|p| p.tag == request.tag && p.image == request.image);
            format!(
                "the delete hooks of {}/{}:{} run ({})",
                request.registry,
                request.image,
                request.tag,
                if recorded {
                    "the revision recorded at install, still in the registry"
                } else {
                    "the catalog's revision of the same type"
                }
            )
        }
        CleanupAnswer::Gone { message, .. } => format!(
            "blocked: {message}. Explain lists what a delete without package would delete; an admin confirms it with AllowDeleteWithoutPackage (the annotation vynil.solidite.fr/delete-without-package alone deletes nothing)"
        ),
        CleanupAnswer::WithoutPackage { warning } => {
            format!("the reaper deletes the recorded children: {warning}")
        }
    }
}

/// Adds what the JukeBox holds back from the instance to `response`.
fn explain_held_back(response: &mut ExplainResponse, held_back: &install_plan::HeldBack) {
    response.withheld = held_back.newer.clone();
    if let Some(recalled) = &held_back.recalled {
        let next = match (&recalled.to, recalled.move_away) {
            (Some(to), true) => format!("moving away to {to}, as an admin's recall with move_away asks"),
            (Some(to), false) => format!(
                "the next selectable revision is {to} (moving instances away, across a freeze or to an older revision, needs an admin's recall with move_away)"
            ),
            (None, _) => "no other revision is selectable".into(),
        };
        response.recalled = format!("running a recalled revision: {}; {next}", recalled.description);
        response.summary = format!("{} ({})", response.summary, response.recalled);
    }
    if !response.withheld.is_empty() {
        response.summary = format!("{}; held back: {}", response.summary, response.withheld.join("; "));
    }
}

/// Fills `response` with what `decision` would do to an instance not being deleted.
fn explain_outcome(response: &mut ExplainResponse, decision: &install_plan::Plan) {
    let (state, blocker) = describe(&decision.outcome);
    response.state = state as i32;
    if let Some(blocker) = blocker {
        response.blocked_by = blocker.criterion.as_str().into();
        response.blocking_code = blocker.code.unwrap_or_default().into();
        response.blocking_reason = blocker.message.clone();
    }
    let from = if response.from_tag.is_empty() { "nothing".to_string() } else { response.from_tag.clone() };
    response.summary = match &decision.outcome {
        Outcome::Suspended => "suspended (vynil.solidite.fr/suspend=\"true\"): nothing is done".into(),
        Outcome::Deleting { detail } => format!("being deleted: {detail}"),
        Outcome::Released => "deleted: the finalizer goes".into(),
        Outcome::Blocked(blocker) => {
            format!("blocked by {}: {}", blocker.criterion.as_str(), blocker.message)
        }
        Outcome::UpToDate { tag } | Outcome::Adopted { tag } | Outcome::Installed { tag } => {
            response.to_tag = tag.clone();
            format!("up to date at {tag}: nothing would run")
        }
        Outcome::Installing { to, .. } => {
            response.to_tag = to.clone();
            let via = if !response.latest_tag.is_empty() && response.latest_tag != *to {
                format!(" (a waypoint on the way to {})", response.latest_tag)
            } else {
                String::new()
            };
            format!("would install {to}{via} over {from}")
        }
        Outcome::Queued { to } => {
            response.to_tag = to.clone();
            format!("would install {to} once an agent Job slot is free (--max-running-jobs)")
        }
        Outcome::Waiting { to, why, on, .. } => {
            response.to_tag = to.clone();
            (response.blocked_by, response.blocking_reason) = (on.as_str().into(), why.clone());
            why.clone()
        }
        Outcome::PendingApproval(step) => {
            response.to_tag = step.to.clone();
            (response.blocked_by, response.blocking_reason) = (APPROVAL.into(), step.why.clone());
            response.approval_fingerprint = step.fingerprint.clone();
            response.approval_options_hash = step.options_hash.clone();
            step.why.clone()
        }
        Outcome::RollingBack { failed, to } => {
            response.to_tag = to.clone();
            format!(
                "rolling back to {to}: the upgrade to {failed} failed and {failed} is quarantined for this instance"
            )
        }
        Outcome::Retrying { to, attempt, reason, retry_at } => {
            response.to_tag = to.clone();
            format!("attempt {attempt} to install {to} failed ({reason}); next attempt at {retry_at}")
        }
    };
    response.details = decision.steps.iter().map(install_plan::Step::describe).collect();
}

/// Records an admin's confirmation (`crate::confirmation`) and sets
/// `vynil.solidite.fr/delete-without-package: "true"` on one instance, for
/// a caller who named it exactly and saw the current list of children (the
/// fingerprint `Explain` gave); reads both back and records an Event.
async fn allow_delete_without_package(
    context: &Context,
    request: AllowDeleteWithoutPackageRequest,
    caller: &vynil_runtime::Caller,
) -> Result<AllowDeleteWithoutPackageResponse, LifecycleError> {
    let wanted = request.r#ref.ok_or_else(|| LifecycleError::Invalid("ref is required".into()))?;
    let (kind, object) = find(context, &wanted)?;
    let instance = Instance::decode(kind, &object)?;
    let expected = instance.reference();
    if request.confirm != expected {
        return Err(LifecycleError::Invalid(format!(
            "confirm must be exactly {expected:?} (got {:?}): nothing was changed",
            request.confirm
        )));
    }
    let status = instance.object.get("status").cloned().unwrap_or(serde_json::Value::Null);
    let (_, _, fingerprint) = crate::children::preview(&status, &instance.namespace);
    if request.fingerprint != fingerprint {
        return Err(LifecycleError::Refused(format!(
            "the children of {expected} changed since the fingerprint was read (now {fingerprint}): call Explain again, review, and retry; nothing was changed"
        )));
    }
    let caller = caller.recorded(&request.caller);
    let uid = instance.uid.clone().ok_or_else(|| {
        LifecycleError::Invalid(format!("{expected} has no UID: it is not an object of the API server"))
    })?;
    let confirmation = crate::confirmation::Confirmation {
        uid,
        instance: expected,
        fingerprint,
        children: crate::confirmation::children_of(&status),
        confirmed_by: caller,
        confirmed_at: jiff::Timestamp::now().to_string(),
        reason: request.reason,
    };
    context.allow_delete_without_package(kind, &object, &confirmation).await?;
    Ok(AllowDeleteWithoutPackageResponse { annotated: true })
}

/// An operator's decision on a failed upgrade (`RollBack`, `ClearQuarantine`).
async fn operator_decision(
    context: &Context,
    wanted: Option<InstanceRef>,
    (tag, claimed, reason): (&str, &str, &str),
    caller: &vynil_runtime::Caller,
    rollback: bool,
) -> Result<vynil_proto::lifecycle::v1::Quarantine, LifecycleError> {
    let wanted = operator::named(wanted)?;
    let (kind, object) = find(context, &wanted)?;
    let asked = Asked { kind, object: &object, tag, caller: caller.recorded(claimed), reason };
    if rollback {
        operator::roll_back(context, &asked).await
    } else {
        operator::clear_quarantine(context, &asked).await
    }
}
