//! Completion webhooks from the durable outbox (docs/design.md, "Webhook
//! outbox"), end to end over real HTTP: a receiver started by the test
//! records what each delivery carried. By what they test:
//!
//! - [`endpoints`]: registering and managing endpoints, owner-scoped, the
//!   secret shown once, the URL's rules (its length, loopback);
//! - [`delivery`]: what a receiver gets: retries keep their `webhook-id`,
//!   signatures verify by recomputing the HMAC, a rotation signs with both
//!   secrets during its overlap, redirects are not followed, a failing
//!   endpoint is disabled, a resend keeps the id and body;
//! - [`outbox`]: underneath, the outbox row commits and rolls back with the
//!   job's state change, and the SQL agrees with the domain's rules;
//! - [`processes`]: real `onejob serve` processes, killed and restarted, or
//!   three at once on one PostgreSQL.
//!
//! The scenarios of the first three are listed here, so that each keeps its
//! name, `webhooks::<backend>::<name>`. Here too are what they share: the
//! test configuration ([`webhook_config`], also used by the browser's and
//! the fairness tests), registering an endpoint, reading an answer and
//! recomputing a signature.

use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use onejob::config::Config;
use onejob::domain::webhook::{base64_decode, base64_encode, WebhookKey};
use onejob::domain::Secret;
use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::Sha256;

use crate::support::harness::{test_config, TestApp, DEFAULT_TEST_PROVIDERS};
use crate::support::webhook_receiver::Received;

mod delivery;
mod endpoints;
mod outbox;
mod processes;

use delivery::*;
use endpoints::*;
use outbox::*;

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
pub(crate) async fn register_ok(app: &TestApp, token: &str, url: &str) -> (String, String) {
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
    // endpoints
    endpoints_are_owner_scoped_and_the_secret_is_shown_once,
    a_url_over_the_schemas_length_is_refused_even_in_its_fragment,
    a_loopback_url_is_refused_unless_allowed,
    // delivery
    an_attempt_going_unknown_is_told_once_then_the_late_success,
    a_receiver_failing_twice_gets_the_third_try_with_the_same_webhook_id,
    redirects_are_not_followed,
    a_rotated_secret_signs_with_both_during_the_overlap_then_only_the_new,
    an_endpoint_past_the_failure_threshold_is_disabled_and_says_why,
    resend_keeps_the_same_webhook_id_and_body,
    // outbox
    a_winner_with_no_endpoint_for_it_looks_none_up,
    the_outbox_row_commits_and_rolls_back_with_the_state_change,
    the_outbox_sql_agrees_with_the_domain_rules,
);
