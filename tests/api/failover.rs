//! Failover to a synchronous standby (PostgreSQL only): a primary and its
//! streaming standby on this machine (`support::standby`), onejob (a real
//! `onejob serve`) on a multi-host URL that names both, with
//! `target_session_attrs=read-write`. Under load (clients creating jobs
//! under idempotency keys and retrying 503s with the same key, some
//! waiting for the job with `Prefer: wait`; the worker sending each job to
//! a fake provider), the standby falls behind for a moment, the primary is
//! killed (`kill -9` of its postmaster) and the standby promoted. Then:
//!
//! - every job a client was acknowledged (201 or 200) is on the new
//!   primary, under the id it was given, and a retry of its key finds it;
//! - no attempt id reached the provider twice, nor any key's input;
//! - no key has two jobs, and the history checker finds the run
//!   consistent;
//! - every answer in the meantime was a 503 with `Retry-After`: no other
//!   status, and no request left without an answer (onejob never went
//!   down, so a client's transport error would be a fault; the clients
//!   drop idle connections before the server would, so a keep-alive race
//!   cannot produce one);
//! - creations succeed again within 10 s of the promotion;
//! - the old primary, brought back as the documented procedure says
//!   (`pg_rewind`, then a standby of the new primary), takes no write:
//!   it is read-only, onejob opens no session on it although the URL names
//!   it first, and its rows become exactly the new primary's. What it held
//!   that the new primary never had (commits whose answers never came) is
//!   looked at first, read-only, and none of it was acknowledged.
//!
//! The guards it relies on, each of which, removed, fails it:
//!
//! - the standby is synchronous (`synchronous_standby_names` names it;
//!   onejob's sessions keep `synchronous_commit = on`): a commit is
//!   answered only once the standby has it, so what the standby lacks when
//!   the primary dies was never acknowledged, and its request gets a 503
//!   and is retried onto the new primary under the same key. Without it,
//!   jobs acknowledged while the standby was behind are missing, their
//!   keys' retries make second jobs, and claimed attempts are sent again;
//! - `target_session_attrs=read-write`: libpq passes over a host that does
//!   not take writes. Without it onejob connects to the standby while the
//!   primary is down, and its writes there fail with 500s.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use futures::StreamExt;
use onejob::store::schema::{attempts, jobs};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::history::{Answer, History};
use crate::server_process::ServerProcess;
use crate::support::fake_provider::{strict_task_toml, Behaviour, FakeProvider, Shape};
use crate::support::harness::{record_figures, summarize, test_config, DEFAULT_TEST_PROVIDERS};
use crate::support::standby::{self, Node, Pair, Role};

const DATABASE: &str = "onejob";
const CLIENTS: usize = 6;
/// How long the primary's WAL sender is stopped before the primary dies.
const STANDBY_BEHIND: Duration = Duration::from_millis(300);
/// How long the failover takes to notice the primary is gone and promote:
/// longer than onejob's pool wait, so that requests meanwhile are answered.
const DETECTION: Duration = Duration::from_millis(1500);
/// The most a client retries one key before the test fails.
const CLIENT_PATIENCE: Duration = Duration::from_secs(20);

/// One acknowledged creation, as its client saw it.
#[derive(Clone, Debug)]
struct Ack {
    key: String,
    id: String,
    at: Instant,
}

/// What the clients were answered.
#[derive(Default)]
struct Answers {
    acknowledged: Mutex<Vec<Ack>>,
    /// 503s with `Retry-After` and a problem+json body, and when each came.
    unavailable: Mutex<Vec<Instant>>,
    /// Anything else: another status, a 503 without `Retry-After`, no
    /// answer at all.
    wrong: Mutex<Vec<String>>,
    /// Answers to `Prefer: wait` that brought the job finished.
    waited_finished: AtomicUsize,
}

impl Answers {
    fn acks(&self) -> Vec<Ack> {
        self.acknowledged.lock().unwrap().clone()
    }

    fn wrong(&self, what: String) {
        self.wrong.lock().unwrap().push(what);
    }
}

/// A client of onejob: one HTTP connection pool, and what it was answered.
#[derive(Clone)]
struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
    answers: Arc<Answers>,
    history: Arc<History>,
}

impl Client {
    fn new(base: &str, token: &str) -> Self {
        Self {
            // Idle connections are dropped before onejob's keep-alive (5 s)
            // would close them: reusing one the server is closing would be
            // a transport error of the client's own making.
            http: reqwest::Client::builder()
                .pool_idle_timeout(Duration::from_secs(2))
                .build()
                .unwrap(),
            base: base.to_owned(),
            token: token.to_owned(),
            answers: Arc::default(),
            history: Arc::default(),
        }
    }

    /// Creates the job for `key` as a careful client does: a 503 is retried
    /// with the same key (sooner than `Retry-After` asks, which only makes
    /// the time to recover measured finer), until acknowledged.
    async fn create(&self, key: &str, wait: bool) -> Option<Ack> {
        let deadline = Instant::now() + CLIENT_PATIENCE;
        loop {
            if let Some(done) = self.try_create(key, wait).await {
                return done;
            }
            if Instant::now() > deadline {
                self.answers
                    .wrong(format!("{key}: not acknowledged in {CLIENT_PATIENCE:?}"));
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// One request: `Some` when the key is settled (acknowledged, or
    /// answered with a status no retry cures), `None` to retry.
    async fn try_create(&self, key: &str, wait: bool) -> Option<Option<Ack>> {
        let mut request = self
            .http
            .post(format!("{}/api/v1/jobs", self.base))
            .bearer_auth(&self.token)
            .header("Idempotency-Key", key)
            .json(&summarize(key));
        if wait {
            request = request.header("Prefer", "wait=2");
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => {
                self.history.record(key, Answer::Unanswered);
                self.answers.wrong(format!("{key}: no answer: {error}"));
                return None;
            }
        };
        let status = response.status();
        match status {
            StatusCode::CREATED | StatusCode::OK => {
                let replayed = response.headers().contains_key("idempotent-replayed");
                let job: Value = match response.json().await {
                    Ok(job) => job,
                    Err(error) => {
                        self.history.record(key, Answer::Unanswered);
                        self.answers
                            .wrong(format!("{key}: a {status} cut short: {error}"));
                        return None;
                    }
                };
                if wait && job["status"] == "succeeded" {
                    self.answers.waited_finished.fetch_add(1, Ordering::Relaxed);
                }
                let ack = Ack {
                    key: key.to_owned(),
                    id: job["id"].as_str().unwrap().to_owned(),
                    at: Instant::now(),
                };
                self.history.record(
                    key,
                    Answer::Job {
                        replayed,
                        body: job,
                    },
                );
                self.answers.acknowledged.lock().unwrap().push(ack.clone());
                Some(Some(ack))
            }
            StatusCode::SERVICE_UNAVAILABLE => {
                self.history.record(key, Answer::Status(503));
                let retry_after = response.headers().contains_key("retry-after");
                let problem = response
                    .headers()
                    .get("content-type")
                    .is_some_and(|t| t == "application/problem+json");
                if retry_after && problem {
                    self.answers
                        .unavailable
                        .lock()
                        .unwrap()
                        .push(Instant::now());
                } else {
                    self.answers.wrong(format!(
                        "{key}: a 503 without Retry-After or problem+json: {:?}",
                        response.headers()
                    ));
                }
                None
            }
            other => {
                self.history.record(key, Answer::Status(other.as_u16()));
                let body = response.text().await.unwrap_or_default();
                self.answers.wrong(format!("{key}: {other}: {body}"));
                Some(None)
            }
        }
    }
}

/// Client `n` creates jobs `c{n}-0`, `c{n}-1`, … one after another until
/// `stop`; odd clients wait for each (`Prefer: wait=2`).
async fn keep_creating(client: Client, n: usize, stop: Arc<AtomicBool>) {
    for i in 0.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        client.create(&format!("c{n}-{i}"), n % 2 == 1).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The configuration file of the onejob process: one fake provider, a
/// short pool wait and lock wait (a 503 within a second), a lease that
/// outlasts both.
fn write_config(dir: &Path, fake: &FakeProvider) -> std::path::PathBuf {
    let toml = format!(
        r#"
[database]
pool_size = 8
pool_timeout_ms = 1000
postgres_lock_timeout_ms = 1000
sqlite_busy_timeout_ms = 1000

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
timeout_ms = 3000
connect_timeout_ms = 1000
late_result_ms = 5000
{task}"#,
        base = fake.base_url,
        task = strict_task_toml("summarize", &["fake"], "Summarize: {{ text }}"),
    );
    let path = dir.join("onejob.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// Migrates the database through `url` (the store as onejob opens it)
/// and makes a user; its API token.
async fn seed(url: &str) -> String {
    let url = onejob::store::DatabaseUrl::parse(url).unwrap();
    tokio::task::spawn_blocking(move || {
        let store =
            onejob::startup::open_store(&url, &test_config(DEFAULT_TEST_PROVIDERS)).unwrap();
        let (_, token) = onejob::store::users::add_user(
            &mut store.conn().unwrap(),
            "client",
            onejob::domain::Role::User,
        )
        .unwrap();
        token.0
    })
    .await
    .unwrap()
}

/// Every job on `node`: id → key.
fn jobs_on(node: &Node) -> HashMap<String, String> {
    jobs::table
        .select((jobs::id, jobs::idempotency_key))
        .load::<(String, String)>(&mut node.connect(DATABASE))
        .unwrap()
        .into_iter()
        .collect()
}

/// Keys with more than one job on `node`.
fn keys_with_two_jobs(node: &Node) -> Vec<String> {
    let mut count: HashMap<(String, String), usize> = HashMap::new();
    for owner_key in jobs::table
        .select((jobs::owner_id, jobs::idempotency_key))
        .load::<(String, String)>(&mut node.connect(DATABASE))
        .unwrap()
    {
        *count.entry(owner_key).or_default() += 1;
    }
    count
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|((_, key), _)| key)
        .collect()
}

/// Waits until no attempt on `node` is queued or running; the ids of
/// those that ended `unknown`.
async fn wait_until_settled(node: &Node) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let states: Vec<(String, String)> = tokio::task::block_in_place(|| {
            attempts::table
                .select((attempts::id, attempts::state))
                .load(&mut node.connect(DATABASE))
                .unwrap()
        });
        let unsettled = states
            .iter()
            .filter(|(_, s)| s == "queued" || s == "running")
            .count();
        if unsettled == 0 {
            return states
                .into_iter()
                .filter(|(_, s)| s == "unknown")
                .map(|(id, _)| id)
                .collect();
        }
        assert!(
            Instant::now() < deadline,
            "{unsettled} attempts still queued or running 20 s after the load"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The key each provider request was for (its prompt is `Summarize:
/// KEY`), and how many requests each attempt id and key got.
fn sends(fake: &FakeProvider) -> (usize, Vec<String>, Vec<String>) {
    let mut by_attempt: HashMap<String, usize> = HashMap::new();
    let mut by_key: HashMap<String, usize> = HashMap::new();
    let mut total = 0;
    for request in fake.requests() {
        let Some(id) = request.header("x-request-id") else {
            continue;
        };
        if id.starts_with("qualify-") {
            continue;
        }
        total += 1;
        *by_attempt.entry(id.to_owned()).or_default() += 1;
        let body = request.body.to_string();
        let key = body
            .split("Summarize: ")
            .nth(1)
            .map(|rest| {
                rest.chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect::<String>()
            })
            .unwrap_or_default();
        *by_key.entry(key).or_default() += 1;
    }
    let twice = |counts: HashMap<String, usize>| -> Vec<String> {
        counts
            .into_iter()
            .filter(|(_, n)| *n > 1)
            .map(|(k, _)| k)
            .collect()
    };
    (total, twice(by_attempt), twice(by_key))
}

/// When each step of the failover happened.
struct Failover {
    stalled: Instant,
    killed: Instant,
    promoted: Instant,
}

/// The standby falls behind (the primary's WAL sender stops), then the
/// primary dies with it: `kill -9` of the postmaster and of the stopped
/// sender, so what the sender held back never leaves. After a detection
/// delay the standby is promoted.
async fn fail_over(pair: &mut Pair) -> Failover {
    let sender = tokio::task::block_in_place(|| pair.node1.wal_sender_pid(pair.node2.name));
    standby::signal(sender, "STOP");
    let stalled = Instant::now();
    tokio::time::sleep(STANDBY_BEHIND).await;
    tokio::task::block_in_place(|| pair.node1.kill_postmaster());
    standby::signal(sender, "KILL");
    let killed = Instant::now();
    tokio::time::sleep(DETECTION).await;
    tokio::task::block_in_place(|| pair.node2.promote());
    Failover {
        stalled,
        killed,
        promoted: Instant::now(),
    }
}

/// What the old primary held that the new one never had, read with it
/// started as a standby of no one (read-only, replaying only its own WAL):
/// those jobs' ids and keys. Then it is stopped.
fn only_on_the_old_primary(pair: &mut Pair) -> Vec<(String, String)> {
    pair.node1.wait_until_gone();
    pair.node1.start(Role::Standby { upstream: None });
    let old = jobs_on(&pair.node1);
    pair.node1.stop();
    let new = jobs_on(&pair.node2);
    old.into_iter()
        .filter(|(id, _)| !new.contains_key(id))
        .collect()
}

/// The old primary comes back as the new primary's synchronous standby:
/// rewound to the new primary's history first. What pg_rewind said.
fn bring_back_as_standby(pair: &mut Pair) -> String {
    // pg_rewind reads the source's timeline from its control file, which a
    // checkpoint brings up to date after a promotion.
    pair.node2.execute("postgres", "CHECKPOINT");
    let rewound = pair.node1.rewind_from(&pair.node2);
    pair.node1.start(Role::Standby {
        upstream: Some(pair.node2.port),
    });
    pair.node2.make_synchronous(pair.node1.name);
    rewound
}

/// A boolean SQL expression, evaluated on `node`'s `postgres` database.
fn holds(node: &Node, sql: &str) -> bool {
    diesel::select(diesel::dsl::sql::<diesel::sql_types::Bool>(sql))
        .get_result(&mut node.connect("postgres"))
        .unwrap_or_else(|e| panic!("{sql} on {}: {e}", node.name))
}

/// A count, evaluated on `node`'s `postgres` database.
fn count(node: &Node, sql: &str) -> i64 {
    diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(sql))
        .get_result(&mut node.connect("postgres"))
        .unwrap_or_else(|e| panic!("{sql} on {}: {e}", node.name))
}

/// Waits until `standby` has replayed all the WAL `primary` has written.
fn wait_for_replay(primary: &Node, standby: &Node) {
    let lsn: String = diesel::select(diesel::dsl::sql::<diesel::sql_types::Text>(
        "pg_current_wal_lsn()::text",
    ))
    .get_result(&mut primary.connect("postgres"))
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !holds(
        standby,
        &format!("pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn"),
    ) {
        assert!(
            Instant::now() < deadline,
            "{} never replayed {lsn}",
            standby.name
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// onejob's sessions (its URL names it `onejob`) on `node`.
fn onejob_sessions(node: &Node) -> i64 {
    count(
        node,
        "(SELECT count(*) FROM pg_stat_activity WHERE application_name = 'onejob')",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_primary_fails_over_to_its_synchronous_standby_losing_and_repeating_nothing() {
    let Some(tools) = standby::tools() else {
        return;
    };
    let started = Instant::now();
    let mut pair = tokio::task::block_in_place(|| Pair::start(&tools, DATABASE));
    let set_up_in = started.elapsed();
    // The old primary first: after the failover it is the host that does
    // not take writes, and libpq must pass over it.
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{DATABASE}\
         ?target_session_attrs=read-write&application_name=onejob",
        pair.node1.port, pair.node2.port
    );
    let token = seed(&url).await;
    let fake = FakeProvider::start(Shape::OpenAi).await;
    fake.set_default(Behaviour::Delay {
        ms: 30,
        then: Box::new(Behaviour::Answer(json!({"summary": "fake summary"}))),
    });
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &fake);
    let mut server = ServerProcess::spawn(dir.path(), "onejob", &config, &url);
    server.wait_ready().await;
    let log = format!("{}{}", server.stdout(), server.stderr());
    assert!(
        log.contains(&url),
        "onejob names the database by its whole URL:\n{log}"
    );

    // The load: creations, their sends, waits.
    let client = Client::new(&server.base, &token);
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|n| tokio::spawn(keep_creating(client.clone(), n, stop.clone())))
        .collect();
    let warm = Instant::now() + Duration::from_secs(10);
    while client.answers.acks().len() < 40 || fake.total_requests() < 20 {
        assert!(Instant::now() < warm, "the load never got going");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let acked_before = client.answers.acks().len();
    let failover = fail_over(&mut pair).await;
    let recovery_deadline = failover.promoted + Duration::from_secs(10);
    let recovered_at = loop {
        if let Some(first) = client
            .answers
            .acks()
            .iter()
            .map(|ack| ack.at)
            .filter(|at| *at > failover.promoted)
            .min()
        {
            break first;
        }
        assert!(
            Instant::now() < recovery_deadline,
            "no creation succeeded within 10 s of the promotion:\n{}",
            server.stderr()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // The load goes on a while on the new primary, then stops.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        tokio::time::timeout(CLIENT_PATIENCE + Duration::from_secs(5), c)
            .await
            .expect("a client finished its last key")
            .unwrap();
    }
    let unknown = wait_until_settled(&pair.node2).await;
    let run = Run {
        client,
        acked_before,
        failover,
        recovered_at,
        unknown,
    };
    let new_primary = check_the_new_primary(&pair, &run, &fake, &url).await;
    let old_primary = check_the_old_primary(&mut pair, &run).await;
    let ready = reqwest::get(format!("{}/readyz", server.base))
        .await
        .unwrap();
    assert_eq!(ready.status(), StatusCode::OK, "onejob serves on");
    assert!(!server.stderr().contains("panicked"), "{}", server.stderr());
    let figures = format!(
        "failover: a primary and its synchronous standby set up in {:.1} s; {CLIENTS} clients \
         creating under idempotency keys (half waiting, Prefer: wait=2), the worker sending to a fake provider\n\
         {new_primary}\n{old_primary}\nwhole test {:.1} s",
        set_up_in.as_secs_f64(),
        started.elapsed().as_secs_f64(),
    );
    eprintln!("{figures}");
    record_figures("failover", &figures);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "bounded in time"
    );
}

/// What the load and the failover left to check.
struct Run {
    client: Client,
    acked_before: usize,
    failover: Failover,
    recovered_at: Instant,
    /// Attempts that ended `unknown`.
    unknown: Vec<String>,
}

/// The new primary holds every acknowledged job once, nothing was sent
/// twice, and every answer in the meantime was a 503 with `Retry-After`.
/// Its figures.
async fn check_the_new_primary(pair: &Pair, run: &Run, fake: &FakeProvider, url: &str) -> String {
    let answers = &run.client.answers;
    let acks = answers.acks();
    let stored = tokio::task::block_in_place(|| jobs_on(&pair.node2));
    let lost: Vec<&Ack> = acks
        .iter()
        .filter(|ack| stored.get(&ack.id) != Some(&ack.key))
        .collect();
    let doubled = tokio::task::block_in_place(|| keys_with_two_jobs(&pair.node2));
    let (sent, attempts_twice, keys_twice) = sends(fake);
    let succeeded = tokio::task::block_in_place(|| {
        jobs::table
            .filter(jobs::status.eq("succeeded"))
            .count()
            .get_result::<i64>(&mut pair.node2.connect(DATABASE))
            .unwrap()
    });
    // Each acknowledged key, sent again: its job, as a replay.
    let replays: Vec<(Ack, Option<Ack>)> = futures::stream::iter(acks.clone())
        .map(|ack| {
            let client = run.client.clone();
            async move {
                let replay = client.create(&ack.key, false).await;
                (ack, replay)
            }
        })
        .buffer_unordered(4)
        .collect()
        .await;
    let not_replayed: Vec<_> = replays
        .iter()
        .filter(|(ack, replay)| replay.as_ref().map(|r| &r.id) != Some(&ack.id))
        .map(|(ack, replay)| format!("{}: {replay:?}, acknowledged as {}", ack.key, ack.id))
        .collect();
    let store = {
        let url = onejob::store::DatabaseUrl::parse(url).unwrap();
        tokio::task::spawn_blocking(move || {
            onejob::store::Store::connect(&url, &test_config(DEFAULT_TEST_PROVIDERS).database)
                .unwrap()
        })
        .await
        .unwrap()
    };
    let verdict = crate::history::check_run(&run.client.history, &fake.requests(), &store).await;
    let unavailable = answers.unavailable.lock().unwrap().clone();
    let wrong = answers.wrong.lock().unwrap().clone();
    let Failover {
        stalled,
        killed,
        promoted,
    } = run.failover;
    let acked_while_behind = acks
        .iter()
        .filter(|ack| ack.at >= stalled && ack.at < killed)
        .count();
    let receipts: HashSet<String> = fake.request_ids().into_iter().collect();
    let unknown_unsent = run
        .unknown
        .iter()
        .filter(|id| !receipts.contains(*id))
        .count();
    let late_503s = unavailable
        .iter()
        .filter(|at| **at > run.recovered_at)
        .count();
    let figures = format!(
        "new primary: {} jobs acknowledged ({} before the failover, {acked_while_behind} while the standby was \
         {} ms behind), {} of them missing; {} keys with two jobs; {} of {} acknowledged keys, sent again, \
         not answered with their job; {sent} provider calls, {} attempt ids and {} keys sent twice; \
         {succeeded} of {} jobs succeeded, {} attempts unknown (a lease ran out on an attempt recorded as sent), {unknown_unsent} of them never \
         reached the provider\n\
         answers meanwhile: {} × 503 with Retry-After ({late_503s} of them after creations succeeded again), \
         {} other answers or requests left unanswered; {} waited answers brought the job finished\n\
         time: primary killed {:.0} ms after the standby fell behind, promoted {:.0} ms after the kill; \
         creations succeeded again {:.0} ms after the promotion ({:.0} ms after the kill)\n{}",
        acks.len(),
        run.acked_before,
        STANDBY_BEHIND.as_millis(),
        lost.len(),
        doubled.len(),
        not_replayed.len(),
        acks.len(),
        attempts_twice.len(),
        keys_twice.len(),
        stored.len(),
        run.unknown.len(),
        unavailable.len(),
        wrong.len(),
        answers.waited_finished.load(Ordering::Relaxed),
        (killed - stalled).as_secs_f64() * 1000.0,
        (promoted - killed).as_secs_f64() * 1000.0,
        (run.recovered_at - promoted).as_secs_f64() * 1000.0,
        (run.recovered_at - killed).as_secs_f64() * 1000.0,
        verdict.line(),
    );
    eprintln!("{figures}");
    assert!(
        lost.is_empty(),
        "acknowledged jobs missing on the new primary: {lost:#?}"
    );
    assert!(doubled.is_empty(), "keys with two jobs: {doubled:?}");
    assert!(not_replayed.is_empty(), "{not_replayed:#?}");
    assert!(
        attempts_twice.is_empty(),
        "attempt ids sent twice: {attempts_twice:?}"
    );
    assert!(keys_twice.is_empty(), "keys sent twice: {keys_twice:?}");
    assert!(
        wrong.is_empty(),
        "answers other than 2xx and 503 with Retry-After: {wrong:#?}"
    );
    assert!(
        !unavailable.is_empty(),
        "the failover was answered with 503s"
    );
    assert!(
        verdict.violations.is_empty(),
        "the history breaks an invariant: {:#?}",
        verdict.violations
    );
    assert!(run.recovered_at - promoted < Duration::from_secs(10));
    figures
}

/// The old primary held nothing acknowledged that the new one lacks,
/// and, brought back as a standby, takes no write: read-only, no session
/// of onejob's, its rows the new primary's. Its figures.
async fn check_the_old_primary(pair: &mut Pair, run: &Run) -> String {
    let only_old = tokio::task::block_in_place(|| only_on_the_old_primary(pair));
    let new_jobs = tokio::task::block_in_place(|| jobs_on(&pair.node2));
    let keys_on_new: HashSet<&String> = new_jobs.values().collect();
    let acked: HashSet<String> = run
        .client
        .answers
        .acks()
        .into_iter()
        .map(|a| a.id)
        .collect();
    assert!(
        only_old.iter().all(|(_, key)| keys_on_new.contains(key)),
        "a key only the old primary had was never retried onto the new one: {only_old:?}"
    );
    let acked_only_old: Vec<_> = only_old
        .iter()
        .filter(|(id, _)| acked.contains(id))
        .collect();
    assert!(
        acked_only_old.is_empty(),
        "acknowledged, yet only on the old primary: {acked_only_old:?}"
    );
    let rewound = tokio::task::block_in_place(|| bring_back_as_standby(pair));
    // onejob goes on writing, the old primary first in its URL.
    for i in 0..10 {
        let ack = run.client.create(&format!("after-{i}"), false).await;
        assert!(
            ack.is_some(),
            "a creation with the old primary back as a standby"
        );
    }
    let old = &pair.node1;
    let new = &pair.node2;
    tokio::task::block_in_place(|| wait_for_replay(new, old));
    let in_recovery: bool = tokio::task::block_in_place(|| holds(old, "pg_is_in_recovery()"));
    let (sessions_old, sessions_new) =
        tokio::task::block_in_place(|| (onejob_sessions(old), onejob_sessions(new)));
    let refused = tokio::task::block_in_place(|| {
        use diesel::connection::SimpleConnection;
        old.connect(DATABASE)
            .batch_execute("UPDATE jobs SET version = version WHERE false")
            .unwrap_err()
            .to_string()
    });
    let (rows_old, rows_new) = tokio::task::block_in_place(|| (jobs_on(old), jobs_on(new)));
    let figures = format!(
        "old primary: {} jobs only it held (commits whose answers never came; {} of them acknowledged), \
         each key retried onto the new primary; pg_rewind: {rewound}; back as the new primary's synchronous \
         standby: in recovery {in_recovery}, onejob sessions on it {sessions_old} (on the new primary \
         {sessions_new}), a write on it refused ({refused}), its jobs the new primary's {} of {}",
        only_old.len(),
        acked_only_old.len(),
        rows_old.iter().filter(|(id, key)| rows_new.get(*id) == Some(key)).count(),
        rows_new.len(),
    );
    eprintln!("{figures}");
    assert!(in_recovery, "the old primary is a standby");
    assert_eq!(
        sessions_old, 0,
        "onejob opened no session on the old primary"
    );
    assert!(sessions_new > 0, "onejob's sessions are on the new primary");
    assert!(refused.contains("read-only"), "{refused}");
    assert_eq!(
        rows_old, rows_new,
        "the old primary holds the new primary's rows, and nothing else"
    );
    figures
}
