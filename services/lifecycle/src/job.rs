//! The agent Job, rendered to upstream's contract (`docs/upstream-vynil.md`
//! §5.7) so the upstream agent image runs it unchanged: the same env names,
//! args, labels, volumes, security context and resources as upstream's
//! `package.yaml.hbs`. Ours on top: the Job name is always valid (hashed when
//! too long, `vynil_crds::names`), the standard `app.kubernetes.io/*` labels
//! tools select agent Jobs by, and two annotations — the fingerprint that
//! decides re-runs and the revision the Job installs.

use k8s_openapi::api::batch::v1::Job;
use serde_json::{Value, json};
use vynil_crds::{
    labels,
    names::{agent_job_name, label_value, unique_agent_job_name},
};

use crate::{install_plan::JobRequest, instance::InstanceKind};

/// Annotation carrying the Job's fingerprint.
pub const FINGERPRINT: &str = "vynil.solidite.fr/fingerprint";
/// Annotation carrying `registry/image:tag@sha256:<hex>` the Job installs
/// (`registry/image:tag` when no digest was recorded).
pub const REVISION: &str = "vynil.solidite.fr/revision";

/// `install` or `delete` (the main container's name and second argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Install,
    Delete,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Install => "install",
            Action::Delete => "delete",
        }
    }
}

/// What every agent Job shares: upstream's `AGENT_IMAGE`, `AGENT_ACCOUNT`,
/// `AGENT_LOG_LEVEL`, `TENANT_LABEL`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSettings {
    pub image: String,
    /// Image of the reaper Jobs: this project's `vynil-lifecycle` (`reap` subcommand).
    pub reaper_image: String,
    pub service_account: String,
    pub log_level: String,
    pub tenant_label: String,
}

impl Default for AgentSettings {
    fn default() -> Self {
        Self {
            image: "docker.io/sebt3/vynil-agent:0.7.7".into(),
            reaper_image: DEFAULT_REAPER_IMAGE.into(),
            service_account: "vynil-agent".into(),
            log_level: "info".into(),
            tenant_label: "vynil.solidite.fr/tenant".into(),
        }
    }
}

/// The published image of this project's lifecycle binary (`deploy/README.md`).
pub const DEFAULT_REAPER_IMAGE: &str =
    concat!("ghcr.io/vynil-control-plane/vynil-lifecycle:", env!("CARGO_PKG_VERSION"));

/// The Job's name for an instance, as upstream names it when it fits.
pub fn job_name(kind: InstanceKind, namespace: &str, name: &str) -> Result<String, vynil_crds::CrdError> {
    agent_job_name(kind.package_type().as_str(), namespace, name)
}

/// The Job's name when upstream's is taken by another instance's Job.
pub fn unique_job_name(
    kind: InstanceKind,
    namespace: &str,
    name: &str,
) -> Result<String, vynil_crds::CrdError> {
    unique_agent_job_name(kind.package_type().as_str(), namespace, name)
}

/// The instance a Job was made for, from its labels: `(type, namespace, name)`
/// (upstream's `type`, `namespace`, `instance` labels; the full name from
/// [`labels::INSTANCE_ANNOTATION`] when the label had to be hashed).
pub fn job_instance(job: &Job) -> Option<(&str, &str, &str)> {
    let job_labels = job.metadata.labels.as_ref()?;
    let package_type = job_labels.get(labels::TYPE).or_else(|| job_labels.get("type"))?;
    let namespace = job_labels.get(labels::NAMESPACE)?;
    let annotated = job.metadata.annotations.as_ref().and_then(|a| a.get(labels::INSTANCE_ANNOTATION));
    let name = annotated.or_else(|| job_labels.get(labels::INSTANCE))?;
    Some((package_type, namespace, name))
}

/// Upstream's labels (`namespace`, `instance`, `type`, `action`) and ours, on the Job and its pod.
fn job_labels(job: &str, package_type: &str, action: &str, namespace: &str, name: &str) -> serde_json::Value {
    json!({
        labels::NAME: job, labels::COMPONENT: labels::AGENT, labels::MANAGED_BY: labels::VYNIL,
        labels::ACTION: action, labels::TYPE: package_type,
        labels::NAMESPACE: namespace, labels::INSTANCE: label_value(name), "type": package_type, "action": action,
    })
}

/// The annotations of a Job (and its pod) for instance `name`, beside `more`:
/// the full name when the `instance` label could not hold it.
fn job_annotations(name: &str, more: serde_json::Value) -> serde_json::Value {
    let mut annotations = more;
    if label_value(name) != name {
        annotations[labels::INSTANCE_ANNOTATION] = json!(name);
    }
    annotations
}

fn env(name: &str, value: &str) -> serde_json::Value {
    json!({"name": name, "value": value})
}

fn field_ref(name: &str, path: &str) -> serde_json::Value {
    json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}})
}

/// The unpack step's env and mounts, and the Job's volumes (the pull
/// secret's when the JukeBox names one).
fn unpack_parts(request: &JobRequest, log: &str, rust_log: &str) -> (Vec<Value>, Vec<Value>, Vec<Value>) {
    // The chosen digest, never the tag: upstream's `package unpack` builds
    // its reference with `Reference::with_tag(REGISTRY, IMAGE, TAG)` and
    // asks `GET /v2/<IMAGE>/manifests/<TAG>` verbatim (`ocihandler.rs`
    // `pull_image`, 0.7.7), which a registry answers by digest. The main
    // container keeps the plain tag: the agent writes it to `status.tag`.
    let pulled = request.digest.as_deref().unwrap_or(&request.tag);
    let mut unpack_env =
        vec![env("REGISTRY", &request.registry), env("IMAGE", &request.image), env("TAG", pulled)];
    let mut unpack_mounts = vec![
        json!({"name": "package", "mountPath": "/package"}),
        json!({"name": "cache", "mountPath": "/var/cache/restic"}),
    ];
    let mut volumes = vec![
        json!({"name": "package", "emptyDir": {"sizeLimit": "500Mi"}}),
        json!({"name": "cache", "emptyDir": {"sizeLimit": "500Mi"}}),
        json!({"name": "config", "configMap": {"name": "vynil", "optional": true}}),
    ];
    if let Some(secret) = &request.pull_secret {
        unpack_env.push(env("PULL_SECRET_PATH", "/secret"));
        unpack_mounts.push(json!({"name": "pullsecret", "mountPath": "/secret"}));
        volumes.push(json!({"name": "pullsecret", "secret": {"secretName": secret}}));
    }
    unpack_env.extend([
        env("LOG_LEVEL", log),
        env("RUST_BACKTRACE", "1"),
        env("RUST_LOG", rust_log),
        field_ref("VYNIL_NAMESPACE", "metadata.namespace"),
        field_ref("POD_NAME", "metadata.name"),
    ]);
    (unpack_env, unpack_mounts, volumes)
}

/// The agent container's env: upstream's contract (`docs/upstream-vynil.md`).
fn main_env(
    settings: &AgentSettings,
    namespace: &str,
    name: &str,
    request: &JobRequest,
    rust_log: &str,
) -> Vec<Value> {
    let log = &settings.log_level;
    vec![
        env("NAMESPACE", namespace),
        env("INSTANCE", name),
        env("TENANT_LABEL", &settings.tenant_label),
        env("OPTIONS_HASH", &request.options_hash),
        env("CONTROLLER_VALUES", &request.controller_values),
        env("RECOMMANDED_CRDS", &request.recommended.crds),
        env("RECOMMANDED_SYSTEM_SERVICES", &request.recommended.system_services),
        env("RECOMMANDED_TENANT_SERVICES", &request.recommended.tenant_services),
        env("TAG", &request.tag),
        env("LOG_LEVEL", log),
        env("RUST_BACKTRACE", "1"),
        env("RUST_LOG", rust_log),
        env("AGENT_IMAGE", &settings.image),
        field_ref("VYNIL_NAMESPACE", "metadata.namespace"),
        field_ref("POD_NAME", "metadata.name"),
    ]
}

/// Renders the agent Job `job` for the instance `kind namespace/name`.
pub fn render(
    settings: &AgentSettings,
    job: &str,
    kind: InstanceKind,
    namespace: &str,
    name: &str,
    action: Action,
    request: &JobRequest,
) -> Result<Job, serde_json::Error> {
    let package_type = kind.package_type().as_str();
    let action = action.as_str();
    let log = &settings.log_level;
    let rust_log = format!("{log},agent={log}");
    let resources =
        json!({"limits": {"cpu": "1000m", "memory": "1Gi"}, "requests": {"cpu": "50m", "memory": "64Mi"}});
    let pod_labels = job_labels(job, package_type, action, namespace, name);
    let (unpack_env, unpack_mounts, volumes) = unpack_parts(request, log, &rust_log);
    let main_env = main_env(settings, namespace, name, request, &rust_log);
    let mut revision = format!("{}/{}:{}", request.registry, request.image, request.tag);
    if let Some(digest) = &request.digest {
        revision = format!("{revision}@{digest}");
    }
    serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job,
            "labels": pod_labels,
            "annotations": job_annotations(name, json!({FINGERPRINT: request.fingerprint, REVISION: revision})),
        },
        "spec": {
            "backoffLimit": 3,
            "template": {
                "metadata": {
                    "annotations": job_annotations(name, json!({"mayfly.cloud.namecheap.com/expire": "120h"})),
                    "labels": pod_labels,
                },
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccount": settings.service_account,
                    "serviceAccountName": settings.service_account,
                    "securityContext": {"runAsUser": 65534, "runAsGroup": 65534, "fsGroup": 65534},
                    "initContainers": [{
                        "name": "unpack",
                        "image": settings.image,
                        "imagePullPolicy": "IfNotPresent",
                        "args": ["package", "unpack"],
                        "env": unpack_env,
                        "resources": resources,
                        "volumeMounts": unpack_mounts,
                    }],
                    "containers": [{
                        "name": action,
                        "image": settings.image,
                        "imagePullPolicy": "IfNotPresent",
                        "args": [package_type, action],
                        "env": main_env,
                        "resources": resources,
                        "volumeMounts": [
                            {"name": "config", "mountPath": "/etc/vynil"},
                            {"name": "package", "mountPath": "/package"},
                        ],
                    }],
                    "volumes": volumes,
                },
            },
        },
    }))
}

/// The reaper Job: a delete Job without the unpack step, running this
/// project's `vynil-lifecycle reap` under the agent ServiceAccount, with the
/// agent Job's labels (action `delete`) so the controllers follow it alike.
/// It reads the admin's confirmation in `confirmations` (the control
/// plane's namespace, `crate::confirmation`).
pub fn render_reaper(
    settings: &AgentSettings,
    job: &str,
    kind: InstanceKind,
    namespace: &str,
    name: &str,
    fingerprint: &str,
    confirmations: &str,
) -> Result<Job, serde_json::Error> {
    let package_type = kind.package_type().as_str();
    let action = Action::Delete.as_str();
    let pod_labels = job_labels(job, package_type, action, namespace, name);
    serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job,
            "labels": pod_labels,
            "annotations": job_annotations(name, json!({FINGERPRINT: fingerprint, REVISION: "reaper"})),
        },
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": pod_labels, "annotations": job_annotations(name, json!({}))},
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccountName": settings.service_account,
                    "securityContext": {"runAsUser": 65534, "runAsGroup": 65534, "fsGroup": 65534, "runAsNonRoot": true},
                    "containers": [{
                        "name": action,
                        "image": settings.reaper_image,
                        "imagePullPolicy": "IfNotPresent",
                        "args": ["reap", "--kind", package_type, "--namespace", namespace, "--name", name, "--confirmations-namespace", confirmations],
                        "env": [env("RUST_LOG", &settings.log_level)],
                        "terminationMessagePolicy": "File",
                        "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}, "requests": {"cpu": "20m", "memory": "32Mi"}},
                        // Ours, so locked down as our services are (it writes
                        // only its termination message, which the kubelet mounts).
                        "securityContext": {
                            "runAsNonRoot": true,
                            "readOnlyRootFilesystem": true,
                            "allowPrivilegeEscalation": false,
                            "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                    }],
                },
            },
        },
    }))
}
