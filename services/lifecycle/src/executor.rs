//! What a reconcile does once planned: the steps of [`crate::install_plan`] and
//! [`crate::uninstall_plan`] (status writes, Job creation and deletion), each
//! read back before it counts: a status write is done when the returned
//! object carries it, a Job when it can be read with its fingerprint, a
//! deletion when the Job is gone. Job creation holds a slot under
//! `--max-running-jobs`.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use kube::{
    ResourceExt,
    api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use vynil_crds::{Condition, labels, set_condition};

use crate::{
    LifecycleError,
    context::Context,
    install_plan::{self, JobRequest, Step},
    instance::Instance,
    job::{self, Action as JobAction},
};

/// How long a Job deletion is waited for before the reconcile is retried.
pub(crate) const JOB_DELETION_WAIT: Duration = Duration::from_secs(20);

pub(crate) async fn execute(
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
    conditions.retain(|c| c.condition_type != install_plan::LEGACY_DELETING);
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
pub(crate) fn pruned(field: &str) -> String {
    format!(
        "{field} was not recorded: the API server dropped it; is the CRD from deploy/crds installed \
         (kubectl apply --server-side -f deploy/crds/vynil.yaml)?"
    )
}

/// A status merge patch of `fields`; when the status has no `conditions` yet
/// (upstream's types require the list) it adds an empty one, guarded by the
/// object's `resourceVersion`.
pub(crate) fn status_patch(
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

pub(crate) async fn delete_job(name: &str, context: &Context) -> Result<(), LifecycleError> {
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

pub(crate) async fn create_job(
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
pub(crate) fn finished(job: &Job) -> bool {
    job.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
        cs.iter().any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
    })
}

/// Renders the agent Job of `action` and creates it.
pub(crate) async fn create_agent_job(
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
