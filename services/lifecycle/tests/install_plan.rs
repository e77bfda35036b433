//! The install planner as a table of named scenarios (`docs/upstream-vynil.md`
//! §9 items 9, 17–21, plus adoption and failure backoff): each gives an
//! instance and what was observed, and checks the steps and the outcome.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::{Value, json};
use vynil_crds::AgentTarget;
use vynil_lifecycle::{
    install_plan::{self, InitVersion, JobState, ObservedJob, Outcome, Resolution, Step},
    instance::{Instance, InstanceKind},
};
use vynil_rules::install::{self, CheckedOptions, OptionProblem, Unmet};

mod plan_kit;

use plan_kit::*;

#[test]
fn a_fresh_install_records_its_target_before_creating_the_job() {
    let plan = install_plan::plan(&fresh(), &observed("4.0.0"));
    let record = plan.steps.iter().position(|s| matches!(s, Step::RecordTarget(_))).unwrap();
    let create = plan.steps.iter().position(|s| matches!(s, Step::CreateJob(_))).unwrap();
    assert!(record < create, "{:?}", plan.steps);
    assert_eq!(creates_job(&plan).as_deref(), Some("4.0.0"));
    assert_eq!(plan.outcome, Outcome::Installing { from: None, to: "4.0.0".into() });
}

#[test]
fn item_9_a_tenant_instance_never_picks_a_service_package() {
    // What the catalog answers when only a `service` revision exists.
    let mut seen = observed("1.0.0");
    seen.resolution = Resolution::NoMatch {
        excluded_by: "type".into(),
        reason: "no tenant revision of think/ollama (only service: 0.1.10)".into(),
    };
    seen.checks = None;
    let mut i = fresh();
    i.category = "think".into();
    i.package = "ollama".into();
    let plan = install_plan::plan(&i, &seen);
    let (kind, ok, message) = condition(&plan).unwrap();
    assert_eq!((kind, ok), ("AgentStarted", false));
    assert!(message.starts_with("Package think/ollama is missing"), "{message}");
    assert_eq!(creates_job(&plan), None);
    assert_eq!(plan.requeue, Duration::from_secs(900));
}

#[test]
fn item_17_suspend_true_does_nothing_and_any_other_value_reconciles() {
    let suspended = instance(json!({"vynil.solidite.fr/suspend": "true"}), Value::Null, Value::Null);
    let plan = install_plan::plan(&suspended, &observed("4.0.0"));
    assert!(plan.steps.is_empty() && plan.outcome == Outcome::Suspended, "{plan:?}");
    let not = instance(json!({"vynil.solidite.fr/suspend": "yes"}), Value::Null, Value::Null);
    assert!(creates_job(&install_plan::plan(&not, &observed("4.0.0"))).is_some());
}

#[test]
fn item_18_force_reinstall_removes_the_annotation_deletes_the_job_and_creates_a_new_one() {
    let fp = fingerprint_of(&install_plan::plan(&fresh(), &observed("4.0.0")));
    let i = instance(json!({"vynil.solidite.fr/force-reinstall": "x"}), Value::Null, installed("4.0.0", &fp));
    let mut seen = observed("4.0.0");
    seen.job = Some(ObservedJob { uid: "u1".into(), fingerprint: Some(fp), state: JobState::Succeeded });
    let plan = install_plan::plan(&i, &seen);
    let kinds: Vec<&str> = plan
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::RemoveForceReinstall => Some("remove"),
            Step::DeleteJob => Some("delete"),
            Step::CreateJob(_) => Some("create"),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, ["remove", "delete", "create"]);
}

#[test]
fn item_19_an_options_change_re_runs_and_no_change_does_not_even_after_the_job_was_deleted() {
    let fp = fingerprint_of(&install_plan::plan(&fresh(), &observed("4.0.0")));
    let same = instance(json!({}), Value::Null, installed("4.0.0", &fp));
    // No Job at all (deleted by a TTL or by hand): nothing re-runs.
    let plan = install_plan::plan(&same, &observed("4.0.0"));
    assert_eq!(creates_job(&plan), None, "{plan:?}");
    assert_eq!(plan.outcome, Outcome::UpToDate { tag: "4.0.0".into() });
    // New options: a new OPTIONS_HASH, a new fingerprint, a Job.
    let changed = instance(json!({}), json!({"replicas": 2}), installed("4.0.0", &fp));
    let plan = install_plan::plan(&changed, &observed("4.0.0"));
    let request = plan.steps.iter().find_map(|s| match s {
        Step::CreateJob(r) => Some(r.clone()),
        _ => None,
    });
    let request = request.expect("a re-run");
    assert_eq!(request.options_hash, install::options_hash(changed.options.as_ref()));
    assert_ne!(request.fingerprint, fp);
}

#[test]
fn item_20_init_from_version_found_sets_the_tag_and_not_found_blocks_without_a_job() {
    let mut seen = observed("4.0.0");
    seen.init_version = InitVersion::Found { tag: "3.0.0".into(), digest: None };
    assert_eq!(creates_job(&install_plan::plan(&fresh(), &seen)).as_deref(), Some("3.0.0"));
    seen.init_version = InitVersion::NotFound("3.0.1".into());
    let plan = install_plan::plan(&fresh(), &seen);
    let (kind, ok, message) = condition(&plan).unwrap();
    assert_eq!((kind, ok), ("InitFrom", false));
    assert_eq!(message, "[E_INIT_VERSION_NOT_FOUND] Version 3.0.1 introuvable dans le registre OCI");
    assert_eq!(creates_job(&plan), None);
}

/// #44 item 2: a recalled revision is never installed, even named by `initFrom.version`.
#[test]
fn init_from_version_naming_a_recalled_revision_is_refused_without_a_job() {
    let mut seen = observed("4.0.0");
    seen.held_back.recalls = vec![("3.0.0".into(), "3.0.0 is recalled: loses data".into())];
    let found = InitVersion::Found { tag: "3.0.0".into(), digest: None };
    seen.init_version = seen.held_back.refusing_recalled(found);
    let plan = install_plan::plan(&fresh(), &seen);
    let (kind, ok, message) = condition(&plan).unwrap();
    assert_eq!((kind, ok), ("InitFrom", false));
    assert!(message.starts_with("[E_RECALLED] initFrom.version: 3.0.0 is recalled: loses data"), "{message}");
    assert_eq!(creates_job(&plan), None);
    let other = InitVersion::Found { tag: "3.1.0".into(), digest: None };
    seen.init_version = seen.held_back.refusing_recalled(other);
    assert_eq!(creates_job(&install_plan::plan(&fresh(), &seen)).as_deref(), Some("3.1.0"));
}

/// #50: under an enforced signature policy no install Job runs for an
/// unverified revision, named by `initFrom.version` or the catalog's own
/// (an instance keeps the revision it runs), and the block says why with the
/// same code.
#[test]
fn an_enforced_signature_policy_refuses_an_unverified_revision_without_a_job() {
    use vynil_rules::signature::{Verdict, VerifyMode};
    let mut seen = observed("4.0.0");
    seen.held_back.verify = Some(VerifyMode::Enforce);
    seen.init_version = InitVersion::Unverified { tag: "3.0.0".into(), verdict: Verdict::UntrustedKey };
    let plan = install_plan::plan(&fresh(), &seen);
    let (kind, ok, message) = condition(&plan).unwrap();
    assert_eq!((kind, ok), ("InitFrom", false));
    assert!(
        message.starts_with("[E_UNVERIFIED] initFrom.version 3.0.0: signed by an untrusted key"),
        "{message}"
    );
    assert_eq!(creates_job(&plan), None);

    seen.init_version = InitVersion::NotAsked;
    let unsigned = plan_for_signature(&mut seen, None);
    let (kind, ok, message) = condition(&unsigned).unwrap();
    assert_eq!((kind, ok), ("AgentStarted", false));
    assert!(message.starts_with("[E_UNVERIFIED] 4.0.0: unsigned"), "{message}");
    assert_eq!(creates_job(&unsigned), None);
    let verified = Verdict::Verified { key: "release".into(), reference: "r/x".into() };
    assert_eq!(creates_job(&plan_for_signature(&mut seen, Some(verified))).as_deref(), Some("4.0.0"));
    seen.held_back.verify = Some(VerifyMode::Warn);
    assert_eq!(
        creates_job(&plan_for_signature(&mut seen, Some(Verdict::UntrustedKey))).as_deref(),
        Some("4.0.0")
    );
}

fn plan_for_signature(
    seen: &mut install_plan::Observed,
    verdict: Option<vynil_rules::signature::Verdict>,
) -> install_plan::Plan {
    if let Resolution::Package { package, .. } = &mut seen.resolution {
        package.signature = verdict;
    }
    install_plan::plan(&fresh(), seen)
}

/// #44 items 2 and 3: an installed instance whose newer revisions are all
/// recalled or too young, its own gone from the catalog, stays where it is,
/// waiting and saying why; a first install with nothing selectable is blocked.
#[test]
fn nothing_selectable_yet_keeps_an_installed_instance_waiting_and_blocks_a_first_install() {
    let mut seen = observed("4.0.0");
    let reason = "no tenant revision of apps/web is selectable yet: 4.0.0 becomes selectable at 2026-12-08T00:00:00Z (minimum age 72h)";
    seen.resolution = Resolution::NoMatch { excluded_by: "withheld".into(), reason: reason.into() };
    let fingerprint = fingerprint_of(&install_plan::plan(&fresh(), &observed("3.0.0")));
    let on_300 = instance(json!({}), Value::Null, installed("3.0.0", &fingerprint));
    let plan = install_plan::plan(&on_300, &seen);
    assert!(plan.steps.is_empty(), "no Job, no condition: {:?}", plan.steps);
    match &plan.outcome {
        Outcome::Waiting { to, why, on, .. } => {
            assert_eq!((to.as_str(), *on), ("3.0.0", install_plan::WaitFor::Withheld));
            assert_eq!(why, &format!("staying at 3.0.0: {reason}"));
        }
        other => panic!("{other:?}"),
    }
    let first = install_plan::plan(&fresh(), &seen);
    assert!(matches!(first.outcome, Outcome::Blocked(_)) && creates_job(&first).is_none(), "{first:?}");
}

/// #65 item 11: after a rollback, the catalog lists only the revision
/// quarantined for the instance. That is not a missing package: a healthy
/// instance stays where it is with no failed condition (the quarantine is
/// said where it holds something back: `ListInstances`, `Explain`), and a
/// first install names the quarantine, not a missing package.
#[test]
fn a_quarantine_is_not_a_missing_package_and_a_healthy_instance_stays_without_a_failed_condition() {
    let mut seen = observed("0.3.1");
    let reason = "every tenant revision of apps/web is quarantined for this instance (0.3.1) after an upgrade to it failed: publish a newer revision, or have an operator clear the quarantine (`vynilctl instance clear-quarantine`)";
    seen.resolution = Resolution::NoMatch { excluded_by: "quarantined".into(), reason: reason.into() };
    let fingerprint = fingerprint_of(&install_plan::plan(&fresh(), &observed("0.2.0")));
    let on_020 = instance(json!({}), Value::Null, installed("0.2.0", &fingerprint));
    let plan = install_plan::plan(&on_020, &seen);
    assert!(plan.steps.is_empty(), "no Job, no condition: {:?}", plan.steps);
    match &plan.outcome {
        Outcome::Waiting { to, why, on, .. } => {
            assert_eq!((to.as_str(), *on), ("0.2.0", install_plan::WaitFor::Quarantine));
            assert_eq!(why, &format!("staying at 0.2.0: {reason}"));
        }
        other => panic!("{other:?}"),
    }
    let first = install_plan::plan(&fresh(), &seen);
    let Outcome::Blocked(blocker) = &first.outcome else { panic!("{first:?}") };
    assert!(
        !blocker.message.contains("missing") && blocker.message.contains("quarantined"),
        "{}",
        blocker.message
    );
}

#[test]
fn item_21_a_missing_crd_blocks_with_upstreams_message_and_retries_in_five_minutes() {
    let mut seen = observed("4.0.0");
    seen.checks.as_mut().unwrap().unmet = Some(Unmet {
        requirement: "custom_resource_definition".into(),
        message: "CRD x.y is not installed".into(),
        retry_after: Duration::from_secs(300),
    });
    let plan = install_plan::plan(&fresh(), &seen);
    assert_eq!(condition(&plan).unwrap(), ("AgentStarted", false, "CRD x.y is not installed".into()));
    assert_eq!(plan.requeue, Duration::from_secs(300));
    assert_eq!(creates_job(&plan), None);
}

#[test]
fn an_option_of_the_wrong_type_blocks_naming_it_and_undeclared_ones_only_warn() {
    let mut seen = observed("4.0.0");
    seen.checks.as_mut().unwrap().options =
        Err(OptionProblem { option: "replicas".into(), expected: "integer".into(), found: "string".into() });
    let plan = install_plan::plan(&fresh(), &seen);
    let (_, ok, message) = condition(&plan).unwrap();
    assert!(!ok && message.starts_with("[E_OPTION_TYPE]") && message.contains("replicas"), "{message}");
    assert_eq!(creates_job(&plan), None);
    seen.checks.as_mut().unwrap().options = Ok(CheckedOptions { dropped: vec!["colour".into()] });
    let plan = install_plan::plan(&fresh(), &seen);
    assert!(creates_job(&plan).is_some());
    assert!(plan.steps.iter().any(|s| matches!(s, Step::Event { warning: true, reason: "UndeclaredOptions", note } if note.contains("colour"))));
}

#[test]
fn a_value_script_error_blocks_naming_the_missing_function() {
    let mut seen = observed("4.0.0");
    seen.checks.as_mut().unwrap().controller_values = Err("Function not found: gpu_count ()".into());
    let plan = install_plan::plan(&fresh(), &seen);
    let (_, ok, message) = condition(&plan).unwrap();
    assert!(!ok && message.contains("gpu_count"), "{message}");
    assert_eq!(creates_job(&plan), None);
}

#[test]
fn a_missing_jukebox_blocks_with_a_warning_and_no_job() {
    let mut seen = observed("4.0.0");
    seen.resolution = Resolution::JukeboxMissing;
    seen.checks = None;
    let plan = install_plan::plan(&fresh(), &seen);
    let (_, ok, message) = condition(&plan).unwrap();
    assert!(!ok && message == "JukeBox box is missing", "{message}");
    assert!(
        plan.steps.iter().any(|s| matches!(s, Step::Event { warning: true, reason: "MissingJukebox", .. }))
    );
    assert_eq!(creates_job(&plan), None);
}

#[test]
fn controller_values_over_the_limit_block_without_a_job_and_at_the_limit_install() {
    let mut seen = observed("4.0.0");
    let at_limit = format!("\"{}\"", "x".repeat(install_plan::MAX_CONTROLLER_VALUES - 2));
    seen.checks.as_mut().unwrap().controller_values = Ok(at_limit.clone());
    assert!(creates_job(&install_plan::plan(&fresh(), &seen)).is_some(), "exactly at the limit installs");
    seen.checks.as_mut().unwrap().controller_values = Ok(format!("{at_limit} "));
    let plan = install_plan::plan(&fresh(), &seen);
    let (_, ok, message) = condition(&plan).unwrap();
    assert!(!ok && message.starts_with("[E_VALUES_TOO_LARGE]"), "{message}");
    assert_eq!(creates_job(&plan), None);
}

#[test]
fn an_instance_upstream_installed_is_adopted_without_a_job_when_what_would_run_matches() {
    let upstream =
        instance(json!({}), Value::Null, json!({"tag": "4.0.0", "digest": install::options_hash(None)}));
    let plan = install_plan::plan(&upstream, &observed("4.0.0"));
    assert_eq!(creates_job(&plan), None);
    assert_eq!(plan.outcome, Outcome::Adopted { tag: "4.0.0".into() });
    assert!(plan.steps.iter().any(|s| matches!(s, Step::RecordInstalled(p) if p.tag == "4.0.0")));
    // Other options than the ones it was installed with: not adopted, a Job runs.
    let other =
        instance(json!({}), json!({"a": 1}), json!({"tag": "4.0.0", "digest": install::options_hash(None)}));
    assert!(creates_job(&install_plan::plan(&other, &observed("4.0.0"))).is_some());
}

#[test]
fn a_completion_is_credited_only_to_the_job_carrying_the_fingerprint() {
    let fp = fingerprint_of(&install_plan::plan(&fresh(), &observed("4.0.0")));
    let mut seen = observed("4.0.0");
    seen.job = Some(ObservedJob {
        uid: "old".into(),
        fingerprint: Some("stale".into()),
        state: JobState::Succeeded,
    });
    let plan = install_plan::plan(&fresh(), &seen);
    assert!(!plan.steps.iter().any(|s| matches!(s, Step::RecordInstalled(_))), "{plan:?}");
    assert!(plan.steps.contains(&Step::DeleteJob) && creates_job(&plan).is_some());
    seen.job =
        Some(ObservedJob { uid: "new".into(), fingerprint: Some(fp.clone()), state: JobState::Succeeded });
    let plan = install_plan::plan(&fresh(), &seen);
    assert!(
        plan.steps
            .iter()
            .any(|s| matches!(s, Step::RecordInstalled(p) if p.fingerprint.as_deref() == Some(fp.as_str())))
    );
}

#[test]
fn a_failed_job_is_kept_counted_once_retried_with_doubling_backoff_then_stays_failed() {
    let fp = fingerprint_of(&install_plan::plan(&fresh(), &observed("4.0.0")));
    let failed = |uid: &str| ObservedJob {
        uid: uid.into(),
        fingerprint: Some(fp.clone()),
        state: JobState::Failed("BackoffLimitExceeded: pod exited 1".into()),
    };
    let target = |failures: u32, failed_job: &str, retry_at: &str| {
        let mut status = json!({});
        let mut t = AgentTarget::default();
        t.revision.fingerprint = Some(fp.clone());
        t.revision.tag = "4.0.0".into();
        t.failures = failures;
        t.failed_job = Some(failed_job.into());
        t.retry_at = Some(retry_at.into());
        status["target"] = serde_json::to_value(t).unwrap();
        instance(json!({}), Value::Null, status)
    };
    // First failure: counted, kept (no DeleteJob), retry in 1 min, reason shown.
    let mut seen = observed("4.0.0");
    seen.job = Some(failed("j1"));
    let plan = install_plan::plan(&fresh(), &seen);
    assert!(!plan.steps.contains(&Step::DeleteJob) && creates_job(&plan).is_none(), "{plan:?}");
    let recorded = recorded_target(&plan);
    assert_eq!((recorded.failures, recorded.retry_at.as_deref()), (1, Some("2026-12-01T12:01:00Z")));
    let (kind, ok, message) = condition(&plan).unwrap();
    assert!(kind == "Installed" && !ok && message.contains("pod exited 1"), "{message}");
    // Not due yet: nothing new.
    let plan = install_plan::plan(&target(1, "j1", "2026-12-01T12:01:00Z"), &seen);
    assert!(creates_job(&plan).is_none());
    assert_eq!(plan.requeue, Duration::from_secs(60));
    // Due: the failed Job is replaced.
    seen.now = "2026-12-01T12:01:00Z".parse().unwrap();
    let plan = install_plan::plan(&target(1, "j1", "2026-12-01T12:01:00Z"), &seen);
    assert!(plan.steps.contains(&Step::DeleteJob) && creates_job(&plan).is_some(), "{plan:?}");
    // The second failure doubles the wait.
    seen.job = Some(failed("j2"));
    let plan = install_plan::plan(&target(1, "j1", "2026-12-01T12:01:00Z"), &seen);
    let recorded = recorded_target(&plan);
    assert_eq!((recorded.failures, recorded.retry_at.as_deref()), (2, Some("2026-12-01T12:03:00Z")));
    // Out of attempts: stays failed whatever the time, until the fingerprint changes.
    seen.now = "2026-12-02T00:00:00Z".parse().unwrap();
    seen.job = Some(failed("j3"));
    let plan = install_plan::plan(&target(3, "j3", "2026-12-01T12:10:00Z"), &seen);
    assert!(creates_job(&plan).is_none());
    assert!(
        matches!(&plan.outcome, Outcome::Blocked(b) if b.code == Some("E_AGENT_FAILED")),
        "{:?}",
        plan.outcome
    );
    let mut options_changed = target(3, "j3", "2026-12-01T12:10:00Z");
    options_changed.options = serde_json::from_value(json!({"a": 1})).unwrap();
    assert!(creates_job(&install_plan::plan(&options_changed, &seen)).is_some());
}

#[test]
fn backoff_doubles_from_one_minute_up_to_one_hour() {
    let waits: Vec<u64> = (1..=9).map(|n| install_plan::backoff(n).as_secs()).collect();
    assert_eq!(waits, [60, 120, 240, 480, 960, 1920, 3600, 3600, 3600]);
}

#[test]
fn a_completed_job_is_credited_with_its_recorded_target_even_when_the_selection_moved_on() {
    // Installed from `initFrom.version` 1.0.0: once the agent wrote `tag`, the
    // selection is 2.5.0, but the completed Job installed the recorded target.
    let mut seen = observed("1.0.0");
    seen.init_version = InitVersion::Found { tag: "1.0.0".into(), digest: Some("sha256:100".into()) };
    let first = install_plan::plan(&fresh(), &seen);
    let target = first
        .steps
        .iter()
        .find_map(|s| match s {
            Step::RecordTarget(t) => Some(t.clone()),
            _ => None,
        })
        .unwrap();
    let status = json!({"tag": "1.0.0", "digest": install::options_hash(None), "target": serde_json::to_value(&target).unwrap()});
    let after_agent = instance(json!({}), Value::Null, status);
    let mut now = observed("2.5.0");
    now.job = Some(ObservedJob {
        uid: "j1".into(),
        fingerprint: target.revision.fingerprint.clone(),
        state: JobState::Succeeded,
    });
    let plan = install_plan::plan(&after_agent, &now);
    let [Step::RecordInstalled(recorded)] = plan.steps.as_slice() else { panic!("{plan:?}") };
    assert_eq!((recorded.tag.as_str(), &recorded.fingerprint), ("1.0.0", &target.revision.fingerprint));
}

#[test]
fn the_history_keeps_the_last_five_installed_revisions_oldest_first() {
    let mut status = json!({});
    let mut tags = Vec::new();
    for minor in 0..7 {
        let tag = format!("1.{minor}.0");
        let plan = install_plan::plan(&instance(json!({}), Value::Null, status.clone()), &observed(&tag));
        let target = recorded_target(&plan);
        let mut done = observed(&tag);
        done.job = Some(ObservedJob {
            uid: tag.clone(),
            fingerprint: target.revision.fingerprint.clone(),
            state: JobState::Succeeded,
        });
        status["target"] = serde_json::to_value(&target).unwrap();
        status["tag"] = json!(tag);
        let credited = install_plan::plan(&instance(json!({}), Value::Null, status.clone()), &done);
        let package = credited
            .steps
            .iter()
            .find_map(|s| match s {
                Step::RecordInstalled(p) => Some(p.clone()),
                _ => None,
            })
            .unwrap();
        status["package"] = serde_json::to_value(&package).unwrap();
        status["target"] = Value::Null;
        tags = package.history.iter().map(|h| h.tag.clone()).collect::<Vec<_>>();
    }
    assert_eq!(tags, ["1.2.0", "1.3.0", "1.4.0", "1.5.0", "1.6.0"]);
}

/// Upstream's bootstrap: SystemInstance `vynil-system/vynil`, package `core/vynil`.
fn control_plane(category: &str, package: &str, status: Value, deleting: bool) -> Instance {
    let mut object = json!({
        "apiVersion": "vynil.solidite.fr/v1", "kind": "SystemInstance",
        "metadata": {"name": "vynil", "namespace": "vynil-system", "generation": 1},
        "spec": {"jukebox": "vynil", "category": category, "package": package},
        "status": status,
    });
    if deleting {
        object["metadata"]["deletionTimestamp"] = json!("2026-12-01T12:00:00Z");
        object["metadata"]["finalizers"] = json!(["systeminstances.vynil.solidite.fr"]);
    }
    Instance::decode(InstanceKind::System, &serde_json::from_value(object).unwrap()).unwrap()
}

#[test]
fn upstreams_control_plane_is_never_upgraded_and_says_why_on_ready() {
    let upstream = json!({"tag": "0.7.7", "digest": install::options_hash(None),
        "crds": ["jukeboxes.vynil.solidite.fr", "tenantinstances.vynil.solidite.fr"]});
    for instance in [
        control_plane("core", "vynil", upstream.clone(), false),
        // Renamed, but recording Vynil's own CRDs.
        control_plane("infra", "controller", upstream.clone(), false),
    ] {
        // A newer revision in the catalog, or a forced reinstall: still nothing runs.
        let plan = install_plan::plan(&instance, &observed("0.8.0"));
        assert_eq!(creates_job(&plan), None, "{plan:?}");
        assert!(!plan.steps.iter().any(|s| matches!(s, Step::DeleteJob | Step::RecordTarget(_))));
        let (kind, ok, message) = condition(&plan).unwrap();
        assert!(kind == "Ready" && !ok && message.starts_with("[E_UPSTREAM_CONTROL_PLANE]"), "{message}");
        assert!(message.contains("suspend"), "says what the operator should do: {message}");
        assert!(
            plan.steps
                .iter()
                .any(|s| matches!(s, Step::Event { warning: true, reason: "UpstreamControlPlane", .. }))
        );
        assert!(matches!(&plan.outcome, Outcome::Blocked(b) if b.criterion.as_str() == "control_plane"));
    }
    // Another system package that installs CRDs of its own group is served.
    let other =
        control_plane("core", "cert-manager", json!({"crds": ["certificates.cert-manager.io"]}), false);
    assert!(creates_job(&install_plan::plan(&other, &observed("0.8.0"))).is_some());
}

#[test]
fn upstreams_control_plane_being_deleted_keeps_its_finalizer_and_runs_no_job() {
    use vynil_lifecycle::uninstall_plan::{CleanupAnswer, CleanupObserved, cleanup};
    let instance = control_plane(
        "core",
        "vynil",
        json!({"tag": "0.7.7", "systems": [{"kind": "ServiceAccount", "name": "vynil-agent"}]}),
        true,
    );
    // Whatever the catalog would answer, even "delete without package".
    for answer in [CleanupAnswer::NothingToDelete, CleanupAnswer::WithoutPackage { warning: "w".into() }] {
        let seen = CleanupObserved {
            answer,
            unverified: None,
            hatch: Default::default(),
            job: None,
            report: None,
            now: "2026-12-01T12:00:00Z".parse().unwrap(),
            max_attempts: 3,
        };
        let plan = cleanup(&instance, &seen);
        assert!(!matches!(plan.outcome, Outcome::Released), "the finalizer stays: {plan:?}");
        assert!(
            plan.steps.iter().all(|s| matches!(s, Step::Condition { .. } | Step::Event { .. })),
            "{plan:?}"
        );
        let (kind, ok, message) = condition(&plan).unwrap();
        assert!(kind == "Ready" && !ok && message.contains("vynil-agent ServiceAccount"), "{message}");
    }
}

#[test]
fn an_instance_upstream_installed_with_a_mistyped_option_is_adopted_with_a_warning() {
    let mistyped = || {
        Err(OptionProblem { option: "replicas".into(), expected: "integer".into(), found: "string".into() })
    };
    let options = json!({"replicas": "2"});
    let hash = install::options_hash(options.as_object());
    let upstream = instance(
        json!({}),
        options.clone(),
        json!({"tag": "4.0.0", "digest": hash,
        "conditions": [{"type": "Ready", "status": "True", "message": "Installed succesfully", "generation": 1}]}),
    );
    let mut seen = observed("4.0.0");
    seen.checks.as_mut().unwrap().options = mistyped();
    let plan = install_plan::plan(&upstream, &seen);
    assert_eq!(plan.outcome, Outcome::Adopted { tag: "4.0.0".into() }, "{plan:?}");
    assert!(plan.steps.iter().any(|s| matches!(s, Step::Event { warning: true, reason: "OptionTypeMismatch", note } if note.contains("replicas"))));
    let recorded = recorded_installed(&plan);
    assert!(recorded.adopted, "remembered, so the next reconcile serves it alike");
    // The next reconcile, with status.package recorded as adopted: an upgrade runs, unblocked.
    let mut status = json!({"tag": "4.0.0", "digest": hash});
    status["package"] = serde_json::to_value(&recorded).unwrap();
    let adopted = instance(json!({}), options.clone(), status);
    let mut newer = observed("4.1.0");
    newer.checks.as_mut().unwrap().options = mistyped();
    let plan = install_plan::plan(&adopted, &newer);
    assert_eq!(creates_job(&plan).as_deref(), Some("4.1.0"), "{plan:?}");
    let target = recorded_target(&plan);
    assert!(target.revision.adopted);
    // A new instance created after the switch is held to the schema.
    let new = instance(json!({}), options, Value::Null);
    let plan = install_plan::plan(&new, &newer);
    assert_eq!(creates_job(&plan), None);
    assert!(condition(&plan).unwrap().2.starts_with("[E_OPTION_TYPE]"));
}

#[test]
fn upstreams_reruns_are_opt_in_a_deleted_job_and_a_new_agent_image() {
    let seen = observed("4.0.0");
    let fingerprint = fingerprint_of(&install_plan::plan(&fresh(), &seen));
    let up_to_date = instance(json!({}), Value::Null, installed("4.0.0", &fingerprint));
    // Off (the default): the Job is gone, the fingerprint holds, nothing runs.
    let plan = install_plan::plan(&up_to_date, &seen);
    assert_eq!(plan.outcome, Outcome::UpToDate { tag: "4.0.0".into() });
    // --recreate-deleted-jobs: the deleted Job is created again…
    let mut recreate = observed("4.0.0");
    recreate.reruns.recreate_deleted_jobs = true;
    let plan = install_plan::plan(&up_to_date, &recreate);
    assert_eq!(creates_job(&plan).as_deref(), Some("4.0.0"), "{plan:?}");
    // …but not while it still exists.
    recreate.job = Some(ObservedJob {
        uid: "u".into(),
        fingerprint: Some(fingerprint.clone()),
        state: JobState::Succeeded,
    });
    let plan = install_plan::plan(&up_to_date, &recreate);
    assert_eq!(creates_job(&plan), None, "{plan:?}");
    // --rerun-on-agent-image-change: the image is part of the fingerprint.
    let mut image = observed("4.0.0");
    image.reruns.agent_image = Some("sebt3/vynil-agent:0.7.7".into());
    let with_image = fingerprint_of(&install_plan::plan(&fresh(), &image));
    assert_ne!(with_image, fingerprint);
    let installed_with_image = instance(json!({}), Value::Null, installed("4.0.0", &with_image));
    assert_eq!(
        install_plan::plan(&installed_with_image, &image).outcome,
        Outcome::UpToDate { tag: "4.0.0".into() }
    );
    image.reruns.agent_image = Some("sebt3/vynil-agent:0.7.8".into());
    assert_eq!(creates_job(&install_plan::plan(&installed_with_image, &image)).as_deref(), Some("4.0.0"));
}
