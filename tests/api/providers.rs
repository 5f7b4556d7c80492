//! Real HTTP providers against fake provider servers on 127.0.0.1: the
//! classification table, late answers and the CAS, qualification and the
//! failover gate, callbacks, and the API key's secrecy.

use std::time::Duration;

use onejob::app::qualification::{self, check_contract};
use onejob::app::App;
use onejob::config::Config;
use onejob::domain::{CallbackKey, Secret};
use onejob::providers::Providers;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::fake_provider::{
    closed_port_url, config_of, fake_provider_toml, settled_attempt, strict_task_toml, Behaviour,
    FakeProvider, Shape, WAIT,
};
use crate::helpers::{
    spawn_app_with, summarize, PreparedApp, TestApp, TestBackend, CALLBACK_KEY, FAKE_API_KEY,
};

async fn qualify_now(app: &TestApp, provider: &str, task: &str) -> qualification::Report {
    app.app.qualify(None, provider, task).await.unwrap()
}

async fn every_row_of_the_classification_table(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        fake_provider_toml("fake", "openai", &fake.base_url, ""),
        fake_provider_toml("closed", "openai", &closed_port_url(), ""),
        strict_task_toml("summarize", &["fake"], "Summarize: {{ text }}"),
        strict_task_toml("refused", &["closed"], "Summarize: {{ text }}"),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    let ok = json!({"summary": "fine"});
    let rows: Vec<(&str, Behaviour, &str, &str)> = vec![
        (
            "a valid answer",
            Behaviour::Answer(ok.clone()),
            "succeeded",
            "",
        ),
        (
            "400",
            Behaviour::Status {
                status: 400,
                retry_after: None,
                body: "{}".into(),
            },
            "failed",
            "refused the request with 400",
        ),
        (
            "401",
            Behaviour::Status {
                status: 401,
                retry_after: None,
                body: "{}".into(),
            },
            "failed",
            "401",
        ),
        (
            "403",
            Behaviour::Status {
                status: 403,
                retry_after: None,
                body: "{}".into(),
            },
            "failed",
            "403",
        ),
        (
            "404",
            Behaviour::Status {
                status: 404,
                retry_after: None,
                body: "{}".into(),
            },
            "failed",
            "404",
        ),
        (
            "422",
            Behaviour::Status {
                status: 422,
                retry_after: None,
                body: "{}".into(),
            },
            "failed",
            "422",
        ),
        (
            "429",
            Behaviour::Status {
                status: 429,
                retry_after: Some(1),
                body: "{}".into(),
            },
            "failed",
            "rate limited",
        ),
        (
            "529",
            Behaviour::Status {
                status: 529,
                retry_after: None,
                body: r#"{"type":"overloaded_error"}"#.into(),
            },
            "failed",
            "overloaded",
        ),
        (
            "500",
            Behaviour::Status {
                status: 500,
                retry_after: None,
                body: "{}".into(),
            },
            "unknown",
            "500",
        ),
        (
            "502",
            Behaviour::Status {
                status: 502,
                retry_after: None,
                body: "{}".into(),
            },
            "unknown",
            "502",
        ),
        (
            "504",
            Behaviour::Status {
                status: 504,
                retry_after: None,
                body: "{}".into(),
            },
            "unknown",
            "504",
        ),
        (
            "a hang past the soft timeout",
            Behaviour::Hang,
            "unknown",
            "soft timeout",
        ),
        ("a reset mid-body", Behaviour::ResetMidBody, "unknown", ""),
        ("a truncated body", Behaviour::TruncatedBody, "unknown", ""),
        (
            "prose",
            Behaviour::AnswerText("Sure! Here is a summary.".into()),
            "failed",
            "invalid_output",
        ),
        (
            "an extra top-level key",
            Behaviour::Answer(json!({"summary": "x", "confidence": 1})),
            "failed",
            "invalid_output",
        ),
    ];
    for (i, (what, behaviour, expected_state, error_has)) in rows.into_iter().enumerate() {
        fake.push(behaviour);
        let started = std::time::Instant::now();
        let job_id = app
            .create_job(
                &app.alice.token,
                &format!("row-{i}"),
                &summarize("classify me"),
            )
            .await;
        let attempt = settled_attempt(&app, &job_id, 0).await;
        if what == "529" {
            // The 429 before it said Retry-After: 1; the provider was not called sooner.
            assert!(
                started.elapsed() >= Duration::from_millis(900),
                "Retry-After was not respected"
            );
        }
        assert_eq!(attempt["state"], expected_state, "{what}: {attempt:#}");
        let error = attempt["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(error_has),
            "{what}: error {error:?} should mention {error_has:?}"
        );
        let attempt_id = attempt["id"].as_str().unwrap();
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
        assert_eq!(request.path, "/v1/chat/completions");
        assert_eq!(
            request.header("authorization"),
            Some(format!("Bearer {FAKE_API_KEY}").as_str())
        );
        assert_eq!(
            request.body["messages"][0]["content"],
            "Summarize: classify me"
        );
        assert_eq!(request.body["response_format"]["type"], "json_schema");
    }
    // Connection refused before anything was sent: definite.
    let job_id = app
        .create_job(
            &app.alice.token,
            "refused",
            &json!({"task": "refused", "input": {"text": "x"}}),
        )
        .await;
    let attempt = settled_attempt(&app, &job_id, 0).await;
    assert_eq!(attempt["state"], "failed");
    assert!(
        attempt["error"]
            .as_str()
            .unwrap()
            .contains("could not connect"),
        "{attempt:#}"
    );
}

async fn the_anthropic_shape_is_spoken_and_classified(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::Anthropic).await;
    let toml = [
        fake_provider_toml("claude", "anthropic", &fake.base_url, ""),
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
    assert_eq!(request.body["output_format"]["type"], "json_schema");
    assert!(request.header("authorization").is_none());
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
}

async fn a_late_answer_after_the_soft_timeout_wins_the_cas(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        fake_provider_toml("fake", "openai", &fake.base_url, ""),
        strict_task_toml("summarize", &["fake"], "Summarize: {{ text }}"),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    fake.push(Behaviour::Delay {
        ms: 1200,
        then: Box::new(Behaviour::Answer(json!({"summary": "late but first"}))),
    });
    let job_id = app
        .create_job(&app.alice.token, "late", &summarize("slow"))
        .await;
    app.wait_for_status(&job_id, "unknown", WAIT).await;
    let job = app.wait_for_status(&job_id, "succeeded", WAIT).await;
    assert_eq!(job["attempts"][0]["outcome"], "won");
    assert_eq!(job["result"]["summary"], "late but first");
    assert_eq!(
        fake.requests_for(job["attempts"][0]["id"].as_str().unwrap()),
        1
    );
}

async fn a_late_answer_loses_to_a_qualified_fallback_and_is_race_logged(backend: TestBackend) {
    let slow = FakeProvider::start(Shape::OpenAi).await;
    let fast = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        fake_provider_toml("slow", "openai", &slow.base_url, ""),
        fake_provider_toml("fast", "openai", &fast.base_url, ""),
        strict_task_toml("summarize", &["slow", "fast"], "Summarize: {{ text }}"),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    assert!(qualify_now(&app, "fast", "summarize").await.passed());
    slow.push(Behaviour::Delay {
        ms: 2000,
        then: Box::new(Behaviour::Answer(json!({"summary": "too late"}))),
    });
    let job_id = app
        .create_job(&app.alice.token, "race", &summarize("race"))
        .await;
    let job = app.wait_for_status(&job_id, "unknown", WAIT).await;
    let first = job["attempts"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        app.abandon(&app.sue.token, &first, "slow provider")
            .await
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        app.start_attempt(&app.alice.token, &job_id, None)
            .await
            .status(),
        StatusCode::CREATED
    );
    let won = app.wait_for_status(&job_id, "succeeded", WAIT).await;
    assert_eq!(won["result"]["summary"], "fake summary");
    let job = app
        .wait_for_job(&job_id, WAIT, |j| j["attempts"][0]["outcome"] == "lost")
        .await;
    assert_eq!(
        job["result"], won["result"],
        "the late answer changed nothing"
    );
    let races: Value = app
        .get(&app.ada.token, "/api/v1/admin/races")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(races[0]["losing_attempt_id"], first.as_str());
    assert_eq!(races[0]["provider"], "slow");
}

async fn failover_skips_an_unqualified_provider_and_takes_a_qualified_one(backend: TestBackend) {
    let (a, b, c) = (
        FakeProvider::start(Shape::OpenAi).await,
        FakeProvider::start(Shape::OpenAi).await,
        FakeProvider::start(Shape::OpenAi).await,
    );
    let toml = [
        fake_provider_toml("fake-a", "openai", &a.base_url, ""),
        fake_provider_toml("fake-b", "openai", &b.base_url, ""),
        fake_provider_toml("fake-c", "openai", &c.base_url, ""),
        strict_task_toml(
            "summarize",
            &["fake-a", "fake-b", "fake-c"],
            "Summarize: {{ text }}",
        ),
        strict_task_toml("two", &["fake-a", "fake-b"], "Summarize: {{ text }}"),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    assert!(qualify_now(&app, "fake-c", "summarize").await.passed());
    let b_before = b.total_requests();
    a.push(Behaviour::Status {
        status: 400,
        retry_after: None,
        body: "{}".into(),
    });
    let job_id = app
        .create_job(&app.alice.token, "gate", &summarize("x"))
        .await;
    let job = app.wait_for_status(&job_id, "succeeded", WAIT).await;
    let providers: Vec<&str> = job["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["provider"].as_str().unwrap())
        .collect();
    assert_eq!(providers, vec!["fake-a", "fake-c"], "fake-b was skipped");
    assert_eq!(
        b.total_requests(),
        b_before,
        "the unqualified provider got nothing"
    );
    // A new attempt may not name an unqualified provider either.
    let mut body = summarize("y");
    body["task"] = "two".into();
    a.push(Behaviour::Status {
        status: 400,
        retry_after: None,
        body: "{}".into(),
    });
    let job_id = app.create_job(&app.alice.token, "no-fallback", &body).await;
    let job = app.wait_for_status(&job_id, "failed", WAIT).await;
    let reason = job["failure_reason"].as_str().unwrap();
    assert!(
        reason.contains("no qualified fallback") && reason.contains("fake-b (never)"),
        "{reason}"
    );
    assert_eq!(job["attempts"].as_array().unwrap().len(), 1);
}

async fn a_new_attempt_on_an_unqualified_provider_is_refused(backend: TestBackend) {
    let (a, b) = (
        FakeProvider::start(Shape::OpenAi).await,
        FakeProvider::start(Shape::OpenAi).await,
    );
    let toml = [
        fake_provider_toml("fake-a", "openai", &a.base_url, ""),
        fake_provider_toml("fake-b", "openai", &b.base_url, ""),
        strict_task_toml("summarize", &["fake-a", "fake-b"], "Summarize: {{ text }}"),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    a.push(Behaviour::Hang);
    let job_id = app
        .create_job(&app.alice.token, "manual", &summarize("x"))
        .await;
    let job = app.wait_for_status(&job_id, "unknown", WAIT).await;
    app.abandon(
        &app.sue.token,
        job["attempts"][0]["id"].as_str().unwrap(),
        "stuck",
    )
    .await;
    let response = app
        .start_attempt(&app.sue.token, &job_id, Some(json!({"provider": "fake-b"})))
        .await;
    let problem =
        crate::helpers::assert_problem(response, StatusCode::CONFLICT, "provider-not-qualified")
            .await;
    assert_eq!(problem["allowed_providers"], json!(["fake-a"]));
    assert!(qualify_now(&app, "fake-b", "summarize").await.passed());
    let response = app
        .start_attempt(&app.sue.token, &job_id, Some(json!({"provider": "fake-b"})))
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
}

async fn changing_the_template_voids_the_qualification(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let v1 = [
        fake_provider_toml("fake", "openai", &fake.base_url, ""),
        strict_task_toml("summarize", &["fake"], "Summarize: {{ text }}"),
    ]
    .concat();
    let v2 = [
        fake_provider_toml("fake", "openai", &fake.base_url, ""),
        strict_task_toml("summarize", &["fake"], "Summarize briefly: {{ text }}"),
    ]
    .concat();
    let prepared = PreparedApp::new(backend, config_of(&v1)).await;
    let before_change = App::new(prepared.store.clone(), config_of(&v1));
    let after_change = App::new(prepared.store.clone(), config_of(&v2));
    let report = before_change
        .qualify(None, "fake", "summarize")
        .await
        .unwrap();
    assert!(report.passed(), "{:?}", report.checks);
    let before = before_change.statuses_for_task("summarize").await.unwrap();
    let after = after_change.statuses_for_task("summarize").await.unwrap();
    assert_eq!(
        (before["fake"].label(), after["fake"].label()),
        ("qualified", "stale")
    );
}

async fn qualification_fails_on_an_extra_key_on_prose_and_on_a_golden_mismatch(
    backend: TestBackend,
) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        fake_provider_toml("fake", "openai", &fake.base_url, ""),
        strict_task_toml("summarize", &["fake"], "Summarize: {{ text }}"),
    ]
    .concat();
    let config = config_of(&toml);
    let _prepared = PreparedApp::new(backend, config.clone()).await;
    let providers = Providers::from_settings(&config.providers);
    let (provider, task) = (
        providers.get("fake").unwrap(),
        config.contracts.get("summarize").unwrap(),
    );
    let cases = [
        (
            Behaviour::Answer(json!({"summary": "fake summary", "extra": true})),
            "invalid_output",
        ),
        (
            Behaviour::AnswerText("Here you go: a summary.".into()),
            "not JSON",
        ),
        (
            Behaviour::Answer(json!({"summary": "something else"})),
            "golden expectations not met",
        ),
    ];
    for (behaviour, expected) in cases {
        fake.set_default(behaviour);
        let report = check_contract(&provider, &task).await;
        assert!(!report.passed());
        let failure = report.first_failure().unwrap();
        assert_eq!(failure.name, "golden[0] answer");
        assert!(
            failure.detail.contains(expected),
            "{expected}: {}",
            failure.detail
        );
    }
    fake.set_default(Behaviour::Answer(json!({"summary": "fake summary"})));
    let report = check_contract(&provider, &task).await;
    assert!(report.passed(), "{:?}", report.checks);
    let names: Vec<&str> = report.checks.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "template renders",
            "fits the context budget",
            "golden[0] answer",
            "round trip"
        ]
    );
}

async fn a_prompt_over_the_context_budget_fails_qualification_without_a_call(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        fake_provider_toml(
            "fake",
            "openai",
            &fake.base_url,
            "context_tokens = 100\nmax_tokens = 90",
        ),
        strict_task_toml(
            "summarize",
            &["fake"],
            "Summarize this long text: {{ text }} {{ text }} {{ text }} {{ text }}",
        ),
    ]
    .concat();
    let config = config_of(&toml);
    let _prepared = PreparedApp::new(backend, config.clone()).await;
    let providers = Providers::from_settings(&config.providers);
    let report = check_contract(
        &providers.get("fake").unwrap(),
        &config.contracts.get("summarize").unwrap(),
    )
    .await;
    let failure = report.first_failure().unwrap();
    assert_eq!(failure.name, "fits the context budget");
    assert!(failure.detail.contains("tiktoken"), "{}", failure.detail);
    assert_eq!(fake.total_requests(), 0, "nothing was sent");
}

fn callback_config(fake: &FakeProvider) -> Config {
    let toml = [
        "[server]\npublic_url = \"http://127.0.0.1:9\"\ncallback_secret_env = \"ONEJOB_TEST_CALLBACK_KEY\"\n".to_owned(),
        fake_provider_toml("async", "openai", &fake.base_url, "callbacks = true"),
        strict_task_toml("summarize", &["async"], "Summarize: {{ text }}"),
    ]
    .concat();
    config_of(&toml)
}

async fn post_callback(
    app: &TestApp,
    attempt_id: &str,
    body: &str,
    signature: Option<String>,
) -> reqwest::Response {
    let mut request = app
        .client
        .post(app.url(&format!("/api/v1/callbacks/attempts/{attempt_id}")))
        .header("Content-Type", "application/json")
        .body(body.to_owned());
    if let Some(signature) = signature {
        request = request.header("X-Onejob-Signature", signature);
    }
    request.send().await.unwrap()
}

/// A job whose attempt went to a callback provider that never answers, now unknown.
async fn awaiting_callback(
    backend: TestBackend,
    key: &str,
) -> (FakeProvider, TestApp, String, String) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let app = spawn_app_with(backend, callback_config(&fake)).await;
    fake.push(Behaviour::Hang);
    let job_id = app.create_job(&app.alice.token, key, &summarize("x")).await;
    let job = app.wait_for_status(&job_id, "unknown", WAIT).await;
    let attempt_id = job["attempts"][0]["id"].as_str().unwrap().to_owned();
    (fake, app, job_id, attempt_id)
}

async fn a_callback_with_a_bad_signature_is_401_and_changes_nothing(backend: TestBackend) {
    let (_fake, app, job_id, attempt_id) = awaiting_callback(backend, "cb-bad").await;
    let body = r#"{"result": {"summary": "forged"}}"#;
    let forged =
        CallbackKey::new(&Secret::new("not the server's key")).sign(&attempt_id, body.as_bytes());
    for signature in [None, Some("sha256=00".to_owned()), Some(forged)] {
        let response = post_callback(&app, &attempt_id, body, signature).await;
        crate::helpers::assert_problem(response, StatusCode::UNAUTHORIZED, "invalid-signature")
            .await;
    }
    let after = app.get_job(&app.alice.token, &job_id).await;
    assert_eq!(after["status"], "unknown");
    assert!(after["result"].is_null());
}

async fn a_signed_callback_goes_through_the_cas(backend: TestBackend) {
    let (fake, app, job_id, attempt_id) = awaiting_callback(backend, "cb-ok").await;
    let key = CallbackKey::new(&Secret::new(CALLBACK_KEY));
    let request = fake.last_request().unwrap();
    assert_eq!(
        request.header("x-onejob-callback-secret"),
        Some(key.attempt_secret(&attempt_id).expose())
    );
    assert_eq!(
        request.header("x-onejob-callback-url"),
        Some(format!("http://127.0.0.1:9/api/v1/callbacks/attempts/{attempt_id}").as_str())
    );
    let body = r#"{"result": {"summary": "called back"}}"#;
    let response = post_callback(
        &app,
        &attempt_id,
        body,
        Some(key.sign(&attempt_id, body.as_bytes())),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let outcome: Value = response.json().await.unwrap();
    assert_eq!(outcome["outcome"], "won");
    let job = app.get_job(&app.alice.token, &job_id).await;
    assert_eq!(job["status"], "succeeded");
    assert_eq!(job["result"]["summary"], "called back");
    // The same callback again is ignored: the attempt is finished.
    let response = post_callback(
        &app,
        &attempt_id,
        body,
        Some(key.sign(&attempt_id, body.as_bytes())),
    )
    .await;
    let outcome: Value = response.json().await.unwrap();
    assert_eq!(outcome["outcome"], "ignored");
}

on_both_backends!(
    every_row_of_the_classification_table,
    the_anthropic_shape_is_spoken_and_classified,
    a_late_answer_after_the_soft_timeout_wins_the_cas,
    a_late_answer_loses_to_a_qualified_fallback_and_is_race_logged,
    failover_skips_an_unqualified_provider_and_takes_a_qualified_one,
    a_new_attempt_on_an_unqualified_provider_is_refused,
    changing_the_template_voids_the_qualification,
    qualification_fails_on_an_extra_key_on_prose_and_on_a_golden_mismatch,
    a_prompt_over_the_context_budget_fails_qualification_without_a_call,
    a_callback_with_a_bad_signature_is_401_and_changes_nothing,
    a_signed_callback_goes_through_the_cas,
);

/// Runs the real binary against a fake provider: the API key must reach the
/// provider and nowhere else (logs at debug level, the API, the job page).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_api_key_never_appears_in_logs_or_pages() {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    // The provider echoes the request back in an error, as some do.
    fake.push(Behaviour::Status {
        status: 400,
        retry_after: None,
        body: format!("bad request; key {FAKE_API_KEY}? no: redacted"),
    });
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("onejob.toml");
    let toml = [
        fake_provider_toml("fake", "openai", &fake.base_url, ""),
        fake_provider_toml("fake2", "openai", &fake.base_url, ""),
        strict_task_toml("summarize", &["fake", "fake2"], "Summarize: {{ text }}"),
    ]
    .concat();
    std::fs::write(&config_path, toml).unwrap();
    let db = dir.path().join("onejob.db");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let binary = env!("CARGO_BIN_EXE_onejob");
    let run = |args: &[&str]| {
        std::process::Command::new(binary)
            .args(args)
            .env("ONEJOB_CONFIG", &config_path)
            .env("DATABASE_URL", &db)
            .env("ONEJOB_TEST_FAKE_KEY", FAKE_API_KEY)
            .env("RUST_LOG", "debug")
            .output()
            .unwrap()
    };
    let added = run(&["users", "add", "kim", "--role", "admin"]);
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    let token = String::from_utf8(added.stdout).unwrap().trim().to_owned();
    let password = String::from_utf8(run(&["users", "password", "kim"]).stdout)
        .unwrap()
        .trim()
        .to_owned();
    let log = dir.path().join("serve.log");
    let mut server = std::process::Command::new(binary)
        .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
        .env("ONEJOB_CONFIG", &config_path)
        .env("DATABASE_URL", &db)
        .env("ONEJOB_TEST_FAKE_KEY", FAKE_API_KEY)
        .env("RUST_LOG", "debug")
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(dir.path().join("serve.err")).unwrap())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder()
        .cookie_store(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let mut ready = false;
    for _ in 0..100 {
        if client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "the server did not start");
    let created: Value = client
        .post(format!("{base}/api/v1/jobs"))
        .bearer_auth(&token)
        .header("Idempotency-Key", "secret-check")
        .json(&summarize("keep it secret"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let job_id = created["id"].as_str().unwrap().to_owned();
    let mut job = Value::Null;
    for _ in 0..100 {
        job = client
            .get(format!("{base}/api/v1/jobs/{job_id}"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if job["status"] == "failed" || job["status"] == "succeeded" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        fake.requests()
            .iter()
            .any(|r| r.header("authorization") == Some(format!("Bearer {FAKE_API_KEY}").as_str())),
        "the key reached the provider"
    );
    // Sign in and read the pages.
    let browser = crate::helpers::FormClient::at(&base);
    browser.sign_in("kim", &password).await;
    let page = browser
        .get(&format!("/jobs/{job_id}"))
        .await
        .text()
        .await
        .unwrap();
    let providers_page = browser.get("/admin/providers").await.text().await.unwrap();
    let _ = server.kill();
    let _ = server.wait();
    let logs = std::fs::read_to_string(dir.path().join("serve.err")).unwrap()
        + &std::fs::read_to_string(&log).unwrap();
    assert!(
        page.contains(&job_id) && providers_page.contains("fake2"),
        "the pages were read"
    );
    assert!(logs.contains("attempt sent"), "debug logs were captured");
    for (what, text) in [
        ("the logs", logs.as_str()),
        ("the API", &job.to_string()),
        ("the job page", page.as_str()),
        ("the providers page", providers_page.as_str()),
    ] {
        let leak = text
            .find(FAKE_API_KEY)
            .map(|at| &text[at.saturating_sub(300)..(at + 60).min(text.len())]);
        assert!(
            leak.is_none(),
            "the API key leaked into {what}: …{}…",
            leak.unwrap_or_default()
        );
    }
}

/// `onejob qualify` against a misbehaving provider names the failing check and exits non-zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn onejob_qualify_names_the_failing_check_and_exits_non_zero() {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    fake.set_default(Behaviour::AnswerText(
        "I would be glad to summarize that for you.".into(),
    ));
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("onejob.toml");
    let toml = [
        fake_provider_toml("primary", "openai", &fake.base_url, ""),
        fake_provider_toml("chatty", "openai", &fake.base_url, ""),
        strict_task_toml("summarize", &["primary", "chatty"], "Summarize: {{ text }}"),
    ]
    .concat();
    std::fs::write(&config_path, toml).unwrap();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_onejob"))
            .args(["qualify", "--provider", "chatty", "--task", "summarize"])
            .env("ONEJOB_CONFIG", &config_path)
            .env("DATABASE_URL", dir.path().join("onejob.db"))
            .env("ONEJOB_TEST_FAKE_KEY", FAKE_API_KEY)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "exit status: {:?}", output.status);
    assert!(stdout.contains("PASS template renders"), "{stdout}");
    assert!(
        stdout.contains("FAIL golden[0] answer: invalid_output: the answer is not JSON"),
        "{stdout}"
    );
    assert!(
        stderr.contains("not qualified: golden[0] answer failed"),
        "{stderr}"
    );
}
