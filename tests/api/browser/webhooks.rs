//! Webhooks in the browser (docs/browser.md, "Webhooks"), in real headless
//! Chromium with a real receiver on 127.0.0.1: a user registers an
//! endpoint from the page under their menu and sees its secret once; a
//! job's page shows the delivery and its status; "Send again" sends the
//! same event, with the same `webhook-id`; an admin sees every owner's
//! endpoints; a job's page follows its deliveries as they are recorded.

use std::time::Duration;

use crate::support::harness::{spawn_app_with, summarize, TestBackend};
use crate::support::webdriver::{Browser, WAIT};
use crate::support::webhook_receiver::WebhookReceiver;
use crate::webhooks::{register_ok, webhook_config};

/// How long a delivery the receiver has may take to show as recorded.
const RECORDED: Duration = Duration::from_secs(20);

async fn a_user_registers_an_endpoint_sees_a_delivery_on_the_job_page_and_resends_it(
    backend: TestBackend,
) {
    let receiver = WebhookReceiver::start().await;
    let app = spawn_app_with(backend, webhook_config(|_| {})).await;
    app.set_password("alice", "alice-pw").await;
    app.set_password("ada", "ada-pw").await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    browser.sign_in(&app, "alice", "alice-pw").await;
    browser.goto(&app, "/jobs/new").await;
    browser.click_link("Webhooks").await;
    browser.wait_for_path(|p| p == "/webhooks").await;
    assert_eq!(browser.count("#no-endpoints").await, 1);

    // A URL the rules refuse is shown again with why, and stores nothing.
    browser
        .fill("input[name=url]", "ftp://example.com/hooks")
        .await;
    browser.click("#add-endpoint").await;
    let refusal = browser
        .wait_for_text("#webhook-error", |t| !t.is_empty())
        .await;
    assert!(refusal.contains("http"), "{refusal}");
    assert_eq!(browser.count(".endpoint-row").await, 0);

    let url = receiver.url("/hooks");
    browser.replace_text("input[name=url]", &url).await;
    browser.click("#add-endpoint").await;
    let secret = browser
        .wait_for_text("#webhook-secret", |t| t.starts_with("whsec_"))
        .await;
    // Shown once: neither the list nor the endpoint's page shows it again.
    browser.goto(&app, "/webhooks").await;
    assert_eq!(browser.count(".endpoint-row").await, 1);
    let listing: String = browser
        .eval("return document.documentElement.outerHTML")
        .await
        .as_str()
        .unwrap()
        .to_owned();
    assert!(!listing.contains(&secret), "the secret is not shown again");
    assert!(listing.contains(&url));

    let job_id = app
        .create_job(&app.alice.token, "hooked", &summarize("tell me when"))
        .await;
    app.wait_for_status(&job_id, "succeeded", WAIT).await;
    let first = receiver.wait_for(1, Duration::from_secs(20)).await;
    let webhook_id = first[0].webhook_id().to_owned();
    assert_eq!(first[0].json()["type"], "job.succeeded");

    // The receiver has the delivery; its state commits just after. The
    // page of a finished job does not refresh itself, so a page read before
    // that commit would never show it: the page is read again until it does.
    let job_path = format!("/jobs/{job_id}");
    let statuses = browser
        .reload_until(
            &app,
            &job_path,
            ".delivery-event[data-state=delivered] .delivery-status",
            RECORDED,
            Duration::from_millis(200),
            |statuses| statuses.first().is_some_and(|s| !s.is_empty()),
        )
        .await;
    assert!(
        statuses[0].starts_with('2'),
        "the receiver's own status: {statuses:?}"
    );
    assert_eq!(
        browser
            .attr_of(".delivery-event", "data-webhook-id")
            .await
            .as_deref(),
        Some(webhook_id.as_str())
    );
    browser
        .click_and_wait("button.resend", |p| p == job_path)
        .await;
    let both = receiver.wait_for(2, Duration::from_secs(20)).await;
    assert_eq!(both[1].webhook_id(), webhook_id, "a resend keeps the id");
    assert_eq!(both[1].body, both[0].body, "and the body");
    // The job page shows both tries once the second is recorded.
    browser
        .reload_until(
            &app,
            &job_path,
            "tr.delivery[data-outcome=delivered]",
            RECORDED,
            Duration::from_millis(200),
            |delivered| delivered.len() == 2,
        )
        .await;

    // The endpoint's page has the same log.
    browser.goto(&app, "/webhooks").await;
    browser
        .click_and_wait(".endpoint-link", |p| p.starts_with("/webhooks/"))
        .await;
    assert_eq!(browser.count("tr.delivery").await, 2);
    assert_eq!(browser.text_of("#endpoint-state").await, "enabled");

    // An admin sees every owner's endpoints.
    browser.sign_out().await;
    browser.sign_in(&app, "ada", "ada-pw").await;
    browser.goto(&app, "/admin/webhooks").await;
    assert_eq!(
        browser.count(".endpoint-row[data-owner=alice]").await,
        1,
        "alice's endpoint is on the admins' list"
    );
    browser.close().await;
}

/// A job's page, opened while its event's delivery is held by the
/// receiver, shows the delivery once it is recorded, in the same document
/// (no reload), then stops asking once nothing about it can change.
async fn a_job_page_follows_its_deliveries_without_a_reload(backend: TestBackend) {
    let receiver = WebhookReceiver::start().await;
    receiver.stall_first(1);
    let app = spawn_app_with(
        backend,
        webhook_config(|config| config.webhooks.settings.timeout_ms = 30_000),
    )
    .await;
    app.set_password("alice", "alice-pw").await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    register_ok(&app, &app.alice.token, &receiver.url("/hooks")).await;
    let job_id = app
        .create_job(&app.alice.token, "followed", &summarize("tell me live"))
        .await;
    app.wait_for_status(&job_id, "succeeded", WAIT).await;
    // The delivery has reached the receiver, which holds it unanswered.
    receiver.wait_for(1, Duration::from_secs(20)).await;

    browser.sign_in(&app, "alice", "alice-pw").await;
    browser.goto(&app, &format!("/jobs/{job_id}")).await;
    assert_eq!(
        browser.count(".delivery-event[data-state=pending]").await,
        1,
        "the event waits on its delivery"
    );
    assert_eq!(
        browser
            .attr_of("#job-webhooks", "data-settled")
            .await
            .as_deref(),
        Some("false")
    );
    let mark = browser.mark_document().await;
    receiver.release();
    let status = browser
        .wait_for_text(
            "tr.delivery[data-outcome=delivered] .delivery-status",
            |t| !t.is_empty(),
        )
        .await;
    assert!(
        status.starts_with('2'),
        "the receiver's own status: {status}"
    );
    assert_eq!(
        browser.eval("return window.__onejob_marker").await,
        serde_json::json!(mark),
        "the same document: the section refreshed itself"
    );
    browser
        .wait_for_text("#job-webhooks .delivery-event", |_| true)
        .await;
    assert_eq!(
        browser
            .attr_of("#job-webhooks", "data-settled")
            .await
            .as_deref(),
        Some("true"),
        "nothing left to follow: the section stops asking"
    );
    browser.close().await;
}

on_both_backends!(
    a_user_registers_an_endpoint_sees_a_delivery_on_the_job_page_and_resends_it,
    a_job_page_follows_its_deliveries_without_a_reload,
);
