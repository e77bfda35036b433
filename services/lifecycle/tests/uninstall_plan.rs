//! The deletion planner as named scenarios (`docs/upstream-vynil.md` §9 items
//! 22–25, upstream #12 C and #15): each gives an instance being deleted and
//! what was observed, and checks the steps, the outcome and the retry.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use kube::api::DynamicObject;
use serde_json::{Value, json};
use vynil_lifecycle::{
    install_plan::{JobRequest, JobState, ObservedJob, Outcome, Plan, Step},
    instance::{Instance, InstanceKind},
    uninstall_plan::{
        CleanupAnswer, CleanupObserved, Gone, Hatch, cleanup, gone_backoff, reaper_fingerprint,
    },
};
use vynil_rules::install::Recommended;

fn deleting(annotations: Value, status: Value) -> Instance {
    let object = json!({
        "apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
        "metadata": {"name": "web", "namespace": "apps", "uid": "u1", "generation": 2,
            "deletionTimestamp": "2026-12-01T12:00:00Z", "annotations": annotations},
        "spec": {"jukebox": "box", "category": "think", "package": "ollama"},
        "status": status,
    });
    let object: DynamicObject = serde_json::from_value(object).unwrap();
    Instance::decode(InstanceKind::Tenant, &object).unwrap()
}

fn with_children() -> Value {
    json!({"tag": "0.1.8", "vitals": [{"kind": "Deployment", "name": "ollama"}]})
}

fn request(tag: &str) -> JobRequest {
    JobRequest {
        registry: "registry.example".into(),
        image: "think/ollama".into(),
        tag: tag.into(),
        digest: None,
        pull_secret: None,
        options_hash: "h".into(),
        controller_values: "{}".into(),
        recommended: Recommended::default(),
        fingerprint: format!("delete-{tag}"),
    }
}

fn observed(answer: CleanupAnswer) -> CleanupObserved {
    CleanupObserved {
        answer,
        unverified: None,
        hatch: Hatch::NotAsked,
        job: None,
        report: None,
        now: "2026-12-01T12:00:00Z".parse().unwrap(),
        max_attempts: 3,
    }
}

fn job(fingerprint: &str, state: JobState) -> Option<ObservedJob> {
    Some(ObservedJob { uid: "j1".into(), fingerprint: Some(fingerprint.into()), state })
}

fn condition(plan: &Plan) -> Option<(&'static str, bool, String)> {
    plan.steps.iter().find_map(|s| match s {
        Step::Condition { condition_type, ok, message } => {
            Some((condition_type.as_str(), *ok, message.clone()))
        }
        _ => None,
    })
}

#[test]
fn item_22_nothing_recorded_to_undo_releases_at_once_without_a_job() {
    let plan = cleanup(&deleting(json!({}), json!({})), &observed(CleanupAnswer::NothingToDelete));
    assert_eq!(plan.outcome, Outcome::Released);
    assert!(!plan.steps.iter().any(|s| matches!(s, Step::CreateDeleteJob(_) | Step::CreateReaperJob { .. })));
}

#[test]
fn item_23_a_delete_job_runs_the_chosen_revision_and_the_finalizer_goes_when_it_completes() {
    let instance = deleting(json!({}), with_children());
    let plan = cleanup(&instance, &observed(CleanupAnswer::Revision(Box::new(request("0.1.8")))));
    let created = plan.steps.iter().find_map(|s| match s {
        Step::CreateDeleteJob(r) => Some(r.tag.clone()),
        _ => None,
    });
    assert_eq!(created.as_deref(), Some("0.1.8"));
    assert!(matches!(plan.outcome, Outcome::Deleting { .. }));
    // An install Job still there goes first.
    let mut seen = observed(CleanupAnswer::Revision(Box::new(request("0.1.8"))));
    seen.job = Some(ObservedJob { uid: "i".into(), fingerprint: None, state: JobState::Succeeded });
    let plan = cleanup(&instance, &seen);
    assert_eq!(plan.steps.first(), Some(&Step::DeleteJob));
    // Running: wait. Complete: the Job goes, then the finalizer.
    seen.job = job("delete-0.1.8", JobState::Running);
    let plan = cleanup(&instance, &seen);
    assert!(plan.steps.is_empty() && matches!(plan.outcome, Outcome::Deleting { .. }), "{plan:?}");
    seen.job = job("delete-0.1.8", JobState::Succeeded);
    let plan = cleanup(&instance, &seen);
    assert_eq!((plan.steps.as_slice(), &plan.outcome), (&[Step::DeleteJob][..], &Outcome::Released));
}

#[test]
fn an_unverified_revision_still_runs_its_delete_job_with_a_warning() {
    let instance = deleting(json!({}), with_children());
    let mut seen = observed(CleanupAnswer::Revision(Box::new(request("0.1.8"))));
    seen.unverified = Some("[E_UNVERIFIED] deleting with 0.1.8 (signed by an untrusted key)".into());
    let plan = cleanup(&instance, &seen);
    let warned = plan.steps.iter().position(|s| {
        matches!(s, Step::Event { warning: true, reason: "UnverifiedRevision", note } if note.contains("untrusted"))
    });
    let created = plan.steps.iter().position(|s| matches!(s, Step::CreateDeleteJob(r) if r.tag == "0.1.8"));
    assert!(warned.is_some() && created.is_some(), "{plan:?}");
    assert!(matches!(plan.outcome, Outcome::Deleting { .. }));
}

#[test]
fn item_25_a_failed_delete_job_is_reported_at_once_kept_and_replaced_after_backoff() {
    let mut seen = observed(CleanupAnswer::Revision(Box::new(request("0.1.8"))));
    seen.job = job("delete-0.1.8", JobState::Failed("BackoffLimitExceeded: hook failed".into()));
    let plan = cleanup(&deleting(json!({}), with_children()), &seen);
    let (kind, ok, message) = condition(&plan).unwrap();
    assert!(kind == "Ready" && !ok && message.contains("hook failed"), "{message}");
    assert!(!plan.steps.contains(&Step::DeleteJob), "kept for its logs");
    assert_eq!(plan.requeue, Duration::from_secs(60));
    // Counted; once due the Job is replaced.
    let target = plan
        .steps
        .iter()
        .find_map(|s| match s {
            Step::RecordTarget(t) => Some(t.clone()),
            _ => None,
        })
        .unwrap();
    let mut status = with_children();
    status["target"] = serde_json::to_value(&target).unwrap();
    seen.now = "2026-12-01T12:01:00Z".parse().unwrap();
    let plan = cleanup(&deleting(json!({}), status), &seen);
    assert!(plan.steps.contains(&Step::DeleteJob));
    assert!(plan.steps.iter().any(|s| matches!(s, Step::CreateDeleteJob(_))), "{plan:?}");
}

#[test]
fn upstream_12_c_package_gone_is_a_readable_condition_a_warning_and_a_doubling_retry() {
    let gone =
        CleanupAnswer::Gone { what: Gone::Package, message: "[E_PACKAGE_GONE] no tenant revision…".into() };
    let plan = cleanup(&deleting(json!({}), with_children()), &observed(gone.clone()));
    let (kind, ok, message) = condition(&plan).unwrap();
    assert!(kind == "Ready" && !ok && message.starts_with("[E_PACKAGE_GONE]"), "{message}");
    assert!(plan.steps.iter().any(|s| matches!(s, Step::Event { warning: true, reason: "PackageGone", .. })));
    assert_eq!(plan.requeue, Duration::from_secs(60));
    // The interval is the time the condition has said so: 1, 1, 2, 4 … minutes, at most an hour.
    let since = |minutes: i64| {
        let status = json!({"tag": "0.1.8", "vitals": [{"kind": "Deployment", "name": "ollama"}], "conditions": [
            {"type": "Ready", "status": "False", "message": "[E_PACKAGE_GONE] x", "generation": 2,
             "lastTransitionTime": "2026-12-01T12:00:00Z"}]});
        let now: jiff::Timestamp = "2026-12-01T12:00:00Z".parse::<jiff::Timestamp>().unwrap()
            + jiff::SignedDuration::from_mins(minutes);
        gone_backoff(&deleting(json!({}), status), now).as_secs()
    };
    let waits: Vec<u64> = [0, 1, 2, 4, 8, 600].into_iter().map(since).collect();
    assert_eq!(waits, [60, 60, 120, 240, 480, 3600]);
}

#[test]
fn a_wrong_delete_without_package_value_is_refused_in_the_condition() {
    let gone = CleanupAnswer::Gone { what: Gone::Package, message: "[E_PACKAGE_GONE] x".into() };
    let instance = deleting(json!({"vynil.solidite.fr/delete-without-package": "yes"}), with_children());
    let plan = cleanup(&instance, &observed(gone));
    let (_, _, message) = condition(&plan).unwrap();
    assert!(message.contains("only \"true\" is accepted"), "{message}");
    assert!(!plan.steps.iter().any(|s| matches!(s, Step::CreateReaperJob { .. })));
}

/// Security review item 3: the annotation (tenant-writable) asks, only an
/// admin's confirmation opens; the condition says which is missing.
#[test]
fn the_annotation_alone_or_a_voided_confirmation_says_an_admin_must_confirm() {
    let gone = CleanupAnswer::Gone { what: Gone::Package, message: "[E_PACKAGE_GONE] x".into() };
    let instance = deleting(json!({"vynil.solidite.fr/delete-without-package": "true"}), with_children());
    for (hatch, says) in [
        (Hatch::Unconfirmed, "the annotation alone deletes nothing: an admin must review"),
        (
            Hatch::Void("the recorded children changed".into()),
            "no longer holds: the recorded children changed",
        ),
    ] {
        let mut seen = observed(gone.clone());
        seen.hatch = hatch;
        let plan = cleanup(&instance, &seen);
        let (_, ok, message) = condition(&plan).unwrap();
        assert!(!ok && message.contains(says) && message.contains("AllowDeleteWithoutPackage"), "{message}");
        assert!(!plan.steps.iter().any(|s| matches!(s, Step::CreateReaperJob { .. })), "{plan:?}");
    }
}

#[test]
fn a_gone_message_without_its_code_still_gives_a_coded_condition() {
    // Found by the fuzzer (fuzz/regressions/objects): the condition took the
    // catalog's text as it came, so a message without `[CODE]` gave a
    // blocked outcome whose condition a client could not recognise.
    for (what, text) in
        [(Gone::Package, "no tenant revision"), (Gone::Jukebox, "[E_PACKAGE_GONE] mislabelled")]
    {
        let gone = CleanupAnswer::Gone { what, message: text.into() };
        let plan = cleanup(&deleting(json!({}), with_children()), &observed(gone));
        let (_, _, message) = condition(&plan).unwrap();
        assert_eq!(vynil_crds::message_code(&message), Some(what.code()), "{message}");
        assert!(message.contains(text), "{message}");
    }
}

#[test]
fn the_jukebox_gone_says_so_with_its_own_code() {
    let gone = CleanupAnswer::Gone {
        what: Gone::Jukebox,
        message: "[E_JUKEBOX_GONE] JukeBox box is missing".into(),
    };
    let plan = cleanup(&deleting(json!({}), with_children()), &observed(gone));
    assert!(matches!(&plan.outcome, Outcome::Blocked(b) if b.code == Some("E_JUKEBOX_GONE")));
    assert!(plan.steps.iter().any(|s| matches!(s, Step::Event { reason: "JukeboxGone", .. })));
}

#[test]
fn without_package_the_reaper_runs_and_the_finalizer_goes_only_when_its_report_shows_everything_gone() {
    let instance = deleting(json!({"vynil.solidite.fr/delete-without-package": "true"}), with_children());
    let answer = CleanupAnswer::WithoutPackage { warning: "no package hooks ran".into() };
    let plan = cleanup(&instance, &observed(answer.clone()));
    assert!(plan.steps.iter().any(|s| matches!(s, Step::CreateReaperJob { .. })), "{plan:?}");
    assert!(
        plan.steps
            .iter()
            .any(|s| matches!(s, Step::Event { warning: true, reason: "DeleteWithoutPackage", .. }))
    );
    let fingerprint = reaper_fingerprint(&instance);
    let report = |outcome: Value| {
        serde_json::from_value(json!({"children": [
            {"phase": "vitals", "kind": "Deployment", "name": "ollama", "namespace": "apps", "outcome": "deleted"},
            {"phase": "crds", "kind": "CustomResourceDefinition", "name": "things.example.io", "outcome": "skipped", "why": "never"},
            outcome,
        ]}))
        .unwrap()
    };
    let mut seen = observed(answer);
    seen.job = job(&fingerprint, JobState::Succeeded);
    // No report yet: wait for it, never release blind.
    let plan = cleanup(&instance, &seen);
    assert!(matches!(plan.outcome, Outcome::Deleting { .. }), "{plan:?}");
    seen.report = Some(report(
        json!({"phase": "posts", "kind": "Job", "name": "p", "outcome": "still_present", "why": "still there after 300s"}),
    ));
    let plan = cleanup(&instance, &seen);
    assert_ne!(plan.outcome, Outcome::Released);
    seen.report =
        Some(report(json!({"phase": "posts", "kind": "Job", "name": "p", "outcome": "already_gone"})));
    let plan = cleanup(&instance, &seen);
    assert_eq!(plan.outcome, Outcome::Released);
    let (_, _, message) = condition(&plan).unwrap();
    assert!(message.contains("Deployment apps/ollama") && message.contains("things.example.io"), "{message}");
    assert!(
        plan.steps
            .iter()
            .any(|s| matches!(s, Step::Event { warning: true, reason: "DeletedWithoutPackage", .. }))
    );
}
