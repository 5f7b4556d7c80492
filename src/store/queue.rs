//! The attempt queue: claiming due queued attempts with a lease (a claim
//! that admits an attempt is also its confirmation before sending), giving
//! back a claim whose request never left, renewing a lease, and what a lease
//! that runs out means: an attempt that was sent becomes `unknown` (never
//! re-sent); one that was claimed but never sent goes back to the queue.
//!
//! Leases are judged by one clock, the database's ([`db_now_ms`]), never by
//! each process's own.

use diesel::dsl::sql;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable};

use super::connection::{db_clock, db_now_ms, per_backend, write_transaction};
use super::prepared::KeepPrepared;
use super::reads::{find_owned_attempt, get_job};
use super::rows::{Attempt, Job};
use super::rows::{AttemptKey, JobKey};
use super::schema::{attempts, jobs};
use super::transitions::{
    lock_attempt_and_job, lock_job, refresh_job_status, state_on_row, transition,
    transition_guarded, Guard,
};
use super::{DbConnection, StoreError, StoreResult};
use std::collections::{BTreeMap, HashMap};

use crate::domain::guards;
use crate::domain::webhook::EventKind;
use crate::domain::{
    Applied, AttemptEvent, AttemptId, AttemptState, JobId, JobStatus, Reason, Timestamp, UserId,
};

/// Lease columns are nullable, so the clock is typed to match them.
type Millis = diesel::expression::SqlLiteral<Nullable<BigInt>>;

fn db_now(conn: &DbConnection) -> Millis {
    sql::<Nullable<BigInt>>(db_now_ms(conn))
}

/// The clock `ms` ahead; `ms` is bound, so the statement's text stays the
/// same whatever it is (`store::prepared`).
fn db_now_plus(
    conn: &DbConnection,
    ms: i64,
) -> diesel::expression::UncheckedBind<Millis, diesel::dsl::AsExprOf<i64, BigInt>> {
    sql::<Nullable<BigInt>>(&format!("({}) + ", db_now_ms(conn))).bind::<BigInt, _>(ms)
}

/// A queued attempt this process now holds, with the job it works for.
#[derive(Debug, Clone)]
pub struct Claim {
    pub attempt: Attempt,
    pub job: Job,
}

/// [`job_version_of_attempt`]'s SQL: a literal with the owner bound.
type JobVersionOfAttempt = diesel::expression::SqlLiteral<
    Nullable<BigInt>,
    diesel::expression::UncheckedBind<
        diesel::expression::SqlLiteral<Nullable<BigInt>>,
        diesel::dsl::AsExprOf<String, diesel::sql_types::Text>,
    >,
>;

/// The version of an attempt's job, read inside the claiming statement:
/// what the compare-and-swap will expect. The owner is a bound value, not
/// `attempts.owner_id`: Citus routes a subquery only by a value, and would
/// otherwise run the claim on every shard.
fn job_version_of_attempt(owner_id: &UserId) -> JobVersionOfAttempt {
    sql::<Nullable<BigInt>>(
        "(SELECT jobs.version FROM jobs WHERE jobs.id = attempts.job_id AND jobs.owner_id = ",
    )
    .bind::<diesel::sql_types::Text, _>(owner_id.as_str().to_owned())
    .sql(")")
}

/// What a claim may take, and how.
pub struct ClaimRules<'a> {
    pub lease_owner: &'a str,
    pub lease_ms: i64,
    /// The most attempts to take.
    pub limit: i64,
    /// Each provider's soft timeout, for `timeout_at`.
    pub soft_timeout_ms: &'a (dyn Fn(&str) -> i64 + Sync),
    /// Providers none of whose attempts may be taken now (paused, or at
    /// their limits): their queued attempts are passed over, not claimed.
    pub closed: &'a [String],
    /// Takes this process's capacity to send one attempt of this provider
    /// now; `false` leaves the attempt queued (and, for the rest of this
    /// claim, the provider's other attempts too).
    pub admit: &'a mut (dyn FnMut(&AttemptId, &str) -> bool + Send),
    /// Whether the claim is also the confirmation before sending: the
    /// caller sends each claimed attempt the moment the claim commits.
    pub confirm: bool,
}

/// What a claim took, and which providers' attempts it left queued for
/// lack of capacity.
#[derive(Debug, Default)]
pub struct ClaimBatch {
    pub claims: Vec<Claim>,
    /// Providers with a due attempt this claim could not admit.
    pub held_back: Vec<String>,
    /// Attempts whose claim may have committed though its reply never
    /// came (the connection broke: [`StoreError::ConnectionLost`]), by
    /// owner: [`confirm_claims`] tells, on a fresh connection.
    pub unconfirmed: Vec<(UserId, Vec<AttemptId>)>,
    /// The attempts of the owner being claimed, until its claim returns.
    claiming: Vec<AttemptId>,
}

/// Claims up to `rules.limit` of the oldest due queued attempts for
/// `rules.lease_owner` until `now + lease_ms`, oldest first. An attempt is
/// due when its job is unfinished, its provider is not `closed`, and it is
/// not a retry still waiting (`not_before`, by the database's clock).
///
/// Candidates are read without locks; then, one owner at a time, their
/// unfinished jobs are locked (PostgreSQL: `FOR UPDATE SKIP LOCKED`, so
/// processes sharing one database never both claim one; SQLite: the write
/// transaction holds the database's write lock) and their attempts
/// claimed. Every locking or writing statement names its owner by value,
/// so the claim runs on a database distributed by owner
/// (docs/scaling.md). Either way the `UPDATE … WHERE state =
/// 'queued'` is the final guard: an attempt is sent at most once.
///
/// On PostgreSQL each owner's claim is a transaction of its own: on Citus
/// an owner's rows are one shard, so no claim commits across nodes (no
/// two-phase commit on the hottest path). If an owner's transaction fails
/// after others committed, the committed claims are returned (they must
/// be sent) and the rest stay queued. On SQLite, one database and one
/// lock, the whole claim is one transaction and one flush.
///
/// Each candidate is `admit`ted (the caller takes its provider's capacity)
/// before it is claimed; one that is not stays queued. With `confirm`, the
/// claim is also the confirmation before sending: `sent_at` is recorded in
/// the same statement, whose guards are the confirmation's (running under
/// this lease, job unfinished, by construction), and the caller sends at
/// once.
pub fn claim_batch(conn: &mut DbConnection, rules: ClaimRules<'_>) -> StoreResult<ClaimBatch> {
    match conn {
        DbConnection::Sqlite(_) => {
            write_transaction(conn, |conn| claim_owner_by_owner(conn, rules))
        }
        DbConnection::Postgresql(_) => claim_owner_by_owner(conn, rules),
    }
}

/// The due candidates, oldest first, read without locks: on a database
/// distributed by owner this read asks every shard, and Citus takes no
/// lock across shards. Twice as many as asked, so that rows another
/// process is claiming right now leave others to take. Grouped by owner,
/// in the order each owner's oldest comes.
fn due_candidates(
    conn: &mut DbConnection,
    closed: &[String],
    limit: i64,
) -> StoreResult<Vec<(UserId, Vec<Candidate>)>> {
    let due = sql::<diesel::sql_types::Bool>(&format!(
        "(attempts.not_before IS NULL OR attempts.not_before <= {})",
        db_now_ms(conn)
    ));
    let rows: Vec<(AttemptId, UserId, JobId, String)> = attempts::table
        .inner_join(jobs::table.on(same_job()))
        .filter(attempts::state.eq(AttemptState::Queued))
        .filter(jobs::status.ne_all(JobStatus::TERMINAL))
        .filter(attempts::provider.ne_all(closed.to_vec()))
        .filter(due)
        .order((attempts::created_at.asc(), attempts::id.asc()))
        .select((
            attempts::id,
            attempts::owner_id,
            attempts::job_id,
            attempts::provider,
        ))
        .limit(limit * 2)
        .keep_prepared()
        .load(conn)?;
    let mut owners: Vec<(UserId, Vec<Candidate>)> = Vec::new();
    for (attempt_id, owner_id, job_id, provider) in rows {
        let candidate = Candidate {
            attempt_id,
            job_id,
            provider,
        };
        match owners.iter_mut().find(|(owner, _)| *owner == owner_id) {
            Some((_, group)) => group.push(candidate),
            None => owners.push((owner_id, vec![candidate])),
        }
    }
    Ok(owners)
}

/// A due queued attempt, read without a lock.
struct Candidate {
    attempt_id: AttemptId,
    job_id: JobId,
    provider: String,
}

fn claim_owner_by_owner(conn: &mut DbConnection, rules: ClaimRules<'_>) -> StoreResult<ClaimBatch> {
    let owners = due_candidates(conn, rules.closed, rules.limit)?;
    // Inside SQLite's one transaction already; PostgreSQL's owners each
    // get their own.
    let one_transaction = matches!(conn, DbConnection::Sqlite(_));
    let mut batch = ClaimBatch::default();
    let mut rules = rules;
    for (owner_id, group) in owners {
        if batch.claims.len() as i64 >= rules.limit {
            break;
        }
        let claimed = if one_transaction {
            claim_of_owner(conn, &owner_id, group, &mut rules, &mut batch)
        } else {
            write_transaction(conn, |conn| {
                claim_of_owner(conn, &owner_id, group, &mut rules, &mut batch)
            })
        };
        super::forget_if_lost(conn, &claimed);
        let claiming = std::mem::take(&mut batch.claiming);
        match claimed {
            Ok(claims) => batch.claims.extend(claims),
            // The claim may have committed: confirmed by the caller on a
            // fresh connection, not retried here.
            Err(StoreError::ConnectionLost(reason)) if !one_transaction => {
                tracing::warn!(%reason, owner = %owner_id, "the connection broke during a claim");
                batch.unconfirmed.push((owner_id, claiming));
                break;
            }
            // What committed must be sent: it is returned, and this
            // owner's attempts stay queued for the next claim.
            Err(error) if !one_transaction && !batch.claims.is_empty() => {
                tracing::warn!(%error, owner = %owner_id, "one owner's claim failed; the others' are sent");
                break;
            }
            Err(error) => return Err(error),
        }
    }
    batch.claims.sort_by(|a, b| {
        (a.attempt.created_at, &a.attempt.id).cmp(&(b.attempt.created_at, &b.attempt.id))
    });
    Ok(batch)
}

/// One owner's part of a claim: its unfinished jobs locked, each candidate
/// admitted, the admitted attempts claimed (one statement per provider)
/// and their jobs marked running. Every statement names the owner.
fn claim_of_owner(
    conn: &mut DbConnection,
    owner_id: &UserId,
    group: Vec<Candidate>,
    rules: &mut ClaimRules<'_>,
    batch: &mut ClaimBatch,
) -> StoreResult<Vec<Claim>> {
    let lockable = lock_unfinished_jobs(conn, owner_id, &group)?;
    let now = Timestamp::now();
    let by_provider = admit_candidates(group, &lockable, rules, batch);
    let mut claimed: Vec<Attempt> = Vec::new();
    for (provider, ids) in by_provider {
        let lease_until = db_now_plus(conn, rules.lease_ms);
        let claim = diesel::update(
            attempts::table
                .filter(attempts::owner_id.eq(owner_id))
                .filter(attempts::id.eq_any(ids))
                .filter(state_on_row(AttemptEvent::Claimed.from_states())),
        )
        .set((
            attempts::state.eq(AttemptEvent::Claimed.target()),
            attempts::sent_at.eq(rules.confirm.then_some(now)),
            attempts::version_read.eq(job_version_of_attempt(owner_id)),
            attempts::lease_owner.eq(rules.lease_owner),
            attempts::lease_expires_at.eq(lease_until),
            attempts::started_at.eq(now),
            attempts::timeout_at.eq(now + (rules.soft_timeout_ms)(&provider)),
        ));
        let rows: Vec<Attempt> = per_backend!(conn, |c| claim
            .returning(Attempt::as_returning())
            .keep_prepared()
            .load(c)?);
        claimed.extend(rows);
    }
    if claimed.is_empty() {
        return Ok(Vec::new());
    }
    // Each job's live attempt is now its running one.
    let running = diesel::update(
        jobs::table
            .filter(jobs::owner_id.eq(owner_id))
            .filter(jobs::id.eq_any(claimed.iter().map(|a| a.job_id.clone()))),
    )
    .set((
        jobs::status.eq(JobStatus::for_live_attempt(Some(AttemptState::Running))),
        jobs::updated_at.eq(now),
    ));
    let rows: Vec<Job> = per_backend!(conn, |c| running
        .returning(Job::as_returning())
        .keep_prepared()
        .load(c)?);
    let mut jobs: HashMap<JobId, Job> = rows.into_iter().map(|job| (job.id.clone(), job)).collect();
    claimed
        .into_iter()
        .map(|attempt| {
            let job = jobs.remove(&attempt.job_id).ok_or_else(|| {
                StoreError::corrupt(format!("claimed attempt {} has no job", attempt.id))
            })?;
            Ok(Claim { attempt, job })
        })
        .collect()
}

/// The candidates of one owner to claim, by provider: those whose job is
/// locked, within the claim's limit, and `admit`ted (a provider refused is
/// held back, with its other candidates). Noted in `batch.claiming` until
/// the claim returns.
fn admit_candidates(
    group: Vec<Candidate>,
    lockable: &std::collections::HashSet<JobId>,
    rules: &mut ClaimRules<'_>,
    batch: &mut ClaimBatch,
) -> BTreeMap<String, Vec<AttemptId>> {
    let mut taken = batch.claims.len() as i64;
    let mut by_provider: BTreeMap<String, Vec<AttemptId>> = BTreeMap::new();
    for candidate in group {
        if taken >= rules.limit {
            break;
        }
        if !lockable.contains(&candidate.job_id) || batch.held_back.contains(&candidate.provider) {
            continue;
        }
        if !(rules.admit)(&candidate.attempt_id, &candidate.provider) {
            batch.held_back.push(candidate.provider);
            continue;
        }
        taken += 1;
        batch.claiming.push(candidate.attempt_id.clone());
        by_provider
            .entry(candidate.provider)
            .or_default()
            .push(candidate.attempt_id);
    }
    by_provider
}

/// Of `unconfirmed` attempts (a claim whose connection broke before its
/// reply came), those the claim did take: running under `lease_owner`'s
/// unexpired lease with `sent_at` recorded, which only that claim can have
/// written, since they were queued when it began. The caller sends them as
/// it would have; the others stayed queued (or another process has them).
pub fn confirm_claims(
    conn: &mut DbConnection,
    lease_owner: &str,
    unconfirmed: &[(UserId, Vec<AttemptId>)],
) -> StoreResult<Vec<Claim>> {
    let mut claims = Vec::new();
    for (owner_id, ids) in unconfirmed {
        let now = db_now(conn);
        let taken: Vec<Attempt> = attempts::table
            .filter(attempts::owner_id.eq(owner_id))
            .filter(attempts::id.eq_any(ids))
            .filter(attempts::state.eq(AttemptState::Running))
            .filter(attempts::lease_owner.eq(lease_owner))
            .filter(attempts::lease_expires_at.gt(now))
            .filter(attempts::sent_at.is_not_null())
            .select(Attempt::as_select())
            .load(conn)?;
        for attempt in taken {
            let job = get_job(conn, &attempt.job_key())?;
            claims.push(Claim { attempt, job });
        }
    }
    Ok(claims)
}

/// The jobs among `group`'s that are unfinished and free to claim: on
/// PostgreSQL they are locked, without waiting (`FOR UPDATE SKIP LOCKED`:
/// a job another process holds, claiming or deciding it, is skipped).
/// SQLite's write transaction already holds the database's write lock.
fn lock_unfinished_jobs(
    conn: &mut DbConnection,
    owner_id: &UserId,
    group: &[Candidate],
) -> StoreResult<std::collections::HashSet<JobId>> {
    let job_ids: Vec<JobId> = group.iter().map(|c| c.job_id.clone()).collect();
    Ok(match conn {
        DbConnection::Postgresql(pg) => jobs::table
            .filter(jobs::owner_id.eq(owner_id))
            .filter(jobs::id.eq_any(job_ids))
            .filter(jobs::status.ne_all(JobStatus::TERMINAL))
            .select(jobs::id)
            .for_update()
            .skip_locked()
            .load::<JobId>(pg)?
            .into_iter()
            .collect(),
        DbConnection::Sqlite(_) => job_ids.into_iter().collect(),
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
    now: Timestamp,
) -> StoreResult<Attempt> {
    let lease_until = db_now_plus(conn, start.lease_ms);
    let id = AttemptId::new();
    let insert = diesel::insert_into(attempts::table).values((
        attempts::id.eq(&id),
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
    /// Names the insert in a connection's statement cache: every value is
    /// a bind, and the lease's clock is the backend's own (one text each).
    struct StartedAttempt;
    match conn {
        DbConnection::Postgresql(c) => Ok(insert
            .returning(Attempt::as_returning())
            .keep_prepared_as::<StartedAttempt>()
            .get_result(c)?),
        // Read back by its key in the same transaction: cheaper on SQLite
        // than a `RETURNING` (see `store::prepared`).
        DbConnection::Sqlite(c) => {
            insert
                .keep_prepared_as::<StartedAttempt>()
                .run_on_sqlite(c)?;
            find_owned_attempt(conn, &id, &job.owner_id)?.ok_or(StoreError::NotFound)
        }
    }
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

/// Extends the lease of a sent attempt this process holds, while its call
/// is out. The lease is renewed whatever happened to the job meanwhile: an
/// attempt whose job finished through another attempt is still awaiting
/// its answer, and its process is alive; when its call ends without an
/// answer it is closed as superseded ([`mark_unknown`]), never reaped as
/// if its process had stopped. False when the attempt is no longer running
/// under this owner.
pub fn renew_lease(
    conn: &mut DbConnection,
    attempt_id: &AttemptId,
    owner_id: &UserId,
    lease_owner: &str,
    lease_ms: i64,
) -> StoreResult<bool> {
    let changed = write_transaction(conn, |conn| {
        // The clock is read first and bound, not evaluated by the UPDATE.
        let until = db_clock(conn)? + lease_ms;
        Ok::<_, StoreError>(
            diesel::update(
                attempts::table
                    .filter(attempts::id.eq(attempt_id))
                    .filter(attempts::owner_id.eq(owner_id))
                    .filter(state_on_row(&[AttemptState::Running]))
                    .filter(attempts::lease_owner.eq(lease_owner)),
            )
            .set(attempts::lease_expires_at.eq(Some(until)))
            .execute(conn)?,
        )
    })?;
    Ok(changed == 1)
}

/// What giving back a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendPermit {
    /// The job had finished: the attempt was closed unsent, with this reason.
    Withdrawn(String),
    /// The attempt went back to the queue, `sent_at` cleared.
    Requeued,
    /// The attempt is no longer this worker's (another process took it over,
    /// or it is not running): nothing to do.
    Lost,
}

const NOT_SENT_JOB_FINISHED: &str = "not sent: the job had already finished";

/// Gives back this worker's claim whose request never left, as the worker
/// itself says (its provider asked for a pause between the claim and the
/// send, or the process is stopping): back to the queue in one guarded
/// statement that clears `sent_at` (the claim had recorded it for a send
/// that did not happen), or closed if its job has finished. Sent later by
/// whoever claims it, once.
pub fn give_back_before_sending(
    conn: &mut DbConnection,
    key: &AttemptKey,
    lease_owner: &str,
) -> StoreResult<SendPermit> {
    give_back(conn, key, lease_owner, false)
}

/// Gives back this worker's claim if the row says it was never sent (no
/// `sent_at`): back to the queue, or closed if its job has finished.
pub fn give_back_unsent(
    conn: &mut DbConnection,
    key: &AttemptKey,
    lease_owner: &str,
) -> StoreResult<SendPermit> {
    give_back(conn, key, lease_owner, true)
}

fn give_back(
    conn: &mut DbConnection,
    key: &AttemptKey,
    lease_owner: &str,
    never_sent: bool,
) -> StoreResult<SendPermit> {
    write_transaction(conn, |conn| {
        let Some(attempt) = lock_attempt_and_job(conn, key)? else {
            return Ok(SendPermit::Lost);
        };
        let ours = guards::may_give_back(
            attempt.state,
            attempt.lease_owner.as_deref(),
            Some(lease_owner),
            attempt.sent_at.is_some(),
            never_sent,
        );
        if !ours {
            return Ok(SendPermit::Lost);
        }
        let guard = Guard {
            lease_owner: Some(lease_owner),
            never_sent,
        };
        let job = get_job(conn, &attempt.job_key())?;
        // Given back by its own worker, the claim counts as unsent.
        match guards::on_lease_expiry(false, job.status.is_terminal()) {
            AttemptEvent::ClosedUnsent => {
                close_unsent(conn, &attempt, guard)?;
                Ok(SendPermit::Withdrawn(NOT_SENT_JOB_FINISHED.to_owned()))
            }
            _ => {
                requeue(conn, &attempt, guard)?;
                Ok(SendPermit::Requeued)
            }
        }
    })
}

/// A running attempt whose request never left goes back to `queued`
/// ([`AttemptEvent::GivenBack`]): sending it later sends it once.
fn requeue(conn: &mut DbConnection, attempt: &Attempt, guard: Guard<'_>) -> StoreResult<bool> {
    let now = Timestamp::now();
    let moved = transition_guarded(conn, attempt, AttemptEvent::GivenBack, now, None, guard)?;
    refresh_job_status(conn, &attempt.job_key(), now)?;
    Ok(moved)
}

/// A running attempt whose request never left, of a finished job, is closed,
/// never sent ([`AttemptEvent::ClosedUnsent`]).
fn close_unsent(conn: &mut DbConnection, attempt: &Attempt, guard: Guard<'_>) -> StoreResult<bool> {
    Ok(transition_guarded(
        conn,
        attempt,
        AttemptEvent::ClosedUnsent,
        Timestamp::now(),
        Some(&Reason::new(NOT_SENT_JOB_FINISHED)),
        guard,
    )?)
}

/// Why a sent attempt of a finished job is closed rather than left
/// `unknown`: `what` happened, followed by why it is closed.
fn superseded_note(job: &Job, what: Reason) -> Reason {
    let how = match (&job.completed_by, job.status) {
        (Some(winner), _) => format!("succeeded through attempt {winner}"),
        (None, status) => format!("{status}"),
    };
    what.followed_by(&format!(
        "; closed, not left unknown: its job had already {how}. The provider may have \
         received the request; a late answer is still written to the race log"
    ))
}

/// The soft timeout passed: the attempt (and its job) become `unknown`. If
/// the job finished through another attempt meanwhile, nobody waits on
/// this one: it is closed with a note ([`AttemptEvent::Superseded`]), not
/// left in the unknown queue (where it would also hold retention off).
pub fn mark_unknown(
    conn: &mut DbConnection,
    key: &AttemptKey,
    reason: &Reason,
) -> StoreResult<Applied> {
    write_transaction(conn, |conn| {
        let now = Timestamp::now();
        let attempt = lock_attempt_and_job(conn, key)?.ok_or(StoreError::NotFound)?;
        let job = get_job(conn, &attempt.job_key())?;
        if guards::on_soft_timeout(attempt.state, job.status.is_terminal())
            == AttemptEvent::Superseded
        {
            let note = superseded_note(&job, reason.clone());
            if transition(conn, &attempt, AttemptEvent::Superseded, now, Some(&note))? {
                return Ok(Applied::Superseded);
            }
        }
        if !transition(conn, &attempt, AttemptEvent::SoftTimeout, now, Some(reason))? {
            return Ok(Applied::Ignored(attempt.state));
        }
        refresh_job_status(conn, &attempt.job_key(), now)?;
        super::webhooks::record_event(conn, &attempt.job_key(), EventKind::JobUnknown, now)?;
        Ok(Applied::MarkedUnknown)
    })
}

/// Running attempts whose lease ran out (by the database's clock) belonged
/// to a process that stopped, or that could not record their outcome. One
/// that was sent becomes `unknown` (the provider may have received it) and
/// is never re-sent, unless its job finished through another attempt (then
/// it is closed with a note); one that was never sent goes back to the
/// queue (or is closed, if its job finished). Each attempt is handled in a
/// transaction of its own, so reapers in several processes never hold locks
/// on two jobs at once, and one whose rows another session holds locked is
/// left for a later turn without holding up the rest. Returns what changed.
pub fn expire_leases(conn: &mut DbConnection) -> StoreResult<Vec<(AttemptId, AttemptState)>> {
    let now = db_now(conn);
    let expired: Vec<(AttemptId, JobId, UserId)> = attempts::table
        .filter(attempts::state.eq(AttemptState::Running))
        .filter(attempts::lease_expires_at.lt(now))
        .select((attempts::id, attempts::job_id, attempts::owner_id))
        .limit(100)
        .load(conn)?;
    let mut changed = Vec::new();
    for (attempt_id, id, owner_id) in expired {
        match expire_one(conn, &attempt_id, &JobKey { id, owner_id }) {
            Ok(Some(state)) => changed.push((attempt_id, state)),
            Ok(None) => {}
            // On PostgreSQL: its row or its job's is locked past the lock
            // wait, by a process cut off inside a transaction, say, whose
            // locks hold until the database ends its session. That attempt
            // waits for a later turn; the others are reaped now. (SQLite's
            // lock is the whole database's: the next would wait as long.)
            Err(StoreError::Busy(reason)) if matches!(conn, DbConnection::Postgresql(_)) => {
                tracing::warn!(%attempt_id, %reason, "an expired lease could not be reaped now; tried again next turn");
            }
            Err(error) => return Err(error),
        }
    }
    Ok(changed)
}

const LEASE_EXPIRED: &str = "lease expired: the process running this attempt stopped, or could \
                             not record its outcome; the provider may have received the request";

fn expire_one(
    conn: &mut DbConnection,
    attempt_id: &AttemptId,
    key: &JobKey,
) -> StoreResult<Option<AttemptState>> {
    write_transaction(conn, |conn| {
        lock_job(conn, key)?;
        let now = db_now(conn);
        // Re-read under the lock: a renewal or an answer may have come first.
        let still_expired = attempts::table
            .filter(attempts::id.eq(attempt_id))
            .filter(attempts::owner_id.eq(&key.owner_id))
            .filter(state_on_row(&[AttemptState::Running]))
            .filter(attempts::lease_expires_at.lt(now))
            .select(Attempt::as_select())
            .first(conn)
            .optional()?;
        let Some(attempt) = still_expired else {
            return Ok(None);
        };
        let job = get_job(conn, key)?;
        let now = Timestamp::now();
        let unsent = Guard {
            lease_owner: None,
            never_sent: true,
        };
        match guards::on_lease_expiry(attempt.sent_at.is_some(), job.status.is_terminal()) {
            AttemptEvent::ClosedUnsent => {
                return Ok(close_unsent(conn, &attempt, unsent)?.then_some(AttemptState::Failed));
            }
            AttemptEvent::GivenBack => {
                return Ok(requeue(conn, &attempt, unsent)?.then_some(AttemptState::Queued));
            }
            AttemptEvent::Superseded => {
                let note = superseded_note(&job, Reason::new(LEASE_EXPIRED));
                let closed =
                    transition(conn, &attempt, AttemptEvent::Superseded, now, Some(&note))?;
                return Ok(closed.then_some(AttemptState::Abandoned));
            }
            _ => {}
        }
        if !transition(
            conn,
            &attempt,
            AttemptEvent::LeaseExpired,
            now,
            Some(&Reason::new(LEASE_EXPIRED)),
        )? {
            return Ok(None);
        }
        refresh_job_status(conn, key, now)?;
        super::webhooks::record_event(conn, key, EventKind::JobUnknown, now)?;
        Ok(Some(AttemptState::Unknown))
    })
}
