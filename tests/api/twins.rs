//! Twins in flight: requests under a key this process is already creating a
//! job for wait for that creation and answer as it ended: from its job, or
//! with its 503 when the database was busy. (A twin whose leader ends with
//! nothing to hand on boards again: `app::singleflight`' unit tests.)

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use reqwest::StatusCode;
use serde_json::Value;

use crate::support::harness::{
    postgres_available, spawn_app, spawn_app_with, spawn_recorded, summarize, test_config, TestApp,
    TestBackend, DEFAULT_TEST_PROVIDERS,
};
use crate::support::statement_log::{Sent, StatementLog};

/// Another session holds off every job insert (SQLite's write lock; on
/// PostgreSQL a SHARE lock on `jobs`, which inserts wait for) until the
/// returned sender is used or dropped. Returns once the lock is held.
fn hold_job_inserts(app: &TestApp) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (release, released) = mpsc::channel::<()>();
    let (held, locked) = mpsc::channel::<()>();
    let store = app.store.clone();
    let holder = std::thread::spawn(move || {
        let mut conn = store.conn().unwrap();
        match &mut *conn {
            onejob::store::DbConnection::Sqlite(c) => c.batch_execute("BEGIN IMMEDIATE").unwrap(),
            onejob::store::DbConnection::Postgresql(c) => c
                .batch_execute("BEGIN; LOCK TABLE jobs IN SHARE MODE")
                .unwrap(),
        }
        held.send(()).unwrap();
        let _ = released.recv();
        conn.batch_execute("ROLLBACK").unwrap();
    });
    locked.recv().unwrap();
    (release, holder)
}

/// Posts a job under `key` from Alice: its status, `Idempotent-Replayed`
/// header and body.
async fn post(app: Arc<TestApp>, key: &'static str, body: Value) -> (StatusCode, bool, Value) {
    let response = app.post_job(&app.alice.token, key, &body).await;
    let status = response.status();
    let replayed = response.headers().contains_key("Idempotent-Replayed");
    (status, replayed, response.json().await.unwrap())
}

/// Waits until this process is creating `keys` keys with `twins` twins
/// waiting on them.
async fn wait_for_flights(app: &TestApp, keys: usize, twins: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.app.creations_in_flight() != (keys, twins) {
        assert!(
            Instant::now() < deadline,
            "expected {keys} key(s) in flight with {twins} twin(s) waiting, found {:?}",
            app.app.creations_in_flight()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Item: twins of a request still being created wait for it and answer
/// from its committed job, without going to the database: the same job for
/// the same payload, 409 for another.
async fn twins_in_flight_answer_from_the_first_requests_job(backend: TestBackend) {
    let app = Arc::new(spawn_app(backend).await);
    let (release, holder) = hold_job_inserts(&app);
    let first = tokio::spawn(post(app.clone(), "twins", summarize("same")));
    wait_for_flights(&app, 1, 0).await;
    let mut twins = Vec::new();
    for _ in 0..6 {
        twins.push(tokio::spawn(post(app.clone(), "twins", summarize("same"))));
    }
    let mut others = Vec::new();
    for _ in 0..2 {
        others.push(tokio::spawn(post(app.clone(), "twins", summarize("other"))));
    }
    // Every twin waits on the first request, which waits on the lock.
    wait_for_flights(&app, 1, 8).await;
    release.send(()).unwrap();
    holder.join().unwrap();

    let (status, replayed, job) = first.await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "{job}");
    assert!(!replayed);
    for twin in twins {
        let (status, replayed, body) = twin.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(replayed, "a twin's answer is a replay");
        assert_eq!(body["id"], job["id"], "the first request's job");
    }
    for other in others {
        let (status, _, body) = other.await.unwrap();
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert!(body["type"]
            .as_str()
            .unwrap()
            .ends_with("idempotency-key-reused"));
        assert_eq!(body["job_id"], job["id"], "{body}");
    }
    assert_eq!(app.job_count(&app.alice.id).await, 1);
    assert_eq!(
        app.app.metrics().twins_joined.get(),
        8,
        "all eight twins were answered from the first request's job"
    );
    assert_eq!(app.app.metrics().jobs_replayed.get(), 6);
    assert_eq!(app.app.metrics().key_conflicts.get(), 2);
    wait_for_flights(&app, 0, 0).await;
}

/// Item: when the database is too busy for the first request (its lock
/// wait times out), its waiting twins get the same retryable 503 at once
/// instead of each waiting out the lock again; nothing is stored, and the
/// client's retry under the key succeeds.
async fn twins_of_a_request_the_busy_database_refused_get_its_503_at_once(backend: TestBackend) {
    const LOCK_WAIT_MS: u64 = 3_000;
    let mut config = test_config(DEFAULT_TEST_PROVIDERS);
    config.database.sqlite_busy_timeout_ms = LOCK_WAIT_MS;
    config.database.postgres_lock_timeout_ms = LOCK_WAIT_MS;
    let app = Arc::new(spawn_app_with(backend, config).await);
    let (release, holder) = hold_job_inserts(&app);
    let first = tokio::spawn(post(app.clone(), "busy-twins", summarize("same")));
    wait_for_flights(&app, 1, 0).await;
    let twins: Vec<_> = (0..4)
        .map(|_| tokio::spawn(post(app.clone(), "busy-twins", summarize("same"))))
        .collect();
    wait_for_flights(&app, 1, 4).await;
    let (status, _, body) = first.await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    // The lock is still held: a twin that went to the database itself
    // would wait out the whole lock timeout before answering.
    let refused = Instant::now();
    for twin in twins {
        let (status, _, body) = twin.await.unwrap();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(body["type"]
            .as_str()
            .unwrap()
            .ends_with("service-unavailable"));
    }
    assert!(
        refused.elapsed() < Duration::from_millis(LOCK_WAIT_MS),
        "the twins answered with the first request's refusal, {:?} after it",
        refused.elapsed()
    );
    release.send(()).unwrap();
    holder.join().unwrap();
    assert_eq!(app.job_count(&app.alice.id).await, 0, "nothing was stored");
    assert_eq!(app.app.metrics().twins_joined.get(), 0);
    let (status, _, body) = post(app.clone(), "busy-twins", summarize("same")).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "the retry goes through: {body}"
    );
}

/// Item: on PostgreSQL a replay (a storm's twin that arrives after its
/// job landed is one) costs two statements, neither in a transaction: the
/// creating statement, which finds the key taken, and one read of the job
/// with its attempts, which answers as the stored row is now.
#[tokio::test]
async fn a_replay_on_postgresql_is_two_statements_and_no_transaction() {
    if !postgres_available() {
        return;
    }
    let log = StatementLog::new();
    let app = Arc::new(spawn_recorded(TestBackend::Postgres, &log).await);
    let id = app
        .create_job(&app.alice.token, "replayed", &summarize("same"))
        .await;
    app.wait_for_status(&id, "succeeded", Duration::from_secs(20))
        .await;
    // A change by hand, bypassing onejob: the replay must show it.
    let read = id.clone();
    let version: i64 = app
        .with_conn(move |conn| {
            conn.batch_execute(&format!(
                "UPDATE jobs SET version = version + 7 WHERE id = '{read}'"
            ))
            .unwrap();
            use diesel::prelude::*;
            use onejob::store::schema::jobs;
            jobs::table
                .filter(jobs::id.eq(&read))
                .select(jobs::version)
                .first(conn)
                .unwrap()
        })
        .await;
    log.take();
    let (status, replayed, body) = post(app.clone(), "replayed", summarize("same")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(replayed);
    assert_eq!(body["id"], id.as_str());
    assert_eq!(
        body["version"].as_i64(),
        Some(version),
        "the replay reads the row as it is now: {body}"
    );
    assert_eq!(body["status"], "succeeded", "{body}");
    assert_eq!(body["attempts"].as_array().map(Vec::len), Some(1), "{body}");
    // The replay's own statements: those that name its key or its job
    // (diesel prints the bound values). The worker's and the sweepers'
    // polls (the claim's, say) read `jobs` too, at times of their own,
    // and name neither.
    let of_jobs: Vec<Sent> = log
        .take_sent()
        .into_iter()
        .filter(|sent| sent.sql.contains("\"replayed\"") || sent.sql.contains(id.as_str()))
        .collect();
    assert_eq!(of_jobs.len(), 2, "{of_jobs:#?}");
    assert!(of_jobs[0].sql.starts_with("WITH job AS"), "{of_jobs:#?}");
    assert!(
        of_jobs[1].sql.starts_with("SELECT") && of_jobs[1].sql.contains("\"attempts\""),
        "{of_jobs:#?}"
    );
    assert!(
        of_jobs.iter().all(|sent| sent.transaction.is_none()),
        "{of_jobs:#?}"
    );
}

on_both_backends!(
    twins_in_flight_answer_from_the_first_requests_job,
    twins_of_a_request_the_busy_database_refused_get_its_503_at_once,
);
