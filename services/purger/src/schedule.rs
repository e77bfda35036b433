//! Scheduled purges (retention config `schedules`): at each cron tick, a fresh
//! plan of the JukeBox, executed only if its deletions respect the limits and
//! usage is known; otherwise the plan is kept for a human and the skip logged.
//! Replicas may fire the same tick: the per-repository execution lease lets
//! one execute, and the other's plan is then stale and refused.

use std::sync::Arc;

use croner::parser::{CronParser, Seconds};

use crate::{Purger, PurgerError, StoredPlan, config::Schedule};

/// Why a scheduled plan was not executed, or `None` when it may be.
pub fn over_limits(plan: &StoredPlan, schedule: &Schedule) -> Option<String> {
    if plan.usage_unknown {
        return Some(
            "installed revisions are unknown (lifecycle unreachable): a human must acknowledge".into(),
        );
    }
    let deletions: usize = plan.repositories.iter().map(|r| r.deletions.len()).sum();
    if deletions > schedule.max_deletions {
        return Some(format!("{deletions} deletions exceed max_deletions {}", schedule.max_deletions));
    }
    for repository in &plan.repositories {
        let tags = repository.entries.len().max(1);
        let deleted = repository.entries.iter().filter(|e| !e.keep).count();
        let percent = 100.0 * deleted as f64 / tags as f64;
        if percent > schedule.max_percent {
            return Some(format!(
                "{} would lose {percent:.0}% of its tags, over max_percent {}",
                repository.name(),
                schedule.max_percent
            ));
        }
    }
    None
}

fn parse(cron: &str) -> Result<croner::Cron, PurgerError> {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .build()
        .parse(cron)
        .map_err(|e| PurgerError::Config(format!("schedule cron {cron:?} is invalid: {e}")))
}

/// Runs every schedule until aborted.
pub async fn run_all(purger: Arc<Purger>) {
    let tasks: Vec<_> =
        purger.schedules.clone().into_iter().map(|s| tokio::spawn(run_one(purger.clone(), s))).collect();
    for task in tasks {
        let _ = task.await;
    }
}

async fn run_one(purger: Arc<Purger>, schedule: Schedule) {
    let cron = match parse(&schedule.cron) {
        Ok(cron) => cron,
        Err(error) => {
            tracing::error!(jukebox = %schedule.jukebox, %error, "scheduled purge disabled");
            return;
        }
    };
    loop {
        let now = chrono::Utc::now();
        let Ok(next) = cron.find_next_occurrence(&now, false) else {
            tracing::error!(jukebox = %schedule.jukebox, "the schedule has no next occurrence");
            return;
        };
        let wait = (next - now).to_std().unwrap_or_default();
        tokio::time::sleep(wait).await;
        match purger.plan_jukebox(&schedule.jukebox).await {
            Ok(plan) => match over_limits(&plan, &schedule) {
                Some(why) => {
                    tracing::warn!(target: "audit", plan = %plan.id, jukebox = %schedule.jukebox, %why, "scheduled purge left for a human")
                }
                None => match purger.execute_as(&plan, &format!("scheduler ({})", schedule.cron)).await {
                    Ok(report) => {
                        tracing::info!(plan = %plan.id, outcomes = report.outcomes.len(), "scheduled purge done")
                    }
                    Err(error) => {
                        tracing::warn!(plan = %plan.id, %error, "scheduled purge not executed")
                    }
                },
            },
            Err(error) => {
                tracing::warn!(jukebox = %schedule.jukebox, %error, "scheduled purge could not plan")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{RepositoryPlan, StoredDeletion, StoredEntry};

    fn plan(kept: usize, deleted: usize, usage_unknown: bool) -> StoredPlan {
        let entry = |i: usize, keep| StoredEntry {
            tag: format!("{i}.0.0"),
            digest: format!("d{i}"),
            keep,
            reasons: vec![],
        };
        let entries: Vec<StoredEntry> = (0..kept)
            .map(|i| entry(i, true))
            .chain((kept..kept + deleted).map(|i| entry(i, false)))
            .collect();
        let deletions = entries
            .iter()
            .filter(|e| !e.keep)
            .map(|e| StoredDeletion {
                digest: e.digest.clone(),
                tags: vec![e.tag.clone()],
                artifacts_only: false,
            })
            .collect();
        let repository = RepositoryPlan {
            registry: "r".into(),
            repository: "a".into(),
            fingerprint: String::new(),
            config_fingerprint: String::new(),
            usage_unknown,
            entries,
            deletions,
        };
        crate::planner::assemble(
            "jukebox/box".into(),
            vec![repository],
            jiff::Timestamp::UNIX_EPOCH,
            std::time::Duration::ZERO,
        )
    }

    fn schedule(max_deletions: usize, max_percent: f64) -> Schedule {
        Schedule { jukebox: "box".into(), cron: "* * * * *".into(), max_deletions, max_percent }
    }

    #[test]
    fn a_scheduled_plan_runs_only_within_every_limit_and_with_known_usage() {
        assert_eq!(over_limits(&plan(7, 3, false), &schedule(3, 30.0)), None);
        assert!(
            over_limits(&plan(7, 3, false), &schedule(2, 100.0))
                .unwrap()
                .contains("3 deletions exceed max_deletions 2")
        );
        assert!(over_limits(&plan(7, 3, false), &schedule(10, 25.0)).unwrap().contains("r/a would lose 30%"));
        assert!(over_limits(&plan(7, 3, true), &schedule(10, 100.0)).unwrap().contains("unknown"));
    }

    #[test]
    fn cron_expressions_take_five_or_six_fields_and_bad_ones_are_named() {
        assert!(parse("0 4 * * *").is_ok());
        assert!(parse("*/10 * * * * *").is_ok());
        assert!(parse("every day").unwrap_err().to_string().contains("\"every day\""));
    }
}
