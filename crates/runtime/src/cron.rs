//! Cron schedules, one loop for every service that runs some (the scanner's
//! `spec.schedule`, the purger's scheduled purges): standard five-field
//! expressions, or six with seconds first, and a tick callback at each
//! occurrence until shutdown.

use std::{future::Future, time::Duration};

use croner::{
    Cron,
    parser::{CronParser, Seconds},
};

use crate::Shutdown;

/// Parses `expression`; the error is the parser's explanation.
pub fn parse(expression: &str) -> Result<Cron, String> {
    CronParser::builder().seconds(Seconds::Optional).build().parse(expression).map_err(|e| e.to_string())
}

/// Calls `tick(at)` at each occurrence of `cron` (`at`: its Unix time), a
/// random delay of at most `jitter` after it, until `shutdown` fires or the
/// schedule has no next occurrence.
pub async fn every<F, Fut>(cron: &Cron, jitter: Duration, shutdown: &Shutdown, mut tick: F)
where
    F: FnMut(i64) -> Fut,
    Fut: Future<Output = ()>,
{
    loop {
        let now = chrono::Utc::now();
        let Ok(next) = cron.find_next_occurrence(&now, false) else {
            tracing::warn!(schedule = %cron.pattern, "the schedule has no next occurrence");
            return;
        };
        let wait = (next - now).to_std().unwrap_or_default();
        let spread =
            Duration::from_millis(fastrand::u64(..=u64::try_from(jitter.as_millis()).unwrap_or(u64::MAX)));
        tokio::select! {
            () = tokio::time::sleep(wait + spread) => tick(next.timestamp()).await,
            () = shutdown.signaled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_or_six_fields_parse_and_others_say_why() {
        assert!(parse("0 * * * *").is_ok());
        assert!(parse("*/2 * * * * *").is_ok());
        assert!(!parse("every hour").unwrap_err().is_empty());
    }

    #[tokio::test]
    async fn each_occurrence_ticks_until_shutdown() {
        let cron = parse("* * * * * *").unwrap();
        let shutdown = Shutdown::new();
        let mut ticks = Vec::new();
        let stop = shutdown.clone();
        every(&cron, Duration::ZERO, &shutdown, |at| {
            ticks.push(at);
            if ticks.len() == 2 {
                stop.trigger();
            }
            async {}
        })
        .await;
        assert_eq!(ticks.len(), 2);
        assert_eq!(ticks[1] - ticks[0], 1, "one tick per second");
    }
}
