//! Cancelling a job (docs/design.md, "Cancelling"): one transaction that
//! moves an unfinished job to `cancelled` with a guarded, versioned
//! `UPDATE` (so a late answer of an attempt sent before loses the
//! compare-and-swap and goes to the race log), and withdraws its queued,
//! never-sent attempt. A sent attempt cannot be recalled: it stays as it is
//! until its call ends.

use diesel::prelude::*;

use super::connection::write_transaction;
use super::reads::{attempts_of, find_owned_job};
use super::rows::JobKey;
use super::rows::{Attempt, Job};
use super::schema::jobs;
use super::transitions::lock_job;
use super::{DbConnection, StoreError, StoreResult};
use crate::domain::{on_cancel, CancelDecision, JobStatus, Timestamp};

/// The note on an attempt withdrawn by a cancel.
pub const WITHDRAWN_NOTE: &str = "not sent: the job was cancelled";

/// What a cancel did.
#[derive(Debug)]
pub enum Cancelled {
    /// The job is cancelled now; `withdrawn` queued attempts were closed unsent.
    Now {
        job: Job,
        attempts: Vec<Attempt>,
        withdrawn: usize,
    },
    /// It had been cancelled before: nothing changed.
    Already { job: Job, attempts: Vec<Attempt> },
    /// It had succeeded or failed: nothing changed.
    Refused(JobStatus),
}

/// Cancels the job `key` names, if it is unfinished (`domain::on_cancel`).
/// `NotFound` when the owner has no such job.
pub fn cancel_job(conn: &mut DbConnection, key: &JobKey) -> StoreResult<Cancelled> {
    write_transaction(conn, |conn| {
        lock_job(conn, key)?;
        let job = find_owned_job(conn, key)?.ok_or(StoreError::NotFound)?;
        match on_cancel(job.status) {
            CancelDecision::Refused(status) => return Ok(Cancelled::Refused(status)),
            CancelDecision::AlreadyCancelled => {
                let attempts = attempts_of(conn, key)?;
                return Ok(Cancelled::Already { job, attempts });
            }
            CancelDecision::Cancel => {}
        }
        let Some(withdrawn) = mark_cancelled(conn, &job, Timestamp::now())? else {
            // Under the job's lock nothing else moves it; a row that
            // changed anyway is not cancelled, and says why.
            let job = find_owned_job(conn, key)?.ok_or(StoreError::NotFound)?;
            return Ok(Cancelled::Refused(job.status));
        };
        let job = find_owned_job(conn, key)?.ok_or(StoreError::NotFound)?;
        let attempts = attempts_of(conn, key)?;
        Ok(Cancelled::Now {
            job,
            attempts,
            withdrawn,
        })
    })
}

/// The cancel's state change, all of it, inside the caller's transaction:
/// the job to `cancelled` (its version moves on), then its queued attempt
/// withdrawn. `None` when the guarded update changed no row (the job was
/// not in a cancellable status at the version read); else how many
/// attempts were withdrawn.
/// The cancel's `job.cancelled` webhook events are written here, in the
/// same transaction, after the job's update.
pub fn mark_cancelled(
    conn: &mut DbConnection,
    job: &Job,
    now: Timestamp,
) -> StoreResult<Option<usize>> {
    if !cancel_statement(conn, &job.key(), job.version, now)? {
        return Ok(None);
    }
    // Its `job.cancelled` webhook events commit with the cancel.
    super::ended::job_ended(conn, &job.key(), super::ended::JobEnd::Cancelled, now)?;
    let withdrawn =
        super::completion::skip_queued_attempts(conn, &job.id, &job.owner_id, WITHDRAWN_NOTE, now)?;
    if withdrawn > 0 {
        // Requests never sent, counted with the cancel that withdrew them.
        super::ledger::add_tallies(
            conn,
            &[super::ledger::Tally {
                owner_id: job.owner_id.clone(),
                day: crate::domain::ledger::day_start(now),
                task: job.task.clone(),
                provider: job.provider.clone(),
                job_id: job.id.as_str().to_owned(),
                kind: crate::domain::ledger::TallyKind::Withdrawn
                    .as_str()
                    .to_owned(),
                count: withdrawn as i64,
            }],
        )?;
    }
    Ok(Some(withdrawn))
}

/// The guarded, versioned update: the job becomes `cancelled` only from a
/// status [`JobStatus::CANCELLABLE`] names, at the version read, with no
/// winner. Whether it changed the row.
pub fn cancel_statement(
    conn: &mut DbConnection,
    key: &JobKey,
    version: i64,
    now: Timestamp,
) -> QueryResult<bool> {
    let changed = diesel::update(
        jobs::table
            .filter(jobs::id.eq(&key.id))
            .filter(jobs::owner_id.eq(&key.owner_id))
            .filter(jobs::version.eq(version))
            .filter(jobs::completed_by.is_null())
            .filter(jobs::status.eq_any(JobStatus::CANCELLABLE)),
    )
    .set((
        jobs::status.eq(JobStatus::Cancelled),
        jobs::version.eq(jobs::version + 1),
        jobs::updated_at.eq(now),
    ))
    .execute(conn)?;
    Ok(changed == 1)
}
