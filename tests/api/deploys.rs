//! Deploys and crashes with real `onejob serve` processes: a SIGTERM lets a
//! call in flight land its answer, gives an unsent claim back to the queue
//! (sent once after the restart), and a chaos run (kills, restarts, a
//! rolling restart, clients retrying every intent several times) loses and
//! duplicates nothing.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use onejob::domain::{AttemptState, JobStatus};
use onejob::store::schema::{attempts, jobs};
use onejob::store::{Attempt, Store};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::server_process::{free_port, ServerProcess};
use crate::support::fake_provider::{strict_task_toml, Behaviour, FakeProvider, Shape};
use crate::support::harness::{
    postgres_available, summarize, test_config, TestBackend, TestDb, DEFAULT_TEST_PROVIDERS,
};

/// A configuration file for the processes: one fake provider, two tasks;
/// `server` adds lines to `[server]`.
fn write_config(dir: &Path, fake: &FakeProvider, server: &str) -> PathBuf {
    let toml = format!(
        r#"
[server]
shutdown_grace_ms = 8000
{server}

[database]
pool_timeout_ms = 1000
sqlite_busy_timeout_ms = 1000
postgres_lock_timeout_ms = 1000

[worker]
concurrency = 4
poll_interval_ms = 50
lease_ms = 4000

[[providers]]
name = "fake"
kind = "openai"
base_url = "{base}"
model = "fake-model"
api_key_env = "ONEJOB_TEST_FAKE_KEY"
timeout_ms = 5000
connect_timeout_ms = 1000
late_result_ms = 5000
{task}{direct}"#,
        base = fake.base_url,
        task = strict_task_toml("summarize", &["fake"], "Summarize: {{ text }}"),
        direct = strict_task_toml("direct", &["fake"], "Directly: {{ text }}"),
    );
    let path = dir.join("onejob.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// Where each deploy test starts: a database with a user (its store and
/// API token), a fake provider, and the processes' configuration file
/// (`server`: extra `[server]` lines) in a directory of their own.
struct Setup {
    db: TestDb,
    store: Store,
    token: String,
    dir: tempfile::TempDir,
    fake: FakeProvider,
    config: PathBuf,
}

async fn set_up(backend: TestBackend, server: &str) -> Setup {
    set_up_on(TestDb::create(backend), server).await
}

async fn set_up_on(db: TestDb, server: &str) -> Setup {
    let (store, token) = seed(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let config = write_config(dir.path(), &fake, server);
    Setup {
        db,
        store,
        token,
        dir,
        fake,
        config,
    }
}

/// The database's store and an API token for a user made in it.
async fn seed(db: &TestDb) -> (Store, String) {
    let url = db.url.clone();
    tokio::task::spawn_blocking(move || {
        let store =
            onejob::startup::open_store(&url, &test_config(DEFAULT_TEST_PROVIDERS)).unwrap();
        let (_, token) = onejob::store::users::add_user(
            &mut store.conn().unwrap(),
            "client",
            onejob::domain::Role::User,
        )
        .unwrap();
        (store, token.0)
    })
    .await
    .unwrap()
}

async fn attempts(store: &Store) -> Vec<Attempt> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || {
        attempts::table
            .select(Attempt::as_select())
            .order(attempts::created_at)
            .load(&mut store.conn().unwrap())
            .unwrap()
    })
    .await
    .unwrap()
}

async fn wait_for(store: &Store, what: &str, done: impl Fn(&[Attempt]) -> bool) -> Vec<Attempt> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rows = attempts(store).await;
        if done(&rows) {
            return rows;
        }
        assert!(Instant::now() < deadline, "{what}: {rows:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn post(
    base: &str,
    token: &str,
    key: &str,
    body: &Value,
) -> reqwest::Result<reqwest::Response> {
    reqwest::Client::new()
        .post(format!("{base}/api/v1/jobs"))
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
}

/// Waits until the server no longer accepts connections (it is stopping).
async fn wait_stopped_serving(base: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while reqwest::get(format!("{base}/healthz")).await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "still serving 10 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `--role http` and `--role worker` split one deployment: the HTTP-only
/// process accepts a job and sends nothing; the worker-only process sends
/// it, once, and over HTTP answers health checks and metrics and nothing
/// else. A worker-only process without worker slots refuses to start.
async fn an_http_only_and_a_worker_only_process_split_the_work(backend: TestBackend) {
    let Setup {
        db,
        store,
        token,
        dir,
        fake,
        config,
    } = set_up(backend, "").await;
    fake.set_default(Behaviour::Hold);
    let url = db.url.as_str();
    let mut http = ServerProcess::spawn_as(dir.path(), "http", &config, url, free_port(), "http");
    http.wait_ready().await;

    let response = post(&http.base, &token, "split", &summarize("x"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let job: Value = response.json().await.unwrap();
    assert_eq!(job["status"], "pending", "{job:#}");
    let attempt_id = job["attempts"][0]["id"].as_str().unwrap().to_owned();

    let mut worker =
        ServerProcess::spawn_as(dir.path(), "worker", &config, url, free_port(), "worker");
    worker.wait_ready().await;
    fake.wait_held(&attempt_id).await;
    let running = wait_for(&store, "claimed by the worker", |rows| {
        rows.len() == 1 && rows[0].state == AttemptState::Running
    })
    .await;
    let owner = running[0].lease_owner.clone().unwrap();
    assert!(
        owner.starts_with(&format!("pid{}-", worker.pid)),
        "claimed by the worker-only process, not {owner}"
    );

    let client = reqwest::Client::new();
    for path in ["/healthz", "/readyz"] {
        let status = client
            .get(format!("{}{path}", worker.base))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, StatusCode::OK, "{path}");
    }
    let metrics = client
        .get(format!("{}/metrics", worker.base))
        .send()
        .await
        .unwrap();
    assert_eq!(
        metrics.status(),
        StatusCode::UNAUTHORIZED,
        "metrics need a token"
    );
    for path in ["/api/v1/jobs", "/v1/models", "/login", "/admin"] {
        let status = client
            .get(format!("{}{path}", worker.base))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, StatusCode::NOT_FOUND, "{path} on the worker");
    }
    let refused = post(&worker.base, &token, "elsewhere", &summarize("y"))
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::NOT_FOUND);

    fake.release(&attempt_id, Behaviour::Answer(json!({"summary": "split"})));
    wait_for(&store, "answered", |rows| {
        rows.len() == 1 && rows[0].state == AttemptState::Succeeded
    })
    .await;
    assert_eq!(fake.requests_for(&attempt_id), 1);
    assert_eq!(fake.total_requests(), 1);

    let idle = dir.path().join("idle.toml");
    std::fs::write(
        &idle,
        std::fs::read_to_string(&config)
            .unwrap()
            .replace("concurrency = 4", "concurrency = 0"),
    )
    .unwrap();
    let mut no_slots =
        ServerProcess::spawn_as(dir.path(), "no-slots", &idle, url, free_port(), "worker");
    let status = no_slots.wait_exit(Duration::from_secs(20)).await;
    assert!(!status.success());
    assert!(
        no_slots
            .stderr()
            .contains("a worker-only process needs `[worker] concurrency` above 0"),
        "{}",
        no_slots.stderr()
    );
    for server in [&http, &worker] {
        server.terminate();
    }
    for server in [&mut http, &mut worker] {
        assert!(server.wait_exit(Duration::from_secs(20)).await.success());
    }
}

async fn a_sigterm_mid_call_lets_the_answer_land_inside_the_grace(backend: TestBackend) {
    let Setup {
        db,
        store,
        token,
        dir,
        fake,
        config,
    } = set_up(backend, "").await;
    fake.set_default(Behaviour::Hold);
    let mut server = ServerProcess::spawn(dir.path(), "server", &config, db.url.as_str());
    server.wait_ready().await;
    let response = post(&server.base, &token, "mid-call", &summarize("x"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let job: Value = response.json().await.unwrap();
    let attempt_id = job["attempts"][0]["id"].as_str().unwrap().to_owned();
    fake.wait_held(&attempt_id).await;

    server.terminate();
    wait_stopped_serving(&server.base).await;
    // The deploy is under way; the provider answers inside the grace.
    fake.release(&attempt_id, Behaviour::Answer(json!({"summary": "landed"})));
    let status = server.wait_exit(Duration::from_secs(20)).await;
    assert!(status.success(), "exit {status}:\n{}", server.stderr());

    let rows = attempts(&store).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].state,
        AttemptState::Succeeded,
        "not unknown: {:#?}",
        rows[0]
    );
    assert_eq!(fake.requests_for(&attempt_id), 1);
}

/// A deploy strands nothing that waits on a provider's pause: the attempt
/// waits in the queue (never claimed, never sent) across SIGTERM, and the
/// next version sends it, once; a retry told to wait a minute still waits.
async fn an_attempt_waiting_out_a_pause_at_sigterm_is_sent_once_after_the_restart(
    backend: TestBackend,
) {
    let Setup {
        db,
        store,
        token,
        dir,
        fake,
        config,
    } = set_up(backend, "").await;
    let port = free_port();
    let mut server = ServerProcess::spawn_on(dir.path(), "first", &config, db.url.as_str(), port);
    server.wait_ready().await;
    // The provider asks this process for a minute's pause.
    fake.push(Behaviour::Status {
        status: 429,
        retry_after: Some(60),
        body: "{}".into(),
    });
    let mut direct = summarize("pause please");
    direct["task"] = "direct".into();
    assert_eq!(
        post(&server.base, &token, "pause", &direct)
            .await
            .unwrap()
            .status(),
        StatusCode::CREATED
    );
    // The 429 is a failure of that attempt, and a retry waits out the
    // minute on the same provider (the task's only one).
    let rows = wait_for(&store, "the 429 recorded and its retry queued", |a| {
        a.len() == 2 && a[0].state == AttemptState::Failed && a[1].state == AttemptState::Queued
    })
    .await;
    let retry = rows[1].clone();
    let waits_for = retry.not_before.unwrap() - retry.created_at;
    assert!(
        waits_for >= 60_000,
        "Retry-After: 60, waited {waits_for} ms"
    );
    // The next job's attempt waits in the queue, unclaimed, unsent.
    let response = post(&server.base, &token, "waits", &summarize("x"))
        .await
        .unwrap();
    let job: Value = response.json().await.unwrap();
    let attempt_id = job["attempts"][0]["id"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rows = attempts(&store).await;
    let waiting = rows.iter().find(|a| a.id.as_str() == attempt_id).unwrap();
    assert_eq!(waiting.state, AttemptState::Queued, "{waiting:#?}");

    server.terminate();
    let status = server.wait_exit(Duration::from_secs(20)).await;
    assert!(status.success(), "exit {status}:\n{}", server.stderr());
    let rows = attempts(&store).await;
    let waiting = rows.iter().find(|a| a.id.as_str() == attempt_id).unwrap();
    assert_eq!(waiting.state, AttemptState::Queued, "{waiting:#?}");
    assert!(waiting.sent_at.is_none());
    assert_eq!(fake.requests_for(&attempt_id), 0, "nothing was sent");

    // The next version starts on the same port and sends it, once.
    let mut restarted =
        ServerProcess::spawn_on(dir.path(), "second", &config, db.url.as_str(), port);
    restarted.wait_ready().await;
    let rows = wait_for(&store, "sent after the restart", |a| {
        a.iter()
            .any(|a| a.id.as_str() == attempt_id && a.state == AttemptState::Succeeded)
    })
    .await;
    assert_eq!(rows.len(), 3, "the same attempt, no new one: {rows:#?}");
    assert_eq!(fake.requests_for(&attempt_id), 1, "sent exactly once");
    let still = rows.iter().find(|a| a.id == retry.id).unwrap();
    assert_eq!(still.state, AttemptState::Queued, "the retry still waits");
    assert_eq!(fake.requests_for(retry.id.as_str()), 0);
}

/// What the chaos clients saw.
#[derive(Default)]
struct Tally {
    requests: AtomicUsize,
    connection_errors: AtomicUsize,
    unavailable: AtomicUsize,
    /// Statuses that must never be seen: other 5xx, 409, anything unexpected.
    wrong: Mutex<Vec<String>>,
    /// The job id each key was acknowledged with, every time.
    acknowledged: Mutex<HashMap<String, Vec<String>>>,
}

/// More owners' tokens for the store's database, each a user of its own.
async fn more_owners(store: &Store, n: usize) -> Vec<String> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || {
        let mut conn = store.conn().unwrap();
        (1..=n)
            .map(|i| {
                let name = format!("owner-{i}");
                let (_, token) =
                    onejob::store::users::add_user(&mut conn, &name, onejob::domain::Role::User)
                        .unwrap();
                token.0
            })
            .collect()
    })
    .await
    .unwrap()
}

/// PostgreSQL only: several processes sharing one database is what
/// PostgreSQL is for. The intents belong to many owners, so that on a
/// database distributed by owner they spread over every node, and each
/// claim takes several owners' attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_kills_restarts_and_retries_lose_nothing_and_send_nothing_twice() {
    if !postgres_available() {
        return;
    }
    const PROCESSES: usize = 3;
    const INTENTS: usize = 240;
    const SENDS: usize = 3;
    const CLIENTS: usize = 12;
    const OWNERS: usize = 60;
    let started = Instant::now();
    let Setup {
        db,
        store,
        token,
        dir,
        fake,
        config,
    } = match std::env::var("ONEJOB_CHAOS_DATABASE_URL") {
        // A run against a database made and distributed by hand (a Citus
        // coordinator, say); CI runs it on a fresh PostgreSQL database.
        Ok(url) => set_up_on(TestDb::existing(&url), "").await,
        Err(_) => set_up(TestBackend::Postgres, "").await,
    };
    fake.set_default(Behaviour::Delay {
        ms: 30,
        then: Box::new(Behaviour::Answer(json!({"summary": "fake summary"}))),
    });
    let tokens: Arc<Vec<String>> = Arc::new(
        std::iter::once(token)
            .chain(more_owners(&store, OWNERS - 1).await)
            .collect(),
    );
    let url = db.url.as_str().to_owned();
    let ports: Vec<u16> = (0..PROCESSES).map(|_| free_port()).collect();
    let servers: Arc<Mutex<Vec<Option<ServerProcess>>>> = Arc::new(Mutex::new(
        ports
            .iter()
            .enumerate()
            .map(|(i, port)| {
                Some(ServerProcess::spawn_on(
                    dir.path(),
                    &format!("p{i}-0"),
                    &config,
                    &url,
                    *port,
                ))
            })
            .collect(),
    ));
    for port in &ports {
        let mut probe = ServerProcess::probe(*port);
        probe.wait_ready_url().await;
    }

    // Clients: every intent sent SENDS times, to random processes, retried
    // (same key) on connection errors and 503s until acknowledged.
    let tally = Arc::new(Tally::default());
    let history = Arc::new(crate::history::History::default());
    let work: Arc<Mutex<Vec<(String, usize)>>> = Arc::new(Mutex::new(
        (0..INTENTS)
            .flat_map(|i| (0..SENDS).map(move |_| (format!("intent-{i}"), i % OWNERS)))
            .collect(),
    ));
    {
        // Shuffle so duplicates of one intent are spread out in time.
        let mut work = work.lock().unwrap();
        let mut state = 0x9e3779b97f4a7c15u64;
        for i in (1..work.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            work.swap(i, (state % (i as u64 + 1)) as usize);
        }
    }
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (work, tally, tokens, ports) =
                (work.clone(), tally.clone(), tokens.clone(), ports.clone());
            let history = history.clone();
            tokio::spawn(async move {
                let mut pick = c;
                loop {
                    let Some((key, owner)) = work.lock().unwrap().pop() else {
                        return;
                    };
                    let (body, token) = (summarize(&key), &tokens[owner]);
                    loop {
                        pick = pick.wrapping_mul(31).wrapping_add(7);
                        let base = format!("http://127.0.0.1:{}", ports[pick % ports.len()]);
                        tally.requests.fetch_add(1, Ordering::Relaxed);
                        match post(&base, token, &key, &body).await {
                            Err(_) => {
                                history.record(&key, crate::history::Answer::Unanswered);
                                tally.connection_errors.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(response) => match response.status() {
                                StatusCode::CREATED | StatusCode::OK => {
                                    let replayed =
                                        response.headers().contains_key("idempotent-replayed");
                                    let job: Value = response.json().await.unwrap();
                                    history.record(
                                        &key,
                                        crate::history::Answer::Job {
                                            replayed,
                                            body: job.clone(),
                                        },
                                    );
                                    tally
                                        .acknowledged
                                        .lock()
                                        .unwrap()
                                        .entry(key.clone())
                                        .or_default()
                                        .push(job["id"].as_str().unwrap().to_owned());
                                    break;
                                }
                                StatusCode::SERVICE_UNAVAILABLE => {
                                    history.record(&key, crate::history::Answer::Status(503));
                                    tally.unavailable.fetch_add(1, Ordering::Relaxed);
                                }
                                other => {
                                    history.record(
                                        &key,
                                        crate::history::Answer::Status(other.as_u16()),
                                    );
                                    let text = response.text().await.unwrap_or_default();
                                    tally.wrong.lock().unwrap().push(format!("{other}: {text}"));
                                    break;
                                }
                            },
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            })
        })
        .collect();

    // Chaos while the clients work: kill a process (SIGKILL) and start it
    // again, a few times.
    let mut kills = 0;
    let mut generation = 1;
    while work.lock().unwrap().len() > INTENTS * SENDS / 4 && kills < 4 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let victim = kills % PROCESSES;
        {
            let mut servers = servers.lock().unwrap();
            if let Some(server) = servers[victim].as_mut() {
                server.kill();
            }
            servers[victim] = None;
        }
        kills += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let restarted = ServerProcess::spawn_on(
            dir.path(),
            &format!("p{victim}-{generation}"),
            &config,
            &url,
            ports[victim],
        );
        generation += 1;
        servers.lock().unwrap()[victim] = Some(restarted);
    }
    for client in clients {
        client.await.unwrap();
    }
    // Then a rolling restart of all of them, one at a time, by SIGTERM.
    let mut rolled = 0;
    for (i, port) in ports.iter().enumerate() {
        let old = servers.lock().unwrap()[i].take();
        if let Some(mut old) = old {
            old.terminate();
            let status = old.wait_exit(Duration::from_secs(30)).await;
            assert!(status.success(), "p{i} exited {status}:\n{}", old.stderr());
        }
        let mut fresh =
            ServerProcess::spawn_on(dir.path(), &format!("p{i}-rolled"), &config, &url, *port);
        fresh.wait_ready().await;
        servers.lock().unwrap()[i] = Some(fresh);
        rolled += 1;
    }
    // Let every attempt settle: nothing may stay queued or running.
    let rows = wait_for(&store, "attempts left queued or running", |rows| {
        rows.iter()
            .all(|a| !matches!(a.state, AttemptState::Queued | AttemptState::Running))
    })
    .await;

    let acknowledged = tally.acknowledged.lock().unwrap().clone();
    let stored: Vec<(String, String, JobStatus)> = {
        let store = store.clone();
        tokio::task::spawn_blocking(move || {
            jobs::table
                .select((jobs::idempotency_key, jobs::id, jobs::status))
                .load::<(String, onejob::domain::JobId, JobStatus)>(&mut store.conn().unwrap())
                .unwrap()
                .into_iter()
                .map(|(k, id, s)| (k, id.to_string(), s))
                .collect()
        })
        .await
        .unwrap()
    };
    let by_key: HashMap<&str, &str> = stored
        .iter()
        .map(|(k, id, _)| (k.as_str(), id.as_str()))
        .collect();
    let requests = fake.requests();
    let mut seen = HashSet::new();
    let sent_twice: Vec<&str> = requests
        .iter()
        .filter_map(|r| r.header("x-request-id"))
        .filter(|id| !seen.insert(*id))
        .collect();
    let unknown = rows
        .iter()
        .filter(|a| a.state == AttemptState::Unknown)
        .count();
    let succeeded = stored
        .iter()
        .filter(|(_, _, s)| *s == JobStatus::Succeeded)
        .count();
    let figures = format!(
        "chaos: {INTENTS} intents of {OWNERS} owners × {SENDS} sends by {CLIENTS} clients to {PROCESSES} processes in {:.1} s; \
         {} requests ({} connection errors, {} answered 503); {kills} SIGKILLs, {rolled} rolling SIGTERM restarts; \
         {} jobs stored ({succeeded} succeeded), {} attempts ({unknown} unknown after a kill), \
         {} provider calls, {} attempt ids sent twice",
        started.elapsed().as_secs_f64(),
        tally.requests.load(Ordering::Relaxed),
        tally.connection_errors.load(Ordering::Relaxed),
        tally.unavailable.load(Ordering::Relaxed),
        stored.len(),
        rows.len(),
        requests.len(),
        sent_twice.len(),
    );
    let verdict = crate::history::check_run(&history, &requests, &store).await;
    let figures = format!("{figures}\n{}", verdict.line());
    eprintln!("{figures}");
    crate::support::harness::record_figures("chaos", &figures);
    assert!(
        verdict.violations.is_empty(),
        "the history breaks an invariant: {:#?}",
        verdict.violations
    );
    let wrong = tally.wrong.lock().unwrap().clone();
    assert!(
        wrong.is_empty(),
        "answers other than 2xx and 503: {wrong:#?}"
    );
    assert_eq!(acknowledged.len(), INTENTS, "every intent acknowledged");
    assert_eq!(stored.len(), INTENTS, "no duplicate job, none missing");
    for (key, ids) in &acknowledged {
        assert_eq!(ids.len(), SENDS, "{key}: every send acknowledged");
        assert!(
            ids.iter()
                .all(|id| Some(id.as_str()) == by_key.get(key.as_str()).copied()),
            "{key}: {ids:?}"
        );
    }
    assert!(
        sent_twice.is_empty(),
        "attempt ids sent twice: {sent_twice:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(240),
        "bounded in time"
    );
}

/// Item: with `[server] metrics_bind`, a process also serves `/metrics` on
/// that address without a token, and nothing else there; its main address
/// still asks for an admin's token; SIGTERM stops both.
async fn metrics_bind_serves_only_the_metrics_without_a_token(backend: TestBackend) {
    let metrics_port = free_port();
    let metrics_bind = format!("metrics_bind = \"127.0.0.1:{metrics_port}\"");
    // The fake stays up: the job created below is sent to it.
    let Setup {
        db,
        token,
        dir,
        fake: _fake,
        config,
        ..
    } = set_up(backend, &metrics_bind).await;
    let mut server = ServerProcess::spawn(dir.path(), "metrics", &config, db.url.as_str());
    server.wait_ready().await;
    let created = post(&server.base, &token, "counted", &summarize("x"))
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);

    let client = reqwest::Client::new();
    let metrics_base = format!("http://127.0.0.1:{metrics_port}");
    let response = client
        .get(format!("{metrics_base}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    let text = response.text().await.unwrap();
    assert!(
        text.lines().any(|l| l == "onejob_jobs_created_total 1"),
        "the job just created is counted: {text}"
    );
    for path in ["/api/v1/jobs", "/healthz", "/login", "/admin", "/v1/models"] {
        let status = client
            .get(format!("{metrics_base}{path}"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(
            status,
            StatusCode::NOT_FOUND,
            "{path} on the metrics address"
        );
    }
    let main = client
        .get(format!("{}/metrics", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(
        main.status(),
        StatusCode::UNAUTHORIZED,
        "the main address still asks for a token"
    );
    server.terminate();
    assert!(server.wait_exit(Duration::from_secs(20)).await.success());
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", metrics_port)).is_err(),
        "the metrics address closed with the process"
    );
}

/// `[server] async_threads` sizes the runtime the process runs on: with
/// one thread (the default on a 2-core machine) a job is still created,
/// sent and answered; the runtime reports the threads asked for; a count
/// past the ceiling is refused before anything starts.
async fn the_async_runtime_has_the_threads_the_configuration_asks_for(backend: TestBackend) {
    let Setup {
        db,
        token,
        dir,
        fake,
        config,
        ..
    } = set_up(backend, "async_threads = 1").await;
    fake.set_default(Behaviour::Answer(json!({"summary": "one thread"})));
    let mut one = ServerProcess::spawn(dir.path(), "one-thread", &config, db.url.as_str());
    one.wait_ready().await;
    assert!(one.stderr().contains("async_threads=1"), "{}", one.stderr());
    // Created, sent and answered while the request waits for it.
    let created = reqwest::Client::new()
        .post(format!("{}/api/v1/jobs", one.base))
        .bearer_auth(&token)
        .header("Idempotency-Key", "one-thread")
        .header("Prefer", "wait=20")
        .json(&summarize("x"))
        .send()
        .await
        .unwrap();
    let job: Value = created.json().await.unwrap();
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(job["result"]["summary"], "one thread");
    one.terminate();
    assert!(one.wait_exit(Duration::from_secs(20)).await.success());

    let three = write_config(dir.path(), &fake, "async_threads = 3");
    let mut server = ServerProcess::spawn(dir.path(), "three-threads", &three, db.url.as_str());
    server.wait_ready().await;
    assert!(
        server.stderr().contains("async_threads=3"),
        "{}",
        server.stderr()
    );
    server.terminate();
    assert!(server.wait_exit(Duration::from_secs(20)).await.success());

    let too_many = write_config(dir.path(), &fake, "async_threads = 257");
    let mut refused = ServerProcess::spawn(dir.path(), "too-many", &too_many, db.url.as_str());
    assert!(!refused.wait_exit(Duration::from_secs(20)).await.success());
    assert!(
        refused.stderr().contains("server.async_threads")
            && refused.stderr().contains("must be at most 256"),
        "{}",
        refused.stderr()
    );
}

on_both_backends!(
    an_http_only_and_a_worker_only_process_split_the_work,
    a_sigterm_mid_call_lets_the_answer_land_inside_the_grace,
    an_attempt_waiting_out_a_pause_at_sigterm_is_sent_once_after_the_restart,
    metrics_bind_serves_only_the_metrics_without_a_token,
    the_async_runtime_has_the_threads_the_configuration_asks_for,
);
