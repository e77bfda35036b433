//! Ours: when upgrades may start — maintenance windows and freezes, on a
//! JukeBox (for its instances) or an instance (for itself, replacing its
//! JukeBox's). The rules are `vynil_rules::upgrade::window`; lifecycle
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
}

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

impl UpgradePolicy {
    /// The windows and freezes, checked; the first bad one says what to fix.
    pub fn rules(&self) -> Result<(Vec<Window>, Vec<Freeze>), RulesError> {
        let windows = self
            .windows
            .iter()
            .map(|w| Window::parse(&w.schedule, &w.zone, &w.duration))
            .collect::<Result<_, _>>()?;
        let freezes = self
            .freezes
            .iter()
            .map(|f| Freeze::parse(&f.from, &f.until, &f.reason))
            .collect::<Result<_, _>>()?;
        Ok((windows, freezes))
    }
}
