//! Hostile input at every entry point: the JSON API, `/v1`, the browser
//! forms, callbacks and sign-in. Each input gets a 4xx (a problem document
//! in the API, OpenAI's error object on `/v1`, a readable page in the
//! browser), stores nothing, and leaves the server answering.
//!
//! The inputs are in `tests/corpus/` (one file per kind, so the corpus grows
//! with every bug) plus generated ones: nesting at several depths, huge
//! members counts, long strings.

use std::time::Duration;

use onejob::domain::{CallbackKey, Secret};
use reqwest::StatusCode;
use serde_json::Value;

use crate::support::db::snapshot;
use crate::support::fake_provider::{
    config_of, Behaviour, FakeProvider, ProviderToml, Shape, WAIT,
};
use crate::support::harness::{
    record_figures, spawn_app_with, summarize, FormClient, TestApp, TestBackend, CALLBACK_KEY,
};

on_both_backends!(
    a_body_that_never_arrives_gets_408_and_its_connection_closes,
    twelve_and_a_hundred_thousand_levels_get_422_on_every_entry_point,
    the_hostile_corpus_gets_4xx_everywhere_stores_nothing_and_the_server_keeps_answering,
);

/// One fake upstream behind a prompt task, a task taking free JSON input, a
/// chat route, and callbacks on; bodies of up to 4 MiB, so that even
/// 100,000 levels of nesting arrive whole and meet the depth limit.
async fn hostile_app(backend: TestBackend) -> (FakeProvider, TestApp) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let mut config = config_of(&format!(
        r#"[server]
public_url = "http://127.0.0.1:9"
callback_secret_env = "ONEJOB_TEST_CALLBACK_KEY"
{}
[[tasks]]
name = "summarize"
providers = ["up"]
input_fields = ["text"]
template = "Summarize: {{{{ text }}}}"

[[tasks]]
name = "free"
providers = ["up"]
template = "Answer: {{{{ question }}}}"
input_schema = {{ type = "object", required = ["question"], additionalProperties = false, properties = {{ question = {{ type = "string", minLength = 1 }} }} }}

[[tasks]]
name = "gpt-safe"
kind = "chat"
providers = ["up"]
"#,
        ProviderToml::openai("up", &format!("{}/v1", fake.base_url))
            .with("callbacks = true")
            .toml()
    ));
    config.server.body_limit_bytes = 4 * 1024 * 1024;
    // The target's call is held for the whole test, never timed out.
    for provider in &mut config.providers {
        provider.timeout_ms = 600_000;
    }
    let app = spawn_app_with(backend, config).await;
    (fake, app)
}

/// Where hostile bytes can go in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    /// `POST /api/v1/jobs`: the body is the request.
    CreateJob,
    /// `POST /api/v1/jobs`: the bytes are `input`.
    CreateJobInput,
    /// `POST /api/v1/jobs/{id}/attempts`.
    StartAttempt,
    /// `POST /api/v1/attempts/{id}/abandon`.
    Abandon,
    /// `POST /v1/chat/completions`: the body is the request.
    Chat,
    /// `POST /v1/chat/completions`: the bytes are `messages`.
    ChatMessages,
    /// `POST /api/v1/callbacks/attempts/{id}`, signed.
    Callback,
    /// `POST /jobs`: the bytes are the form's `input_json`.
    SubmitForm,
    /// `POST /login`: the bytes are the name.
    SignIn,
}

impl Entry {
    const ALL: [Entry; 9] = [
        Self::CreateJob,
        Self::CreateJobInput,
        Self::StartAttempt,
        Self::Abandon,
        Self::Chat,
        Self::ChatMessages,
        Self::Callback,
        Self::SubmitForm,
        Self::SignIn,
    ];

    /// Entry points whose body is JSON as a whole (the rest embed the bytes).
    fn takes_whole_body(self) -> bool {
        matches!(
            self,
            Self::CreateJob | Self::StartAttempt | Self::Abandon | Self::Chat | Self::Callback
        )
    }
}

/// What the hostile requests need: a job waiting for its callback, a
/// signed-in browser with its CSRF token.
struct Target {
    job_id: String,
    attempt_id: String,
    browser: FormClient,
    csrf: String,
    login_csrf: String,
    login_cookie: String,
}

async fn target(app: &TestApp, fake: &FakeProvider) -> Target {
    fake.set_default(Behaviour::Hang);
    let job_id = app
        .create_job(&app.alice.token, "the-target", &summarize("x"))
        .await;
    let job = app.wait_for_status(&job_id, "running", WAIT).await;
    let attempt_id = job["attempts"][0]["id"].as_str().unwrap().to_owned();
    app.set_password("alice", "alice-password").await;
    let browser = FormClient::new(app);
    let csrf = browser.sign_in("alice", "alice-password").await;
    let anonymous = reqwest::Client::new();
    let login = anonymous.get(app.url("/login")).send().await.unwrap();
    let login_cookie = login.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let login_csrf = crate::support::harness::hidden_value(&login.text().await.unwrap(), "csrf");
    Target {
        job_id,
        attempt_id,
        browser,
        csrf,
        login_csrf,
        login_cookie,
    }
}

/// Percent-encodes every byte (a form field may carry any bytes).
fn form_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("%{b:02X}")).collect()
}

/// Sends `bytes` to `entry` as `content_type`; returns the status, the
/// content type and the body.
async fn send(
    app: &TestApp,
    target: &Target,
    entry: Entry,
    bytes: &[u8],
    content_type: &str,
    key: &str,
) -> (StatusCode, String, String) {
    let embed = |prefix: &str, suffix: &str| {
        let mut body = prefix.as_bytes().to_vec();
        body.extend_from_slice(bytes);
        body.extend_from_slice(suffix.as_bytes());
        body
    };
    let client = &app.client;
    let request = match entry {
        Entry::CreateJob => client
            .post(app.url("/api/v1/jobs"))
            .bearer_auth(&app.alice.token)
            .header("Idempotency-Key", key)
            .header("Content-Type", content_type)
            .body(bytes.to_vec()),
        Entry::CreateJobInput => client
            .post(app.url("/api/v1/jobs"))
            .bearer_auth(&app.alice.token)
            .header("Idempotency-Key", key)
            .header("Content-Type", content_type)
            .body(embed(r#"{"task":"free","input":"#, "}")),
        Entry::StartAttempt => client
            .post(app.url(&format!("/api/v1/jobs/{}/attempts", target.job_id)))
            .bearer_auth(&app.sue.token)
            .header("Content-Type", content_type)
            .body(bytes.to_vec()),
        Entry::Abandon => client
            .post(app.url(&format!("/api/v1/attempts/{}/abandon", target.attempt_id)))
            .bearer_auth(&app.sue.token)
            .header("Content-Type", content_type)
            .body(bytes.to_vec()),
        Entry::Chat => client
            .post(app.url("/v1/chat/completions"))
            .bearer_auth(&app.alice.token)
            .header("Idempotency-Key", key)
            .header("Content-Type", content_type)
            .body(bytes.to_vec()),
        Entry::ChatMessages => client
            .post(app.url("/v1/chat/completions"))
            .bearer_auth(&app.alice.token)
            .header("Idempotency-Key", key)
            .header("Content-Type", content_type)
            .body(embed(r#"{"model":"gpt-safe","messages":"#, "}")),
        Entry::Callback => {
            let now = onejob::domain::Timestamp::now().unix_seconds();
            let signature =
                CallbackKey::new(&Secret::new(CALLBACK_KEY)).sign(&target.attempt_id, now, bytes);
            client
                .post(app.url(&format!("/api/v1/callbacks/attempts/{}", target.attempt_id)))
                .header("Content-Type", content_type)
                .header("X-Onejob-Timestamp", now.to_string())
                .header("X-Onejob-Signature", signature)
                .body(bytes.to_vec())
        }
        Entry::SubmitForm => {
            let form = format!(
                "csrf={}&idempotency_key={}&task=free&input_json={}",
                target.csrf,
                form_encode(key.as_bytes()),
                form_encode(bytes)
            );
            target
                .browser
                .http
                .post(format!("{}/jobs", target.browser.base))
                .header("Content-Type", form_content_type(content_type))
                .body(form)
        }
        Entry::SignIn => {
            let form = format!(
                "csrf={}&password=x&name={}",
                target.login_csrf,
                form_encode(bytes)
            );
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap()
                .post(app.url("/login"))
                .header("Cookie", &target.login_cookie)
                .header("Content-Type", form_content_type(content_type))
                .body(form)
        }
    };
    let response = request
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{entry:?}: the server did not answer: {e}"));
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    (
        status,
        content_type,
        response.text().await.unwrap_or_default(),
    )
}

/// Forms go as forms; the JSON content types of the corpus map to the
/// form's own, and a wrong one stays wrong.
fn form_content_type(content_type: &str) -> &str {
    if content_type == "application/json" {
        "application/x-www-form-urlencoded"
    } else {
        content_type
    }
}

/// A refusal in the entry point's own shape: problem+json from the API and
/// callbacks, OpenAI's error object from `/v1`, a page from the browser.
fn assert_refused(
    entry: Entry,
    case: &str,
    (status, content_type, body): &(StatusCode, String, String),
) {
    assert!(
        status.is_client_error(),
        "{entry:?} / {case}: {status} {}",
        body.chars().take(300).collect::<String>()
    );
    match entry {
        Entry::Chat | Entry::ChatMessages => {
            let error: Value = serde_json::from_str(body)
                .unwrap_or_else(|_| panic!("{entry:?} / {case}: not JSON: {body:.300}"));
            assert!(
                error["error"]["message"].is_string(),
                "{entry:?} / {case}: {error}"
            );
        }
        Entry::SubmitForm | Entry::SignIn => {
            assert!(
                content_type.starts_with("text/html"),
                "{entry:?} / {case}: {content_type}"
            );
        }
        _ => {
            assert_eq!(
                content_type, "application/problem+json",
                "{entry:?} / {case}"
            );
        }
    }
}

async fn assert_still_answering(app: &TestApp, what: &str) {
    let health = app
        .client
        .get(app.url("/healthz"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .unwrap_or_else(|e| panic!("after {what}, /healthz did not answer: {e}"));
    assert_eq!(health.status(), StatusCode::OK, "after {what}");
}

fn nested_arrays(depth: usize) -> Vec<u8> {
    ["[".repeat(depth), "]".repeat(depth)].concat().into_bytes()
}

fn nested_objects(depth: usize) -> Vec<u8> {
    [r#"{"a":"#.repeat(depth), "1".into(), "}".repeat(depth)]
        .concat()
        .into_bytes()
}

/// The deep documents of the issue that once stopped the server, at every
/// entry point: a clear 422 naming the limit, and `/healthz` right after.
async fn twelve_and_a_hundred_thousand_levels_get_422_on_every_entry_point(backend: TestBackend) {
    let (fake, app) = hostile_app(backend).await;
    let target = target(&app, &fake).await;
    let before = snapshot(&app).await;
    let mut tried = 0;
    for depth in [12_000, 100_000] {
        for (shape, bytes) in [
            ("arrays", nested_arrays(depth)),
            ("objects", nested_objects(depth)),
        ] {
            for entry in Entry::ALL {
                let case = format!("{depth} levels of {shape}");
                let answer = send(&app, &target, entry, &bytes, "application/json", &case).await;
                tried += 1;
                let (status, _, body) = &answer;
                // A name is no JSON: sign-in refuses it as a name.
                if entry == Entry::SignIn {
                    assert_eq!(*status, StatusCode::UNAUTHORIZED, "{case}");
                } else {
                    assert_eq!(
                        *status,
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "{entry:?} / {case}: {body:.300}"
                    );
                    assert!(
                        body.contains("64"),
                        "{entry:?} / {case}: names the limit: {body:.300}"
                    );
                }
                assert_refused(entry, &case, &answer);
                assert_still_answering(&app, &format!("{entry:?} / {case}")).await;
            }
        }
    }
    let problem: Value = {
        let (_, _, body) = send(
            &app,
            &target,
            Entry::CreateJob,
            &nested_arrays(12_000),
            "application/json",
            "problem",
        )
        .await;
        serde_json::from_str(&body).unwrap()
    };
    assert_eq!(problem["type"], "/problems/nesting-too-deep");
    assert_eq!(problem["limit"], 64);
    assert_eq!(snapshot(&app).await, before, "nothing was stored");
    eprintln!("deep nesting: {tried} requests, all refused with the limit named");
}

/// The corpus files: one input per line, as JSON-escaped text (so a line
/// can hold a lone surrogate, a NUL or bytes that are no UTF-8: `\xff`).
fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
        .collect();
    files.sort();
    let mut cases = Vec::new();
    for file in files {
        let name = file.file_stem().unwrap().to_string_lossy().into_owned();
        for (i, line) in std::fs::read_to_string(&file).unwrap().lines().enumerate() {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            cases.push((format!("{name}:{}", i + 1), unescape(line)));
        }
    }
    cases
}

/// A corpus line's bytes: `\xHH` is one raw byte (JSON has no `\x`
/// escape, so JSON's own escapes stay as written); all else as written.
fn unescape(line: &str) -> Vec<u8> {
    let bytes = line.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], bytes.get(i + 1)) {
            (b'\\', Some(b'x')) => {
                let hex = std::str::from_utf8(&bytes[i + 2..i + 4]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// Generated inputs: depths around the limit, 10,000 members, long strings.
fn generated() -> Vec<(String, Vec<u8>)> {
    let mut cases = Vec::new();
    for depth in [65, 128, 129, 1_000, 12_000] {
        cases.push((format!("{depth} nested arrays"), nested_arrays(depth)));
        cases.push((format!("{depth} nested objects"), nested_objects(depth)));
    }
    let members: Vec<String> = (0..10_000).map(|i| format!(r#""k{i}":{i}"#)).collect();
    cases.push((
        "10,000 members".into(),
        format!("{{{}}}", members.join(",")).into_bytes(),
    ));
    let same: Vec<String> = (0..10_000).map(|i| format!(r#""k":{i}"#)).collect();
    cases.push((
        "10,000 members of one name".into(),
        format!("{{{}}}", same.join(",")).into_bytes(),
    ));
    cases.push((
        "a 500 KiB string".into(),
        format!(r#"{{"task":"{}"}}"#, "x".repeat(500 * 1024)).into_bytes(),
    ));
    cases.push((
        "100,000 array members".into(),
        format!("[{}]", vec!["1"; 100_000].join(",")).into_bytes(),
    ));
    cases
}

async fn the_hostile_corpus_gets_4xx_everywhere_stores_nothing_and_the_server_keeps_answering(
    backend: TestBackend,
) {
    let (fake, app) = hostile_app(backend).await;
    let target = target(&app, &fake).await;
    let before = snapshot(&app).await;
    let cases: Vec<(String, Vec<u8>)> = corpus().into_iter().chain(generated()).collect();
    let content_types = ["application/json", "text/plain", "application/octet-stream"];
    let mut tried = 0;
    for (n, (case, bytes)) in cases.iter().enumerate() {
        for entry in Entry::ALL {
            // The whole body under every content type; embedded bytes as JSON.
            let types: &[&str] = if entry.takes_whole_body() {
                &content_types
            } else {
                &content_types[..1]
            };
            for content_type in types {
                let key = format!("hostile-{n}-{tried}");
                let answer = send(&app, &target, entry, bytes, content_type, &key).await;
                assert_refused(entry, &format!("{case} as {content_type}"), &answer);
                tried += 1;
            }
        }
        assert_still_answering(&app, case).await;
    }
    assert_eq!(snapshot(&app).await, before, "nothing was stored");
    let figures = format!(
        "hostile inputs: {} cases ({} from tests/corpus), {tried} requests to {} entry points, \
         all refused with a 4xx; nothing stored; the server answered after each",
        cases.len(),
        corpus().len(),
        Entry::ALL.len()
    );
    eprintln!("{figures}");
    record_figures(&format!("hostile-inputs-{backend:?}"), &figures);
}

/// Sends headers that promise 1,000 bytes, then 6, then nothing: the answer
/// is 408 once `server.body_timeout_ms` has passed, and the connection is
/// closed (the read after the answer ends).
async fn promise_a_body_and_stall(
    address: &str,
    request_line: &str,
    extra_headers: &str,
) -> (Duration, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = address.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    let head = format!(
        "{request_line} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 1000\r\n{extra_headers}\r\n{{\"a\":"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let started = std::time::Instant::now();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(15), stream.read_to_end(&mut answer))
        .await
        .expect("the server answered and closed the connection")
        .unwrap();
    (
        started.elapsed(),
        String::from_utf8_lossy(&answer).into_owned(),
    )
}

async fn a_body_that_never_arrives_gets_408_and_its_connection_closes(backend: TestBackend) {
    let mut config =
        crate::support::harness::test_config(crate::support::harness::DEFAULT_TEST_PROVIDERS);
    config.server.body_timeout_ms = 700;
    let app = spawn_app_with(backend, config).await;
    let before = snapshot(&app).await;
    let (took, answer) = promise_a_body_and_stall(
        &app.address,
        "POST /api/v1/jobs",
        &format!(
            "Authorization: Bearer {}\r\nIdempotency-Key: slow\r\nContent-Type: application/json\r\n",
            app.alice.token
        ),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("/problems/request-timeout"), "{answer}");
    assert!(
        answer.to_lowercase().contains("connection: close"),
        "{answer}"
    );
    assert!(
        took >= Duration::from_millis(600) && took < Duration::from_secs(5),
        "answered after the body timeout: {took:?}"
    );
    // A form: a readable page, the same timeout.
    let (_, page) = promise_a_body_and_stall(
        &app.address,
        "POST /login",
        "Content-Type: application/x-www-form-urlencoded\r\n",
    )
    .await;
    assert!(page.starts_with("HTTP/1.1 408"), "{page}");
    assert!(page.contains("text/html"), "{page}");
    assert_eq!(snapshot(&app).await, before, "nothing was stored");
    assert_still_answering(&app, "slow bodies").await;
}
