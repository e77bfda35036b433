//! When an upgrade may start: maintenance windows and freezes.
//!
//! A **window** opens at each local time its cron `schedule` (five fields,
//! or six with seconds) matches in an IANA time zone, and stays open for
//! its duration. Upgrades wait outside every window; installs, uninstalls
//! and rollbacks never wait (lifecycle asks this only for an upgrade). No
//! window at all: always open. A **freeze** is an absolute interval during
//! which no upgrade starts, whatever the windows say.
//!
//! Daylight saving time is the cron library's (croner, the Open Cron
//! Pattern Specification's rules, on jiff's zoned times): a window whose
//! opening falls in the spring-forward gap opens at the first valid time
//! after it, the same day; one in the fall-back overlap opens once, at the
//! first pass. So each window opens exactly once a scheduled day, neither
//! skipped nor doubled (Argo CD's sync windows are known for both,
//! argoproj/argo-cd#3204). Zones come from the tz database bundled in the
//! binary, the same everywhere and read from no file.

use jiff::{
    SignedDuration, Timestamp, Zoned,
    tz::{TimeZone, TimeZoneDatabase},
};

use crate::RulesError;

/// One recurring maintenance window.
#[derive(Debug, Clone)]
pub struct Window {
    cron: croner::Cron,
    zone: TimeZone,
    duration: SignedDuration,
    text: String,
}

/// One freeze: no upgrade starts in `[from, until)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Freeze {
    pub from: Timestamp,
    pub until: Timestamp,
    pub reason: String,
}

impl Freeze {
    pub fn parse(from: &str, until: &str, reason: &str) -> Result<Self, RulesError> {
        let instant = |field: &'static str, value: &str| {
            value.parse::<Timestamp>().map_err(|e| RulesError::UpgradePolicy {
                field,
                value: value.to_string(),
                problem: e.to_string(),
                hint: "give an RFC 3339 time with its offset, e.g. 2026-12-24T00:00:00+01:00",
            })
        };
        let (from, until) = (instant("freeze start", from)?, instant("freeze end", until)?);
        if until <= from {
            return Err(RulesError::UpgradePolicy {
                field: "freeze",
                value: format!("{from} – {until}"),
                problem: "it ends before it starts".into(),
                hint: "give the start first",
            });
        }
        Ok(Freeze { from, until, reason: reason.to_string() })
    }

    fn holds(&self, at: Timestamp) -> bool {
        self.from <= at && at < self.until
    }
}

impl Window {
    /// `schedule` a cron expression, `zone` an IANA name (`Europe/Paris`),
    /// `duration` as `4h`, `90m` or `1h 30m`.
    pub fn parse(schedule: &str, zone: &str, duration: &str) -> Result<Self, RulesError> {
        let parser = croner::parser::CronParser::builder().seconds(croner::parser::Seconds::Optional).build();
        let cron = parser.parse(schedule).map_err(|e| RulesError::UpgradePolicy {
            field: "window schedule",
            value: schedule.to_string(),
            problem: e.to_string(),
            hint: "give five cron fields (minute hour day month weekday), e.g. \"0 2 * * 6\"",
        })?;
        let zone = TimeZoneDatabase::bundled().get(zone).map_err(|e| RulesError::UpgradePolicy {
            field: "window time zone",
            value: zone.to_string(),
            problem: e.to_string(),
            hint: "give an IANA zone name, e.g. Europe/Paris or UTC",
        })?;
        let length = duration.parse::<SignedDuration>().ok().filter(|d| d.is_positive());
        let Some(length) = length else {
            return Err(RulesError::UpgradePolicy {
                field: "window duration",
                value: duration.to_string(),
                problem: "not a positive duration".into(),
                hint: "give it as 4h, 90m or 1h 30m",
            });
        };
        let text = format!("{schedule} ({}) for {duration}", zone.iana_name().unwrap_or("UTC"));
        Ok(Window { cron, zone, duration: length, text })
    }

    fn zoned(&self, at: Timestamp) -> Zoned {
        at.to_zoned(self.zone.clone())
    }

    /// The first opening strictly after `after`.
    pub fn next_opening(&self, after: Timestamp) -> Option<Timestamp> {
        self.cron.find_next_occurrence(&self.zoned(after), false).ok().map(|z| z.timestamp())
    }

    /// When the opening that contains `at` closes, if `at` is in one.
    fn closes_after(&self, at: Timestamp) -> Option<Timestamp> {
        let earliest = at.checked_sub(self.duration).ok()?;
        let opening = self.next_opening(earliest)?;
        let closes = opening.checked_add(self.duration).ok()?;
        (opening <= at && at < closes).then_some(closes)
    }
}

impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// Whether an upgrade may start now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpgradeGate {
    Open,
    /// Not before `until` (`None`: no window ever opens again), and why.
    Wait {
        until: Option<Timestamp>,
        why: String,
    },
}

/// How far ahead a next opening is looked for (windows that open less
/// often than yearly, or freezes longer than that, read as "no opening").
const HORIZON: SignedDuration = SignedDuration::from_hours(24 * 366 * 2);

/// The gate of an upgrade at `now` under `windows` and `freezes`.
pub fn upgrade_gate(windows: &[Window], freezes: &[Freeze], now: Timestamp) -> UpgradeGate {
    match next_open(windows, freezes, now) {
        Some(at) if at == now => UpgradeGate::Open,
        until => UpgradeGate::Wait { until, why: why_closed(windows, freezes, now, until) },
    }
}

/// Whether `at` is in some window (or there are none) and in no freeze.
fn open_at(windows: &[Window], freezes: &[Freeze], at: Timestamp) -> bool {
    !freezes.iter().any(|f| f.holds(at))
        && (windows.is_empty() || windows.iter().any(|w| w.closes_after(at).is_some()))
}

/// The earliest time at or after `now` when the gate is open.
pub fn next_open(windows: &[Window], freezes: &[Freeze], now: Timestamp) -> Option<Timestamp> {
    let horizon = now.checked_add(HORIZON).ok()?;
    let mut at = now;
    while at <= horizon {
        if open_at(windows, freezes, at) {
            return Some(at);
        }
        // The next moment something may change: a freeze ends, a window opens.
        let freeze_end = freezes.iter().filter(|f| f.holds(at)).map(|f| f.until).max();
        let next = match freeze_end {
            Some(end) if windows.is_empty() || windows.iter().any(|w| w.closes_after(end).is_some()) => end,
            Some(end) => earliest_opening(windows, end)?,
            None => earliest_opening(windows, at)?,
        };
        if next <= at {
            return None;
        }
        at = next;
    }
    None
}

/// The earliest window opening strictly after `after`.
fn earliest_opening(windows: &[Window], after: Timestamp) -> Option<Timestamp> {
    windows.iter().filter_map(|w| w.next_opening(after)).min()
}

fn why_closed(windows: &[Window], freezes: &[Freeze], now: Timestamp, until: Option<Timestamp>) -> String {
    let next = match until {
        Some(at) => format!("the next window opens at {at}"),
        None => "no window opens again within two years".to_string(),
    };
    if let Some(freeze) = freezes.iter().find(|f| f.holds(now)) {
        let reason = if freeze.reason.is_empty() { String::new() } else { format!(" ({})", freeze.reason) };
        return format!("upgrades are frozen until {}{reason}; {next}", freeze.until);
    }
    let listed: Vec<String> = windows.iter().map(Window::to_string).collect();
    format!("outside the maintenance windows ({}); {next}", listed.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    /// Every opening of `window` in `[from, to)`.
    fn openings(window: &Window, from: Timestamp, to: Timestamp) -> Vec<Timestamp> {
        let mut found = Vec::new();
        let mut after = from.checked_sub(SignedDuration::from_secs(1)).unwrap();
        while let Some(next) = window.next_opening(after).filter(|n| *n < to) {
            found.push(next);
            after = next;
        }
        found
    }

    #[test]
    fn a_daily_window_in_paris_opens_exactly_once_on_both_dst_days() {
        // 02:30 local: in the spring-forward gap (02:00 → 03:00 on 2026-03-29)
        // and in the fall-back overlap (03:00 → 02:00 on 2026-10-25).
        let window = Window::parse("30 2 * * *", "Europe/Paris", "1h").unwrap();
        let spring = openings(&window, at("2026-03-28T23:00:00Z"), at("2026-03-29T22:00:00Z"));
        assert_eq!(spring, [at("2026-03-29T01:00:00Z")], "03:00 CEST, the first valid time after the gap");
        let autumn = openings(&window, at("2026-10-24T22:00:00Z"), at("2026-10-25T23:00:00Z"));
        assert_eq!(autumn, [at("2026-10-25T00:30:00Z")], "02:30 CEST, the first pass only");
        let ordinary = openings(&window, at("2026-06-01T22:00:00Z"), at("2026-06-02T22:00:00Z"));
        assert_eq!(ordinary, [at("2026-06-02T00:30:00Z")]);
    }

    #[test]
    fn outside_a_window_an_upgrade_waits_for_its_next_opening_and_inside_it_goes() {
        let window = Window::parse("0 2 * * 6", "Europe/Paris", "4h").unwrap();
        // Saturday 2026-12-05 02:00 CET = 01:00Z.
        match upgrade_gate(std::slice::from_ref(&window), &[], at("2026-12-04T12:00:00Z")) {
            UpgradeGate::Wait { until, why } => {
                assert_eq!(until, Some(at("2026-12-05T01:00:00Z")));
                assert!(why.contains("next window opens at 2026-12-05T01:00:00Z"), "{why}");
            }
            UpgradeGate::Open => panic!("Friday noon is outside"),
        }
        assert_eq!(
            upgrade_gate(std::slice::from_ref(&window), &[], at("2026-12-05T04:59:59Z")),
            UpgradeGate::Open
        );
        assert!(matches!(
            upgrade_gate(std::slice::from_ref(&window), &[], at("2026-12-05T05:00:00Z")),
            UpgradeGate::Wait { .. }
        ));
        assert_eq!(
            upgrade_gate(&[], &[], at("2026-12-04T12:00:00Z")),
            UpgradeGate::Open,
            "no window: always open"
        );
    }

    #[test]
    fn a_freeze_holds_whatever_the_windows_and_the_next_open_time_skips_it() {
        let window = Window::parse("0 2 * * *", "UTC", "2h").unwrap();
        let freeze = Freeze::parse("2026-12-20T00:00:00Z", "2027-01-03T00:00:00Z", "year-end").unwrap();
        match upgrade_gate(
            std::slice::from_ref(&window),
            std::slice::from_ref(&freeze),
            at("2026-12-24T02:30:00Z"),
        ) {
            UpgradeGate::Wait { until, why } => {
                assert_eq!(until, Some(at("2027-01-03T02:00:00Z")));
                assert!(why.contains("frozen until 2027-01-03T00:00:00Z (year-end)"), "{why}");
            }
            UpgradeGate::Open => panic!("frozen"),
        }
        // Without windows, the freeze's end opens the gate.
        assert_eq!(
            next_open(&[], std::slice::from_ref(&freeze), at("2026-12-24T00:00:00Z")),
            Some(freeze.until)
        );
    }

    #[test]
    fn bad_settings_say_which_and_how_to_write_them() {
        let errors = [
            Window::parse("every night", "UTC", "1h").unwrap_err(),
            Window::parse("0 2 * * *", "Mars/Olympus", "1h").unwrap_err(),
            Window::parse("0 2 * * *", "UTC", "-1h").unwrap_err(),
            Freeze::parse("2026-12-20", "2027-01-03T00:00:00Z", "").unwrap_err(),
            Freeze::parse("2027-01-03T00:00:00Z", "2026-12-20T00:00:00Z", "").unwrap_err(),
        ];
        let hints = ["five cron fields", "IANA zone name", "4h, 90m", "RFC 3339", "start first"];
        for (error, hint) in errors.iter().zip(hints) {
            assert!(error.to_string().contains(hint), "{error}");
        }
    }
}
