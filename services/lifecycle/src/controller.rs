//! The instance controllers: one kube-runtime `Controller` per kind, in the
//! style of kube-rs controller-rs — `finalizer()` as the only top-level
//! action, an instrumented reconcile, `error_policy` counting failures.
//!
//! A reconcile observes (catalog answer, cluster facts, the agent Job, the
//! recorded status), asks [`crate::plan`] what to do, and performs the steps,
//! reading each write back: a status write is done when the returned object
//! carries it, a Job when it can be read with its fingerprint, a deletion when
//! the Job is gone. Agent Jobs live in the control plane's namespace without
//! owner references; each controller follows them with `watches` and a label
//! mapper (`vynil.solidite.fr/type`, `namespace`, `instance`). Only the
//! leader (`crate::leader`) reconciles, and every write is preceded by a
//! leadership check; Job creation holds a slot under `--max-running-jobs`.

use std::{collections::HashMap, sync::Arc, sync::Mutex, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::{
    batch::v1::Job,
    core::v1::{Pod, Secret},
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
    runtime::{
        Controller,
        controller::Action,
        events::{Event as KubeEvent, EventType, Recorder},
        finalizer::{Error as FinalizerError, Event, finalizer},
        reflector::ObjectRef,
        watcher,
    },
};
use serde_json::json;
use vynil_crds::{Condition, labels, set_condition};
use vynil_proto::catalog::v1 as pb;
use vynil_registry::{CredentialStore, RegistryClient, RepositoryRef};
use vynil_rules::{install, selection::RecordedCheck};
use vynil_store::script::ScriptLimits;

use crate::{
    LifecycleError,
    catalog::{Catalog, Cleanup},
    confirmation::{Confirmation, Confirmations},
    facts::{self, Stores},
    instance::{Instance, InstanceKind},
    job::{self, Action as JobAction, AgentSettings},
    leader::Leader,
    metrics::{InstanceFailure, LifecycleMetrics},
    plan::{
        self, InitVersion, JobRequest, JobState, Observed, ObservedJob, Outcome, Prepared, Resolution, Step,
    },
    reaper::ReaperReport,
    uninstall::{self, CleanupAnswer, CleanupObserved, Hatch},
};

/// How long a Job deletion is waited for before the reconcile is retried.
const JOB_DELETION_WAIT: Duration = Duration::from_secs(20);

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub jobs: Api<Job>,
    pods: Api<Pod>,
    secrets: Api<Secret>,
    /// Admins' confirmations of deletes without package (control plane's namespace).
    pub confirmations: Confirmations,
    pub catalog: Catalog,
    registry: RegistryClient,
    pub agent: AgentSettings,
    pub framework: semver::Version,
    pub scripts: ScriptLimits,
    pub max_attempts: u32,
    /// Upstream's re-runs, opted into.
    pub reruns: plan::Reruns,
    pub stores: Stores,
    pub metrics: LifecycleMetrics,
    recorder: Recorder,
    /// Only the leader reconciles; every replica serves reads.
    pub leader: Leader,
    /// The idle requeue (`--requeue-seconds`).
    requeue: Duration,
    /// Agent Jobs running at once, at most (`--max-running-jobs`).
    max_running_jobs: usize,
    /// Held across "count the running Jobs, create one": the cap holds.
    job_slots: tokio::sync::Mutex<()>,
    /// The last decision per instance, for `ListInstances`.
    outcomes: Mutex<HashMap<(InstanceKind, String, String), Outcome>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("agent", &self.agent).finish_non_exhaustive()
    }
}

/// What [`Context::new`] needs besides the client and the stores.
#[derive(Debug, Clone)]
pub struct Settings {
    pub namespace: String,
    pub catalog: Catalog,
    pub registry: RegistryClient,
    pub agent: AgentSettings,
    pub framework: semver::Version,
    /// What a package's `value_script` and `prefly` may do.
    pub scripts: ScriptLimits,
    pub max_attempts: u32,
    pub reruns: plan::Reruns,
    pub reporter: kube::runtime::events::Reporter,
    pub leader: Leader,
    pub requeue: Duration,
    pub max_running_jobs: usize,
}

impl Context {
    pub fn new(client: Client, stores: Stores, metrics: LifecycleMetrics, settings: Settings) -> Self {
        Self {
            jobs: Api::namespaced(client.clone(), &settings.namespace),
            pods: Api::namespaced(client.clone(), &settings.namespace),
            secrets: Api::namespaced(client.clone(), &settings.namespace),
            confirmations: Confirmations::new(&client, &settings.namespace),
            recorder: Recorder::new(client.clone(), settings.reporter),
            client,
            catalog: settings.catalog,
            registry: settings.registry,
            agent: settings.agent,
            framework: settings.framework,
            scripts: settings.scripts,
            max_attempts: settings.max_attempts.max(1),
            reruns: settings.reruns,
            stores,
            metrics,
            outcomes: Mutex::default(),
            leader: settings.leader,
            requeue: settings.requeue,
            max_running_jobs: settings.max_running_jobs.max(1),
            job_slots: tokio::sync::Mutex::new(()),
        }
    }

    pub fn outcome(&self, kind: InstanceKind, namespace: &str, name: &str) -> Option<Outcome> {
        let outcomes = self.outcomes.lock().unwrap_or_else(|p| p.into_inner());
        outcomes.get(&(kind, namespace.to_string(), name.to_string())).cloned()
    }

    fn remember(&self, instance: &Instance, outcome: Outcome) {
        let mut outcomes = self.outcomes.lock().unwrap_or_else(|p| p.into_inner());
        outcomes.insert((instance.kind, instance.namespace.clone(), instance.name.clone()), outcome);
    }

    /// Records the admin's `confirmation` where tenants cannot write
    /// (read back), then sets `delete-without-package: "true"` (read back)
    /// and records who confirmed in an Event.
    pub async fn allow_delete_without_package(
        &self,
        kind: InstanceKind,
        object: &DynamicObject,
        confirmation: &Confirmation,
    ) -> Result<(), LifecycleError> {
        let (caller, reason) = (&confirmation.confirmed_by, &confirmation.reason);
        self.confirmations.record(confirmation).await?;
        let name = object.name_any();
        let api = self.instances(kind, &object.namespace().unwrap_or_default());
        let patch =
            json!({"metadata": {"annotations": {vynil_crds::annotations::DELETE_WITHOUT_PACKAGE: "true"}}});
        let written = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| LifecycleError::Unavailable(format!("Kubernetes API, annotating {name}: {e}")))?;
        if written.annotations().get(vynil_crds::annotations::DELETE_WITHOUT_PACKAGE).map(String::as_str)
            != Some("true")
        {
            return Err(LifecycleError::NotDone(format!("the annotation on {name} cannot be read back")));
        }
        let note = format!(
            "{caller} allowed deleting the recorded children without package hooks{}",
            if reason.is_empty() { String::new() } else { format!(": {reason}") }
        );
        self.publish(&written, kind, true, "DeleteWithoutPackageAllowed", note).await;
        Ok(())
    }

    /// Refuses a write once this replica is not (or no longer) the leader.
    fn ensure_leader(&self) -> Result<(), LifecycleError> {
        if self.leader.is_leader() {
            Ok(())
        } else {
            Err(LifecycleError::Pending {
                why: "not the leader: no write".into(),
                retry_after: Duration::from_secs(5),
            })
        }
    }

    fn instances(&self, kind: InstanceKind, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, &kind.api_resource())
    }

    async fn publish(
        &self,
        object: &DynamicObject,
        kind: InstanceKind,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        let event = KubeEvent {
            type_: if warning { EventType::Warning } else { EventType::Normal },
            reason: reason.into(),
            note: Some(note.chars().take(1023).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        let reference = object.object_ref(&kind.api_resource());
        if let Err(error) = self.recorder.publish(&event, &reference).await {
            tracing::warn!(%error, reason, "cannot publish the Event");
        }
    }
}

/// The controller of `kind`, not started: its store feeds [`Stores`].
pub fn controller(client: &Client, namespace: &str, kind: InstanceKind) -> Controller<DynamicObject> {
    let resource = kind.api_resource();
    let instances: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let jobs: Api<Job> = Api::namespaced(client.clone(), namespace);
    let selector =
        format!("{}={},{}={}", labels::COMPONENT, labels::AGENT, labels::TYPE, kind.package_type().as_str());
    Controller::new_with(instances, watcher::Config::default(), resource.clone()).watches(
        jobs,
        watcher::Config::default().labels(&selector),
        move |job: Job| {
            let (_, namespace, instance) = job::job_instance(&job)?;
            Some(ObjectRef::new_with(instance, resource.clone()).within(namespace))
        },
    )
}

/// Runs `controller` for `kind` until `shutdown`.
pub async fn run(
    controller: Controller<DynamicObject>,
    kind: InstanceKind,
    context: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    controller
        .graceful_shutdown_on(shutdown)
        .run(
            move |object, context| reconcile(kind, object, context),
            move |object, error, context| error_policy(kind, &object, error, &context),
            context,
        )
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "reconcile ended with an error");
            }
        })
        .await;
}

#[tracing::instrument(skip_all, fields(kind = %kind, namespace = object.namespace().unwrap_or_default(), name = object.name_any()))]
async fn reconcile(
    kind: InstanceKind,
    object: Arc<DynamicObject>,
    context: Arc<Context>,
) -> Result<Action, LifecycleError> {
    if !context.leader.is_leader() {
        // Another replica reconciles; this one is brought back when elected.
        return Ok(Action::await_change());
    }
    let metrics = context.metrics.of(kind);
    metrics.runs.inc();
    let started = std::time::Instant::now();
    let namespace = object.namespace().unwrap_or_default();
    let api = context.instances(kind, &namespace);
    let result = finalizer(&api, kind.finalizer(), object, |event| async {
        match event {
            Event::Apply(object) => apply(kind, &object, &context).await,
            Event::Cleanup(object) => cleanup(kind, &object, &context).await,
        }
    })
    .await
    .map_err(|e| match e {
        FinalizerError::ApplyFailed(e) | FinalizerError::CleanupFailed(e) => e,
        other => LifecycleError::Unavailable(format!("Kubernetes API, managing the finalizer: {other}")),
    });
    metrics.observe(started.elapsed().as_secs_f64());
    result
}

fn error_policy(
    kind: InstanceKind,
    object: &DynamicObject,
    error: &LifecycleError,
    context: &Context,
) -> Action {
    let spec = |key: &str| {
        object.data.pointer(&format!("/spec/{key}")).and_then(|v| v.as_str()).unwrap_or_default().to_string()
    };
    let failure = InstanceFailure {
        name: object.name_any(),
        namespace: object.namespace().unwrap_or_default(),
        jukebox: spec("jukebox"),
        category: spec("category"),
        package: spec("package"),
        error: error.label(),
    };
    if matches!(error, LifecycleError::Pending { .. } | LifecycleError::Queued(_)) {
        tracing::debug!(%error, "not a failure; coming back");
        return Action::requeue(error.retry_after());
    }
    context.metrics.of(kind).failures.get_or_create(&failure).inc();
    tracing::warn!(%error, instance = %format!("{kind}/{}/{}", failure.namespace, failure.name), "reconcile failed");
    Action::requeue(error.retry_after())
}

async fn decode(
    kind: InstanceKind,
    object: &DynamicObject,
    context: &Context,
) -> Result<Instance, LifecycleError> {
    match Instance::decode(kind, object) {
        Ok(instance) => Ok(instance),
        Err(error) => {
            context.publish(object, kind, true, "InvalidObject", error.to_string()).await;
            Err(LifecycleError::Decode(error))
        }
    }
}

async fn apply(
    kind: InstanceKind,
    object: &DynamicObject,
    context: &Context,
) -> Result<Action, LifecycleError> {
    let instance = decode(kind, object, context).await?;
    let slot = job_slot(&instance, context).await?;
    let observed = observe(&instance, &slot, context).await?;
    let plan = plan::plan(&instance, &observed);
    tracing::debug!(outcome = ?plan.outcome, steps = plan.steps.len(), "planned");
    let executed = execute(&instance, object, &slot.name, plan.steps, context).await;
    if let (Err(LifecycleError::Queued(_)), Outcome::Installing { to, .. }) = (&executed, &plan.outcome) {
        // The Job waits for a slot: say so rather than "installing".
        context.remember(&instance, Outcome::Queued { to: to.clone() });
    }
    executed?;
    context.remember(&instance, plan.outcome);
    // The planner's idle interval is upstream's; the configured one wins.
    let requeue = if plan.requeue == plan::REQUEUE { context.requeue } else { plan.requeue };
    Ok(Action::requeue(requeue))
}

/// What the planner reads, gathered for `instance` (also serves `Explain`).
pub async fn observe(
    instance: &Instance,
    slot: &JobSlot,
    context: &Context,
) -> Result<Observed, LifecycleError> {
    // Not asked: the planner holds both before reading the resolution.
    let resolution = if instance.suspended || instance.is_upstream_control_plane() {
        Resolution::JukeboxMissing
    } else {
        context.catalog.resolve(instance).await?
    };
    let (init_version, prepared) = match &resolution {
        Resolution::Package { package, pull_secret } => {
            let init_version = init_version(instance, package, pull_secret.as_deref(), context).await?;
            let asked = facts::Asked {
                namespace: &instance.namespace,
                instance: &instance.object,
                tenant_label: &context.agent.tenant_label,
                scripts: context.scripts,
                vynil_version: &context.framework,
            };
            let facts = facts::gather(&context.client, &context.stores, asked).await?;
            let content = package.content.clone();
            let kind = instance.kind.package_type();
            let (options, framework) = (instance.options.clone(), context.framework.clone());
            // Scripts may read the cluster (upstream's helpers): off the runtime.
            let prepared = crate::script::upstream::off_the_runtime(move || {
                let controller_values = content
                    .value_script_source()
                    .map_err(|e| e.to_string())
                    .and_then(|source| facts.script.controller_values(source.as_deref()));
                Prepared {
                    options: install::check_options(content.options.as_ref(), options.as_ref()),
                    unmet: install::unmet_requirement(&content, kind, &framework, &facts),
                    recommended: install::recommended(&content, kind, &facts),
                    controller_values,
                }
            })
            .await
            .map_err(LifecycleError::Unavailable)?;
            (init_version, Some(prepared))
        }
        _ => (InitVersion::NotAsked, None),
    };
    Ok(Observed {
        resolution,
        init_version,
        prepared,
        job: observe_job(slot, JobAction::Install, context).await,
        now: jiff::Timestamp::now(),
        max_attempts: context.max_attempts,
        reruns: context.reruns.clone(),
    })
}

/// `initFrom.version` on a first install: the catalog's entry, else the
/// registry (a HEAD with the JukeBox's pull secret). An unreachable registry
/// is an error to retry, never "not found".
async fn init_version(
    instance: &Instance,
    package: &vynil_rules::Package,
    pull_secret: Option<&str>,
    context: &Context,
) -> Result<InitVersion, LifecycleError> {
    let Some(version) = instance.init_from.as_ref().and_then(|i| i.version.clone()) else {
        return Ok(InitVersion::NotAsked);
    };
    if instance.installed_tag().is_some() {
        return Ok(InitVersion::NotAsked);
    }
    if let Some(digest) = context.catalog.find_tag(instance, &version).await? {
        return Ok(InitVersion::Found { tag: version, digest });
    }
    let client = registry_for(pull_secret, context).await?;
    let repo = RepositoryRef::new(&package.registry, &package.image)
        .map_err(|e| LifecycleError::Invalid(e.to_string()))?;
    match client.head_digest(&repo, &version).await {
        Ok(Some(digest)) => Ok(InitVersion::Found { tag: version, digest: Some(digest) }),
        Ok(None) => Ok(InitVersion::NotFound(version)),
        Err(e) => {
            Err(LifecycleError::Unavailable(format!("registry, looking for initFrom.version {version}: {e}")))
        }
    }
}

/// The registry client with the credentials of the pull secret `name` (read
/// afresh: a rotated secret counts at once).
async fn registry_for(
    pull_secret: Option<&str>,
    context: &Context,
) -> Result<RegistryClient, LifecycleError> {
    let Some(name) = pull_secret else {
        return Ok(context.registry.clone());
    };
    let secret = context.secrets.get_opt(name).await.map_err(|e| {
        LifecycleError::Unavailable(format!("Kubernetes API, reading the pull secret {name}: {e}"))
    })?;
    let document = secret.and_then(|s| s.data).and_then(|d| d.get(".dockerconfigjson").map(|b| b.0.clone()));
    let Some(document) = document else {
        return Ok(context.registry.clone());
    };
    let credentials = CredentialStore::from_dockerconfigjson(&document)
        .map_err(|e| LifecycleError::Invalid(format!("pull secret {name}: {e}")))?;
    context.registry.with_credentials(&credentials).map_err(|e| LifecycleError::Invalid(e.to_string()))
}

/// The agent Job of an instance: its name, and the Job found under it.
#[derive(Debug, Clone)]
pub struct JobSlot {
    pub name: String,
    found: Option<Job>,
}

/// The agent Job of `instance`: upstream's name while it is free or holds
/// this instance's Job (adoption reads upstream's Jobs by it), else a name
/// hashed from the instance's identity, so one instance never deletes or
/// reads another's Job (`a--b/c` and `a/b--c` share upstream's name). A Job
/// in flight under the hashed name keeps it.
pub async fn job_slot(instance: &Instance, context: &Context) -> Result<JobSlot, LifecycleError> {
    let (kind, namespace, name) = (instance.kind, instance.namespace.as_str(), instance.name.as_str());
    let invalid = |e: vynil_crds::CrdError| LifecycleError::Invalid(e.to_string());
    let upstream = job::job_name(kind, namespace, name).map_err(invalid)?;
    let unique = job::unique_job_name(kind, namespace, name).map_err(invalid)?;
    let read = |name: String| async move {
        let found = context.jobs.get_opt(&name).await.map_err(|e| {
            LifecycleError::Unavailable(format!("Kubernetes API, reading the agent Job {name}: {e}"))
        })?;
        Ok::<_, LifecycleError>(JobSlot { name, found })
    };
    if instance.status.target.as_ref().is_some_and(|t| t.job == unique) {
        return read(unique).await;
    }
    let slot = read(upstream).await?;
    let ours = |job: &Job| job::job_instance(job) == Some((kind.package_type().as_str(), namespace, name));
    match &slot.found {
        Some(job) if !ours(job) => read(unique).await,
        _ => Ok(slot),
    }
}

/// The Job of `slot`; its fingerprint is read only when it runs `wanted`.
async fn observe_job(slot: &JobSlot, wanted: JobAction, context: &Context) -> Option<ObservedJob> {
    let name = slot.name.as_str();
    let found = slot.found.as_ref()?;
    let is_wanted = found.labels().get(labels::ACTION).is_some_and(|a| a == wanted.as_str());
    let fingerprint = (is_wanted && found.metadata.deletion_timestamp.is_none())
        .then(|| found.annotations().get(job::FINGERPRINT).cloned())
        .flatten();
    let conditions = found.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
    let holds = |t: &str| conditions.iter().find(|c| c.type_ == t && c.status == "True");
    let state = if holds("Complete").is_some() {
        JobState::Succeeded
    } else if let Some(failed) = holds("Failed") {
        let mut reason = format!(
            "{}: {}",
            failed.reason.as_deref().unwrap_or("Failed"),
            failed.message.as_deref().unwrap_or("the Job failed")
        );
        if let Some(pod) = pod_failure(name, context).await {
            reason.push_str(&format!("; {pod}"));
        }
        JobState::Failed(reason)
    } else {
        JobState::Running
    };
    Some(ObservedJob { uid: found.uid().unwrap_or_default(), fingerprint, state })
}

/// The first terminated container of the Job's pods that did not succeed.
async fn pod_failure(job: &str, context: &Context) -> Option<String> {
    let pods = context.pods.list(&ListParams::default().labels(&format!("job-name={job}"))).await.ok()?;
    pods.items.iter().find_map(|pod| {
        let status = pod.status.as_ref()?;
        let containers =
            status.init_container_statuses.iter().flatten().chain(status.container_statuses.iter().flatten());
        containers.into_iter().find_map(|c| {
            let terminated = c.state.as_ref()?.terminated.as_ref()?;
            (terminated.exit_code != 0).then(|| {
                format!(
                    "pod {} container {} exited {} ({}){}",
                    pod.name_any(),
                    c.name,
                    terminated.exit_code,
                    terminated.reason.as_deref().unwrap_or("Error"),
                    terminated.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default()
                )
            })
        })
    })
}

async fn execute(
    instance: &Instance,
    object: &DynamicObject,
    job_name: &str,
    steps: Vec<Step>,
    context: &Context,
) -> Result<(), LifecycleError> {
    let api = context.instances(instance.kind, &instance.namespace);
    let kube = |doing: &'static str| {
        move |e: kube::Error| LifecycleError::Unavailable(format!("Kubernetes API, {doing}: {e}"))
    };
    let mut conditions = instance.status.conditions.clone();
    // An earlier release wrote `Deleting`, which upstream's agent cannot decode.
    conditions.retain(|c| c.condition_type != plan::LEGACY_DELETING);
    let mut conditions_changed = conditions.len() != instance.status.conditions.len();
    let mut resource_version = object.resource_version();
    // Upstream's status types require `conditions`: a first status write
    // carries an empty list (compare-and-set, so no list written meanwhile is lost).
    let mut lacks_conditions = object.data.pointer("/status/conditions").is_none_or(|c| !c.is_array());
    let now = jiff::Timestamp::now();
    for step in steps {
        if !matches!(step, Step::Condition { .. }) {
            context.ensure_leader()?;
        }
        match step {
            Step::Condition { condition_type, ok, message } => {
                let condition = Condition::new(
                    condition_type.as_str().to_string(),
                    ok,
                    message,
                    instance.generation,
                    now,
                );
                conditions_changed |= set_condition(&mut conditions, condition);
            }
            Step::Event { warning, reason, note } => {
                context.publish(object, instance.kind, warning, reason, note).await;
            }
            Step::RemoveForceReinstall => {
                let patch =
                    json!({"metadata": {"annotations": {vynil_crds::annotations::FORCE_REINSTALL: null}}});
                let written = api
                    .patch(&instance.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(kube("removing the force-reinstall annotation"))?;
                if written.annotations().contains_key(vynil_crds::annotations::FORCE_REINSTALL) {
                    return Err(LifecycleError::NotDone(
                        "the force-reinstall annotation is still there".into(),
                    ));
                }
                resource_version = written.resource_version();
            }
            Step::DeleteJob => delete_job(job_name, context).await?,
            Step::RecordTarget(mut target) => {
                target.job = job_name.to_string();
                let patch = status_patch(json!({"target": target}), &mut lacks_conditions, &resource_version);
                let written = api
                    .patch_status(&instance.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(kube("recording status.target"))?;
                let recorded =
                    written.data.pointer("/status/target/revision/fingerprint").and_then(|v| v.as_str());
                if recorded != target.revision.fingerprint.as_deref() {
                    return Err(LifecycleError::NotDone(pruned("status.target")));
                }
                resource_version = written.resource_version();
            }
            Step::CreateJob(request) => {
                create_agent_job(instance, job_name, JobAction::Install, &request, context).await?
            }
            Step::CreateDeleteJob(request) => {
                create_agent_job(instance, job_name, JobAction::Delete, &request, context).await?
            }
            Step::CreateReaperJob { fingerprint } => {
                let rendered = job::render_reaper(
                    &context.agent,
                    job_name,
                    instance.kind,
                    &instance.namespace,
                    &instance.name,
                    &fingerprint,
                    context.confirmations.namespace(),
                )
                .map_err(|e| LifecycleError::Invalid(format!("rendering the reaper Job: {e}")))?;
                create_job(job_name, &rendered, &fingerprint, context).await?
            }
            Step::RecordInstalled(package) => {
                let patch = status_patch(
                    json!({"package": package, "target": null}),
                    &mut lacks_conditions,
                    &resource_version,
                );
                let written = api
                    .patch_status(&instance.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(kube("recording status.package"))?;
                let recorded = written.data.pointer("/status/package/fingerprint").and_then(|v| v.as_str());
                if recorded != package.fingerprint.as_deref() {
                    return Err(LifecycleError::NotDone(pruned("status.package")));
                }
                resource_version = written.resource_version();
            }
        }
    }
    if conditions_changed {
        context.ensure_leader()?;
        // Compare-and-set: a condition list written over an agent's write would lose it.
        let patch =
            json!({"metadata": {"resourceVersion": resource_version}, "status": {"conditions": conditions}});
        let written = api
            .patch_status(&instance.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kube("writing the conditions"))?;
        if written.data.pointer("/status/conditions") != Some(&json!(conditions)) {
            return Err(LifecycleError::NotDone("the conditions were not recorded".into()));
        }
    }
    Ok(())
}

/// A status field the written object does not hold: accepted, not done. The
/// API server prunes what the installed CRD does not declare (upstream's CRD
/// has neither `package` nor `target`), so say where to look.
fn pruned(field: &str) -> String {
    format!(
        "{field} was not recorded: the API server dropped it; is the CRD from deploy/crds installed \
         (kubectl apply --server-side -f deploy/crds/vynil.yaml)?"
    )
}

/// A status merge patch of `fields`; when the status has no `conditions` yet
/// (upstream's types require the list) it adds an empty one, guarded by the
/// object's `resourceVersion`.
fn status_patch(
    mut fields: serde_json::Value,
    lacks_conditions: &mut bool,
    resource_version: &Option<String>,
) -> serde_json::Value {
    if !std::mem::take(lacks_conditions) {
        return json!({"status": fields});
    }
    fields["conditions"] = json!([]);
    json!({"metadata": {"resourceVersion": resource_version}, "status": fields})
}

async fn delete_job(name: &str, context: &Context) -> Result<(), LifecycleError> {
    let kube = |e| LifecycleError::Unavailable(format!("Kubernetes API, deleting the agent Job {name}: {e}"));
    match context.jobs.delete(name, &DeleteParams::background()).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
        Err(e) => return Err(kube(e)),
    }
    let deadline = tokio::time::Instant::now() + JOB_DELETION_WAIT;
    while context.jobs.get_opt(name).await.map_err(kube)?.is_some() {
        if tokio::time::Instant::now() > deadline {
            return Err(LifecycleError::NotDone(format!("the agent Job {name} is still being deleted")));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

async fn create_job(
    name: &str,
    rendered: &Job,
    fingerprint: &str,
    context: &Context,
) -> Result<(), LifecycleError> {
    let kube = |e| LifecycleError::Unavailable(format!("Kubernetes API, creating the agent Job {name}: {e}"));
    let _slot = context.job_slots.lock().await;
    let selector = format!("{}={}", labels::COMPONENT, labels::AGENT);
    let jobs = context.jobs.list(&ListParams::default().labels(&selector)).await.map_err(kube)?;
    let running = jobs.items.iter().filter(|j| j.name_any() != name && !finished(j)).count();
    if running >= context.max_running_jobs {
        return Err(LifecycleError::Queued(format!(
            "{running} agent Jobs run, the cap is {}: {name} waits for a slot",
            context.max_running_jobs
        )));
    }
    context.jobs.create(&PostParams::default(), rendered).await.map_err(kube)?;
    let read = context.jobs.get_opt(name).await.map_err(kube)?;
    let found = read.as_ref().and_then(|j| j.annotations().get(job::FINGERPRINT).cloned());
    if found.as_deref() != Some(fingerprint) {
        return Err(LifecycleError::NotDone(format!("the agent Job {name} cannot be read back")));
    }
    Ok(())
}

/// A Job with a `Complete` or `Failed` condition.
fn finished(job: &Job) -> bool {
    job.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
        cs.iter().any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
    })
}

/// Renders the agent Job of `action` and creates it.
async fn create_agent_job(
    instance: &Instance,
    job_name: &str,
    action: JobAction,
    request: &JobRequest,
    context: &Context,
) -> Result<(), LifecycleError> {
    let rendered = job::render(
        &context.agent,
        job_name,
        instance.kind,
        &instance.namespace,
        &instance.name,
        action,
        request,
    )
    .map_err(|e| LifecycleError::Invalid(format!("rendering the agent Job: {e}")))?;
    create_job(job_name, &rendered, &request.fingerprint, context).await
}

/// Deletion (`crate::uninstall` decides): released, or `Pending` until the
/// delete Job, the reaper or a republished package lets it end.
async fn cleanup(
    kind: InstanceKind,
    object: &DynamicObject,
    context: &Context,
) -> Result<Action, LifecycleError> {
    let instance = match decode(kind, object, context).await {
        Ok(instance) => instance,
        // An object that does not decode but records nothing to undo can still go.
        Err(error) if !records_anything(object) => {
            let note = format!("released without cleanup: it records nothing to undo ({error})");
            context.publish(object, kind, true, "InvalidObjectReleased", note).await;
            return Ok(Action::await_change());
        }
        Err(error) => return Err(error),
    };
    let slot = job_slot(&instance, context).await?;
    let observed = observe_cleanup(&instance, &slot, context).await?;
    let plan = uninstall::cleanup(&instance, &observed);
    tracing::debug!(outcome = ?plan.outcome, steps = plan.steps.len(), "cleanup planned");
    execute(&instance, object, &slot.name, plan.steps, context).await?;
    let outcome = plan.outcome.clone();
    context.remember(&instance, plan.outcome);
    match outcome {
        Outcome::Released => {
            // The instance is gone: so is any confirmation of its children.
            if let Some(uid) = instance.uid.as_deref()
                && let Err(error) = context.confirmations.forget(uid).await
            {
                tracing::warn!(%error, "a confirmation outlives its instance (it confirms nothing for another UID)");
            }
            Ok(Action::await_change())
        }
        other => Err(LifecycleError::Pending { why: format!("{other:?}"), retry_after: plan.requeue }),
    }
}

/// Whether the raw status records children or a state (read without decoding).
fn records_anything(object: &DynamicObject) -> bool {
    let status = object.data.get("status").cloned().unwrap_or(serde_json::Value::Null);
    let (children, crds) = crate::reaper::recorded_children(&status);
    let state = ["tfstate", "rhaistate"].iter().any(|k| status.get(k).is_some_and(|v| !v.is_null()));
    !children.is_empty() || !crds.is_empty() || state
}

/// Whether the recorded tag still resolves to the recorded digest.
async fn check_recorded(recorded: &vynil_crds::InstalledPackage, context: &Context) -> RecordedCheck {
    let Ok(repo) = RepositoryRef::new(&recorded.registry, &recorded.image) else {
        return RecordedCheck::Gone;
    };
    let client = match registry_for(recorded.pull_secret.as_deref(), context).await {
        Ok(client) => client,
        Err(e) => return RecordedCheck::Unknown(e.to_string()),
    };
    match client.head_digest(&repo, &recorded.tag).await {
        Ok(found) => RecordedCheck::from_head(recorded.digest.as_deref(), found.as_deref()),
        Err(e) => RecordedCheck::Unknown(e.to_string()),
    }
}

/// What the cleanup planner reads (also serves `Explain`).
pub async fn observe_cleanup(
    instance: &Instance,
    slot: &JobSlot,
    context: &Context,
) -> Result<CleanupObserved, LifecycleError> {
    if instance.is_upstream_control_plane() {
        // Not asked: the cleanup planner holds it before reading anything,
        // and no Job of ours may be deleted or run for it.
        return Ok(CleanupObserved {
            answer: CleanupAnswer::NothingToDelete,
            hatch: Hatch::NotAsked,
            job: None,
            report: None,
            now: jiff::Timestamp::now(),
            max_attempts: context.max_attempts,
        });
    }
    let check = match &instance.status.package {
        Some(recorded) => Some(check_recorded(recorded, context).await),
        None => None,
    };
    let hatch = hatch(instance, context).await?;
    let confirmed = hatch == Hatch::Confirmed;
    let answer = match context
        .catalog
        .resolve_cleanup(instance, check, instance.status.have_child, confirmed)
        .await?
    {
        Cleanup::NothingToDelete => CleanupAnswer::NothingToDelete,
        Cleanup::Gone { code, message } => {
            CleanupAnswer::Gone { what: uninstall::Gone::from_code(&code), message }
        }
        Cleanup::WithoutPackage { warning } => CleanupAnswer::WithoutPackage { warning },
        Cleanup::UsePackage { package, pull_secret } => {
            CleanupAnswer::Revision(Box::new(delete_request(instance, &package, pull_secret, context)))
        }
    };
    let job = observe_job(slot, JobAction::Delete, context).await;
    let reaped = job.as_ref().is_some_and(|j| {
        j.state == JobState::Succeeded
            && j.fingerprint.as_deref() == Some(uninstall::reaper_fingerprint(instance).as_str())
    });
    let report = if reaped { reaper_report(&slot.name, context).await } else { None };
    Ok(CleanupObserved {
        answer,
        hatch,
        job,
        report,
        now: jiff::Timestamp::now(),
        max_attempts: context.max_attempts,
    })
}

/// The escape hatch of `instance`: asked by its annotation, opened only by
/// an admin's confirmation that still holds for this object and its
/// recorded children (`crate::confirmation`).
async fn hatch(instance: &Instance, context: &Context) -> Result<Hatch, LifecycleError> {
    if instance.delete_without_package.as_deref() != Some("true") {
        return Ok(Hatch::NotAsked);
    }
    let Some(uid) = instance.uid.as_deref() else { return Ok(Hatch::Unconfirmed) };
    let status = instance.object.get("status").cloned().unwrap_or(serde_json::Value::Null);
    Ok(match context.confirmations.read(uid).await? {
        None => Hatch::Unconfirmed,
        Some(confirmation) => match confirmation.voided(uid, &status, &instance.namespace) {
            Some(why) => Hatch::Void(why),
            None => Hatch::Confirmed,
        },
    })
}

/// The delete Job of `package`: with what the install recorded when it is
/// the recorded revision, else the package's own `value_script`.
fn delete_request(
    instance: &Instance,
    package: &pb::Package,
    pull_secret: Option<String>,
    context: &Context,
) -> JobRequest {
    let recorded = instance
        .status
        .package
        .as_ref()
        .filter(|r| r.registry == package.registry && r.image == package.image && r.tag == package.tag);
    let controller_values = match recorded.and_then(|r| r.controller_values.clone()) {
        Some(values) => values,
        None => vynil_runtime::convert::package_from_proto(package)
            .ok()
            .and_then(|p| p.content.value_script_source().ok().flatten())
            .and_then(|source| {
                let given = crate::script::upstream::Given {
                    cluster: None,
                    vynil_version: context.framework.to_string(),
                    reads: None,
                };
                crate::script::Host::new(instance.object.clone(), context.scripts, given)
                    .controller_values(Some(&source))
                    .ok()
            })
            .unwrap_or_else(|| "{}".into()),
    };
    let pull_secret = recorded.and_then(|r| r.pull_secret.clone()).or(pull_secret);
    let options_hash = install::options_hash(instance.options.as_ref());
    let digest = Some(package.digest.as_str()).filter(|d| !d.is_empty());
    let target =
        install::Target { registry: &package.registry, image: &package.image, tag: &package.tag, digest };
    let recommended = install::Recommended::default();
    let fingerprint = install::fingerprint(&target, &options_hash, &controller_values, &recommended);
    JobRequest {
        registry: package.registry.clone(),
        image: package.image.clone(),
        tag: package.tag.clone(),
        pull_secret,
        options_hash,
        controller_values,
        recommended,
        fingerprint,
    }
}

/// The reaper's report: the termination message of its `delete` container.
async fn reaper_report(job: &str, context: &Context) -> Option<ReaperReport> {
    let pods = context.pods.list(&ListParams::default().labels(&format!("job-name={job}"))).await.ok()?;
    pods.items.iter().find_map(|pod| {
        let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
        let delete = statuses.iter().find(|c| c.name == JobAction::Delete.as_str())?;
        let message = delete.state.as_ref()?.terminated.as_ref()?.message.as_deref()?;
        serde_json::from_str(message).ok()
    })
}

/// Single reconciles against kube's `tower-test` mock, as named scenarios
/// (kube-rs controller-rs style): each scenario answers exactly the API calls
/// the reconcile must make, in order, and fails on any other.
#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::Value;

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    fn context() -> (Arc<Context>, Handle) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "vynil-system");
        let store = |k: InstanceKind| {
            kube::runtime::reflector::store::Writer::<DynamicObject>::new(k.api_resource()).as_reader()
        };
        let stores = Stores {
            tenant: store(InstanceKind::Tenant),
            service: store(InstanceKind::Service),
            system: store(InstanceKind::System),
        };
        let (metrics, _) = LifecycleMetrics::register();
        let registry = RegistryClient::new(
            vynil_registry::TransportConfig::default(),
            CredentialStore::default(),
            Arc::new(vynil_registry::InMemoryMetadataCache::default()),
        )
        .unwrap();
        let settings = Settings {
            namespace: "vynil-system".into(),
            // Nothing listens here: a scenario that reached the catalog would fail.
            catalog: Catalog::connect("http://127.0.0.1:1").unwrap(),
            registry,
            agent: AgentSettings::default(),
            framework: semver::Version::new(0, 7, 7),
            scripts: ScriptLimits::default(),
            max_attempts: 3,
            reruns: plan::Reruns::default(),
            reporter: kube::runtime::events::Reporter {
                controller: "vynil-lifecycle".into(),
                instance: None,
            },
            leader: Leader::always(),
            requeue: plan::REQUEUE,
            max_running_jobs: 4,
        };
        (Arc::new(Context::new(client, stores, metrics, settings)), handle)
    }

    fn object(spec: Value, annotations: Value, finalized: bool) -> Arc<DynamicObject> {
        let finalizers = if finalized { json!([vynil_crds::finalizers::TENANT]) } else { json!([]) };
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "vynil.solidite.fr/v1", "kind": "TenantInstance",
                "metadata": {"name": "web", "namespace": "apps", "uid": "u1", "resourceVersion": "1",
                    "generation": 1, "annotations": annotations, "finalizers": finalizers},
                "spec": spec,
            }))
            .unwrap(),
        )
    }

    fn respond(status: u16, body: Value) -> Response<Body> {
        Response::builder().status(status).body(Body::from(serde_json::to_vec(&body).unwrap())).unwrap()
    }

    /// Answers the next request, checking its method and path.
    async fn expect(handle: &mut Handle, method: &str, path: &str, status: u16, body: Value) {
        let (request, send) = handle.next_request().await.expect("a request");
        assert_eq!(request.method().as_str(), method, "{}", request.uri());
        assert!(request.uri().path().starts_with(path), "expected {method} {path}, got {}", request.uri());
        send.send_response(respond(status, body));
    }

    fn not_found() -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"})
    }

    async fn scenario(
        object: Arc<DynamicObject>,
        script: impl FnOnce(Handle) -> tokio::task::JoinHandle<Handle>,
    ) -> Result<Action, LifecycleError> {
        let (context, handle) = context();
        let server = script(handle);
        let result =
            tokio::time::timeout(Duration::from_secs(10), reconcile(InstanceKind::Tenant, object, context))
                .await
                .expect("the reconcile finished");
        // The script answered exactly its requests: one more would have left
        // the reconcile waiting, and the timeout above fails the scenario.
        server.await.unwrap();
        result
    }

    fn spec() -> Value {
        json!({"jukebox": "box", "category": "apps", "package": "web"})
    }

    #[tokio::test]
    async fn a_new_instance_gets_the_finalizer_first_and_nothing_else() {
        let result = scenario(object(spec(), json!({}), false), |mut handle| {
            tokio::spawn(async move {
                let (request, send) = handle.next_request().await.unwrap();
                assert_eq!(request.method(), http::Method::PATCH);
                assert!(
                    request.uri().path().ends_with("/namespaces/apps/tenantinstances/web"),
                    "{}",
                    request.uri()
                );
                let mut body = (*object(spec(), json!({}), true)).clone();
                body.metadata.resource_version = Some("2".into());
                send.send_response(respond(200, serde_json::to_value(body).unwrap()));
                handle
            })
        })
        .await;
        assert_eq!(result.unwrap(), Action::await_change());
    }

    #[tokio::test]
    async fn a_suspended_instance_reads_its_job_and_asks_the_catalog_nothing() {
        let suspended = object(spec(), json!({"vynil.solidite.fr/suspend": "true"}), true);
        let result = scenario(suspended, |mut handle| {
            tokio::spawn(async move {
                expect(
                    &mut handle,
                    "GET",
                    "/apis/batch/v1/namespaces/vynil-system/jobs/tenant--apps--web",
                    404,
                    not_found(),
                )
                .await;
                handle
            })
        })
        .await;
        assert_eq!(result.unwrap(), Action::requeue(plan::REQUEUE));
    }

    #[tokio::test]
    async fn an_object_that_does_not_decode_publishes_an_event_and_fails_without_panicking() {
        let garbage = object(json!({"jukebox": 42, "category": ["x"]}), json!({}), true);
        let result = scenario(garbage, |mut handle| {
            tokio::spawn(async move {
                let (request, send) = handle.next_request().await.unwrap();
                assert_eq!(request.method(), http::Method::POST);
                assert!(request.uri().path().contains("/events"), "{}", request.uri());
                let body = request.into_body().collect_bytes().await.unwrap();
                let event: Value = serde_json::from_slice(&body).unwrap();
                assert_eq!(event["reason"], "InvalidObject", "{event}");
                send.send_response(respond(201, event));
                handle
            })
        })
        .await;
        assert!(matches!(result, Err(LifecycleError::Decode(_))), "{result:?}");
    }
}
