//! Every client door against every provider kind (docs/providers.md), on
//! both backends: `/v1/chat/completions`, `/v1/messages` and
//! `/v1/responses`, each to a fake `openai`, `azure_openai`, `anthropic`,
//! `gemini` and `bedrock` provider that checks what the real service
//! checks. Each cell is one capability end to end:
//!
//! - **text**: the answer's text comes back in the door's shape, and the
//!   provider received the system text, the user's text, the token limit
//!   and the stop sequence in its own terms;
//! - **tools**: a tool call out and its result back in (not on the
//!   Responses door, which takes no tools);
//! - **structured**: a JSON schema reaches the provider in its terms, and
//!   the JSON answer comes back (not on the Responses door, which returns
//!   text only);
//! - **stream**: the answer streams in the door's events;
//! - **rate limit**: a 429 with `Retry-After`, then the answer: one job,
//!   two calls;
//! - **failover**: a definite failure, then the route's qualified spare
//!   answers;
//! - **timeout**: a provider that never answers leaves the outcome unknown
//!   (503, retried by the SDKs under the same key).
//!
//! A cell that fails is named with what it saw; every cell runs, and the
//! count is kept in `target/test-figures/door-matrix-<backend>.txt`.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::fake_provider::{
    config_of, Behaviour, FakeProvider, ProviderToml, Shape, WAIT,
};
use crate::support::harness::{record_figures, spawn_app_with, TestApp, TestBackend};
use crate::support::sse::{content_of, text_of, SseReader};

/// The provider kinds, each with the shape its fake speaks.
const KINDS: [(&str, Shape); 5] = [
    ("openai", Shape::OpenAi),
    ("azure", Shape::Azure),
    ("anthropic", Shape::Anthropic),
    ("gemini", Shape::Gemini),
    ("bedrock", Shape::Bedrock),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Door {
    Chat,
    Messages,
    Responses,
}

const DOORS: [Door; 3] = [Door::Chat, Door::Messages, Door::Responses];

impl Door {
    fn path(self) -> &'static str {
        match self {
            Door::Chat => "/v1/chat/completions",
            Door::Messages => "/v1/messages",
            Door::Responses => "/v1/responses",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Door::Chat => "chat",
            Door::Messages => "messages",
            Door::Responses => "responses",
        }
    }

    /// A request to `route`: a system text, the user's text, a token limit
    /// and (where the door has one) a stop sequence.
    fn hello(self, route: &str) -> Value {
        match self {
            Door::Chat => json!({"model": route, "max_tokens": 50, "stop": ["END"],
                "messages": [{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": "Hi there"}]}),
            Door::Messages => json!({"model": route, "max_tokens": 50, "stop_sequences": ["END"],
                "system": "Be brief.", "messages": [{"role": "user", "content": "Hi there"}]}),
            Door::Responses => json!({"model": route, "max_output_tokens": 50,
                "instructions": "Be brief.", "input": "Hi there"}),
        }
    }

    /// The answer's text, from the door's answer.
    fn text(self, answer: &Value) -> Option<String> {
        let pointer = match self {
            Door::Chat => "/choices/0/message/content",
            Door::Messages => "/content/0/text",
            Door::Responses => "/output/0/content/0/text",
        };
        answer.pointer(pointer)?.as_str().map(str::to_owned)
    }

    /// The streamed text, from the door's events.
    fn streamed_text(self, events: &[crate::support::sse::SseEvent]) -> String {
        match self {
            Door::Chat => content_of(events),
            Door::Messages => text_of(events),
            Door::Responses => events
                .iter()
                .filter(|e| e.event.as_deref() == Some("response.output_text.delta"))
                .filter_map(|e| e.json()["delta"].as_str().map(str::to_owned))
                .collect(),
        }
    }

    fn takes_tools(self) -> bool {
        self != Door::Responses
    }
}

/// Where each capability sits in a provider's request.
struct Spoken {
    system: &'static str,
    max_tokens: &'static str,
    stop: &'static str,
    tool: &'static str,
    schema: &'static str,
    /// What its tool result is called.
    tool_result: &'static str,
}

fn spoken(shape: Shape) -> Spoken {
    match shape {
        Shape::OpenAi | Shape::Azure => Spoken {
            system: "/messages/0/content",
            max_tokens: "/max_tokens",
            stop: "/stop/0",
            tool: "/tools/0/function/name",
            schema: "/response_format/json_schema/schema",
            tool_result: "\"role\":\"tool\"",
        },
        Shape::Anthropic => Spoken {
            system: "/system",
            max_tokens: "/max_tokens",
            stop: "/stop_sequences/0",
            tool: "/tools/0/name",
            schema: "/output_format/schema",
            tool_result: "\"type\":\"tool_result\"",
        },
        Shape::Gemini => Spoken {
            system: "/systemInstruction/parts/0/text",
            max_tokens: "/generationConfig/maxOutputTokens",
            stop: "/generationConfig/stopSequences/0",
            tool: "/tools/0/functionDeclarations/0/name",
            schema: "/generationConfig/responseJsonSchema",
            tool_result: "\"functionResponse\"",
        },
        Shape::Bedrock => Spoken {
            system: "/system/0/text",
            max_tokens: "/inferenceConfig/maxTokens",
            stop: "/inferenceConfig/stopSequences/0",
            tool: "/toolConfig/tools/0/toolSpec/name",
            // Converse takes the schema as a string.
            schema: "/outputConfig/textFormat/structure/jsonSchema/schema",
            tool_result: "\"toolResult\"",
        },
    }
}

/// A rate limit's body, as each provider words it.
fn rate_limited(shape: Shape) -> String {
    match shape {
        Shape::OpenAi | Shape::Azure => {
            json!({"error": {"message": "Rate limit reached", "type": "requests", "code": "429"}})
        }
        Shape::Anthropic => {
            json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}})
        }
        Shape::Gemini => {
            json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "quota"}})
        }
        Shape::Bedrock => json!({"message": "Too many requests, please wait before trying again."}),
    }
    .to_string()
}

/// A refusal of the request itself (a definite failure), as each words it.
fn refused(shape: Shape) -> String {
    match shape {
        Shape::OpenAi | Shape::Azure => json!({"error": {"message": "bad request", "type": "invalid_request_error"}}),
        Shape::Anthropic => json!({"type": "error", "error": {"type": "invalid_request_error", "message": "bad request"}}),
        Shape::Gemini => json!({"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": "bad request"}}),
        Shape::Bedrock => json!({"message": "bad request"}),
    }
    .to_string()
}

fn provider_toml(kind: &str, fake: &FakeProvider) -> ProviderToml {
    let name = format!("p-{kind}");
    let toml = match kind {
        "openai" => ProviderToml::openai(&name, &fake.base_url),
        "azure" => ProviderToml::azure(&name, &fake.base_url, "gpt-4o-mini"),
        "anthropic" => ProviderToml::anthropic(&name, &fake.base_url),
        "gemini" => ProviderToml::gemini(&name, &fake.base_url),
        _ => ProviderToml::bedrock(&name, &fake.base_url),
    };
    toml.timeout_ms(1_500).late_result_ms(300)
}

/// Each kind's provider `p-<kind>`, its route `r-<kind>`, and its failover
/// route `f-<kind>`: `p-<kind>` then the spare (with a golden example, so
/// the spare can qualify).
fn matrix_config(fakes: &[(&str, Shape, FakeProvider)], spare: &FakeProvider) -> String {
    let mut toml = ProviderToml::openai("spare", &spare.base_url)
        .timeout_ms(1_500)
        .toml();
    for (kind, _, fake) in fakes {
        toml.push_str(&provider_toml(kind, fake).toml());
    }
    for (kind, _, _) in fakes {
        write!(
            toml,
            r#"
[[tasks]]
name = "r-{kind}"
kind = "chat"
providers = ["p-{kind}"]

[[tasks]]
name = "f-{kind}"
kind = "chat"
providers = ["p-{kind}", "spare"]

[[tasks.golden]]
input = {{ model = "f-{kind}", messages = [{{ role = "user", content = "Say it" }}] }}
expect = {{ "/message/content" = "Qualified." }}
"#
        )
        .unwrap();
    }
    toml
}

/// One cell's verdict.
type Verdict = Result<(), String>;

fn check(held: bool, what: impl FnOnce() -> String) -> Verdict {
    if held {
        Ok(())
    } else {
        Err(what())
    }
}

/// Sends `body` through `door` under `key`.
async fn send(app: &TestApp, door: Door, key: &str, body: &Value) -> reqwest::Response {
    app.client
        .post(app.url(door.path()))
        .bearer_auth(&app.alice.token)
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .unwrap()
}

/// Sends `body` through `door` under `key` as a client that is told its
/// job is still running does: again, under the same key, to rejoin it (at
/// most three times). On a loaded machine a failover or a rate limit's wait
/// may outlast one request's wait; the job, and its one answer, are the same.
async fn send_rejoining(app: &TestApp, door: Door, key: &str, body: &Value) -> reqwest::Response {
    let mut response = send(app, door, key, body).await;
    for _ in 0..3 {
        if response.status() != StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        response = send(app, door, key, body).await;
    }
    response
}

/// The door's answer as JSON, when it is a 200.
async fn answered(response: reqwest::Response) -> Result<Value, String> {
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    if status != StatusCode::OK {
        return Err(format!("{status}: {body}"));
    }
    Ok(body)
}

fn with(mut body: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// What one kind's fake is, for the cells.
struct Cell<'a> {
    app: &'a TestApp,
    door: Door,
    kind: &'a str,
    shape: Shape,
    fake: &'a FakeProvider,
    spare: &'a FakeProvider,
}

impl Cell<'_> {
    fn key(&self, cell: &str) -> String {
        format!("{}-{}-{cell}", self.door.name(), self.kind)
    }

    fn route(&self) -> String {
        format!("r-{}", self.kind)
    }

    fn last_sent(&self) -> Value {
        self.fake.last_request().map(|r| r.body).unwrap_or_default()
    }

    async fn text(&self) -> Verdict {
        self.fake.push(Behaviour::AnswerText("Hello.".into()));
        let answer = answered(
            send(
                self.app,
                self.door,
                &self.key("text"),
                &self.door.hello(&self.route()),
            )
            .await,
        )
        .await?;
        check(self.door.text(&answer).as_deref() == Some("Hello."), || {
            format!("answered {answer}")
        })?;
        let sent = self.last_sent();
        let spoken = spoken(self.shape);
        check(
            sent.pointer(spoken.system) == Some(&json!("Be brief.")),
            || format!("no system text at {}: {sent}", spoken.system),
        )?;
        check(sent.to_string().contains("Hi there"), || {
            format!("no user text: {sent}")
        })?;
        check(sent.pointer(spoken.max_tokens) == Some(&json!(50)), || {
            format!("no token limit at {}: {sent}", spoken.max_tokens)
        })?;
        if self.door != Door::Responses {
            check(sent.pointer(spoken.stop) == Some(&json!("END")), || {
                format!("no stop sequence at {}: {sent}", spoken.stop)
            })?;
        }
        Ok(())
    }

    async fn tools(&self) -> Verdict {
        let route = self.route();
        let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}});
        let (first, tools) = match self.door {
            Door::Chat => {
                let tools = json!([{"type": "function", "function": {"name": "weather", "parameters": schema}}]);
                (
                    json!({"model": route, "tools": tools, "messages": [{"role": "user", "content": "Weather in Oslo?"}]}),
                    tools,
                )
            }
            _ => {
                let tools = json!([{"name": "weather", "input_schema": schema}]);
                (
                    json!({"model": route, "max_tokens": 50, "tools": tools, "messages": [{"role": "user", "content": "Weather in Oslo?"}]}),
                    tools,
                )
            }
        };
        self.fake.push(Behaviour::AnswerToolCall {
            name: "weather".into(),
            arguments: json!({"city": "Oslo"}),
        });
        let asked = answered(send(self.app, self.door, &self.key("tool-1"), &first).await).await?;
        let sent = self.last_sent();
        let spoken = spoken(self.shape);
        check(sent.pointer(spoken.tool) == Some(&json!("weather")), || {
            format!("no tool at {}: {sent}", spoken.tool)
        })?;
        let second = match self.door {
            Door::Chat => {
                let message = &asked["choices"][0]["message"];
                let call = &message["tool_calls"][0];
                check(
                    call["function"]["name"] == "weather"
                        && call["function"]["arguments"] == "{\"city\":\"Oslo\"}",
                    || format!("answered {asked}"),
                )?;
                json!({"model": route, "tools": tools, "messages": [
                    {"role": "user", "content": "Weather in Oslo?"}, message,
                    {"role": "tool", "tool_call_id": call["id"], "content": "{\"sky\":\"sunny\"}"}]})
            }
            _ => {
                let call = &asked["content"][0];
                check(
                    call["type"] == "tool_use"
                        && call["name"] == "weather"
                        && call["input"] == json!({"city": "Oslo"})
                        && asked["stop_reason"] == "tool_use",
                    || format!("answered {asked}"),
                )?;
                json!({"model": route, "max_tokens": 50, "tools": tools, "messages": [
                    {"role": "user", "content": "Weather in Oslo?"},
                    {"role": "assistant", "content": asked["content"]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "{\"sky\":\"sunny\"}"}]}]})
            }
        };
        self.fake.push(Behaviour::AnswerText("Sunny.".into()));
        let replied =
            answered(send(self.app, self.door, &self.key("tool-2"), &second).await).await?;
        check(
            self.door.text(&replied).as_deref() == Some("Sunny."),
            || format!("answered {replied}"),
        )?;
        let sent = self.last_sent().to_string();
        check(
            sent.contains(spoken.tool_result) && sent.contains("sunny"),
            || format!("no tool result ({}): {sent}", spoken.tool_result),
        )
    }

    async fn structured(&self) -> Verdict {
        let schema = json!({"type": "object", "required": ["sky"], "properties": {"sky": {"type": "string"}}});
        let format = match self.door {
            Door::Chat => {
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "sky", "schema": schema}}})
            }
            _ => json!({"output_format": {"type": "json_schema", "schema": schema}}),
        };
        self.fake.push(Behaviour::Answer(json!({"sky": "blue"})));
        let body = with(self.door.hello(&self.route()), format);
        let answer =
            answered(send(self.app, self.door, &self.key("structured"), &body).await).await?;
        let text = self.door.text(&answer).unwrap_or_default();
        check(
            serde_json::from_str::<Value>(&text).ok() == Some(json!({"sky": "blue"})),
            || format!("answered {answer}"),
        )?;
        let sent = self.last_sent();
        let at = spoken(self.shape).schema;
        let carried = match sent.pointer(at) {
            Some(Value::String(text)) => serde_json::from_str::<Value>(text).ok(),
            other => other.cloned(),
        };
        check(
            carried.is_some_and(|s| s["required"] == json!(["sky"])),
            || format!("no schema at {at}: {sent}"),
        )
    }

    async fn stream(&self) -> Verdict {
        self.fake.push(Behaviour::stream_of(&["Hel", "lo."]));
        let body = with(self.door.hello(&self.route()), json!({"stream": true}));
        let response = send(self.app, self.door, &self.key("stream"), &body).await;
        if response.status() != StatusCode::OK {
            return Err(format!(
                "{}: {}",
                response.status(),
                response.text().await.unwrap_or_default()
            ));
        }
        let events = SseReader::new(response).rest().await;
        let text = self.door.streamed_text(&events);
        check(text == "Hello.", || {
            format!("streamed {text:?} in {} events", events.len())
        })
    }

    async fn rate_limit(&self) -> Verdict {
        let before = self.fake.total_requests();
        self.fake.push(Behaviour::Status {
            status: 429,
            retry_after: Some(1),
            body: rate_limited(self.shape),
        });
        self.fake
            .push(Behaviour::AnswerText("After the wait.".into()));
        let answer = answered(
            send_rejoining(
                self.app,
                self.door,
                &self.key("rate-limit"),
                &self.door.hello(&self.route()),
            )
            .await,
        )
        .await?;
        check(
            self.door.text(&answer).as_deref() == Some("After the wait."),
            || format!("answered {answer}"),
        )?;
        let calls = self.fake.total_requests() - before;
        check(calls == 2, || format!("{calls} calls, not 2"))
    }

    async fn failover(&self) -> Verdict {
        self.fake.push(Behaviour::Status {
            status: 400,
            retry_after: None,
            body: refused(self.shape),
        });
        self.spare
            .push(Behaviour::AnswerText("From the spare.".into()));
        let body = self.door.hello(&format!("f-{}", self.kind));
        let answer =
            answered(send_rejoining(self.app, self.door, &self.key("failover"), &body).await)
                .await?;
        check(
            self.door.text(&answer).as_deref() == Some("From the spare."),
            || format!("answered {answer}"),
        )
    }

    async fn timeout(&self) -> Verdict {
        self.fake.push(Behaviour::Hang);
        let response = send(
            self.app,
            self.door,
            &self.key("timeout"),
            &self.door.hello(&self.route()),
        )
        .await;
        let status = response.status();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let (retry, job_id) = (header("x-should-retry"), header("x-onejob-job-id"));
        let body: Value = response.json().await.unwrap_or_default();
        // Unknown, or still running when the wait ended: either way a 503
        // the SDKs retry under the same key.
        let said = match self.door {
            Door::Messages => body["error"]["type"] == "overloaded_error",
            _ => ["outcome_unknown", "job_in_progress"]
                .contains(&body["error"]["code"].as_str().unwrap_or_default()),
        };
        check(
            status == StatusCode::SERVICE_UNAVAILABLE && said && retry.as_deref() == Some("true"),
            || format!("{status}: {body}"),
        )?;
        let job_id = job_id.ok_or("no X-Onejob-Job-Id")?;
        let job = self.app.wait_for_status(&job_id, "unknown", WAIT).await;
        let attempts = job["attempts"].as_array().map_or(0, Vec::len);
        check(
            attempts == 1 && job["attempts"][0]["state"] == "unknown",
            || format!("the job: {job}"),
        )
    }

    /// Every cell this door takes but the timeout (run last, the doors
    /// side by side: each waits out the server's whole wait), with its
    /// verdict and how long it took.
    async fn run(&self) -> Vec<(String, Verdict, Duration)> {
        let mut verdicts = Vec::new();
        let mut timed = |name: &str, verdict: Verdict, started: Instant| {
            verdicts.push((name.to_owned(), verdict, started.elapsed()));
        };
        let started = Instant::now();
        timed("text", self.text().await, started);
        if self.door.takes_tools() {
            let started = Instant::now();
            timed("tools", self.tools().await, started);
            let started = Instant::now();
            timed("structured", self.structured().await, started);
        }
        let started = Instant::now();
        timed("stream", self.stream().await, started);
        let started = Instant::now();
        timed("rate limit", self.rate_limit().await, started);
        let started = Instant::now();
        timed("failover", self.failover().await, started);
        verdicts
    }
}

async fn every_door_serves_every_provider_kind(backend: TestBackend) {
    let mut fakes = Vec::new();
    for (kind, shape) in KINDS {
        fakes.push((kind, shape, FakeProvider::start(shape).await));
    }
    let spare = FakeProvider::start(Shape::OpenAi).await;
    let mut config = config_of(&matrix_config(&fakes, &spare));
    // An unknown outcome is answered when the wait ends (the timeout cells
    // run last, side by side, and wait it out); long enough for a rate
    // limit's retry and a failover on a loaded machine.
    config.server.max_wait_seconds = 8;
    let app = spawn_app_with(backend, config).await;
    for (kind, _, _) in &fakes {
        spare.push(Behaviour::AnswerText("Qualified.".into()));
        let report = app
            .app
            .qualify(None, "spare", &format!("f-{kind}"))
            .await
            .unwrap();
        assert!(
            report.passed(),
            "the spare qualifies for f-{kind}: {:?}",
            report.checks
        );
    }
    // The kinds run side by side (each its own fake); one kind's doors in
    // turn.
    let runs = fakes.iter().map(|(kind, shape, fake)| {
        let (app, spare) = (&app, &spare);
        async move {
            let mut verdicts = Vec::new();
            let cells = DOORS.map(|door| Cell {
                app,
                door,
                kind,
                shape: *shape,
                fake,
                spare,
            });
            for cell in &cells {
                for (name, verdict, took) in cell.run().await {
                    verdicts.push((cell.door.name(), *kind, name, verdict, took));
                }
            }
            let timeouts = cells.iter().map(|cell| async move {
                let started = Instant::now();
                let verdict = cell.timeout().await;
                (
                    cell.door.name(),
                    *kind,
                    "timeout".to_owned(),
                    verdict,
                    started.elapsed(),
                )
            });
            verdicts.extend(futures_util::future::join_all(timeouts).await);
            verdicts
        }
    });
    let started = Instant::now();
    let verdicts: Vec<_> = futures_util::future::join_all(runs)
        .await
        .into_iter()
        .flatten()
        .collect();
    let passed = verdicts.iter().filter(|v| v.3.is_ok()).count();
    let slowest = verdicts.iter().max_by_key(|v| v.4).expect("cells ran");
    let mut figures = format!(
        "{passed} of {} cells passed ({} doors x {} provider kinds; the Responses door takes no tools or schemas) in {:.1} s; slowest: {} x {}: {} ({:.1} s)",
        verdicts.len(),
        DOORS.len(),
        KINDS.len(),
        started.elapsed().as_secs_f64(),
        slowest.0,
        slowest.1,
        slowest.2,
        slowest.4.as_secs_f64(),
    );
    let failures: Vec<String> = verdicts
        .iter()
        .filter_map(|(door, kind, cell, verdict, _)| {
            verdict
                .as_ref()
                .err()
                .map(|why| format!("{door} x {kind}: {cell}: {why}"))
        })
        .collect();
    for (door, kind, cell, _, took) in &verdicts {
        if took.as_secs_f64() > 5.0 && cell != "timeout" {
            write!(
                figures,
                "\nslow: {door} x {kind}: {cell} ({:.1} s)",
                took.as_secs_f64()
            )
            .unwrap();
        }
    }
    for failure in &failures {
        write!(figures, "\nFAILED {failure}").unwrap();
    }
    record_figures(&format!("door-matrix-{backend:?}").to_lowercase(), &figures);
    println!("{figures}");
    assert!(failures.is_empty(), "{figures}");
}

/// A request the primary's format cannot carry (a `seed` for Anthropic, a
/// `user` for Gemini, a `top_k` for Bedrock) is never sent to it: its
/// attempt fails before anything leaves, naming what it cannot carry, and
/// the job fails over to the qualified spare, which gets the request whole.
async fn what_a_provider_cannot_carry_is_never_sent_to_it_and_fails_over(backend: TestBackend) {
    let mut fakes = Vec::new();
    for (kind, shape) in [
        ("anthropic", Shape::Anthropic),
        ("gemini", Shape::Gemini),
        ("bedrock", Shape::Bedrock),
    ] {
        fakes.push((kind, shape, FakeProvider::start(shape).await));
    }
    let spare = FakeProvider::start(Shape::OpenAi).await;
    let app = spawn_app_with(backend, config_of(&matrix_config(&fakes, &spare))).await;
    for ((kind, _, fake), (member, value)) in fakes.iter().zip([
        ("seed", json!(7)),
        ("user", json!("u-1")),
        ("top_k", json!(5)),
    ]) {
        spare.push(Behaviour::AnswerText("Qualified.".into()));
        let report = app
            .app
            .qualify(None, "spare", &format!("f-{kind}"))
            .await
            .unwrap();
        assert!(report.passed(), "{:?}", report.checks);
        spare.push(Behaviour::AnswerText("From the spare.".into()));
        let body = with(
            Door::Chat.hello(&format!("f-{kind}")),
            json!({ member: value }),
        );
        let answer = answered(send(&app, Door::Chat, &format!("carry-{kind}"), &body).await)
            .await
            .unwrap();
        assert_eq!(
            Door::Chat.text(&answer).as_deref(),
            Some("From the spare."),
            "{kind}"
        );
        assert_eq!(fake.total_requests(), 0, "nothing reached {kind}");
        assert_eq!(spare.last_request().unwrap().body[member], value, "{kind}");
        let job_id = answer["id"]
            .as_str()
            .unwrap()
            .trim_start_matches("chatcmpl-");
        let job = app.wait_for_status(job_id, "succeeded", WAIT).await;
        let first = &job["attempts"][0];
        assert_eq!(first["provider"], format!("p-{kind}"));
        assert_eq!(first["state"], "failed", "{job}");
        let reason = first["error"].to_string();
        assert!(
            reason.contains("cannot carry") && reason.contains(member),
            "{kind}: {reason}"
        );
    }
}

on_both_backends!(
    every_door_serves_every_provider_kind,
    what_a_provider_cannot_carry_is_never_sent_to_it_and_fails_over,
);
