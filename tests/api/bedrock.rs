//! The `bedrock` provider kind (docs/providers.md), against a fake that
//! checks what Bedrock checks (`Shape::Bedrock`): every request's SigV4
//! signature, recomputed with AWS's own signer; Converse's shapes; the
//! binary event stream of ConverseStream. Tasks and chats, whole and
//! streamed, tools and structured output; `ThrottlingException`,
//! `ValidationException`, `ModelTimeoutException` and a guardrail's stop
//! classified as the issue of each asks.

use std::time::{Duration, SystemTime};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::fake_provider::{
    answer, config_of, Behaviour, FakeProvider, ProviderToml, Shape, WAIT,
};
use crate::support::harness::{spawn_app_with, summarize, TestApp, TestBackend};
use crate::support::sse::{content_of, SseReader};

const CONVERSE: &str = "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse";

fn bedrock_config(fake: &FakeProvider) -> onejob::config::Config {
    let mut config = config_of(&format!(
        r#"{}
[[tasks]]
name = "summarize"
providers = ["rock"]
input_fields = ["text"]
template = "Summarize: {{{{ text }}}}"
output_schema = {{ type = "object", required = ["summary"], properties = {{ summary = {{ type = "string" }} }} }}

[[tasks]]
name = "claude-on-bedrock"
kind = "chat"
providers = ["rock"]
"#,
        ProviderToml::bedrock("rock", &fake.base_url)
            .timeout_ms(3_000)
            .toml()
    ));
    config.server.max_wait_seconds = 20;
    config
}

async fn start(backend: TestBackend) -> (TestApp, FakeProvider) {
    let fake = FakeProvider::start(Shape::Bedrock).await;
    let app = spawn_app_with(backend, bedrock_config(&fake)).await;
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
    json!({"model": "claude-on-bedrock", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"}]})
}

/// A task's structured output, a chat, a tool round trip and a stream,
/// each signed (the fake recomputes every signature) and in Converse's
/// terms.
async fn a_bedrock_model_serves_tasks_chats_tools_and_streams(backend: TestBackend) {
    let (app, fake) = start(backend).await;
    fake.push(answer("done"));
    let job = app
        .create_job(&app.alice.token, "task", &summarize("a long text"))
        .await;
    let done = app.wait_for_status(&job, "succeeded", WAIT).await;
    assert_eq!(done["result"], json!({"summary": "done"}), "{done}");
    let sent = fake.last_request().unwrap();
    assert_eq!(sent.path, CONVERSE);
    assert!(sent
        .header("authorization")
        .unwrap()
        .starts_with("AWS4-HMAC-SHA256 Credential="));
    let schema = &sent.body["outputConfig"]["textFormat"]["structure"]["jsonSchema"]["schema"];
    let schema: Value = serde_json::from_str(schema.as_str().unwrap()).unwrap();
    assert_eq!(schema["required"], json!(["summary"]));

    fake.push(Behaviour::AnswerText("Hello there.".into()));
    let answered: Value = chat(&app, "chat", hello()).await.json().await.unwrap();
    assert_eq!(answered["choices"][0]["message"]["content"], "Hello there.");
    let sent = fake.last_request().unwrap();
    assert_eq!(sent.body["system"], json!([{"text": "Be brief."}]));
    assert_eq!(
        sent.body["messages"],
        json!([{"role": "user", "content": [{"text": "Hi"}]}])
    );

    let tools = json!([{"type": "function", "function": {"name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let called = json!({"output": {"message": {"role": "assistant", "content": [
        {"toolUse": {"toolUseId": "tooluse_1", "name": "weather", "input": {"city": "Oslo"}}}]}},
        "stopReason": "tool_use", "usage": {"inputTokens": 9, "outputTokens": 4, "totalTokens": 13},
        "metrics": {"latencyMs": 3}});
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
    assert_eq!(message["tool_calls"][0]["id"], "tooluse_1");
    assert_eq!(
        fake.last_request().unwrap().body["toolConfig"]["tools"][0]["toolSpec"]["name"],
        "weather"
    );
    fake.push(Behaviour::AnswerText("Sunny in Oslo.".into()));
    let second = with(
        hello(),
        json!({"tools": tools, "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            message.clone(),
            {"role": "tool", "tool_call_id": "tooluse_1", "content": "{\"sky\":\"sunny\"}"},
        ]}),
    );
    let replied: Value = chat(&app, "tool-2", second).await.json().await.unwrap();
    assert_eq!(
        replied["choices"][0]["message"]["content"],
        "Sunny in Oslo."
    );
    assert_eq!(
        fake.last_request().unwrap().body["messages"][2]["content"][0]["toolResult"]["toolUseId"],
        "tooluse_1"
    );

    // Streamed: ConverseStream's frames, split across writes.
    fake.push(Behaviour::stream_of(&["Hel", "lo."]));
    let streamed = chat(&app, "stream", with(hello(), json!({"stream": true}))).await;
    assert_eq!(streamed.status(), StatusCode::OK);
    let events = SseReader::new(streamed).rest().await;
    assert_eq!(content_of(&events), "Hello.");
    assert_eq!(
        fake.last_request().unwrap().path,
        format!("{CONVERSE}-stream")
    );
}

/// `ThrottlingException` is a rate limit (retried, then succeeds),
/// `ValidationException` a definite failure, `ModelTimeoutException`
/// unknown, and a guardrail's stop a definite failure naming it.
async fn bedrocks_errors_are_classified_as_each_means(backend: TestBackend) {
    let (app, fake) = start(backend).await;
    let error = |status: u16, kind: &str| Behaviour::Status {
        status,
        retry_after: None,
        body: json!({"__type": kind, "message": format!("a {kind}")}).to_string(),
    };
    fake.push(error(429, "ThrottlingException"));
    fake.push(answer("after the throttle"));
    let limited = app
        .create_job(&app.alice.token, "limited", &summarize("a"))
        .await;
    let done = app.wait_for_status(&limited, "succeeded", WAIT).await;
    assert_eq!(done["result"], json!({"summary": "after the throttle"}));
    assert_eq!(fake.total_requests(), 2);

    fake.push(error(400, "ValidationException"));
    let invalid = app
        .create_job(&app.alice.token, "invalid", &summarize("b"))
        .await;
    let failed = app.wait_for_status(&invalid, "failed", WAIT).await;
    let why = failed["attempts"][0]["error"].as_str().unwrap_or_default();
    assert!(why.contains("ValidationException"), "{failed}");

    fake.push(Behaviour::Status {
        status: 200,
        retry_after: None,
        body: json!({"output": {"message": {"role": "assistant", "content": [{"text": "…"}]}},
            "stopReason": "guardrail_intervened", "usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2},
            "metrics": {"latencyMs": 1}})
        .to_string(),
    });
    let guarded = app
        .create_job(&app.alice.token, "guarded", &summarize("c"))
        .await;
    let failed = app.wait_for_status(&guarded, "failed", WAIT).await;
    let why = failed["attempts"][0]["error"].as_str().unwrap_or_default();
    assert!(why.contains("guardrail_intervened"), "{failed}");

    fake.push(error(408, "ModelTimeoutException"));
    let slow = app
        .create_job(&app.alice.token, "slow", &summarize("d"))
        .await;
    let unknown = app
        .wait_for_status(&slow, "unknown", Duration::from_secs(15))
        .await;
    let why = unknown["attempts"][0]["error"].as_str().unwrap_or_default();
    assert!(why.contains("ModelTimeoutException"), "{unknown}");
}

/// The fake recomputes each signature: one over the body as signed is
/// taken; the same headers over a body one byte off are refused, as Bedrock
/// refuses them.
#[tokio::test]
async fn the_bedrock_fake_refuses_a_signature_off_by_one_byte() {
    use crate::support::aws;
    let fake = FakeProvider::start(Shape::Bedrock).await;
    fake.set_default(answer("signed"));
    let url = format!("{}{CONVERSE}", fake.base_url);
    let body = br#"{"messages":[{"role":"user","content":[{"text":"Hi"}]}],"inferenceConfig":{}}"#;
    let signing = onejob::providers::bedrock::AwsSigning {
        access_key_id: aws::ACCESS_KEY_ID.to_owned(),
        secret_access_key: onejob::domain::Secret::new(aws::SECRET_ACCESS_KEY),
        session_token: Some(onejob::domain::Secret::new(aws::SESSION_TOKEN)),
        region: aws::REGION.to_owned(),
    };
    let headers = onejob::providers::bedrock::sign(
        &signing,
        &url,
        &[("content-type", "application/json")],
        body,
        SystemTime::now(),
    )
    .unwrap();
    let send = |bytes: Vec<u8>| {
        let mut request = reqwest::Client::new()
            .post(&url)
            .header("content-type", "application/json")
            .body(bytes);
        for (name, value) in &headers {
            request = request.header(name.as_str(), value.as_str());
        }
        request.send()
    };
    assert_eq!(send(body.to_vec()).await.unwrap().status(), StatusCode::OK);
    let mut tampered = body.to_vec();
    let at = tampered.iter().position(|b| *b == b'H').unwrap();
    tampered[at] = b'J';
    let refused = send(tampered).await.unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        refused.headers()["x-amzn-errortype"]
            .to_str()
            .unwrap()
            .split(':')
            .next(),
        Some("InvalidSignatureException")
    );
}

on_both_backends!(
    a_bedrock_model_serves_tasks_chats_tools_and_streams,
    bedrocks_errors_are_classified_as_each_means,
);
