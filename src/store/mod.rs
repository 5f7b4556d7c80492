//! The store: diesel over SQLite (embedded default) or PostgreSQL (scale-out),
//! behind one `MultiConnection`. Every query runs on a blocking thread through
//! [`Store::run`], never on an async worker. The store knows the domain and
//! nothing above it.

pub mod budgets;
pub mod cancel;
pub mod completion;
pub mod connection;
pub mod console;
pub mod distribution;
pub mod ended;
pub mod group_commit;
pub mod jobs;
pub mod ledger;
pub mod mailbox;
pub mod migrations;
pub mod operator;
pub mod plain_win;
pub mod prepared;
pub mod qualifications;
pub mod queue;
pub mod reads;
pub mod reports;
pub mod retention;
pub mod rows;
pub mod schema;
pub mod sessions;
pub mod sql_types;
pub mod sqlite_batch;
pub mod stream_chunks;
pub mod transitions;
pub mod users;
pub mod webhooks;

use std::sync::Arc;
use std::time::Duration;

use diesel::r2d2::Pool;
use serde::Deserialize;

pub use connection::{Backend, DatabaseUrl, DbConnection, DbConnectionManager, Instrumenter};
pub use rows::{Attempt, Job, QualificationRun, RaceEntry};

/// Errors from the storage layer, mapped to application errors in one place
/// (`app::AppError`).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No pooled connection became free in time: the caller should retry later.
    #[error("the database is busy: no connection became free in time")]
    PoolExhausted(#[source] r2d2::Error),
    #[error("not found")]
    NotFound,
    /// The database could not serve this now, but may on a retry: a
    /// serialization failure, a deadlock, a lock or statement timeout, a
    /// connection lost or refused, SQLite's "database is locked".
    #[error("the database is busy: {0}")]
    Busy(String),
    /// The connection broke during the call: whatever it last sent may or
    /// may not have committed (a lost reply to `COMMIT`), so the caller
    /// checks on a fresh connection where that matters. The connection is
    /// not pooled again ([`forget_if_lost`]).
    #[error("the connection to the database was lost: {0}")]
    ConnectionLost(String),
    /// The database's disk has no room for the write (SQLite's
    /// `SQLITE_FULL`; PostgreSQL's "No space left on device", from its data
    /// disk or, with a PANIC, its WAL disk). Nothing of the transaction was
    /// stored, and nothing will be until an operator frees space; then the
    /// same connections serve again.
    #[error("the database's disk is full: {0}")]
    DiskFull(String),
    #[error("database error: {0}")]
    Database(diesel::result::Error),
    #[error("stored data is inconsistent: {0}")]
    Corrupt(String),
    #[error("a blocking database task was cancelled")]
    Cancelled,
    /// The owner's budget has no room for the job (its creation was rolled
    /// back).
    #[error("the owner's budget is exhausted")]
    BudgetExceeded(budgets::Refused),
    /// A creation made on a kept check of its caller's token found that
    /// tokens or users changed since (`users::credentials_unchanged_since`):
    /// nothing of it was stored; the token is read again.
    #[error("tokens or users changed since the caller's token was checked")]
    CredentialsChanged,
}

impl StoreError {
    pub fn corrupt(what: impl Into<String>) -> Self {
        Self::Corrupt(what.into())
    }
}

impl From<diesel::result::Error> for StoreError {
    fn from(error: diesel::result::Error) -> Self {
        if let Some(reason) = disk_full_reason(&error) {
            return Self::DiskFull(reason);
        }
        match transience(&error) {
            Some(Transience::Busy(reason)) => Self::Busy(reason),
            Some(Transience::ConnectionLost(reason)) => Self::ConnectionLost(reason),
            None => Self::Database(error),
        }
    }
}

/// The database's own words when its disk is full. Neither driver reports
/// this as a kind of its own: SQLite's `SQLITE_FULL` reads "database or
/// disk is full" (a commit that cannot grow the WAL, a checkpoint that
/// cannot grow the file); PostgreSQL's `53100` either names the system's
/// error ("No space left on device", as a WAL write's PANIC does) or, for
/// a table that could not grow by a whole block ("could not extend file …:
/// wrote only 4096 of 8192 bytes"), only hints at it.
fn disk_full_reason(error: &diesel::result::Error) -> Option<String> {
    const MESSAGES: [&str; 2] = ["database or disk is full", "No space left on device"];
    const HINT: &str = "Check free disk space";
    match error {
        diesel::result::Error::DatabaseError(_, info)
            if MESSAGES.iter().any(|m| info.message().contains(m))
                || info.hint().is_some_and(|hint| hint.contains(HINT)) =>
        {
            Some(info.message().to_owned())
        }
        diesel::result::Error::RollbackErrorOnCommit { commit_error, .. } => {
            disk_full_reason(commit_error)
        }
        _ => None,
    }
}

/// Why a database error is worth a retry, if it is.
enum Transience {
    /// The database is there but could not serve this now.
    Busy(String),
    /// The connection itself broke: what it carried last may have
    /// committed.
    ConnectionLost(String),
}

/// Classifies a database error. PostgreSQL reports deadlocks, lock and
/// statement timeouts and lost connections without a kind of their own, so
/// their (English) messages are matched.
fn transience(error: &diesel::result::Error) -> Option<Transience> {
    use diesel::result::{DatabaseErrorKind as Kind, Error};
    const LOST: [&str; 5] = [
        "terminating connection",
        "server closed the connection",
        "connection to server",
        "no connection to the server",
        "the database system is",
    ];
    const BUSY: [&str; 8] = [
        "deadlock detected",
        "lock timeout",
        "could not obtain lock",
        "statement timeout",
        "idle-in-transaction timeout",
        "could not serialize access",
        "database is locked",
        "database table is locked",
    ];
    match error {
        Error::DatabaseError(kind, info) => {
            let message = info.message().to_owned();
            if matches!(kind, Kind::ClosedConnection | Kind::UnableToSendCommand)
                || LOST.iter().any(|m| message.contains(m))
            {
                Some(Transience::ConnectionLost(message))
            } else if matches!(kind, Kind::SerializationFailure)
                || BUSY.iter().any(|m| message.contains(m))
            {
                Some(Transience::Busy(message))
            } else {
                None
            }
        }
        // A failed `COMMIT` whose rollback failed too: the commit's error
        // says what happened (a broken connection, typically).
        Error::RollbackErrorOnCommit { commit_error, .. } => transience(commit_error),
        Error::BrokenTransactionManager => Some(Transience::ConnectionLost(
            "the connection's transaction state was lost".into(),
        )),
        _ => None,
    }
}

/// Keeps a connection that broke out of the pool: its transaction state is
/// marked broken, which the pool checks when the connection comes back
/// (libpq's own state is not visible through diesel), so the next caller
/// gets a fresh connection instead of this one's "no connection to the
/// server".
pub fn forget_if_lost<T>(conn: &mut DbConnection, outcome: &StoreResult<T>) {
    if let Err(StoreError::ConnectionLost(_)) = outcome {
        mark_broken(conn);
    }
}

/// Marks `conn`'s transaction state broken: the pool drops it when it comes
/// back.
fn mark_broken(conn: &mut DbConnection) {
    type Manager = <DbConnection as diesel::Connection>::TransactionManager;
    <Manager as diesel::connection::TransactionManager<DbConnection>>::transaction_manager_status_mut(conn)
        .set_in_error();
}

pub type StoreResult<T> = Result<T, StoreError>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SqliteSynchronous {
    /// A 2xx means the row is on disk, even across a power loss.
    Full,
    /// Faster; a power loss may lose the last transactions (never corrupts).
    Normal,
}

/// The `[database]` section of the configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseSettings {
    /// `postgres://…` or a SQLite file path.
    pub url: String,
    pub pool_size: u32,
    /// How long a request waits for a pooled connection before answering 503.
    pub pool_timeout_ms: u64,
    /// SQLite `busy_timeout`: how long a writer waits for the write lock.
    pub sqlite_busy_timeout_ms: u64,
    pub sqlite_synchronous: SqliteSynchronous,
    /// PostgreSQL `lock_timeout`: how long a statement waits for a row lock
    /// before giving up (and the request answering 503).
    pub postgres_lock_timeout_ms: u64,
    /// PostgreSQL `statement_timeout`.
    pub postgres_statement_timeout_ms: u64,
    /// PostgreSQL `idle_in_transaction_session_timeout`.
    pub postgres_idle_in_transaction_timeout_ms: u64,
    /// The most writes one commit carries (1: each its own).
    pub group_commit_rows: usize,
    /// SQLite: how long a batch keeps taking newcomers.
    pub group_commit_ms: u64,
}

impl DatabaseSettings {
    /// The longest a statement may wait for a lock before it is refused:
    /// SQLite's busy timeout or PostgreSQL's lock timeout.
    pub fn lock_wait_ms(&self) -> u64 {
        self.sqlite_busy_timeout_ms
            .max(self.postgres_lock_timeout_ms)
    }
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            url: "onejob.db".into(),
            pool_size: 8,
            pool_timeout_ms: 5_000,
            sqlite_busy_timeout_ms: 5_000,
            sqlite_synchronous: SqliteSynchronous::Full,
            postgres_lock_timeout_ms: 5_000,
            postgres_statement_timeout_ms: 30_000,
            postgres_idle_in_transaction_timeout_ms: 60_000,
            group_commit_rows: 64,
            group_commit_ms: 5,
        }
    }
}

/// Told how long each request waited for a pooled connection.
pub type PoolWaitObserver = Arc<dyn Fn(Duration) + Send + Sync>;

/// A cloneable handle on the connection pool.
#[derive(Clone)]
pub struct Store {
    pool: Pool<DbConnectionManager>,
    backend: Backend,
    pool_wait: Option<PoolWaitObserver>,
    /// SQLite only: this process's writers take turns here (see
    /// [`connection::WriterTurn`]).
    writers: Option<connection::WriterTurn>,
    /// Unless off: writes share commits (see [`group_commit`]).
    batches: Option<group_commit::GroupCommit>,
    /// One database, or distributed by owner (read at start).
    placement: connection::Placement,
    /// Raised when a connection broke: see [`Suspicion`].
    suspicion: Suspicion,
}

/// After one connection broke, the pool's idle ones may be dead too (the
/// server restarted, or failed over to a standby), and each would fail its
/// next caller once before the pool drops it. For a while after a break,
/// each checkout is tried with a round trip first and a dead connection is
/// swapped for a fresh one, so one request answers `503`, not one for every
/// pooled connection. The rest of the time checkouts cost nothing.
#[derive(Clone, Default)]
struct Suspicion(Arc<std::sync::atomic::AtomicU64>);

impl Suspicion {
    /// How long checkouts are tried after a break.
    const WINDOW: Duration = Duration::from_secs(10);

    fn base() -> std::time::Instant {
        static BASE: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        *BASE.get_or_init(std::time::Instant::now)
    }

    fn now_ms() -> u64 {
        Self::base().elapsed().as_millis() as u64
    }

    fn raise(&self) {
        let until = Self::now_ms() + Self::WINDOW.as_millis() as u64;
        self.0
            .fetch_max(until, std::sync::atomic::Ordering::Relaxed);
    }

    fn active(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed) > Self::now_ms()
    }
}

/// How many idle connections the pool keeps open for their own sake
/// (r2d2's `min_idle`, otherwise the pool's size): none. A caller that
/// finds no idle connection opens one, up to `pool_size`, and one left
/// idle for ten minutes is closed (r2d2's `idle_timeout`). So a process
/// holds the connections its load needed in the last ten minutes, not
/// `pool_size` from its start: a SQLite connection is about 200 KB of
/// schema, statement cache and page cache, a PostgreSQL one a server
/// process. A spare kept ready (one) was tried: r2d2 counts a connection
/// still being opened as none, so each call that came meanwhile, one
/// after another, opened one more.
const IDLE_CONNECTIONS_KEPT: u32 = 0;

impl Store {
    /// Builds the pool and checks that one connection can be made, so that a bad
    /// `DATABASE_URL` fails at start with the driver's own message.
    pub fn connect(
        url: &DatabaseUrl,
        settings: &DatabaseSettings,
    ) -> Result<Self, connection::ConnectError> {
        Self::connect_with(
            DbConnectionManager::new(url.clone(), settings),
            url,
            settings,
        )
    }

    /// As [`connect`](Self::connect), each connection carrying the
    /// instrumentation `make` makes.
    pub fn connect_instrumented(
        url: &DatabaseUrl,
        settings: &DatabaseSettings,
        make: Instrumenter,
    ) -> Result<Self, connection::ConnectError> {
        let manager = DbConnectionManager::new(url.clone(), settings).instrumented(make);
        Self::connect_with(manager, url, settings)
    }

    fn connect_with(
        manager: DbConnectionManager,
        url: &DatabaseUrl,
        settings: &DatabaseSettings,
    ) -> Result<Self, connection::ConnectError> {
        // Prove the URL works before building the pool, keeping the real
        // error text; and read how the database keeps its rows.
        let placement = connection::placement_of(&mut manager.establish()?);
        let pool = Pool::builder()
            .max_size(settings.pool_size)
            .min_idle(Some(IDLE_CONNECTIONS_KEPT))
            .connection_timeout(Duration::from_millis(settings.pool_timeout_ms))
            .test_on_check_out(false)
            .build_unchecked(manager);
        let backend = url.backend();
        Ok(Self {
            pool,
            backend,
            pool_wait: None,
            writers: (backend == Backend::Sqlite).then(connection::WriterTurn::default),
            batches: (settings.group_commit_rows > 1).then(|| {
                group_commit::GroupCommit::new(group_commit::BatchLimits {
                    max_rows: settings.group_commit_rows,
                    max_wait: Duration::from_millis(settings.group_commit_ms),
                })
            }),
            placement,
            suspicion: Suspicion::default(),
        })
    }

    /// Whether the database is one, or distributed by owner.
    pub fn placement(&self) -> connection::Placement {
        self.placement
    }

    /// This handle, writing as if the database were placed as `placement`
    /// (the tests try the distributed statements on one PostgreSQL).
    pub fn placed_as(mut self, placement: connection::Placement) -> Self {
        self.placement = placement;
        self
    }

    /// This handle, telling `observer` how long each [`run`](Self::run)
    /// waited for a connection.
    pub fn observing_pool_wait(mut self, observer: PoolWaitObserver) -> Self {
        self.pool_wait = Some(observer);
        self
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// A pooled connection, for blocking code such as the CLI and tests.
    pub fn conn(&self) -> StoreResult<diesel::r2d2::PooledConnection<DbConnectionManager>> {
        self.checkout().map_err(StoreError::PoolExhausted)
    }

    /// A pooled connection; while [`Suspicion`] is raised, one that answers
    /// a round trip (a dead one is dropped, and another taken).
    fn checkout(&self) -> Result<diesel::r2d2::PooledConnection<DbConnectionManager>, r2d2::Error> {
        let mut conn = self.pool.get()?;
        if !self.suspicion.active() {
            return Ok(conn);
        }
        for _ in 0..self.pool.max_size() {
            if diesel::connection::SimpleConnection::batch_execute(&mut *conn, "SELECT 1").is_ok() {
                break;
            }
            mark_broken(&mut conn);
            drop(conn);
            conn = self.pool.get()?;
        }
        Ok(conn)
    }

    /// [`forget_if_lost`], and the pool's other connections suspect.
    fn note_if_lost<T>(&self, conn: &mut DbConnection, outcome: &StoreResult<T>) {
        if let Err(StoreError::ConnectionLost(_)) = outcome {
            forget_if_lost(conn, outcome);
            self.suspicion.raise();
        }
    }

    /// This process's SQLite writers' turn (none on PostgreSQL).
    pub(crate) fn writer_turn(&self) -> Option<&connection::WriterTurn> {
        self.writers.as_ref()
    }

    /// Creates the job, or finds the one its key already made
    /// ([`jobs::create_job_with_attempts`]), sharing a commit with the
    /// creations beside it where the store batches them. `after_commit`
    /// runs once the creation is durable, even if the caller has gone.
    ///
    /// With `kept_counter`, the creating transaction first reads the
    /// credential counter: moved since, nothing is stored and the creation
    /// answers [`StoreError::CredentialsChanged`] (`app::credentials`).
    pub async fn create_job(
        &self,
        new: jobs::NewJob,
        kept_counter: Option<i64>,
        after_commit: Option<group_commit::AfterCommit>,
    ) -> StoreResult<group_commit::Created> {
        if let Some(group) = &self.batches {
            return group.create(self, new, kept_counter, after_commit).await;
        }
        let placement = self.placement;
        let store = self.clone();
        self.run(move |conn| {
            let created = jobs::create_job_checked(conn, &new, kept_counter, placement);
            let created = store.confirm_if_lost(conn, &new, created)?;
            if let Some(after_commit) = after_commit {
                after_commit(&created);
            }
            Ok(created)
        })
        .await
    }

    /// A creation's outcome, confirmed on a fresh connection when its own
    /// broke ([`jobs::confirm_creation`]); any other outcome as it is.
    fn confirm_if_lost(
        &self,
        conn: &mut DbConnection,
        new: &jobs::NewJob,
        outcome: StoreResult<group_commit::Created>,
    ) -> StoreResult<group_commit::Created> {
        let Err(StoreError::ConnectionLost(reason)) = &outcome else {
            return outcome;
        };
        tracing::warn!(%reason, "the connection broke during a creation");
        self.note_if_lost(conn, &outcome);
        match self.checkout() {
            Ok(mut fresh) => {
                let confirmed = jobs::confirm_creation(&mut fresh, new, self.placement);
                self.note_if_lost(&mut fresh, &confirmed);
                confirmed
            }
            Err(_) => outcome,
        }
    }

    /// Runs `work`, a write transaction's body, on SQLite in a savepoint of
    /// a batch's shared transaction (group commit); on PostgreSQL, which
    /// flushes concurrent commits together itself, in a transaction of its
    /// own. `work` may run twice on SQLite: again alone, if the batch's
    /// commit failed.
    pub async fn write_batched<T, F>(&self, work: F) -> StoreResult<T>
    where
        F: Fn(&mut DbConnection) -> StoreResult<T> + Send + 'static,
        T: Send + 'static,
    {
        self.write_batched_then(work, None).await
    }

    /// [`Store::write_batched`], and `then` with its outcome on the thread
    /// that committed it, as soon as it is durable: before the caller's
    /// task is woken, which saves a hand-off for news that others await.
    pub async fn write_batched_then<T, F>(
        &self,
        work: F,
        then: Option<group_commit::ThenCommitted<T>>,
    ) -> StoreResult<T>
    where
        F: Fn(&mut DbConnection) -> StoreResult<T> + Send + 'static,
        T: Send + 'static,
    {
        match &self.batches {
            Some(group) if self.backend == Backend::Sqlite => group.write(self, work, then).await,
            // `work` commits its own transaction before it returns.
            _ => {
                self.run(move |conn| {
                    let mut value = work(conn)?;
                    if let Some(then) = then {
                        then(&mut value);
                    }
                    Ok(value)
                })
                .await
            }
        }
    }

    /// How many commits the batches took, and how many writes they carried
    /// (zeros when nothing is batched).
    pub fn group_commit_counts(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.batches.as_ref().map_or((0, 0), |group| {
            let counts = group.counts();
            (counts.commits.load(Relaxed), counts.rows.load(Relaxed))
        })
    }

    /// Writes queued for batches since the start; `None` when nothing is
    /// batched.
    pub fn batched_writes_queued(&self) -> Option<u64> {
        self.batches.as_ref().map(group_commit::GroupCommit::queued)
    }

    /// Runs `f` with a pooled connection on tokio's blocking pool.
    pub async fn run<T, F>(&self, f: F) -> StoreResult<T>
    where
        F: FnOnce(&mut DbConnection) -> StoreResult<T> + Send + 'static,
        T: Send + 'static,
    {
        let store = self.clone();
        tokio::task::spawn_blocking(move || {
            let asked = std::time::Instant::now();
            let conn = store.checkout();
            if let Some(observe) = &store.pool_wait {
                observe(asked.elapsed());
            }
            let mut conn = conn.map_err(StoreError::PoolExhausted)?;
            let outcome = match &store.writers {
                Some(turn) => turn.within(|| f(&mut conn)),
                None => f(&mut conn),
            };
            store.note_if_lost(&mut conn, &outcome);
            outcome
        })
        .await
        .map_err(|_| StoreError::Cancelled)?
    }
}

#[cfg(test)]
mod tests {
    use super::StoreError;
    use diesel::result::{DatabaseErrorInformation, DatabaseErrorKind, Error};

    /// An error as PostgreSQL or SQLite words it: a message, and a hint.
    #[derive(Debug)]
    struct Words(&'static str, Option<&'static str>);

    impl DatabaseErrorInformation for Words {
        fn message(&self) -> &str {
            self.0
        }
        fn details(&self) -> Option<&str> {
            None
        }
        fn hint(&self) -> Option<&str> {
            self.1
        }
        fn table_name(&self) -> Option<&str> {
            None
        }
        fn column_name(&self) -> Option<&str> {
            None
        }
        fn constraint_name(&self) -> Option<&str> {
            None
        }
        fn statement_position(&self) -> Option<i32> {
            None
        }
    }

    fn from(message: &'static str, hint: Option<&'static str>) -> StoreError {
        Error::DatabaseError(DatabaseErrorKind::Unknown, Box::new(Words(message, hint))).into()
    }

    /// Each database's words for a full disk, as the full-disk tests met
    /// them (tests/api/full_disk).
    #[test]
    fn a_full_disk_on_either_database_is_disk_full() {
        let hint = Some("Check free disk space.");
        for (message, hint) in [
            ("database or disk is full", None),
            ("could not extend file \"base/16384/16386\": No space left on device", hint),
            ("could not extend file \"base/16384/16418\": wrote only 4096 of 8192 bytes at block 51", hint),
            ("could not write to file \"pg_wal/xlogtemp.18610\": No space left on device", None),
        ] {
            let error = from(message, hint);
            assert!(
                matches!(&error, StoreError::DiskFull(reason) if reason == message),
                "{message}: {error:?}"
            );
        }
        let busy = from("deadlock detected", None);
        assert!(matches!(busy, StoreError::Busy(_)), "{busy:?}");
    }
}
