//! The OpenAI-compatible surface (`/v1/chat/completions`, `/v1/models`) and
//! `Prefer: wait=N` on the jobs API, against fake upstreams over real HTTP.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::fake_provider::{config_of, Behaviour, FakeProvider, ProviderToml, Shape};
use crate::support::harness::{chat_request, spawn_app_with, start_instance, TestApp, TestBackend};

on_both_backends!(
    a_chat_completion_answers_in_openais_shape_and_a_retry_replays_it,
    the_request_reaches_the_upstream_as_sent_with_the_providers_model_and_no_stream,
    an_anthropic_provider_serves_a_chat_route,
    twenty_concurrent_duplicates_make_one_upstream_call_and_get_one_answer,
    a_wait_that_ends_first_is_a_retryable_503_and_the_retry_rejoins_the_job,
    a_failed_job_is_a_424_the_sdk_does_not_retry,
    the_same_key_with_other_messages_is_a_409_conflict,
    streaming_sends_the_answer_as_chunks_and_a_replay_streams_too,
    requests_without_a_key_a_model_or_a_token_are_refused_in_openais_shape,
    models_lists_the_chat_routes,
    prefer_wait_holds_the_answer_until_the_job_is_done,
    a_chat_request_without_a_limit_or_temperature_gets_the_providers,
    prefer_wait_sees_a_job_another_process_finished,
    waiting_requests_hold_no_database_connection,
    undeclared_methods_answer_405_with_allow,
    a_replay_is_answered_whatever_todays_routes,
    a_duplicate_of_an_unknown_job_or_one_waiting_for_support_is_answered_at_once,
    a_waiter_reads_no_more_than_its_answer_needs,
    every_statement_of_an_answer_is_prepared_once,
    every_statement_of_a_refused_call_is_prepared_once,
);

/// One OpenAI-compatible upstream behind the chat route `gpt-safe`, a
/// prompt task `summarize` on the same upstream (not a chat route), and
/// `max_wait_seconds` as given.
fn chat_config(upstream: &FakeProvider, max_wait_seconds: u64) -> onejob::config::Config {
    chat_config_of(&chat_toml(upstream), max_wait_seconds)
}

/// `chat_config`'s file.
fn chat_toml(upstream: &FakeProvider) -> String {
    format!(
        r#"{}
[[tasks]]
name = "gpt-safe"
kind = "chat"
providers = ["up"]

[[tasks]]
name = "summarize"
providers = ["up"]
input_fields = ["text"]
template = "Summarize: {{{{ text }}}}"
"#,
        ProviderToml::openai("up", &format!("{}/v1", upstream.base_url)).toml()
    )
}

fn chat_config_of(toml: &str, max_wait_seconds: u64) -> onejob::config::Config {
    let mut config = config_of(toml);
    // Calls here are held by the tests, not timed out.
    for provider in &mut config.providers {
        provider.timeout_ms = 30_000;
    }
    config.server.max_wait_seconds = max_wait_seconds;
    config
}

fn hello(text: &str) -> Value {
    json!({
        "model": "gpt-safe",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": text},
        ],
        "max_tokens": 20,
    })
}

async fn chat(app: &TestApp, key: Option<&str>, body: &Value) -> reqwest::Response {
    let mut request = app
        .client
        .post(app.url("/v1/chat/completions"))
        .bearer_auth(&app.alice.token)
        .json(body);
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    request.send().await.expect("request sent")
}

/// Sends a request in the background; the handle yields how long it took
/// and the answer.
fn in_background(
    request: reqwest::RequestBuilder,
) -> tokio::task::JoinHandle<(Duration, reqwest::Response)> {
    tokio::spawn(async move {
        let started = Instant::now();
        let response = request.send().await.expect("request sent");
        (started.elapsed(), response)
    })
}

/// Alice's `GET` of a job with `Prefer: wait=N`, not yet sent.
fn waiting_get(app: &TestApp, job_id: &str, seconds: u64) -> reqwest::RequestBuilder {
    app.client
        .get(app.url(&format!("/api/v1/jobs/{job_id}")))
        .bearer_auth(&app.alice.token)
        .header("Prefer", format!("wait={seconds}"))
}

fn header<'a>(response: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    response.headers().get(name).and_then(|v| v.to_str().ok())
}

async fn error_of(response: reqwest::Response, status: StatusCode, code: &str) -> Value {
    assert_eq!(response.status(), status);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], code, "{body:#}");
    assert!(body["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
    assert!(body["error"]["type"].is_string());
    body
}

async fn a_chat_completion_answers_in_openais_shape_and_a_retry_replays_it(backend: TestBackend) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.set_default(Behaviour::AnswerText("Hello there.".into()));
    let app = spawn_app_with(backend, chat_config(&upstream, 30)).await;

    let first = chat(&app, Some("chat-1"), &hello("Hi")).await;
    assert_eq!(first.status(), StatusCode::OK);
    let job_id = header(&first, "x-onejob-job-id").unwrap().to_owned();
    assert!(header(&first, "idempotent-replayed").is_none());
    let body: Value = first.json().await.unwrap();
    assert_eq!(body["id"], format!("chatcmpl-{job_id}"));
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "gpt-safe");
    assert!(body["created"].as_i64().unwrap() > 1_700_000_000);
    assert_eq!(body["choices"][0]["index"], 0);
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(body["choices"][0]["message"]["content"], "Hello there.");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert!(body["usage"]["total_tokens"].is_u64(), "{body:#}");

    let again = chat(&app, Some("chat-1"), &hello("Hi")).await;
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(header(&again, "idempotent-replayed"), Some("true"));
    assert_eq!(header(&again, "x-onejob-job-id"), Some(job_id.as_str()));
    let replayed: Value = again.json().await.unwrap();
    assert_eq!(replayed, body, "a replay is the same answer");
    assert_eq!(upstream.total_requests(), 1, "one upstream call");

    // The job is an ordinary job of the API too.
    let job = app.get_job(&app.alice.token, &job_id).await;
    assert_eq!(job["task"], "gpt-safe");
    assert_eq!(job["status"], "succeeded");
    assert_eq!(job["input"], hello("Hi"));
}

async fn the_request_reaches_the_upstream_as_sent_with_the_providers_model_and_no_stream(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.set_default(Behaviour::AnswerText("ok".into()));
    let mut config = chat_config(&upstream, 30);
    config.providers[0].max_tokens_field = onejob::providers::MaxTokensField::MaxCompletionTokens;
    let app = spawn_app_with(backend, config).await;
    let mut body = hello("Hi");
    body["temperature"] = json!(0.25);
    body["stream"] = json!(false);
    body["user"] = json!("end-user-7");
    let response = chat(&app, Some("as-sent"), &body).await;
    assert_eq!(response.status(), StatusCode::OK);
    let sent = upstream.last_request().unwrap();
    // `base_url` ended in /v1; the path has it once.
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(sent.body["model"], "fake-model");
    assert_eq!(sent.body["messages"], body["messages"]);
    assert_eq!(sent.body["temperature"], 0.25);
    assert_eq!(sent.body["user"], "end-user-7");
    assert!(sent.body.get("stream").is_none(), "{:#}", sent.body);
    // A reasoning model's limit goes under the name it accepts.
    assert_eq!(sent.body["max_completion_tokens"], 20);
    assert!(sent.body.get("max_tokens").is_none());
}

/// docs/configuration.md: a provider's `max_tokens` and `temperature`
/// apply to a chat request that sets none of its own, on both kinds.
async fn a_chat_request_without_a_limit_or_temperature_gets_the_providers(backend: TestBackend) {
    let openai = FakeProvider::start(Shape::OpenAi).await;
    let claude = FakeProvider::start(Shape::Anthropic).await;
    for upstream in [&openai, &claude] {
        upstream.set_default(Behaviour::AnswerText("ok".into()));
    }
    let settings = "max_tokens = 77\ntemperature = 0.4";
    let mut config = config_of(&format!(
        r#"{}{}
[[tasks]]
name = "via-openai"
kind = "chat"
providers = ["up"]

[[tasks]]
name = "via-claude"
kind = "chat"
providers = ["claude"]
"#,
        ProviderToml::openai("up", &openai.base_url)
            .with(settings)
            .toml(),
        ProviderToml::anthropic("claude", &claude.base_url)
            .with(settings)
            .toml(),
    ));
    for provider in &mut config.providers {
        provider.timeout_ms = 30_000;
    }
    config.server.max_wait_seconds = 30;
    let app = spawn_app_with(backend, config).await;
    for (route, upstream) in [("via-openai", &openai), ("via-claude", &claude)] {
        let bare = json!({"model": route, "messages": [{"role": "user", "content": "Hi"}]});
        let response = chat(&app, Some(&format!("{route}-bare")), &bare).await;
        assert_eq!(response.status(), StatusCode::OK, "{route}");
        let sent = upstream.last_request().unwrap();
        assert_eq!(sent.body["max_tokens"], 77, "{route}: {:#}", sent.body);
        assert_eq!(sent.body["temperature"], 0.4, "{route}: {:#}", sent.body);

        let mut own = bare.clone();
        own["max_tokens"] = json!(12);
        own["temperature"] = json!(0.9);
        let response = chat(&app, Some(&format!("{route}-own")), &own).await;
        assert_eq!(response.status(), StatusCode::OK, "{route}");
        let sent = upstream.last_request().unwrap();
        assert_eq!(
            sent.body["max_tokens"], 12,
            "{route}: the request's own wins"
        );
        assert_eq!(
            sent.body["temperature"], 0.9,
            "{route}: the request's own wins"
        );
    }
}

async fn an_anthropic_provider_serves_a_chat_route(backend: TestBackend) {
    let claude = FakeProvider::start(Shape::Anthropic).await;
    claude.set_default(Behaviour::AnswerText("Bonjour.".into()));
    let mut config = config_of(&format!(
        r#"{}
[[tasks]]
name = "gpt-safe"
kind = "chat"
providers = ["claude"]
"#,
        ProviderToml::anthropic("claude", &claude.base_url).toml()
    ));
    config.server.max_wait_seconds = 30;
    let app = spawn_app_with(backend, config).await;
    let response = chat(&app, Some("to-claude"), &hello("Say hello in French")).await;
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], "Bonjour.");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let sent = claude.last_request().unwrap();
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.body["system"], "Be brief.");
    assert_eq!(
        sent.body["messages"],
        json!([{"role": "user", "content": "Say hello in French"}])
    );
    assert_eq!(sent.body["max_tokens"], 20);
}

async fn twenty_concurrent_duplicates_make_one_upstream_call_and_get_one_answer(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.set_default(Behaviour::Hold);
    let app = spawn_app_with(backend, chat_config(&upstream, 30)).await;
    let calls: Vec<_> = (0..20)
        .map(|_| in_background(chat_request(&app, "storm", &hello("Hi"))))
        .collect();
    // Every duplicate is in: one call reached the upstream and is held.
    let held = upstream.wait_held_count(1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(upstream.total_requests(), 1);
    upstream.release(&held[0], Behaviour::AnswerText("Only once.".into()));
    let mut answers = Vec::new();
    for call in calls {
        let (_, response) = call.await.unwrap();
        let status = response.status();
        let job = header(&response, "x-onejob-job-id").map(str::to_owned);
        answers.push((status, job, response.json::<Value>().await.unwrap()));
    }
    let first = &answers[0];
    for (status, job, body) in &answers {
        assert_eq!(*status, StatusCode::OK, "{body:#}");
        assert_eq!(job, &first.1, "every duplicate joined one job");
        assert_eq!(body["choices"][0]["message"]["content"], "Only once.");
        assert_eq!(body["id"], first.2["id"]);
    }
    assert_eq!(upstream.total_requests(), 1, "one upstream call in all");
    assert_eq!(app.job_count(&app.alice.id).await, 1);
}

async fn a_wait_that_ends_first_is_a_retryable_503_and_the_retry_rejoins_the_job(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.set_default(Behaviour::Hold);
    let app = spawn_app_with(backend, chat_config(&upstream, 1)).await;
    let started = Instant::now();
    let response = chat(&app, Some("slow"), &hello("Hi")).await;
    assert!(started.elapsed() >= Duration::from_millis(900));
    assert_eq!(header(&response, "retry-after"), Some("1"));
    assert_eq!(header(&response, "x-should-retry"), Some("true"));
    let job_id = header(&response, "x-onejob-job-id").unwrap().to_owned();
    error_of(response, StatusCode::SERVICE_UNAVAILABLE, "job_in_progress").await;

    let held = upstream.wait_held_count(1).await;
    let retry = in_background(chat_request(&app, "slow", &hello("Hi")));
    tokio::time::sleep(Duration::from_millis(200)).await;
    upstream.release(&held[0], Behaviour::AnswerText("Late but once.".into()));
    let (_, retry) = retry.await.unwrap();
    assert_eq!(retry.status(), StatusCode::OK);
    assert_eq!(header(&retry, "x-onejob-job-id"), Some(job_id.as_str()));
    assert_eq!(header(&retry, "idempotent-replayed"), Some("true"));
    let body: Value = retry.json().await.unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], "Late but once.");
    assert_eq!(upstream.total_requests(), 1);
}

async fn a_failed_job_is_a_424_the_sdk_does_not_retry(backend: TestBackend) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.set_default(Behaviour::Status {
        status: 400,
        retry_after: None,
        body: r#"{"error": {"message": "context too long"}}"#.into(),
    });
    let app = spawn_app_with(backend, chat_config(&upstream, 30)).await;
    let response = chat(&app, Some("doomed"), &hello("Hi")).await;
    assert_eq!(header(&response, "x-should-retry"), Some("false"));
    assert!(header(&response, "x-onejob-job-id").is_some());
    let body = error_of(response, StatusCode::FAILED_DEPENDENCY, "job_failed").await;
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("400"), "{message}");
    // The same failure on a retry, without another call.
    let again = chat(&app, Some("doomed"), &hello("Hi")).await;
    error_of(again, StatusCode::FAILED_DEPENDENCY, "job_failed").await;
    assert_eq!(upstream.total_requests(), 1);
}

async fn the_same_key_with_other_messages_is_a_409_conflict(backend: TestBackend) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.set_default(Behaviour::AnswerText("ok".into()));
    let app = spawn_app_with(backend, chat_config(&upstream, 30)).await;
    assert_eq!(
        chat(&app, Some("k"), &hello("Hi")).await.status(),
        StatusCode::OK
    );
    let conflict = chat(&app, Some("k"), &hello("Something else")).await;
    assert_eq!(header(&conflict, "x-should-retry"), Some("false"));
    let body = error_of(conflict, StatusCode::CONFLICT, "idempotency_key_reused").await;
    assert_eq!(body["error"]["type"], "conflict_error");
    // Key order and spacing do not make another request.
    let same = r#"{"max_tokens":20,"messages":[{"content":"Be brief.","role":"system"},{"role":"user","content":"Hi"}],"model":"gpt-safe"}"#;
    let reordered = app
        .client
        .post(app.url("/v1/chat/completions"))
        .bearer_auth(&app.alice.token)
        .header("Idempotency-Key", "k")
        .header("Content-Type", "application/json")
        .body(same)
        .send()
        .await
        .unwrap();
    assert_eq!(reordered.status(), StatusCode::OK);
    assert_eq!(upstream.total_requests(), 1);
}

/// The `data:` payloads of an event stream.
fn events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|event| event.lines().find_map(|line| line.strip_prefix("data: ")))
        .map(str::to_owned)
        .collect()
}

async fn streaming_sends_the_answer_as_chunks_and_a_replay_streams_too(backend: TestBackend) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.set_default(Behaviour::AnswerText("Streamed.".into()));
    let app = spawn_app_with(backend, chat_config(&upstream, 30)).await;
    let mut body = hello("Hi");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    for attempt in 0..2 {
        let response = chat(&app, Some("streaming"), &body).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert!(header(&response, "content-type")
            .unwrap()
            .starts_with("text/event-stream"));
        assert_eq!(
            header(&response, "idempotent-replayed").is_some(),
            attempt == 1
        );
        let text = response.text().await.unwrap();
        let events = events(&text);
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{text}");
        let chunks: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        let content: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(content, "Streamed.");
        assert!(chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk"));
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        assert!(chunks
            .iter()
            .any(|c| c["choices"][0]["finish_reason"] == "stop"));
        let usage = chunks.last().unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert!(usage["usage"]["total_tokens"].is_u64());
    }
    assert_eq!(upstream.total_requests(), 1);
    // Asked to stream; an upstream that answers whole anyway is handed on
    // as it came.
    assert_eq!(upstream.last_request().unwrap().body["stream"], true);
}

async fn requests_without_a_key_a_model_or_a_token_are_refused_in_openais_shape(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    let app = spawn_app_with(backend, chat_config(&upstream, 30)).await;

    let missing = chat(&app, None, &hello("Hi")).await;
    assert_eq!(header(&missing, "x-should-retry"), Some("false"));
    let body = error_of(missing, StatusCode::BAD_REQUEST, "missing_idempotency_key").await;
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains(r#"extra_headers={"Idempotency-Key""#));

    let mut other = hello("Hi");
    other["model"] = json!("gpt-7");
    error_of(
        chat(&app, Some("m1"), &other).await,
        StatusCode::NOT_FOUND,
        "model_not_found",
    )
    .await;
    // A prompt task is not a chat route.
    other["model"] = json!("summarize");
    error_of(
        chat(&app, Some("m2"), &other).await,
        StatusCode::NOT_FOUND,
        "model_not_found",
    )
    .await;
    let empty = json!({"model": "gpt-safe", "messages": []});
    let body = error_of(
        chat(&app, Some("m3"), &empty).await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("messages"));
    let no_model = json!({"messages": [{"role": "user", "content": "Hi"}]});
    error_of(
        chat(&app, Some("m4"), &no_model).await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;
    let broken = app
        .client
        .post(app.url("/v1/chat/completions"))
        .bearer_auth(&app.alice.token)
        .header("Idempotency-Key", "m5")
        .header("Content-Type", "application/json")
        .body("{\"model\":")
        .send()
        .await
        .unwrap();
    error_of(broken, StatusCode::BAD_REQUEST, "invalid_json").await;

    let anonymous = app
        .client
        .post(app.url("/v1/chat/completions"))
        .header("Idempotency-Key", "m6")
        .json(&hello("Hi"))
        .send()
        .await
        .unwrap();
    error_of(anonymous, StatusCode::UNAUTHORIZED, "invalid_api_key").await;
    let unknown = app.get(&app.alice.token, "/v1/embeddings").await;
    error_of(unknown, StatusCode::NOT_FOUND, "unknown_url").await;

    assert_eq!(upstream.total_requests(), 0);
    assert_eq!(
        app.job_count(&app.alice.id).await,
        0,
        "refusals store nothing"
    );
}

async fn models_lists_the_chat_routes(backend: TestBackend) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    let app = spawn_app_with(backend, chat_config(&upstream, 30)).await;
    let list: Value = app
        .get(&app.alice.token, "/v1/models")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(list["object"], "list");
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["gpt-safe"], "prompt tasks are not models");
    let one: Value = app
        .get(&app.alice.token, "/v1/models/gpt-safe")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(one["id"], "gpt-safe");
    assert_eq!(one["object"], "model");
    error_of(
        app.get(&app.alice.token, "/v1/models/summarize").await,
        StatusCode::NOT_FOUND,
        "model_not_found",
    )
    .await;
    let anonymous = app.client.get(app.url("/v1/models")).send().await.unwrap();
    error_of(anonymous, StatusCode::UNAUTHORIZED, "invalid_api_key").await;
}

async fn prefer_wait_holds_the_answer_until_the_job_is_done(backend: TestBackend) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.set_default(Behaviour::Delay {
        ms: 300,
        then: Box::new(Behaviour::Answer(json!({"summary": "waited"}))),
    });
    let app = spawn_app_with(backend, chat_config(&upstream, 5)).await;
    let body = json!({"task": "summarize", "input": {"text": "a"}});
    let response = app
        .client
        .post(app.url("/api/v1/jobs"))
        .bearer_auth(&app.alice.token)
        .header("Idempotency-Key", "wait-1")
        .header("Prefer", "respond-async, wait=30")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(
        header(&response, "preference-applied"),
        Some("wait=5"),
        "capped at max_wait_seconds"
    );
    let job: Value = response.json().await.unwrap();
    assert_eq!(job["status"], "succeeded", "{job:#}");

    // Without the preference, the answer does not wait.
    upstream.set_default(Behaviour::Hold);
    let quick = app
        .client
        .post(app.url("/api/v1/jobs"))
        .bearer_auth(&app.alice.token)
        .header("Idempotency-Key", "wait-2")
        .json(&json!({"task": "summarize", "input": {"text": "b"}}))
        .send()
        .await
        .unwrap();
    assert!(header(&quick, "preference-applied").is_none());
    let quick: Value = quick.json().await.unwrap();
    assert_ne!(quick["status"], "succeeded");
    let id = quick["id"].as_str().unwrap().to_owned();

    // A GET waits the time asked, then answers with the job as it is.
    let started = Instant::now();
    let response = waiting_get(&app, &id, 1).send().await.unwrap();
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(900), "{waited:?}");
    assert_eq!(header(&response, "preference-applied"), Some("wait=1"));
    let job: Value = response.json().await.unwrap();
    assert_eq!(job["status"], "running");

    // And returns as soon as the job finishes.
    let held = upstream.wait_held_count(1).await;
    let waiter = in_background(waiting_get(&app, &id, 5));
    tokio::time::sleep(Duration::from_millis(300)).await;
    upstream.release(&held[0], Behaviour::Answer(json!({"summary": "released"})));
    let (waited, response) = waiter.await.unwrap();
    let job: Value = response.json().await.unwrap();
    assert_eq!(job["status"], "succeeded");
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    // Another owner's job is not found, wait or not.
    let other = app
        .client
        .get(app.url(&format!("/api/v1/jobs/{id}")))
        .bearer_auth(&app.bob.token)
        .header("Prefer", "wait=2")
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::NOT_FOUND);
}

async fn prefer_wait_sees_a_job_another_process_finished(backend: TestBackend) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.set_default(Behaviour::Hold);
    let mut config = chat_config(&upstream, 10);
    // This instance does no work: the other one claims and finishes the job.
    config.worker.concurrency = 0;
    let app = spawn_app_with(backend, config).await;
    let id = app
        .create_job(
            &app.alice.token,
            "elsewhere",
            &json!({"task": "summarize", "input": {"text": "x"}}),
        )
        .await;
    let waiter = in_background(waiting_get(&app, &id, 10));
    let (_, _other, other_server) =
        start_instance(chat_config(&upstream, 10), app.store.clone()).await;
    let held = upstream.wait_held_count(1).await;
    let started = Instant::now();
    upstream.release(&held[0], Behaviour::Answer(json!({"summary": "from afar"})));
    let job: Value = waiter.await.unwrap().1.json().await.unwrap();
    assert_eq!(job["status"], "succeeded", "{job:#}");
    assert_eq!(job["result"]["summary"], "from afar");
    assert!(started.elapsed() < Duration::from_secs(3));
    other_server.abort();
}

async fn undeclared_methods_answer_405_with_allow(backend: TestBackend) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    let app = spawn_app_with(backend, chat_config(&upstream, 30)).await;
    let send = |method: reqwest::Method, path: &str| {
        app.client
            .request(method, app.url(path))
            .bearer_auth(&app.alice.token)
            .send()
    };
    let api = send(reqwest::Method::DELETE, "/api/v1/jobs").await.unwrap();
    assert_eq!(api.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(header(&api, "allow"), Some("GET, HEAD, POST"));
    assert_eq!(
        header(&api, "content-type"),
        Some("application/problem+json")
    );
    let problem: Value = api.json().await.unwrap();
    assert_eq!(problem["type"], "/problems/method-not-allowed");

    let chat = send(reqwest::Method::GET, "/v1/chat/completions")
        .await
        .unwrap();
    assert_eq!(chat.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(header(&chat, "allow"), Some("POST"));
    let body: Value = chat.json().await.unwrap();
    assert_eq!(body["error"]["code"], "method_not_allowed");

    let page = send(reqwest::Method::PUT, "/jobs/new").await.unwrap();
    assert_eq!(page.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(header(&page, "allow"), Some("GET, HEAD"));
    assert!(header(&page, "content-type")
        .unwrap()
        .starts_with("text/html"));

    // Unknown paths are still 404.
    let missing = send(reqwest::Method::GET, "/api/v1/nothing").await.unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
}

async fn waiting_requests_hold_no_database_connection(backend: TestBackend) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.set_default(Behaviour::Hold);
    let mut config = chat_config(&upstream, 10);
    config.database.pool_size = 3;
    config.database.pool_timeout_ms = 1000;
    let app = spawn_app_with(backend, config).await;
    let id = app
        .create_job(
            &app.alice.token,
            "held",
            &json!({"task": "summarize", "input": {"text": "x"}}),
        )
        .await;
    let held = upstream.wait_held_count(1).await;
    // Twelve waiters, four times the pool.
    let waiters: Vec<_> = (0..12)
        .map(|_| in_background(waiting_get(&app, &id, 10)))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // While they wait, the pool still serves everyone else at once.
    for n in 0..5 {
        let started = Instant::now();
        let response = app
            .post_job(
                &app.bob.token,
                &format!("meanwhile-{n}"),
                &json!({"task": "summarize", "input": {"text": "y"}}),
            )
            .await;
        assert_eq!(response.status(), StatusCode::CREATED);
        assert!(started.elapsed() < Duration::from_millis(900));
    }
    upstream.release(&held[0], Behaviour::Answer(json!({"summary": "done"})));
    for waiter in waiters {
        let job: Value = waiter.await.unwrap().1.json().await.unwrap();
        assert_eq!(job["status"], "succeeded");
    }
}

/// Item: replays ignore today's route table. A chat completion made while
/// `gpt-safe` was a chat route is replayed by a process whose configuration
/// made it a prompt task; a new request for it there is `model_not_found`.
async fn a_replay_is_answered_whatever_todays_routes(backend: TestBackend) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.set_default(Behaviour::AnswerText("Hello there.".into()));
    let app = spawn_app_with(backend, chat_config(&upstream, 10)).await;
    let first = chat(&app, Some("before-the-change"), &hello("hi")).await;
    assert_eq!(first.status(), StatusCode::OK);
    let first: Value = first.json().await.unwrap();

    let changed = chat_toml(&upstream).replace(
        "name = \"gpt-safe\"\nkind = \"chat\"\nproviders = [\"up\"]",
        "name = \"gpt-safe\"\nproviders = [\"up\"]\ninput_fields = [\"text\"]\n\
         template = \"Now a prompt: {{ text }}\"",
    );
    assert_ne!(changed, chat_toml(&upstream), "the route was changed");
    let (next, _, _server) = start_instance(chat_config_of(&changed, 10), app.store.clone()).await;
    let send = |key: &str| {
        app.client
            .post(format!("{next}/v1/chat/completions"))
            .bearer_auth(&app.alice.token)
            .header("Idempotency-Key", key)
            .json(&hello("hi"))
            .send()
    };
    let replay = send("before-the-change").await.unwrap();
    assert_eq!(replay.status(), StatusCode::OK, "the replay is answered");
    assert_eq!(header(&replay, "Idempotent-Replayed"), Some("true"));
    let replayed: Value = replay.json().await.unwrap();
    assert_eq!(replayed, first, "the same answer");
    let fresh = send("after-the-change").await.unwrap();
    let body = error_of(fresh, StatusCode::NOT_FOUND, "model_not_found").await;
    assert_eq!(body["error"]["param"], "model");
    assert_eq!(upstream.total_requests(), 1, "one call in all");
}

/// Item: what only a person can move on is answered at once. A duplicate
/// of a job whose attempt is unknown is `outcome_unknown` without waiting
/// `max_wait_seconds`; once support abandons the attempt, leaving the job
/// pending with nothing in flight, a duplicate is a clear 409 naming the
/// job and what support must do, not "still running" forever.
async fn a_duplicate_of_an_unknown_job_or_one_waiting_for_support_is_answered_at_once(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.push(Behaviour::Hold);
    let mut config = chat_config(&upstream, 5);
    config.providers[0].timeout_ms = 400;
    let app = spawn_app_with(backend, config).await;
    let first = in_background(chat_request(&app, "stuck", &hello("hi")));
    let attempt_id = upstream.wait_held_count(1).await.remove(0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let job_id = loop {
        let jobs: Value = app
            .get(&app.alice.token, "/api/v1/jobs")
            .await
            .json()
            .await
            .unwrap();
        let job = &jobs["jobs"][0];
        if job["status"] == "unknown" {
            break job["id"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "{jobs:#}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };

    let started = Instant::now();
    let duplicate = chat(&app, Some("stuck"), &hello("hi")).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "answered at once, not after max_wait_seconds: {:?}",
        started.elapsed()
    );
    assert_eq!(header(&duplicate, "x-should-retry"), Some("true"));
    assert_eq!(header(&duplicate, "X-Onejob-Job-Id"), Some(job_id.as_str()));
    error_of(
        duplicate,
        StatusCode::SERVICE_UNAVAILABLE,
        "outcome_unknown",
    )
    .await;

    assert_eq!(
        app.abandon(&app.sue.token, &attempt_id, "provider lost it")
            .await
            .status(),
        StatusCode::OK
    );
    let started = Instant::now();
    let stalled = chat(&app, Some("stuck"), &hello("hi")).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(header(&stalled, "x-should-retry"), Some("false"));
    assert_eq!(header(&stalled, "X-Onejob-Job-Id"), Some(job_id.as_str()));
    let body = error_of(stalled, StatusCode::CONFLICT, "job_needs_support").await;
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&job_id)
            && message.contains("no attempt in flight")
            && message.contains(&format!("POST /api/v1/jobs/{job_id}/attempts")),
        "{message}"
    );
    // The first request's wait ends after the abandon: the same answer.
    let (_, first) = first.await.unwrap();
    error_of(first, StatusCode::CONFLICT, "job_needs_support").await;
    assert_eq!(upstream.total_requests(), 1, "one call in all");
}

/// Every statement a chat completion sends, from the token's look-up to
/// the compare-and-swap, is prepared once per connection and kept: none is
/// parsed and planned again on the next request. (diesel keeps no
/// `UPDATE`, no `IN` list and no raw SQL prepared unless told to:
/// `store::prepared`.) Transaction control (`BEGIN`, savepoints) is the
/// exception, as short as a statement gets. The owner has a budget, so
/// its reservation and settlement are on the path too.
async fn every_statement_of_an_answer_is_prepared_once(backend: TestBackend) {
    use crate::support::harness::PreparedApp;
    use crate::support::statement_log::StatementLog;
    use onejob::domain::ledger::{BudgetLimits, Reservation};
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    let log = StatementLog::new();
    let prepared = PreparedApp::new(backend, chat_config(&upstream, 10)).await;
    // Set before the recording starts: only the answers' statements count.
    let (store, alice) = (prepared.store.clone(), prepared.alice.id.clone());
    tokio::task::spawn_blocking(move || {
        let limits = BudgetLimits {
            spend_micros: None,
            tokens: Some(1_000_000_000),
        };
        let now = onejob::domain::Timestamp::now();
        onejob::store::budgets::set_limits(
            &mut store.conn().unwrap(),
            &alice,
            limits,
            Reservation::default(),
            now,
        )
        .unwrap();
    })
    .await
    .unwrap();
    let app = prepared.recording(&log).await.start().await;
    for n in 0..3 {
        let key = format!("prepared-{n}");
        assert_eq!(chat(&app, Some(&key), &hello("hi")).await.status(), 200);
    }
    let cached = assert_every_statement_was_kept(&log);
    assert!(
        cached.iter().any(|sql| sql.contains("budget_reservations")),
        "no budget statement was on the path: {cached:#?}"
    );
}

/// Asserts that every statement `log` recorded, but transaction control,
/// came from diesel's statement cache; returns those it cached.
fn assert_every_statement_was_kept(
    log: &crate::support::statement_log::StatementLog,
) -> std::collections::HashSet<String> {
    let cached: std::collections::HashSet<String> = log.take_cached().into_iter().collect();
    let control = [
        "BEGIN",
        "COMMIT",
        "ROLLBACK",
        "SAVEPOINT",
        "RELEASE",
        "SET ",
        "PRAGMA",
    ];
    let mut prepared_each_time: Vec<String> = log
        .take()
        .iter()
        .map(|sent| sent.split(" -- binds: ").next().unwrap_or(sent).to_owned())
        .filter(|sql| !control.iter().any(|c| sql.to_uppercase().starts_with(c)))
        .filter(|sql| !cached.contains(sql))
        .collect();
    prepared_each_time.sort();
    prepared_each_time.dedup();
    assert!(
        prepared_each_time.is_empty(),
        "prepared anew on every run: {prepared_each_time:#?}"
    );
    cached
}

/// onejob on [`chat_config`] with a wait of 10 s, every statement it sends
/// recorded in `log`.
async fn recording_chat_app(
    backend: TestBackend,
    upstream: &FakeProvider,
    log: &crate::support::statement_log::StatementLog,
) -> TestApp {
    crate::support::harness::PreparedApp::new(backend, chat_config(upstream, 10))
        .await
        .recording(log)
        .await
        .start()
        .await
}

/// A call the provider refuses takes the failure's path: the attempt and
/// its job recorded failed, and the call counted in the usage ledger. Each
/// of its statements, too, is prepared once per connection and kept.
async fn every_statement_of_a_refused_call_is_prepared_once(backend: TestBackend) {
    use crate::support::statement_log::StatementLog;
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.set_default(Behaviour::Status {
        status: 400,
        retry_after: None,
        body: r#"{"error":{"message":"refused"}}"#.into(),
    });
    let log = StatementLog::new();
    let app = recording_chat_app(backend, &upstream, &log).await;
    for n in 0..3 {
        let key = format!("refused-{n}");
        let response = chat(&app, Some(&key), &hello("hi")).await;
        assert_eq!(response.status(), StatusCode::FAILED_DEPENDENCY);
    }
    assert_eq!(upstream.total_requests(), 3, "one call a job, none retried");
    let cached = assert_every_statement_was_kept(&log);
    assert!(
        cached.iter().any(|sql| sql.contains("usage_ledger")),
        "the refused calls were not counted: {cached:#?}"
    );
}

/// A request waiting for its answer reads no more than the answer needs.
/// The compare-and-swap returns the job's row (on PostgreSQL, its one
/// statement returns every column of the job it changed) and the waiter in
/// the same process answers from it: nothing reads the job, or its
/// attempts, after the statement that decided it.
async fn a_waiter_reads_no_more_than_its_answer_needs(backend: TestBackend) {
    use crate::support::statement_log::StatementLog;
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    let log = StatementLog::new();
    let app = recording_chat_app(backend, &upstream, &log).await;
    // The first request warms the worker; the second is the one looked at.
    assert_eq!(chat(&app, Some("warm"), &hello("hi")).await.status(), 200);
    log.take();
    let response = chat(&app, Some("looked-at"), &hello("hello")).await;
    assert_eq!(response.status(), 200);
    let job_id = response.headers()["X-Onejob-Job-Id"]
        .to_str()
        .unwrap()
        .to_owned();
    let answer: Value = response.json().await.unwrap();
    assert!(
        answer["choices"][0]["message"]["content"].is_string(),
        "{answer}"
    );
    let statements = log.take();
    // The compare-and-swap: how it starts, and what else it holds.
    let (cas_starts, cas_holds, jobs, attempts) = match backend {
        TestBackend::Sqlite => (
            "UPDATE `jobs`",
            "RETURNING",
            "FROM `jobs`",
            "FROM `attempts`",
        ),
        // A plain win: one statement (`store::plain_win`).
        TestBackend::Postgres => (
            "WITH j AS",
            "UPDATE attempts",
            "FROM \"jobs\"",
            "FROM \"attempts\"",
        ),
    };
    let cas = statements
        .iter()
        .position(|s| s.starts_with(cas_starts) && s.contains(cas_holds))
        .unwrap_or_else(|| panic!("no compare-and-swap among {statements:#?}"));
    let reads_after = |table: &str| -> Vec<&String> {
        statements[cas..]
            .iter()
            .filter(|s| s.starts_with("SELECT") && s.contains(table) && s.contains(&job_id))
            .collect()
    };
    assert!(
        reads_after(jobs).is_empty(),
        "job {job_id} was read after its compare-and-swap: {:#?}",
        reads_after(jobs)
    );
    assert!(
        reads_after(attempts).is_empty(),
        "its attempts were read after its compare-and-swap: {:#?}",
        reads_after(attempts)
    );
}
