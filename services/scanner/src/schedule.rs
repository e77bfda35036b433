//! Cron schedules of JukeBoxes (`spec.schedule`), replacing upstream's scan
//! CronJobs. Expressions are standard five-field cron, or six fields with
//! seconds first: this module reads them (a bad one is a condition message);
//! `triggers` times them.

use vynil_runtime::cron;

/// The schedule, or why it cannot run (a condition message).
pub fn parse(expression: &str) -> Result<croner::Cron, String> {
    cron::parse(expression).map_err(|e| {
        vynil_crds::coded_message(
            "E_INVALID_SCHEDULE",
            &format!(
                "schedule {expression:?} is not a cron expression ({e}); scheduled scans are off until it is fixed"
            ),
        )
    })
}

/// The problem of a schedule, if any.
pub fn problem(expression: &str) -> Option<String> {
    parse(expression).err()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_are_five_or_six_field_cron_and_problems_say_why() {
        assert!(problem("0 * * * *").is_none());
        assert!(problem("*/2 * * * * *").is_none());
        let why = problem("every hour").unwrap_or_default();
        assert!(why.starts_with("[E_INVALID_SCHEDULE] schedule \"every hour\""), "{why}");
        assert!(why.contains("scheduled scans are off"), "{why}");
    }
}
