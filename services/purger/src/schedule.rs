//! Scheduled purges (retention config `schedules`): at each cron tick, a fresh
//! plan of the JukeBox, executed only if its deletions respect the limits and
//! usage is known; otherwise the plan is kept for a human and the skip logged.
//! Replicas may fire the same tick: the per-repository execution lease lets
//! one execute, and the other's plan is then stale and refused.

use std::{sync::Arc, time::Duration};

use vynil_runtime::{Shutdown, cron};

use crate::{Purger, StoredPlan, config::Schedule};

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

/// Runs every schedule until `shutdown`.
pub async fn run_all(purger: Arc<Purger>, shutdown: Shutdown) {
    let runs = purger.schedules.clone().into_iter().map(|s| run_one(purger.clone(), s, shutdown.clone()));
    futures::future::join_all(runs).await;
}

async fn run_one(purger: Arc<Purger>, schedule: Schedule, shutdown: Shutdown) {
    let cron = match cron::parse(&schedule.cron) {
        Ok(cron) => cron,
        Err(error) => {
            let error = format!("schedule cron {:?} is invalid: {error}", schedule.cron);
            tracing::error!(jukebox = %schedule.jukebox, %error, "scheduled purge disabled");
            return;
        }
    };
    cron::every(&cron, Duration::ZERO, &shutdown, |_| scheduled_purge(&purger, &schedule)).await;
}

/// One tick: a fresh plan, executed only within the schedule's limits.
async fn scheduled_purge(purger: &Purger, schedule: &Schedule) {
    match purger.plan_jukebox(&schedule.jukebox).await {
        Ok(plan) => match over_limits(&plan, schedule) {
            Some(why) => {
                tracing::warn!(target: "audit", plan = %plan.id, jukebox = %schedule.jukebox, %why, "scheduled purge left for a human")
            }
            None => match purger.execute_as(&plan, &format!("scheduler ({})", schedule.cron)).await {
                Ok(report) => {
                    tracing::info!(plan = %plan.id, outcomes = report.outcomes.len(), "scheduled purge done")
                }
                Err(error) => tracing::warn!(plan = %plan.id, %error, "scheduled purge not executed"),
            },
        },
        Err(error) => tracing::warn!(jukebox = %schedule.jukebox, %error, "scheduled purge could not plan"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan_store::{RepositoryPlan, StoredDeletion, StoredEntry};

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
            "plan-test".into(),
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
}
