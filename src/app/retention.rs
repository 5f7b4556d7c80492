//! Retention: finished jobs (with their attempts and idempotency keys),
//! race-log entries and audit-log entries are kept for the windows
//! `[retention]` sets, then removed a small batch at a time. Every process
//! prunes now and then, with its other housekeeping (see `worker`), and
//! `onejob prune` does it on demand. Without a window nothing is removed.

use std::time::{Duration, Instant};

use super::{App, AppResult};
use crate::domain::{JobId, Timestamp};
use crate::store::retention::{self, Log, BATCH_ROWS};

const DAY_MS: i64 = 86_400_000;

/// What a pruning run removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub jobs: u64,
    pub attempts: u64,
    pub race_entries: u64,
    pub audit_entries: u64,
}

impl Pruned {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Where a window of `days` ends as of `now`: what is older goes.
fn cutoff(now: Timestamp, days: Option<u32>) -> Option<Timestamp> {
    days.map(|days| now - i64::from(days) * DAY_MS)
}

/// Rests after a batch as long as the batch took (at most a second), so
/// that pruning a large backlog takes at most about half of one
/// connection's time, and writers waiting for SQLite's lock get their turns.
async fn rest_after(batch_took: Duration) {
    tokio::time::sleep(batch_took.min(Duration::from_secs(1))).await;
}

impl App {
    /// Removes what has outlived its window as of `now`. The logs
    /// go first: a job is kept while a race- or audit-log entry refers to
    /// it, so a job whose last entry expires now goes in the same run.
    pub async fn prune_expired(&self, now: Timestamp) -> AppResult<Pruned> {
        let windows = self.config().retention.clone();
        let mut pruned = Pruned::default();
        if let Some(cutoff) = cutoff(now, windows.races_days) {
            pruned.race_entries = self.prune_log(Log::Races, cutoff).await?;
        }
        if let Some(cutoff) = cutoff(now, windows.audit_days) {
            pruned.audit_entries = self.prune_log(Log::Audit, cutoff).await?;
        }
        if let Some(cutoff) = cutoff(now, windows.jobs_days) {
            let mut after: Option<JobId> = None;
            loop {
                let started = Instant::now();
                let look_after = after.clone();
                let batch = self
                    .store()
                    .run(move |conn| {
                        retention::prune_finished_jobs(
                            conn,
                            cutoff,
                            look_after.as_ref(),
                            BATCH_ROWS,
                        )
                    })
                    .await?;
                self.metrics().count_pruned("jobs", batch.jobs);
                self.metrics().count_pruned("attempts", batch.attempts);
                pruned.jobs += batch.jobs;
                pruned.attempts += batch.attempts;
                // A short batch: nothing is left (or the rest is locked by
                // someone else, and waits for the next run).
                if batch.jobs < BATCH_ROWS as u64 {
                    break;
                }
                after = batch.last_id;
                rest_after(started.elapsed()).await;
            }
        }
        Ok(pruned)
    }

    async fn prune_log(&self, log: Log, cutoff: Timestamp) -> AppResult<u64> {
        let table = match log {
            Log::Races => "race_log",
            Log::Audit => "audit_log",
        };
        let mut total = 0;
        loop {
            let started = Instant::now();
            let removed = self
                .store()
                .run(move |conn| retention::prune_log(conn, log, cutoff, BATCH_ROWS))
                .await?;
            self.metrics().count_pruned(table, removed);
            total += removed;
            if removed < BATCH_ROWS as u64 {
                return Ok(total);
            }
            rest_after(started.elapsed()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_ends_whole_days_before_now_and_none_keeps_everything() {
        let at = Timestamp::from_millis;
        assert_eq!(
            cutoff(at(10 * DAY_MS + 7), Some(3)),
            Some(at(7 * DAY_MS + 7))
        );
        assert_eq!(cutoff(at(DAY_MS), None), None);
    }
}
