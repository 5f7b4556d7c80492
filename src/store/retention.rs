//! Retention's storage: deleting finished jobs with their attempts (which
//! frees their idempotency keys) and old race- and audit-log entries, at
//! most one batch per statement or transaction, so that no lock is held for
//! long.
//!
//! A job may go when it is finished (succeeded, failed or cancelled: every
//! status of [`JobStatus::TERMINAL`]), finished before
//! the cutoff, has no live attempt (a finished job can still have one whose
//! answer is awaited), and nothing in the race or audit log refers to it or
//! to its attempts: the logs keep their own windows, and their rows keep
//! pointing at something real. Live jobs and their attempts are never
//! touched.
//!
//! Candidates are found through the primary key: ids are UUIDv7, so every
//! job created before the cutoff sorts before [`id_bound`] of the cutoff,
//! and a run reads only the jobs created before it, never the newer bulk.
//! The finish time (`updated_at`) decides; the id only narrows the search.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable, Text};

use super::connection::write_transaction;
use super::schema::{attempts, jobs};
use super::{DbConnection, StoreResult};
use crate::domain::{JobId, JobStatus, Timestamp};

/// The most jobs (or log entries) one statement or transaction removes.
pub const BATCH_ROWS: i64 = 500;

/// What one batch of finished jobs removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobsBatch {
    pub jobs: u64,
    pub attempts: u64,
    /// The greatest id removed: the next batch looks after it.
    pub last_id: Option<JobId>,
}

/// The smallest text an id made at `at` can have: the 48-bit timestamp
/// that starts a UUIDv7, as its first twelve hex digits are written. Every
/// id made earlier sorts before it, every id made at `at` or later after it
/// (in byte order and in PostgreSQL's collations, which compare the digits
/// in the same places alike).
pub fn id_bound(at: Timestamp) -> String {
    let ms = at.millis().clamp(0, (1 << 48) - 1) as u64;
    format!("{:08x}-{:04x}", ms >> 16, ms & 0xffff)
}

/// Finished jobs that may go, oldest id first: `$1` the id to look after,
/// `$2` the id bound, `$3` the cutoff, `$4` the batch size. Every link is
/// matched on the owner too, as the keys are (docs/scaling.md).
fn prunable_jobs() -> String {
    format!(
        "SELECT j.id, j.owner_id FROM jobs j
          WHERE j.id > $1 AND j.id < $2
            AND j.status IN ({TERMINAL})
            AND j.updated_at < $3
            AND {STILL_PRUNABLE}
          ORDER BY j.id
          LIMIT $4",
        TERMINAL = terminal_statuses(),
        STILL_PRUNABLE = still_prunable("j.owner_id"),
    )
}

/// The statuses a job ends in, as a SQL list: `'succeeded', 'failed', …`.
fn terminal_statuses() -> String {
    JobStatus::TERMINAL
        .iter()
        .map(|status| format!("'{}'", status.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What keeps a finished job `j`: a live attempt (a late answer awaited), or
/// a race- or audit-log entry about it or its attempts. `owner` is how the
/// subqueries name `j`'s owner: `j.owner_id` in the read across owners, the
/// bound owner (`$1`) in one owner's statement, so that Citus routes every
/// subquery by value.
fn still_prunable(owner: &str) -> String {
    format!(
        "
        NOT EXISTS (SELECT 1 FROM attempts a
                     WHERE a.job_id = j.id AND a.owner_id = {owner}
                       AND a.state IN ('queued', 'running', 'unknown'))
    AND NOT EXISTS (SELECT 1 FROM race_log r
                     WHERE r.job_id = j.id AND r.owner_id = {owner})
    AND NOT EXISTS (SELECT 1 FROM audit_log l
                     WHERE l.job_id = j.id AND l.owner_id = {owner})
    AND NOT EXISTS (SELECT 1 FROM attempts a
                     JOIN audit_log l ON l.attempt_id = a.id AND l.owner_id = a.owner_id
                     WHERE a.job_id = j.id AND a.owner_id = {owner})"
    )
}

/// One owner's part of a batch: the jobs found for it are locked (`SKIP
/// LOCKED`: a job another process is pruning, or a late answer is writing
/// about, is left for the next run), checked again, and deleted with their
/// attempts in one statement; every part names the owner.
fn prune_owners_jobs(
    pg: &mut diesel::PgConnection,
    owner_id: &str,
    ids: &[String],
    cutoff: Timestamp,
) -> QueryResult<Removed> {
    let statement = format!(
        "WITH doomed AS (
             SELECT j.id, j.owner_id FROM jobs j
              WHERE j.owner_id = $1 AND j.id = ANY($2)
                AND j.status IN ({TERMINAL}) AND j.updated_at < $3
                AND {STILL_PRUNABLE}
              FOR UPDATE OF j SKIP LOCKED),
         gone_attempts AS (
             DELETE FROM attempts WHERE owner_id = $1
                AND job_id IN (SELECT id FROM doomed)
             RETURNING id),
         gone_jobs AS (
             DELETE FROM jobs WHERE owner_id = $1 AND id IN (SELECT id FROM doomed)
             RETURNING id)
         SELECT (SELECT count(*) FROM gone_jobs) AS jobs,
                (SELECT count(*) FROM gone_attempts) AS attempts,
                (SELECT max(id) FROM gone_jobs) AS last_id",
        TERMINAL = terminal_statuses(),
        STILL_PRUNABLE = still_prunable("$1"),
    );
    diesel::sql_query(statement)
        .bind::<Text, _>(owner_id)
        .bind::<diesel::sql_types::Array<Text>, _>(ids)
        .bind::<BigInt, _>(cutoff)
        .get_result(pg)
}

/// Candidates grouped by owner, ids in order.
fn by_owner(candidates: Vec<OwnedId>) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut owners: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for row in candidates {
        owners.entry(row.owner_id).or_default().push(row.id);
    }
    owners
}

#[derive(QueryableByName)]
struct OwnedId {
    #[diesel(sql_type = Text)]
    id: String,
    #[diesel(sql_type = Text)]
    owner_id: String,
}

#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = Text)]
    id: String,
}

#[derive(QueryableByName)]
struct Removed {
    #[diesel(sql_type = BigInt)]
    jobs: i64,
    #[diesel(sql_type = BigInt)]
    attempts: i64,
    #[diesel(sql_type = Nullable<Text>)]
    last_id: Option<String>,
}

/// Removes up to `limit` finished jobs that finished before `cutoff`, with
/// their attempts, looking only at ids after `after`. A batch smaller than
/// `limit` means none is left.
///
/// A job and its attempts refer to each other (`completed_by`, `job_id`),
/// and neither foreign key may be checked between the two deletions:
/// PostgreSQL deletes both in one statement (checked at its end), SQLite in
/// one transaction with the checks deferred to the commit.
pub fn prune_finished_jobs(
    conn: &mut DbConnection,
    cutoff: Timestamp,
    after: Option<&JobId>,
    limit: i64,
) -> StoreResult<JobsBatch> {
    let after = after.map_or("", JobId::as_str).to_owned();
    let bound = id_bound(cutoff);
    match conn {
        DbConnection::Postgresql(pg) => {
            // Candidates are read without locks (on a database distributed
            // by owner the read asks every shard, which takes no lock),
            // then each owner's are locked and deleted in a statement that
            // names the owner (one shard).
            let candidates: Vec<OwnedId> = diesel::sql_query(prunable_jobs())
                .bind::<Text, _>(&after)
                .bind::<Text, _>(&bound)
                .bind::<BigInt, _>(cutoff)
                .bind::<BigInt, _>(limit)
                .load(pg)?;
            let mut batch = JobsBatch::default();
            for (owner_id, ids) in by_owner(candidates) {
                let removed = prune_owners_jobs(pg, &owner_id, &ids, cutoff)?;
                batch.jobs += removed.jobs as u64;
                batch.attempts += removed.attempts as u64;
                batch.last_id = batch
                    .last_id
                    .into_iter()
                    .chain(removed.last_id.map(JobId::from_stored))
                    .max();
            }
            Ok(batch)
        }
        DbConnection::Sqlite(_) => write_transaction(conn, |conn| {
            // Switched off again by the commit or rollback. Ids are unique
            // by construction, so here they alone name the rows.
            conn.batch_execute("PRAGMA defer_foreign_keys = ON")?;
            let ids: Vec<String> = diesel::sql_query(prunable_jobs().replace('$', "?"))
                .bind::<Text, _>(&after)
                .bind::<Text, _>(&bound)
                .bind::<BigInt, _>(cutoff)
                .bind::<BigInt, _>(limit)
                .load::<Id>(conn)?
                .into_iter()
                .map(|row| row.id)
                .collect();
            if ids.is_empty() {
                return Ok(JobsBatch::default());
            }
            let attempts = diesel::delete(attempts::table.filter(attempts::job_id.eq_any(&ids)))
                .execute(conn)?;
            let jobs = diesel::delete(jobs::table.filter(jobs::id.eq_any(&ids))).execute(conn)?;
            Ok(JobsBatch {
                jobs: jobs as u64,
                attempts: attempts as u64,
                last_id: ids.into_iter().max().map(JobId::from_stored),
            })
        }),
    }
}

/// The append-only logs retention trims by age.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Log {
    /// `race_log`, aged by `lost_at`.
    Races,
    /// `audit_log`, aged by `at`.
    Audit,
}

impl Log {
    fn table_and_time(self) -> (&'static str, &'static str) {
        match self {
            Self::Races => ("race_log", "lost_at"),
            Self::Audit => ("audit_log", "at"),
        }
    }
}

/// Removes up to `limit` entries of `log` written before `cutoff`, oldest
/// first, in one statement; returns how many went. Nothing refers to log
/// entries, so they go alone.
pub fn prune_log(
    conn: &mut DbConnection,
    log: Log,
    cutoff: Timestamp,
    limit: i64,
) -> StoreResult<u64> {
    let (table, time) = log.table_and_time();
    let oldest = format!("SELECT id FROM {table} WHERE {time} < $1 ORDER BY {time} LIMIT $2");
    let removed = match conn {
        // Found without locks, deleted per owner (see `prune_finished_jobs`);
        // two processes pruning at once delete each entry once.
        DbConnection::Postgresql(pg) => {
            let candidates: Vec<OwnedId> = diesel::sql_query(format!(
                "SELECT id, owner_id FROM {table} WHERE {time} < $1 ORDER BY {time} LIMIT $2"
            ))
            .bind::<BigInt, _>(cutoff)
            .bind::<BigInt, _>(limit)
            .load(pg)?;
            let mut removed = 0;
            for (owner_id, ids) in by_owner(candidates) {
                removed += diesel::sql_query(format!(
                    "DELETE FROM {table} WHERE owner_id = $1 AND id = ANY($2)"
                ))
                .bind::<Text, _>(&owner_id)
                .bind::<diesel::sql_types::Array<Text>, _>(&ids)
                .execute(pg)?;
            }
            removed
        }
        DbConnection::Sqlite(sqlite) => diesel::sql_query(format!(
            "DELETE FROM {table} WHERE id IN ({})",
            oldest.replace('$', "?")
        ))
        .bind::<BigInt, _>(cutoff)
        .bind::<BigInt, _>(limit)
        .execute(sqlite)?,
    };
    Ok(removed as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_bound_splits_uuid_v7_ids_at_their_millisecond() {
        let at = |ms: u64| {
            uuid::Builder::from_unix_timestamp_millis(ms, &[0xff; 10])
                .into_uuid()
                .hyphenated()
                .to_string()
        };
        let cutoff: i64 = 1_764_460_800_123;
        let bound = id_bound(Timestamp::from_millis(cutoff));
        assert_eq!(bound.len(), 13);
        for ms in [0, 1, cutoff as u64 - 1] {
            assert!(at(ms) < bound, "{} made at {ms}", at(ms));
        }
        for ms in [cutoff as u64, cutoff as u64 + 1, 1 << 47] {
            assert!(at(ms) > bound, "{} made at {ms}", at(ms));
        }
        assert_eq!(id_bound(Timestamp::from_millis(-5)), "00000000-0000");
    }
}
