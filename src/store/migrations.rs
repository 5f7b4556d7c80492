//! Embedded migrations, one folder per backend with matching names.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};

use super::DbConnection;

const SQLITE_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/sqlite");
const POSTGRES_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/postgres");

/// An arbitrary constant naming onejob's migration lock on PostgreSQL.
const PG_MIGRATION_LOCK: i64 = 0x6f6e_656a_6f62;

pub type MigrationError = Box<dyn std::error::Error + Send + Sync>;

/// Applies every pending migration and returns the versions applied.
///
/// On PostgreSQL several processes may start at once against one database; an
/// advisory lock makes them take turns.
pub fn run_pending(conn: &mut DbConnection) -> Result<Vec<String>, MigrationError> {
    fn names(versions: Vec<diesel::migration::MigrationVersion<'_>>) -> Vec<String> {
        versions.into_iter().map(|v| v.to_string()).collect()
    }
    match conn {
        DbConnection::Sqlite(sqlite) => {
            // SQLite changes a table's keys by rebuilding it, which drops a
            // table that others reference: foreign keys are not enforced
            // while migrations run (the pragma is a no-op inside their
            // transactions, so it is set here), then checked as a whole.
            sqlite.batch_execute("PRAGMA foreign_keys = OFF")?;
            let result = sqlite.run_pending_migrations(SQLITE_MIGRATIONS).map(names);
            let broken = match &result {
                Ok(applied) if !applied.is_empty() => sqlite_foreign_key_violations(sqlite),
                _ => Ok(0),
            };
            sqlite.batch_execute("PRAGMA foreign_keys = ON")?;
            let applied = result?;
            match broken? {
                0 => Ok(applied),
                n => Err(format!(
                    "after migrations {applied:?}, {n} rows break their foreign keys \
                     (PRAGMA foreign_key_check lists them)"
                )
                .into()),
            }
        }
        DbConnection::Postgresql(pg) => {
            pg.batch_execute(&format!("SELECT pg_advisory_lock({PG_MIGRATION_LOCK})"))?;
            let result = pg.run_pending_migrations(POSTGRES_MIGRATIONS).map(names);
            pg.batch_execute(&format!("SELECT pg_advisory_unlock({PG_MIGRATION_LOCK})"))?;
            Ok(result?)
        }
    }
}

/// How many rows `PRAGMA foreign_key_check` finds whose parent row is missing.
fn sqlite_foreign_key_violations(conn: &mut diesel::SqliteConnection) -> QueryResult<i64> {
    diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
        "(SELECT COUNT(*) FROM pragma_foreign_key_check)",
    ))
    .get_result(conn)
}
