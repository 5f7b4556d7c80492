//! One trace per job (docs/tracing.md), seen by a real OTLP/HTTP collector
//! (`support::collector`, decoding with `opentelemetry-proto`) from real
//! `onejob serve` processes, on both backends:
//!
//! - a job that fails over, goes unknown, and whose late answer loses the
//!   race, with a replay, a wait and a webhook delivery: every span of the
//!   job is in the client's trace, under the request that created it; the
//!   fake providers and the webhook receiver are sent the `traceparent` of
//!   the span that called them; the replay is in its own trace, linked;
//! - a streamed chat;
//! - a job created by a process killed with SIGKILL, sent and delivered by
//!   another: the trace goes on from what the database kept;
//! - a collector that hangs or refuses: every request is answered, and
//!   the spans dropped are counted.

use std::path::{Path, PathBuf};
use std::time::Duration;

use onejob::store::users as user_store;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::server_process::{free_port, ServerProcess};
use crate::support::collector::{tree, Attr, Collector, Span};
use crate::support::fake_provider::{
    strict_task_toml, Behaviour, FakeProvider, ProviderToml, Shape,
};
use crate::support::harness::{record_figures, summarize, TestBackend, TestDb, FAKE_API_KEY};
use crate::support::metrics::metric_sum;
use crate::support::webhook_receiver::{SilentServer, WebhookReceiver};

const WAIT: Duration = Duration::from_secs(20);

/// A client's own trace context: a fresh trace id and span id.
fn client_traceparent() -> (String, String, String) {
    let trace_id = uuid::Uuid::new_v4().simple().to_string();
    let span_id = uuid::Uuid::new_v4().simple().to_string()[..16].to_owned();
    let header = format!("00-{trace_id}-{span_id}-01");
    (header, trace_id, span_id)
}

/// A configuration file: the worker, webhooks, tracing to `collector`
/// (its base URL), and `rest` (providers and tasks).
fn config_file(dir: &Path, name: &str, collector: &str, telemetry: &str, rest: &str) -> PathBuf {
    let toml = format!(
        r#"
[worker]
concurrency = 2
poll_interval_ms = 50
lease_ms = 20000

[webhooks]
signing_key_env = "ONEJOB_TEST_WEBHOOK_KEY"
allow_private_addresses = true
backoff_initial_ms = 100
poll_interval_ms = 50
timeout_ms = 2000

[telemetry]
otlp_endpoint = "{collector}"
service_name = "onejob-test"
schedule_delay_ms = 50
{telemetry}
{rest}"#
    );
    let path = dir.join(name);
    std::fs::write(&path, toml).unwrap();
    path
}

async fn admin_token(db: &TestDb) -> String {
    let store = db.open_store().await;
    tokio::task::spawn_blocking(move || {
        let mut conn = store.conn().unwrap();
        user_store::issue_token(&mut conn, "admin", None).unwrap().0
    })
    .await
    .unwrap()
}

/// The providers and tasks of a configuration: `fake`, the one provider
/// of `summarize`.
fn one_fake(fake: &FakeProvider) -> String {
    [
        ProviderToml::openai("fake", &fake.base_url)
            .timeout_ms(5_000)
            .toml(),
        strict_task_toml("summarize", &["fake"], "Summarize: {{ text }}"),
    ]
    .concat()
}

/// Runs `onejob <args>` with the configuration and database of the
/// processes under test, as an operator would; it must succeed. Its
/// standard output.
pub fn onejob_command(dir: &Path, config: &Path, url: &str, args: &[&str]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_onejob"))
        .args(args)
        .current_dir(dir)
        .env("ONEJOB_CONFIG", config)
        .env("DATABASE_URL", url)
        .env("ONEJOB_TEST_FAKE_KEY", FAKE_API_KEY)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "onejob {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Runs `onejob qualify` for `provider` on `summarize`.
fn qualify(dir: &Path, config: &Path, url: &str, provider: &str) {
    onejob_command(
        dir,
        config,
        url,
        &["qualify", "--provider", provider, "--task", "summarize"],
    );
}

async fn register_webhook(base: &str, token: &str, url: &str) {
    let response = reqwest::Client::new()
        .post(format!("{base}/api/v1/webhooks"))
        .bearer_auth(token)
        .json(&json!({"url": url, "events": ["job.succeeded"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
}

async fn post_job(base: &str, token: &str, key: &str, traceparent: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{base}/api/v1/jobs"))
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .header("traceparent", traceparent)
        .header("tracestate", "client=1")
        .json(&summarize(key))
        .send()
        .await
        .unwrap()
}

async fn get_json(base: &str, token: &str, path: &str) -> Value {
    let response = reqwest::Client::new()
        .get(format!("{base}{path}"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{path}");
    response.json().await.unwrap()
}

/// Re-reads the job until `done` holds of it.
async fn wait_for_job(base: &str, token: &str, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let job = get_json(base, token, &format!("/api/v1/jobs/{id}")).await;
        if done(&job) {
            return job;
        }
        assert!(std::time::Instant::now() < deadline, "{job}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Spans counted in `/metrics` with `outcome`.
fn dropped(exposition: &str, outcome: &str) -> f64 {
    metric_sum(
        exposition,
        "onejob_trace_spans_total",
        &[("outcome", outcome)],
    )
}

fn find<'a>(spans: &'a [Span], what: &str, test: impl Fn(&Span) -> bool) -> &'a Span {
    spans
        .iter()
        .find(|s| test(s))
        .unwrap_or_else(|| panic!("no {what} among:\n{}", tree(spans)))
}

fn provider_span(spans: &[Span], number: i64) -> &Span {
    find(spans, &format!("provider call {number}"), |s| {
        s.attr("onejob.attempt.number") == Some(&Attr::Int(number))
            && s.attr("gen_ai.operation.name").is_some()
    })
}

/// The recording span under `parent` whose outcome is `outcome`.
fn recording_span<'a>(spans: &'a [Span], parent: &Span, outcome: &str) -> &'a Span {
    find(
        spans,
        &format!("{outcome} recorded under {}", parent.name),
        |s| {
            s.parent_span_id == parent.span_id
                && s.attr("onejob.attempt.outcome") == Some(&Attr::Text(outcome.to_owned()))
        },
    )
}

fn sent_traceparent(fake: &FakeProvider, attempt_id: &str) -> String {
    fake.requests()
        .iter()
        .find(|r| r.header("x-request-id") == Some(attempt_id))
        .and_then(|r| r.header("traceparent").map(str::to_owned))
        .unwrap_or_else(|| {
            panic!("attempt {attempt_id} reached its provider without a traceparent")
        })
}

on_both_backends!(
    a_failover_and_a_lost_race_are_one_trace_under_the_clients_span,
    a_streamed_chat_is_traced_from_the_clients_span_to_the_provider,
    a_job_created_by_a_killed_process_is_traced_on_by_the_one_that_sends_it,
    a_collector_that_hangs_or_refuses_fails_no_request_and_its_spans_are_counted,
);

/// A job that failed over and whose late answer lost, traced, with what
/// the test's parties saw.
pub struct FailoverTrace {
    pub server: ServerProcess,
    pub db: TestDb,
    pub dir: tempfile::TempDir,
    pub job_id: String,
    /// The client's trace, and its span the creation was sent from.
    pub trace_id: String,
    pub client_span: String,
    /// The job as it stood when it had succeeded.
    pub won: Value,
    /// Every span exported (the replay's trace included).
    pub spans: Vec<Span>,
    retry_trace: String,
    fakes: [FakeProvider; 3],
    delivered: Vec<crate::support::webhook_receiver::Received>,
}

impl FailoverTrace {
    /// The spans of the job's trace.
    pub fn job_spans(&self) -> Vec<Span> {
        self.spans
            .iter()
            .filter(|s| s.trace_id == self.trace_id)
            .cloned()
            .collect()
    }
}

/// `broken` refuses the request (a definite failure): the job fails over
/// to `slow`, which holds it past its soft timeout (unknown); support
/// abandons it and the owner starts the next attempt, on `fast`, which
/// wins; then `slow`'s held answer comes back and loses. Then a retry of
/// the creation from another trace, and the webhook's delivery.
pub async fn failover_with_a_lost_race(backend: TestBackend) -> FailoverTrace {
    let db = TestDb::create_empty(backend);
    let url = db.url.as_str().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let collector = Collector::start().await;
    let hooks = WebhookReceiver::start().await;
    let broken = FakeProvider::start(Shape::OpenAi).await;
    let slow = FakeProvider::start(Shape::OpenAi).await;
    let fast = FakeProvider::start(Shape::OpenAi).await;
    let providers = [
        ProviderToml::openai("broken", &broken.base_url).toml(),
        ProviderToml::openai("slow", &slow.base_url)
            .timeout_ms(300)
            .connect_timeout_ms(Some(200))
            .toml(),
        ProviderToml::openai("fast", &fast.base_url)
            .timeout_ms(5_000)
            .toml(),
        strict_task_toml(
            "summarize",
            &["broken", "slow", "fast"],
            "Summarize: {{ text }}",
        ),
    ]
    .concat();
    let config = config_file(
        dir.path(),
        "traced.toml",
        &collector.endpoint(),
        "",
        &providers,
    );
    let mut server = ServerProcess::spawn(dir.path(), "traced", &config, &url);
    server.wait_ready().await;
    qualify(dir.path(), &config, &url, "slow");
    qualify(dir.path(), &config, &url, "fast");
    let base = server.base.clone();
    let token = admin_token(&db).await;
    register_webhook(&base, &token, &hooks.url("/hook")).await;

    broken.push(Behaviour::Status {
        status: 400,
        retry_after: None,
        body: r#"{"error": {"message": "no such model"}}"#.into(),
    });
    slow.push(Behaviour::Hold);
    let (traceparent, trace_id, client_span) = client_traceparent();
    let created = post_job(&base, &token, "traced-1", &traceparent).await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let job: Value = created.json().await.unwrap();
    let job_id = job["id"].as_str().unwrap().to_owned();
    let unknown = wait_for_job(&base, &token, &job_id, |j| {
        j["attempts"][1]["state"] == "unknown"
    })
    .await;
    let held = unknown["attempts"][1]["id"].as_str().unwrap().to_owned();
    let abandon = reqwest::Client::new()
        .post(format!("{base}/api/v1/attempts/{held}/abandon"))
        .bearer_auth(&token)
        .json(&json!({"reason": "slow provider"}))
        .send()
        .await
        .unwrap();
    assert_eq!(abandon.status(), StatusCode::OK);
    let started = reqwest::Client::new()
        .post(format!("{base}/api/v1/jobs/{job_id}/attempts"))
        .bearer_auth(&token)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), StatusCode::CREATED);
    let won = wait_for_job(&base, &token, &job_id, |j| j["status"] == "succeeded").await;
    slow.release(&held, Behaviour::Answer(json!({"summary": "too late"})));
    wait_for_job(&base, &token, &job_id, |j| {
        j["attempts"][1]["outcome"] == "lost"
    })
    .await;

    // A retry from another trace: a replay, in its own trace, linked.
    let (retry_parent, retry_trace, _) = client_traceparent();
    let replay = post_job(&base, &token, "traced-1", &retry_parent).await;
    assert_eq!(replay.status(), StatusCode::OK);
    let delivered = hooks.wait_for(1, WAIT).await;

    let spans = collector
        .wait_until("lost race, delivery and replay", WAIT, |spans| {
            let job_trace: Vec<&Span> = spans.iter().filter(|s| s.trace_id == trace_id).collect();
            job_trace
                .iter()
                .any(|s| s.attr("onejob.cas.verdict") == Some(&Attr::Text("lost".into())))
                && job_trace.iter().any(|s| s.name == "webhook delivery")
                // The replay's own span, not only its children: a span is
                // exported when it ends, and the request's ends last.
                && spans
                    .iter()
                    .any(|s| s.trace_id == retry_trace && s.name == "POST /api/v1/jobs")
        })
        .await;
    FailoverTrace {
        server,
        db,
        dir,
        job_id,
        trace_id,
        client_span,
        won,
        spans,
        retry_trace,
        fakes: [broken, slow, fast],
        delivered,
    }
}

async fn a_failover_and_a_lost_race_are_one_trace_under_the_clients_span(backend: TestBackend) {
    let traced = failover_with_a_lost_race(backend).await;
    let FailoverTrace {
        job_id,
        trace_id,
        client_span,
        won,
        spans,
        retry_trace,
        fakes: [broken, slow, fast],
        delivered,
        ..
    } = &traced;
    let job_spans = traced.job_spans();
    let printed = format!(
        "the job's trace on {backend:?} (failover, unknown, lost race, webhook):\n{}",
        tree(&job_spans)
    );
    println!("{printed}");
    // Printed after the suite by `.ci/run`, too.
    record_figures(&format!("trace-failover-{backend:?}"), &printed);

    // The request that created the job is the client's span's child.
    let creation = find(&job_spans, "creating request", |s| {
        s.name == "POST /api/v1/jobs"
    });
    assert_eq!(&creation.parent_span_id, client_span);
    assert_eq!(creation.kind, 2, "a server span");
    assert_eq!(creation.service, "onejob-test");
    assert_eq!(creation.text("onejob.job.id"), job_id);
    assert_eq!(
        creation.attr("http.response.status_code"),
        Some(&Attr::Int(201))
    );
    let transaction = find(&job_spans, "creation transaction", |s| {
        s.name == "job.create"
    });
    assert_eq!(transaction.parent_span_id, creation.span_id);
    assert_eq!(
        transaction.attr("onejob.job.created"),
        Some(&Attr::Bool(true))
    );

    // Each attempt's call is the creating request's child, in the GenAI
    // conventions, and its provider was sent its span as the parent.
    let attempts = won["attempts"].as_array().unwrap();
    for (number, fake, outcome) in [
        (1, &broken, "failed"),
        (2, &slow, "succeeded"),
        (3, &fast, "succeeded"),
    ] {
        let call = provider_span(&job_spans, number);
        let attempt_id = attempts[number as usize - 1]["id"].as_str().unwrap();
        assert_eq!(call.parent_span_id, creation.span_id, "attempt {number}");
        assert_eq!(call.name, "chat fake-model");
        assert_eq!(call.kind, 3, "a client span");
        assert_eq!(call.text("gen_ai.operation.name"), "chat");
        assert_eq!(call.text("gen_ai.provider.name"), "openai");
        assert_eq!(call.text("gen_ai.request.model"), "fake-model");
        assert_eq!(call.text("onejob.job.id"), job_id);
        assert_eq!(call.text("onejob.attempt.id"), attempt_id);
        assert_eq!(
            call.text("onejob.attempt.outcome"),
            outcome,
            "attempt {number}"
        );
        let sent = sent_traceparent(fake, attempt_id);
        assert!(
            sent.starts_with(&call.traceparent_prefix()),
            "attempt {number} sent {sent}, its span is {}",
            call.span_id
        );
    }
    let failed = provider_span(&job_spans, 1);
    assert_eq!(failed.status, 2, "a definite failure is an error");
    let failover = recording_span(&job_spans, failed, "failed");
    assert_eq!(failover.text("onejob.failover.provider"), "slow");

    let late = provider_span(&job_spans, 2);
    assert_eq!(late.attr("onejob.attempt.unknown"), Some(&Attr::Bool(true)));
    assert_eq!(
        recording_span(&job_spans, late, "unknown").text("onejob.cas.verdict"),
        "unknown"
    );
    let lost = recording_span(&job_spans, late, "succeeded");
    assert_eq!(lost.name, "compare-and-swap");
    assert_eq!(lost.text("onejob.cas.verdict"), "lost");

    let winner = provider_span(&job_spans, 3);
    assert_eq!(winner.text("gen_ai.response.model"), "fake-model");
    assert!(winner.int("gen_ai.usage.input_tokens") > 0);
    assert!(winner.int("gen_ai.usage.output_tokens") > 0);
    assert_eq!(
        winner.attr("gen_ai.response.finish_reasons"),
        Some(&Attr::Texts(vec!["stop".into()]))
    );
    assert_eq!(
        recording_span(&job_spans, winner, "succeeded").text("onejob.cas.verdict"),
        "won"
    );
    assert!(
        job_spans
            .iter()
            .all(|s| s.attr("gen_ai.input.messages").is_none()),
        "no prompt is recorded unless configured"
    );

    // The webhook delivery continues the job's trace, and its receiver
    // was sent the delivery's span as the parent.
    let delivery = find(&job_spans, "webhook delivery", |s| {
        s.name == "webhook delivery"
    });
    assert_eq!(delivery.parent_span_id, creation.span_id);
    assert_eq!(delivery.text("onejob.webhook.outcome"), "delivered");
    let hook_parent = delivered[0].header("traceparent");
    assert!(
        hook_parent.starts_with(&delivery.traceparent_prefix()),
        "the receiver got {hook_parent:?}"
    );
    assert_eq!(delivered[0].header("tracestate"), "client=1");

    // The replay is a span of the client's retry's trace, linked to the
    // job's.
    let retried = find(spans, "the replay", |s| {
        s.trace_id == *retry_trace && s.name == "POST /api/v1/jobs"
    });
    assert_eq!(retried.attr("onejob.replayed"), Some(&Attr::Bool(true)));
    assert!(
        retried
            .links
            .contains(&(trace_id.clone(), creation.span_id.clone())),
        "{:?}",
        retried.links
    );
    // Reading the job from outside its trace links to it too.
    let look = find(spans, "a read of the job", |s| {
        s.name == "GET /api/v1/jobs/{id}" && s.trace_id != *trace_id
    });
    assert!(look
        .links
        .contains(&(trace_id.clone(), creation.span_id.clone())));
}

/// A chat streamed through `/v1/chat/completions`.
async fn a_streamed_chat_is_traced_from_the_clients_span_to_the_provider(backend: TestBackend) {
    let db = TestDb::create_empty(backend);
    let url = db.url.as_str().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let collector = Collector::start().await;
    let up = FakeProvider::start(Shape::OpenAi).await;
    up.push(Behaviour::stream_of(&["Hello", ", ", "world"]));
    let rest = format!(
        r#"{provider}
[[tasks]]
name = "gpt-stream"
kind = "chat"
providers = ["up"]
"#,
        provider = ProviderToml::openai("up", &format!("{}/v1", up.base_url))
            .timeout_ms(10_000)
            .toml()
    );
    let config = config_file(
        dir.path(),
        "chat.toml",
        &collector.endpoint(),
        "record_content = true",
        &rest,
    );
    let mut server = ServerProcess::spawn(dir.path(), "chat", &config, &url);
    server.wait_ready().await;
    let token = admin_token(&db).await;
    let (traceparent, trace_id, client_span) = client_traceparent();
    let response = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", server.base))
        .bearer_auth(&token)
        .header("Idempotency-Key", "stream-1")
        .header("traceparent", &traceparent)
        .json(&json!({
            "model": "gpt-stream",
            "messages": [{"role": "user", "content": "Say hello"}],
            "stream": true,
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.text().await.unwrap();
    assert!(body.contains("world") && body.contains("[DONE]"), "{body}");

    collector
        .wait_until("the streamed call", WAIT, |spans| {
            spans.iter().any(|s| {
                s.trace_id == trace_id
                    && s.attr("onejob.attempt.outcome").is_some()
                    && s.attr("gen_ai.operation.name").is_some()
            }) && spans
                .iter()
                .any(|s| s.trace_id == trace_id && s.name == "POST /v1/chat/completions")
        })
        .await;
    let spans = collector.trace(&trace_id);
    println!("the streamed chat's trace:\n{}", tree(&spans));
    let request = find(&spans, "the chat request", |s| {
        s.name == "POST /v1/chat/completions"
    });
    assert_eq!(request.parent_span_id, client_span);
    let call = provider_span(&spans, 1);
    assert_eq!(call.parent_span_id, request.span_id);
    assert_eq!(call.text("onejob.attempt.outcome"), "succeeded");
    assert_eq!(call.text("gen_ai.response.model"), "fake-model");
    assert_eq!(
        call.attr("gen_ai.response.finish_reasons"),
        Some(&Attr::Texts(vec!["stop".into()]))
    );
    // `record_content = true`: the prompt and the answer are on the span.
    assert!(call.text("gen_ai.input.messages").contains("Say hello"));
    assert!(call.text("gen_ai.output.messages").contains("Hello, world"));
    let sent = up.last_request().unwrap();
    let sent_parent = sent.header("traceparent").unwrap_or_default();
    assert!(
        sent_parent.starts_with(&call.traceparent_prefix()),
        "the provider got {sent_parent:?}"
    );
}

/// The first process only takes requests (`ONEJOB_ROLE=http`) and is
/// killed with SIGKILL once the job is created; the second sends the
/// attempt and delivers the webhook, in the client's trace.
async fn a_job_created_by_a_killed_process_is_traced_on_by_the_one_that_sends_it(
    backend: TestBackend,
) {
    let db = TestDb::create_empty(backend);
    let url = db.url.as_str().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let collector = Collector::start().await;
    let hooks = WebhookReceiver::start().await;
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let rest = one_fake(&fake);
    let config = config_file(dir.path(), "both.toml", &collector.endpoint(), "", &rest);
    let mut first =
        ServerProcess::spawn_as(dir.path(), "first", &config, &url, free_port(), "http");
    first.wait_ready().await;
    let token = admin_token(&db).await;
    register_webhook(&first.base, &token, &hooks.url("/hook")).await;
    let (traceparent, trace_id, _) = client_traceparent();
    let created = post_job(&first.base, &token, "killed-1", &traceparent).await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let job: Value = created.json().await.unwrap();
    let job_id = job["id"].as_str().unwrap().to_owned();
    first.kill();
    first.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(fake.total_requests(), 0, "the first process sent nothing");

    let mut second = ServerProcess::spawn(dir.path(), "second", &config, &url);
    second.wait_ready().await;
    let delivered = hooks.wait_for(1, WAIT).await;
    let sent = fake.requests();
    assert_eq!(sent.len(), 1);
    let sent_parent = sent[0].header("traceparent").unwrap_or_default().to_owned();
    assert!(
        sent_parent.starts_with(&format!("00-{trace_id}-")),
        "the provider got {sent_parent:?}, not a span of the client's trace {trace_id}"
    );
    let hook_parent = delivered[0].header("traceparent");
    assert!(
        hook_parent.starts_with(&format!("00-{trace_id}-")),
        "the receiver got {hook_parent:?}"
    );

    // The second process's spans hang under the span the first process
    // stored with the job.
    let stored: String = {
        let store = db.open_store().await;
        let id = job_id.clone();
        tokio::task::spawn_blocking(move || {
            use diesel::prelude::*;
            use onejob::store::schema::jobs;
            let mut conn = store.conn().unwrap();
            jobs::table
                .filter(jobs::id.eq(id))
                .select(jobs::trace_context)
                .first::<Option<String>>(&mut conn)
                .unwrap()
                .expect("the job kept its trace")
        })
        .await
        .unwrap()
    };
    let creation_span = &stored[36..52];
    let spans = collector
        .wait_until("the second process's spans", WAIT, |spans| {
            spans
                .iter()
                .filter(|s| s.trace_id == trace_id)
                .any(|s| s.name == "webhook delivery")
        })
        .await;
    let spans: Vec<Span> = spans
        .into_iter()
        .filter(|s| s.trace_id == trace_id)
        .collect();
    println!("the trace across the kill:\n{}", tree(&spans));
    let call = provider_span(&spans, 1);
    assert_eq!(call.parent_span_id, creation_span);
    assert!(sent_parent.starts_with(&call.traceparent_prefix()));
    let delivery = find(&spans, "the delivery", |s| s.name == "webhook delivery");
    assert_eq!(delivery.parent_span_id, creation_span);
}

/// The collector hangs (then refuses): requests are answered as ever, and
/// the spans that could not go are counted in `/metrics`.
async fn a_collector_that_hangs_or_refuses_fails_no_request_and_its_spans_are_counted(
    backend: TestBackend,
) {
    let db = TestDb::create_empty(backend);
    let url = db.url.as_str().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let silent = SilentServer::start().await;
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let rest = one_fake(&fake);
    let bounded = "max_queue_size = 8\nmax_export_batch_size = 8\nexport_timeout_ms = 300";
    let config = config_file(dir.path(), "hung.toml", &silent.url(""), bounded, &rest);
    let mut server = ServerProcess::spawn(dir.path(), "hung", &config, &url);
    server.wait_ready().await;
    let token = admin_token(&db).await;
    let started = std::time::Instant::now();
    for i in 0..40 {
        let (traceparent, _, _) = client_traceparent();
        let created = post_job(&server.base, &token, &format!("hung-{i}"), &traceparent).await;
        assert_eq!(created.status(), StatusCode::CREATED, "job {i}");
    }
    println!(
        "40 creations with a hanging collector took {:?}",
        started.elapsed()
    );
    let metrics = |base: String, token: String| async move {
        let response = reqwest::Client::new()
            .get(format!("{base}/metrics"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        response.text().await.unwrap()
    };
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let text = metrics(server.base.clone(), token.clone()).await;
        let full = dropped(&text, "dropped_queue_full");
        let failed = dropped(&text, "dropped_export_failed");
        if full > 0.0 && failed > 0.0 {
            println!("spans dropped: {full} with the queue full, {failed} in failed exports");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(silent.accepted() > 0, "exports were tried");

    // A collector that answers 500: still no request fails.
    let refusing = Collector::start().await;
    refusing.refuse_first(usize::MAX);
    let config = config_file(dir.path(), "refused.toml", &refusing.endpoint(), "", &rest);
    server.kill();
    let mut server = ServerProcess::spawn(dir.path(), "refused", &config, &url);
    server.wait_ready().await;
    for i in 0..5 {
        let (traceparent, _, _) = client_traceparent();
        let created = post_job(&server.base, &token, &format!("refused-{i}"), &traceparent).await;
        assert_eq!(created.status(), StatusCode::CREATED, "job {i}");
    }
    let deadline = std::time::Instant::now() + WAIT;
    while refusing.exports() == 0 {
        assert!(std::time::Instant::now() < deadline, "no export was tried");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let text = metrics(server.base.clone(), token.clone()).await;
        if dropped(&text, "dropped_export_failed") > 0.0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
