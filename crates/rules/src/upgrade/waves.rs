//! Waves: a JukeBox's upgrade policy that rolls a new revision out to its
//! instances in turn.
//!
//! The JukeBox lists waves in order, each a label selector (e.g. `wave:
//! canary`) and a soak time. An instance belongs to the first wave whose
//! selector its labels match; one that matches none belongs to an implicit
//! last wave, "the rest". So the order is a function of labels alone.
//!
//! An instance upgrades to a revision only once every instance of the same
//! package in each earlier wave runs that revision, installed, for at least
//! that wave's soak time. The first failure of an instance upgrading to it
//! (the revision quarantined for that instance, [`crate::upgrade`]) halts
//! every later wave for that revision: the failed instance rolls back as any
//! failed upgrade does, and the halt lasts until an operator clears that
//! quarantine or a newer revision is published. Lifecycle applies this to
//! upgrades only (a first install, new options and rollbacks never wait).

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};

use crate::RulesError;

/// One wave of a JukeBox's policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wave {
    pub name: String,
    /// Labels an instance must carry, all of them (an empty selector matches every instance).
    pub selector: BTreeMap<String, String>,
    /// How long its instances run a revision before the next wave may start.
    pub soak: SignedDuration,
}

impl Wave {
    /// `soak` as `1h`, `30m`, `0s`.
    pub fn parse(name: &str, selector: &BTreeMap<String, String>, soak: &str) -> Result<Self, RulesError> {
        let soak = super::non_negative("wave soak", soak, "give it as 1h, 30m or 0s")?;
        Ok(Wave { name: name.to_string(), selector: selector.clone(), soak })
    }

    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.selector.iter().all(|(k, v)| labels.get(k) == Some(v))
    }
}

/// The wave of an instance with these labels: the index of the first wave
/// matching them, `waves.len()` ("the rest") when none does.
pub fn wave_of(waves: &[Wave], labels: &BTreeMap<String, String>) -> usize {
    waves.iter().position(|w| w.matches(labels)).unwrap_or(waves.len())
}

/// The name of wave `index` ("the rest" past the listed ones).
pub fn wave_name(waves: &[Wave], index: usize) -> &str {
    waves.get(index).map_or("the rest", |w| w.name.as_str())
}

/// Another instance of the same package, as the gate needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member<'a> {
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    /// The revision it runs, installed (`None`: none, or not installed now).
    pub installed: Option<&'a str>,
    /// When it was recorded as installed at that revision.
    pub installed_at: Option<Timestamp>,
    /// Revisions quarantined for it (its upgrades to them failed).
    pub quarantined: &'a [String],
}

/// Whether an instance of wave `mine` may start its upgrade to `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaveGate {
    Open,
    /// An earlier wave has not finished (`until`: when its soak ends, when
    /// only the soak is left).
    Wait {
        until: Option<Timestamp>,
        why: String,
    },
    /// An instance of an earlier wave failed to upgrade to `to`.
    Halted {
        why: String,
    },
}

/// The gate of an upgrade to `to` by an instance of wave `mine`, given the
/// other instances of its package, at `now`.
pub fn wave_gate(waves: &[Wave], mine: usize, to: &str, members: &[Member], now: Timestamp) -> WaveGate {
    let mut failed: Vec<(usize, &str)> = members
        .iter()
        .map(|m| (wave_of(waves, m.labels), m))
        .filter(|(wave, m)| *wave < mine && m.quarantined.iter().any(|q| q == to))
        .map(|(wave, m)| (wave, m.name))
        .collect();
    failed.sort();
    if let Some((wave, name)) = failed.first() {
        return WaveGate::Halted {
            why: format!(
                "the rollout of {to} is halted: {name} of wave {} failed to upgrade to it (clear its quarantine to resume, or publish a newer revision)",
                wave_name(waves, *wave)
            ),
        };
    }
    for (index, wave) in waves.iter().enumerate().take(mine) {
        let mut in_wave: Vec<&Member> =
            members.iter().filter(|m| wave_of(waves, m.labels) == index).collect();
        in_wave.sort_by_key(|m| m.name);
        let behind: Vec<&str> = in_wave.iter().filter(|m| m.installed != Some(to)).map(|m| m.name).collect();
        if !behind.is_empty() {
            return WaveGate::Wait {
                until: None,
                why: format!(
                    "wave {} runs {to} first: {} of {} instances not there yet ({})",
                    wave.name,
                    behind.len(),
                    in_wave.len(),
                    behind.join(", ")
                ),
            };
        }
        // Unknown install times count as now: the soak starts again.
        let last = in_wave.iter().map(|m| m.installed_at.filter(|t| *t <= now).unwrap_or(now)).max();
        let Some(last) = last else { continue };
        // An overflow holds: never "no wait".
        let Ok(soaked) = last.checked_add(wave.soak) else {
            return WaveGate::Wait {
                until: None,
                why: format!(
                    "wave {} runs {to}, but its soak time ({:#}) cannot be counted: shorten it",
                    wave.name, wave.soak
                ),
            };
        };
        if soaked > now {
            return WaveGate::Wait {
                until: Some(soaked),
                why: format!("wave {} runs {to}; its soak time ends at {soaked}", wave.name),
            };
        }
    }
    WaveGate::Open
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(wave: Option<&str>) -> BTreeMap<String, String> {
        wave.map(|w| BTreeMap::from([("wave".to_string(), w.to_string())])).unwrap_or_default()
    }

    #[test]
    fn canary_first_then_its_soak_then_the_rest_and_a_canary_failure_halts_the_rest() {
        let canary = Wave::parse("canary", &labels(Some("canary")), "1h").unwrap();
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
            quarantined: &none,
        };
        let behind = [member(Some("0.2.0"), "2026-12-01T00:00:00Z")];
        assert!(matches!(wave_gate(&waves, 1, "0.3.0", &behind, now), WaveGate::Wait { until: None, .. }));
        assert_eq!(wave_gate(&waves, 0, "0.3.0", &behind, now), WaveGate::Open, "the canary itself goes");
        let soaking = [member(Some("0.3.0"), "2026-12-05T11:30:00Z")];
        match wave_gate(&waves, 1, "0.3.0", &soaking, now) {
            WaveGate::Wait { until, why } => {
                assert_eq!(until.map(|t| t.to_string()).as_deref(), Some("2026-12-05T12:30:00Z"));
                assert!(why.contains("wave canary runs 0.3.0"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        let soaked = [member(Some("0.3.0"), "2026-12-05T10:00:00Z")];
        assert_eq!(wave_gate(&waves, 1, "0.3.0", &soaked, now), WaveGate::Open);
        let quarantined = ["0.3.0".to_string()];
        let failed = [Member { quarantined: &quarantined, ..member(Some("0.2.0"), "2026-12-01T00:00:00Z") }];
        match wave_gate(&waves, 1, "0.3.0", &failed, now) {
            WaveGate::Halted { why } => assert!(why.contains("c1 of wave canary failed"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(wave_gate(&waves, 1, "0.3.1", &failed, now), WaveGate::Wait { .. }), "not 0.3.1's");
        assert!(Wave::parse("x", &BTreeMap::new(), "soon").is_err());
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
        }];
        let now: Timestamp = "2026-12-05T12:00:00Z".parse().unwrap();
        let none: [String; 0] = [];
        let canary = [Member {
            name: "c1",
            labels: &c,
            installed: Some("0.3.0"),
            installed_at: "2026-01-01T00:00:00Z".parse().ok(),
            quarantined: &none,
        }];
        match wave_gate(&waves, 1, "0.3.0", &canary, now) {
            WaveGate::Wait { until: None, why } => assert!(why.contains("soak"), "{why}"),
            other => panic!("the rest must wait: {other:?}"),
        }
        let error = Wave::parse("canary", &c, "100000000h").unwrap_err().to_string();
        assert!(error.contains("8784h"), "{error}");
    }
}
