//! Connections: one diesel `MultiConnection` over SQLite and PostgreSQL, a pool
//! manager that sets SQLite's pragmas on every connection, and the write
//! transaction helper.

use std::sync::Arc;

use diesel::connection::{
    AnsiTransactionManager, Instrumentation, SimpleConnection, TransactionManager,
};
use diesel::prelude::*;

use super::{DatabaseSettings, SqliteSynchronous};
use crate::domain::ids::text_enum;
use crate::domain::Timestamp;

/// Runs `$body` with `$c` bound to the concrete connection, for statements
/// the multi-backend connection cannot compile (`RETURNING`, `ON CONFLICT`),
/// and for reads run once a request or more: through the multi-backend
/// connection a query has no static id, so diesel's statement cache finds
/// it only by building its SQL and hashing it, each time; on the concrete
/// one it is found by its type. The body is compiled once per backend.
macro_rules! per_backend {
    ($conn:expr, |$c:ident| $body:expr) => {
        match $conn {
            $crate::store::connection::DbConnection::Postgresql($c) => $body,
            $crate::store::connection::DbConnection::Sqlite($c) => $body,
        }
    };
}
pub(crate) use per_backend;

#[derive(diesel::MultiConnection)]
pub enum DbConnection {
    Postgresql(diesel::PgConnection),
    Sqlite(diesel::SqliteConnection),
}

text_enum! {
    pub enum Backend {
        Sqlite = "sqlite",
        Postgres = "postgres",
    }
}

/// Whether `raw` is libpq's keyword/value form (`host=db port=5432
/// dbname=onejob`), which would otherwise be taken for a SQLite file's
/// path: words of `keyword=value`, one of them a connection keyword.
fn is_keyword_value_form(raw: &str) -> bool {
    const KEYWORDS: [&str; 6] = ["host", "hostaddr", "port", "dbname", "user", "password"];
    !raw.contains("://")
        && raw.split_whitespace().all(|word| word.contains('='))
        && raw.split_whitespace().any(|word| {
            word.split_once('=')
                .is_some_and(|(key, _)| KEYWORDS.contains(&key))
        })
}

/// `postgres://…` / `postgresql://…`, or a SQLite file path (optionally `sqlite://path`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    pub fn parse(raw: &str) -> Result<Self, ConnectError> {
        let raw = raw.trim();
        if raw.is_empty() {
            return Err(ConnectError::EmptyUrl);
        }
        if is_keyword_value_form(raw) {
            return Err(ConnectError::KeywordValueForm);
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn backend(&self) -> Backend {
        if self.0.starts_with("postgres://") || self.0.starts_with("postgresql://") {
            Backend::Postgres
        } else {
            Backend::Sqlite
        }
    }

    /// The folder a SQLite database file lives in (`None` for PostgreSQL).
    pub fn sqlite_folder(&self) -> Option<std::path::PathBuf> {
        (self.backend() == Backend::Sqlite).then(|| {
            std::path::Path::new(self.sqlite_path())
                .parent()
                .map(std::path::Path::to_path_buf)
                .unwrap_or_default()
        })
    }

    /// The SQLite database file (`None` for PostgreSQL).
    pub fn sqlite_file(&self) -> Option<std::path::PathBuf> {
        (self.backend() == Backend::Sqlite).then(|| std::path::PathBuf::from(self.sqlite_path()))
    }

    /// Which database this is, for people: the SQLite file's absolute path,
    /// or the PostgreSQL URL without its password.
    pub fn described(&self) -> String {
        match self.sqlite_file() {
            Some(file) => {
                let file = std::path::absolute(&file).unwrap_or(file);
                format!("the SQLite database {}", file.display())
            }
            None => format!("the PostgreSQL database {}", self.redacted()),
        }
    }

    /// The SQLite file path, without an optional `sqlite://` prefix.
    fn sqlite_path(&self) -> &str {
        self.0.strip_prefix("sqlite://").unwrap_or(&self.0)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The URL with any password replaced, fit for logs: the one in the
    /// user information, and a `password` query parameter (libpq takes
    /// either). Hosts, ports and the other parameters stay, a multi-host
    /// URL's whole list of hosts included.
    pub fn redacted(&self) -> String {
        if self.backend() != Backend::Postgres {
            return self.0.clone();
        }
        let url = match (self.0.find("://"), self.0.rfind('@')) {
            (Some(scheme_end), Some(at)) if at > scheme_end => {
                let userinfo = &self.0[scheme_end + 3..at];
                let user = userinfo.split(':').next().unwrap_or("");
                if userinfo.contains(':') {
                    format!("{}{user}:***{}", &self.0[..scheme_end + 3], &self.0[at..])
                } else {
                    self.0.clone()
                }
            }
            _ => self.0.clone(),
        };
        redact_password_parameter(&url)
    }
}

/// `url` with the value of each `password=` query parameter replaced.
fn redact_password_parameter(url: &str) -> String {
    let Some((base, query)) = url.split_once('?') else {
        return url.to_owned();
    };
    let parameters: Vec<&str> = query
        .split('&')
        .map(|parameter| match parameter.split_once('=') {
            Some((name, _)) if name.eq_ignore_ascii_case("password") => "password=***",
            _ => parameter,
        })
        .collect();
    format!("{base}?{}", parameters.join("&"))
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("DATABASE_URL is empty")]
    EmptyUrl,
    /// Not echoed: the string may hold a password.
    #[error(
        "DATABASE_URL is in libpq's keyword/value form (host=… dbname=…); onejob takes the URL \
         form: postgres://user:password@host:5432/dbname (several hosts: \
         postgres://user@db-a:5432,db-b:5432/dbname?target_session_attrs=read-write)"
    )]
    KeywordValueForm,
    #[error("cannot connect to {url}: {source}")]
    Connection {
        url: String,
        source: diesel::ConnectionError,
    },
    #[error("cannot prepare the connection to {url}: {source}")]
    Pragmas {
        url: String,
        source: diesel::result::Error,
    },
}

/// Makes the instrumentation each new connection carries (diesel's hook on
/// every statement and transaction). The tests record what a path sends
/// with one (`tests/api/support/statement_log.rs`); the server sets none.
#[derive(Clone)]
pub struct Instrumenter(pub Arc<dyn Fn() -> Box<dyn Instrumentation> + Send + Sync>);

impl std::fmt::Debug for Instrumenter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Instrumenter")
    }
}

/// An r2d2 manager that establishes the concrete connection itself (keeping the
/// driver's real error message) and applies SQLite's pragmas to each connection.
#[derive(Debug, Clone)]
pub struct DbConnectionManager {
    url: DatabaseUrl,
    busy_timeout_ms: u64,
    synchronous: SqliteSynchronous,
    postgres_session: String,
    instrumenter: Option<Instrumenter>,
}

impl DbConnectionManager {
    pub fn new(url: DatabaseUrl, config: &DatabaseSettings) -> Self {
        Self {
            url,
            busy_timeout_ms: config.sqlite_busy_timeout_ms,
            synchronous: config.sqlite_synchronous,
            // Pinned on every PostgreSQL session, whatever the server's,
            // the database's or the role's defaults: the locking in `store`
            // assumes read committed; a 2xx means the job is on disk, so a
            // commit waits for its WAL to be flushed (`synchronous_commit`
            // off would lose acknowledged jobs on a crash); and a wait that
            // would outlast the pool's patience must fail (503) rather than
            // hold the request.
            postgres_session: format!(
                "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED; \
                 SET synchronous_commit = on; \
                 SET lock_timeout = {}; SET statement_timeout = {}; \
                 SET idle_in_transaction_session_timeout = {};",
                config.postgres_lock_timeout_ms,
                config.postgres_statement_timeout_ms,
                config.postgres_idle_in_transaction_timeout_ms
            ),
            instrumenter: None,
        }
    }

    /// Gives every connection it makes the instrumentation `make` makes.
    pub fn instrumented(mut self, make: Instrumenter) -> Self {
        self.instrumenter = Some(make);
        self
    }

    pub fn establish(&self) -> Result<DbConnection, ConnectError> {
        let connection_error = |source| ConnectError::Connection {
            url: self.url.redacted(),
            source,
        };
        match self.url.backend() {
            Backend::Postgres => {
                let mut conn =
                    diesel::PgConnection::establish(self.url.as_str()).map_err(connection_error)?;
                if let Some(make) = &self.instrumenter {
                    conn.set_instrumentation(make.0());
                }
                conn.batch_execute(&self.postgres_session)
                    .map_err(|source| ConnectError::Pragmas {
                        url: self.url.redacted(),
                        source,
                    })?;
                Ok(DbConnection::Postgresql(conn))
            }
            Backend::Sqlite => {
                let mut conn = diesel::SqliteConnection::establish(self.url.sqlite_path())
                    .map_err(connection_error)?;
                if let Some(make) = &self.instrumenter {
                    conn.set_instrumentation(make.0());
                }
                let synchronous = match self.synchronous {
                    SqliteSynchronous::Full => "FULL",
                    SqliteSynchronous::Normal => "NORMAL",
                };
                // busy_timeout first: switching to WAL itself needs the lock.
                // temp_store = MEMORY keeps each savepoint's journal in
                // memory: group commit opens one per write, and on disk each
                // page a write first touched went out in a pwrite of its own.
                conn.batch_execute(&format!(
                    "PRAGMA busy_timeout = {}; PRAGMA journal_mode = WAL; \
                     PRAGMA synchronous = {synchronous}; PRAGMA foreign_keys = ON; \
                     PRAGMA temp_store = MEMORY;",
                    self.busy_timeout_ms
                ))
                .map_err(|source| ConnectError::Pragmas {
                    url: self.url.redacted(),
                    source,
                })?;
                Ok(DbConnection::Sqlite(conn))
            }
        }
    }
}

impl r2d2::ManageConnection for DbConnectionManager {
    type Connection = DbConnection;
    type Error = ConnectError;

    fn connect(&self) -> Result<DbConnection, ConnectError> {
        self.establish()
    }

    fn is_valid(&self, conn: &mut DbConnection) -> Result<(), ConnectError> {
        conn.batch_execute("SELECT 1")
            .map_err(|source| ConnectError::Pragmas {
                url: self.url.redacted(),
                source,
            })
    }

    fn has_broken(&self, conn: &mut DbConnection) -> bool {
        use diesel::r2d2::R2D2Connection;
        conn.is_broken()
    }
}

/// One process's SQLite writers, taking turns in the process.
///
/// SQLite has one write lock per database. Left to itself, a writer that finds
/// it taken sleeps in SQLite's busy handler in growing steps (up to 100 ms
/// each) and tries again, so with a few dozen concurrent writers some wait
/// far longer than the work ahead of them: a long latency tail. Here writers
/// of one process queue on a mutex first, and each is woken as soon as the one
/// before it commits; the busy handler is left only for other processes
/// sharing the file (the CLI, say).
#[derive(Clone, Default)]
pub struct WriterTurn(std::sync::Arc<std::sync::Mutex<()>>);

thread_local! {
    /// The turn of the store whose closure this blocking thread is running.
    static WRITER_TURN: std::cell::RefCell<Option<WriterTurn>> = const { std::cell::RefCell::new(None) };
}

impl WriterTurn {
    /// Runs `f` (on a blocking thread) with write transactions in it taking
    /// this turn.
    pub fn within<T>(&self, f: impl FnOnce() -> T) -> T {
        struct Reset(Option<WriterTurn>);
        impl Drop for Reset {
            fn drop(&mut self) {
                WRITER_TURN.with(|turn| *turn.borrow_mut() = self.0.take());
            }
        }
        let _reset = Reset(WRITER_TURN.with(|turn| turn.borrow_mut().replace(self.clone())));
        f()
    }

    fn current() -> Option<WriterTurn> {
        WRITER_TURN.with(|turn| turn.borrow().clone())
    }
}

/// How the database behind `conn` keeps its rows: distributed by owner when
/// it is a Citus database (the extension is installed), else one database.
/// A database that cannot say is taken as one: its statements work on both.
pub fn placement_of(conn: &mut DbConnection) -> Placement {
    #[derive(diesel::QueryableByName)]
    struct Citus {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        installed: bool,
    }
    let DbConnection::Postgresql(pg) = conn else {
        return Placement::OneDatabase;
    };
    // Kept prepared like every statement the tests record.
    let citus = super::prepared::KeepPrepared::keep_prepared(diesel::sql_query(
        "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') AS installed",
    ))
    .get_result::<Citus>(pg);
    match citus {
        Ok(Citus { installed: true }) => Placement::ByOwner,
        Ok(_) => Placement::OneDatabase,
        Err(error) => {
            tracing::warn!(%error, "could not tell whether the database is distributed; writing as to one");
            Placement::OneDatabase
        }
    }
}

/// Runs `f` in a write transaction. On SQLite that is `BEGIN IMMEDIATE`, which
/// takes the write lock up front: a deferred transaction that reads and then
/// writes can fail with "database is locked" instead of waiting its turn.
/// Inside [`WriterTurn::within`] it first waits for this process's earlier
/// writers to finish.
///
/// SQLite ends a whole transaction by itself on some failures: a statement
/// that finds the disk full (`SQLITE_FULL`) rolls back every savepoint and
/// the transaction around them, and the driver then counts no transaction.
/// So a failure's own error is kept when nothing is left to roll back, and
/// a write whose enclosing transaction was lost this way is refused: begun
/// afresh it would commit alone what its caller meant as part of a larger
/// one (a batch of [`super::group_commit`]), and wait forever for the
/// writer turn this thread already holds.
pub fn write_transaction<T, E, F>(conn: &mut DbConnection, f: F) -> Result<T, E>
where
    F: FnOnce(&mut DbConnection) -> Result<T, E>,
    E: From<diesel::result::Error>,
{
    let nested = Manager::transaction_manager_status_mut(conn)
        .transaction_depth()?
        .is_some();
    match conn {
        // Inside a transaction already: a savepoint (the write lock, on
        // SQLite, is held by the outer transaction), unless its writes run
        // bare ([`without_savepoints`]).
        _ if nested && BareNested::active() => BareNested::run(conn, f),
        _ if nested => savepoint(conn, f),
        DbConnection::Postgresql(_) => conn.transaction(f),
        DbConnection::Sqlite(_) if InWriteTransaction::already() => {
            Err(diesel::result::Error::BrokenTransactionManager.into())
        }
        DbConnection::Sqlite(sqlite) => {
            let _inside = InWriteTransaction::enter();
            let turn = WriterTurn::current();
            // A writer that panicked left nothing half-done behind the
            // mutex (its transaction rolls back), so a poisoned turn is fine.
            let _turn = turn.as_ref().map(|turn| {
                turn.0
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
            });
            AnsiTransactionManager::begin_transaction_sql(sqlite, "BEGIN IMMEDIATE")?;
            match f(conn) {
                Ok(value) => match Manager::commit_transaction(conn) {
                    Ok(()) => Ok(value),
                    Err(commit_error) => {
                        // A failed COMMIT leaves the transaction open; close it so the
                        // pooled connection stays usable, and report the failure.
                        let _ = Manager::rollback_transaction(conn);
                        Err(commit_error.into())
                    }
                },
                Err(error) => Err(roll_back(conn, error)),
            }
        }
    }
}

type Manager = <DbConnection as Connection>::TransactionManager;

/// `f` in a savepoint of the open transaction.
fn savepoint<T, E, F>(conn: &mut DbConnection, f: F) -> Result<T, E>
where
    F: FnOnce(&mut DbConnection) -> Result<T, E>,
    E: From<diesel::result::Error>,
{
    Manager::begin_transaction(conn)?;
    match f(conn) {
        Ok(value) => {
            Manager::commit_transaction(conn)?;
            Ok(value)
        }
        Err(error) => Err(roll_back(conn, error)),
    }
}

/// Rolls back the innermost savepoint or transaction after `error`; the
/// error to report: `error`, unless the rollback itself failed while a
/// transaction is still open.
fn roll_back<E: From<diesel::result::Error>>(conn: &mut DbConnection, error: E) -> E {
    match Manager::rollback_transaction(conn) {
        Ok(()) => error,
        // SQLite ended the transaction itself: nothing was left to roll
        // back, and the first error says why.
        Err(_)
            if matches!(
                Manager::transaction_manager_status_mut(conn).transaction_depth(),
                Ok(None)
            ) =>
        {
            error
        }
        Err(rollback_error) => rollback_error.into(),
    }
}

thread_local! {
    /// Whether this thread is inside a SQLite write transaction of
    /// [`write_transaction`]'s own beginning.
    static IN_WRITE_TRANSACTION: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

thread_local! {
    /// While [`without_savepoints`] runs on this thread: whether a write it
    /// ran bare has failed (`None`: not running).
    static BARE_NESTED: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with every write nested in this thread's open transaction run
/// in that transaction itself, with no savepoint of its own: a savepoint is
/// two statements, and on SQLite it copies each page it changes aside
/// before changing it, to undo it on failure. Returns what `f` returned and
/// whether any of those writes failed: then the transaction holds what the
/// failed writes did before they failed, and the caller must roll it back
/// whole (whatever the failed writes' callers made of their errors).
pub(super) fn without_savepoints<T>(f: impl FnOnce() -> T) -> (T, bool) {
    struct Restore(Option<bool>);
    impl Drop for Restore {
        fn drop(&mut self) {
            BARE_NESTED.with(|bare| bare.set(self.0));
        }
    }
    let _restore = Restore(BARE_NESTED.with(|bare| bare.replace(Some(false))));
    let value = f();
    let failed = BARE_NESTED.with(|bare| bare.get() == Some(true));
    (value, failed)
}

/// A nested write run bare, while [`without_savepoints`] runs.
struct BareNested;

impl BareNested {
    fn active() -> bool {
        BARE_NESTED.with(|bare| bare.get().is_some())
    }

    /// Runs `f` in the open transaction; once a write has failed, runs
    /// nothing more: the transaction will be rolled back whole, and SQLite
    /// may have ended it already (a full disk) without the driver knowing,
    /// so that a statement now would commit by itself.
    fn run<T, E, F>(conn: &mut DbConnection, f: F) -> Result<T, E>
    where
        F: FnOnce(&mut DbConnection) -> Result<T, E>,
        E: From<diesel::result::Error>,
    {
        if BARE_NESTED.with(|bare| bare.get() == Some(true)) {
            return Err(diesel::result::Error::BrokenTransactionManager.into());
        }
        let outcome = f(conn);
        if outcome.is_err() {
            BARE_NESTED.with(|bare| bare.set(Some(true)));
        }
        outcome
    }
}

/// Marks this thread inside [`write_transaction`] until dropped.
struct InWriteTransaction;

impl InWriteTransaction {
    fn already() -> bool {
        IN_WRITE_TRANSACTION.with(std::cell::Cell::get)
    }

    fn enter() -> Self {
        IN_WRITE_TRANSACTION.with(|inside| inside.set(true));
        Self
    }
}

impl Drop for InWriteTransaction {
    fn drop(&mut self) {
        IN_WRITE_TRANSACTION.with(|inside| inside.set(false));
    }
}

/// Runs one writing statement: as it is on PostgreSQL (a statement is atomic
/// by itself), and on SQLite in a write transaction, so that it takes its turn
/// with this process's other writers instead of spinning on the lock.
pub fn write_statement<T, E, F>(conn: &mut DbConnection, f: F) -> Result<T, E>
where
    F: FnOnce(&mut DbConnection) -> Result<T, E>,
    E: From<diesel::result::Error>,
{
    match conn {
        DbConnection::Postgresql(_) => f(conn),
        DbConnection::Sqlite(_) => write_transaction(conn, f),
    }
}

/// True when a diesel error is a unique-constraint violation.
pub fn is_unique_violation(error: &diesel::result::Error) -> bool {
    matches!(
        error,
        diesel::result::Error::DatabaseError(diesel::result::DatabaseErrorKind::UniqueViolation, _)
    )
}

/// For unit tests: a SQLite database file of their own, opened as the
/// process opens one, and what SQLite's `EXPLAIN` says a statement runs.
#[cfg(test)]
pub(crate) mod test_sqlite {
    use diesel::query_dsl::LoadQuery;
    use diesel::sqlite::SqliteConnection;

    use super::{DatabaseSettings, DatabaseUrl, DbConnection, DbConnectionManager};

    /// `name` in `dir`, connected with the default settings.
    pub(crate) fn connection(dir: &std::path::Path, name: &str) -> DbConnection {
        let url = DatabaseUrl::parse(dir.join(name).to_str().unwrap()).unwrap();
        DbConnectionManager::new(url, &DatabaseSettings::default())
            .establish()
            .unwrap()
    }

    #[derive(diesel::QueryableByName)]
    pub(crate) struct Step {
        #[diesel(sql_type = diesel::sql_types::Text)]
        opcode: String,
    }

    /// The opcodes of `explain`, an `EXPLAIN …` query.
    pub(crate) fn opcodes<Q>(conn: &mut SqliteConnection, explain: Q) -> Vec<String>
    where
        Q: for<'a> LoadQuery<'a, SqliteConnection, Step>,
    {
        let steps: Vec<Step> = explain.load(conn).unwrap();
        steps.into_iter().map(|step| step.opcode).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_is_chosen_by_the_url_scheme() {
        assert_eq!(
            DatabaseUrl::parse("postgres://h/db").unwrap().backend(),
            Backend::Postgres
        );
        assert_eq!(
            DatabaseUrl::parse("postgresql://h/db").unwrap().backend(),
            Backend::Postgres
        );
        assert_eq!(
            DatabaseUrl::parse("onejob.db").unwrap().backend(),
            Backend::Sqlite
        );
        assert_eq!(
            DatabaseUrl::parse("sqlite:///tmp/x.db")
                .unwrap()
                .sqlite_path(),
            "/tmp/x.db"
        );
    }

    /// With the query planner stability guarantee (`.cargo/config.toml`
    /// builds SQLite with it on), a bound `LIMIT ?` is read at run time,
    /// from a register: binding it again leaves the prepared statement
    /// valid. Without it SQLite plans with the value bound when it
    /// prepared, as a constant, and every new binding expires the statement
    /// (diesel binds each `.first()`'s limit, so each ran re-parsed).
    #[test]
    fn a_bound_limit_does_not_expire_sqlite_statements() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = test_sqlite::connection(dir.path(), "plan.db");
        let DbConnection::Sqlite(sqlite) = &mut conn else {
            unreachable!("a file path is a SQLite database")
        };
        let opcodes = test_sqlite::opcodes(
            sqlite,
            diesel::sql_query("EXPLAIN SELECT 1 LIMIT ?").bind::<diesel::sql_types::BigInt, _>(1),
        );
        assert!(
            opcodes.iter().any(|opcode| opcode == "Variable"),
            "the limit was planned as a constant: {opcodes:?}"
        );
    }

    /// SQLite ends a transaction by itself when a statement finds the disk
    /// full; the driver notices at its next failing statement and counts
    /// no transaction. Acted out here without a full disk: a `ROLLBACK`
    /// behind the driver's back, then a statement that fails. A write
    /// inside must be refused, not begun afresh (which would commit it
    /// alone, and wait forever for the writer turn this thread holds).
    #[test]
    fn a_write_inside_a_transaction_sqlite_ended_is_refused() {
        use crate::store::StoreError;
        let dir = tempfile::tempdir().unwrap();
        let mut conn = test_sqlite::connection(dir.path(), "lost.db");
        let (sender, answer) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut inner = None;
            let turn = WriterTurn::default();
            let _ = turn.within(|| {
                write_transaction(&mut conn, |conn| {
                    conn.batch_execute("ROLLBACK").unwrap();
                    let _ = conn.batch_execute("SELECT * FROM no_such_table");
                    let write = write_transaction(conn, |_| Ok::<_, StoreError>(()));
                    inner = Some(write.map_err(|error| error.to_string()));
                    Ok::<_, StoreError>(())
                })
            });
            let _ = sender.send(inner);
        });
        let inner = answer
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the inner write answers, not waits forever for its own thread's writer turn");
        assert!(
            matches!(inner, Some(Err(_))),
            "the inner write was refused: {inner:?}"
        );
    }

    /// libpq's keyword/value form is refused with the URL form to use
    /// (taken for a SQLite path, it would have made a file by that name),
    /// and the refusal does not repeat the string, which may hold a
    /// password. A SQLite path with `=` in it is still a path.
    #[test]
    fn libpq_keyword_value_strings_are_refused_with_the_url_form_to_use() {
        for raw in [
            "host=db port=5432 dbname=onejob",
            "host=pg-one,pg-two dbname=onejob target_session_attrs=read-write password=s3cret",
        ] {
            let error = DatabaseUrl::parse(raw).unwrap_err().to_string();
            assert!(error.contains("postgres://"), "{error}");
            assert!(
                !error.contains("s3cret") && !error.contains("pg-one"),
                "{error}"
            );
        }
        for path in ["onejob.db", "data/a=b.db", "sqlite://x=1.db"] {
            assert_eq!(DatabaseUrl::parse(path).unwrap().backend(), Backend::Sqlite);
        }
    }

    #[test]
    fn passwords_are_redacted_for_logs() {
        let url = DatabaseUrl::parse("postgres://app:s3cret@db:5432/onejob").unwrap();
        assert_eq!(url.redacted(), "postgres://app:***@db:5432/onejob");
        assert!(!url.redacted().contains("s3cret"));
    }

    /// A multi-host URL (libpq tries the hosts in turn, and with
    /// `target_session_attrs=read-write` keeps the first that takes writes:
    /// how onejob follows a failover) is a PostgreSQL URL, logged with its
    /// hosts and parameters and without its password, wherever the URL
    /// carries it.
    #[test]
    fn a_multi_host_url_is_postgres_and_is_logged_with_its_hosts_and_without_its_password() {
        let url = DatabaseUrl::parse(
            "postgres://app:s3cret@10.0.0.1:5432,10.0.0.2:5432/onejob?target_session_attrs=read-write",
        )
        .unwrap();
        assert_eq!(url.backend(), Backend::Postgres);
        assert_eq!(url.sqlite_file(), None);
        assert_eq!(
            url.redacted(),
            "postgres://app:***@10.0.0.1:5432,10.0.0.2:5432/onejob?target_session_attrs=read-write"
        );
        let url = DatabaseUrl::parse(
            "postgresql://db-a,db-b/onejob?user=app&password=s3cret&target_session_attrs=read-write",
        )
        .unwrap();
        assert_eq!(url.backend(), Backend::Postgres);
        assert_eq!(
            url.redacted(),
            "postgresql://db-a,db-b/onejob?user=app&password=***&target_session_attrs=read-write"
        );
        assert!(!url.described().contains("s3cret"));
    }

    #[test]
    fn a_database_is_described_by_its_absolute_file_or_its_url_without_password() {
        let url = DatabaseUrl::parse("postgres://app:s3cret@db:5432/onejob").unwrap();
        assert_eq!(
            url.described(),
            "the PostgreSQL database postgres://app:***@db:5432/onejob"
        );
        let here = std::env::current_dir().unwrap().join("onejob.db");
        assert_eq!(
            DatabaseUrl::parse("onejob.db").unwrap().described(),
            format!("the SQLite database {}", here.display())
        );
        assert_eq!(
            DatabaseUrl::parse("sqlite:///tmp/x.db")
                .unwrap()
                .described(),
            "the SQLite database /tmp/x.db"
        );
    }
}

/// How the database keeps its rows, which decides how a creation is
/// written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// One database (SQLite, or one PostgreSQL): on PostgreSQL a creation
    /// is one statement, and a batch of one owner's one multi-row
    /// statement, each an `INSERT … SELECT`.
    #[default]
    OneDatabase,
    /// Distributed by owner (Citus): a creation is plain `INSERT … VALUES`
    /// statements in one transaction, which Citus routes to the owner's
    /// shard. Citus runs an `INSERT … SELECT` through the coordinator, with
    /// intermediate results and a two-phase commit, on every creation.
    ByOwner,
}

/// PostgreSQL's clock in Unix milliseconds, as SQL: `statement_timestamp()`,
/// one value for the whole statement, which Citus evaluates once on the
/// coordinator (a volatile `clock_timestamp()` is refused inside an UPDATE
/// on a distributed table; see docs/scaling.md).
pub const PG_NOW_MS: &str = "(EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT";

/// SQLite's clock in Unix milliseconds, as SQL.
pub const SQLITE_NOW_MS: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

/// The database's clock in Unix milliseconds, as SQL for this backend.
pub fn db_now_ms(conn: &DbConnection) -> &'static str {
    match conn {
        DbConnection::Postgresql(_) => PG_NOW_MS,
        DbConnection::Sqlite(_) => SQLITE_NOW_MS,
    }
}

#[derive(QueryableByName)]
struct Clock {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    now_ms: Timestamp,
}

/// Reads the database's clock: statements bind it rather than evaluate a
/// clock inside a write.
pub fn db_clock(conn: &mut DbConnection) -> super::StoreResult<Timestamp> {
    let query = format!("SELECT {} AS now_ms", db_now_ms(conn));
    Ok(diesel::sql_query(query).get_result::<Clock>(conn)?.now_ms)
}
