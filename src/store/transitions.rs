//! The statements every attempt write is built from: the job-row lock that
//! orders writers, guarded state transitions (`UPDATE … WHERE state IN
//! (<from-states>)`, the guard taken from [`AttemptEvent::from_states`]), the
//! job status derived from its live attempt, and the insert that the
//! one-live-attempt index polices.

use diesel::prelude::*;

use super::ended::{job_ended, JobEnd};
use super::prepared::KeepPrepared;
use super::reads::find_owned_attempt;
use super::rows::{columns_of, Attempt, Job};
use super::rows::{AttemptKey, JobKey};
use super::schema::{attempts, jobs};
use super::{DbConnection, StoreResult};
use crate::domain::{
    AttemptEvent, AttemptId, AttemptState, JobId, JobStatus, Reason, Timestamp, UserId,
};

/// The job's live attempt (queued, running or unknown), if any.
pub fn live_attempt(conn: &mut DbConnection, key: &JobKey) -> StoreResult<Option<Attempt>> {
    Ok(attempts::table
        .filter(attempts::job_id.eq(&key.id))
        .filter(attempts::owner_id.eq(&key.owner_id))
        .filter(attempts::state.eq_any(AttemptState::LIVE))
        .select(Attempt::as_select())
        .first(conn)
        .optional()?)
}

/// On PostgreSQL, locks the job row until the transaction ends. Every write
/// transaction that touches a job or its attempts takes this lock first, so
/// they queue on the job in one order (no deadlocks) and each reads what the
/// previous one committed. SQLite needs nothing: `BEGIN IMMEDIATE` already
/// makes writers take turns.
pub fn lock_job(conn: &mut DbConnection, key: &JobKey) -> QueryResult<()> {
    if let DbConnection::Postgresql(pg) = conn {
        jobs::table
            .filter(jobs::id.eq(&key.id))
            .filter(jobs::owner_id.eq(&key.owner_id))
            .select(jobs::id)
            .for_update()
            .first::<JobId>(pg)
            .optional()?;
    }
    Ok(())
}

/// Locks the attempt's job, then reads the attempt as it is under that
/// lock. On PostgreSQL the job is found from the attempt inside the locking
/// statement (one statement, not a read and then a lock), by scalar
/// subqueries evaluated once: the job is then found by its whole primary
/// key (as `IN (subquery)` the planner may join, and a plan made while the
/// table was small scans all jobs).
pub fn lock_attempt_and_job(
    conn: &mut DbConnection,
    key: &AttemptKey,
) -> StoreResult<Option<Attempt>> {
    if let DbConnection::Postgresql(pg) = conn {
        let of_attempt = attempts::table
            .filter(attempts::id.eq(&key.id))
            .filter(attempts::owner_id.eq(&key.owner_id))
            .limit(1);
        jobs::table
            .filter(jobs::owner_id.eq(&key.owner_id))
            .filter(
                jobs::id
                    .nullable()
                    .eq(of_attempt.select(attempts::job_id).single_value()),
            )
            .select(jobs::id)
            .for_update()
            .first::<JobId>(pg)
            .optional()?;
    }
    find_owned_attempt(conn, &key.id, &key.owner_id)
}

/// `attempts.state` is one of `states`, as SQL checked on the row that the
/// statement's key (`id`, `owner_id`) found, never through
/// `attempts_state_order`. Statistics see few attempts in a live state (most
/// have finished), so for `state = 'running' AND id = …` PostgreSQL's
/// planner picks that index and walks every entry of the state, dead ones
/// included (a backlog's thousands, for one row), where the primary key
/// finds the row at once. `… IS TRUE` is not a condition an index can
/// serve; `state` is never NULL, so it means the same.
pub fn state_on_row_sql(states: &[AttemptState]) -> String {
    let list = states
        .iter()
        .map(|state| format!("'{}'", state.as_str()))
        .collect::<Vec<_>>()
        .join(", ");
    format!("(attempts.state IN ({list})) IS TRUE")
}

/// [`state_on_row_sql`] as a filter of a statement on `attempts`: typed,
/// with the states bound, so the statement is built like any other (no
/// text formatted for it on each run). The list is written as equalities
/// ([`StateIsOneOf`]), which mean the same.
pub(crate) fn state_on_row(states: &[AttemptState]) -> IsTrue<StateIsOneOf<'_>> {
    IsTrue(StateIsOneOf(states))
}

/// `attempts.state = ? OR attempts.state = ? …`, one bound state each: what
/// `attempts.state IN (?, ? …)` means, written so that SQLite checks it on
/// the row. For an `IN` list of more than two bound values SQLite builds a
/// temporary table of the values on every run of the statement (opened,
/// its pages zeroed, filled, dropped); the answer's transition of its
/// attempt ran one on every call. An empty list is false.
#[derive(Debug, Clone, Copy, diesel::expression::ValidGrouping)]
pub(crate) struct StateIsOneOf<'a>(&'a [AttemptState]);

/// Its text varies with the number of states: no static id.
impl diesel::query_builder::QueryId for StateIsOneOf<'_> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl diesel::Expression for StateIsOneOf<'_> {
    type SqlType = diesel::sql_types::Bool;
}

impl diesel::AppearsOnTable<attempts::table> for StateIsOneOf<'_> {}

impl diesel::SelectableExpression<attempts::table> for StateIsOneOf<'_> {}

impl<DB> diesel::query_builder::QueryFragment<DB> for StateIsOneOf<'_>
where
    DB: diesel::backend::Backend,
    attempts::state: diesel::query_builder::QueryFragment<DB>,
    AttemptState: diesel::serialize::ToSql<diesel::sql_types::Text, DB>,
{
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, DB>,
    ) -> QueryResult<()> {
        if self.0.is_empty() {
            out.push_sql("1 = 0");
            return Ok(());
        }
        out.push_sql("(");
        for (i, state) in self.0.iter().enumerate() {
            if i > 0 {
                out.push_sql(" OR ");
            }
            attempts::state.walk_ast(out.reborrow())?;
            out.push_sql(" = ");
            out.push_bind_param::<diesel::sql_types::Text, _>(state)?;
        }
        out.push_sql(")");
        Ok(())
    }
}

/// `(E) IS TRUE`, for [`state_on_row`].
#[derive(Debug, Clone, Copy, diesel::query_builder::QueryId, diesel::expression::ValidGrouping)]
pub(crate) struct IsTrue<E>(E);

impl<E> diesel::Expression for IsTrue<E>
where
    E: diesel::Expression<SqlType = diesel::sql_types::Bool>,
{
    type SqlType = diesel::sql_types::Bool;
}

impl<E, QS> diesel::AppearsOnTable<QS> for IsTrue<E>
where
    E: diesel::AppearsOnTable<QS>,
    Self: diesel::Expression,
{
}

impl<E, QS> diesel::SelectableExpression<QS> for IsTrue<E>
where
    E: diesel::SelectableExpression<QS>,
    Self: diesel::AppearsOnTable<QS>,
{
}

impl<E, DB> diesel::query_builder::QueryFragment<DB> for IsTrue<E>
where
    E: diesel::query_builder::QueryFragment<DB>,
    DB: diesel::backend::Backend,
{
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, DB>,
    ) -> QueryResult<()> {
        out.push_sql("(");
        self.0.walk_ast(out.reborrow())?;
        out.push_sql(") IS TRUE");
        Ok(())
    }
}

/// The key of an attempt known by its id alone (see [`find_attempt`]).
pub fn locate_attempt(
    conn: &mut DbConnection,
    attempt_id: &AttemptId,
) -> StoreResult<Option<AttemptKey>> {
    Ok(attempts::table
        .filter(attempts::id.eq(attempt_id))
        .select(attempts::owner_id)
        .first::<UserId>(conn)
        .optional()?
        .map(|owner_id| AttemptKey {
            id: attempt_id.clone(),
            owner_id,
        }))
}

/// Conditions a transition may need besides the attempt's state.
#[derive(Debug, Clone, Copy, Default)]
pub struct Guard<'a> {
    /// Only while this worker holds the attempt's lease.
    pub lease_owner: Option<&'a str>,
    /// Only if the attempt was never sent (`sent_at` is null): what another
    /// process can judge from the row alone.
    pub never_sent: bool,
}

/// Moves an attempt along `event` if it is in one of the event's from-states.
/// Returns whether the row changed. The row is addressed by its whole
/// primary key, so the plan is a unique-index look-up at any table size. `error`, when given, replaces the
/// attempt's reason (its three columns); without one (a success) the
/// earlier reason (a soft timeout, a lost lease) is kept as the attempt's
/// history.
pub fn transition(
    conn: &mut DbConnection,
    attempt: &Attempt,
    event: AttemptEvent,
    now: Timestamp,
    error: Option<&Reason>,
) -> QueryResult<bool> {
    transition_guarded(conn, attempt, event, now, error, Guard::default())
}

/// [`transition`], only if `guard` holds too. An attempt that goes back to
/// the queue ([`AttemptEvent::GivenBack`]) leaves everything its claim
/// wrote behind: the version read, the lease, the start and the soft
/// timeout, and `sent_at`, which means "this request is leaving now". One
/// closed unsent ([`AttemptEvent::ClosedUnsent`]) clears `sent_at` too.
pub fn transition_guarded(
    conn: &mut DbConnection,
    attempt: &Attempt,
    event: AttemptEvent,
    now: Timestamp,
    error: Option<&Reason>,
    guard: Guard<'_>,
) -> QueryResult<bool> {
    let target = event.target();
    let finished_at =
        matches!(target, AttemptState::Succeeded | AttemptState::Failed).then_some(now);
    let mut guarded = diesel::update(attempts::table)
        .filter(attempts::id.eq(&attempt.id))
        .filter(attempts::owner_id.eq(&attempt.owner_id))
        .filter(state_on_row(event.from_states()))
        .into_boxed();
    if let Some(lease_owner) = guard.lease_owner {
        guarded = guarded.filter(attempts::lease_owner.eq(lease_owner.to_owned()));
    }
    if guard.never_sent {
        guarded = guarded.filter(attempts::sent_at.is_null());
    }
    // Each form is kept prepared (`store::prepared`): its text varies only
    // with the guards and the `IN` list of the event's states, a fixed few.
    let changed: Vec<AttemptId> = if target == AttemptState::Queued {
        guarded
            .set((
                attempts::state.eq(target),
                attempts::sent_at.eq(None::<i64>),
                attempts::version_read.eq(None::<i64>),
                attempts::lease_expires_at.eq(None::<i64>),
                attempts::started_at.eq(None::<i64>),
                attempts::timeout_at.eq(None::<i64>),
            ))
            .returning(attempts::id)
            .keep_prepared()
            .load(conn)?
    } else {
        let moved = (
            attempts::state.eq(target),
            attempts::finished_at.eq(finished_at),
            attempts::lease_expires_at.eq(None::<i64>),
        );
        let (kind, summary, detail) = columns_of(error);
        let reason = (
            attempts::error_kind.eq(kind),
            attempts::error.eq(summary),
            attempts::error_detail.eq(detail),
        );
        if event == AttemptEvent::ClosedUnsent {
            // Its request never left: the row must not say it did, even
            // where the claim had recorded `sent_at` for a send to come.
            guarded
                .set((moved, attempts::sent_at.eq(None::<i64>), reason))
                .returning(attempts::id)
                .keep_prepared()
                .load(conn)?
        } else {
            match error {
                Some(_) => guarded
                    .set((moved, reason))
                    .returning(attempts::id)
                    .keep_prepared()
                    .load(conn)?,
                None => guarded
                    .set(moved)
                    .returning(attempts::id)
                    .keep_prepared()
                    .load(conn)?,
            }
        }
    };
    Ok(changed.len() == 1)
}

/// Re-derives a non-terminal job's status from its live attempt. Terminal jobs
/// are never touched.
pub fn refresh_job_status(
    conn: &mut DbConnection,
    key: &JobKey,
    now: Timestamp,
) -> StoreResult<()> {
    let live = live_attempt(conn, key)?.map(|a| a.state);
    let status = JobStatus::for_live_attempt(live);
    diesel::update(
        jobs::table
            .filter(jobs::id.eq(&key.id))
            .filter(jobs::owner_id.eq(&key.owner_id))
            .filter(jobs::status.ne_all(JobStatus::TERMINAL)),
    )
    .set((jobs::status.eq(status), jobs::updated_at.eq(now)))
    .execute(conn)?;
    Ok(())
}

/// Inserts a queued attempt of `job_id`, owned by the job's owner. The
/// partial unique index refuses it if the job already has a live attempt.
pub fn insert_queued_attempt(
    conn: &mut DbConnection,
    job_id: &JobId,
    owner_id: &UserId,
    number: i32,
    provider: &str,
    now: Timestamp,
) -> QueryResult<Attempt> {
    insert_waiting_attempt(conn, job_id, owner_id, number, provider, now, None)
}

/// A queued attempt of a job, before it has an id.
pub(crate) struct QueuedAttempt<'a> {
    pub job_id: &'a JobId,
    pub owner_id: &'a UserId,
    pub number: i32,
    pub provider: &'a str,
    pub now: Timestamp,
    pub not_before: Option<Timestamp>,
}

impl QueuedAttempt<'_> {
    /// Its row as its insert writes it: nothing of a claim, a send or an
    /// end yet.
    pub(crate) fn row(&self, id: AttemptId) -> Attempt {
        Attempt {
            id,
            job_id: self.job_id.clone(),
            owner_id: self.owner_id.clone(),
            number: self.number,
            provider: self.provider.to_owned(),
            state: AttemptState::Queued,
            outcome: None,
            version_read: None,
            lease_owner: None,
            lease_expires_at: None,
            created_at: self.now,
            started_at: None,
            timeout_at: None,
            finished_at: None,
            error: None,
            sent_at: None,
            not_before: self.not_before,
            error_kind: None,
            error_detail: None,
        }
    }
}

/// [`insert_queued_attempt`], for a retry that may not be sent before
/// `not_before` (the database's clock).
pub fn insert_waiting_attempt(
    conn: &mut DbConnection,
    job_id: &JobId,
    owner_id: &UserId,
    number: i32,
    provider: &str,
    now: Timestamp,
    not_before: Option<Timestamp>,
) -> QueryResult<Attempt> {
    let row = QueuedAttempt {
        job_id,
        owner_id,
        number,
        provider,
        now,
        not_before,
    }
    .row(AttemptId::new());
    /// Names the insert in a connection's statement cache: [`Attempt`]
    /// inserts every column, each value a bind, so its text is one.
    struct QueuedAttemptInsert;
    let insert = diesel::insert_into(attempts::table).values(&row);
    match conn {
        DbConnection::Postgresql(c) => {
            let _: Vec<String> = insert
                .returning(attempts::id)
                .keep_prepared_as::<QueuedAttemptInsert>()
                .load(c)?;
        }
        // No `RETURNING`: the row is known (see `store::prepared`).
        DbConnection::Sqlite(c) => insert
            .keep_prepared_as::<QueuedAttemptInsert>()
            .run_on_sqlite(c)?,
    }
    Ok(row)
}

/// Finalizes a job as failed: a version-guarded update, so it cannot overwrite
/// a result that won in the meantime. What its end brings (`job.failed`
/// events, the budget reservation back) is written in the same transaction.
pub fn fail_job(
    conn: &mut DbConnection,
    job: &Job,
    reason: &Reason,
    now: Timestamp,
) -> StoreResult<bool> {
    let (kind, summary, detail) = columns_of(Some(reason));
    let updated = diesel::update(
        jobs::table
            .filter(jobs::id.eq(&job.id))
            .filter(jobs::owner_id.eq(&job.owner_id))
            .filter(jobs::version.eq(job.version))
            .filter(jobs::completed_by.is_null())
            .filter(jobs::status.ne_all(JobStatus::TERMINAL)),
    )
    .set((
        jobs::status.eq(JobStatus::Failed),
        jobs::failure_kind.eq(kind),
        jobs::failure_reason.eq(summary),
        jobs::failure_detail.eq(detail),
        jobs::version.eq(jobs::version + 1),
        jobs::updated_at.eq(now),
    ))
    .returning(jobs::id)
    .keep_prepared()
    .load::<JobId>(conn)?
    .len();
    if updated == 1 {
        job_ended(conn, &job.key(), JobEnd::Failed, now)?;
    }
    Ok(updated == 1)
}

#[cfg(test)]
mod tests {
    use diesel::prelude::*;

    use super::state_on_row;
    use crate::domain::{AttemptEvent, AttemptState};
    use crate::store::connection::test_sqlite;
    use crate::store::schema::attempts;
    use crate::store::{migrations, DbConnection};

    /// A guarded transition from three states (an answer's, a failure's)
    /// compares the row's state with each bound value in turn: SQLite
    /// builds no temporary table of the states.
    #[test]
    fn a_transitions_states_are_checked_on_the_row_without_a_table_of_them() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = test_sqlite::connection(dir.path(), "states.db");
        migrations::run_pending(&mut conn).unwrap();
        let DbConnection::Sqlite(sqlite) = &mut conn else {
            unreachable!("a file path is a SQLite database")
        };
        let states = AttemptEvent::ProviderSucceeded.from_states();
        assert_eq!(states.len(), 3, "a list SQLite would build a table for");
        let update = diesel::update(
            attempts::table
                .filter(attempts::id.eq("a"))
                .filter(attempts::owner_id.eq("o"))
                .filter(state_on_row(states)),
        )
        .set(attempts::state.eq(AttemptState::Succeeded));
        let text = diesel::debug_query::<diesel::sqlite::Sqlite, _>(&update).to_string();
        let sql = text.split(" -- binds:").next().unwrap();
        assert!(
            sql.contains(
                "`attempts`.`state` = ? OR `attempts`.`state` = ? OR `attempts`.`state` = ?"
            ),
            "{sql}"
        );
        let opcodes = test_sqlite::opcodes(sqlite, diesel::sql_query(format!("EXPLAIN {sql}")));
        assert!(
            !opcodes.iter().any(|opcode| opcode == "OpenEphemeral"),
            "{opcodes:?}"
        );
    }
}
