//! Streamed chat completions (docs/design.md, "Streaming"), over real HTTP
//! against a fake upstream that streams: tokens reach the client as they
//! arrive, the stream belongs to the job (a reconnect or a duplicate joins
//! it), `Last-Event-ID` resumes, and timeouts and failover respect what the
//! clients already saw.
//!
//! Timing is ordered by the upstream's gates, not by the clock: a test
//! reads a chunk from onejob, checks how far the upstream has got, and only
//! then lets it send more.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::server_process::ServerProcess;
use crate::support::fake_provider::{
    config_of, Behaviour, FakeProvider, ProviderToml, Shape, StreamStep,
};
use crate::support::harness::{
    chat_request, spawn_app_with, start_instance, test_config, FormClient, TestApp, TestBackend,
    TestDb, DEFAULT_TEST_PROVIDERS,
};
use crate::support::metrics::{metric_sum, metrics};
use crate::support::sse::{content_of, SseEvent, SseReader};

on_both_backends!(
    chunks_reach_the_client_before_the_upstream_has_finished,
    a_client_that_hangs_up_after_three_chunks_and_reconnects_gets_the_whole_answer_from_one_call,
    last_event_id_resumes_after_the_event_it_names,
    an_idle_stall_after_the_first_chunk_makes_the_attempt_unknown_and_sends_nothing_else,
    a_failure_before_any_chunk_fails_over_and_one_after_a_chunk_does_not,
    a_duplicate_in_another_process_receives_the_same_content_from_one_upstream_call,
    a_kill_mid_stream_leaves_the_attempt_unknown_and_never_sends_it_again,
    two_concurrent_duplicates_in_two_processes_receive_identical_content_from_one_call,
    a_follower_past_the_cap_gets_a_429_and_one_that_hangs_up_frees_its_place,
    an_answer_past_the_stream_byte_cap_fails_over_before_a_chunk_and_fails_the_job_after,
    time_to_first_token_is_observed_by_provider_when_the_first_chunk_is_released,
    a_job_pages_stream_is_its_owners_alone_and_resumes_after_last_event_id,
);

/// How long `up` may go quiet between chunks: longer than any wait of a
/// test at a gate, on a loaded machine.
const PATIENT_MS: u64 = 10_000;

/// The chat route `gpt-stream` on the fake upstream `up`, then on `backup`
/// when one is given (a golden example lets it qualify).
fn stream_config(up: &FakeProvider, backup: Option<&FakeProvider>) -> onejob::config::Config {
    stream_config_idle(up, backup, PATIENT_MS)
}

/// [`stream_config`] with `up`'s idle timeout.
fn stream_config_idle(
    up: &FakeProvider,
    backup: Option<&FakeProvider>,
    idle_timeout_ms: u64,
) -> onejob::config::Config {
    let mut toml = ProviderToml::openai("up", &format!("{}/v1", up.base_url))
        .timeout_ms(10_000)
        .with(&format!("idle_timeout_ms = {idle_timeout_ms}"))
        .toml();
    let mut chain = "\"up\"".to_owned();
    if let Some(backup) = backup {
        toml.push_str(
            &ProviderToml::openai("backup", &backup.base_url)
                .timeout_ms(10_000)
                .toml(),
        );
        chain.push_str(", \"backup\"");
    }
    toml.push_str(&format!(
        r#"
[[tasks]]
name = "gpt-stream"
kind = "chat"
providers = [{chain}]

[[tasks.golden]]
input = {{ messages = [{{ role = "user", content = "ping" }}] }}
expect = {{ "/message/content" = "pong" }}
"#
    ));
    let mut config = config_of(&toml);
    config.server.max_wait_seconds = 20;
    config
}

/// A streaming request's body.
fn streaming(text: &str) -> Value {
    json!({
        "model": "gpt-stream",
        "messages": [{"role": "user", "content": text}],
        "stream": true,
    })
}

async fn open_stream(request: reqwest::RequestBuilder) -> SseReader {
    let response = request.send().await.expect("request sent");
    assert_eq!(response.status(), StatusCode::OK);
    SseReader::new(response)
}

/// The one attempt id the upstream has been sent, once it has.
async fn the_request_id(upstream: &FakeProvider) -> String {
    upstream.wait_requests(1).await;
    let ids = upstream.request_ids();
    assert_eq!(ids.len(), 1, "{ids:?}");
    ids[0].clone()
}

/// The job's stored answer text, as the jobs API gives it.
async fn stored_content(app: &TestApp, job_id: &str) -> String {
    let job = app
        .wait_for_job(job_id, crate::support::fake_provider::WAIT, |j| {
            j["status"] == "succeeded"
        })
        .await;
    job["result"]["message"]["content"]
        .as_str()
        .expect("a text answer")
        .to_owned()
}

fn job_id_of(events: &[SseEvent]) -> String {
    events[0].json()["id"]
        .as_str()
        .and_then(|id| id.strip_prefix("chatcmpl-"))
        .expect("a chunk id")
        .to_owned()
}

async fn chunks_reach_the_client_before_the_upstream_has_finished(backend: TestBackend) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.push(Behaviour::Stream(vec![
        StreamStep::Text("one ".into()),
        StreamStep::Gate,
        StreamStep::Text("two ".into()),
        StreamStep::Gate,
        StreamStep::Text("three".into()),
    ]));
    let app = spawn_app_with(backend, stream_config(&upstream, None)).await;
    let mut body = streaming("count");
    body["stream_options"] = json!({"include_usage": true});
    let mut reader = open_stream(chat_request(&app, "count", &body)).await;
    let request_id = the_request_id(&upstream).await;

    let mut seen = reader.until_content().await;
    assert_eq!(content_of(&seen), "one ");
    upstream.wait_gate(&request_id, 1).await;
    assert_eq!(
        upstream.chunks_sent(&request_id),
        1,
        "the client saw chunk 1 while the upstream was held before chunk 2"
    );
    upstream.open_gate(&request_id);
    seen.extend(reader.until_content().await);
    assert_eq!(content_of(&seen), "one two ");
    // The upstream counts a chunk once written: at its next gate, as above.
    upstream.wait_gate(&request_id, 2).await;
    assert_eq!(upstream.chunks_sent(&request_id), 2);
    upstream.open_gate(&request_id);
    seen.extend(reader.rest().await);
    assert_eq!(content_of(&seen), "one two three");
    assert!(seen.last().unwrap().is_done(), "{seen:#?}");
    assert!(seen.iter().all(|e| e.id.is_some()), "an id on every event");
    let usage = &seen[seen.len() - 2].json();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["total_tokens"], 8, "the upstream's usage");

    // The upstream was asked to stream, with its usage.
    let sent = upstream.last_request().unwrap();
    assert_eq!(sent.body["stream"], true);
    assert_eq!(sent.body["stream_options"]["include_usage"], true);

    // The stored answer is what was streamed, byte for byte, and a replay
    // streams it again with the same ids.
    let job_id = job_id_of(&seen);
    assert_eq!(stored_content(&app, &job_id).await, "one two three");
    // The streamed usage is the ledger's: 3 prompt tokens, 5 completion.
    let ledger: Value = app
        .get(&app.alice.token, &format!("/api/v1/jobs/{job_id}/usage"))
        .await
        .json()
        .await
        .unwrap();
    let call = &ledger["attempts"][0];
    assert_eq!(
        (&call["prompt_tokens"], &call["completion_tokens"]),
        (&json!(3), &json!(5)),
        "{ledger:#}"
    );
    assert_eq!(ledger["incomplete"], false, "{ledger:#}");
    let mut replay = open_stream(chat_request(&app, "count", &body)).await;
    let replayed = replay.rest().await;
    assert_eq!(
        replayed, seen,
        "a replay after completion is the same stream"
    );
    assert_eq!(upstream.total_requests(), 1);
}

async fn a_client_that_hangs_up_after_three_chunks_and_reconnects_gets_the_whole_answer_from_one_call(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.push(Behaviour::Stream(vec![
        StreamStep::Text("a".into()),
        StreamStep::Text("b".into()),
        StreamStep::Text("c".into()),
        StreamStep::Gate,
        StreamStep::Text("d".into()),
        StreamStep::Gate,
        StreamStep::Text("e".into()),
    ]));
    let app = spawn_app_with(backend, stream_config(&upstream, None)).await;
    let body = streaming("letters");
    let mut first = open_stream(chat_request(&app, "letters", &body)).await;
    let request_id = the_request_id(&upstream).await;
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.extend(first.until_content().await);
    }
    assert_eq!(content_of(&seen), "abc");
    drop(first);

    // The attempt goes on without the client: the upstream sends "d".
    upstream.wait_gate(&request_id, 1).await;
    upstream.open_gate(&request_id);
    upstream.wait_gate(&request_id, 2).await;
    assert_eq!(upstream.chunks_sent(&request_id), 4);

    // The reconnect gets every chunk so far, then follows live.
    let mut again = open_stream(chat_request(&app, "letters", &body)).await;
    let mut rejoined = Vec::new();
    for _ in 0..4 {
        rejoined.extend(again.until_content().await);
    }
    assert_eq!(content_of(&rejoined), "abcd");
    upstream.open_gate(&request_id);
    rejoined.extend(again.rest().await);
    assert_eq!(content_of(&rejoined), "abcde");
    assert!(rejoined.last().unwrap().is_done());
    assert_eq!(upstream.total_requests(), 1, "the upstream was called once");
    let job_id = job_id_of(&rejoined);
    assert_eq!(stored_content(&app, &job_id).await, "abcde");
    let job = app.get_job(&app.alice.token, &job_id).await;
    assert_eq!(job["attempts"].as_array().unwrap().len(), 1, "{job:#}");
}

async fn last_event_id_resumes_after_the_event_it_names(backend: TestBackend) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.push(Behaviour::Stream(vec![
        StreamStep::Text("w".into()),
        StreamStep::Text("x".into()),
        StreamStep::Gate,
        StreamStep::Text("y".into()),
        StreamStep::Text("z".into()),
    ]));
    let app = spawn_app_with(backend, stream_config(&upstream, None)).await;
    let body = streaming("resume");
    let mut first = open_stream(chat_request(&app, "resume", &body)).await;
    let request_id = the_request_id(&upstream).await;
    let mut seen = first.until_content().await;
    seen.extend(first.until_content().await);
    assert_eq!(content_of(&seen), "wx");
    let ids: Vec<&str> = seen.iter().filter_map(|e| e.id.as_deref()).collect();
    assert_eq!(
        ids,
        ["0", "1", "2"],
        "the role chunk, then the chunks by number"
    );
    drop(first);

    // Live: resuming after chunk 1 starts at chunk 2.
    let mut resumed =
        open_stream(chat_request(&app, "resume", &body).header("Last-Event-ID", "1")).await;
    let next = resumed.next().await.unwrap();
    assert_eq!(next.id.as_deref(), Some("2"));
    assert_eq!(next.content().as_deref(), Some("x"));
    upstream.open_gate(&request_id);
    let rest = resumed.rest().await;
    assert_eq!(content_of(&rest), "yz");
    let ids: Vec<&str> = rest.iter().filter_map(|e| e.id.as_deref()).collect();
    assert_eq!(ids, ["3", "4", "5", "7"], "y, z, the finish and [DONE]");

    // After completion: from the stored chunks.
    let mut after =
        open_stream(chat_request(&app, "resume", &body).header("Last-Event-ID", "3")).await;
    let events = after.rest().await;
    assert_eq!(events[0].id.as_deref(), Some("4"));
    assert_eq!(content_of(&events), "z");
    assert!(events.last().unwrap().is_done());

    // An id that is not one is refused, in OpenAI's shape.
    let refused = chat_request(&app, "resume", &body)
        .header("Last-Event-ID", "chunk-two")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    let error: Value = refused.json().await.unwrap();
    assert_eq!(error["error"]["param"], "Last-Event-ID", "{error:#}");
    // So is one on a request without a stream (an empty one too), which
    // creates nothing.
    let mut plain = streaming("resume");
    plain["stream"] = json!(false);
    for malformed in ["chunk-two", "", "-1", "+1", "1234567890123456789"] {
        let refused = chat_request(&app, "resume-plain", &plain)
            .header("Last-Event-ID", malformed)
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST, "{malformed:?}");
    }
    assert_eq!(upstream.total_requests(), 1);
}

async fn an_idle_stall_after_the_first_chunk_makes_the_attempt_unknown_and_sends_nothing_else(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.push(Behaviour::Stream(vec![
        StreamStep::Text("first".into()),
        StreamStep::Stall,
    ]));
    let app = spawn_app_with(backend, stream_config_idle(&upstream, None, 400)).await;
    let mut reader = open_stream(chat_request(&app, "stall", &streaming("stall"))).await;
    let events = reader.rest().await;
    assert_eq!(content_of(&events), "first");
    let last = events.last().unwrap();
    assert_eq!(
        last.error_code().as_deref(),
        Some("outcome_unknown"),
        "{events:#?}"
    );
    // The role chunk, the one chunk, the error: nothing else.
    assert_eq!(events.len(), 3, "{events:#?}");
    assert!(!events.iter().any(SseEvent::is_done));

    let job_id = job_id_of(&events);
    let job = app.get_job(&app.alice.token, &job_id).await;
    assert_eq!(job["status"], "unknown", "{job:#}");
    assert_eq!(job["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(job["attempts"][0]["state"], "unknown");
    assert!(
        job["attempts"][0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("idle timeout")),
        "{job:#}"
    );
    assert_eq!(upstream.total_requests(), 1, "never sent again");
}

async fn a_failure_before_any_chunk_fails_over_and_one_after_a_chunk_does_not(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    let backup = FakeProvider::start(Shape::OpenAi).await;
    backup.set_default(Behaviour::AnswerText("pong".into()));
    let app = spawn_app_with(backend, stream_config(&upstream, Some(&backup))).await;
    let report = app.app.qualify(None, "backup", "gpt-stream").await.unwrap();
    assert!(report.passed(), "{:?}", report.checks);
    let qualifying_calls = backup.total_requests();

    // Before any chunk: the backup answers, and the client sees one answer.
    upstream.push(Behaviour::Stream(vec![StreamStep::Error(
        "the model is overloaded".into(),
    )]));
    backup.push(Behaviour::stream_of(&["from ", "the backup"]));
    let mut reader = open_stream(chat_request(&app, "before", &streaming("before"))).await;
    let events = reader.rest().await;
    assert_eq!(content_of(&events), "from the backup", "{events:#?}");
    assert!(events.last().unwrap().is_done());
    let job = app.get_job(&app.alice.token, &job_id_of(&events)).await;
    assert_eq!(job["status"], "succeeded");
    assert_eq!(job["attempts"][0]["state"], "failed");
    assert_eq!(job["attempts"][1]["provider"], "backup");
    assert_eq!(backup.total_requests(), qualifying_calls + 1);

    // After a chunk: the job fails, and the client gets a terminal error
    // event after what it saw, never the backup's answer spliced on.
    upstream.push(Behaviour::Stream(vec![
        StreamStep::Text("half an ans".into()),
        StreamStep::Error("the model crashed".into()),
    ]));
    let mut reader = open_stream(chat_request(&app, "after", &streaming("after"))).await;
    let events = reader.rest().await;
    assert_eq!(content_of(&events), "half an ans", "{events:#?}");
    assert_eq!(
        events.last().unwrap().error_code().as_deref(),
        Some("job_failed"),
        "{events:#?}"
    );
    assert!(!events.iter().any(SseEvent::is_done));
    let job = app.get_job(&app.alice.token, &job_id_of(&events)).await;
    assert_eq!(job["status"], "failed", "{job:#}");
    assert_eq!(job["attempts"].as_array().unwrap().len(), 1, "no failover");
    assert!(
        job["failure_reason"]
            .as_str()
            .is_some_and(|r| r.contains("part of the answer")),
        "{job:#}"
    );
    assert_eq!(backup.total_requests(), qualifying_calls + 1);
}

async fn a_duplicate_in_another_process_receives_the_same_content_from_one_upstream_call(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.push(Behaviour::Stream(vec![
        StreamStep::Text("shared ".into()),
        StreamStep::Gate,
        StreamStep::Text("by ".into()),
        StreamStep::Text("both".into()),
    ]));
    let app = spawn_app_with(backend, stream_config(&upstream, None)).await;
    // Another process on the same database that does no work itself: what
    // it streams, it reads from the database.
    let mut elsewhere_config = stream_config(&upstream, None);
    elsewhere_config.worker.concurrency = 0;
    let (elsewhere, _other, other_server) =
        start_instance(elsewhere_config, app.store.clone()).await;

    let body = streaming("twice");
    let mut here = open_stream(chat_request(&app, "twice", &body)).await;
    let request_id = the_request_id(&upstream).await;
    let mut seen_here = here.until_content().await;
    let there = app
        .client
        .post(format!("{elsewhere}/v1/chat/completions"))
        .bearer_auth(&app.alice.token)
        .header("Idempotency-Key", "twice")
        .json(&body);
    let mut there = open_stream(there).await;
    let mut seen_there = there.until_content().await;
    assert_eq!(
        content_of(&seen_there),
        "shared ",
        "replayed from the database"
    );
    upstream.wait_gate(&request_id, 1).await;
    upstream.open_gate(&request_id);
    seen_here.extend(here.rest().await);
    seen_there.extend(there.rest().await);
    assert_eq!(content_of(&seen_here), "shared by both");
    assert_eq!(seen_there, seen_here, "the same events, ids and all");
    assert_eq!(upstream.total_requests(), 1, "one upstream call");
    other_server.abort();
}

/// A configuration file for real server processes: the chat route
/// `gpt-stream` on `up`, which never times out by itself, and a short
/// lease so a killed process's attempt is reaped soon.
fn process_config(dir: &std::path::Path, up: &FakeProvider) -> std::path::PathBuf {
    let toml = format!(
        r#"
[worker]
concurrency = 2
poll_interval_ms = 50
lease_ms = 1500

[database]
pool_timeout_ms = 300
sqlite_busy_timeout_ms = 300
postgres_lock_timeout_ms = 300
{provider}
[[tasks]]
name = "gpt-stream"
kind = "chat"
providers = ["up"]
"#,
        provider = ProviderToml::openai("up", &up.base_url)
            .timeout_ms(60_000)
            .connect_timeout_ms(None)
            .with("idle_timeout_ms = 60000")
            .toml(),
    );
    let path = dir.join("onejob.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// Real server processes on one fresh database, and an API token of its
/// first user.
struct Processes {
    db: TestDb,
    dir: tempfile::TempDir,
    config: std::path::PathBuf,
    token: String,
    client: reqwest::Client,
}

impl Processes {
    /// Starts the first process, serving `up`, and reads a token.
    async fn start(backend: TestBackend, up: &FakeProvider) -> (Self, ServerProcess) {
        let db = TestDb::create_empty(backend);
        let dir = tempfile::tempdir().unwrap();
        let config = process_config(dir.path(), up);
        let mut first = ServerProcess::spawn(dir.path(), "first", &config, db.url.as_str());
        first.wait_ready().await;
        let url = db.url.clone();
        let token = tokio::task::spawn_blocking(move || {
            let store =
                onejob::startup::open_store(&url, &test_config(DEFAULT_TEST_PROVIDERS)).unwrap();
            let mut conn = store.conn().unwrap();
            onejob::store::users::issue_token(&mut conn, "admin", None)
                .unwrap()
                .0
        })
        .await
        .unwrap();
        let processes = Self {
            db,
            dir,
            config,
            token,
            client: reqwest::Client::new(),
        };
        (processes, first)
    }

    /// Another process on the same database, in `role`, ready.
    async fn another(&self, name: &str, role: &str) -> ServerProcess {
        let port = crate::server_process::free_port();
        let mut process = ServerProcess::spawn_as(
            self.dir.path(),
            name,
            &self.config,
            self.db.url.as_str(),
            port,
            role,
        );
        process.wait_ready().await;
        process
    }

    /// The streaming chat request under `key` to the process at `base`.
    fn request(&self, base: &str, key: &str) -> reqwest::RequestBuilder {
        self.client
            .post(format!("{base}/v1/chat/completions"))
            .bearer_auth(&self.token)
            .header("Idempotency-Key", key)
            .json(&streaming(key))
    }
}

async fn two_concurrent_duplicates_in_two_processes_receive_identical_content_from_one_call(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.push(Behaviour::Stream(vec![
        StreamStep::Text("one call, ".into()),
        StreamStep::Gate,
        StreamStep::Text("two ".into()),
        StreamStep::Text("readers".into()),
    ]));
    let (processes, worker) = Processes::start(backend, &upstream).await;
    // The second process only serves HTTP: what it streams, it reads from
    // the database.
    let http_only = processes.another("http-only", "http").await;
    let mut here = open_stream(processes.request(&worker.base, "dup")).await;
    let mut there = open_stream(processes.request(&http_only.base, "dup")).await;
    let request_id = the_request_id(&upstream).await;
    let mut seen_here = here.until_content().await;
    let mut seen_there = there.until_content().await;
    assert_eq!(content_of(&seen_there), "one call, ");
    upstream.wait_gate(&request_id, 1).await;
    upstream.open_gate(&request_id);
    seen_here.extend(here.rest().await);
    seen_there.extend(there.rest().await);
    assert_eq!(content_of(&seen_here), "one call, two readers");
    assert_eq!(seen_there, seen_here, "the same events, ids and all");
    assert_eq!(upstream.total_requests(), 1, "one upstream call");
}

async fn a_kill_mid_stream_leaves_the_attempt_unknown_and_never_sends_it_again(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.push(Behaviour::Stream(vec![
        StreamStep::Text("before the crash".into()),
        StreamStep::Stall,
    ]));
    let (processes, mut first) = Processes::start(backend, &upstream).await;
    let (client, token) = (&processes.client, &processes.token);
    let request = |base: &str| processes.request(base, "crash");
    let mut reader = open_stream(request(&first.base)).await;
    let seen = reader.until_content().await;
    assert_eq!(content_of(&seen), "before the crash");
    let job_id = job_id_of(&seen);

    // kill -9 mid-stream; another process reaps the lease.
    first.kill();
    first.wait_exit(std::time::Duration::from_secs(10)).await;
    let second = processes.another("second", "all").await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let job = loop {
        let job: Value = client
            .get(format!("{}/api/v1/jobs/{job_id}", second.base))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        // The job's row and its attempts are read one after the other:
        // both say so once the reaper's transaction is seen by both reads.
        if job["status"] == "unknown" && job["attempts"][0]["state"] == "unknown" {
            break job;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not unknown in 20 s: {job:#}\n{}",
            second.stderr()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(job["status"], "unknown", "{job:#}");
    assert_eq!(job["attempts"].as_array().unwrap().len(), 1);
    assert!(
        job["attempts"][0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("lease expired")),
        "{job:#}"
    );

    // A reconnect under the key is told the outcome is unknown; nothing is
    // sent again, however many claims the live process makes meanwhile.
    let again = request(&second.base).send().await.unwrap();
    assert_eq!(again.status(), StatusCode::SERVICE_UNAVAILABLE);
    let error: Value = again.json().await.unwrap();
    assert_eq!(error["error"]["code"], "outcome_unknown", "{error:#}");
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(upstream.total_requests(), 1, "never re-sent");
}

/// Scrapes `/metrics` until the sample called `name` (with `labels`) is
/// `value`; panics after 10 s with what it was.
async fn wait_for_metric(app: &TestApp, name: &str, labels: &[(&str, &str)], value: f64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let now = metric_sum(&metrics(app).await, name, labels);
        if now == value {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name}{labels:?} stayed {now}, not {value}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

async fn a_follower_past_the_cap_gets_a_429_and_one_that_hangs_up_frees_its_place(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.push(Behaviour::Stream(vec![
        StreamStep::Text("held ".into()),
        StreamStep::Gate,
        StreamStep::Text("open".into()),
    ]));
    let mut config = stream_config(&upstream, None);
    config.server.max_followers_per_job = 2;
    // A quiet stream's keep-alive is how a client that hung up is noticed.
    config.server.stream_keepalive_ms = 200;
    let app = spawn_app_with(backend, config).await;
    let body = streaming("capped");
    let followed = "onejob_streams_followed";
    let mut first = open_stream(chat_request(&app, "capped", &body)).await;
    let request_id = the_request_id(&upstream).await;
    let mut seen_first = first.until_content().await;
    let mut second = open_stream(chat_request(&app, "capped", &body)).await;
    assert_eq!(content_of(&second.until_content().await), "held ");
    wait_for_metric(&app, followed, &[], 2.0).await;

    // A third follower of the job is refused, in OpenAI's shape, with a
    // retry the SDKs make on their own; it changes nothing.
    let refused = chat_request(&app, "capped", &body).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(refused.headers()["x-should-retry"], "true");
    let error: Value = refused.json().await.unwrap();
    assert_eq!(error["error"]["code"], "too_many_followers", "{error:#}");
    assert_eq!(error["error"]["type"], "rate_limit_error", "{error:#}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("already has 2 followers") && message.contains("max_followers_per_job"),
        "{message}"
    );
    let exposition = metrics(&app).await;
    assert_eq!(
        metric_sum(
            &exposition,
            "onejob_stream_limits_hit_total",
            &[("limit", "followers")]
        ),
        1.0
    );
    assert_eq!(
        metric_sum(&exposition, followed, &[]),
        2.0,
        "the refusal follows nothing"
    );

    // A follower that hangs up mid-stream gives its place back within a
    // few keep-alives, though the upstream sends nothing meanwhile.
    drop(second);
    wait_for_metric(&app, followed, &[], 1.0).await;
    assert_eq!(
        upstream.chunks_sent(&request_id),
        1,
        "nothing moved meanwhile"
    );
    let mut third = open_stream(chat_request(&app, "capped", &body)).await;
    let mut seen_third = third.until_content().await;
    assert_eq!(content_of(&seen_third), "held ");

    upstream.wait_gate(&request_id, 1).await;
    upstream.open_gate(&request_id);
    seen_first.extend(first.rest().await);
    seen_third.extend(third.rest().await);
    assert_eq!(content_of(&seen_first), "held open");
    assert_eq!(seen_third, seen_first, "the same stream");
    // Streams that ended follow nothing.
    wait_for_metric(&app, followed, &[], 0.0).await;
    assert_eq!(upstream.total_requests(), 1, "one upstream call");
}

async fn an_answer_past_the_stream_byte_cap_fails_over_before_a_chunk_and_fails_the_job_after(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    let backup = FakeProvider::start(Shape::OpenAi).await;
    backup.set_default(Behaviour::AnswerText("pong".into()));
    let mut config = stream_config(&upstream, Some(&backup));
    config.server.max_stream_bytes = 1024;
    let app = spawn_app_with(backend, config).await;
    let report = app.app.qualify(None, "backup", "gpt-stream").await.unwrap();
    assert!(report.passed(), "{:?}", report.checks);
    let qualifying_calls = backup.total_requests();
    let big = "x".repeat(1500);

    // A first chunk past the cap: nothing was released, so the refusal is
    // a definite failure like any other, and the backup answers.
    upstream.push(Behaviour::Stream(vec![StreamStep::Text(big.clone())]));
    backup.push(Behaviour::stream_of(&["small ", "enough"]));
    let mut reader = open_stream(chat_request(&app, "big-first", &streaming("big-first"))).await;
    let events = reader.rest().await;
    assert_eq!(content_of(&events), "small enough", "{events:#?}");
    assert!(events.last().unwrap().is_done());
    let job = app.get_job(&app.alice.token, &job_id_of(&events)).await;
    assert_eq!(job["status"], "succeeded", "{job:#}");
    assert_eq!(job["attempts"][0]["state"], "failed");
    assert!(
        job["attempts"][0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("1024 bytes") && e.contains("max_stream_bytes")),
        "{job:#}"
    );
    assert_eq!(job["attempts"][1]["provider"], "backup");

    // Past the cap after a released chunk: the clients keep what they saw
    // and get a terminal error event; the job fails, with no failover.
    upstream.push(Behaviour::Stream(vec![
        StreamStep::Text("seen ".into()),
        StreamStep::Text(big),
        StreamStep::Text("never".into()),
    ]));
    let mut reader = open_stream(chat_request(&app, "big-later", &streaming("big-later"))).await;
    let events = reader.rest().await;
    assert_eq!(content_of(&events), "seen ", "{events:#?}");
    assert_eq!(
        events.last().unwrap().error_code().as_deref(),
        Some("job_failed"),
        "{events:#?}"
    );
    assert!(!events.iter().any(SseEvent::is_done));
    let job = app.get_job(&app.alice.token, &job_id_of(&events)).await;
    assert_eq!(job["status"], "failed", "{job:#}");
    assert_eq!(job["attempts"].as_array().unwrap().len(), 1, "no failover");
    assert!(
        job["attempts"][0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("max_stream_bytes")),
        "{job:#}"
    );
    assert_eq!(backup.total_requests(), qualifying_calls + 1);
    let exposition = metrics(&app).await;
    assert_eq!(
        metric_sum(
            &exposition,
            "onejob_stream_limits_hit_total",
            &[("limit", "buffer")]
        ),
        2.0
    );
}

async fn time_to_first_token_is_observed_by_provider_when_the_first_chunk_is_released(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.push(Behaviour::Stream(vec![
        StreamStep::Wait(300),
        StreamStep::Text("late ".into()),
        StreamStep::Gate,
        StreamStep::Text("start".into()),
    ]));
    let app = spawn_app_with(backend, stream_config(&upstream, None)).await;
    let ttft = "onejob_time_to_first_token_seconds";
    let count = format!("{ttft}_count");
    let before = metrics(&app).await;
    assert_eq!(
        metric_sum(&before, &count, &[("provider", "up")]),
        0.0,
        "written at zero from the start: {before}"
    );
    assert!(before.contains(&format!("# TYPE {ttft} histogram")));

    let mut reader = open_stream(chat_request(&app, "ttft", &streaming("ttft"))).await;
    let request_id = the_request_id(&upstream).await;
    let seen = reader.until_content().await;
    assert_eq!(content_of(&seen), "late ");
    // Observed once the first chunk was released, while the upstream is
    // still held before its second.
    let exposition = metrics(&app).await;
    assert_eq!(metric_sum(&exposition, &count, &[("provider", "up")]), 1.0);
    let took = metric_sum(&exposition, &format!("{ttft}_sum"), &[("provider", "up")]);
    assert!((0.3..10.0).contains(&took), "{took} s to the first token");
    assert_eq!(
        metric_sum(
            &exposition,
            &format!("{ttft}_bucket"),
            &[("provider", "up"), ("le", "0.256")]
        ),
        0.0,
        "not before the upstream sent it"
    );
    upstream.wait_gate(&request_id, 1).await;
    upstream.open_gate(&request_id);
    let _ = reader.rest().await;
    // Once per attempt, not per chunk.
    let exposition = metrics(&app).await;
    assert_eq!(metric_sum(&exposition, &count, &[("provider", "up")]), 1.0);
}

/// A job page's stream as a signed-in browser asks for it.
async fn page_stream(client: &FormClient, job_id: &str, last: Option<&str>) -> reqwest::Response {
    let mut request = client
        .http
        .get(format!("{}/jobs/{job_id}/stream", client.base))
        .header("Accept", "text/event-stream");
    if let Some(last) = last {
        request = request.header("Last-Event-ID", last);
    }
    request.send().await.unwrap()
}

/// The page stream's events with data (the `retry:` hint has none).
async fn page_events(reader: &mut SseReader, until_end: bool) -> Vec<SseEvent> {
    let mut events = Vec::new();
    while let Some(event) = reader.next().await {
        if event.data.is_empty() {
            continue;
        }
        let end = event.json().get("status").is_some();
        events.push(event);
        if !until_end || end {
            if !until_end {
                return events;
            }
            break;
        }
    }
    events
}

async fn a_job_pages_stream_is_its_owners_alone_and_resumes_after_last_event_id(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.push(Behaviour::Stream(vec![
        StreamStep::Text("page ".into()),
        StreamStep::Text("by ".into()),
        StreamStep::Gate,
        StreamStep::Text("page".into()),
    ]));
    let app = spawn_app_with(backend, stream_config(&upstream, None)).await;
    // The API client hangs up after its first chunk: the job goes on.
    let mut first = open_stream(chat_request(&app, "paged", &streaming("paged"))).await;
    let request_id = the_request_id(&upstream).await;
    let job_id = job_id_of(&first.until_content().await);
    drop(first);
    upstream.wait_gate(&request_id, 1).await;

    for name in ["alice", "bob", "sue"] {
        app.set_password(name, &format!("{name}-pw")).await;
    }
    let alice = FormClient::new(&app);
    alice.sign_in("alice", "alice-pw").await;

    // The owner follows from the first chunk, live.
    let response = page_stream(&alice, &job_id, None).await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut reader = SseReader::new(response);
    let mut texts = Vec::new();
    for _ in 0..2 {
        texts.extend(page_events(&mut reader, false).await);
    }
    let said: Vec<(Option<&str>, Value)> =
        texts.iter().map(|e| (e.id.as_deref(), e.json())).collect();
    assert_eq!(
        said,
        [
            (Some("1"), json!({"text": "page "})),
            (Some("2"), json!({"text": "by "}))
        ]
    );
    // Resumed after event 1 while the upstream is held: event 2 on.
    let mut resumed = SseReader::new(page_stream(&alice, &job_id, Some("1")).await);
    let next = page_events(&mut resumed, false).await;
    assert_eq!(next[0].id.as_deref(), Some("2"), "{next:?}");

    upstream.open_gate(&request_id);
    let rest = page_events(&mut reader, true).await;
    let ids: Vec<&str> = rest.iter().filter_map(|e| e.id.as_deref()).collect();
    assert_eq!(ids, ["3", "4"], "{rest:?}");
    assert_eq!(rest[0].json(), json!({"text": "page"}));
    assert_eq!(rest[1].json()["status"], "succeeded");
    assert!(
        reader.next().await.is_none(),
        "the stream ends after its end"
    );
    let _ = page_events(&mut resumed, true).await;

    // After the job ended: the stored chunks, then the end.
    let mut after = SseReader::new(page_stream(&alice, &job_id, Some("2")).await);
    let events = page_events(&mut after, true).await;
    let said: Vec<Value> = events.iter().map(SseEvent::json).collect();
    assert_eq!(said[0], json!({"text": "page"}), "{said:?}");
    assert_eq!(said[1]["status"], "succeeded");
    let text: String = page_events(
        &mut SseReader::new(page_stream(&alice, &job_id, None).await),
        true,
    )
    .await
    .iter()
    .filter_map(|e| e.json()["text"].as_str().map(str::to_owned))
    .collect();
    assert_eq!(
        text,
        stored_content(&app, &job_id).await,
        "the stored answer"
    );

    // A malformed Last-Event-ID is a readable 400.
    let refused = page_stream(&alice, &job_id, Some("two")).await;
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    assert!(refused.text().await.unwrap().contains("Last-Event-ID"));

    // Nobody else follows it, staff included: the 404 of a job that does
    // not exist, word for word.
    let missing = onejob::domain::JobId::new().to_string();
    let anonymous = FormClient::new(&app);
    let nobody = page_stream(&anonymous, &job_id, None).await;
    assert_eq!(nobody.status(), StatusCode::SEE_OTHER, "sign in first");
    for name in ["bob", "sue"] {
        let other = FormClient::new(&app);
        other.sign_in(name, &format!("{name}-pw")).await;
        let theirs = page_stream(&other, &job_id, None).await;
        assert_eq!(theirs.status(), StatusCode::NOT_FOUND, "{name}");
        let page = theirs.text().await.unwrap();
        assert!(!page.contains(&job_id), "{name}: {page}");
        let none = page_stream(&other, &missing, None)
            .await
            .text()
            .await
            .unwrap();
        assert_eq!(page, none, "{name}: the same answer as for no job");
    }
    assert_eq!(upstream.total_requests(), 1);
}
