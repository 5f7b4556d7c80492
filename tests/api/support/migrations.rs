//! A database as an earlier release left it: the migrations applied one at
//! a time up to a named one (diesel's `MigrationHarness`), so that a test
//! can write rows in that release's shape and let onejob migrate the rest
//! (`store::migrations::run_pending`), as an upgrade does.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};

use super::harness::{TestBackend, TestDb};

pub const SQLITE_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/sqlite");
pub const POSTGRES_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/postgres");

/// Applies `source`'s pending migrations in order, up to and including the
/// one named `last` (`2026-12-02-000014_ledger`). Panics if there is none
/// of that name: a test must not silently migrate everything.
pub fn migrate_up_to<C, DB>(conn: &mut C, source: EmbeddedMigrations, last: &str)
where
    DB: diesel::backend::Backend,
    C: MigrationHarness<DB>,
{
    let pending = conn.pending_migrations(source).unwrap();
    assert!(
        pending.iter().any(|m| m.name().to_string() == last),
        "no pending migration named {last}"
    );
    for migration in &pending {
        conn.run_migration(&**migration).unwrap();
        if migration.name().to_string() == last {
            return;
        }
    }
}

/// Migrates the empty database `db` up to `last` and runs `sql` on it
/// (rows in that release's shape), with each backend's own connection.
pub fn as_of(db: &TestDb, backend: TestBackend, last: &str, sql: &str) {
    match backend {
        TestBackend::Sqlite => {
            let mut conn = SqliteConnection::establish(db.url.as_str()).unwrap();
            // As `store::migrations` runs them: SQLite rebuilds tables that
            // others refer to, with foreign keys off; the rows are written
            // with them on.
            conn.batch_execute("PRAGMA foreign_keys = OFF").unwrap();
            migrate_up_to(&mut conn, SQLITE_MIGRATIONS, last);
            conn.batch_execute("PRAGMA foreign_keys = ON").unwrap();
            conn.batch_execute(sql).unwrap();
        }
        TestBackend::Postgres => {
            let mut conn = PgConnection::establish(db.url.as_str()).unwrap();
            migrate_up_to(&mut conn, POSTGRES_MIGRATIONS, last);
            conn.batch_execute(sql).unwrap();
        }
    }
}
