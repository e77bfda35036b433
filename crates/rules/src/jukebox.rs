//! A JukeBox's conditions after a scan, as upstream words them, and when each
//! changes — decided here once, applied by the scanner to the status.
//!
//! Upstream: a successful scan replaces every condition with `Updated` and
//! `Ready`, both True, "Updated succesfully" (sic); a failed one sets
//! `Updated=False` with the reason, keeps the other conditions, and sets
//! `Ready=False` "No successful update" only when there was no `Ready` yet.
//! Ours on top: a schedule that cannot run makes `Ready=False` with its reason
//! whatever the outcome (a successful manual scan cannot hide it), and a scan
//! that changed the packages stamps `Updated` anew, so its transition time is
//! the catalog's last change. The scanner applies each change with Kubernetes'
//! rule (the transition time moves only when the status does), so a scan that
//! changes nothing yields exactly the previous conditions.

/// The condition types a JukeBox carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JukeboxCondition {
    Updated,
    Ready,
}

/// Upstream's wording of a successful update (its spelling kept).
pub const UPDATED_OK: &str = "Updated succesfully";
/// Upstream's `Ready=False` message before any successful update.
pub const NO_SUCCESSFUL_UPDATE: &str = "No successful update";

/// One condition to set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionChange {
    pub condition: JukeboxCondition,
    pub ok: bool,
    pub message: String,
}

/// How a scan ended, for its conditions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanVerdict {
    Succeeded,
    /// Why, as the `Updated=False` message says it.
    Failed(String),
    /// The source's configuration is refused (a Secret it may not name):
    /// `Updated=False` and `Ready=False` say why; packages are kept.
    Refused(String),
}

/// What a scan does to the conditions, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionTransition {
    /// Drop every condition but `Updated` and `Ready` first (a success).
    pub only_ours: bool,
    /// Stamp `Updated` anew even if it does not change (the packages did).
    pub restamp_updated: bool,
    pub set: Vec<ConditionChange>,
}

fn change(condition: JukeboxCondition, ok: bool, message: &str) -> ConditionChange {
    ConditionChange { condition, ok, message: message.to_string() }
}

/// The conditions after a scan. `has_ready`: the status has a `Ready`
/// condition already; `schedule_problem`: why the JukeBox's schedule cannot run.
pub fn after_scan(
    verdict: &ScanVerdict,
    has_ready: bool,
    packages_changed: bool,
    schedule_problem: Option<&str>,
) -> ConditionTransition {
    let mut set = Vec::new();
    let only_ours = *verdict == ScanVerdict::Succeeded;
    match verdict {
        ScanVerdict::Succeeded => {
            set.push(change(JukeboxCondition::Updated, true, UPDATED_OK));
            if schedule_problem.is_none() {
                set.push(change(JukeboxCondition::Ready, true, UPDATED_OK));
            }
        }
        ScanVerdict::Failed(why) => {
            set.push(change(JukeboxCondition::Updated, false, why));
            if !has_ready && schedule_problem.is_none() {
                set.push(change(JukeboxCondition::Ready, false, NO_SUCCESSFUL_UPDATE));
            }
        }
        ScanVerdict::Refused(why) => {
            set.push(change(JukeboxCondition::Updated, false, why));
            if schedule_problem.is_none() {
                set.push(change(JukeboxCondition::Ready, false, why));
            }
        }
    }
    if let Some(problem) = schedule_problem {
        set.push(schedule_problem_condition(problem));
    }
    ConditionTransition { only_ours, restamp_updated: packages_changed, set }
}

/// `Ready=False` naming why the schedule cannot run.
pub fn schedule_problem_condition(problem: &str) -> ConditionChange {
    change(JukeboxCondition::Ready, false, problem)
}

/// The `Updated=False` message of a scan in which some repositories failed.
pub fn partial_failure(errors: &[(String, String)], repositories: usize) -> String {
    let detail = errors.iter().map(|(repo, why)| format!("{repo}: {why}")).collect::<Vec<_>>().join("; ");
    format!(
        "{} of {repositories} repositories failed, their previous entries are kept: {detail}",
        errors.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use JukeboxCondition::{Ready, Updated};

    fn set(transition: &ConditionTransition) -> Vec<(JukeboxCondition, bool, &str)> {
        transition.set.iter().map(|c| (c.condition, c.ok, c.message.as_str())).collect()
    }

    #[test]
    fn conditions_follow_upstreams_wording_and_transitions() {
        let ok = after_scan(&ScanVerdict::Succeeded, true, false, None);
        assert!(ok.only_ours && !ok.restamp_updated);
        assert_eq!(set(&ok), [(Updated, true, UPDATED_OK), (Ready, true, UPDATED_OK)]);

        let first_failure = after_scan(&ScanVerdict::Failed("registry down".into()), false, false, None);
        assert!(!first_failure.only_ours);
        assert_eq!(
            set(&first_failure),
            [(Updated, false, "registry down"), (Ready, false, NO_SUCCESSFUL_UPDATE)]
        );

        let later_failure = after_scan(&ScanVerdict::Failed("registry down".into()), true, false, None);
        assert_eq!(set(&later_failure), [(Updated, false, "registry down")], "Ready is kept");

        let changed = after_scan(&ScanVerdict::Succeeded, true, true, None);
        assert!(changed.restamp_updated);

        // A refused configuration is not a passing outage: Ready says it too.
        let refused = after_scan(&ScanVerdict::Refused("[E_SECRET_NOT_ALLOWED] x".into()), true, false, None);
        assert!(!refused.only_ours && !refused.restamp_updated);
        assert_eq!(
            set(&refused),
            [(Updated, false, "[E_SECRET_NOT_ALLOWED] x"), (Ready, false, "[E_SECRET_NOT_ALLOWED] x")]
        );
    }

    #[test]
    fn a_schedule_that_cannot_run_shows_in_ready_whatever_the_outcome() {
        for verdict in
            [ScanVerdict::Succeeded, ScanVerdict::Failed("x".into()), ScanVerdict::Refused("y".into())]
        {
            for has_ready in [false, true] {
                let transition = after_scan(&verdict, has_ready, false, Some("[E_INVALID_SCHEDULE] bad"));
                let readies: Vec<_> = transition.set.iter().filter(|c| c.condition == Ready).collect();
                assert_eq!(readies.len(), 1, "{verdict:?} {has_ready}");
                assert_eq!((readies[0].ok, readies[0].message.as_str()), (false, "[E_INVALID_SCHEDULE] bad"));
            }
        }
    }

    #[test]
    fn a_partial_failure_names_each_repository() {
        let errors = [("r/a".to_string(), "timeout".to_string()), ("r/b".to_string(), "401".to_string())];
        assert_eq!(
            partial_failure(&errors, 3),
            "2 of 3 repositories failed, their previous entries are kept: r/a: timeout; r/b: 401"
        );
    }
}
