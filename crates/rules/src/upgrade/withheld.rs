//! Revisions a JukeBox holds back from selection for all its instances.
//!
//! - **Recalled**: an operator marked the revision bad (a field of the
//!   JukeBox, so losing Redis cannot make it installable again). Selection
//!   never installs or upgrades to it. An instance already running it keeps
//!   it (its uninstall needs it, and going back is a downgrade no package
//!   declares safe) and moves on at the next selectable newer revision —
//!   unless the recall says **move away**: then the instance is moved to the
//!   newest selectable revision of its type, older or not.
//! - **Too young**: first seen by the scanner (`Package::first_seen`) less
//!   than the minimum release age ago. A revision without a first-seen time
//!   (a catalog written before it was recorded, a time lost) counts as seen
//!   now: the age restarts, the safe direction. The installed revision is
//!   never held back for its age.
//! - **Unverified**: under a JukeBox's `enforce` signature policy, a revision
//!   whose signature verdict ([`crate::signature`], recorded by the scanner)
//!   is not "verified". An instance running one keeps it (a downgrade is no
//!   package's promise, and its uninstall must run) but is never moved to
//!   another one.
//!
//! [`crate::selection::select_install`] applies them;
//! [`crate::catalog::held_back`] says what they kept from an instance, for
//! `Explain`.

use jiff::{SignedDuration, Timestamp};

use crate::{
    RulesError,
    package::Package,
    signature::{Verdict, VerifyMode},
};

/// An operator's recall of one revision (a tag) of a JukeBox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recall {
    pub tag: String,
    pub reason: String,
    /// Instances running it are moved to the newest selectable revision.
    pub move_away: bool,
}

/// Why a revision is held back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Withholding {
    Recalled {
        reason: String,
        move_away: bool,
    },
    /// `selectable_at: None`: its minimum age cannot be counted from its
    /// first sighting (the date would overflow), so it is held for ever.
    TooYoung {
        selectable_at: Option<Timestamp>,
        minimum_age: SignedDuration,
    },
    Unverified {
        verdict: Verdict,
    },
}

/// One revision held back, by tag: of any package of the JukeBox (a recall
/// names a tag), or of one repository (`registry`, `image`) when the reason
/// is the revision's own (its age, its signature).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Withheld {
    pub tag: String,
    pub why: Withholding,
    pub repository: Option<(String, String)>,
}

impl Withheld {
    /// "0.3.0 is recalled: <reason>", "0.3.0 becomes selectable at <time> (minimum age 72h)".
    pub fn describe(&self) -> String {
        match &self.why {
            Withholding::Recalled { reason, .. } if reason.is_empty() => format!("{} is recalled", self.tag),
            Withholding::Recalled { reason, .. } => format!("{} is recalled: {reason}", self.tag),
            Withholding::TooYoung { selectable_at: Some(at), minimum_age } => {
                format!("{} becomes selectable at {at} (minimum age {})", self.tag, human(*minimum_age))
            }
            Withholding::TooYoung { selectable_at: None, minimum_age } => format!(
                "{} is held: its minimum age ({}) cannot be counted from its first sighting; shorten the policy's minimumAge",
                self.tag,
                human(*minimum_age)
            ),
            Withholding::Unverified { verdict } => {
                format!("[E_UNVERIFIED] {}: {}", self.tag, verdict.describe())
            }
        }
    }

    /// Whether this holds `package` back.
    pub fn holds(&self, package: &Package) -> bool {
        self.tag == package.tag
            && self.repository.as_ref().is_none_or(|(r, i)| *r == package.registry && *i == package.image)
    }

    /// Whether an instance running this revision keeps it: always, but for
    /// a recall that moves its instances away.
    pub fn keeps_installed(&self) -> bool {
        !matches!(self.why, Withholding::Recalled { move_away: true, .. })
    }

    pub fn is_recall(&self) -> bool {
        matches!(self.why, Withholding::Recalled { .. })
    }
}

/// `72h` for 259 200 s: jiff's friendly format, hours as the largest unit.
fn human(duration: SignedDuration) -> String {
    format!("{duration:#}")
}

/// A minimum release age as written (`72h`, `90m`, `1h 30m`; `0s` for none).
pub fn parse_minimum_age(text: &str) -> Result<SignedDuration, RulesError> {
    super::non_negative("minimum age", text, "give it as 72h, 90m or 1h 30m")
}

/// Which of two minimum ages holds (a JukeBox's and an instance's): the
/// longer, so neither side can shorten the other's; one that does not parse
/// is the one returned, so its error is what the caller reports.
pub fn stricter_age<'a>(a: Option<&'a str>, b: Option<&'a str>) -> Option<&'a str> {
    match (a, b) {
        (Some(a), Some(b)) => match (parse_minimum_age(a), parse_minimum_age(b)) {
            (Ok(x), Ok(y)) => Some(if y > x { b } else { a }),
            (Err(_), _) => Some(a),
            (_, Err(_)) => Some(b),
        },
        (a, b) => a.or(b),
    }
}

/// What a JukeBox holds back from every instance.
#[derive(Debug, Clone, Copy, Default)]
pub struct Holds<'a> {
    pub recalls: &'a [Recall],
    pub minimum_age: Option<SignedDuration>,
    pub verify: Option<VerifyMode>,
}

/// The revisions of `packages` held back: each recalled tag, each revision
/// first seen less than `minimum_age` before `now`, and under an enforced
/// signature policy each revision not verified (one without a verdict was
/// never checked: it is not verified).
pub fn withheld(packages: &[Package], holds: Holds, now: Timestamp) -> Vec<Withheld> {
    let mut out: Vec<Withheld> = holds
        .recalls
        .iter()
        .map(|r| Withheld {
            tag: r.tag.clone(),
            why: Withholding::Recalled { reason: r.reason.clone(), move_away: r.move_away },
            repository: None,
        })
        .collect();
    if holds.verify == Some(VerifyMode::Enforce) {
        for package in packages {
            let verdict = package.signature.clone().unwrap_or(Verdict::Unsigned);
            if !verdict.is_verified() {
                out.push(Withheld {
                    tag: package.tag.clone(),
                    why: Withholding::Unverified { verdict },
                    repository: Some((package.registry.clone(), package.image.clone())),
                });
            }
        }
    }
    let Some(minimum_age) = holds.minimum_age.filter(|a| a.is_positive()) else {
        return out;
    };
    for package in packages {
        let seen = package.first_seen.as_deref().and_then(|t| t.parse::<Timestamp>().ok());
        // Unknown, or in the future (a clock ahead): seen now.
        let seen = seen.filter(|s| *s <= now).unwrap_or(now);
        // An overflow holds: never "no wait".
        let selectable_at = seen.checked_add(minimum_age).ok();
        if selectable_at.is_none_or(|at| at > now) && !out.iter().any(|w| w.holds(package)) {
            out.push(Withheld {
                tag: package.tag.clone(),
                why: Withholding::TooYoung { selectable_at, minimum_age },
                repository: Some((package.registry.clone(), package.image.clone())),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::package::{PackageContent, PackageType};

    fn seen(tag: &str, first_seen: Option<&str>) -> Package {
        let mut p = Package::new("r", "i", tag, PackageContent::minimal("c", "n", PackageType::Tenant));
        p.first_seen = first_seen.map(String::from);
        p
    }

    #[test]
    fn a_revision_is_too_young_until_its_first_sighting_plus_the_minimum_age() {
        let now: Timestamp = "2026-03-10T12:00:00Z".parse().unwrap();
        let packages = [
            seen("0.1.0", Some("2026-03-01T00:00:00Z")),
            seen("0.2.0", Some("2026-03-09T12:00:00Z")),
            seen("0.3.0", None),
            seen("0.4.0", Some("2027-01-01T00:00:00Z")),
        ];
        let age = parse_minimum_age("72h").unwrap();
        let held = withheld(&packages, Holds { minimum_age: Some(age), ..Holds::default() }, now);
        let at = |tag: &str| {
            held.iter().find(|w| w.tag == tag).map(|w| match w.why {
                Withholding::TooYoung { selectable_at, .. } => {
                    selectable_at.map(|t| t.to_string()).unwrap_or_default()
                }
                _ => "recalled".into(),
            })
        };
        assert_eq!(at("0.1.0"), None, "seen 9½ days ago");
        assert_eq!(at("0.2.0").as_deref(), Some("2026-03-12T12:00:00Z"));
        assert_eq!(at("0.3.0").as_deref(), Some("2026-03-13T12:00:00Z"), "unknown counts as now");
        assert_eq!(at("0.4.0").as_deref(), Some("2026-03-13T12:00:00Z"), "a future sighting counts as now");
        assert!(
            withheld(&packages, Holds { minimum_age: Some(SignedDuration::ZERO), ..Holds::default() }, now)
                .is_empty()
        );
        assert!(held[0].describe().contains("becomes selectable at 2026-03-12T12:00:00Z (minimum age 72h)"));
    }

    #[test]
    fn a_minimum_age_too_long_to_count_holds_the_revision_instead_of_opening() {
        // The attack: `minimumAge: 100000000h` made the date addition
        // overflow, and the check was skipped: selectable at once.
        let now: Timestamp = "2026-03-10T12:00:00Z".parse().unwrap();
        let huge = SignedDuration::from_hours(100_000_000);
        let packages = [seen("0.1.0", Some("2026-03-01T00:00:00Z")), seen("0.2.0", None)];
        let held = withheld(&packages, Holds { minimum_age: Some(huge), ..Holds::default() }, now);
        assert_eq!(held.len(), 2, "{held:?}");
        assert!(held[0].describe().contains("minimum age"), "{}", held[0].describe());
        // Written in a policy, it is refused with its bound.
        let error = parse_minimum_age("100000000h").unwrap_err().to_string();
        assert!(error.contains("8784h"), "{error}");
        assert!(parse_minimum_age("8784h").is_ok());
    }

    #[test]
    fn a_bad_minimum_age_says_how_to_write_one() {
        let error = parse_minimum_age("three days").unwrap_err().to_string();
        assert!(error.contains("minimum age") && error.contains("72h"), "{error}");
        assert!(parse_minimum_age("-1h").is_err());
        assert_eq!(parse_minimum_age("0s").unwrap(), SignedDuration::ZERO);
    }

    #[test]
    fn the_longer_of_two_minimum_ages_holds_and_a_bad_one_is_reported() {
        assert_eq!(stricter_age(Some("72h"), Some("1h")), Some("72h"));
        assert_eq!(stricter_age(Some("1h"), Some("90h")), Some("90h"));
        assert_eq!(stricter_age(None, Some("1h")), Some("1h"));
        assert_eq!(stricter_age(Some("72h"), Some("soon")), Some("soon"));
        assert_eq!(stricter_age(None, None), None);
    }
}
