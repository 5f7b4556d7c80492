//! The Submit form: a real double click (with htmx, with htmx's boost
//! turned off, with JavaScript off), changed content under the same key,
//! and Back and submit again (with JavaScript on and off).

use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::*;
use crate::support::db::*;
use crate::support::devtools::DevTools;
use crate::support::fake_provider::{answer, FakeProvider};
use crate::support::harness::{spawn_app, TestApp, TestBackend};
use crate::support::metrics::*;
use crate::support::proxy::{HoldingProxy, ProxiedRequest};
use crate::support::webdriver::{is_job_path, Browser, SentRequest, WAIT};

async fn a_real_double_click_on_submit_makes_one_job_and_lands_on_it(backend: TestBackend) {
    let app = spawn_app(backend).await;
    app.set_password("alice", "alice-pw").await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    browser.sign_in(&app, "alice", "alice-pw").await;
    browser.goto(&app, "/jobs/new").await;
    browser
        .fill("textarea[name='input.text']", "Summarize this, once.")
        .await;
    if backend == TestBackend::Sqlite {
        browser.screenshots("submit").await;
    }
    let key = browser.value_of("input[name=idempotency_key]").await;
    let csrf = browser.value_of("#submit-form input[name=csrf]").await;
    browser.double_click("#submit-button").await;
    let landed = browser.wait_for_path(is_job_path).await;
    assert_eq!(
        app.job_count(&app.alice.id).await,
        1,
        "a double click made one job"
    );

    // The same form submitted again (a reload that re-POSTs): the same job,
    // shown by a freshly loaded page.
    let mark = browser.mark_document().await;
    browser
        .post_natively(
            "/jobs",
            &[
                ("csrf", &csrf),
                ("idempotency_key", &key),
                ("task", "summarize"),
                ("provider", ""),
                ("input.text", "Summarize this, once."),
            ],
        )
        .await;
    assert_eq!(
        browser.wait_for_fresh_page(&mark, is_job_path).await,
        landed,
        "lands on the same job"
    );
    assert_eq!(app.job_count(&app.alice.id).await, 1, "still one job");
    browser
        .wait_for_text("#job-status", |s| s == "succeeded")
        .await;

    // The one job row is the form's key's, and it was sent once.
    let rows = job_rows(&app, &app.alice.id).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let job = &rows[0];
    assert_eq!(landed, format!("/jobs/{}", job.id));
    assert_eq!(job.idempotency_key, key);
    assert_eq!(job.status, "succeeded");
    assert_eq!(job.input(), json!({"text": "Summarize this, once."}));
    let attempts = attempt_rows(&app, &job.id).await;
    assert_eq!(
        summary(&attempts),
        vec![(1, "sim-fast", "succeeded", Some("won"))],
        "one attempt, sent once"
    );
    assert_eq!(job.completed_by.as_deref(), Some(attempts[0].id.as_str()));
    browser.close().await;
}

/// Double-clicks the element matching `css` with real input events (mouse
/// presses and releases sent to Chromium's input pipeline; the second press
/// carries `clickCount: 2`), the second click landing while the first click's
/// submission is in flight: the app has answered it, but the proxy holds the
/// answer, so the browser still shows the form. (Clicks a few milliseconds
/// apart, before the first submission has started, are folded into one
/// navigation by Chromium itself: then the server is never asked twice.)
///
/// The clicks go over the DevTools protocol straight to the page, because
/// chromedriver answers no command while a navigation is under way.
async fn double_click_while_the_first_submission_is_in_flight(
    browser: &Browser,
    proxy: &HoldingProxy,
    css: &str,
) {
    let centre = browser
        .client
        .execute(
            "const element = document.querySelector(arguments[0]);
             element.scrollIntoView({block: 'center'});
             const r = element.getBoundingClientRect();
             return [r.left + r.width / 2, r.top + r.height / 2];",
            vec![json!(css)],
        )
        .await
        .unwrap();
    let (x, y) = (centre[0].as_f64().unwrap(), centre[1].as_f64().unwrap());
    let page = browser.client.current_url().await.unwrap().to_string();
    let mut devtools = DevTools::connect(browser, &page).await;
    proxy.hold_next_form_post();
    devtools.click(x, y, 1).await;
    // The first submission reached the app and was answered; the answer is
    // held, so the form is still on screen.
    proxy.wait_held().await;
    devtools.click(x, y, 2).await;
}

/// A double click on the submit form that only the server can keep to one
/// job: both clicks leave the browser as native form submissions (Chromium's
/// own log of what it sent, and the proxy's of what reached the app), the
/// server answers both (its metrics), and one job with one provider call is
/// stored (its rows). Returns the job's id.
async fn assert_a_double_click_reached_the_server_twice_and_made_one_job(
    app: &TestApp,
    browser: &Browser,
    proxy: &HoldingProxy,
    fake: &FakeProvider,
    text: &str,
) -> String {
    let key = browser.value_of("input[name=idempotency_key]").await;
    browser.fill("textarea[name='input.text']", text).await;
    let served_before = form_posts_served(app).await;
    let _ = browser.sent_requests().await;

    let mark = browser.mark_document().await;
    double_click_while_the_first_submission_is_in_flight(browser, proxy, "#submit-button").await;
    let landed = browser.wait_for_fresh_page(&mark, is_job_path).await;
    // The second submission's answer brought the job page; the first's was
    // held all along.
    assert_eq!(proxy.held_count(), 1);
    proxy.release();

    // What the browser sent: two POSTs of the form, both page navigations
    // (native submissions), neither from a script.
    let posts: Vec<SentRequest> = browser
        .sent_requests()
        .await
        .into_iter()
        .filter(|r| r.method == "POST" && r.path == "/jobs")
        .collect();
    assert!(posts.len() >= 2, "the double click sent {posts:#?}");
    for post in &posts {
        assert_eq!(post.kind, "Document", "a native submission: {post:#?}");
        assert!(!post.has_header("HX-Request"), "not htmx: {post:#?}");
        if let Some(body) = &post.post_data {
            assert!(body.contains(&key), "the form's key is sent: {body}");
        }
        assert_eq!(
            post.query.as_deref(),
            Some(format!("idempotency_key={key}").as_str()),
            "the key is in the address too, for a load balancer: {post:#?}"
        );
    }
    // What reached the app, and how it answered: both, with the job.
    let reached: Vec<ProxiedRequest> = proxy
        .passed()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path == "/jobs")
        .collect();
    assert!(reached.len() >= 2, "{reached:?}");
    for post in &reached {
        assert!(!post.from_htmx, "not htmx: {post:?}");
        assert_eq!(post.status, 303, "redirected to the job: {post:?}");
    }
    // What the server counted.
    let served = form_posts_served(app).await - served_before;
    assert!(
        served >= 2,
        "the server answered {served} POST /jobs for a double click (the browser sent {})",
        posts.len()
    );
    let exposition = metrics(app).await;
    assert_eq!(
        metric_sum(&exposition, "onejob_jobs_created_total", &[]),
        1.0,
        "one job created"
    );
    assert!(
        metric_sum(&exposition, "onejob_jobs_replayed_total", &[]) >= 1.0,
        "the second POST was answered with the first's job"
    );

    // What is stored: one job, under the form's key, with one attempt, sent
    // to the provider once.
    assert_eq!(app.job_count(&app.alice.id).await, 1, "one job");
    let rows = job_rows(app, &app.alice.id).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let job = &rows[0];
    assert_eq!(landed, format!("/jobs/{}", job.id), "lands on the job");
    assert_eq!(job.idempotency_key, key);
    assert_eq!(job.input(), json!({ "text": text }));
    let attempts = attempt_rows(app, &job.id).await;
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    fake.wait_held(&attempts[0].id).await;
    assert_eq!(fake.total_requests(), 1, "the provider was called once");
    job.id.clone()
}

/// Releases the held call and waits for the page and the rows to show the
/// job succeeded.
async fn release_and_see_the_job_succeed(
    app: &TestApp,
    browser: &Browser,
    fake: &FakeProvider,
    job_id: &str,
) {
    let attempt = attempt_rows(app, job_id).await.remove(0);
    fake.release(&attempt.id, answer("summarized once"));
    browser
        .wait_for_text("#job-status", |s| s == "succeeded")
        .await;
    let rows = job_rows(app, &app.alice.id).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].status, "succeeded");
    assert_eq!(
        rows[0].result(),
        Some(json!({"summary": "summarized once"}))
    );
    assert_eq!(rows[0].completed_by.as_deref(), Some(attempt.id.as_str()));
    assert_eq!(
        summary(&attempt_rows(app, job_id).await),
        vec![(1, "held", "succeeded", Some("won"))]
    );
    assert_eq!(fake.total_requests(), 1, "still one provider call");
}

/// `browser`, signed in as alice through `proxy`, on the new-job form.
async fn on_the_form_through(
    app: &TestApp,
    proxy: &HoldingProxy,
    browser: Option<Browser>,
) -> Option<Browser> {
    let mut browser = browser?;
    app.set_password("alice", "alice-pw").await;
    browser.origin = Some(proxy.origin.clone());
    browser.sign_in(app, "alice", "alice-pw").await;
    browser.goto(app, "/jobs/new").await;
    Some(browser)
}

async fn a_double_click_with_htmx_boost_off_sends_two_native_posts_and_makes_one_job(
    backend: TestBackend,
) {
    let (app, fake) = app_with_a_held_provider(backend).await;
    let proxy = HoldingProxy::start(&app).await;
    let Some(browser) = on_the_form_through(&app, &proxy, Browser::start().await).await else {
        return;
    };
    // htmx runs on this page; the form is boosted through <body hx-boost>.
    // Turn the boost off and let htmx process the page again, which unbinds
    // the form's boosted submit handler.
    let boost = browser
        .eval(
            "if (typeof htmx !== 'object') return 'htmx is not loaded';
             const form = document.getElementById('submit-form');
             if (form.closest('[hx-boost]').getAttribute('hx-boost') !== 'true') return 'not boosted';
             document.body.setAttribute('hx-boost', 'false');
             form.setAttribute('hx-boost', 'false');
             htmx.process(document.body);
             return form.closest('[hx-boost]').getAttribute('hx-boost');",
        )
        .await;
    assert_eq!(boost, json!("false"), "htmx boost turned off");

    let job_id = assert_a_double_click_reached_the_server_twice_and_made_one_job(
        &app,
        &browser,
        &proxy,
        &fake,
        "Summarize this, once, without the boost.",
    )
    .await;
    // Scripts run in this browser: the job page's <noscript> is inert text,
    // and htmx polls the live page.
    assert_eq!(browser.eval("return typeof htmx;").await, json!("object"));
    assert_eq!(browser.count("noscript meta[http-equiv=refresh]").await, 0);
    release_and_see_the_job_succeed(&app, &browser, &fake, &job_id).await;
    browser.close().await;
}

async fn a_double_click_with_javascript_off_sends_two_posts_and_makes_one_job(
    backend: TestBackend,
) {
    let (app, fake) = app_with_a_held_provider(backend).await;
    let proxy = HoldingProxy::start(&app).await;
    let Some(browser) =
        on_the_form_through(&app, &proxy, Browser::start_without_javascript().await).await
    else {
        return;
    };
    // The page loads htmx, but its scripts do not run (WebDriver's own
    // scripts still do).
    assert_eq!(browser.count("script[src*=htmx]").await, 1);
    assert_eq!(
        browser.eval("return typeof htmx;").await,
        json!("undefined")
    );

    let job_id = assert_a_double_click_reached_the_server_twice_and_made_one_job(
        &app,
        &browser,
        &proxy,
        &fake,
        "Summarize this, once, without JavaScript.",
    )
    .await;
    // Scripting is off: the live job page's <noscript> is parsed, and its
    // refresh is what brings the result.
    assert_eq!(browser.count("noscript meta[http-equiv=refresh]").await, 1);
    assert_eq!(
        browser.eval("return typeof htmx;").await,
        json!("undefined")
    );
    release_and_see_the_job_succeed(&app, &browser, &fake, &job_id).await;
    browser.close().await;
}

async fn changed_content_under_the_same_key_explains_itself_and_makes_no_second_job(
    backend: TestBackend,
) {
    let app = spawn_app(backend).await;
    app.set_password("alice", "alice-pw").await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    browser.sign_in(&app, "alice", "alice-pw").await;
    browser.goto(&app, "/jobs/new").await;
    let key = browser.value_of("input[name=idempotency_key]").await;
    let csrf = browser.value_of("#submit-form input[name=csrf]").await;
    browser
        .fill("textarea[name='input.text']", "first version")
        .await;
    browser.click("#submit-button").await;
    let job_path = browser.wait_for_path(is_job_path).await;
    // Back, edit, resubmit: the old form's key with new content.
    let mark = browser.mark_document().await;
    browser
        .post_natively(
            "/jobs",
            &[
                ("csrf", &csrf),
                ("idempotency_key", &key),
                ("task", "summarize"),
                ("provider", ""),
                ("input.text", "edited version"),
            ],
        )
        .await;
    assert_eq!(
        browser.wait_for_fresh_page(&mark, |p| p == "/jobs").await,
        "/jobs"
    );
    let notice = browser
        .wait_for_text("#key-reused h1", |t| !t.is_empty())
        .await;
    assert!(notice.contains("already submitted"), "{notice}");
    assert_eq!(app.job_count(&app.alice.id).await, 1, "no second job");
    // The stored job is the first version's, unchanged.
    let rows = job_rows(&app, &app.alice.id).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(job_path, format!("/jobs/{}", rows[0].id));
    assert_eq!(rows[0].idempotency_key, key);
    assert_eq!(rows[0].input(), json!({"text": "first version"}));
    let exposition = metrics(&app).await;
    assert_eq!(
        metric_sum(&exposition, "onejob_idempotency_conflicts_total", &[]),
        1.0,
        "the edited resubmission was refused as a conflict"
    );
    browser.click_link("See the existing job").await;
    assert_eq!(browser.wait_for_path(is_job_path).await, job_path);
    browser.close().await;
}

/// In Chromium with page scripts on or off: opens a fresh form, submits it
/// (landing on the job), goes Back to the form, and submits it again,
/// unchanged or edited. Unchanged, the second submission lands on the same
/// job; edited, it gets the key-reused page (409) linking the first job.
/// Either way one job, with the first content and one attempt, is stored.
async fn submit_go_back_and_submit_again(backend: TestBackend, javascript: bool, edit: bool) {
    let app = spawn_app(backend).await;
    app.set_password("alice", "alice-pw").await;
    let Some(browser) = Browser::start_with(javascript).await else {
        return;
    };
    browser.sign_in(&app, "alice", "alice-pw").await;
    browser.goto(&app, "/jobs/new").await;
    let htmx = if javascript { "object" } else { "undefined" };
    assert_eq!(browser.eval("return typeof htmx;").await, json!(htmx));
    let form_url = browser.client.current_url().await.unwrap();
    let key = browser.value_of("input[name=idempotency_key]").await;
    assert_eq!(
        form_url.query(),
        Some(format!("key={key}").as_str()),
        "the form's key is in its address"
    );
    let first_text = "Summarize this, then go back.";
    browser
        .fill("textarea[name='input.text']", first_text)
        .await;
    let document = browser.mark_document().await;
    let job_path = browser.click_and_wait("#submit-button", is_job_path).await;
    browser
        .wait_for_text("#job-status", |s| !s.is_empty())
        .await;
    let rows = job_rows(&app, &app.alice.id).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(job_path, format!("/jobs/{}", rows[0].id));
    let job_id = rows[0].id.clone();

    // Back to the form, at its address.
    let forms_before = answered(&metrics(&app).await, "GET", "/jobs/new", "200");
    browser.client.back().await.unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        let shown = browser
            .client
            .execute(
                "return document.readyState === 'complete' && location.href === arguments[0]
                   && document.getElementById('submit-form') !== null;",
                vec![json!(form_url.as_str())],
            )
            .await;
        if matches!(shown, Ok(Value::Bool(true))) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Back did not bring the form at {form_url} (the browser is on {})",
            browser.path().await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let asked_again = answered(&metrics(&app).await, "GET", "/jobs/new", "200") - forms_before;
    let same_document = browser
        .client
        .execute(
            "return window.__onejob_marker === arguments[0];",
            vec![json!(document)],
        )
        .await
        .unwrap()
        == json!(true);
    if javascript {
        // htmx moved between the pages in one document, and keeps no
        // history cache (historyCacheSize 0): it asked the server again.
        assert!(same_document, "htmx kept the document");
        assert_eq!(asked_again, 1, "htmx asked the server for the form again");
    }
    if asked_again > 0 {
        // The server drew the form again: it says it was submitted, links
        // the job, and holds what it sent.
        let notice = browser.text_of("#already-submitted").await;
        assert!(
            notice.contains("This form was already submitted."),
            "{notice}"
        );
        assert_eq!(
            browser
                .count(&format!("#already-submitted a[href='{job_path}']"))
                .await,
            1,
            "the notice links the job"
        );
    } else {
        // Nothing was asked: Chromium showed the very page it left, from
        // its back/forward cache, as it was.
        assert!(same_document, "no new request, yet a new document");
        assert_eq!(browser.count("#already-submitted").await, 0);
        let _ = writeln!(
            std::io::stderr(),
            "note: Chromium restored the submitted form from its back/forward cache"
        );
    }
    assert_eq!(browser.value_of("input[name=idempotency_key]").await, key);
    assert_eq!(
        browser.value_of("textarea[name='input.text']").await,
        first_text
    );

    // Submit again.
    let sent_text = if edit {
        let edited = "Summarize this, edited after going back.";
        browser
            .replace_text("textarea[name='input.text']", edited)
            .await;
        edited
    } else {
        first_text
    };
    let _ = browser.sent_requests().await;
    let landed = browser
        .click_and_wait("#submit-button", |p| {
            if edit {
                p == "/jobs"
            } else {
                is_job_path(p)
            }
        })
        .await;
    let posts: Vec<SentRequest> = browser
        .sent_requests()
        .await
        .into_iter()
        .filter(|r| r.method == "POST" && r.path == "/jobs")
        .collect();
    assert_eq!(posts.len(), 1, "{posts:#?}");
    let post = &posts[0];
    if javascript {
        assert!(post.has_header("HX-Request"), "sent by htmx: {post:#?}");
    } else {
        assert_eq!(post.kind, "Document", "a native submission: {post:#?}");
        assert!(!post.has_header("HX-Request"), "not htmx: {post:#?}");
    }
    if let Some(body) = &post.post_data {
        assert!(body.contains(&key), "the form's key is sent again: {body}");
    }
    assert_eq!(
        post.query.as_deref(),
        Some(format!("idempotency_key={key}").as_str()),
        "the key is in the address too, for a load balancer: {post:#?}"
    );
    let exposition = metrics(&app).await;
    if edit {
        let title = browser.text_of("#key-reused h1").await;
        assert_eq!(
            title,
            "This form was already submitted, with different content"
        );
        assert_eq!(
            browser
                .attr_of("#key-reused a.button", "href")
                .await
                .as_deref(),
            Some(job_path.as_str()),
            "the page links the first job"
        );
        assert_eq!(answered(&exposition, "POST", "/jobs", "409"), 1);
        assert_eq!(
            metric_sum(&exposition, "onejob_idempotency_conflicts_total", &[]),
            1.0
        );
    } else {
        assert_eq!(landed, job_path, "lands on the same job");
        assert_eq!(
            metric_sum(&exposition, "onejob_jobs_replayed_total", &[]),
            1.0,
            "answered with the first submission's job"
        );
    }
    assert_eq!(
        answered(&exposition, "POST", "/jobs", "303"),
        if edit { 1 } else { 2 }
    );
    assert_eq!(
        metric_sum(&exposition, "onejob_jobs_created_total", &[]),
        1.0
    );

    // What is stored: one job under the form's key, with the first content
    // and one attempt.
    let rows = job_rows(&app, &app.alice.id).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].id, job_id);
    assert_eq!(rows[0].idempotency_key, key);
    assert_eq!(rows[0].input(), json!({ "text": first_text }));
    if edit {
        assert_ne!(
            rows[0].input(),
            json!({ "text": sent_text }),
            "not the edit"
        );
    }
    assert_eq!(attempt_rows(&app, &job_id).await.len(), 1, "one attempt");
    if edit {
        let opened = browser
            .click_and_wait("#key-reused a.button", is_job_path)
            .await;
        assert_eq!(opened, job_path);
    }

    // The form's address, asked for again, says the form was submitted,
    // links the job, and holds what it sent the first time.
    let mark = browser.mark_document().await;
    browser.client.goto(form_url.as_str()).await.unwrap();
    browser
        .wait_for_fresh_page(&mark, |p| p == "/jobs/new")
        .await;
    assert_eq!(
        browser
            .count(&format!("#already-submitted a[href='{job_path}']"))
            .await,
        1
    );
    assert_eq!(
        browser.value_of("textarea[name='input.text']").await,
        first_text
    );
    browser.close().await;
}

async fn back_and_submit_again_unchanged_with_javascript_lands_on_the_same_job(
    backend: TestBackend,
) {
    submit_go_back_and_submit_again(backend, true, false).await;
}

async fn back_and_submit_again_edited_with_javascript_gets_the_key_reused_page(
    backend: TestBackend,
) {
    submit_go_back_and_submit_again(backend, true, true).await;
}

async fn back_and_submit_again_unchanged_without_javascript_lands_on_the_same_job(
    backend: TestBackend,
) {
    submit_go_back_and_submit_again(backend, false, false).await;
}

async fn back_and_submit_again_edited_without_javascript_gets_the_key_reused_page(
    backend: TestBackend,
) {
    submit_go_back_and_submit_again(backend, false, true).await;
}

on_both_backends!(
    a_real_double_click_on_submit_makes_one_job_and_lands_on_it,
    a_double_click_with_htmx_boost_off_sends_two_native_posts_and_makes_one_job,
    a_double_click_with_javascript_off_sends_two_posts_and_makes_one_job,
    changed_content_under_the_same_key_explains_itself_and_makes_no_second_job,
    back_and_submit_again_unchanged_with_javascript_lands_on_the_same_job,
    back_and_submit_again_edited_with_javascript_gets_the_key_reused_page,
    back_and_submit_again_unchanged_without_javascript_lands_on_the_same_job,
    back_and_submit_again_edited_without_javascript_gets_the_key_reused_page,
);
