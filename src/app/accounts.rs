//! Users, API tokens and browser sessions.
//!
//! Signing in never holds a database connection while a password is hashed:
//! the name is checked first (no database, no hashing, for a name that
//! cannot exist), the throttle and the stored hash are read, the connection
//! goes back to the pool, and argon2 runs on a blocking thread when its turn
//! comes in a short, bounded line (`password_queue`); a flood slows sign-ins
//! down a little or gets `503` (with `Retry-After`), never starving every
//! other request and the worker's lease renewals of connections or CPU.

use super::{require_admin, App, AppError, AppResult, User};
use crate::domain::password::{generate_password, hash_password, verify_password, UserName};
use crate::domain::{throttle, AuditAction, AuditReason, Role, Timestamp, UserId};
use crate::store::operator::{record_audit, Audited};
use crate::store::sessions::{self, CleanedUp, Reservation};
use crate::store::users::{self, IssuedToken, UserError, UserSummary};

/// How a sign-in went.
#[derive(Debug)]
pub enum SignIn {
    Ok(User),
    /// Wrong name or password (which, is not said to the client). `account`
    /// is the name when it belongs to an account: only such a name is safe
    /// to log (anything else may be a password typed into the wrong field).
    BadCredentials {
        account: Option<String>,
    },
    /// The right password, for a disabled user.
    Disabled,
    /// Too many failures from this address (for this name): wait this long.
    Throttled {
        retry_after_s: i64,
    },
    /// No password check could be run in time: try again shortly. Nothing
    /// was counted.
    Busy,
}

impl App {
    /// The user a bearer token belongs to, if the token is live.
    pub async fn user_for_token(&self, token: &str) -> AppResult<Option<User>> {
        let token = token.to_owned();
        Ok(self
            .store()
            .run(move |conn| users::user_for_token(conn, &token))
            .await?)
    }

    /// The user a session cookie's token belongs to, if the session is live.
    pub async fn user_for_session(&self, token: &str) -> AppResult<Option<User>> {
        let token = token.to_owned();
        Ok(self
            .store()
            .run(move |conn| sessions::user_for_session(conn, &token))
            .await?)
    }

    /// Checks a name and password from `address`, in this order, so that
    /// a flood costs honest users as little as possible:
    /// 1. a name that cannot exist: refused, nothing counted or hashed;
    /// 2. this address's place in the line for password checks, and a read
    ///    of its throttle: refused at once (503 / 429), nothing counted;
    /// 3. its turn in the line (at most a short wait): else 503, nothing
    ///    counted;
    /// 4. counted in advance, atomically, as a failure of the address and,
    ///    if the name is an account's, of the name at this address;
    /// 5. the password; a good one takes its own count back.
    pub async fn sign_in(
        &self,
        raw_name: &str,
        password: &str,
        address: std::net::IpAddr,
    ) -> AppResult<SignIn> {
        let Some(name) = UserName::parse(raw_name) else {
            return Ok(SignIn::BadCredentials { account: None });
        };
        let group = throttle::address_group(address);
        let address_scope = throttle::address_scope(&group);
        let name_scope = throttle::name_scope(&name.folded(), &group);
        let queue = &self.inner.password_queue;
        let Ok(place) = queue.join(&group) else {
            return Ok(SignIn::Busy);
        };
        let now = Timestamp::now();
        let scope_names = [name_scope.0.clone(), address_scope.0.clone()];
        let blocked = self
            .store()
            .run(move |conn| {
                let scopes: Vec<&str> = scope_names.iter().map(String::as_str).collect();
                sessions::blocked_until(conn, &scopes, now)
            })
            .await?;
        if let Some(until) = blocked {
            return Ok(throttled(until, now));
        }
        let Ok(turn) = queue.turn(place).await else {
            return Ok(SignIn::Busy);
        };
        let now = Timestamp::now();
        let lookup = name.as_str().to_owned();
        let counted = (name_scope.clone(), address_scope.clone());
        let (reservation, credentials) = self
            .store()
            .run(move |conn| {
                let credentials = sessions::credentials(conn, &lookup)?;
                let (name_scope, address_scope) = counted;
                let mut scopes = vec![address_scope];
                if credentials.is_some() {
                    scopes.push(name_scope);
                }
                let reservation = sessions::reserve_attempt(conn, &scopes, now)?;
                Ok((reservation, credentials))
            })
            .await?;
        if let Reservation::Blocked { until } = reservation {
            return Ok(throttled(until, now));
        }
        let stored = credentials.as_ref().and_then(|c| c.password_hash.clone());
        let password = password.to_owned();
        let verified = tokio::task::spawn_blocking(move || {
            let _turn = turn;
            verify_password(&password, stored.as_deref())
        })
        .await
        .map_err(|_| AppError::Internal)?;
        match credentials {
            Some(credentials) if verified => {
                let now = Timestamp::now();
                self.store()
                    .run(move |conn| {
                        sessions::settle_good_sign_in(conn, &name_scope.0, &address_scope, now)
                    })
                    .await?;
                if credentials.disabled {
                    return Ok(SignIn::Disabled);
                }
                Ok(SignIn::Ok(credentials.user))
            }
            // Counted already, in the reservation.
            credentials => Ok(SignIn::BadCredentials {
                account: credentials.map(|c| c.user.name),
            }),
        }
    }

    /// Starts a session for `user`; returns the cookie's token.
    pub async fn start_session(&self, user: &User) -> AppResult<String> {
        let ttl_ms = self.config().server.session_hours as i64 * 3_600_000;
        let user_id = user.id.clone();
        Ok(self
            .store()
            .run(move |conn| sessions::create_session(conn, &user_id, ttl_ms))
            .await?)
    }

    pub async fn end_session(&self, token: &str) -> AppResult<()> {
        let token = token.to_owned();
        Ok(self
            .store()
            .run(move |conn| sessions::end_session(conn, &token))
            .await?)
    }

    /// Removes expired sessions and quiet sign-in failure counters.
    pub async fn clean_up(&self) -> AppResult<CleanedUp> {
        let now = Timestamp::now();
        Ok(self
            .store()
            .run(move |conn| sessions::clean_up(conn, now))
            .await?)
    }

    /// Hashes a password on a blocking thread, waiting for a hashing slot.
    async fn hash(&self, password: &str) -> AppResult<String> {
        let permit = self
            .inner
            .password_queue
            .slot()
            .await
            .ok_or(AppError::Internal)?;
        let password = password.to_owned();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            hash_password(&password)
        })
        .await
        .map_err(|_| AppError::Internal)
    }

    /// On a database without users, creates `admin` and returns its password
    /// (to be printed once).
    pub async fn ensure_first_admin(&self) -> AppResult<Option<String>> {
        if !self.store().run(sessions::no_users_yet).await? {
            return Ok(None);
        }
        let password = generate_password();
        let hash = self.hash(&password).await?;
        let created = self
            .store()
            .run(move |conn| sessions::create_first_admin(conn, &hash))
            .await?;
        Ok(created.then_some(password))
    }

    /// Creates a user and its first API token (the command line).
    pub async fn add_user(&self, name: &str, role: Role) -> Result<(User, IssuedToken), UserError> {
        let name = name.to_owned();
        self.blocking_users(move |conn| users::add_user(conn, &name, role))
            .await
    }

    /// Issues a further API token for a user, valid for `days` when given.
    pub async fn issue_token(
        &self,
        name: &str,
        days: Option<u32>,
    ) -> Result<IssuedToken, UserError> {
        let name = name.to_owned();
        let expires_at = days.map(|d| Timestamp::now() + i64::from(d) * 86_400_000);
        self.blocking_users(move |conn| users::issue_token(conn, &name, expires_at))
            .await
    }

    /// Gives a user a new random password; returns it (to be shown once).
    /// Their sessions end, and any sign-in throttle on the name is lifted.
    pub async fn reset_password(&self, name: &str) -> Result<String, UserError> {
        let password = generate_password();
        self.set_password(name, &password).await?;
        Ok(password)
    }

    /// Sets a user's password; their sessions end, throttles are lifted.
    pub async fn set_password(&self, name: &str, password: &str) -> Result<(), UserError> {
        let hash = self
            .hash(password)
            .await
            .map_err(|e| UserError::Failed(e.to_string()))?;
        let name = name.to_owned();
        self.blocking_users(move |conn| sessions::set_password_hash(conn, &name, &hash).map(drop))
            .await
    }

    /// Disables (or enables) a user from the command line.
    pub async fn set_disabled_by_name(&self, name: &str, disabled: bool) -> Result<(), UserError> {
        let name = name.to_owned();
        self.blocking_users(move |conn| {
            let id = users::id_of(conn, &name)?;
            users::set_disabled(conn, &id, disabled)?;
            Ok(())
        })
        .await
    }

    /// Renames a user from the command line.
    pub async fn rename_user(&self, name: &str, new_name: &str) -> Result<(), UserError> {
        let (name, new_name) = (name.to_owned(), new_name.to_owned());
        self.blocking_users(move |conn| users::rename_user(conn, &name, &new_name))
            .await
    }

    /// Deletes every API token of a user from the command line; how many.
    pub async fn revoke_tokens_by_name(&self, name: &str) -> Result<usize, UserError> {
        let name = name.to_owned();
        self.blocking_users(move |conn| {
            let id = users::id_of(conn, &name)?;
            Ok(users::revoke_tokens(conn, &id)?)
        })
        .await
    }

    async fn blocking_users<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut crate::store::DbConnection) -> Result<T, UserError> + Send + 'static,
    ) -> Result<T, UserError> {
        self.store()
            .run(move |conn| Ok(f(conn)))
            .await
            .map_err(UserError::Store)?
    }
}

/// A sign-in refused until `until`.
fn throttled(until: Timestamp, now: Timestamp) -> SignIn {
    SignIn::Throttled {
        retry_after_s: ((until - now) as f64 / 1000.0).ceil().max(1.0) as i64,
    }
}

/// What an admin does on the Users page; each is audited with a reason.
#[derive(Debug, Clone)]
pub enum UserAction {
    Add { name: String, role: Role },
    ResetPassword,
    RevokeTokens,
    Disable,
    Enable,
    SetRole(Role),
}

impl UserAction {
    fn audit_action(&self) -> AuditAction {
        match self {
            Self::Add { .. } => AuditAction::AddUser,
            Self::ResetPassword => AuditAction::ResetPassword,
            Self::RevokeTokens => AuditAction::RevokeTokens,
            Self::Disable => AuditAction::DisableUser,
            Self::Enable => AuditAction::EnableUser,
            Self::SetRole(_) => AuditAction::SetRole,
        }
    }
}

/// A Users-page action as it is written: the ones that set a password
/// carry its hash, so none can be written without one.
#[derive(Debug)]
enum UserWrite {
    Add { role: Role, hash: String },
    ResetPassword { hash: String },
    RevokeTokens,
    Disable,
    Enable,
    SetRole(Role),
}

/// What a Users-page action produced.
#[derive(Debug)]
pub struct UserActionDone {
    pub user: String,
    /// A new password, to be shown once.
    pub password: Option<String>,
    pub note: String,
}

impl App {
    /// Every user, for the Users page (admin).
    pub async fn list_users(&self, actor: &User) -> AppResult<Vec<UserSummary>> {
        require_admin(actor)?;
        Ok(self.store().run(users::list_users).await?)
    }

    /// Runs a Users-page action on `subject` (a user's name; for `Add`, the
    /// new name), audited with `reason` (admin).
    pub async fn user_action(
        &self,
        actor: &User,
        subject: &str,
        action: UserAction,
        reason: &str,
    ) -> AppResult<UserActionDone> {
        require_admin(actor)?;
        let reason = AuditReason::parse(reason).map_err(AppError::bad_reason)?;
        let name = match &action {
            UserAction::Add { name, .. } => UserName::parse(name),
            _ => UserName::parse(subject),
        }
        .ok_or_else(|| AppError::InvalidBody {
            detail: "user names are 1-64 characters of letters, digits, '-', '_' or '.'".into(),
            field: Some("name".into()),
        })?;
        if matches!(
            action,
            UserAction::Disable | UserAction::SetRole(Role::User | Role::Support)
        ) && name.as_str() == actor.name
        {
            return Err(AppError::invalid_body(
                "admins cannot disable or demote themselves here; another admin can",
            ));
        }
        let audit = action.audit_action();
        let (write, password) = match action {
            UserAction::Add { role, .. } => {
                let password = generate_password();
                let hash = self.hash(&password).await?;
                (UserWrite::Add { role, hash }, Some(password))
            }
            UserAction::ResetPassword => {
                let password = generate_password();
                let hash = self.hash(&password).await?;
                (UserWrite::ResetPassword { hash }, Some(password))
            }
            UserAction::RevokeTokens => (UserWrite::RevokeTokens, None),
            UserAction::Disable => (UserWrite::Disable, None),
            UserAction::Enable => (UserWrite::Enable, None),
            UserAction::SetRole(role) => (UserWrite::SetRole(role), None),
        };
        let actor_id = actor.id.clone();
        let subject_name = name.as_str().to_owned();
        let note = self
            .store()
            .run(move |conn| {
                crate::store::connection::write_transaction(conn, |conn| {
                    user_action_in(
                        conn,
                        &actor_id,
                        &subject_name,
                        &write,
                        reason.as_str(),
                        audit,
                    )
                })
            })
            .await?
            .map_err(|e| match e {
                UserError::NoSuchUser(_) => AppError::NotFound,
                UserError::NameTaken(name) => {
                    AppError::invalid_body(format!("a user named {name:?} already exists"))
                }
                UserError::InvalidName => AppError::invalid_body(e.to_string()),
                UserError::Store(e) => e.into(),
                UserError::Failed(detail) => AppError::invalid_body(detail),
            })?;
        Ok(UserActionDone {
            user: name.as_str().to_owned(),
            password,
            note,
        })
    }
}

/// One Users-page action and its audit entry, in one transaction.
fn user_action_in(
    conn: &mut crate::store::DbConnection,
    actor: &UserId,
    name: &str,
    write: &UserWrite,
    reason: &str,
    audit: AuditAction,
) -> Result<Result<String, UserError>, crate::store::StoreError> {
    let now = Timestamp::now();
    let done: Result<(UserId, String), UserError> = (|| match write {
        UserWrite::Add { role, hash } => {
            let user = users::add_user_with_password(conn, name, *role, hash)?;
            Ok((user.id, format!("added {name} as {role}")))
        }
        UserWrite::ResetPassword { hash } => {
            let id = sessions::set_password_hash(conn, name, hash)?;
            Ok((id, format!("new password for {name}; their sessions ended")))
        }
        UserWrite::RevokeTokens => {
            let id = users::id_of(conn, name)?;
            let n = users::revoke_tokens(conn, &id)?;
            Ok((id, format!("revoked {n} API token(s) of {name}")))
        }
        UserWrite::Disable => {
            let id = users::id_of(conn, name)?;
            users::set_disabled(conn, &id, true)?;
            Ok((id, format!("disabled {name}")))
        }
        UserWrite::Enable => {
            let id = users::id_of(conn, name)?;
            users::set_disabled(conn, &id, false)?;
            Ok((id, format!("enabled {name}")))
        }
        UserWrite::SetRole(role) => {
            let id = users::id_of(conn, name)?;
            users::set_role(conn, &id, *role)?;
            Ok((id, format!("{name} is now {role}")))
        }
    })();
    match done {
        Ok((subject, note)) => {
            record_audit(
                conn,
                actor,
                audit,
                Audited::User(&subject),
                &format!("{note}: {reason}"),
                now,
            )?;
            Ok(Ok(note))
        }
        Err(UserError::Store(e)) => Err(e),
        Err(other) => Ok(Err(other)),
    }
}
