//! SQLite: one owner's creations in a group-commit batch as multi-row
//! inserts (the jobs, then the first attempts of those stored), in the
//! caller's transaction. Most of a lone creation's cost on SQLite is per
//! statement, not per row: a batch of 32 runs a few statements instead of
//! 160 (a savepoint, two inserts, the budget's read and the release, each).
//!
//! Rows go in chunks of a power of two, so that a connection keeps at most a
//! few texts prepared. Each chunk's statement is a type of its own
//! ([`JobsChunk`], [`AttemptsChunk`]) that binds its values straight from
//! the rows, where a `sql_query` boxed each value bound, and that
//! diesel's cache finds by a type naming its text ([`ChunkText`]).

use diesel::prelude::*;
use diesel::query_builder::{AstPass, QueryFragment};
use diesel::sql_types::{BigInt, Nullable, Text};
use diesel::sqlite::{Sqlite, SqliteConnection};

use super::connection::SQLITE_NOW_MS;
use super::prepared::{CacheKey, KeepPrepared, Prepared};
use super::queue::StartNow;
use super::rows::{Attempt, Job, ATTEMPT_COLUMNS};
use super::schema::jobs;
use super::transitions::QueuedAttempt;
use super::StoreResult;
use crate::domain::{AttemptId, AttemptState, Timestamp, UserId};

/// The most rows one of SQLite's multi-row inserts carries. SQLite refuses
/// a statement with more than 32,766 bound values, and a batch can be as
/// large as `database.group_commit_rows` allows: 64 rows of fourteen values
/// stay far under it, and a connection keeps at most seven texts of each
/// insert prepared (1, 2, 4 … 64 rows; the attempts' twice over, with and
/// without their rows returned).
pub const MAX_ROWS_PER_STATEMENT: usize = 64;

/// One creation of a batch: its job's row (its key among the columns), and
/// how its first attempt starts (`None`: queued).
pub(super) type Creation<'a> = (&'a Job, Option<&'a StartNow>);

/// Inserts `batch`'s jobs and the first attempt of each job stored; returns
/// those attempts. A creation whose key had made a job, or that the owner's
/// budget keeps from this statement, stores nothing here, and its caller
/// makes or finds it alone.
pub(super) fn insert_jobs_and_attempts(
    conn: &mut SqliteConnection,
    owner: &UserId,
    batch: &[Creation<'_>],
    now: Timestamp,
) -> StoreResult<Vec<Attempt>> {
    let mut made: Vec<Creation<'_>> = Vec::with_capacity(batch.len());
    for (from, to) in power_of_two_chunks(batch.len()) {
        let chunk = &batch[from..to];
        let count =
            run_kept::<JobsText, _, _>(chunk.len(), JobsChunk { owner, now, chunk }, Count(conn))?;
        match count {
            0 => {}
            all if all == chunk.len() => made.extend_from_slice(chunk),
            _ => {
                let stored = stored_job_ids(conn, chunk)?;
                made.extend(
                    chunk
                        .iter()
                        .filter(|(job, _)| stored.contains(job.id.as_str())),
                );
            }
        }
    }
    insert_first_attempts(conn, owner, &made, now)
}

/// Which of `rows` the jobs' insert stored, read back when it stored some
/// but not all (a key came twice or had made a job before): the ids are
/// fresh, so a row found by its id is one this batch stored. The insert
/// itself returns nothing, which spares SQLite a table of the rows it
/// wrote (see `store::prepared`).
fn stored_job_ids(
    conn: &mut SqliteConnection,
    chunk: &[Creation<'_>],
) -> QueryResult<std::collections::HashSet<String>> {
    let ids: Vec<&str> = chunk.iter().map(|(job, _)| job.id.as_str()).collect();
    let stored: Vec<String> = jobs::table
        .filter(jobs::id.eq_any(&ids))
        .select(jobs::id)
        .load(conn)?;
    Ok(stored.into_iter().collect())
}

/// The first attempts of the jobs a batch made (`made`), in chunks as
/// [`insert_jobs_and_attempts`] inserts their jobs.
fn insert_first_attempts(
    conn: &mut SqliteConnection,
    owner: &UserId,
    made: &[Creation<'_>],
    now: Timestamp,
) -> StoreResult<Vec<Attempt>> {
    let mut attempts = Vec::with_capacity(made.len());
    for (from, to) in power_of_two_chunks(made.len()) {
        let chunk = AttemptsChunk::of(owner, &made[from..to], now);
        if chunk.returns_rows() {
            let rows = run_kept::<StartedAttemptsText, _, _>(chunk.rows.len(), chunk, Load(conn))?;
            attempts.extend(rows);
            continue;
        }
        let ids: Vec<AttemptId> = chunk.rows.iter().map(|row| row.id.clone()).collect();
        run_kept::<QueuedAttemptsText, _, _>(chunk.rows.len(), chunk, Run(conn))?;
        attempts.extend(made[from..to].iter().zip(ids).map(|((job, _), id)| {
            QueuedAttempt {
                job_id: &job.id,
                owner_id: owner,
                number: 1,
                provider: &job.provider,
                now,
                not_before: None,
            }
            .row(id)
        }));
    }
    Ok(attempts)
}

/// The statements of a batch, each a text per chunk length: the jobs' insert,
/// and the first attempts' with (some started) and without (all queued)
/// their rows returned.
struct JobsText;
struct QueuedAttemptsText;
struct StartedAttemptsText;

/// Names the text of `Kind`'s statement for a chunk of `ROWS` rows, by
/// which diesel's cache finds it: a run neither writes its text out (some
/// kilobytes for a long chunk) nor hashes it. The text depends on nothing
/// else (see each statement's `walk_ast`).
struct ChunkText<Kind, const ROWS: usize>(std::marker::PhantomData<Kind>);

/// Runs a chunk's statement kept prepared, whichever key it is kept by.
trait RunKept<Q> {
    type Out;
    fn run<K: CacheKey>(self, kept: Prepared<Q, K>) -> Self::Out;
}

/// Runs `query`, a chunk of `rows` rows, kept prepared under the
/// [`ChunkText`] of `Kind` at that length; a length no chunk has
/// (see [`is_chunk_length`]) is kept by its text.
fn run_kept<Kind: 'static, Q, R: RunKept<Q>>(rows: usize, query: Q, runner: R) -> R::Out {
    match rows {
        1 => runner.run(query.keep_prepared_as::<ChunkText<Kind, 1>>()),
        2 => runner.run(query.keep_prepared_as::<ChunkText<Kind, 2>>()),
        4 => runner.run(query.keep_prepared_as::<ChunkText<Kind, 4>>()),
        8 => runner.run(query.keep_prepared_as::<ChunkText<Kind, 8>>()),
        16 => runner.run(query.keep_prepared_as::<ChunkText<Kind, 16>>()),
        32 => runner.run(query.keep_prepared_as::<ChunkText<Kind, 32>>()),
        64 => runner.run(query.keep_prepared_as::<ChunkText<Kind, 64>>()),
        _ => runner.run(query.keep_prepared()),
    }
}

/// Runs the jobs' insert; how many rows it stored.
struct Count<'c>(&'c mut SqliteConnection);

impl<'a> RunKept<JobsChunk<'a>> for Count<'_> {
    type Out = QueryResult<usize>;
    fn run<K: CacheKey>(self, kept: Prepared<JobsChunk<'a>, K>) -> Self::Out {
        kept.count_on_sqlite(self.0)
    }
}

/// Runs the queued attempts' insert.
struct Run<'c>(&'c mut SqliteConnection);

impl<'a> RunKept<AttemptsChunk<'a>> for Run<'_> {
    type Out = QueryResult<()>;
    fn run<K: CacheKey>(self, kept: Prepared<AttemptsChunk<'a>, K>) -> Self::Out {
        kept.run_on_sqlite(self.0)
    }
}

/// Runs the attempts' insert that returns its rows.
struct Load<'c>(&'c mut SqliteConnection);

impl<'a> RunKept<AttemptsChunk<'a>> for Load<'_> {
    type Out = QueryResult<Vec<Attempt>>;
    fn run<K: CacheKey>(self, kept: Prepared<AttemptsChunk<'a>, K>) -> Self::Out {
        kept.load(self.0)
    }
}

/// One chunk of a batch's jobs, each row's values bound in turn.
struct JobsChunk<'a> {
    owner: &'a UserId,
    now: Timestamp,
    chunk: &'a [Creation<'a>],
}

impl QueryFragment<Sqlite> for JobsChunk<'_> {
    /// SQLite needs the `WHERE` to read `ON CONFLICT` as the upsert's.
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
        debug_assert!(
            is_chunk_length(self.chunk.len()),
            "{} rows",
            self.chunk.len()
        );
        out.push_sql(
            "INSERT INTO jobs (id, owner_id, idempotency_key, task, provider, \
             requested_provider, input, params, fingerprint, status, version, created_at, \
             updated_at, trace_context) SELECT * FROM (VALUES ",
        );
        for (i, (job, _)) in self.chunk.iter().enumerate() {
            let mut row = Values::open(&mut out, i);
            row.bind::<Text, str>(job.id.as_str())?
                .bind::<Text, str>(self.owner.as_str())?
                .bind::<Text, str>(&job.idempotency_key)?
                .bind::<Text, str>(&job.task)?
                .bind::<Text, str>(&job.provider)?
                .bind::<Nullable<Text>, _>(&job.requested_provider)?
                .bind::<Text, str>(job.input.as_str())?
                .bind::<Text, str>(job.params.as_str())?
                .bind::<Text, str>(&job.fingerprint)?
                .bind::<Text, str>(job.status.as_str())?
                .sql("0")
                .bind::<BigInt, _>(&self.now)?
                .bind::<BigInt, _>(&self.now)?
                .bind::<Nullable<Text>, _>(&job.trace_context)?
                .close();
        }
        out.push_sql(") WHERE NOT EXISTS (SELECT 1 FROM budgets WHERE budgets.owner_id = ");
        out.push_bind_param::<Text, str>(self.owner.as_str())?;
        out.push_sql(") ON CONFLICT (owner_id, idempotency_key) DO NOTHING");
        Ok(())
    }
}

/// One chunk of a batch's first attempts, each row's values bound in turn.
/// Queued attempts are all known here and return nothing; a started one's
/// lease runs on the database's clock, which only the row can tell, so a
/// chunk with one returns its rows.
struct AttemptsChunk<'a> {
    owner: &'a UserId,
    now: Timestamp,
    rows: Vec<FirstAttempt<'a>>,
}

/// A first attempt's values, queued or started as
/// `queue::insert_started_attempt` starts one.
struct FirstAttempt<'a> {
    id: AttemptId,
    job_id: &'a str,
    provider: &'a str,
    state: &'static str,
    version_read: Option<i64>,
    lease_owner: Option<&'a str>,
    lease_ms: Option<i64>,
    started_at: Option<Timestamp>,
    timeout_at: Option<Timestamp>,
}

impl<'a> AttemptsChunk<'a> {
    fn of(owner: &'a UserId, made: &[Creation<'a>], now: Timestamp) -> Self {
        let rows: Vec<FirstAttempt<'a>> = made
            .iter()
            .map(|&(job, start)| {
                let state = match start {
                    Some(_) => AttemptState::Running,
                    None => AttemptState::Queued,
                };
                FirstAttempt {
                    id: AttemptId::new(),
                    job_id: job.id.as_str(),
                    provider: &job.provider,
                    state: state.as_str(),
                    version_read: start.map(|_| job.version),
                    lease_owner: start.map(|s| s.lease_owner.as_str()),
                    lease_ms: start.map(|s| s.lease_ms),
                    started_at: start.map(|_| now),
                    timeout_at: start.map(|s| now + s.soft_timeout_ms),
                }
            })
            .collect();
        AttemptsChunk { owner, now, rows }
    }

    /// Whether the insert returns its rows: only where one started.
    fn returns_rows(&self) -> bool {
        self.rows.iter().any(|row| row.started_at.is_some())
    }
}

impl QueryFragment<Sqlite> for AttemptsChunk<'_> {
    /// A started attempt's lease runs on the database's clock.
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
        debug_assert!(is_chunk_length(self.rows.len()), "{} rows", self.rows.len());
        out.push_sql(
            "INSERT INTO attempts (id, job_id, owner_id, number, provider, state, version_read, \
             lease_owner, lease_expires_at, created_at, started_at, timeout_at, sent_at) VALUES ",
        );
        for (i, row) in self.rows.iter().enumerate() {
            let mut values = Values::open(&mut out, i);
            values
                .bind::<Text, str>(row.id.as_str())?
                .bind::<Text, str>(row.job_id)?
                .bind::<Text, str>(self.owner.as_str())?
                .sql("1")
                .bind::<Text, str>(row.provider)?
                .bind::<Text, str>(row.state)?
                .bind::<Nullable<BigInt>, _>(&row.version_read)?
                .bind::<Nullable<Text>, _>(&row.lease_owner)?
                .sql(SQLITE_NOW_MS)
                .and_bind::<Nullable<BigInt>, _>(" + ", &row.lease_ms)?
                .bind::<BigInt, _>(&self.now)?
                .bind::<Nullable<BigInt>, _>(&row.started_at)?
                .bind::<Nullable<BigInt>, _>(&row.timeout_at)?
                .bind::<Nullable<BigInt>, _>(&row.started_at)?
                .close();
        }
        if self.returns_rows() {
            out.push_sql(" RETURNING ");
            out.push_sql(ATTEMPT_COLUMNS);
        }
        Ok(())
    }
}

/// One row of a multi-row insert's `VALUES`, `(a, b, …)`, written value by
/// value: each bind a `?` of its own, pushed in the order the text names it.
struct Values<'p, 'q, 'b> {
    out: &'p mut AstPass<'q, 'b, Sqlite>,
    first: bool,
}

impl<'p, 'q, 'b> Values<'p, 'q, 'b> {
    /// Opens the `n`th row (zero-based).
    fn open(out: &'p mut AstPass<'q, 'b, Sqlite>, n: usize) -> Self {
        out.push_sql(if n == 0 { "(" } else { ", (" });
        Values { out, first: true }
    }

    fn next(&mut self) {
        if !std::mem::take(&mut self.first) {
            self.out.push_sql(", ");
        }
    }

    fn bind<T, U>(&mut self, value: &'b U) -> QueryResult<&mut Self>
    where
        Sqlite: diesel::sql_types::HasSqlType<T>,
        U: diesel::serialize::ToSql<T, Sqlite> + ?Sized,
    {
        self.next();
        self.out.push_bind_param::<T, U>(value)?;
        Ok(self)
    }

    /// A value written as SQL.
    fn sql(&mut self, text: &str) -> &mut Self {
        self.next();
        self.out.push_sql(text);
        self
    }

    /// Goes on the value just written with `text` and a bind.
    fn and_bind<T, U>(&mut self, text: &str, value: &'b U) -> QueryResult<&mut Self>
    where
        Sqlite: diesel::sql_types::HasSqlType<T>,
        U: diesel::serialize::ToSql<T, Sqlite> + ?Sized,
    {
        self.out.push_sql(text);
        self.out.push_bind_param::<T, U>(value)?;
        Ok(self)
    }

    fn close(&mut self) {
        self.out.push_sql(")");
    }
}

/// Whether a chunk may hold `rows` rows: a length [`power_of_two_chunks`]
/// gives, so that a connection keeps at most a few texts prepared.
fn is_chunk_length(rows: usize) -> bool {
    rows.is_power_of_two() && rows <= MAX_ROWS_PER_STATEMENT
}

impl diesel::query_builder::Query for AttemptsChunk<'_> {
    type SqlType = diesel::sql_types::Untyped;
}

/// `0..n` cut into runs whose lengths are powers of two, longest first,
/// none longer than [`MAX_ROWS_PER_STATEMENT`].
fn power_of_two_chunks(n: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut from = 0;
    std::iter::from_fn(move || {
        let left = n - from;
        (left > 0).then(|| {
            let len = (1 << left.ilog2()).min(MAX_ROWS_PER_STATEMENT);
            from += len;
            (from - len, from)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::{power_of_two_chunks, MAX_ROWS_PER_STATEMENT};

    fn lengths(n: usize) -> Vec<usize> {
        power_of_two_chunks(n).map(|(from, to)| to - from).collect()
    }

    #[test]
    fn chunks_are_powers_of_two_longest_first_and_cover_every_row() {
        assert_eq!(lengths(0), Vec::<usize>::new());
        assert_eq!(lengths(1), [1]);
        assert_eq!(lengths(7), [4, 2, 1]);
        assert_eq!(lengths(64), [64]);
        let chunks: Vec<(usize, usize)> = power_of_two_chunks(45).collect();
        assert_eq!(chunks, [(0, 32), (32, 40), (40, 44), (44, 45)]);
    }

    #[test]
    fn no_chunk_is_longer_than_one_statement_carries() {
        assert_eq!(lengths(200), [64, 64, 64, 8]);
        let big = lengths(5_000);
        assert!(big.iter().all(|&len| len <= MAX_ROWS_PER_STATEMENT));
        assert_eq!(big.iter().sum::<usize>(), 5_000);
    }
}
