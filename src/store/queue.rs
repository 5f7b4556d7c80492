//! The attempt queue: claiming a queued attempt with a lease, renewing it,
//! confirming the claim immediately before sending, and what a lease that
//! runs out means: an attempt that was sent becomes `unknown` (never
//! re-sent); one that was claimed but never sent goes back to the queue.
//!
//! Leases are judged by one clock, the database's ([`db_now_ms`]), never by
//! each process's own.

use diesel::dsl::sql;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable};

use super::connection::{per_backend, write_statement, write_transaction};
use super::rows::{Attempt, Job};
use super::schema::{attempts, jobs};
use super::transitions::{get_job, lock_attempt_and_job, lock_job, refresh_job_status, transition};
use super::{now_ms, DbConnection, StoreError, StoreResult};
use std::collections::{BTreeMap, HashMap};

use crate::domain::{Applied, AttemptEvent, AttemptId, AttemptState, JobId, JobStatus, UserId};

/// PostgreSQL's clock in Unix milliseconds, as SQL.
pub(crate) const PG_NOW_MS: &str = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT";

/// The database's clock in Unix milliseconds, as SQL for this backend.
pub fn db_now_ms(conn: &DbConnection) -> &'static str {
    match conn {
        DbConnection::Postgresql(_) => PG_NOW_MS,
        DbConnection::Sqlite(_) => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
    }
}

/// Lease columns are nullable, so the clock is typed to match them.
type Millis = diesel::expression::SqlLiteral<Nullable<BigInt>>;

fn db_now(conn: &DbConnection) -> Millis {
    sql::<Nullable<BigInt>>(db_now_ms(conn))
}

fn db_now_plus(conn: &DbConnection, ms: i64) -> Millis {
    sql::<Nullable<BigInt>>(&format!("({}) + {ms}", db_now_ms(conn)))
}

/// A queued attempt this process now holds, with the job it works for.
#[derive(Debug, Clone)]
pub struct Claim {
    pub attempt: Attempt,
    pub job: Job,
}

/// Claims the oldest queued attempt for `lease_owner` until `now + lease_ms`
/// (see [`claim_batch`]; this claim is never confirmed for sending).
pub fn claim_next(
    conn: &mut DbConnection,
    lease_owner: &str,
    lease_ms: i64,
    soft_timeout_ms: &(dyn Fn(&str) -> i64 + Sync),
) -> StoreResult<Option<Claim>> {
    Ok(claim_batch(conn, lease_owner, lease_ms, 1, soft_timeout_ms, &|_| false)?.pop())
}

/// The version of an attempt's job, read inside the claiming statement:
/// what the compare-and-swap will expect.
fn job_version_of_attempt() -> diesel::expression::SqlLiteral<Nullable<BigInt>> {
    sql::<Nullable<BigInt>>(
        "(SELECT jobs.version FROM jobs \
         WHERE jobs.id = attempts.job_id AND jobs.owner_id = attempts.owner_id)",
    )
}

/// Claims up to `limit` of the oldest queued attempts for `lease_owner`
/// until `now + lease_ms`, in one transaction, oldest first.
///
/// PostgreSQL: `SELECT … FOR UPDATE SKIP LOCKED`, so processes sharing one
/// database never pick the same row. SQLite: the write transaction holds the
/// database's write lock. Either way the `UPDATE … WHERE state = 'queued'` is
/// the final guard: an attempt is sent at most once.
///
/// When `send_now(provider)` says an attempt will be sent the moment the
/// claim commits (its provider asked for no pause), the claim is also the
/// confirmation before sending: `sent_at` is recorded in the same statement,
/// whose guards are the confirmation's (running under this lease, job
/// unfinished, by construction). An attempt that must wait is confirmed
/// separately, after its wait ([`confirm_send`]).
pub fn claim_batch(
    conn: &mut DbConnection,
    lease_owner: &str,
    lease_ms: i64,
    limit: i64,
    soft_timeout_ms: &(dyn Fn(&str) -> i64 + Sync),
    send_now: &(dyn Fn(&str) -> bool + Sync),
) -> StoreResult<Vec<Claim>> {
    write_transaction(conn, |conn| {
        // Only attempts of unfinished jobs; on PostgreSQL the attempts and
        // their jobs are locked without waiting (rows another process holds
        // are skipped).
        let queued = attempts::table
            .inner_join(jobs::table.on(same_job()))
            .filter(attempts::state.eq(AttemptState::Queued))
            .filter(jobs::status.ne_all(JobStatus::TERMINAL))
            .order((attempts::created_at.asc(), attempts::id.asc()))
            .select((attempts::id, attempts::owner_id, attempts::provider))
            .limit(limit);
        let candidates: Vec<(AttemptId, UserId, String)> = match conn {
            DbConnection::Postgresql(pg) => queued.for_update().skip_locked().load(pg)?,
            DbConnection::Sqlite(_) => queued.load(conn)?,
        };
        // Rows are addressed by both halves of their primary key (id and
        // owner): the planner then expects a handful of rows, not a share of
        // the table, even before the table has statistics.
        let mut by_owner_and_provider: BTreeMap<(UserId, String), Vec<AttemptId>> =
            Default::default();
        for (attempt_id, owner_id, provider) in candidates {
            by_owner_and_provider
                .entry((owner_id, provider))
                .or_default()
                .push(attempt_id);
        }
        let now = now_ms();
        let mut claimed: Vec<Attempt> = Vec::new();
        for ((owner_id, provider), ids) in by_owner_and_provider {
            let lease_until = db_now_plus(conn, lease_ms);
            let claim = diesel::update(
                attempts::table
                    .filter(attempts::owner_id.eq(owner_id))
                    .filter(attempts::id.eq_any(ids))
                    .filter(attempts::state.eq_any(AttemptEvent::Claimed.from_states())),
            )
            .set((
                attempts::state.eq(AttemptEvent::Claimed.target()),
                attempts::sent_at.eq(send_now(&provider).then_some(now)),
                attempts::version_read.eq(job_version_of_attempt()),
                attempts::lease_owner.eq(lease_owner),
                attempts::lease_expires_at.eq(lease_until),
                attempts::started_at.eq(now),
                attempts::timeout_at.eq(now + soft_timeout_ms(&provider)),
            ));
            let rows: Vec<Attempt> = per_backend!(conn, |c| claim
                .returning(Attempt::as_returning())
                .load(c)?);
            claimed.extend(rows);
        }
        // Each job's live attempt is now its running one.
        let mut job_ids_by_owner: BTreeMap<UserId, Vec<JobId>> = Default::default();
        for attempt in &claimed {
            job_ids_by_owner
                .entry(attempt.owner_id.clone())
                .or_default()
                .push(attempt.job_id.clone());
        }
        let mut jobs: HashMap<JobId, Job> = HashMap::new();
        for (owner_id, job_ids) in job_ids_by_owner {
            let running = diesel::update(
                jobs::table
                    .filter(jobs::owner_id.eq(owner_id))
                    .filter(jobs::id.eq_any(job_ids)),
            )
            .set((
                jobs::status.eq(JobStatus::for_live_attempt(Some(AttemptState::Running))),
                jobs::updated_at.eq(now),
            ));
            let rows: Vec<Job> =
                per_backend!(conn, |c| running.returning(Job::as_returning()).load(c)?);
            jobs.extend(rows.into_iter().map(|job| (job.id.clone(), job)));
        }
        claimed.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        claimed
            .into_iter()
            .map(|attempt| {
                let job = jobs.remove(&attempt.job_id).ok_or_else(|| {
                    StoreError::corrupt(format!("claimed attempt {} has no job", attempt.id))
                })?;
                Ok(Claim { attempt, job })
            })
            .collect()
    })
}

/// What starting a new job's first attempt in its creating transaction
/// needs: the lease it runs under, and its provider's soft timeout.
#[derive(Debug, Clone)]
pub struct StartNow {
    pub lease_owner: String,
    pub lease_ms: i64,
    pub soft_timeout_ms: i64,
}

/// Inserts a new job's first attempt already claimed by `start.lease_owner`
/// and confirmed for sending, exactly as [`claim_batch`] leaves an attempt
/// whose provider asked for no pause: `running`, leased by the database's
/// clock, `sent_at` recorded, the job's version read. It is the creating
/// transaction's own row, so no other process can hold it; the guards a
/// claim checks (queued, job unfinished) hold by construction. The caller
/// sends it as soon as the transaction commits; if the process stops
/// first, the lease runs out and the attempt becomes `unknown`, never
/// re-sent, as for any claimed attempt.
pub fn insert_started_attempt(
    conn: &mut DbConnection,
    job: &Job,
    start: &StartNow,
    now: i64,
) -> StoreResult<Attempt> {
    let lease_until = db_now_plus(conn, start.lease_ms);
    let insert = diesel::insert_into(attempts::table).values((
        attempts::id.eq(AttemptId::new()),
        attempts::job_id.eq(&job.id),
        attempts::owner_id.eq(&job.owner_id),
        attempts::number.eq(1),
        attempts::provider.eq(&job.provider),
        attempts::state.eq(AttemptEvent::Claimed.target()),
        attempts::version_read.eq(Some(job.version)),
        attempts::lease_owner.eq(&start.lease_owner),
        attempts::lease_expires_at.eq(lease_until),
        attempts::created_at.eq(now),
        attempts::started_at.eq(now),
        attempts::timeout_at.eq(now + start.soft_timeout_ms),
        attempts::sent_at.eq(now),
    ));
    Ok(per_backend!(conn, |c| insert
        .returning(Attempt::as_returning())
        .get_result(c)?))
}

/// An attempt's job: the same id and the same owner, so that the join stays
/// within one owner's rows (docs/scaling.md).
pub(crate) fn same_job() -> diesel::dsl::And<
    diesel::dsl::Eq<jobs::id, attempts::job_id>,
    diesel::dsl::Eq<jobs::owner_id, attempts::owner_id>,
> {
    jobs::id
        .eq(attempts::job_id)
        .and(jobs::owner_id.eq(attempts::owner_id))
}

/// The attempt's job is not finished: a correlated look-up by the job's
/// whole primary key (as `job_id IN (unfinished jobs)` the planner may
/// hash every unfinished job instead).
fn job_unfinished() -> diesel::expression::SqlLiteral<diesel::sql_types::Bool> {
    let terminal = JobStatus::TERMINAL.map(|status| format!("'{}'", status.as_str()));
    sql::<diesel::sql_types::Bool>(&format!(
        "EXISTS (SELECT 1 FROM jobs WHERE jobs.id = attempts.job_id \
         AND jobs.owner_id = attempts.owner_id AND jobs.status NOT IN ({}))",
        terminal.join(", ")
    ))
}

/// Extends the lease of a running attempt this process holds, while its job
/// is unfinished. False when the claim is void: the attempt is no longer
/// running under this owner, or its job finished.
pub fn renew_lease(
    conn: &mut DbConnection,
    attempt_id: &AttemptId,
    lease_owner: &str,
    lease_ms: i64,
) -> StoreResult<bool> {
    let until = db_now_plus(conn, lease_ms);
    let changed = write_statement(conn, |conn| {
        diesel::update(
            attempts::table
                .filter(attempts::id.eq(attempt_id))
                .filter(attempts::state.eq(AttemptState::Running))
                .filter(attempts::lease_owner.eq(lease_owner))
                .filter(job_unfinished()),
        )
        .set(attempts::lease_expires_at.eq(until))
        .execute(conn)
    })?;
    Ok(changed == 1)
}

/// What confirming a claim immediately before sending found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendPermit {
    /// The claim holds: `sent_at` is recorded; send now.
    Granted,
    /// The job finished while the claim waited: the attempt was closed
    /// unsent, with this reason.
    Withdrawn(String),
    /// The lease ran out before sending: the attempt went back to the queue.
    Requeued,
    /// The attempt is no longer this worker's (another process took it over,
    /// or it is not running): nothing to do.
    Lost,
}

const NOT_SENT_JOB_FINISHED: &str = "not sent: the job had already finished";

/// The one guarded statement before a send: the attempt is still `running`,
/// leased by `lease_owner` (by the database's clock), never sent, and its
/// job is unfinished. If so, `sent_at` is recorded and the lease renewed;
/// if not, nothing may be sent and the attempt records why.
pub fn confirm_send(
    conn: &mut DbConnection,
    attempt_id: &AttemptId,
    lease_owner: &str,
    lease_ms: i64,
) -> StoreResult<SendPermit> {
    let (now, until) = (db_now(conn), db_now_plus(conn, lease_ms));
    let confirmed = write_statement(conn, |conn| {
        diesel::update(
            attempts::table
                .filter(attempts::id.eq(attempt_id))
                .filter(attempts::state.eq(AttemptState::Running))
                .filter(attempts::lease_owner.eq(lease_owner))
                .filter(attempts::sent_at.is_null())
                .filter(attempts::lease_expires_at.gt(now))
                .filter(job_unfinished()),
        )
        .set((
            attempts::sent_at.eq(now_ms()),
            attempts::lease_expires_at.eq(until),
        ))
        .execute(conn)
    })?;
    if confirmed == 1 {
        return Ok(SendPermit::Granted);
    }
    give_back_unsent(conn, attempt_id, lease_owner)
}

/// Gives up this worker's unsent claim (at shutdown, or when it became
/// void): back to the queue, or closed if its job has finished. Nothing was
/// sent, so the attempt may be sent later by whoever claims it.
pub fn give_back_unsent(
    conn: &mut DbConnection,
    attempt_id: &AttemptId,
    lease_owner: &str,
) -> StoreResult<SendPermit> {
    write_transaction(conn, |conn| {
        let Some(attempt) = lock_attempt_and_job(conn, attempt_id)? else {
            return Ok(SendPermit::Lost);
        };
        let ours = attempt.state == AttemptState::Running
            && attempt.sent_at.is_none()
            && attempt.lease_owner.as_deref() == Some(lease_owner);
        if !ours {
            return Ok(SendPermit::Lost);
        }
        let job = get_job(conn, &attempt.job_id)?;
        if job.status.is_terminal() {
            close_unsent(conn, &attempt, NOT_SENT_JOB_FINISHED)?;
            return Ok(SendPermit::Withdrawn(NOT_SENT_JOB_FINISHED.to_owned()));
        }
        requeue(conn, &attempt)?;
        Ok(SendPermit::Requeued)
    })
}

/// An unsent running attempt goes back to `queued`: it was claimed, never
/// sent, so sending it later sends it once.
fn requeue(conn: &mut DbConnection, attempt: &Attempt) -> StoreResult<()> {
    let now = now_ms();
    diesel::update(
        attempts::table
            .filter(attempts::id.eq(&attempt.id))
            .filter(attempts::owner_id.eq(&attempt.owner_id))
            .filter(attempts::state.eq(AttemptState::Running))
            .filter(attempts::sent_at.is_null()),
    )
    .set((
        attempts::state.eq(AttemptState::Queued),
        attempts::version_read.eq(None::<i64>),
        attempts::lease_expires_at.eq(None::<i64>),
        attempts::started_at.eq(None::<i64>),
        attempts::timeout_at.eq(None::<i64>),
    ))
    .execute(conn)?;
    refresh_job_status(conn, &attempt.job_id, now)
}

/// An unsent running attempt of a finished job is closed, never sent.
fn close_unsent(conn: &mut DbConnection, attempt: &Attempt, reason: &str) -> StoreResult<()> {
    diesel::update(
        attempts::table
            .filter(attempts::id.eq(&attempt.id))
            .filter(attempts::owner_id.eq(&attempt.owner_id))
            .filter(attempts::state.eq(AttemptState::Running))
            .filter(attempts::sent_at.is_null()),
    )
    .set((
        attempts::state.eq(AttemptState::Failed),
        attempts::finished_at.eq(now_ms()),
        attempts::error.eq(reason),
        attempts::lease_expires_at.eq(None::<i64>),
    ))
    .execute(conn)?;
    Ok(())
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
        if !transition(conn, &attempt, AttemptEvent::SoftTimeout, now, Some(reason))? {
            return Ok(Applied::Ignored(attempt.state));
        }
        refresh_job_status(conn, &attempt.job_id, now)?;
        Ok(Applied::MarkedUnknown)
    })
}

/// Running attempts whose lease ran out (by the database's clock) belonged
/// to a process that stopped. One that was sent becomes `unknown` (the
/// provider may have received it) and is never re-sent; one that was never
/// sent goes back to the queue (or is closed, if its job finished). Each
/// attempt is handled in a transaction of its own, so reapers in several
/// processes never hold locks on two jobs at once. Returns what changed.
pub fn expire_leases(conn: &mut DbConnection) -> StoreResult<Vec<(AttemptId, AttemptState)>> {
    let now = db_now(conn);
    let expired: Vec<(AttemptId, JobId)> = attempts::table
        .filter(attempts::state.eq(AttemptState::Running))
        .filter(attempts::lease_expires_at.lt(now))
        .select((attempts::id, attempts::job_id))
        .limit(100)
        .load(conn)?;
    let mut changed = Vec::new();
    for (attempt_id, job_id) in expired {
        if let Some(state) = expire_one(conn, &attempt_id, &job_id)? {
            changed.push((attempt_id, state));
        }
    }
    Ok(changed)
}

fn expire_one(
    conn: &mut DbConnection,
    attempt_id: &AttemptId,
    job_id: &JobId,
) -> StoreResult<Option<AttemptState>> {
    write_transaction(conn, |conn| {
        lock_job(conn, job_id)?;
        let now = db_now(conn);
        // Re-read under the lock: a renewal or an answer may have come first.
        let still_expired = attempts::table
            .filter(attempts::id.eq(attempt_id))
            .filter(attempts::state.eq(AttemptState::Running))
            .filter(attempts::lease_expires_at.lt(now))
            .select(Attempt::as_select())
            .first(conn)
            .optional()?;
        let Some(attempt) = still_expired else {
            return Ok(None);
        };
        if attempt.sent_at.is_none() {
            let job = get_job(conn, job_id)?;
            if job.status.is_terminal() {
                close_unsent(conn, &attempt, NOT_SENT_JOB_FINISHED)?;
                return Ok(Some(AttemptState::Failed));
            }
            requeue(conn, &attempt)?;
            return Ok(Some(AttemptState::Queued));
        }
        let reason = "lease expired: the process running this attempt stopped; \
                      the provider may have received the request";
        let updated = diesel::update(
            attempts::table
                .filter(attempts::id.eq(attempt_id))
                .filter(attempts::state.eq_any(AttemptEvent::LeaseExpired.from_states())),
        )
        .set((
            attempts::state.eq(AttemptEvent::LeaseExpired.target()),
            attempts::error.eq(reason),
            attempts::lease_expires_at.eq(None::<i64>),
        ))
        .execute(conn)?;
        if updated != 1 {
            return Ok(None);
        }
        refresh_job_status(conn, job_id, now_ms())?;
        Ok(Some(AttemptState::Unknown))
    })
}
