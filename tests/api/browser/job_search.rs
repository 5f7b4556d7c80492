//! The console's job search, as support uses it.

use crate::support::db::*;
use crate::support::harness::{spawn_app_with, summarize, test_config, TestBackend};
use crate::support::webdriver::{is_job_path, Browser, WAIT};

/// The search page's result rows: (id, owner, key, status) each, and each
/// row's link.
async fn listed_jobs(browser: &Browser) -> (Vec<ListedJob>, Vec<String>) {
    let rows = browser
        .eval(
            "return [...document.querySelectorAll('tr.job-row')].map(row => [
               row.dataset.job,
               row.querySelector('td[data-label=Owner]').textContent.trim(),
               row.querySelector('td[data-label=Key]').textContent.trim(),
               row.querySelector('td[data-label=Status]').textContent.trim(),
               row.querySelector('td[data-label=Job] a').getAttribute('href'),
             ]);",
        )
        .await;
    let rows: Vec<[String; 5]> = serde_json::from_value(rows).unwrap();
    rows.into_iter()
        .map(|[id, owner, key, status, link]| ((id, owner, key, status), link))
        .unzip()
}

/// Fills the search form with `fields` (the others emptied), submits it, and
/// waits for the answer; returns its path.
async fn search_jobs(browser: &Browser, fields: &[(&str, &str)]) -> String {
    let value = |name: &str| {
        fields
            .iter()
            .find(|(field, _)| *field == name)
            .map_or("", |(_, value)| *value)
    };
    for name in ["job", "owner", "key"] {
        browser
            .replace_text(&format!("#job-search input[name={name}]"), value(name))
            .await;
    }
    for name in ["status", "provider"] {
        browser
            .select(&format!("#job-search select[name={name}]"), value(name))
            .await;
    }
    browser
        .click_and_wait("#job-search button", |p| {
            p.starts_with("/admin/jobs") || is_job_path(p)
        })
        .await
}

async fn support_finds_jobs_by_owner_status_key_and_id_and_opens_them(backend: TestBackend) {
    // sim-hang never answers: bob's job goes unknown.
    let app = spawn_app_with(backend, test_config(crate::authorization::PROVIDERS)).await;
    app.set_password("sue", "sue-pw").await;
    let first = app
        .create_job(&app.alice.token, "order-77", &summarize("first"))
        .await;
    let mut hanging = summarize("second");
    hanging["provider"] = "sim-hang".into();
    // A key as some API clients make it: a digest, 64 characters unbroken.
    let digest_key = onejob::domain::sha256_hex(b"order-78");
    let second = app.create_job(&app.bob.token, &digest_key, &hanging).await;
    // The key a browser's submit form makes: a UUID, long and unbroken.
    let form_key = uuid::Uuid::now_v7().to_string();
    let third = app
        .create_job(&app.alice.token, &form_key, &summarize("third"))
        .await;
    app.wait_for_status(&first, "succeeded", WAIT).await;
    app.wait_for_status(&second, "unknown", WAIT).await;
    app.wait_for_status(&third, "succeeded", WAIT).await;
    let stored = every_job(&app).await;
    let ids: Vec<&str> = stored.iter().map(|job| job.0.as_str()).collect();
    assert_eq!(ids, vec![&third, &second, &first], "newest first");
    let matching = |keep: &dyn Fn(&ListedJob) -> bool| -> Vec<ListedJob> {
        stored.iter().filter(|job| keep(job)).cloned().collect()
    };
    let links = |jobs: &[ListedJob]| -> Vec<String> {
        jobs.iter().map(|job| format!("/jobs/{}", job.0)).collect()
    };

    let Some(browser) = Browser::start().await else {
        return;
    };
    browser.sign_in(&app, "sue", "sue-pw").await;
    browser.goto(&app, "/admin").await;
    let mark = browser.mark_content().await;
    browser.click_link("Find a job").await;
    browser
        .wait_for_fresh_content(&mark, |p| p == "/admin/jobs")
        .await;
    // Every job, newest first, as stored.
    let (rows, row_links) = listed_jobs(&browser).await;
    assert_eq!(rows, stored);
    assert_eq!(row_links, links(&stored));
    browser
        .assert_fits_at_each_width("job-search", backend == TestBackend::Sqlite)
        .await;

    // By owner.
    search_jobs(&browser, &[("owner", "alice")]).await;
    let alice = matching(&|job| job.1 == "alice");
    assert_eq!(alice.len(), 2);
    assert_eq!(listed_jobs(&browser).await, (alice.clone(), links(&alice)));
    assert_eq!(
        browser.value_of("#job-search input[name=owner]").await,
        "alice"
    );
    // By status.
    search_jobs(&browser, &[("status", "unknown")]).await;
    let unknown = matching(&|job| job.3 == "unknown");
    assert_eq!(unknown.len(), 1);
    assert_eq!(
        listed_jobs(&browser).await,
        (unknown.clone(), links(&unknown))
    );
    assert_eq!(
        browser.value_of("#job-search select[name=status]").await,
        "unknown"
    );
    // By the customer's idempotency key.
    search_jobs(&browser, &[("key", "order-77")]).await;
    let keyed = matching(&|job| job.2 == "order-77");
    assert_eq!(keyed.len(), 1);
    assert_eq!(listed_jobs(&browser).await, (keyed.clone(), links(&keyed)));
    // An owner and a key that do not go together: nothing, said so.
    search_jobs(&browser, &[("owner", "bob"), ("key", "order-77")]).await;
    assert_eq!(browser.count("tr.job-row").await, 0);
    assert_eq!(browser.text_of("#search-message").await, "No job matches.");
    // An id that is not one.
    search_jobs(&browser, &[("job", "not-an-id")]).await;
    assert_eq!(
        browser.text_of("#search-message").await,
        "not-an-id is not a job id."
    );
    // By id: straight to the job's page.
    let landed = search_jobs(&browser, &[("job", &second)]).await;
    assert_eq!(landed, format!("/jobs/{second}"));
    assert_eq!(browser.text_of("#job-owner").await, "Owner: bob");
    assert_eq!(browser.text_of("#job-status").await, "unknown");

    // A result's link opens its job.
    browser.goto(&app, "/admin/jobs").await;
    search_jobs(&browser, &[("owner", "alice")]).await;
    let target = format!("/jobs/{first}");
    let opened = browser
        .click_and_wait(&format!("tr.job-row a[href='{target}']"), is_job_path)
        .await;
    assert_eq!(opened, target);
    assert_eq!(browser.text_of("#job-owner").await, "Owner: alice");
    assert_eq!(browser.text_of("#job-status").await, "succeeded");
    browser.close().await;
}

on_both_backends!(support_finds_jobs_by_owner_status_key_and_id_and_opens_them,);
