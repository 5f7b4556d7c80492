//! `POST /v1/messages`, Anthropic's Messages wire format (docs/api.md,
//! "/v1/messages"), and Anthropic upstreams that stream, against fake
//! upstreams over real HTTP: the same exactly-once rules as Chat
//! Completions, Anthropic's shapes for answers, streams and errors.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::fake_provider::{
    config_of, Behaviour, FakeProvider, ProviderToml, Shape, StreamStep,
};
use crate::support::harness::{chat_request, spawn_app_with, TestApp, TestBackend};
use crate::support::sse::{content_of, text_of, SseEvent, SseReader};

on_both_backends!(
    a_message_answers_in_anthropics_shape_and_a_retry_with_a_bearer_replays_it,
    an_anthropic_provider_serves_messages_whole_and_streamed,
    a_bad_token_or_a_malformed_body_is_refused_in_anthropics_shape_and_creates_nothing,
    the_same_key_with_another_body_is_a_409_and_reaches_no_provider,
    a_streamed_message_follows_the_job_and_is_the_stored_answer,
    a_reconnect_with_last_event_id_resumes_after_the_event_it_names,
    an_anthropic_upstream_streams_to_chat_completions_as_chunks,
    twenty_concurrent_duplicates_make_one_upstream_call_and_one_message,
    an_anthropic_error_event_after_a_chunk_fails_the_job_and_ends_the_stream_with_an_error,
    tools_reach_either_kind_of_provider_and_tool_calls_come_back_as_tool_use,
    a_follower_past_the_cap_is_refused_in_anthropics_shape,
    a_stop_sequence_the_provider_stopped_at_comes_back_as_stop_sequence,
    a_retry_of_a_message_whose_input_an_earlier_release_derived_otherwise_is_a_replay,
);

/// How long an upstream may go quiet between chunks: longer than any wait
/// of a test at a gate.
const PATIENT_MS: u64 = 10_000;

/// The chat route `via-openai` on the OpenAI-compatible `openai`, and
/// `via-claude` on the Anthropic `claude`.
fn config(openai: &FakeProvider, claude: &FakeProvider) -> onejob::config::Config {
    let patient = format!("idle_timeout_ms = {PATIENT_MS}");
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
        ProviderToml::openai("up", &format!("{}/v1", openai.base_url))
            .timeout_ms(10_000)
            .with(&patient)
            .toml(),
        ProviderToml::anthropic("claude", &claude.base_url)
            .timeout_ms(10_000)
            .with(&patient)
            .toml(),
    ));
    config.server.max_wait_seconds = 20;
    config
}

async fn start(backend: TestBackend) -> (TestApp, FakeProvider, FakeProvider) {
    let openai = FakeProvider::start(Shape::OpenAi).await;
    let claude = FakeProvider::start(Shape::Anthropic).await;
    let app = spawn_app_with(backend, config(&openai, &claude)).await;
    (app, openai, claude)
}

/// A Messages request to `model`.
fn hello(model: &str, text: &str) -> Value {
    json!({
        "model": model,
        "max_tokens": 20,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
        "stop_sequences": ["END"],
    })
}

/// Alice's Messages request under `key`, her token as `x-api-key` (as the
/// Anthropic SDK sends it), not yet sent.
fn messages(app: &TestApp, key: &str, body: &Value) -> reqwest::RequestBuilder {
    app.client
        .post(app.url("/v1/messages"))
        .header("x-api-key", &app.alice.token)
        .header("anthropic-version", "2023-06-01")
        .header("Idempotency-Key", key)
        .json(body)
}

fn header<'a>(response: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    response.headers().get(name).and_then(|v| v.to_str().ok())
}

/// An Anthropic-shaped error of `kind` with `status`; its message.
async fn anthropic_error(response: reqwest::Response, status: StatusCode, kind: &str) -> String {
    assert_eq!(response.status(), status);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["type"], "error", "{body:#}");
    assert_eq!(body["error"]["type"], kind, "{body:#}");
    body["error"]["message"]
        .as_str()
        .filter(|m| !m.is_empty())
        .expect("a message")
        .to_owned()
}

async fn open_stream(request: reqwest::RequestBuilder) -> SseReader {
    let response = request.send().await.expect("request sent");
    assert_eq!(response.status(), StatusCode::OK);
    SseReader::new(response)
}

/// Events until one carries text (returned last).
async fn until_text(reader: &mut SseReader) -> Vec<SseEvent> {
    let mut events = Vec::new();
    loop {
        let event = reader.next().await.expect("a text delta before the end");
        let text = event.event.as_deref() == Some("content_block_delta");
        events.push(event);
        if text {
            return events;
        }
    }
}

fn names(events: &[SseEvent]) -> Vec<&str> {
    events.iter().filter_map(|e| e.event.as_deref()).collect()
}

fn job_id_of(events: &[SseEvent]) -> String {
    events[0].json()["message"]["id"]
        .as_str()
        .and_then(|id| id.strip_prefix("msg_"))
        .expect("message_start names the job")
        .to_owned()
}

/// The one attempt id the upstream has been sent, once it has.
async fn the_request_id(upstream: &FakeProvider) -> String {
    upstream.wait_requests(1).await;
    let ids = upstream.request_ids();
    assert_eq!(ids.len(), 1, "{ids:?}");
    ids[0].clone()
}

/// The job's stored answer, once it succeeded.
async fn stored_answer(app: &TestApp, job_id: &str) -> Value {
    app.wait_for_job(job_id, crate::support::fake_provider::WAIT, |j| {
        j["status"] == "succeeded"
    })
    .await["result"]
        .clone()
}

async fn a_message_answers_in_anthropics_shape_and_a_retry_with_a_bearer_replays_it(
    backend: TestBackend,
) {
    let (app, openai, _claude) = start(backend).await;
    openai.set_default(Behaviour::AnswerText("Hello there.".into()));
    let body = hello("via-openai", "Say hello");
    let response = messages(&app, "m-1", &body).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let job_id = header(&response, "x-onejob-job-id").unwrap().to_owned();
    assert_eq!(header(&response, "idempotent-replayed"), None);
    let message: Value = response.json().await.unwrap();
    assert_eq!(
        message,
        json!({
            "id": format!("msg_{job_id}"),
            "type": "message",
            "role": "assistant",
            "model": "via-openai",
            "content": [{"type": "text", "text": "Hello there."}],
            "stop_reason": "end_turn",
            "stop_sequence": null,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        })
    );
    // The OpenAI-compatible upstream got the conversation translated.
    let sent = openai.last_request().unwrap();
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(
        sent.body["messages"],
        json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Say hello"}]},
        ])
    );
    assert_eq!(sent.body["max_tokens"], 20);
    assert_eq!(sent.body["stop"], json!(["END"]));
    assert_eq!(sent.body["model"], "fake-model");

    // The same key and body, the token as a bearer this time: the same job.
    let retry = app
        .client
        .post(app.url("/v1/messages"))
        .bearer_auth(&app.alice.token)
        .header("Idempotency-Key", "m-1")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(retry.status(), StatusCode::OK);
    assert_eq!(header(&retry, "idempotent-replayed"), Some("true"));
    assert_eq!(header(&retry, "x-onejob-job-id"), Some(job_id.as_str()));
    assert_eq!(retry.json::<Value>().await.unwrap(), message);
    assert_eq!(
        openai.total_requests(),
        1,
        "one upstream call for two requests"
    );
    assert_eq!(app.job_count(&app.alice.id).await, 1);
}

async fn an_anthropic_provider_serves_messages_whole_and_streamed(backend: TestBackend) {
    let (app, openai, claude) = start(backend).await;
    claude.push(Behaviour::AnswerText("Bonjour.".into()));
    let response = messages(&app, "to-claude", &hello("via-claude", "Hello in French"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let message: Value = response.json().await.unwrap();
    assert_eq!(
        message["content"],
        json!([{"type": "text", "text": "Bonjour."}])
    );
    assert_eq!(message["stop_reason"], "end_turn");
    let sent = claude.last_request().unwrap();
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.body["system"], "Be brief.");
    // The client's blocks reach Anthropic as it sent them.
    assert_eq!(
        sent.body["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "Hello in French"}]}])
    );
    assert_eq!(sent.body["stop_sequences"], json!(["END"]));
    assert!(
        sent.body.get("stream").is_none(),
        "not streamed unless asked"
    );

    // Streamed: the Anthropic upstream streams, and its events reach the
    // client as Anthropic's events again.
    claude.push(Behaviour::stream_of(&["Bon", "jour", "."]));
    let mut body = hello("via-claude", "Stream it");
    body["stream"] = json!(true);
    let events = open_stream(messages(&app, "to-claude-streamed", &body))
        .await
        .rest()
        .await;
    assert_eq!(text_of(&events), "Bonjour.");
    assert_eq!(claude.last_request().unwrap().body["stream"], true);
    let answer = stored_answer(&app, &job_id_of(&events)).await;
    assert_eq!(answer["message"]["content"], "Bonjour.");
    let end = events
        .iter()
        .find(|e| e.event.as_deref() == Some("message_delta"));
    assert_eq!(
        end.unwrap().json()["usage"],
        json!({"input_tokens": 3, "output_tokens": 3}),
        "the upstream's usage"
    );
    assert_eq!(claude.total_requests(), 2);
    assert_eq!(openai.total_requests(), 0);
}

async fn a_bad_token_or_a_malformed_body_is_refused_in_anthropics_shape_and_creates_nothing(
    backend: TestBackend,
) {
    let (app, openai, _claude) = start(backend).await;
    let body = hello("via-openai", "Hi");
    let url = app.url("/v1/messages");

    let bad_key = app
        .client
        .post(&url)
        .header("x-api-key", "not-a-token")
        .header("Idempotency-Key", "bad-token")
        .json(&body)
        .send()
        .await
        .unwrap();
    anthropic_error(bad_key, StatusCode::UNAUTHORIZED, "authentication_error").await;
    let bad_bearer = app
        .client
        .post(&url)
        .bearer_auth("not-a-token")
        .header("Idempotency-Key", "bad-token")
        .json(&body)
        .send()
        .await
        .unwrap();
    anthropic_error(bad_bearer, StatusCode::UNAUTHORIZED, "authentication_error").await;
    let none = app
        .client
        .post(&url)
        .header("Idempotency-Key", "no-token")
        .json(&body)
        .send()
        .await
        .unwrap();
    let message = anthropic_error(none, StatusCode::UNAUTHORIZED, "authentication_error").await;
    assert!(message.contains("x-api-key"), "{message}");

    let malformed = app
        .client
        .post(&url)
        .header("x-api-key", &app.alice.token)
        .header("Idempotency-Key", "malformed")
        .header("content-type", "application/json")
        .body("{\"model\": \"via-openai\", \"messages\": [")
        .send()
        .await
        .unwrap();
    anthropic_error(malformed, StatusCode::BAD_REQUEST, "invalid_request_error").await;
    let mut no_limit = body.clone();
    no_limit.as_object_mut().unwrap().remove("max_tokens");
    let message = anthropic_error(
        messages(&app, "no-limit", &no_limit).send().await.unwrap(),
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
    )
    .await;
    assert!(message.starts_with("max_tokens"), "{message}");
    let image = json!({"model": "via-openai", "max_tokens": 5, "messages": [{"role": "user",
        "content": [{"type": "image", "source": {"type": "base64", "data": "AA=="}}]}]});
    anthropic_error(
        messages(&app, "image", &image).send().await.unwrap(),
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
    )
    .await;
    let no_key = app
        .client
        .post(&url)
        .header("x-api-key", &app.alice.token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(header(&no_key, "x-should-retry"), Some("false"));
    let message = anthropic_error(no_key, StatusCode::BAD_REQUEST, "invalid_request_error").await;
    assert!(message.contains("extra_headers"), "{message}");
    let unknown = anthropic_error(
        messages(&app, "unknown-model", &hello("claude-none", "Hi"))
            .send()
            .await
            .unwrap(),
        StatusCode::NOT_FOUND,
        "not_found_error",
    )
    .await;
    assert!(unknown.contains("claude-none"), "{unknown}");
    // Deep nesting, past the server's limit: refused, and the server goes on.
    let deep = format!(
        "{{\"model\":\"via-openai\",\"max_tokens\":5,\"metadata\":{}1{},\"messages\":[{{\"role\":\"user\",\"content\":\"x\"}}]}}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let deep = app
        .client
        .post(&url)
        .header("x-api-key", &app.alice.token)
        .header("Idempotency-Key", "deep")
        .header("content-type", "application/json")
        .body(deep)
        .send()
        .await
        .unwrap();
    assert!(deep.status().is_client_error(), "{}", deep.status());
    let refusal: Value = deep.json().await.unwrap();
    assert_eq!(refusal["type"], "error", "{refusal:#}");
    let get = app
        .client
        .get(&url)
        .header("x-api-key", &app.alice.token)
        .send()
        .await
        .unwrap();
    assert_eq!(header(&get, "allow"), Some("POST"));
    anthropic_error(get, StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error").await;

    assert_eq!(app.job_count(&app.alice.id).await, 0, "nothing was created");
    assert_eq!(openai.total_requests(), 0);
    // The keys stay free: the corrected request is accepted.
    openai.set_default(Behaviour::AnswerText("ok".into()));
    let fixed = messages(&app, "no-limit", &body).send().await.unwrap();
    assert_eq!(fixed.status(), StatusCode::OK, "{:?}", fixed.text().await);
}

async fn the_same_key_with_another_body_is_a_409_and_reaches_no_provider(backend: TestBackend) {
    let (app, openai, _claude) = start(backend).await;
    openai.set_default(Behaviour::AnswerText("first".into()));
    let first = messages(&app, "reused", &hello("via-openai", "first"))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let job_id = header(&first, "x-onejob-job-id").unwrap().to_owned();
    let other = messages(&app, "reused", &hello("via-openai", "another"))
        .send()
        .await
        .unwrap();
    assert_eq!(header(&other, "x-should-retry"), Some("false"));
    anthropic_error(other, StatusCode::CONFLICT, "invalid_request_error").await;
    // Key order and spacing are not another body; a member onejob does not
    // pass on (`metadata`) is.
    let reordered = r#"{"stop_sequences":["END"],"messages":[{"content":[{"text":"first","type":"text"}],"role":"user"}],
        "system":"Be brief.","max_tokens":20.0,"model":"via-openai"}"#;
    let same = app
        .client
        .post(app.url("/v1/messages"))
        .header("x-api-key", &app.alice.token)
        .header("Idempotency-Key", "reused")
        .header("content-type", "application/json")
        .body(reordered)
        .send()
        .await
        .unwrap();
    assert_eq!(same.status(), StatusCode::OK);
    assert_eq!(header(&same, "x-onejob-job-id"), Some(job_id.as_str()));
    let mut tagged = hello("via-openai", "first");
    tagged["metadata"] = json!({"user_id": "u-1"});
    let tagged = messages(&app, "reused", &tagged).send().await.unwrap();
    anthropic_error(tagged, StatusCode::CONFLICT, "invalid_request_error").await;
    // A Chat Completions request under the key is another intent too.
    let chat = json!({"model": "via-openai", "max_tokens": 20, "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "first"}]}], "stop": ["END"]});
    let chat = chat_request(&app, "reused", &chat).send().await.unwrap();
    assert_eq!(chat.status(), StatusCode::CONFLICT);
    assert_eq!(openai.total_requests(), 1, "only the first body reached it");
    assert_eq!(app.job_count(&app.alice.id).await, 1);
}

async fn a_streamed_message_follows_the_job_and_is_the_stored_answer(backend: TestBackend) {
    let (app, openai, _claude) = start(backend).await;
    openai.push(Behaviour::Stream(vec![
        StreamStep::Text("one ".into()),
        StreamStep::Gate,
        StreamStep::Text("two ".into()),
        StreamStep::Text("three".into()),
    ]));
    let mut body = hello("via-openai", "count");
    body["stream"] = json!(true);
    let mut reader = open_stream(messages(&app, "streamed", &body)).await;
    let request_id = the_request_id(&openai).await;
    let mut seen = until_text(&mut reader).await;
    assert_eq!(text_of(&seen), "one ");
    openai.wait_gate(&request_id, 1).await;
    assert_eq!(
        openai.chunks_sent(&request_id),
        1,
        "the client saw chunk 1 while the upstream was held before chunk 2"
    );
    // A duplicate joins the same generation from its first token.
    let mut twin = open_stream(messages(&app, "streamed", &body)).await;
    let twin_start = until_text(&mut twin).await;
    assert_eq!(
        twin_start, seen,
        "the duplicate's stream so far is the same"
    );
    openai.open_gate(&request_id);
    seen.extend(reader.rest().await);
    assert_eq!(
        names(&seen),
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    assert!(seen.iter().all(|e| e.id.is_some()), "an id on every event");
    assert!(
        seen.iter()
            .all(|e| e.json()["type"] == e.event.as_deref().unwrap()),
        "each event's data names it"
    );
    let ids: Vec<&str> = seen.iter().filter_map(|e| e.id.as_deref()).collect();
    assert_eq!(ids, ["0", "1", "1", "2", "3", "4", "5", "6"]);
    assert_eq!(text_of(&seen), "one two three");
    let finish = seen[6].json();
    assert_eq!(finish["delta"]["stop_reason"], "end_turn");
    let mut twin_rest = twin_start.clone();
    twin_rest.extend(twin.rest().await);
    assert_eq!(twin_rest, seen, "the duplicate got the same events");

    // What was streamed is the stored answer, and the message a replay or
    // a non-streamed reading of the job gives.
    let job_id = job_id_of(&seen);
    let answer = stored_answer(&app, &job_id).await;
    assert_eq!(answer["message"]["content"], "one two three");
    let replay = open_stream(messages(&app, "streamed", &body))
        .await
        .rest()
        .await;
    assert_eq!(replay, seen, "a replay after completion is the same stream");
    assert_eq!(openai.total_requests(), 1, "one upstream call in all");
    assert_eq!(openai.last_request().unwrap().body["stream"], true);
}

async fn a_reconnect_with_last_event_id_resumes_after_the_event_it_names(backend: TestBackend) {
    let (app, openai, _claude) = start(backend).await;
    openai.push(Behaviour::Stream(vec![
        StreamStep::Text("w".into()),
        StreamStep::Text("x".into()),
        StreamStep::Gate,
        StreamStep::Text("y".into()),
        StreamStep::Text("z".into()),
    ]));
    let mut body = hello("via-openai", "resume");
    body["stream"] = json!(true);
    let mut first = open_stream(messages(&app, "resume", &body)).await;
    let request_id = the_request_id(&openai).await;
    let mut seen = until_text(&mut first).await;
    seen.extend(until_text(&mut first).await);
    assert_eq!(text_of(&seen), "wx");
    drop(first);

    // Live: after event 1 comes chunk 2's delta, in the block already open.
    let mut resumed =
        open_stream(messages(&app, "resume", &body).header("Last-Event-ID", "1")).await;
    let next = resumed.next().await.unwrap();
    assert_eq!(next.id.as_deref(), Some("2"));
    assert_eq!(next.event.as_deref(), Some("content_block_delta"));
    assert_eq!(next.json()["delta"]["text"], "x");
    assert_eq!(next.json()["index"], 0);
    openai.open_gate(&request_id);
    let rest = resumed.rest().await;
    assert_eq!(text_of(&rest), "yz");
    let ids: Vec<&str> = rest.iter().filter_map(|e| e.id.as_deref()).collect();
    assert_eq!(ids, ["3", "4", "5", "6", "7"]);
    assert_eq!(
        names(&rest),
        [
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );

    // After completion: from the stored chunks.
    let after = open_stream(messages(&app, "resume", &body).header("Last-Event-ID", "3"))
        .await
        .rest()
        .await;
    assert_eq!(after[0].id.as_deref(), Some("4"));
    assert_eq!(text_of(&after), "z");
    assert_eq!(names(&after).last(), Some(&"message_stop"));

    // An id that is not one is refused, in Anthropic's shape.
    let refused = messages(&app, "resume", &body)
        .header("Last-Event-ID", "chunk-two")
        .send()
        .await
        .unwrap();
    anthropic_error(refused, StatusCode::BAD_REQUEST, "invalid_request_error").await;
    assert_eq!(openai.total_requests(), 1);
}

async fn an_anthropic_upstream_streams_to_chat_completions_as_chunks(backend: TestBackend) {
    let (app, _openai, claude) = start(backend).await;
    claude.push(Behaviour::Stream(vec![
        StreamStep::Text("Hel".into()),
        StreamStep::Gate,
        StreamStep::Text("lo".into()),
    ]));
    let body = json!({
        "model": "via-claude",
        "messages": [{"role": "user", "content": "Hi"}],
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let mut reader = open_stream(chat_request(&app, "chunks", &body)).await;
    let request_id = the_request_id(&claude).await;
    let mut seen = reader.until_content().await;
    assert_eq!(content_of(&seen), "Hel");
    claude.wait_gate(&request_id, 1).await;
    assert_eq!(
        claude.chunks_sent(&request_id),
        1,
        "the chunk arrived while the upstream was held"
    );
    claude.open_gate(&request_id);
    seen.extend(reader.rest().await);
    assert_eq!(content_of(&seen), "Hello");
    assert!(seen.iter().all(|e| e.id.is_some()));
    for event in &seen[..seen.len() - 1] {
        assert_eq!(event.json()["object"], "chat.completion.chunk", "{event:?}");
    }
    assert!(seen.last().unwrap().is_done());
    let finish = &seen[seen.len() - 3].json();
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    let usage = &seen[seen.len() - 2].json();
    assert_eq!(
        usage["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}),
        "Anthropic's usage, in OpenAI's names"
    );

    // The upstream was asked to stream, in Anthropic's terms.
    let sent = claude.last_request().unwrap();
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.body["stream"], true);
    assert!(sent.body.get("stream_options").is_none(), "{:#}", sent.body);

    // The stored answer is what was streamed, and a replay streams it again.
    let job_id = seen[0].json()["id"]
        .as_str()
        .and_then(|id| id.strip_prefix("chatcmpl-"))
        .unwrap()
        .to_owned();
    let answer = stored_answer(&app, &job_id).await;
    assert_eq!(answer["message"]["content"], "Hello");
    let replay = open_stream(chat_request(&app, "chunks", &body))
        .await
        .rest()
        .await;
    assert_eq!(replay, seen);
    assert_eq!(claude.total_requests(), 1);
}

async fn twenty_concurrent_duplicates_make_one_upstream_call_and_one_message(backend: TestBackend) {
    let (app, openai, _claude) = start(backend).await;
    openai.set_default(Behaviour::Hold);
    let body = hello("via-openai", "Hi");
    let calls: Vec<_> = (0..20)
        .map(|_| tokio::spawn(messages(&app, "storm", &body).send()))
        .collect();
    // Every duplicate is in: one call reached the upstream and is held.
    let held = openai.wait_held_count(1).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(openai.total_requests(), 1);
    openai.release(&held[0], Behaviour::AnswerText("Only once.".into()));
    let mut ids = std::collections::BTreeSet::new();
    for call in calls {
        let response = call.await.unwrap().expect("request sent");
        assert_eq!(response.status(), StatusCode::OK);
        let message: Value = response.json().await.unwrap();
        assert_eq!(message["content"][0]["text"], "Only once.");
        ids.insert(message["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(ids.len(), 1, "one message for twenty requests: {ids:?}");
    assert_eq!(openai.total_requests(), 1, "one upstream call in all");
    assert_eq!(app.job_count(&app.alice.id).await, 1);
}

async fn an_anthropic_error_event_after_a_chunk_fails_the_job_and_ends_the_stream_with_an_error(
    backend: TestBackend,
) {
    let (app, _openai, claude) = start(backend).await;
    claude.push(Behaviour::Stream(vec![
        StreamStep::Text("partial".into()),
        StreamStep::Error("Overloaded".into()),
    ]));
    let mut body = hello("via-claude", "fail midway");
    body["stream"] = json!(true);
    let events = open_stream(messages(&app, "midway", &body))
        .await
        .rest()
        .await;
    assert_eq!(text_of(&events), "partial");
    let last = events.last().unwrap();
    assert_eq!(last.event.as_deref(), Some("error"), "{events:#?}");
    assert_eq!(last.json()["error"]["type"], "api_error", "{events:#?}");
    assert!(
        !names(&events).contains(&"message_stop"),
        "no second answer, no end of message: {events:#?}"
    );
    let job = app
        .wait_for_job(
            &job_id_of(&events),
            crate::support::fake_provider::WAIT,
            |j| j["status"] == "failed",
        )
        .await;
    assert_eq!(job["attempts"].as_array().unwrap().len(), 1, "{job:#}");
    assert_eq!(claude.total_requests(), 1);
}

async fn tools_reach_either_kind_of_provider_and_tool_calls_come_back_as_tool_use(
    backend: TestBackend,
) {
    let (app, openai, claude) = start(backend).await;
    let weather = json!({"name": "weather", "description": "The weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}});
    let body = |model: &str| {
        json!({
            "model": model,
            "max_tokens": 50,
            "tools": [weather],
            "tool_choice": {"type": "any"},
            "messages": [
                {"role": "user", "content": "Weather in Oslo, then Rome?"},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "rain"}]},
            ],
        })
    };
    let tool_use =
        json!([{"type": "tool_use", "id": "call_2", "name": "weather", "input": {"city": "Rome"}}]);

    // An OpenAI-compatible provider gets functions, tool calls and tool messages.
    openai.push(Behaviour::Status {
        status: 200,
        retry_after: None,
        body: json!({"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": "fake-model",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
                "tool_calls": [{"id": "call_2", "type": "function",
                                "function": {"name": "weather", "arguments": "{\"city\":\"Rome\"}"}}]}}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}})
        .to_string(),
    });
    let response = messages(&app, "tools-openai", &body("via-openai"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let message: Value = response.json().await.unwrap();
    assert_eq!(message["content"], tool_use, "{message:#}");
    assert_eq!(message["stop_reason"], "tool_use");
    let sent = openai.last_request().unwrap().body;
    assert_eq!(
        sent["tools"],
        json!([{"type": "function", "function": {"name": "weather", "description": "The weather in a city",
                "parameters": weather["input_schema"]}}])
    );
    assert_eq!(sent["tool_choice"], "required");
    assert_eq!(
        sent["messages"][1],
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "toolu_1", "type": "function",
               "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}}]})
    );
    assert_eq!(
        sent["messages"][2],
        json!({"role": "tool", "tool_call_id": "toolu_1", "content": "rain"})
    );

    // An Anthropic provider gets them back in Anthropic's terms.
    claude.push(Behaviour::Status {
        status: 200,
        retry_after: None,
        body: json!({"id": "msg_fake", "type": "message", "role": "assistant", "model": "fake-model",
            "content": tool_use, "stop_reason": "tool_use", "usage": {"input_tokens": 9, "output_tokens": 4}})
        .to_string(),
    });
    let response = messages(&app, "tools-claude", &body("via-claude"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let message: Value = response.json().await.unwrap();
    assert_eq!(message["content"], tool_use, "{message:#}");
    assert_eq!(message["stop_reason"], "tool_use");
    let sent = claude.last_request().unwrap().body;
    assert_eq!(sent["tools"], json!([weather]));
    assert_eq!(sent["tool_choice"], json!({"type": "any"}));
    assert_eq!(sent["messages"], body("via-claude")["messages"], "{sent:#}");
}

/// A streamed message's follower past `server.max_followers_per_job` gets
/// a `429` in Anthropic's shape, with the retry the SDK makes on its own;
/// the stream it would have joined goes on, from one upstream call.
async fn a_follower_past_the_cap_is_refused_in_anthropics_shape(backend: TestBackend) {
    let openai = FakeProvider::start(Shape::OpenAi).await;
    let claude = FakeProvider::start(Shape::Anthropic).await;
    let mut config = config(&openai, &claude);
    config.server.max_followers_per_job = 1;
    let app = spawn_app_with(backend, config).await;
    openai.push(Behaviour::Stream(vec![
        StreamStep::Text("held ".into()),
        StreamStep::Gate,
        StreamStep::Text("open".into()),
    ]));
    let mut body = hello("via-openai", "capped");
    body["stream"] = json!(true);
    let mut first = open_stream(messages(&app, "capped", &body)).await;
    let request_id = the_request_id(&openai).await;
    let mut seen = until_text(&mut first).await;

    let refused = messages(&app, "capped", &body).send().await.unwrap();
    assert_eq!(header(&refused, "retry-after"), Some("1"));
    assert_eq!(header(&refused, "x-should-retry"), Some("true"));
    let message = anthropic_error(refused, StatusCode::TOO_MANY_REQUESTS, "rate_limit_error").await;
    assert!(message.contains("max_followers_per_job"), "{message}");

    openai.wait_gate(&request_id, 1).await;
    openai.open_gate(&request_id);
    seen.extend(first.rest().await);
    assert_eq!(text_of(&seen), "held open");
    assert_eq!(openai.total_requests(), 1, "one upstream call");
}

/// An Anthropic provider that stops at one of the request's stop sequences
/// says so (`stop_reason: "stop_sequence"` and which one): the client of
/// `/v1/messages` gets both back, whole and streamed, and the stored answer
/// keeps which sequence it was. Not `end_turn`.
async fn a_stop_sequence_the_provider_stopped_at_comes_back_as_stop_sequence(backend: TestBackend) {
    let (app, _openai, claude) = start(backend).await;
    claude.push(Behaviour::AnswerText("One, two END three.".into()));
    let response = messages(&app, "stops", &hello("via-claude", "Count"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let message: Value = response.json().await.unwrap();
    assert_eq!(
        message["content"],
        json!([{"type": "text", "text": "One, two "}])
    );
    assert_eq!(message["stop_reason"], "stop_sequence");
    assert_eq!(message["stop_sequence"], "END");

    claude.push(Behaviour::stream_of(&["One, ", "two ", "END three."]));
    let mut body = hello("via-claude", "Count again");
    body["stream"] = json!(true);
    let events = open_stream(messages(&app, "stops-streamed", &body))
        .await
        .rest()
        .await;
    assert_eq!(text_of(&events), "One, two ");
    let end = events
        .iter()
        .find(|e| e.event.as_deref() == Some("message_delta"))
        .unwrap()
        .json();
    assert_eq!(end["delta"]["stop_reason"], "stop_sequence");
    assert_eq!(end["delta"]["stop_sequence"], "END");
    let answer = stored_answer(&app, &job_id_of(&events)).await;
    assert_eq!(answer["stop_sequence"], "END");
    assert_eq!(answer["finish_reason"], "stop");
}

/// A job made by an earlier release keeps the input that release derived
/// from the body (and a fingerprint of it). Its retry after an upgrade,
/// the same body under the same key, is still a replay, never a 409 or a
/// second call; another body is still a 409.
async fn a_retry_of_a_message_whose_input_an_earlier_release_derived_otherwise_is_a_replay(
    backend: TestBackend,
) {
    use diesel::prelude::*;
    use onejob::domain::{Fingerprint, JobIntent};
    use onejob::store::schema::jobs;

    let (app, openai, _claude) = start(backend).await;
    openai.set_default(Behaviour::AnswerText("first".into()));
    let body = hello("via-openai", "first");
    let first = messages(&app, "upgraded", &body).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let job_id = header(&first, "x-onejob-job-id").unwrap().to_owned();
    // As an earlier release stored it: the blocks flattened to a string.
    let (id, earlier) = (
        job_id.clone(),
        r#"{"model":"via-openai","max_tokens":20,"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"first"}],"stop":["END"]}"#,
    );
    let rewritten = app
        .with_conn(move |conn| {
            let (task, params): (String, String) = jobs::table
                .filter(jobs::id.eq(&id))
                .select((jobs::task, jobs::params))
                .first(conn)
                .unwrap();
            let fingerprint = Fingerprint::of(&JobIntent {
                task: &task,
                input: earlier,
                params: &params,
                provider: None,
            })
            .unwrap();
            diesel::update(jobs::table.filter(jobs::id.eq(&id)))
                .set((
                    jobs::input.eq(earlier),
                    jobs::fingerprint.eq(fingerprint.as_str()),
                ))
                .execute(conn)
                .unwrap()
        })
        .await;
    assert_eq!(rewritten, 1);
    let retry = messages(&app, "upgraded", &body).send().await.unwrap();
    assert_eq!(retry.status(), StatusCode::OK);
    assert_eq!(header(&retry, "idempotent-replayed"), Some("true"));
    assert_eq!(header(&retry, "x-onejob-job-id"), Some(job_id.as_str()));
    assert_eq!(openai.total_requests(), 1, "no second upstream call");
    let other = messages(&app, "upgraded", &hello("via-openai", "another"))
        .send()
        .await
        .unwrap();
    anthropic_error(other, StatusCode::CONFLICT, "invalid_request_error").await;
}
