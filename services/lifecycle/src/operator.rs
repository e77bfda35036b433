//! What an operator decides about an upgrade (`RollBack`,
//! `ClearQuarantine`, `ApproveUpgrade`): recorded in the instance's upgrade record
//! ([`crate::upgrades`]), where tenants cannot write, read back, with an
//! Event naming who decided. The service token is required (the gateway
//! allows operators only): a tenant with every right on its own instance
//! and its status can do neither.

use kube::api::{DynamicObject, Patch, PatchParams};
use serde_json::json;
use vynil_proto::lifecycle::v1::{InstanceRef, Quarantine, RollbackState};
use vynil_rules::upgrade::{Quarantined, Rollback};

use crate::{
    LifecycleError,
    context::Context,
    install_plan::Outcome,
    instance::{Instance, InstanceKind},
    upgrades::Approval,
};

/// A quarantine as the API answers it.
pub fn to_proto(entry: &Quarantined) -> Quarantine {
    let (rollback, detail) = match &entry.rollback {
        Rollback::Automatic => (RollbackState::Automatic, String::new()),
        Rollback::AwaitingOperator { why } => (RollbackState::AwaitingOperator, why.clone()),
        Rollback::Approved { by, at } => (RollbackState::Approved, format!("approved by {by} at {at}")),
        Rollback::Off => (RollbackState::Unspecified, String::new()),
    };
    Quarantine {
        tag: entry.tag.clone(),
        digest: entry.digest.clone().unwrap_or_default(),
        from_tag: entry.from.clone(),
        reason: entry.reason.clone(),
        at: entry.at.clone(),
        rollback: rollback as i32,
        rollback_detail: detail,
    }
}

/// What an operator's request names: the instance and who asks.
pub struct Asked<'a> {
    pub kind: InstanceKind,
    pub object: &'a DynamicObject,
    pub tag: &'a str,
    pub caller: String,
    pub reason: &'a str,
}

impl Asked<'_> {
    fn instance(&self) -> Result<(Instance, String), LifecycleError> {
        let instance = Instance::decode(self.kind, self.object)?;
        let uid = instance.uid.clone().ok_or_else(|| {
            LifecycleError::Invalid(format!(
                "{} has no UID: it is not an object of the API server",
                instance.reference()
            ))
        })?;
        Ok((instance, uid))
    }

    /// The instance as its ledger says it stands (`crate::ledger`), its
    /// record and its UID.
    async fn through_ledger(
        &self,
        context: &Context,
    ) -> Result<(Instance, crate::upgrades::UpgradeRecord, String), LifecycleError> {
        let (instance, uid) = self.instance()?;
        let (instance, record) =
            crate::ledger::read(instance, context, crate::ledger::Meeting::ReadOnly).await?;
        Ok((instance, record, uid))
    }

    fn note(&self, what: String) -> String {
        let reason = if self.reason.is_empty() { String::new() } else { format!(": {}", self.reason) };
        format!("{} {what}{reason}", self.caller)
    }
}

/// Approves the rollback of the failed upgrade `asked.tag` names (the one
/// awaiting an operator when empty).
pub async fn roll_back(context: &Context, asked: &Asked<'_>) -> Result<Quarantine, LifecycleError> {
    context.ensure_leader()?;
    let (instance, uid) = asked.instance()?;
    let key = instance.reference();
    let at = vynil_crds::condition::rfc3339_seconds(jiff::Timestamp::now());
    let approved = Rollback::Approved { by: asked.caller.clone(), at };
    let before = context
        .upgrades
        .change(&uid, &key, asked.tag, |found| match &found.rollback {
            Rollback::AwaitingOperator { .. } => {
                Ok(Some(Quarantined { rollback: approved.clone(), ..found.clone() }))
            }
            Rollback::Automatic | Rollback::Approved { .. } => Err(LifecycleError::Refused(format!(
                "the rollback of {key} from {} to {} is already under way: nothing was changed",
                found.tag, found.from
            ))),
            Rollback::Off => Err(LifecycleError::Refused(format!("rollback is turned off for {key}"))),
        })
        .await?;
    let note = asked.note(format!("approved the rollback from {} to {}", before.tag, before.from));
    context.audit(asked.object, asked.kind, true, ("UpgradeRollbackApproved", &asked.caller), note).await;
    Ok(to_proto(&Quarantined { rollback: approved, ..before }))
}

/// Removes the quarantine `asked.tag` names; when it is the instance's
/// failed target, that target goes too, so the revision is tried again
/// with fresh attempts.
pub async fn clear_quarantine(context: &Context, asked: &Asked<'_>) -> Result<Quarantine, LifecycleError> {
    context.ensure_leader()?;
    let (instance, _, uid) = asked.through_ledger(context).await?;
    let key = instance.reference();
    let cleared = context.upgrades.change(&uid, &key, asked.tag, |_| Ok(None)).await?;
    let failed_target =
        instance.status.target.as_ref().is_some_and(|t| t.revision.tag == cleared.tag && t.failures > 0);
    if failed_target {
        context.upgrades.drop_target(&uid, &key).await?;
        let api = context.instances(asked.kind, &instance.namespace);
        let written = api
            .patch_status(
                &instance.name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"target": null}})),
            )
            .await
            .map_err(LifecycleError::kube(format!("clearing the failed target of {key}")))?;
        if written.data.pointer("/status/target").is_some_and(|t| !t.is_null()) {
            return Err(LifecycleError::NotDone(format!(
                "the failed target of {key} cannot be read back cleared"
            )));
        }
    }
    let note = asked.note(format!("cleared the quarantine of {} (it may be installed again)", cleared.tag));
    context.audit(asked.object, asked.kind, false, ("QuarantineCleared", &asked.caller), note).await;
    Ok(to_proto(&cleared))
}

/// Approves the upgrade awaiting approval when it is still exactly the one
/// `fingerprint` names (what the caller reviewed, from `Explain`); a stale
/// fingerprint is refused naming the step pending now.
pub async fn approve(
    context: &Context,
    asked: &Asked<'_>,
    fingerprint: &str,
) -> Result<vynil_proto::lifecycle::v1::ApproveUpgradeResponse, LifecycleError> {
    context.ensure_leader()?;
    let (instance, record, uid) = asked.through_ledger(context).await?;
    let key = instance.reference();
    let slot = crate::observe::job_slot(&instance, context).await?;
    let observed = crate::observe::observe(&instance, record, &slot, context).await?;
    let (from, to, pending) = match crate::install_plan::plan(&instance, &observed).outcome {
        Outcome::PendingApproval(step) => (step.from, step.to, step.fingerprint),
        other => {
            return Err(LifecycleError::Refused(format!(
                "{key} has no upgrade awaiting approval (now: {other:?}): nothing was approved"
            )));
        }
    };
    if pending != fingerprint {
        return Err(LifecycleError::Refused(format!(
            "{key}: the upgrade awaiting approval is now {from} → {to} (fingerprint {pending}); the step approved ({fingerprint:?}) changed since it was read: review this one (Explain) and approve it"
        )));
    }
    let at = vynil_crds::condition::rfc3339_seconds(jiff::Timestamp::now());
    let approval = Approval {
        fingerprint: pending.clone(),
        from: from.clone(),
        to: to.clone(),
        by: asked.caller.clone(),
        at,
    };
    context.upgrades.approve(&uid, &key, &approval).await?;
    let note = asked.note(format!("approved the upgrade {from} → {to} (fingerprint {pending})"));
    context.audit(asked.object, asked.kind, false, ("UpgradeApproved", &asked.caller), note).await;
    Ok(vynil_proto::lifecycle::v1::ApproveUpgradeResponse {
        from_tag: from,
        to_tag: to,
        fingerprint: pending,
    })
}

/// The instance `wanted` names, for an operator's request.
pub fn named(wanted: Option<InstanceRef>) -> Result<InstanceRef, LifecycleError> {
    wanted.ok_or_else(|| LifecycleError::Invalid("ref is required".into()))
}
