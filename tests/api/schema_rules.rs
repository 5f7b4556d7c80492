//! The schema stays ready to be distributed by owner (docs/scaling.md). These
//! tests read the catalog of a migrated database, as the database itself
//! reports it, and hold it to the rules a distributed engine such as Citus
//! sets for tables distributed by a column:
//!
//! - every table is placed: distributed by owner, reference (copied to every
//!   node) or local (the coordinator's own);
//! - every distributed table has a NOT NULL `owner_id`;
//! - every primary key, unique constraint, unique index (partial ones too)
//!   and exclusion constraint of a distributed table includes `owner_id` as
//!   a plain key column;
//! - a foreign key between two distributed tables matches `owner_id` to
//!   `owner_id`; nothing but a distributed table points at one.

use std::collections::BTreeMap;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Nullable, Text};
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};
use onejob::store::distribution::{Layout, DISTRIBUTION_COLUMN, LAYOUT};
use onejob::store::DbConnection;

use crate::support::harness::{
    test_config, PreparedApp, TestBackend, TestDb, DEFAULT_TEST_PROVIDERS,
};

/// A unique key: its table, its name and its key columns in order (`None`
/// for an expression).
struct UniqueKey {
    table: String,
    name: String,
    columns: Vec<Option<String>>,
}

/// A foreign key: (column, parent column) pairs in order.
struct ForeignKey {
    table: String,
    name: String,
    parent: String,
    pairs: Vec<(String, Option<String>)>,
}

/// What the catalog says, the same shape on both backends.
struct Catalog {
    /// Table → (column → NOT NULL).
    tables: BTreeMap<String, BTreeMap<String, bool>>,
    unique_keys: Vec<UniqueKey>,
    foreign_keys: Vec<ForeignKey>,
}

#[derive(QueryableByName)]
struct ColumnRow {
    #[diesel(sql_type = Text)]
    table_name: String,
    #[diesel(sql_type = Text)]
    column_name: String,
    #[diesel(sql_type = Bool)]
    not_null: bool,
}

#[derive(QueryableByName)]
struct KeyColumnRow {
    #[diesel(sql_type = Text)]
    table_name: String,
    #[diesel(sql_type = Text)]
    key_name: String,
    #[diesel(sql_type = Nullable<Text>)]
    column_name: Option<String>,
    #[diesel(sql_type = BigInt)]
    position: i64,
}

#[derive(QueryableByName)]
struct ForeignKeyRow {
    #[diesel(sql_type = Text)]
    table_name: String,
    #[diesel(sql_type = Text)]
    key_name: String,
    #[diesel(sql_type = Text)]
    parent: String,
    #[diesel(sql_type = Text)]
    column_name: String,
    #[diesel(sql_type = Nullable<Text>)]
    parent_column: Option<String>,
    #[diesel(sql_type = BigInt)]
    position: i64,
}

/// Every table's columns (PostgreSQL: the current schema's base tables).
const PG_COLUMNS: &str = "
    SELECT c.table_name::text AS table_name, c.column_name::text AS column_name,
           c.is_nullable = 'NO' AS not_null
    FROM information_schema.columns c
    JOIN information_schema.tables t
      ON t.table_schema = c.table_schema AND t.table_name = c.table_name
    WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'";

/// Key columns of every unique index (primary keys and unique constraints
/// included, partial indexes too; INCLUDE columns are not key columns; an
/// expression has no column) and of every exclusion constraint.
const PG_UNIQUE_KEYS: &str = "
    SELECT t.relname::text AS table_name, i.relname::text AS key_name,
           a.attname::text AS column_name, k.position AS position
    FROM pg_index x
    JOIN pg_class i ON i.oid = x.indexrelid
    JOIN pg_class t ON t.oid = x.indrelid
    CROSS JOIN LATERAL unnest(x.indkey::int2[]) WITH ORDINALITY AS k(attnum, position)
    LEFT JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum AND k.attnum > 0
    WHERE x.indisunique AND t.relnamespace = current_schema()::text::regnamespace
      AND k.position <= x.indnkeyatts
    UNION ALL
    SELECT t.relname::text, c.conname::text, a.attname::text, k.position
    FROM pg_constraint c
    JOIN pg_class t ON t.oid = c.conrelid
    CROSS JOIN LATERAL unnest(c.conkey) WITH ORDINALITY AS k(attnum, position)
    LEFT JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum
    WHERE c.contype = 'x' AND c.connamespace = current_schema()::text::regnamespace";

const PG_FOREIGN_KEYS: &str = "
    SELECT t.relname::text AS table_name, c.conname::text AS key_name,
           p.relname::text AS parent, a.attname::text AS column_name,
           pa.attname::text AS parent_column, k.position AS position
    FROM pg_constraint c
    JOIN pg_class t ON t.oid = c.conrelid
    JOIN pg_class p ON p.oid = c.confrelid
    CROSS JOIN LATERAL unnest(c.conkey, c.confkey) WITH ORDINALITY AS k(attnum, parent_attnum, position)
    JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
    JOIN pg_attribute pa ON pa.attrelid = c.confrelid AND pa.attnum = k.parent_attnum
    WHERE c.contype = 'f' AND c.connamespace = current_schema()::text::regnamespace";

const SQLITE_TABLES: &str =
    "FROM sqlite_master m WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite\\_%' ESCAPE '\\'";

fn sqlite_columns() -> String {
    format!(
        "SELECT m.name AS table_name, c.name AS column_name, c.\"notnull\" <> 0 AS not_null \
         {}",
        SQLITE_TABLES.replace(
            "FROM sqlite_master m",
            "FROM sqlite_master m, pragma_table_info(m.name) c"
        )
    )
}

/// The primary key from the table's columns (a rowid alias has no index),
/// and every other unique index: UNIQUE constraints and CREATE UNIQUE INDEX,
/// partial ones too (an expression has no column name).
fn sqlite_unique_keys() -> String {
    let primary = SQLITE_TABLES.replace(
        "FROM sqlite_master m",
        "FROM sqlite_master m, pragma_table_info(m.name) c",
    );
    let indexes = SQLITE_TABLES.replace(
        "FROM sqlite_master m",
        "FROM sqlite_master m, pragma_index_list(m.name) il, pragma_index_info(il.name) ii",
    );
    format!(
        "SELECT m.name AS table_name, m.name || ' PRIMARY KEY' AS key_name, \
                c.name AS column_name, c.pk AS position {primary} AND c.pk > 0 \
         UNION ALL \
         SELECT m.name, il.name, ii.name, ii.seqno + 1 {indexes} \
           AND il.\"unique\" = 1 AND il.origin <> 'pk'"
    )
}

fn sqlite_foreign_keys() -> String {
    format!(
        "SELECT m.name AS table_name, m.name || ' foreign key #' || fk.id AS key_name, \
                fk.\"table\" AS parent, fk.\"from\" AS column_name, fk.\"to\" AS parent_column, \
                fk.seq AS position {}",
        SQLITE_TABLES.replace(
            "FROM sqlite_master m",
            "FROM sqlite_master m, pragma_foreign_key_list(m.name) fk"
        )
    )
}

fn read_catalog(conn: &mut DbConnection) -> Catalog {
    let (columns, unique_keys, foreign_keys) = match conn {
        DbConnection::Postgresql(_) => (
            PG_COLUMNS.to_owned(),
            PG_UNIQUE_KEYS.to_owned(),
            PG_FOREIGN_KEYS.to_owned(),
        ),
        DbConnection::Sqlite(_) => (
            sqlite_columns(),
            sqlite_unique_keys(),
            sqlite_foreign_keys(),
        ),
    };
    let mut tables: BTreeMap<String, BTreeMap<String, bool>> = BTreeMap::new();
    for row in diesel::sql_query(columns).load::<ColumnRow>(conn).unwrap() {
        tables
            .entry(row.table_name)
            .or_default()
            .insert(row.column_name, row.not_null);
    }

    let mut rows = diesel::sql_query(unique_keys)
        .load::<KeyColumnRow>(conn)
        .unwrap();
    rows.sort_by(|a, b| {
        (&a.table_name, &a.key_name, a.position).cmp(&(&b.table_name, &b.key_name, b.position))
    });
    let mut unique_keys: Vec<UniqueKey> = Vec::new();
    for row in rows {
        match unique_keys.last_mut() {
            Some(key) if key.table == row.table_name && key.name == row.key_name => {
                key.columns.push(row.column_name)
            }
            _ => unique_keys.push(UniqueKey {
                table: row.table_name,
                name: row.key_name,
                columns: vec![row.column_name],
            }),
        }
    }

    let mut rows = diesel::sql_query(foreign_keys)
        .load::<ForeignKeyRow>(conn)
        .unwrap();
    rows.sort_by(|a, b| {
        (&a.table_name, &a.key_name, a.position).cmp(&(&b.table_name, &b.key_name, b.position))
    });
    let mut foreign_keys: Vec<ForeignKey> = Vec::new();
    for row in rows {
        let pair = (row.column_name, row.parent_column);
        match foreign_keys.last_mut() {
            Some(fk) if fk.table == row.table_name && fk.name == row.key_name => {
                fk.pairs.push(pair)
            }
            _ => foreign_keys.push(ForeignKey {
                table: row.table_name,
                name: row.key_name,
                parent: row.parent,
                pairs: vec![pair],
            }),
        }
    }

    Catalog {
        tables,
        unique_keys,
        foreign_keys,
    }
}

/// Everything in the catalog that breaks the rules for `layout`, one line
/// each, naming the table and the key.
fn offenders(catalog: &Catalog, layout: &Layout) -> Vec<String> {
    let mut found = Vec::new();
    for table in catalog.tables.keys() {
        match layout.placements(table) {
            1 => {}
            0 => found.push(format!(
                "table {table} is not placed: list it as distributed by {DISTRIBUTION_COLUMN}, \
                 reference or local (docs/scaling.md)"
            )),
            _ => found.push(format!("table {table} is placed more than once")),
        }
    }
    for table in layout
        .distributed
        .iter()
        .chain(layout.reference)
        .chain(layout.local)
    {
        if !catalog.tables.contains_key(*table) {
            found.push(format!("table {table} is placed but does not exist"));
        }
    }
    for table in layout.distributed {
        match catalog
            .tables
            .get(*table)
            .and_then(|columns| columns.get(DISTRIBUTION_COLUMN))
        {
            Some(true) => {}
            Some(false) => found.push(format!(
                "distributed table {table}: {DISTRIBUTION_COLUMN} may be NULL"
            )),
            None => found.push(format!(
                "distributed table {table} has no {DISTRIBUTION_COLUMN} column"
            )),
        }
    }
    for key in &catalog.unique_keys {
        let includes_owner = key
            .columns
            .iter()
            .any(|c| c.as_deref() == Some(DISTRIBUTION_COLUMN));
        if layout.is_distributed(&key.table) && !includes_owner {
            let columns: Vec<&str> = key
                .columns
                .iter()
                .map(|c| c.as_deref().unwrap_or("<expression>"))
                .collect();
            found.push(format!(
                "{}: unique key {} ({}) does not include {DISTRIBUTION_COLUMN}",
                key.table,
                key.name,
                columns.join(", ")
            ));
        }
    }
    for fk in &catalog.foreign_keys {
        if !layout.is_distributed(&fk.parent) {
            continue;
        }
        let matches_owner = fk.pairs.iter().any(|(column, parent)| {
            column == DISTRIBUTION_COLUMN && parent.as_deref() == Some(DISTRIBUTION_COLUMN)
        });
        if !layout.is_distributed(&fk.table) {
            found.push(format!(
                "{}: foreign key {} points at the distributed table {} from a table that is not \
                 distributed",
                fk.table, fk.name, fk.parent
            ));
        } else if !matches_owner {
            found.push(format!(
                "{}: foreign key {} to {} does not match {DISTRIBUTION_COLUMN} to \
                 {DISTRIBUTION_COLUMN}",
                fk.table, fk.name, fk.parent
            ));
        }
    }
    found
}

async fn the_schema_is_ready_to_be_distributed_by_owner(backend: TestBackend) {
    let prepared = PreparedApp::new(backend, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let (catalog, found) = prepared
        .with_conn(|conn| {
            let catalog = read_catalog(conn);
            let found = offenders(&catalog, &LAYOUT);
            (catalog, found)
        })
        .await;
    assert!(
        found.is_empty(),
        "the schema breaks the rules for distribution by {DISTRIBUTION_COLUMN} \
         (docs/scaling.md):\n  {}",
        found.join("\n  ")
    );
    // The catalog was read, not found empty: the keys the rules are about are there.
    let one_live = catalog
        .unique_keys
        .iter()
        .find(|k| k.name == "attempts_one_live_per_job")
        .expect("attempts_one_live_per_job read from the catalog");
    assert_eq!(
        one_live.columns,
        [Some("job_id".to_owned()), Some("owner_id".to_owned())]
    );
    let distributed_keys = catalog
        .unique_keys
        .iter()
        .filter(|k| LAYOUT.is_distributed(&k.table))
        .count();
    // jobs: key, (owner, key); attempts: key, (job, owner, number), one live;
    // race_log and audit_log: key.
    assert!(distributed_keys >= 7, "{distributed_keys} unique keys read");
    let owner_links = catalog
        .foreign_keys
        .iter()
        .filter(|fk| LAYOUT.is_distributed(&fk.parent))
        .count();
    assert!(owner_links >= 7, "{owner_links} foreign keys read");
}

async fn the_rules_report_keys_and_tables_that_break_them(backend: TestBackend) {
    let prepared = PreparedApp::new(backend, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let (found, found_wrong) = prepared
        .with_conn(move |conn| {
            // A unique index and a unique constraint without the owner, a
            // table nobody placed, and a local table pointing at jobs.
            let unique_constraint = match backend {
                TestBackend::Postgres => {
                    "ALTER TABLE attempts ADD CONSTRAINT attempts_provider_number_unique \
                     UNIQUE (provider, number);"
                }
                TestBackend::Sqlite => {
                    "CREATE UNIQUE INDEX attempts_provider_number_unique \
                     ON attempts (provider, number);"
                }
            };
            conn.batch_execute(&format!(
                "CREATE UNIQUE INDEX jobs_fingerprint_unique ON jobs (fingerprint) \
                     WHERE status = 'pending';
                 {unique_constraint}
                 CREATE TABLE job_notes (
                     id TEXT PRIMARY KEY NOT NULL,
                     job_id TEXT NOT NULL,
                     owner_id TEXT NOT NULL,
                     FOREIGN KEY (job_id, owner_id) REFERENCES jobs (id, owner_id)
                 );"
            ))
            .unwrap();
            let catalog = read_catalog(conn);
            // The same catalog, with a table that has no owner listed as
            // distributed and the new table placed.
            let wrong = Layout {
                distributed: &[
                    "jobs",
                    "attempts",
                    "race_log",
                    "audit_log",
                    "stream_chunks",
                    "webhook_endpoints",
                    "webhook_subscriptions",
                    "webhook_events",
                    "webhook_deliveries",
                    "usage_ledger",
                    "budgets",
                    "budget_reservations",
                    "usage_tallies",
                    "qualifications",
                ],
                reference: &["users", "api_tokens", "sessions", "sign_in_throttle"],
                local: &[
                    "__diesel_schema_migrations",
                    "job_notes",
                    "backlog_samples",
                    "credential_changes",
                ],
            };
            (offenders(&catalog, &LAYOUT), offenders(&catalog, &wrong))
        })
        .await;
    let unique_index =
        "jobs: unique key jobs_fingerprint_unique (fingerprint) does not include owner_id";
    let unique_constraint = "attempts: unique key attempts_provider_number_unique \
                             (provider, number) does not include owner_id";
    let local_points_at_jobs = "job_notes: foreign key";
    assert_reported(
        &found,
        &[
            unique_index,
            unique_constraint,
            "table job_notes is not placed",
            local_points_at_jobs,
        ],
    );
    assert_reported(
        &found_wrong,
        &[
            unique_index,
            unique_constraint,
            local_points_at_jobs,
            "distributed table qualifications has no owner_id column",
            "qualifications: unique key",
        ],
    );
}

/// Each offender matches one expected line (by its start), and nothing else
/// is reported: the migrated schema itself breaks no rule.
fn assert_reported(found: &[String], expected: &[&str]) {
    let report = found.join("\n  ");
    for line in expected {
        assert!(
            found.iter().any(|f| f.starts_with(line)),
            "not reported: {line}\nreported:\n  {report}"
        );
    }
    assert_eq!(found.len(), expected.len(), "reported:\n  {report}");
}

const SQLITE_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/sqlite");
const POSTGRES_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/postgres");

/// The migration this file's rules came with.
const DISTRIBUTION_MIGRATION: &str = "_distribution_column";

/// Applies the migrations that come before the distribution column.
fn migrate_to_before_distribution<C, DB>(conn: &mut C, source: EmbeddedMigrations)
where
    DB: diesel::backend::Backend,
    C: MigrationHarness<DB>,
{
    let pending = conn.pending_migrations(source).unwrap();
    for migration in pending
        .iter()
        .take_while(|m| !m.name().to_string().ends_with(DISTRIBUTION_MIGRATION))
    {
        conn.run_migration(&**migration).unwrap();
    }
}

/// Rows as the schema held them before the owner's column: two owners,
/// a race, audit entries about a job, an account and a qualification run.
fn legacy_rows() -> String {
    let (a64, b64) = ("a".repeat(64), "b".repeat(64));
    format!(
        "INSERT INTO users (id, name, role, created_at) VALUES
             ('u-alice', 'alice', 'user', 0), ('u-bob', 'bob', 'user', 0),
             ('u-ada', 'ada', 'admin', 0);
         INSERT INTO jobs (id, owner_id, idempotency_key, task, provider, input, params,
                           fingerprint, status, version, created_at, updated_at) VALUES
             ('j-alice', 'u-alice', 'k', 'summarize', 'sim-fast', '{{}}', '{{}}', '{a64}',
              'pending', 0, 0, 0),
             ('j-bob', 'u-bob', 'k', 'summarize', 'sim-fast', '{{}}', '{{}}', '{a64}',
              'pending', 0, 0, 0);
         INSERT INTO attempts (id, job_id, number, provider, state, created_at) VALUES
             ('a-won', 'j-alice', 1, 'sim-fast', 'succeeded', 0),
             ('a-lost', 'j-alice', 2, 'sim-slow', 'succeeded', 0),
             ('a-bob', 'j-bob', 1, 'sim-fast', 'unknown', 0);
         UPDATE jobs SET status = 'succeeded', result = '{{}}', completed_by = 'a-won',
                         version = 1
             WHERE id = 'j-alice';
         INSERT INTO race_log (id, job_id, losing_attempt_id, winning_attempt_id, reason,
                               version_read, version_found, provider, payload_sha256, lost_at)
             VALUES ('r-1', 'j-alice', 'a-lost', 'a-won', 'late', 0, 1, 'sim-slow', '{b64}', 0);
         INSERT INTO audit_log (id, actor_id, action, job_id, attempt_id, reason, at,
                                subject_user_id) VALUES
             ('e-job', 'u-ada', 'abandon_attempt', 'j-bob', 'a-bob', 'why', 0, NULL),
             ('e-user', 'u-ada', 'disable_user', NULL, NULL, 'why', 0, 'u-bob'),
             ('e-qualify', 'u-ada', 'qualify', NULL, NULL, 'why', 0, NULL);"
    )
}

#[derive(QueryableByName)]
struct OwnedRow {
    #[diesel(sql_type = Text)]
    id: String,
    #[diesel(sql_type = Text)]
    owner_id: String,
}

async fn migrating_gives_existing_rows_their_jobs_owner(backend: TestBackend) {
    let db = TestDb::create_empty(backend);
    let url = db.url.clone();
    let owners = tokio::task::spawn_blocking(move || {
        match backend {
            TestBackend::Sqlite => {
                let mut conn = SqliteConnection::establish(url.as_str()).unwrap();
                conn.batch_execute("PRAGMA foreign_keys = ON").unwrap();
                migrate_to_before_distribution(&mut conn, SQLITE_MIGRATIONS);
                conn.batch_execute(&legacy_rows()).unwrap();
            }
            TestBackend::Postgres => {
                let mut conn = PgConnection::establish(url.as_str()).unwrap();
                migrate_to_before_distribution(&mut conn, POSTGRES_MIGRATIONS);
                conn.batch_execute(&legacy_rows()).unwrap();
            }
        }
        // The rest as onejob applies it at start.
        let store =
            onejob::startup::open_store(&url, &test_config(DEFAULT_TEST_PROVIDERS)).unwrap();
        let mut conn = store.conn().unwrap();
        let owners: BTreeMap<String, String> = diesel::sql_query(
            "SELECT id, owner_id FROM attempts UNION ALL SELECT id, owner_id FROM race_log \
             UNION ALL SELECT id, owner_id FROM audit_log",
        )
        .load::<OwnedRow>(&mut *conn)
        .unwrap()
        .into_iter()
        .map(|r| (r.id, r.owner_id))
        .collect();
        let found = offenders(&read_catalog(&mut conn), &LAYOUT);
        assert!(found.is_empty(), "{}", found.join("\n"));
        owners
    })
    .await
    .unwrap();
    let expected: BTreeMap<String, String> = [
        ("a-won", "u-alice"),
        ("a-lost", "u-alice"),
        ("a-bob", "u-bob"),
        ("r-1", "u-alice"),
        // About Bob's job, by Ada: filed under Bob.
        ("e-job", "u-bob"),
        // About Bob's account: filed under Bob.
        ("e-user", "u-bob"),
        // About no one's job or account: filed under its actor.
        ("e-qualify", "u-ada"),
    ]
    .into_iter()
    .map(|(id, owner)| (id.to_owned(), owner.to_owned()))
    .collect();
    assert_eq!(owners, expected);
}

on_both_backends!(
    the_schema_is_ready_to_be_distributed_by_owner,
    the_rules_report_keys_and_tables_that_break_them,
    migrating_gives_existing_rows_their_jobs_owner,
);
