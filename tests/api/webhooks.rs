//! Completion webhooks from the durable outbox (docs/design.md, "Webhook
//! outbox"), end to end over real HTTP: a receiver started by the test
//! records what each delivery carried. Retries keep their `webhook-id`,
//! signatures verify by recomputing the HMAC, a rotation signs with both
//! secrets during its overlap, loopback is refused unless allowed,
//! redirects are not followed, a failing endpoint is disabled, a resend
//! keeps the id and body; underneath, the outbox row commits and rolls back
//! with the job's state change, and the SQL agrees with the domain's rules.

use std::collections::HashMap;
use std::time::Duration;

use diesel::prelude::*;
use hmac::{Hmac, KeyInit, Mac};
use onejob::config::Config;
use onejob::domain::webhook::{
    base64_decode, base64_encode, may_claim_event, records_event, EventKind, EventState, WebhookKey,
};
use onejob::domain::{JobStatus, Secret};
use onejob::store::transitions::{fail_job, find_owned_job, JobKey};
use onejob::store::webhooks as outbox;
use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::Sha256;

use crate::support::harness::{
    assert_problem, spawn_app_with, summarize, test_config, TestApp, TestBackend,
    DEFAULT_TEST_PROVIDERS,
};
use crate::support::webhook_receiver::{Received, WebhookReceiver};

/// The server webhook key the tests configure.
pub const WEBHOOK_KEY: &str = "webhook-key-for-tests-0123456789abcdef0123456789";

/// Test settings: the key, private addresses allowed (the receiver is on
/// 127.0.0.1), short backoff, quick polling.
pub(crate) fn webhook_config(tweak: impl FnOnce(&mut Config)) -> Config {
    let mut config = test_config(DEFAULT_TEST_PROVIDERS);
    config.webhooks.key = Some(WebhookKey::new(&Secret::new(WEBHOOK_KEY)));
    let s = &mut config.webhooks.settings;
    s.allow_private_addresses = true;
    s.backoff_initial_ms = 100;
    s.backoff_max_ms = 400;
    s.poll_interval_ms = 50;
    s.timeout_ms = 2_000;
    tweak(&mut config);
    config
}

async fn register(app: &TestApp, token: &str, body: Value) -> reqwest::Response {
    app.client
        .post(app.url("/api/v1/webhooks"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// Registers `url` for every event type; returns (id, secret).
async fn register_ok(app: &TestApp, token: &str, url: &str) -> (String, String) {
    let response = register(
        app,
        token,
        json!({"url": url, "events": ["job.succeeded", "job.failed", "job.unknown"]}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let body: Value = response.json().await.unwrap();
    (
        body["webhook"]["id"].as_str().unwrap().to_owned(),
        body["secret"].as_str().unwrap().to_owned(),
    )
}

async fn get_json(app: &TestApp, token: &str, path: &str) -> Value {
    let response = app.get(token, path).await;
    assert_eq!(response.status(), StatusCode::OK, "GET {path}");
    response.json().await.unwrap()
}

/// The signatures of a `webhook-signature` header that verify under
/// `secret`, recomputed here with HMAC-SHA256 over `{id}.{timestamp}.{body}`.
fn verifying(secret: &str, received: &Received) -> usize {
    let key = base64_decode(secret.strip_prefix("whsec_").unwrap()).unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(
        format!(
            "{}.{}.",
            received.webhook_id(),
            received.header("webhook-timestamp")
        )
        .as_bytes(),
    );
    mac.update(&received.body);
    let expected = format!("v1,{}", base64_encode(&mac.finalize().into_bytes()));
    received
        .header("webhook-signature")
        .split(' ')
        .filter(|s| *s == expected)
        .count()
}

async fn wait_until<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + within;
    while !check().await {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

on_both_backends!(
    a_receiver_failing_twice_gets_the_third_try_with_the_same_webhook_id,
    endpoints_are_owner_scoped_and_the_secret_is_shown_once,
    a_loopback_url_is_refused_unless_allowed,
    a_url_over_the_schemas_length_is_refused_even_in_its_fragment,
    redirects_are_not_followed,
    a_rotated_secret_signs_with_both_during_the_overlap_then_only_the_new,
    an_endpoint_past_the_failure_threshold_is_disabled_and_says_why,
    resend_keeps_the_same_webhook_id_and_body,
    the_outbox_row_commits_and_rolls_back_with_the_state_change,
    the_outbox_sql_agrees_with_the_domain_rules,
    an_attempt_going_unknown_is_told_once_then_the_late_success,
    a_winner_with_no_endpoint_for_it_looks_none_up,
);

/// A soft timeout makes the attempt unknown: one `job.unknown` event naming
/// it; its late answer then wins, and `job.succeeded` follows.
async fn an_attempt_going_unknown_is_told_once_then_the_late_success(backend: TestBackend) {
    let receiver = WebhookReceiver::start().await;
    let app = spawn_app_with(backend, webhook_config(|_| {})).await;
    register_ok(&app, &app.alice.token, &receiver.url("/")).await;
    let body = json!({"task": "summarize", "input": {"text": "slow"}, "provider": "sim-slow"});
    let job_id = app.create_job(&app.alice.token, "wh-unknown", &body).await;
    app.wait_for_status(&job_id, "succeeded", Duration::from_secs(15))
        .await;
    let got = receiver.wait_for(2, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let types: Vec<String> = receiver
        .received()
        .iter()
        .map(|r| r.json()["type"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(types, ["job.unknown", "job.succeeded"]);
    let unknown = got[0].json();
    assert_eq!(unknown["data"]["status"], "unknown");
    assert_eq!(unknown["data"]["id"], job_id.as_str());
    let job = app.get_job(&app.alice.token, &job_id).await;
    assert_eq!(
        unknown["data"]["attempt_id"], job["attempts"][0]["id"],
        "{job}"
    );
    assert_ne!(got[0].webhook_id(), got[1].webhook_id());
}

async fn a_receiver_failing_twice_gets_the_third_try_with_the_same_webhook_id(
    backend: TestBackend,
) {
    let receiver = WebhookReceiver::start().await;
    receiver.fail_first(2);
    let app = spawn_app_with(backend, webhook_config(|_| {})).await;
    let (endpoint, secret) = register_ok(&app, &app.alice.token, &receiver.url("/hook")).await;
    let job_id = app
        .create_job(&app.alice.token, "wh-1", &summarize("three tries"))
        .await;
    app.wait_for_status(&job_id, "succeeded", Duration::from_secs(10))
        .await;
    let got = receiver.wait_for(3, Duration::from_secs(15)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got_now = receiver.received();
    assert_eq!(got_now.len(), 3, "no delivery after the successful one");
    let id = got[0].webhook_id();
    assert!(id.starts_with("msg_"), "{id}");
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.webhook_id(), id, "try {i} keeps the webhook-id");
        assert_eq!(r.body, got[0].body, "try {i} sends the same bytes");
        assert_eq!(r.path, "/hook");
        assert_eq!(r.header("content-type"), "application/json");
        assert!(r.header("user-agent").starts_with("onejob-webhooks/"));
        assert_eq!(verifying(&secret, r), 1, "try {i}'s signature verifies");
        let ts: i64 = r.header("webhook-timestamp").parse().unwrap();
        assert!((chrono::Utc::now().timestamp() - ts).abs() < 60);
    }
    // A tampered body does not verify.
    let mut tampered = got[2].clone();
    tampered.body.push(b' ');
    assert_eq!(verifying(&secret, &tampered), 0);
    let body = got[2].json();
    assert_eq!(body["type"], "job.succeeded");
    assert_eq!(body["data"]["id"], job_id.as_str());
    assert_eq!(body["data"]["status"], "succeeded");
    assert_eq!(body["data"]["idempotency_key"], "wh-1");
    assert!(body["data"]["result"].is_object(), "{body}");

    let log = get_json(
        &app,
        &app.alice.token,
        &format!("/api/v1/webhooks/{endpoint}/deliveries"),
    )
    .await;
    let outcomes: Vec<(&str, i64)> = log["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .map(|d| {
            (
                d["outcome"].as_str().unwrap(),
                d["status_code"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [("failed", 500), ("failed", 500), ("delivered", 204)]
    );
    assert_eq!(log["deliveries"][2]["response_body"], "receiver says no");
    let events = get_json(
        &app,
        &app.alice.token,
        &format!("/api/v1/webhooks/{endpoint}/events"),
    )
    .await;
    assert_eq!(events["events"][0]["state"], "delivered");
    assert_eq!(events["events"][0]["webhook_id"], id);
    assert_eq!(events["events"][0]["attempts"], 3);
    let metrics = crate::support::metrics::metrics(&app).await;
    assert!(
        metrics.contains("onejob_webhook_deliveries_total{outcome=\"delivered\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("onejob_webhook_deliveries_total{outcome=\"failed\"} 2"));
    assert!(metrics.contains("onejob_webhook_outbox_oldest_age_seconds 0"));
    assert!(metrics.contains("onejob_webhook_endpoints_disabled 0"));
}

async fn endpoints_are_owner_scoped_and_the_secret_is_shown_once(backend: TestBackend) {
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
async fn a_url_over_the_schemas_length_is_refused_even_in_its_fragment(backend: TestBackend) {
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

async fn a_loopback_url_is_refused_unless_allowed(backend: TestBackend) {
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

async fn redirects_are_not_followed(backend: TestBackend) {
    let target = WebhookReceiver::start().await;
    let redirecting = WebhookReceiver::start().await;
    redirecting.redirect_to(&target.url("/elsewhere"));
    let app = spawn_app_with(backend, webhook_config(|_| {})).await;
    let (endpoint, _) = register_ok(&app, &app.alice.token, &redirecting.url("/in")).await;
    let job_id = app
        .create_job(&app.alice.token, "wh-redirect", &summarize("redirect"))
        .await;
    app.wait_for_status(&job_id, "succeeded", Duration::from_secs(10))
        .await;
    redirecting.wait_for(2, Duration::from_secs(10)).await;
    assert!(
        target.received().is_empty(),
        "the redirect was not followed"
    );
    let log = get_json(
        &app,
        &app.alice.token,
        &format!("/api/v1/webhooks/{endpoint}/deliveries"),
    )
    .await;
    let last = log["deliveries"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["outcome"], "failed");
    assert_eq!(last["status_code"], 302);
    assert!(last["error"]
        .as_str()
        .unwrap()
        .contains("redirects are not followed"));
}

async fn a_rotated_secret_signs_with_both_during_the_overlap_then_only_the_new(
    backend: TestBackend,
) {
    let receiver = WebhookReceiver::start().await;
    let app = spawn_app_with(backend, webhook_config(|_| {})).await;
    let (endpoint, old) = register_ok(&app, &app.alice.token, &receiver.url("/")).await;
    let rotated: Value = app
        .client
        .post(app.url(&format!("/api/v1/webhooks/{endpoint}/rotate-secret")))
        .bearer_auth(&app.alice.token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let new = rotated["secret"].as_str().unwrap().to_owned();
    assert_ne!(new, old);
    assert_eq!(rotated["webhook"]["secret_generation"], 2);
    assert!(rotated["webhook"]["previous_secret_valid_until"].is_string());
    let job_id = app
        .create_job(&app.alice.token, "wh-rot-1", &summarize("during"))
        .await;
    app.wait_for_status(&job_id, "succeeded", Duration::from_secs(10))
        .await;
    let during = receiver.wait_for(1, Duration::from_secs(10)).await;
    assert_eq!(during[0].header("webhook-signature").split(' ').count(), 2);
    assert_eq!(
        verifying(&old, &during[0]),
        1,
        "the old secret still verifies"
    );
    assert_eq!(verifying(&new, &during[0]), 1, "the new secret verifies");

    // The overlap ends (its end moved into the past in the database).
    let owner = app.alice.id.clone();
    app.with_conn(move |conn| {
        diesel::sql_query(
            "UPDATE webhook_endpoints SET previous_generation_valid_until = 1 WHERE owner_id = $1"
                .replace("$1", &format!("'{owner}'")),
        )
        .execute(conn)
        .unwrap();
    })
    .await;
    let job_id = app
        .create_job(&app.alice.token, "wh-rot-2", &summarize("after"))
        .await;
    app.wait_for_status(&job_id, "succeeded", Duration::from_secs(10))
        .await;
    let after = receiver.wait_for(2, Duration::from_secs(10)).await;
    assert_eq!(after[1].header("webhook-signature").split(' ').count(), 1);
    assert_eq!(
        verifying(&old, &after[1]),
        0,
        "the old secret no longer signs"
    );
    assert_eq!(verifying(&new, &after[1]), 1);
}

async fn an_endpoint_past_the_failure_threshold_is_disabled_and_says_why(backend: TestBackend) {
    let receiver = WebhookReceiver::start().await;
    receiver.fail_first(1_000);
    let app = spawn_app_with(
        backend,
        webhook_config(|c| {
            c.webhooks.settings.disable_after_failures = 3;
            c.webhooks.settings.disable_after_seconds = 0;
        }),
    )
    .await;
    let (endpoint, _) = register_ok(&app, &app.alice.token, &receiver.url("/")).await;
    let job_id = app
        .create_job(&app.alice.token, "wh-dis", &summarize("failing"))
        .await;
    app.wait_for_status(&job_id, "succeeded", Duration::from_secs(10))
        .await;
    let path = format!("/api/v1/webhooks/{endpoint}");
    wait_until("the endpoint disabled", Duration::from_secs(15), || async {
        get_json(&app, &app.alice.token, &path).await["enabled"] == false
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let shown = get_json(&app, &app.alice.token, &path).await;
    assert_eq!(shown["consecutive_failures"], 3, "{shown}");
    assert!(shown["disabled_at"].is_string());
    assert!(
        shown["disabled_reason"]
            .as_str()
            .unwrap()
            .contains("3 consecutive failed deliveries"),
        "{shown}"
    );
    assert_eq!(receiver.received().len(), 3, "nothing sent once disabled");
    let metrics = crate::support::metrics::metrics(&app).await;
    assert!(
        metrics.contains("onejob_webhook_endpoints_disabled 1"),
        "{metrics}"
    );

    // Enabled again (the receiver healthy now), the pending event goes out.
    receiver.fail_first(0);
    let enabled: Value = app
        .client
        .patch(app.url(&path))
        .bearer_auth(&app.alice.token)
        .json(&json!({"enabled": true}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(enabled["enabled"], true);
    assert_eq!(enabled["consecutive_failures"], 0);
    assert!(enabled["disabled_reason"].is_null());
    receiver.wait_for(4, Duration::from_secs(10)).await;
}

async fn resend_keeps_the_same_webhook_id_and_body(backend: TestBackend) {
    let receiver = WebhookReceiver::start().await;
    let app = spawn_app_with(backend, webhook_config(|_| {})).await;
    let (endpoint, secret) = register_ok(&app, &app.alice.token, &receiver.url("/")).await;
    let job_id = app
        .create_job(&app.alice.token, "wh-resend", &summarize("resend"))
        .await;
    app.wait_for_status(&job_id, "succeeded", Duration::from_secs(10))
        .await;
    let first = receiver.wait_for(1, Duration::from_secs(10)).await;
    let events_path = format!("/api/v1/webhooks/{endpoint}/events");
    wait_until("delivered", Duration::from_secs(5), || async {
        get_json(&app, &app.alice.token, &events_path).await["events"][0]["state"] == "delivered"
    })
    .await;
    let events = get_json(&app, &app.alice.token, &events_path).await;
    let event_id = events["events"][0]["id"].as_str().unwrap().to_owned();
    let resend = |token: String, endpoint: String| {
        let request = app
            .client
            .post(app.url(&format!(
                "/api/v1/webhooks/{endpoint}/events/{event_id}/resend"
            )))
            .bearer_auth(token);
        async move { request.send().await.unwrap() }
    };
    // Not bob's to resend.
    assert_eq!(
        resend(app.bob.token.clone(), endpoint.clone())
            .await
            .status(),
        StatusCode::NOT_FOUND
    );
    let answer = resend(app.alice.token.clone(), endpoint.clone()).await;
    assert_eq!(answer.status(), StatusCode::ACCEPTED);
    let again = receiver.wait_for(2, Duration::from_secs(10)).await;
    assert_eq!(again[1].webhook_id(), first[0].webhook_id());
    assert_eq!(again[1].body, first[0].body);
    assert_eq!(verifying(&secret, &again[1]), 1);
}

/// On PostgreSQL the compare-and-swap's statement also says whether the
/// owner has an enabled endpoint for `job.succeeded`; a winner with none
/// skips the endpoints' look-up (a round trip) and records no event, while
/// another owner's endpoint, or one for other events, does not count. Once
/// the endpoint subscribes, the next winner's event is recorded. SQLite,
/// with no round trips to save, looks up as before.
async fn a_winner_with_no_endpoint_for_it_looks_none_up(backend: TestBackend) {
    use crate::support::harness::PreparedApp;
    let receiver = WebhookReceiver::start().await;
    let log = onejob::store::statement_log::StatementLog::new();
    let app = PreparedApp::new(backend, webhook_config(|_| {}))
        .await
        .recording(&log)
        .await
        .start()
        .await;
    let only_failures = register(
        &app,
        &app.alice.token,
        json!({"url": receiver.url("/"), "events": ["job.failed"]}),
    )
    .await;
    assert_eq!(only_failures.status(), StatusCode::CREATED);
    let endpoint = only_failures.json::<Value>().await.unwrap()["webhook"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    register_ok(&app, &app.bob.token, &receiver.url("/")).await;
    let look_ups = |statements: &[String]| {
        statements
            .iter()
            .filter(|s| {
                s.contains("FROM \"webhook_endpoints\"") || s.contains("FROM `webhook_endpoints`")
            })
            .filter(|s| s.contains("LIKE"))
            .count()
    };
    let events_path = format!("/api/v1/webhooks/{endpoint}/events");
    let finish = |key: &'static str| {
        let app = &app;
        async move {
            let job_id = app.create_job(&app.alice.token, key, &summarize(key)).await;
            app.wait_for_status(&job_id, "succeeded", Duration::from_secs(10))
                .await;
            job_id
        }
    };

    log.take();
    finish("wh-none").await;
    let expected = match backend {
        TestBackend::Postgres => 0,
        TestBackend::Sqlite => 1,
    };
    assert_eq!(
        look_ups(&log.take()),
        expected,
        "endpoint look-ups for a winner"
    );
    assert_eq!(
        get_json(&app, &app.alice.token, &events_path).await["events"],
        json!([]),
        "no event for an endpoint that does not subscribe to it"
    );

    let patched = app
        .client
        .patch(app.url(&format!("/api/v1/webhooks/{endpoint}")))
        .bearer_auth(&app.alice.token)
        .json(&json!({"events": ["job.succeeded"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(patched.status(), StatusCode::OK);
    log.take();
    let job_id = finish("wh-some").await;
    assert_eq!(
        look_ups(&log.take()),
        1,
        "the look-up once an endpoint subscribes"
    );
    let events = get_json(&app, &app.alice.token, &events_path).await;
    let events = events["events"].as_array().unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["type"], "job.succeeded", "{events:?}");
    assert_eq!(events[0]["job_id"], job_id.as_str(), "{events:?}");
}

/// Bypassing the application: `fail_job` in a transaction that rolls back
/// leaves neither the failed status nor an outbox row; committed, both are
/// there. The database refuses a second row for the same occurrence.
async fn the_outbox_row_commits_and_rolls_back_with_the_state_change(backend: TestBackend) {
    let receiver = WebhookReceiver::start().await;
    let app = spawn_app_with(
        backend,
        webhook_config(|c| {
            c.worker.concurrency = 0;
            c.webhooks.settings.deliver = false;
        }),
    )
    .await;
    register_ok(&app, &app.alice.token, &receiver.url("/")).await;
    let job_id = app
        .create_job(&app.alice.token, "wh-tx", &summarize("rolled back"))
        .await;
    let key = JobKey {
        id: onejob::domain::JobId::parse(&job_id).unwrap(),
        owner_id: app.alice.id.clone(),
    };
    let count_rows = |job_id: &str| {
        format!("SELECT count(*) AS n FROM webhook_events WHERE job_id = '{job_id}'")
    };
    #[derive(QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let (inside, after_rollback, status_after_rollback) = {
        let (key, sql) = (key.clone(), count_rows(&job_id));
        app.with_conn(move |conn| {
            let mut inside = 0;
            let rolled: Result<(), diesel::result::Error> = conn.transaction(|conn| {
                let job = find_owned_job(conn, &key).unwrap().unwrap();
                assert!(
                    fail_job(conn, &job, "failed inside a rolled-back transaction", 1).unwrap()
                );
                inside = diesel::sql_query(&sql).get_result::<N>(conn).unwrap().n;
                Err(diesel::result::Error::RollbackTransaction)
            });
            assert!(rolled.is_err());
            let after = diesel::sql_query(&sql).get_result::<N>(conn).unwrap().n;
            let status = find_owned_job(conn, &key).unwrap().unwrap().status;
            (inside, after, status)
        })
        .await
    };
    assert_eq!(
        inside, 1,
        "the row is written in the state change's transaction"
    );
    assert_eq!(after_rollback, 0, "rolled back with it");
    assert_ne!(status_after_rollback, JobStatus::Failed);

    let (rows, status, duplicate) = {
        let (key, sql) = (key.clone(), count_rows(&job_id));
        app.with_conn(move |conn| {
            conn.transaction(|conn| {
                let job = find_owned_job(conn, &key).unwrap().unwrap();
                assert!(fail_job(conn, &job, "failed for good", 1).unwrap());
                Ok::<_, diesel::result::Error>(())
            })
            .unwrap();
            let rows = diesel::sql_query(&sql).get_result::<N>(conn).unwrap().n;
            let status = find_owned_job(conn, &key).unwrap().unwrap().status;
            // The same occurrence again, by raw SQL: refused by the database.
            let duplicate = diesel::sql_query(format!(
                "INSERT INTO webhook_events (id, owner_id, endpoint_id, job_id, kind, subject, \
                 webhook_id, body, state, attempts, next_attempt_at, window_start_at, created_at) \
                 SELECT '{id}', owner_id, endpoint_id, job_id, kind, subject, 'msg_dup', body, \
                 state, 0, 0, 0, 0 FROM webhook_events WHERE job_id = '{job}'",
                id = uuid::Uuid::now_v7(),
                job = key.id
            ))
            .execute(conn);
            (rows, status, duplicate)
        })
        .await
    };
    assert_eq!(rows, 1);
    assert_eq!(status, JobStatus::Failed);
    assert!(duplicate.is_err(), "one row per occurrence: {duplicate:?}");
    let events = app
        .with_conn(move |conn| outbox::events_of_job(conn, &key).unwrap())
        .await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, "job.failed");
    let body: Value = serde_json::from_str(&events[0].body).unwrap();
    assert_eq!(body["data"]["failure_reason"], "failed for good");
}

/// The outbox's SQL keeps the domain's rules: `record_event` writes a row
/// for exactly the endpoints `records_event` accepts, and `claim_due`
/// claims exactly the rows `may_claim_event` accepts.
async fn the_outbox_sql_agrees_with_the_domain_rules(backend: TestBackend) {
    let app = spawn_app_with(
        backend,
        webhook_config(|c| {
            c.worker.concurrency = 0;
            c.webhooks.settings.deliver = false;
        }),
    )
    .await;
    let job_id = app
        .create_job(&app.alice.token, "wh-agree", &summarize("agreement"))
        .await;
    let owner = app.alice.id.clone();
    let key = JobKey {
        id: onejob::domain::JobId::parse(&job_id).unwrap(),
        owner_id: owner.clone(),
    };
    app.with_conn(move |conn| {
        // Every combination of enabled and subscription.
        let mut expected: HashMap<String, bool> = HashMap::new();
        let mut disabled_endpoint = String::new();
        for enabled in [true, false] {
            for events in [
                vec![EventKind::JobFailed],
                vec![EventKind::JobSucceeded, EventKind::JobUnknown],
                vec![EventKind::JobFailed, EventKind::JobCancelled],
            ] {
                let id = uuid::Uuid::now_v7().to_string();
                let endpoint = outbox::create_endpoint(
                    conn,
                    &outbox::NewEndpoint {
                        id: id.clone(),
                        owner_id: owner.clone(),
                        url: "https://receiver.example/".into(),
                        events,
                        retry_for_ms: 60_000,
                        secret_fingerprint: "00000000".into(),
                    },
                    usize::MAX,
                    1,
                )
                .unwrap()
                .unwrap();
                if !enabled {
                    outbox::update_endpoint(
                        conn,
                        &endpoint.key(),
                        &outbox::EndpointChange {
                            enabled: Some(false),
                            ..Default::default()
                        },
                        1,
                    )
                    .unwrap();
                    disabled_endpoint = id.clone();
                }
                expected.insert(
                    id,
                    records_event(enabled, &endpoint.events, EventKind::JobFailed),
                );
            }
        }
        let written = outbox::record_event(conn, &key, EventKind::JobFailed, 5).unwrap();
        let rows = outbox::events_of_job(conn, &key).unwrap();
        assert_eq!(written, rows.len());
        for (id, wanted) in &expected {
            assert_eq!(
                rows.iter().any(|r| &r.endpoint_id == id),
                *wanted,
                "endpoint {id}"
            );
        }
        assert_eq!(expected.values().filter(|w| **w).count(), 2);
        // Recording the same occurrence again writes nothing.
        assert_eq!(
            outbox::record_event(conn, &key, EventKind::JobFailed, 6).unwrap(),
            0
        );

        // Claims: rows in every state, due or not, leased or not.
        let now: i64 = onejob::store::queue::db_clock_ms(conn).unwrap();
        let enabled_endpoint = rows[0].endpoint_id.clone();
        let mut cases: Vec<(String, bool)> = Vec::new();
        for (i, (state, next, lease)) in [
            (EventState::Pending, now - 1_000, None),
            (EventState::Pending, now + 60_000, None),
            (EventState::Pending, now - 1_000, Some(now + 60_000)),
            (EventState::Pending, now - 1_000, Some(now - 1)),
            (EventState::Delivered, now - 1_000, None),
            (EventState::Dead, now - 1_000, None),
        ]
        .into_iter()
        .enumerate()
        {
            let id = uuid::Uuid::now_v7().to_string();
            diesel::sql_query(format!(
                "INSERT INTO webhook_events (id, owner_id, endpoint_id, job_id, kind, subject, \
                 webhook_id, body, state, attempts, next_attempt_at, window_start_at, \
                 lease_owner, lease_expires_at, delivered_at, created_at) VALUES \
                 ('{id}', '{owner}', '{enabled_endpoint}', '{job}', 'job.unknown', 'case-{i}', \
                 'msg_case{i}', '{{}}', '{state}', 0, {next}, {now}, {lease_owner}, {lease}, \
                 {delivered}, {now})",
                job = key.id,
                lease_owner = if lease.is_some() { "'someone'" } else { "NULL" },
                lease = lease.map_or("NULL".to_owned(), |l| l.to_string()),
                delivered = if state == EventState::Delivered {
                    now.to_string()
                } else {
                    "NULL".into()
                },
            ))
            .execute(conn)
            .unwrap();
            cases.push((id, may_claim_event(state, next, lease, true, now)));
        }
        // A due row of a disabled endpoint is not claimed.
        let id = uuid::Uuid::now_v7().to_string();
        diesel::sql_query(format!(
            "INSERT INTO webhook_events (id, owner_id, endpoint_id, job_id, kind, subject, \
             webhook_id, body, state, attempts, next_attempt_at, window_start_at, created_at) \
             VALUES ('{id}', '{owner}', '{disabled_endpoint}', '{job}', 'job.unknown', 'off', \
             'msg_off', '{{}}', 'pending', 0, {due}, {now}, {now})",
            job = key.id,
            due = now - 1_000,
        ))
        .execute(conn)
        .unwrap();
        cases.push((
            id,
            may_claim_event(EventState::Pending, now - 1_000, None, false, now),
        ));
        // The earlier rows: pending and due, for enabled endpoints only.
        for row in &rows {
            cases.push((
                row.id.clone(),
                may_claim_event(EventState::Pending, row.next_attempt_at, None, true, now),
            ));
        }
        let claimed = outbox::claim_due(conn, "agreement", 60_000, 100).unwrap();
        for (id, wanted) in &cases {
            assert_eq!(
                claimed.iter().any(|c| &c.event.id == id),
                *wanted,
                "event {id}"
            );
        }
        assert_eq!(claimed.len(), cases.iter().filter(|c| c.1).count());
        // Claimed once: a second claim finds them leased.
        assert!(outbox::claim_due(conn, "other", 60_000, 100)
            .unwrap()
            .is_empty());
    })
    .await;
}

/// Real `onejob serve` processes: killed with SIGKILL and restarted, or
/// three at once on one PostgreSQL.
mod processes {
    use std::collections::HashMap;
    use std::time::Duration;

    use onejob::store::users as user_store;
    use onejob::store::Store;
    use reqwest::StatusCode;
    use serde_json::{json, Value};

    use crate::server_process::ServerProcess;
    use crate::support::harness::{
        postgres_available, summarize, TestBackend, TestDb, DEFAULT_TEST_PROVIDERS,
    };
    use crate::support::webhook_receiver::WebhookReceiver;

    fn config_file(dir: &std::path::Path, name: &str, deliver: bool) -> std::path::PathBuf {
        let toml = format!(
            r#"
[worker]
concurrency = 2
poll_interval_ms = 50
lease_ms = 20000

[webhooks]
signing_key_env = "ONEJOB_TEST_WEBHOOK_KEY"
allow_private_addresses = true
deliver = {deliver}
backoff_initial_ms = 100
backoff_max_ms = 400
poll_interval_ms = 50
timeout_ms = 2000
{DEFAULT_TEST_PROVIDERS}"#
        );
        let path = dir.join(name);
        std::fs::write(&path, toml).unwrap();
        path
    }

    async fn open(db: &TestDb) -> Store {
        db.open_store().await
    }

    async fn admin_token(store: &Store) -> String {
        let store = store.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = store.conn().unwrap();
            user_store::issue_token(&mut conn, "admin", None).unwrap().0
        })
        .await
        .unwrap()
    }

    async fn register(base: &str, token: &str, url: &str) {
        let response = reqwest::Client::new()
            .post(format!("{base}/api/v1/webhooks"))
            .bearer_auth(token)
            .json(&json!({"url": url, "events": ["job.succeeded"]}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
    }

    async fn create_job(base: &str, token: &str, key: &str) -> String {
        let response = reqwest::Client::new()
            .post(format!("{base}/api/v1/jobs"))
            .bearer_auth(token)
            .header("Idempotency-Key", key)
            .header("Prefer", "wait=10")
            .json(&summarize(key))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
        let job: Value = response.json().await.unwrap();
        assert_eq!(job["status"], "succeeded", "{job}");
        job["id"].as_str().unwrap().to_owned()
    }

    on_both_backends!(a_kill_9_before_or_during_delivery_still_delivers_after_restart);

    /// The job's state change commits; the first process delivers nothing
    /// (`deliver = false`) and is killed; the second claims the event, the
    /// receiver stalls, and it is killed mid-delivery; the third delivers
    /// once the lease runs out: the same `webhook-id`, one event, delivered.
    async fn a_kill_9_before_or_during_delivery_still_delivers_after_restart(backend: TestBackend) {
        let db = TestDb::create_empty(backend);
        let url = db.url.as_str().to_owned();
        let dir = tempfile::tempdir().unwrap();
        let receiver = WebhookReceiver::start().await;
        let holding = config_file(dir.path(), "holding.toml", false);
        let delivering = config_file(dir.path(), "delivering.toml", true);

        let mut first = ServerProcess::spawn(dir.path(), "first", &holding, &url);
        first.wait_ready().await;
        let store = open(&db).await;
        let token = admin_token(&store).await;
        register(&first.base, &token, &receiver.url("/hook")).await;
        let job_id = create_job(&first.base, &token, "killed-1").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            receiver.received().is_empty(),
            "the first process delivers nothing"
        );
        first.kill();
        first.wait_exit(Duration::from_secs(10)).await;

        receiver.stall_first(1);
        let mut second = ServerProcess::spawn(dir.path(), "second", &delivering, &url);
        second.wait_ready().await;
        let stalled = receiver.wait_for(1, Duration::from_secs(10)).await;
        second.kill();
        second.wait_exit(Duration::from_secs(10)).await;
        receiver.release();

        let mut third = ServerProcess::spawn(dir.path(), "third", &delivering, &url);
        third.wait_ready().await;
        let got = receiver.wait_for(2, Duration::from_secs(20)).await;
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        let got_now = receiver.received();
        assert_eq!(got_now.len(), 2, "{}", third.stderr());
        assert_eq!(got[1].webhook_id(), stalled[0].webhook_id());
        assert_eq!(got[1].body, stalled[0].body);
        assert_eq!(got[1].json()["data"]["id"], job_id.as_str());
        let events = {
            let store = store.clone();
            tokio::task::spawn_blocking(move || {
                use diesel::prelude::*;
                use onejob::store::schema::webhook_events;
                let mut conn = store.conn().unwrap();
                webhook_events::table
                    .select((webhook_events::state, webhook_events::attempts))
                    .load::<(String, i32)>(&mut conn)
                    .unwrap()
            })
            .await
            .unwrap()
        };
        assert_eq!(events, [("delivered".to_owned(), 2)]);
    }

    /// Three processes on one PostgreSQL, a healthy receiver: every event
    /// is delivered exactly once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn three_processes_deliver_each_event_once() {
        if !postgres_available() {
            return;
        }
        const JOBS: usize = 30;
        let db = TestDb::create_empty(TestBackend::Postgres);
        let url = db.url.as_str().to_owned();
        let dir = tempfile::tempdir().unwrap();
        let receiver = WebhookReceiver::start().await;
        let config = config_file(dir.path(), "config.toml", true);
        let mut servers: Vec<ServerProcess> = (0..3)
            .map(|i| ServerProcess::spawn(dir.path(), &format!("p{i}"), &config, &url))
            .collect();
        for server in &mut servers {
            server.wait_ready().await;
        }
        let store = open(&db).await;
        let token = admin_token(&store).await;
        register(&servers[0].base, &token, &receiver.url("/")).await;
        let mut jobs = Vec::new();
        for i in 0..JOBS {
            jobs.push(create_job(&servers[i % 3].base, &token, &format!("three-{i}")).await);
        }
        receiver.wait_for(JOBS, Duration::from_secs(30)).await;
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let got = receiver.received();
        let mut per_id: HashMap<String, usize> = HashMap::new();
        for r in &got {
            *per_id.entry(r.webhook_id().to_owned()).or_default() += 1;
        }
        assert_eq!(per_id.len(), JOBS, "one webhook-id per job");
        assert!(
            per_id.values().all(|n| *n == 1),
            "each delivered once: {per_id:?}"
        );
        let mut delivered: Vec<String> = got
            .iter()
            .map(|r| r.json()["data"]["id"].as_str().unwrap().to_owned())
            .collect();
        delivered.sort();
        jobs.sort();
        assert_eq!(delivered, jobs);
    }
}
