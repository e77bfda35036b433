//! Upgrades wait for their maintenance windows and for the end of a freeze
//! (`vynil_rules::upgrade::window`), decided by the planner with an injected
//! clock: an upgrade not started waits; a first install, new options for
//! the same revision and a Job already started never do; a policy that does
//! not check holds the upgrade saying what to fix.

use serde_json::{Value, json};
use vynil_crds::{AgentTarget, MaintenanceWindow, UpgradeFreeze, UpgradePolicy};
use vynil_lifecycle::install_plan::{self, JobState, Observed, ObservedJob, Outcome, PolicyOf};

use super::*;

fn saturday_nights(freezes: Vec<UpgradeFreeze>) -> PolicyOf {
    let window = MaintenanceWindow {
        schedule: "0 2 * * 6".into(),
        zone: "Europe/Paris".into(),
        duration: "4h".into(),
    };
    PolicyOf {
        policy: UpgradePolicy { windows: vec![window], freezes, ..UpgradePolicy::default() },
        narrowing: Vec::new(),
        of: "JukeBox box".into(),
    }
}

/// 0.2.0 installed, the catalog answers `tag`, at `now`, under `policy`.
fn upgrade_at(tag: &str, now: &str, policy: PolicyOf) -> Observed {
    let mut seen = observed(tag);
    seen.now = now.parse().unwrap();
    seen.upgrade_policy = Some(policy);
    seen
}

fn on_020() -> vynil_lifecycle::instance::Instance {
    let fingerprint = fingerprint_of(&install_plan::plan(&fresh(), &observed("0.2.0")));
    instance(json!({}), Value::Null, installed("0.2.0", &fingerprint))
}

#[test]
fn an_upgrade_outside_its_window_waits_for_the_next_opening_and_starts_inside_it() {
    // Friday 2026-12-04 noon UTC; the window opens Saturday 02:00 in Paris (01:00Z).
    let plan =
        install_plan::plan(&on_020(), &upgrade_at("0.3.0", "2026-12-04T12:00:00Z", saturday_nights(vec![])));
    assert!(creates_job(&plan).is_none() && plan.steps.is_empty(), "{plan:?}");
    match &plan.outcome {
        Outcome::Waiting { to, until, why, .. } => {
            assert_eq!((to.as_str(), until.as_deref()), ("0.3.0", Some("2026-12-05T01:00:00Z")));
            assert!(
                why.contains("0.2.0 → 0.3.0")
                    && why.contains("JukeBox box")
                    && why.contains("next window opens"),
                "{why}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(plan.requeue, install_plan::REQUEUE, "13 h away: the idle requeue comes first");
    let soon =
        install_plan::plan(&on_020(), &upgrade_at("0.3.0", "2026-12-05T00:50:00Z", saturday_nights(vec![])));
    assert_eq!(soon.requeue, std::time::Duration::from_secs(600), "back when it opens");
    let inside =
        install_plan::plan(&on_020(), &upgrade_at("0.3.0", "2026-12-05T01:30:00Z", saturday_nights(vec![])));
    assert_eq!(creates_job(&inside).as_deref(), Some("0.3.0"));
}

#[test]
fn installs_new_options_and_a_job_already_started_never_wait() {
    let friday = "2026-12-04T12:00:00Z";
    assert_eq!(
        creates_job(&install_plan::plan(&fresh(), &upgrade_at("0.3.0", friday, saturday_nights(vec![]))))
            .as_deref(),
        Some("0.3.0")
    );
    let mut reconfigured = on_020();
    reconfigured.options = serde_json::from_value(json!({"replicas": 2})).unwrap();
    assert_eq!(
        creates_job(&install_plan::plan(
            &reconfigured,
            &upgrade_at("0.2.0", friday, saturday_nights(vec![]))
        ))
        .as_deref(),
        Some("0.2.0")
    );
    // Started inside the window, followed after it closed.
    let fingerprint = fingerprint_of(&install_plan::plan(&fresh(), &observed("0.3.0")));
    let mut status = installed("0.2.0", "f0");
    let mut target = AgentTarget::default();
    (target.revision.tag, target.revision.fingerprint) = ("0.3.0".into(), Some(fingerprint.clone()));
    status["target"] = serde_json::to_value(target).unwrap();
    let running = instance(json!({}), Value::Null, status);
    let mut seen = upgrade_at("0.3.0", "2026-12-05T06:30:00Z", saturday_nights(vec![]));
    seen.job =
        Some(ObservedJob { uid: "j".into(), fingerprint: Some(fingerprint), state: JobState::Running });
    assert!(matches!(install_plan::plan(&running, &seen).outcome, Outcome::Installing { .. }));
}

#[test]
fn a_freeze_holds_an_upgrade_inside_a_window_and_a_bad_policy_says_what_to_fix() {
    let freeze = UpgradeFreeze {
        from: "2026-12-01T00:00:00Z".into(),
        until: "2026-12-10T00:00:00Z".into(),
        reason: "audit".into(),
    };
    let plan = install_plan::plan(
        &on_020(),
        &upgrade_at("0.3.0", "2026-12-05T01:30:00Z", saturday_nights(vec![freeze])),
    );
    match &plan.outcome {
        // The first Saturday window after the freeze: 2026-12-12 02:00 Paris.
        Outcome::Waiting { until, why, .. } => {
            assert_eq!(until.as_deref(), Some("2026-12-12T01:00:00Z"));
            assert!(why.contains("frozen until 2026-12-10T00:00:00Z (audit)"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    let mut bad = saturday_nights(vec![]);
    bad.policy.windows[0].zone = "Europe/Pariss".into();
    let plan = install_plan::plan(&on_020(), &upgrade_at("0.3.0", "2026-12-05T01:30:00Z", bad));
    assert!(creates_job(&plan).is_none());
    match &plan.outcome {
        Outcome::Blocked(b) => {
            assert_eq!(b.code, Some("E_UPGRADE_POLICY"));
            assert!(
                b.message.contains("Europe/Pariss") && b.message.contains("IANA zone name"),
                "{}",
                b.message
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_paris_window_opens_once_on_the_spring_forward_and_fall_back_days() {
    // 02:30 local, daily: in the gap on 2026-03-29 (it opens at 03:00 CEST, 01:00Z),
    // in the overlap on 2026-10-25 (first pass, 00:30Z).
    let window = MaintenanceWindow {
        schedule: "30 2 * * *".into(),
        zone: "Europe/Paris".into(),
        duration: "1h".into(),
    };
    let policy = PolicyOf {
        policy: UpgradePolicy { windows: vec![window], ..UpgradePolicy::default() },
        narrowing: Vec::new(),
        of: "the instance".into(),
    };
    for (before, opens) in
        [("2026-03-29T00:59:59Z", "2026-03-29T01:00:00Z"), ("2026-10-25T00:29:59Z", "2026-10-25T00:30:00Z")]
    {
        let waiting = install_plan::plan(&on_020(), &upgrade_at("0.3.0", before, policy.clone()));
        assert!(
            matches!(&waiting.outcome, Outcome::Waiting { until: Some(u), .. } if u == opens),
            "{:?}",
            waiting.outcome
        );
        assert!(
            creates_job(&install_plan::plan(&on_020(), &upgrade_at("0.3.0", opens, policy.clone())))
                .is_some()
        );
    }
    // After the first pass closes (01:30Z on 2026-10-25, 02:30 CET), the second 02:30 does not reopen it.
    let second_pass = install_plan::plan(&on_020(), &upgrade_at("0.3.0", "2026-10-25T01:45:00Z", policy));
    assert!(
        matches!(&second_pass.outcome, Outcome::Waiting { until: Some(u), .. } if u == "2026-10-26T01:30:00Z"),
        "{:?}",
        second_pass.outcome
    );
}

fn manual() -> PolicyOf {
    let policy =
        UpgradePolicy { approval: Some(vynil_crds::ApprovalMode::Manual), ..UpgradePolicy::default() };
    PolicyOf { policy, narrowing: Vec::new(), of: "JukeBox box".into() }
}

#[test]
fn a_manual_upgrade_waits_for_an_approval_of_exactly_its_step() {
    let now = "2026-12-04T12:00:00Z";
    let plan = install_plan::plan(&on_020(), &upgrade_at("0.3.0", now, manual()));
    assert!(creates_job(&plan).is_none() && plan.steps.is_empty(), "{plan:?}");
    let Outcome::PendingApproval(step) = plan.outcome else { panic!("{:?}", plan.outcome) };
    let install_plan::PendingStep { from, to, fingerprint, options_hash, why } = *step;
    assert_eq!((from.as_str(), to.as_str()), ("0.2.0", "0.3.0"));
    assert_eq!(
        fingerprint,
        fingerprint_of(&install_plan::plan(&fresh(), &observed("0.3.0"))),
        "the step's own fingerprint"
    );
    assert!(
        why.contains(&fingerprint) && why.contains(&options_hash) && why.contains("0.2.0 → 0.3.0"),
        "{why}"
    );
    let approval = |fingerprint: &str| vynil_lifecycle::upgrades::Approval {
        fingerprint: fingerprint.into(),
        from: "0.2.0".into(),
        to: "0.3.0".into(),
        by: "alice".into(),
        at: now.into(),
    };
    let mut approved = upgrade_at("0.3.0", now, manual());
    approved.upgrades = Default::default();
    approved.upgrades = approved.upgrades.approving(vec![approval(&fingerprint)]);
    assert_eq!(creates_job(&install_plan::plan(&on_020(), &approved)).as_deref(), Some("0.3.0"));
    // The catalog moved on (0.3.1): the approval of 0.3.0's step lapses.
    let mut moved = upgrade_at("0.3.1", now, manual());
    moved.upgrades = moved.upgrades.approving(vec![approval(&fingerprint)]);
    let plan = install_plan::plan(&on_020(), &moved);
    assert!(
        matches!(&plan.outcome, Outcome::PendingApproval(step) if step.to == "0.3.1"),
        "{:?}",
        plan.outcome
    );
    // Approved, it still waits for its window; a first install needs no approval.
    let mut windowed = saturday_nights(vec![]);
    windowed.policy.approval = Some(vynil_crds::ApprovalMode::Manual);
    let mut approved_outside = upgrade_at("0.3.0", now, windowed);
    approved_outside.upgrades = approved_outside.upgrades.approving(vec![approval(&fingerprint)]);
    assert!(matches!(install_plan::plan(&on_020(), &approved_outside).outcome, Outcome::Waiting { .. }));
    assert_eq!(
        creates_job(&install_plan::plan(&fresh(), &upgrade_at("0.3.0", now, manual()))).as_deref(),
        Some("0.3.0")
    );
}

/// #65 item 2, the attack: a tenant sets `vynil.solidite.fr/force-reinstall`
/// on its instance to start an upgrade at once, past its approval, window,
/// freeze and waves. A forced run of another revision than the installed one
/// meets every gate (the annotation stays until it may run); a forced re-run
/// of the installed revision runs at once (upstream's `kubectl-vynil upgrade`).
#[test]
fn a_forced_run_of_another_revision_meets_every_gate_and_of_the_installed_one_runs_at_once() {
    let fingerprint = fingerprint_of(&install_plan::plan(&fresh(), &observed("0.2.0")));
    let forced = instance(
        json!({"vynil.solidite.fr/force-reinstall": "now"}),
        Value::Null,
        installed("0.2.0", &fingerprint),
    );
    let friday_noon = "2026-12-04T12:00:00Z";
    let pending = install_plan::plan(&forced, &upgrade_at("0.3.0", friday_noon, manual()));
    assert!(creates_job(&pending).is_none(), "{pending:?}");
    assert!(matches!(pending.outcome, Outcome::PendingApproval(_)), "{:?}", pending.outcome);
    assert!(pending.steps.is_empty(), "the annotation stays until the upgrade may run: {:?}", pending.steps);
    let outside = install_plan::plan(&forced, &upgrade_at("0.3.0", friday_noon, saturday_nights(vec![])));
    assert!(creates_job(&outside).is_none(), "{outside:?}");
    assert!(matches!(outside.outcome, Outcome::Waiting { .. }), "{:?}", outside.outcome);
    // Inside its window, the forced upgrade runs (and the annotation goes).
    let inside =
        install_plan::plan(&forced, &upgrade_at("0.3.0", "2026-12-05T02:00:00Z", saturday_nights(vec![])));
    assert_eq!(creates_job(&inside).as_deref(), Some("0.3.0"));
    // The installed revision, forced: at once, whatever the policy.
    let rerun = install_plan::plan(&forced, &upgrade_at("0.2.0", friday_noon, manual()));
    assert_eq!(creates_job(&rerun).as_deref(), Some("0.2.0"), "{rerun:?}");
}
