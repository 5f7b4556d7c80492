//! Handing the first admin's password to the person starting onejob,
//! without putting it in the log stream (journald and container logs keep
//! stderr, and often ship it elsewhere).
//!
//! - stdout is a terminal: the password is printed there, once.
//! - otherwise: it is written to a file only its owner may read (mode
//!   0600), and the log says where: next to the SQLite database, or in the
//!   working directory for PostgreSQL.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use crate::app::App;
use crate::store::DatabaseUrl;

/// The file the first admin's password goes to when stdout is no terminal.
pub const PASSWORD_FILE: &str = "onejob-first-password.txt";

/// Creates the first admin on a database without users and hands its
/// password over; does nothing on a database that has users.
pub async fn create_and_hand_over(
    app: &App,
    url: &DatabaseUrl,
    sign_in_at: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let Some(password) = app.ensure_first_admin().await? else {
        return Ok(());
    };
    let advice = "this password is not shown again (`onejob users password admin` sets a new one)";
    if std::io::stdout().is_terminal() {
        println!(
            "\n  onejob created the first user.\n    name:     admin\n    password: {password}\n  \
             Sign in at {sign_in_at}: {advice}.\n"
        );
        tracing::info!(
            "onejob created the first user, admin; its password was shown on the terminal"
        );
        return Ok(());
    }
    let folder = url.sqlite_folder().unwrap_or_default();
    let path = absolute(&folder.join(PASSWORD_FILE));
    write_private(&path, &password).map_err(|error| {
        format!(
            "onejob created the first user, admin, but could not write its password to {}: {error}; \
             run `onejob users password admin` to set one",
            path.display()
        )
    })?;
    tracing::info!(
        file = %path.display(),
        "onejob created the first user, admin; its password is in this file (mode 0600): \
         sign in at {sign_in_at}, then delete the file; {advice}"
    );
    Ok(())
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Writes `password` to a new file that only its owner may read.
fn write_private(path: &Path, password: &str) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    // A file left from an earlier database would keep its own mode.
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    writeln!(file, "{password}")?;
    file.sync_all()
}
