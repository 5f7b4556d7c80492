//! A token's check, kept (docs/design.md): a request that creates a job
//! takes its bearer token's user from the grants this process has already
//! read, without a read of its own, and the write that stores the job
//! confirms the grant.
//!
//! - **SQLite:** a grant is kept with the credential counter as the read
//!   saw it (`credential_changes`, which triggers move whenever a token is
//!   revoked or changed and whenever a user is disabled, enabled, given
//!   another role or deleted, by any process or by hand). The creating
//!   transaction reads the counter once per batch, under the write lock:
//!   unchanged, the token was still good when the job was stored; moved,
//!   nothing of the creation is stored.
//! - **PostgreSQL:** no counter moves (a row every token change writes
//!   would be one hot row for every process, and across a Citus cluster).
//!   The statement that stores the job checks the token itself, in its own
//!   snapshot: the job is inserted only where the token is still live and
//!   still grants its owner, neither disabled nor given another role.
//!
//! Where the check fails, the token is read again, and the creation runs
//! again on that read, or is refused with 401. Any other way a creation is
//! answered (on PostgreSQL, a replay found by key; a twin's job; a
//! refusal) reads the token again before it answers. So a revocation stops
//! a token at once, across processes, as the per-request read did; only
//! the read is saved.
//!
//! Requests that read one token at once share the read ([`GrantReads`]):
//! the twins of a storm under one key, each answered from its leader's
//! job, confirm their token with the reads that begin while they wait,
//! not one read each. A shared read the database was too busy for
//! answers each request that joined it with the same retryable refusal
//! (503), as a creation's twins share their leader's: none adds a wait
//! of its own to a database already behind.

use std::collections::HashMap;
use std::sync::Mutex;

use super::flights::{Flight, Flights, Joined};
use super::{App, AppError, AppResult, User};
use crate::domain::Timestamp;
use crate::store::users::{self, GrantToCheck, TokenGrant};

/// The most grants one process keeps; past it, they are all dropped
/// (each is read again at its next use).
const MAX_KEPT: usize = 4096;

/// How a request's bearer token was checked.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Credential {
    /// Read from the database for this request.
    #[default]
    Checked,
    /// Taken from this process's kept grants: the write that acts on it
    /// confirms it, or it is read again before anything is answered.
    Kept(KeptGrant),
}

/// A kept grant's token (by its SHA-256, never in clear), the role it
/// granted, and on SQLite the counter it was read at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptGrant {
    digest: String,
    role: crate::domain::Role,
    /// `None` on PostgreSQL: the storing statement checks the token.
    counter: Option<i64>,
}

impl Credential {
    /// The counter the creating transaction must read unchanged (SQLite).
    pub(crate) fn kept_counter(&self) -> Option<i64> {
        match self {
            Self::Checked => None,
            Self::Kept(kept) => kept.counter,
        }
    }

    /// The grant the statement storing the job must find still holding
    /// (PostgreSQL).
    pub(crate) fn grant_to_check(&self) -> Option<GrantToCheck> {
        match self {
            Self::Kept(kept) if kept.counter.is_none() => Some(GrantToCheck {
                digest: kept.digest.clone(),
                role: kept.role,
            }),
            _ => None,
        }
    }

    pub(crate) fn is_kept(&self) -> bool {
        matches!(self, Self::Kept(_))
    }

    /// Whether the creating write confirmed this check, when it `stored`
    /// the job or found the one its key had made: a counter by the
    /// creating transaction, whatever it found; a grant to check only by
    /// the statement that stored the job (a job found under the key was
    /// read without the check).
    pub(crate) fn confirmed_by_creation(&self, stored: bool) -> bool {
        match self {
            Self::Checked => true,
            Self::Kept(kept) => kept.counter.is_some() || stored,
        }
    }
}

/// The grants this process has read, by token digest.
#[derive(Default)]
pub(crate) struct KeptGrants(Mutex<HashMap<String, TokenGrant>>);

impl KeptGrants {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, TokenGrant>> {
        // Every change is one insert or removal: a panic leaves it whole.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The grant kept for `digest`, unless its token has expired since.
    fn get(&self, digest: &str) -> Option<(User, Option<i64>)> {
        let grants = self.lock();
        let grant = grants.get(digest)?;
        match grant.expires_at {
            Some(at) if at <= Timestamp::now() => None,
            _ => Some((grant.user(), grant.counter)),
        }
    }

    fn keep(&self, digest: String, grant: Option<TokenGrant>) {
        let mut grants = self.lock();
        match grant {
            Some(grant) => {
                if grants.len() >= MAX_KEPT {
                    grants.clear();
                }
                grants.insert(digest, grant);
            }
            None => {
                grants.remove(&digest);
            }
        }
    }
}

/// What a shared read hands to the requests that joined it.
#[derive(Debug, Clone)]
pub(crate) enum ReadOutcome {
    /// The token's grant, or `None` when it grants nothing.
    Read(Option<TokenGrant>),
    /// The database was busy: the reader's retryable refusal.
    Unavailable(String),
}

/// Reads of a token's grant that requests share, by token digest
/// ([`Flights`]). A request that needs a read joins the one for its token
/// that has not begun, or starts one. A read takes no one more once it
/// begins: it closes itself on its blocking thread, with its connection in
/// hand, just before its statement. So every request it answers asked
/// before it began, and none of them misses a revocation committed before
/// it asked. A read is open to newcomers only while it waits to begin.
pub(crate) type GrantReads = Flights<String, ReadOutcome>;

impl App {
    /// The user a bearer token belongs to, for a request that creates a
    /// job, and how it was checked: from the kept grants when there is
    /// one, else read now.
    pub async fn user_for_creating_token(
        &self,
        token: &str,
    ) -> AppResult<Option<(User, Credential)>> {
        let digest = users::token_digest(token);
        if let Some((user, counter)) = self.inner.kept_grants.get(&digest) {
            self.metrics().token_checks_kept.inc();
            let role = user.role;
            return Ok(Some((
                user,
                Credential::Kept(KeptGrant {
                    digest,
                    role,
                    counter,
                }),
            )));
        }
        let grant = self.read_grant(digest).await?;
        Ok(grant.map(|grant| (grant.user(), Credential::Checked)))
    }

    /// Reads the grant of the token `digest` names, sharing the read with
    /// the requests that ask for it before it begins ([`GrantReads`]), and
    /// keeps it (or forgets the one kept, when the token is no longer
    /// good). Where the shared read found the database busy, each request
    /// that joined it is refused as its reader was; where it failed
    /// otherwise, each reads alone.
    async fn read_grant(&self, digest: String) -> AppResult<Option<TokenGrant>> {
        let waiter = match self.inner.grant_reads.join(digest.clone()) {
            Joined::Waiting(waiter) => waiter,
            Joined::Started(read) => return self.start_grant_read(read).await,
        };
        match waiter.wait().await {
            Some(ReadOutcome::Read(grant)) => Ok(grant),
            Some(ReadOutcome::Unavailable(detail)) => Err(AppError::Unavailable(detail)),
            None => self.read_grant_alone(digest, |_| ()).await,
        }
    }

    /// The read this request started, sent to the requests that joined it:
    /// the grant, or the database's busy refusal. Any other failure is not
    /// sent; the read's drop then leaves each joined request to read alone.
    async fn start_grant_read(
        &self,
        flight: Flight<'_, String, ReadOutcome>,
    ) -> AppResult<Option<TokenGrant>> {
        let (app, ticket) = (self.clone(), flight.ticket());
        let read = self
            .read_grant_alone(flight.key().clone(), move |digest| {
                app.inner.grant_reads.close(digest, &ticket)
            })
            .await;
        let shared = match &read {
            Ok(grant) => ReadOutcome::Read(grant.clone()),
            Err(AppError::Unavailable(detail)) => ReadOutcome::Unavailable(detail.clone()),
            Err(_) => return read,
        };
        flight.share(|| shared);
        read
    }

    /// One read of a grant, kept; `begin` runs on the reading thread, with
    /// its connection in hand, just before the read.
    async fn read_grant_alone(
        &self,
        digest: String,
        begin: impl FnOnce(&String) + Send + 'static,
    ) -> AppResult<Option<TokenGrant>> {
        let read = digest.clone();
        let grant = self
            .store()
            .run(move |conn| {
                begin(&read);
                users::grant_for_digest(conn, &read)
            })
            .await?;
        self.inner.kept_grants.keep(digest, grant.clone());
        Ok(grant)
    }

    /// Checks a kept grant now, with a read: the token still good for the
    /// same user (401 otherwise). A user changed meanwhile (another role,
    /// say) is a retryable refusal: the request's answer was shaped for
    /// the user as it was.
    pub(crate) async fn confirm_now(&self, owner: &User, credential: &Credential) -> AppResult<()> {
        let Credential::Kept(kept) = credential else {
            return Ok(());
        };
        match self.read_grant(kept.digest.clone()).await? {
            Some(grant) if grant.user() == *owner => Ok(()),
            Some(grant) if grant.id == owner.id => Err(AppError::Unavailable(
                "your account changed while this request ran; send it again with the same \
                 Idempotency-Key"
                    .into(),
            )),
            _ => Err(AppError::TokenRevoked),
        }
    }
}
