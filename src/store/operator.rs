//! Actions on a job that people take: a new attempt (the owner's retry, or
//! support's next attempt on a chosen provider), abandoning an unknown
//! attempt, finalizing a job as failed. Staff actions are written to the
//! audit log in the same transaction.

use diesel::prelude::*;

use super::connection::{is_unique_violation, write_transaction};
use super::reads::{attempts_of, find_owned_attempt, find_owned_job, get_job};
use super::rows::{Attempt, Job};
use super::rows::{AttemptKey, JobKey};
use super::schema::audit_log;
use super::transitions::{
    fail_job, insert_queued_attempt, live_attempt, lock_attempt_and_job, lock_job,
    refresh_job_status, transition,
};
use super::{DbConnection, StoreError};
use crate::domain::{
    next_provider, AttemptEvent, AttemptId, AttemptState, AuditAction, JobId, JobStatus, Reason,
    Timestamp, UserId,
};

/// Why an action on a job or attempt did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("job not found")]
    JobNotFound,
    #[error("attempt not found")]
    AttemptNotFound,
    #[error("the job is {0}; it takes no more attempts")]
    JobFinished(JobStatus),
    #[error("attempt {attempt_id} is {state}; wait for it or have support abandon it")]
    InFlight {
        attempt_id: AttemptId,
        state: AttemptState,
    },
    #[error("every provider in the task's chain has been tried; name a provider explicitly")]
    ChainExhausted,
    #[error("attempt is {0}; only an unknown attempt can be abandoned")]
    NotUnknown(AttemptState),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<diesel::result::Error> for ActionError {
    fn from(e: diesel::result::Error) -> Self {
        Self::Store(e.into())
    }
}

/// What an audit entry is about, which decides whom it is filed under.
#[derive(Debug, Clone, Copy)]
pub enum Audited<'a> {
    /// Someone's job (and maybe one of its attempts): filed under its owner.
    Job {
        owner_id: &'a UserId,
        job_id: &'a JobId,
        attempt_id: Option<&'a AttemptId>,
    },
    /// A user (a Users-page action): filed under that user.
    User(&'a UserId),
    /// No one's job (a qualification run): filed under the actor.
    Nothing,
}

impl<'a> Audited<'a> {
    pub fn job(owner_id: &'a UserId, job_id: &'a JobId, attempt_id: Option<&'a AttemptId>) -> Self {
        Self::Job {
            owner_id,
            job_id,
            attempt_id,
        }
    }
}

/// Records who did what, to what, when and why: the one audit insert.
pub fn record_audit(
    conn: &mut DbConnection,
    actor_id: &UserId,
    action: AuditAction,
    about: Audited<'_>,
    reason: &str,
    at: Timestamp,
) -> QueryResult<()> {
    let (owner_id, job_id, attempt_id, subject) = match about {
        Audited::Job {
            owner_id,
            job_id,
            attempt_id,
        } => (owner_id, Some(job_id), attempt_id, None),
        Audited::User(user) => (user, None, None, Some(user)),
        Audited::Nothing => (actor_id, None, None, None),
    };
    diesel::insert_into(audit_log::table)
        .values((
            audit_log::id.eq(uuid::Uuid::now_v7().to_string()),
            audit_log::actor_id.eq(actor_id),
            audit_log::action.eq(action),
            audit_log::job_id.eq(job_id),
            audit_log::attempt_id.eq(attempt_id),
            audit_log::subject_user_id.eq(subject),
            audit_log::reason.eq(reason),
            audit_log::at.eq(at),
            audit_log::owner_id.eq(owner_id),
        ))
        .execute(conn)?;
    Ok(())
}

/// Queues a new attempt on `provider`, or on the next untried provider of
/// `order` (the gated failover order). `actor`, when given, is support staff
/// acting on someone's job: the action goes to the audit log.
///
/// The one-live-attempt index decides whether the attempt may start: nothing
/// here checks for a live attempt before inserting. The insert runs in a
/// savepoint; when the index refuses it, the caller is told which attempt
/// blocks (`409 attempt-in-flight`), whoever inserted it and however close
/// the race.
pub fn start_attempt(
    conn: &mut DbConnection,
    key: &JobKey,
    provider: Option<&str>,
    order: &[String],
    actor: Option<&UserId>,
) -> Result<Attempt, ActionError> {
    write_transaction(conn, |conn| {
        let now = Timestamp::now();
        let job_id = &key.id;
        lock_job(conn, key)?;
        let job = find_owned_job(conn, key)?.ok_or(ActionError::JobNotFound)?;
        if job.status.is_terminal() {
            return Err(ActionError::JobFinished(job.status));
        }
        let tried: Vec<String> = attempts_of(conn, key)?
            .into_iter()
            .map(|a| a.provider)
            .collect();
        let provider = match provider {
            Some(p) => p.to_owned(),
            None => {
                let order: Vec<&str> = order.iter().map(String::as_str).collect();
                match next_provider(&order, &tried) {
                    Some(p) => p.to_owned(),
                    // A live attempt is the better answer than "all tried":
                    // it is what the caller waits for.
                    None => {
                        return Err(in_flight(conn, key)?.unwrap_or(ActionError::ChainExhausted))
                    }
                }
            }
        };
        let number = tried.len() as i32 + 1;
        let inserted = conn.transaction(|savepoint| {
            insert_queued_attempt(savepoint, job_id, &job.owner_id, number, &provider, now)
        });
        let row = match inserted {
            Ok(row) => row,
            Err(e) if is_unique_violation(&e) => {
                return Err(in_flight(conn, key)?.ok_or(ActionError::Store(e.into()))?)
            }
            Err(e) => return Err(e.into()),
        };
        refresh_job_status(conn, key, now)?;
        if let Some(actor) = actor {
            let reason = format!("started attempt {} on {provider}", row.number);
            let about = Audited::job(&job.owner_id, job_id, Some(&row.id));
            record_audit(conn, actor, AuditAction::StartAttempt, about, &reason, now)?;
        }
        Ok(row)
    })
}

/// The refusal naming the job's live attempt, if it has one.
fn in_flight(conn: &mut DbConnection, key: &JobKey) -> Result<Option<ActionError>, StoreError> {
    Ok(live_attempt(conn, key)?.map(|a| ActionError::InFlight {
        attempt_id: a.id,
        state: a.state,
    }))
}

/// Support staff finalize a job as failed after resolving its unknown attempt.
/// Refused while an attempt is live (abandon it first) or once the job is
/// finished; a version-guarded update, audited.
pub fn fail_job_by_operator(
    conn: &mut DbConnection,
    key: &JobKey,
    actor: &UserId,
    reason: &str,
) -> Result<Job, ActionError> {
    write_transaction(conn, |conn| {
        let now = Timestamp::now();
        let job_id = &key.id;
        lock_job(conn, key)?;
        let job = find_owned_job(conn, key)?.ok_or(ActionError::JobNotFound)?;
        if let Some(live) = live_attempt(conn, key)? {
            return Err(ActionError::InFlight {
                attempt_id: live.id,
                state: live.state,
            });
        }
        if job.status.is_terminal()
            || !fail_job(
                conn,
                &job,
                &Reason::new(format!("marked failed by support: {reason}")),
                now,
            )?
        {
            return Err(ActionError::JobFinished(get_job(conn, key)?.status));
        }
        let about = Audited::job(&job.owner_id, job_id, None);
        record_audit(conn, actor, AuditAction::FailJob, about, reason, now)?;
        Ok(get_job(conn, key)?)
    })
}

/// Support staff give up on an unknown attempt, with a reason, in the audit log.
/// The job returns to `pending` and a new attempt may start; a late result of
/// the abandoned attempt still goes through the CAS.
pub fn abandon(
    conn: &mut DbConnection,
    key: &AttemptKey,
    actor_id: &UserId,
    reason: &str,
) -> Result<Attempt, ActionError> {
    write_transaction(conn, |conn| {
        let now = Timestamp::now();
        let attempt = lock_attempt_and_job(conn, key)?.ok_or(ActionError::AttemptNotFound)?;
        if !transition(
            conn,
            &attempt,
            AttemptEvent::Abandoned,
            now,
            attempt.reason().as_ref(),
        )? {
            return Err(ActionError::NotUnknown(attempt.state));
        }
        refresh_job_status(conn, &attempt.job_key(), now)?;
        let about = Audited::job(&attempt.owner_id, &attempt.job_id, Some(&key.id));
        record_audit(
            conn,
            actor_id,
            AuditAction::AbandonAttempt,
            about,
            reason,
            now,
        )?;
        Ok(find_owned_attempt(conn, &key.id, &attempt.owner_id)?.ok_or(StoreError::NotFound)?)
    })
}
