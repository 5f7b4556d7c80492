//! The job page's forms, in the section that replaces itself every second
//! while the job is open.

use std::time::Instant;

use reqwest::StatusCode;

use crate::support::harness::{
    spawn_app_with, summarize, test_config, FormClient, TestApp, TestBackend,
};
use crate::support::webdriver::{is_job_path, Browser, WAIT};

/// Marks the job page's live section, then waits until its refresh has
/// replaced it with a fresh copy.
async fn wait_for_a_refresh(browser: &Browser) {
    let marked = browser
        .eval(
            "const section = document.querySelector('#job-live');
             section.dataset.testMark = 'before';
             return section.dataset.testMark;",
        )
        .await;
    assert_eq!(marked, "before", "the live section could not be marked");
    let deadline = Instant::now() + WAIT;
    loop {
        let fresh = browser
            .eval(
                "const section = document.querySelector('#job-live');
                 return !!section && section.dataset.testMark !== 'before';",
            )
            .await;
        if fresh == true {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the live section was not refreshed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// alice's job whose only attempt went unknown and support (sue, whose
/// password is `sue-pw`) abandoned: open, with no live attempt, so its page
/// offers a new attempt and marking it failed, and still refreshes itself.
async fn an_open_job_waiting_for_support(app: &TestApp) -> String {
    app.set_password("sue", "sue-pw").await;
    let job_id = app
        .create_job(&app.alice.token, "typed-reason", &summarize("x"))
        .await;
    let job = app.wait_for_status(&job_id, "unknown", WAIT).await;
    let attempt = job["attempts"][0]["id"].as_str().unwrap().to_owned();
    let sue = FormClient::new(app);
    let csrf = sue.sign_in("sue", "sue-pw").await;
    let response = sue
        .abandon_attempt(&csrf, &attempt, "provider outage")
        .await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    job_id
}

/// onejob with [`an_open_job_waiting_for_support`], and the browser that
/// `start` starts, signed in as sue on that job's page; `None` where no
/// browser could start (skipped loudly outside CI).
async fn sue_on_an_open_jobs_page(
    backend: TestBackend,
    start: impl std::future::Future<Output = Option<Browser>>,
) -> Option<(TestApp, String, Browser)> {
    let app = spawn_app_with(backend, test_config(crate::attempts::HANGING_PRIMARY)).await;
    let job_id = an_open_job_waiting_for_support(&app).await;
    let browser = start.await?;
    browser.sign_in(&app, "sue", "sue-pw").await;
    browser.goto(&app, &format!("/jobs/{job_id}")).await;
    Some((app, job_id, browser))
}

/// The reason stored for `job_id`'s failure.
async fn failure_reason(app: &TestApp, job_id: &str) -> String {
    let job = app.get_job(&app.alice.token, job_id).await;
    assert_eq!(job["status"], "failed", "{job}");
    job["failure_reason"].as_str().unwrap().to_owned()
}

/// Support chooses a provider and types a reason on an open job's page; the
/// page refreshes itself meanwhile, and neither is lost: the reason that
/// support then submits is the one stored.
async fn what_support_types_on_a_job_page_survives_its_refresh(backend: TestBackend) {
    let Some((app, job_id, browser)) = sue_on_an_open_jobs_page(backend, Browser::start()).await
    else {
        return;
    };
    assert_eq!(
        browser.attr_of("#job-live", "hx-trigger").await.as_deref(),
        Some("every 1s"),
        "the page of an open job refreshes itself"
    );
    let provider = format!("form[action='/jobs/{job_id}/attempts'] select[name=provider]");
    let reason = format!("form[action='/jobs/{job_id}/fail'] input[name=reason]");
    browser.select(&provider, "sim-fast").await;
    browser.fill(&reason, "the customer gave up").await;
    wait_for_a_refresh(&browser).await;
    wait_for_a_refresh(&browser).await;
    assert_eq!(browser.value_of(&provider).await, "sim-fast");
    assert_eq!(browser.value_of(&reason).await, "the customer gave up");

    let landed = browser.click_and_wait("#mark-failed", is_job_path).await;
    assert_eq!(landed, format!("/jobs/{job_id}"));
    assert_eq!(browser.text_of("#job-status").await, "failed");
    let reason = failure_reason(&app, &job_id).await;
    assert!(
        reason.contains("the customer gave up"),
        "the reason typed before the refreshes is the one stored: {reason}"
    );
    browser.close().await;
}

/// Without JavaScript, the page of an open job reloads itself, but not
/// while it waits for support to type a reason: what was typed stays, and
/// the page says how to refresh it by hand.
async fn without_javascript_the_page_does_not_reload_what_support_types_away(backend: TestBackend) {
    let Some((app, job_id, browser)) =
        sue_on_an_open_jobs_page(backend, Browser::start_without_javascript()).await
    else {
        return;
    };
    assert_eq!(browser.count("#refresh-by-hand").await, 1);
    let reason = format!("form[action='/jobs/{job_id}/fail'] input[name=reason]");
    browser.fill(&reason, "typed without scripts").await;
    // Longer than the reload of a page that reloads itself (2 s).
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    assert_eq!(browser.value_of(&reason).await, "typed without scripts");
    let landed = browser.click_and_wait("#mark-failed", is_job_path).await;
    assert_eq!(landed, format!("/jobs/{job_id}"));
    let stored = failure_reason(&app, &job_id).await;
    assert!(stored.contains("typed without scripts"), "{stored}");
    browser.close().await;
}

on_both_backends!(
    what_support_types_on_a_job_page_survives_its_refresh,
    without_javascript_the_page_does_not_reload_what_support_types_away,
);
