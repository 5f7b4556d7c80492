//! Users and API tokens. A token is shown once, at creation; only its SHA-256
//! is stored, so a leaked database yields no usable token.

use diesel::prelude::*;

use super::connection::per_backend;
use super::schema::{api_tokens, users};
use super::{DbConnection, StoreError, StoreResult};
use crate::domain::password::UserName;
use crate::domain::{sha256_hex, Role, Timestamp, UserId};

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
    #[error("{0}")]
    Failed(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<diesel::result::Error> for UserError {
    fn from(e: diesel::result::Error) -> Self {
        Self::Store(e.into())
    }
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
    super::connection::write_transaction(conn, |conn| {
        let user = insert_user(conn, name, role, None)?;
        let token = insert_token(conn, &user.id, None)?;
        Ok((user, token))
    })
}

/// Creates a user who signs in with a password (this hash), without a token.
pub fn add_user_with_password(
    conn: &mut DbConnection,
    name: &str,
    role: Role,
    password_hash: &str,
) -> Result<User, UserError> {
    insert_user(conn, name, role, Some(password_hash))
}

fn insert_user(
    conn: &mut DbConnection,
    name: &str,
    role: Role,
    password_hash: Option<&str>,
) -> Result<User, UserError> {
    let name = UserName::parse(name)
        .filter(|parsed| parsed.as_str() == name)
        .ok_or(UserError::InvalidName)?;
    let id = UserId::new();
    // In a savepoint: after a refusal, the transaction can still say who
    // holds the name.
    let inserted = conn.transaction(|conn| {
        diesel::insert_into(users::table)
            .values((
                users::id.eq(&id),
                users::name.eq(name.as_str()),
                users::name_folded.eq(name.folded()),
                users::role.eq(role),
                users::created_at.eq(Timestamp::now()),
                users::password_hash.eq(password_hash),
            ))
            .execute(conn)
    });
    match inserted {
        Err(e) if super::connection::is_unique_violation(&e) => {
            return Err(UserError::NameTaken(holder_of(conn, &name)?));
        }
        other => other?,
    };
    Ok(User {
        id,
        name: name.as_str().to_owned(),
        role,
    })
}

/// The existing name a new `name` clashes with (the same but for case).
fn holder_of(conn: &mut DbConnection, name: &UserName) -> StoreResult<String> {
    let holder: Option<String> = users::table
        .filter(users::name_folded.eq(name.folded()))
        .or_filter(users::name.eq(name.as_str()))
        .select(users::name)
        .first(conn)
        .optional()?;
    Ok(holder.unwrap_or_else(|| name.as_str().to_owned()))
}

/// Users whose names differ only in case from an earlier user's: each with
/// the name of that earlier user. They were made before names were compared
/// without regard to case, and keep working until renamed.
pub fn case_clashes(conn: &mut DbConnection) -> StoreResult<Vec<(String, String)>> {
    let (later, earlier) = diesel::alias!(users as later, users as earlier);
    Ok(later
        .inner_join(
            earlier.on(earlier.field(users::name_folded).eq(diesel::dsl::sql::<
                diesel::sql_types::Nullable<diesel::sql_types::Text>,
            >("lower(later.name)"))),
        )
        .filter(later.field(users::name_folded).is_null())
        .order(later.field(users::name))
        .select((later.field(users::name), earlier.field(users::name)))
        .load(conn)?)
}

/// Renames a user; the new name must be free without regard to case.
/// Sessions, tokens, jobs and audit entries follow the user's id.
pub fn rename_user(conn: &mut DbConnection, old: &str, new: &str) -> Result<(), UserError> {
    let new_name = UserName::parse(new)
        .filter(|parsed| parsed.as_str() == new)
        .ok_or(UserError::InvalidName)?;
    super::connection::write_transaction(conn, |conn| {
        let id = id_of(conn, old)?;
        let renamed = conn.transaction(|conn| {
            diesel::update(users::table.find(&id))
                .set((
                    users::name.eq(new_name.as_str()),
                    users::name_folded.eq(new_name.folded()),
                ))
                .execute(conn)
        });
        match renamed {
            Err(e) if super::connection::is_unique_violation(&e) => {
                Err(UserError::NameTaken(holder_of(conn, &new_name)?))
            }
            other => other.map(drop).map_err(UserError::from),
        }
    })
}

/// The name of a user.
pub fn name_of(conn: &mut DbConnection, id: &UserId) -> StoreResult<String> {
    Ok(users::table.find(id).select(users::name).first(conn)?)
}

/// The id of the user with this name.
pub fn id_of(conn: &mut DbConnection, name: &str) -> Result<UserId, UserError> {
    users::table
        .filter(users::name.eq(name))
        .select(users::id)
        .first(conn)
        .optional()?
        .ok_or_else(|| UserError::NoSuchUser(name.to_owned()))
}

/// Issues a further token for an existing user, valid until `expires_at` when
/// given.
pub fn issue_token(
    conn: &mut DbConnection,
    name: &str,
    expires_at: Option<Timestamp>,
) -> Result<IssuedToken, UserError> {
    super::connection::write_transaction(conn, |conn| {
        let id = id_of(conn, name)?;
        Ok(insert_token(conn, &id, expires_at)?)
    })
}

fn insert_token(
    conn: &mut DbConnection,
    user_id: &UserId,
    expires_at: Option<Timestamp>,
) -> StoreResult<IssuedToken> {
    let token = generate_token();
    diesel::insert_into(api_tokens::table)
        .values((
            api_tokens::id.eq(uuid::Uuid::now_v7().to_string()),
            api_tokens::user_id.eq(user_id),
            api_tokens::token_sha256.eq(token_digest(&token)),
            api_tokens::created_at.eq(Timestamp::now()),
            api_tokens::expires_at.eq(expires_at),
        ))
        .execute(conn)?;
    Ok(IssuedToken(token))
}

/// The user a bearer token belongs to, if the token is live and the user
/// not disabled.
pub fn user_for_token(conn: &mut DbConnection, token: &str) -> StoreResult<Option<User>> {
    let (digest, now) = (token_digest(token), Timestamp::now());
    Ok(per_backend!(conn, |c| api_tokens::table
        .inner_join(users::table)
        .filter(api_tokens::token_sha256.eq(&digest))
        .filter(
            api_tokens::expires_at
                .is_null()
                .or(api_tokens::expires_at.gt(now)),
        )
        .filter(users::disabled_at.is_null())
        .select((users::id, users::name, users::role))
        .first::<User>(c)
        .optional())?)
}

/// What a token grants, as one statement saw it: its user, when it
/// expires, and on SQLite the credential counter at that moment
/// (`credential_changes`; docs/design.md, "A token's check, kept").
#[derive(Debug, Clone, QueryableByName)]
pub struct TokenGrant {
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub id: UserId,
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub name: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub role: Role,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    pub expires_at: Option<Timestamp>,
    /// `None` on PostgreSQL, where no counter moves: there the statement
    /// that acts on a kept grant checks the token itself ([`GrantToCheck`]).
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    pub counter: Option<i64>,
}

impl TokenGrant {
    pub fn user(&self) -> User {
        User {
            id: self.id.clone(),
            name: self.name.clone(),
            role: self.role,
        }
    }
}

/// The statement of [`grant_for_digest`], with its backend's counter
/// expression and placeholders.
macro_rules! grant_for_digest_sql {
    ($counter:literal, $digest:literal, $now:literal) => {
        concat!(
            "SELECT users.id, users.name, users.role, api_tokens.expires_at, ",
            $counter,
            " AS counter \
               FROM api_tokens JOIN users ON users.id = api_tokens.user_id \
              WHERE api_tokens.token_sha256 = ",
            $digest,
            " AND users.disabled_at IS NULL \
                AND (api_tokens.expires_at IS NULL OR api_tokens.expires_at > ",
            $now,
            ") LIMIT 1"
        )
    };
}

/// The grant of the token whose SHA-256 is `digest`, if the token is live
/// and its user not disabled. One statement, so the user and the counter
/// are one snapshot.
pub fn grant_for_digest(conn: &mut DbConnection, digest: &str) -> StoreResult<Option<TokenGrant>> {
    use super::prepared::KeepPrepared;
    use diesel::sql_types::{BigInt, Text};
    let now = Timestamp::now();
    let statement = match conn {
        DbConnection::Sqlite(_) => grant_for_digest_sql!(
            "(SELECT counter FROM credential_changes WHERE id = 1)",
            "?",
            "?"
        ),
        DbConnection::Postgresql(_) => grant_for_digest_sql!("NULL::bigint", "$1", "$2"),
    };
    let grants = per_backend!(conn, |c| diesel::sql_query(statement)
        .bind::<Text, _>(digest)
        .bind::<BigInt, _>(now)
        .keep_prepared()
        .load::<TokenGrant>(c))?;
    Ok(grants.into_iter().next())
}

/// A token check kept from an earlier read, for the statement that stores
/// a creation to confirm in its own snapshot (PostgreSQL, where no counter
/// moves): the token still live, and still its owner's, who is neither
/// disabled nor given another role since.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantToCheck {
    /// The token's SHA-256 (never the token).
    pub digest: String,
    pub role: Role,
}

/// [`GrantToCheck`] as SQL (`guards::kept_grant_holds`): true while the
/// token whose digest is `digest` is live and grants `owner` in role
/// `role` at `now`, each given as a placeholder or a column. The text
/// names them in the order digest, owner, role, now.
pub fn grant_holds_sql(owner: &str, digest: &str, role: &str, now: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM api_tokens JOIN users ON users.id = api_tokens.user_id \
                  WHERE api_tokens.token_sha256 = {digest} AND users.id = {owner} \
                    AND users.role = {role} AND users.disabled_at IS NULL \
                    AND (api_tokens.expires_at IS NULL OR api_tokens.expires_at > {now}))"
    )
}

/// Whether `grant` still holds for `owner` now ([`GrantToCheck`]), read
/// in the transaction that acts on it: the creating statements' own
/// check ([`grant_holds_sql`]), run alone.
pub fn grant_holds(
    conn: &mut DbConnection,
    owner: &UserId,
    grant: &GrantToCheck,
) -> StoreResult<bool> {
    use super::prepared::KeepPrepared;
    use diesel::sql_types::{BigInt, Bool, Text};
    #[derive(QueryableByName)]
    struct Holds {
        #[diesel(sql_type = Bool)]
        holds: bool,
    }
    // Bound in the order the text names them (SQLite's `?` are positional).
    let statement = match conn {
        DbConnection::Sqlite(_) => grant_holds_sql("?", "?", "?", "?"),
        DbConnection::Postgresql(_) => grant_holds_sql("$2", "$1", "$3", "$4"),
    };
    let holds: Vec<Holds> = per_backend!(conn, |c| diesel::sql_query(format!(
        "SELECT {statement} AS holds"
    ))
    .bind::<Text, _>(&grant.digest)
    .bind::<Text, _>(owner.as_str())
    .bind::<Text, _>(grant.role.as_str())
    .bind::<BigInt, _>(Timestamp::now())
    .keep_prepared()
    .load(c))?;
    Ok(holds.first().is_some_and(|row| row.holds))
}

/// Whether the credential counter still reads `counter` (SQLite): no token
/// was revoked and no user disabled or changed since a grant read it. Read
/// in the write transaction that acts on the grant, it is that write's
/// check of its caller's token.
pub fn credentials_unchanged_since(conn: &mut DbConnection, counter: i64) -> StoreResult<bool> {
    Ok(crate::domain::guards::kept_check_holds(
        counter,
        credential_counter(conn)?,
    ))
}

/// The credential counter now (SQLite); `None` on PostgreSQL, where
/// nothing moves it (a grant kept there is checked by [`GrantToCheck`]).
pub fn credential_counter(conn: &mut DbConnection) -> StoreResult<Option<i64>> {
    use super::prepared::KeepPrepared;
    #[derive(QueryableByName)]
    struct Counter {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        counter: i64,
    }
    match conn {
        DbConnection::Sqlite(lite) => Ok(diesel::sql_query(
            "SELECT counter FROM credential_changes WHERE id = 1",
        )
        .keep_prepared()
        .load::<Counter>(lite)?
        .first()
        .map(|now| now.counter)),
        DbConnection::Postgresql(_) => Ok(None),
    }
}

/// A user as the Users page lists them.
#[derive(Debug, Clone, PartialEq, Eq, Queryable)]
pub struct UserSummary {
    pub id: UserId,
    pub name: String,
    pub role: Role,
    pub created_at: Timestamp,
    pub last_sign_in_at: Option<Timestamp>,
    pub disabled_at: Option<Timestamp>,
    pub has_password: bool,
    /// Live API tokens.
    pub tokens: i64,
}

/// A user's row as the Users page reads it.
type UserRow = (
    UserId,
    String,
    Role,
    Timestamp,
    Option<Timestamp>,
    Option<Timestamp>,
    Option<String>,
);

/// Every user, by name, with their live token counts.
pub fn list_users(conn: &mut DbConnection) -> StoreResult<Vec<UserSummary>> {
    let now = Timestamp::now();
    let rows: Vec<UserRow> = users::table
        .order(users::name.asc())
        .select((
            users::id,
            users::name,
            users::role,
            users::created_at,
            users::last_sign_in_at,
            users::disabled_at,
            users::password_hash,
        ))
        .load(conn)?;
    let counts: Vec<(UserId, i64)> = api_tokens::table
        .filter(
            api_tokens::expires_at
                .is_null()
                .or(api_tokens::expires_at.gt(now)),
        )
        .group_by(api_tokens::user_id)
        .select((api_tokens::user_id, diesel::dsl::count_star()))
        .load(conn)?;
    Ok(rows
        .into_iter()
        .map(
            |(id, name, role, created_at, last_sign_in_at, disabled_at, hash)| UserSummary {
                tokens: counts
                    .iter()
                    .find(|(user, _)| *user == id)
                    .map_or(0, |(_, n)| *n),
                id,
                name,
                role,
                created_at,
                last_sign_in_at,
                disabled_at,
                has_password: hash.is_some(),
            },
        )
        .collect())
}

/// Changes a user's role.
pub fn set_role(conn: &mut DbConnection, id: &UserId, role: Role) -> StoreResult<bool> {
    Ok(diesel::update(users::table.find(id))
        .set(users::role.eq(role))
        .execute(conn)?
        == 1)
}

/// Disables a user (their sessions end; tokens and sessions stop working at
/// once), or enables them again.
pub fn set_disabled(conn: &mut DbConnection, id: &UserId, disabled: bool) -> StoreResult<bool> {
    super::connection::write_transaction(conn, |conn| {
        let at = disabled.then(Timestamp::now);
        let changed = diesel::update(users::table.find(id))
            .set(users::disabled_at.eq(at))
            .execute(conn)?;
        if disabled {
            diesel::delete(
                super::schema::sessions::table.filter(super::schema::sessions::user_id.eq(id)),
            )
            .execute(conn)?;
        }
        Ok(changed == 1)
    })
}

/// Deletes every API token of a user; returns how many there were.
pub fn revoke_tokens(conn: &mut DbConnection, id: &UserId) -> StoreResult<usize> {
    Ok(diesel::delete(api_tokens::table.filter(api_tokens::user_id.eq(id))).execute(conn)?)
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
