//! The deployment docs/deployment.md describes, on one machine: three
//! `onejob serve` processes on one PostgreSQL database, behind the real
//! nginx of [`super::nginx`] running `deploy/nginx.conf`. The processes
//! send to one fake provider, `up`, for two tasks: `summarize` (a strict
//! task) and `gpt-stream` (a chat route).

use std::path::{Path, PathBuf};

use diesel::prelude::*;
use onejob::store::schema::{attempts, stream_chunks};
use onejob::store::Store;

use super::fake_provider::{strict_task_toml, FakeProvider, ProviderToml};
use super::harness::{postgres_available, TestBackend, TestDb};
use super::metrics::metric_sum;
use super::nginx::{nginx_available, served_by, Nginx};
use crate::server_process::{free_port, ServerProcess};

/// How long a process's lease on a sent attempt lasts: a killed process's
/// attempt becomes `unknown` within this and half of it again (the
/// reapers' period).
pub const LEASE_MS: u64 = 3_000;

/// The processes' configuration: short database waits (the lease must
/// outlast a pool wait plus a lock wait), a 20 s wait for chat answers.
fn config_file(dir: &Path, up: &FakeProvider) -> PathBuf {
    let toml = format!(
        r#"
[server]
max_wait_seconds = 20

[worker]
concurrency = 2
poll_interval_ms = 50
lease_ms = {LEASE_MS}

[database]
pool_timeout_ms = 500
sqlite_busy_timeout_ms = 500
postgres_lock_timeout_ms = 500
{provider}{summarize}
[[tasks]]
name = "gpt-stream"
kind = "chat"
providers = ["up"]
"#,
        provider = ProviderToml::openai("up", &up.base_url)
            .timeout_ms(60_000)
            .connect_timeout_ms(None)
            .with("idle_timeout_ms = 60000")
            .toml(),
        summarize = strict_task_toml("summarize", &["up"], "Summarize: {{ text }}"),
    );
    let path = dir.join("onejob.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// Three distinct free ports.
fn three_ports() -> [u16; 3] {
    let mut ports = Vec::new();
    while ports.len() < 3 {
        let port = free_port();
        if !ports.contains(&port) {
            ports.push(port);
        }
    }
    [ports[0], ports[1], ports[2]]
}

/// Three processes behind nginx. Fields drop in order: nginx, then the
/// processes, then their database.
pub struct Balanced {
    pub nginx: Nginx,
    pub processes: Vec<ServerProcess>,
    /// The first admin's API token.
    pub token: String,
    pub client: reqwest::Client,
    pub store: Store,
    _dir: tempfile::TempDir,
    _db: TestDb,
}

impl Balanced {
    /// Starts the three processes, sending to `up`, and nginx in front of
    /// them (after `nginx -t` passed). `None` where the test is skipped:
    /// no PostgreSQL or no nginx outside CI.
    pub async fn start(up: &FakeProvider) -> Option<Self> {
        if !postgres_available() {
            return None;
        }
        let binary = nginx_available()?;
        let db = TestDb::create(TestBackend::Postgres);
        let dir = tempfile::tempdir().unwrap();
        let config = config_file(dir.path(), up);
        let ports = three_ports();
        let mut processes: Vec<ServerProcess> = ports
            .iter()
            .enumerate()
            .map(|(i, port)| {
                let name = format!("onejob-{i}");
                ServerProcess::spawn_on(dir.path(), &name, &config, db.url.as_str(), *port)
            })
            .collect();
        for process in &mut processes {
            process.wait_ready().await;
        }
        let mut nginx = Nginx::configure(binary, &ports.map(|port| format!("127.0.0.1:{port}")));
        let (passed, said) = nginx.check();
        assert!(passed, "nginx -t failed:\n{said}");
        nginx.start();
        let store = db.open_store().await;
        let token = {
            let store = store.clone();
            tokio::task::spawn_blocking(move || {
                let mut conn = store.conn().unwrap();
                onejob::store::users::issue_token(&mut conn, "admin", None)
                    .unwrap()
                    .0
            })
            .await
            .unwrap()
        };
        Some(Self {
            nginx,
            processes,
            token,
            client: reqwest::Client::new(),
            store,
            _dir: dir,
            _db: db,
        })
    }

    /// The index of the process at `address` (`127.0.0.1:PORT`).
    pub fn process_at(&self, address: &str) -> usize {
        let base = format!("http://{address}");
        self.processes
            .iter()
            .position(|p| p.base == base)
            .unwrap_or_else(|| panic!("{address} is none of the three processes"))
    }

    /// The index of the process that answered `response` through nginx.
    pub fn served(&self, response: &reqwest::Response) -> usize {
        self.process_at(&served_by(response))
    }

    /// A request through nginx to `path`, with the admin's token.
    pub fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.client
            .post(self.nginx.url(path))
            .bearer_auth(&self.token)
    }

    /// Which process nginx sends `key`'s requests to now: a `GET
    /// /api/v1/jobs` (the list, which creates nothing) under the key.
    pub async fn route_of(&self, key: &str) -> usize {
        let response = self
            .client
            .get(self.nginx.url("/api/v1/jobs"))
            .bearer_auth(&self.token)
            .header("Idempotency-Key", key)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{response:?}");
        self.served(&response)
    }

    /// Process `index`'s own metrics (each process counts its own).
    pub async fn metrics_of(&self, index: usize) -> String {
        let response = self
            .client
            .get(format!("{}/metrics", self.processes[index].base))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "GET /metrics");
        response.text().await.unwrap()
    }

    /// How many requests process `index` answered on `method` `route`.
    pub async fn answered_by(&self, index: usize, method: &str, route: &str) -> u64 {
        let exposition = self.metrics_of(index).await;
        metric_sum(
            &exposition,
            "onejob_http_request_seconds_count",
            &[("method", method), ("route", route)],
        ) as u64
    }

    /// The process id in the lease of every attempt of `job_id`, in order
    /// (`pid<N>-<uuid>`: the process that claimed it, and so sent it).
    pub async fn senders_of(&self, job_id: &str) -> Vec<u32> {
        let store = self.store.clone();
        let job_id = job_id.to_owned();
        let owners: Vec<Option<String>> = tokio::task::spawn_blocking(move || {
            attempts::table
                .filter(attempts::job_id.eq(job_id))
                .order(attempts::number)
                .select(attempts::lease_owner)
                .load(&mut store.conn().unwrap())
                .unwrap()
        })
        .await
        .unwrap();
        owners
            .iter()
            .map(|owner| {
                let owner = owner.as_deref().expect("a claimed attempt");
                owner
                    .strip_prefix("pid")
                    .and_then(|rest| rest.split('-').next())
                    .and_then(|pid| pid.parse().ok())
                    .unwrap_or_else(|| panic!("lease owner {owner:?} names no process"))
            })
            .collect()
    }

    /// How many chunks of `job_id`'s stream the database holds.
    pub async fn stored_chunks(&self, job_id: &str) -> i64 {
        let store = self.store.clone();
        let job_id = job_id.to_owned();
        tokio::task::spawn_blocking(move || {
            stream_chunks::table
                .filter(stream_chunks::job_id.eq(job_id))
                .count()
                .get_result::<i64>(&mut store.conn().unwrap())
                .unwrap()
        })
        .await
        .unwrap()
    }
}
