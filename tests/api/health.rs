//! Health, the OpenAPI document, request ids and problem descriptions.

use std::io::Write;

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{spawn_app, TestBackend};

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
        if std::env::var("CI").is_ok_and(|v| !v.is_empty()) {
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

on_both_backends!(
    healthz_and_readyz_answer_200,
    every_response_carries_a_request_id,
    problem_types_resolve_to_a_description,
    the_openapi_document_covers_the_api_and_validates,
);
