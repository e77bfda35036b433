//! Ours: when upgrades may start — maintenance windows and freezes, on a
//! JukeBox (for its instances) or an instance (for itself, narrowing its
//! JukeBox's: a tenant writes its instance, and never widens an operator's
//! windows). The rules are `vynil_rules::upgrade::window`; lifecycle
//! applies them to upgrades only (`docs/lifecycle.md`, "Maintenance windows
//! and freezes"). Field names are single words, the same in the JukeBox's
//! snake_case spec and the instances' camelCase ones.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use vynil_rules::{
    RulesError,
    upgrade::window::{Freeze, Window},
};

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct UpgradePolicy {
    /// Upgrades start only inside one of these; none: at any time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<MaintenanceWindow>,
    /// No upgrade starts inside any of these, whatever the windows say.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub freezes: Vec<UpgradeFreeze>,
    /// `manual`: each upgrade waits for an operator's approval of exactly it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalMode>,
    /// A revision is selectable only once the scanner has known its digest
    /// this long (`72h`, `90m`). The longer of the JukeBox's and the
    /// instance's holds. Named as the issue that asked for it, in both specs.
    #[serde(default, rename = "minimumAge", skip_serializing_if = "Option::is_none")]
    pub minimum_age: Option<String>,
    /// A JukeBox's only (an instance's are ignored): a new revision reaches
    /// its instances wave by wave, each wave after the previous one's
    /// instances run it for their soak time; instances no wave selects come last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waves: Vec<UpgradeWave>,
}

/// One wave of a JukeBox's rollout (`docs/lifecycle.md`, "Waves").
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct UpgradeWave {
    pub name: String,
    /// Labels the namespaces of its instances carry, all of them: the
    /// operator's, never the tenants' (#65 item 4).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub namespaces: std::collections::BTreeMap<String, String>,
    /// Refused when set: an earlier release matched it with the instances'
    /// own labels, which their tenants write (use `namespaces`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub selector: std::collections::BTreeMap<String, String>,
    /// How long its instances run a revision before the next wave starts (`1h`, `0s`).
    #[serde(default = "no_soak")]
    pub soak: String,
    /// How long its instances that never start a revision (suspended, held,
    /// never installed) hold the next waves (`24h` when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patience: Option<String>,
}

impl UpgradeWave {
    /// The rules' wave, checked: a selector of the instances' own labels is
    /// refused, never read (a tenant would choose its wave).
    fn rules(&self) -> Result<vynil_rules::upgrade::waves::Wave, RulesError> {
        if !self.selector.is_empty() {
            return Err(RulesError::UpgradePolicy {
                field: "wave selector",
                value: format!("{} {:?}", self.name, self.selector),
                problem: "it selects instances by their own labels, which their tenants write".into(),
                hint: "select the labels of their namespaces with `namespaces` instead",
            });
        }
        let patience = self.patience.as_deref();
        vynil_rules::upgrade::waves::Wave::parse(&self.name, &self.namespaces, &self.soak, patience)
    }
}

fn no_soak() -> String {
    "0s".into()
}

/// Ours: a revision an operator recalled for a JukeBox's instances
/// (`spec.recalls`): never installed or upgraded to (`docs/lifecycle.md`,
/// "Recalled revisions").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RecalledRevision {
    /// The tag recalled, as the catalog lists it.
    pub tag: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Move the instances running it to the newest selectable revision.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub move_away: bool,
    /// Who recalled it and when (RFC 3339), as the gateway recorded them.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub by: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub at: String,
}

impl RecalledRevision {
    /// The rules' view of these recalls.
    pub fn rules(recalls: &[Self]) -> Vec<vynil_rules::upgrade::withheld::Recall> {
        recalls
            .iter()
            .map(|r| vynil_rules::upgrade::withheld::Recall {
                tag: r.tag.clone(),
                reason: r.reason.clone(),
                move_away: r.move_away,
            })
            .collect()
    }
}

/// Whether an upgrade needs an operator's approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalMode {
    Automatic,
    Manual,
}

/// `vynil.solidite.fr/upgrade-approval: manual` on an instance: its upgrades
/// wait for approval (whatever its JukeBox says; a JukeBox's `manual` holds
/// whatever the instance says).
pub const UPGRADE_APPROVAL: &str = "vynil.solidite.fr/upgrade-approval";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MaintenanceWindow {
    /// Cron expression of each opening, in `zone` (e.g. `0 2 * * 6`: Saturdays 02:00).
    pub schedule: String,
    /// IANA time zone of the schedule, e.g. `Europe/Paris`.
    #[serde(default = "utc")]
    pub zone: String,
    /// How long each opening lasts, e.g. `4h`, `90m`.
    pub duration: String,
}

fn utc() -> String {
    "UTC".into()
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UpgradeFreeze {
    /// RFC 3339, with its offset.
    pub from: String,
    /// RFC 3339, with its offset: the first moment upgrades may start again.
    pub until: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// The upgrade policy an instance follows: its JukeBox's (or its own, when
/// the JukeBox has none), the windows the instance narrows it to, and whose
/// it is ("JukeBox box", "the instance"), for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectivePolicy {
    pub policy: UpgradePolicy,
    /// The instance's own windows, when its JukeBox has a policy: an upgrade
    /// waits for one of these too.
    pub narrowing: Vec<MaintenanceWindow>,
    pub of: String,
}

impl EffectivePolicy {
    /// The window sets (the policy's, then the narrowing ones) and the
    /// freezes, checked; the first bad one says what to fix.
    pub fn rules(&self) -> Result<(Vec<Vec<Window>>, Vec<Freeze>), RulesError> {
        let (windows, freezes) = self.policy.rules()?;
        let narrowing = parse_windows(&self.narrowing)?;
        Ok((vec![windows, narrowing], freezes))
    }
}

impl UpgradePolicy {
    /// What applies to an instance: its own windows narrow its JukeBox's
    /// (an upgrade waits for one of each: when its upgrades may run is its
    /// owner's choice within the operator's), the JukeBox's freezes always
    /// hold (an instance cannot lift an operator's freeze), either's
    /// `approval: manual` makes upgrades wait for approval, and the longer
    /// minimum age holds.
    pub fn effective(jukebox: Option<(&str, &Self)>, own: Option<&Self>) -> Option<EffectivePolicy> {
        let manual = [jukebox.map(|(_, p)| p), own].iter().flatten().any(|p| p.manual());
        let mut effective = Self::combined(jukebox, own)?;
        if manual {
            effective.policy.approval = Some(ApprovalMode::Manual);
        }
        Some(effective)
    }

    /// Whether upgrades under it need an operator's approval.
    pub fn manual(&self) -> bool {
        self.approval == Some(ApprovalMode::Manual)
    }

    fn combined(jukebox: Option<(&str, &Self)>, own: Option<&Self>) -> Option<EffectivePolicy> {
        match (jukebox, own) {
            (None, None) => None,
            (Some((name, policy)), None) => Some(EffectivePolicy {
                policy: policy.clone(),
                narrowing: Vec::new(),
                of: format!("JukeBox {name}"),
            }),
            (None, Some(own)) => Some(EffectivePolicy {
                policy: UpgradePolicy { waves: Vec::new(), ..own.clone() },
                narrowing: Vec::new(),
                of: "the instance".into(),
            }),
            (Some((name, policy)), Some(own)) => {
                let freezes = policy.freezes.iter().chain(&own.freezes).cloned().collect();
                let ages = (policy.minimum_age.as_deref(), own.minimum_age.as_deref());
                let minimum_age =
                    vynil_rules::upgrade::withheld::stricter_age(ages.0, ages.1).map(String::from);
                let merged = UpgradePolicy {
                    windows: policy.windows.clone(),
                    freezes,
                    approval: own.approval,
                    minimum_age,
                    waves: policy.waves.clone(),
                };
                Some(EffectivePolicy {
                    policy: merged,
                    narrowing: own.windows.clone(),
                    of: format!("JukeBox {name} and the instance"),
                })
            }
        }
    }

    /// The waves, checked; the first bad one says what to fix.
    pub fn waves(&self) -> Result<Vec<vynil_rules::upgrade::waves::Wave>, RulesError> {
        self.waves.iter().map(UpgradeWave::rules).collect()
    }

    /// The windows and freezes, checked; the first bad one says what to fix.
    pub fn rules(&self) -> Result<(Vec<Window>, Vec<Freeze>), RulesError> {
        let windows = parse_windows(&self.windows)?;
        let freezes = self
            .freezes
            .iter()
            .map(|f| Freeze::parse(&f.from, &f.until, &f.reason))
            .collect::<Result<_, _>>()?;
        Ok((windows, freezes))
    }
}

fn parse_windows(windows: &[MaintenanceWindow]) -> Result<Vec<Window>, RulesError> {
    windows.iter().map(|w| Window::parse(&w.schedule, &w.zone, &w.duration)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instances_windows_narrow_its_jukeboxs_and_the_jukeboxs_freezes_hold() {
        let window =
            |s: &str| MaintenanceWindow { schedule: s.into(), zone: "UTC".into(), duration: "1h".into() };
        let wave = |name: &str| UpgradeWave {
            name: name.into(),
            namespaces: [("wave".to_string(), name.to_string())].into(),
            soak: "1h".into(),
            ..UpgradeWave::default()
        };
        let freeze = |r: &str| UpgradeFreeze {
            from: "2026-01-01T00:00:00Z".into(),
            until: "2026-02-01T00:00:00Z".into(),
            reason: r.into(),
        };
        let jukebox = UpgradePolicy {
            windows: vec![window("0 2 * * 6")],
            freezes: vec![freeze("operator")],
            approval: Some(ApprovalMode::Manual),
            minimum_age: None,
            waves: vec![wave("canary")],
        };
        let own = UpgradePolicy {
            windows: vec![window("0 3 * * *")],
            freezes: vec![freeze("tenant")],
            approval: Some(ApprovalMode::Automatic),
            minimum_age: None,
            waves: vec![wave("mine first")],
        };
        let EffectivePolicy { policy: merged, narrowing, of } =
            UpgradePolicy::effective(Some(("box", &jukebox)), Some(&own)).unwrap();
        assert_eq!(merged.waves, jukebox.waves, "waves are the JukeBox's alone");
        let alone = UpgradePolicy::effective(None, Some(&own)).unwrap().policy;
        assert!(alone.waves.is_empty(), "an instance's waves are ignored");
        assert_eq!(alone.windows, own.windows, "without a JukeBox policy, the instance's windows");
        assert_eq!(merged.windows, jukebox.windows, "the JukeBox's windows hold");
        assert_eq!(narrowing, own.windows, "the instance's narrow them");
        let reasons: Vec<&str> = merged.freezes.iter().map(|f| f.reason.as_str()).collect();
        assert_eq!(reasons, ["operator", "tenant"]);
        assert!(of.contains("JukeBox box"), "{of}");
        assert!(merged.manual(), "the JukeBox's manual approval holds whatever the instance says");
        let empty = UpgradePolicy::default();
        let lifted = UpgradePolicy::effective(Some(("box", &jukebox)), Some(&empty)).unwrap().policy;
        assert_eq!(lifted.freezes.len(), 1, "an empty policy of the instance lifts no freeze");
        assert_eq!(UpgradePolicy::effective(None, None), None);
    }

    #[test]
    fn item_4_a_wave_of_the_instances_own_labels_is_refused_and_one_of_namespaces_read() {
        // The attack: membership by the instance's own labels let a tenant
        // join the canary wave (and hold every other tenant's rollout).
        let mut policy = UpgradePolicy {
            waves: vec![UpgradeWave {
                name: "canary".into(),
                selector: [("wave".to_string(), "canary".to_string())].into(),
                soak: "1h".into(),
                ..UpgradeWave::default()
            }],
            ..UpgradePolicy::default()
        };
        let refused = policy.waves().unwrap_err().to_string();
        assert!(refused.contains("canary") && refused.contains("namespaces"), "{refused}");
        policy.waves[0].namespaces = std::mem::take(&mut policy.waves[0].selector);
        policy.waves[0].patience = Some("2h".into());
        let waves = policy.waves().unwrap();
        assert_eq!(waves[0].selector, policy.waves[0].namespaces);
        assert_eq!(waves[0].patience, jiff::SignedDuration::from_hours(2));
        let read: UpgradeWave = serde_json::from_value(serde_json::json!({"name": "w"})).unwrap();
        assert_eq!(read.rules().unwrap().patience, vynil_rules::upgrade::waves::DEFAULT_PATIENCE);
    }
}
