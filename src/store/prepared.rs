//! Statements kept prepared, which diesel would prepare anew on every run.
//!
//! diesel caches a connection's prepared statements, but refuses any
//! statement holding a part whose text may vary with its values: every
//! `UPDATE` (a changeset may leave columns out), an `IN` list, an
//! `ON CONFLICT … DO UPDATE`, an insert with a `DEFAULT` (PostgreSQL), a
//! `sql()` fragment and a `sql_query`. Those are
//! parsed and planned again each time: on SQLite in this process, on
//! PostgreSQL by the server. The compare-and-swap and the started attempt's
//! insert are such statements, on the path of every answer.
//!
//! [`KeepPrepared::keep_prepared`] lets diesel cache one anyway, keyed by
//! its SQL text and bind types (never by its Rust type), so a statement
//! whose text varies is cached once per text. The cache holds what it is
//! given for the connection's life: a statement wrapped here must take
//! every value as a bind, never written into its text, so that its texts
//! are a small fixed set.
//!
//! Run a wrapped statement with `load` or `get_result`: diesel's `execute`
//! hands the statement on by reference, and a reference asks the
//! statement's own parts whether it may be cached, not this wrapper. Name
//! the columns it returns (no `RETURNING *`): PostgreSQL refuses to run a
//! kept statement whose result gained a column (a migration while this
//! process runs). On SQLite, a statement with nothing to return runs with
//! [`Prepared::run_on_sqlite`] (or [`Prepared::count_on_sqlite`]) instead, without a `RETURNING`: SQLite
//! gathers a `RETURNING` clause's rows in a table of their own, and a write
//! with one keeps a statement journal (a copy of each page it changes),
//! which a single-row write without one does not need.

use diesel::backend::Backend;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::BigInt;
use diesel::sqlite::{Sqlite, SqliteConnection};
use diesel::{QueryResult, RunQueryDsl};

/// How a kept statement is found in a connection's cache: by its text, or
/// by a type naming it.
pub trait CacheKey: 'static {
    type Id: 'static;
    const BY_TYPE: bool;
}

/// Found by its text (diesel hashes it on every run).
#[derive(Debug, Clone, Copy)]
pub struct ByText;

impl CacheKey for ByText {
    type Id = ();
    const BY_TYPE: bool = false;
}

/// Found by `Id`, a type naming one statement: a run neither writes the
/// text out nor hashes it (for a statement of a few kilobytes, run once a
/// request or more, a measurable share of its cost).
#[derive(Debug, Clone, Copy)]
pub struct ByType<Id>(std::marker::PhantomData<Id>);

impl<Id: 'static> CacheKey for ByType<Id> {
    type Id = Id;
    const BY_TYPE: bool = true;
}

/// A statement diesel's cache keeps, found as `K` says.
#[derive(Debug, Clone, Copy)]
pub struct Prepared<Q, K = ByText>(Q, std::marker::PhantomData<K>);

/// Wraps a statement so that a connection prepares it once.
pub trait KeepPrepared: Sized {
    /// Only for statements whose values are all binds (see the module).
    fn keep_prepared(self) -> Prepared<Self> {
        Prepared(self, std::marker::PhantomData)
    }

    /// [`KeepPrepared::keep_prepared`], found by `Id` instead of its text.
    /// Only for a statement whose text and bind types never change: `Id`
    /// must be a type of its own, private to the one statement it names
    /// (declared beside the text, built once). Two texts under one `Id`
    /// would run the first one's.
    fn keep_prepared_as<Id: 'static>(self) -> Prepared<Self, ByType<Id>> {
        Prepared(self, std::marker::PhantomData)
    }
}

impl<Q> KeepPrepared for Q {}

impl<Q, K, DB> QueryFragment<DB> for Prepared<Q, K>
where
    DB: Backend,
    Q: QueryFragment<DB>,
{
    fn walk_ast<'b>(&'b self, pass: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        self.0.walk_ast(pass)
    }

    /// The key (its text, or its `Id`) is the cache's, so the same key is
    /// the same statement.
    fn is_safe_to_cache_prepared(&self, _backend: &DB) -> QueryResult<bool> {
        Ok(true)
    }
}

/// By text: no static id, so the cache keys the statement by its text; by
/// type: `Id`'s.
impl<Q, K: CacheKey> QueryId for Prepared<Q, K> {
    type QueryId = K::Id;
    const HAS_STATIC_QUERY_ID: bool = K::BY_TYPE;
}

impl<Q: Query, K> Query for Prepared<Q, K> {
    type SqlType = Q::SqlType;
}

impl<Q, K, Conn> RunQueryDsl<Conn> for Prepared<Q, K> {}

/// A write with nothing to return, given a row type so that it can be kept
/// and run through `load` (see the module); it returns no rows.
struct NoRows<Q>(Q);

impl<Q, DB> QueryFragment<DB> for NoRows<Q>
where
    DB: Backend,
    Q: QueryFragment<DB>,
{
    fn walk_ast<'b>(&'b self, pass: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        self.0.walk_ast(pass)
    }
}

impl<Q> Query for NoRows<Q> {
    type SqlType = diesel::sql_types::Integer;
}

/// Names the statement that reads SQLite's count of the rows the last
/// write changed.
struct ChangesOfLastWrite;

impl<Q, K> Prepared<Q, K>
where
    Q: QueryFragment<Sqlite>,
    K: CacheKey,
{
    /// Runs a kept write that has no `RETURNING` on SQLite.
    pub fn run_on_sqlite(self, conn: &mut SqliteConnection) -> QueryResult<()> {
        let none: Vec<i32> =
            Prepared::<_, K>(NoRows(self.0), std::marker::PhantomData).load(conn)?;
        debug_assert!(
            none.is_empty(),
            "a write run without RETURNING returned rows"
        );
        Ok(())
    }

    /// [`Prepared::run_on_sqlite`], returning how many rows the write
    /// inserted, updated or deleted (`changes()`, which a conflict that
    /// did nothing leaves at 0).
    pub fn count_on_sqlite(self, conn: &mut SqliteConnection) -> QueryResult<usize> {
        self.run_on_sqlite(conn)?;
        let changed: i64 = diesel::select(diesel::dsl::sql::<BigInt>("changes()"))
            .keep_prepared_as::<ChangesOfLastWrite>()
            .get_result(conn)?;
        Ok(usize::try_from(changed).unwrap_or(0))
    }
}
