//! Exactly-once at the edges (docs/design.md): no send after a claim became
//! void, every success that does not win is in the race log, provider text
//! that cannot wedge a worker, a busy database answers 503, and the unknown
//! queue as support reads it.

use std::time::Duration;

use diesel::prelude::*;
use onejob::app::Attempt;
use onejob::domain::{AttemptState, CallbackKey, JobId, Secret};
use onejob::store::schema::race_log;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::db::attempts_of;
use crate::support::fake_provider::{
    answer, config_of, one_fake_config, strict_task_toml, Behaviour, FakeProvider, ProviderToml,
    Shape, WAIT,
};
use crate::support::harness::{
    assert_problem, spawn_app_with, summarize, PreparedApp, TestApp, TestBackend, CALLBACK_KEY,
};

async fn race_reasons(app: &TestApp, job_id: &str) -> Vec<(String, String)> {
    let job_id = JobId::parse(job_id).unwrap();
    app.with_conn(move |conn| {
        race_log::table
            .filter(race_log::job_id.eq(job_id))
            .select((race_log::losing_attempt_id, race_log::reason))
            .load(conn)
            .unwrap()
    })
    .await
}

/// Polls the attempts of a job until `done` holds (20 s at most).
async fn wait_attempts(
    app: &TestApp,
    job_id: &str,
    done: impl Fn(&[Attempt]) -> bool,
) -> Vec<Attempt> {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let attempts = attempts_of(app, job_id).await;
        if done(&attempts) {
            return attempts;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "attempts never got there: {attempts:#?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Item: no send once the job finished. A provider that asked to pause
/// (429, Retry-After) holds an attempt in the queue, unclaimed and unsent;
/// the job finishes meanwhile (an abandoned attempt's late answer wins);
/// the waiting attempt is closed and the provider never receives it.
async fn an_attempt_waiting_out_retry_after_is_never_sent_once_its_job_finished(
    backend: TestBackend,
) {
    let slow = FakeProvider::start(Shape::OpenAi).await;
    let paused = FakeProvider::start(Shape::OpenAi).await;
    // `direct` gives up after one attempt: its 429 fails the job at once.
    let direct = strict_task_toml("direct", &["paused"], "Summarize: {{ text }}")
        .replace("output_schema = ", "max_attempts = 1\noutput_schema = ");
    let toml = [
        ProviderToml::openai("slow", &slow.base_url).toml(),
        ProviderToml::openai("paused", &paused.base_url).toml(),
        strict_task_toml("summarize", &["slow", "paused"], "Summarize: {{ text }}"),
        direct,
    ]
    .concat();
    let mut config = config_of(&toml);
    config.worker.concurrency = 2;
    let app = spawn_app_with(backend, config).await;
    assert!(app
        .app
        .qualify(None, "paused", "summarize")
        .await
        .unwrap()
        .passed());
    // `paused` asks for a minute's pause on some other job's call.
    paused.push(Behaviour::Status {
        status: 429,
        retry_after: Some(60),
        body: "{}".into(),
    });
    let mut other = summarize("other");
    other["task"] = "direct".into();
    let other = app.create_job(&app.alice.token, "other", &other).await;
    let other = app.wait_for_status(&other, "failed", WAIT).await;
    let reason = other["failure_reason"].as_str().unwrap();
    assert!(
        reason.contains("the retry budget is spent") && reason.contains("max_attempts = 1"),
        "{reason}"
    );
    let requests_before = paused.total_requests();

    slow.set_default(Behaviour::Hold);
    let job_id = app
        .create_job(&app.alice.token, "void", &summarize("void"))
        .await;
    let job = app.wait_for_status(&job_id, "unknown", WAIT).await;
    let first = job["attempts"][0]["id"].as_str().unwrap().to_owned();
    slow.wait_held(&first).await;
    assert_eq!(
        app.abandon(&app.sue.token, &first, "try paused")
            .await
            .status(),
        StatusCode::OK
    );
    let response = app.start_attempt(&app.alice.token, &job_id, None).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let second: Value = response.json().await.unwrap();
    let second = second["id"].as_str().unwrap().to_owned();
    // It waits out the pause in the queue: never claimed, never sent.
    wait_attempts(&app, &job_id, |a| {
        a.len() == 2 && a[1].state == AttemptState::Queued
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let waiting = attempts_of(&app, &job_id).await;
    assert_eq!(waiting[1].state, AttemptState::Queued, "{:#?}", waiting[1]);
    assert!(waiting[1].sent_at.is_none() && waiting[1].lease_owner.is_none());

    // The abandoned first attempt answers late, and wins.
    slow.release(&first, answer("late but first"));
    app.wait_for_status(&job_id, "succeeded", WAIT).await;
    let attempts = wait_attempts(&app, &job_id, |a| a[1].state != AttemptState::Running).await;
    let waiting = &attempts[1];
    assert_eq!(waiting.state, AttemptState::Failed, "{waiting:#?}");
    assert_eq!(
        waiting.error.as_deref(),
        Some("not sent: the job had already finished")
    );
    assert!(waiting.sent_at.is_none(), "never sent");
    assert_eq!(
        paused.requests_for(&second),
        0,
        "the provider never received it"
    );
    assert_eq!(paused.total_requests(), requests_before);
}

fn callback_config(fake: &FakeProvider) -> onejob::config::Config {
    let toml = [
        "[server]\npublic_url = \"http://127.0.0.1:9\"\ncallback_secret_env = \"ONEJOB_TEST_CALLBACK_KEY\"\n".to_owned(),
        ProviderToml::openai("async", &fake.base_url).with("callbacks = true").toml(),
        strict_task_toml("summarize", &["async"], "Summarize: {{ text }}"),
    ]
    .concat();
    config_of(&toml)
}

async fn signed_callback(app: &TestApp, attempt_id: &str, body: &str) -> String {
    let key = CallbackKey::new(&Secret::new(CALLBACK_KEY));
    let now = onejob::domain::Timestamp::now().unix_seconds();
    let response = app
        .client
        .post(app.url(&format!("/api/v1/callbacks/attempts/{attempt_id}")))
        .header("Content-Type", "application/json")
        .header("X-Onejob-Timestamp", now.to_string())
        .header(
            "X-Onejob-Signature",
            key.sign(attempt_id, now, body.as_bytes()),
        )
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let outcome: Value = response.json().await.unwrap();
    outcome["outcome"].as_str().unwrap().to_owned()
}

/// Item: every success that does not win is in the race log. An error
/// callback fails the attempt; then the synchronous answer arrives (a 200
/// with a valid answer): not applied, and logged with its reason.
async fn a_success_after_an_error_callback_is_race_logged(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let app = spawn_app_with(backend, callback_config(&fake)).await;
    fake.set_default(Behaviour::Hold);
    let job_id = app
        .create_job(&app.alice.token, "error-then-200", &summarize("x"))
        .await;
    let job = app.wait_for_status(&job_id, "unknown", WAIT).await;
    let attempt_id = job["attempts"][0]["id"].as_str().unwrap().to_owned();
    fake.wait_held(&attempt_id).await;
    let outcome = signed_callback(&app, &attempt_id, r#"{"error": "quota exceeded"}"#).await;
    assert_eq!(outcome, "failed");
    app.wait_for_status(&job_id, "failed", WAIT).await;
    // The synchronous call answers after all.
    fake.release(&attempt_id, answer("too late"));
    let races = {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let races = race_reasons(&app, &job_id).await;
            if !races.is_empty() || std::time::Instant::now() > deadline {
                break races;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    };
    assert_eq!(races.len(), 1, "{races:?}");
    assert_eq!(races[0].0, attempt_id);
    assert!(
        races[0].1.contains(
            "already been recorded as failed (the provider reported a failure by callback"
        ),
        "{}",
        races[0].1
    );
    let attempts = attempts_of(&app, &job_id).await;
    assert_eq!(
        attempts[0].state,
        AttemptState::Failed,
        "the attempt stays as first recorded"
    );
    let job = app.get_job(&app.alice.token, &job_id).await;
    assert_eq!(job["status"], "failed");
    assert!(job["result"].is_null());
}

/// Item: every success that does not win is in the race log. The
/// synchronous answer breaks the output schema (`invalid_output`); then a
/// valid answer arrives by callback: not applied, and logged.
async fn a_valid_callback_after_invalid_output_is_race_logged(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let app = spawn_app_with(backend, callback_config(&fake)).await;
    fake.push(Behaviour::Answer(json!({"summary": "x", "extra": true})));
    let job_id = app
        .create_job(&app.alice.token, "invalid-then-callback", &summarize("x"))
        .await;
    app.wait_for_status(&job_id, "failed", WAIT).await;
    let attempt_id = attempts_of(&app, &job_id).await[0].id.to_string();
    let outcome =
        signed_callback(&app, &attempt_id, r#"{"result": {"summary": "valid now"}}"#).await;
    assert_eq!(outcome, "ignored");
    let races = race_reasons(&app, &job_id).await;
    assert_eq!(races.len(), 1, "{races:?}");
    assert!(
        races[0]
            .1
            .contains("already been recorded as failed (invalid_output"),
        "{}",
        races[0].1
    );
    assert!(app.get_job(&app.alice.token, &job_id).await["result"].is_null());
}

/// Item: provider text cannot wedge a worker. A NUL byte in an error and in
/// an answer is stored safely; the attempts finish.
async fn a_nul_byte_from_a_provider_is_stored_safely_and_the_job_moves_on(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let app = spawn_app_with(backend, one_fake_config(&fake)).await;
    fake.push(Behaviour::Status {
        status: 400,
        retry_after: None,
        body: "bad\u{0}request\u{1b}[31m".into(),
    });
    let failed = app
        .create_job(&app.alice.token, "nul-error", &summarize("x"))
        .await;
    app.wait_for_status(&failed, "failed", WAIT).await;
    let error = attempts_of(&app, &failed).await[0]
        .reason()
        .unwrap()
        .for_staff();
    assert!(
        error.contains("bad\\u{0000}request\\u{001b}[31m"),
        "{error}"
    );
    fake.push(Behaviour::Answer(json!({"summary": "nul\u{0}inside"})));
    let succeeded = app
        .create_job(&app.alice.token, "nul-answer", &summarize("y"))
        .await;
    let job = app.wait_for_status(&succeeded, "succeeded", WAIT).await;
    assert_eq!(
        job["result"]["summary"], "nul\u{0}inside",
        "the answer is kept exactly"
    );
}

/// Item: a busy database answers 503 with Retry-After, never 500, and
/// changes nothing (the client retries with the same key).
async fn a_locked_database_answers_503_and_the_retry_succeeds(backend: TestBackend) {
    use diesel::connection::SimpleConnection;
    let mut config =
        crate::support::harness::test_config(crate::support::harness::DEFAULT_TEST_PROVIDERS);
    config.database.sqlite_busy_timeout_ms = 300;
    config.database.postgres_lock_timeout_ms = 300;
    let prepared = PreparedApp::new(backend, config).await;
    let app = prepared.start().await;
    let job_id = app
        .create_job(&app.alice.token, "locked", &summarize("x"))
        .await;
    app.wait_for_status(&job_id, "succeeded", WAIT).await;
    // Another session holds the write lock (SQLite) or the job's row (PostgreSQL).
    let (hold, release) = std::sync::mpsc::channel::<()>();
    let (held, locked) = std::sync::mpsc::channel::<()>();
    let store = app.store.clone();
    let job = JobId::parse(&job_id).unwrap();
    let holder = std::thread::spawn(move || {
        let mut conn = store.conn().unwrap();
        match &mut *conn {
            onejob::store::DbConnection::Sqlite(c) => c.batch_execute("BEGIN IMMEDIATE").unwrap(),
            onejob::store::DbConnection::Postgresql(c) => c
                .batch_execute(&format!(
                    "BEGIN; SELECT id FROM jobs WHERE id = '{job}' FOR UPDATE"
                ))
                .unwrap(),
        }
        held.send(()).unwrap();
        release.recv().unwrap();
        conn.batch_execute("ROLLBACK").unwrap();
    });
    locked.recv().unwrap();
    let response = match app.store.backend() {
        onejob::store::Backend::Sqlite => {
            app.post_job(&app.alice.token, "while-locked", &summarize("y"))
                .await
        }
        onejob::store::Backend::Postgres => {
            app.start_attempt(&app.alice.token, &job_id, None).await
        }
    };
    assert_eq!(response.headers()["retry-after"], "1");
    assert_problem(
        response,
        StatusCode::SERVICE_UNAVAILABLE,
        "service-unavailable",
    )
    .await;
    hold.send(()).unwrap();
    holder.join().unwrap();
    assert_eq!(
        app.job_count(&app.alice.id).await,
        1,
        "the refused request changed nothing"
    );
    // The client's retry with the same key goes through.
    let retried = app
        .post_job(&app.alice.token, "while-locked", &summarize("y"))
        .await;
    assert_eq!(retried.status(), StatusCode::CREATED);
}

/// Item: the unknown queue is bounded and paginated, shows the attempts of
/// jobs another attempt already won as such, and a success keeps the
/// attempt's earlier history.
async fn the_unknown_queue_pages_and_marks_attempts_whose_job_already_won(backend: TestBackend) {
    let slow = FakeProvider::start(Shape::OpenAi).await;
    let fast = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        ProviderToml::openai("slow", &slow.base_url).toml(),
        ProviderToml::openai("fast", &fast.base_url).toml(),
        strict_task_toml("summarize", &["slow", "fast"], "Summarize: {{ text }}"),
    ]
    .concat();
    let mut config = config_of(&toml);
    config.worker.concurrency = 4;
    let app = spawn_app_with(backend, config).await;
    assert!(app
        .app
        .qualify(None, "fast", "summarize")
        .await
        .unwrap()
        .passed());
    slow.set_default(Behaviour::Hold);
    fast.set_default(Behaviour::Hold);
    let mut unknown = Vec::new();
    for i in 0..3 {
        let job_id = app
            .create_job(&app.alice.token, &format!("u{i}"), &summarize("u"))
            .await;
        let job = app.wait_for_status(&job_id, "unknown", WAIT).await;
        unknown.push(job["attempts"][0]["id"].as_str().unwrap().to_owned());
    }
    let page = |query: String| {
        let app = &app;
        async move {
            let response = app
                .get(&app.sue.token, &format!("/api/v1/admin/unknown{query}"))
                .await;
            assert_eq!(response.status(), StatusCode::OK);
            let rows: Vec<Value> = response.json().await.unwrap();
            rows.iter()
                .map(|r| r["attempt_id"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        }
    };
    let first = page("?limit=2".into()).await;
    let second = page(format!("?limit=2&after={}", first[1])).await;
    assert_eq!(first.len(), 2);
    assert_eq!(
        [first, second].concat(),
        unknown,
        "every unknown attempt once, oldest first"
    );
    assert_problem(
        app.get(&app.sue.token, "/api/v1/admin/unknown?limit=501")
            .await,
        StatusCode::BAD_REQUEST,
        "invalid-query",
    )
    .await;

    // Job 0: its first attempt is abandoned, the second goes unknown too,
    // then the first answers late and wins: the second can only lose.
    let job_id = app
        .get(&app.alice.token, "/api/v1/jobs?limit=100")
        .await
        .json::<Value>()
        .await
        .unwrap()["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["idempotency_key"] == "u0")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        app.abandon(&app.sue.token, &unknown[0], "try fast")
            .await
            .status(),
        StatusCode::OK
    );
    let response = app.start_attempt(&app.alice.token, &job_id, None).await;
    let second: Value = response.json().await.unwrap();
    let second = second["id"].as_str().unwrap().to_owned();
    app.wait_for_job(&job_id, WAIT, |j| j["attempts"][1]["state"] == "unknown")
        .await;
    slow.release(&unknown[0], answer("late"));
    app.wait_for_status(&job_id, "succeeded", WAIT).await;
    let rows: Vec<Value> = app
        .get(&app.sue.token, "/api/v1/admin/unknown")
        .await
        .json()
        .await
        .unwrap();
    let row = rows
        .iter()
        .find(|r| r["attempt_id"] == second.as_str())
        .unwrap();
    assert_eq!(row["job_status"], "succeeded");
    app.set_password("sue", "sue-pw").await;
    let browser = crate::support::harness::FormClient::new(&app);
    browser.sign_in("sue", "sue-pw").await;
    let queue = browser.get("/admin/unknown").await.text().await.unwrap();
    assert!(
        queue.contains("The job already succeeded: this answer can only lose."),
        "{queue}"
    );

    // The winner kept the history of its soft timeout.
    let attempts = attempts_of(&app, &job_id).await;
    assert_eq!(attempts[0].state, AttemptState::Succeeded);
    assert!(
        attempts[0]
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("no answer within the soft timeout"),
        "{:?}",
        attempts[0].error
    );
}

on_both_backends!(
    an_attempt_waiting_out_retry_after_is_never_sent_once_its_job_finished,
    a_success_after_an_error_callback_is_race_logged,
    a_valid_callback_after_invalid_output_is_race_logged,
    a_nul_byte_from_a_provider_is_stored_safely_and_the_job_moves_on,
    a_locked_database_answers_503_and_the_retry_succeeds,
    the_unknown_queue_pages_and_marks_attempts_whose_job_already_won,
);
