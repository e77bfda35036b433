//! When an upgrade may start: maintenance windows and freezes.
//!
//! A **window** opens at each local time its cron `schedule` (five fields,
//! or six with seconds) matches in an IANA time zone, and stays open for
//! its duration (at most [`super::LONGEST_DURATION`]). Upgrades wait outside
//! every window; installs, uninstalls and rollbacks never wait (lifecycle
//! asks this only for an upgrade). No window at all: always open. Windows
//! come in sets, each of which must have one open (an instance's own
//! windows narrow its JukeBox's, never widen them). A **freeze** is an absolute interval during
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
        let refused = |problem: String| RulesError::UpgradePolicy {
            field: "window duration",
            value: duration.to_string(),
            problem,
            hint: "give it as 4h, 90m or 1h 30m",
        };
        let length = duration.parse::<SignedDuration>().ok().filter(|d| d.is_positive());
        let length = length.ok_or_else(|| refused("not a positive duration".into()))?;
        let length = super::within_bound(length).map_err(refused)?;
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
    /// Not before `until` (`None`: no opening was found), and why.
    Wait {
        until: Option<Timestamp>,
        why: String,
    },
}

/// How far ahead a next opening is looked for (windows that open less
/// often than yearly, or freezes longer than that, read as "no opening").
const HORIZON: SignedDuration = SignedDuration::from_hours(24 * 366 * 2);

/// How many candidate times the search for the next opening looks at before
/// it gives up (and the upgrade holds). One set of windows needs at most two
/// per freeze and two more, whatever its schedule's frequency; only sets
/// that keep missing each other (a JukeBox's and an instance's windows that
/// rarely overlap) can need more.
pub const MOST_STEPS: usize = 1_000;

/// The gate of an upgrade at `now` under the window `sets` (open when one
/// window of every set is: a JukeBox's, and the instance's that narrow it;
/// an empty set constrains nothing) and the `freezes`.
pub fn upgrade_gate(sets: &[Vec<Window>], freezes: &[Freeze], now: Timestamp) -> UpgradeGate {
    match search(sets, freezes, now) {
        Search::Opens { at, .. } if at == now => UpgradeGate::Open,
        found => UpgradeGate::Wait { until: found.opens(), why: why_closed(sets, freezes, now, &found) },
    }
}

/// Whether `at` is in one window of every set and in no freeze.
fn open_at(sets: &[Vec<Window>], freezes: &[Freeze], at: Timestamp) -> bool {
    !freezes.iter().any(|f| f.holds(at)) && sets.iter().all(|set| set_open_at(set, at))
}

/// Whether `at` is in one of `set`'s windows (an empty set: always).
fn set_open_at(set: &[Window], at: Timestamp) -> bool {
    set.is_empty() || set.iter().any(|w| w.closes_after(at).is_some())
}

/// What the search for the next opening found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Search {
    /// Open at `at`, found after looking at `steps` candidate times.
    Opens { at: Timestamp, steps: usize },
    /// Nothing opens within [`HORIZON`] (or a date cannot be computed).
    Never,
    /// [`MOST_STEPS`] candidate times were not enough.
    GaveUp,
}

impl Search {
    pub fn opens(self) -> Option<Timestamp> {
        match self {
            Search::Opens { at, .. } => Some(at),
            Search::Never | Search::GaveUp => None,
        }
    }
}

/// The earliest time at or after `now` when the gate is open.
pub fn next_open(sets: &[Vec<Window>], freezes: &[Freeze], now: Timestamp) -> Option<Timestamp> {
    search(sets, freezes, now).opens()
}

/// [`next_open`], saying how it ended. Each step jumps to the first moment
/// the gate may open — past every freeze holding it, at the next opening
/// of every set closed then — so no opening is ever skipped, and a date
/// that cannot be computed ends the search closed.
pub fn search(sets: &[Vec<Window>], freezes: &[Freeze], now: Timestamp) -> Search {
    let Ok(horizon) = now.checked_add(HORIZON) else { return Search::Never };
    let mut at = now;
    for steps in 1..=MOST_STEPS {
        if at > horizon {
            return Search::Never;
        }
        if open_at(sets, freezes, at) {
            return Search::Opens { at, steps };
        }
        let mut next = freezes.iter().filter(|f| f.holds(at)).map(|f| f.until).max().unwrap_or(at);
        for set in sets {
            if !set_open_at(set, next) {
                let Some(opening) = earliest_opening(set, next) else { return Search::Never };
                next = opening;
            }
        }
        if next <= at {
            return Search::Never;
        }
        at = next;
    }
    Search::GaveUp
}

/// The earliest window opening strictly after `after`.
fn earliest_opening(windows: &[Window], after: Timestamp) -> Option<Timestamp> {
    windows.iter().filter_map(|w| w.next_opening(after)).min()
}

fn why_closed(sets: &[Vec<Window>], freezes: &[Freeze], now: Timestamp, found: &Search) -> String {
    let next = match found {
        Search::Opens { at, .. } => format!("the next window opens at {at}"),
        Search::Never => "no window opens again within two years".to_string(),
        Search::GaveUp => {
            format!("no opening was found within {MOST_STEPS} candidate times: the windows rarely overlap")
        }
    };
    if let Some(freeze) = freezes.iter().find(|f| f.holds(now)) {
        let reason = if freeze.reason.is_empty() { String::new() } else { format!(" ({})", freeze.reason) };
        return format!("upgrades are frozen until {}{reason}; {next}", freeze.until);
    }
    let listed: Vec<String> = sets
        .iter()
        .filter(|set| !set.is_empty())
        .map(|set| set.iter().map(Window::to_string).collect::<Vec<_>>().join(", "))
        .collect();
    format!("outside the maintenance windows ({}); {next}", listed.join("; and "))
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
        match upgrade_gate(&[vec![window.clone()]], &[], at("2026-12-04T12:00:00Z")) {
            UpgradeGate::Wait { until, why } => {
                assert_eq!(until, Some(at("2026-12-05T01:00:00Z")));
                assert!(why.contains("next window opens at 2026-12-05T01:00:00Z"), "{why}");
            }
            UpgradeGate::Open => panic!("Friday noon is outside"),
        }
        assert_eq!(upgrade_gate(&[vec![window.clone()]], &[], at("2026-12-05T04:59:59Z")), UpgradeGate::Open);
        assert!(matches!(
            upgrade_gate(&[vec![window.clone()]], &[], at("2026-12-05T05:00:00Z")),
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
        match upgrade_gate(&[vec![window.clone()]], std::slice::from_ref(&freeze), at("2026-12-24T02:30:00Z"))
        {
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

    #[test]
    fn a_window_too_long_is_refused_with_its_bound_and_never_reads_as_open() {
        // The attacks: 18000000h read as always open, 100000000h as never,
        // after walking every minute of two years.
        for duration in ["18000000h", "100000000h", "8785h"] {
            let error = Window::parse("* * * * *", "UTC", duration).unwrap_err().to_string();
            assert!(error.contains("8784h"), "{duration}: {error}");
        }
        assert!(Window::parse("* * * * *", "UTC", "8784h").is_ok());
    }

    #[test]
    fn an_instances_windows_narrow_its_jukeboxs_and_never_widen_them() {
        let saturday = Window::parse("0 2 * * 6", "Europe/Paris", "4h").unwrap();
        let every_minute = Window::parse("* * * * *", "UTC", "1m").unwrap();
        let friday_noon = at("2026-12-04T12:00:00Z");
        let sets = [vec![saturday.clone()], vec![every_minute]];
        match upgrade_gate(&sets, &[], friday_noon) {
            UpgradeGate::Wait { until, .. } => assert_eq!(until, Some(at("2026-12-05T01:00:00Z"))),
            UpgradeGate::Open => panic!("the JukeBox's window is closed on Friday noon"),
        }
        let sunday = Window::parse("0 3 * * 0", "UTC", "1h").unwrap();
        let disjoint = [vec![saturday], vec![sunday]];
        assert!(matches!(upgrade_gate(&disjoint, &[], friday_noon), UpgradeGate::Wait { until: None, .. }));
    }
}
