//! What the planner is told of an instance's upgrade rules: its policy
//! (windows, freezes, approvals, waves), what its JukeBox holds back from
//! it (recalled, too young), its package's fleet for waves, and what a
//! waiting upgrade waits for.

use super::InitVersion;

/// An upgrade policy as written, the windows the instance narrows it to,
/// and whose it is ("JukeBox box", "the instance").
pub type PolicyOf = vynil_crds::EffectivePolicy;

/// What an upgrade waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitFor {
    /// A maintenance window, or the end of a freeze.
    Window,
    /// The earlier waves of the JukeBox's rollout.
    Wave,
    /// A selectable revision: every newer one is recalled or too young,
    /// and the installed one is not in the catalog.
    Withheld,
    /// A revision not quarantined for the instance: every one the catalog
    /// lists is (an upgrade to it failed), the installed one is not listed.
    Quarantine,
}

impl WaitFor {
    /// As `blocked_by` says it.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitFor::Window => "upgrade_window",
            WaitFor::Wave => "upgrade_wave",
            WaitFor::Withheld => "withheld",
            WaitFor::Quarantine => "quarantine",
        }
    }
}

/// Another instance of the same package (or itself), for waves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetMember {
    /// `<kind>/<namespace>/<name>`.
    pub name: String,
    /// Its namespace's labels (the operator's: they choose its wave).
    pub labels: std::collections::BTreeMap<String, String>,
    /// The revision lifecycle credited as installed (its ledger).
    pub installed: Option<String>,
    pub installed_at: Option<jiff::Timestamp>,
    /// The revision of the agent Job lifecycle started and has not credited.
    pub started: Option<String>,
    /// Revisions quarantined for it after upgrades to them failed.
    pub quarantined: Vec<String>,
}

/// What the JukeBox held back from an instance, as the catalog said it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HeldBack {
    /// Recalled or too young revisions newer than the one selected, in
    /// words ("0.1.10 becomes selectable at …"), newest first.
    pub newer: Vec<String>,
    /// The installed revision is recalled.
    pub recalled: Option<RunningRecalled>,
    /// Every revision the JukeBox recalls: tag, and the recall in words.
    pub recalls: Vec<(String, String)>,
    /// The JukeBox's signature policy (`initFrom.version` is checked against it).
    pub verify: Option<vynil_rules::signature::VerifyMode>,
}

/// The installed revision is recalled: in words, whether the recall moves
/// its instances away, and the revision moving away installs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningRecalled {
    pub description: String,
    pub move_away: bool,
    pub to: Option<String>,
}

impl HeldBack {
    /// `initFrom.version` as found, unless the JukeBox recalls that tag.
    pub fn refusing_recalled(&self, found: InitVersion) -> InitVersion {
        let recalled = match &found {
            InitVersion::Found { tag, .. } => self.recalls.iter().find(|(t, _)| t == tag),
            _ => None,
        };
        recalled.map_or(found, |(_, recall)| InitVersion::Recalled(recall.clone()))
    }

    /// Whether installing `tag` moves the instance away from a recalled revision.
    pub fn moves_away_to(&self, tag: &str) -> bool {
        self.recalled.as_ref().is_some_and(|r| r.move_away && r.to.as_deref() == Some(tag))
    }
}
