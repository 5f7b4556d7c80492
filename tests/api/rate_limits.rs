//! Rate limits (docs/design.md, "Rate limits and retries"), against real
//! HTTP fake providers: a `429` is a definite failure of that attempt in
//! which nothing happened, and the job goes on with a new attempt (on the
//! next qualified provider, or on the same one once its `Retry-After` has
//! passed) within its task's budget; a pause is never a failure; onejob
//! keeps to a provider's `max_in_flight` instead of provoking refusals.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use futures::StreamExt;
use onejob::domain::{AttemptState, JobStatus};
use onejob::store::schema::{attempts, jobs};
use onejob::store::{Attempt, Job};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::fake_provider::{
    config_of, strict_task_toml, Behaviour, FakeProvider, ProviderToml, Shape,
};
use crate::support::harness::{record_figures, spawn_app_with, summarize, TestApp, TestBackend};

/// A task, with extra keys (retry policy and budget) of its own.
fn task_with(name: &str, chain: &[&str], extra: &str) -> String {
    strict_task_toml(name, chain, "Summarize: {{ text }}")
        .replace("output_schema = ", &format!("{extra}\noutput_schema = "))
}

fn answer_in(ms: u64) -> Behaviour {
    Behaviour::Delay {
        ms,
        then: Box::new(Behaviour::Answer(json!({"summary": "fake summary"}))),
    }
}

fn rate_limited(seconds: u64) -> Behaviour {
    Behaviour::Status {
        status: 429,
        retry_after: Some(seconds),
        body: r#"{"error": {"type": "rate_limit_exceeded"}}"#.into(),
    }
}

/// One in four calls answered 429 `Retry-After: 1`, the others in 30 ms.
fn one_in_four_rate_limited(fake: &FakeProvider) {
    fake.set_rotation(vec![
        rate_limited(1),
        answer_in(30),
        answer_in(30),
        answer_in(30),
    ]);
}

/// Every job and attempt stored, attempts by job, oldest first.
async fn everything(app: &TestApp) -> (Vec<Job>, HashMap<String, Vec<Attempt>>) {
    app.with_conn(|conn| {
        let jobs: Vec<Job> = jobs::table.select(Job::as_select()).load(conn).unwrap();
        let mut by_job: HashMap<String, Vec<Attempt>> = HashMap::new();
        let rows: Vec<Attempt> = attempts::table
            .order((attempts::job_id, attempts::number))
            .select(Attempt::as_select())
            .load(conn)
            .unwrap();
        for attempt in rows {
            by_job
                .entry(attempt.job_id.to_string())
                .or_default()
                .push(attempt);
        }
        (jobs, by_job)
    })
    .await
}

/// Creates `jobs` jobs from `clients` concurrent clients through the JSON
/// API; every one is acknowledged with 201.
async fn create_concurrently(app: &TestApp, tag: &str, jobs: usize, clients: usize) {
    let statuses: Vec<StatusCode> = futures::stream::iter(0..jobs)
        .map(|n| async move {
            app.post_job(
                &app.alice.token,
                &format!("{tag}-{n}"),
                &summarize(&format!("{tag} {n}")),
            )
            .await
            .status()
        })
        .buffer_unordered(clients)
        .collect()
        .await;
    assert!(
        statuses.iter().all(|s| *s == StatusCode::CREATED),
        "{statuses:?}"
    );
}

/// Waits until no job is unfinished (at most `within`); how long it took.
async fn drained(app: &TestApp, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let unfinished: i64 = app
            .with_conn(|conn| {
                jobs::table
                    .filter(jobs::status.ne_all(JobStatus::TERMINAL))
                    .count()
                    .get_result(conn)
                    .unwrap()
            })
            .await;
        if unfinished == 0 {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "{unfinished} jobs still unfinished after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What a provider received: each attempt id, and how often.
fn received(fake: &FakeProvider) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for request in fake.requests() {
        let id = request
            .header("x-request-id")
            .unwrap_or_default()
            .to_owned();
        *counts.entry(id).or_default() += 1;
    }
    counts
}

/// The exactly-once checks: every attempt id reached its provider at most
/// once, and every attempt that records `sent_at` was received.
fn assert_sent_once_and_sent_at_is_true(
    by_job: &HashMap<String, Vec<Attempt>>,
    providers: &[(&str, &FakeProvider)],
) {
    for (name, fake) in providers {
        let counts = received(fake);
        for (id, n) in &counts {
            assert_eq!(*n, 1, "{name} received attempt {id} {n} times");
        }
        for attempt in by_job.values().flatten() {
            if attempt.provider != *name {
                continue;
            }
            match attempt.sent_at {
                Some(_) => assert!(
                    counts.contains_key(attempt.id.as_str()),
                    "attempt {} records sent_at but {name} never received it: {attempt:#?}",
                    attempt.id
                ),
                None => assert!(!counts.contains_key(attempt.id.as_str())),
            }
        }
    }
}

/// The 429s seen: attempts that failed with a rate limit.
fn rate_limited_attempts(by_job: &HashMap<String, Vec<Attempt>>) -> Vec<&Attempt> {
    by_job
        .values()
        .flatten()
        .filter(|a| {
            a.state == AttemptState::Failed
                && a.error
                    .as_deref()
                    .is_some_and(|e| e.contains("rate limited (429)"))
        })
        .collect()
}

fn assert_no_attempt_failed_unsent(by_job: &HashMap<String, Vec<Attempt>>) {
    for attempt in by_job.values().flatten() {
        let error = attempt.error.as_deref().unwrap_or_default();
        assert!(
            !error.contains("not sent"),
            "a pause is never a failure: {attempt:#?}"
        );
        if attempt.state == AttemptState::Failed {
            assert!(error.contains("rate limited (429)"), "{attempt:#?}");
        }
    }
}

/// Done when: the only provider of a task answers `429 Retry-After: 1` to
/// one call in four; 120 jobs from 16 concurrent clients all succeed, each
/// attempt reaches the provider at most once, and no attempt records a
/// send the provider did not receive.
async fn an_only_provider_that_rate_limits_one_call_in_four_slows_jobs_down_and_fails_none(
    backend: TestBackend,
) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    one_in_four_rate_limited(&fake);
    let toml = [
        ProviderToml::openai("limited", &fake.base_url).toml(),
        strict_task_toml("summarize", &["limited"], "Summarize: {{ text }}"),
    ]
    .concat();
    let mut config = config_of(&toml);
    config.worker.concurrency = 16;
    let app = spawn_app_with(backend, config).await;
    let started = Instant::now();
    create_concurrently(&app, "only", 120, 16).await;
    drained(&app, Duration::from_secs(120)).await;
    let took = started.elapsed();
    let (jobs, by_job) = everything(&app).await;
    assert_eq!(jobs.len(), 120);
    let failed: Vec<&Job> = jobs
        .iter()
        .filter(|j| j.status != JobStatus::Succeeded)
        .collect();
    assert!(failed.is_empty(), "every job succeeds: {failed:#?}");
    assert_sent_once_and_sent_at_is_true(&by_job, &[("limited", &fake)]);
    assert_no_attempt_failed_unsent(&by_job);
    // Each rate-limited attempt was followed by a retry on the same
    // provider, sent no earlier than the Retry-After it was told.
    let refused = rate_limited_attempts(&by_job);
    assert!(!refused.is_empty(), "the provider refused some calls");
    for attempt in &refused {
        let retry = &by_job[attempt.job_id.as_str()][attempt.number as usize];
        assert_eq!(retry.provider, "limited");
        assert_eq!(retry.number, attempt.number + 1);
        let not_before = retry.not_before.expect("a retry waits");
        assert!(not_before - retry.created_at >= 1000, "{retry:#?}");
        assert!(retry.sent_at.unwrap() >= not_before, "{retry:#?}");
    }
    let calls = fake.total_requests();
    let figures = format!(
        "{backend:?}: 120 jobs, {} succeeded; {calls} calls, {} refused (429); drained in {:.1} s",
        jobs.len() - failed.len(),
        refused.len(),
        took.as_secs_f64()
    );
    record_figures(&format!("rate_limits-only-{backend:?}"), &figures);
}

/// The same load with a qualified fallback: a rate-limited attempt fails
/// over to it at once, and every job succeeds.
async fn with_a_qualified_fallback_a_rate_limited_attempt_fails_over(backend: TestBackend) {
    let limited = FakeProvider::start(Shape::OpenAi).await;
    let backup = FakeProvider::start(Shape::OpenAi).await;
    one_in_four_rate_limited(&limited);
    backup.set_default(answer_in(30));
    let toml = [
        ProviderToml::openai("limited", &limited.base_url).toml(),
        ProviderToml::openai("backup", &backup.base_url).toml(),
        strict_task_toml("summarize", &["limited", "backup"], "Summarize: {{ text }}"),
    ]
    .concat();
    let mut config = config_of(&toml);
    config.worker.concurrency = 16;
    let app = spawn_app_with(backend, config).await;
    assert!(app
        .app
        .qualify(None, "backup", "summarize")
        .await
        .unwrap()
        .passed());
    let qualification_calls = backup.total_requests();
    create_concurrently(&app, "fallback", 120, 16).await;
    drained(&app, Duration::from_secs(120)).await;
    let (jobs, by_job) = everything(&app).await;
    assert!(jobs.iter().all(|j| j.status == JobStatus::Succeeded));
    assert_sent_once_and_sent_at_is_true(&by_job, &[("limited", &limited)]);
    let backup_calls: HashSet<String> = backup
        .requests()
        .iter()
        .skip(qualification_calls)
        .map(|r| r.header("x-request-id").unwrap().to_owned())
        .collect();
    assert_eq!(
        backup_calls.len(),
        backup.total_requests() - qualification_calls,
        "each attempt reached the backup at most once"
    );
    assert_no_attempt_failed_unsent(&by_job);
    let refused = rate_limited_attempts(&by_job);
    assert!(!refused.is_empty());
    for attempt in &refused {
        let next = &by_job[attempt.job_id.as_str()][attempt.number as usize];
        assert_eq!(next.provider, "backup", "failed over: {next:#?}");
        assert_eq!(next.not_before, None, "no wait for another provider");
        assert_eq!(next.state, AttemptState::Succeeded);
        assert!(backup_calls.contains(next.id.as_str()));
    }
    for attempt in by_job.values().flatten() {
        if attempt.provider == "backup" {
            assert!(backup_calls.contains(attempt.id.as_str()) == attempt.sent_at.is_some());
        }
    }
}

/// With a budget of 2 attempts, a provider that rate-limits every call
/// makes the job fail after two, with a reason that says so.
async fn a_budget_of_two_attempts_fails_the_job_clearly(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    fake.set_default(rate_limited(1));
    let toml = [
        ProviderToml::openai("limited", &fake.base_url).toml(),
        task_with("summarize", &["limited"], "max_attempts = 2"),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    let job_id = app
        .create_job(&app.alice.token, "budget", &summarize("x"))
        .await;
    let job = app
        .wait_for_status(&job_id, "failed", Duration::from_secs(20))
        .await;
    let reason = job["failure_reason"].as_str().unwrap();
    assert_eq!(
        reason,
        "the retry budget is spent: 2 attempts made (limited), the most the task allows \
         (max_attempts = 2); last error: rate limited (429)"
    );
    let attempts = job["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{job:#}");
    assert!(attempts.iter().all(|a| a["state"] == "failed"));
    assert!(attempts[0]["not_before"].is_null());
    assert!(attempts[1]["not_before"].is_string(), "the retry waited");
    assert_eq!(fake.total_requests(), 2, "one call per attempt");
    let (_, by_job) = everything(&app).await;
    assert_sent_once_and_sent_at_is_true(&by_job, &[("limited", &fake)]);
    let rows = &by_job[job_id.as_str()];
    assert!(rows[1].sent_at.unwrap() >= rows[1].not_before.unwrap());
    // The job page shows the retry as an attempt of its own, in the
    // timeline and the table, and the reason.
    app.set_password("alice", "alice-pw").await;
    let browser = crate::support::harness::FormClient::new(&app);
    browser.sign_in("alice", "alice-pw").await;
    let page = browser
        .get(&format!("/jobs/{job_id}"))
        .await
        .text()
        .await
        .unwrap();
    assert!(page.contains("#2 limited"), "the timeline has the retry");
    assert_eq!(
        page.matches("<tr class=\"attempt\" data-state=\"failed\"")
            .count(),
        2,
        "two failed attempts in the table: {page}"
    );
    assert!(page.contains("a retry, sent after waiting"), "{page}");
    assert!(page.contains("the retry budget is spent"), "{page}");
}

/// The longest total wait is a budget too: Retry-After 2 s with at most
/// 3 s of waiting in all allows one retry, not two.
async fn a_budget_of_total_wait_fails_the_job_clearly(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    fake.set_default(rate_limited(2));
    let toml = [
        ProviderToml::openai("limited", &fake.base_url).toml(),
        task_with("summarize", &["limited"], "max_retry_wait_seconds = 3"),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    let job_id = app
        .create_job(&app.alice.token, "wait-budget", &summarize("x"))
        .await;
    let job = app
        .wait_for_status(&job_id, "failed", Duration::from_secs(20))
        .await;
    let reason = job["failure_reason"].as_str().unwrap();
    assert!(
        reason.starts_with("the retry budget is spent: limited asked to wait 2")
            && reason.contains("of the 3 s the task allows (max_retry_wait_seconds)")
            && reason.contains("2 attempts made"),
        "{reason}"
    );
    assert_eq!(job["attempts"].as_array().unwrap().len(), 2);
    assert_eq!(fake.total_requests(), 2);
}

/// `on_rate_limit = "wait"`: a rate-limited attempt is retried on the same
/// provider even with a qualified fallback, which is never called.
async fn the_wait_policy_retries_the_same_provider_and_never_the_fallback(backend: TestBackend) {
    let limited = FakeProvider::start(Shape::OpenAi).await;
    let backup = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        ProviderToml::openai("limited", &limited.base_url).toml(),
        ProviderToml::openai("backup", &backup.base_url).toml(),
        task_with(
            "summarize",
            &["limited", "backup"],
            "on_rate_limit = \"wait\"",
        ),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    assert!(app
        .app
        .qualify(None, "backup", "summarize")
        .await
        .unwrap()
        .passed());
    let backup_before = backup.total_requests();
    limited.push(rate_limited(1));
    let job_id = app
        .create_job(&app.alice.token, "wait", &summarize("x"))
        .await;
    let job = app
        .wait_for_status(&job_id, "succeeded", Duration::from_secs(20))
        .await;
    let attempts = job["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{job:#}");
    assert_eq!(
        (&attempts[0]["provider"], &attempts[0]["state"]),
        (&json!("limited"), &json!("failed"))
    );
    assert_eq!(
        (&attempts[1]["provider"], &attempts[1]["state"]),
        (&json!("limited"), &json!("succeeded"))
    );
    assert_eq!(backup.total_requests(), backup_before, "never the fallback");
    // A definite failure of another kind still fails over.
    limited.push(Behaviour::Status {
        status: 400,
        retry_after: None,
        body: "{}".into(),
    });
    let job_id = app
        .create_job(&app.alice.token, "wait-400", &summarize("y"))
        .await;
    let job = app
        .wait_for_status(&job_id, "succeeded", Duration::from_secs(20))
        .await;
    assert_eq!(job["attempts"][1]["provider"], "backup");
}

/// Item: a pause is never a failure. A job's first attempt is claimed and
/// confirmed in its creating transaction (its `sent_at` recorded) while the
/// provider is clear; the creation is held up; meanwhile another call gets
/// a 429 and the provider is paused. The started attempt is not sent into
/// the pause: it goes back to the queue in one guarded statement that
/// clears its `sent_at`, and is sent, once, when the pause is over.
/// The refused call's retry is claimed when its wait is over, by the
/// process that queued it, with no poll to find it.
async fn a_pause_between_the_claim_and_the_send_gives_the_attempt_back_unsent(
    backend: TestBackend,
) {
    use diesel::connection::SimpleConnection;
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        ProviderToml::openai("limited", &fake.base_url).toml(),
        strict_task_toml("summarize", &["limited"], "Summarize: {{ text }}"),
    ]
    .concat();
    let mut config = config_of(&toml);
    config.worker.concurrency = 2;
    // The claimer wakes when an attempt is queued or a pause ends, never by
    // the clock: a poll during the hold below would take the free slot for
    // a claim stalled on the held database, and the creation would find
    // none.
    config.worker.poll_interval_ms = 600_000;
    let app = spawn_app_with(backend, config).await;
    let limiter = app.providers.get("limited").unwrap().limiter().clone();
    // A call that will answer 429 when the test says.
    fake.push(Behaviour::Hold);
    let first = app
        .create_job(&app.alice.token, "first", &summarize("first"))
        .await;
    let held = fake.wait_held_count(1).await.remove(0);
    assert_eq!(limiter.in_flight(), 1);

    // Hold the database, so that the next creation takes its slot and then
    // waits to commit.
    let (hold, release) = std::sync::mpsc::channel::<()>();
    let (locked, is_locked) = std::sync::mpsc::channel::<()>();
    let store = app.store.clone();
    let holder = std::thread::spawn(move || {
        let mut conn = store.conn().unwrap();
        match &mut *conn {
            onejob::store::DbConnection::Sqlite(c) => c.batch_execute("BEGIN IMMEDIATE").unwrap(),
            onejob::store::DbConnection::Postgresql(c) => c
                .batch_execute("BEGIN; LOCK TABLE jobs IN EXCLUSIVE MODE")
                .unwrap(),
        }
        locked.send(()).unwrap();
        release.recv().unwrap();
        conn.batch_execute("ROLLBACK").unwrap();
    });
    is_locked.recv().unwrap();
    let creating = {
        let (client, url, token) = (
            app.client.clone(),
            app.url("/api/v1/jobs"),
            app.alice.token.clone(),
        );
        tokio::spawn(async move {
            client
                .post(url)
                .bearer_auth(token)
                .header("Idempotency-Key", "second")
                .json(&summarize("second"))
                .send()
                .await
                .unwrap()
        })
    };
    // The creation has its slot: admitted while the provider was clear.
    let deadline = Instant::now() + Duration::from_secs(10);
    while limiter.in_flight() < 2 {
        assert!(Instant::now() < deadline, "the creation never took a slot");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Now the provider asks for a pause.
    fake.release(&held, rate_limited(1));
    while limiter.paused_until().is_none() {
        assert!(Instant::now() < deadline, "the pause never began");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let paused_at = onejob::domain::Timestamp::now();
    hold.send(()).unwrap();
    holder.join().unwrap();
    let response = creating.await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let created: Value = response.json().await.unwrap();
    let second = created["id"].as_str().unwrap().to_owned();
    let attempt_id = created["attempts"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        created["attempts"][0]["state"], "running",
        "started in its creating transaction, confirmed for sending"
    );

    let job = app
        .wait_for_status(&second, "succeeded", Duration::from_secs(20))
        .await;
    assert_eq!(
        job["attempts"].as_array().unwrap().len(),
        1,
        "the same attempt, no failure, no new one: {job:#}"
    );
    assert_eq!(job["completed_by"], attempt_id.as_str());
    assert_eq!(fake.requests_for(&attempt_id), 1, "sent exactly once");
    let (_, by_job) = everything(&app).await;
    let row = &by_job[second.as_str()][0];
    assert!(
        row.sent_at.unwrap() >= paused_at + 900,
        "sent once the pause was over, not when it was claimed: {row:#?}"
    );
    // The job whose call was refused retried and succeeded too.
    app.wait_for_status(&first, "succeeded", Duration::from_secs(20))
        .await;
    let (_, by_job) = everything(&app).await;
    assert_sent_once_and_sent_at_is_true(&by_job, &[("limited", &fake)]);
}

/// Item: onejob does not provoke the 429s itself. A provider that serves
/// two requests at once and refuses more, with `max_in_flight = 2`: twelve
/// jobs on eight worker slots queue for its capacity, never get a 429, and
/// the time they waited shows in the metrics.
async fn max_in_flight_queues_attempts_for_capacity_instead_of_provoking_refusals(
    backend: TestBackend,
) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    fake.set_default(answer_in(150));
    fake.set_capacity(2, rate_limited(1));
    let toml = [
        ProviderToml::openai("limited", &fake.base_url)
            .with("max_in_flight = 2")
            .toml(),
        strict_task_toml("summarize", &["limited"], "Summarize: {{ text }}"),
    ]
    .concat();
    let mut config = config_of(&toml);
    config.worker.concurrency = 8;
    let app = spawn_app_with(backend, config).await;
    create_concurrently(&app, "capacity", 12, 12).await;
    drained(&app, Duration::from_secs(30)).await;
    let (jobs, by_job) = everything(&app).await;
    assert!(jobs.iter().all(|j| j.status == JobStatus::Succeeded));
    assert!(
        by_job.values().all(|a| a.len() == 1),
        "no refusal, no retry"
    );
    assert_eq!(fake.total_requests(), 12);
    assert!(
        fake.max_open() <= 2,
        "at most max_in_flight at once: {}",
        fake.max_open()
    );
    assert_sent_once_and_sent_at_is_true(&by_job, &[("limited", &fake)]);
    let metrics = app
        .get(&app.ada.token, "/metrics")
        .await
        .text()
        .await
        .unwrap();
    let value = |series: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{metrics}"))
    };
    assert!(
        value("onejob_provider_held_back_total{provider=\"limited\",reason=\"at_capacity\"}")
            >= 1.0
    );
    assert_eq!(
        value("onejob_provider_wait_seconds_count{provider=\"limited\"}"),
        12.0
    );
    assert!(
        value("onejob_provider_wait_seconds_sum{provider=\"limited\"}") >= 0.3,
        "twelve calls of 150 ms, two at a time: the later ones waited"
    );
    assert_eq!(
        value("onejob_provider_pauses_total{provider=\"limited\"}"),
        0.0
    );
}

on_both_backends!(
    an_only_provider_that_rate_limits_one_call_in_four_slows_jobs_down_and_fails_none,
    with_a_qualified_fallback_a_rate_limited_attempt_fails_over,
    a_budget_of_two_attempts_fails_the_job_clearly,
    a_budget_of_total_wait_fails_the_job_clearly,
    the_wait_policy_retries_the_same_provider_and_never_the_fallback,
    a_pause_between_the_claim_and_the_send_gives_the_attempt_back_unsent,
    max_in_flight_queues_attempts_for_capacity_instead_of_provoking_refusals,
);
