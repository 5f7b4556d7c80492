//! The ceilings onejob is measured against, in the same run: pgbench running
//! onejob's own statements on onejob's own schema, a raw single-connection
//! SQLite loop of the creation transaction, and the durable floor of one
//! `/v1` answer on each backend (its two commits, raw, one at a time).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;

use crate::load::Run;

pub const FUNCTIONS: &str = include_str!("../../bench/pgbench/functions.sql");
pub const CREATE: &str = include_str!("../../bench/pgbench/create.sql");
/// A job made with its attempt running: the first part of the next two.
const RUNNING_JOB: &str = include_str!("../../bench/pgbench/running_job.sql");
const LIFECYCLE_CAS: &str = include_str!("../../bench/pgbench/lifecycle.sql");
const ANSWER: &str = include_str!("../../bench/pgbench/answer.sql");

/// The bare lifecycle: the running job, then the compare-and-swap transaction.
pub fn lifecycle_script() -> String {
    format!("{RUNNING_JOB}{LIFECYCLE_CAS}")
}

/// The durable floor of one `/v1` answer: the running job, then the answer
/// in one statement.
pub fn answer_script() -> String {
    format!("{RUNNING_JOB}{ANSWER}")
}
/// Group commit's multi-row creation, [`CREATE_BATCH_ROWS`] jobs a statement.
pub const CREATE_BATCHED: &str = include_str!("../../bench/pgbench/create_batched.sql");
pub const CREATE_BATCH_ROWS: usize = 32;

/// A PostgreSQL server: where each step's fresh database is made.
#[derive(Clone)]
pub struct Postgres {
    pub server: url::Url,
}

impl Postgres {
    pub fn parse(raw: &str) -> Self {
        let server = url::Url::parse(raw).expect("--postgres is a postgres:// URL");
        Self { server }
    }

    pub fn database_url(&self, database: &str) -> String {
        self.url_of(database)
    }

    fn url_of(&self, database: &str) -> String {
        let mut url = self.server.clone();
        url.set_path(database);
        url.to_string()
    }

    /// Drops and creates `name`; its URL.
    pub fn fresh_database(&self, name: &str) -> String {
        let mut admin = PgConnection::establish(&self.url_of("postgres"))
            .expect("connecting to the PostgreSQL server");
        // One statement per call: DROP DATABASE refuses to run in the
        // implicit transaction of a multi-statement string.
        for statement in [
            format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            format!("CREATE DATABASE {name}"),
        ] {
            admin
                .batch_execute(&statement)
                .expect("creating the benchmark database");
        }
        self.url_of(name)
    }

    pub fn drop_database(&self, name: &str) {
        if let Ok(mut admin) = PgConnection::establish(&self.url_of("postgres")) {
            let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
        }
    }
}

pub fn pg(url: &str) -> PgConnection {
    PgConnection::establish(url).expect("connecting to the benchmark database")
}

/// pgbench's transactions per second (one transaction = one run of `script`).
pub fn pgbench(
    database_url: &str,
    dir: &Path,
    name: &str,
    script: &str,
    clients: usize,
    seconds: u64,
    defines: &[(&str, &str)],
) -> f64 {
    pg(database_url)
        .batch_execute(FUNCTIONS)
        .expect("creating the pgbench helpers");
    let file = dir.join(format!("{name}.sql"));
    std::fs::write(&file, script).expect("writing the pgbench script");
    let url = url::Url::parse(database_url).unwrap();
    let mut command = Command::new("pgbench");
    command
        .args(["--no-vacuum", "--protocol=prepared", "--jobs=2"])
        .arg(format!("--client={clients}"))
        .arg(format!("--time={seconds}"))
        .arg(format!("--host={}", url.host_str().unwrap_or("127.0.0.1")))
        .arg(format!("--port={}", url.port().unwrap_or(5432)))
        .arg(format!("--username={}", url.username()))
        .arg("--file")
        .arg(&file);
    for (name, value) in defines {
        command.arg(format!("--define={name}={value}"));
    }
    command.arg(url.path().trim_start_matches('/'));
    if let Some(password) = url.password() {
        command.env("PGPASSWORD", password);
    }
    let output = command
        .output()
        .expect("running pgbench (is it installed?)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "pgbench failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let failed = stdout
        .lines()
        .find(|l| l.contains("number of failed transactions"))
        .unwrap_or("");
    assert!(
        failed.is_empty() || failed.contains(": 0 "),
        "pgbench transactions failed: {failed}"
    );
    stdout
        .lines()
        .find(|l| l.starts_with("tps = "))
        .and_then(|l| l["tps = ".len()..].split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("pgbench printed no tps: {stdout}"))
}

/// Gathers the planner's statistics on the tables every step writes. Both
/// sides run it after their warm-up: a database older than autovacuum's
/// first pass has statistics, and without them PostgreSQL plans with
/// default estimates (a plan made on a near-empty table may then stay cached
/// in a connection as the table grows).
pub fn analyze(database_url: &str) {
    pg(database_url)
        .batch_execute("ANALYZE jobs; ANALYZE attempts;")
        .expect("analyzing the tables");
}

/// How many times PostgreSQL has synced its WAL to disk, cluster-wide
/// (`pg_stat_wal.wal_sync`, PostgreSQL 14 and later): `None` where the
/// server does not keep the count.
pub fn wal_syncs(database_url: &str) -> Option<i64> {
    #[derive(QueryableByName)]
    struct Syncs {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        wal_sync: i64,
    }
    diesel::sql_query("SELECT wal_sync::bigint AS wal_sync FROM pg_stat_wal")
        .get_result::<Syncs>(&mut pg(database_url))
        .ok()
        .map(|s| s.wal_sync)
}

/// One raw SQLite connection on a database with onejob's schema, set as
/// onejob sets its own: `journal_mode=WAL`, `synchronous=FULL`.
fn raw_sqlite(path: &Path) -> SqliteConnection {
    let mut conn = SqliteConnection::establish(&path.display().to_string()).unwrap();
    conn.batch_execute(
        "PRAGMA busy_timeout = 5000; PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; \
         PRAGMA foreign_keys = ON;",
    )
    .unwrap();
    conn
}

/// How a raw creation leaves its first attempt.
#[derive(Clone, Copy)]
enum FirstAttempt {
    /// Waiting for the worker.
    Queued,
    /// Claimed and confirmed for sending, as when the worker has a slot.
    Running,
}

/// A job and its first attempt as raw SQL.
fn raw_creation(
    job: &uuid::Uuid,
    attempt: &uuid::Uuid,
    owner: &str,
    first: FirstAttempt,
) -> String {
    let now = chrono::Utc::now().timestamp_millis();
    let fingerprint = format!("{}{}", job.simple(), attempt.simple());
    let (job_status, state, version_read) = match first {
        FirstAttempt::Running => ("running", "running", "0"),
        FirstAttempt::Queued => ("pending", "queued", "NULL"),
    };
    format!(
        "INSERT INTO jobs (id, owner_id, idempotency_key, task, provider, requested_provider,
             input, params, fingerprint, status, version, created_at, updated_at)
           VALUES ('{job}', '{owner}', 'raw-{job}', 'summarize', 'sim', NULL,
             '{{\"text\":\"raw\"}}', '{{}}', '{fingerprint}', '{job_status}', 0, {now}, {now})
           ON CONFLICT (owner_id, idempotency_key) DO NOTHING;
         INSERT INTO attempts (id, job_id, owner_id, number, provider, state, version_read,
             created_at)
           VALUES ('{attempt}', '{job}', '{owner}', 1, 'sim', '{state}', {version_read}, {now});"
    )
}

/// Creations per second of a raw loop on one SQLite connection: the same two
/// inserts, `per_commit` creations to a `BEGIN IMMEDIATE` transaction
/// (1: one transaction, one `fsync`, per job), on a database with onejob's
/// schema ([`raw_sqlite`]).
pub fn sqlite_raw_loop(path: &Path, owner: &str, duration: Duration, per_commit: usize) -> f64 {
    let mut conn = raw_sqlite(path);
    let started = Instant::now();
    let mut done = 0u64;
    while started.elapsed() < duration {
        let mut batch = String::from("BEGIN IMMEDIATE;");
        for _ in 0..per_commit.max(1) {
            let (job, attempt) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
            batch.push_str(&raw_creation(&job, &attempt, owner, FirstAttempt::Queued));
        }
        batch.push_str("COMMIT;");
        conn.batch_execute(&batch).expect("the raw SQLite loop");
        done += per_commit.max(1) as u64;
    }
    done as f64 / started.elapsed().as_secs_f64()
}

/// The durable floor of one `/v1` answer on SQLite: the two commits every
/// call waits for, raw, one job at a time on one connection. First the job
/// with its attempt running (durable before the provider is called), then
/// the answer: the job's result, the attempt's end and the call's row in
/// the usage ledger. Each job's time is the two together. With
/// `synchronous` other than `FULL`, the same without waiting for the disk.
pub fn sqlite_answer_floor(path: &Path, owner: &str, duration: Duration, synchronous: &str) -> Run {
    let mut conn = raw_sqlite(path);
    conn.batch_execute(&format!("PRAGMA synchronous = {synchronous};"))
        .unwrap();
    let mut run = Run::default();
    let answered_before = succeeded_jobs(&mut conn);
    let started = Instant::now();
    while started.elapsed() < duration {
        let (job, attempt) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
        let sent = Instant::now();
        let created = format!(
            "BEGIN IMMEDIATE; {} COMMIT;",
            raw_creation(&job, &attempt, owner, FirstAttempt::Running)
        );
        conn.batch_execute(&created).expect("the raw creation");
        let now = chrono::Utc::now().timestamp_millis();
        conn.batch_execute(&format!(
            "BEGIN IMMEDIATE;
             UPDATE attempts SET state = 'succeeded', outcome = 'won', finished_at = {now},
                 lease_expires_at = NULL
               WHERE id = '{attempt}' AND owner_id = '{owner}' AND state = 'running';
             UPDATE jobs SET result = '{{\"summary\":\"ok\"}}', completed_by = '{attempt}',
                 status = 'succeeded', version = version + 1, updated_at = {now}
               WHERE id = '{job}' AND owner_id = '{owner}' AND version = 0
                 AND completed_by IS NULL;
             INSERT INTO usage_ledger (attempt_id, owner_id, job_id, task, provider, model, kind,
                 late, prompt_tokens, completion_tokens, cached_tokens, usage_source,
                 cost_micros, price_effective_from, currency, recorded_at)
               VALUES ('{attempt}', '{owner}', '{job}', 'summarize', 'sim', 'simulated', 'won',
                 0, 12, 3, 0, 'estimated', NULL, NULL, NULL, {now});
             COMMIT;"
        ))
        .expect("the raw answer");
        run.latencies.push(sent.elapsed());
    }
    run.elapsed = started.elapsed();
    // Every answer took: the floor is of writes that happened.
    assert_eq!(
        succeeded_jobs(&mut conn) - answered_before,
        run.latencies.len() as i64,
        "every raw answer made its job succeed"
    );
    run
}

/// How many jobs have succeeded.
fn succeeded_jobs(conn: &mut SqliteConnection) -> i64 {
    diesel::dsl::sql::<diesel::sql_types::BigInt>(
        "SELECT count(*) FROM jobs WHERE status = 'succeeded'",
    )
    .get_result(conn)
    .unwrap()
}
