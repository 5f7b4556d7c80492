//! Endpoints as their owner registers and manages them: owner-scoped, the
//! secret shown once, bad input refused with nothing stored, the URL's
//! length as the schema says, loopback refused unless allowed (also when a
//! name resolves to it at delivery), and a server without a webhook key
//! saying how to enable webhooks.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use super::{get_json, register, register_ok, wait_until, webhook_config};
use crate::support::harness::{
    assert_problem, spawn_app_with, summarize, test_config, TestBackend, DEFAULT_TEST_PROVIDERS,
};
use crate::support::webhook_receiver::WebhookReceiver;

pub(super) async fn endpoints_are_owner_scoped_and_the_secret_is_shown_once(backend: TestBackend) {
    let receiver = WebhookReceiver::start().await;
    let app = spawn_app_with(backend, webhook_config(|_| {})).await;
    let (endpoint, secret) = register_ok(&app, &app.alice.token, &receiver.url("/a")).await;
    assert!(secret.starts_with("whsec_"));
    let path = format!("/api/v1/webhooks/{endpoint}");
    let shown = app.get(&app.alice.token, &path).await.text().await.unwrap();
    assert!(!shown.contains(&secret), "GET never shows the secret");
    let listed = app
        .get(&app.alice.token, "/api/v1/webhooks")
        .await
        .text()
        .await
        .unwrap();
    assert!(!listed.contains(&secret) && listed.contains(&endpoint));
    // Another owner's endpoint does not exist for bob, nor for staff by id.
    for token in [&app.bob.token, &app.ada.token] {
        assert_problem(
            app.get(token, &path).await,
            StatusCode::NOT_FOUND,
            "not-found",
        )
        .await;
    }
    let bobs = get_json(&app, &app.bob.token, "/api/v1/webhooks").await;
    assert_eq!(bobs["webhooks"], json!([]));
    // Admins list across owners; others may not.
    let all = get_json(&app, &app.ada.token, "/api/v1/webhooks?all=true").await;
    assert_eq!(all["webhooks"][0]["id"], endpoint.as_str());
    assert_problem(
        app.get(&app.alice.token, "/api/v1/webhooks?all=true").await,
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    // Bad input: a clear problem, nothing stored.
    for (body, field) in [
        (
            json!({"url": "ftp://x.example/", "events": ["job.failed"]}),
            "url",
        ),
        (
            json!({"url": "https://u:p@x.example/", "events": ["job.failed"]}),
            "url",
        ),
        (json!({"url": "https://x.example/", "events": []}), "events"),
        (
            json!({"url": "https://x.example/", "events": ["job.failed"], "retry_for_seconds": 0}),
            "retry_for_seconds",
        ),
    ] {
        let problem = assert_problem(
            register(&app, &app.bob.token, body).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-body",
        )
        .await;
        assert_eq!(problem["field"], field, "{problem}");
    }
    assert_problem(
        register(
            &app,
            &app.bob.token,
            json!({"url": "https://x.example/", "events": ["job.done"]}),
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid-body",
    )
    .await;
    assert_eq!(
        get_json(&app, &app.bob.token, "/api/v1/webhooks").await["webhooks"],
        json!([])
    );
    // PATCH and DELETE are owner-scoped too.
    let patched = app
        .client
        .patch(app.url(&path))
        .bearer_auth(&app.bob.token)
        .json(&json!({"enabled": false}))
        .send()
        .await
        .unwrap();
    assert_eq!(patched.status(), StatusCode::NOT_FOUND);
    let deleted = app
        .client
        .delete(app.url(&path))
        .bearer_auth(&app.alice.token)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    assert_problem(
        app.get(&app.alice.token, &path).await,
        StatusCode::NOT_FOUND,
        "not-found",
    )
    .await;

    // Without a server key, creating an endpoint says how to enable webhooks.
    let off = spawn_app_with(backend, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let problem = assert_problem(
        register(
            &off,
            &off.alice.token,
            json!({"url": "https://x.example/", "events": ["job.failed"]}),
        )
        .await,
        StatusCode::CONFLICT,
        "webhooks-not-configured",
    )
    .await;
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("webhooks.signing_key_env"),
        "{problem}"
    );
}

/// The schema says `maxLength: 2047`; a URL one character longer is refused,
/// even when the extra characters sit in a fragment that would be dropped,
/// and nothing is stored. One at the limit is accepted.
pub(super) async fn a_url_over_the_schemas_length_is_refused_even_in_its_fragment(
    backend: TestBackend,
) {
    let app = spawn_app_with(backend, webhook_config(|_| {})).await;
    let prefix = "https://hooks.example.com/in#";
    let at_limit = format!("{prefix}{}", "f".repeat(2047 - prefix.len()));
    let over = format!("{at_limit}f");
    let problem = assert_problem(
        register(
            &app,
            &app.alice.token,
            json!({"url": over, "events": ["job.succeeded"]}),
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid-body",
    )
    .await;
    assert!(
        problem["detail"].as_str().unwrap().contains("2047"),
        "{problem}"
    );
    let listed = get_json(&app, &app.alice.token, "/api/v1/webhooks").await;
    assert_eq!(listed["webhooks"].as_array().unwrap().len(), 0, "{listed}");
    register_ok(&app, &app.alice.token, &at_limit).await;
}

pub(super) async fn a_loopback_url_is_refused_unless_allowed(backend: TestBackend) {
    let receiver = WebhookReceiver::start().await;
    let app = spawn_app_with(
        backend,
        webhook_config(|c| c.webhooks.settings.allow_private_addresses = false),
    )
    .await;
    for url in [
        receiver.url("/"),
        format!("http://[::1]:{}/", receiver.port),
        format!("http://[::ffff:127.0.0.1]:{}/", receiver.port),
        "http://10.0.0.8/".to_owned(),
        "http://169.254.169.254/latest/meta-data".to_owned(),
    ] {
        let problem = assert_problem(
            register(
                &app,
                &app.alice.token,
                json!({"url": url, "events": ["job.succeeded"]}),
            )
            .await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-body",
        )
        .await;
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("public addresses"),
            "{url}: {problem}"
        );
    }
    // A name is judged when it is resolved, at each delivery: `localhost`
    // resolves to loopback, so nothing is sent.
    let (endpoint, _) = register_ok(&app, &app.alice.token, &receiver.localhost_url("/")).await;
    let job_id = app
        .create_job(&app.alice.token, "wh-loop", &summarize("loopback"))
        .await;
    app.wait_for_status(&job_id, "succeeded", Duration::from_secs(10))
        .await;
    let log_path = format!("/api/v1/webhooks/{endpoint}/deliveries");
    wait_until("a refused delivery", Duration::from_secs(10), || async {
        let log = get_json(&app, &app.alice.token, &log_path).await;
        log["deliveries"].as_array().is_some_and(|d| !d.is_empty())
    })
    .await;
    let log = get_json(&app, &app.alice.token, &log_path).await;
    let first = &log["deliveries"][0];
    assert_eq!(first["outcome"], "refused", "{log}");
    assert!(
        first["error"].as_str().unwrap().contains("loopback"),
        "{log}"
    );
    assert!(receiver.received().is_empty(), "nothing reached loopback");

    // Allowed, the same URL is delivered to.
    let allowed = spawn_app_with(backend, webhook_config(|_| {})).await;
    register_ok(&allowed, &allowed.alice.token, &receiver.localhost_url("/")).await;
    let job_id = allowed
        .create_job(&allowed.alice.token, "wh-loop", &summarize("loopback"))
        .await;
    allowed
        .wait_for_status(&job_id, "succeeded", Duration::from_secs(10))
        .await;
    receiver.wait_for(1, Duration::from_secs(10)).await;
}
