//! Waves: a JukeBox's upgrade policy that rolls a new revision out to its
//! instances in turn.
//!
//! The JukeBox lists waves in order, each a label selector and a soak time.
//! The labels are what the operator owns, never what a tenant writes: the
//! labels of the instance's namespace (lifecycle passes them; an instance's
//! own labels are its tenant's, who would otherwise join the canary wave
//! and hold every other tenant's rollout, #65 item 4). An instance belongs
//! to the first wave whose selector its labels match; one that matches none
//! belongs to an implicit last wave, "the rest".
//!
//! An instance upgrades to a revision only once every instance of the same
//! package in each earlier wave runs that revision, installed, for at least
//! that wave's soak time. A member that never **started** the revision
//! (suspended, held by its own gates, never installed) holds the later
//! waves only for the wave's patience, counted from when the wave could
//! start it (the revision's availability for the first wave, the end of
//! the previous wave's soak for the others); past it the rollout goes on
//! without it and says whom it skipped. A member whose Job for the revision
//! started keeps the later waves waiting whatever the patience. The first
//! failure of an instance upgrading to it (the revision quarantined for
//! that instance, [`crate::upgrade`]) halts every later wave for that
//! revision: the halt lasts until an operator clears that quarantine or a
//! newer revision is published, and no patience releases it. Lifecycle
//! applies this to upgrades only (a first install, new options and
//! rollbacks never wait).

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};

use crate::RulesError;

/// How long a wave's members that never start a revision hold the later
/// waves when the JukeBox does not say.
pub const DEFAULT_PATIENCE: SignedDuration = SignedDuration::from_hours(24);

/// One wave of a JukeBox's policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wave {
    pub name: String,
    /// Labels an instance's namespace must carry, all of them (an empty
    /// selector matches every instance).
    pub selector: BTreeMap<String, String>,
    /// How long its instances run a revision before the next wave may start.
    pub soak: SignedDuration,
    /// How long its members that never started a revision hold the next waves.
    pub patience: SignedDuration,
}

impl Wave {
    /// `soak` and `patience` as `1h`, `30m`, `0s` (no patience: [`DEFAULT_PATIENCE`]).
    pub fn parse(
        name: &str,
        selector: &BTreeMap<String, String>,
        soak: &str,
        patience: Option<&str>,
    ) -> Result<Self, RulesError> {
        let soak = super::non_negative("wave soak", soak, "give it as 1h, 30m or 0s")?;
        let patience = match patience {
            Some(patience) => super::non_negative("wave patience", patience, "give it as 24h, 30m or 0s")?,
            None => DEFAULT_PATIENCE,
        };
        Ok(Wave { name: name.to_string(), selector: selector.clone(), soak, patience })
    }

    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.selector.iter().all(|(k, v)| labels.get(k) == Some(v))
    }
}

/// The wave of an instance whose namespace has these labels: the index of
/// the first wave matching them, `waves.len()` ("the rest") when none does.
pub fn wave_of(waves: &[Wave], labels: &BTreeMap<String, String>) -> usize {
    waves.iter().position(|w| w.matches(labels)).unwrap_or(waves.len())
}

/// The name of wave `index` ("the rest" past the listed ones).
pub fn wave_name(waves: &[Wave], index: usize) -> &str {
    waves.get(index).map_or("the rest", |w| w.name.as_str())
}

/// Another instance of the same package, as the gate needs it: each from
/// lifecycle's own records, never the instance's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member<'a> {
    pub name: &'a str,
    /// Its namespace's labels.
    pub labels: &'a BTreeMap<String, String>,
    /// The revision it runs, installed (`None`: none, or not installed now).
    pub installed: Option<&'a str>,
    /// When it was recorded as installed at that revision.
    pub installed_at: Option<Timestamp>,
    /// The revision of the agent Job lifecycle started for it and has not
    /// credited yet (`None`: none in flight).
    pub started: Option<&'a str>,
    /// Revisions quarantined for it (its upgrades to them failed).
    pub quarantined: &'a [String],
}

/// Whether an instance of wave `mine` may start its upgrade to `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaveGate {
    /// It may: `skipped` names the members of earlier waves that never
    /// started `to` within their wave's patience (`name (wave w)`), which
    /// the rollout went on without.
    Open { skipped: Vec<String> },
    /// An earlier wave has not finished (`until`: when its soak or its
    /// patience ends, when only that is left).
    Wait { until: Option<Timestamp>, why: String },
    /// An instance of an earlier wave failed to upgrade to `to`.
    Halted { why: String },
}

/// When a revision became available to the first wave: when the scanner
/// first saw it (`first_seen`, RFC 3339) plus the policy's minimum age.
/// Unknown, unreadable or past counting: `now`, so the first wave's
/// patience starts again (it holds, never releases early).
pub fn available_since(first_seen: Option<&str>, minimum_age: Option<&str>, now: Timestamp) -> Timestamp {
    let age = match minimum_age.map(super::withheld::parse_minimum_age) {
        None => SignedDuration::ZERO,
        Some(Ok(age)) => age,
        Some(Err(_)) => return now,
    };
    let seen = first_seen.and_then(|s| s.parse::<Timestamp>().ok());
    seen.and_then(|seen| seen.checked_add(age).ok()).map_or(now, |at| at.min(now))
}

/// The gate of an upgrade to `to` by an instance of wave `mine`, given the
/// other instances of its package, at `now`; `available`: when `to` became
/// available to the first wave (the wave's patience counts from it).
pub fn wave_gate(
    waves: &[Wave],
    mine: usize,
    to: &str,
    members: &[Member],
    available: Timestamp,
    now: Timestamp,
) -> WaveGate {
    if let Some(why) = halted(waves, mine, to, members) {
        return WaveGate::Halted { why };
    }
    let mut opened = available;
    let mut skipped = Vec::new();
    for (index, wave) in waves.iter().enumerate().take(mine) {
        let mut in_wave: Vec<&Member> =
            members.iter().filter(|m| wave_of(waves, m.labels) == index).collect();
        in_wave.sort_by_key(|m| m.name);
        match through(wave, to, &in_wave, opened, now) {
            Ok((finished, never)) => {
                skipped.extend(never.into_iter().map(|name| format!("{name} (wave {})", wave.name)));
                opened = finished;
            }
            Err(gate) => return gate,
        }
    }
    WaveGate::Open { skipped }
}

/// The first failure of an earlier wave's member to upgrade to `to`, in words.
fn halted(waves: &[Wave], mine: usize, to: &str, members: &[Member]) -> Option<String> {
    let mut failed: Vec<(usize, &str)> = members
        .iter()
        .map(|m| (wave_of(waves, m.labels), m))
        .filter(|(wave, m)| *wave < mine && m.quarantined.iter().any(|q| q == to))
        .map(|(wave, m)| (wave, m.name))
        .collect();
    failed.sort();
    let (wave, name) = failed.first()?;
    Some(format!(
        "the rollout of {to} is halted: {name} of wave {} failed to upgrade to it (clear its quarantine to resume, or publish a newer revision)",
        wave_name(waves, *wave)
    ))
}

/// Whether `wave` (its members `in_wave`, able to start `to` since
/// `opened`) is through with `to` at `now`: when it finished and the
/// members skipped, or the gate that holds the later waves.
fn through<'a>(
    wave: &Wave,
    to: &str,
    in_wave: &[&'a Member<'a>],
    opened: Timestamp,
    now: Timestamp,
) -> Result<(Timestamp, Vec<&'a str>), WaveGate> {
    // An overflow holds: never "no wait".
    let uncountable = |what: &str, duration: SignedDuration| WaveGate::Wait {
        until: None,
        why: format!("wave {}: its {what} ({duration:#}) cannot be counted: shorten it", wave.name),
    };
    let behind: Vec<&Member> = in_wave.iter().copied().filter(|m| m.installed != Some(to)).collect();
    let started: Vec<&str> = behind.iter().filter(|m| m.started == Some(to)).map(|m| m.name).collect();
    let never: Vec<&str> = behind.iter().filter(|m| m.started != Some(to)).map(|m| m.name).collect();
    let not_there = |names: &[&str]| {
        format!("{} of {} instances not there yet ({})", behind.len(), in_wave.len(), names.join(", "))
    };
    if !started.is_empty() {
        let why = format!(
            "wave {} runs {to} first: {}; their upgrade is under way",
            wave.name,
            not_there(&started)
        );
        return Err(WaveGate::Wait { until: None, why });
    }
    let released = match never.is_empty() {
        true => opened,
        false => opened.checked_add(wave.patience).map_err(|_| uncountable("patience", wave.patience))?,
    };
    if !never.is_empty() && released > now {
        let why = format!(
            "wave {} runs {to} first: {}; those that do not start it hold the later waves until {released} (patience {:#})",
            wave.name,
            not_there(&never),
            wave.patience
        );
        return Err(WaveGate::Wait { until: Some(released), why });
    }
    // Unknown install times count as now: the soak starts again.
    let installed = in_wave.iter().filter(|m| m.installed == Some(to));
    let last = installed.map(|m| m.installed_at.filter(|t| *t <= now).unwrap_or(now)).max();
    // A wave never finishes before it could start.
    let finished = match last {
        Some(last) => {
            last.checked_add(wave.soak).map_err(|_| uncountable("soak time", wave.soak))?.max(released)
        }
        None => released,
    };
    if finished > now {
        let why = format!("wave {} runs {to}; its soak time ends at {finished}", wave.name);
        return Err(WaveGate::Wait { until: Some(finished), why });
    }
    Ok((finished, never))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(wave: Option<&str>) -> BTreeMap<String, String> {
        wave.map(|w| BTreeMap::from([("wave".to_string(), w.to_string())])).unwrap_or_default()
    }

    fn open() -> WaveGate {
        WaveGate::Open { skipped: Vec::new() }
    }

    #[test]
    fn canary_first_then_its_soak_then_the_rest_and_a_canary_failure_halts_the_rest() {
        let canary = Wave::parse("canary", &labels(Some("canary")), "1h", None).unwrap();
        let waves = [canary];
        let (c, rest) = (labels(Some("canary")), labels(None));
        assert_eq!((wave_of(&waves, &c), wave_of(&waves, &rest)), (0, 1));
        let now: Timestamp = "2026-12-05T12:00:00Z".parse().unwrap();
        let none: [String; 0] = [];
        let member = |installed: Option<&'static str>, at: &str| Member {
            name: "c1",
            labels: &c,
            installed,
            installed_at: at.parse().ok(),
            started: None,
            quarantined: &none,
        };
        let behind = [Member { started: Some("0.3.0"), ..member(Some("0.2.0"), "2026-12-01T00:00:00Z") }];
        let gate = wave_gate(&waves, 1, "0.3.0", &behind, now, now);
        assert!(matches!(gate, WaveGate::Wait { until: None, .. }), "{gate:?}");
        assert_eq!(wave_gate(&waves, 0, "0.3.0", &behind, now, now), open(), "the canary itself goes");
        let soaking = [member(Some("0.3.0"), "2026-12-05T11:30:00Z")];
        match wave_gate(&waves, 1, "0.3.0", &soaking, now, now) {
            WaveGate::Wait { until, why } => {
                assert_eq!(until.map(|t| t.to_string()).as_deref(), Some("2026-12-05T12:30:00Z"));
                assert!(why.contains("wave canary runs 0.3.0"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        let soaked = [member(Some("0.3.0"), "2026-12-05T10:00:00Z")];
        assert_eq!(wave_gate(&waves, 1, "0.3.0", &soaked, now, now), open());
        let quarantined = ["0.3.0".to_string()];
        let failed = [Member { quarantined: &quarantined, ..member(Some("0.2.0"), "2026-12-01T00:00:00Z") }];
        match wave_gate(&waves, 1, "0.3.0", &failed, now, now) {
            WaveGate::Halted { why } => assert!(why.contains("c1 of wave canary failed"), "{why}"),
            other => panic!("{other:?}"),
        }
        let gate = wave_gate(&waves, 1, "0.3.1", &failed, now, now);
        assert!(matches!(gate, WaveGate::Wait { .. }), "not 0.3.1's: {gate:?}");
        assert!(Wave::parse("x", &BTreeMap::new(), "soon", None).is_err());
    }

    #[test]
    fn item_4_a_member_that_never_starts_holds_the_later_waves_only_for_its_patience() {
        // The attack (with membership by the tenant's own labels): a tenant
        // joins the canary wave and suspends its instance; every other
        // tenant's rollout waited for it forever.
        let c = labels(Some("canary"));
        let waves = [Wave::parse("canary", &c, "1h", Some("6h")).unwrap()];
        let available: Timestamp = "2026-12-05T00:00:00Z".parse().unwrap();
        let none: [String; 0] = [];
        let quarantined = ["0.3.0".to_string()];
        let member = |name: &'static str, installed: &'static str, started: Option<&'static str>| Member {
            name,
            labels: &c,
            installed: Some(installed),
            installed_at: "2026-12-05T01:00:00Z".parse().ok(),
            started,
            quarantined: &none,
        };
        let suspended = member("suspended", "0.2.0", None);
        let fleet = [member("done", "0.3.0", None), suspended.clone()];
        let before: Timestamp = "2026-12-05T05:59:00Z".parse().unwrap();
        match wave_gate(&waves, 1, "0.3.0", &fleet, available, before) {
            WaveGate::Wait { until, why } => {
                assert_eq!(until.map(|t| t.to_string()).as_deref(), Some("2026-12-05T06:00:00Z"));
                assert!(why.contains("suspended") && why.contains("patience 6h"), "{why}");
            }
            other => panic!("within its patience the member holds: {other:?}"),
        }
        let after: Timestamp = "2026-12-05T06:00:00Z".parse().unwrap();
        let gate = wave_gate(&waves, 1, "0.3.0", &fleet, available, after);
        assert_eq!(gate, WaveGate::Open { skipped: vec!["suspended (wave canary)".into()] });
        // Started, failed or quarantined: no patience releases the wave.
        let running = [member("done", "0.3.0", None), member("running", "0.2.0", Some("0.3.0"))];
        let later: Timestamp = "2026-12-09T00:00:00Z".parse().unwrap();
        let gate = wave_gate(&waves, 1, "0.3.0", &running, available, later);
        assert!(matches!(&gate, WaveGate::Wait { until: None, why } if why.contains("running")), "{gate:?}");
        let failed = [Member { quarantined: &quarantined, ..suspended }];
        assert!(matches!(wave_gate(&waves, 1, "0.3.0", &failed, available, later), WaveGate::Halted { .. }));
        // A wave nobody of which installed: the next counts from its release.
        let two = [waves[0].clone(), Wave::parse("early", &labels(Some("early")), "0s", Some("1h")).unwrap()];
        let e = labels(Some("early"));
        let early = Member { name: "e1", labels: &e, installed: Some("0.2.0"), ..member("x", "0.2.0", None) };
        let fleet = [member("c1", "0.2.0", None), early];
        let at_release: Timestamp = "2026-12-05T06:30:00Z".parse().unwrap();
        let gate = wave_gate(&two, 2, "0.3.0", &fleet, available, at_release);
        assert!(matches!(&gate, WaveGate::Wait { why, .. } if why.contains("wave early")), "{gate:?}");
        let past: Timestamp = "2026-12-05T07:00:00Z".parse().unwrap();
        let gate = wave_gate(&two, 2, "0.3.0", &fleet, available, past);
        assert_eq!(
            gate,
            WaveGate::Open { skipped: vec!["c1 (wave canary)".into(), "e1 (wave early)".into()] }
        );
    }

    #[test]
    fn a_soak_too_long_to_count_holds_the_later_waves() {
        // The attack: a soak of 100000000h overflowed the date addition and
        // the later waves started at once.
        let c = labels(Some("canary"));
        let waves = [Wave {
            name: "canary".into(),
            selector: c.clone(),
            soak: SignedDuration::from_hours(100_000_000),
            patience: SignedDuration::from_hours(100_000_000),
        }];
        let now: Timestamp = "2026-12-05T12:00:00Z".parse().unwrap();
        let none: [String; 0] = [];
        let canary = Member {
            name: "c1",
            labels: &c,
            installed: Some("0.3.0"),
            installed_at: "2026-01-01T00:00:00Z".parse().ok(),
            started: None,
            quarantined: &none,
        };
        match wave_gate(&waves, 1, "0.3.0", std::slice::from_ref(&canary), now, now) {
            WaveGate::Wait { until: None, why } => assert!(why.contains("soak"), "{why}"),
            other => panic!("the rest must wait: {other:?}"),
        }
        let never = [Member { installed: Some("0.2.0"), ..canary }];
        match wave_gate(&waves, 1, "0.3.0", &never, now, now) {
            WaveGate::Wait { until: None, why } => assert!(why.contains("patience"), "{why}"),
            other => panic!("a patience too long holds: {other:?}"),
        }
        let error = Wave::parse("canary", &c, "100000000h", None).unwrap_err().to_string();
        assert!(error.contains("8784h"), "{error}");
        let error = Wave::parse("canary", &c, "1h", Some("100000000h")).unwrap_err().to_string();
        assert!(error.contains("8784h"), "{error}");
    }
}
