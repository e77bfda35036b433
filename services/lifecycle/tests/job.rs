//! The agent Job equals the golden file written by hand from upstream's
//! contract (`docs/upstream-vynil.md` §5.7): env names and order, args,
//! labels, volumes, security context and resources. When the renderer drifts
//! from the contract the upstream agent image expects, this fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use vynil_lifecycle::{
    install_plan::JobRequest,
    instance::InstanceKind,
    job::{Action, AgentSettings, job_name, render, render_reaper},
};
use vynil_rules::install::Recommended;

const DIGEST: &str = "sha256:4f1c1e5d1e1b1d9a2c3f5e6d7c8b9a0f1e2d3c4b5a69788796a5b4c3d2e1f0a9";

fn request() -> JobRequest {
    JobRequest {
        registry: "registry.example".into(),
        image: "think/ollama".into(),
        tag: "2.5.0".into(),
        digest: Some(DIGEST.into()),
        pull_secret: Some("regcred".into()),
        options_hash: "abc123".into(),
        controller_values: r#"{"gpu":true}"#.into(),
        recommended: Recommended {
            crds: "servicemonitors.monitoring.coreos.com".into(),
            system_services: String::new(),
            tenant_services: "sso".into(),
        },
        fingerprint: "f1".into(),
    }
}

#[test]
fn the_rendered_install_job_equals_the_golden_file_from_the_contract() {
    let golden: Value = serde_yaml_ng::from_str(include_str!("golden/tenant-install-job.yaml")).unwrap();
    let name = job_name(InstanceKind::Tenant, "apps", "ollama").unwrap();
    let job = render(
        &AgentSettings::default(),
        &name,
        InstanceKind::Tenant,
        "apps",
        "ollama",
        Action::Install,
        &request(),
    )
    .unwrap();
    let rendered = serde_json::to_value(&job).unwrap();
    assert_eq!(rendered, golden, "rendered:\n{}", serde_yaml_ng::to_string(&rendered).unwrap());
}

/// The install Job of TenantInstance apps/ollama for `request`, as JSON.
fn install_job(request: &JobRequest) -> Value {
    let job = render(
        &AgentSettings::default(),
        "tenant--apps--ollama",
        InstanceKind::Tenant,
        "apps",
        "ollama",
        Action::Install,
        request,
    )
    .unwrap();
    serde_json::to_value(&job).unwrap()
}

#[test]
fn without_a_pull_secret_the_job_neither_mounts_nor_names_one() {
    let mut request = request();
    request.pull_secret = None;
    let text = install_job(&request).to_string();
    assert!(!text.contains("pullsecret") && !text.contains("PULL_SECRET_PATH"), "{text}");
}

#[test]
fn a_delete_job_runs_the_delete_action_in_a_container_named_after_it() {
    let job = render(
        &AgentSettings::default(),
        "service--apps--db",
        InstanceKind::Service,
        "apps",
        "db",
        Action::Delete,
        &request(),
    )
    .unwrap();
    let spec = job.spec.unwrap().template.spec.unwrap();
    assert_eq!(spec.containers[0].name, "delete");
    assert_eq!(spec.containers[0].args.as_deref().unwrap(), ["service", "delete"]);
    assert_eq!(job.metadata.labels.unwrap()["vynil.solidite.fr/action"], "delete");
}

/// Security review item 9: the reaper is our image, run under the
/// cluster-admin agent account: its container is locked down as our
/// services' are (upstream's agent Job keeps upstream's template).
#[test]
fn the_reaper_runs_locked_down() {
    let job = render_reaper(
        &AgentSettings::default(),
        "tenant--apps--web",
        InstanceKind::Tenant,
        "apps",
        "web",
        "f",
        "vynil-system",
    )
    .unwrap();
    let pod = job.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.security_context.as_ref().and_then(|s| s.run_as_non_root), Some(true));
    let security = pod.containers[0].security_context.clone().unwrap();
    assert_eq!(security.run_as_non_root, Some(true));
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(security.capabilities.and_then(|c| c.drop).unwrap_or_default(), ["ALL"]);
    assert_eq!(security.seccomp_profile.map(|s| s.type_), Some("RuntimeDefault".to_string()));
}

/// The test kit's Job runner maps lifecycle's default images to the fake
/// agent and the reaper: the names it maps are the ones lifecycle renders.
#[test]
fn the_test_kits_agent_and_reaper_images_are_lifecycles_defaults() {
    let settings = AgentSettings::default();
    assert_eq!(settings.image, vynil_testkit::kube_api::UPSTREAM_AGENT_IMAGE);
    assert_eq!(settings.reaper_image, vynil_testkit::kube_api::REAPER_IMAGE);
}

/// #65 item 1: the unpack pulls the chosen digest and the agent is told the
/// plain tag; without a recorded digest, the unpack pulls the tag.
#[test]
fn the_unpack_pulls_the_chosen_digest_and_the_agent_is_told_the_tag() {
    let tags = |request: &JobRequest| {
        let job = install_job(request);
        let tag_of = |container: &Value| {
            container["env"].as_array().unwrap().iter().find(|e| e["name"] == "TAG").unwrap()["value"].clone()
        };
        let pod = &job["spec"]["template"]["spec"];
        let revision = job["metadata"]["annotations"]["vynil.solidite.fr/revision"].clone();
        (tag_of(&pod["initContainers"][0]), tag_of(&pod["containers"][0]), revision)
    };
    let (unpack, main, revision) = tags(&request());
    assert_eq!((unpack.as_str(), main.as_str()), (Some(DIGEST), Some("2.5.0")));
    assert_eq!(revision, format!("registry.example/think/ollama:2.5.0@{DIGEST}"));
    let unpinned = JobRequest { digest: None, ..request() };
    let (unpack, main, revision) = tags(&unpinned);
    assert_eq!((unpack.as_str(), main.as_str()), (Some("2.5.0"), Some("2.5.0")));
    assert_eq!(revision, "registry.example/think/ollama:2.5.0");
}
