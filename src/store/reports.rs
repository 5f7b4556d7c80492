//! Reads over time for the ledger view and the console's charts. Each is
//! bounded by an indexed time range (the ledger's `recorded_at`, the
//! tallies' `day`, the job id's time prefix, the race log's `lost_at`, the
//! backlog samples' `at`), so its cost follows the rows in the range, not
//! the table's size.

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};

use super::connection::per_backend;
use super::retention::id_bound;
use super::schema::{attempts, backlog_samples};
use super::{DbConnection, StoreResult};
use crate::domain::{AttemptState, Timestamp};

/// Which rows a usage report covers: `[from, to)`, and the
/// optional filters (empty: any).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageFilter {
    pub from: Timestamp,
    pub to: Timestamp,
    pub owner_id: String,
    pub provider: String,
    pub task: String,
}

/// How a usage report groups its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UsageGrouping {
    Day,
    Owner,
    Provider,
    Task,
}

impl UsageGrouping {
    pub const ALL: [UsageGrouping; 4] = [
        UsageGrouping::Day,
        UsageGrouping::Owner,
        UsageGrouping::Provider,
        UsageGrouping::Task,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            UsageGrouping::Day => "day",
            UsageGrouping::Owner => "owner",
            UsageGrouping::Provider => "provider",
            UsageGrouping::Task => "task",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|g| g.as_str() == text)
    }

    /// The grouping expression over a table aliased `t` joined to `users`
    /// as `u`; `day` is the column holding a day or a time.
    fn expression(self, time: &str) -> String {
        match self {
            UsageGrouping::Day => format!("CAST(t.{time} - (t.{time} % 86400000) AS TEXT)"),
            UsageGrouping::Owner => "u.name".into(),
            UsageGrouping::Provider => "t.provider".into(),
            UsageGrouping::Task => "t.task".into(),
        }
    }
}

/// The ledger's sums for one group.
#[derive(Debug, Clone, Default, PartialEq, Eq, QueryableByName)]
pub struct LedgerSums {
    #[diesel(sql_type = Text)]
    pub grp: String,
    #[diesel(sql_type = BigInt)]
    pub calls: i64,
    #[diesel(sql_type = BigInt)]
    pub prompt_tokens: i64,
    #[diesel(sql_type = BigInt)]
    pub completion_tokens: i64,
    #[diesel(sql_type = BigInt)]
    pub cached_tokens: i64,
    #[diesel(sql_type = BigInt)]
    pub cost_micros: i64,
    #[diesel(sql_type = BigInt)]
    pub won_calls: i64,
    #[diesel(sql_type = BigInt)]
    pub lost_calls: i64,
    #[diesel(sql_type = BigInt)]
    pub lost_micros: i64,
    #[diesel(sql_type = BigInt)]
    pub late_calls: i64,
    #[diesel(sql_type = BigInt)]
    pub late_micros: i64,
    #[diesel(sql_type = BigInt)]
    pub failed_calls: i64,
    #[diesel(sql_type = BigInt)]
    pub rate_limited_calls: i64,
    #[diesel(sql_type = BigInt)]
    pub unpriced_calls: i64,
    #[diesel(sql_type = BigInt)]
    pub estimated_calls: i64,
}

/// The tallies' sums for one group and kind, with what the duplicates
/// would have cost at their jobs' own price.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct TallySums {
    #[diesel(sql_type = Text)]
    pub grp: String,
    #[diesel(sql_type = Text)]
    pub kind: String,
    #[diesel(sql_type = BigInt)]
    pub count: i64,
    #[diesel(sql_type = BigInt)]
    pub estimate_micros: i64,
}

/// Runs a report statement written with `$n` parameters on either backend
/// (SQLite reads `?n` as the same numbered parameter).
macro_rules! report_query {
    ($conn:expr, $sql:expr, |$q:ident| $binds:expr) => {{
        let sql: String = $sql;
        match $conn {
            DbConnection::Postgresql(c) => {
                let $q = diesel::sql_query(sql);
                $binds.load(c)
            }
            DbConnection::Sqlite(c) => {
                let $q = diesel::sql_query(sql.replace('$', "?"));
                $binds.load(c)
            }
        }
    }};
}

const FILTERS: &str = "($3 = '' OR t.owner_id = $3) AND ($4 = '' OR t.provider = $4) \
                       AND ($5 = '' OR t.task = $5)";

/// The ledger summed by `grouping` over `filter`.
pub fn ledger_sums(
    conn: &mut DbConnection,
    filter: &UsageFilter,
    grouping: UsageGrouping,
) -> StoreResult<Vec<LedgerSums>> {
    let sum = |expr: &str| format!("CAST(COALESCE(SUM({expr}), 0) AS BIGINT)");
    let count_if = |cond: &str| sum(&format!("CASE WHEN {cond} THEN 1 ELSE 0 END"));
    let sql = format!(
        "SELECT {grp} AS grp, CAST(COUNT(*) AS BIGINT) AS calls,
                {prompt} AS prompt_tokens, {completion} AS completion_tokens,
                {cached} AS cached_tokens, {cost} AS cost_micros,
                {won} AS won_calls, {lost} AS lost_calls, {lost_micros} AS lost_micros,
                {late} AS late_calls, {late_micros} AS late_micros,
                {failed} AS failed_calls, {limited} AS rate_limited_calls,
                {unpriced} AS unpriced_calls, {estimated} AS estimated_calls
         FROM usage_ledger t JOIN users u ON u.id = t.owner_id
         WHERE t.recorded_at >= $1 AND t.recorded_at < $2 AND {FILTERS}
         GROUP BY {grp} ORDER BY {grp}",
        grp = grouping.expression("recorded_at"),
        prompt = sum("t.prompt_tokens"),
        completion = sum("t.completion_tokens"),
        cached = sum("t.cached_tokens"),
        cost = sum("t.cost_micros"),
        won = count_if("t.kind = 'won'"),
        lost = count_if("t.kind = 'lost'"),
        lost_micros = sum("CASE WHEN t.kind = 'lost' THEN t.cost_micros END"),
        late = count_if("t.late"),
        late_micros = sum("CASE WHEN t.late THEN t.cost_micros END"),
        failed = count_if("t.kind = 'failed'"),
        limited = count_if("t.kind = 'rate_limited'"),
        unpriced = count_if("t.cost_micros IS NULL"),
        estimated = count_if("t.usage_source = 'estimated'"),
    );
    Ok(report_query!(conn, sql, |q| q
        .bind::<BigInt, _>(filter.from)
        .bind::<BigInt, _>(filter.to)
        .bind::<Text, _>(&filter.owner_id)
        .bind::<Text, _>(&filter.provider)
        .bind::<Text, _>(&filter.task))?)
}

/// The tallies summed by `grouping` and kind over `filter` (whole days:
/// a tally is kept per day). A duplicate's estimate is its count times the
/// cost of its job's winning call.
pub fn tally_sums(
    conn: &mut DbConnection,
    filter: &UsageFilter,
    grouping: UsageGrouping,
) -> StoreResult<Vec<TallySums>> {
    // The winners' costs are read for the tallies' jobs only (a semi-join
    // on the ledger's job index), joined on the owner too: one shard each.
    let sql = format!(
        "SELECT {grp} AS grp, t.kind AS kind, CAST(SUM(t.count) AS BIGINT) AS count,
                CAST(COALESCE(SUM(t.count * w.cost), 0) AS BIGINT) AS estimate_micros
         FROM usage_tallies t JOIN users u ON u.id = t.owner_id
         LEFT JOIN (
           SELECT l.job_id AS job_id, l.owner_id AS owner_id, SUM(l.cost_micros) AS cost
           FROM usage_ledger l
           WHERE l.kind = 'won' AND (l.job_id, l.owner_id) IN (
             SELECT t2.job_id, t2.owner_id FROM usage_tallies t2
             WHERE t2.day >= $1 AND t2.day < $2)
           GROUP BY l.job_id, l.owner_id
         ) w ON w.job_id = t.job_id AND w.owner_id = t.owner_id
         WHERE t.day >= $1 AND t.day < $2 AND {FILTERS}
         GROUP BY {grp}, t.kind ORDER BY {grp}, t.kind",
        grp = grouping.expression("day"),
    );
    Ok(report_query!(conn, sql, |q| q
        .bind::<BigInt, _>(crate::domain::ledger::day_start(filter.from))
        .bind::<BigInt, _>(filter.to)
        .bind::<Text, _>(&filter.owner_id)
        .bind::<Text, _>(&filter.provider)
        .bind::<Text, _>(&filter.task))?)
}

/// A count in a time bucket, by series.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct BucketCount {
    #[diesel(sql_type = BigInt)]
    pub bucket: Timestamp,
    #[diesel(sql_type = Text)]
    pub series: String,
    #[diesel(sql_type = BigInt)]
    pub value: i64,
}

/// Jobs created in `[from, to)`, counted per `bucket_ms` and status (the
/// range is read through the job id's time prefix, the primary key).
pub fn jobs_by_status(
    conn: &mut DbConnection,
    from: Timestamp,
    to: Timestamp,
    bucket_ms: i64,
) -> StoreResult<Vec<BucketCount>> {
    let sql = "SELECT CAST(t.created_at - (t.created_at % $3) AS BIGINT) AS bucket,
                      t.status AS series, CAST(COUNT(*) AS BIGINT) AS value
               FROM jobs t
               WHERE t.id >= $1 AND t.id < $2
               GROUP BY CAST(t.created_at - (t.created_at % $3) AS BIGINT), t.status"
        .to_owned();
    Ok(report_query!(conn, sql, |q| q
        .bind::<Text, _>(id_bound(from))
        .bind::<Text, _>(id_bound(to))
        .bind::<BigInt, _>(bucket_ms))?)
}

/// Answers that lost the race in `[from, to)`, per `bucket_ms`.
pub fn races_by_bucket(
    conn: &mut DbConnection,
    from: Timestamp,
    to: Timestamp,
    bucket_ms: i64,
) -> StoreResult<Vec<BucketCount>> {
    let sql = "SELECT CAST(t.lost_at - (t.lost_at % $3) AS BIGINT) AS bucket,
                      'races' AS series, CAST(COUNT(*) AS BIGINT) AS value
               FROM race_log t
               WHERE t.lost_at >= $1 AND t.lost_at < $2
               GROUP BY CAST(t.lost_at - (t.lost_at % $3) AS BIGINT)"
        .to_owned();
    Ok(report_query!(conn, sql, |q| q
        .bind::<BigInt, _>(from)
        .bind::<BigInt, _>(to)
        .bind::<BigInt, _>(bucket_ms))?)
}

/// Spend in `[from, to)` per day and provider, in micro-units.
pub fn spend_by_day(
    conn: &mut DbConnection,
    from: Timestamp,
    to: Timestamp,
) -> StoreResult<Vec<BucketCount>> {
    let sql = "SELECT CAST(t.recorded_at - (t.recorded_at % 86400000) AS BIGINT) AS bucket,
                      t.provider AS series, CAST(COALESCE(SUM(t.cost_micros), 0) AS BIGINT) AS value
               FROM usage_ledger t
               WHERE t.recorded_at >= $1 AND t.recorded_at < $2
               GROUP BY CAST(t.recorded_at - (t.recorded_at % 86400000) AS BIGINT), t.provider"
        .to_owned();
    Ok(report_query!(conn, sql, |q| q
        .bind::<BigInt, _>(from)
        .bind::<BigInt, _>(to))?)
}

/// One sample of the Unknown backlog.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable, Insertable)]
#[diesel(table_name = backlog_samples)]
pub struct BacklogSample {
    pub at: Timestamp,
    pub unknown_attempts: i64,
    pub oldest_unknown_at: Option<Timestamp>,
}

/// Samples the Unknown backlog at `at` (a minute's start): one row per
/// minute, whichever process comes first; older than `keep_from` pruned.
pub fn sample_backlog(
    conn: &mut DbConnection,
    at: Timestamp,
    keep_from: Timestamp,
) -> StoreResult<()> {
    let unknown = attempts::table.filter(attempts::state.eq(AttemptState::Unknown));
    let count: i64 = unknown.count().get_result(conn)?;
    let oldest: Option<Timestamp> = unknown
        .select(diesel::dsl::min(attempts::started_at))
        .first::<Option<Timestamp>>(conn)?;
    let sample = BacklogSample {
        at,
        unknown_attempts: count,
        oldest_unknown_at: oldest,
    };
    per_backend!(conn, |c| diesel::insert_into(backlog_samples::table)
        .values(&sample)
        .on_conflict(backlog_samples::at)
        .do_nothing()
        .execute(c))?;
    diesel::delete(backlog_samples::table.filter(backlog_samples::at.lt(keep_from)))
        .execute(conn)?;
    Ok(())
}

/// The backlog samples in `[from, to)`, oldest first.
pub fn backlog_samples(
    conn: &mut DbConnection,
    from: Timestamp,
    to: Timestamp,
) -> StoreResult<Vec<BacklogSample>> {
    Ok(backlog_samples::table
        .filter(backlog_samples::at.ge(from))
        .filter(backlog_samples::at.lt(to))
        .order(backlog_samples::at.asc())
        .select(BacklogSample::as_select())
        .load(conn)?)
}
