//! What the console's charts show, read in bounded time ranges
//! (`store::reports`): jobs by outcome over the last hour and day, the
//! Unknown backlog, races per hour and spend per day by provider.

use super::{require_admin, require_staff, App, AppResult, User};
use crate::domain::ledger::{day_start, DAY_MS};
use crate::domain::Timestamp;
use crate::store::reports::{self, BacklogSample, BucketCount};

pub const MINUTE_MS: i64 = 60_000;
pub const HOUR_MS: i64 = 3_600_000;

/// A series of counts over consecutive buckets, by name.
#[derive(Debug, Clone, PartialEq)]
pub struct Buckets {
    /// Each bucket's start, oldest first.
    pub starts: Vec<Timestamp>,
    /// Each series: its name and one value per bucket.
    pub series: Vec<(String, Vec<f64>)>,
}

impl Buckets {
    /// `count` buckets of `width` ms ending with the one holding `end`.
    fn new(end: Timestamp, width: i64, count: i64) -> Self {
        let last = end.floor_to(width);
        Self {
            starts: (0..count).map(|i| last - (count - 1 - i) * width).collect(),
            series: Vec::new(),
        }
    }

    fn first(&self) -> Timestamp {
        self.starts.first().copied().unwrap_or_default()
    }

    fn end(&self, width: i64) -> Timestamp {
        self.starts.last().copied().unwrap_or_default() + width
    }

    /// Adds each row's value to its series and bucket, scaled by `scale`;
    /// series appear in `order` first, then as found.
    fn fill(&mut self, rows: &[BucketCount], order: &[&str], scale: f64) {
        for name in order {
            self.series
                .push(((*name).to_owned(), vec![0.0; self.starts.len()]));
        }
        for row in rows {
            let Some(index) = self.starts.iter().position(|s| *s == row.bucket) else {
                continue;
            };
            let series = match self.series.iter().position(|(n, _)| *n == row.series) {
                Some(i) => i,
                None => {
                    self.series
                        .push((row.series.clone(), vec![0.0; self.starts.len()]));
                    self.series.len() - 1
                }
            };
            self.series[series].1[index] += row.value as f64 * scale;
        }
    }
}

/// The console's charts' data.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsoleCharts {
    /// Jobs created per minute over the last hour, by status now.
    pub jobs_last_hour: Buckets,
    /// Jobs created per minute (averaged per hour) over the last day.
    pub jobs_last_day: Buckets,
    /// Unknown attempts and the oldest one's age in minutes, per sample
    /// (a minute) over the last day.
    pub backlog: Buckets,
    /// Admins only: races per hour over the last two days.
    pub races: Option<Buckets>,
    /// Admins only: spend per day by provider over the last 30 days, in
    /// currency units.
    pub spend: Option<Buckets>,
    pub currency: String,
}

/// Job statuses in the order the charts stack them.
const STATUSES: [&str; 6] = [
    "succeeded",
    "failed",
    "cancelled",
    "unknown",
    "running",
    "pending",
];

impl App {
    /// The console's charts (support and admins; races and spend admins).
    pub async fn console_charts(&self, actor: &User) -> AppResult<ConsoleCharts> {
        require_staff(actor)?;
        let admin = require_admin(actor).is_ok();
        let now = Timestamp::now();
        let mut jobs_last_hour = Buckets::new(now, MINUTE_MS, 60);
        let mut jobs_last_day = Buckets::new(now, HOUR_MS, 24);
        let mut races = Buckets::new(now, HOUR_MS, 48);
        let mut spend = Buckets::new(now, DAY_MS, 30);
        let ranges = (
            (jobs_last_day.first(), jobs_last_day.end(HOUR_MS)),
            (races.first(), races.end(HOUR_MS)),
            (day_start(spend.first()), spend.end(DAY_MS)),
        );
        let (minutes, race_rows, spend_rows, samples) = self
            .store()
            .run(move |conn| {
                let (d, r, s) = ranges;
                Ok((
                    // One read of the day, by minute: the hour's chart is
                    // its last 60 minutes, the day's its hours.
                    reports::jobs_by_status(conn, d.0, d.1, MINUTE_MS)?,
                    if admin {
                        reports::races_by_bucket(conn, r.0, r.1, HOUR_MS)?
                    } else {
                        Vec::new()
                    },
                    if admin {
                        reports::spend_by_day(conn, s.0, s.1)?
                    } else {
                        Vec::new()
                    },
                    reports::backlog_samples(conn, now - DAY_MS, now + MINUTE_MS)?,
                ))
            })
            .await?;
        jobs_last_hour.fill(&minutes, &STATUSES, 1.0);
        let hours: Vec<BucketCount> = minutes
            .iter()
            .map(|row| BucketCount {
                bucket: row.bucket.floor_to(HOUR_MS),
                ..row.clone()
            })
            .collect();
        // Per minute, averaged over each hour.
        jobs_last_day.fill(&hours, &STATUSES, 1.0 / 60.0);
        races.fill(&race_rows, &["races"], 1.0);
        spend.fill(&spend_rows, &[], 1e-6);
        Ok(ConsoleCharts {
            jobs_last_hour,
            jobs_last_day,
            backlog: backlog_buckets(&samples, now),
            races: admin.then_some(races),
            spend: admin.then_some(spend),
            currency: self.config().ledger.currency.clone(),
        })
    }
}

/// The backlog samples of the last day, per 10 minutes (the largest
/// sample of each), with the oldest unknown attempt's age in minutes.
fn backlog_buckets(samples: &[BacklogSample], now: Timestamp) -> Buckets {
    let width = 10 * MINUTE_MS;
    let mut buckets = Buckets::new(now, width, 144);
    let mut count = vec![0.0; buckets.starts.len()];
    let mut age = vec![0.0; buckets.starts.len()];
    for sample in samples {
        let start = sample.at.floor_to(width);
        if let Some(i) = buckets.starts.iter().position(|s| *s == start) {
            count[i] = f64::max(count[i], sample.unknown_attempts as f64);
            let minutes = sample
                .oldest_unknown_at
                .map_or(0.0, |t| (sample.at - t).max(0) as f64 / MINUTE_MS as f64);
            age[i] = f64::max(age[i], minutes);
        }
    }
    buckets.series = vec![
        ("unknown attempts".to_owned(), count),
        ("oldest unknown, minutes".to_owned(), age),
    ];
    buckets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_land_in_their_buckets_and_series_keep_their_order() {
        let minute = |n: i64| Timestamp::from_millis(n * MINUTE_MS);
        let mut buckets = Buckets::new(minute(10) + 5, MINUTE_MS, 3);
        assert_eq!(buckets.starts, vec![minute(8), minute(9), minute(10)]);
        let row = |n, series: &str, value| BucketCount {
            bucket: minute(n),
            series: series.into(),
            value,
        };
        buckets.fill(
            &[
                row(9, "failed", 2),
                row(10, "succeeded", 5),
                row(3, "succeeded", 7),
                row(8, "odd", 1),
            ],
            &["succeeded", "failed"],
            1.0,
        );
        assert_eq!(buckets.series[0], ("succeeded".into(), vec![0.0, 0.0, 5.0]));
        assert_eq!(buckets.series[1], ("failed".into(), vec![0.0, 2.0, 0.0]));
        assert_eq!(buckets.series[2], ("odd".into(), vec![1.0, 0.0, 0.0]));
    }
}
