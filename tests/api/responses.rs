//! The OpenAI Responses API (`/v1/responses`) and cancelling, against a fake
//! upstream over real HTTP: a response is a job, a poll is a read, a cancel
//! stops new attempts (and the database decides it).

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use onejob::domain::{AttemptState, JobId, JobStatus, RaceResult, Timestamp};
use onejob::store::cancel::{cancel_statement, WITHDRAWN_NOTE};
use onejob::store::rows::JobKey;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::db::stored;
use crate::support::fake_provider::{
    config_of, Behaviour, FakeProvider, ProviderToml, Shape, StreamStep, WAIT,
};
use crate::support::harness::{spawn_app_with, TestApp, TestBackend};

on_both_backends!(
    a_background_response_is_queued_then_polled_until_completed_with_one_upstream_call,
    concurrent_duplicates_make_one_job_and_another_body_under_the_key_is_a_409,
    cancelling_a_queued_response_stops_it_before_any_upstream_call,
    cancelling_a_sent_response_race_logs_the_late_answer_and_it_stays_cancelled,
    the_database_refuses_a_live_attempt_and_a_stale_answer_on_a_cancelled_job,
    the_cancel_statement_moves_exactly_the_statuses_the_domain_calls_cancellable,
    a_stream_sends_the_responses_events_in_order_and_a_reconnect_gets_the_same,
    a_stream_of_a_response_cancelled_midway_ends_with_response_cancelled,
    previous_response_id_continues_the_owners_response_and_refuses_anothers,
    parameters_that_cannot_be_honoured_are_refused_by_name_and_create_nothing,
    input_as_a_string_or_a_list_and_instructions_reach_the_provider,
);

/// One OpenAI-compatible upstream behind the chat route `gpt-safe`; one
/// worker slot (`config_of`), calls held by the tests rather than timed out.
fn config(upstream: &FakeProvider) -> onejob::config::Config {
    let mut config = config_of(&format!(
        r#"{}
[[tasks]]
name = "gpt-safe"
kind = "chat"
providers = ["up"]
"#,
        ProviderToml::openai("up", &format!("{}/v1", upstream.base_url))
            .late_result_ms(120_000)
            .toml()
    ));
    for provider in &mut config.providers {
        provider.timeout_ms = 30_000;
    }
    config.server.max_wait_seconds = 20;
    config
}

fn body(input: Value) -> Value {
    json!({"model": "gpt-safe", "input": input})
}

fn background(input: &str) -> Value {
    json!({"model": "gpt-safe", "input": input, "background": true})
}

fn create(app: &TestApp, token: &str, key: &str, body: &Value) -> reqwest::RequestBuilder {
    app.client
        .post(app.url("/v1/responses"))
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .json(body)
}

async fn send(request: reqwest::RequestBuilder) -> (StatusCode, Value) {
    let response = request.send().await.expect("request sent");
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn poll(app: &TestApp, token: &str, id: &str) -> (StatusCode, Value) {
    send(
        app.client
            .get(app.url(&format!("/v1/responses/{id}")))
            .bearer_auth(token),
    )
    .await
}

async fn cancel(app: &TestApp, token: &str, id: &str) -> reqwest::Response {
    app.client
        .post(app.url(&format!("/v1/responses/{id}/cancel")))
        .bearer_auth(token)
        .send()
        .await
        .expect("request sent")
}

/// The job a response id names.
fn job_of(response_id: &str) -> String {
    onejob::domain::responses::ResponseId::parse(response_id)
        .unwrap_or_else(|| panic!("{response_id} is a response id"))
        .job_id()
        .to_string()
}

/// Polls the response until `done` holds.
async fn poll_until(app: &TestApp, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (status, response) = poll(app, &app.alice.token, id).await;
        assert_eq!(status, StatusCode::OK, "{response:#}");
        if done(&response) {
            return response;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "response {id} never got there: {response:#}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn output_text(response: &Value) -> String {
    response["output"][0]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

async fn a_background_response_is_queued_then_polled_until_completed_with_one_upstream_call(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.push(Behaviour::Hold);
    let app = spawn_app_with(backend, config(&upstream)).await;

    let (status, created) = send(create(&app, &app.alice.token, "bg-1", &background("Hi"))).await;
    assert_eq!(status, StatusCode::OK, "{created:#}");
    assert_eq!(created["object"], "response");
    assert!(
        ["queued", "in_progress"].contains(&created["status"].as_str().unwrap()),
        "{created:#}"
    );
    assert_eq!(created["background"], true);
    assert_eq!(created["output"], json!([]));
    assert!(created["usage"].is_null());
    let id = created["id"].as_str().unwrap().to_owned();
    let job_id = job_of(&id);

    let attempt = upstream.wait_held_count(1).await.remove(0);
    let before = stored(&app, &job_id).await;
    for _ in 0..5 {
        let (status, polled) = poll(&app, &app.alice.token, &id).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(polled["status"], "in_progress", "{polled:#}");
        assert_eq!(polled["id"], id.as_str());
    }
    assert_eq!(stored(&app, &job_id).await, before, "polls change nothing");
    assert_eq!(upstream.total_requests(), 1);

    upstream.release(&attempt, Behaviour::AnswerText("Hello there.".into()));
    let done = poll_until(&app, &id, |r| r["status"] == "completed").await;
    assert_eq!(output_text(&done), "Hello there.");
    assert_eq!(done["output"][0]["type"], "message");
    assert_eq!(done["output"][0]["role"], "assistant");
    assert_eq!(done["output"][0]["content"][0]["type"], "output_text");
    assert!(
        done["usage"]["total_tokens"].as_i64().unwrap() > 0,
        "{done:#}"
    );
    assert_eq!(
        done["usage"]["total_tokens"].as_i64().unwrap(),
        done["usage"]["input_tokens"].as_i64().unwrap()
            + done["usage"]["output_tokens"].as_i64().unwrap()
    );
    assert_eq!(done["model"], "gpt-safe");
    assert!(done["error"].is_null() && done["incomplete_details"].is_null());
    let after = stored(&app, &job_id).await;
    let (_, again) = poll(&app, &app.alice.token, &id).await;
    assert_eq!(again, done);
    assert_eq!(stored(&app, &job_id).await, after, "polls change nothing");
    assert_eq!(upstream.total_requests(), 1, "exactly one upstream call");

    // Another owner's poll is a 404 in OpenAI's shape; so is a malformed id.
    let (status, refused) = poll(&app, &app.bob.token, &id).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(refused["error"]["code"], "response_not_found");
    let (status, _) = poll(&app, &app.alice.token, "resp_nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

async fn concurrent_duplicates_make_one_job_and_another_body_under_the_key_is_a_409(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.set_default(Behaviour::Delay {
        ms: 300,
        then: Box::new(Behaviour::AnswerText("Once.".into())),
    });
    let app = spawn_app_with(backend, config(&upstream)).await;
    let request = body(json!("Say it once"));
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(12));
    let handles: Vec<_> = (0..12)
        .map(|_| {
            let request = create(&app, &app.alice.token, "dup-1", &request);
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                send(request).await
            })
        })
        .collect();
    let mut ids = std::collections::BTreeSet::new();
    for handle in handles {
        let (status, response) = handle.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{response:#}");
        assert_eq!(response["status"], "completed");
        assert_eq!(output_text(&response), "Once.");
        ids.insert(response["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(ids.len(), 1, "one response: {ids:?}");
    assert_eq!(upstream.total_requests(), 1, "one upstream call");
    assert_eq!(app.job_count(&app.alice.id).await, 1);

    let (status, conflict) = send(create(
        &app,
        &app.alice.token,
        "dup-1",
        &body(json!("Something else")),
    ))
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(conflict["error"]["code"], "idempotency_key_reused");
    assert_eq!(app.job_count(&app.alice.id).await, 1);
    assert_eq!(upstream.total_requests(), 1);
}

async fn cancelling_a_queued_response_stops_it_before_any_upstream_call(backend: TestBackend) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.push(Behaviour::Hold);
    upstream.set_default(Behaviour::AnswerText("Should never be asked.".into()));
    let app = spawn_app_with(backend, config(&upstream)).await;

    // The one worker slot is taken by a held response: the next one queues.
    let (_, blocker) = send(create(&app, &app.alice.token, "q-0", &background("first"))).await;
    let held = upstream.wait_held_count(1).await.remove(0);
    let (status, queued) = send(create(&app, &app.alice.token, "q-1", &background("second"))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(queued["status"], "queued", "{queued:#}");
    let id = queued["id"].as_str().unwrap().to_owned();
    let job_id = job_of(&id);

    let cancelled = cancel(&app, &app.alice.token, &id).await;
    assert_eq!(cancelled.status(), StatusCode::OK);
    assert!(cancelled.headers().get("idempotent-replayed").is_none());
    let cancelled: Value = cancelled.json().await.unwrap();
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(cancelled["id"], id.as_str());
    let after = stored(&app, &job_id).await;
    assert_eq!(after.job.status, JobStatus::Cancelled);
    assert_eq!(after.job.version, 1, "the cancel moved the version");
    assert_eq!(after.attempts.len(), 1);
    assert_eq!(after.attempts[0].state, AttemptState::Failed);
    assert_eq!(after.attempts[0].error.as_deref(), Some(WITHDRAWN_NOTE));
    assert_eq!(after.attempts[0].sent_at, None);

    // Idempotent: the same answer, nothing changes (also through /api/v1).
    let again = cancel(&app, &app.alice.token, &id).await;
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(again.headers().get("idempotent-replayed").unwrap(), "true");
    let again: Value = again.json().await.unwrap();
    assert_eq!(again, cancelled);
    let api = app
        .client
        .post(app.url(&format!("/api/v1/jobs/{job_id}/cancel")))
        .bearer_auth(&app.alice.token)
        .send()
        .await
        .unwrap();
    assert_eq!(api.status(), StatusCode::OK);
    let api: Value = api.json().await.unwrap();
    assert_eq!(api["status"], "cancelled");
    assert_eq!(stored(&app, &job_id).await, after, "nothing changed");
    // Another owner cannot cancel it, or even see it.
    assert_eq!(
        cancel(&app, &app.bob.token, &id).await.status(),
        StatusCode::NOT_FOUND
    );

    // The worker's slot frees; the cancelled job is never sent.
    upstream.release(&held, Behaviour::AnswerText("First.".into()));
    let blocker_id = blocker["id"].as_str().unwrap();
    poll_until(&app, blocker_id, |r| r["status"] == "completed").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(upstream.total_requests(), 1, "no upstream call for it");
    assert_eq!(upstream.requests_for(after.attempts[0].id.as_str()), 0);
    assert_eq!(stored(&app, &job_id).await, after);

    // A finished response cannot be cancelled: a 409, and it keeps its answer.
    let refused = cancel(&app, &app.alice.token, blocker_id).await;
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    assert_eq!(refused.headers().get("x-should-retry").unwrap(), "false");
    let refused: Value = refused.json().await.unwrap();
    assert_eq!(refused["error"]["code"], "response_already_finished");
    let (_, blocker) = poll(&app, &app.alice.token, blocker_id).await;
    assert_eq!(blocker["status"], "completed");
    let api = app
        .client
        .post(app.url(&format!("/api/v1/jobs/{}/cancel", job_of(blocker_id))))
        .bearer_auth(&app.alice.token)
        .send()
        .await
        .unwrap();
    crate::support::harness::assert_problem(api, StatusCode::CONFLICT, "job-finished").await;
}

async fn cancelling_a_sent_response_race_logs_the_late_answer_and_it_stays_cancelled(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.push(Behaviour::Hold);
    let app = spawn_app_with(backend, config(&upstream)).await;
    let (_, created) = send(create(&app, &app.alice.token, "sent-1", &background("Hi"))).await;
    let id = created["id"].as_str().unwrap().to_owned();
    let job_id = job_of(&id);
    let attempt = upstream.wait_held_count(1).await.remove(0);

    let cancelled: Value = cancel(&app, &app.alice.token, &id)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(cancelled["status"], "cancelled");
    let after = stored(&app, &job_id).await;
    assert_eq!(after.job.status, JobStatus::Cancelled);
    assert_eq!(
        after.attempts[0].state,
        AttemptState::Running,
        "a sent attempt cannot be recalled"
    );
    // No new attempt: support's "start a new attempt" is refused.
    let start = app.start_attempt(&app.sue.token, &job_id, None).await;
    crate::support::harness::assert_problem(start, StatusCode::CONFLICT, "job-finished").await;

    upstream.release(&attempt, Behaviour::AnswerText("Too late.".into()));
    let deadline = tokio::time::Instant::now() + WAIT;
    let settled = loop {
        let now = stored(&app, &job_id).await;
        if now.attempts[0].outcome.is_some() {
            break now;
        }
        assert!(tokio::time::Instant::now() < deadline, "{now:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    assert_eq!(
        (settled.attempts[0].state, settled.attempts[0].outcome),
        (AttemptState::Succeeded, Some(RaceResult::Lost))
    );
    assert_eq!(
        settled.job.status,
        JobStatus::Cancelled,
        "it stays cancelled"
    );
    assert_eq!(
        (&settled.job.result, &settled.job.completed_by),
        (&None, &None)
    );
    assert_eq!(settled.races.len(), 1, "{:?}", settled.races);
    let race = &settled.races[0];
    assert_eq!(race.losing_attempt_id.as_str(), attempt);
    assert_eq!(race.winning_attempt_id, None);
    assert_eq!((race.version_read, race.version_found), (0, 1));
    assert!(race.reason.contains("cancelled"), "{}", race.reason);
    let (_, polled) = poll(&app, &app.alice.token, &id).await;
    assert_eq!(polled["status"], "cancelled");
    assert_eq!(polled["output"], json!([]));
    assert_eq!(upstream.total_requests(), 1);
}

/// Bypassing the application: after a cancel, the database itself refuses
/// a second live attempt (the one-live-attempt index: the sent one is still
/// out), and the compare-and-swap on the version the attempt read changes
/// nothing.
async fn the_database_refuses_a_live_attempt_and_a_stale_answer_on_a_cancelled_job(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.push(Behaviour::Hold);
    let app = spawn_app_with(backend, config(&upstream)).await;
    let (_, created) = send(create(&app, &app.alice.token, "raw-1", &background("Hi"))).await;
    let id = created["id"].as_str().unwrap().to_owned();
    let job_id = job_of(&id);
    let attempt = upstream.wait_held_count(1).await.remove(0);
    assert_eq!(
        cancel(&app, &app.alice.token, &id).await.status(),
        StatusCode::OK
    );
    let before = stored(&app, &job_id).await;
    assert_eq!(before.job.version, 1);
    let owner = app.alice.id.to_string();
    let (job, attempt_id) = (job_id.clone(), attempt.clone());
    app.with_conn(move |conn| {
        let insert = format!(
            "INSERT INTO attempts (id, job_id, owner_id, number, provider, state, created_at) \
             VALUES ('{}', '{job}', '{owner}', 2, 'up', 'queued', 0)",
            uuid::Uuid::now_v7()
        );
        let refused = conn.batch_execute(&insert).unwrap_err().to_string();
        assert!(
            refused.contains("attempts_one_live_per_job") || refused.contains("UNIQUE"),
            "{refused}"
        );
        let cas = diesel::sql_query(format!(
            "UPDATE jobs SET status = 'succeeded', result = '{{}}', completed_by = '{attempt_id}', \
             version = version + 1 \
             WHERE id = '{job}' AND owner_id = '{owner}' AND version = 0 AND completed_by IS NULL"
        ))
        .execute(conn)
        .unwrap();
        assert_eq!(
            cas, 0,
            "the version read before the cancel no longer matches"
        );
    })
    .await;
    assert_eq!(stored(&app, &job_id).await, before, "nothing changed");
    upstream.release(&attempt, Behaviour::AnswerText("late".into()));
}

/// The cancel's `WHERE` is the domain's rule: run on a row in each status,
/// it changes the row exactly when `JobStatus::is_cancellable` says.
async fn the_cancel_statement_moves_exactly_the_statuses_the_domain_calls_cancellable(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    let app = spawn_app_with(backend, config(&upstream)).await;
    let owner = app.alice.id.clone();
    app.with_conn(move |conn| {
        for status in JobStatus::ALL {
            let job = JobId::new();
            let attempt = uuid::Uuid::now_v7().to_string();
            conn.batch_execute(&format!(
                "INSERT INTO jobs (id, owner_id, idempotency_key, task, provider, input, params, \
                 fingerprint, status, version, created_at, updated_at) VALUES ('{job}', '{owner}', \
                 'k-{status}', 'gpt-safe', 'up', '{{}}', '{{}}', '{fp}', 'pending', 3, 0, 0); \
                 INSERT INTO attempts (id, job_id, owner_id, number, provider, state, created_at) \
                 VALUES ('{attempt}', '{job}', '{owner}', 1, 'up', 'succeeded', 0)",
                fp = "a".repeat(64)
            ))
            .unwrap();
            let winner = if status == JobStatus::Succeeded {
                format!(", result = '{{}}', completed_by = '{attempt}'")
            } else {
                String::new()
            };
            conn.batch_execute(&format!(
                "UPDATE jobs SET status = '{status}'{winner} WHERE id = '{job}'"
            ))
            .unwrap();
            let key = JobKey {
                id: job.clone(),
                owner_id: owner.clone(),
            };
            assert!(
                !cancel_statement(conn, &key, 2, Timestamp::from_millis(1)).unwrap(),
                "{status}: a stale version never cancels"
            );
            let changed = cancel_statement(conn, &key, 3, Timestamp::from_millis(1)).unwrap();
            assert_eq!(changed, status.is_cancellable(), "{status}");
            use onejob::store::schema::jobs;
            let (now, version): (String, i64) = jobs::table
                .filter(jobs::id.eq(job.as_str()))
                .select((jobs::status, jobs::version))
                .first(conn)
                .unwrap();
            if changed {
                assert_eq!((now.as_str(), version), ("cancelled", 4));
            } else {
                assert_eq!((now.as_str(), version), (status.as_str(), 3));
            }
        }
    })
    .await;
}

/// The events of a stream: (type, sequence_number, data).
fn events(text: &str) -> Vec<(String, u64, Value)> {
    text.split("\n\n")
        .filter(|block| block.contains("data: "))
        .map(|block| {
            let kind = block
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap_or_default()
                .to_owned();
            let data: Value = serde_json::from_str(
                block
                    .lines()
                    .find_map(|l| l.strip_prefix("data: "))
                    .unwrap(),
            )
            .unwrap();
            assert_eq!(data["type"], kind.as_str(), "{block}");
            (kind, data["sequence_number"].as_u64().unwrap(), data)
        })
        .collect()
}

async fn a_stream_sends_the_responses_events_in_order_and_a_reconnect_gets_the_same(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.push(Behaviour::Stream(vec![
        StreamStep::Text("Hel".into()),
        StreamStep::Gate,
        StreamStep::Text("lo ".into()),
        StreamStep::Text("there.".into()),
    ]));
    let app = spawn_app_with(backend, config(&upstream)).await;
    let request = json!({"model": "gpt-safe", "input": "Hi", "stream": true});

    let first = create(&app, &app.alice.token, "stream-1", &request)
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert!(first.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let first = tokio::spawn(async move { first.text().await.unwrap() });
    upstream.wait_requests(1).await;
    let attempt = upstream.request_ids().remove(0);
    upstream.wait_gate(&attempt, 1).await;
    // A reconnect while the answer is half out joins the same generation.
    let second = create(&app, &app.alice.token, "stream-1", &request)
        .send()
        .await
        .unwrap();
    assert_eq!(second.headers()["idempotent-replayed"], "true");
    let second = tokio::spawn(async move { second.text().await.unwrap() });
    tokio::time::sleep(Duration::from_millis(300)).await;
    upstream.open_gate(&attempt);
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    let sent = events(&first);
    let kinds: Vec<&str> = sent.iter().map(|(k, _, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ],
        "{first}"
    );
    let numbers: Vec<u64> = sent.iter().map(|(_, n, _)| *n).collect();
    assert_eq!(numbers, (0..sent.len() as u64).collect::<Vec<_>>());
    let deltas: String = sent
        .iter()
        .filter(|(k, _, _)| k == "response.output_text.delta")
        .map(|(_, _, d)| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, "Hello there.");
    assert_eq!(sent[7].2["text"], "Hello there.");
    let completed = &sent[10].2["response"];
    assert_eq!(completed["status"], "completed");
    assert_eq!(output_text(completed), "Hello there.");
    let id = completed["id"].as_str().unwrap();
    let job = stored(&app, &job_of(id)).await;
    let answer = job.job.result.unwrap().value();
    assert_eq!(
        answer["message"]["content"], "Hello there.",
        "the stored answer"
    );
    assert_eq!(events(&second), sent, "the reconnect got the same events");
    // And after the end, a replay under the key streams the same again.
    let third = create(&app, &app.alice.token, "stream-1", &request)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(events(&third), sent);
    assert_eq!(upstream.total_requests(), 1, "one upstream call");
}

async fn a_stream_of_a_response_cancelled_midway_ends_with_response_cancelled(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.push(Behaviour::Stream(vec![
        StreamStep::Text("Half".into()),
        StreamStep::Gate,
        StreamStep::Text(" and the rest.".into()),
    ]));
    let app = spawn_app_with(backend, config(&upstream)).await;
    let request = json!({"model": "gpt-safe", "input": "Hi", "stream": true});
    let streaming = create(&app, &app.alice.token, "stream-cancel", &request)
        .send()
        .await
        .unwrap();
    let job_id = streaming.headers()["x-onejob-job-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let streaming = tokio::spawn(async move { streaming.text().await.unwrap() });
    upstream.wait_requests(1).await;
    let attempt = upstream.request_ids().remove(0);
    upstream.wait_gate(&attempt, 1).await;
    let id = onejob::domain::responses::ResponseId::of(&JobId::parse(&job_id).unwrap()).to_string();
    assert_eq!(
        cancel(&app, &app.alice.token, &id).await.status(),
        StatusCode::OK
    );
    let text = tokio::time::timeout(WAIT, streaming)
        .await
        .unwrap()
        .unwrap();
    let sent = events(&text);
    let kinds: Vec<&str> = sent.iter().map(|(k, _, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.cancelled",
        ],
        "{text}"
    );
    assert_eq!(sent[5].2["response"]["status"], "cancelled");
    // The call goes on upstream; its answer loses and is logged.
    upstream.open_gate(&attempt);
    let deadline = tokio::time::Instant::now() + WAIT;
    while stored(&app, &job_id).await.races.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "no race-log row");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(stored(&app, &job_id).await.job.status, JobStatus::Cancelled);
}

async fn previous_response_id_continues_the_owners_response_and_refuses_anothers(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.set_default(Behaviour::AnswerText("First answer.".into()));
    let app = spawn_app_with(backend, config(&upstream)).await;
    let (status, first) = send(create(
        &app,
        &app.alice.token,
        "prev-1",
        &json!({"model": "gpt-safe", "input": "Hi", "instructions": "Be brief."}),
    ))
    .await;
    assert_eq!(status, StatusCode::OK, "{first:#}");
    let first_id = first["id"].as_str().unwrap();

    let follow_up = json!({"model": "gpt-safe", "input": "And?", "previous_response_id": first_id,
        "instructions": "Be kind."});
    let (status, second) = send(create(&app, &app.alice.token, "prev-2", &follow_up)).await;
    assert_eq!(status, StatusCode::OK, "{second:#}");
    assert_eq!(second["previous_response_id"], first_id);
    assert_eq!(
        upstream.last_request().unwrap().body["messages"],
        json!([
            {"role": "system", "content": "Be kind."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "First answer."},
            {"role": "user", "content": "And?"},
        ])
    );
    assert_eq!(upstream.total_requests(), 2);

    // Bob cannot continue Alice's response, nor learn it exists.
    let (status, refused) = send(create(&app, &app.bob.token, "prev-3", &follow_up)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(refused["error"]["code"], "response_not_found");
    assert_eq!(refused["error"]["param"], "previous_response_id");
    let unknown = json!({"model": "gpt-safe", "input": "x",
        "previous_response_id": onejob::domain::responses::ResponseId::of(&JobId::new()).to_string()});
    let (status, _) = send(create(&app, &app.alice.token, "prev-4", &unknown)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let malformed = json!({"model": "gpt-safe", "input": "x", "previous_response_id": "resp_1"});
    let (status, refused) = send(create(&app, &app.alice.token, "prev-5", &malformed)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(refused["error"]["param"], "previous_response_id");
    assert_eq!(app.job_count(&app.bob.id).await, 0);
    assert_eq!(app.job_count(&app.alice.id).await, 2);
    assert_eq!(upstream.total_requests(), 2);
}

async fn parameters_that_cannot_be_honoured_are_refused_by_name_and_create_nothing(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.set_default(Behaviour::AnswerText("Fine.".into()));
    let app = spawn_app_with(backend, config(&upstream)).await;
    let with = |member: &str, value: Value| {
        let mut request = body(json!("Hi"));
        request[member] = value;
        request
    };
    let cases = [
        (
            with("tools", json!([{"type": "web_search_preview"}])),
            "tools",
        ),
        (with("store", json!(false)), "store"),
        (
            with("include", json!(["file_search_call.results"])),
            "include",
        ),
        (with("reasoning", json!({"effort": "high"})), "reasoning"),
        (with("truncation", json!("auto")), "truncation"),
        (with("max_tool_calls", json!(2)), "max_tool_calls"),
        (
            with("text", json!({"format": {"type": "json_schema"}})),
            "text.format",
        ),
        (with("temperature", json!(7)), "temperature"),
        (with("no_such_thing", json!(1)), "no_such_thing"),
        (
            body(json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])),
            "input[0].content[0].type",
        ),
        (
            body(json!([{"type": "function_call_output", "call_id": "c", "output": "x"}])),
            "input[0].type",
        ),
        (json!({"model": "gpt-safe"}), "input"),
    ];
    for (request, param) in cases {
        let response = create(&app, &app.alice.token, "refused-1", &request)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{param}");
        assert_eq!(response.headers()["x-should-retry"], "false");
        let refused: Value = response.json().await.unwrap();
        assert_eq!(refused["error"]["param"], param, "{refused:#}");
        assert_eq!(refused["error"]["type"], "invalid_request_error");
        assert!(refused["error"]["message"].as_str().unwrap().len() > 10);
    }
    assert_eq!(app.job_count(&app.alice.id).await, 0, "nothing was created");
    assert_eq!(upstream.total_requests(), 0);
    // The key was not reserved by the refusals.
    let (status, ok) = send(create(
        &app,
        &app.alice.token,
        "refused-1",
        &with("store", json!(true)),
    ))
    .await;
    assert_eq!(status, StatusCode::OK, "{ok:#}");
    assert_eq!(ok["status"], "completed");
    // An unknown model is OpenAI's model_not_found.
    let (status, missing) = send(create(
        &app,
        &app.alice.token,
        "refused-2",
        &json!({"model": "nope", "input": "x"}),
    ))
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(missing["error"]["code"], "model_not_found");
}

async fn input_as_a_string_or_a_list_and_instructions_reach_the_provider(backend: TestBackend) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.set_default(Behaviour::AnswerText("Noted.".into()));
    let app = spawn_app_with(backend, config(&upstream)).await;
    let (status, plain) = send(create(
        &app,
        &app.alice.token,
        "in-1",
        &json!({"model": "gpt-safe", "input": "Hello", "instructions": "Answer in French.",
                "temperature": 0.5, "top_p": 0.9, "max_output_tokens": 32,
                "metadata": {"ticket": "42"}}),
    ))
    .await;
    assert_eq!(status, StatusCode::OK, "{plain:#}");
    assert_eq!(plain["instructions"], "Answer in French.");
    assert_eq!(plain["metadata"], json!({"ticket": "42"}));
    assert_eq!(plain["max_output_tokens"], 32);
    let sent = upstream.last_request().unwrap().body;
    assert_eq!(
        sent["messages"],
        json!([
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": "Hello"},
        ])
    );
    assert_eq!(
        (&sent["temperature"], &sent["top_p"], &sent["max_tokens"]),
        (&json!(0.5), &json!(0.9), &json!(32))
    );

    let (status, listed) = send(create(
        &app,
        &app.alice.token,
        "in-2",
        &json!({"model": "gpt-safe", "input": [
            {"role": "developer", "content": "Be terse."},
            {"role": "user", "content": [{"type": "input_text", "text": "Hi "},
                                         {"type": "input_text", "text": "there"}]},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "Hello.", "annotations": []}]},
            {"role": "user", "content": "Again"},
        ]}),
    ))
    .await;
    assert_eq!(status, StatusCode::OK, "{listed:#}");
    assert_eq!(output_text(&listed), "Noted.");
    assert_eq!(
        upstream.last_request().unwrap().body["messages"],
        json!([
            {"role": "developer", "content": "Be terse."},
            {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Again"},
        ])
    );
}
