//! The attempt queue: claiming a queued attempt with a lease, renewing it,
//! and what a lease or a soft timeout that runs out means (`unknown`, never
//! re-sent).

use diesel::prelude::*;

use super::connection::write_transaction;
use super::rows::{Attempt, Job};
use super::schema::{attempts, jobs};
use super::transitions::{
    get_attempt, get_job, lock_attempt_and_job, lock_job, refresh_job_status, transition,
};
use super::{now_ms, DbConnection, StoreError, StoreResult};
use crate::domain::{Applied, AttemptEvent, AttemptId, AttemptState, JobId, JobStatus};

/// A queued attempt this process now holds, with the job it works for.
#[derive(Debug, Clone)]
pub struct Claim {
    pub attempt: Attempt,
    pub job: Job,
}

/// Claims the oldest queued attempt for `lease_owner` until `now + lease_ms`.
///
/// PostgreSQL: `SELECT … FOR UPDATE SKIP LOCKED`, so processes sharing one
/// database never pick the same row. SQLite: the write transaction holds the
/// database's write lock. Either way the `UPDATE … WHERE state = 'queued'` is the
/// final guard: an attempt is sent at most once.
pub fn claim_next(
    conn: &mut DbConnection,
    lease_owner: &str,
    lease_ms: i64,
    soft_timeout_ms: &(dyn Fn(&str) -> i64 + Sync),
) -> StoreResult<Option<Claim>> {
    write_transaction(conn, |conn| {
        // Only attempts of unfinished jobs; on PostgreSQL the attempt and its job
        // are locked without waiting (a row another process holds is skipped).
        let queued = attempts::table
            .inner_join(jobs::table)
            .filter(attempts::state.eq(AttemptState::Queued))
            .filter(jobs::status.ne_all(JobStatus::TERMINAL))
            .order((attempts::created_at.asc(), attempts::id.asc()))
            .select((attempts::id, attempts::job_id, attempts::provider))
            .limit(1);
        let candidate: Option<(AttemptId, JobId, String)> = match conn {
            DbConnection::Postgresql(pg) => {
                queued.for_update().skip_locked().first(pg).optional()?
            }
            DbConnection::Sqlite(_) => queued.first(conn).optional()?,
        };
        let Some((attempt_id, job_id, provider)) = candidate else {
            return Ok(None);
        };
        let now = now_ms();
        let version: i64 = jobs::table
            .find(&job_id)
            .select(jobs::version)
            .first(conn)?;
        let claimed = diesel::update(
            attempts::table
                .filter(attempts::id.eq(&attempt_id))
                .filter(attempts::state.eq_any(AttemptEvent::Claimed.from_states())),
        )
        .set((
            attempts::state.eq(AttemptEvent::Claimed.target()),
            attempts::version_read.eq(version),
            attempts::lease_owner.eq(lease_owner),
            attempts::lease_expires_at.eq(now + lease_ms),
            attempts::started_at.eq(now),
            attempts::timeout_at.eq(now + soft_timeout_ms(&provider)),
        ))
        .execute(conn)?;
        if claimed != 1 {
            return Ok(None);
        }
        refresh_job_status(conn, &job_id, now)?;
        Ok(Some(Claim {
            attempt: get_attempt(conn, &attempt_id)?,
            job: get_job(conn, &job_id)?,
        }))
    })
}

/// Extends the lease of a running attempt this process holds.
pub fn renew_lease(
    conn: &mut DbConnection,
    attempt_id: &AttemptId,
    lease_owner: &str,
    lease_ms: i64,
) -> StoreResult<bool> {
    let changed = diesel::update(
        attempts::table
            .filter(attempts::id.eq(attempt_id))
            .filter(attempts::state.eq(AttemptState::Running))
            .filter(attempts::lease_owner.eq(lease_owner)),
    )
    .set(attempts::lease_expires_at.eq(now_ms() + lease_ms))
    .execute(conn)?;
    Ok(changed == 1)
}

/// The soft timeout passed: the attempt (and its job) become `unknown`.
pub fn mark_unknown(
    conn: &mut DbConnection,
    attempt_id: &AttemptId,
    reason: &str,
) -> StoreResult<Applied> {
    write_transaction(conn, |conn| {
        let now = now_ms();
        let attempt = lock_attempt_and_job(conn, attempt_id)?.ok_or(StoreError::NotFound)?;
        if !transition(
            conn,
            attempt_id,
            AttemptEvent::SoftTimeout,
            now,
            Some(reason),
        )? {
            return Ok(Applied::Ignored(attempt.state));
        }
        refresh_job_status(conn, &attempt.job_id, now)?;
        Ok(Applied::MarkedUnknown)
    })
}

/// Running attempts whose lease ran out belonged to a process that stopped: they
/// become `unknown` (the provider may have received them) and are never re-sent.
/// Returns the attempts changed.
pub fn expire_leases(conn: &mut DbConnection) -> StoreResult<Vec<AttemptId>> {
    write_transaction(conn, |conn| {
        let now = now_ms();
        let expired: Vec<(AttemptId, JobId)> = attempts::table
            .filter(attempts::state.eq(AttemptState::Running))
            .filter(attempts::lease_expires_at.lt(now))
            .select((attempts::id, attempts::job_id))
            .load(conn)?;
        let mut changed = Vec::new();
        for (attempt_id, job_id) in expired {
            let reason = "lease expired: the process running this attempt stopped; \
                          the provider may have received the request";
            lock_job(conn, &job_id)?;
            // Guard on the lease too: a renewal that won the race keeps it running.
            let updated = diesel::update(
                attempts::table
                    .filter(attempts::id.eq(&attempt_id))
                    .filter(attempts::state.eq_any(AttemptEvent::LeaseExpired.from_states()))
                    .filter(attempts::lease_expires_at.lt(now)),
            )
            .set((
                attempts::state.eq(AttemptEvent::LeaseExpired.target()),
                attempts::error.eq(reason),
                attempts::lease_expires_at.eq(None::<i64>),
            ))
            .execute(conn)?;
            if updated == 1 {
                refresh_job_status(conn, &job_id, now)?;
                changed.push(attempt_id);
            }
        }
        Ok(changed)
    })
}
