//! A PostgreSQL cluster of a test's own: made by the installed Debian
//! binaries' `initdb` (as user `postgres`, which they require) in a
//! directory the test chose, served on a free port of 127.0.0.1, stopped
//! (immediately) when its guard drops. A test can stop, crash and restart
//! it without disturbing the shared server the rest of the suite uses.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The newest installed `…/postgresql/<version>/bin` holding `initdb`.
pub fn postgres_bin_dir() -> Option<PathBuf> {
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let version = path.file_name()?.to_str()?.parse().ok()?;
            let bin = path.join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    dirs.sort();
    dirs.pop().map(|(_, bin)| bin)
}

pub struct ScratchCluster {
    bin: PathBuf,
    data: PathBuf,
    log: PathBuf,
    pub port: u16,
    /// The settings every start passes (`-c name=value` each).
    settings: Vec<String>,
}

impl ScratchCluster {
    /// `initdb` into `data` (its parent must belong to `postgres`), the WAL
    /// in `wal` when given, with 1 MB WAL segments so that a small disk
    /// holds several; not started yet.
    pub fn init(bin: &Path, data: &Path, wal: Option<&Path>, log: &Path) -> Self {
        let mut initdb = vec![
            "-D".to_owned(),
            data.display().to_string(),
            "-U".into(),
            "postgres".into(),
            "--auth=trust".into(),
            "--no-locale".into(),
            "-E".into(),
            "UTF8".into(),
            "--wal-segsize=1".into(),
            "--no-sync".into(),
        ];
        if let Some(wal) = wal {
            initdb.push(format!("--waldir={}", wal.display()));
        }
        let output = as_postgres(&bin.join("initdb"), &initdb);
        assert!(output.status.success(), "initdb: {}", text(&output));
        std::fs::write(log, "").unwrap();
        let chowned = Command::new("chown")
            .arg("postgres:postgres")
            .arg(log)
            .status()
            .unwrap();
        assert!(chowned.success());
        Self {
            bin: bin.to_owned(),
            data: data.to_owned(),
            log: log.to_owned(),
            port: crate::server_process::free_port(),
            settings: Vec::new(),
        }
    }

    /// Adds `name = value` to every start from now on.
    pub fn set(&mut self, name: &str, value: &str) {
        self.settings.push(format!("{name}={value}"));
    }

    /// `postgres://postgres@127.0.0.1:<port>/<database>`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Starts it and waits (at most 30 s) until it accepts connections.
    pub fn start(&self) {
        let mut options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.data.display()
        );
        for setting in &self.settings {
            options.push_str(&format!(" -c {setting}"));
        }
        let output = self.pg_ctl(&[
            "-l",
            &self.log.display().to_string(),
            "-w",
            "-t",
            "30",
            "-o",
            &options,
            "start",
        ]);
        assert!(
            output.status.success(),
            "pg_ctl start: {}\n{}",
            text(&output),
            self.log()
        );
    }

    /// Whether its postmaster is running.
    pub fn running(&self) -> bool {
        self.pg_ctl(&["status"]).status.success()
    }

    /// Waits (at most `within`) until the postmaster is gone; whether it went.
    pub async fn wait_stopped(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while self.running() {
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        true
    }

    /// What the server logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn pg_ctl(&self, args: &[&str]) -> Output {
        let mut all = vec!["-D".to_owned(), self.data.display().to_string()];
        all.extend(args.iter().map(|a| (*a).to_owned()));
        as_postgres(&self.bin.join("pg_ctl"), &all)
    }
}

impl Drop for ScratchCluster {
    fn drop(&mut self) {
        let _ = self.pg_ctl(&["-m", "immediate", "-w", "-t", "10", "stop"]);
    }
}

/// Runs `program` as user `postgres` (initdb and postgres refuse root).
fn as_postgres(program: &Path, args: &[String]) -> Output {
    Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(program)
        .args(args)
        .current_dir("/")
        .output()
        .unwrap_or_else(|error| panic!("run {} as postgres: {error}", program.display()))
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
