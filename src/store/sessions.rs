//! Browser sign-in's storage: credentials, server-side sessions (the cookie
//! carries a random token; only its SHA-256 is stored, so a copy of the
//! database opens no session), and the atomic failed-sign-in counters.
//! Password hashing happens elsewhere, never while a connection is held.

use diesel::prelude::*;

use super::connection::{per_backend, write_transaction};
use super::schema::{sessions, sign_in_throttle, users};
use super::users::{token_digest, User, UserError};
use super::{DbConnection, StoreResult};
use crate::domain::throttle::{self, Policy};
use crate::domain::{Role, Timestamp, UserId};

/// What signing in as a name needs to know.
#[derive(Debug, Clone)]
pub struct Credentials {
    pub user: User,
    pub password_hash: Option<String>,
    pub disabled: bool,
}

/// A user's row as signing in reads it.
type CredentialRow = (UserId, String, Role, Option<String>, Option<i64>);

pub fn credentials(conn: &mut DbConnection, name: &str) -> StoreResult<Option<Credentials>> {
    let found: Option<CredentialRow> = users::table
        .filter(users::name.eq(name))
        .select((
            users::id,
            users::name,
            users::role,
            users::password_hash,
            users::disabled_at,
        ))
        .first(conn)
        .optional()?;
    Ok(
        found.map(|(id, name, role, password_hash, disabled_at)| Credentials {
            user: User { id, name, role },
            password_hash,
            disabled: disabled_at.is_some(),
        }),
    )
}

/// Whether a sign-in may go on to check its password.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reservation {
    /// It may; it was counted as a failure in advance (a good password
    /// takes that back: `settle_good_sign_in`).
    Allowed,
    /// A scope must wait until then; nothing was counted.
    Blocked { until: Timestamp },
}

/// Counts a sign-in against its scopes before its password is checked,
/// atomically: the scopes' rows are locked (in one order), and if any must
/// still wait the sign-in is refused without being counted; otherwise each
/// count goes up and its wait is set as if the password were wrong. So
/// parallel guesses from one address are refused once the allowance is
/// spent, however many arrive at once.
pub fn reserve_attempt(
    conn: &mut DbConnection,
    scopes: &[(String, Policy)],
    now: Timestamp,
) -> StoreResult<Reservation> {
    let mut scopes: Vec<&(String, Policy)> = scopes.iter().collect();
    scopes.sort_by(|a, b| a.0.cmp(&b.0));
    write_transaction(conn, |conn| {
        let mut rows = Vec::new();
        for (scope, policy) in &scopes {
            rows.push((lock_scope(conn, scope, now)?, scope, *policy));
        }
        if let Some(until) = rows
            .iter()
            .map(|((_, _, blocked_until), _, _)| *blocked_until)
            .filter(|until| *until > now)
            .max()
        {
            return Ok(Reservation::Blocked { until });
        }
        for ((failures, last_failure_at, _), scope, policy) in rows {
            let failures = if last_failure_at < now - throttle::QUIET_WINDOW_MS {
                1
            } else {
                failures + 1
            };
            diesel::update(sign_in_throttle::table.find(scope))
                .set((
                    sign_in_throttle::failures.eq(failures),
                    sign_in_throttle::last_failure_at.eq(now),
                    sign_in_throttle::blocked_until
                        .eq(now + policy.wait_after(i64::from(failures))),
                ))
                .execute(conn)?;
        }
        Ok(Reservation::Allowed)
    })
}

/// Makes sure the scope's row exists and locks it (PostgreSQL; SQLite's
/// write transaction already excludes other writers): its failures, last
/// failure and wait.
fn lock_scope(
    conn: &mut DbConnection,
    scope: &str,
    now: Timestamp,
) -> QueryResult<(i32, Timestamp, Timestamp)> {
    use sign_in_throttle::dsl as t;
    let row = (
        t::scope.eq(scope),
        t::failures.eq(0),
        t::last_failure_at.eq(now),
        t::blocked_until.eq(Timestamp::EPOCH),
    );
    let query =
        t::sign_in_throttle
            .find(scope)
            .select((t::failures, t::last_failure_at, t::blocked_until));
    per_backend!(conn, |c| diesel::insert_into(t::sign_in_throttle)
        .values(row)
        .on_conflict(t::scope)
        .do_nothing()
        .execute(c))?;
    // SQLite has no row locks: its write transaction holds the database.
    match conn {
        DbConnection::Sqlite(c) => query.first(c),
        DbConnection::Postgresql(c) => query.for_update().first(c),
    }
}

/// Until when any of these scopes must wait, if one must wait now: a read
/// that changes nothing, so a sign-in that would be refused anyway is
/// refused before it queues for a password check.
pub fn blocked_until(
    conn: &mut DbConnection,
    scopes: &[&str],
    now: Timestamp,
) -> StoreResult<Option<Timestamp>> {
    let until: Option<Timestamp> = sign_in_throttle::table
        .filter(sign_in_throttle::scope.eq_any(scopes))
        .select(diesel::dsl::max(sign_in_throttle::blocked_until))
        .first(conn)?;
    Ok(until.filter(|until| *until > now))
}

/// After a good password: the name's count at this address is forgotten,
/// and the address's count loses only the failure this sign-in was counted
/// as in advance (`reserve_attempt`). Earlier failures from the address
/// still count: signing in to one's own account does not wipe a spray.
pub fn settle_good_sign_in(
    conn: &mut DbConnection,
    name_scope: &str,
    address_scope: &(String, Policy),
    now: Timestamp,
) -> StoreResult<()> {
    let (scope, policy) = address_scope;
    write_transaction(conn, |conn| {
        diesel::delete(sign_in_throttle::table.find(name_scope)).execute(conn)?;
        let (failures, _, blocked_until) = lock_scope(conn, scope, now)?;
        let failures = (failures - 1).max(0);
        if failures == 0 {
            diesel::delete(sign_in_throttle::table.find(scope)).execute(conn)?;
            return Ok(());
        }
        let wait_until = now + policy.wait_after(i64::from(failures));
        diesel::update(sign_in_throttle::table.find(scope))
            .set((
                sign_in_throttle::failures.eq(failures),
                sign_in_throttle::blocked_until.eq(blocked_until.min(wait_until)),
            ))
            .execute(conn)?;
        Ok(())
    })
}

/// Forgets every failure counted against a name (folded), at any address.
fn clear_name(conn: &mut DbConnection, name: &str) -> QueryResult<usize> {
    let pattern = format!(
        "{}%",
        throttle::name_prefix(name)
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_")
    );
    diesel::delete(
        sign_in_throttle::table.filter(sign_in_throttle::scope.like(pattern).escape('\\')),
    )
    .execute(conn)
}

/// Sets (or replaces) a user's password hash. Every session of that user
/// ends, and every throttle on the name is lifted.
pub fn set_password_hash(
    conn: &mut DbConnection,
    name: &str,
    hash: &str,
) -> Result<UserId, UserError> {
    write_transaction(conn, |conn| {
        let id: UserId = users::table
            .filter(users::name.eq(name))
            .select(users::id)
            .first(conn)
            .optional()?
            .ok_or_else(|| UserError::NoSuchUser(name.to_owned()))?;
        diesel::update(users::table.find(&id))
            .set(users::password_hash.eq(hash))
            .execute(conn)?;
        diesel::delete(sessions::table.filter(sessions::user_id.eq(&id))).execute(conn)?;
        clear_name(conn, &name.to_ascii_lowercase())?;
        Ok(id)
    })
}

/// Whether the database has no users yet.
pub fn no_users_yet(conn: &mut DbConnection) -> StoreResult<bool> {
    Ok(users::table.count().get_result::<i64>(conn)? == 0)
}

/// On a database without users, creates `admin` with this password hash.
/// Several processes starting at once are safe: the unique user name lets
/// exactly one of them create it. Returns whether this call did.
pub fn create_first_admin(conn: &mut DbConnection, password_hash: &str) -> StoreResult<bool> {
    write_transaction(conn, |conn| {
        if !no_users_yet(conn)? {
            return Ok(false);
        }
        let row = (
            users::id.eq(UserId::new()),
            users::name.eq("admin"),
            users::name_folded.eq("admin"),
            users::role.eq(Role::Admin),
            users::created_at.eq(Timestamp::now()),
            users::password_hash.eq(Some(password_hash)),
        );
        // Any unique index may be the one a concurrent process hit first.
        let insert = diesel::insert_into(users::table)
            .values(row)
            .on_conflict_do_nothing();
        let inserted = per_backend!(conn, |c| insert.execute(c)?);
        Ok(inserted == 1)
    })
}

/// Starts a session and notes the sign-in; returns the token for the
/// cookie (shown nowhere else).
pub fn create_session(
    conn: &mut DbConnection,
    user_id: &UserId,
    ttl_ms: i64,
) -> StoreResult<String> {
    let token = crate::domain::secret::random_hex_token();
    let now = Timestamp::now();
    write_transaction(conn, |conn| {
        diesel::insert_into(sessions::table)
            .values((
                sessions::id.eq(uuid::Uuid::now_v7().to_string()),
                sessions::token_sha256.eq(token_digest(&token)),
                sessions::user_id.eq(user_id),
                sessions::created_at.eq(now),
                sessions::expires_at.eq(now + ttl_ms),
            ))
            .execute(conn)?;
        diesel::update(users::table.find(user_id))
            .set(users::last_sign_in_at.eq(now))
            .execute(conn)?;
        Ok(token)
    })
}

/// The user of a live session; a disabled user's sessions open nothing.
pub fn user_for_session(conn: &mut DbConnection, token: &str) -> StoreResult<Option<User>> {
    Ok(sessions::table
        .inner_join(users::table)
        .filter(sessions::token_sha256.eq(token_digest(token)))
        .filter(sessions::expires_at.gt(Timestamp::now()))
        .filter(users::disabled_at.is_null())
        .select((users::id, users::name, users::role))
        .first::<User>(conn)
        .optional()?)
}

pub fn end_session(conn: &mut DbConnection, token: &str) -> StoreResult<()> {
    diesel::delete(sessions::table.filter(sessions::token_sha256.eq(token_digest(token))))
        .execute(conn)?;
    Ok(())
}

/// What a cleanup removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CleanedUp {
    pub sessions: usize,
    pub throttles: usize,
}

/// Removes expired sessions, and failure counters that are quiet and no
/// longer make anyone wait.
pub fn clean_up(conn: &mut DbConnection, now: Timestamp) -> StoreResult<CleanedUp> {
    let sessions =
        diesel::delete(sessions::table.filter(sessions::expires_at.le(now))).execute(conn)?;
    let throttles = diesel::delete(
        sign_in_throttle::table
            .filter(sign_in_throttle::last_failure_at.lt(now - throttle::QUIET_WINDOW_MS))
            .filter(sign_in_throttle::blocked_until.le(now)),
    )
    .execute(conn)?;
    Ok(CleanedUp {
        sessions,
        throttles,
    })
}
