//! PostgreSQL's most common answer in one statement: a running attempt's
//! answer that wins its job, for an owner with no budget and no endpoint
//! for `job.succeeded`. The job's lock, the attempt's transition, the
//! compare-and-swap and the call's ledger row are one autocommitted
//! statement instead of a transaction of seven round trips.
//!
//! Anything else (the answer loses, the attempt is not `running`, the owner
//! has a budget or a subscribed endpoint, the call is priced on estimated
//! tokens) finds the statement changing nothing, and
//! [`super::completion::settle_answer`]'s transaction decides it as before.

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Nullable, Text};

use super::ledger::{estimated_tokens, estimated_tokens_sql, tokens, Charge, LedgerEntry};
use super::prepared::KeepPrepared;
use super::rows::{AttemptKey, Job};
use super::StoreResult;
use crate::domain::ledger::{is_late, AnswerKind};
use crate::domain::webhook::EventKind;
use crate::domain::{AttemptEvent, AttemptState, JobStatus, RaceResult, Timestamp};

/// What the statement returns when the answer won: the job as the update
/// left it, the attempt's provider and the prompt tokens its ledger row
/// took (`NULL`: the call was in the ledger already).
#[derive(QueryableByName)]
struct Won {
    #[diesel(embed)]
    job: Job,
    #[diesel(sql_type = Text)]
    attempt_provider: String,
    #[diesel(sql_type = Nullable<BigInt>)]
    ledger_prompt_tokens: Option<i64>,
}

/// Names [`STATEMENT`] in a connection's statement cache.
struct PlainWinStatement;

/// The statement, written once. Its steps, in order:
/// - `j` locks the attempt's job, only if the job is still at the version
///   the attempt read and nobody completed it, and its owner has no budget
///   row and no endpoint for `job.succeeded` (a locked row's conditions are
///   checked again on its newest version);
/// - `att` moves the attempt from `running` to `succeeded`, `won`, only if
///   `j` locked the job (the attempt's newest version is checked too; the
///   state on the row its key finds, `transitions::state_on_row_sql`);
/// - `cas` is the versioned update of the job, only if `att` moved;
/// - `ledger` counts the call, only if `cas` changed the job; a prompt of
///   unreported size (`$7` NULL) is estimated from the job's input.
///
/// Each step depends on the one before, so it all happens or nothing does.
static STATEMENT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH j AS (
           SELECT jobs.id FROM jobs
           WHERE jobs.owner_id = $4 AND jobs.completed_by IS NULL
             AND (jobs.id, jobs.version) = (SELECT a.job_id, a.version_read FROM attempts a
                                            WHERE a.id = $2 AND a.owner_id = $4)
             AND NOT EXISTS (SELECT 1 FROM budgets WHERE budgets.owner_id = $4)
             AND NOT {subscribed}
           FOR UPDATE
         ), att AS (
           UPDATE attempts SET state = '{succeeded_attempt}', finished_at = $3,
                               lease_expires_at = NULL, outcome = '{won}'
           WHERE id = $2 AND owner_id = $4 AND {running}
             AND job_id = (SELECT id FROM j)
           RETURNING provider
         ), cas AS (
           UPDATE jobs SET result = $1, completed_by = $2, status = '{succeeded}',
                           version = version + 1, updated_at = $3
           WHERE owner_id = $4 AND id = (SELECT id FROM j) AND EXISTS (SELECT 1 FROM att)
           RETURNING *
         ), ledger AS (
           INSERT INTO usage_ledger (attempt_id, owner_id, job_id, task, provider, model, kind,
                                     late, prompt_tokens, completion_tokens, cached_tokens,
                                     usage_source, cost_micros, price_effective_from, currency,
                                     recorded_at)
           SELECT $2, $4, cas.id, cas.task, att.provider, $6, '{won_call}', $14,
                  COALESCE($7, {estimate}), $8, $9, $10, $11, $12, $13, $3
           FROM cas, att
           ON CONFLICT (attempt_id, owner_id) DO NOTHING
           RETURNING prompt_tokens
         )
         SELECT cas.id, cas.owner_id, cas.idempotency_key, cas.task, cas.provider,
                cas.requested_provider, cas.input, cas.params, cas.fingerprint, cas.status,
                cas.version, cas.result, cas.completed_by, cas.failure_reason, cas.created_at,
                cas.updated_at, cas.failure_kind, cas.failure_detail, cas.trace_context,
                att.provider AS attempt_provider,
                (SELECT prompt_tokens FROM ledger) AS ledger_prompt_tokens
         FROM cas, att",
        subscribed = super::webhooks::any_endpoint_subscribed_sql("$4", "$5"),
        estimate = estimated_tokens_sql("octet_length(cas.input)"),
        succeeded_attempt = AttemptEvent::ProviderSucceeded.target().as_str(),
        running = super::transitions::state_on_row_sql(&[AttemptState::Running]),
        won = RaceResult::Won.as_str(),
        succeeded = JobStatus::Succeeded.as_str(),
        won_call = AnswerKind::Won.as_str(),
    )
});

/// The ledger values the caller knows before the statement: all but the
/// prompt's tokens when onejob estimates them (`None`). `None` as a whole
/// when the cost depends on an estimate the statement makes (a priced call
/// whose usage was not reported): such a call takes the transaction.
struct KnownCharge {
    prompt_tokens: Option<i64>,
    completion_tokens: i64,
    cached_tokens: i64,
    usage: crate::domain::UsageSource,
    cost_micros: Option<i64>,
    price_effective_from: Option<Timestamp>,
    currency: Option<String>,
}

fn known_charge(charge: &Charge, answer_bytes: usize) -> Option<KnownCharge> {
    match (&charge.usage, &charge.price) {
        (Some(usage), price) => Some(KnownCharge {
            prompt_tokens: Some(tokens(usage.prompt_tokens)),
            completion_tokens: tokens(usage.completion_tokens),
            cached_tokens: tokens(usage.cached_tokens),
            usage: usage.source,
            cost_micros: price.as_ref().map(|p| p.cost_micros(usage)),
            price_effective_from: price.as_ref().map(|p| p.effective_from),
            currency: price.as_ref().map(|_| charge.currency.clone()),
        }),
        (None, None) => Some(KnownCharge {
            prompt_tokens: None,
            completion_tokens: tokens(estimated_tokens(answer_bytes)),
            cached_tokens: 0,
            usage: crate::domain::UsageSource::Estimated,
            cost_micros: None,
            price_effective_from: None,
            currency: None,
        }),
        (None, Some(_)) => None,
    }
}

/// What a plain win recorded: the job as it left it, and the call's ledger
/// row (`None`: the call was in the ledger already).
pub struct PlainWin {
    pub job: Job,
    pub entry: Option<LedgerEntry>,
}

/// Settles `key`'s answer (`payload`, canonical JSON) in one statement if
/// it is a plain win; `None` when the statement changed nothing and the
/// transaction must decide.
pub fn settle_plain_win(
    conn: &mut diesel::PgConnection,
    key: &AttemptKey,
    payload: &str,
    charge: &Charge,
    now: Timestamp,
) -> StoreResult<Option<PlainWin>> {
    let Some(known) = known_charge(charge, payload.len()) else {
        return Ok(None);
    };
    let late = is_late(AttemptState::Running);
    let won: Option<Won> = diesel::sql_query(STATEMENT.as_str())
        .bind::<Text, _>(payload)
        .bind::<Text, _>(key.id.as_str())
        .bind::<BigInt, _>(now)
        .bind::<Text, _>(key.owner_id.as_str())
        .bind::<Text, _>(EventKind::JobSucceeded.as_str())
        .bind::<Text, _>(&charge.model)
        .bind::<Nullable<BigInt>, _>(known.prompt_tokens)
        .bind::<BigInt, _>(known.completion_tokens)
        .bind::<BigInt, _>(known.cached_tokens)
        .bind::<Text, _>(known.usage.as_str())
        .bind::<Nullable<BigInt>, _>(known.cost_micros)
        .bind::<Nullable<BigInt>, _>(known.price_effective_from)
        .bind::<Nullable<Text>, _>(&known.currency)
        .bind::<Bool, _>(late)
        .keep_prepared_as::<PlainWinStatement>()
        .get_result(conn)
        .optional()?;
    let Some(won) = won else {
        return Ok(None);
    };
    let Won {
        job,
        attempt_provider: provider,
        ledger_prompt_tokens,
    } = won;
    let entry = ledger_prompt_tokens.map(|prompt_tokens| LedgerEntry {
        attempt_id: key.id.clone(),
        owner_id: key.owner_id.clone(),
        job_id: job.id.clone(),
        task: job.task.clone(),
        provider,
        model: charge.model.clone(),
        kind: AnswerKind::Won.as_str().to_owned(),
        late,
        prompt_tokens,
        completion_tokens: known.completion_tokens,
        cached_tokens: known.cached_tokens,
        usage_source: known.usage,
        cost_micros: known.cost_micros,
        price_effective_from: known.price_effective_from,
        currency: known.currency,
        recorded_at: now,
    });
    Ok(Some(PlainWin { job, entry }))
}
