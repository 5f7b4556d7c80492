//! Jobs: creation under an idempotency key, and reads.

use diesel::prelude::*;

use super::connection::write_transaction;
use super::queue::{self, StartNow};
use super::rows::{Attempt, Job};
use super::schema::jobs;
use super::transitions::insert_queued_attempt;
use super::{now_ms, DbConnection, StoreResult};
use crate::domain::{AttemptState, IdempotencyKey, JobId, JobStatus, JsonText, UserId};

pub use super::transitions::{attempts_of, find_job, get_job};

/// What a client asked for, validated and fingerprinted by the caller.
#[derive(Debug, Clone)]
pub struct NewJob {
    pub owner_id: UserId,
    pub key: IdempotencyKey,
    pub task: String,
    /// The provider of the first attempt.
    pub provider: String,
    /// The provider the client named, if it named one.
    pub requested_provider: Option<String>,
    pub input: JsonText,
    pub params: JsonText,
    pub fingerprint: String,
    /// When set, the first attempt starts in the creating transaction:
    /// claimed under this lease and confirmed for sending (see
    /// [`queue::insert_started_attempt`]). Otherwise it is queued.
    pub start: Option<StartNow>,
}

#[derive(Debug)]
pub enum CreateOutcome {
    /// This request created the job (and its first, queued attempt).
    Created(Job),
    /// The key had already made this job (whether with the same payload is
    /// the caller's to decide).
    Existing(Job),
}

/// Creates the job, or finds the one this key already made.
///
/// `INSERT … ON CONFLICT (owner_id, idempotency_key) DO NOTHING`, then read the
/// row: the database decides who was first, never a check-then-insert here.
pub fn create_job(conn: &mut DbConnection, new: &NewJob) -> StoreResult<CreateOutcome> {
    Ok(create_job_with_attempts(conn, new)?.0)
}

/// [`create_job`], with the job's attempts: the new one (queued, or started
/// when `new.start` says so), or the existing job's.
pub fn create_job_with_attempts(
    conn: &mut DbConnection,
    new: &NewJob,
) -> StoreResult<(CreateOutcome, Vec<Attempt>)> {
    write_transaction(conn, |conn| {
        let now = now_ms();
        let row = Job {
            id: JobId::new(),
            owner_id: new.owner_id.clone(),
            idempotency_key: new.key.as_str().to_owned(),
            task: new.task.clone(),
            provider: new.provider.clone(),
            requested_provider: new.requested_provider.clone(),
            input: new.input.clone(),
            params: new.params.clone(),
            fingerprint: new.fingerprint.clone(),
            status: match new.start {
                Some(_) => JobStatus::for_live_attempt(Some(AttemptState::Running)),
                None => JobStatus::Pending,
            },
            version: 0,
            result: None,
            completed_by: None,
            failure_reason: None,
            created_at: now,
            updated_at: now,
        };
        let inserted = insert_job_unless_key_exists(conn, &row)?;
        if inserted == 1 {
            let attempt = match &new.start {
                Some(start) => queue::insert_started_attempt(conn, &row, start, now)?,
                None => insert_queued_attempt(conn, &row.id, &row.owner_id, 1, &row.provider, now)?,
            };
            return Ok((CreateOutcome::Created(row), vec![attempt]));
        }
        let existing = find_by_key(conn, &new.owner_id, new.key.as_str())?
            .ok_or(super::StoreError::NotFound)?;
        let attempts = attempts_of(conn, &existing.id)?;
        Ok((CreateOutcome::Existing(existing), attempts))
    })
}

/// The job an owner's key made, if any.
pub fn find_by_key(
    conn: &mut DbConnection,
    owner_id: &UserId,
    key: &str,
) -> StoreResult<Option<Job>> {
    Ok(jobs::table
        .filter(jobs::owner_id.eq(owner_id))
        .filter(jobs::idempotency_key.eq(key))
        .select(Job::as_select())
        .first(conn)
        .optional()?)
}

/// `ON CONFLICT … DO NOTHING` does not compile through the multi-backend
/// connection, so the same statement runs on the concrete one.
fn insert_job_unless_key_exists(conn: &mut DbConnection, row: &Job) -> QueryResult<usize> {
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

/// The owner's jobs, newest first (ids are time-ordered), `limit` at a time,
/// starting after the job id `before` when given.
pub fn list_jobs(
    conn: &mut DbConnection,
    owner_id: &UserId,
    before: Option<&JobId>,
    limit: i64,
) -> StoreResult<Vec<Job>> {
    let mut query = jobs::table
        .filter(jobs::owner_id.eq(owner_id))
        .select(Job::as_select())
        .order(jobs::id.desc())
        .limit(limit)
        .into_boxed();
    if let Some(before) = before {
        query = query.filter(jobs::id.lt(before.clone()));
    }
    Ok(query.load(conn)?)
}
