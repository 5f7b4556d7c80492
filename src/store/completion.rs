//! Applying a provider's answer: the compare-and-swap that lets exactly one
//! attempt's answer become the job's result (a loser goes to the race log),
//! and a definite failure's failover or the job's end.

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable, Text};
use serde_json::Value;

use super::connection::{db_clock, write_transaction};
use super::ended::{job_ended, JobEnd};
use super::ledger::{record_call, Charge, LedgerEntry};
use super::prepared::KeepPrepared;
use super::reads::{attempts_of, get_job};
use super::rows::AttemptKey;
use super::rows::{Attempt, Job, RaceEntry};
use super::schema::{attempts, jobs, race_log};
use super::transitions::{
    fail_job, insert_queued_attempt, insert_waiting_attempt, lock_attempt_and_job,
    refresh_job_status, state_on_row, transition,
};
use super::{DbConnection, StoreError, StoreResult};
use crate::domain::ledger::AnswerKind;
use crate::domain::retry::{next_step, Failure, Made, NextStep};
use crate::domain::{
    canonical_json, sha256_hex, AllowedProviders, Applied, AttemptEvent, AttemptId, AttemptState,
    JobId, JobStatus, JsonText, RaceResult, Reason, ReasonKind, RetryPolicy, Timestamp, UserId,
};

/// [`settle_answer`] of a call not priced, whose usage was not reported.
pub fn complete_success(
    conn: &mut DbConnection,
    key: &AttemptKey,
    payload: &Value,
) -> StoreResult<(Applied, JobId)> {
    let settled = settle_answer(conn, key, payload, &Charge::unpriced(""))?;
    Ok((settled.applied, settled.job_id))
}

/// What recording an outcome did: what happened to the attempt, its job,
/// and the ledger row written for its call (none when the call was in the
/// ledger already, or its outcome took no row).
#[derive(Debug, Clone)]
pub struct Recorded {
    pub applied: Applied,
    pub job_id: JobId,
    pub entry: Option<LedgerEntry>,
    /// The job as a winning compare-and-swap left it (its statement returns
    /// the row on both backends): a waiter in this process answers from it
    /// without reading the job again. `None` when the answer did not win.
    pub finished: Option<Job>,
}

/// Applies a successful answer with the compare-and-swap (docs/design.md,
/// "First result wins"), and counts its call in the usage ledger at
/// `charge`, whether it won or lost. On PostgreSQL a plain win (a running
/// attempt's, for an owner with no budget and no endpoint for
/// `job.succeeded`) is one statement (`plain_win`); the rest, and SQLite's,
/// one transaction.
pub fn settle_answer(
    conn: &mut DbConnection,
    key: &AttemptKey,
    payload: &Value,
    charge: &Charge,
) -> StoreResult<Recorded> {
    let text = canonical_json(payload);
    if let DbConnection::Postgresql(pg) = conn {
        if let Some(won) =
            super::plain_win::settle_plain_win(pg, key, &text, charge, Timestamp::now())?
        {
            return Ok(Recorded {
                applied: Applied::Won,
                job_id: won.job.id.clone(),
                entry: won.entry,
                finished: Some(won.job),
            });
        }
    }
    write_transaction(conn, |conn| {
        let attempt = lock_attempt_and_job(conn, key)?.ok_or(StoreError::NotFound)?;
        let answer = Answer {
            text,
            attempt,
            charge,
            now: Timestamp::now(),
        };
        if let Some(first) = already_delivered(conn, &answer.attempt, &answer.text)? {
            return Ok(answer.recorded(Applied::Repeated(first), None));
        }
        if AttemptEvent::ProviderSucceeded
            .apply(answer.attempt.state)
            .is_err()
        {
            return discard_answer(conn, answer);
        }
        let version_read = answer.attempt.version_read.ok_or_else(|| {
            StoreError::corrupt(format!("attempt {} has a result but never started", key.id))
        })?;
        let settlement = settle_success(
            conn,
            &answer.attempt,
            version_read,
            &answer.text,
            answer.now,
        )?;
        match settlement.finished {
            Some(job) => record_win(conn, answer, job, settlement.subscribed),
            None => record_loss(conn, answer),
        }
    })
}

/// A successful answer being recorded, inside its transaction.
struct Answer<'a> {
    /// The attempt, locked with its job.
    attempt: Attempt,
    /// The answer as canonical JSON.
    text: String,
    charge: &'a Charge,
    now: Timestamp,
}

impl Answer<'_> {
    fn recorded(&self, applied: Applied, entry: Option<LedgerEntry>) -> Recorded {
        Recorded {
            applied,
            job_id: self.attempt.job_id.clone(),
            entry,
            finished: None,
        }
    }

    /// Counts the call in the usage ledger as `kind` (once: a call already
    /// in the ledger is not counted again).
    fn record_call(
        &self,
        conn: &mut DbConnection,
        kind: AnswerKind,
        task: Option<&str>,
    ) -> StoreResult<Option<LedgerEntry>> {
        record_call(
            conn,
            &self.attempt,
            kind,
            self.text.len(),
            self.charge,
            task,
            self.now,
        )
    }
}

/// An answer the attempt's state takes no more (it answered already, or
/// was recorded failed): into the race log with why, and billed all the
/// same.
fn discard_answer(conn: &mut DbConnection, answer: Answer<'_>) -> StoreResult<Recorded> {
    let attempt = &answer.attempt;
    let job = get_job(conn, &attempt.job_key())?;
    let reason = match (attempt.state, attempt.reason()) {
        (AttemptState::Succeeded, _) => {
            "a repeated answer: the attempt had already answered".to_owned()
        }
        (AttemptState::Failed, Some(error)) => {
            format!("the attempt had already been recorded as failed ({error})")
        }
        (state, _) => format!("the attempt was {state} and takes no answer"),
    };
    log_race(conn, attempt, &job, &answer.text, reason, answer.now)?;
    let entry = answer.record_call(conn, AnswerKind::Lost, Some(&job.task))?;
    if let Some(entry) = &entry {
        super::budgets::spend(conn, &attempt.job_key(), entry.spent(), answer.now)?;
    }
    Ok(answer.recorded(Applied::Discarded(attempt.state), entry))
}

/// The answer that won its job: its call in the ledger, and the job's end
/// (its `job.succeeded` events, its reservation back with the call's cost)
/// in the same transaction.
fn record_win(
    conn: &mut DbConnection,
    answer: Answer<'_>,
    finished: Job,
    subscribed: Option<bool>,
) -> StoreResult<Recorded> {
    let attempt = &answer.attempt;
    let entry = answer.record_call(conn, AnswerKind::Won, Some(&finished.task))?;
    let spent = entry.as_ref().map(LedgerEntry::spent).unwrap_or_default();
    job_ended(
        conn,
        &attempt.job_key(),
        JobEnd::Succeeded { spent, subscribed },
        answer.now,
    )?;
    // A live attempt is the job's only one (the one-live-attempt index);
    // only an answer on a non-live attempt (abandoned, say) can find a
    // queued successor to close.
    if !AttemptState::LIVE.contains(&attempt.state) {
        skip_queued_attempts(
            conn,
            &attempt.job_id,
            &attempt.owner_id,
            "not sent: the job had already finished",
            answer.now,
        )?;
    }
    Ok(Recorded {
        finished: Some(finished),
        ..answer.recorded(Applied::Won, entry)
    })
}

/// An answer that came after its job's outcome was decided: billed, and
/// into the race log with who won.
fn record_loss(conn: &mut DbConnection, answer: Answer<'_>) -> StoreResult<Recorded> {
    let attempt = &answer.attempt;
    let entry = answer.record_call(conn, AnswerKind::Lost, None)?;
    let spent = entry.as_ref().map(LedgerEntry::spent).unwrap_or_default();
    super::budgets::spend(conn, &attempt.job_key(), spent, answer.now)?;
    let job = get_job(conn, &attempt.job_key())?;
    let reason = match (&job.completed_by, job.status) {
        (Some(winner), _) => format!("attempt {winner} had already completed the job"),
        (None, JobStatus::Failed) => "the job had already been finalized as failed".to_owned(),
        (None, JobStatus::Cancelled) => "the job had been cancelled by its owner".to_owned(),
        (None, _) => "the job's version changed since the attempt started".to_owned(),
    };
    log_race(conn, attempt, &job, &answer.text, reason, answer.now)?;
    Ok(answer.recorded(
        Applied::Lost {
            winner: job.completed_by,
        },
        entry,
    ))
}

/// Whether this attempt already delivered exactly this answer (a callback
/// repeated, the same answer by callback and by the call): what the first
/// delivery did, or `None`. A repeat writes nothing, so replaying a signed
/// callback cannot grow the race log (or keep its job from being pruned).
fn already_delivered(
    conn: &mut DbConnection,
    attempt: &Attempt,
    payload_text: &str,
) -> StoreResult<Option<&'static str>> {
    if attempt.state.is_live() {
        return Ok(None);
    }
    let first = match (attempt.state, attempt.outcome) {
        (AttemptState::Succeeded, Some(RaceResult::Won)) => "won",
        (AttemptState::Succeeded, Some(RaceResult::Lost)) => "lost",
        _ => "ignored",
    };
    if attempt.outcome == Some(RaceResult::Won) {
        let job = get_job(conn, &attempt.job_key())?;
        if job.completed_by.as_ref() == Some(&attempt.id)
            && job.result.as_ref().map(|r| r.as_str()) == Some(payload_text)
        {
            return Ok(Some(first));
        }
    }
    let logged = race_log::table
        .filter(race_log::owner_id.eq(&attempt.owner_id))
        .filter(race_log::losing_attempt_id.eq(&attempt.id))
        .filter(race_log::payload_sha256.eq(sha256_hex(payload_text.as_bytes())))
        .select(race_log::id)
        .first::<String>(conn)
        .optional()?;
    Ok(logged.map(|_| first))
}

/// Writes the race-log row of an answer that was not applied.
fn log_race(
    conn: &mut DbConnection,
    attempt: &Attempt,
    job: &Job,
    payload_text: &str,
    reason: String,
    now: Timestamp,
) -> StoreResult<()> {
    let entry = RaceEntry {
        id: uuid::Uuid::now_v7().to_string(),
        job_id: attempt.job_id.clone(),
        owner_id: attempt.owner_id.clone(),
        losing_attempt_id: attempt.id.clone(),
        winning_attempt_id: job.completed_by.clone(),
        reason,
        // An attempt that was never claimed read no version: the job's.
        version_read: attempt.version_read.unwrap_or(job.version),
        version_found: job.version,
        provider: attempt.provider.clone(),
        payload_sha256: sha256_hex(payload_text.as_bytes()),
        loser_started_at: attempt.started_at,
        lost_at: now,
    };
    diesel::insert_into(race_log::table)
        .values(&entry)
        .execute(conn)?;
    Ok(())
}

/// What the compare-and-swap decided.
struct Settlement {
    /// The job as the winning update left it, or `None` when the answer
    /// lost.
    finished: Option<Job>,
    /// Whether the owner has an endpoint for `job.succeeded`, when the
    /// statement found out (PostgreSQL); `None`: not asked.
    subscribed: Option<bool>,
}

/// Names [`settle_success`]'s transition of the attempt (SQLite) in a
/// connection's statement cache: its text is one (the event's starting
/// states are a fixed list), so a run neither writes it out nor hashes it.
struct SettleAttemptSqlite;

/// Names [`cas_job_result`]'s statement in a connection's statement cache
/// (one text: every value is a bind).
struct CasJobResultSqlite;

/// The single conditional statement that decides the winner.
/// The compare-and-swap and the attempt's transition with its place in the
/// race, under the job's lock.
fn settle_success(
    conn: &mut DbConnection,
    attempt: &Attempt,
    version_read: i64,
    payload: &str,
    now: Timestamp,
) -> StoreResult<Settlement> {
    let conn = match conn {
        DbConnection::Postgresql(pg) => {
            return settle_success_in_one_statement(pg, attempt, version_read, payload, now);
        }
        DbConnection::Sqlite(sqlite) => sqlite,
    };
    let finished = cas_job_result(
        conn,
        &attempt.job_id,
        &attempt.owner_id,
        version_read,
        &attempt.id,
        payload,
        now,
    )?;
    let result = if finished.is_some() {
        RaceResult::Won
    } else {
        RaceResult::Lost
    };
    // The attempt's transition and its place in the race, in one guarded
    // statement.
    diesel::update(
        attempts::table
            .filter(attempts::id.eq(&attempt.id))
            .filter(attempts::owner_id.eq(&attempt.owner_id))
            .filter(state_on_row(AttemptEvent::ProviderSucceeded.from_states())),
    )
    .set((
        attempts::state.eq(AttemptEvent::ProviderSucceeded.target()),
        attempts::finished_at.eq(Some(now)),
        attempts::lease_expires_at.eq(None::<i64>),
        attempts::outcome.eq(result),
    ))
    .keep_prepared_as::<SettleAttemptSqlite>()
    .run_on_sqlite(conn)?;
    Ok(Settlement {
        finished,
        subscribed: None,
    })
}

/// What the one-statement compare-and-swap returns: the attempt's place in
/// the race and, when it won, every column of its job as the update left it
/// (each read from the `cas` step, so all are NULL when the answer lost);
/// and whether the owner has an endpoint for `job.succeeded`.
#[derive(QueryableByName)]
struct Settled {
    #[diesel(sql_type = Nullable<Text>)]
    outcome: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    id: Option<JobId>,
    #[diesel(sql_type = Nullable<Text>)]
    owner_id: Option<UserId>,
    #[diesel(sql_type = Nullable<Text>)]
    idempotency_key: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    task: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    provider: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    requested_provider: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    input: Option<JsonText>,
    #[diesel(sql_type = Nullable<Text>)]
    params: Option<JsonText>,
    #[diesel(sql_type = Nullable<Text>)]
    fingerprint: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    status: Option<JobStatus>,
    #[diesel(sql_type = Nullable<BigInt>)]
    version: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    result: Option<JsonText>,
    #[diesel(sql_type = Nullable<Text>)]
    completed_by: Option<AttemptId>,
    #[diesel(sql_type = Nullable<Text>)]
    failure_reason: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    created_at: Option<Timestamp>,
    #[diesel(sql_type = Nullable<BigInt>)]
    updated_at: Option<Timestamp>,
    #[diesel(sql_type = Nullable<Text>)]
    failure_kind: Option<ReasonKind>,
    #[diesel(sql_type = Nullable<Text>)]
    failure_detail: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    trace_context: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    subscribed: bool,
}

impl Settled {
    /// The job as the winning update left it; `None` when the answer lost
    /// (the `cas` step changed no row, so its columns came back NULL).
    fn into_job(self) -> Option<Job> {
        Some(Job {
            id: self.id?,
            owner_id: self.owner_id?,
            idempotency_key: self.idempotency_key?,
            task: self.task?,
            provider: self.provider?,
            requested_provider: self.requested_provider,
            input: self.input?,
            params: self.params?,
            fingerprint: self.fingerprint?,
            status: self.status?,
            version: self.version?,
            result: self.result,
            completed_by: self.completed_by,
            failure_reason: self.failure_reason,
            created_at: self.created_at?,
            updated_at: self.updated_at?,
            failure_kind: self.failure_kind,
            failure_detail: self.failure_detail,
            trace_context: self.trace_context,
        })
    }
}

/// The job's columns, in the order [`Settled`] names them.
const JOB_COLUMNS: [&str; 19] = [
    "id",
    "owner_id",
    "idempotency_key",
    "task",
    "provider",
    "requested_provider",
    "input",
    "params",
    "fingerprint",
    "status",
    "version",
    "result",
    "completed_by",
    "failure_reason",
    "created_at",
    "updated_at",
    "failure_kind",
    "failure_detail",
    "trace_context",
];

/// Names [`SETTLE_IN_ONE_STATEMENT`] in a connection's statement cache.
struct SettleInOneStatement;

/// [`settle_success_in_one_statement`]'s text, written once.
static SETTLE_IN_ONE_STATEMENT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let job_columns = JOB_COLUMNS
        .iter()
        .map(|column| format!("(SELECT {column} FROM cas) AS {column}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "WITH cas AS (
           UPDATE jobs SET result = $1, completed_by = $2, status = '{succeeded}',
                           version = version + 1, updated_at = $3
           WHERE id = $4 AND owner_id = $5 AND version = $6 AND completed_by IS NULL
           RETURNING *
         )
         UPDATE attempts SET state = '{target}', finished_at = $3, lease_expires_at = NULL,
                             outcome = CASE WHEN EXISTS (SELECT 1 FROM cas)
                                            THEN '{won}' ELSE '{lost}' END
         WHERE id = $2 AND owner_id = $5 AND state = ANY($7)
         RETURNING outcome, {job_columns}, {subscribed} AS subscribed",
        subscribed = super::webhooks::any_endpoint_subscribed_sql("$5", "$8"),
        succeeded = JobStatus::Succeeded.as_str(),
        target = AttemptEvent::ProviderSucceeded.target().as_str(),
        won = RaceResult::Won.as_str(),
        lost = RaceResult::Lost.as_str(),
    )
});

/// PostgreSQL: the same two guarded updates as one statement (the
/// versioned update of the job in a data-modifying `WITH`, the attempt's
/// transition taking `won` or `lost` from whether it changed a row): one
/// round trip fewer per answer. The winner's job comes back with it, each
/// column by a scalar subquery on `cas` (the statement keeps the shape that
/// names its owner in both steps), so a waiter answers without reading it.
/// It also says whether the owner has an endpoint for `job.succeeded`, so
/// that a winner with none skips the webhook look-up's round trip.
fn settle_success_in_one_statement(
    conn: &mut diesel::PgConnection,
    attempt: &Attempt,
    version_read: i64,
    payload: &str,
    now: Timestamp,
) -> StoreResult<Settlement> {
    use diesel::sql_types::Array;
    let from_states: Vec<&str> = AttemptEvent::ProviderSucceeded
        .from_states()
        .iter()
        .map(|state| state.as_str())
        .collect();
    let settled: Vec<Settled> = diesel::sql_query(SETTLE_IN_ONE_STATEMENT.as_str())
        .bind::<Text, _>(payload)
        .bind::<Text, _>(attempt.id.as_str())
        .bind::<BigInt, _>(now)
        .bind::<Text, _>(attempt.job_id.as_str())
        .bind::<Text, _>(attempt.owner_id.as_str())
        .bind::<BigInt, _>(version_read)
        .bind::<Array<Text>, _>(from_states)
        .bind::<Text, _>(crate::domain::webhook::EventKind::JobSucceeded.as_str())
        .keep_prepared_as::<SettleInOneStatement>()
        .load(conn)?;
    let mut rows = settled.into_iter();
    match (rows.next(), rows.next()) {
        (Some(row), None) if row.outcome.is_some() => {
            let won = row.outcome.as_deref() == Some(RaceResult::Won.as_str());
            let subscribed = Some(row.subscribed);
            let finished = row.into_job();
            if won != finished.is_some() {
                return Err(StoreError::corrupt(format!(
                    "attempt {} won without its job's row, or lost with it",
                    attempt.id
                )));
            }
            Ok(Settlement {
                finished,
                subscribed,
            })
        }
        // The attempt was read under its job's lock in a state that takes an
        // answer; anything else rolls the transaction back.
        _ => Err(StoreError::corrupt(format!(
            "attempt {} changed under its job's lock",
            attempt.id
        ))),
    }
}

/// SQLite's compare-and-swap. It keeps its `RETURNING` (see
/// `store::prepared`): a waiter answers from the row it returns, and
/// setting `completed_by`, a foreign key, makes SQLite keep a statement
/// journal for it all the same.
fn cas_job_result(
    conn: &mut diesel::SqliteConnection,
    job_id: &JobId,
    owner_id: &UserId,
    version_read: i64,
    attempt_id: &AttemptId,
    payload: &str,
    now: Timestamp,
) -> QueryResult<Option<Job>> {
    diesel::update(
        jobs::table
            .filter(jobs::id.eq(job_id))
            .filter(jobs::owner_id.eq(owner_id))
            .filter(jobs::version.eq(version_read))
            .filter(jobs::completed_by.is_null()),
    )
    .set((
        jobs::result.eq(JsonText::parse(payload).expect("canonical JSON parses")),
        jobs::completed_by.eq(attempt_id),
        jobs::status.eq(JobStatus::Succeeded),
        jobs::version.eq(jobs::version + 1),
        jobs::updated_at.eq(now),
    ))
    .returning(Job::as_returning())
    .keep_prepared_as::<CasJobResultSqlite>()
    .get_result(conn)
    .optional()
}

/// Once a job is terminal, a queued attempt must never be sent: each is
/// closed unsent, with `note` saying why.
pub(super) fn skip_queued_attempts(
    conn: &mut DbConnection,
    job_id: &JobId,
    owner_id: &UserId,
    note: &str,
    now: Timestamp,
) -> QueryResult<usize> {
    diesel::update(
        attempts::table
            .filter(attempts::job_id.eq(job_id))
            .filter(attempts::owner_id.eq(owner_id))
            .filter(attempts::state.eq_any(AttemptEvent::Skipped.from_states())),
    )
    .set((
        attempts::state.eq(AttemptEvent::Skipped.target()),
        attempts::finished_at.eq(now),
        attempts::lease_expires_at.eq(None::<i64>),
        attempts::error_kind.eq(ReasonKind::Other),
        attempts::error.eq(note),
        attempts::error_detail.eq(None::<String>),
    ))
    .execute(conn)
}

/// What may follow a definite failure: where the gate allows the job to
/// go, and the task's retry policy and budget.
#[derive(Debug, Clone)]
pub struct FailurePlan {
    /// The job's primary and qualified fallbacks; `skipped` names the
    /// providers the gate kept out, for the failure reason.
    pub gate: AllowedProviders,
    pub policy: RetryPolicy,
    /// Uniform in [0, 1): the retry's jitter.
    pub jitter: f64,
}

/// [`record_failure`] of a call not priced, whose usage was not reported.
pub fn complete_failure(
    conn: &mut DbConnection,
    key: &AttemptKey,
    error: &Reason,
    failure: Failure,
    plan: &FailurePlan,
) -> StoreResult<Applied> {
    Ok(record_failure(conn, key, error, failure, plan, &Charge::unpriced(""))?.applied)
}

/// Applies a definite failure, then decides what follows by
/// `domain::retry::next_step`: a new attempt on the next provider of the
/// gated order, a retry on the same provider once its wait is over (a
/// queued attempt with `not_before`, by the database's clock), or the job
/// fails with the reason. The call is counted in the usage ledger (a
/// refusal in which nothing happened as `rate_limited`).
pub fn record_failure(
    conn: &mut DbConnection,
    key: &AttemptKey,
    error: &Reason,
    failure: Failure,
    plan: &FailurePlan,
    charge: &Charge,
) -> StoreResult<Recorded> {
    write_transaction(conn, |conn| {
        let now = Timestamp::now();
        let attempt: Attempt = lock_attempt_and_job(conn, key)?.ok_or(StoreError::NotFound)?;
        let job_id = attempt.job_id.clone();
        if AttemptEvent::ProviderFailed.apply(attempt.state).is_err() {
            return Ok(Recorded {
                applied: Applied::Ignored(attempt.state),
                job_id,
                entry: None,
                finished: None,
            });
        }
        transition(
            conn,
            &attempt,
            AttemptEvent::ProviderFailed,
            now,
            Some(error),
        )?;
        let kind = match failure {
            Failure::NothingHappened { .. } => AnswerKind::RateLimited,
            Failure::Definite | Failure::PartlyDelivered => AnswerKind::Failed,
        };
        let job = get_job(conn, &attempt.job_key())?;
        let entry = record_call(conn, &attempt, kind, 0, charge, Some(&job.task), now)?;
        if let Some(entry) = &entry {
            super::budgets::spend(conn, &attempt.job_key(), entry.spent(), now)?;
        }
        let applied = decide_after_failure(conn, &attempt, &job, error, failure, plan, now)?;
        Ok(Recorded {
            applied,
            job_id,
            entry,
            finished: None,
        })
    })
}

/// What follows a recorded failure of `attempt`, whose `job` was read
/// after it.
fn decide_after_failure(
    conn: &mut DbConnection,
    attempt: &Attempt,
    job: &Job,
    error: &Reason,
    failure: Failure,
    plan: &FailurePlan,
    now: Timestamp,
) -> StoreResult<Applied> {
    // An operator already decided what follows an abandoned attempt.
    if attempt.state == AttemptState::Abandoned || job.status.is_terminal() {
        return Ok(Applied::Recorded);
    }
    let attempts = attempts_of(conn, &job.key())?;
    let made: Vec<Made> = attempts
        .iter()
        .map(|a| Made {
            provider: &a.provider,
            waited_ms: a.waited_ms(),
        })
        .collect();
    let order: Vec<&str> = plan.gate.allowed.iter().map(String::as_str).collect();
    let number = attempts.len() as i32 + 1;
    let step = next_step(
        &plan.policy,
        &order,
        &made,
        &attempt.provider,
        failure,
        plan.jitter,
    );
    match step {
        NextStep::FailOver(provider) => {
            let next = insert_queued_attempt(conn, &job.id, &job.owner_id, number, provider, now)?;
            refresh_job_status(conn, &job.key(), now)?;
            Ok(Applied::FailedOver {
                attempt_id: next.id,
                provider: provider.to_owned(),
            })
        }
        NextStep::RetryLater { provider, wait_ms } => {
            // One clock for the wait and for every claim that judges it.
            let db_now = db_clock(conn)?;
            let not_before = db_now + wait_ms;
            let next = insert_waiting_attempt(
                conn,
                &job.id,
                &job.owner_id,
                number,
                provider,
                db_now,
                Some(not_before),
            )?;
            refresh_job_status(conn, &job.key(), now)?;
            Ok(Applied::RetryScheduled {
                attempt_id: next.id,
                provider: provider.to_owned(),
                not_before,
            })
        }
        NextStep::GiveUp(give_up) => {
            // The job's reason is for its owner: the provider's own text
            // stays on the attempt, for support.
            let tried: Vec<String> = attempts.iter().map(|a| a.provider.clone()).collect();
            let reason = give_up.reason(&tried, &plan.gate.skipped, &error.for_owner());
            if fail_job(conn, job, &Reason::new(reason.as_str()), now)? {
                Ok(Applied::JobFailed { reason })
            } else {
                Ok(Applied::Recorded)
            }
        }
    }
}
