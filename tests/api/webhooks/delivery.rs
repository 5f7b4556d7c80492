//! What a receiver gets: a soft timeout's `job.unknown` and then the late
//! success, retries that keep their `webhook-id` and bytes, signatures that
//! verify by recomputing the HMAC, a rotation that signs with both secrets
//! during its overlap, redirects not followed, an endpoint disabled past the
//! failure threshold (and enabled again), and a resend with the same id and
//! body.

use std::time::Duration;

use diesel::RunQueryDsl;
use reqwest::StatusCode;
use serde_json::{json, Value};

use super::{get_json, register_ok, verifying, wait_until, webhook_config};
use crate::support::harness::{spawn_app_with, summarize, TestBackend};
use crate::support::webhook_receiver::WebhookReceiver;

/// A soft timeout makes the attempt unknown: one `job.unknown` event naming
/// it; its late answer then wins, and `job.succeeded` follows.
pub(super) async fn an_attempt_going_unknown_is_told_once_then_the_late_success(
    backend: TestBackend,
) {
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

pub(super) async fn a_receiver_failing_twice_gets_the_third_try_with_the_same_webhook_id(
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

pub(super) async fn redirects_are_not_followed(backend: TestBackend) {
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

pub(super) async fn a_rotated_secret_signs_with_both_during_the_overlap_then_only_the_new(
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

pub(super) async fn an_endpoint_past_the_failure_threshold_is_disabled_and_says_why(
    backend: TestBackend,
) {
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

pub(super) async fn resend_keeps_the_same_webhook_id_and_body(backend: TestBackend) {
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
