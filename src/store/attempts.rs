//! Attempts: claiming with a lease, the completion compare-and-swap, failover,
//! timeouts, lease expiry and abandonment. Every state change is a conditional
//! `UPDATE` guarded by the states the domain allows it from
//! ([`AttemptEvent::from_states`]); the caller learns from the row count whether
//! it happened.

use diesel::prelude::*;
use serde_json::Value;

use super::connection::{is_unique_violation, write_transaction};
use super::jobs::{attempts_of, get_job, insert_queued_attempt};
use super::models::{state_names, terminal_status_names, Attempt, AttemptRow, Job};
use super::schema::{attempts, jobs, race_log};
use super::{now_ms, DbConnection, StoreError, StoreResult};
use crate::domain::fingerprint::{canonical_json, sha256_hex};
use crate::domain::{
    may_start_attempt, next_provider, AttemptEvent, AttemptOutcome, AttemptState, JobStatus,
    NewAttemptRefusal,
};

/// A queued attempt this process now holds, with the job it works for.
#[derive(Debug, Clone)]
pub struct Claim {
    pub attempt: Attempt,
    pub job: Job,
}

fn find_attempt(conn: &mut DbConnection, attempt_id: &str) -> StoreResult<Option<Attempt>> {
    attempts::table
        .find(attempt_id)
        .select(AttemptRow::as_select())
        .first(conn)
        .optional()?
        .map(Attempt::try_from)
        .transpose()
}

pub fn get_attempt(conn: &mut DbConnection, attempt_id: &str) -> StoreResult<Attempt> {
    find_attempt(conn, attempt_id)?.ok_or(StoreError::NotFound)
}

/// The job's live attempt (queued, running or unknown), if any.
pub fn live_attempt(conn: &mut DbConnection, job_id: &str) -> StoreResult<Option<Attempt>> {
    attempts::table
        .filter(attempts::job_id.eq(job_id))
        .filter(attempts::state.eq_any(state_names(&AttemptState::LIVE)))
        .select(AttemptRow::as_select())
        .first(conn)
        .optional()?
        .map(Attempt::try_from)
        .transpose()
}

/// On PostgreSQL, locks the job row until the transaction ends. Every write
/// transaction that touches a job or its attempts takes this lock first, so
/// they queue on the job in one order (no deadlocks) and each reads what the
/// previous one committed. SQLite needs nothing: `BEGIN IMMEDIATE` already
/// makes writers take turns.
fn lock_job(conn: &mut DbConnection, job_id: &str) -> QueryResult<()> {
    if let DbConnection::Postgresql(pg) = conn {
        jobs::table
            .find(job_id)
            .select(jobs::id)
            .for_update()
            .first::<String>(pg)
            .optional()?;
    }
    Ok(())
}

/// Locks the attempt's job, then reads the attempt as it is under that lock.
fn lock_attempt_and_job(conn: &mut DbConnection, attempt_id: &str) -> StoreResult<Option<Attempt>> {
    let Some(attempt) = find_attempt(conn, attempt_id)? else {
        return Ok(None);
    };
    lock_job(conn, &attempt.job_id)?;
    find_attempt(conn, attempt_id)
}

/// Moves an attempt along `event` if it is in one of the event's from-states.
/// Returns whether the row changed.
fn transition(
    conn: &mut DbConnection,
    attempt_id: &str,
    event: AttemptEvent,
    now: i64,
    error: Option<&str>,
) -> QueryResult<bool> {
    let target = event.target();
    let finished_at =
        matches!(target, AttemptState::Succeeded | AttemptState::Failed).then_some(now);
    let changed = diesel::update(
        attempts::table
            .filter(attempts::id.eq(attempt_id))
            .filter(attempts::state.eq_any(state_names(event.from_states()))),
    )
    .set((
        attempts::state.eq(target.as_str()),
        attempts::finished_at.eq(finished_at),
        attempts::error.eq(error),
        attempts::lease_owner.eq(None::<String>),
        attempts::lease_expires_at.eq(None::<i64>),
    ))
    .execute(conn)?;
    Ok(changed == 1)
}

/// Re-derives a non-terminal job's status from its live attempt. Terminal jobs
/// are never touched.
fn refresh_job_status(conn: &mut DbConnection, job_id: &str, now: i64) -> StoreResult<()> {
    let live = live_attempt(conn, job_id)?.map(|a| a.state);
    let status = JobStatus::for_live_attempt(live);
    diesel::update(
        jobs::table
            .filter(jobs::id.eq(job_id))
            .filter(jobs::status.ne_all(terminal_status_names())),
    )
    .set((jobs::status.eq(status.as_str()), jobs::updated_at.eq(now)))
    .execute(conn)?;
    Ok(())
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
            .filter(attempts::state.eq(AttemptState::Queued.as_str()))
            .filter(jobs::status.ne_all(terminal_status_names()))
            .order((attempts::created_at.asc(), attempts::id.asc()))
            .select((attempts::id, attempts::job_id, attempts::provider))
            .limit(1);
        let candidate: Option<(String, String, String)> = match conn {
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
                .filter(attempts::state.eq_any(state_names(AttemptEvent::Claimed.from_states()))),
        )
        .set((
            attempts::state.eq(AttemptEvent::Claimed.target().as_str()),
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
    attempt_id: &str,
    lease_owner: &str,
    lease_ms: i64,
) -> StoreResult<bool> {
    let changed = diesel::update(
        attempts::table
            .filter(attempts::id.eq(attempt_id))
            .filter(attempts::state.eq(AttemptState::Running.as_str()))
            .filter(attempts::lease_owner.eq(lease_owner)),
    )
    .set(attempts::lease_expires_at.eq(now_ms() + lease_ms))
    .execute(conn)?;
    Ok(changed == 1)
}

/// The soft timeout passed: the attempt (and its job) become `unknown`.
pub fn mark_unknown(conn: &mut DbConnection, attempt_id: &str, reason: &str) -> StoreResult<bool> {
    write_transaction(conn, |conn| {
        let now = now_ms();
        let Some(attempt) = lock_attempt_and_job(conn, attempt_id)? else {
            return Ok(false);
        };
        if !transition(
            conn,
            attempt_id,
            AttemptEvent::SoftTimeout,
            now,
            Some(reason),
        )? {
            return Ok(false);
        }
        refresh_job_status(conn, &attempt.job_id, now)?;
        Ok(true)
    })
}

/// Running attempts whose lease ran out belonged to a process that stopped: they
/// become `unknown` (the provider may have received them) and are never re-sent.
/// Returns the attempts changed.
pub fn expire_leases(conn: &mut DbConnection) -> StoreResult<Vec<String>> {
    write_transaction(conn, |conn| {
        let now = now_ms();
        let expired: Vec<(String, String)> = attempts::table
            .filter(attempts::state.eq(AttemptState::Running.as_str()))
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
                    .filter(
                        attempts::state
                            .eq_any(state_names(AttemptEvent::LeaseExpired.from_states())),
                    )
                    .filter(attempts::lease_expires_at.lt(now)),
            )
            .set((
                attempts::state.eq(AttemptEvent::LeaseExpired.target().as_str()),
                attempts::error.eq(reason),
                attempts::lease_owner.eq(None::<String>),
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

/// What happened to a provider's successful answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// This attempt's result is the job's result.
    Won,
    /// Another attempt won or the job was finalized first: the payload was
    /// discarded and a race-log row written.
    Lost { winner: Option<String> },
    /// The attempt was not in a state that takes a result (already finished).
    Ignored(AttemptState),
}

/// Applies a successful answer with the compare-and-swap of DESIGN.md §4.
pub fn complete_success(
    conn: &mut DbConnection,
    attempt_id: &str,
    payload: &Value,
) -> StoreResult<Completion> {
    write_transaction(conn, |conn| {
        let now = now_ms();
        let attempt = lock_attempt_and_job(conn, attempt_id)?.ok_or(StoreError::NotFound)?;
        if AttemptEvent::ProviderSucceeded
            .apply(attempt.state)
            .is_err()
        {
            return Ok(Completion::Ignored(attempt.state));
        }
        let version_read = attempt.version_read.ok_or_else(|| {
            StoreError::corrupt(format!(
                "attempt {attempt_id} has a result but never started"
            ))
        })?;
        let payload_text = canonical_json(payload);
        let won = cas_job_result(
            conn,
            &attempt.job_id,
            version_read,
            attempt_id,
            &payload_text,
            now,
        )?;
        transition(conn, attempt_id, AttemptEvent::ProviderSucceeded, now, None)?;
        let outcome = if won {
            AttemptOutcome::Won
        } else {
            AttemptOutcome::Lost
        };
        diesel::update(attempts::table.find(attempt_id))
            .set(attempts::outcome.eq(outcome.as_str()))
            .execute(conn)?;
        if won {
            skip_queued_attempts(conn, &attempt.job_id, now)?;
            return Ok(Completion::Won);
        }
        let job = get_job(conn, &attempt.job_id)?;
        let reason = match (&job.completed_by, job.status) {
            (Some(winner), _) => format!("attempt {winner} had already completed the job"),
            (None, JobStatus::Failed) => "the job had already been finalized as failed".to_owned(),
            (None, _) => "the job's version changed since the attempt started".to_owned(),
        };
        diesel::insert_into(race_log::table)
            .values((
                race_log::id.eq(uuid::Uuid::now_v7().to_string()),
                race_log::job_id.eq(&attempt.job_id),
                race_log::losing_attempt_id.eq(attempt_id),
                race_log::winning_attempt_id.eq(&job.completed_by),
                race_log::reason.eq(&reason),
                race_log::version_read.eq(version_read),
                race_log::version_found.eq(job.version),
                race_log::provider.eq(&attempt.provider),
                race_log::payload_sha256.eq(sha256_hex(payload_text.as_bytes())),
                race_log::loser_started_at.eq(attempt.started_at),
                race_log::lost_at.eq(now),
            ))
            .execute(conn)?;
        Ok(Completion::Lost {
            winner: job.completed_by,
        })
    })
}

/// The single conditional statement that decides the winner.
fn cas_job_result(
    conn: &mut DbConnection,
    job_id: &str,
    version_read: i64,
    attempt_id: &str,
    payload: &str,
    now: i64,
) -> QueryResult<bool> {
    let updated = diesel::update(
        jobs::table
            .filter(jobs::id.eq(job_id))
            .filter(jobs::version.eq(version_read))
            .filter(jobs::completed_by.is_null()),
    )
    .set((
        jobs::result.eq(payload),
        jobs::completed_by.eq(attempt_id),
        jobs::status.eq(JobStatus::Succeeded.as_str()),
        jobs::version.eq(jobs::version + 1),
        jobs::updated_at.eq(now),
    ))
    .execute(conn)?;
    Ok(updated == 1)
}

/// Once a job is terminal, a queued attempt must never be sent.
fn skip_queued_attempts(conn: &mut DbConnection, job_id: &str, now: i64) -> QueryResult<usize> {
    diesel::update(
        attempts::table
            .filter(attempts::job_id.eq(job_id))
            .filter(attempts::state.eq_any(state_names(AttemptEvent::Skipped.from_states()))),
    )
    .set((
        attempts::state.eq(AttemptEvent::Skipped.target().as_str()),
        attempts::finished_at.eq(now),
        attempts::error.eq("not sent: the job had already finished"),
    ))
    .execute(conn)
}

/// What followed a definite failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailureOutcome {
    /// A new attempt was queued on the next provider of the chain.
    FailedOver {
        attempt_id: String,
        provider: String,
    },
    /// No provider was left: the job failed.
    JobFailed { reason: String },
    /// Recorded on the attempt only: it had been abandoned, or the job had finished.
    Recorded,
    /// The attempt was not in a state that takes a failure.
    Ignored(AttemptState),
}

/// Applies a definite failure, then fails over along `order` (the job's
/// failover order) to the first provider the job has not tried, or fails the job.
///
/// `order` holds only providers failover may use (the job's primary and
/// qualified fallbacks); `skipped` names the others, for the failure reason.
pub fn complete_failure(
    conn: &mut DbConnection,
    attempt_id: &str,
    error: &str,
    order: &[String],
    skipped: &[String],
) -> StoreResult<FailureOutcome> {
    write_transaction(conn, |conn| {
        let now = now_ms();
        let attempt = lock_attempt_and_job(conn, attempt_id)?.ok_or(StoreError::NotFound)?;
        if AttemptEvent::ProviderFailed.apply(attempt.state).is_err() {
            return Ok(FailureOutcome::Ignored(attempt.state));
        }
        transition(
            conn,
            attempt_id,
            AttemptEvent::ProviderFailed,
            now,
            Some(error),
        )?;
        let job = get_job(conn, &attempt.job_id)?;
        // An operator already decided what follows an abandoned attempt.
        if attempt.state == AttemptState::Abandoned || job.status.is_terminal() {
            return Ok(FailureOutcome::Recorded);
        }
        let tried: Vec<String> = attempts_of(conn, &job.id)?
            .into_iter()
            .map(|a| a.provider)
            .collect();
        let order: Vec<&str> = order.iter().map(String::as_str).collect();
        match next_provider(&order, &tried) {
            Some(provider) => {
                let number = tried.len() as i32 + 1;
                let next = insert_queued_attempt(conn, &job.id, number, provider, now)?;
                refresh_job_status(conn, &job.id, now)?;
                Ok(FailureOutcome::FailedOver {
                    attempt_id: next.id,
                    provider: provider.to_owned(),
                })
            }
            None => {
                let reason = if skipped.is_empty() {
                    format!(
                        "every provider in the chain failed ({}); last error: {error}",
                        tried.join(", ")
                    )
                } else {
                    format!(
                        "no qualified fallback provider is left: {} not qualified for this task; tried {}; \
                         last error: {error}",
                        skipped.join(", "),
                        tried.join(", ")
                    )
                };
                if fail_job(conn, &job, &reason, now)? {
                    Ok(FailureOutcome::JobFailed { reason })
                } else {
                    Ok(FailureOutcome::Recorded)
                }
            }
        }
    })
}

/// Finalizes a job as failed: a version-guarded update, so it cannot overwrite
/// a result that won in the meantime.
pub(crate) fn fail_job(
    conn: &mut DbConnection,
    job: &Job,
    reason: &str,
    now: i64,
) -> QueryResult<bool> {
    let updated = diesel::update(
        jobs::table
            .filter(jobs::id.eq(&job.id))
            .filter(jobs::version.eq(job.version))
            .filter(jobs::completed_by.is_null())
            .filter(jobs::status.ne_all(terminal_status_names())),
    )
    .set((
        jobs::status.eq(JobStatus::Failed.as_str()),
        jobs::failure_reason.eq(reason),
        jobs::version.eq(jobs::version + 1),
        jobs::updated_at.eq(now),
    ))
    .execute(conn)?;
    Ok(updated == 1)
}

#[derive(Debug, thiserror::Error)]
pub enum JobActionError {
    #[error("job not found")]
    JobNotFound,
    #[error("the job is {0}; it takes no more attempts")]
    JobFinished(JobStatus),
    #[error("attempt {attempt_id} is {state}; wait for it or have support abandon it")]
    InFlight {
        attempt_id: String,
        state: AttemptState,
    },
    #[error("every provider in the task's chain has been tried; name a provider explicitly")]
    ChainExhausted,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<diesel::result::Error> for JobActionError {
    fn from(e: diesel::result::Error) -> Self {
        Self::Store(e.into())
    }
}

/// Queues a new attempt on `provider`, or on the next untried provider of `order`.
/// The partial unique index is the final word: if another request slipped a live
/// attempt in first, the insert fails and the caller is told which one blocks.
/// `actor`, when given, is support staff acting on someone's job: the action
/// goes to the audit log.
pub fn start_attempt(
    conn: &mut DbConnection,
    job_id: &str,
    provider: Option<&str>,
    order: &[String],
    actor: Option<&str>,
) -> Result<Attempt, JobActionError> {
    let result = write_transaction(conn, |conn| {
        let now = now_ms();
        lock_job(conn, job_id)?;
        let job = super::jobs::find_job(conn, job_id)?.ok_or(JobActionError::JobNotFound)?;
        let live = live_attempt(conn, job_id)?;
        if let Err(refusal) = may_start_attempt(job.status, live.as_ref().map(|a| a.state)) {
            return Err(match (refusal, live) {
                (NewAttemptRefusal::AttemptInFlight(state), Some(a)) => JobActionError::InFlight {
                    attempt_id: a.id,
                    state,
                },
                (NewAttemptRefusal::JobFinished(status), _) => JobActionError::JobFinished(status),
                (NewAttemptRefusal::AttemptInFlight(_), None) => {
                    unreachable!("refused for a live attempt")
                }
            });
        }
        let tried: Vec<String> = attempts_of(conn, job_id)?
            .into_iter()
            .map(|a| a.provider)
            .collect();
        let provider = match provider {
            Some(p) => p.to_owned(),
            None => {
                let order: Vec<&str> = order.iter().map(String::as_str).collect();
                next_provider(&order, &tried)
                    .ok_or(JobActionError::ChainExhausted)?
                    .to_owned()
            }
        };
        let row = insert_queued_attempt(conn, job_id, tried.len() as i32 + 1, &provider, now)?;
        refresh_job_status(conn, job_id, now)?;
        if let Some(actor) = actor {
            let reason = format!("started attempt {} on {provider}", row.number);
            super::admin::record_audit(
                conn,
                actor,
                "start_attempt",
                Some(job_id),
                Some(&row.id),
                &reason,
                now,
            )?;
        }
        Ok(Attempt::try_from(row)?)
    });
    match result {
        Err(JobActionError::Store(StoreError::Database(e))) if is_unique_violation(&e) => {
            match live_attempt(conn, job_id)? {
                Some(a) => Err(JobActionError::InFlight {
                    attempt_id: a.id,
                    state: a.state,
                }),
                None => Err(JobActionError::Store(StoreError::Database(e))),
            }
        }
        other => other,
    }
}

/// Support staff finalize a job as failed after resolving its unknown attempt.
/// Refused while an attempt is live (abandon it first) or once the job is
/// finished; a version-guarded update, audited.
pub fn fail_job_by_operator(
    conn: &mut DbConnection,
    job_id: &str,
    actor: &str,
    reason: &str,
) -> Result<Job, JobActionError> {
    write_transaction(conn, |conn| {
        let now = now_ms();
        lock_job(conn, job_id)?;
        let job = super::jobs::find_job(conn, job_id)?.ok_or(JobActionError::JobNotFound)?;
        if let Some(live) = live_attempt(conn, job_id)? {
            return Err(JobActionError::InFlight {
                attempt_id: live.id,
                state: live.state,
            });
        }
        if job.status.is_terminal()
            || !fail_job(
                conn,
                &job,
                &format!("marked failed by support: {reason}"),
                now,
            )?
        {
            return Err(JobActionError::JobFinished(get_job(conn, job_id)?.status));
        }
        super::admin::record_audit(conn, actor, "fail_job", Some(job_id), None, reason, now)?;
        Ok(get_job(conn, job_id)?)
    })
}

#[derive(Debug, thiserror::Error)]
pub enum AbandonError {
    #[error("attempt not found")]
    NotFound,
    #[error("attempt is {0}; only an unknown attempt can be abandoned")]
    NotUnknown(AttemptState),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<diesel::result::Error> for AbandonError {
    fn from(e: diesel::result::Error) -> Self {
        Self::Store(e.into())
    }
}

/// Support staff give up on an unknown attempt, with a reason, in the audit log.
/// The job returns to `pending` and a new attempt may start; a late result of
/// the abandoned attempt still goes through the CAS.
pub fn abandon(
    conn: &mut DbConnection,
    attempt_id: &str,
    actor_id: &str,
    reason: &str,
) -> Result<Attempt, AbandonError> {
    write_transaction(conn, |conn| {
        let now = now_ms();
        let attempt = lock_attempt_and_job(conn, attempt_id)?.ok_or(AbandonError::NotFound)?;
        if !transition(
            conn,
            attempt_id,
            AttemptEvent::Abandoned,
            now,
            attempt.error.as_deref(),
        )? {
            return Err(AbandonError::NotUnknown(attempt.state));
        }
        refresh_job_status(conn, &attempt.job_id, now)?;
        super::admin::record_audit(
            conn,
            actor_id,
            "abandon_attempt",
            Some(&attempt.job_id),
            Some(attempt_id),
            reason,
            now,
        )?;
        Ok(get_attempt(conn, attempt_id)?)
    })
}
