//! What the processes run with: their configuration file, the users, and
//! the backup provider's qualification.

use std::path::{Path, PathBuf};

use onejob::domain::Role;
use onejob::store::Store;

use super::{HELD, IDLE_IN_TRANSACTION_MS, LEASE_MS, STEP};
use crate::support::fake_provider::{strict_task_toml, FakeProvider, ProviderToml};
use crate::support::harness::{TestDb, FAKE_API_KEY};

/// The processes' configuration: `fake` first, `backup` next. Short
/// leases and pool waits (a lease must outlast two of them); soft
/// timeouts far past the partition, so that A's calls are still its own
/// when their answers come; and a short idle-in-transaction timeout, so
/// that a cut catching A inside a transaction frees its rows in seconds
/// (see [`super::locked_row`]).
pub fn write_config(dir: &Path, fake: &FakeProvider, backup: &FakeProvider) -> PathBuf {
    let provider = |name, fake: &FakeProvider| {
        ProviderToml::openai(name, &fake.base_url)
            .timeout_ms(30_000)
            .late_result_ms(30_000)
            .connect_timeout_ms(Some(1_000))
            .toml()
    };
    let toml = format!(
        r#"
[database]
pool_timeout_ms = 500
sqlite_busy_timeout_ms = 500
postgres_lock_timeout_ms = 500
postgres_idle_in_transaction_timeout_ms = {IDLE_IN_TRANSACTION_MS}

[worker]
concurrency = {HELD}
poll_interval_ms = 50
lease_ms = {LEASE_MS}
{fake}{backup}{task}"#,
        fake = provider("fake", fake),
        backup = provider("backup", backup),
        task = strict_task_toml("summarize", &["fake", "backup"], "Summarize: {{ text }}"),
    );
    let path = dir.join("onejob.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// The database's store, and API tokens for an owner and a support user.
pub async fn seed(db: &TestDb) -> (Store, String, String) {
    let store = db.open_store().await;
    let (owner, support) = store
        .run(|conn| {
            let (_, owner) = onejob::store::users::add_user(conn, "client", Role::User).unwrap();
            let (_, support) = onejob::store::users::add_user(conn, "sue", Role::Support).unwrap();
            Ok((owner.0, support.0))
        })
        .await
        .unwrap();
    (store, owner, support)
}

/// Qualifies `provider` for the task with the real command, so that
/// support may start an attempt on it.
pub async fn qualify(dir: &Path, config: &Path, url: &str, provider: &str) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_onejob"));
    command
        .args(["qualify", "--provider", provider, "--task", "summarize"])
        .current_dir(dir)
        .env("ONEJOB_CONFIG", config)
        .env("DATABASE_URL", url)
        .env("ONEJOB_TEST_FAKE_KEY", FAKE_API_KEY);
    // Its one call is bounded by the provider's soft timeout.
    let output = tokio::time::timeout(STEP, tokio::task::spawn_blocking(move || command.output()))
        .await
        .expect("qualifying took too long")
        .unwrap()
        .unwrap();
    assert!(
        output.status.success(),
        "qualifying {provider}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Triggers that note, in `stale_writes`, every write the protocol rules
/// out whoever makes it: a lease written on an attempt no longer queued or
/// running (a stale renewal that landed), and a finished job's result or
/// winner written over.
const WATCH_STALE_WRITES: &str = r#"
CREATE TABLE stale_writes (what TEXT NOT NULL, row_id TEXT NOT NULL);
CREATE FUNCTION note_stale_lease() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO stale_writes VALUES ('a lease written on an attempt already ' || OLD.state, OLD.id);
  RETURN NEW;
END $$;
CREATE TRIGGER stale_lease AFTER UPDATE OF lease_expires_at ON attempts FOR EACH ROW
  WHEN (OLD.state NOT IN ('queued', 'running') AND NEW.lease_expires_at IS NOT NULL)
  EXECUTE FUNCTION note_stale_lease();
CREATE FUNCTION note_overwritten_result() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO stale_writes VALUES ('a finished job''s result written over', OLD.id);
  RETURN NEW;
END $$;
CREATE TRIGGER overwritten_result AFTER UPDATE ON jobs FOR EACH ROW
  WHEN (OLD.completed_by IS NOT NULL AND (NEW.result IS DISTINCT FROM OLD.result
        OR NEW.completed_by IS DISTINCT FROM OLD.completed_by))
  EXECUTE FUNCTION note_overwritten_result();
"#;

/// Installs the triggers of [`WATCH_STALE_WRITES`].
pub async fn watch_stale_writes(store: &Store) {
    use diesel::connection::SimpleConnection;
    store
        .run(|conn| Ok(conn.batch_execute(WATCH_STALE_WRITES)?))
        .await
        .unwrap();
}

/// What the triggers noted: (what, row id).
pub async fn stale_writes(store: &Store) -> Vec<(String, String)> {
    #[derive(diesel::QueryableByName)]
    struct Noted {
        #[diesel(sql_type = diesel::sql_types::Text)]
        what: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        row_id: String,
    }
    use diesel::RunQueryDsl;
    store
        .run(|conn| {
            let noted: Vec<Noted> =
                diesel::sql_query("SELECT what, row_id FROM stale_writes").load(conn)?;
            Ok(noted.into_iter().map(|n| (n.what, n.row_id)).collect())
        })
        .await
        .unwrap()
}
