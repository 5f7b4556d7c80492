//! Owner budgets (docs/design.md, "Usage, prices and budgets"): the row a
//! creation reserves against, the reservation each unfinished job holds,
//! and the spend each recorded call adds.
//!
//! Every change reads the owner's row under a lock (`FOR UPDATE` on
//! PostgreSQL; SQLite's write transaction holds the whole database), asks
//! `domain::ledger` what the row becomes, and writes it back: the rule
//! lives once, in the domain, and the database's lock makes it hold across
//! processes.

use diesel::prelude::*;

use super::connection::DbConnection;
use super::prepared::KeepPrepared;
use super::rows::JobKey;
use super::schema::{budget_reservations, budgets};
use super::{StoreError, StoreResult};
use crate::domain::ledger::{
    may_reserve, month_start, next_month_start, BudgetCounters, BudgetLimits, Reservation,
};
use crate::domain::{Timestamp, UserId};

/// An owner's budget row.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable, Insertable)]
#[diesel(table_name = budgets)]
pub struct BudgetRow {
    pub owner_id: UserId,
    pub spend_limit_micros: Option<i64>,
    pub token_limit: Option<i64>,
    pub period_start: Timestamp,
    pub spent_micros: i64,
    pub spent_tokens: i64,
    pub reserved_micros: i64,
    pub reserved_tokens: i64,
    pub updated_at: Timestamp,
}

impl BudgetRow {
    pub fn limits(&self) -> BudgetLimits {
        BudgetLimits {
            spend_micros: self.spend_limit_micros,
            tokens: self.token_limit,
        }
    }

    pub fn counters(&self) -> BudgetCounters {
        BudgetCounters {
            period_start: self.period_start,
            spent_micros: self.spent_micros,
            spent_tokens: self.spent_tokens,
            reserved_micros: self.reserved_micros,
            reserved_tokens: self.reserved_tokens,
        }
    }

    fn with_counters(&self, counters: BudgetCounters, now: Timestamp) -> Self {
        Self {
            period_start: counters.period_start,
            spent_micros: counters.spent_micros,
            spent_tokens: counters.spent_tokens,
            reserved_micros: counters.reserved_micros,
            reserved_tokens: counters.reserved_tokens,
            updated_at: now,
            ..self.clone()
        }
    }
}

/// What a write changes in an owner's row: every column but the owner,
/// which is the distribution column on Citus, and Citus refuses an UPDATE
/// that sets it, even to the value it has (`modifying the partition value
/// of rows is not allowed`).
#[derive(AsChangeset)]
#[diesel(table_name = budgets, treat_none_as_null = true)]
struct BudgetChanges {
    spend_limit_micros: Option<i64>,
    token_limit: Option<i64>,
    period_start: Timestamp,
    spent_micros: i64,
    spent_tokens: i64,
    reserved_micros: i64,
    reserved_tokens: i64,
    updated_at: Timestamp,
}

impl From<&BudgetRow> for BudgetChanges {
    fn from(row: &BudgetRow) -> Self {
        Self {
            spend_limit_micros: row.spend_limit_micros,
            token_limit: row.token_limit,
            period_start: row.period_start,
            spent_micros: row.spent_micros,
            spent_tokens: row.spent_tokens,
            reserved_micros: row.reserved_micros,
            reserved_tokens: row.reserved_tokens,
            updated_at: row.updated_at,
        }
    }
}

/// A creation the budget refused: which limit, and when it resets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub limits: BudgetLimits,
    /// What the month has committed (spent and reserved) before this job.
    pub committed: Reservation,
    /// What this job would have reserved.
    pub wanted: Reservation,
    /// When the month's spend starts again from zero.
    pub resets_at: Timestamp,
}

/// The owner's budget row, locked until the transaction ends.
fn lock(conn: &mut DbConnection, owner_id: &UserId) -> StoreResult<Option<BudgetRow>> {
    let query = budgets::table.filter(budgets::owner_id.eq(owner_id));
    // SQLite has no row locks: its write transaction holds the database.
    Ok(match conn {
        DbConnection::Postgresql(c) => query
            .select(BudgetRow::as_select())
            .for_update()
            .first(c)
            .optional()?,
        DbConnection::Sqlite(c) => query.select(BudgetRow::as_select()).first(c).optional()?,
    })
}

fn write(conn: &mut DbConnection, row: &BudgetRow) -> StoreResult<()> {
    diesel::update(budgets::table.filter(budgets::owner_id.eq(&row.owner_id)))
        .set(BudgetChanges::from(row))
        .returning(budgets::owner_id)
        .keep_prepared()
        .load::<String>(conn)?;
    Ok(())
}

/// Reserves `wanted` for a job just inserted, in the creating transaction:
/// `Ok(None)` when it fits (or the owner has no budget), `Ok(Some(refused))`
/// when it does not, and the caller must roll the creation back.
pub fn reserve(
    conn: &mut DbConnection,
    job: &JobKey,
    wanted: Reservation,
    now: Timestamp,
) -> StoreResult<Option<Refused>> {
    let Some(row) = lock(conn, &job.owner_id)? else {
        return Ok(None);
    };
    let month = month_start(now);
    let counters = row.counters();
    if !may_reserve(&row.limits(), &counters, month, wanted) {
        return Ok(Some(Refused {
            limits: row.limits(),
            committed: counters.committed(month),
            wanted,
            resets_at: next_month_start(now),
        }));
    }
    write(
        conn,
        &row.with_counters(counters.reserve(month, wanted), now),
    )?;
    diesel::insert_into(budget_reservations::table)
        .values((
            budget_reservations::job_id.eq(&job.id),
            budget_reservations::owner_id.eq(&job.owner_id),
            budget_reservations::micros.eq(wanted.micros),
            budget_reservations::tokens.eq(wanted.tokens),
            budget_reservations::created_at.eq(now),
        ))
        .execute(conn)?;
    Ok(None)
}

/// Adds a recorded call's cost to its owner's month, if the owner has a
/// budget.
pub fn spend(
    conn: &mut DbConnection,
    job: &JobKey,
    spent: Reservation,
    now: Timestamp,
) -> StoreResult<()> {
    settle(conn, job, false, spent, now)
}

/// What a recorded call and its job's end do to the owner's budget, under
/// one lock of its row: `release` gives the job's reservation back (its
/// row deleted, so once), `spent` is added to the month. An owner without
/// a budget has no reservations (removing a budget removes them): one
/// read, and nothing to write.
pub fn settle(
    conn: &mut DbConnection,
    job: &JobKey,
    release: bool,
    spent: Reservation,
    now: Timestamp,
) -> StoreResult<()> {
    if !release && spent == Reservation::default() {
        return Ok(());
    }
    let Some(row) = lock(conn, &job.owner_id)? else {
        return Ok(());
    };
    let mut counters = row.counters();
    if release {
        if let Some(held) = take_reservation(conn, job)? {
            counters = counters.release(held);
        }
    }
    if spent != Reservation::default() {
        counters = counters.spend(month_start(now), spent.micros, spent.tokens);
    }
    if counters != row.counters() {
        write(conn, &row.with_counters(counters, now))?;
    }
    Ok(())
}

#[derive(QueryableByName)]
struct Held {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    micros: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    tokens: i64,
}

/// Deletes a job's reservation, returning what it held (one statement).
fn take_reservation(conn: &mut DbConnection, job: &JobKey) -> StoreResult<Option<Reservation>> {
    use diesel::sql_types::Text;
    const SQL: &str = "DELETE FROM budget_reservations WHERE job_id = $1 AND owner_id = $2 \
                       RETURNING micros, tokens";
    let held: Vec<Held> = match conn {
        DbConnection::Postgresql(c) => diesel::sql_query(SQL)
            .bind::<Text, _>(job.id.as_str())
            .bind::<Text, _>(job.owner_id.as_str())
            .keep_prepared()
            .load(c)?,
        DbConnection::Sqlite(c) => diesel::sql_query(SQL.replace('$', "?"))
            .bind::<Text, _>(job.id.as_str())
            .bind::<Text, _>(job.owner_id.as_str())
            .keep_prepared()
            .load(c)?,
    };
    Ok(held.first().map(|h| Reservation {
        micros: h.micros,
        tokens: h.tokens,
    }))
}

/// Sets an owner's limits, creating the row if there is none. A new row's
/// month starts with what the ledger already recorded this month
/// (`spent_this_month`) and nothing reserved: jobs created before the
/// budget hold nothing.
pub fn set_limits(
    conn: &mut DbConnection,
    owner_id: &UserId,
    limits: BudgetLimits,
    spent_this_month: Reservation,
    now: Timestamp,
) -> StoreResult<BudgetRow> {
    super::connection::write_transaction(conn, |conn| {
        let row = match lock(conn, owner_id)? {
            Some(row) => {
                let row = BudgetRow {
                    spend_limit_micros: limits.spend_micros,
                    token_limit: limits.tokens,
                    updated_at: now,
                    ..row
                };
                write(conn, &row)?;
                row
            }
            None => {
                let row = BudgetRow {
                    owner_id: owner_id.clone(),
                    spend_limit_micros: limits.spend_micros,
                    token_limit: limits.tokens,
                    period_start: month_start(now),
                    spent_micros: spent_this_month.micros,
                    spent_tokens: spent_this_month.tokens,
                    reserved_micros: 0,
                    reserved_tokens: 0,
                    updated_at: now,
                };
                diesel::insert_into(budgets::table)
                    .values(&row)
                    .execute(conn)?;
                row
            }
        };
        Ok(row)
    })
}

/// Removes an owner's budget (and the reservations held against it).
pub fn remove(conn: &mut DbConnection, owner_id: &UserId) -> StoreResult<bool> {
    super::connection::write_transaction(conn, |conn| {
        diesel::delete(
            budget_reservations::table.filter(budget_reservations::owner_id.eq(owner_id)),
        )
        .execute(conn)?;
        let removed =
            diesel::delete(budgets::table.filter(budgets::owner_id.eq(owner_id))).execute(conn)?;
        Ok::<_, StoreError>(removed == 1)
    })
}

/// An owner's budget row, if any.
pub fn find(conn: &mut DbConnection, owner_id: &UserId) -> StoreResult<Option<BudgetRow>> {
    Ok(budgets::table
        .filter(budgets::owner_id.eq(owner_id))
        .select(BudgetRow::as_select())
        .first(conn)
        .optional()?)
}

/// What one job holds, if anything.
pub fn reservation_of(conn: &mut DbConnection, job: &JobKey) -> StoreResult<Option<Reservation>> {
    Ok(budget_reservations::table
        .filter(budget_reservations::job_id.eq(&job.id))
        .filter(budget_reservations::owner_id.eq(&job.owner_id))
        .select((budget_reservations::micros, budget_reservations::tokens))
        .first::<(i64, i64)>(conn)
        .optional()?
        .map(|(micros, tokens)| Reservation { micros, tokens }))
}

/// Every budget, by owner (admins).
pub fn list(conn: &mut DbConnection, limit: i64) -> StoreResult<Vec<BudgetRow>> {
    Ok(budgets::table
        .order(budgets::owner_id.asc())
        .limit(limit)
        .select(BudgetRow::as_select())
        .load(conn)?)
}
