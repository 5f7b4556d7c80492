//! Browser sign-in: argon2id passwords, server-side sessions and throttled
//! failed sign-ins. The session cookie carries a random token; only its
//! SHA-256 is stored, so a copy of the database opens no session.

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use diesel::prelude::*;

use super::connection::write_transaction;
use super::schema::{login_failures, sessions, users};
use super::users::{token_digest, User, UserError};
use super::{now_ms, DbConnection, StoreResult};
use crate::domain::{Role, UserId};

/// Failed sign-ins allowed per user name within [`THROTTLE_WINDOW_MS`].
pub const MAX_FAILED_SIGN_INS: i64 = 5;
pub const THROTTLE_WINDOW_MS: i64 = 15 * 60 * 1000;

/// A readable random password: 20 characters from an unambiguous alphabet.
pub fn generate_password() -> String {
    const ALPHABET: &[u8] = b"abcdefghjkmnpqrstuvwxyzABCDEFGHJKMNPQRSTUVWXYZ23456789";
    let mut bytes = [0u8; 20];
    getrandom::fill(&mut bytes).expect("the operating system's random source is available");
    bytes
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}

pub fn hash_password(password: &str) -> String {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .expect("argon2id hashing with default parameters")
        .to_string()
}

fn verify_password(password: &str, stored: &str) -> bool {
    PasswordHash::new(stored)
        .map(|hash| {
            Argon2::default()
                .verify_password(password.as_bytes(), &hash)
                .is_ok()
        })
        .unwrap_or(false)
}

/// Sets (or replaces) a user's password.
pub fn set_password(conn: &mut DbConnection, name: &str, password: &str) -> Result<(), UserError> {
    let hash = hash_password(password);
    let updated = diesel::update(users::table.filter(users::name.eq(name)))
        .set(users::password_hash.eq(hash))
        .execute(conn)?;
    if updated == 0 {
        return Err(UserError::NoSuchUser(name.to_owned()));
    }
    Ok(())
}

/// On a database without users, creates `admin` with a fresh password and
/// returns that password (to be printed once). Several processes starting at
/// once are safe: the unique user name lets exactly one of them create it.
pub fn ensure_first_admin(conn: &mut DbConnection) -> StoreResult<Option<String>> {
    write_transaction(conn, |conn| {
        let existing: i64 = users::table.count().get_result(conn)?;
        if existing > 0 {
            return Ok(None);
        }
        let password = generate_password();
        let row = (
            users::id.eq(UserId::new()),
            users::name.eq("admin"),
            users::role.eq(Role::Admin),
            users::created_at.eq(now_ms()),
            users::password_hash.eq(Some(hash_password(&password))),
        );
        let inserted = match conn {
            DbConnection::Sqlite(c) => diesel::insert_into(users::table)
                .values(row)
                .on_conflict(users::name)
                .do_nothing()
                .execute(c)?,
            DbConnection::Postgresql(c) => diesel::insert_into(users::table)
                .values(row)
                .on_conflict(users::name)
                .do_nothing()
                .execute(c)?,
        };
        Ok((inserted == 1).then_some(password))
    })
}

#[derive(Debug)]
pub enum SignIn {
    Ok(User),
    BadCredentials,
    /// Too many failures for this name: try again after this many seconds.
    Throttled {
        retry_after_s: i64,
    },
}

/// Checks a name and password, counting failures per name.
pub fn sign_in(conn: &mut DbConnection, name: &str, password: &str) -> StoreResult<SignIn> {
    let now = now_ms();
    let since = now - THROTTLE_WINDOW_MS;
    let failures: Vec<i64> = login_failures::table
        .filter(login_failures::user_name.eq(name))
        .filter(login_failures::at.gt(since))
        .order(login_failures::at.asc())
        .select(login_failures::at)
        .load(conn)?;
    if failures.len() as i64 >= MAX_FAILED_SIGN_INS {
        let oldest = failures[failures.len() - MAX_FAILED_SIGN_INS as usize];
        return Ok(SignIn::Throttled {
            retry_after_s: ((oldest + THROTTLE_WINDOW_MS - now) / 1000).max(1),
        });
    }
    let found: Option<(UserId, String, Role, Option<String>)> = users::table
        .filter(users::name.eq(name))
        .select((users::id, users::name, users::role, users::password_hash))
        .first(conn)
        .optional()?;
    let verified = match &found {
        Some((_, _, _, Some(hash))) => verify_password(password, hash),
        _ => {
            // Spend the same work for unknown names, so timing does not tell.
            let _ = verify_password(
                password,
                DUMMY_HASH.get_or_init(|| hash_password("not a password")),
            );
            false
        }
    };
    if !verified {
        diesel::insert_into(login_failures::table)
            .values((
                login_failures::id.eq(uuid::Uuid::now_v7().to_string()),
                login_failures::user_name.eq(name),
                login_failures::at.eq(now),
            ))
            .execute(conn)?;
        return Ok(SignIn::BadCredentials);
    }
    diesel::delete(login_failures::table.filter(login_failures::user_name.eq(name)))
        .execute(conn)?;
    let (id, name, role, _) = found.expect("verified implies found");
    Ok(SignIn::Ok(User { id, name, role }))
}

static DUMMY_HASH: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Starts a session; returns the token for the cookie (shown nowhere else).
pub fn create_session(
    conn: &mut DbConnection,
    user_id: &UserId,
    ttl_ms: i64,
) -> StoreResult<String> {
    let token = crate::domain::secret::random_hex_token();
    let now = now_ms();
    diesel::insert_into(sessions::table)
        .values((
            sessions::id.eq(uuid::Uuid::now_v7().to_string()),
            sessions::token_sha256.eq(token_digest(&token)),
            sessions::user_id.eq(user_id),
            sessions::created_at.eq(now),
            sessions::expires_at.eq(now + ttl_ms),
        ))
        .execute(conn)?;
    Ok(token)
}

pub fn user_for_session(conn: &mut DbConnection, token: &str) -> StoreResult<Option<User>> {
    Ok(sessions::table
        .inner_join(users::table)
        .filter(sessions::token_sha256.eq(token_digest(token)))
        .filter(sessions::expires_at.gt(now_ms()))
        .select((users::id, users::name, users::role))
        .first::<User>(conn)
        .optional()?)
}

pub fn end_session(conn: &mut DbConnection, token: &str) -> StoreResult<()> {
    diesel::delete(sessions::table.filter(sessions::token_sha256.eq(token_digest(token))))
        .execute(conn)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_hash_with_argon2id_and_verify() {
        let hash = hash_password("correct horse");
        assert!(hash.starts_with("$argon2id$"));
        assert!(verify_password("correct horse", &hash));
        assert!(!verify_password("wrong horse", &hash));
        assert!(!verify_password("anything", "not a hash"));
    }

    #[test]
    fn generated_passwords_are_long_and_differ() {
        let a = generate_password();
        assert_eq!(a.len(), 20);
        assert_ne!(a, generate_password());
    }
}
