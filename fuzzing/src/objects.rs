//! Objects the cluster hands the control plane, structure-aware: instances
//! and JukeBoxes that nearly match their CRDs (fields dropped, retyped, odd
//! annotations, statuses upstream or we wrote), decoded as the controllers
//! decode them, then the lifecycle's pure decisions: `plan()` for an
//! instance to install, `cleanup()` for one being deleted, over what the
//! catalog and the cluster could answer.
//!
//! Properties: the target revision is recorded before any Job is created
//! (accepted is not done); a blocked outcome says why in a False condition
//! whose code is the blocker's; a suspended instance starts nothing; an
//! instance whose package is gone is never released (upstream #12's
//! undeletable instance must stay visible, never silently dropped, and the
//! finalizer never goes without its hooks or the reaper); a failed Job never
//! releases.

use arbitrary::{Arbitrary, Result, Unstructured};
use kube::api::DynamicObject;
use semver::Version;
use serde_json::{Value, json};
use vynil_lifecycle::{
    install_plan::{
        InitVersion, JobRequest, JobState, Observed, ObservedJob, Outcome, Plan, Resolution, RevisionChecks,
        Step, plan,
    },
    instance::{Instance, InstanceKind},
    uninstall_plan::{CleanupAnswer, CleanupObserved, Gone, Hatch, cleanup},
};
use vynil_rules::{
    Package, PackageContent,
    install::{self, ClusterFacts, Recommended},
    package::{ClusterVersion, PackageRef, Prefly},
};

use crate::input::{Json, Text, VersionText, spoil};

const ANNOTATIONS: &[&str] = &[
    "vynil.solidite.fr/suspend",
    "vynil.solidite.fr/force-reinstall",
    "vynil.solidite.fr/hold-upgrades",
    "vynil.solidite.fr/delete-without-package",
    "other.example/x",
];

fn text(u: &mut Unstructured<'_>) -> Result<String> {
    Text::arbitrary(u).map(|t| t.0)
}

fn instance_doc(u: &mut Unstructured<'_>, kind: &str) -> Result<Value> {
    let mut annotations = serde_json::Map::new();
    for _ in 0..u.int_in_range(0..=3usize)? {
        let value = if bool::arbitrary(u)? { "true".to_string() } else { text(u)? };
        annotations.insert(u.choose(ANNOTATIONS)?.to_string(), json!(value));
    }
    let mut doc = json!({
        "apiVersion": "vynil.solidite.fr/v1",
        "kind": kind,
        "metadata": {"name": text(u)?, "namespace": text(u)?, "uid": text(u)?,
                     "generation": i64::arbitrary(u)?, "annotations": annotations},
        "spec": {"jukebox": text(u)?, "category": text(u)?, "package": text(u)?},
    });
    if u.ratio(1, 4)? {
        doc["metadata"]["deletionTimestamp"] = json!("2026-12-01T00:00:00Z");
    }
    if bool::arbitrary(u)? {
        doc["spec"]["options"] = Json::arbitrary(u)?.0;
    }
    if u.ratio(1, 3)? {
        doc["spec"]["initFrom"] = json!({"version": VersionText::arbitrary(u)?.0});
    }
    if bool::arbitrary(u)? {
        let condition = json!({"type": u.choose(&["Ready", "Installed", "AgentStarted", "Deleting", "X"])?,
            "status": u.choose(&["True", "False", "Unknown", "maybe"])?, "message": text(u)?,
            "lastTransitionTime": "2026-12-01T00:00:00Z", "generation": 1, "reason": text(u)?});
        doc["status"] =
            json!({"tag": VersionText::arbitrary(u)?.0, "digest": text(u)?, "conditions": [condition]});
        if bool::arbitrary(u)? {
            doc["status"]["package"] = json!({"registry": text(u)?, "image": text(u)?, "tag": VersionText::arbitrary(u)?.0,
                "digest": text(u)?, "fingerprint": text(u)?});
        }
        if u.ratio(1, 4)? {
            doc["status"] = Json::arbitrary(u)?.0;
        }
    }
    Ok(doc)
}

/// What the cluster and catalog answer, from the input.
#[derive(Debug)]
struct Facts {
    bits: u8,
    version: ClusterVersion,
}

impl ClusterFacts for Facts {
    fn cluster_version(&self) -> ClusterVersion {
        self.version
    }
    fn has_crd(&self, _: &str) -> bool {
        self.bits & 1 != 0
    }
    fn has_system_package(&self, _: &PackageRef) -> bool {
        self.bits & 2 != 0
    }
    fn has_tenant_package(&self, _: &PackageRef) -> bool {
        self.bits & 4 != 0
    }
    fn has_system_service(&self, _: &str) -> bool {
        self.bits & 8 != 0
    }
    fn has_tenant_service(&self, _: &str) -> bool {
        self.bits & 16 != 0
    }
    fn prefly(&self, _: &Prefly) -> std::result::Result<bool, String> {
        if self.bits & 32 != 0 { Err("no such function".into()) } else { Ok(self.bits & 64 != 0) }
    }
}

fn job(u: &mut Unstructured<'_>) -> Result<Option<ObservedJob>> {
    if bool::arbitrary(u)? {
        return Ok(None);
    }
    let state = match u.int_in_range(0..=2u8)? {
        0 => JobState::Running,
        1 => JobState::Succeeded,
        _ => JobState::Failed(text(u)?),
    };
    Ok(Some(ObservedJob {
        uid: text(u)?,
        fingerprint: if bool::arbitrary(u)? { Some(text(u)?) } else { None },
        state,
    }))
}

fn request(u: &mut Unstructured<'_>) -> Result<JobRequest> {
    Ok(JobRequest {
        registry: text(u)?,
        image: text(u)?,
        tag: VersionText::arbitrary(u)?.0,
        digest: if bool::arbitrary(u)? { Some(text(u)?) } else { None },
        pull_secret: None,
        options_hash: text(u)?,
        controller_values: "{}".into(),
        recommended: Recommended::default(),
        fingerprint: text(u)?,
    })
}

pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(kind) = u.choose(&[InstanceKind::Tenant, InstanceKind::Service, InstanceKind::System]).copied()
    else {
        return;
    };
    let name = match kind {
        InstanceKind::Tenant => "TenantInstance",
        InstanceKind::Service => "ServiceInstance",
        InstanceKind::System => "SystemInstance",
    };
    let Ok(text) = instance_doc(&mut u, name).and_then(|doc| spoil(&mut u, doc)) else {
        return;
    };
    // The JukeBox decoder sees the same document: a CRD decode error, never a panic.
    let _ = serde_json::from_str::<vynil_crds::JukeBox>(&text);
    let Ok(object) = serde_json::from_str::<DynamicObject>(&text) else {
        return;
    };
    let Ok(instance) = Instance::decode(kind, &object) else {
        return;
    };
    let _ = decide(&mut u, &instance);
}

fn decide(u: &mut Unstructured<'_>, instance: &Instance) -> Result<()> {
    let now = jiff::Timestamp::from_second(u.int_in_range(1_700_000_000..=1_900_000_000i64)?)
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    let max_attempts = u.int_in_range(0..=6u32)?;
    let package_type = instance.kind.package_type();
    let mut content = PackageContent::minimal(&instance.category, &instance.package, package_type);
    if bool::arbitrary(u)? {
        content.options = Json::arbitrary(u)?.0.as_object().cloned();
    }
    let facts = Facts {
        bits: u8::arbitrary(u)?,
        version: ClusterVersion { major: 1, minor: u.int_in_range(20..=33u64)? },
    };
    let resolution = match u.int_in_range(0..=3u8)? {
        0 => Resolution::JukeboxMissing,
        1 => Resolution::NoMatch { excluded_by: text(u)?, reason: text(u)? },
        _ => Resolution::Package {
            package: Box::new(Package::new(
                "registry.example",
                "apps/web",
                &VersionText::arbitrary(u)?.0,
                content.clone(),
            )),
            pull_secret: None,
        },
    };
    let checks = matches!(resolution, Resolution::Package { .. }).then(|| RevisionChecks {
        options: install::check_options(content.options.as_ref(), instance.options.as_ref()),
        unmet: install::unmet_requirement(&content, package_type, &Version::new(0, 8, 0), &facts),
        recommended: install::recommended(&content, package_type, &facts),
        controller_values: Ok("{}".into()),
    });
    let init_version = match u.int_in_range(0..=2u8)? {
        0 => InitVersion::NotAsked,
        1 => InitVersion::Found { tag: VersionText::arbitrary(u)?.0, digest: None },
        _ => InitVersion::NotFound(text(u)?),
    };
    let observed = Observed {
        resolution,
        init_version,
        checks,
        job: job(u)?,
        now,
        max_attempts,
        reruns: Default::default(),
        upgrades: quarantine(u)?,
        rollback: u.arbitrary()?,
        upgrade_policy: None,
        held_back: Default::default(),
        fleet: Vec::new(),
    };
    if !instance.deleting {
        check_install(instance, &plan(instance, &observed));
    }
    let answer = match u.int_in_range(0..=3u8)? {
        0 => CleanupAnswer::NothingToDelete,
        1 => CleanupAnswer::Gone { what: *u.choose(&[Gone::Package, Gone::Jukebox])?, message: text(u)? },
        2 => CleanupAnswer::Revision(Box::new(request(u)?)),
        _ => CleanupAnswer::WithoutPackage { warning: text(u)? },
    };
    let job = job(u)?;
    // Read last, so the recorded regressions replay as they were found.
    let hatch = match u.int_in_range(0..=3u8)? {
        0 => Hatch::NotAsked,
        1 => Hatch::Unconfirmed,
        2 => Hatch::Void(text(u)?),
        _ => Hatch::Confirmed,
    };
    let observed = CleanupObserved { answer, unverified: None, hatch, job, report: None, now, max_attempts };
    check_cleanup(&observed, &cleanup(instance, &observed));
    Ok(())
}

fn recorded_before_created(plan: &Plan) {
    let created = plan.steps.iter().position(|s| {
        matches!(s, Step::CreateJob(_) | Step::CreateDeleteJob(_) | Step::CreateReaperJob { .. })
    });
    if let Some(created) = created {
        assert!(
            plan.steps[..created].iter().any(|s| matches!(s, Step::RecordTarget(_))),
            "a Job created before its target was recorded: {:?}",
            plan.steps
        );
    }
}

fn blocked_says_why(plan: &Plan) {
    if let Outcome::Blocked(blocker) = &plan.outcome {
        let condition = plan.steps.iter().find_map(|s| match s {
            Step::Condition { ok: false, message, .. } => Some(message),
            _ => None,
        });
        let Some(message) = condition else {
            panic!("blocked without a False condition: {plan:?}");
        };
        if let Some(code) = blocker.code {
            assert_eq!(
                vynil_crds::message_code(message),
                Some(code),
                "the condition does not carry {code}: {message}"
            );
        }
    }
}

fn check_install(instance: &Instance, plan: &Plan) {
    recorded_before_created(plan);
    blocked_says_why(plan);
    if instance.suspended {
        assert!(
            !plan.steps.iter().any(|s| matches!(s, Step::CreateJob(_))),
            "a suspended instance started a Job"
        );
    }
}

fn check_cleanup(observed: &CleanupObserved, plan: &Plan) {
    recorded_before_created(plan);
    blocked_says_why(plan);
    let released = plan.outcome == Outcome::Released;
    if let CleanupAnswer::Gone { .. } = observed.answer {
        assert!(!released, "released although the package is gone");
    }
    if observed.job.as_ref().is_some_and(|j| matches!(j.state, JobState::Failed(_))) && released {
        assert!(
            matches!(observed.answer, CleanupAnswer::NothingToDelete),
            "a failed Job released the instance"
        );
    }
}

/// An upgrade record: nothing, or one quarantined revision in any rollback state.
fn quarantine(u: &mut Unstructured) -> arbitrary::Result<vynil_lifecycle::upgrades::UpgradeRecord> {
    use vynil_rules::upgrade::{Quarantined, Rollback};
    if u.arbitrary()? {
        return Ok(Default::default());
    }
    let rollback = match u.int_in_range(0..=3u8)? {
        0 => Rollback::Automatic,
        1 => Rollback::AwaitingOperator { why: text(u)? },
        2 => Rollback::Approved { by: text(u)?, at: text(u)? },
        _ => Rollback::Off,
    };
    let entry = Quarantined {
        tag: VersionText::arbitrary(u)?.0,
        digest: None,
        from: VersionText::arbitrary(u)?.0,
        reason: text(u)?,
        at: text(u)?,
        rollback,
    };
    Ok(vynil_lifecycle::upgrades::UpgradeRecord::new(vec![entry]))
}
