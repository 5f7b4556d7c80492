//! Plain reads of jobs and attempts, by whole key or (where a caller has
//! nothing else) by id alone: what every other statement file builds on.

use diesel::prelude::*;

use super::connection::per_backend;
use super::rows::{Attempt, Job, JobKey};
use super::schema::{attempts, jobs};
use super::{DbConnection, StoreError, StoreResult};
use crate::domain::{AttemptId, JobId, UserId};

/// An attempt found by its id alone: for callers that have nothing else (a
/// callback's URL, a staff action). On a distributed database this read
/// asks every shard; what follows names the owner it found.
pub fn find_attempt(
    conn: &mut DbConnection,
    attempt_id: &AttemptId,
) -> StoreResult<Option<Attempt>> {
    Ok(attempts::table
        .filter(attempts::id.eq(attempt_id))
        .select(Attempt::as_select())
        .first(conn)
        .optional()?)
}

/// An attempt of a known owner, by its whole key.
pub fn find_owned_attempt(
    conn: &mut DbConnection,
    attempt_id: &AttemptId,
    owner_id: &UserId,
) -> StoreResult<Option<Attempt>> {
    Ok(per_backend!(conn, |c| attempts::table
        .filter(attempts::id.eq(attempt_id))
        .filter(attempts::owner_id.eq(owner_id))
        .select(Attempt::as_select())
        .first(c)
        .optional())?)
}

pub fn get_attempt(conn: &mut DbConnection, attempt_id: &AttemptId) -> StoreResult<Attempt> {
    find_attempt(conn, attempt_id)?.ok_or(StoreError::NotFound)
}

/// A job found by its id alone (a staff look-up; a shared link). On a
/// distributed database this read asks every shard.
pub fn find_job(conn: &mut DbConnection, job_id: &JobId) -> StoreResult<Option<Job>> {
    Ok(jobs::table
        .filter(jobs::id.eq(job_id))
        .select(Job::as_select())
        .first(conn)
        .optional()?)
}

/// A job by its whole key.
pub fn find_owned_job(conn: &mut DbConnection, key: &JobKey) -> StoreResult<Option<Job>> {
    Ok(per_backend!(conn, |c| jobs::table
        .filter(jobs::id.eq(&key.id))
        .filter(jobs::owner_id.eq(&key.owner_id))
        .select(Job::as_select())
        .first(c)
        .optional())?)
}

pub fn get_job(conn: &mut DbConnection, key: &JobKey) -> StoreResult<Job> {
    find_owned_job(conn, key)?.ok_or(StoreError::NotFound)
}

/// `job`, read a moment ago, with its attempts, as a pair that never says
/// "not finished, and no live attempt" only because the two statements
/// straddled a commit: an attempt that is seen finished was finished in the
/// transaction that also settled its job or queued its successor, so when
/// the attempts show nothing live the job is read again, after them.
pub fn with_attempts(conn: &mut DbConnection, job: Job) -> StoreResult<(Job, Vec<Attempt>)> {
    let key = job.key();
    let attempts = attempts_of(conn, &key)?;
    if job.status.is_terminal() || attempts.iter().any(|a| a.state.is_live()) {
        return Ok((job, attempts));
    }
    Ok((get_job(conn, &key)?, attempts))
}

/// The job's attempts in the order they were made.
pub fn attempts_of(conn: &mut DbConnection, key: &JobKey) -> StoreResult<Vec<Attempt>> {
    Ok(per_backend!(conn, |c| attempts::table
        .filter(attempts::job_id.eq(&key.id))
        .filter(attempts::owner_id.eq(&key.owner_id))
        .order(attempts::number.asc())
        .select(Attempt::as_select())
        .load(c))?)
}
