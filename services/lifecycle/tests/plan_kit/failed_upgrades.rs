//! A failed upgrade, decided by the planner (`vynil_rules::upgrade`): out of
//! attempts, the revision is quarantined; the instance rolls back on its own
//! only when the failed runs applied nothing, else holds for an operator; a
//! newer revision goes ahead; a first install or an opted-out instance stays
//! failed as before.

use serde_json::{Value, json};
use vynil_crds::AgentTarget;
use vynil_lifecycle::{
    install_plan::{self, JobState, Observed, ObservedJob, Outcome, Plan, Step},
    upgrades::{PhasesBefore, UpgradeRecord},
};
use vynil_rules::upgrade::{Quarantined, Rollback};

use super::*;

/// The fingerprint an install of `tag` (no options) runs under.
fn fingerprint(tag: &str) -> String {
    fingerprint_of(&install_plan::plan(&fresh(), &observed(tag)))
}

fn job(uid: &str, tag: &str, state: JobState) -> ObservedJob {
    ObservedJob { uid: uid.into(), fingerprint: Some(fingerprint(tag)), state }
}

/// 0.2.0 installed; the upgrade to `target` began at 11:00 and failed `failures` times (the last Job `j<failures>`).
fn upgrading(
    target: &str,
    failures: u32,
    conditions: Value,
    annotations: Value,
) -> vynil_lifecycle::instance::Instance {
    let mut status = installed("0.2.0", &fingerprint("0.2.0"));
    let mut t = AgentTarget::default();
    t.revision.tag = target.into();
    t.revision.fingerprint = Some(fingerprint(target));
    t.failures = failures;
    t.failed_job = (failures > 0).then(|| format!("j{failures}"));
    t.last_failure = Some("the migration hook exited 1".into());
    t.retry_at = Some("2026-12-01T11:30:00Z".into());
    t.since = Some("2026-12-01T11:00:00Z".into());
    status["target"] = serde_json::to_value(t).unwrap();
    status["conditions"] = conditions;
    instance(annotations, Value::Null, status)
}

fn ready_before() -> Value {
    json!([{"type": "Ready", "status": "True", "message": "Installed succesfully", "generation": 1,
        "lastTransitionTime": "2026-11-30T10:00:00Z"}])
}

/// The third (last) attempt's Job failed just now; lifecycle saw no phase
/// condition when it created the upgrade's first Job.
fn third_failure(tag: &str) -> Observed {
    let mut seen = observed(tag);
    seen.job =
        Some(job("j3", tag, JobState::Failed("BackoffLimitExceeded: the migration hook exited 1".into())));
    seen.upgrades =
        UpgradeRecord::default().seeing(PhasesBefore { fingerprint: fingerprint(tag), seen: Vec::new() });
    seen
}

fn quarantine_of(plan: &Plan) -> Option<&Quarantined> {
    plan.steps.iter().find_map(|s| match s {
        Step::Quarantine(q) => Some(q.as_ref()),
        _ => None,
    })
}

fn ready(plan: &Plan) -> Option<(bool, String)> {
    plan.steps.iter().find_map(|s| match s {
        Step::Condition { condition_type, ok, message } if condition_type.as_str() == "Ready" => {
            Some((*ok, message.clone()))
        }
        _ => None,
    })
}

fn quarantined(rollback: Rollback) -> UpgradeRecord {
    UpgradeRecord::new(vec![Quarantined {
        tag: "0.3.0".into(),
        digest: None,
        from: "0.2.0".into(),
        reason: "the migration hook exited 1".into(),
        at: "2026-12-01T12:00:00Z".into(),
        rollback,
    }])
}

#[test]
fn an_upgrade_out_of_attempts_that_applied_nothing_is_quarantined_to_roll_back_on_its_own() {
    let plan = install_plan::plan(&upgrading("0.3.0", 2, ready_before(), json!({})), &third_failure("0.3.0"));
    let entry = quarantine_of(&plan).expect("a quarantine");
    assert_eq!((entry.tag.as_str(), entry.from.as_str()), ("0.3.0", "0.2.0"));
    assert_eq!(entry.rollback, Rollback::Automatic);
    assert!(entry.reason.contains("migration hook exited 1"), "{}", entry.reason);
    let (ok, message) = ready(&plan).unwrap();
    assert!(!ok && message.starts_with("[E_UPGRADE_ROLLED_BACK] 0.2.0 → 0.3.0 failed"), "{message}");
    assert!(creates_job(&plan).is_none(), "the rollback runs at the next reconcile, once recorded");
    assert!(
        plan.steps.iter().any(|s| matches!(s, Step::Event { reason: "UpgradeFailed", warning: true, .. }))
    );
}

#[test]
fn an_upgrade_whose_runs_applied_a_phase_or_whose_options_changed_holds_for_an_operator() {
    let applied = json!([{"type": "VitalApplied", "status": "True", "message": "vitals templates applied succesfully",
        "generation": 1, "lastTransitionTime": "2026-12-01T11:10:00Z"}]);
    let plan = install_plan::plan(&upgrading("0.3.0", 2, applied, json!({})), &third_failure("0.3.0"));
    match &quarantine_of(&plan).unwrap().rollback {
        Rollback::AwaitingOperator { why } => assert!(why.contains("VitalApplied"), "{why}"),
        other => panic!("{other:?}"),
    }
    let (_, message) = ready(&plan).unwrap();
    assert!(
        message.starts_with(
            "[E_UPGRADE_FAILED] 0.2.0 → 0.3.0: BackoffLimitExceeded: the migration hook exited 1"
        ),
        "{message}"
    );
    assert!(
        matches!(&plan.outcome, Outcome::Blocked(b) if b.code == Some("E_UPGRADE_FAILED")),
        "{:?}",
        plan.outcome
    );
    // A phase written before the upgrade began does not count; options changed since 0.2.0 ran do.
    let mut changed = upgrading("0.3.0", 2, ready_before(), json!({}));
    changed.status.digest = Some("another options hash".into());
    let plan = install_plan::plan(&changed, &third_failure("0.3.0"));
    assert!(
        matches!(&quarantine_of(&plan).unwrap().rollback, Rollback::AwaitingOperator { why } if why.contains("options changed"))
    );
}

#[test]
fn a_first_install_or_an_opted_out_instance_stays_failed_without_quarantine() {
    let mut seen = third_failure("0.3.0");
    seen.rollback = false;
    let plan = install_plan::plan(&upgrading("0.3.0", 2, ready_before(), json!({})), &seen);
    assert!(quarantine_of(&plan).is_none(), "{plan:?}");
    assert!(matches!(&plan.outcome, Outcome::Blocked(b) if b.code == Some("E_AGENT_FAILED")));
    let opted_out = upgrading("0.3.0", 2, ready_before(), json!({"vynil.solidite.fr/rollback": "false"}));
    assert!(opted_out.rollback_off);
    // A first install has nothing to go back to.
    let mut status = json!({});
    let mut t = AgentTarget::default();
    t.revision.tag = "0.3.0".into();
    t.revision.fingerprint = Some(fingerprint("0.3.0"));
    (t.failures, t.failed_job) = (2, Some("j2".into()));
    status["target"] = serde_json::to_value(t).unwrap();
    let first = instance(json!({}), Value::Null, status);
    let plan = install_plan::plan(&first, &third_failure("0.3.0"));
    assert!(quarantine_of(&plan).is_none() && creates_job(&plan).is_none(), "{plan:?}");
}

#[test]
fn a_quarantined_failure_rolls_back_with_a_job_for_the_revision_it_ran_then_rests() {
    let failed = upgrading("0.3.0", 3, ready_before(), json!({}));
    let mut seen = third_failure("0.3.0");
    // The catalog, held at the rollback's revision, answers 0.2.0.
    seen.resolution = observed("0.2.0").resolution;
    seen.upgrades = quarantined(Rollback::Automatic);
    let plan = install_plan::plan(&failed, &seen);
    assert_eq!(creates_job(&plan).as_deref(), Some("0.2.0"), "{plan:?}");
    assert!(plan.steps.contains(&Step::DeleteJob), "the failed Job is replaced");
    assert_eq!(plan.outcome, Outcome::RollingBack { failed: "0.3.0".into(), to: "0.2.0".into() });
    assert!(ready(&plan).unwrap().1.starts_with("[E_UPGRADE_ROLLED_BACK]"));
    let target = plan
        .steps
        .iter()
        .find_map(|s| match s {
            Step::RecordTarget(t) => Some(t.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!((target.failures, target.since.as_deref()), (0, Some("2026-12-01T12:00:00Z")));
    // Its Job runs: followed (not "up to date" though 0.2.0 is installed), then credited.
    let mut rolling = installed("0.2.0", &fingerprint("0.2.0"));
    rolling["target"] = serde_json::to_value(AgentTarget { job: "j".into(), ..target }).unwrap();
    let rolling = instance(json!({}), Value::Null, rolling);
    let mut seen = observed("0.2.0");
    seen.upgrades = quarantined(Rollback::Automatic);
    seen.job = Some(job("r1", "0.2.0", JobState::Running));
    assert!(matches!(install_plan::plan(&rolling, &seen).outcome, Outcome::Installing { .. }));
    seen.job = Some(job("r1", "0.2.0", JobState::Failed("exit 1".into())));
    assert!(
        matches!(install_plan::plan(&rolling, &seen).outcome, Outcome::Retrying { .. }),
        "a failed rollback is seen"
    );
    seen.job = Some(job("r1", "0.2.0", JobState::Succeeded));
    assert_eq!(install_plan::plan(&rolling, &seen).outcome, Outcome::Installed { tag: "0.2.0".into() });
    // At rest, with 0.3.0 quarantined, nothing runs.
    let rest = instance(json!({}), Value::Null, installed("0.2.0", &fingerprint("0.2.0")));
    seen.job = None;
    let plan = install_plan::plan(&rest, &seen);
    assert_eq!(plan.outcome, Outcome::UpToDate { tag: "0.2.0".into() });
}

#[test]
fn a_failure_awaiting_an_operator_holds_until_approved_and_a_newer_revision_goes_ahead() {
    let failed = upgrading("0.3.0", 3, ready_before(), json!({}));
    let mut seen = third_failure("0.3.0");
    seen.resolution = observed("0.2.0").resolution;
    seen.upgrades =
        quarantined(Rollback::AwaitingOperator { why: "the failed run applied VitalApplied".into() });
    let plan = install_plan::plan(&failed, &seen);
    assert!(creates_job(&plan).is_none(), "{plan:?}");
    assert!(
        !plan.steps.iter().any(|s| matches!(s, Step::RecordInstalled(_))),
        "the failure is not forgotten"
    );
    assert!(matches!(&plan.outcome, Outcome::Blocked(b) if b.code == Some("E_UPGRADE_FAILED")));
    seen.upgrades = quarantined(Rollback::Approved { by: "alice".into(), at: "2026-12-01T12:05:00Z".into() });
    assert_eq!(creates_job(&install_plan::plan(&failed, &seen)).as_deref(), Some("0.2.0"));
    // 0.3.1 published: it replaces the failed Job as any new revision does.
    seen.upgrades = quarantined(Rollback::AwaitingOperator { why: "x".into() });
    seen.resolution = observed("0.3.1").resolution;
    assert_eq!(creates_job(&install_plan::plan(&failed, &seen)).as_deref(), Some("0.3.1"));
}

#[test]
fn a_failure_whose_way_back_cannot_be_had_holds_saying_why_not_package_missing() {
    let failed = upgrading("0.3.0", 3, ready_before(), json!({}));
    let mut seen = third_failure("0.3.0");
    seen.resolution = install_plan::Resolution::NoMatch {
        excluded_by: "quarantined".into(),
        reason: "every tenant revision of apps/web is quarantined for this instance (0.3.0)".into(),
    };
    for (rollback, why) in [
        (Rollback::Automatic, "0.2.0 cannot be installed now: every tenant revision"),
        // Awaiting an operator, the way back is looked for once asked: the hold says the usual.
        (Rollback::AwaitingOperator { why: "x".into() }, "not rolled back on its own (x)"),
    ] {
        seen.upgrades = quarantined(rollback);
        let plan = install_plan::plan(&failed, &seen);
        assert!(creates_job(&plan).is_none(), "{plan:?}");
        let (ok, message) = ready(&plan).unwrap();
        assert!(!ok && message.starts_with("[E_UPGRADE_FAILED]"), "{message}");
        assert!(message.contains(why) && message.contains("clear-quarantine"), "{message}");
        assert!(
            !plan.steps.iter().any(|s| matches!(s, Step::Event { reason: "MissingPackage", .. })),
            "{plan:?}"
        );
    }
}

/// #65 item 10: "the failed runs applied nothing" is decided from what
/// lifecycle saw when it created the upgrade's first Job, never from the
/// agent's timestamps (its pod's clock, to the nanosecond). Seen with
/// upstream's agent 0.7.7: the previous Job's phase stamped
/// `…:00.167585170Z` counted against an upgrade begun at `…:00Z` on
/// lifecycle's clock; and an agent whose clock runs behind made a phase it
/// did write look older than the upgrade.
#[test]
fn what_a_failed_upgrade_wrote_is_told_from_what_lifecycle_saw_not_from_the_agents_clock() {
    let phase = |at: &str| {
        json!({"type": "VitalApplied", "status": "True", "message": "vitals templates applied succesfully",
            "generation": 1, "lastTransitionTime": at})
    };
    let before = |at: &str| {
        let instance = upgrading("0.3.0", 0, json!([phase(at)]), json!({}));
        PhasesBefore { fingerprint: fingerprint("0.3.0"), seen: instance.seen_phases() }
    };
    let failed = |seen_before: PhasesBefore| {
        let mut seen = third_failure("0.3.0");
        seen.upgrades = UpgradeRecord::default().seeing(seen_before);
        seen
    };
    // The previous Job wrote VitalApplied a fraction of a second after the
    // second the upgrade began (11:00:00Z); the failed runs wrote nothing.
    let untouched = upgrading("0.3.0", 2, json!([phase("2026-12-01T11:00:00.167585170Z")]), json!({}));
    let plan = install_plan::plan(&untouched, &failed(before("2026-12-01T11:00:00.167585170Z")));
    assert_eq!(
        quarantine_of(&plan).unwrap().rollback,
        Rollback::Automatic,
        "nothing was written: it rolls back"
    );
    // An agent whose clock runs an hour behind rewrote VitalApplied
    // (10:10, before the upgrade began at 11:00 on lifecycle's clock).
    let rewritten = upgrading("0.3.0", 2, json!([phase("2026-12-01T10:10:00.000000001Z")]), json!({}));
    let plan = install_plan::plan(&rewritten, &failed(before("2026-11-30T10:00:00Z")));
    match &quarantine_of(&plan).unwrap().rollback {
        Rollback::AwaitingOperator { why } => assert!(why.contains("VitalApplied"), "{why}"),
        other => panic!("a partial apply must hold for an operator: {other:?}"),
    }
    // The first Job of an upgrade records what lifecycle sees before it.
    let on_020 = instance(json!({}), Value::Null, installed("0.2.0", &fingerprint("0.2.0")));
    let started = install_plan::plan(&on_020, &observed("0.3.0"));
    let at = |wanted: fn(&Step) -> bool| started.steps.iter().position(wanted);
    let (recorded, created) =
        (at(|s| matches!(s, Step::RecordPhases(_))), at(|s| matches!(s, Step::CreateJob(_))));
    assert!(recorded.is_some() && recorded < created, "{:?}", started.steps);
    // Nothing seen before (a record lost): unknown, so it holds.
    let mut lost = third_failure("0.3.0");
    lost.upgrades = UpgradeRecord::default();
    let plan = install_plan::plan(&untouched, &lost);
    assert!(matches!(&quarantine_of(&plan).unwrap().rollback, Rollback::AwaitingOperator { .. }));
}
