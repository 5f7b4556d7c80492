//! The `gemini` provider kind (docs/providers.md), against a fake that
//! checks what the Gemini API checks (`Shape::Gemini`): the method in the
//! path, the key in `x-goog-api-key` and never in the URL, `alt=sse` for a
//! stream, turns of `user` and `model`. Tasks and chats, whole and
//! streamed, tools and structured output; `RESOURCE_EXHAUSTED` and its
//! retry delay, safety blocks and timeouts classified as for any provider.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::fake_provider::{
    answer, config_of, Behaviour, FakeProvider, ProviderToml, Shape, WAIT,
};
use crate::support::harness::{spawn_app_with, summarize, TestApp, TestBackend, FAKE_API_KEY};
use crate::support::sse::{content_of, SseReader};

/// `summarize` (with an output schema) and the chat route `gemini-chat` on
/// the Gemini provider `gem`.
fn gemini_config(fake: &FakeProvider) -> onejob::config::Config {
    let mut config = config_of(&format!(
        r#"{}
[[tasks]]
name = "summarize"
providers = ["gem"]
input_fields = ["text"]
template = "Summarize: {{{{ text }}}}"
output_schema = {{ type = "object", required = ["summary"], properties = {{ summary = {{ type = "string" }} }} }}

[[tasks]]
name = "gemini-chat"
kind = "chat"
providers = ["gem"]
"#,
        ProviderToml::gemini("gem", &fake.base_url)
            .timeout_ms(3_000)
            .toml()
    ));
    config.server.max_wait_seconds = 20;
    config
}

async fn start(backend: TestBackend) -> (TestApp, FakeProvider) {
    let fake = FakeProvider::start(Shape::Gemini).await;
    let app = spawn_app_with(backend, gemini_config(&fake)).await;
    (app, fake)
}

async fn chat(app: &TestApp, key: &str, body: Value) -> reqwest::Response {
    app.client
        .post(app.url("/v1/chat/completions"))
        .bearer_auth(&app.alice.token)
        .header("Idempotency-Key", key)
        .json(&body)
        .send()
        .await
        .unwrap()
}

fn with(mut body: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn hello() -> Value {
    json!({"model": "gemini-chat", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"}]})
}

/// A task's structured output, a chat, a tool round trip and a stream:
/// each to the method's path with the key in `x-goog-api-key`, in Gemini's
/// terms (`contents`, `systemInstruction`, `functionDeclarations`,
/// `responseJsonSchema`).
async fn a_gemini_model_serves_tasks_chats_tools_and_streams(backend: TestBackend) {
    let (app, fake) = start(backend).await;
    fake.push(answer("done"));
    let job = app
        .create_job(&app.alice.token, "task", &summarize("a long text"))
        .await;
    let done = app.wait_for_status(&job, "succeeded", WAIT).await;
    assert_eq!(done["result"], json!({"summary": "done"}));
    let sent = fake.last_request().unwrap();
    assert_eq!(sent.path, "/v1beta/models/gemini-2.5-flash:generateContent");
    assert_eq!(sent.header("x-goog-api-key"), Some(FAKE_API_KEY));
    assert_eq!(sent.body["contents"][0]["role"], "user");
    assert_eq!(
        sent.body["generationConfig"]["responseMimeType"],
        "application/json"
    );
    assert_eq!(
        sent.body["generationConfig"]["responseJsonSchema"]["required"],
        json!(["summary"])
    );

    fake.push(Behaviour::AnswerText("Hello there.".into()));
    let answered: Value = chat(&app, "chat", hello()).await.json().await.unwrap();
    assert_eq!(answered["choices"][0]["message"]["content"], "Hello there.");
    let sent = fake.last_request().unwrap();
    assert_eq!(
        sent.body["systemInstruction"],
        json!({"parts": [{"text": "Be brief."}]})
    );
    assert_eq!(
        sent.body["contents"],
        json!([{"role": "user", "parts": [{"text": "Hi"}]}])
    );

    // A function call out, and its result back in, named after the call.
    let tools = json!([{"type": "function", "function": {"name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let called = json!({"candidates": [{"content": {"role": "model", "parts": [
        {"functionCall": {"name": "weather", "args": {"city": "Oslo"}}}]}, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 4, "totalTokenCount": 13}});
    fake.push(Behaviour::Status {
        status: 200,
        retry_after: None,
        body: called.to_string(),
    });
    let asked: Value = chat(&app, "tool", with(hello(), json!({"tools": tools})))
        .await
        .json()
        .await
        .unwrap();
    let message = &asked["choices"][0]["message"];
    assert_eq!(asked["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(message["tool_calls"][0]["function"]["name"], "weather");
    assert_eq!(
        message["tool_calls"][0]["function"]["arguments"],
        "{\"city\":\"Oslo\"}"
    );
    assert_eq!(
        fake.last_request().unwrap().body["tools"][0]["functionDeclarations"][0]["name"],
        "weather"
    );
    let call_id = message["tool_calls"][0]["id"].as_str().unwrap();
    fake.push(Behaviour::AnswerText("Sunny in Oslo.".into()));
    let second = with(
        hello(),
        json!({"tools": tools, "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            message.clone(),
            {"role": "tool", "tool_call_id": call_id, "content": "{\"sky\":\"sunny\"}"},
        ]}),
    );
    let replied: Value = chat(&app, "tool-2", second).await.json().await.unwrap();
    assert_eq!(
        replied["choices"][0]["message"]["content"],
        "Sunny in Oslo."
    );
    let sent = fake.last_request().unwrap();
    assert_eq!(
        sent.body["contents"][2],
        json!({"role": "user", "parts": [{"functionResponse": {"name": "weather",
            "response": {"sky": "sunny"}}}]})
    );

    // Streamed: `alt=sse`, each event a whole response.
    fake.push(Behaviour::stream_of(&["Hel", "lo."]));
    let streamed = chat(&app, "stream", with(hello(), json!({"stream": true}))).await;
    assert_eq!(streamed.status(), StatusCode::OK);
    let events = SseReader::new(streamed).rest().await;
    assert_eq!(content_of(&events), "Hello.");
    assert_eq!(
        fake.last_request().unwrap().path,
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    );
}

/// `RESOURCE_EXHAUSTED` is a rate limit whose wait is the body's
/// `retryDelay`: the same model is asked again after it, and the job
/// succeeds. A blocked prompt and an answer stopped for `SAFETY` are
/// definite failures naming why. A call past the soft timeout is unknown.
async fn geminis_rate_limits_safety_blocks_and_timeouts_are_classified(backend: TestBackend) {
    let (app, fake) = start(backend).await;
    fake.push(Behaviour::Status {
        status: 429,
        retry_after: None,
        body: json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED",
            "message": "You exceeded your current quota. Please retry in 1.2s.",
            "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1.2s"}]}})
        .to_string(),
    });
    fake.push(answer("after the wait"));
    let started = Instant::now();
    let limited = app
        .create_job(&app.alice.token, "limited", &summarize("a"))
        .await;
    let done = app.wait_for_status(&limited, "succeeded", WAIT).await;
    assert_eq!(done["result"], json!({"summary": "after the wait"}));
    assert_eq!(fake.total_requests(), 2);
    assert!(
        started.elapsed() >= Duration::from_millis(1_200),
        "the retry waited for the body's retryDelay: {:?}",
        started.elapsed()
    );

    for (key, body, why) in [
        (
            "safety",
            json!({"candidates": [{"content": {"role": "model", "parts": []}, "finishReason": "SAFETY",
                "safetyRatings": [{"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH"}]}]}),
            "the provider stopped the answer: SAFETY",
        ),
        (
            "blocked",
            json!({"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}}),
            "the provider blocked the prompt: PROHIBITED_CONTENT",
        ),
    ] {
        fake.push(Behaviour::Status {
            status: 200,
            retry_after: None,
            body: body.to_string(),
        });
        let job = app.create_job(&app.alice.token, key, &summarize(key)).await;
        let failed = app.wait_for_status(&job, "failed", WAIT).await;
        let error = failed["attempts"][0]["error"].as_str().unwrap_or_default();
        assert!(error.contains(why), "{failed}");
    }

    fake.push(Behaviour::Hang);
    let slow = app
        .create_job(&app.alice.token, "slow", &summarize("c"))
        .await;
    let unknown = app
        .wait_for_status(&slow, "unknown", Duration::from_secs(15))
        .await;
    assert_eq!(unknown["attempts"][0]["state"], "unknown");
}

/// The fake refuses what the Gemini API refuses: a key in the URL, no key,
/// another key, a stream without `alt=sse`, another path.
#[tokio::test]
async fn the_gemini_fake_refuses_what_gemini_refuses() {
    let fake = FakeProvider::start(Shape::Gemini).await;
    let client = reqwest::Client::new();
    let body = json!({"contents": [{"role": "user", "parts": [{"text": "Hi"}]}]});
    for (path, key, status) in [
        (
            format!("/v1beta/models/m:generateContent?key={FAKE_API_KEY}"),
            None,
            400,
        ),
        ("/v1beta/models/m:generateContent".to_owned(), None, 403),
        (
            "/v1beta/models/m:generateContent".to_owned(),
            Some("another-key"),
            400,
        ),
        (
            "/v1beta/models/m:streamGenerateContent".to_owned(),
            Some(FAKE_API_KEY),
            400,
        ),
        ("/v1/chat/completions".to_owned(), Some(FAKE_API_KEY), 404),
    ] {
        let mut request = client.post(format!("{}{path}", fake.base_url)).json(&body);
        if let Some(key) = key {
            request = request.header("x-goog-api-key", key);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{path}");
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"]["code"], status, "{path}");
    }
}

on_both_backends!(
    a_gemini_model_serves_tasks_chats_tools_and_streams,
    geminis_rate_limits_safety_blocks_and_timeouts_are_classified,
);
