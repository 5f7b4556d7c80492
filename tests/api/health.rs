//! Health, the OpenAPI document, request ids and problem descriptions.

use std::io::Write;

use reqwest::StatusCode;
use serde_json::Value;

use crate::support::harness::{spawn_app, test_config, PreparedApp, TestBackend};

/// A chain whose fallback never answers and whose soft timeout is a minute:
/// qualifying it at start takes that minute.
const SLOW_TO_QUALIFY: &str = r#"
[[providers]]
name = "sim-fast"
kind = "simulated"
latency_ms = 10

[[providers]]
name = "sim-never"
kind = "simulated"
fail = "timeout-forever"
timeout_ms = 60000

[[tasks]]
name = "summarize"
providers = ["sim-fast", "sim-never"]
input_fields = ["text"]

[[tasks.golden]]
input = { text = "golden example" }
"#;

async fn healthz_answers_within_a_second_of_start_whatever_the_providers_latencies(
    backend: TestBackend,
) {
    let prepared = PreparedApp::new(backend, test_config(SLOW_TO_QUALIFY)).await;
    let started = std::time::Instant::now();
    let app = prepared.start().await;
    loop {
        let answered = app.client.get(app.url("/healthz")).send().await;
        if answered.is_ok_and(|r| r.status() == StatusCode::OK) {
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
            "no /healthz within a second"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(
        started.elapsed() < std::time::Duration::from_secs(1),
        "/healthz took {:?}",
        started.elapsed()
    );
    // The minute-long qualification of sim-never is still running: serving
    // did not wait for it.
    assert!(
        tokio::time::timeout(
            std::time::Duration::ZERO,
            app.app.startup_qualification_settled()
        )
        .await
        .is_err(),
        "the start-up qualification should still be running"
    );
}

async fn healthz_and_readyz_answer_200(backend: TestBackend) {
    let app = spawn_app(backend).await;
    for path in ["/healthz", "/readyz"] {
        let response = app.client.get(app.url(path)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
    }
}

async fn every_response_carries_a_request_id(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let response = app
        .client
        .get(app.url("/api/v1/jobs"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let id = response.headers()["x-request-id"].to_str().unwrap();
    assert!(uuid::Uuid::parse_str(id).is_ok(), "{id}");
}

async fn problem_types_resolve_to_a_description(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let response = app
        .client
        .get(app.url("/problems/idempotency-key-reused"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.text().await.unwrap().contains("different payload"));
}

/// Validates the served document with `openapi-spec-validator` (installed by
/// `.ci/run`); required in CI, skipped loudly elsewhere when missing.
async fn the_openapi_document_covers_the_api_and_validates(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let doc: Value = app
        .client
        .get(app.url("/api/v1/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for path in [
        "/api/v1/jobs",
        "/api/v1/jobs/{id}",
        "/api/v1/jobs/{id}/attempts",
        "/api/v1/attempts/{id}/abandon",
        "/api/v1/admin/unknown",
        "/api/v1/admin/races",
        "/api/v1/callbacks/attempts/{id}",
        "/api/v1/openapi.json",
        "/healthz",
        "/readyz",
    ] {
        assert!(
            doc["paths"].get(path).is_some(),
            "the document describes {path}"
        );
    }
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), doc.to_string()).unwrap();
    let output = std::process::Command::new("python3")
        .args(["-m", "openapi_spec_validator"])
        .arg(file.path())
        .output();
    let missing = match &output {
        Ok(out) => String::from_utf8_lossy(&out.stderr).contains("No module named"),
        Err(_) => true,
    };
    if missing {
        if crate::support::harness::in_ci() {
            panic!("openapi-spec-validator is required in CI (pip install openapi-spec-validator)");
        }
        let _ = writeln!(
            std::io::stderr(),
            "!!! SKIPPED OpenAPI validation: python3 -m openapi_spec_validator is not installed"
        );
        return;
    }
    let output = output.unwrap();
    assert!(
        output.status.success(),
        "the OpenAPI document does not validate:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// PostgreSQL only: an embedded SQLite file has no "down" to be in.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readyz_answers_503_while_the_database_is_down_and_200_once_it_is_back() {
    use diesel::connection::SimpleConnection;
    use diesel::prelude::*;
    if !crate::support::harness::postgres_available() {
        return;
    }
    let mut config = test_config(crate::support::harness::DEFAULT_TEST_PROVIDERS);
    config.database.pool_timeout_ms = 500;
    let app = crate::support::harness::spawn_app_with(TestBackend::Postgres, config).await;
    let readyz = || async { app.client.get(app.url("/readyz")).send().await.unwrap() };
    assert_eq!(readyz().await.status(), StatusCode::OK);
    let name = app.db.postgres_name().unwrap().to_owned();
    let mut admin = diesel::PgConnection::establish(&format!(
        "{}/postgres",
        crate::support::harness::postgres_server_url()
    ))
    .unwrap();
    // The database goes away: no new connections, and every open one is cut.
    admin
        .batch_execute(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS false"))
        .unwrap();
    admin
        .batch_execute(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
        ))
        .unwrap();
    let response = readyz().await;
    crate::support::harness::assert_problem(
        response,
        StatusCode::SERVICE_UNAVAILABLE,
        "service-unavailable",
    )
    .await;
    // Twice: a broken pooled connection, then no connection at all.
    let response = readyz().await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().contains_key("retry-after"));
    admin
        .batch_execute(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true"))
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while readyz().await.status() != StatusCode::OK {
        assert!(
            std::time::Instant::now() < deadline,
            "not ready again after 10 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

on_both_backends!(
    healthz_and_readyz_answer_200,
    healthz_answers_within_a_second_of_start_whatever_the_providers_latencies,
    every_response_carries_a_request_id,
    problem_types_resolve_to_a_description,
    the_openapi_document_covers_the_api_and_validates,
);
