//! Users, API tokens and browser sessions.

use super::{App, AppResult, User};
use crate::domain::Role;
use crate::store::sessions::{self, SignIn};
use crate::store::users::{self, IssuedToken, UserError};

impl App {
    /// The user a bearer token belongs to, if any.
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

    /// Checks a name and password, counting failures per name.
    pub async fn sign_in(&self, name: &str, password: &str) -> AppResult<SignIn> {
        let (name, password) = (name.to_owned(), password.to_owned());
        Ok(self
            .store()
            .run(move |conn| sessions::sign_in(conn, &name, &password))
            .await?)
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

    /// On a database without users, creates `admin` and returns its password
    /// (to be printed once).
    pub async fn ensure_first_admin(&self) -> AppResult<Option<String>> {
        Ok(self.store().run(sessions::ensure_first_admin).await?)
    }

    /// Creates a user and its first API token.
    pub async fn add_user(&self, name: &str, role: Role) -> Result<(User, IssuedToken), UserError> {
        let name = name.to_owned();
        self.blocking_users(move |conn| users::add_user(conn, &name, role))
            .await
    }

    /// Issues a further API token for a user.
    pub async fn issue_token(&self, name: &str) -> Result<IssuedToken, UserError> {
        let name = name.to_owned();
        self.blocking_users(move |conn| users::issue_token(conn, &name))
            .await
    }

    /// Gives a user a new random password; returns it (to be shown once).
    pub async fn reset_password(&self, name: &str) -> Result<String, UserError> {
        let name = name.to_owned();
        self.blocking_users(move |conn| {
            let password = sessions::generate_password();
            sessions::set_password(conn, &name, &password)?;
            Ok(password)
        })
        .await
    }

    /// Sets a user's password.
    pub async fn set_password(&self, name: &str, password: &str) -> Result<(), UserError> {
        let (name, password) = (name.to_owned(), password.to_owned());
        self.blocking_users(move |conn| sessions::set_password(conn, &name, &password))
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
