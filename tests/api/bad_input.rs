//! Bad input gets a clear problem+json error and changes nothing.

use reqwest::header::HeaderValue;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::harness::{assert_problem, spawn_app, summarize, TestApp, TestBackend};

async fn assert_nothing_stored(app: &TestApp) {
    assert_eq!(
        app.job_count(&app.alice.id).await,
        0,
        "a refused request stored nothing"
    );
}

async fn a_request_without_an_idempotency_key_is_400(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let response = app
        .client
        .post(app.url("/api/v1/jobs"))
        .bearer_auth(&app.alice.token)
        .json(&summarize("no key"))
        .send()
        .await
        .unwrap();
    assert_problem(response, StatusCode::BAD_REQUEST, "missing-idempotency-key").await;
    assert_nothing_stored(&app).await;
}

async fn a_256_character_key_is_400_and_255_is_accepted(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let response = app
        .post_job(&app.alice.token, &"k".repeat(256), &summarize("long"))
        .await;
    let problem =
        assert_problem(response, StatusCode::BAD_REQUEST, "invalid-idempotency-key").await;
    assert!(problem["detail"].as_str().unwrap().contains("256"));
    assert_nothing_stored(&app).await;
    let response = app
        .post_job(&app.alice.token, &"k".repeat(255), &summarize("long"))
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
}

async fn a_non_ascii_or_empty_key_is_400(backend: TestBackend) {
    let app = spawn_app(backend).await;
    for raw in [
        HeaderValue::from_bytes("clé-ü".as_bytes()).unwrap(),
        HeaderValue::from_static("\"\""),
    ] {
        let response = app
            .client
            .post(app.url("/api/v1/jobs"))
            .bearer_auth(&app.alice.token)
            .header("Idempotency-Key", raw)
            .json(&summarize("accent"))
            .send()
            .await
            .unwrap();
        assert_problem(response, StatusCode::BAD_REQUEST, "invalid-idempotency-key").await;
    }
    assert_nothing_stored(&app).await;
}

async fn send_raw(
    app: &TestApp,
    content_type: &str,
    body: impl Into<reqwest::Body>,
) -> reqwest::Response {
    app.client
        .post(app.url("/api/v1/jobs"))
        .bearer_auth(&app.alice.token)
        .header("Idempotency-Key", "raw-key")
        .header("Content-Type", content_type)
        .body(body)
        .send()
        .await
        .unwrap()
}

async fn malformed_json_is_400(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let response = send_raw(
        &app,
        "application/json",
        r#"{"task": "summarize", "input": {"text": "x"}"#,
    )
    .await;
    assert_problem(response, StatusCode::BAD_REQUEST, "malformed-json").await;
    assert_nothing_stored(&app).await;
}

async fn a_wrong_content_type_is_415(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let body = summarize("x").to_string();
    let response = send_raw(&app, "text/plain", body.clone()).await;
    assert_problem(
        response,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported-media-type",
    )
    .await;
    let response = send_raw(&app, "application/x-www-form-urlencoded", "task=summarize").await;
    assert_problem(
        response,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported-media-type",
    )
    .await;
    assert_nothing_stored(&app).await;
}

async fn a_body_over_the_size_limit_is_413(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let huge = summarize(&"x".repeat(100 * 1024)).to_string();
    let response = send_raw(&app, "application/json", huge).await;
    assert_problem(response, StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large").await;
    assert_nothing_stored(&app).await;
}

async fn an_unknown_task_is_422_and_the_key_is_not_reserved(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let response = app
        .post_job(
            &app.alice.token,
            "fix-and-retry",
            &json!({"task": "translate", "input": {"text": "x"}}),
        )
        .await;
    let problem = assert_problem(response, StatusCode::UNPROCESSABLE_ENTITY, "unknown-task").await;
    assert_eq!(problem["tasks"], json!(["summarize"]));
    assert_nothing_stored(&app).await;
    // The client fixes the body and reuses the key.
    let response = app
        .post_job(&app.alice.token, "fix-and-retry", &summarize("x"))
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
}

async fn invalid_bodies_are_422(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let cases: Vec<(Value, &str)> = vec![
        (
            json!({"task": "summarize", "input": {"text": "x"}, "provider": "sim-nowhere"}),
            "unknown-provider",
        ),
        (json!({"task": "summarize", "input": {}}), "invalid-input"),
        (
            json!({"task": "summarize", "input": {"text": "   "}}),
            "invalid-input",
        ),
        (
            json!({"task": "summarize", "input": "just a string"}),
            "invalid-input",
        ),
        (json!({"task": 7, "input": {"text": "x"}}), "invalid-body"),
        (json!({"input": {"text": "x"}}), "invalid-body"),
        (
            json!({"task": "summarize", "input": {"text": "x"}, "priority": "high"}),
            "invalid-body",
        ),
        (
            json!({"task": "summarize", "input": {"text": "x"}, "params": [1]}),
            "invalid-body",
        ),
    ];
    for (i, (body, slug)) in cases.into_iter().enumerate() {
        let response = app
            .post_job(&app.alice.token, &format!("bad-{i}"), &body)
            .await;
        assert_problem(response, StatusCode::UNPROCESSABLE_ENTITY, slug).await;
    }
    assert_nothing_stored(&app).await;
}

async fn requests_without_a_valid_token_are_401(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let no_token = app
        .client
        .post(app.url("/api/v1/jobs"))
        .header("Idempotency-Key", "k")
        .json(&summarize("x"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        no_token.headers()["www-authenticate"],
        "Bearer realm=\"onejob\""
    );
    assert_problem(no_token, StatusCode::UNAUTHORIZED, "unauthorized").await;
    let bad_token = app
        .post_job("oj_not-a-real-token", "k", &summarize("x"))
        .await;
    assert_problem(bad_token, StatusCode::UNAUTHORIZED, "unauthorized").await;
    // 401 comes before any look at the body.
    let response = app
        .client
        .post(app.url("/api/v1/jobs"))
        .header("Content-Type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_problem(response, StatusCode::UNAUTHORIZED, "unauthorized").await;
    assert_nothing_stored(&app).await;
}

async fn unknown_ids_and_routes_are_404(backend: TestBackend) {
    let app = spawn_app(backend).await;
    for path in [
        "/api/v1/jobs/not-a-uuid",
        "/api/v1/jobs/01890a5d-ac96-774b-bcce-b302099a8057",
        "/api/v1/nothing-here",
    ] {
        assert_problem(
            app.get(&app.alice.token, path).await,
            StatusCode::NOT_FOUND,
            "not-found",
        )
        .await;
    }
    let response = app
        .abandon(
            &app.sue.token,
            "01890a5d-ac96-774b-bcce-b302099a8057",
            "why",
        )
        .await;
    assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
}

async fn html_in_the_input_is_stored_and_returned_verbatim_as_json(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let text = "<script>alert('x')</script>";
    let job_id = app
        .create_job(&app.alice.token, "html", &summarize(text))
        .await;
    let job = app.get_job(&app.alice.token, &job_id).await;
    assert_eq!(job["input"]["text"], text);
}

on_both_backends!(
    a_request_without_an_idempotency_key_is_400,
    a_256_character_key_is_400_and_255_is_accepted,
    a_non_ascii_or_empty_key_is_400,
    malformed_json_is_400,
    a_wrong_content_type_is_415,
    a_body_over_the_size_limit_is_413,
    an_unknown_task_is_422_and_the_key_is_not_reserved,
    invalid_bodies_are_422,
    requests_without_a_valid_token_are_401,
    unknown_ids_and_routes_are_404,
    html_in_the_input_is_stored_and_returned_verbatim_as_json,
);
