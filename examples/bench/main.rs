//! onejob against its ceilings, side by side in one run, printing ratios
//! (absolute rates on a shared machine vary from run to run; ratios measured
//! in the same run much less). Every step starts real `onejob serve`
//! processes on fresh databases and drives them over HTTP on 127.0.0.1.
//!
//!     cargo build --release --bin onejob --example bench
//!     target/release/examples/bench                       # all steps, 8 s each
//!     target/release/examples/bench --prefill 1000000     # plus the stored-volume step
//!     target/release/examples/bench --only lifecycle,processes --seconds 5
//!
//! Steps: `create` (PostgreSQL creation vs pgbench's bare creation),
//! `lifecycle` (create → claim → send → compare-and-swap vs pgbench's bare
//! lifecycle), `sqlite` (SQLite creation at 32 clients vs a raw loop, and its
//! p99), `storm` (256 requests under one key vs 256 under their own), `processes`
//! (three processes vs one on one PostgreSQL), `prefill` (creation and lifecycle
//! with `--prefill` finished jobs stored vs an empty database), `overhead`
//! (`/v1/chat/completions` through onejob vs calling the upstream directly),
//! `ttft` (time to the first token of a streamed chat completion, through
//! onejob vs direct), `ratelimit` (a provider that refuses past its concurrency, with onejob's
//! `max_in_flight` off and on). `--otlp live` or `--otlp dead` runs the
//! `overhead` step with traces exported to a collector that answers at once,
//! or to one that never answers.
//! See docs/benchmarks.md.

mod ceiling;
mod cpu;
mod cpu_budget;
mod load;
mod servers;
mod upstream;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use cpu::CpuMeter;
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::BigInt;
use load::{ms, Run};
use onejob::store::schema::users;
use serde_json::json;
use servers::{Deployment, Server};

#[derive(Parser)]
struct Args {
    /// Seconds each measured run lasts.
    #[arg(long, default_value_t = 8)]
    seconds: u64,
    /// Concurrent clients for throughput runs.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// The PostgreSQL server; each step gets a fresh database on it.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432")]
    postgres: String,
    /// The CPU each process may use in the `processes` step's budgeted
    /// comparison (a cgroup quota, in cores), standing in for a machine of
    /// its own.
    #[arg(long, default_value_t = 0.25)]
    process_cores: f64,
    /// Finished jobs to store before the `prefill` step (0: skip the step).
    #[arg(long, default_value_t = 0)]
    prefill: u64,
    /// Only these steps (comma-separated); default: all.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Keep the configurations, SQLite files and process logs in this
    /// directory, and the PostgreSQL databases (default: a temp dir, removed
    /// at the end, and the databases dropped).
    #[arg(long)]
    keep: Option<std::path::PathBuf>,
    /// Pin the `onejob serve` processes to these CPUs (`taskset -c`'s
    /// list, say `0-7`), apart from the load generator's.
    #[arg(long)]
    server_cpus: Option<String>,
    /// Pin this process (the load generator and the fake upstreams) to
    /// these CPUs.
    #[arg(long)]
    load_cpus: Option<String>,
    /// `[server] http_workers` for the footprint's second idle reading:
    /// as many HTTP workers as a machine of that many cores gets.
    #[arg(long, default_value_t = 16)]
    many_workers: usize,
    /// Trace export in the `overhead` step: `off`, `live` (to a collector
    /// that answers at once) or `dead` (to one that never answers).
    #[arg(long, default_value = "off", value_parser = ["off", "live", "dead"])]
    otlp: String,
    /// The backends the `overhead` and `ttft` steps measure (`sqlite`
    /// alone where no PostgreSQL server can be had).
    #[arg(long, value_delimiter = ',', default_value = "sqlite,postgres",
          value_parser = ["sqlite", "postgres"])]
    backends: Vec<String>,
}

/// What a ratio must come to, if anything.
#[derive(Clone, Copy)]
enum Goal {
    None,
    AtLeast(f64),
    AtMost(f64),
    /// A condition of its own, described.
    Other(&'static str, bool),
}

/// One line of the closing table.
struct Ratio {
    name: String,
    product: String,
    ceiling: String,
    ratio: f64,
    goal: Goal,
}

impl Ratio {
    fn target(&self) -> String {
        match self.goal {
            Goal::None => "—".into(),
            Goal::AtLeast(min) => format!("≥ {min:.1}"),
            Goal::AtMost(max) => format!("≤ {max:.1}"),
            Goal::Other(text, _) => text.into(),
        }
    }

    fn met(&self) -> Option<bool> {
        match self.goal {
            Goal::None => None,
            Goal::AtLeast(min) => Some(self.ratio >= min),
            Goal::AtMost(max) => Some(self.ratio <= max),
            Goal::Other(_, met) => Some(met),
        }
    }
}

struct Bench {
    args: Args,
    pg: ceiling::Postgres,
    _temp: Option<tempfile::TempDir>,
    dir: std::path::PathBuf,
    client: reqwest::Client,
    ratios: Vec<Ratio>,
    /// Rates on an empty database, for the `prefill` comparison.
    empty_create: Option<f64>,
    empty_lifecycle: Option<f64>,
    /// CPU per job measured so far, in µs, by what was measured
    /// (`"create server"`, `"pgbench create database per transaction"`…).
    cpu: std::cell::RefCell<std::collections::HashMap<String, Option<f64>>>,
}

const SIMULATED: &str = r#"
[[providers]]
name = "sim"
kind = "simulated"
latency_ms = 0
timeout_ms = 5000
late_result_ms = 10000

[[tasks]]
name = "summarize"
providers = ["sim"]
input_fields = ["text"]
template = "Summarize: {{ text }}"
"#;

/// The lifecycle's process: 16 connections (half pgbench's clients), and
/// enough attempts in flight (64) that the worker is not the bottleneck
/// when the provider answers at once: each attempt's slot is held through
/// the call and the compare-and-swap, so 32 slots capped a process at about
/// 32 ÷ that latency, below what the database can do.
fn lifecycle_config() -> String {
    config(64, 16, SIMULATED)
}

/// A process sized for a share of this machine (each of three, or one held
/// to a CPU budget): the lifecycle process's worker, one HTTP thread instead
/// of one per core (two here), and 6 of its 16 connections.
fn small_process_config() -> String {
    config(64, 6, SIMULATED).replace("[server]\n", "[server]\nhttp_workers = 1\n")
}

fn config(worker_concurrency: usize, pool_size: u32, providers_and_tasks: &str) -> String {
    format!(
        "[server]\nmax_wait_seconds = 30\n\n[database]\npool_size = {pool_size}\n\n\
         [worker]\nconcurrency = {worker_concurrency}\n{providers_and_tasks}"
    )
}

/// A browser signed in to the server at `base` as `name`, a user of `role`
/// added with the CLI and given a password there: one password check on
/// the server.
async fn signed_in_browser(
    deployment: &Deployment,
    base: &str,
    name: &str,
    role: &str,
) -> reqwest::Client {
    deployment.cli(&["users", "add", name, "--role", role]);
    let password = deployment.cli(&["users", "password", name]);
    let password = password
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_owned();
    let browser = reqwest::Client::builder()
        .cookie_store(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client");
    let form = browser
        .get(format!("{base}/login"))
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .expect("the sign-in page");
    let html = form.text().await.unwrap_or_default();
    let csrf = html
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the sign-in form's token")
        .to_owned();
    let signed_in = browser
        .post(format!("{base}/login"))
        .form(&[
            ("name", name),
            ("password", password.as_str()),
            ("csrf", csrf.as_str()),
        ])
        .send()
        .await
        .expect("signing in");
    assert!(
        signed_in.status().is_redirection(),
        "signing in answered {}",
        signed_in.status()
    );
    browser
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if let Some(cpus) = &args.server_cpus {
        servers::SERVER_CPUS.set(cpus.clone()).unwrap();
    }
    if let Some(cpus) = &args.load_cpus {
        cpu::pin_self(cpus);
    }
    let (temp, dir) = match &args.keep {
        Some(dir) => {
            std::fs::create_dir_all(dir).expect("creating --keep");
            (None, dir.clone())
        }
        None => {
            let temp = tempfile::tempdir().expect("a temp dir");
            let dir = temp.path().to_owned();
            (Some(temp), dir)
        }
    };
    let mut bench = Bench {
        pg: ceiling::Postgres::parse(&args.postgres),
        _temp: temp,
        dir,
        client: reqwest::Client::builder()
            .pool_max_idle_per_host(512)
            .build()
            .unwrap(),
        ratios: Vec::new(),
        empty_create: None,
        empty_lifecycle: None,
        cpu: Default::default(),
        args,
    };
    println!(
        "onejob benchmark: {} s per run, {} clients, {} CPUs (servers on {}, load on {})",
        bench.args.seconds,
        bench.args.concurrency,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        bench.args.server_cpus.as_deref().unwrap_or("any"),
        bench.args.load_cpus.as_deref().unwrap_or("any"),
    );
    let started = Instant::now();
    let mut lifecycle_one = None;
    if bench.wants("create") {
        bench.create().await;
    }
    if bench.wants("lifecycle") || bench.wants("processes") {
        lifecycle_one = Some(bench.lifecycle().await);
    }
    if bench.wants("processes") {
        bench.processes(lifecycle_one.unwrap()).await;
    }
    if bench.wants("sqlite") {
        bench.sqlite().await;
    }
    if bench.wants("storm") {
        bench.storm().await;
    }
    if bench.wants("overhead") {
        bench.overhead().await;
    }
    if bench.wants("ttft") {
        bench.ttft().await;
    }
    if bench.wants("ratelimit") {
        bench.ratelimit().await;
    }
    // Last: storing a million rows leaves the disk busy for a while.
    if bench.args.prefill > 0 && bench.wants("prefill") {
        bench.prefill().await;
    }
    bench.report(started.elapsed());
}

impl Bench {
    fn wants(&self, step: &str) -> bool {
        let wanted = self.args.only.is_empty() || self.args.only.iter().any(|s| s == step);
        if wanted {
            self.settle();
        }
        wanted
    }

    /// Drops a step's database, unless `--keep` asks to keep everything.
    fn drop_database(&self, name: &str) {
        if self.args.keep.is_none() {
            self.pg.drop_database(name);
        }
    }

    /// Lets the machine settle between steps: PostgreSQL writes out what
    /// the last step dirtied (a checkpoint), so that its disk traffic does
    /// not land in the next step's figures.
    fn settle(&self) {
        if let Ok(mut conn) = PgConnection::establish(&self.pg.database_url("postgres")) {
            let _ = conn.batch_execute("CHECKPOINT");
        }
        std::thread::sleep(Duration::from_secs(1));
    }

    fn seconds(&self) -> Duration {
        Duration::from_secs(self.args.seconds)
    }

    fn dir(&self) -> &Path {
        &self.dir
    }

    fn push(&mut self, ratio: Ratio) {
        println!(
            "  → {}: {:.2} ({} vs {}; target {})",
            ratio.name,
            ratio.ratio,
            ratio.product,
            ratio.ceiling,
            ratio.target()
        );
        self.ratios.push(ratio);
    }

    /// The server's CPU per job of the run tagged `tag`, against
    /// PostgreSQL's CPU per transaction of pgbench's `script`: what the
    /// database itself spends on the bare statements. Beside it,
    /// PostgreSQL's CPU per job under onejob.
    fn push_cpu(&mut self, name: &str, tag: &str, script: &str) {
        let measured = |key: String| self.cpu.borrow().get(&key).copied().flatten();
        let server = measured(format!("{tag} server"));
        let database = measured(format!("{tag} database"));
        let bare = measured(format!("pgbench {script} database per transaction"));
        let us = |v: Option<f64>| v.map_or("?".to_owned(), |v| format!("{v:.1} µs"));
        self.push(Ratio {
            name: name.into(),
            product: format!(
                "{} (PostgreSQL's under onejob {})",
                us(server),
                us(database)
            ),
            ceiling: format!(
                "PostgreSQL's per pgbench {script}.sql transaction {}",
                us(bare)
            ),
            ratio: server.zip(bare).map_or(f64::NAN, |(s, b)| s / b.max(0.001)),
            goal: Goal::None,
        });
    }

    /// Creations over HTTP: unique keys, 201 expected.
    async fn create_load(
        &self,
        servers: &[Server],
        token: &str,
        tag: &str,
        duration: Duration,
    ) -> Run {
        let (client, token, tag) = (
            self.client.clone(),
            Arc::new(token.to_owned()),
            tag.to_owned(),
        );
        let bases: Arc<Vec<String>> = Arc::new(servers.iter().map(|s| s.base.clone()).collect());
        load::run(self.args.concurrency, duration, move |n| {
            let (client, token, bases) = (client.clone(), token.clone(), bases.clone());
            let key = format!("{tag}-{n}");
            async move {
                // As a careful client does: a request that failed in transit
                // (a kept-alive connection the server had just closed, say)
                // is sent again under its key. A replay (200) acknowledges
                // the job the first try created.
                let mut tries = 0;
                let response = loop {
                    tries += 1;
                    let sent = client
                        .post(format!("{}/api/v1/jobs", bases[n as usize % bases.len()]))
                        .bearer_auth(token.as_str())
                        .header("Idempotency-Key", &key)
                        .json(&json!({"task": "summarize", "input": {"text": key}}))
                        .send()
                        .await;
                    match sent {
                        Ok(response) => break response,
                        Err(error) if tries < 3 => {
                            eprintln!("  (sending again under key {key}: {error})");
                        }
                        Err(error) => return Err(error.to_string()),
                    }
                };
                match response.status().as_u16() {
                    201 | 200 => Ok(()),
                    status => Err(format!(
                        "{status}: {}",
                        response.text().await.unwrap_or_default()
                    )),
                }
            }
        })
        .await
    }

    /// Creation on PostgreSQL (HTTP only, no worker) vs pgbench's bare creation.
    async fn create(&mut self) {
        println!("\n[create] PostgreSQL creation over HTTP vs pgbench's bare creation transaction");
        let url = self.pg.fresh_database("onejob_bench_create");
        let deployment = Deployment::prepare(self.dir(), "create", &url, &config(0, 8, SIMULATED));
        let rate = self.measure_create(&deployment, "create").await;
        self.empty_create = Some(rate);
        drop(deployment);
        let (tps, database, _) = self.pgbench_of("create", ceiling::CREATE, self.args.concurrency);
        self.drop_database(&database);
        println!("  pgbench create.sql: {tps:.0} tx/s");
        // The multi-row statement group commit sends, by one connection.
        assert!(
            ceiling::CREATE_BATCHED.contains(&format!("\\set rows {}", ceiling::CREATE_BATCH_ROWS)),
            "create_batched.sql makes CREATE_BATCH_ROWS jobs a statement"
        );
        let (batches, database, _) = self.pgbench_of("create_batched", ceiling::CREATE_BATCHED, 1);
        self.drop_database(&database);
        let batched = batches * ceiling::CREATE_BATCH_ROWS as f64;
        println!(
            "  pgbench create_batched.sql, one client: {batches:.0} tx/s of {} jobs = {batched:.0} jobs/s",
            ceiling::CREATE_BATCH_ROWS
        );
        self.push(Ratio {
            name: "creation (PostgreSQL) vs the multi-row statement".into(),
            product: format!("{rate:.0} jobs/s"),
            ceiling: format!(
                "{} per statement {batched:.0}/s",
                ceiling::CREATE_BATCH_ROWS
            ),
            ratio: rate / batched,
            goal: Goal::None,
        });
        self.push_cpu("server CPU per PostgreSQL creation", "create", "create");
        self.push(Ratio {
            name: "creation (PostgreSQL)".into(),
            product: format!("{rate:.0} jobs/s"),
            ceiling: format!("pgbench {tps:.0} tx/s"),
            ratio: rate / tps,
            goal: Goal::AtLeast(1.5),
        });
        self.drop_database("onejob_bench_create");
    }

    async fn measure_create(&self, deployment: &Deployment, tag: &str) -> f64 {
        let servers = deployment.serve(1).await;
        self.create_load(
            &servers,
            &deployment.token,
            &format!("{tag}-warm"),
            Duration::from_secs(1),
        )
        .await;
        ceiling::analyze(&deployment.database_url);
        let syncs_before = ceiling::wal_syncs(&deployment.database_url);
        let meter = CpuMeter::start(servers::pids(&servers));
        let run = self
            .create_load(&servers, &deployment.token, tag, self.seconds())
            .await;
        let spent = meter.stop();
        println!("  onejob creation: {}", run.summary());
        println!("  {}", spent.line(run.latencies.len()));
        self.cpu.borrow_mut().insert(
            format!("{tag} server"),
            spent.server_per_job(run.latencies.len()),
        );
        self.cpu.borrow_mut().insert(
            format!("{tag} database"),
            spent.database_per_job(run.latencies.len()),
        );
        if let (Some(before), Some(after)) =
            (syncs_before, ceiling::wal_syncs(&deployment.database_url))
        {
            println!(
                "  WAL syncs: {} for {} jobs = {:.2} per job (pg_stat_wal.wal_sync)",
                after - before,
                run.latencies.len(),
                (after - before) as f64 / run.latencies.len().max(1) as f64
            );
        }
        run.rate()
    }

    /// pgbench running `script` on a fresh database of its own, migrated and
    /// with its user made by onejob itself: the same schema, starting from
    /// the same (empty) state as the product's run.
    /// Returns its rate, its database and when its measured run began.
    fn pgbench_of(&self, name: &str, script: &str, clients: usize) -> (f64, String, i64) {
        let database = format!("onejob_bench_{name}_pgbench");
        let url = self.pg.fresh_database(&database);
        let deployment = Deployment::prepare(self.dir(), &database, &url, &config(0, 8, SIMULATED));
        let (owner, role) = owner_id_and_role(&url);
        let digest = onejob::store::users::token_digest(&deployment.token);
        let defines = [
            ("owner", owner.as_str()),
            ("digest", digest.as_str()),
            ("role", role.as_str()),
        ];
        let run =
            |seconds| ceiling::pgbench(&url, self.dir(), name, script, clients, seconds, &defines);
        // The same warm-up and statistics as the product's run.
        run(1);
        ceiling::analyze(&url);
        let since = chrono::Utc::now().timestamp_millis();
        let syncs_before = ceiling::wal_syncs(&url);
        let meter = CpuMeter::start(Vec::new());
        let tps = run(self.args.seconds);
        let spent = meter.stop();
        let transactions = (tps * self.args.seconds as f64) as usize;
        println!(
            "  pgbench {name}: PostgreSQL's CPU {:?} µs per transaction",
            spent.database_per_job(transactions).map(|us| us.round())
        );
        self.cpu.borrow_mut().insert(
            format!("pgbench {name} database per transaction"),
            spent.database_per_job(transactions),
        );
        if let (Some(before), Some(after)) = (syncs_before, ceiling::wal_syncs(&url)) {
            let transactions = tps * self.args.seconds as f64;
            println!(
                "  pgbench {name}: WAL syncs {} for about {transactions:.0} transactions = {:.2} per transaction",
                after - before,
                (after - before) as f64 / transactions.max(1.0)
            );
        }
        (tps, database, since)
    }

    /// Jobs per second from creation to success: clients create for the
    /// run's time, then the clock runs on until every job created has
    /// succeeded. One process or several, round-robin.
    async fn measure_lifecycle(
        &self,
        url: &str,
        deployment: &Deployment,
        processes: usize,
        cores: Option<f64>,
        tag: &str,
    ) -> Result<f64, String> {
        // Jobs an earlier step left queued (the stored-volume creation runs
        // with the worker off) are drained with the warm-up's: the claiming
        // path's rate, printed.
        let queued_before = unfinished_jobs(url);
        let servers = deployment.serve_within(processes, cores).await?;
        let warm_up = Instant::now();
        // Warm-up, drained before the clock starts.
        self.create_load(
            &servers,
            &deployment.token,
            &format!("{tag}-warm"),
            Duration::from_secs(1),
        )
        .await;
        wait_until_finished(url, 0, Duration::from_secs(120));
        if queued_before > 0 {
            println!(
                "  {queued_before} jobs queued earlier drained, with the warm-up's, {:.1} s after the process started",
                warm_up.elapsed().as_secs_f64()
            );
        }
        ceiling::analyze(url);
        // An admin, to read each server's count of its claims.
        let admin = deployment.cli(&[
            "users",
            "add",
            &format!("bench-admin-{tag}"),
            "--role",
            "admin",
        ]);
        let admin = admin.lines().last().unwrap_or_default().trim().to_owned();
        let claims_before = self.claims(&servers, &admin).await;
        let since = chrono::Utc::now().timestamp_millis();
        let started = Instant::now();
        let meter = CpuMeter::start(servers::pids(&servers));
        let run = self
            .create_load(&servers, &deployment.token, tag, self.seconds())
            .await;
        let created_in = started.elapsed();
        let succeeded = wait_until_finished(url, since, Duration::from_secs(120));
        let elapsed = started.elapsed();
        let spent = meter.stop();
        println!("  {}", spent.line(succeeded as usize));
        self.cpu.borrow_mut().insert(
            format!("{tag} server"),
            spent.server_per_job(succeeded as usize),
        );
        self.cpu.borrow_mut().insert(
            format!("{tag} database"),
            spent.database_per_job(succeeded as usize),
        );
        let (claims, claimed) = self.claims(&servers, &admin).await;
        let (claims, claimed) = (claims - claims_before.0, claimed - claims_before.1);
        println!(
            "  queued attempts claimed: {claimed:.0} of {succeeded} in {claims:.0} claims, \
             {:.1} a claim (onejob_claims_total, onejob_claimed_attempts_total)",
            claimed / claims.max(1.0)
        );
        let rate = succeeded as f64 / elapsed.as_secs_f64();
        println!(
            "  onejob lifecycle, {processes} process(es): {} created in {:.1} s ({}), all {succeeded} succeeded after {:.1} s = {rate:.0} jobs/s",
            run.latencies.len(),
            created_in.as_secs_f64(),
            run.summary(),
            elapsed.as_secs_f64()
        );
        assert_eq!(
            succeeded as usize,
            run.latencies.len(),
            "every acknowledged job succeeded, once"
        );
        Ok(rate)
    }

    async fn lifecycle(&mut self) -> f64 {
        println!("\n[lifecycle] PostgreSQL create → claim → send (instant provider) → compare-and-swap vs pgbench's bare lifecycle");
        let url = self.pg.fresh_database("onejob_bench_lifecycle");
        let deployment = Deployment::prepare(self.dir(), "lifecycle", &url, &lifecycle_config());
        let rate = self
            .measure_lifecycle(&url, &deployment, 1, None, "life")
            .await
            .expect("no budget to set");
        self.empty_lifecycle = Some(rate);
        self.drop_database("onejob_bench_lifecycle");
        let (rounds, database, since) = self.pgbench_of(
            "lifecycle",
            &ceiling::lifecycle_script(),
            self.args.concurrency,
        );
        let url = self.pg.database_url(&database);
        // Jobs pgbench's measured run created and finished, per second of
        // the run (counted in the database, not taken from pgbench's tps).
        let finished: i64 = diesel::dsl::sql::<BigInt>(&format!(
            "SELECT count(*) FROM jobs WHERE input = '{{\"text\":\"pgbench\"}}' \
             AND status = 'succeeded' AND created_at >= {since}"
        ))
        .get_result(&mut ceiling::pg(&url))
        .unwrap();
        let tps = finished as f64 / self.args.seconds as f64;
        self.drop_database(&database);
        println!("  pgbench lifecycle.sql: {rounds:.0} rounds/s, {finished} jobs finished = {tps:.0} jobs/s");
        self.push_cpu("server CPU per lifecycle job", "life", "lifecycle");
        self.push(Ratio {
            name: "lifecycle (PostgreSQL)".into(),
            product: format!("{rate:.0} jobs/s"),
            ceiling: format!("pgbench {tps:.0} jobs/s"),
            ratio: rate / tps,
            goal: Goal::AtLeast(0.9),
        });
        rate
    }

    /// Three processes against one on one PostgreSQL, taking turns on fresh
    /// databases so that neither side gets the machine's better moments:
    /// first with each process held to `--process-cores` (`cpu_budget`), as
    /// processes on machines of their own would be, which is what adding
    /// processes is for; then sharing this machine's cores unlimited, where
    /// more processes only divide the same CPU (the first one-process run is
    /// the lifecycle step's).
    async fn processes(&mut self, first_one: f64) {
        let cores = self.args.process_cores;
        println!("\n[processes] the lifecycle on three processes sharing one PostgreSQL vs one, taking turns");
        println!(
            "  each process held to {cores} core(s) of CPU; the database and the load unlimited"
        );
        let mut budgeted = (Vec::new(), Vec::new());
        let mut refused = None;
        'turns: for turn in 0..2 {
            for processes in [1, 3] {
                let tag = format!("budget{processes}_{turn}");
                match self.lifecycle_on_fresh(processes, Some(cores), &tag).await {
                    Ok(rate) if processes == 1 => budgeted.0.push(rate),
                    Ok(rate) => budgeted.1.push(rate),
                    // No budget can be set: the other turns would fail alike.
                    Err(error) => {
                        refused = Some(error);
                        break 'turns;
                    }
                }
            }
        }
        match refused {
            None => self.push_processes(
                format!("three processes vs one, {cores} core each"),
                &budgeted.0,
                &budgeted.1,
                Goal::AtLeast(1.0),
            ),
            Some(error) => {
                println!("  not measured: {error}");
                self.push(Ratio {
                    name: format!("three processes vs one, {cores} core each"),
                    product: "not measured".into(),
                    ceiling: "a writable cgroup CPU controller".into(),
                    ratio: f64::NAN,
                    goal: Goal::Other("≥ 1.0", false),
                });
            }
        }
        println!("  sharing the machine's cores, unlimited");
        let mut ones = vec![first_one];
        let mut threes = Vec::new();
        for turn in 0..2 {
            let tag = format!("three{turn}");
            threes.push(self.lifecycle_on_fresh(3, None, &tag).await.unwrap());
            if turn == 0 {
                ones.push(self.lifecycle_on_fresh(1, None, "one1").await.unwrap());
            }
        }
        self.push_processes(
            "three processes vs one, sharing the cores".into(),
            &ones,
            &threes,
            Goal::None,
        );
    }

    fn push_processes(&mut self, name: String, ones: &[f64], threes: &[f64], goal: Goal) {
        let (one, three) = (mean(ones), mean(threes));
        println!("  one process: {ones:.0?} jobs/s; three processes: {threes:.0?} jobs/s");
        self.push(Ratio {
            name,
            product: format!("{three:.0} jobs/s (mean of {})", threes.len()),
            ceiling: format!("one process {one:.0} jobs/s (mean of {})", ones.len()),
            ratio: three / one,
            goal,
        });
    }

    /// The lifecycle on `processes` processes, each held to `cores` if
    /// given, on a database of its own. A budgeted process is sized for its
    /// budget (`small_process_config`), alone or one of three; unlimited,
    /// one process gets the whole machine's (`lifecycle_config`).
    async fn lifecycle_on_fresh(
        &self,
        processes: usize,
        cores: Option<f64>,
        tag: &str,
    ) -> Result<f64, String> {
        let name = format!("onejob_bench_processes_{tag}");
        let url = self.pg.fresh_database(&name);
        let config = match (processes, cores) {
            (1, None) => lifecycle_config(),
            _ => small_process_config(),
        };
        let deployment = Deployment::prepare(self.dir(), &name, &url, &config);
        self.settle();
        let rate = self
            .measure_lifecycle(&url, &deployment, processes, cores, tag)
            .await;
        self.drop_database(&name);
        rate
    }

    /// SQLite creation at the configured concurrency (HTTP only, no
    /// worker, as the PostgreSQL step and as the raw loop, which only
    /// creates) vs a raw single-connection loop; and its p99.
    async fn sqlite(&mut self) {
        println!("\n[sqlite] SQLite (synchronous=FULL) creation over HTTP vs a raw single-connection loop");
        let path = self.dir().join("sqlite.db");
        let deployment = Deployment::prepare(
            self.dir(),
            "sqlite",
            &path.display().to_string(),
            &config(0, 8, SIMULATED),
        );
        // An admin, to read the server's own count of its commits.
        let admin = deployment.cli(&["users", "add", "bench-admin", "--role", "admin"]);
        let admin = admin.lines().last().unwrap_or_default().trim().to_owned();
        let servers = deployment.serve(1).await;
        // The process's footprint: its start, and its memory idle.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let idle_kib = servers[0].rss_kib().unwrap_or(0);
        let idle_parts = servers[0].rss_parts();
        let ready_ms = servers[0].ready_after.as_secs_f64() * 1000.0;
        self.create_load(
            &servers,
            &deployment.token,
            "sqlite-warm",
            Duration::from_secs(1),
        )
        .await;
        let meter = CpuMeter::start(servers::pids(&servers));
        let commits_before = self.group_commits(&servers[0].base, &admin).await;
        let run = self
            .create_load(&servers, &deployment.token, "sqlite", self.seconds())
            .await;
        // Where the cores went: the server's CPU and the load generator's
        // (this process), per job.
        let spent = meter.stop();
        println!("  onejob creation: {}", run.summary());
        // Each SQLite commit is one flush of the WAL (synchronous=FULL).
        if let (Some(before), Some(after)) = (
            commits_before,
            self.group_commits(&servers[0].base, &admin).await,
        ) {
            let (commits, rows) = (after.0 - before.0, after.1 - before.1);
            println!(
                "  commits (one WAL flush each): {commits:.0} for {} jobs = {:.3} per job, \
                 {:.1} creations a commit (onejob_group_commits, onejob_group_commit_rows)",
                run.latencies.len(),
                commits / run.latencies.len().max(1) as f64,
                rows / commits.max(1.0)
            );
        }
        println!("  {}", spent.line(run.latencies.len()));
        let server_cpu = spent.server_per_job(run.latencies.len());
        let loaded_kib = servers[0].rss_kib().unwrap_or(0);
        println!(
            "  footprint: start to /readyz {ready_ms:.0} ms; RSS idle {:.1} MB ({idle_parts}), \
             after the load {:.1} MB",
            idle_kib as f64 / 1024.0,
            loaded_kib as f64 / 1024.0
        );
        self.push(Ratio {
            name: "idle RSS (SQLite, one process)".into(),
            product: format!("{:.1} MB", idle_kib as f64 / 1024.0),
            ceiling: "30 MB".into(),
            ratio: idle_kib as f64 / 1024.0 / 30.0,
            goal: Goal::AtMost(1.0),
        });
        let wide_kib = self.idle_rss_with_workers(&deployment).await;
        self.push(Ratio {
            name: format!(
                "idle RSS (SQLite, {} HTTP workers, after a sign-in)",
                self.args.many_workers
            ),
            product: format!("{:.1} MB", wide_kib as f64 / 1024.0),
            ceiling: "30 MB".into(),
            ratio: wide_kib as f64 / 1024.0 / 30.0,
            goal: Goal::AtMost(1.0),
        });
        self.push(Ratio {
            name: "RSS after the SQLite load".into(),
            product: format!("{:.1} MB", loaded_kib as f64 / 1024.0),
            ceiling: format!("idle {:.1} MB", idle_kib as f64 / 1024.0),
            ratio: loaded_kib as f64 / idle_kib.max(1) as f64,
            goal: Goal::None,
        });
        self.push(Ratio {
            name: "start to /readyz (SQLite)".into(),
            product: format!("{ready_ms:.0} ms"),
            ceiling: "1000 ms".into(),
            ratio: ready_ms / 1000.0,
            goal: Goal::None,
        });
        drop(servers);
        let (raw_path, owner) = self.raw_sqlite_database("raw");
        let ceiling = ceiling::sqlite_raw_loop(&raw_path, &owner, self.seconds(), 1);
        println!("  raw SQLite loop: {ceiling:.0} creations/s");
        let batch = self.args.concurrency;
        // The loop runs on this thread; nothing else in this process is busy.
        let meter = CpuMeter::start(Vec::new());
        let batched = ceiling::sqlite_raw_loop(&raw_path, &owner, self.seconds(), batch);
        let raw_cpu = meter
            .stop()
            .load
            .map(|spent| cpu::per_job(spent, (batched * self.seconds().as_secs_f64()) as usize));
        println!(
            "  raw SQLite loop, {batch} creations per commit: {batched:.0} creations/s, \
             CPU {:.1} µs per creation",
            raw_cpu.unwrap_or(f64::NAN)
        );
        let us = |v: Option<f64>| v.map_or("?".to_owned(), |v| format!("{v:.1} µs"));
        self.push(Ratio {
            name: format!("server CPU per SQLite creation, {batch} creators"),
            product: us(server_cpu),
            ceiling: format!("raw loop, {batch} per commit: {} per row", us(raw_cpu)),
            ratio: server_cpu
                .zip(raw_cpu)
                .map_or(f64::NAN, |(s, r)| s / r.max(0.001)),
            goal: Goal::Other("≤ 45 µs", server_cpu.is_some_and(|us| us <= 45.0)),
        });
        let rate = run.rate();
        self.push(Ratio {
            name: "creation (SQLite)".into(),
            product: format!("{rate:.0} jobs/s"),
            ceiling: format!("raw loop {ceiling:.0}/s"),
            ratio: rate / ceiling,
            goal: Goal::AtLeast(2.0),
        });
        self.push(Ratio {
            name: "creation (SQLite) vs the batched loop".into(),
            product: format!("{rate:.0} jobs/s"),
            ceiling: format!("{batch} per commit {batched:.0}/s"),
            ratio: rate / batched,
            goal: Goal::AtLeast(0.8),
        });
        let p99 = run.p99();
        let met = p99 <= Duration::from_millis(50) && run.errors == 0;
        self.push(Ratio {
            name: "SQLite p99 at 32 creators".into(),
            product: format!("{} ({} errors)", ms(p99), run.errors),
            ceiling: "50 ms".into(),
            ratio: p99.as_secs_f64() / 0.05,
            goal: Goal::Other("≤ 1.0, no errors", met),
        });
    }

    /// The idle RSS, in KiB, of a process configured with as many HTTP
    /// workers as a machine of `--many-workers` cores gets by default: it
    /// stands in for that machine where this one has fewer cores.
    async fn idle_rss_with_workers(&self, deployment: &Deployment) -> u64 {
        let many = self.args.many_workers;
        let wide = deployment.reconfigured(
            self.dir(),
            "sqlite-wide",
            &config(0, 8, SIMULATED)
                .replace("[server]\n", &format!("[server]\nhttp_workers = {many}\n")),
        );
        let servers = wide.serve(1).await;
        // A person signing in: one password check, whose 19 MiB the server
        // must not keep (docs/benchmarks.md, "A password hash's memory").
        signed_in_browser(&wide, &servers[0].base, "bench-signer", "user").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let kib = servers[0].rss_kib().unwrap_or(0);
        println!(
            "  footprint with {many} HTTP workers, after a sign-in: RSS idle {:.1} MB ({})",
            kib as f64 / 1024.0,
            servers[0].rss_parts()
        );
        kib
    }

    /// The server's commits that carried batched writes and the writes
    /// they carried, from its metrics (read with an admin's token).
    async fn group_commits(&self, base: &str, admin: &str) -> Option<(f64, f64)> {
        self.metric_pair(
            base,
            admin,
            ("onejob_group_commits", "onejob_group_commit_rows"),
        )
        .await
    }

    /// The claims the servers made that took attempts, and the attempts
    /// they took, all servers together.
    async fn claims(&self, servers: &[servers::Server], admin: &str) -> (f64, f64) {
        let mut sum = (0.0, 0.0);
        for server in servers {
            let names = ("onejob_claims_total", "onejob_claimed_attempts_total");
            if let Some((claims, claimed)) = self.metric_pair(&server.base, admin, names).await {
                sum = (sum.0 + claims, sum.1 + claimed);
            }
        }
        sum
    }

    /// Two values of the server's metrics (read with an admin's token).
    async fn metric_pair(
        &self,
        base: &str,
        admin: &str,
        names: (&str, &str),
    ) -> Option<(f64, f64)> {
        let text = self
            .client
            .get(format!("{base}/metrics"))
            .bearer_auth(admin)
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        let value = |name: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|value| value.trim().parse::<f64>().ok())
        };
        Some((value(names.0)?, value(names.1)?))
    }

    /// 256 requests at once under one key vs 256 under their own keys.
    async fn storm(&mut self) {
        println!(
            "\n[storm] 256 simultaneous requests under one key vs under 256 keys (PostgreSQL)"
        );
        let url = self.pg.fresh_database("onejob_bench_storm");
        let deployment = Deployment::prepare(self.dir(), "storm", &url, &config(0, 8, SIMULATED));
        let servers = deployment.serve(1).await;
        let base = servers[0].base.clone();
        // Rounds until the step's seconds are spent (at least three): the
        // p99 of a few bursts is the slowest burst's tail, so more rounds
        // are what steadies it.
        // 256 connections opened before the clock starts, so that neither
        // side's first round pays for them.
        let (client, warm_base) = (self.client.clone(), base.clone());
        load::burst(256, move |_| {
            let (client, url) = (client.clone(), format!("{warm_base}/healthz"));
            async move {
                client.get(url).send().await.map_err(|e| e.to_string())?;
                Ok(())
            }
        })
        .await;
        let (mut storm, mut unique) = (Run::default(), Run::default());
        let started = Instant::now();
        let mut rounds: u64 = 0;
        while rounds < 3 || started.elapsed() < Duration::from_secs(self.args.seconds) {
            let round = rounds;
            rounds += 1;
            // Taking turns at going first.
            let order = if round % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            for same_key in order {
                let (client, token, base) =
                    (self.client.clone(), deployment.token.clone(), base.clone());
                let run = load::burst(256, move |n| {
                    let (client, token, base) = (client.clone(), token.clone(), base.clone());
                    let key = if same_key {
                        format!("storm-{round}")
                    } else {
                        format!("unique-{round}-{n}")
                    };
                    async move {
                        let response = client
                            .post(format!("{base}/api/v1/jobs"))
                            .bearer_auth(token)
                            .header("Idempotency-Key", &key)
                            .json(&json!({"task": "summarize", "input": {"text": "storm"}}))
                            .send()
                            .await
                            .map_err(|e| e.to_string())?;
                        match response.status().as_u16() {
                            200 | 201 => Ok(()),
                            status => Err(format!("{status}")),
                        }
                    }
                })
                .await;
                let into = if same_key { &mut storm } else { &mut unique };
                into.errors += run.errors;
                into.first_error = into.first_error.take().or(run.first_error);
                into.latencies.extend(run.latencies);
                into.elapsed += run.elapsed;
            }
        }
        let jobs: i64 = diesel::dsl::sql::<BigInt>(
            "SELECT count(*) FROM jobs WHERE idempotency_key LIKE 'storm-%'",
        )
        .get_result(&mut ceiling::pg(&url))
        .unwrap();
        println!("  one key: {}\n  own keys: {}\n  jobs made by the storms: {jobs} (one per round: {rounds})", storm.summary(), unique.summary());
        assert_eq!(jobs as u64, rounds, "a storm under one key makes one job");
        let ratio = storm.p99().as_secs_f64() / unique.p99().as_secs_f64();
        self.push(Ratio {
            name: "storm p99 vs unique p99".into(),
            product: ms(storm.p99()),
            ceiling: ms(unique.p99()),
            ratio,
            goal: Goal::AtMost(1.0),
        });
        drop(servers);
        self.drop_database("onejob_bench_storm");
    }

    /// Creation and lifecycle with `--prefill` finished jobs already stored.
    async fn prefill(&mut self) {
        let rows = self.args.prefill;
        println!("\n[prefill] creation and lifecycle with {rows} finished jobs already stored");
        let url = self.pg.fresh_database("onejob_bench_prefill");
        let deployment = Deployment::prepare(self.dir(), "prefill", &url, &config(0, 8, SIMULATED));
        let filling = Instant::now();
        prefill(&url, &owner_id(&url), rows);
        // The fill's writes are flushed before anything is measured.
        self.settle();
        println!(
            "  stored {rows} finished jobs (and their attempts) in {:.0} s",
            filling.elapsed().as_secs_f64()
        );
        let create = self.measure_create(&deployment, "prefill-create").await;
        let deployment = deployment.reconfigured(self.dir(), "prefill-life", &lifecycle_config());
        // The lifecycle varies more from run to run than creation: the
        // prefilled database and an empty one take turns (the first empty
        // run is the lifecycle step's), and their means are compared.
        let mut empties: Vec<f64> = self.empty_lifecycle.into_iter().collect();
        let mut prefilled = Vec::new();
        for turn in 0..2 {
            let tag = format!("prefill-life{turn}");
            prefilled.push(
                self.measure_lifecycle(&url, &deployment, 1, None, &tag)
                    .await
                    .expect("no budget to set"),
            );
            if turn == 0 && !empties.is_empty() {
                let empty = self.lifecycle_on_fresh(1, None, "empty1").await.unwrap();
                empties.push(empty);
            }
        }
        let lifecycle = (!empties.is_empty()).then(|| (mean(&prefilled), mean(&empties)));
        if lifecycle.is_some() {
            println!("  lifecycle with {rows} stored: {prefilled:.0?} jobs/s; empty: {empties:.0?} jobs/s");
        }
        let creation = self.empty_create.map(|empty| (create, empty));
        for (name, rates) in [
            ("creation, prefilled vs empty", creation),
            ("lifecycle, prefilled vs empty", lifecycle),
        ] {
            let Some((full, empty)) = rates else { continue };
            self.push(Ratio {
                name: name.into(),
                product: format!("{full:.0}/s with {rows} stored"),
                ceiling: format!("{empty:.0}/s empty"),
                ratio: full / empty,
                goal: Goal::AtLeast(0.8),
            });
        }
        self.console_page(&deployment, rows).await;
        self.drop_database("onejob_bench_prefill");
    }

    /// The console's front page, with its charts, on the prefilled
    /// database (the jobs the steps above made fill its last hour): its
    /// p99 against the 200 ms it must stay under.
    async fn console_page(&mut self, deployment: &Deployment, rows: u64) {
        let servers = deployment.serve(1).await;
        let base = servers[0].base.clone();
        let browser = signed_in_browser(deployment, &base, "bench-admin", "admin").await;
        let page = |browser: reqwest::Client, base: String| async move {
            let response = browser
                .get(format!("{base}/admin"))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            if !response.status().is_success() {
                return Err(response.status().to_string());
            }
            let body = response.text().await.map_err(|e| e.to_string())?;
            body.contains("chart-jobs-hour")
                .then_some(())
                .ok_or_else(|| "the page has no charts".to_owned())
        };
        // Warm-up, then the measured run: one staff member, then four.
        let _ = load::run(1, Duration::from_secs(1), {
            let (browser, base) = (browser.clone(), base.clone());
            move |_| page(browser.clone(), base.clone())
        })
        .await;
        for concurrency in [1usize, 4] {
            let run = load::run(concurrency, self.seconds(), {
                let (browser, base) = (browser.clone(), base.clone());
                move |_| page(browser.clone(), base.clone())
            })
            .await;
            println!(
                "  console home with charts, {rows} stored, {concurrency} at once: {}",
                run.summary()
            );
            let p99 = run.p99().as_secs_f64() * 1000.0;
            // A page that failed is no page: the goal is missed.
            let failed = run.errors > 0 || run.latencies.is_empty();
            self.push(Ratio {
                name: format!("console home p99, {concurrency} at once, {rows} stored"),
                product: format!("p99 {p99:.1} ms"),
                ceiling: "200 ms".into(),
                ratio: if failed { f64::INFINITY } else { p99 / 200.0 },
                goal: Goal::AtMost(1.0),
            });
        }
        drop(servers);
    }

    /// `/v1/chat/completions` through onejob vs the upstream called
    /// directly, at concurrency 1 and 32, on SQLite and PostgreSQL.
    async fn overhead(&mut self) {
        println!(
            "\n[overhead] /v1/chat/completions through onejob vs calling the upstream directly"
        );
        let upstream = upstream::start();
        let (telemetry, exports) = match self.args.otlp.as_str() {
            "live" => {
                let (base, exports) = upstream::start_collector();
                (
                    format!("\n[telemetry]\notlp_endpoint = \"{base}\"\n"),
                    Some(exports),
                )
            }
            "dead" => {
                let base = upstream::start_dead_collector();
                (format!("\n[telemetry]\notlp_endpoint = \"{base}\"\n"), None)
            }
            _ => (String::new(), None),
        };
        println!("  trace export: {}", self.args.otlp);
        let duration = Duration::from_secs((self.args.seconds / 2).max(2));
        let chat = |n: u64| json!({"model": "bench-chat", "messages": [{"role": "user", "content": format!("hello {n}")}]});
        for backend in self.args.backends.clone() {
            let backend = backend.as_str();
            let (deployment, servers) = self
                .chat_deployment("overhead", backend, &upstream, &telemetry)
                .await;
            let base = servers[0].base.clone();
            for concurrency in [1usize, 32] {
                let client = self.client.clone();
                let direct_url = format!("{upstream}/v1/chat/completions");
                let meter = CpuMeter::start(Vec::new());
                let direct = load::run(concurrency, duration, move |n| {
                    let (client, url) = (client.clone(), direct_url.clone());
                    async move {
                        let response = client
                            .post(url)
                            .bearer_auth("bench-key")
                            .json(&chat(n))
                            .send()
                            .await
                            .map_err(|e| e.to_string())?;
                        response
                            .status()
                            .is_success()
                            .then_some(())
                            .ok_or_else(|| response.status().to_string())
                    }
                })
                .await;
                let direct_cpu = meter.stop();
                let (client, token, base, tag) = (
                    self.client.clone(),
                    deployment.token.clone(),
                    base.clone(),
                    format!("{backend}-{concurrency}"),
                );
                let meter = CpuMeter::start(servers::pids(&servers));
                let through = load::run(concurrency, duration, move |n| {
                    let (client, token, base) = (client.clone(), token.clone(), base.clone());
                    let key = format!("{tag}-{n}");
                    async move {
                        let response = client
                            .post(format!("{base}/v1/chat/completions"))
                            .bearer_auth(token)
                            .header("Idempotency-Key", key)
                            .json(&chat(n))
                            .send()
                            .await
                            .map_err(|e| e.to_string())?;
                        match response.status().as_u16() {
                            200 => Ok(()),
                            status => Err(format!(
                                "{status}: {}",
                                response.text().await.unwrap_or_default()
                            )),
                        }
                    }
                })
                .await;
                let through_cpu = meter.stop();
                println!("  {backend} c={concurrency} direct: {}\n  {backend} c={concurrency} onejob: {}", direct.summary(), through.summary());
                println!("    direct: {}", direct_cpu.line(direct.latencies.len()));
                println!("    onejob: {}", through_cpu.line(through.latencies.len()));
                let server_cpu = through_cpu.server_per_job(through.latencies.len());
                let upstream_cpu = cpu::per_job(direct_cpu.upstream, direct.latencies.len());
                self.push(Ratio {
                    name: format!("server CPU per /v1 call {backend} c={concurrency}"),
                    product: server_cpu.map_or("?".into(), |us| format!("{us:.1} µs")),
                    ceiling: format!("the fake upstream's per direct call {upstream_cpu:.1} µs"),
                    ratio: server_cpu.map_or(f64::NAN, |us| us / upstream_cpu.max(0.001)),
                    goal: Goal::None,
                });
                let overhead = through.p50().saturating_sub(direct.p50());
                let goal = match (backend, concurrency) {
                    ("sqlite", 1) => Goal::Other(
                        "p50 overhead ≤ 0.6 ms",
                        overhead <= Duration::from_micros(600) && through.errors == 0,
                    ),
                    ("postgres", 1) => Goal::Other(
                        "p50 overhead ≤ 1.0 ms",
                        overhead <= Duration::from_millis(1) && through.errors == 0,
                    ),
                    _ => Goal::None,
                };
                let name = match self.args.otlp.as_str() {
                    "off" => format!("overhead {backend} c={concurrency}"),
                    mode => format!("overhead {backend} c={concurrency}, traces {mode}"),
                };
                self.push(Ratio {
                    name,
                    product: format!("onejob p50 {} p99 {}", ms(through.p50()), ms(through.p99())),
                    ceiling: format!("direct p50 {} p99 {}", ms(direct.p50()), ms(direct.p99())),
                    ratio: through.p50().as_secs_f64() / direct.p50().as_secs_f64().max(1e-6),
                    goal,
                });
                println!(
                    "    p50 overhead {}, p99 overhead {}",
                    load::us(overhead),
                    load::us(through.p99().saturating_sub(direct.p99()))
                );
                if concurrency == 1 {
                    self.above_the_floor(backend, overhead, duration);
                }
            }
            drop(servers);
            if backend == "postgres" {
                self.drop_database("onejob_bench_overhead");
            }
        }
        if let Some(exports) = exports {
            let exports = exports.load(std::sync::atomic::Ordering::Relaxed);
            println!("  the collector took {exports} exports");
        }
    }

    /// A fresh SQLite database `name.db` for a raw loop: migrated, with its
    /// user made, by onejob itself. Its path and the user's id.
    fn raw_sqlite_database(&self, name: &str) -> (std::path::PathBuf, String) {
        let path = self.dir().join(format!("{name}.db"));
        let prepared = Deployment::prepare(
            self.dir(),
            name,
            &path.display().to_string(),
            &config(0, 8, SIMULATED),
        );
        let owner = sqlite_owner(&path);
        drop(prepared);
        (path, owner)
    }

    /// The `/v1` overhead at concurrency 1 beside its durable floor: the two
    /// commits each call must wait for (the job with its attempt running,
    /// before the provider is called; the answer, before the caller hears
    /// it), made raw and one at a time on a fresh database of the same
    /// backend. What the overhead has above that floor is onejob's own.
    fn above_the_floor(&mut self, backend: &str, overhead: Duration, duration: Duration) {
        let floor = match backend {
            "sqlite" => {
                let (path, owner) = self.raw_sqlite_database("floor");
                let unsynced = ceiling::sqlite_answer_floor(&path, &owner, duration, "OFF");
                let floor = ceiling::sqlite_answer_floor(&path, &owner, duration, "FULL");
                println!(
                    "    durable floor (raw SQLite, the two commits of a call, one call at a \
                     time): p50 {}, p99 {}; the same without waiting for the disk: p50 {}",
                    load::us(floor.p50()),
                    load::us(floor.p99()),
                    load::us(unsynced.p50()),
                );
                floor.p50()
            }
            _ => {
                let (tps, database, since) =
                    self.pgbench_of("answer", &ceiling::answer_script(), 1);
                // Every answer took: the floor is of writes that happened.
                let all_answered: bool = diesel::dsl::sql::<diesel::sql_types::Bool>(&format!(
                    "SELECT count(*) > 0 AND bool_and(status = 'succeeded') FROM jobs \
                     WHERE created_at >= {since}"
                ))
                .get_result(&mut ceiling::pg(&self.pg.database_url(&database)))
                .unwrap();
                assert!(
                    all_answered,
                    "pgbench made jobs, and each answer made its job succeed"
                );
                self.drop_database(&database);
                let mean = Duration::from_secs_f64(1.0 / tps.max(1e-9));
                println!(
                    "    durable floor (pgbench, one client, the two statements of a call): \
                     {} a call on average",
                    load::us(mean)
                );
                mean
            }
        };
        println!(
            "    above the floor: {}",
            load::us(overhead.saturating_sub(floor))
        );
        self.push(Ratio {
            name: format!("overhead {backend} c=1 vs its durable floor"),
            product: format!("p50 overhead {}", load::us(overhead)),
            ceiling: format!("the two commits alone {}", load::us(floor)),
            ratio: overhead.as_secs_f64() / floor.as_secs_f64().max(1e-9),
            goal: Goal::None,
        });
    }

    /// One `onejob serve` process on a fresh `backend` database, with the
    /// chat route `bench-chat` to the OpenAI-compatible `upstream`.
    async fn chat_deployment(
        &self,
        step: &str,
        backend: &str,
        upstream: &str,
        telemetry: &str,
    ) -> (Deployment, Vec<Server>) {
        let routes = format!(
            "{}\n[[tasks]]\nname = \"bench-chat\"\nkind = \"chat\"\nproviders = [\"up\"]\n{telemetry}",
            upstream_provider(upstream, "")
        );
        let url = match backend {
            "sqlite" => self.dir().join(format!("{step}.db")).display().to_string(),
            _ => self.pg.fresh_database(&format!("onejob_bench_{step}")),
        };
        let deployment = Deployment::prepare(
            self.dir(),
            &format!("{step}-{backend}"),
            &url,
            &config(32, 16, &routes),
        );
        let servers = deployment.serve(1).await;
        (deployment, servers)
    }

    /// Time to the first token of a streamed `/v1/chat/completions`,
    /// through onejob vs the streaming upstream called directly, at
    /// concurrency 1 and 32, on SQLite and PostgreSQL. Every stream is
    /// read to its end and must carry the whole answer.
    async fn ttft(&mut self) {
        println!(
            "\n[ttft] time to first token of a streamed chat completion, through onejob vs \
             calling the upstream directly ({} pieces, {} apart)",
            upstream::STREAMED.len(),
            ms(upstream::CHUNK_GAP)
        );
        let upstream = upstream::start();
        let duration = Duration::from_secs((self.args.seconds / 2).max(2));
        let chat = |n: u64| {
            json!({"model": "bench-chat", "stream": true,
                   "messages": [{"role": "user", "content": format!("tell {n}")}]})
        };
        for backend in self.args.backends.clone() {
            let backend = backend.as_str();
            let (deployment, servers) = self.chat_deployment("ttft", backend, &upstream, "").await;
            let base = servers[0].base.clone();
            for concurrency in [1usize, 32] {
                let (client, direct_url) = (
                    self.client.clone(),
                    format!("{upstream}/v1/chat/completions"),
                );
                let direct = load::run_measured(concurrency, duration, move |n| {
                    first_token(
                        client
                            .post(&direct_url)
                            .bearer_auth("bench-key")
                            .json(&chat(n)),
                    )
                })
                .await;
                let (client, token, base, tag) = (
                    self.client.clone(),
                    deployment.token.clone(),
                    base.clone(),
                    format!("ttft-{backend}-{concurrency}"),
                );
                let through = load::run_measured(concurrency, duration, move |n| {
                    first_token(
                        client
                            .post(format!("{base}/v1/chat/completions"))
                            .bearer_auth(&token)
                            .header("Idempotency-Key", format!("{tag}-{n}"))
                            .json(&chat(n)),
                    )
                })
                .await;
                println!(
                    "  {backend} c={concurrency} direct TTFT: {}\n  {backend} c={concurrency} onejob TTFT: {}",
                    direct.summary(),
                    through.summary()
                );
                let (p50, p99) = (
                    through.p50().saturating_sub(direct.p50()),
                    through.p99().saturating_sub(direct.p99()),
                );
                let goal = match (backend, concurrency) {
                    ("sqlite", 1) => Goal::Other(
                        "TTFT p50 overhead ≤ 2 ms",
                        p50 <= Duration::from_millis(2)
                            && through.errors == 0
                            && direct.errors == 0,
                    ),
                    _ => Goal::None,
                };
                self.push(Ratio {
                    name: format!("ttft {backend} c={concurrency}"),
                    product: format!("onejob p50 {} p99 {}", ms(through.p50()), ms(through.p99())),
                    ceiling: format!("direct p50 {} p99 {}", ms(direct.p50()), ms(direct.p99())),
                    ratio: through.p50().as_secs_f64() / direct.p50().as_secs_f64().max(1e-6),
                    goal,
                });
                println!(
                    "    TTFT through onejob minus direct: p50 {}, p99 {}",
                    ms(p50),
                    ms(p99)
                );
                assert_eq!(
                    through.errors, 0,
                    "every stream through onejob arrives whole: {:?}",
                    through.first_error
                );
            }
            drop(servers);
            if backend == "postgres" {
                self.drop_database("onejob_bench_ttft");
            }
        }
    }

    /// A provider that answers 8 requests at once (in 200 ms) and refuses
    /// more with `429 Retry-After: 1`, and 48 jobs created at once, on a
    /// worker with 48 slots: with `max_in_flight` off, onejob provokes the
    /// refusals and the jobs drain by retries a second apart; with
    /// `max_in_flight = 8`, they queue for the capacity and none is
    /// refused. Every job succeeds either way.
    async fn ratelimit(&mut self) {
        const JOBS: usize = 48;
        const CAPACITY: usize = 8;
        const LATENCY_MS: u64 = 200;
        println!(
            "\n[ratelimit] {JOBS} jobs at once on a provider serving {CAPACITY} at a time in \
             {LATENCY_MS} ms (429 Retry-After: 1 past that), max_in_flight off and on"
        );
        let mut drains = Vec::new();
        for max_in_flight in [None, Some(CAPACITY)] {
            let (upstream, calls) = upstream::start_limited(CAPACITY, LATENCY_MS);
            let limit = max_in_flight.map_or(String::new(), |n| format!("max_in_flight = {n}\n"));
            let routes = format!(
                r#"{}
[[tasks]]
name = "summarize"
providers = ["up"]
input_fields = ["text"]
template = "Summarize: {{{{ text }}}}"
"#,
                upstream_provider(&upstream, &limit)
            );
            let tag = if max_in_flight.is_some() { "on" } else { "off" };
            let name = format!("onejob_bench_ratelimit_{tag}");
            let url = self.pg.fresh_database(&name);
            let deployment = Deployment::prepare(
                self.dir(),
                &format!("ratelimit-{tag}"),
                &url,
                &config(JOBS, 16, &routes),
            );
            let servers = deployment.serve(1).await;
            let since = chrono::Utc::now().timestamp_millis();
            let started = Instant::now();
            let (client, token, base) = (
                self.client.clone(),
                deployment.token.clone(),
                servers[0].base.clone(),
            );
            let created = load::burst(JOBS, move |n| {
                let (client, token, base) = (client.clone(), token.clone(), base.clone());
                async move {
                    let response = client
                        .post(format!("{base}/api/v1/jobs"))
                        .bearer_auth(token)
                        .header("Idempotency-Key", format!("ratelimit-{n}"))
                        .json(&json!({"task": "summarize", "input": {"text": format!("job {n}")}}))
                        .send()
                        .await
                        .map_err(|e| e.to_string())?;
                    match response.status().as_u16() {
                        201 => Ok(()),
                        status => Err(format!("{status}")),
                    }
                }
            })
            .await;
            let succeeded = wait_until_finished(&url, since, Duration::from_secs(120));
            let drain = started.elapsed();
            let (total, refused) = calls.read();
            let share = refused as f64 / total.max(1) as f64;
            println!(
                "  max_in_flight {}: {} created ({} errors), {succeeded} of {JOBS} jobs succeeded; \
                 {total} provider calls, {refused} refused ({:.0}%); drained in {:.2} s",
                max_in_flight.map_or("off".to_owned(), |n| n.to_string()),
                created.latencies.len(),
                created.errors,
                share * 100.0,
                drain.as_secs_f64()
            );
            assert_eq!(
                succeeded as usize, JOBS,
                "every job succeeds, rate limited or not"
            );
            drains.push((drain, refused, share));
            drop(servers);
            self.drop_database(&name);
        }
        let ((off, _, off_share), (on, on_refused, _)) = (drains[0], drains[1]);
        self.push(Ratio {
            name: "rate limited: drain with max_in_flight vs without".into(),
            product: format!("{:.2} s, {on_refused} refused", on.as_secs_f64()),
            ceiling: format!(
                "{:.2} s, {:.0}% of calls refused",
                off.as_secs_f64(),
                off_share * 100.0
            ),
            ratio: on.as_secs_f64() / off.as_secs_f64(),
            goal: Goal::Other("no refusal with max_in_flight", on_refused == 0),
        });
    }

    fn report(&self, elapsed: Duration) {
        println!(
            "\n| measure | onejob | ceiling | ratio | target | met |\n|---|---|---|---|---|---|"
        );
        for r in &self.ratios {
            let met = match r.met() {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "—",
            };
            println!(
                "| {} | {} | {} | {:.2} | {} | {met} |",
                r.name,
                r.product,
                r.ceiling,
                r.ratio,
                r.target()
            );
        }
        println!("\nbenchmark finished in {:.0} s", elapsed.as_secs_f64());
    }
}

/// The user every step adds (`onejob users add bench`).
/// The provider `up`: the OpenAI-compatible `upstream`, with `extra`
/// settings.
fn upstream_provider(upstream: &str, extra: &str) -> String {
    format!(
        "\n[[providers]]\nname = \"up\"\nkind = \"openai\"\nbase_url = \"{upstream}/v1\"\n\
         model = \"bench-model\"\napi_key_env = \"BENCH_UPSTREAM_KEY\"\ntimeout_ms = 30000\n{extra}"
    )
}

/// Sends a streamed chat completion and reads it to its end: the time from
/// sending to the first event with content, if the stream carried the whole
/// answer and ended with `[DONE]`.
async fn first_token(request: reqwest::RequestBuilder) -> Result<Duration, String> {
    use futures_util::StreamExt;
    let sent = Instant::now();
    let response = request.send().await.map_err(|e| e.to_string())?;
    if response.status() != reqwest::StatusCode::OK {
        let status = response.status();
        return Err(format!(
            "{status}: {}",
            response.text().await.unwrap_or_default()
        ));
    }
    let mut body = response.bytes_stream();
    let (mut pending, mut content) = (String::new(), String::new());
    let (mut first, mut done) = (None, false);
    while let Some(bytes) = body.next().await {
        pending.push_str(&String::from_utf8_lossy(&bytes.map_err(|e| e.to_string())?));
        while let Some(end) = pending.find("\n\n") {
            let event: String = pending.drain(..end + 2).collect();
            for data in event.lines().filter_map(|l| l.strip_prefix("data: ")) {
                if data == "[DONE]" {
                    done = true;
                    continue;
                }
                let chunk: serde_json::Value =
                    serde_json::from_str(data).map_err(|e| format!("{e}: {data}"))?;
                if let Some(text) = chunk["choices"][0]["delta"]["content"].as_str() {
                    first.get_or_insert_with(|| sent.elapsed());
                    content.push_str(text);
                }
            }
        }
    }
    let whole = upstream::STREAMED.concat();
    match first {
        Some(first) if done && content == whole => Ok(first),
        _ => Err(format!("an incomplete stream (done: {done}): {content:?}")),
    }
}

const BENCH_USER: &str = "bench";

/// The bench user's id, on PostgreSQL.
fn owner_id(url: &str) -> String {
    owner_id_and_role(url).0
}

/// The bench user's id and role, on PostgreSQL.
fn owner_id_and_role(url: &str) -> (String, String) {
    users::table
        .filter(users::name.eq(BENCH_USER))
        .select((users::id, users::role))
        .first::<(String, String)>(&mut ceiling::pg(url))
        .expect("the benchmark's user")
}

/// The bench user's id, on SQLite.
fn sqlite_owner(path: &Path) -> String {
    let mut conn = SqliteConnection::establish(&path.display().to_string()).unwrap();
    users::table
        .filter(users::name.eq(BENCH_USER))
        .select(users::id)
        .first(&mut conn)
        .expect("the benchmark's user")
}

/// The smallest UUIDv7 of the millisecond `ms`, as onejob writes ids: job ids
/// are time-ordered, so "created since" is a range of the owner's index.
fn first_id_at(ms: i64) -> String {
    let hex = format!("{:012x}", ms);
    format!("{}-{}-0000-0000-000000000000", &hex[..8], &hex[8..])
}

/// Waits until no job created since `since` (ms) is unfinished; how many
/// of them succeeded. Reads only the new jobs (a range of the owner's
/// index), so that watching costs the database next to nothing, however
/// many jobs are stored.
fn mean(rates: &[f64]) -> f64 {
    rates.iter().sum::<f64>() / rates.len() as f64
}

/// Jobs of the benchmark's user not finished yet.
fn unfinished_jobs(url: &str) -> i64 {
    diesel::dsl::sql::<BigInt>(&format!(
        "SELECT count(*) FROM jobs WHERE owner_id = '{}' AND status NOT IN ('succeeded', 'failed')",
        owner_id(url)
    ))
    .get_result(&mut ceiling::pg(url))
    .unwrap()
}

fn wait_until_finished(url: &str, since: i64, within: Duration) -> i64 {
    let mut conn = ceiling::pg(url);
    let owner = owner_id(url);
    let new_jobs = format!(
        "jobs WHERE owner_id = '{owner}' AND id >= '{}'",
        first_id_at(since)
    );
    let deadline = Instant::now() + within;
    loop {
        let unfinished: i64 = diesel::dsl::sql::<BigInt>(&format!(
            "SELECT count(*) FROM {new_jobs} AND status NOT IN ('succeeded', 'failed')"
        ))
        .get_result(&mut conn)
        .unwrap();
        if unfinished == 0 {
            return diesel::dsl::sql::<BigInt>(&format!(
                "SELECT count(*) FROM {new_jobs} AND status = 'succeeded'"
            ))
            .get_result(&mut conn)
            .unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "{unfinished} jobs still unfinished"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stores `rows` finished jobs (each with its winning attempt), spread over
/// the past year, in batches of 100,000.
fn prefill(url: &str, owner: &str, rows: u64) {
    let mut conn = ceiling::pg(url);
    // Ids shaped as onejob makes them (UUIDv7, here of the job's own past
    // time), so the indexes hold what a year of real use would leave.
    conn.batch_execute(
        "CREATE OR REPLACE FUNCTION bench_uuid7_at(ms bigint) RETURNS text LANGUAGE sql VOLATILE AS $$
           WITH h AS (SELECT lpad(to_hex(ms), 12, '0') AS t,
                             replace(gen_random_uuid()::text, '-', '') AS r)
           SELECT substr(t, 1, 8) || '-' || substr(t, 9, 4) || '-7' || substr(r, 13, 3) || '-'
                  || substr(r, 17, 4) || '-' || substr(r, 21, 12)
           FROM h
         $$;",
    )
    .expect("creating the prefill helper");
    let batch = 100_000u64;
    let mut done = 0;
    while done < rows {
        let n = batch.min(rows - done);
        // A job and its attempt point at each other: the job goes in
        // running, then becomes succeeded once its winner exists.
        conn.batch_execute(&format!(
            "BEGIN;
             CREATE TEMP TABLE ids ON COMMIT DROP AS
               SELECT g, bench_uuid7_at(at) AS job_id, bench_uuid7_at(at) AS attempt_id, at
               FROM (SELECT g, (extract(epoch FROM now()) * 1000)::bigint - 31536000000 + g * 10 AS at
                     FROM generate_series({start}, {end}) AS g) AS past;
             INSERT INTO jobs (id, owner_id, idempotency_key, task, provider, input, params,
                               fingerprint, status, version, created_at, updated_at)
               SELECT job_id, '{owner}', 'prefill-' || g, 'summarize', 'sim', '{{\"text\":\"old\"}}',
                      '{{}}', md5(g::text) || md5(g::text), 'running', 0, at, at FROM ids;
             INSERT INTO attempts (id, job_id, owner_id, number, provider, state, outcome,
                                   version_read, created_at, started_at, finished_at, sent_at)
               SELECT attempt_id, job_id, '{owner}', 1, 'sim', 'succeeded', 'won', 0, at, at, at, at
               FROM ids;
             UPDATE jobs SET status = 'succeeded', version = 1, completed_by = ids.attempt_id,
                    result = '{{\"summary\":\"old\"}}'
               FROM ids WHERE jobs.id = ids.job_id AND jobs.owner_id = '{owner}';
             COMMIT;",
            start = done,
            end = done + n - 1
        ))
        .expect("prefilling");
        done += n;
    }
    // One statement per call: VACUUM refuses a multi-statement string.
    for table in ["jobs", "attempts"] {
        conn.batch_execute(&format!("VACUUM ANALYZE {table}"))
            .expect("finishing the prefill");
    }
}
