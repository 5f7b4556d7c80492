//! The `azure_openai` provider kind (docs/providers.md), against a fake
//! that checks what Azure OpenAI checks (`Shape::Azure`): a deployment's
//! path, a required `api-version`, an `api-key` or an Entra ID bearer
//! token. Tasks and chats, whole and streamed, tools and structured output;
//! its rate limits, its content filter and its timeouts classified as for
//! any provider.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::fake_provider::{
    answer, config_of, Behaviour, FakeProvider, ProviderToml, Shape, WAIT,
};
use crate::support::harness::{spawn_app_with, summarize, TestApp, TestBackend, FAKE_API_KEY};
use crate::support::sse::{content_of, SseReader};

const DEPLOYMENT: &str = "gpt4o-prod";
const PATH: &str = "/openai/deployments/gpt4o-prod/chat/completions?api-version=2024-10-21";

/// `summarize` (with an output schema) and the chat route `gpt-azure` on
/// the Azure provider `az`.
fn azure_config(fake: &FakeProvider, provider: ProviderToml) -> onejob::config::Config {
    let _ = fake;
    let mut config = config_of(&format!(
        r#"{}
[[tasks]]
name = "summarize"
providers = ["az"]
input_fields = ["text"]
template = "Summarize: {{{{ text }}}}"
output_schema = {{ type = "object", required = ["summary"], properties = {{ summary = {{ type = "string" }} }} }}

[[tasks]]
name = "gpt-azure"
kind = "chat"
providers = ["az"]
"#,
        provider.toml()
    ));
    config.server.max_wait_seconds = 20;
    config
}

async fn start(backend: TestBackend, bearer: bool) -> (TestApp, FakeProvider) {
    let fake = FakeProvider::start(Shape::Azure).await;
    let mut provider = ProviderToml::azure("az", &fake.base_url, DEPLOYMENT).timeout_ms(3_000);
    if bearer {
        provider = provider.bearer_token();
    }
    let app = spawn_app_with(backend, azure_config(&fake, provider)).await;
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

fn hello(extra: Value) -> Value {
    let mut body = json!({"model": "gpt-azure", "messages": [{"role": "user", "content": "Hi"}]});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// A task with an output schema, a chat, a tool call and a stream, each
/// sent to the deployment's path with the `api-version` and the key as
/// `api-key`, with no `model` member (the deployment names the model).
async fn an_azure_deployment_serves_tasks_chats_tools_and_streams(backend: TestBackend) {
    let (app, fake) = start(backend, false).await;
    fake.push(answer("done"));
    let job = app
        .create_job(&app.alice.token, "task", &summarize("a long text"))
        .await;
    let done = app.wait_for_status(&job, "succeeded", WAIT).await;
    assert_eq!(done["result"], json!({"summary": "done"}));
    let sent = fake.last_request().unwrap();
    assert_eq!(sent.path, PATH);
    assert_eq!(sent.header("api-key"), Some(FAKE_API_KEY));
    assert_eq!(sent.header("authorization"), None);
    assert!(sent.body.get("model").is_none(), "{}", sent.body);
    assert_eq!(sent.body["response_format"]["type"], "json_schema");
    assert_eq!(
        sent.body["response_format"]["json_schema"]["schema"]["required"],
        json!(["summary"])
    );

    fake.push(Behaviour::AnswerText("Hello there.".into()));
    let answered = chat(&app, "chat", hello(json!({}))).await;
    assert_eq!(answered.status(), StatusCode::OK);
    let answered: Value = answered.json().await.unwrap();
    assert_eq!(answered["choices"][0]["message"]["content"], "Hello there.");

    // A tool call out, and the round trip's second turn in.
    let tools = json!([{"type": "function", "function": {"name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let called = json!({"id": "chatcmpl-az", "object": "chat.completion", "created": 0,
        "model": "gpt-4o", "choices": [{"index": 0, "finish_reason": "tool_calls",
            "message": {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
                "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}}]}}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}});
    fake.push(Behaviour::Status {
        status: 200,
        retry_after: None,
        body: called.to_string(),
    });
    let asked = chat(&app, "tool", hello(json!({"tools": tools}))).await;
    let asked: Value = asked.json().await.unwrap();
    assert_eq!(asked["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(
        asked["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "weather"
    );
    assert_eq!(fake.last_request().unwrap().body["tools"], tools);
    fake.push(Behaviour::AnswerText("Sunny in Oslo.".into()));
    let second = hello(json!({"tools": tools, "messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        asked["choices"][0]["message"].clone(),
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"sky\":\"sunny\"}"},
    ]}));
    let replied: Value = chat(&app, "tool-2", second).await.json().await.unwrap();
    assert_eq!(
        replied["choices"][0]["message"]["content"],
        "Sunny in Oslo."
    );
    assert_eq!(
        fake.last_request().unwrap().body["messages"][2]["tool_call_id"],
        "call_1"
    );

    // Streamed: Azure's filter-results chunk (no choices) first, then text.
    fake.push(Behaviour::stream_of(&["Hel", "lo."]));
    let streamed = chat(&app, "stream", hello(json!({"stream": true}))).await;
    assert_eq!(streamed.status(), StatusCode::OK);
    let events = SseReader::new(streamed).rest().await;
    assert_eq!(content_of(&events), "Hello.");
    let sent = fake.last_request().unwrap();
    assert_eq!(sent.path, PATH);
    assert_eq!(sent.body["stream"], true);
}

/// A 429 is a refusal in which nothing happened: the same deployment is
/// tried again after its wait, and the job succeeds. Azure's content
/// filter is a definite failure whose reason says what it filtered. A call
/// that outlasts the soft timeout is unknown, never failed.
async fn azures_rate_limits_content_filter_and_timeouts_are_classified(backend: TestBackend) {
    let (app, fake) = start(backend, false).await;
    fake.push(Behaviour::Status {
        status: 429,
        retry_after: Some(1),
        body: json!({"error": {"code": "429", "message": "Requests to the ChatCompletions_Create \
            Operation have exceeded the token rate limit. Please retry after 1 second."}})
        .to_string(),
    });
    fake.push(answer("after the wait"));
    let limited = app
        .create_job(&app.alice.token, "limited", &summarize("a"))
        .await;
    let done = app.wait_for_status(&limited, "succeeded", WAIT).await;
    assert_eq!(done["result"], json!({"summary": "after the wait"}));
    assert_eq!(fake.total_requests(), 2);

    fake.push(Behaviour::Status {
        status: 400,
        retry_after: None,
        body: json!({"error": {"code": "content_filter", "status": 400, "param": "prompt",
            "message": "The response was filtered due to the prompt triggering Azure OpenAI's content management policy.",
            "innererror": {"code": "ResponsibleAIPolicyViolation", "content_filter_result": {
                "hate": {"filtered": true, "severity": "medium"},
                "violence": {"filtered": false, "severity": "safe"}}}}})
        .to_string(),
    });
    let filtered = app
        .create_job(&app.alice.token, "filtered", &summarize("b"))
        .await;
    let failed = app.wait_for_status(&filtered, "failed", WAIT).await;
    let why = failed["attempts"][0]["error"].as_str().unwrap_or_default();
    assert!(
        why.contains("content filter refused the request: hate (medium)"),
        "{failed}"
    );

    fake.push(Behaviour::Hang);
    let slow = app
        .create_job(&app.alice.token, "slow", &summarize("c"))
        .await;
    let unknown = app
        .wait_for_status(&slow, "unknown", Duration::from_secs(15))
        .await;
    assert_eq!(unknown["attempts"][0]["state"], "unknown");
}

/// With `bearer_token_env` the token goes as a bearer and no `api-key`;
/// and the fake refuses, as Azure does, a call without an `api-version`, to
/// another path, or without a credential.
async fn an_entra_token_is_a_bearer_and_the_fake_refuses_what_azure_refuses(backend: TestBackend) {
    let (app, fake) = start(backend, true).await;
    fake.push(Behaviour::AnswerText("Hi.".into()));
    assert_eq!(
        chat(&app, "bearer", hello(json!({}))).await.status(),
        StatusCode::OK
    );
    let sent = fake.last_request().unwrap();
    assert_eq!(
        sent.header("authorization"),
        Some(format!("Bearer {FAKE_API_KEY}").as_str())
    );
    assert_eq!(sent.header("api-key"), None);

    let client = reqwest::Client::new();
    let body = json!({"messages": [{"role": "user", "content": "Hi"}]});
    for (path, key, status) in [
        (
            "/openai/deployments/d/chat/completions",
            Some(FAKE_API_KEY),
            404,
        ),
        (
            "/v1/chat/completions?api-version=2024-10-21",
            Some(FAKE_API_KEY),
            404,
        ),
        (
            "/openai/deployments/d/chat/completions?api-version=2024-10-21",
            None,
            401,
        ),
    ] {
        let mut request = client.post(format!("{}{path}", fake.base_url)).json(&body);
        if let Some(key) = key {
            request = request.header("api-key", key);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{path}");
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"]["code"], status.to_string());
    }
}

on_both_backends!(
    an_azure_deployment_serves_tasks_chats_tools_and_streams,
    azures_rate_limits_content_filter_and_timeouts_are_classified,
    an_entra_token_is_a_bearer_and_the_fake_refuses_what_azure_refuses,
);
