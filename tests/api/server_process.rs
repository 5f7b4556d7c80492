//! onejob server processes for tests that need real processes: several on
//! one database, killed and restarted. Each runs the built binary with a
//! configuration file and its own logs, and is stopped (SIGKILL) when its
//! guard drops, even if the test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::harness::FAKE_API_KEY;

pub struct ServerProcess {
    pub base: String,
    pub pid: u32,
    child: Child,
    stderr_path: PathBuf,
    stdout_path: PathBuf,
}

/// Waits for a server that someone else started on `port`.
pub struct Probe {
    base: String,
}

impl ServerProcess {
    /// A handle that only waits for `127.0.0.1:port` to be ready.
    pub fn probe(port: u16) -> Probe {
        Probe {
            base: format!("http://127.0.0.1:{port}"),
        }
    }
}

impl Probe {
    pub async fn wait_ready_url(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !reqwest::get(format!("{}/readyz", self.base))
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            assert!(Instant::now() < deadline, "{} not ready in 30 s", self.base);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A free port on 127.0.0.1, for a process started later to take.
///
/// Not one `bind(0)` hands out: that port is released before the process
/// binds it, and in between the kernel may give it to anything else that
/// asks for an ephemeral port (an in-process server on port 0, an outgoing
/// connection), which once left a process unable to listen. Ports come
/// instead from the range just below the kernel's ephemeral ones, each
/// once a test run (a counter, started at an offset of this process's id),
/// and each is bound first to check that it is free.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral_start: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768);
    let span = 12_000.min(ephemeral_start - 1_024);
    let low = ephemeral_start - span;
    let offset = std::process::id() % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = u16::try_from(low + (offset + n) % span).expect("below the ephemeral range");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {low}..{ephemeral_start}");
}

impl ServerProcess {
    /// Starts `onejob serve` on a free port with the configuration in
    /// `config` and the database at `database_url`; logs go to files named
    /// after `name` in `dir`. Does not wait for it to be ready.
    pub fn spawn(dir: &Path, name: &str, config: &Path, database_url: &str) -> Self {
        let port = free_port();
        Self::spawn_on(dir, name, config, database_url, port)
    }

    pub fn spawn_on(dir: &Path, name: &str, config: &Path, database_url: &str, port: u16) -> Self {
        Self::spawn_as(dir, name, config, database_url, port, "all")
    }

    /// As [`spawn_on`](Self::spawn_on), with `ONEJOB_ROLE=role`.
    pub fn spawn_as(
        dir: &Path,
        name: &str,
        config: &Path,
        database_url: &str,
        port: u16,
        role: &str,
    ) -> Self {
        Self::start(dir, name, config, database_url, port, role, &[])
    }

    /// As [`spawn_on`](Self::spawn_on), with the variables of `env` set
    /// too (a key the configuration names, say).
    pub fn spawn_on_with_env(
        dir: &Path,
        name: &str,
        config: &Path,
        database_url: &str,
        port: u16,
        env: &[(&str, &str)],
    ) -> Self {
        Self::start(dir, name, config, database_url, port, "all", env)
    }

    fn start(
        dir: &Path,
        name: &str,
        config: &Path,
        database_url: &str,
        port: u16,
        role: &str,
        env: &[(&str, &str)],
    ) -> Self {
        let stderr_path = dir.join(format!("{name}.err"));
        let stdout_path = dir.join(format!("{name}.out"));
        let child = Command::new(env!("CARGO_BIN_EXE_onejob"))
            .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
            .current_dir(dir)
            .env("ONEJOB_ROLE", role)
            .env("ONEJOB_CONFIG", config)
            .env("DATABASE_URL", database_url)
            .env("ONEJOB_TEST_FAKE_KEY", FAKE_API_KEY)
            .env("ONEJOB_TEST_WEBHOOK_KEY", crate::webhooks::WEBHOOK_KEY)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout_path).unwrap())
            .stderr(std::fs::File::create(&stderr_path).unwrap())
            .spawn()
            .expect("start onejob serve");
        Self {
            base: format!("http://127.0.0.1:{port}"),
            pid: child.id(),
            child,
            stderr_path,
            stdout_path,
        }
    }

    /// Waits until `/readyz` answers 200 (panics after 30 s, with the logs).
    pub async fn wait_ready(&mut self) {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "onejob exited with {status} before it was ready:\n{}",
                    self.stderr()
                );
            }
            let ready = client
                .get(format!("{}/readyz", self.base))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not ready in 30 s:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// What the process wrote on stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// What the process wrote on stdout so far.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout_path).unwrap_or_default()
    }

    /// Sends SIGTERM (a graceful stop, as a deploy does).
    pub fn terminate(&self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
    }

    /// Sends SIGKILL (a crash).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
    }

    /// Its exit status, if it has exited (`None`: still running).
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// Waits for the process to exit (panics after `within`); its exit status.
    pub async fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "onejob did not exit in {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
