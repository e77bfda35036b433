//! What the planner tests share: an instance from JSON, a catalog answer,
//! what was observed, and readers of a plan's steps.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod failed_upgrades;
mod upgrade_windows;

use kube::api::DynamicObject;
use serde_json::{Value, json};
use vynil_crds::AgentTarget;
use vynil_lifecycle::{
    install_plan::{InitVersion, Observed, Plan, Resolution, RevisionChecks, Step},
    instance::{Instance, InstanceKind},
};
use vynil_rules::{
    Package, PackageContent, PackageType,
    install::{self, CheckedOptions, Recommended},
};

pub fn instance(annotations: Value, options: Value, status: Value) -> Instance {
    let mut object = json!({
        "apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
        "metadata": {"name": "web", "namespace": "apps", "generation": 1, "annotations": annotations},
        "spec": {"jukebox": "box", "category": "apps", "package": "web"},
    });
    if !options.is_null() {
        object["spec"]["options"] = options;
    }
    if !status.is_null() {
        object["status"] = status;
    }
    let object: DynamicObject = serde_json::from_value(object).unwrap();
    Instance::decode(InstanceKind::Tenant, &object).unwrap()
}

pub fn fresh() -> Instance {
    instance(json!({}), Value::Null, Value::Null)
}

pub fn package(tag: &str) -> Package {
    Package::new(
        "registry.example",
        "apps/web",
        tag,
        PackageContent::minimal("apps", "web", PackageType::Tenant),
    )
    .with_digest(&format!("sha256:{tag}"))
}

pub fn checks() -> RevisionChecks {
    RevisionChecks {
        options: Ok(CheckedOptions::default()),
        unmet: None,
        recommended: Recommended::default(),
        controller_values: Ok("{}".into()),
    }
}

pub fn observed(tag: &str) -> Observed {
    Observed {
        resolution: Resolution::Package { package: Box::new(package(tag)), pull_secret: None },
        init_version: InitVersion::NotAsked,
        checks: Some(checks()),
        job: None,
        now: "2026-12-01T12:00:00Z".parse().unwrap(),
        max_attempts: 3,
        reruns: Default::default(),
        upgrades: Default::default(),
        rollback: true,
        upgrade_policy: None,
        held_back: Default::default(),
        fleet: Vec::new(),
    }
}

/// The fingerprint a plan for `observed` targets (from its RecordTarget or CreateJob step).
pub fn fingerprint_of(plan: &Plan) -> String {
    plan.steps
        .iter()
        .find_map(|s| match s {
            Step::CreateJob(request) => Some(request.fingerprint.clone()),
            Step::RecordTarget(t) => t.revision.fingerprint.clone(),
            Step::RecordInstalled(p) => p.fingerprint.clone(),
            _ => None,
        })
        .expect("a step naming the fingerprint")
}

pub fn creates_job(plan: &Plan) -> Option<String> {
    plan.steps.iter().find_map(|s| match s {
        Step::CreateJob(request) => Some(request.tag.clone()),
        _ => None,
    })
}

pub fn installed(tag: &str, fingerprint: &str) -> Value {
    json!({"tag": tag, "digest": install::options_hash(None), "package": {
        "registry": "registry.example", "image": "apps/web", "tag": tag, "type": "tenant", "fingerprint": fingerprint}})
}

/// The target a plan records (its `RecordTarget` step).
pub fn recorded_target(plan: &Plan) -> AgentTarget {
    plan.steps
        .iter()
        .find_map(|s| match s {
            Step::RecordTarget(t) => Some(t.clone()),
            _ => None,
        })
        .expect("a RecordTarget step")
}

/// The revision a plan records as installed (its `RecordInstalled` step).
pub fn recorded_installed(plan: &Plan) -> vynil_crds::InstalledPackage {
    plan.steps
        .iter()
        .find_map(|s| match s {
            Step::RecordInstalled(p) => Some(p.clone()),
            _ => None,
        })
        .expect("a RecordInstalled step")
}

pub fn condition(plan: &Plan) -> Option<(&'static str, bool, String)> {
    plan.steps.iter().find_map(|s| match s {
        Step::Condition { condition_type, ok, message } => {
            Some((condition_type.as_str(), *ok, message.clone()))
        }
        _ => None,
    })
}
