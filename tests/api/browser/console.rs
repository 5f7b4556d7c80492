//! The support console: the Unknown queue, the race log, and the console
//! refused to a user without the role.

use fantoccini::Locator;

use serde_json::{json, Value};

use super::*;
use crate::support::db::*;
use crate::support::fake_provider::{
    answer, config_of, strict_task_toml, Behaviour, FakeProvider, Shape,
};
use crate::support::harness::{spawn_app, spawn_app_with, summarize, test_config, TestBackend};
use crate::support::webdriver::{Browser, WAIT};

async fn support_abandons_an_unknown_attempt_from_the_queue_and_starts_the_next_one(
    backend: TestBackend,
) {
    let app = spawn_app_with(backend, test_config(crate::attempts::HANGING_PRIMARY)).await;
    app.set_password("sue", "sue-pw").await;
    let job_id = app
        .create_job(&app.alice.token, "stuck", &summarize("will hang"))
        .await;
    app.wait_for_status(&job_id, "unknown", WAIT).await;
    let first = attempt_rows(&app, &job_id).await.remove(0);
    assert_eq!(
        (first.provider.as_str(), first.state.as_str()),
        ("sim-hang", "unknown")
    );
    let Some(browser) = Browser::start().await else {
        return;
    };
    browser.sign_in(&app, "sue", "sue-pw").await;
    browser.goto(&app, "/admin").await;
    browser.wait_for_text("#unknown-now", |t| t == "1").await;
    browser.goto(&app, "/admin/unknown").await;
    assert_eq!(browser.count(".unknown-row").await, 1);
    browser
        .fill(
            ".unknown-row input[name=reason]",
            "provider status page shows an outage",
        )
        .await;
    browser.click(".unknown-row button").await;
    browser
        .wait_for_path(|p| p == format!("/jobs/{job_id}"))
        .await;
    let abandoned = attempt_rows(&app, &job_id).await;
    assert_eq!(
        summary(&abandoned),
        vec![(1, "sim-hang", "abandoned", None)],
        "abandoned, and nothing started yet"
    );
    browser
        .client
        .find(Locator::Css("select[name=provider]"))
        .await
        .unwrap()
        .select_by_value("sim-fast")
        .await
        .unwrap();
    browser.click("#new-attempt").await;
    browser
        .wait_for_text("#job-status", |s| s == "succeeded")
        .await;
    assert_eq!(
        browser.count("tr.attempt").await,
        2,
        "the job page shows both attempts"
    );
    assert_eq!(browser.count("tr.attempt[data-state=abandoned]").await, 1);
    let entries = app
        .with_conn(|conn| onejob::store::console::audit_entries(conn, 10).unwrap())
        .await;
    let actions: Vec<_> = entries.iter().map(|e| e.action.as_str()).collect();
    assert_eq!(
        actions,
        vec!["start_attempt", "abandon_attempt"],
        "both actions are audited"
    );

    // The rows: the first attempt abandoned, the second (on the provider sue
    // chose) won, and both actions audited as sue's, on this job.
    let attempts = attempt_rows(&app, &job_id).await;
    assert_eq!(
        summary(&attempts),
        vec![
            (1, "sim-hang", "abandoned", None),
            (2, "sim-fast", "succeeded", Some("won")),
        ]
    );
    let jobs = job_rows(&app, &app.alice.id).await;
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0].status, "succeeded");
    assert_eq!(
        jobs[0].completed_by.as_deref(),
        Some(attempts[1].id.as_str())
    );
    let audit = audit_rows(&app).await;
    assert_eq!(audit.len(), 2, "{audit:?}");
    let (abandon, start) = (&audit[0], &audit[1]);
    assert_eq!(abandon.action, "abandon_attempt");
    assert_eq!(abandon.attempt_id.as_deref(), Some(first.id.as_str()));
    assert_eq!(abandon.reason, "provider status page shows an outage");
    assert_eq!(start.action, "start_attempt");
    assert_eq!(start.attempt_id.as_deref(), Some(attempts[1].id.as_str()));
    assert_eq!(start.reason, "started attempt 2 on sim-fast");
    for row in &audit {
        assert_eq!(row.actor_id, app.sue.id.as_str(), "{row:?}");
        assert_eq!(row.job_id.as_deref(), Some(job_id.as_str()), "{row:?}");
    }
    browser.close().await;
}

async fn the_race_log_shows_a_reverse_order_finish_and_links_to_the_job(backend: TestBackend) {
    // Two fake providers that hold every call until the test releases it:
    // the test, not the clock, orders the race.
    let primary = FakeProvider::start(Shape::OpenAi).await;
    let fallback = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        // The primary's soft timeout makes its held call unknown; the
        // fallback's is long, so its call stays running until released.
        held_provider_toml("primary", &primary.base_url, 1000),
        held_provider_toml("fallback", &fallback.base_url, 600_000),
        strict_task_toml(
            "summarize",
            &["primary", "fallback"],
            "Summarize: {{ text }}",
        ),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    app.set_password("ada", "ada-pw").await;
    // A new attempt may go to the fallback only once it is qualified (the
    // check calls it, so it answers before the holding starts).
    assert!(app
        .app
        .qualify(None, "fallback", "summarize")
        .await
        .unwrap()
        .passed());
    primary.set_default(Behaviour::Hold);
    fallback.set_default(Behaviour::Hold);

    let mut body = summarize("race");
    body["provider"] = "primary".into();
    let job_id = app.create_job(&app.alice.token, "race", &body).await;
    // The primary holds the call past its soft timeout: unknown.
    let job = app.wait_for_status(&job_id, "unknown", WAIT).await;
    let first = job["attempts"][0]["id"].as_str().unwrap().to_owned();
    primary.wait_held(&first).await;
    assert_eq!(
        summary(&attempt_rows(&app, &job_id).await),
        vec![(1, "primary", "unknown", None)]
    );

    // Support abandons it and the next attempt goes to the fallback, which
    // answers: the job succeeds while the primary still holds its answer.
    assert_eq!(
        app.abandon(&app.sue.token, &first, "fall back")
            .await
            .status(),
        200
    );
    let response = app.start_attempt(&app.alice.token, &job_id, None).await;
    assert_eq!(response.status(), 201);
    let second: Value = response.json().await.unwrap();
    assert_eq!(second["provider"], "fallback");
    let second = second["id"].as_str().unwrap().to_owned();
    fallback.wait_held(&second).await;
    fallback.release(&second, answer("from the fallback"));
    app.wait_for_status(&job_id, "succeeded", WAIT).await;
    assert_eq!(
        summary(&attempt_rows(&app, &job_id).await),
        vec![
            (1, "primary", "abandoned", None),
            (2, "fallback", "succeeded", Some("won")),
        ]
    );

    // Then the primary's answer arrives: it loses, and is race-logged.
    primary.release(&first, answer("too late"));
    app.wait_for_job(&job_id, WAIT, |j| j["attempts"][0]["outcome"] == "lost")
        .await;
    let attempts = wait_for_attempts(&app, &job_id, |rows| {
        rows.first().and_then(|a| a.outcome.as_deref()) == Some("lost")
    })
    .await;
    assert_eq!(
        summary(&attempts),
        vec![
            (1, "primary", "succeeded", Some("lost")),
            (2, "fallback", "succeeded", Some("won")),
        ]
    );
    let jobs = job_rows(&app, &app.alice.id).await;
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0].status, "succeeded");
    assert_eq!(jobs[0].completed_by.as_deref(), Some(second.as_str()));
    assert_eq!(
        jobs[0].result(),
        Some(json!({"summary": "from the fallback"})),
        "the loser's answer is discarded, not merged"
    );
    let races = race_rows(&app, &job_id).await;
    assert_eq!(races.len(), 1, "{races:?}");
    assert_eq!(races[0].losing_attempt_id, first);
    assert_eq!(
        races[0].winning_attempt_id.as_deref(),
        Some(second.as_str())
    );
    assert_eq!(races[0].provider, "primary");
    assert_eq!((races[0].version_read, races[0].version_found), (0, 1));
    assert_eq!(
        races[0].payload_sha256,
        onejob::domain::sha256_hex(br#"{"summary":"too late"}"#)
    );
    let audit = audit_rows(&app).await;
    let abandon = audit
        .iter()
        .find(|row| row.action == "abandon_attempt")
        .unwrap_or_else(|| panic!("no abandon in the audit log: {audit:?}"));
    assert_eq!(abandon.attempt_id.as_deref(), Some(first.as_str()));
    assert_eq!(abandon.reason, "fall back");

    let Some(browser) = Browser::start().await else {
        return;
    };
    browser.sign_in(&app, "ada", "ada-pw").await;
    browser.goto(&app, "/admin/races").await;
    assert_eq!(browser.count(".race-row").await, 1);
    let row = browser
        .client
        .find(Locator::Css(".race-row"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        row.contains("#2 fallback") && row.contains("#1 primary"),
        "winner and loser: {row}"
    );
    if backend == TestBackend::Sqlite {
        browser.screenshots("race-log").await;
    }
    browser.click(".race-row a.job-link").await;
    browser
        .wait_for_path(|p| p == format!("/jobs/{job_id}"))
        .await;
    assert_eq!(browser.count("svg rect.bar.won").await, 1);
    assert_eq!(browser.count("svg rect.bar.lost").await, 1);
    if backend == TestBackend::Sqlite {
        browser.screenshots("job-with-race").await;
        browser.goto(&app, "/admin/providers").await;
        assert_eq!(browser.count("tr.qualification").await, 2);
        browser.screenshots("providers").await;
    }
    browser.close().await;
}

async fn a_user_without_the_role_cannot_open_the_console(backend: TestBackend) {
    let app = spawn_app(backend).await;
    app.set_password("bob", "bob-pw").await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    browser.sign_in(&app, "bob", "bob-pw").await;
    assert_eq!(
        browser.count("a[href='/admin']").await,
        0,
        "no console link for a user"
    );
    for path in ["/admin", "/admin/unknown", "/admin/races"] {
        browser.goto(&app, path).await;
        let title = browser.wait_for_text("h1", |t| !t.is_empty()).await;
        assert_eq!(title, "Not allowed", "{path}");
    }
    browser.close().await;
}

on_both_backends!(
    support_abandons_an_unknown_attempt_from_the_queue_and_starts_the_next_one,
    the_race_log_shows_a_reverse_order_finish_and_links_to_the_job,
    a_user_without_the_role_cannot_open_the_console,
);
