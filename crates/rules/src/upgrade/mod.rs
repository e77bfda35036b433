//! What happens when an upgrade fails: quarantine, and the way back.
//!
//! Upstream retries a failed upgrade for ever and never goes back. Here, once
//! an upgrade's agent Job has failed as many times as allowed, the revision
//! it tried is **quarantined for that instance** (selection never offers it
//! again, [`crate::selection::InstallQuery::quarantined`], until a newer
//! revision appears or an operator clears it), and the instance goes back to
//! the revision it ran before — but on its own only when that cannot make
//! things worse:
//!
//! - the failed runs applied nothing: no phase condition (anything but
//!   `Ready`, `Installed` and `AgentStarted`: `BeforeApplied`, `CrdApplied`,
//!   `TofuInstalled`, `InitFrom`…) was written since the upgrade began,
//!   whatever its status — upstream's agent writes a phase's condition after
//!   applying it, and a failed phase may have applied part of it. "Written"
//!   is decided from what lifecycle itself saw: the phase conditions as they
//!   stood when it created the upgrade's first Job, compared with what the
//!   failed runs left, never by comparing the agent's timestamps (its pod's
//!   clock) with lifecycle's;
//! - the options are the ones the previous revision ran with (upstream's
//!   `status.digest`), since a rollback runs it with today's options.
//!
//! Upstream packages do not declare downgrades safe, so in any other case the
//! instance holds (`[E_UPGRADE_FAILED]`) and an operator decides: roll back,
//! or clear the quarantine to try again. A rollback runs the previous
//! revision's agent Job (`[E_UPGRADE_ROLLED_BACK]` until it succeeds).
//!
//! Where the record lives (an object lifecycle owns, never the instance a
//! tenant can edit) is lifecycle's business; what it says is here.

use serde::{Deserialize, Serialize};

pub mod waves;
pub mod window;
pub mod withheld;

/// The longest duration a policy may write (a minimum age, a soak, a
/// window's length): 366 days, `8784h`. Longer ones are refused, and an
/// object already holding one is held with the error, never opened: past
/// this, the date arithmetic of a gate may overflow, and an overflow must
/// never read as "no wait".
pub const LONGEST_DURATION: jiff::SignedDuration = jiff::SignedDuration::from_hours(24 * 366);

/// A duration of zero or more, at most [`LONGEST_DURATION`], as a policy
/// writes it (`72h`, `90m`, `1h 30m`, `0s`); `field` and `hint` say what to
/// fix when it is not one.
fn non_negative(
    field: &'static str,
    text: &str,
    hint: &'static str,
) -> Result<jiff::SignedDuration, crate::RulesError> {
    let problem =
        |problem: String| crate::RulesError::UpgradePolicy { field, value: text.to_string(), problem, hint };
    let parsed = text.trim().parse::<jiff::SignedDuration>().ok().filter(|d| !d.is_negative());
    let duration = parsed.ok_or_else(|| problem("not a duration of zero or more".into()))?;
    within_bound(duration).map_err(problem)
}

/// `duration` when it is at most [`LONGEST_DURATION`], else the problem in words.
fn within_bound(duration: jiff::SignedDuration) -> Result<jiff::SignedDuration, String> {
    if duration > LONGEST_DURATION {
        return Err(format!("longer than the longest a policy may write, {LONGEST_DURATION:#}"));
    }
    Ok(duration)
}

/// `vynil.solidite.fr/rollback: "false"` on an instance: a failed upgrade
/// neither quarantines nor rolls back (it stays failed, as upstream's).
pub const ROLLBACK_ANNOTATION: &str = "vynil.solidite.fr/rollback";

/// The hold's code: an upgrade failed and an operator must decide.
pub const UPGRADE_FAILED: &str = "E_UPGRADE_FAILED";
/// The rollback's code, until its Job succeeds.
pub const UPGRADE_ROLLED_BACK: &str = "E_UPGRADE_ROLLED_BACK";

/// Condition types that say nothing of what a run applied.
const NOT_PHASES: [&str; 3] = ["Ready", "Installed", "AgentStarted"];

/// One phase condition of the instance as lifecycle saw it: every field
/// the agent writes, `lastTransitionTime` as text (compared as written,
/// never as a time: the agent stamps it with its own clock).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SeenPhase {
    #[serde(rename = "type")]
    pub condition_type: String,
    pub status: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub last_transition_time: String,
}

impl SeenPhase {
    /// Whether a condition of this type tells what a run applied.
    pub fn is_phase(condition_type: &str) -> bool {
        !NOT_PHASES.contains(&condition_type)
    }
}

/// The phases the failed runs wrote: each phase condition now that was not
/// there, or not as it was, in `before` (as lifecycle saw them when it
/// created the upgrade's first Job), in the order found. `None` when
/// nothing was seen then: nobody can say the runs applied nothing.
pub fn phases_written(before: Option<&[SeenPhase]>, now: &[SeenPhase]) -> Option<Vec<String>> {
    let before = before?;
    Some(
        now.iter()
            .filter(|c| SeenPhase::is_phase(&c.condition_type))
            .filter(|c| !before.contains(c))
            .map(|c| c.condition_type.clone())
            .collect(),
    )
}

/// An upgrade whose Job failed as many times as allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedUpgrade<'a> {
    /// The revision installed before (`status.package.tag`).
    pub from: &'a str,
    /// The revision the failed Job installed.
    pub to: &'a str,
    /// The last failure, as the Job and its pod said it.
    pub reason: &'a str,
    /// [`phases_written`] since the upgrade began.
    pub phases_written: Option<Vec<String>>,
    /// The options hash now differs from the one `from` ran with.
    pub options_changed: bool,
}

/// What becomes of the instance once the revision is quarantined.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum Rollback {
    /// Back to `from` now: the failed runs applied nothing.
    Automatic,
    /// Holds until an operator rolls back or clears the quarantine.
    AwaitingOperator { why: String },
    /// An operator asked for the rollback.
    Approved { by: String, at: String },
    /// Opted out (annotation or flag): the instance stays failed.
    Off,
}

impl Rollback {
    /// Whether the way back may run now.
    pub fn may_run(&self) -> bool {
        matches!(self, Rollback::Automatic | Rollback::Approved { .. })
    }
}

/// Whether a failed upgrade goes back on its own, and if not, why.
pub fn rollback_for(failed: &FailedUpgrade, enabled: bool) -> Rollback {
    if !enabled {
        return Rollback::Off;
    }
    let why = match &failed.phases_written {
        None => Some("when the upgrade began is not recorded, so what it applied is unknown".to_string()),
        Some(phases) if !phases.is_empty() => Some(format!("the failed run applied {}", phases.join(", "))),
        Some(_) if failed.options_changed => Some(format!(
            "the options changed since {} ran, and a rollback would run it with today's",
            failed.from
        )),
        Some(_) => None,
    };
    match why {
        Some(why) => Rollback::AwaitingOperator { why },
        None => Rollback::Automatic,
    }
}

/// One revision quarantined for one instance, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Quarantined {
    pub tag: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// The revision installed when it failed: where a rollback goes.
    pub from: String,
    pub reason: String,
    /// RFC 3339.
    pub at: String,
    pub rollback: Rollback,
}

impl Quarantined {
    /// The `Ready=False` message while this quarantine decides the instance's
    /// state: rolling back, or holding for an operator.
    pub fn message(&self) -> String {
        let (from, to, reason) = (&self.from, &self.tag, &self.reason);
        match &self.rollback {
            Rollback::Automatic | Rollback::Approved { .. } => format!(
                "[{UPGRADE_ROLLED_BACK}] {from} → {to} failed: {reason}; rolling back to {from} ({to} is quarantined for this instance)"
            ),
            Rollback::AwaitingOperator { why } => format!(
                "[{UPGRADE_FAILED}] {from} → {to}: {reason}; {to} is quarantined for this instance and not rolled back on its own ({why}): roll back to {from} (`vynilctl instance rollback`) or clear the quarantine to try {to} again (`vynilctl instance clear-quarantine`)"
            ),
            Rollback::Off => format!(
                "[{UPGRADE_FAILED}] {from} → {to}: {reason}; rollback is turned off for this instance"
            ),
        }
    }
}

impl Quarantined {
    /// The `Ready=False` message when the revision to go back to cannot be
    /// installed (`why`: the catalog's reason), whatever the rollback state.
    pub fn no_way_back(&self, why: &str) -> String {
        let (from, to, reason) = (&self.from, &self.tag, &self.reason);
        format!(
            "[{UPGRADE_FAILED}] {from} → {to}: {reason}; {to} is quarantined for this instance and {from} cannot be installed now: {why}. Restore {from} in the registry and rescan, or clear the quarantine to try {to} again (`vynilctl instance clear-quarantine`)"
        )
    }
}

/// The tags of `entries`, as selection excludes them.
pub fn quarantined_tags(entries: &[Quarantined]) -> Vec<String> {
    entries.iter().filter(|q| q.rollback != Rollback::Off).map(|q| q.tag.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(kind: &str, status: &str, at: &str) -> SeenPhase {
        SeenPhase {
            condition_type: kind.into(),
            status: status.into(),
            message: "applied".into(),
            last_transition_time: at.into(),
        }
    }

    #[test]
    fn a_phase_counts_as_written_when_it_is_new_or_changed_since_the_upgrade_began_whatever_its_clock() {
        let before = [
            phase("Ready", "True", "2026-01-01T10:00:00Z"),
            phase("VitalApplied", "True", "2026-01-01T09:00:00.167585170Z"),
            phase("BeforeApplied", "True", "2026-01-01T09:00:00Z"),
        ];
        // The failed runs: Ready rewritten, VitalApplied untouched, BeforeApplied
        // rewritten by an agent whose clock runs an hour behind, TofuInstalled new.
        let now = [
            phase("Ready", "False", "2026-01-01T10:05:00Z"),
            phase("VitalApplied", "True", "2026-01-01T09:00:00.167585170Z"),
            phase("BeforeApplied", "True", "2026-01-01T08:59:00.000000001Z"),
            phase("TofuInstalled", "False", "2026-01-01T10:04:00Z"),
        ];
        assert_eq!(
            phases_written(Some(&before), &now),
            Some(vec!["BeforeApplied".into(), "TofuInstalled".into()])
        );
        assert_eq!(phases_written(Some(&before), &before), Some(vec![]), "nothing written: nothing counts");
        assert_eq!(phases_written(None, &now), None, "nothing seen before: unknown");
    }

    #[test]
    fn only_a_run_that_applied_nothing_with_unchanged_options_rolls_back_on_its_own() {
        let failed = |phases: Option<Vec<String>>, options_changed| FailedUpgrade {
            from: "0.2.0",
            to: "0.3.0",
            reason: "exit 1",
            phases_written: phases,
            options_changed,
        };
        assert_eq!(rollback_for(&failed(Some(vec![]), false), true), Rollback::Automatic);
        assert_eq!(rollback_for(&failed(Some(vec![]), false), false), Rollback::Off);
        for (phases, changed, says) in [
            (Some(vec!["VitalApplied".to_string()]), false, "applied VitalApplied"),
            (None, false, "not recorded"),
            (Some(vec![]), true, "options changed"),
        ] {
            match rollback_for(&failed(phases, changed), true) {
                Rollback::AwaitingOperator { why } => assert!(why.contains(says), "{why}"),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn the_messages_lead_with_their_code_and_name_both_ways_out() {
        let mut entry = Quarantined {
            tag: "0.3.0".into(),
            digest: None,
            from: "0.2.0".into(),
            reason: "exit 1".into(),
            at: "2026-01-01T10:00:00Z".into(),
            rollback: Rollback::Automatic,
        };
        assert!(entry.message().starts_with("[E_UPGRADE_ROLLED_BACK] 0.2.0 → 0.3.0 failed: exit 1"));
        entry.rollback = Rollback::AwaitingOperator { why: "the failed run applied VitalApplied".into() };
        let held = entry.message();
        assert!(held.starts_with("[E_UPGRADE_FAILED] 0.2.0 → 0.3.0: exit 1"), "{held}");
        assert!(held.contains("instance rollback") && held.contains("clear-quarantine"), "{held}");
        let text = serde_json::to_value(&entry).unwrap();
        assert_eq!(text["rollback"]["state"], "awaitingOperator");
        assert_eq!(serde_json::from_value::<Quarantined>(text).unwrap(), entry);
    }
}
