//! One owner cannot slow another's webhooks (docs/design.md, "Webhook
//! outbox", fairness): deliveries take turns between owners, each send
//! frees its slot when it ends, an owner holds at most
//! `webhooks.max_in_flight_per_owner` slots, and may register at most
//! `webhooks.max_endpoints_per_owner` endpoints.

use std::time::{Duration, Instant, SystemTime};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::harness::{
    assert_problem, record_figures, spawn_app_with, summarize, TestApp, TestBackend,
};
use crate::support::webhook_receiver::{SilentServer, WebhookReceiver};
use crate::webhooks::webhook_config;

/// The most a fair owner's delivery may take, from its event to its
/// arrival, while another owner's 48 endpoints hang: the poll interval
/// (100 ms) and a claim and a send, with a margin for a busy machine.
const FAIR_BOUND: Duration = Duration::from_millis(2_000);

async fn register(app: &TestApp, token: &str, url: &str) -> reqwest::Response {
    app.client
        .post(app.url("/api/v1/webhooks"))
        .bearer_auth(token)
        .json(&json!({"url": url, "events": ["job.succeeded"]}))
        .send()
        .await
        .unwrap()
}

/// How long after its event a delivery arrived.
fn latency(body: &Value, arrived: SystemTime) -> Duration {
    let at = chrono::DateTime::parse_from_rfc3339(body["timestamp"].as_str().unwrap()).unwrap();
    let at = SystemTime::UNIX_EPOCH + Duration::from_millis(at.timestamp_millis() as u64);
    arrived.duration_since(at).unwrap_or_default()
}

/// Bob registers 48 endpoints on a server that accepts and never answers,
/// and keeps finishing jobs (48 events each, retried every 200-400 ms);
/// Alice's one endpoint answers. Every one of Alice's deliveries arrives
/// within [`FAIR_BOUND`] of its event.
async fn a_hanging_owner_does_not_delay_anothers_deliveries(backend: TestBackend) {
    let config = webhook_config(|c| {
        let s = &mut c.webhooks.settings;
        s.timeout_ms = 3_000;
        s.poll_interval_ms = 100;
        s.backoff_initial_ms = 200;
        s.backoff_max_ms = 400;
        s.disable_after_failures = 10_000;
        s.max_endpoints_per_owner = 48;
    });
    let caps = config.webhooks.settings.caps();
    let app = spawn_app_with(backend, config).await;
    let silent = SilentServer::start().await;
    let receiver = WebhookReceiver::start().await;
    for n in 0..48 {
        let response = register(&app, &app.bob.token, &silent.url(&format!("/{n}"))).await;
        assert_eq!(response.status(), StatusCode::CREATED);
    }
    assert_eq!(
        register(&app, &app.alice.token, &receiver.url("/"))
            .await
            .status(),
        StatusCode::CREATED
    );
    let started = Instant::now();
    let flood = {
        let (client, url, token) = (
            app.client.clone(),
            app.url("/api/v1/jobs"),
            app.bob.token.clone(),
        );
        tokio::spawn(async move {
            for i in 0.. {
                let _ = client
                    .post(&url)
                    .bearer_auth(&token)
                    .header("Idempotency-Key", format!("flood-{i}"))
                    .json(&summarize("flood"))
                    .send()
                    .await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    // Let the flood fill Bob's slots first.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    const FAIR_JOBS: usize = 8;
    for i in 0..FAIR_JOBS {
        app.create_job(&app.alice.token, &format!("fair-{i}"), &summarize("fair"))
            .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let received = receiver.wait_for(FAIR_JOBS, Duration::from_secs(60)).await;
    flood.abort();
    let mut latencies: Vec<Duration> = received.iter().map(|r| latency(&r.json(), r.at)).collect();
    latencies.sort();
    let hanging = silent.accepted();
    let figures = format!(
        "webhook fairness ({backend:?}): {FAIR_JOBS} deliveries of a fair owner while another's 48 \
         hanging endpoints took {hanging} connections in {:.1} s (caps: {} slots, {} per owner, {} \
         per endpoint); fair latency p50 {} ms, max {} ms, bound {} ms",
        started.elapsed().as_secs_f64(),
        caps.total,
        caps.per_owner,
        caps.per_endpoint,
        latencies[latencies.len() / 2].as_millis(),
        latencies.last().unwrap().as_millis(),
        FAIR_BOUND.as_millis(),
    );
    eprintln!("{figures}");
    record_figures(&format!("webhook-fairness-{backend:?}"), &figures);
    assert!(
        hanging >= caps.per_owner,
        "the hanging owner held its slots: {hanging}"
    );
    assert!(
        *latencies.last().unwrap() <= FAIR_BOUND,
        "a fair owner's delivery waited: {figures}"
    );
}

/// An owner registers at most `max_endpoints_per_owner` endpoints (10 by
/// default), even when it asks twenty times at once; the refusal says so
/// and registers nothing; deleting one makes room for one.
async fn an_owner_registers_at_most_the_cap_of_endpoints(backend: TestBackend) {
    let app = spawn_app_with(backend, webhook_config(|_| {})).await;
    let receiver = WebhookReceiver::start().await;
    let answers = futures::future::join_all((0..20).map(|n| {
        let (app, url) = (&app, receiver.url(&format!("/{n}")));
        async move { register(app, &app.alice.token, &url).await }
    }))
    .await;
    let made: Vec<&reqwest::Response> = answers
        .iter()
        .filter(|r| r.status() == StatusCode::CREATED)
        .collect();
    assert_eq!(made.len(), 10, "exactly the cap, however many at once");
    let refused = answers
        .into_iter()
        .find(|r| r.status() != StatusCode::CREATED)
        .unwrap();
    let problem = assert_problem(refused, StatusCode::CONFLICT, "webhook-endpoint-limit").await;
    assert_eq!(problem["limit"], 10);
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("10 webhook endpoints"),
        "{problem}"
    );
    let listed: Value = app
        .get(&app.alice.token, "/api/v1/webhooks")
        .await
        .json()
        .await
        .unwrap();
    let endpoints = listed["webhooks"].as_array().unwrap();
    assert_eq!(endpoints.len(), 10);
    // Another owner has room of its own.
    assert_eq!(
        register(&app, &app.bob.token, &receiver.url("/bob"))
            .await
            .status(),
        StatusCode::CREATED
    );
    let one = endpoints[0]["id"].as_str().unwrap();
    let deleted = app
        .client
        .delete(app.url(&format!("/api/v1/webhooks/{one}")))
        .bearer_auth(&app.alice.token)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        register(&app, &app.alice.token, &receiver.url("/again"))
            .await
            .status(),
        StatusCode::CREATED
    );
}

on_both_backends!(
    a_hanging_owner_does_not_delay_anothers_deliveries,
    an_owner_registers_at_most_the_cap_of_endpoints,
);
