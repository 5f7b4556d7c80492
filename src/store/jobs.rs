//! Jobs: creation under an idempotency key, and reads.

use diesel::prelude::*;

use super::connection::write_transaction;
use super::models::{convert_all, Attempt, AttemptRow, Job, JobRow};
use super::schema::{attempts, jobs};
use super::{now_ms, DbConnection, StoreError, StoreResult};
use crate::domain::{AttemptId, AttemptState, IdempotencyKey, JobId, JobStatus};

/// What a client asked for, validated and fingerprinted by the caller.
#[derive(Debug, Clone)]
pub struct NewJob {
    pub owner_id: String,
    pub key: IdempotencyKey,
    pub task: String,
    /// The provider of the first attempt.
    pub provider: String,
    /// The provider the client named, if it named one.
    pub requested_provider: Option<String>,
    pub input: serde_json::Value,
    pub params: serde_json::Value,
    pub fingerprint: String,
}

#[derive(Debug)]
pub enum CreateOutcome {
    /// This request created the job (and its first, queued attempt).
    Created(Job),
    /// The key was used before with the same payload: this is that job.
    Replayed(Job),
    /// The key was used before with a different payload.
    KeyReused { existing_job_id: String },
}

/// Creates the job, or finds the one this key already made.
///
/// `INSERT … ON CONFLICT (owner_id, idempotency_key) DO NOTHING`, then read the
/// row: the database decides who was first, never a check-then-insert here.
pub fn create_job(conn: &mut DbConnection, new: &NewJob) -> StoreResult<CreateOutcome> {
    write_transaction(conn, |conn| {
        let now = now_ms();
        let row = JobRow {
            id: JobId::new().to_string(),
            owner_id: new.owner_id.clone(),
            idempotency_key: new.key.as_str().to_owned(),
            task: new.task.clone(),
            provider: new.provider.clone(),
            requested_provider: new.requested_provider.clone(),
            input: new.input.to_string(),
            params: new.params.to_string(),
            fingerprint: new.fingerprint.clone(),
            status: JobStatus::Pending.as_str().to_owned(),
            version: 0,
            result: None,
            completed_by: None,
            failure_reason: None,
            created_at: now,
            updated_at: now,
        };
        let inserted = insert_job_unless_key_exists(conn, &row)?;
        if inserted == 1 {
            insert_queued_attempt(conn, &row.id, 1, &row.provider, now)?;
            return Ok(CreateOutcome::Created(Job::try_from(row)?));
        }
        let existing: Job = jobs::table
            .filter(jobs::owner_id.eq(&new.owner_id))
            .filter(jobs::idempotency_key.eq(new.key.as_str()))
            .select(JobRow::as_select())
            .first(conn)?
            .try_into()?;
        if existing.fingerprint == new.fingerprint {
            Ok(CreateOutcome::Replayed(existing))
        } else {
            Ok(CreateOutcome::KeyReused {
                existing_job_id: existing.id,
            })
        }
    })
}

/// `ON CONFLICT … DO NOTHING` does not compile through the multi-backend
/// connection, so the same statement runs on the concrete one.
fn insert_job_unless_key_exists(conn: &mut DbConnection, row: &JobRow) -> QueryResult<usize> {
    let target = (jobs::owner_id, jobs::idempotency_key);
    match conn {
        DbConnection::Sqlite(c) => diesel::insert_into(jobs::table)
            .values(row)
            .on_conflict(target)
            .do_nothing()
            .execute(c),
        DbConnection::Postgresql(c) => diesel::insert_into(jobs::table)
            .values(row)
            .on_conflict(target)
            .do_nothing()
            .execute(c),
    }
}

/// Inserts a queued attempt. The partial unique index refuses it if the job
/// already has a live attempt.
pub(crate) fn insert_queued_attempt(
    conn: &mut DbConnection,
    job_id: &str,
    number: i32,
    provider: &str,
    now: i64,
) -> QueryResult<AttemptRow> {
    let row = AttemptRow {
        id: AttemptId::new().to_string(),
        job_id: job_id.to_owned(),
        number,
        provider: provider.to_owned(),
        state: AttemptState::Queued.as_str().to_owned(),
        outcome: None,
        version_read: None,
        lease_owner: None,
        lease_expires_at: None,
        created_at: now,
        started_at: None,
        timeout_at: None,
        finished_at: None,
        error: None,
    };
    diesel::insert_into(attempts::table)
        .values(&row)
        .execute(conn)?;
    Ok(row)
}

pub fn find_job(conn: &mut DbConnection, job_id: &str) -> StoreResult<Option<Job>> {
    jobs::table
        .find(job_id)
        .select(JobRow::as_select())
        .first(conn)
        .optional()?
        .map(Job::try_from)
        .transpose()
}

pub fn get_job(conn: &mut DbConnection, job_id: &str) -> StoreResult<Job> {
    find_job(conn, job_id)?.ok_or(StoreError::NotFound)
}

/// The job's attempts in the order they were made.
pub fn attempts_of(conn: &mut DbConnection, job_id: &str) -> StoreResult<Vec<Attempt>> {
    let rows = attempts::table
        .filter(attempts::job_id.eq(job_id))
        .order(attempts::number.asc())
        .select(AttemptRow::as_select())
        .load(conn)?;
    convert_all(rows)
}

/// The owner's jobs, newest first (ids are time-ordered), `limit` at a time,
/// starting after the job id `before` when given.
pub fn list_jobs(
    conn: &mut DbConnection,
    owner_id: &str,
    before: Option<&str>,
    limit: i64,
) -> StoreResult<Vec<Job>> {
    let mut query = jobs::table
        .filter(jobs::owner_id.eq(owner_id))
        .select(JobRow::as_select())
        .order(jobs::id.desc())
        .limit(limit)
        .into_boxed();
    if let Some(before) = before {
        query = query.filter(jobs::id.lt(before.to_owned()));
    }
    convert_all(query.load(conn)?)
}

/// Counts rows holding this owner's key: used by tests and diagnostics.
pub fn count_jobs_with_key(conn: &mut DbConnection, owner_id: &str, key: &str) -> StoreResult<i64> {
    Ok(jobs::table
        .filter(jobs::owner_id.eq(owner_id))
        .filter(jobs::idempotency_key.eq(key))
        .count()
        .get_result(conn)?)
}
