//! What a reconcile reads before it plans: the catalog's answer, the
//! cluster's facts, the agent Job and its pods, the registry (a recorded
//! revision, `initFrom.version`) and the confirmations of a delete. Each
//! answer is "unknown, retry" when its source cannot say, never "absent".
//! Also what `Explain` shows (`crate::grpc`).

use k8s_openapi::api::batch::v1::Job;
use kube::{ResourceExt, api::ListParams};
use vynil_crds::labels;
use vynil_proto::catalog::v1 as pb;
use vynil_registry::RepositoryRef;
use vynil_rules::{install, selection::RecordedCheck};

use crate::{
    LifecycleError,
    catalog_client::{Answer, Cleanup},
    context::Context,
    facts,
    install_plan::{
        HeldBack, InitVersion, JobRequest, JobState, Observed, ObservedJob, Resolution, RevisionChecks,
    },
    instance::Instance,
    job::{self, Action as JobAction},
    reaper::ReaperReport,
    uninstall_plan::{self, CleanupAnswer, CleanupObserved, Hatch},
    upgrades::UpgradeRecord,
};

/// What the planner reads, gathered for `instance` as its record `upgrades`
/// says it stands (`crate::ledger`; also serves `Explain`).
pub async fn observe(
    instance: &Instance,
    upgrades: UpgradeRecord,
    slot: &JobSlot,
    context: &Context,
) -> Result<Observed, LifecycleError> {
    // Not asked: the planner holds both before reading the resolution.
    let Resolved { resolution, jukebox_policy, held_back } =
        if instance.suspended || instance.is_upstream_control_plane() {
            Resolved { resolution: Resolution::JukeboxMissing, ..Resolved::default() }
        } else {
            resolve(instance, &upgrades, context).await?
        };
    let jukebox_policy = jukebox_policy.as_ref().map(|p| (instance.jukebox.as_str(), p));
    let upgrade_policy = vynil_crds::UpgradePolicy::effective(jukebox_policy, instance.own_policy().as_ref());
    let waves = upgrade_policy.as_ref().is_some_and(|p| !p.policy.waves.is_empty());
    if let Some(uid) = &instance.uid {
        // Before its peers are read: a move after that read wakes it (`crate::fleet`).
        context.under_waves.mark(uid, waves);
    }
    let fleet = if waves && instance.installed_tag().is_some() {
        crate::fleet::members(instance, &context.stores, &context.upgrades).await?
    } else {
        Vec::new()
    };
    let (init_version, checks) = match &resolution {
        Resolution::Package { package, pull_secret } => {
            let init_version =
                init_version(instance, package, pull_secret.as_deref(), held_back.verify, context).await?;
            let init_version = held_back.refusing_recalled(init_version);
            // A value script may read anything upstream's helpers give.
            let scripted = !matches!(package.content.value_script_source(), Ok(None));
            let all = install::Asks { version: true, crds: true, instances: true };
            let asked = facts::Asked {
                namespace: &instance.namespace,
                instance: &instance.object,
                tenant_label: &context.agent.tenant_label,
                scripts: context.scripts,
                vynil_version: &context.framework,
                asks: if scripted { all } else { install::Asks::of(&package.content) },
                content: &package.content,
            };
            let facts = facts::gather(&context.client, &context.stores, asked).await?;
            let content = package.content.clone();
            let kind = instance.kind.package_type();
            let (options, framework) = (instance.options.clone(), context.framework.clone());
            // Scripts may read the cluster (upstream's helpers): off the runtime.
            let checks = crate::script::upstream::off_the_runtime(move || {
                let controller_values = content
                    .value_script_source()
                    .map_err(|e| e.to_string())
                    .and_then(|source| facts.script.controller_values(source.as_deref()));
                RevisionChecks {
                    options: install::check_options(content.options.as_ref(), options.as_ref()),
                    unmet: install::unmet_requirement(&content, kind, &framework, &facts),
                    recommended: install::recommended(&content, kind, &facts),
                    controller_values,
                }
            })
            .await
            .map_err(LifecycleError::Unavailable)?;
            (init_version, Some(checks))
        }
        _ => (InitVersion::NotAsked, None),
    };
    Ok(Observed {
        resolution,
        init_version,
        checks,
        job: observe_job(slot, JobAction::Install, context).await,
        now: jiff::Timestamp::now(),
        max_attempts: context.max_attempts,
        reruns: context.reruns.clone(),
        upgrades,
        rollback: context.rollback && !instance.rollback_off,
        upgrade_policy,
        held_back,
        fleet,
    })
}

/// What the catalog answered for an instance.
#[derive(Debug, Default)]
struct Resolved {
    resolution: Resolution,
    jukebox_policy: Option<vynil_crds::UpgradePolicy>,
    held_back: HeldBack,
}

/// The catalog's answer for `instance`, with the revisions quarantined for
/// it (in its record `upgrades`) left out, and during a rollback, the
/// revision it goes back to.
async fn resolve(
    instance: &Instance,
    upgrades: &UpgradeRecord,
    context: &Context,
) -> Result<Resolved, LifecycleError> {
    let (quarantined, back_to) = (upgrades.quarantined_tags(), upgrades.rolling_back_to(instance));
    let answer = context.catalog.resolve(instance, &quarantined, back_to).await?;
    let jukebox = crate::jukeboxes::of(instance, context).await?;
    let Answer { mut resolution, jukebox_policy, held_back } =
        crate::jukeboxes::confirmed(answer, jukebox.as_deref(), &instance.jukebox);
    if let (Some(from), Resolution::NoMatch { .. }) = (back_to, &resolution)
        && let Some(recorded) = recorded_rollback(instance, from, held_back.verify, context).await?
    {
        resolution = recorded;
    }
    Ok(Resolved { resolution, jukebox_policy, held_back })
}

/// The revision a rollback goes back to when the catalog no longer lists it
/// (its view keeps the newest revision of each type and the waypoints, so
/// the one an instance ran before an upgrade has usually left it): the
/// recorded revision, trusted only as a cleanup trusts it — its tag still
/// at the recorded digest, from a source of the instance's JukeBox (the
/// catalog's `ResolveCleanup` decides) — with its content read from the
/// registry, and under a signature policy its verdict. `None`: it cannot be used (the plan says the catalog's why).
async fn recorded_rollback(
    instance: &Instance,
    from: &str,
    verify: Option<vynil_rules::signature::VerifyMode>,
    context: &Context,
) -> Result<Option<Resolution>, LifecycleError> {
    let Some(recorded) = instance.status.package.as_ref().filter(|p| p.tag == from) else {
        return Ok(None);
    };
    match check_recorded(instance, recorded, context).await?.0 {
        RecordedCheck::Resolves => {}
        RecordedCheck::Gone => return Ok(None),
        RecordedCheck::Unknown(why) => {
            return Err(LifecycleError::Unavailable(format!(
                "registry, checking the rollback's {from}: {why}"
            )));
        }
    }
    let answer =
        context.catalog.resolve_cleanup(instance, Some(RecordedCheck::Resolves), true, false).await?;
    let Cleanup::UsePackage { package, .. } = answer else {
        return Ok(None);
    };
    if (package.registry.as_str(), package.image.as_str(), package.tag.as_str())
        != (recorded.registry.as_str(), recorded.image.as_str(), from)
    {
        return Ok(None);
    }
    // The JukeBox's own pull secret, never one the catalog's cache names.
    let jukebox = crate::jukeboxes::of(instance, context).await?;
    let pull_secret = jukebox.and_then(|j| j.spec.pull_secret.clone());
    let repo = RepositoryRef::new(&recorded.registry, &recorded.image)
        .map_err(|e| LifecycleError::Invalid(e.to_string()))?;
    let client = context.registry_for(pull_secret.as_deref()).await?;
    let found = client
        .tag_metadata(&repo, from)
        .await
        .map_err(|e| LifecycleError::Unavailable(format!("registry, reading the rollback's {from}: {e}")))?;
    let Some(found) = found.filter(|f| recorded.digest.as_deref().is_none_or(|d| d == f.digest)) else {
        return Ok(None);
    };
    let vynil_rules::ManifestMetadata::Vynil(content) = found.metadata else {
        return Ok(None);
    };
    let mut package = vynil_rules::Package::new(&recorded.registry, &recorded.image, from, *content)
        .with_digest(&found.digest);
    if verify.is_some() {
        // Judged as the catalog's revisions are (the planner refuses an unverified one).
        package.signature =
            crate::signatures::read(instance, &repo, &found.digest, pull_secret.as_deref(), context).await?;
    }
    Ok(Some(Resolution::Package { package: Box::new(package), pull_secret }))
}

/// `initFrom.version` on a first install: the JukeBox's status entry (in the
/// API server, `crate::jukeboxes`), else the registry (a HEAD with the
/// JukeBox's pull secret). An unreachable registry
/// is an error to retry, never "not found". Under an enforced signature
/// policy (`verify`), an unverified version is refused (`crate::signatures`).
pub(crate) async fn init_version(
    instance: &Instance,
    package: &vynil_rules::Package,
    pull_secret: Option<&str>,
    verify: Option<vynil_rules::signature::VerifyMode>,
    context: &Context,
) -> Result<InitVersion, LifecycleError> {
    let Some(version) = instance.init_from.as_ref().and_then(|i| i.version.clone()) else {
        return Ok(InitVersion::NotAsked);
    };
    if instance.installed_tag().is_some() {
        return Ok(InitVersion::NotAsked);
    }
    let repo = RepositoryRef::new(&package.registry, &package.image)
        .map_err(|e| LifecycleError::Invalid(e.to_string()))?;
    let jukebox = crate::jukeboxes::of(instance, context).await?;
    let listed = jukebox
        .as_deref()
        .and_then(|j| crate::jukeboxes::listed(j, &package.registry, &package.image, &version))
        .filter(|p| p.is_of(&instance.category, &instance.package, instance.kind.package_type()));
    let (found, verdict) = match listed {
        Some(p) => (InitVersion::Found { tag: version, digest: p.digest.clone() }, p.signature.clone()),
        None => {
            let client = context.registry_for(pull_secret).await?;
            match client.head_digest(&repo, &version).await {
                Ok(Some(digest)) => (InitVersion::Found { tag: version, digest: Some(digest) }, None),
                Ok(None) => return Ok(InitVersion::NotFound(version)),
                Err(e) => {
                    return Err(LifecycleError::Unavailable(format!(
                        "registry, looking for initFrom.version {version}: {e}"
                    )));
                }
            }
        }
    };
    crate::signatures::refusing_unverified(found, verdict, verify, instance, (&repo, pull_secret), context)
        .await
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
        let found = context
            .jobs
            .get_opt(&name)
            .await
            .map_err(LifecycleError::kube(format!("reading the agent Job {name}")))?;
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
pub(crate) async fn observe_job(slot: &JobSlot, wanted: JobAction, context: &Context) -> Option<ObservedJob> {
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
pub(crate) async fn pod_failure(job: &str, context: &Context) -> Option<String> {
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

/// Whether the recorded revision can still be pulled: its digest, which
/// every agent Job pulls (a tag moved since changes nothing: the Job runs
/// the recorded bytes; a digest gone is gone, `[E_DIGEST_GONE]`, and the
/// cleanup falls to the catalog's selection). A revision recorded without a
/// digest (an instance adopted from upstream) has its tag resolved here;
/// the digest found is answered too, for the Job to pull and the ledger to
/// record before it (`crate::executor`). The
/// record is the ledger's (a previous release's status), checked: only a revision in
/// a repository where the catalog lists the instance's own package is
/// checked (`vynil_rules::selection::is_own_repository`), with the
/// JukeBox's pull secret, never one named in status; any other is treated
/// as gone without asking its registry (no request to a host of the
/// tenant's choice), and the cleanup falls to the catalog's revision. A
/// catalog that cannot answer is an error to retry.
pub(crate) async fn check_recorded(
    instance: &Instance,
    recorded: &vynil_crds::InstalledPackage,
    context: &Context,
) -> Result<(RecordedCheck, Option<String>), LifecycleError> {
    let (own, pull_secret) = context.catalog.own_repositories(instance).await?;
    let listed: Vec<(&str, &str)> = own.iter().map(|(r, i)| (r.as_str(), i.as_str())).collect();
    let revision = vynil_rules::selection::RecordedRevision {
        registry: recorded.registry.clone(),
        image: recorded.image.clone(),
        tag: recorded.tag.clone(),
        digest: recorded.digest.clone().unwrap_or_default(),
        package_type: instance.kind.package_type(),
    };
    let credited =
        vynil_rules::repository::listed(&instance.listed_before, &recorded.registry, &recorded.image);
    if !vynil_rules::selection::is_own_repository(&revision, &listed) && !credited {
        return Ok((RecordedCheck::Gone, None));
    }
    let Ok(repo) = RepositoryRef::new(&recorded.registry, &recorded.image) else {
        return Ok((RecordedCheck::Gone, None));
    };
    let client = match context.registry_for(pull_secret.as_deref()).await {
        Ok(client) => client,
        Err(e) => return Ok((RecordedCheck::Unknown(e.to_string()), None)),
    };
    let reference = recorded.digest.as_deref().unwrap_or(&recorded.tag);
    Ok(match client.head_digest(&repo, reference).await {
        Ok(found) => (RecordedCheck::from_head(recorded.digest.as_deref(), found.as_deref()), found),
        Err(e) => (RecordedCheck::Unknown(e.to_string()), None),
    })
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
            unverified: None,
        });
    }
    let (check, found) = match &instance.status.package {
        Some(recorded) => {
            let (check, found) = check_recorded(instance, recorded, context).await?;
            (Some(check), found)
        }
        None => (None, None),
    };
    let hatch = hatch(instance, context).await?;
    let confirmed = hatch == Hatch::Confirmed;
    let mut unverified = None;
    let answer = match context
        .catalog
        .resolve_cleanup(instance, check, instance.status.have_child, confirmed)
        .await?
    {
        Cleanup::NothingToDelete => CleanupAnswer::NothingToDelete,
        Cleanup::Gone { code, message } => {
            CleanupAnswer::Gone { what: uninstall_plan::Gone::from_code(&code), message }
        }
        Cleanup::WithoutPackage { warning } => CleanupAnswer::WithoutPackage { warning },
        Cleanup::UsePackage { package, unverified: why, .. } => {
            let pull_secret = confirmed_cleanup(instance, &package, context).await?;
            unverified = why.map(|why| {
                vynil_crds::coded_message(
                    "E_UNVERIFIED",
                    &format!(
                        "deleting with {}:{}, which the JukeBox's signature policy does not verify ({why}); \
                         its delete Job runs anyway, so that the instance can be removed",
                        package.image, package.tag
                    ),
                )
            });
            let mut package = package;
            if package.digest.is_empty() {
                // The recorded revision, adopted without a digest: pinned to the one its tag named.
                package.digest = found.filter(|_| is_recorded(instance, &package)).unwrap_or_default();
            }
            CleanupAnswer::Revision(Box::new(delete_request(instance, &package, pull_secret, context)))
        }
    };
    let job = observe_job(slot, JobAction::Delete, context).await;
    let reaped = job.as_ref().is_some_and(|j| {
        j.state == JobState::Succeeded
            && j.fingerprint.as_deref() == Some(uninstall_plan::reaper_fingerprint(instance).as_str())
    });
    let report = if reaped { reaper_report(&slot.name, context).await } else { None };
    Ok(CleanupObserved {
        answer,
        unverified,
        hatch,
        job,
        report,
        now: jiff::Timestamp::now(),
        max_attempts: context.max_attempts,
    })
}

/// The pull secret a delete Job of the catalog's cleanup revision `package`
/// uses: the JukeBox's. What Redis alone says never runs: the catalog's own
/// revision must be the JukeBox status's (the recorded one was checked
/// against the registry, `check_recorded`), else the delete waits.
async fn confirmed_cleanup(
    instance: &Instance,
    package: &pb::Package,
    context: &Context,
) -> Result<Option<String>, LifecycleError> {
    let jukebox = crate::jukeboxes::of(instance, context).await?;
    if !is_recorded(instance, package)
        && let Some(why) = crate::jukeboxes::unlisted_cleanup(jukebox.as_deref(), &instance.jukebox, package)
    {
        return Err(LifecycleError::Pending {
            why: vynil_crds::coded_message(
                "E_UNCONFIRMED",
                &format!("{why}: no delete Job until they agree"),
            ),
            retry_after: std::time::Duration::from_secs(60),
        });
    }
    Ok(jukebox.and_then(|j| j.spec.pull_secret.clone()))
}

/// Whether `package` is the instance's recorded revision (its location).
fn is_recorded(instance: &Instance, package: &pb::Package) -> bool {
    instance.status.package.as_ref().is_some_and(|r| {
        (r.registry.as_str(), r.image.as_str(), r.tag.as_str())
            == (package.registry.as_str(), package.image.as_str(), package.tag.as_str())
    })
}

/// The escape hatch of `instance`: asked by its annotation, opened only by
/// an admin's confirmation that still holds for this object and its
/// recorded children (`crate::confirmation`).
pub(crate) async fn hatch(instance: &Instance, context: &Context) -> Result<Hatch, LifecycleError> {
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
pub(crate) fn delete_request(
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
        None => vynil_proto::convert::package_from_proto(package)
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
    // The JukeBox's pull secret, never one named in status (tenant-writable).
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
        digest: digest.map(String::from),
        pull_secret,
        options_hash,
        controller_values,
        recommended,
        fingerprint,
    }
}

/// The reaper's report: the termination message of its `delete` container.
pub(crate) async fn reaper_report(job: &str, context: &Context) -> Option<ReaperReport> {
    let pods = context.pods.list(&ListParams::default().labels(&format!("job-name={job}"))).await.ok()?;
    pods.items.iter().find_map(|pod| {
        let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
        let delete = statuses.iter().find(|c| c.name == JobAction::Delete.as_str())?;
        let message = delete.state.as_ref()?.terminated.as_ref()?.message.as_deref()?;
        serde_json::from_str(message).ok()
    })
}
