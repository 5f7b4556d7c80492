//! The usage ledger (docs/design.md, "Usage, prices and budgets"): one row
//! per provider call that answered, written in the transaction that
//! records the call's outcome, so the compare-and-swap that decides the job
//! also counts the call, once.

use diesel::prelude::*;

use super::connection::{per_backend, write_transaction};
use super::prepared::KeepPrepared;
use super::rows::Attempt;
use super::schema::{jobs, usage_ledger, usage_tallies};
use super::{DbConnection, StoreError, StoreResult};
use crate::domain::ledger::{is_late, AnswerKind, Price};
use crate::domain::{AttemptId, JobId, Timestamp, Usage, UsageSource, UserId};

/// What the caller knows of a call's cost before its outcome is recorded:
/// the tokens the provider reported (`None`: it did not say, and onejob
/// estimates them), the model, and the price in force now (`None`: the
/// call is not priced).
#[derive(Debug, Clone, PartialEq)]
pub struct Charge {
    pub usage: Option<Usage>,
    pub model: String,
    pub price: Option<Price>,
    pub currency: String,
}

impl Charge {
    /// A call of `model` with no price and no reported usage.
    pub fn unpriced(model: impl Into<String>) -> Self {
        Self {
            usage: None,
            model: model.into(),
            price: None,
            currency: String::new(),
        }
    }
}

/// A ledger row. Inserted with every column, `None` as NULL (the nullable
/// columns have no other default), so that the insert has one text.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable, Insertable)]
#[diesel(table_name = usage_ledger, treat_none_as_default_value = false)]
pub struct LedgerEntry {
    pub attempt_id: AttemptId,
    pub owner_id: UserId,
    pub job_id: JobId,
    pub task: String,
    pub provider: String,
    pub model: String,
    pub kind: String,
    pub late: bool,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub cached_tokens: i64,
    pub usage_source: UsageSource,
    pub cost_micros: Option<i64>,
    pub price_effective_from: Option<Timestamp>,
    pub currency: Option<String>,
    pub recorded_at: Timestamp,
}

impl LedgerEntry {
    pub fn kind(&self) -> Option<AnswerKind> {
        AnswerKind::parse(&self.kind)
    }

    pub fn tokens(&self) -> i64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }
}

/// A token count as the ledger stores it.
pub(super) fn tokens(count: u64) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// Bytes a token is taken to hold when the provider did not say.
const BYTES_PER_TOKEN: usize = 3;

/// Tokens a text of `bytes` bytes is estimated to take when the provider
/// did not say: one per three bytes, as the context check counts them.
pub fn estimated_tokens(bytes: usize) -> u64 {
    bytes.div_ceil(BYTES_PER_TOKEN) as u64
}

/// [`estimated_tokens`] in SQL, of `bytes`, an SQL expression counting
/// bytes (`octet_length(…)`), for a statement that estimates what it
/// alone reads.
pub(super) fn estimated_tokens_sql(bytes: &str) -> String {
    format!("((({bytes}) + {n} - 1) / {n})", n = BYTES_PER_TOKEN)
}

/// Names [`record_call`]'s insert in a connection's statement cache.
struct RecordCall;

/// Records the call of `attempt` (as it was before this outcome) that
/// answered as `kind`, with `answer_bytes` of answer, for a job of `task`
/// (read from the job when not given): the ledger row. Nothing if the
/// attempt's call is in the ledger already (its news came twice). Returns
/// the row written, whose cost the caller adds to the owner's budget
/// ([`super::budgets::settle`]).
pub(super) fn record_call(
    conn: &mut DbConnection,
    attempt: &Attempt,
    kind: AnswerKind,
    answer_bytes: usize,
    charge: &Charge,
    task: Option<&str>,
    now: Timestamp,
) -> StoreResult<Option<LedgerEntry>> {
    let estimates = charge.usage.is_none() && matches!(kind, AnswerKind::Won | AnswerKind::Lost);
    let (task, input): (String, Option<String>) = if !estimates {
        let task = match task {
            Some(task) => task.to_owned(),
            None => per_backend!(conn, |c| jobs::table
                .filter(jobs::id.eq(&attempt.job_id))
                .filter(jobs::owner_id.eq(&attempt.owner_id))
                .select(jobs::task)
                .first(c))?,
        };
        (task, None)
    } else {
        let (task, input): (String, String) = per_backend!(conn, |c| jobs::table
            .filter(jobs::id.eq(&attempt.job_id))
            .filter(jobs::owner_id.eq(&attempt.owner_id))
            .select((jobs::task, jobs::input))
            .first(c))?;
        (task, Some(input))
    };
    let usage = match (charge.usage, kind, input) {
        (Some(usage), _, _) => usage,
        // A refusal, or an error answer that did not say what it used: the
        // provider did no work that it reported, so none is charged.
        (None, AnswerKind::RateLimited | AnswerKind::Failed, _) => Usage::none(),
        (None, _, input) => Usage::estimated(
            estimated_tokens(input.map_or(0, |i| i.len())),
            estimated_tokens(answer_bytes),
        ),
    };
    let price = charge.price.as_ref();
    let entry = LedgerEntry {
        attempt_id: attempt.id.clone(),
        owner_id: attempt.owner_id.clone(),
        job_id: attempt.job_id.clone(),
        task,
        provider: attempt.provider.clone(),
        model: charge.model.clone(),
        kind: kind.as_str().to_owned(),
        late: is_late(attempt.state),
        prompt_tokens: tokens(usage.prompt_tokens),
        completion_tokens: tokens(usage.completion_tokens),
        cached_tokens: tokens(usage.cached_tokens),
        usage_source: usage.source,
        cost_micros: price.map(|p| p.cost_micros(&usage)),
        price_effective_from: price.map(|p| p.effective_from),
        currency: price.map(|_| charge.currency.clone()),
        recorded_at: now,
    };
    let key = (usage_ledger::attempt_id, usage_ledger::owner_id);
    let insert = diesel::insert_into(usage_ledger::table)
        .values(&entry)
        .on_conflict(key)
        .do_nothing();
    let inserted = match conn {
        DbConnection::Postgresql(c) => insert
            .returning(usage_ledger::attempt_id)
            .keep_prepared_as::<RecordCall>()
            .load::<String>(c)?
            .len(),
        DbConnection::Sqlite(c) => insert.keep_prepared_as::<RecordCall>().count_on_sqlite(c)?,
    };
    Ok((inserted > 0).then_some(entry))
}

/// The ledger rows of one job's attempts.
pub fn entries_of_job(
    conn: &mut DbConnection,
    job_id: &JobId,
    owner_id: &UserId,
) -> StoreResult<Vec<LedgerEntry>> {
    Ok(usage_ledger::table
        .filter(usage_ledger::job_id.eq(job_id))
        .filter(usage_ledger::owner_id.eq(owner_id))
        .order(usage_ledger::recorded_at.asc())
        .select(LedgerEntry::as_select())
        .load(conn)?)
}

/// A count of duplicates absorbed or requests never sent, for one owner,
/// day, task, provider and job (`job_id` empty for no job).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Queryable, Selectable, Insertable)]
#[diesel(table_name = usage_tallies)]
pub struct Tally {
    pub owner_id: UserId,
    pub day: Timestamp,
    pub task: String,
    pub provider: String,
    pub job_id: String,
    pub kind: String,
    pub count: i64,
}

/// Adds counts to the tallies, inside the caller's transaction: each row's
/// count is added to the stored one, or inserted. The rows are written in
/// key order, so two transactions adding to the same rows lock them in the
/// same order and cannot deadlock.
pub fn add_tallies(conn: &mut DbConnection, tallies: &[Tally]) -> StoreResult<()> {
    use diesel::upsert::excluded;
    use usage_tallies::dsl as t;
    let mut ordered: Vec<&Tally> = tallies.iter().collect();
    ordered.sort_by(|a, b| a.key().cmp(&b.key()));
    for tally in ordered {
        let key = (
            t::owner_id,
            t::day,
            t::task,
            t::provider,
            t::job_id,
            t::kind,
        );
        per_backend!(conn, |c| diesel::insert_into(t::usage_tallies)
            .values(tally)
            .on_conflict(key)
            .do_update()
            .set(t::count.eq(t::count + excluded(t::count)))
            .execute(c))?;
    }
    Ok(())
}

/// Adds a process's counts to the tallies: one transaction per owner, the
/// owners in order (on Citus an owner is one shard, so no flush commits
/// across nodes, and no two flushes wait on each other's owners). On a
/// failure the counts not yet stored come back with the error, to be kept
/// for the next flush; the owners stored before it stay stored.
pub fn flush_tallies(
    conn: &mut DbConnection,
    mut tallies: Vec<Tally>,
) -> Result<(), (StoreError, Vec<Tally>)> {
    tallies.sort_by(|a, b| a.key().cmp(&b.key()));
    while !tallies.is_empty() {
        let owner = tallies[0].owner_id.clone();
        let rest = tallies.split_off(tallies.partition_point(|t| t.owner_id == owner));
        if let Err(error) = write_transaction(conn, |conn| add_tallies(conn, &tallies)) {
            tallies.extend(rest);
            return Err((error, tallies));
        }
        tallies = rest;
    }
    Ok(())
}

impl Tally {
    /// The row's key, in the order the flush writes rows.
    fn key(&self) -> (&str, Timestamp, &str, &str, &str, &str) {
        (
            self.owner_id.as_str(),
            self.day,
            &self.task,
            &self.provider,
            &self.job_id,
            &self.kind,
        )
    }
}

impl LedgerEntry {
    /// What the call spent of its owner's budget.
    pub fn spent(&self) -> crate::domain::ledger::Reservation {
        crate::domain::ledger::Reservation {
            micros: self.cost_micros.unwrap_or(0),
            tokens: self.tokens(),
        }
    }
}
