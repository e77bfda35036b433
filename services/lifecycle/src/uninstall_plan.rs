//! The deletion decision, pure: `cleanup(&instance, &observed) -> Plan`.
//!
//! Which revision deletes an instance is the catalog's `ResolveCleanup` (the
//! rules crate's three-way decision: the recorded revision while its tag
//! still resolves to the recorded digest, else the strict catalog lookup,
//! else `[E_PACKAGE_GONE]` / `[E_JUKEBOX_GONE]`). Here only the sequencing:
//!
//! - nothing recorded to undo: released at once, as upstream;
//! - a revision: the install Job goes, a delete Job runs that revision's hooks
//!   with what the install recorded (pull secret, controller values); a
//!   `Failed` Job is seen when Kubernetes marks it (the Job watch), kept for
//!   its logs, counted once and replaced after backoff; `Complete` → the Job
//!   goes and so does the finalizer;
//! - gone: a condition naming what is missing and the two ways out, a
//!   Warning event, a retry whose interval doubles (the time since the
//!   condition first said so, 1 min to 1 h);
//! - `vynil.solidite.fr/delete-without-package: "true"` (read at each
//!   reconcile, so adding it after deletion began counts) together with an
//!   admin's confirmation that still holds (`crate::confirmation`: the
//!   annotation alone is writable by tenants and opens nothing): the reaper
//!   Job deletes the confirmed children without package hooks; the finalizer goes
//!   once its report shows every child it was allowed to delete verified
//!   gone, with a Warning that no hooks ran and what was left for a human.
//!   Any other value is refused in the condition.

use std::time::Duration;

use vynil_crds::{AgentTarget, ConditionStatus, InstalledPackage, message_code};

use crate::{
    install_plan::{
        Blocker, ConditionType, Criterion, FailedJob, FailureWording, JobRequest, JobState, LEGACY_DELETING,
        ObservedJob, Outcome, Plan, REQUEUE, Step, account_failure, failed,
    },
    instance::Instance,
    reaper::ReaperReport,
};

const GONE_FIRST: Duration = Duration::from_secs(60);
const GONE_MAX: Duration = Duration::from_secs(3600);
/// When a finished reaper's report cannot be read yet.
const REPORT_RETRY: Duration = Duration::from_secs(10);

/// What is gone, so no revision can run the delete hooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gone {
    /// `[E_PACKAGE_GONE]`: no revision of the instance's type.
    Package,
    /// `[E_JUKEBOX_GONE]`: the JukeBox itself.
    Jukebox,
}

impl Gone {
    /// The catalog's `PackageGone.code`; anything but `E_JUKEBOX_GONE` is a package gone.
    pub fn from_code(code: &str) -> Self {
        if code == "E_JUKEBOX_GONE" { Gone::Jukebox } else { Gone::Package }
    }

    pub fn code(self) -> &'static str {
        match self {
            Gone::Package => "E_PACKAGE_GONE",
            Gone::Jukebox => "E_JUKEBOX_GONE",
        }
    }

    fn event_reason(self) -> &'static str {
        match self {
            Gone::Package => "PackageGone",
            Gone::Jukebox => "JukeboxGone",
        }
    }
}

/// What the catalog decided for the deletion.
#[derive(Debug, Clone, PartialEq)]
pub enum CleanupAnswer {
    NothingToDelete,
    /// Run the delete hooks of this revision.
    Revision(Box<JobRequest>),
    Gone {
        what: Gone,
        message: String,
    },
    WithoutPackage {
        warning: String,
    },
}

/// Whether the escape hatch is open for the instance: the annotation asks,
/// an admin's confirmation (`crate::confirmation`) opens it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Hatch {
    /// The annotation is absent or not `"true"`.
    #[default]
    NotAsked,
    /// The annotation says `"true"`; no admin confirmed.
    Unconfirmed,
    /// An admin confirmed, but it no longer holds (why).
    Void(String),
    /// Confirmed for this object and exactly its recorded children.
    Confirmed,
}

impl Hatch {
    /// What the blocked condition adds, if anything.
    fn note(&self) -> Option<String> {
        match self {
            Hatch::NotAsked | Hatch::Confirmed => None,
            Hatch::Unconfirmed => Some(
                " (vynil.solidite.fr/delete-without-package is set, but the annotation alone deletes nothing: an admin must review Explain's list and confirm it through AllowDeleteWithoutPackage)".into(),
            ),
            Hatch::Void(why) => Some(format!(
                " (the admin's confirmation no longer holds: {why}; review Explain's list and confirm again through AllowDeleteWithoutPackage)"
            )),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct CleanupObserved {
    pub answer: CleanupAnswer,
    /// The revision the delete hooks run from fails the JukeBox's signature
    /// policy: the Warning Event's note (the Job runs anyway).
    pub unverified: Option<String>,
    /// The escape hatch, as the annotation and the confirmations say.
    pub hatch: Hatch,
    /// The instance's Job; its fingerprint is read only from a delete Job.
    pub job: Option<ObservedJob>,
    /// The report of a completed reaper Job, when it could be read.
    pub report: Option<ReaperReport>,
    pub now: jiff::Timestamp,
    pub max_attempts: u32,
}

const DELETE_FAILURE: FailureWording = FailureWording {
    condition_type: ConditionType::Ready,
    job: "delete Job",
    until: "the package or the JukeBox change, or an admin confirms a delete without package (AllowDeleteWithoutPackage, which sets vynil.solidite.fr/delete-without-package)",
};

/// The reaper Job's fingerprint for an instance (one per instance object).
pub fn reaper_fingerprint(instance: &Instance) -> String {
    format!("reaper-{}", instance.uid.as_deref().unwrap_or(&instance.name))
}

/// The retry after a "gone" answer: the time the condition has said so,
/// between 1 min and 1 h, so successive intervals double.
pub fn gone_backoff(instance: &Instance, now: jiff::Timestamp) -> Duration {
    let since = instance
        .status
        .conditions
        .iter()
        .find(|c| {
            (c.condition_type == ConditionType::Ready.as_str() || c.condition_type == LEGACY_DELETING)
                && c.status == ConditionStatus::False
                && matches!(message_code(&c.message), Some("E_PACKAGE_GONE" | "E_JUKEBOX_GONE"))
        })
        .and_then(|c| c.last_transition_time.as_deref()?.parse::<jiff::Timestamp>().ok());
    let elapsed = since.and_then(|t| Duration::try_from(now.duration_since(t)).ok()).unwrap_or(GONE_FIRST);
    elapsed.clamp(GONE_FIRST, GONE_MAX)
}

/// An uninstall state: `Ready=False`, as upstream's agent leaves a deleted instance.
fn deleting(message: String) -> Step {
    Step::Condition { condition_type: ConditionType::Ready, ok: false, message }
}

/// Decides what to do with `instance`, which is being deleted: by the
/// catalog's answer, release it, hold it (its package is gone), run its
/// package's delete hooks, or reap its recorded children without them.
pub fn cleanup(instance: &Instance, observed: &CleanupObserved) -> Plan {
    if instance.is_upstream_control_plane() {
        return crate::install_plan::control_plane_held(true);
    }
    match &observed.answer {
        CleanupAnswer::NothingToDelete => released(vec![Step::DeleteJob]),
        CleanupAnswer::Gone { what, message } => gone(instance, observed, *what, message),
        CleanupAnswer::Revision(request) => with_hooks(instance, observed, request),
        CleanupAnswer::WithoutPackage { warning } => without_package(instance, observed, warning),
    }
}

fn released(steps: Vec<Step>) -> Plan {
    Plan { steps, outcome: Outcome::Released, requeue: REQUEUE }
}

fn waiting(steps: Vec<Step>, detail: String) -> Plan {
    Plan { steps, outcome: Outcome::Deleting { detail }, requeue: REQUEUE }
}

/// The target status records for this deletion's `fingerprint`, if any.
fn recorded_for<'a>(instance: &'a Instance, fingerprint: &str) -> Option<&'a AgentTarget> {
    instance.status.target.as_ref().filter(|t| t.revision.fingerprint.as_deref() == Some(fingerprint))
}

/// The Job of this deletion's `fingerprint`, if it is the one there.
fn job_for<'a>(observed: &'a CleanupObserved, fingerprint: &str) -> Option<&'a ObservedJob> {
    observed.job.as_ref().filter(|j| j.fingerprint.as_deref() == Some(fingerprint))
}

/// The package is gone: held with the code the outcome reports, and how
/// to let it go.
fn gone(instance: &Instance, observed: &CleanupObserved, what: Gone, message: &str) -> Plan {
    // The condition carries the code the outcome reports, whatever
    // the catalog's message says (found by the fuzzer: a message
    // without its `[CODE]` gave a condition without it).
    let mut message = match message_code(message) {
        Some(code) if code == what.code() => message.to_string(),
        _ => vynil_crds::coded_message(what.code(), message),
    };
    if let Some(value) = instance.delete_without_package.as_deref().filter(|v| *v != "true") {
        message.push_str(&format!(
            " (vynil.solidite.fr/delete-without-package is {value:?}: only \"true\" is accepted)"
        ));
    }
    if let Some(note) = observed.hatch.note() {
        message.push_str(&note);
    }
    let (code, reason) = (what.code(), what.event_reason());
    Plan {
        steps: vec![
            Step::Condition { condition_type: ConditionType::Ready, ok: false, message: message.clone() },
            Step::Event { warning: true, reason, note: message.clone() },
        ],
        outcome: Outcome::Blocked(Blocker { criterion: Criterion::Package, code: Some(code), message }),
        requeue: gone_backoff(instance, observed.now),
    }
}

/// The delete Job running the hooks of the installed revision's package.
fn with_hooks(instance: &Instance, observed: &CleanupObserved, request: &JobRequest) -> Plan {
    let fingerprint = request.fingerprint.as_str();
    let revision = InstalledPackage {
        registry: request.registry.clone(),
        image: request.image.clone(),
        tag: request.tag.clone(),
        fingerprint: Some(fingerprint.to_string()),
        pull_secret: request.pull_secret.clone(),
        controller_values: Some(request.controller_values.clone()),
        ..InstalledPackage::default()
    };
    let start = |mut steps: Vec<Step>, kept: Option<&AgentTarget>| {
        let target = match kept {
            Some(kept) => kept.clone(),
            None => AgentTarget { revision: revision.clone(), ..AgentTarget::default() },
        };
        steps.push(Step::RecordTarget(target));
        if let Some(note) = &observed.unverified {
            steps.push(Step::Event { warning: true, reason: "UnverifiedRevision", note: note.clone() });
        }
        steps.push(Step::CreateDeleteJob(Box::new(request.clone())));
        steps.push(deleting(format!("delete Job running the hooks of {}:{}", request.image, request.tag)));
        steps.push(Step::Event {
            warning: false,
            reason: "DeleteStarted",
            note: format!(
                "deleting with the hooks of {}/{}:{}",
                request.registry, request.image, request.tag
            ),
        });
        waiting(steps, format!("delete Job for {} started", request.tag))
    };
    let recorded = recorded_for(instance, fingerprint);
    match job_for(observed, fingerprint) {
        None => start(replacing(observed), recorded),
        Some(job) => match &job.state {
            JobState::Running => waiting(Vec::new(), format!("delete Job for {} running", request.tag)),
            JobState::Succeeded => released(vec![Step::DeleteJob]),
            JobState::Failed(reason) => {
                retry(observed, recorded, &revision, job, reason, &request.tag, &start)
            }
        },
    }
}

/// The reaper Job deleting the recorded children, confirmed by an admin,
/// released once its report says every allowed child is gone.
fn without_package(instance: &Instance, observed: &CleanupObserved, warning: &str) -> Plan {
    let fingerprint = reaper_fingerprint(instance);
    let revision = InstalledPackage {
        image: "reaper".into(),
        fingerprint: Some(fingerprint.clone()),
        ..InstalledPackage::default()
    };
    let recorded = recorded_for(instance, &fingerprint);
    let start = |mut steps: Vec<Step>, kept: Option<&AgentTarget>| {
        let target = kept
            .cloned()
            .unwrap_or_else(|| AgentTarget { revision: revision.clone(), ..AgentTarget::default() });
        steps.push(Step::RecordTarget(target));
        steps.push(Step::CreateReaperJob { fingerprint: fingerprint.clone() });
        steps.push(deleting(format!("reaper Job deleting the recorded children: {warning}")));
        steps.push(Step::Event { warning: true, reason: "DeleteWithoutPackage", note: warning.to_string() });
        waiting(steps, "reaper Job started".into())
    };
    let retry = |job: &ObservedJob, reason: &str| {
        retry(observed, recorded, &revision, job, reason, "the reaper", &start)
    };
    match job_for(observed, &fingerprint) {
        None => start(replacing(observed), recorded),
        Some(job) => match (&job.state, &observed.report) {
            (JobState::Running, _) => waiting(Vec::new(), "reaper Job running".into()),
            (JobState::Failed(reason), _) => retry(job, reason),
            (JobState::Succeeded, None) => Plan {
                steps: Vec::new(),
                outcome: Outcome::Deleting { detail: "waiting for the reaper's report".into() },
                requeue: REPORT_RETRY,
            },
            (JobState::Succeeded, Some(report)) if !report.all_allowed_gone() => {
                retry(job, &format!("children still present: {}", report.still_present().join(", ")))
            }
            (JobState::Succeeded, Some(report)) => {
                let message = format!(
                    "[W_NO_PACKAGE_HOOKS] deleted without package hooks: {}; left for a human: {}",
                    list_or_none(&report.deleted()),
                    list_or_none(&report.left())
                );
                released(vec![
                    Step::Condition {
                        condition_type: ConditionType::Ready,
                        ok: false,
                        message: message.clone(),
                    },
                    Step::Event { warning: true, reason: "DeletedWithoutPackage", note: message },
                    Step::DeleteJob,
                ])
            }
        },
    }
}

/// The first steps of a new deletion Job: the Job in place (an install Job,
/// a stale one) goes first.
fn replacing(observed: &CleanupObserved) -> Vec<Step> {
    if observed.job.is_some() { vec![Step::DeleteJob] } else { Vec::new() }
}

/// A failed deletion Job: counted once, kept while its retry is not due,
/// replaced (through `start`) when it is.
fn retry(
    observed: &CleanupObserved,
    recorded: Option<&AgentTarget>,
    revision: &InstalledPackage,
    job: &ObservedJob,
    reason: &str,
    what: &str,
    start: &dyn Fn(Vec<Step>, Option<&AgentTarget>) -> Plan,
) -> Plan {
    match account_failure(recorded, revision.clone(), job, reason, observed.now, observed.max_attempts) {
        FailedJob::Due(target) => start(vec![Step::DeleteJob], Some(&target)),
        FailedJob::Wait(target) => {
            failed(Vec::new(), target, &DELETE_FAILURE, observed.now, observed.max_attempts, what)
        }
    }
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() { "none".into() } else { items.join(", ") }
}
