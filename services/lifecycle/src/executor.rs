//! What a reconcile does once planned: the steps of [`crate::install_plan`] and
//! [`crate::uninstall_plan`] (status writes, Job creation and deletion), each
//! read back before it counts: a status write is done when the returned
//! object carries it, a Job when it can be read with its fingerprint, a
//! deletion when the Job is gone. Job creation holds a slot under
//! `--max-running-jobs`.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use kube::{
    Api, ResourceExt,
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
            step @ (Step::Event { .. } | Step::JukeboxWarning { .. } | Step::Audited { .. }) => {
                announce(step, (instance, object), context).await
            }
            Step::RemoveForceReinstall => {
                resource_version = remove_force_reinstall(&api, instance, object, context).await?
            }
            Step::DeleteJob => delete_job(job_name, context).await?,
            Step::RecordTarget(mut target) => {
                target.job = job_name.to_string();
                // The ledger first: the status is its display copy.
                context.upgrades.started(uid_of(instance)?, &instance.reference(), &target).await?;
                let patch = status_patch(json!({"target": target}), &mut lacks_conditions, &resource_version);
                let recorded = ("status.target", "/status/target/revision/fingerprint");
                let expected = target.revision.fingerprint.as_deref();
                resource_version = record_status(&api, instance, &patch, recorded, expected).await?;
            }
            Step::CreateJob(request) => {
                create_agent_job((instance, object), job_name, JobAction::Install, &request, context).await?
            }
            Step::CreateDeleteJob(request) => {
                create_agent_job((instance, object), job_name, JobAction::Delete, &request, context).await?
            }
            Step::CreateReaperJob { fingerprint } => {
                create_reaper_job(instance, job_name, &fingerprint, context).await?
            }
            step @ (Step::RecordPhases(_) | Step::Quarantine(_)) => {
                record_upgrade(step, instance, context).await?
            }
            Step::RecordInstalled(package) => {
                // The ledger first (the later waves read it): the status is its display copy.
                context.upgrades.credited(uid_of(instance)?, &instance.reference(), &package).await?;
                let fields = json!({"package": package, "target": null});
                let patch = status_patch(fields, &mut lacks_conditions, &resource_version);
                let recorded = ("status.package", "/status/package/fingerprint");
                let expected = package.fingerprint.as_deref();
                resource_version = record_status(&api, instance, &patch, recorded, expected).await?;
            }
        }
    }
    if conditions_changed {
        context.ensure_leader()?;
        write_conditions(&api, instance, &conditions, &resource_version).await?;
    }
    Ok(())
}

/// Removes the force-reinstall annotation, read back, and says so in the
/// audit trail (a forced run); the instance's new resource version.
async fn remove_force_reinstall(
    api: &Api<DynamicObject>,
    instance: &Instance,
    object: &DynamicObject,
    context: &Context,
) -> Result<Option<String>, LifecycleError> {
    let patch = json!({"metadata": {"annotations": {vynil_crds::annotations::FORCE_REINSTALL: null}}});
    let written = api
        .patch(&instance.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(LifecycleError::kube("removing the force-reinstall annotation"))?;
    if written.annotations().contains_key(vynil_crds::annotations::FORCE_REINSTALL) {
        return Err(LifecycleError::NotDone("the force-reinstall annotation is still there".into()));
    }
    let actor = "whoever annotated the instance (vynil.solidite.fr/force-reinstall)";
    let note = "a forced run (vynil.solidite.fr/force-reinstall): the agent Job runs again now".to_string();
    context.audit(object, instance.kind, false, ("ForcedRun", actor), note).await;
    Ok(written.resource_version())
}

/// An Event (on the instance or its JukeBox), with its audit line when it
/// overrides a gate; best effort, as every Event.
async fn announce(step: Step, (instance, object): (&Instance, &DynamicObject), context: &Context) {
    match step {
        Step::Event { warning, reason, note } => {
            context.publish(object, instance.kind, warning, reason, note).await
        }
        Step::JukeboxWarning { reason, note } => {
            context.publish_on_jukebox(&instance.jukebox, reason, note).await
        }
        Step::Audited { warning, reason, actor, note } => {
            context.audit(object, instance.kind, warning, (reason, actor), note).await
        }
        _ => {}
    }
}

/// Writes a status `patch` and reads back the fingerprint at `recorded`'s
/// pointer (a field the API server pruned is not done); the instance's new
/// resource version.
async fn record_status(
    api: &Api<DynamicObject>,
    instance: &Instance,
    patch: &serde_json::Value,
    (field, pointer): (&'static str, &str),
    expected: Option<&str>,
) -> Result<Option<String>, LifecycleError> {
    let written = api
        .patch_status(&instance.name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map_err(LifecycleError::kube(format!("recording {field}")))?;
    if written.data.pointer(pointer).and_then(|v| v.as_str()) != expected {
        return Err(LifecycleError::NotDone(pruned(field)));
    }
    Ok(written.resource_version())
}

/// Writes the condition list with compare-and-set (a list written over an
/// agent's write would lose it), read back.
async fn write_conditions(
    api: &Api<DynamicObject>,
    instance: &Instance,
    conditions: &[Condition<String>],
    resource_version: &Option<String>,
) -> Result<(), LifecycleError> {
    let patch =
        json!({"metadata": {"resourceVersion": resource_version}, "status": {"conditions": conditions}});
    let written = api
        .patch_status(&instance.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(LifecycleError::kube("writing the conditions"))?;
    if written.data.pointer("/status/conditions") != Some(&json!(conditions)) {
        return Err(LifecycleError::NotDone("the conditions were not recorded".into()));
    }
    Ok(())
}

/// Renders and creates the reaper Job for a confirmed delete without package.
async fn create_reaper_job(
    instance: &Instance,
    job_name: &str,
    fingerprint: &str,
    context: &Context,
) -> Result<(), LifecycleError> {
    let rendered = job::render_reaper(
        &context.agent,
        job_name,
        instance.kind,
        &instance.namespace,
        &instance.name,
        fingerprint,
        context.confirmations.namespace(),
    )
    .map_err(|e| LifecycleError::Invalid(format!("rendering the reaper Job: {e}")))?;
    create_job(job_name, &rendered, fingerprint, context).await
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
    let kube = |e| LifecycleError::kube(format!("deleting the agent Job {name}"))(e);
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
    context.job_queue.deleted(name);
    Ok(())
}

pub(crate) async fn create_job(
    name: &str,
    rendered: &Job,
    fingerprint: &str,
    context: &Context,
) -> Result<(), LifecycleError> {
    let kube = |e| LifecycleError::kube(format!("creating the agent Job {name}"))(e);
    let _slot = context.job_slots.lock().await;
    let queue = &context.job_queue;
    let running = match queue.running_besides(name) {
        Some(running) => running,
        None => {
            let selector = format!("{}={}", labels::COMPONENT, labels::AGENT);
            let jobs = context.jobs.list(&ListParams::default().labels(&selector)).await.map_err(kube)?;
            queue.listed(&jobs.items);
            queue.counted_besides(name)
        }
    };
    if running >= queue.cap() {
        return Err(LifecycleError::Queued(format!(
            "{running} agent Jobs run, the cap is {}: {name} waits for a slot",
            queue.cap()
        )));
    }
    context.jobs.create(&PostParams::default(), rendered).await.map_err(kube)?;
    let read = context.jobs.get_opt(name).await.map_err(kube)?;
    let found = read.as_ref().and_then(|j| j.annotations().get(job::FINGERPRINT).cloned());
    if found.as_deref() != Some(fingerprint) {
        return Err(LifecycleError::NotDone(format!("the agent Job {name} cannot be read back")));
    }
    if let Some(job) = &read {
        queue.created(name, &job.uid().unwrap_or_default());
    }
    Ok(())
}

/// Renders the agent Job of `action` and creates it.
pub(crate) async fn create_agent_job(
    (instance, object): (&Instance, &DynamicObject),
    job_name: &str,
    action: JobAction,
    request: &JobRequest,
    context: &Context,
) -> Result<(), LifecycleError> {
    warn_if_tag_moved(instance, object, request, context).await;
    // The Job mounts its pull secret: one that is gone, unusable, or that no
    // JukeBox may name (`[E_SECRET_NOT_ALLOWED]`) runs no Job; a Warning
    // Event `PullSecretRefused` says why, and the reconcile comes back.
    let client = match context.registry_for(request.pull_secret.as_deref()).await {
        Ok(client) => client,
        Err(LifecycleError::Invalid(why)) => {
            context.publish(object, instance.kind, true, "PullSecretRefused", why.clone()).await;
            return Err(LifecycleError::Pending { why, retry_after: std::time::Duration::from_secs(60) });
        }
        Err(other) => return Err(other),
    };
    refuse_if_digest_gone((instance, object), request, &client, context).await?;
    if action == JobAction::Install {
        refuse_if_unverified((instance, object), request, context).await?;
    }
    if let (Some(recorded), Some(digest)) = (&instance.status.package, &request.digest)
        && recorded.digest.is_none()
        && (recorded.registry.as_str(), recorded.image.as_str(), recorded.tag.as_str())
            == (request.registry.as_str(), request.image.as_str(), request.tag.as_str())
    {
        // Resolved once, recorded before the Job: a retry pulls the same bytes.
        context.upgrades.pinned(uid_of(instance)?, &instance.reference(), &recorded.tag, digest).await?;
    }
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

/// Before a Job pulls its chosen digest: where the tag points now. The Job
/// runs pinned whatever the answer (`crate::job`); a tag re-pointed since
/// the choice (a pusher who cannot sign, or a re-publication) is a Warning
/// Event naming both digests, so that an operator hears of it. An
/// unreachable registry says nothing: the pin holds either way.
async fn warn_if_tag_moved(
    instance: &Instance,
    object: &DynamicObject,
    request: &JobRequest,
    context: &Context,
) {
    let Some(chosen) = &request.digest else { return };
    let Ok(repo) = vynil_registry::RepositoryRef::new(&request.registry, &request.image) else { return };
    let Ok(client) = context.registry_for(request.pull_secret.as_deref()).await else { return };
    let Ok(Some(now)) = client.head_digest(&repo, &request.tag).await else { return };
    if now != *chosen {
        let (registry, image, tag) = (&request.registry, &request.image, &request.tag);
        let asked = match &context.scanner {
            Some(scanner) => match scanner.rescan(registry, image, tag).await {
                Ok(scans) => format!("a scan of the repository was asked ({scans} JukeBox(es))"),
                Err(error) => {
                    tracing::warn!(%error, "asking a scan of a moved tag's repository");
                    "the JukeBox's next scan considers the new bytes (the scanner could not be asked)".into()
                }
            },
            None => "the JukeBox's next scan considers the new bytes".into(),
        };
        let note = format!(
            "the tag {tag} of {registry}/{image} now names {now}, not {chosen}, the digest chosen for this instance: the agent Job pulls {chosen}; {asked}"
        );
        context.publish(object, instance.kind, true, "TagMoved", note).await;
    }
}

/// Before a Job pulls its chosen digest: that the registry still serves it.
/// A digest gone (deleted, garbage-collected) would fail the Job's unpack
/// on every retry: no Job, `[E_DIGEST_GONE] <digest>` (a Warning Event and
/// the reconcile's reason), until a scan lists what the tag names now (an
/// install chooses again) or the package is gone (a cleanup falls to
/// `[E_PACKAGE_GONE]` and the escape hatch); a recorded revision's digest
/// gone is the cleanup's own fall-through (`crate::observe::check_recorded`).
/// An unreachable registry says nothing here: the Job's own pull decides.
async fn refuse_if_digest_gone(
    (instance, object): (&Instance, &DynamicObject),
    request: &JobRequest,
    client: &vynil_registry::RegistryClient,
    context: &Context,
) -> Result<(), LifecycleError> {
    let Some(chosen) = &request.digest else { return Ok(()) };
    let Ok(repo) = vynil_registry::RepositoryRef::new(&request.registry, &request.image) else {
        return Ok(());
    };
    let Ok(None) = client.head_digest(&repo, chosen).await else { return Ok(()) };
    let why = vynil_crds::coded_message(
        "E_DIGEST_GONE",
        &format!(
            "{chosen}: {}/{}:{} was chosen at this digest, which the registry no longer serves; no agent Job until a scan lists the revision again",
            request.registry, request.image, request.tag
        ),
    );
    context.publish(object, instance.kind, true, "DigestGone", why.clone()).await;
    Err(LifecycleError::Pending { why, retry_after: std::time::Duration::from_secs(60) })
}

/// Under the JukeBox's enforced signature policy, the verdict of the digest
/// an install Job pulls, read again from the registry's evidence with the
/// JukeBox's keys (#65 item 6): the status's verdict chose it, but whoever
/// could write that status (or, before, Redis) must not make the agent run
/// bytes no trusted key signed. Unverified: no Job, `[E_UNVERIFIED]` (a
/// Warning Event `SignatureRefused`). A delete Job is never refused (a
/// removed key must not make an instance impossible to uninstall).
async fn refuse_if_unverified(
    (instance, object): (&Instance, &DynamicObject),
    request: &JobRequest,
    context: &Context,
) -> Result<(), LifecycleError> {
    let jukebox = crate::jukeboxes::of(instance, context).await?;
    let enforced =
        jukebox.and_then(|j| j.spec.verify.as_ref().map(|v| v.mode)) == Some(vynil_crds::VerifyMode::Enforce);
    if !enforced {
        return Ok(());
    }
    let verdict = match &request.digest {
        Some(digest) => {
            let repo = vynil_registry::RepositoryRef::new(&request.registry, &request.image)
                .map_err(|e| LifecycleError::Invalid(e.to_string()))?;
            crate::signatures::read(instance, &repo, digest, request.pull_secret.as_deref(), context).await?
        }
        None => Some(vynil_rules::signature::Verdict::Malformed { problem: "its digest is unknown".into() }),
    };
    let Some(verdict) = verdict.filter(|v| !v.is_verified()) else { return Ok(()) };
    let why = vynil_crds::coded_message(
        "E_UNVERIFIED",
        &format!(
            "{}:{}: {} (read again from the registry before its Job); no agent Job under the JukeBox's enforced signature policy",
            request.image,
            request.tag,
            verdict.describe()
        ),
    );
    context.publish(object, instance.kind, true, "SignatureRefused", why.clone()).await;
    Err(LifecycleError::Pending { why, retry_after: std::time::Duration::from_secs(300) })
}

/// Writes a step into the instance's upgrade record (read back by its store).
async fn record_upgrade(step: Step, instance: &Instance, context: &Context) -> Result<(), LifecycleError> {
    let (uid, key) = (uid_of(instance)?, instance.reference());
    match step {
        Step::RecordPhases(before) => context.upgrades.phases_before(uid, &key, &before).await,
        Step::Quarantine(entry) => context.upgrades.quarantine(uid, &key, &entry).await,
        // Not the record's: `execute` sends only the two above.
        _ => Ok(()),
    }
}

/// The instance's UID, under which lifecycle records what tenants may not write.
fn uid_of(instance: &Instance) -> Result<&str, LifecycleError> {
    instance.uid.as_deref().ok_or_else(|| {
        LifecycleError::Invalid(format!(
            "{} has no UID: nothing can be recorded for it",
            instance.reference()
        ))
    })
}
