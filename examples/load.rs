//! A reproducible load benchmark of job creation: starts onejob in-process on
//! 127.0.0.1 (SQLite in a temp dir, or the PostgreSQL database named by
//! `--database-url`), fires `--jobs` creations from `--concurrency` clients,
//! each with its own idempotency key plus one replay per job, and reports
//! throughput and latency percentiles. Every created job is then counted in
//! the database.
//!
//!     cargo run --release --example load -- --jobs 2000 --concurrency 32
//!     cargo run --release --example load -- --database-url postgres://postgres@127.0.0.1:5432/onejob_bench

use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use diesel::prelude::*;
use onejob::config::Config;
use onejob::domain::Role;
use onejob::startup::{open_store, Application};
use onejob::store::schema::jobs;
use onejob::store::{users, DatabaseUrl};
use serde_json::json;
use tokio::sync::Semaphore;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 2000)]
    jobs: usize,
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Default: a fresh SQLite file in a temp dir.
    #[arg(long)]
    database_url: Option<String>,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let dir = tempfile::tempdir().unwrap();
    let url = DatabaseUrl::parse(
        &args
            .database_url
            .clone()
            .unwrap_or_else(|| dir.path().join("bench.db").display().to_string()),
    )
    .unwrap();
    let mut config = Config::load(None, &onejob::config::Environment::Process).unwrap();
    config.database.pool_size = 16;
    let store = {
        let (url, config) = (url.clone(), config.clone());
        tokio::task::spawn_blocking(move || open_store(&url, &config))
            .await
            .unwrap()
            .unwrap()
    };
    let name = format!("bench-{}", uuid::Uuid::now_v7().simple());
    let (user, token) = {
        let store = store.clone();
        tokio::task::spawn_blocking(move || {
            users::add_user(&mut store.conn().unwrap(), &name, Role::User).unwrap()
        })
        .await
        .unwrap()
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let app = Application::build(config, store.clone(), listener)
        .await
        .unwrap();
    let base = format!("http://127.0.0.1:{}", app.port());
    tokio::spawn(app.run_until_stopped());

    let client = reqwest::Client::new();
    let token = Arc::new(token.0);
    let gate = Arc::new(Semaphore::new(args.concurrency));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(args.jobs);
    for i in 0..args.jobs {
        let (client, token, gate, base) =
            (client.clone(), token.clone(), gate.clone(), base.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire_owned().await.unwrap();
            let mut timings = Vec::with_capacity(2);
            for expected in [201u16, 200] {
                let t = Instant::now();
                let response = client
                    .post(format!("{base}/api/v1/jobs"))
                    .bearer_auth(token.as_str())
                    .header("Idempotency-Key", format!("load-{i}"))
                    .json(&json!({"task": "summarize", "input": {"text": format!("load {i}")}}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(
                    response.status().as_u16(),
                    expected,
                    "{}",
                    response.text().await.unwrap()
                );
                timings.push(t.elapsed());
            }
            timings
        }));
    }
    let mut latencies = Vec::with_capacity(args.jobs * 2);
    for task in tasks {
        latencies.extend(task.await.unwrap());
    }
    let elapsed = started.elapsed();
    latencies.sort();
    let owner = user.id.clone();
    let stored: i64 = tokio::task::spawn_blocking(move || {
        jobs::table
            .filter(jobs::owner_id.eq(owner))
            .count()
            .get_result(&mut store.conn().unwrap())
            .unwrap()
    })
    .await
    .unwrap();
    println!("backend          {}", url.backend().as_str());
    println!(
        "requests         {} ({} creates + {} replays)",
        latencies.len(),
        args.jobs,
        args.jobs
    );
    println!("concurrency      {}", args.concurrency);
    println!("elapsed          {:.2?}", elapsed);
    println!(
        "throughput       {:.0} requests/s",
        latencies.len() as f64 / elapsed.as_secs_f64()
    );
    println!(
        "latency          p50 {:.1?}  p95 {:.1?}  p99 {:.1?}  max {:.1?}",
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.95),
        percentile(&latencies, 0.99),
        latencies.last().unwrap()
    );
    println!("jobs stored      {stored} (expected {})", args.jobs);
    assert_eq!(
        stored as usize, args.jobs,
        "every acknowledged creation is stored, once"
    );
}
