//! Jobs: creation under an idempotency key, and reads.

use diesel::prelude::*;

use super::connection::{per_backend, write_transaction, Placement, PG_NOW_MS};
use super::prepared::KeepPrepared;
use super::queue::{self, StartNow};
use super::reads::attempts_of;
use super::rows::{Attempt, Job, ATTEMPT_COLUMNS};
use super::schema::jobs;
pub use super::sqlite_batch::MAX_ROWS_PER_STATEMENT;
use super::transitions::insert_queued_attempt;
use super::{DbConnection, StoreError, StoreResult};
use crate::domain::ledger::Reservation;
use crate::domain::{
    AttemptId, AttemptState, IdempotencyKey, JobId, JobStatus, JsonText, Timestamp, UserId,
};

/// What a client asked for, validated and fingerprinted by the caller.
#[derive(Debug, Clone)]
pub struct NewJob {
    /// The job's id, chosen before the first try: a creation whose
    /// connection broke can then tell its own job (committed, its reply
    /// lost) from another request's under the same key
    /// ([`confirm_creation`]).
    pub id: JobId,
    pub owner_id: UserId,
    pub key: IdempotencyKey,
    pub task: String,
    /// The provider of the first attempt.
    pub provider: String,
    /// The provider the client named, if it named one.
    pub requested_provider: Option<String>,
    pub input: JsonText,
    pub params: JsonText,
    pub fingerprint: String,
    /// When set, the first attempt starts in the creating transaction:
    /// claimed under this lease and confirmed for sending (see
    /// [`queue::insert_started_attempt`]). Otherwise it is queued.
    pub start: Option<StartNow>,
    /// The most the job can cost, reserved against its owner's budget (if
    /// the owner has one) in the creating transaction.
    pub reservation: Reservation,
    /// The trace the job's work continues: the creating request's span.
    pub trace_context: Option<crate::domain::TraceContext>,
    /// The caller's token check, kept from an earlier read (PostgreSQL,
    /// `app::credentials`): nothing is stored unless the token still
    /// grants the owner what it did, as the storing statement sees it
    /// (else [`StoreError::CredentialsChanged`]).
    pub kept_grant: Option<super::users::GrantToCheck>,
}

#[derive(Debug)]
pub enum CreateOutcome {
    /// This request created the job (and its first, queued attempt).
    Created(Job),
    /// The key had already made this job (whether with the same payload is
    /// the caller's to decide).
    Existing(Job),
}

/// Creates the job, or finds the one this key already made.
///
/// `INSERT … ON CONFLICT (owner_id, idempotency_key) DO NOTHING`, then read the
/// row: the database decides who was first, never a check-then-insert here.
pub fn create_job(conn: &mut DbConnection, new: &NewJob) -> StoreResult<CreateOutcome> {
    Ok(create_job_with_attempts(conn, new)?.0)
}

/// [`create_job`], with the job's attempts: the new one (queued, or started
/// when `new.start` says so), or the existing job's.
///
/// The job the key conflicted with can vanish before it is read: retention
/// may delete a finished job between the insert that found it and the read
/// (PostgreSQL runs them as two statements). Its key is then free again,
/// and the insert is tried again: a request never answers 404 for a job it
/// was about to create.
pub fn create_job_with_attempts(
    conn: &mut DbConnection,
    new: &NewJob,
) -> StoreResult<(CreateOutcome, Vec<Attempt>)> {
    create_job_placed(conn, new, Placement::OneDatabase)
}

/// [`create_job_with_attempts`], in the statements `placement` takes.
pub fn create_job_placed(
    conn: &mut DbConnection,
    new: &NewJob,
    placement: Placement,
) -> StoreResult<(CreateOutcome, Vec<Attempt>)> {
    const TRIES: usize = 3;
    let mut tries = 0;
    loop {
        tries += 1;
        match insert_or_read(conn, new, placement) {
            Err(super::StoreError::NotFound) if tries < TRIES => {
                tracing::info!(
                    key = new.key.as_str(),
                    "the job this key had made was removed meanwhile; creating it again"
                );
            }
            done => return done,
        }
    }
}

/// One try: insert, or read the job the key already made (`NotFound` if it
/// vanished in between).
fn insert_or_read(
    conn: &mut DbConnection,
    new: &NewJob,
    placement: Placement,
) -> StoreResult<(CreateOutcome, Vec<Attempt>)> {
    let now = Timestamp::now();
    let row = new_job_row(new, now);
    if let (DbConnection::Postgresql(pg), Placement::OneDatabase) = (&mut *conn, placement) {
        let kept = new.kept_grant.as_ref();
        if let Some(attempt) = insert_job_and_attempt(pg, &row, new.start.as_ref(), kept, now)? {
            return Ok((CreateOutcome::Created(row), vec![attempt]));
        }
        // The key had made a job (a replay, a storm's twin): one statement
        // reads it and its attempts. Nothing found: the owner has a budget,
        // the kept token check no longer holds (or retention removed the
        // job meanwhile), and the transaction below tells which.
        if let Some((job, attempts)) = job_of_key(conn, &new.owner_id, new.key.as_str())? {
            return Ok((CreateOutcome::Existing(job), attempts));
        }
    }
    write_transaction(conn, |conn| {
        if let Some(grant) = &new.kept_grant {
            if !super::users::grant_holds(conn, &new.owner_id, grant)? {
                return Err(StoreError::CredentialsChanged);
            }
        }
        let inserted = insert_job_unless_key_exists(conn, &row)?;
        if inserted == 1 {
            let attempt = match &new.start {
                Some(start) => queue::insert_started_attempt(conn, &row, start, now)?,
                None => insert_queued_attempt(conn, &row.id, &row.owner_id, 1, &row.provider, now)?,
            };
            // Refused: the error rolls the creation back.
            if let Some(refused) = super::budgets::reserve(conn, &row.key(), new.reservation, now)?
            {
                return Err(StoreError::BudgetExceeded(refused));
            }
            return Ok((CreateOutcome::Created(row), vec![attempt]));
        }
        // A replay is never refused for budget.
        existing_by_key(conn, new)
    })
}

/// After a creation's connection broke ([`StoreError::ConnectionLost`]),
/// on a fresh connection: whether the creation committed all the same (the
/// reply to its commit lost). The job under the key with the id this
/// creation chose is its own: `Created`, with its attempts, so that a
/// started attempt goes to the worker as if the reply had come; but only
/// while that attempt still runs under its lease (else the lease has run
/// out and the reaper decides, and the job is `Existing`). Another job
/// under the key is `Existing`. None: the creation did not commit, and is
/// made now.
pub fn confirm_creation(
    conn: &mut DbConnection,
    new: &NewJob,
    placement: Placement,
) -> StoreResult<(CreateOutcome, Vec<Attempt>)> {
    let Some(job) = find_by_key(conn, &new.owner_id, new.key.as_str())? else {
        return create_job_placed(conn, new, placement);
    };
    let attempts = attempts_of(conn, &job.key())?;
    let still_ours = |attempt: &Attempt| match &new.start {
        Some(start) => {
            attempt.state == AttemptState::Running
                && attempt.lease_owner.as_deref() == Some(start.lease_owner.as_str())
                && attempt
                    .lease_expires_at
                    .is_some_and(|until| until > Timestamp::now())
        }
        None => true,
    };
    let created = job.id == new.id && attempts.len() == 1 && still_ours(&attempts[0]);
    tracing::warn!(
        job_id = %job.id,
        committed = job.id == new.id,
        "a creation's connection broke; checked on a fresh connection"
    );
    Ok(match created {
        true => (CreateOutcome::Created(job), attempts),
        false => (CreateOutcome::Existing(job), attempts),
    })
}

/// The job `owner_id`'s key made and its attempts, in one statement (one
/// view of both, without a transaction's round trips); `None` when the
/// key made no job. (A job is never without its first attempt: both are
/// written, and removed, together.)
pub fn job_of_key(
    conn: &mut DbConnection,
    owner_id: &UserId,
    key: &str,
) -> StoreResult<Option<(Job, Vec<Attempt>)>> {
    use super::schema::attempts;
    let rows: Vec<(Job, Attempt)> = per_backend!(conn, |c| jobs::table
        .inner_join(attempts::table.on(queue::same_job()))
        .filter(jobs::owner_id.eq(owner_id))
        .filter(jobs::idempotency_key.eq(key))
        .filter(attempts::owner_id.eq(owner_id))
        .order(attempts::number.asc())
        .select((Job::as_select(), Attempt::as_select()))
        .load(c))?;
    let mut rows = rows.into_iter();
    Ok(rows.next().map(|(job, first)| {
        let attempts = std::iter::once(first)
            .chain(rows.map(|(_, attempt)| attempt))
            .collect();
        (job, attempts)
    }))
}

/// The job a key already made, with its attempts ([`job_of_key`]).
fn existing_by_key(
    conn: &mut DbConnection,
    new: &NewJob,
) -> StoreResult<(CreateOutcome, Vec<Attempt>)> {
    let (existing, attempts) =
        job_of_key(conn, &new.owner_id, new.key.as_str())?.ok_or(super::StoreError::NotFound)?;
    Ok((CreateOutcome::Existing(existing), attempts))
}

/// The job row a new request makes (stamped at the creating transaction).
fn new_job_row(new: &NewJob, now: Timestamp) -> Job {
    Job {
        id: new.id.clone(),
        owner_id: new.owner_id.clone(),
        idempotency_key: new.key.as_str().to_owned(),
        task: new.task.clone(),
        provider: new.provider.clone(),
        requested_provider: new.requested_provider.clone(),
        input: new.input.clone(),
        params: new.params.clone(),
        fingerprint: new.fingerprint.clone(),
        status: match new.start {
            Some(_) => JobStatus::for_live_attempt(Some(AttemptState::Running)),
            None => JobStatus::Pending,
        },
        version: 0,
        result: None,
        completed_by: None,
        failure_reason: None,
        created_at: now,
        updated_at: now,
        failure_kind: None,
        failure_detail: None,
        trace_context: new.trace_context.as_ref().map(|t| t.to_column()),
    }
}

/// PostgreSQL: the job and its first attempt in one statement (a
/// data-modifying `WITH`), atomic by itself, so one round trip instead of
/// four (`BEGIN`, two inserts, `COMMIT`). The attempt is inserted only if
/// the job was: `None` when the key had made a job already, when the owner
/// has a budget (whose reservation needs the transaction), or when `kept`,
/// the caller's kept token check, no longer holds.
fn insert_job_and_attempt(
    conn: &mut diesel::PgConnection,
    job: &Job,
    start: Option<&StartNow>,
    kept: Option<&super::users::GrantToCheck>,
    now: Timestamp,
) -> StoreResult<Option<Attempt>> {
    use diesel::sql_types::{BigInt, Nullable, Text};
    let (state, lease_owner, lease_ms, started, timeout, version_read) = match start {
        Some(start) => (
            AttemptState::Running,
            Some(start.lease_owner.as_str()),
            Some(start.lease_ms),
            Some(now),
            Some(now + start.soft_timeout_ms),
            Some(job.version),
        ),
        None => (AttemptState::Queued, None, None, None, None, None),
    };
    // Built once: the text is the same on every call.
    struct CreationStatement;
    static STATEMENT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "WITH job AS (
           INSERT INTO jobs (id, owner_id, idempotency_key, task, provider, requested_provider,
                             input, params, fingerprint, status, version, created_at, updated_at,
                             trace_context)
           SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $12, $20
           WHERE NOT EXISTS (SELECT 1 FROM budgets WHERE budgets.owner_id = $2)
             AND ($21::text IS NULL OR {grant_holds})
           ON CONFLICT (owner_id, idempotency_key) DO NOTHING
           RETURNING id, owner_id, provider
         )
         INSERT INTO attempts (id, job_id, owner_id, number, provider, state, version_read,
                               lease_owner, lease_expires_at, created_at, started_at, timeout_at,
                               sent_at)
         SELECT $13, job.id, job.owner_id, 1, job.provider, $14, $15, $16,
                {now_ms} + $17, $12, $18, $19, $18
         FROM job
         RETURNING {ATTEMPT_COLUMNS}",
            now_ms = PG_NOW_MS,
            grant_holds = super::users::grant_holds_sql("$2", "$21", "$22", "$12"),
        )
    });
    let inserted: Vec<Attempt> = diesel::sql_query(STATEMENT.as_str())
        .bind::<Text, _>(job.id.as_str())
        .bind::<Text, _>(job.owner_id.as_str())
        .bind::<Text, _>(&job.idempotency_key)
        .bind::<Text, _>(&job.task)
        .bind::<Text, _>(&job.provider)
        .bind::<Nullable<Text>, _>(job.requested_provider.as_deref())
        .bind::<Text, _>(job.input.as_str())
        .bind::<Text, _>(job.params.as_str())
        .bind::<Text, _>(&job.fingerprint)
        .bind::<Text, _>(job.status.as_str())
        .bind::<BigInt, _>(job.version)
        .bind::<BigInt, _>(now)
        .bind::<Text, _>(AttemptId::new().as_str())
        .bind::<Text, _>(state.as_str())
        .bind::<Nullable<BigInt>, _>(version_read)
        .bind::<Nullable<Text>, _>(lease_owner)
        .bind::<Nullable<BigInt>, _>(lease_ms)
        .bind::<Nullable<BigInt>, _>(started)
        .bind::<Nullable<BigInt>, _>(timeout)
        .bind::<Nullable<Text>, _>(job.trace_context.as_deref())
        .bind::<Nullable<Text>, _>(kept.map(|grant| grant.digest.as_str()))
        .bind::<Nullable<Text>, _>(kept.map(|grant| grant.role.as_str()))
        .keep_prepared_as::<CreationStatement>()
        .load(conn)?;
    Ok(inserted.into_iter().next())
}

/// [`create_job_placed`], in a transaction that first reads the credential
/// counter when `kept_counter` is given: moved since, nothing is stored
/// ([`StoreError::CredentialsChanged`]).
pub fn create_job_checked(
    conn: &mut DbConnection,
    new: &NewJob,
    kept_counter: Option<i64>,
    placement: Placement,
) -> StoreResult<(CreateOutcome, Vec<Attempt>)> {
    let Some(counter) = kept_counter else {
        return create_job_placed(conn, new, placement);
    };
    write_transaction(conn, |conn| {
        if !super::users::credentials_unchanged_since(conn, counter)? {
            return Err(StoreError::CredentialsChanged);
        }
        create_job_placed(conn, new, placement)
    })
}

/// The creations of one owner together ([`create_distinct_of_one_owner`]).
/// Twins in one batch (a storm of retries under one key) are made or found
/// once: the first of each key stands for the rest, which are answered with
/// the job it made or found, as [`CreateOutcome::Existing`]. A twin whose
/// first failed is made or found alone.
pub fn create_many_of_one_owner(
    conn: &mut DbConnection,
    owner: &UserId,
    news: &[&NewJob],
    placement: Placement,
) -> Vec<StoreResult<(CreateOutcome, Vec<Attempt>)>> {
    // Each key's first position, and each creation's key as an index of those.
    let mut first_of_key: std::collections::HashMap<&str, usize> = Default::default();
    let mut firsts: Vec<usize> = Vec::with_capacity(news.len());
    let slots: Vec<usize> = news
        .iter()
        .enumerate()
        .map(|(position, new)| {
            *first_of_key.entry(new.key.as_str()).or_insert_with(|| {
                firsts.push(position);
                firsts.len() - 1
            })
        })
        .collect();
    if firsts.len() == news.len() {
        return create_distinct_of_one_owner(conn, owner, news, placement);
    }
    let distinct: Vec<&NewJob> = firsts.iter().map(|&position| news[position]).collect();
    let made = create_distinct_of_one_owner(conn, owner, &distinct, placement);
    type Outcome = StoreResult<(CreateOutcome, Vec<Attempt>)>;
    let mut outcomes: Vec<Option<Outcome>> = news.iter().map(|_| None).collect();
    // Each twin from its first's outcome, before those are moved to their places.
    for (position, (&slot, new)) in slots.iter().zip(news).enumerate() {
        if firsts[slot] != position {
            outcomes[position] = Some(match &made[slot] {
                Ok((CreateOutcome::Created(job) | CreateOutcome::Existing(job), attempts)) => {
                    Ok((CreateOutcome::Existing(job.clone()), attempts.clone()))
                }
                Err(_) => create_job_placed(conn, new, placement),
            });
        }
    }
    for (outcome, position) in made.into_iter().zip(firsts) {
        outcomes[position] = Some(outcome);
    }
    outcomes
        .into_iter()
        .map(|outcome| outcome.expect("each creation has its outcome"))
        .collect()
}

/// Creations of one owner under distinct keys: on PostgreSQL in one statement,
/// the multi-row form of [`insert_job_and_attempt`] (one round trip and one
/// commit for them all); on SQLite as multi-row inserts in a savepoint of
/// the caller's transaction. A creation the statement did not insert (its key
/// had made a job, the same key came twice, or the owner has a budget) is
/// then made or found alone by [`create_job_with_attempts`]: one verdict
/// per creation, and none fails another.
fn create_distinct_of_one_owner(
    conn: &mut DbConnection,
    owner: &UserId,
    news: &[&NewJob],
    placement: Placement,
) -> Vec<StoreResult<(CreateOutcome, Vec<Attempt>)>> {
    let sqlite_with_kept_grant =
        matches!(conn, DbConnection::Sqlite(_)) && news.iter().any(|new| new.kept_grant.is_some());
    if news.len() == 1 || placement == Placement::ByOwner || sqlite_with_kept_grant {
        // One alone: the single-row statement plans faster. Distributed:
        // plain inserts, each creation its own one-shard transaction. On
        // SQLite (which keeps token checks by its counter, not this way)
        // a grant to check is checked in each creation's transaction.
        return news
            .iter()
            .map(|new| create_job_placed(conn, new, placement))
            .collect();
    }
    let now = Timestamp::now();
    let rows: Vec<Job> = news.iter().map(|new| new_job_row(new, now)).collect();
    let inserted = match conn {
        DbConnection::Postgresql(pg) => insert_jobs_and_attempts(pg, owner, news, &rows, now),
        // Two statements, undone together if the second fails.
        DbConnection::Sqlite(_) => write_transaction(conn, |conn| match conn {
            DbConnection::Sqlite(lite) => {
                let batch: Vec<_> = news
                    .iter()
                    .zip(&rows)
                    .map(|(new, job)| (job, new.start.as_ref()))
                    .collect();
                super::sqlite_batch::insert_jobs_and_attempts(lite, owner, &batch, now)
            }
            DbConnection::Postgresql(_) => Ok(Vec::new()),
        }),
    };
    let mut firsts: std::collections::HashMap<String, Attempt> = match inserted {
        Ok(attempts) => attempts
            .into_iter()
            .map(|a| (a.job_id.as_str().to_owned(), a))
            .collect(),
        // Nothing was inserted: each alone says why.
        Err(error) => {
            tracing::warn!(%error, "a multi-row creation failed; creating each alone");
            Default::default()
        }
    };
    news.iter()
        .zip(rows)
        .map(|(new, row)| match firsts.remove(row.id.as_str()) {
            Some(attempt) => Ok((CreateOutcome::Created(row), vec![attempt])),
            None => create_job_with_attempts(conn, new),
        })
        .collect()
}

fn insert_jobs_and_attempts(
    conn: &mut diesel::PgConnection,
    owner: &UserId,
    news: &[&NewJob],
    rows: &[Job],
    now: Timestamp,
) -> StoreResult<Vec<Attempt>> {
    use diesel::pg::sql_types::Array;
    use diesel::sql_types::{BigInt, Nullable, Text};
    let texts = |f: &dyn Fn(&Job) -> String| rows.iter().map(f).collect::<Vec<String>>();
    let starts: Vec<Option<&StartNow>> = news.iter().map(|new| new.start.as_ref()).collect();
    let started = |f: &dyn Fn(&StartNow) -> i64| {
        starts
            .iter()
            .map(|start| start.map(f))
            .collect::<Vec<Option<i64>>>()
    };
    let states: Vec<String> = starts
        .iter()
        .map(|start| match start {
            Some(_) => AttemptState::Running.as_str().to_owned(),
            None => AttemptState::Queued.as_str().to_owned(),
        })
        .collect();
    let kept = |f: &dyn Fn(&super::users::GrantToCheck) -> String| {
        news.iter()
            .map(|new| new.kept_grant.as_ref().map(f))
            .collect::<Vec<Option<String>>>()
    };
    let statement = multi_row_creation_statement();
    Ok(diesel::sql_query(statement)
        .bind::<Text, _>(owner.as_str())
        .bind::<Array<Text>, _>(texts(&|j| j.id.as_str().to_owned()))
        .bind::<Array<Text>, _>(texts(&|j| j.idempotency_key.clone()))
        .bind::<Array<Text>, _>(texts(&|j| j.task.clone()))
        .bind::<Array<Text>, _>(texts(&|j| j.provider.clone()))
        .bind::<Array<Nullable<Text>>, _>(
            rows.iter()
                .map(|j| j.requested_provider.clone())
                .collect::<Vec<_>>(),
        )
        .bind::<Array<Text>, _>(texts(&|j| j.input.as_str().to_owned()))
        .bind::<Array<Text>, _>(texts(&|j| j.params.as_str().to_owned()))
        .bind::<Array<Text>, _>(texts(&|j| j.fingerprint.clone()))
        .bind::<Array<Text>, _>(texts(&|j| j.status.as_str().to_owned()))
        .bind::<Array<Text>, _>(
            rows.iter()
                .map(|_| AttemptId::new().as_str().to_owned())
                .collect::<Vec<_>>(),
        )
        .bind::<Array<Text>, _>(states)
        .bind::<Array<Nullable<Text>>, _>(
            starts
                .iter()
                .map(|start| start.map(|s| s.lease_owner.clone()))
                .collect::<Vec<_>>(),
        )
        .bind::<Array<Nullable<BigInt>>, _>(started(&|s| s.lease_ms))
        .bind::<Array<Nullable<BigInt>>, _>(started(&|_| now.millis()))
        .bind::<Array<Nullable<BigInt>>, _>(started(&|s| s.soft_timeout_ms))
        .bind::<BigInt, _>(now)
        .bind::<Array<Nullable<Text>>, _>(
            rows.iter()
                .map(|j| j.trace_context.clone())
                .collect::<Vec<_>>(),
        )
        .bind::<Array<Nullable<Text>>, _>(kept(&|grant| grant.digest.clone()))
        .bind::<Array<Nullable<Text>>, _>(kept(&|grant| grant.role.as_str().to_owned()))
        .keep_prepared_as::<MultiRowCreation>()
        .load(conn)?)
}

/// Names [`multi_row_creation_statement`] in a connection's statement
/// cache: its text is one whatever the number of rows (they are arrays).
struct MultiRowCreation;

/// The statement of [`insert_jobs_and_attempts`]: `$1` the owner, `$2`…
/// `$16` the rows' columns as arrays, `$17` the time of creation, `$18` the rows' trace contexts,
/// `$19` and `$20` the digest and role of each row's kept token check. Built once.
pub fn multi_row_creation_statement() -> &'static str {
    static STATEMENT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "WITH input AS (
           SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                                $7::text[], $8::text[], $9::text[], $10::text[], $11::text[],
                                $12::text[], $13::text[], $14::bigint[], $15::bigint[],
                                $16::bigint[], $18::text[], $19::text[], $20::text[])
             AS i(id, idempotency_key, task, provider, requested_provider, input, params,
                  fingerprint, status, attempt_id, state, lease_owner, lease_ms, started_at,
                  soft_timeout_ms, trace_context, grant_digest, grant_role)
         ),
         job AS (
           INSERT INTO jobs (id, owner_id, idempotency_key, task, provider, requested_provider,
                             input, params, fingerprint, status, version, created_at, updated_at,
                             trace_context)
           SELECT id, $1, idempotency_key, task, provider, requested_provider, input, params,
                  fingerprint, status, 0, $17, $17, trace_context
           FROM input
           WHERE NOT EXISTS (SELECT 1 FROM budgets WHERE budgets.owner_id = $1)
             AND (input.grant_digest IS NULL OR {grant_holds})
           ON CONFLICT (owner_id, idempotency_key) DO NOTHING
           RETURNING id, owner_id, provider
         )
         INSERT INTO attempts (id, job_id, owner_id, number, provider, state, version_read,
                               lease_owner, lease_expires_at, created_at, started_at, timeout_at,
                               sent_at)
         SELECT input.attempt_id, job.id, job.owner_id, 1, job.provider, input.state,
                CASE WHEN input.started_at IS NULL THEN NULL ELSE 0 END, input.lease_owner,
                {now_ms} + input.lease_ms, $17, input.started_at,
                input.started_at + input.soft_timeout_ms, input.started_at
         FROM job JOIN input ON input.id = job.id
         RETURNING {ATTEMPT_COLUMNS}",
            now_ms = PG_NOW_MS,
            grant_holds = super::users::grant_holds_sql(
                "$1",
                "input.grant_digest",
                "input.grant_role",
                "$17"
            ),
        )
    });
    STATEMENT.as_str()
}

/// The job an owner's key made, if any.
pub fn find_by_key(
    conn: &mut DbConnection,
    owner_id: &UserId,
    key: &str,
) -> StoreResult<Option<Job>> {
    Ok(jobs::table
        .filter(jobs::owner_id.eq(owner_id))
        .filter(jobs::idempotency_key.eq(key))
        .select(Job::as_select())
        .first(conn)
        .optional()?)
}

/// `ON CONFLICT … DO NOTHING` does not compile through the multi-backend
/// connection, so the same statement runs on the concrete one.
fn insert_job_unless_key_exists(conn: &mut DbConnection, row: &Job) -> QueryResult<usize> {
    /// Names the statement in a connection's statement cache: [`Job`]
    /// inserts every column (`None` as NULL), so its text is one.
    struct JobUnlessKeyExists;
    let target = (jobs::owner_id, jobs::idempotency_key);
    let insert = diesel::insert_into(jobs::table)
        .values(row)
        .on_conflict(target)
        .do_nothing();
    match conn {
        DbConnection::Postgresql(c) => Ok(insert
            .returning(jobs::id)
            .keep_prepared_as::<JobUnlessKeyExists>()
            .load::<String>(c)?
            .len()),
        DbConnection::Sqlite(c) => insert
            .keep_prepared_as::<JobUnlessKeyExists>()
            .count_on_sqlite(c),
    }
}

/// The owner's jobs, newest first (ids are time-ordered), `limit` at a time,
/// starting after the job id `before` when given.
pub fn list_jobs(
    conn: &mut DbConnection,
    owner_id: &UserId,
    before: Option<&JobId>,
    limit: i64,
) -> StoreResult<Vec<Job>> {
    let page = JobPage {
        after: before.cloned(),
        ..JobPage::default()
    };
    list_jobs_page(conn, owner_id, &page, limit)
}

/// Which of an owner's jobs to list, in which order, from where.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobPage {
    /// Only jobs in this status.
    pub status: Option<JobStatus>,
    /// Oldest first (else newest first).
    pub oldest_first: bool,
    /// Continue past this job (the last one of the previous page), in the
    /// page's order.
    pub after: Option<JobId>,
}

/// The owner's jobs as `page` says, `limit` at a time (ids are
/// time-ordered, so they order by creation).
pub fn list_jobs_page(
    conn: &mut DbConnection,
    owner_id: &UserId,
    page: &JobPage,
    limit: i64,
) -> StoreResult<Vec<Job>> {
    let mut query = jobs::table
        .filter(jobs::owner_id.eq(owner_id))
        .select(Job::as_select())
        .limit(limit)
        .into_boxed();
    query = if page.oldest_first {
        query.order(jobs::id.asc())
    } else {
        query.order(jobs::id.desc())
    };
    if let Some(status) = page.status {
        query = query.filter(jobs::status.eq(status));
    }
    match (&page.after, page.oldest_first) {
        (Some(after), false) => query = query.filter(jobs::id.lt(after.clone())),
        (Some(after), true) => query = query.filter(jobs::id.gt(after.clone())),
        (None, _) => {}
    }
    Ok(query.load(conn)?)
}

/// The provider each of these jobs of one owner is with: the winning
/// attempt's when it has one, else its latest attempt's.
pub fn providers_of(
    conn: &mut DbConnection,
    owner_id: &UserId,
    jobs: &[Job],
) -> StoreResult<std::collections::HashMap<JobId, String>> {
    use super::schema::attempts;
    let ids: Vec<JobId> = jobs.iter().map(|j| j.id.clone()).collect();
    let rows: Vec<(AttemptId, JobId, i32, String)> = attempts::table
        .filter(attempts::owner_id.eq(owner_id))
        .filter(attempts::job_id.eq_any(&ids))
        .select((
            attempts::id,
            attempts::job_id,
            attempts::number,
            attempts::provider,
        ))
        .load(conn)?;
    let mut providers = std::collections::HashMap::new();
    for job in jobs {
        let of_job = rows.iter().filter(|(_, job_id, _, _)| *job_id == job.id);
        let winner = job
            .completed_by
            .as_ref()
            .and_then(|won| of_job.clone().find(|(id, ..)| id == won));
        let chosen = winner.or_else(|| of_job.max_by_key(|(_, _, number, _)| *number));
        if let Some((_, _, _, provider)) = chosen {
            providers.insert(job.id.clone(), provider.clone());
        }
    }
    Ok(providers)
}
