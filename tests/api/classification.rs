//! The classification table (docs/design.md, "Providers"; `providers::classify`)
//! against real HTTP servers on 127.0.0.1: every row's outcome (succeeded,
//! definite failure, unknown), the reason recorded on the attempt, and the
//! failover column: a definite failure fails over to a qualified fallback,
//! an unknown outcome never does. Both provider shapes (OpenAI-compatible and
//! Anthropic) are spoken.

use std::time::{Duration, Instant};

use onejob::domain::{AttemptState, JobStatus, RaceResult};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use crate::support::db::{stored, StoredJob};
use crate::support::fake_provider::{
    closed_port_url, config_of, settled_attempt, strict_task_toml, Behaviour, FakeProvider,
    ProviderToml, Shape, WAIT,
};
use crate::support::harness::{spawn_app_with, summarize, TestBackend, FAKE_API_KEY};

/// A soft timeout no answer from 127.0.0.1 comes near: a row whose call
/// ends (an answer, a refusal, a reset) is classified by what came back,
/// never by a race with the soft timeout.
const NO_SOFT_TIMEOUT_MS: u64 = 30_000;

/// An OpenAI-compatible provider entry with explicit clocks.
fn http_provider(name: &str, base_url: &str, timeout_ms: u64, connect_timeout_ms: u64) -> String {
    ProviderToml::openai(name, base_url)
        .timeout_ms(timeout_ms)
        .late_result_ms(5000)
        .connect_timeout_ms(Some(connect_timeout_ms))
        .toml()
}

/// A plain-HTTP server that answers whatever arrives (a TLS ClientHello
/// included) with an HTTP/1.1 400 at once, as nginx does on its plain port.
/// Returns its port and the first byte of each connection's first read.
async fn plain_http_server() -> (u16, tokio::sync::mpsc::UnboundedReceiver<u8>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (first_bytes, received) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let first_bytes = first_bytes.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                if let Ok(n) = stream.read(&mut buf).await {
                    if n > 0 {
                        let _ = first_bytes.send(buf[0]);
                    }
                }
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    )
                    .await;
                let _ = stream.shutdown().await;
            });
        }
    });
    (port, received)
}

/// A listener on 127.0.0.1 that never accepts, whose accept queue is full:
/// Linux drops a SYN to a listener whose accept queue is full (it does not
/// answer it, even with SYN cookies on), so a connect to it hangs until the
/// client gives up. Returns the listener and the connections that fill the
/// queue; both must be kept for as long as the port must stay silent.
async fn unanswered_listener() -> (TcpListener, Vec<TcpStream>, u16) {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let address = listener.local_addr().unwrap();
    let mut fillers = Vec::new();
    // A connect completes only when the kernel answered its SYN, i.e. only
    // while the queue had room; the first one that does not complete shows
    // the queue is full. A completed handshake on 127.0.0.1 takes
    // microseconds, so 500 ms without one is a dropped SYN.
    for _ in 0..8 {
        match tokio::time::timeout(Duration::from_millis(500), TcpStream::connect(address)).await {
            Ok(Ok(stream)) => fillers.push(stream),
            Ok(Err(e)) => panic!("connecting to the backlog listener failed: {e}"),
            Err(_) => return (listener, fillers, address.port()),
        }
    }
    panic!("the kernel kept completing handshakes on a listen(0) socket that never accepts");
}

/// What a row expects of the job's first attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// Succeeded and won; no failover.
    Succeeded,
    /// Failed: the job fails over to the qualified backup, which wins.
    Definite,
    /// Unknown: no failover; the job is unknown.
    Unknown,
}

struct Row {
    what: &'static str,
    /// The task whose chain is `[<provider under test>, "backup"]`.
    task: &'static str,
    /// Queued on the fake provider for this row (rows whose provider is not
    /// the fake never reach it).
    behaviour: Option<Behaviour>,
    expect: Expect,
    /// Fragments the first attempt's recorded error must contain.
    error_has: &'static [&'static str],
    /// If not empty, the error must also contain one of these.
    error_has_one_of: &'static [&'static str],
}

fn status(status: u16, retry_after: Option<u64>, body: &str) -> Option<Behaviour> {
    Some(Behaviour::Status {
        status,
        retry_after,
        body: body.into(),
    })
}

fn row(
    what: &'static str,
    behaviour: Option<Behaviour>,
    expect: Expect,
    error_has: &'static [&'static str],
) -> Row {
    Row {
        what,
        task: "summarize",
        behaviour,
        expect,
        error_has,
        error_has_one_of: &[],
    }
}

async fn every_row_of_the_classification_table(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let backup = FakeProvider::start(Shape::OpenAi).await;
    let (tls_port, mut tls_first_bytes) = plain_http_server().await;
    let (_unanswered, _fillers, unanswered_port) = unanswered_listener().await;
    let template = "Summarize: {{ text }}";
    let toml = [
        http_provider("fake", &fake.base_url, NO_SOFT_TIMEOUT_MS, 1000),
        // The same server, with a soft timeout a hanging call runs into.
        ProviderToml::openai("fake-hang", &fake.base_url).toml(),
        http_provider("backup", &backup.base_url, NO_SOFT_TIMEOUT_MS, 1000),
        http_provider("closed", &closed_port_url(), NO_SOFT_TIMEOUT_MS, 1000),
        http_provider(
            "tls",
            &format!("https://127.0.0.1:{tls_port}"),
            NO_SOFT_TIMEOUT_MS,
            1000,
        ),
        http_provider(
            "unanswered",
            &format!("http://127.0.0.1:{unanswered_port}"),
            NO_SOFT_TIMEOUT_MS,
            300,
        ),
        // `.invalid` never resolves (RFC 6761); a connect timeout longer
        // than a slow resolver's keeps the failure a DNS one.
        http_provider(
            "dns",
            "https://no-such-host.invalid",
            NO_SOFT_TIMEOUT_MS,
            10_000,
        ),
        strict_task_toml("summarize", &["fake", "backup"], template),
        strict_task_toml("hang", &["fake-hang", "backup"], template),
        strict_task_toml("refused", &["closed", "backup"], template),
        strict_task_toml("tls", &["tls", "backup"], template),
        strict_task_toml("connect-timeout", &["unanswered", "backup"], template),
        strict_task_toml("dns", &["dns", "backup"], template),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    for task in [
        "summarize",
        "hang",
        "refused",
        "tls",
        "connect-timeout",
        "dns",
    ] {
        let report = app.app.qualify(None, "backup", task).await.unwrap();
        assert!(report.passed(), "backup for {task}: {:?}", report.checks);
    }
    use Expect::{Definite, Succeeded, Unknown};
    let rows = vec![
        row(
            "a valid answer",
            Some(Behaviour::Answer(json!({"summary": "fine"}))),
            Succeeded,
            &[],
        ),
        row(
            "400",
            status(400, None, "{}"),
            Definite,
            &["refused the request with 400"],
        ),
        row(
            "401",
            status(401, None, "{}"),
            Definite,
            &["refused the request with 401"],
        ),
        row(
            "403",
            status(403, None, "{}"),
            Definite,
            &["refused the request with 403"],
        ),
        row(
            "404",
            status(404, None, "{}"),
            Definite,
            &["refused the request with 404"],
        ),
        row(
            "422",
            status(422, None, "{}"),
            Definite,
            &["refused the request with 422"],
        ),
        row(
            "429",
            status(429, Some(1), "{}"),
            Definite,
            &["rate limited (429)"],
        ),
        row(
            "529",
            status(529, None, r#"{"type":"overloaded_error"}"#),
            Definite,
            &["overloaded (529)", "overloaded_error"],
        ),
        row(
            "408",
            status(408, None, "{}"),
            Unknown,
            &["answered 408", "may or may not have done the work"],
        ),
        row(
            "409",
            status(409, None, "{}"),
            Unknown,
            &["answered 409", "may or may not have done the work"],
        ),
        row(
            "500",
            status(500, None, "{}"),
            Unknown,
            &["answered 500", "may or may not have done the work"],
        ),
        row(
            "502",
            status(502, None, "{}"),
            Unknown,
            &["answered 502", "may or may not have done the work"],
        ),
        row(
            "503",
            status(503, None, "{}"),
            Unknown,
            &["answered 503", "may or may not have done the work"],
        ),
        row(
            "504",
            status(504, None, "{}"),
            Unknown,
            &["answered 504", "may or may not have done the work"],
        ),
        Row {
            task: "hang",
            ..row(
                "a hang past the soft timeout",
                Some(Behaviour::Hang),
                Unknown,
                &["no answer within the soft timeout of 400 ms"],
            )
        },
        row(
            "a reset mid-body",
            Some(Behaviour::ResetMidBody),
            Unknown,
            &[
                "the answer was cut off (200 OK)",
                "Connection reset by peer",
            ],
        ),
        row(
            "a truncated body",
            Some(Behaviour::TruncatedBody),
            Unknown,
            &[
                "the answer was cut off (200 OK)",
                "end of file before message length reached",
            ],
        ),
        row(
            "prose",
            Some(Behaviour::AnswerText("Sure! Here is a summary.".into())),
            Definite,
            &["invalid_output", "not JSON"],
        ),
        row(
            "an extra top-level key",
            Some(Behaviour::Answer(json!({"summary": "x", "confidence": 1}))),
            Definite,
            &["invalid_output", "confidence"],
        ),
        Row {
            task: "refused",
            ..row(
                "connection refused",
                None,
                Definite,
                &["could not connect", "Connection refused"],
            )
        },
        Row {
            task: "tls",
            ..row(
                "a TLS failure",
                None,
                Definite,
                &["could not connect", "InvalidContentType"],
            )
        },
        Row {
            task: "connect-timeout",
            // reqwest runs two timers of `connect_timeout_ms`, one around the
            // TCP connect and one around the whole connector; either may
            // fire first.
            error_has_one_of: &[
                "tcp connect error: deadline has elapsed",
                "operation timed out",
            ],
            ..row("a connect timeout", None, Definite, &["could not connect"])
        },
        Row {
            task: "dns",
            ..row(
                "a DNS failure",
                None,
                Definite,
                &["could not connect", "dns error"],
            )
        },
    ];
    let mut rate_limited_at = None;
    let mut rate_limited_sent_at = None;
    for (i, row) in rows.into_iter().enumerate() {
        let what = row.what;
        let to_fake = row.behaviour.is_some();
        if let Some(behaviour) = row.behaviour {
            fake.push(behaviour);
        }
        let backup_before = backup.total_requests();
        let started = Instant::now();
        if what == "429" {
            rate_limited_at = Some(started);
        }
        let mut body = summarize("classify me");
        body["task"] = row.task.into();
        let job_id = app
            .create_job(&app.alice.token, &format!("row-{i}"), &body)
            .await;
        let attempt = settled_attempt(&app, &job_id, 0).await;
        let expected_state = match row.expect {
            Succeeded => "succeeded",
            Definite => "failed",
            Unknown => "unknown",
        };
        assert_eq!(attempt["state"], expected_state, "{what}: {attempt:#}");
        if row.expect == Definite {
            app.wait_for_status(&job_id, "succeeded", WAIT).await;
        }
        if what == "529" {
            // The 429 before it said Retry-After: 1. The pause began when
            // the 429 came back, after that row's job was created; the 529
            // was sent only once the pause was over, before it settled.
            let since_429 = rate_limited_at.unwrap().elapsed();
            assert!(
                since_429 >= Duration::from_secs(1),
                "Retry-After was not respected: the 529 settled {since_429:?} after the 429 row began"
            );
        }

        // The rows, as stored.
        let StoredJob {
            job,
            attempts: rows,
            ..
        } = stored(&app, &job_id).await;
        let first = &rows[0];
        match what {
            "429" => rate_limited_sent_at = first.sent_at,
            "529" => {
                // Recorded just before each call went out: the 529 went out
                // at least the 429's Retry-After (1 s) after the 429 did.
                let gap = first.sent_at.unwrap() - rate_limited_sent_at.unwrap();
                assert!(
                    gap >= 1000,
                    "Retry-After was not respected: sent {gap} ms after the 429"
                );
            }
            _ => {}
        }
        let error = first.reason().map(|r| r.for_staff()).unwrap_or_default();
        for fragment in row.error_has {
            assert!(
                error.contains(fragment),
                "{what}: error {error:?} should mention {fragment:?}"
            );
        }
        assert!(
            row.error_has_one_of.is_empty()
                || row.error_has_one_of.iter().any(|f| error.contains(f)),
            "{what}: error {error:?} should mention one of {:?}",
            row.error_has_one_of
        );
        assert!(!error.contains(FAKE_API_KEY), "{what}: {error}");
        match row.expect {
            Succeeded => {
                assert_eq!(rows.len(), 1, "{what}: {rows:#?}");
                assert_eq!(first.state, AttemptState::Succeeded, "{what}");
                assert_eq!(first.outcome, Some(RaceResult::Won), "{what}");
                assert_eq!(first.error, None, "{what}");
                assert_eq!(job.status, JobStatus::Succeeded, "{what}");
                assert_eq!(job.completed_by.as_ref(), Some(&first.id), "{what}");
                assert_eq!(
                    job.result.as_ref().map(|r| r.value()),
                    Some(json!({"summary": "fine"})),
                    "{what}"
                );
            }
            Definite => {
                // Failed over: a second attempt on the qualified backup, which won.
                assert_eq!(rows.len(), 2, "{what}: failed over once: {rows:#?}");
                assert_eq!(first.state, AttemptState::Failed, "{what}");
                assert_eq!(first.outcome, None, "{what}");
                let second = &rows[1];
                assert_eq!(
                    (second.number, second.provider.as_str(), second.state),
                    (2, "backup", AttemptState::Succeeded),
                    "{what}"
                );
                assert_eq!(second.outcome, Some(RaceResult::Won), "{what}");
                assert_eq!(job.status, JobStatus::Succeeded, "{what}");
                assert_eq!(job.completed_by.as_ref(), Some(&second.id), "{what}");
                assert_eq!(job.failure_reason, None, "{what}");
                assert_eq!(
                    backup.requests_for(second.id.as_str()),
                    1,
                    "{what}: the backup was sent the second attempt once"
                );
                assert_eq!(backup.total_requests(), backup_before + 1, "{what}");
            }
            Unknown => {
                // No failover: one attempt, the job unknown, nothing sent elsewhere.
                assert_eq!(rows.len(), 1, "{what}: no failover: {rows:#?}");
                assert_eq!(first.state, AttemptState::Unknown, "{what}");
                assert_eq!(first.outcome, None, "{what}");
                assert_eq!(job.status, JobStatus::Unknown, "{what}");
                assert_eq!(job.completed_by, None, "{what}");
                assert_eq!(job.result, None, "{what}");
                assert_eq!(job.failure_reason, None, "{what}");
                assert_eq!(backup.total_requests(), backup_before, "{what}");
            }
        }

        // What the provider under test received, if it is the fake.
        let attempt_id = first.id.as_str();
        if !to_fake {
            assert_eq!(
                fake.requests_for(attempt_id),
                0,
                "{what}: never reached the fake"
            );
            continue;
        }
        assert_eq!(
            fake.requests_for(attempt_id),
            1,
            "{what}: sent exactly once"
        );
        let request = fake
            .requests()
            .into_iter()
            .find(|r| r.header("x-request-id") == Some(attempt_id))
            .unwrap();
        assert_eq!(
            request.header("idempotency-key"),
            Some(attempt_id),
            "{what}"
        );
        assert_eq!(request.method, "POST", "{what}");
        assert_eq!(request.path, "/v1/chat/completions");
        assert_eq!(
            request.header("authorization"),
            Some(format!("Bearer {FAKE_API_KEY}").as_str())
        );
        assert_eq!(request.body["model"], "fake-model", "{what}");
        assert_eq!(
            request.body["messages"][0]["content"],
            "Summarize: classify me"
        );
        assert_eq!(request.body["response_format"]["type"], "json_schema");
    }
    // The TLS row spoke TLS to the plain server: its first byte was a TLS
    // handshake record (0x16), not an HTTP request line.
    assert_eq!(tls_first_bytes.try_recv().ok(), Some(0x16));
}

async fn the_anthropic_shape_is_spoken_and_classified(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::Anthropic).await;
    let toml = [
        ProviderToml::anthropic("claude", &fake.base_url).toml(),
        strict_task_toml("summarize", &["claude"], "Summarize: {{ text }}"),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    fake.push(Behaviour::Answer(json!({"summary": "from claude"})));
    let job_id = app
        .create_job(&app.alice.token, "a1", &summarize("hi"))
        .await;
    let job = app.wait_for_status(&job_id, "succeeded", WAIT).await;
    assert_eq!(job["result"]["summary"], "from claude");
    let request = fake.last_request().unwrap();
    assert_eq!(request.path, "/v1/messages");
    assert_eq!(request.header("x-api-key"), Some(FAKE_API_KEY));
    assert_eq!(request.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(
        request.header("anthropic-beta"),
        Some("structured-outputs-2025-11-13")
    );
    assert_eq!(request.body["output_format"]["type"], "json_schema");
    assert_eq!(request.body["messages"][0]["content"], "Summarize: hi");
    assert!(request.header("authorization").is_none());
    let StoredJob {
        job: stored_job,
        attempts: rows,
        ..
    } = stored(&app, &job_id).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].state, rows[0].outcome),
        (AttemptState::Succeeded, Some(RaceResult::Won))
    );
    assert_eq!(stored_job.completed_by.as_ref(), Some(&rows[0].id));
    assert_eq!(
        request.header("x-request-id"),
        Some(rows[0].id.as_str()),
        "the call carried its attempt id"
    );

    fake.push(Behaviour::Status {
        status: 529,
        retry_after: None,
        body: r#"{"type":"error","error":{"type":"overloaded_error"}}"#.into(),
    });
    let job_id = app
        .create_job(&app.alice.token, "a2", &summarize("busy"))
        .await;
    let attempt = settled_attempt(&app, &job_id, 0).await;
    assert_eq!(attempt["state"], "failed");
    // Overloaded: nothing happened. With no fallback in the chain, the job
    // retries on the same provider after a backoff (no Retry-After), and
    // the retry succeeds.
    let job = app.wait_for_status(&job_id, "succeeded", WAIT).await;
    let StoredJob {
        job: stored_job,
        attempts: rows,
        ..
    } = stored(&app, &job_id).await;
    assert_eq!(rows.len(), 2, "one retry: {rows:#?}");
    assert_eq!(rows[0].state, AttemptState::Failed);
    let error = rows[0].reason().unwrap().for_staff();
    assert!(
        error.contains("overloaded (529)") && error.contains("overloaded_error"),
        "{error}"
    );
    assert_eq!(
        (rows[1].number, rows[1].provider.as_str(), rows[1].state),
        (2, "claude", AttemptState::Succeeded)
    );
    let waited = rows[1].not_before.unwrap() - rows[1].created_at;
    assert!(
        (500..1000).contains(&waited),
        "the first backoff step is half to all of a second: {waited} ms"
    );
    assert!(rows[1].sent_at.unwrap() >= rows[1].not_before.unwrap());
    assert_eq!(stored_job.completed_by.as_ref(), Some(&rows[1].id));
    assert!(job["attempts"][1]["not_before"].as_str().is_some());

    // A refusal that would end the same way again (400), with no fallback
    // in the chain: the job failed, without a retry.
    fake.push(Behaviour::Status {
        status: 400,
        retry_after: None,
        body: r#"{"type":"error","error":{"type":"invalid_request_error"}}"#.into(),
    });
    let job_id = app
        .create_job(&app.alice.token, "a3", &summarize("bad"))
        .await;
    let job = app.wait_for_status(&job_id, "failed", WAIT).await;
    let StoredJob {
        job: stored_job,
        attempts: rows,
        ..
    } = stored(&app, &job_id).await;
    assert_eq!(rows.len(), 1, "no fallback, no retry: {rows:#?}");
    assert_eq!(rows[0].state, AttemptState::Failed);
    assert_eq!(stored_job.status, JobStatus::Failed);
    assert_eq!(stored_job.result, None);
    let reason = stored_job.failure_reason.unwrap();
    assert!(
        reason.contains("every provider in the chain failed"),
        "{reason}"
    );
    assert_eq!(job["failure_reason"], Value::String(reason));
}

on_both_backends!(
    every_row_of_the_classification_table,
    the_anthropic_shape_is_spoken_and_classified,
);
