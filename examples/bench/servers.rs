//! The product under test: release `onejob` processes started as a user
//! would start them (`onejob migrate`, `onejob users add`, `onejob serve`),
//! each on its own port, stopped when dropped.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cpu_budget::CpuBudget;

/// The CPUs `onejob serve` processes are pinned to (`--server-cpus`, as
/// `taskset -c` takes them); unset, they run where the kernel puts them.
pub static SERVER_CPUS: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The `onejob` binary built beside this benchmark (`target/release/onejob`).
pub fn onejob_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the benchmark's own path");
    // target/release/examples/bench → target/release/onejob
    let binary = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("onejob"))
        .expect("the benchmark runs from target/<profile>/examples");
    assert!(
        binary.exists(),
        "{} is missing: build it with `cargo build --release --bin onejob --example bench`",
        binary.display()
    );
    binary
}

/// A database and a configuration file the processes share.
pub struct Deployment {
    pub database_url: String,
    pub config: PathBuf,
    /// Environment variables the configuration names (a provider's API key).
    pub env: Vec<(String, String)>,
    pub token: String,
}

impl Deployment {
    /// Writes `config_toml`, migrates `database_url` and adds a user.
    pub fn prepare(dir: &Path, name: &str, database_url: &str, config_toml: &str) -> Self {
        let config = dir.join(format!("{name}.toml"));
        std::fs::write(&config, config_toml).expect("writing the configuration");
        let mut deployment = Self {
            database_url: database_url.to_owned(),
            config,
            env: vec![("BENCH_UPSTREAM_KEY".into(), "bench-key".into())],
            token: String::new(),
        };
        deployment.cli(&["migrate"]);
        let added = deployment.cli(&["users", "add", crate::BENCH_USER]);
        deployment.token = added
            .lines()
            .last()
            .expect("`users add` prints the token last")
            .trim()
            .to_owned();
        deployment
    }

    /// The same database and user, with another configuration.
    pub fn reconfigured(&self, dir: &Path, name: &str, config_toml: &str) -> Self {
        let config = dir.join(format!("{name}.toml"));
        std::fs::write(&config, config_toml).expect("writing the configuration");
        Self {
            database_url: self.database_url.clone(),
            config,
            env: self.env.clone(),
            token: self.token.clone(),
        }
    }

    fn command(&self) -> Command {
        self.command_on(None)
    }

    /// The `onejob` command, pinned to `cpus` when given (`taskset` execs
    /// it, so the pid is `onejob`'s own).
    fn command_on(&self, cpus: Option<&str>) -> Command {
        let mut command = match cpus {
            Some(cpus) => {
                let mut taskset = Command::new("taskset");
                taskset.args(["-c", cpus]).arg(onejob_binary());
                taskset
            }
            None => Command::new(onejob_binary()),
        };
        command
            .arg("--config")
            .arg(&self.config)
            .arg("--database-url")
            .arg(&self.database_url)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }

    /// The processes' logs (at the default level, as in production) go to
    /// one file beside the configuration, not to the terminal.
    fn log_file(&self) -> Stdio {
        let log = self.config.with_extension("log");
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map(Stdio::from)
            .unwrap_or_else(|_| Stdio::null())
    }

    /// Runs a CLI command to its end; its standard output.
    pub fn cli(&self, args: &[&str]) -> String {
        let output = self.command().args(args).output().expect("running onejob");
        assert!(
            output.status.success(),
            "onejob {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Starts `count` serving processes; returns once each answers `/healthz`.
    pub async fn serve(&self, count: usize) -> Vec<Server> {
        self.serve_within(count, None)
            .await
            .expect("no budget to set")
    }

    /// Starts `count` serving processes, each held to `cores` of CPU time
    /// if given (see `cpu_budget`); returns once each answers `/healthz`.
    pub async fn serve_within(
        &self,
        count: usize,
        cores: Option<f64>,
    ) -> Result<Vec<Server>, String> {
        let mut servers = Vec::new();
        for index in 0..count {
            let budget = match cores {
                Some(cores) => Some(CpuBudget::new(
                    &format!("onejob-bench-{}-{index}", std::process::id()),
                    cores,
                )?),
                None => None,
            };
            let port = free_port();
            let started = Instant::now();
            let child = self
                .command_on(SERVER_CPUS.get().map(String::as_str))
                .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
                .stdout(Stdio::null())
                .stderr(self.log_file())
                .spawn()
                .expect("starting onejob serve");
            let server = Server {
                child,
                base: format!("http://127.0.0.1:{port}"),
                started,
                ready_after: Duration::ZERO,
                _budget: budget,
            };
            if let Some(budget) = &server._budget {
                budget.admit(server.child.id())?;
            }
            servers.push(server);
        }
        let client = reqwest::Client::new();
        for server in &mut servers {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let ready = client
                    .get(format!("{}/readyz", server.base))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
                if ready {
                    server.ready_after = server.started.elapsed();
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{} never became ready",
                    server.base
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        Ok(servers)
    }
}

/// One `onejob serve` process; killed when dropped (and then its CPU
/// budget removed).
pub struct Server {
    child: Child,
    pub base: String,
    started: Instant,
    /// From the process's start to its first ready `/readyz` (checked
    /// every 5 ms, after every process of the batch was started).
    pub ready_after: Duration,
    _budget: Option<CpuBudget>,
}

impl Server {
    /// The process's resident memory now, in KiB (`VmRSS`).
    pub fn rss_kib(&self) -> Option<u64> {
        self.status_kib("VmRSS:")
    }

    /// The resident memory's two parts, as a line: anonymous memory
    /// (`RssAnon`), and pages mapped from files (`RssFile`), mostly the
    /// program's code. The second moves by a megabyte or two with how the
    /// program's file came into the page cache, just copied or read back
    /// (docs/benchmarks.md, "Connections opened as the load needs them").
    pub fn rss_parts(&self) -> String {
        let mb = |field| {
            self.status_kib(field)
                .map_or(0.0, |kib| kib as f64 / 1024.0)
        };
        format!(
            "anonymous {:.1} MB, from files {:.1} MB",
            mb("RssAnon:"),
            mb("RssFile:")
        )
    }

    fn status_kib(&self, field: &str) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        status
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// The pids of `servers`, for a [`crate::cpu::CpuMeter`].
pub fn pids(servers: &[Server]) -> Vec<u32> {
    servers.iter().map(Server::pid).collect()
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}
