//! The install decision, pure: `plan(&instance, &observed) -> Plan`.
//!
//! The reconciler gathers what it observed (the catalog's answer, the
//! requirement facts, the existing agent Job, the recorded status), this
//! module decides, and a thin executor performs the [`Step`]s in order. Every
//! rule about *which* revision comes from the catalog (`ResolveInstall`, the
//! rules crate) and every install check from `vynil_rules::install`: here only
//! the sequencing lives — upstream's reconcile order (`docs/upstream-vynil.md`
//! §5.4), with re-runs decided by the recorded fingerprint instead of Job
//! immutability errors:
//!
//! - an unchanged fingerprint never re-runs, even after the Job was deleted;
//! - a changed one records the target in status, then replaces the Job;
//! - a completion is credited only to the Job whose fingerprint it carries;
//! - a failed Job is kept (its pod holds the logs), counted once, retried
//!   after 1 min doubling to 1 h, up to the configured attempts, then stays
//!   failed with its reason until the fingerprint changes or
//!   `force-reinstall`;
//! - an instance upstream installed (no `status.package`) whose `status.tag`
//!   and options hash match what would be rendered is adopted with no Job.

use std::time::Duration;

use vynil_crds::{AgentTarget, InstalledPackage, RevisionRecord, coded_message};
use vynil_rules::{
    Package,
    install::{self, CheckedOptions, OptionProblem, RETRY_LONG, RETRY_SHORT, Recommended, Unmet},
};

use crate::{instance::Instance, upgrades::UpgradeRecord};

mod checks;
mod gates;
mod policy;

pub use gates::plan;
pub use policy::{FleetMember, HeldBack, PolicyOf, RunningRecalled, WaitFor};

/// How long a healthy instance waits before its next check.
pub const REQUEUE: Duration = RETRY_LONG;
/// Largest `CONTROLLER_VALUES` accepted: it is recorded in status for the delete Job.
pub const MAX_CONTROLLER_VALUES: usize = 32 * 1024;
const BACKOFF_FIRST: Duration = Duration::from_secs(60);
const BACKOFF_MAX: Duration = Duration::from_secs(3600);

/// What the catalog answered for the instance.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Resolution {
    Package {
        package: Box<Package>,
        pull_secret: Option<String>,
    },
    #[default]
    JukeboxMissing,
    /// No revision matched; `reason` says which criterion excluded the last ones.
    NoMatch {
        excluded_by: String,
        reason: String,
    },
    /// The catalog's revision is not the one the JukeBox's status lists
    /// (`crate::jukeboxes`): what the catalog's cache holds is not trusted.
    Unconfirmed {
        reason: String,
    },
}

/// `initFrom.version`, asked only on a first install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitVersion {
    NotAsked,
    /// The tag exists (in the catalog or the registry), with its digest when known.
    Found {
        tag: String,
        digest: Option<String>,
    },
    NotFound(String),
    /// The version is recalled for the JukeBox: the recall, in words.
    Recalled(String),
    /// The JukeBox enforces a signature policy this version fails: its verdict.
    Unverified {
        tag: String,
        verdict: vynil_rules::signature::Verdict,
    },
}

/// What was computed from the selected revision and the cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct RevisionChecks {
    pub options: Result<CheckedOptions, OptionProblem>,
    pub unmet: Option<Unmet>,
    pub recommended: Recommended,
    /// `value_script`'s map as JSON text (`{}` without a script), or why it failed.
    pub controller_values: Result<String, String>,
}

/// The state of an agent Job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    Running,
    Succeeded,
    /// With the reason from the Job and pod status.
    Failed(String),
}

/// The agent Job of the instance, as found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedJob {
    pub uid: String,
    /// Its fingerprint annotation (none on a Job upstream created).
    pub fingerprint: Option<String>,
    pub state: JobState,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    pub resolution: Resolution,
    pub init_version: InitVersion,
    /// `None` unless the resolution is a package.
    pub checks: Option<RevisionChecks>,
    pub job: Option<ObservedJob>,
    pub now: jiff::Timestamp,
    pub max_attempts: u32,
    /// Upstream's re-runs, each opt-in (`docs/lifecycle.md`).
    pub reruns: Reruns,
    /// What lifecycle recorded of the instance's failed upgrades (read only
    /// when an upgrade is in question: empty otherwise).
    pub upgrades: UpgradeRecord,
    /// A failed upgrade is quarantined and rolled back (`--rollback-failed-upgrades`
    /// and no `vynil.solidite.fr/rollback: "false"` on the instance).
    pub rollback: bool,
    /// When an upgrade may start: the instance's policy, else its JukeBox's.
    pub upgrade_policy: Option<PolicyOf>,
    /// What the JukeBox holds back from the instance (recalled, too young).
    pub held_back: HeldBack,
    /// The instances of its package, when its JukeBox rolls out in waves
    /// (empty otherwise).
    pub fleet: Vec<FleetMember>,
}

/// Upstream's re-runs that the fingerprint alone does not make, each opt-in.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reruns {
    /// `--recreate-deleted-jobs`: a deleted agent Job is created again (the
    /// install runs again), as upstream's 15-minute reconcile does.
    pub recreate_deleted_jobs: bool,
    /// `--rerun-on-agent-image-change`: the agent image is part of the
    /// fingerprint, so a new image re-runs every install, as upstream's Job
    /// template change does.
    pub agent_image: Option<String>,
}

/// What a new agent Job is rendered from (the settings add image, account…).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRequest {
    pub registry: String,
    pub image: String,
    pub tag: String,
    /// The digest chosen (under a signature policy, the one verified): the
    /// unpack pulls it, never the tag, which a pusher may re-point after
    /// the choice. `None`: none recorded (the tag is pulled).
    pub digest: Option<String>,
    pub pull_secret: Option<String>,
    pub options_hash: String,
    pub controller_values: String,
    pub recommended: Recommended,
    pub fingerprint: String,
}

/// The condition types lifecycle writes: each is in upstream's closed enum of
/// every kind (`InitFrom` only where `spec.initFrom` exists), since one value
/// upstream does not know makes its agent exit 3 and its operator stop for the
/// whole kind. Blocks before a Job go on `AgentStarted=False`, holds and
/// uninstall states on `Ready=False`, each with its `[E_…]` code first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConditionType {
    Ready,
    AgentStarted,
    Installed,
    InitFrom,
}

/// The condition type an earlier release wrote for uninstall states, which
/// upstream's types refuse: lifecycle removes it wherever it finds one.
pub const LEGACY_DELETING: &str = "Deleting";

impl ConditionType {
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionType::AgentStarted => "AgentStarted",
            ConditionType::Installed => "Installed",
            ConditionType::InitFrom => "InitFrom",
            ConditionType::Ready => "Ready",
        }
    }
}

/// What blocks an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Criterion {
    Jukebox,
    Package,
    Options,
    InitFrom,
    Requirement,
    ValueScript,
    /// The agent Job failed as many times as allowed.
    Agent,
    /// Upstream's own control plane, never acted on.
    ControlPlane,
    /// An upgrade failed and was quarantined: an operator decides.
    Upgrade,
    /// The JukeBox's enforced signature policy refuses the revision.
    Signature,
}

impl Criterion {
    /// As `ListInstances.blocked_by` says it.
    pub fn as_str(self) -> &'static str {
        match self {
            Criterion::Jukebox => "jukebox",
            Criterion::Package => "package",
            Criterion::Options => "options",
            Criterion::InitFrom => "init_from",
            Criterion::Requirement => "requirement",
            Criterion::ValueScript => "value_script",
            Criterion::Agent => "agent",
            Criterion::ControlPlane => "control_plane",
            Criterion::Upgrade => "upgrade",
            Criterion::Signature => "signature",
        }
    }
}

/// One thing the executor does, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Set a condition (a no-op when identical, upstream's loop guard).
    Condition {
        condition_type: ConditionType,
        ok: bool,
        message: String,
    },
    Event {
        warning: bool,
        reason: &'static str,
        note: String,
    },
    /// A Warning Event regarding the instance's JukeBox (a halted rollout
    /// is the JukeBox's news; its conditions are the scanner's to write).
    JukeboxWarning {
        reason: &'static str,
        note: String,
    },
    /// An entry of the audit trail: an Event on the instance naming what
    /// overrode a gate, and the log line naming `actor` (`vynil::audit`).
    Audited {
        warning: bool,
        reason: &'static str,
        actor: &'static str,
        note: String,
    },
    RemoveForceReinstall,
    /// Delete the agent Job and wait until it is gone.
    DeleteJob,
    /// Record the target in the ledger, then its copy in `status.target`
    /// (each read back), before the Job exists.
    RecordTarget(AgentTarget),
    /// Record in the instance's upgrade record the phase conditions as
    /// they stand before the first Job of an upgrade.
    RecordPhases(crate::upgrades::PhasesBefore),
    /// Create the Job and read it back.
    CreateJob(Box<JobRequest>),
    /// Record the revision as installed in the ledger (the target cleared),
    /// then its copy in `status.package` (`status.target` cleared).
    RecordInstalled(InstalledPackage),
    /// Create the delete Job (package hooks of `request`'s revision) and read it back.
    CreateDeleteJob(Box<JobRequest>),
    /// Create the reaper Job (no package: the recorded children) and read it back.
    CreateReaperJob {
        fingerprint: String,
    },
    /// Record a failed upgrade's revision as quarantined for the instance
    /// (lifecycle's upgrade record, read back).
    Quarantine(Box<vynil_rules::upgrade::Quarantined>),
}

impl Step {
    /// What the step does, in words (`Explain`).
    pub fn describe(&self) -> String {
        match self {
            Step::Condition { condition_type, ok, message } => {
                format!(
                    "set condition {}={} \"{message}\"",
                    condition_type.as_str(),
                    if *ok { "True" } else { "False" }
                )
            }
            Step::Event { warning, reason, note } => {
                format!("record a{} event {reason}: {note}", if *warning { " Warning" } else { "n" })
            }
            Step::JukeboxWarning { reason, note } => {
                format!("record a Warning event {reason} on the JukeBox: {note}")
            }
            Step::Audited { warning, reason, actor, note } => {
                format!(
                    "record a{} event {reason} ({actor}): {note}",
                    if *warning { " Warning" } else { "n" }
                )
            }
            Step::RemoveForceReinstall => "remove the vynil.solidite.fr/force-reinstall annotation".into(),
            Step::DeleteJob => "delete the instance's Job and wait until it is gone".into(),
            Step::RecordTarget(t) => format!("record status.target: {} {}", t.revision.image, t.revision.tag),
            Step::RecordPhases(p) => {
                format!(
                    "record in the upgrade record the {} phase conditions seen before the upgrade",
                    p.seen.len()
                )
            }
            Step::CreateJob(r) => format!("create the install Job for {}/{}:{}", r.registry, r.image, r.tag),
            Step::RecordInstalled(p) => format!("record status.package: {} {}", p.image, p.tag),
            Step::CreateDeleteJob(r) => {
                format!("create the delete Job with the hooks of {}/{}:{}", r.registry, r.image, r.tag)
            }
            Step::CreateReaperJob { .. } => "create the reaper Job (no package hooks)".into(),
            Step::Quarantine(q) => format!("quarantine {} for this instance (installed: {})", q.tag, q.from),
        }
    }
}

/// Why nothing runs, with its error code when it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocker {
    pub criterion: Criterion,
    pub code: Option<&'static str>,
    pub message: String,
}

/// The decision, for `ListInstances` and `Explain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Suspended,
    /// Deletion in progress (a delete Job runs, or waits to be retried).
    Deleting {
        detail: String,
    },
    /// Deletion done: the finalizer goes.
    Released,
    Blocked(Blocker),
    UpToDate {
        tag: String,
    },
    Adopted {
        tag: String,
    },
    /// A Job was (or is being) started: `from` is the installed tag.
    Installing {
        from: Option<String>,
        to: String,
    },
    /// The Job waits for a free slot (`--max-running-jobs`).
    Queued {
        to: String,
    },
    /// An upgrade to `to` waits (`on`): not before `until` (RFC 3339; none:
    /// no known time).
    Waiting {
        to: String,
        until: Option<String>,
        why: String,
        on: WaitFor,
    },
    /// An upgrade waits for an operator's approval of exactly this step.
    PendingApproval(Box<PendingStep>),
    /// A failed upgrade to `failed` (quarantined) goes back to `to`.
    RollingBack {
        failed: String,
        to: String,
    },
    /// The last Job failed; the next attempt waits for `retry_at`.
    Retrying {
        to: String,
        attempt: u32,
        reason: String,
        retry_at: String,
    },
    Installed {
        tag: String,
    },
}

/// An upgrade awaiting an operator's approval: the step, as approved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingStep {
    pub from: String,
    pub to: String,
    pub fingerprint: String,
    pub options_hash: String,
    pub why: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub steps: Vec<Step>,
    pub outcome: Outcome,
    pub requeue: Duration,
}

impl Plan {
    fn blocked(criterion: Criterion, code: Option<&'static str>, message: String, requeue: Duration) -> Self {
        let condition_type = if criterion == Criterion::InitFrom {
            ConditionType::InitFrom
        } else {
            ConditionType::AgentStarted
        };
        Plan {
            steps: vec![Step::Condition { condition_type, ok: false, message: message.clone() }],
            outcome: Outcome::Blocked(Blocker { criterion, code, message }),
            requeue,
        }
    }
}

/// Upstream's control plane, held: `Ready=False` and a Warning, no Job (install or delete).
pub(crate) fn control_plane_held(deleting: bool) -> Plan {
    let message = install::control_plane_message(deleting);
    Plan {
        steps: vec![
            Step::Condition { condition_type: ConditionType::Ready, ok: false, message: message.clone() },
            event_warning("UpstreamControlPlane", message.clone()),
        ],
        outcome: Outcome::Blocked(Blocker {
            criterion: Criterion::ControlPlane,
            code: Some(install::CONTROL_PLANE_CODE),
            message,
        }),
        requeue: REQUEUE,
    }
}

/// Revisions kept in `status.package.history`.
pub const HISTORY: usize = 5;

/// Records `revision` as installed now, extending the bounded history of the
/// revision it replaces (the same fingerprint again replaces the last entry).
fn installed(instance: &Instance, mut revision: InstalledPackage, now: jiff::Timestamp) -> Step {
    let at = vynil_crds::condition::rfc3339_seconds(now);
    let previous = instance.status.package.as_ref();
    let mut history = previous.map(|p| p.history.clone()).unwrap_or_default();
    if history.is_empty()
        && let Some(p) = previous
    {
        history.push(RevisionRecord {
            tag: p.tag.clone(),
            digest: p.digest.clone(),
            fingerprint: p.fingerprint.clone(),
            installed_at: p.installed_at.clone(),
        });
    }
    if history.last().is_some_and(|last| last.fingerprint == revision.fingerprint) {
        history.pop();
    }
    history.push(RevisionRecord {
        tag: revision.tag.clone(),
        digest: revision.digest.clone(),
        fingerprint: revision.fingerprint.clone(),
        installed_at: Some(at.clone()),
    });
    let excess = history.len().saturating_sub(HISTORY);
    history.drain(..excess);
    revision.installed_at = Some(at);
    revision.history = history;
    Step::RecordInstalled(revision)
}

/// The delay before attempt `failures + 1`: 1 min doubling to 1 h.
pub fn backoff(failures: u32) -> Duration {
    let doubled = BACKOFF_FIRST.saturating_mul(1u32 << failures.saturating_sub(1).min(16));
    doubled.min(BACKOFF_MAX)
}

pub(crate) fn after(now: jiff::Timestamp, delay: Duration) -> jiff::Timestamp {
    jiff::SignedDuration::try_from(delay).ok().and_then(|d| now.checked_add(d).ok()).unwrap_or(now)
}

/// A failed Job of the current fingerprint, once accounted for.
pub(crate) enum FailedJob {
    /// Counted (now or before) and not due, or out of attempts: keep it.
    Wait(AgentTarget),
    /// Its retry is due: replace it.
    Due(AgentTarget),
}

/// Counts `job`'s failure once (by uid) in the target recorded for its
/// fingerprint and decides whether its retry is due (1 min doubling to 1 h,
/// at most `max_attempts`).
pub(crate) fn account_failure(
    recorded: Option<&AgentTarget>,
    revision: InstalledPackage,
    job: &ObservedJob,
    reason: &str,
    now: jiff::Timestamp,
    max_attempts: u32,
) -> FailedJob {
    let counted = recorded.filter(|t| t.failed_job.as_deref() == Some(job.uid.as_str()));
    let Some(target) = counted else {
        let failures = recorded.map_or(0, |t| t.failures) + 1;
        return FailedJob::Wait(AgentTarget {
            revision,
            job: recorded.map(|t| t.job.clone()).unwrap_or_default(),
            failures,
            failed_job: Some(job.uid.clone()),
            last_failure: Some(reason.to_string()),
            retry_at: Some(vynil_crds::condition::rfc3339_seconds(after(now, backoff(failures)))),
            since: recorded.and_then(|t| t.since.clone()),
        });
    };
    let due =
        target.retry_at.as_deref().and_then(|t| t.parse::<jiff::Timestamp>().ok()).is_none_or(|at| at <= now);
    if target.failures >= max_attempts || !due {
        FailedJob::Wait(target.clone())
    } else {
        FailedJob::Due(target.clone())
    }
}

/// How a failure reads for one kind of Job.
pub(crate) struct FailureWording {
    pub condition_type: ConditionType,
    pub job: &'static str,
    /// What ends "no more attempts".
    pub until: &'static str,
}

const INSTALL_FAILURE: FailureWording = FailureWording {
    condition_type: ConditionType::Installed,
    job: "agent Job",
    until: "the options or the package change, or the annotation vynil.solidite.fr/force-reinstall is set",
};

/// A failed Job: kept, its reason shown, retried when due unless out of attempts.
pub(crate) fn failed(
    mut steps: Vec<Step>,
    target: AgentTarget,
    wording: &FailureWording,
    now: jiff::Timestamp,
    attempts: u32,
    tag: &str,
) -> Plan {
    let reason = target.last_failure.clone().unwrap_or_else(|| "the Job failed".into());
    let retry_at = target.retry_at.clone().unwrap_or_default();
    let job = wording.job;
    let (message, outcome, requeue) = if target.failures >= attempts {
        let message = coded_message(
            "E_AGENT_FAILED",
            &format!(
                "the {job} for {tag} failed {} times, the last time: {reason}; no more attempts until {}",
                target.failures, wording.until
            ),
        );
        let blocker =
            Blocker { criterion: Criterion::Agent, code: Some("E_AGENT_FAILED"), message: message.clone() };
        (message, Outcome::Blocked(blocker), REQUEUE)
    } else {
        let wait = retry_at
            .parse::<jiff::Timestamp>()
            .ok()
            .and_then(|at| Duration::try_from(at.duration_since(now)).ok())
            .unwrap_or(BACKOFF_FIRST)
            .max(Duration::from_secs(1));
        let message = coded_message(
            "E_AGENT_FAILED",
            &format!(
                "the {job} for {tag} failed (attempt {} of {attempts}): {reason}; retrying at {retry_at}",
                target.failures
            ),
        );
        let outcome =
            Outcome::Retrying { to: tag.into(), attempt: target.failures, reason: reason.clone(), retry_at };
        (message, outcome, wait)
    };
    steps.push(Step::RecordTarget(target));
    steps.push(Step::Condition { condition_type: wording.condition_type, ok: false, message });
    Plan { steps, outcome, requeue }
}

fn event_warning(reason: &'static str, note: String) -> Step {
    Step::Event { warning: true, reason, note }
}
