//! Roles on the support and admin endpoints, and the busy-database answer.

use std::time::{Duration, Instant};

use reqwest::StatusCode;

use crate::support::harness::{
    assert_problem, spawn_app, spawn_app_with, summarize, test_config, TestBackend,
    DEFAULT_TEST_PROVIDERS,
};

async fn only_staff_see_the_unknown_queue_and_only_admins_the_race_log(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let user = app.get(&app.alice.token, "/api/v1/admin/unknown").await;
    assert_problem(user, StatusCode::FORBIDDEN, "forbidden").await;
    assert_eq!(
        app.get(&app.sue.token, "/api/v1/admin/unknown")
            .await
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        app.get(&app.ada.token, "/api/v1/admin/unknown")
            .await
            .status(),
        StatusCode::OK
    );
    for token in [&app.alice.token, &app.sue.token] {
        assert_problem(
            app.get(token, "/api/v1/admin/races").await,
            StatusCode::FORBIDDEN,
            "forbidden",
        )
        .await;
    }
    assert_eq!(
        app.get(&app.ada.token, "/api/v1/admin/races")
            .await
            .status(),
        StatusCode::OK
    );
    let bad_limit = app
        .get(&app.ada.token, "/api/v1/admin/races?limit=abc")
        .await;
    assert_problem(bad_limit, StatusCode::BAD_REQUEST, "invalid-query").await;
}

async fn abandoning_a_running_or_finished_attempt_is_409(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let job_id = app
        .create_job(&app.alice.token, "done", &summarize("x"))
        .await;
    let job = app
        .wait_for_status(&job_id, "succeeded", Duration::from_secs(10))
        .await;
    let attempt = job["attempts"][0]["id"].as_str().unwrap().to_owned();
    let response = app.abandon(&app.ada.token, &attempt, "not needed").await;
    let problem = assert_problem(response, StatusCode::CONFLICT, "attempt-not-unknown").await;
    assert_eq!(problem["attempt_state"], "succeeded");
    let entries = app
        .with_conn(|conn| onejob::store::console::audit_entries(conn, 10).unwrap())
        .await;
    assert!(
        entries.is_empty(),
        "a refused abandon writes no audit entry"
    );
}

async fn an_exhausted_connection_pool_answers_503_instead_of_hanging(backend: TestBackend) {
    let mut config = test_config(DEFAULT_TEST_PROVIDERS);
    config.database.pool_size = 1;
    config.database.pool_timeout_ms = 300;
    config.worker.concurrency = 0;
    let app = spawn_app_with(backend, config).await;
    // Hold the pool's only connection.
    let store = app.store.clone();
    let held = tokio::task::spawn_blocking(move || store.conn().unwrap())
        .await
        .unwrap();
    let started = Instant::now();
    let response = app.get(&app.alice.token, "/api/v1/jobs").await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered promptly"
    );
    assert_eq!(response.headers()["retry-after"], "1");
    assert_problem(
        response,
        StatusCode::SERVICE_UNAVAILABLE,
        "service-unavailable",
    )
    .await;
    drop(held);
    assert_eq!(
        app.get(&app.alice.token, "/api/v1/jobs").await.status(),
        StatusCode::OK
    );
}

on_both_backends!(
    only_staff_see_the_unknown_queue_and_only_admins_the_race_log,
    abandoning_a_running_or_finished_attempt_is_409,
    an_exhausted_connection_pool_answers_503_instead_of_hanging,
);
