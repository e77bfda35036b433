//! When an upgrade that has not started may start: an operator's approval
//! of exactly it, the JukeBox's waves, then its maintenance windows and
//! freezes — the timing gates, each answering the plan that holds it, or
//! the audit of what it went on without.

use vynil_crds::coded_message;
use vynil_rules::upgrade::{
    waves::{Member, WaveGate, available_since, wave_gate, wave_name, wave_of},
    window::{UpgradeGate, upgrade_gate},
};

use super::Desired;
use crate::install_plan::{
    Criterion, Observed, Outcome, PendingStep, Plan, PolicyOf, REQUEUE, Resolution, Step, WaitFor,
};

/// An upgrade not started yet waits for an operator's approval of exactly
/// it when its policy is manual, then for the JukeBox's waves, then outside
/// its maintenance windows and during a freeze
/// (`vynil_rules::upgrade::window`); a first install, new options for the
/// same revision, a rollback and a move away from a recalled revision never
/// wait. A policy that does not check holds the upgrade, saying what to fix.
pub(super) fn upgrade_timing(desired: &Desired, observed: &Observed) -> Result<Vec<Step>, Plan> {
    let Some(from) = desired.upgrade_from() else { return Ok(Vec::new()) };
    if observed.held_back.moves_away_to(&desired.tag) {
        // An operator's recall moves it: remediation, like a rollback.
        return Ok(Vec::new());
    }
    let Some(policy) = observed.upgrade_policy.as_ref() else { return Ok(Vec::new()) };
    if policy.policy.manual() && observed.upgrades.approval_of(&desired.fingerprint).is_none() {
        let (to, fingerprint, options_hash) = (&desired.tag, &desired.fingerprint, &desired.options_hash);
        let why = format!(
            "the upgrade {from} → {to} waits for an operator's approval ({}): options hash {options_hash}, fingerprint {fingerprint} (`vynilctl instance approve`)",
            policy.of
        );
        let outcome = Outcome::PendingApproval(Box::new(PendingStep {
            from: from.to_string(),
            to: to.clone(),
            fingerprint: fingerprint.clone(),
            options_hash: options_hash.clone(),
            why,
        }));
        return Err(Plan { steps: Vec::new(), outcome, requeue: REQUEUE });
    }
    let audited = wave_timing(desired, observed, policy, from)?;
    let (windows, freezes) = match policy.rules() {
        Ok(rules) => rules,
        Err(problem) => {
            let message =
                coded_message("E_UPGRADE_POLICY", &format!("the upgrade policy of {}: {problem}", policy.of));
            return Err(Plan::blocked(Criterion::Upgrade, Some("E_UPGRADE_POLICY"), message, REQUEUE));
        }
    };
    let UpgradeGate::Wait { until, why } = upgrade_gate(&windows, &freezes, observed.now) else {
        return Ok(audited);
    };
    let wait = until
        .and_then(|at| std::time::Duration::try_from(at.duration_since(observed.now)).ok())
        .map_or(REQUEUE, |d| d.clamp(std::time::Duration::from_secs(1), REQUEUE));
    let outcome = Outcome::Waiting {
        to: desired.tag.clone(),
        until: until.map(vynil_crds::condition::rfc3339_seconds),
        why: format!("the upgrade {from} → {} waits ({}): {why}", desired.tag, policy.of),
        on: WaitFor::Window,
    };
    Err(Plan { steps: Vec::new(), outcome, requeue: wait })
}

/// An upgrade under a JukeBox's waves waits for the earlier waves to run the
/// revision for their soak time (their members that never started it only
/// for their patience), and halts when one of their instances failed to
/// upgrade to it (`vynil_rules::upgrade::waves`). The wave of an instance
/// is chosen by its namespace's labels. Open, it answers the audit of the
/// members it went on without.
fn wave_timing(
    desired: &Desired,
    observed: &Observed,
    policy: &PolicyOf,
    from: &str,
) -> Result<Vec<Step>, Plan> {
    if policy.policy.waves.is_empty() {
        return Ok(Vec::new());
    }
    let waves = policy.policy.waves().map_err(|problem| {
        let message =
            coded_message("E_UPGRADE_POLICY", &format!("the upgrade policy of {}: {problem}", policy.of));
        Plan::blocked(Criterion::Upgrade, Some("E_UPGRADE_POLICY"), message, REQUEUE)
    })?;
    let reference = desired.instance.reference();
    // Not among its peers (not listed yet): the rest, which waits for every wave.
    let mine = observed
        .fleet
        .iter()
        .find(|m| m.name == reference)
        .map_or(waves.len(), |m| wave_of(&waves, &m.labels));
    let members: Vec<Member> = observed
        .fleet
        .iter()
        .map(|m| Member {
            name: &m.name,
            labels: &m.labels,
            installed: m.installed.as_deref(),
            installed_at: m.installed_at,
            started: m.started.as_deref(),
            quarantined: &m.quarantined,
        })
        .collect();
    let to = &desired.tag;
    let first_seen = match &observed.resolution {
        Resolution::Package { package, .. } if package.tag == *to => package.first_seen.as_deref(),
        _ => None,
    };
    let available = available_since(first_seen, policy.policy.minimum_age.as_deref(), observed.now);
    let step = format!("the upgrade {from} → {to} (wave {} of {})", wave_name(&waves, mine), policy.of);
    match wave_gate(&waves, mine, to, &members, available, observed.now) {
        WaveGate::Open { skipped } if skipped.is_empty() => Ok(Vec::new()),
        WaveGate::Open { skipped } => {
            let note = format!(
                "{step} goes on without the instances that never started it within their wave's patience: {}",
                skipped.join(", ")
            );
            Ok(vec![
                Step::Audited {
                    warning: true,
                    reason: "WaveMembersSkipped",
                    actor: "the JukeBox's wave patience",
                    note: note.clone(),
                },
                Step::JukeboxWarning { reason: "WaveMembersSkipped", note },
            ])
        }
        WaveGate::Wait { until, why } => {
            // Woken by the instances it waits for (`crate::fleet`), or when the soak ends.
            let wait = until
                .and_then(|at| std::time::Duration::try_from(at.duration_since(observed.now)).ok())
                .map_or(REQUEUE, |d| d.clamp(std::time::Duration::from_secs(1), REQUEUE));
            let until = until.map(vynil_crds::condition::rfc3339_seconds);
            let why = format!("{step} waits: {why}");
            let outcome = Outcome::Waiting { to: to.clone(), until, why, on: WaitFor::Wave };
            Err(Plan { steps: Vec::new(), outcome, requeue: wait })
        }
        WaveGate::Halted { why } => {
            let message = coded_message("E_WAVE_HALTED", &format!("{step}: {why}"));
            let mut plan = Plan::blocked(Criterion::Upgrade, Some("E_WAVE_HALTED"), message, REQUEUE);
            let note = coded_message("E_WAVE_HALTED", &why);
            plan.steps.push(Step::JukeboxWarning { reason: "WaveHalted", note });
            Err(plan)
        }
    }
}
