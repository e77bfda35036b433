//! The install decision's gates, in order: held, credited, a failed upgrade
//! held, resolved, options checked, init version, requirements, controller
//! values; then
//! what the desired revision asks of the agent Job. Each gate is a function
//! that either passes or answers the plan itself.

use vynil_rules::{
    install::Target,
    tag::is_newer,
    upgrade::{self, FailedUpgrade, Quarantined},
};

use super::{checks::*, *};

mod timing;
use timing::upgrade_timing;

/// Decides what to do with `instance` (not being deleted, read through its
/// ledger: `crate::ledger`) given `observed`: a sequence of gates, each of
/// which may answer the plan itself (held, credited, blocked), then what
/// the desired revision asks of the Job.
pub fn plan(instance: &Instance, observed: &Observed) -> Plan {
    let (Ok(plan) | Err(plan)) = gated(instance, observed);
    plan
}

/// The gates in order; `Err` is a gate's own answer.
fn gated(instance: &Instance, observed: &Observed) -> Result<Plan, Plan> {
    held(instance)?;
    credited(instance, observed)?;
    failed_upgrade_held(instance, observed)?;
    let (package, pull_secret) = resolved(instance, observed)?;
    let Some(checks) = &observed.checks else {
        // The reconciler always prepares a resolved package; say so rather than guess.
        return Err(Plan::blocked(
            Criterion::Package,
            None,
            "internal: no facts gathered".into(),
            RETRY_SHORT,
        ));
    };
    let (checked, mistyped) = checked_options(instance, checks)?;
    let (tag, digest) = init_version(observed, package)?;
    verified(observed, package, &tag)?;
    requirements_met(checks)?;
    let controller_values = controller_values(checks)?;
    let desired =
        Desired::new(instance, observed, (package, pull_secret), checks, (tag, digest), controller_values);
    let mut steps: Vec<Step> = mistyped.into_iter().collect();
    if let Some(plan) = after_failed_upgrade(&desired, observed, steps.clone(), &checked) {
        return Ok(plan);
    }
    steps.extend(forced_run_gated(&desired, observed)?);
    if let Some(outcome) = settled(&desired, observed, &mut steps, &checked) {
        return Ok(Plan { steps, outcome, requeue: REQUEUE });
    }
    Ok(follow_job(&desired, observed, steps, &checked))
}

/// Upstream's own control plane is never touched; a suspended instance waits.
fn held(instance: &Instance) -> Result<(), Plan> {
    if instance.is_upstream_control_plane() {
        return Err(control_plane_held(false));
    }
    if instance.suspended {
        return Err(Plan { steps: Vec::new(), outcome: Outcome::Suspended, requeue: REQUEUE });
    }
    Ok(())
}

/// A Job that completed for the recorded target is credited with exactly
/// that target, whatever the catalog says now (a first install from
/// `initFrom.version`, a revision purged since).
fn credited(instance: &Instance, observed: &Observed) -> Result<(), Plan> {
    if let (Some(target), Some(job)) = (&instance.status.target, &observed.job)
        && job.state == JobState::Succeeded
        && target.revision.fingerprint.is_some()
        && job.fingerprint == target.revision.fingerprint
    {
        let tag = target.revision.tag.clone();
        return Err(Plan {
            steps: vec![installed(instance, target.revision.clone(), observed.now)],
            outcome: Outcome::Installed { tag },
            requeue: REQUEUE,
        });
    }
    Ok(())
}

/// What the instance should run once every gate passed: the revision with
/// its options, as status records it and as the agent Job asks for it.
struct Desired<'a> {
    instance: &'a Instance,
    now: jiff::Timestamp,
    tag: String,
    options_hash: String,
    fingerprint: String,
    revision: InstalledPackage,
    request: JobRequest,
}

impl<'a> Desired<'a> {
    fn new(
        instance: &'a Instance,
        observed: &Observed,
        (package, pull_secret): (&Package, &Option<String>),
        checks: &RevisionChecks,
        (tag, digest): (String, Option<String>),
        controller_values: String,
    ) -> Self {
        let options_hash = install::options_hash(instance.options.as_ref());
        let target = Target {
            registry: &package.registry,
            image: &package.image,
            tag: &tag,
            digest: digest.as_deref(),
        };
        let fingerprint = install::fingerprint_with_agent(
            &target,
            &options_hash,
            &controller_values,
            &checks.recommended,
            observed.reruns.agent_image.as_deref(),
        );
        let revision = InstalledPackage {
            registry: package.registry.clone(),
            image: package.image.clone(),
            tag: tag.clone(),
            digest: digest.clone(),
            package_type: package.package_type().as_str().into(),
            fingerprint: Some(fingerprint.clone()),
            pull_secret: pull_secret.clone(),
            controller_values: Some(controller_values.clone()),
            installed_at: None,
            history: Vec::new(),
            adopted: instance.upstream_installed(),
        };
        let request = JobRequest {
            registry: package.registry.clone(),
            image: package.image.clone(),
            tag: tag.clone(),
            digest: digest.clone(),
            pull_secret: pull_secret.clone(),
            options_hash: options_hash.clone(),
            controller_values,
            recommended: checks.recommended.clone(),
            fingerprint: fingerprint.clone(),
        };
        Self { instance, now: observed.now, tag, options_hash, fingerprint, revision, request }
    }

    /// The revision this is an upgrade from: the installed one, when it is
    /// another (`None`: a first install, or the same revision again).
    fn upgrade_from(&self) -> Option<&'a str> {
        self.instance.installed_tag().filter(|from| *from != self.tag)
    }

    fn installing(&self) -> Outcome {
        Outcome::Installing { from: self.instance.status.tag.clone(), to: self.tag.clone() }
    }

    /// Starts the agent Job for the desired revision (replacing the one
    /// there), keeping the failures counted so far when given.
    fn start(
        &self,
        steps: &mut Vec<Step>,
        replace: bool,
        failures: Option<&AgentTarget>,
        checked: &CheckedOptions,
    ) {
        let (instance, tag) = (self.instance, &self.tag);
        if replace {
            steps.push(Step::DeleteJob);
        }
        let target = match failures {
            Some(kept) => AgentTarget { revision: self.revision.clone(), job: String::new(), ..kept.clone() },
            None => AgentTarget {
                revision: self.revision.clone(),
                since: Some(vynil_crds::condition::rfc3339_seconds(self.now)),
                ..AgentTarget::default()
            },
        };
        steps.push(Step::RecordTarget(target));
        if self.upgrade_from().is_some() && failures.is_none() {
            // What the failed runs write is told from this, never from the agent's clock.
            let seen = instance.seen_phases();
            steps.push(Step::RecordPhases(crate::upgrades::PhasesBefore {
                fingerprint: self.fingerprint.clone(),
                seen,
            }));
        }
        if !checked.dropped.is_empty() {
            steps.push(event_warning(
                "UndeclaredOptions",
                format!(
                    "options not declared by {}/{} {tag} are ignored: {}",
                    instance.category,
                    instance.package,
                    checked.dropped.join(", ")
                ),
            ));
        }
        steps.push(Step::CreateJob(Box::new(self.request.clone())));
        steps.push(Step::Condition {
            condition_type: ConditionType::AgentStarted,
            ok: true,
            message: format!("Agent started for {}/{} {tag}", instance.category, instance.package),
        });
        let doing =
            if instance.status.tag.is_some() { "upgrading or reconfiguring to" } else { "installing" };
        steps.push(Step::Event { warning: false, reason: "AgentStarted", note: format!("{doing} {tag}") });
    }
}

/// A forced run (`vynil.solidite.fr/force-reinstall`, which a tenant may
/// set) of another revision than the installed one is an upgrade like any
/// other: it waits for its approval, windows, freezes and waves, the
/// annotation staying until it may run. Only a forced re-run of the
/// installed revision starts at once (upstream's `kubectl-vynil upgrade`).
fn forced_run_gated(desired: &Desired, observed: &Observed) -> Result<Vec<Step>, Plan> {
    if !desired.instance.force_reinstall {
        return Ok(Vec::new());
    }
    upgrade_timing(desired, observed)
}

/// The cases that need no Job's answer: a forced reinstall, a deleted Job
/// to recreate, a revision already installed, one upstream installed.
fn settled(
    desired: &Desired,
    observed: &Observed,
    steps: &mut Vec<Step>,
    checked: &CheckedOptions,
) -> Option<Outcome> {
    let (instance, tag, fingerprint) = (desired.instance, &desired.tag, desired.fingerprint.as_str());
    let status = &instance.status;
    if instance.force_reinstall {
        steps.push(Step::RemoveForceReinstall);
        desired.start(steps, observed.job.is_some(), None, checked);
        return Some(desired.installing());
    }
    let installed_fingerprint = status.package.as_ref().and_then(|p| p.fingerprint.as_deref());
    let recreate = observed.reruns.recreate_deleted_jobs && observed.job.is_none();
    if installed_fingerprint == Some(fingerprint) && recreate && status.target.is_none() {
        steps.push(Step::Event {
            warning: false,
            reason: "RecreateDeletedJob",
            note: "the agent Job was deleted: running it again (--recreate-deleted-jobs)".into(),
        });
        desired.start(steps, false, None, checked);
        return Some(desired.installing());
    }
    let rerun_in_flight =
        status.target.as_ref().is_some_and(|t| t.revision.fingerprint.as_deref() == Some(fingerprint))
            && observed.job.as_ref().is_some_and(|j| {
                j.fingerprint.as_deref() == Some(fingerprint) && j.state != JobState::Succeeded
            });
    if installed_fingerprint == Some(fingerprint) && !rerun_in_flight {
        if status.target.is_some() {
            // A target left by a run that was superseded: the installed revision is current.
            steps.push(installed(instance, desired.revision.clone(), observed.now));
        } else if let Some(package) = status.package.clone().filter(|_| instance.shown_lags()) {
            // The status's copy lags the ledger (its write failed): shown again.
            steps.push(Step::RecordInstalled(package));
        }
        return Some(Outcome::UpToDate { tag: tag.clone() });
    }
    if status.package.is_none()
        && status.target.is_none()
        && status.tag.as_deref() == Some(tag.as_str())
        && status.digest.as_deref() == Some(desired.options_hash.as_str())
    {
        steps.push(installed(instance, desired.revision.clone(), observed.now));
        steps.push(Step::Event {
            warning: false,
            reason: "Adopted",
            note: format!("installed by upstream's operator as {tag}; adopted without running the agent"),
        });
        return Some(Outcome::Adopted { tag: tag.clone() });
    }
    None
}

/// What the agent Job of the desired revision says: running, done, failed
/// (retried within the attempts, else held), absent or of another revision.
fn follow_job(
    desired: &Desired,
    observed: &Observed,
    mut steps: Vec<Step>,
    checked: &CheckedOptions,
) -> Plan {
    let (instance, tag) = (desired.instance, &desired.tag);
    let recorded = instance
        .status
        .target
        .as_ref()
        .filter(|t| t.revision.fingerprint.as_deref() == Some(desired.fingerprint.as_str()));
    let started = recorded.is_some()
        || observed
            .job
            .as_ref()
            .is_some_and(|j| j.fingerprint.as_deref() == Some(desired.fingerprint.as_str()));
    if !started {
        match upgrade_timing(desired, observed) {
            Ok(audited) => steps.extend(audited),
            Err(plan) => return plan,
        }
    }
    let installing = Plan { steps: Vec::new(), outcome: desired.installing(), requeue: REQUEUE };
    let with = |steps: Vec<Step>| Plan { steps, ..installing.clone() };
    match &observed.job {
        Some(job) if job.fingerprint.as_deref() == Some(desired.fingerprint.as_str()) => match &job.state {
            JobState::Running => {
                if recorded.is_none() {
                    let revision = desired.revision.clone();
                    steps.push(Step::RecordTarget(AgentTarget { revision, ..AgentTarget::default() }));
                }
                with(steps)
            }
            JobState::Succeeded => {
                steps.push(installed(instance, desired.revision.clone(), observed.now));
                steps.push(Step::Condition {
                    condition_type: ConditionType::AgentStarted,
                    ok: true,
                    message: format!("Agent finished for {}/{} {tag}", instance.category, instance.package),
                });
                Plan { steps, outcome: Outcome::Installed { tag: tag.clone() }, requeue: REQUEUE }
            }
            JobState::Failed(reason) => {
                let now = observed.now;
                match account_failure(
                    recorded,
                    desired.revision.clone(),
                    job,
                    reason,
                    now,
                    observed.max_attempts,
                ) {
                    FailedJob::Due(target) => {
                        desired.start(&mut steps, true, Some(&target), checked);
                        with(steps)
                    }
                    FailedJob::Wait(target) if target.failures >= observed.max_attempts => {
                        match quarantined_upgrade(desired, observed, steps.clone(), &target) {
                            Some(plan) => plan,
                            None => failed(steps, target, &INSTALL_FAILURE, now, observed.max_attempts, tag),
                        }
                    }
                    FailedJob::Wait(target) => {
                        failed(steps, target, &INSTALL_FAILURE, now, observed.max_attempts, tag)
                    }
                }
            }
        },
        Some(_) => {
            desired.start(&mut steps, true, None, checked);
            with(steps)
        }
        None => {
            desired.start(&mut steps, false, recorded, checked);
            with(steps)
        }
    }
}

/// An upgrade out of attempts (`vynil_rules::upgrade`): its revision is
/// quarantined for the instance, which rolls back at the next reconcile
/// when the failed runs applied nothing, else holds for an operator. `None`
/// when it was no upgrade (a first install, new options for the same
/// revision) or rollback is off: it stays failed.
fn quarantined_upgrade(
    desired: &Desired,
    observed: &Observed,
    mut steps: Vec<Step>,
    target: &AgentTarget,
) -> Option<Plan> {
    let instance = desired.instance;
    let from = desired.upgrade_from()?;
    if !observed.rollback {
        return None;
    }
    let before = observed.upgrades.phases_before(&desired.fingerprint);
    let reason = target.last_failure.as_deref().unwrap_or("the Job failed");
    let failed = FailedUpgrade {
        from,
        to: &desired.tag,
        reason,
        phases_written: upgrade::phases_written(before, &instance.seen_phases()),
        options_changed: instance.status.digest.as_deref() != Some(desired.options_hash.as_str()),
    };
    let entry = Quarantined {
        tag: desired.tag.clone(),
        digest: desired.revision.digest.clone(),
        from: from.to_string(),
        reason: reason.to_string(),
        at: vynil_crds::condition::rfc3339_seconds(observed.now),
        rollback: upgrade::rollback_for(&failed, true),
    };
    let message = entry.message();
    let (code, requeue) = if entry.rollback.may_run() {
        (upgrade::UPGRADE_ROLLED_BACK, std::time::Duration::from_secs(1))
    } else {
        (upgrade::UPGRADE_FAILED, REQUEUE)
    };
    steps.push(Step::RecordTarget(target.clone()));
    steps.push(Step::Quarantine(Box::new(entry)));
    steps.push(event_warning("UpgradeFailed", message.clone()));
    steps.push(Step::Condition { condition_type: ConditionType::Ready, ok: false, message: message.clone() });
    let blocker = Blocker { criterion: Criterion::Upgrade, code: Some(code), message };
    Some(Plan { steps, outcome: Outcome::Blocked(blocker), requeue })
}

/// The `[E_UPGRADE_FAILED]` hold: `Ready=False`, no Job.
fn upgrade_held(message: String, mut steps: Vec<Step>) -> Plan {
    steps.push(Step::Condition { condition_type: ConditionType::Ready, ok: false, message: message.clone() });
    let blocker = Blocker { criterion: Criterion::Upgrade, code: Some(upgrade::UPGRADE_FAILED), message };
    Plan { steps, outcome: Outcome::Blocked(blocker), requeue: REQUEUE }
}

/// While the instance's state is a failed upgrade quarantined for it, it
/// holds for an operator, or when the revision to go back to cannot be had
/// (the catalog's reason is said); a revision newer than the failed one
/// goes ahead as any new revision does, and a rollback that may run is
/// [`after_failed_upgrade`]'s.
fn failed_upgrade_held(instance: &Instance, observed: &Observed) -> Result<(), Plan> {
    let Some(quarantined) = observed.upgrades.of_failed_target(instance) else {
        return Ok(());
    };
    let message = match &observed.resolution {
        Resolution::Package { package, .. } if is_newer(&package.tag, &quarantined.tag) => return Ok(()),
        Resolution::Package { .. } if quarantined.rollback.may_run() => return Ok(()),
        Resolution::NoMatch { reason, .. } if quarantined.rollback.may_run() => {
            quarantined.no_way_back(reason)
        }
        // Held for an operator: the way back is looked for once asked (`observe`).
        Resolution::Package { .. } | Resolution::NoMatch { .. } => quarantined.message(),
        // The JukeBox gate, or the confirmation, says it.
        Resolution::JukeboxMissing | Resolution::Unconfirmed { .. } => return Ok(()),
    };
    Err(upgrade_held(message, Vec::new()))
}

/// While the instance's state is a failed upgrade quarantined for it: the
/// rollback when it may run and the desired revision is where it goes
/// (its Job replaces the failed one), else a hold for an operator. A
/// revision newer than the failed one goes ahead as any new revision does.
fn after_failed_upgrade(
    desired: &Desired,
    observed: &Observed,
    mut steps: Vec<Step>,
    checked: &CheckedOptions,
) -> Option<Plan> {
    let quarantined = observed.upgrades.of_failed_target(desired.instance)?;
    if is_newer(&desired.tag, &quarantined.tag) {
        return None;
    }
    let message = quarantined.message();
    if quarantined.rollback.may_run() && desired.tag == quarantined.from {
        let note = format!(
            "{} → {} failed: rolling back to {}",
            quarantined.from, quarantined.tag, quarantined.from
        );
        steps.push(event_warning("UpgradeRolledBack", note));
        desired.start(&mut steps, observed.job.is_some(), None, checked);
        steps.push(Step::Condition { condition_type: ConditionType::Ready, ok: false, message });
        let outcome = Outcome::RollingBack { failed: quarantined.tag.clone(), to: quarantined.from.clone() };
        return Some(Plan { steps, outcome, requeue: REQUEUE });
    }
    Some(upgrade_held(message, steps))
}
