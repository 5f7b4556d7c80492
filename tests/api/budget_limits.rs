//! Owner budgets hold under concurrency (docs/design.md, "Usage, prices and
//! budgets"): a creation reserves the most its job can cost against the
//! owner's monthly limit in the creating transaction, under the budget
//! row's lock, so however many creators race, in one process or in three
//! on one PostgreSQL database, what is reserved never passes the limit and
//! the limit is reached, not undershot. A replay past the limit still
//! answers with its job; a finished job gives its reservation back.
//!
//! There is no budget API yet: the tests set limits in the store.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use onejob::domain::ledger::{BudgetLimits, Reservation};
use onejob::domain::{Role, UserId};
use onejob::store::budgets::{self as budget_store, BudgetRow};
use onejob::store::schema::{attempts, budget_reservations, budgets, jobs};
use onejob::store::{users as user_store, DbConnection, Store};
use reqwest::StatusCode;
use serde_json::Value;
use tokio::sync::Barrier;

use crate::server_process::ServerProcess;
use crate::support::fake_provider::{
    answer, config_of, strict_task_toml, Behaviour, FakeProvider, ProviderToml, Shape, WAIT,
};
use crate::support::harness::{
    assert_problem, postgres_available, record_figures, spawn_app_with, summarize, test_config,
    TestApp, TestBackend, TestDb, DEFAULT_TEST_PROVIDERS,
};

/// Creators racing at once.
const CREATORS: usize = 32;
/// A limit no test reaches.
const HUGE: i64 = 1_000_000_000_000;

/// The body of job `i`: every one the same length, so every one reserves
/// the same tokens.
fn job_body(i: usize) -> Value {
    summarize(&format!("budget job {i:06}"))
}

/// Gives `owner` a monthly token limit (and no spend limit), keeping what
/// the row already holds.
fn set_token_limit(conn: &mut DbConnection, owner: &UserId, tokens: i64) -> BudgetRow {
    budget_store::set_limits(
        conn,
        owner,
        BudgetLimits {
            spend_micros: None,
            tokens: Some(tokens),
        },
        Reservation::default(),
        onejob::domain::Timestamp::now(),
    )
    .unwrap()
}

/// Runs blocking store code on tokio's blocking pool.
async fn on_store<T: Send + 'static>(
    store: &Store,
    f: impl FnOnce(&mut DbConnection) -> T + Send + 'static,
) -> T {
    let store = store.clone();
    tokio::task::spawn_blocking(move || f(&mut store.conn().unwrap()))
        .await
        .unwrap()
}

fn budget_row(conn: &mut DbConnection, owner: &UserId) -> BudgetRow {
    budget_store::find(conn, owner)
        .unwrap()
        .expect("the owner has a budget row")
}

/// What the owner's stored state is: jobs, attempts, reservation rows and
/// their tokens, and the budget row.
#[derive(Debug)]
struct Stored {
    jobs: i64,
    attempts: i64,
    reservations: i64,
    reserved_sum: i64,
    row: BudgetRow,
}

fn stored(conn: &mut DbConnection, owner: &UserId) -> Stored {
    let owner_text = owner.as_str().to_owned();
    let jobs = jobs::table
        .filter(jobs::owner_id.eq(&owner_text))
        .count()
        .get_result(conn)
        .unwrap();
    let attempts = attempts::table
        .filter(attempts::owner_id.eq(&owner_text))
        .count()
        .get_result(conn)
        .unwrap();
    let tokens: Vec<i64> = budget_reservations::table
        .filter(budget_reservations::owner_id.eq(&owner_text))
        .select(budget_reservations::tokens)
        .load(conn)
        .unwrap();
    Stored {
        jobs,
        attempts,
        reservations: tokens.len() as i64,
        reserved_sum: tokens.iter().sum(),
        row: budget_row(conn, owner),
    }
}

/// Checks a 429 budget refusal of a token limit of `limit` for a job of
/// `r` tokens, while the owner's reservations hold `committed` tokens.
fn assert_token_refusal(body: &Value, limit: i64, committed: i64, r: i64) {
    assert_eq!(body["type"], "/problems/budget-exceeded", "{body:#}");
    assert_eq!(body["status"], 429, "{body:#}");
    assert_eq!(body["limit"], "token_limit", "{body:#}");
    assert_eq!(body["limit_value"], limit, "{body:#}");
    assert_eq!(body["committed"], committed, "{body:#}");
    assert_eq!(body["requested"], r, "{body:#}");
    assert_eq!(body["unit"], "tokens", "{body:#}");
    assert!(
        body["resets_at"].as_str().is_some_and(|s| !s.is_empty()),
        "{body:#}"
    );
}

/// What one creation answered.
#[derive(Debug)]
struct Answer {
    index: usize,
    status: StatusCode,
    content_type: String,
    body: Value,
}

/// `CREATORS` tasks, released together, post jobs `first..first + total`
/// (each under its own key) to the bases in turn; every request is bounded.
async fn race_creators(
    client: &reqwest::Client,
    bases: &[String],
    token: &str,
    first: usize,
    total: usize,
) -> Vec<Answer> {
    let next = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(CREATORS));
    let mut tasks = Vec::new();
    for _ in 0..CREATORS {
        let (client, bases, token) = (client.clone(), bases.to_vec(), token.to_owned());
        let (next, barrier) = (next.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            barrier.wait().await;
            loop {
                let n = next.fetch_add(1, Ordering::SeqCst);
                if n >= total {
                    return answers;
                }
                let index = first + n;
                let base = &bases[n % bases.len()];
                let response = client
                    .post(format!("{base}/api/v1/jobs"))
                    .bearer_auth(&token)
                    .header("Idempotency-Key", format!("budget-{index}"))
                    .json(&job_body(index))
                    .timeout(Duration::from_secs(20))
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("creation {index}: {e}"));
                let status = response.status();
                let content_type = response
                    .headers()
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                let text = response.text().await.unwrap();
                let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
                answers.push(Answer {
                    index,
                    status,
                    content_type,
                    body,
                });
            }
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.extend(
            tokio::time::timeout(Duration::from_secs(60), task)
                .await
                .expect("the creators finish within 60 s")
                .unwrap(),
        );
    }
    answers.sort_by_key(|a| a.index);
    answers
}

/// Checks the answers of a race against a limit of `fits × r` tokens whose
/// first `already` jobs were made before it: exactly the rest of the room
/// is created, every other creation refused for the token limit with the
/// limit reached. Returns (created, refused).
fn check_race(answers: &[Answer], limit: i64, r: i64, fits: i64, already: i64) -> (i64, i64) {
    let mut created = 0;
    let mut refused = 0;
    for answer in answers {
        match answer.status {
            StatusCode::CREATED => {
                assert!(answer.body["id"].is_string(), "{:#}", answer.body);
                created += 1;
            }
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(
                    answer.content_type, "application/problem+json",
                    "creation {}",
                    answer.index
                );
                // Reservations come in steps of R: a refusal with the limit
                // not yet reached would name less than `fits × R`.
                assert_token_refusal(&answer.body, limit, fits * r, r);
                refused += 1;
            }
            other => panic!(
                "creation {} answered {other}, neither 201 nor 429: {:#}",
                answer.index, answer.body
            ),
        }
    }
    assert_eq!(
        created,
        fits - already,
        "the race creates exactly what the budget has room for"
    );
    assert_eq!(created + refused, answers.len() as i64);
    (created, refused)
}

// --- Three processes on one PostgreSQL database -----------------------------

const PROCESSES: usize = 3;
/// Jobs the limit has room for (the measuring job is one of them).
const FITS: i64 = 50;
/// Creations attempted by the racing creators.
const ATTEMPTS: usize = 150;

fn serving_config(dir: &std::path::Path, fake: &FakeProvider) -> std::path::PathBuf {
    let toml = format!(
        r#"
[worker]
concurrency = 0
poll_interval_ms = 50
lease_ms = 20000

{provider}{task}"#,
        provider = ProviderToml::openai("fake", &fake.base_url)
            .timeout_ms(60_000)
            .connect_timeout_ms(None)
            .toml(),
        task = strict_task_toml("summarize", &["fake"], "Summarize: {{ text }}"),
    );
    let path = dir.join("serving.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_creators_in_three_processes_never_pass_the_budget() {
    if !postgres_available() {
        return;
    }
    let db = TestDb::create(TestBackend::Postgres);
    let url = db.url.as_str().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let store = {
        let url = db.url.clone();
        tokio::task::spawn_blocking(move || {
            onejob::startup::open_store(&url, &test_config(DEFAULT_TEST_PROVIDERS)).unwrap()
        })
        .await
        .unwrap()
    };
    let (owner, token): (UserId, String) = on_store(&store, |conn| {
        let (user, token) = user_store::add_user(conn, "spender", Role::User).unwrap();
        (user.id, token.0)
    })
    .await;

    // Nothing is ever sent (worker concurrency 0): no job ends, so no
    // reservation is given back during the race.
    let config = serving_config(dir.path(), &fake);
    let mut servers: Vec<ServerProcess> = (0..PROCESSES)
        .map(|i| ServerProcess::spawn(dir.path(), &format!("budget-{i}"), &config, &url))
        .collect();
    for server in &mut servers {
        server.wait_ready().await;
    }
    let bases: Vec<String> = servers.iter().map(|s| s.base.clone()).collect();
    let client = reqwest::Client::new();

    // R: what one job of this length reserves, under a budget it cannot reach.
    let o = owner.clone();
    on_store(&store, move |conn| set_token_limit(conn, &o, HUGE)).await;
    let response = client
        .post(format!("{}/api/v1/jobs", bases[0]))
        .bearer_auth(&token)
        .header("Idempotency-Key", "budget-measure")
        .json(&job_body(0))
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let o = owner.clone();
    let r = on_store(&store, move |conn| budget_row(conn, &o).reserved_tokens).await;
    assert!(r > 0, "a job reserves some tokens: {r}");

    // The limit has room for FITS jobs; the measuring job holds one.
    let limit = FITS * r;
    let o = owner.clone();
    let row = on_store(&store, move |conn| set_token_limit(conn, &o, limit)).await;
    assert_eq!(row.reserved_tokens, r, "the new limit keeps what is held");

    // A sampler reads the budget row through its own connection while the
    // creators race, and keeps the most it ever saw reserved.
    let stop = Arc::new(AtomicBool::new(false));
    let max_seen = Arc::new(AtomicI64::new(0));
    let samples = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let (stop, max_seen, samples) = (stop.clone(), max_seen.clone(), samples.clone());
        let (url, owner) = (url.clone(), owner.as_str().to_owned());
        std::thread::spawn(move || {
            let mut conn = PgConnection::establish(&url).expect("the sampler connects");
            while !stop.load(Ordering::SeqCst) {
                let reserved: i64 = budgets::table
                    .filter(budgets::owner_id.eq(&owner))
                    .select(budgets::reserved_tokens)
                    .first(&mut conn)
                    .unwrap();
                max_seen.fetch_max(reserved, Ordering::SeqCst);
                samples.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    // The sampler is running before the race starts.
    let deadline = Instant::now() + Duration::from_secs(10);
    while samples.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the sampler took no sample");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let started = Instant::now();
    let answers = race_creators(&client, &bases, &token, 1, ATTEMPTS).await;
    let elapsed = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    sampler.join().expect("the sampler ends");

    let (created, refused) = check_race(&answers, limit, r, FITS, 1);
    let mut created_per_process: HashMap<String, usize> = HashMap::new();
    for answer in &answers {
        if answer.status == StatusCode::CREATED {
            let base = &bases[(answer.index - 1) % PROCESSES];
            *created_per_process.entry(base.clone()).or_default() += 1;
        }
    }
    let max_sampled = max_seen.load(Ordering::SeqCst);
    let samples_taken = samples.load(Ordering::SeqCst);
    let o = owner.clone();
    let after = on_store(&store, move |conn| stored(conn, &o)).await;
    let figures = format!(
        "budget across {PROCESSES} processes: R = {r} tokens, limit = {limit} ({FITS} jobs), \
         {ATTEMPTS} creations by {CREATORS} creators: {created} created (+1 measuring), \
         {refused} refused; max reserved sampled {max_sampled} in {samples_taken} samples; \
         final reserved {}; elapsed {elapsed:?}; created per process {:?}",
        after.row.reserved_tokens,
        created_per_process.values().collect::<Vec<_>>(),
    );
    eprintln!("{figures}");
    record_figures("budget_limits_three_processes", &figures);

    assert_eq!(after.jobs, FITS, "exactly {FITS} jobs exist: {after:?}");
    assert_eq!(after.attempts, FITS, "one attempt per job: {after:?}");
    assert!(
        max_sampled <= limit,
        "reserved never passes the limit: {max_sampled} > {limit}"
    );
    assert!(
        max_sampled >= r,
        "the sampler saw the budget: {max_sampled}"
    );
    assert_eq!(after.row.reserved_tokens, limit, "{after:?}");
    assert_eq!(after.reserved_sum, after.row.reserved_tokens, "{after:?}");
    assert_eq!(
        after.reservations, FITS,
        "one reservation per job: {after:?}"
    );
    assert_eq!(after.row.spent_tokens, 0, "nothing was sent: {after:?}");
    assert_eq!(fake.total_requests(), 0, "nothing was sent");
    for server in &mut servers {
        server.kill();
    }
}

// --- One process, both backends ----------------------------------------------

/// The default test providers, with no worker slot: nothing is sent, so no
/// job ends and every reservation stays held.
async fn app_sending_nothing(backend: TestBackend) -> TestApp {
    let mut config = test_config(DEFAULT_TEST_PROVIDERS);
    config.worker.concurrency = 0;
    spawn_app_with(backend, config).await
}

/// R, measured on bob (a budget he cannot reach, one job): what a job of
/// [`job_body`]'s length reserves. Bob's job is sent only if the app sends.
async fn measure_r_on_bob(app: &TestApp) -> i64 {
    let bob = app.bob.id.clone();
    app.with_conn(move |conn| set_token_limit(conn, &bob, HUGE))
        .await;
    app.create_job(&app.bob.token, "measure", &job_body(0))
        .await;
    let bob = app.bob.id.clone();
    let r = app
        .with_conn(move |conn| budget_row(conn, &bob).reserved_tokens)
        .await;
    assert!(r > 0, "a job reserves some tokens: {r}");
    r
}

async fn a_replay_past_the_limit_still_answers_200(backend: TestBackend) {
    let app = app_sending_nothing(backend).await;
    let r = measure_r_on_bob(&app).await;
    let alice = app.alice.id.clone();
    app.with_conn(move |conn| set_token_limit(conn, &alice, r))
        .await;

    let created = app.post_job(&app.alice.token, "job-a", &job_body(1)).await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let job_a: Value = created.json().await.unwrap();

    let refused = app.post_job(&app.alice.token, "job-b", &job_body(2)).await;
    let body = assert_problem(refused, StatusCode::TOO_MANY_REQUESTS, "budget-exceeded").await;
    assert_token_refusal(&body, r, r, r);

    let alice = app.alice.id.clone();
    let before = app.with_conn(move |conn| stored(conn, &alice)).await;

    let replay = app.post_job(&app.alice.token, "job-a", &job_body(1)).await;
    assert_eq!(replay.status(), StatusCode::OK, "a replay is not refused");
    assert_eq!(
        replay
            .headers()
            .get("Idempotent-Replayed")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    let replayed: Value = replay.json().await.unwrap();
    assert_eq!(replayed["id"], job_a["id"], "the same job");

    let alice = app.alice.id.clone();
    let after = app.with_conn(move |conn| stored(conn, &alice)).await;
    assert_eq!(
        (after.jobs, after.attempts, after.reservations),
        (1, 1, 1),
        "nothing new stored: {after:?}"
    );
    assert_eq!(after.row.reserved_tokens, r, "{after:?}");
    assert_eq!(after.reserved_sum, r, "{after:?}");
    assert_eq!(after.row, before.row, "the replay left the budget alone");
}

async fn concurrent_creators_on_one_process_never_pass_the_budget(backend: TestBackend) {
    const FITS: i64 = 10;
    const ATTEMPTS: usize = 40;
    let app = app_sending_nothing(backend).await;
    let r = measure_r_on_bob(&app).await;
    let limit = FITS * r;
    let alice = app.alice.id.clone();
    app.with_conn(move |conn| set_token_limit(conn, &alice, limit))
        .await;

    let started = Instant::now();
    let answers = race_creators(
        &app.client,
        std::slice::from_ref(&app.address),
        &app.alice.token,
        1,
        ATTEMPTS,
    )
    .await;
    let elapsed = started.elapsed();
    let (created, refused) = check_race(&answers, limit, r, FITS, 0);
    eprintln!(
        "budget in one process ({backend:?}): R = {r}, limit = {limit} ({FITS} jobs), \
         {ATTEMPTS} creations by {CREATORS} creators: {created} created, {refused} refused \
         in {elapsed:?}"
    );

    let alice = app.alice.id.clone();
    let after = app.with_conn(move |conn| stored(conn, &alice)).await;
    assert_eq!(after.jobs, FITS, "{after:?}");
    assert_eq!(after.attempts, FITS, "{after:?}");
    assert_eq!(after.reservations, FITS, "{after:?}");
    assert_eq!(after.row.reserved_tokens, limit, "{after:?}");
    assert_eq!(after.reserved_sum, limit, "{after:?}");
}

async fn a_finished_job_gives_its_reservation_back(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    // A soft timeout no held request reaches: a held job stays running.
    let toml = [
        ProviderToml::openai("fake", &fake.base_url)
            .timeout_ms(60_000)
            .toml(),
        strict_task_toml("summarize", &["fake"], "Summarize: {{ text }}"),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;

    // R, on bob's job, held by the provider until measured.
    fake.push(Behaviour::Hold);
    let r = measure_r_on_bob(&app).await;
    let bob_attempt = fake.wait_held_count(1).await.remove(0);
    fake.release(&bob_attempt, answer("fake summary"));
    let bob = app.bob.id.clone();
    let bob_job = app
        .with_conn(move |conn| onejob::store::jobs::find_by_key(conn, &bob, "measure"))
        .await
        .unwrap()
        .expect("bob's job");
    app.wait_for_status(bob_job.id.as_str(), "succeeded", WAIT)
        .await;

    // Room for one job while it is held, and for one more once it ends:
    // what a finished job spent is far less than it reserved.
    let limit = 2 * r - 1;
    let alice = app.alice.id.clone();
    app.with_conn(move |conn| set_token_limit(conn, &alice, limit))
        .await;

    fake.push(Behaviour::Hold);
    let job_a = app
        .create_job(&app.alice.token, "job-a", &job_body(1))
        .await;
    let held = fake.wait_held_count(2).await;
    let attempt_a = held[1].clone();
    let refused = app.post_job(&app.alice.token, "job-b", &job_body(2)).await;
    let body = assert_problem(refused, StatusCode::TOO_MANY_REQUESTS, "budget-exceeded").await;
    assert_token_refusal(&body, limit, r, r);
    let alice = app.alice.id.clone();
    let while_held = app.with_conn(move |conn| stored(conn, &alice)).await;
    assert_eq!(while_held.row.reserved_tokens, r, "{while_held:?}");
    assert_eq!(while_held.reservations, 1, "{while_held:?}");

    fake.release(&attempt_a, answer("fake summary"));
    app.wait_for_status(&job_a, "succeeded", WAIT).await;

    let (alice, a) = (app.alice.id.clone(), job_a.clone());
    let (after, a_reservations) = app
        .with_conn(move |conn| {
            let held: i64 = budget_reservations::table
                .filter(budget_reservations::job_id.eq(&a))
                .count()
                .get_result(conn)
                .unwrap();
            (stored(conn, &alice), held)
        })
        .await;
    eprintln!(
        "budget released ({backend:?}): R = {r}, limit = {limit}, after job A: reserved {} \
         spent {} tokens",
        after.row.reserved_tokens, after.row.spent_tokens
    );
    assert_eq!(a_reservations, 0, "A's reservation is gone: {after:?}");
    assert_eq!(after.reservations, 0, "{after:?}");
    assert_eq!(after.row.reserved_tokens, 0, "{after:?}");
    assert!(
        after.row.spent_tokens > 0,
        "A's tokens were recorded: {after:?}"
    );
    assert!(
        after.row.spent_tokens < r,
        "A spent less than it had reserved: {after:?}"
    );

    // The key the budget refused made nothing: now it creates its job.
    let accepted = app.post_job(&app.alice.token, "job-b", &job_body(2)).await;
    assert_eq!(
        accepted.status(),
        StatusCode::CREATED,
        "room again once A ended: {}",
        accepted.text().await.unwrap_or_default()
    );
    let alice = app.alice.id.clone();
    let last = app.with_conn(move |conn| stored(conn, &alice)).await;
    assert_eq!(last.jobs, 2, "{last:?}");
}

on_both_backends!(
    a_replay_past_the_limit_still_answers_200,
    concurrent_creators_on_one_process_never_pass_the_budget,
    a_finished_job_gives_its_reservation_back,
);
