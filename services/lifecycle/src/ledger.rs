//! Where an instance stands — the revision installed, the agent Job started
//! — read from lifecycle's own record, never from the status (#65 item 3).
//!
//! A tenant who may write its instance's status wrote the pending upgrade's
//! fingerprint (Explain shows it) as the started target, and the upgrade ran
//! with no approval; it cleared `status.tag`, and an upgrade became a first
//! install (no gate, no waypoint). So the upgrade record (`crate::upgrades`,
//! in the control plane's namespace) holds the revision credited and the
//! target started, and the planner reads the instance through it
//! ([`Instance::per_ledger`]); `status.package` and `status.target` are
//! display copies.
//!
//! An instance lifecycle meets without a record is adopted from its status
//! once — the takeover of what upstream's operator (or a release of ours
//! that kept no record) installed — and only if it was created before
//! lifecycle first ran here ([`crate::upgrades::Upgrades::taken_over_at`]):
//! the API server sets `creationTimestamp`, so no instance a tenant creates
//! afterwards is adopted, whatever status it writes. The first meeting is
//! recorded, so what a tenant writes after it changes nothing. A record a
//! previous release wrote (or rewrote, beside this one during a rolling
//! update: it keeps only the keys it knows) holds no ledger: its instance is
//! adopted from its status once more, which that release kept.

use crate::{
    LifecycleError,
    context::Context,
    instance::{Instance, Ledger},
    upgrades::UpgradeRecord,
};

/// Whether a first meeting is recorded (a reconcile) or only read (Explain).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Meeting {
    Record,
    ReadOnly,
}

/// `instance` as its record says it stands, with the record.
pub async fn read(
    instance: Instance,
    context: &Context,
    meeting: Meeting,
) -> Result<(Instance, UpgradeRecord), LifecycleError> {
    let Some(uid) = instance.uid.clone() else {
        return Ok((instance.per_ledger(&Ledger::default()), UpgradeRecord::default()));
    };
    let record = context.upgrades.read(&uid).await?;
    // Adopted from its status once: a record without a ledger (a previous
    // release's, whose status that release wrote), or no record at all for
    // an instance created before the takeover.
    let adoptable =
        !record.holds_ledger() && (record.exists() || created_before_takeover(&instance, context).await?);
    if !adoptable {
        // Met before, or created since the takeover: nothing to adopt.
        let instance = instance.per_ledger(&record.ledger);
        return Ok((instance, record));
    }
    let met = instance.ledger_shown();
    if meeting == Meeting::ReadOnly {
        let instance = instance.per_ledger(&met);
        return Ok((instance, record.with_ledger(met)));
    }
    context.upgrades.meet(&uid, &instance.reference(), met).await?;
    tracing::info!(
        target: "vynil::audit",
        reason = "LedgerAdopted",
        actor = "lifecycle (the takeover)",
        kind = %instance.kind,
        namespace = %instance.namespace,
        name = %instance.name,
        note = %format!("first met: installed {}", instance.status.tag.as_deref().unwrap_or("nothing")),
        "an instance's status adopted as its ledger, once"
    );
    let record = context.upgrades.read(&uid).await?;
    Ok((instance.per_ledger(&record.ledger), record))
}

/// Whether `instance` was created before lifecycle took the cluster over
/// (one created at the same second counts: the takeover time is to the second).
async fn created_before_takeover(instance: &Instance, context: &Context) -> Result<bool, LifecycleError> {
    let Some(created) = instance.created else { return Ok(false) };
    let at = context.upgrades.taken_over_at().await?;
    Ok(created.as_second() <= at.as_second())
}
