//! Cron schedules of JukeBoxes (`spec.schedule`), replacing upstream's scan
//! CronJobs. Expressions are standard five-field cron, or six fields with
//! seconds first. Each replica times every schedule; at a tick, the replica
//! that claims it (see `RequestQueue::claim_tick`) requests a full scan, so a
//! tick scans once however many replicas run. An optional jitter spreads the
//! scans of JukeBoxes sharing a schedule (`0 * * * *`) over a few seconds.

use std::{sync::Arc, time::Duration};

use vynil_runtime::{Shutdown, cron};

use crate::Scanner;

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

/// Requests a full scan of `jukebox` at each tick this replica claims, until `stop`.
pub async fn run(
    scanner: Arc<Scanner>,
    jukebox: String,
    cron: croner::Cron,
    jitter: Duration,
    stop: Shutdown,
) {
    cron::every(&cron, jitter, &stop, |at| {
        let (scanner, jukebox) = (scanner.clone(), jukebox.clone());
        async move {
            // Claims outlive any clock skew between replicas.
            match scanner.queue.claim_tick(&jukebox, at, Duration::from_secs(3600)).await {
                Ok(true) => match scanner.request(&jukebox, vynil_rules::ScanScope::Full).await {
                    Ok((id, joined)) => tracing::info!(%jukebox, %id, joined, "scheduled scan requested"),
                    Err(error) => tracing::warn!(%jukebox, %error, "cannot request the scheduled scan"),
                },
                Ok(false) => tracing::debug!(%jukebox, "tick already claimed by another replica"),
                Err(error) => tracing::warn!(%jukebox, %error, "cannot claim the scheduled tick; skipped"),
            }
        }
    })
    .await;
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
