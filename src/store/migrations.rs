//! Embedded migrations, one folder per backend with matching names.

use diesel::connection::SimpleConnection;
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
            Ok(names(sqlite.run_pending_migrations(SQLITE_MIGRATIONS)?))
        }
        DbConnection::Postgresql(pg) => {
            pg.batch_execute(&format!("SELECT pg_advisory_lock({PG_MIGRATION_LOCK})"))?;
            let result = pg.run_pending_migrations(POSTGRES_MIGRATIONS).map(names);
            pg.batch_execute(&format!("SELECT pg_advisory_unlock({PG_MIGRATION_LOCK})"))?;
            Ok(result?)
        }
    }
}
