//! The ceilings onejob is measured against, in the same run: pgbench running
//! onejob's own statements on onejob's own schema, and a raw single-connection
//! SQLite loop of the creation transaction.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;

pub const FUNCTIONS: &str = include_str!("../../bench/pgbench/functions.sql");
pub const CREATE: &str = include_str!("../../bench/pgbench/create.sql");
pub const LIFECYCLE: &str = include_str!("../../bench/pgbench/lifecycle.sql");
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

/// Creations per second of a raw loop on one SQLite connection: the same two
/// inserts, `per_commit` creations to a `BEGIN IMMEDIATE` transaction
/// (1: one transaction, one `fsync`, per job), `journal_mode=WAL`,
/// `synchronous=FULL`, on a database with onejob's schema.
pub fn sqlite_raw_loop(path: &Path, owner: &str, duration: Duration, per_commit: usize) -> f64 {
    let mut conn = SqliteConnection::establish(&path.display().to_string()).unwrap();
    conn.batch_execute(
        "PRAGMA busy_timeout = 5000; PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; \
         PRAGMA foreign_keys = ON;",
    )
    .unwrap();
    let started = Instant::now();
    let mut done = 0u64;
    while started.elapsed() < duration {
        let mut batch = String::from("BEGIN IMMEDIATE;");
        for _ in 0..per_commit.max(1) {
            let (job, attempt) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
            let now = chrono::Utc::now().timestamp_millis();
            let fingerprint = format!("{}{}", job.simple(), attempt.simple());
            batch.push_str(&format!(
                "INSERT INTO jobs (id, owner_id, idempotency_key, task, provider, requested_provider,
                     input, params, fingerprint, status, version, created_at, updated_at)
                   VALUES ('{job}', '{owner}', 'raw-{job}', 'summarize', 'sim', NULL,
                     '{{\"text\":\"raw\"}}', '{{}}', '{fingerprint}', 'pending', 0, {now}, {now})
                   ON CONFLICT (owner_id, idempotency_key) DO NOTHING;
                 INSERT INTO attempts (id, job_id, owner_id, number, provider, state, created_at)
                   VALUES ('{attempt}', '{job}', '{owner}', 1, 'sim', 'queued', {now});"
            ));
        }
        batch.push_str("COMMIT;");
        conn.batch_execute(&batch).expect("the raw SQLite loop");
        done += per_commit.max(1) as u64;
    }
    done as f64 / started.elapsed().as_secs_f64()
}
