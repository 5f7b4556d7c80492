//! Users and API tokens. A token is shown once, at creation; only its SHA-256
//! is stored, so a leaked database yields no usable token.

use diesel::prelude::*;

use super::schema::{api_tokens, users};
use super::{now_ms, DbConnection, StoreError, StoreResult};
use crate::domain::{sha256_hex, Role, UserId};

/// Who someone is: the owner of jobs and tokens, and the actor of console
/// actions.
#[derive(Debug, Clone, PartialEq, Eq, Queryable)]
pub struct User {
    pub id: UserId,
    pub name: String,
    pub role: Role,
}

/// A freshly issued API token: the clear text exists only in this value.
pub struct IssuedToken(pub String);

#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("a user named {0:?} already exists")]
    NameTaken(String),
    #[error("no user named {0:?}")]
    NoSuchUser(String),
    #[error("user names are 1-64 characters of letters, digits, '-', '_' or '.'")]
    InvalidName,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<diesel::result::Error> for UserError {
    fn from(e: diesel::result::Error) -> Self {
        Self::Store(e.into())
    }
}

fn is_valid_user_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// Generates a token: `oj_` + 256 random bits in hex.
fn generate_token() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the operating system's random source is available");
    format!("oj_{}", hex::encode(bytes))
}

pub fn token_digest(token: &str) -> String {
    sha256_hex(token.as_bytes())
}

/// Creates a user and its first API token.
pub fn add_user(
    conn: &mut DbConnection,
    name: &str,
    role: Role,
) -> Result<(User, IssuedToken), UserError> {
    if !is_valid_user_name(name) {
        return Err(UserError::InvalidName);
    }
    super::connection::write_transaction(conn, |conn| {
        let id = UserId::new();
        let inserted = diesel::insert_into(users::table)
            .values((
                users::id.eq(&id),
                users::name.eq(name),
                users::role.eq(role),
                users::created_at.eq(now_ms()),
            ))
            .execute(conn);
        match inserted {
            Err(e) if super::connection::is_unique_violation(&e) => {
                return Err(UserError::NameTaken(name.to_owned()))
            }
            other => other?,
        };
        let token = insert_token(conn, &id)?;
        Ok((
            User {
                id,
                name: name.to_owned(),
                role,
            },
            token,
        ))
    })
}

/// Issues a further token for an existing user.
pub fn issue_token(conn: &mut DbConnection, name: &str) -> Result<IssuedToken, UserError> {
    super::connection::write_transaction(conn, |conn| {
        let id: UserId = users::table
            .filter(users::name.eq(name))
            .select(users::id)
            .first(conn)
            .optional()?
            .ok_or_else(|| UserError::NoSuchUser(name.to_owned()))?;
        Ok(insert_token(conn, &id)?)
    })
}

fn insert_token(conn: &mut DbConnection, user_id: &UserId) -> StoreResult<IssuedToken> {
    let token = generate_token();
    diesel::insert_into(api_tokens::table)
        .values((
            api_tokens::id.eq(uuid::Uuid::now_v7().to_string()),
            api_tokens::user_id.eq(user_id),
            api_tokens::token_sha256.eq(token_digest(&token)),
            api_tokens::created_at.eq(now_ms()),
        ))
        .execute(conn)?;
    Ok(IssuedToken(token))
}

/// The user a bearer token belongs to, if any.
pub fn user_for_token(conn: &mut DbConnection, token: &str) -> StoreResult<Option<User>> {
    Ok(api_tokens::table
        .inner_join(users::table)
        .filter(api_tokens::token_sha256.eq(token_digest(token)))
        .select((users::id, users::name, users::role))
        .first::<User>(conn)
        .optional()?)
}

pub fn find_by_name(conn: &mut DbConnection, name: &str) -> StoreResult<Option<User>> {
    Ok(users::table
        .filter(users::name.eq(name))
        .select((users::id, users::name, users::role))
        .first::<User>(conn)
        .optional()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_long_random_and_prefixed() {
        let a = generate_token();
        let b = generate_token();
        assert_ne!(a, b);
        assert!(a.starts_with("oj_"));
        assert_eq!(a.len(), 3 + 64);
    }

    #[test]
    fn the_digest_is_not_the_token() {
        let token = generate_token();
        assert_ne!(token_digest(&token), token);
        assert_eq!(token_digest(&token).len(), 64);
    }
}
