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
//! Run a wrapped statement with `load` or `get_result` (give it a
//! `RETURNING` if it has nothing to return): diesel's `execute` hands the
//! statement on by reference, and a reference asks the statement's own
//! parts whether it may be cached, not this wrapper. Name the columns it
//! returns (no `RETURNING *`): PostgreSQL refuses to run a kept statement
//! whose result gained a column (a migration while this process runs).

use diesel::backend::Backend;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::{QueryResult, RunQueryDsl};

/// A statement diesel's cache keeps, keyed by its text.
#[derive(Debug, Clone, Copy)]
pub struct Prepared<Q>(Q);

/// Wraps a statement so that a connection prepares it once.
pub trait KeepPrepared: Sized {
    /// Only for statements whose values are all binds (see the module).
    fn keep_prepared(self) -> Prepared<Self> {
        Prepared(self)
    }
}

impl<Q> KeepPrepared for Q {}

impl<Q, DB> QueryFragment<DB> for Prepared<Q>
where
    DB: Backend,
    Q: QueryFragment<DB>,
{
    fn walk_ast<'b>(&'b self, pass: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        self.0.walk_ast(pass)
    }

    /// The text is the cache's key, so the same text is the same statement.
    fn is_safe_to_cache_prepared(&self, _backend: &DB) -> QueryResult<bool> {
        Ok(true)
    }
}

/// No static id: the cache keys the statement by its text.
impl<Q> QueryId for Prepared<Q> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<Q: Query> Query for Prepared<Q> {
    type SqlType = Q::SqlType;
}

impl<Q, Conn> RunQueryDsl<Conn> for Prepared<Q> {}

/// A statement diesel's cache keeps under `Id`, a type naming it, instead
/// of under its text: a run neither writes the text out nor hashes it
/// (for a statement of a few kilobytes, run once a request or more, a
/// measurable share of its cost).
#[derive(Debug, Clone, Copy)]
pub struct PreparedAs<Q, Id>(Q, std::marker::PhantomData<Id>);

/// Wraps a statement of one fixed text so that a connection prepares it
/// once and finds it again by `Id`.
pub trait KeepPreparedAs: Sized {
    /// Only for a statement whose text and bind types never change: `Id`
    /// must be a type of its own, private to the one statement it names
    /// (declared beside the text, built once). Two texts under one `Id`
    /// would run the first one's.
    fn keep_prepared_as<Id: 'static>(self) -> PreparedAs<Self, Id> {
        PreparedAs(self, std::marker::PhantomData)
    }
}

impl<Q> KeepPreparedAs for Q {}

impl<Q, Id, DB> QueryFragment<DB> for PreparedAs<Q, Id>
where
    DB: Backend,
    Q: QueryFragment<DB>,
{
    fn walk_ast<'b>(&'b self, pass: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        self.0.walk_ast(pass)
    }

    fn is_safe_to_cache_prepared(&self, _backend: &DB) -> QueryResult<bool> {
        Ok(true)
    }
}

/// The statement's id is `Id`'s: the cache's key.
impl<Q, Id: 'static> QueryId for PreparedAs<Q, Id> {
    type QueryId = Id;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl<Q: Query, Id> Query for PreparedAs<Q, Id> {
    type SqlType = Q::SqlType;
}

impl<Q, Id, Conn> RunQueryDsl<Conn> for PreparedAs<Q, Id> {}
