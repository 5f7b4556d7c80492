//! The pages a newcomer meets, in real headless Chromium, each at 1280 and
//! 390 px: the built-in demo walked at a person's pace (a job sent to
//! sim-slow goes unknown, the job page leads staff to the Unknown queue,
//! the attempt is abandoned, the next attempt wins, the late answer
//! loses), a timeline readable on a phone, My jobs with its key, provider
//! and age columns sorted and filtered, and a Submit form that names its
//! task once and shows a chat route a `messages` example.
//!
//! The demo runs the built-in configuration with the late answer sooner
//! ([`crate::demo`]) and pauses [`PERSON_PAUSE`] between a person's steps.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::demo::{demo_config, DEMO_LATE_ANSWER_MS, PERSON_PAUSE};
use crate::support::db::{attempt_rows, race_rows, summary};
use crate::support::harness::{spawn_app_with, summarize, test_config, FormClient, TestBackend};
use crate::support::webdriver::{is_job_path, Browser};

async fn pause() {
    tokio::time::sleep(PERSON_PAUSE).await;
}

/// At 1280 and 390 px: every timeline label is at least 12 px tall and
/// lies beside or above its bar, never on it, and the timeline does not
/// scroll sideways.
async fn assert_timeline_readable(browser: &Browser) {
    for (width, height) in [(1280, 900), (390, 844)] {
        browser.client.set_window_size(width, height).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while browser.eval("return window.innerWidth;").await.as_u64() != Some(u64::from(width)) {
            assert!(Instant::now() < deadline, "the window did not resize");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let problems = browser
            .eval(
                "const problems = [];
                 const figure = document.querySelector('figure.timeline');
                 if (!figure) return ['no timeline'];
                 if (figure.scrollWidth > figure.clientWidth + 1)
                   problems.push(`the timeline needs ${figure.scrollWidth} px in ${figure.clientWidth}`);
                 const rows = figure.querySelectorAll('.tl-row');
                 if (rows.length === 0) problems.push('no rows');
                 for (const row of rows) {
                   const label = row.querySelector('.tl-label'), track = row.querySelector('.tl-track');
                   const size = parseFloat(getComputedStyle(label).fontSize);
                   if (size < 12) problems.push(`a ${size} px label: ${label.textContent}`);
                   const l = label.getBoundingClientRect(), t = track.getBoundingClientRect();
                   const apart = l.right <= t.left + 1 || l.bottom <= t.top + 1;
                   if (!apart) problems.push(`the label '${label.textContent}' lies on its bar`);
                   if (t.width < 150) problems.push(`a ${t.width} px bar track`);
                 }
                 for (const item of figure.querySelectorAll('.legend li')) {
                   if (parseFloat(getComputedStyle(item).fontSize) < 12) problems.push('a tiny legend');
                 }
                 return problems;",
            )
            .await;
        assert_eq!(problems, json!([]), "the timeline at {width} px");
    }
    browser.client.set_window_size(1280, 900).await.unwrap();
}

/// The legend says what each colour and the dashed line mean, in words.
async fn assert_plain_legend(browser: &Browser) {
    let legend = browser.text_of("figure.timeline figcaption").await;
    for said in [
        "won: its answer is the job's result",
        "lost: it answered after another attempt had won",
        "unknown: timed out, and may still answer",
        "dashed line: the soft timeout",
        "Each bar runs from when an attempt was sent to its answer",
    ] {
        assert!(legend.contains(said), "the legend says {said:?}: {legend}");
    }
    assert!(!legend.contains("·"), "no cryptic separators: {legend}");
}

async fn the_built_in_demo_at_a_persons_pace_in_the_browser(backend: TestBackend) {
    let app = spawn_app_with(backend, demo_config()).await;
    app.set_password("ada", "ada-pw").await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    let save = backend == TestBackend::Sqlite;
    browser.sign_in(&app, "ada", "ada-pw").await;

    // Submit, with sim-slow first.
    browser.select("select[name=provider]", "sim-slow").await;
    browser
        .fill(
            "textarea[name='input.text']",
            "Exactly once, at a person's pace.",
        )
        .await;
    let sent = Instant::now();
    let job_path = browser.click_and_wait("#submit-button", is_job_path).await;
    let job_id = job_path.trim_start_matches("/jobs/").to_owned();
    let status = browser
        .wait_for_text("#job-status", |s| !s.is_empty())
        .await;
    assert!(
        status == "running" || status == "pending",
        "sim-slow is still working {:?} after the submit: {status}",
        sent.elapsed()
    );

    // After the 5 s soft timeout, the page (refreshing itself) says
    // unknown, why no new attempt may start, and leads to the queue.
    browser
        .wait_for_text("#job-status", |s| s == "unknown")
        .await;
    let refusal = browser.text_of("#retry-refusal").await;
    assert!(
        refusal.contains("Attempt 1 timed out and its outcome is unknown")
            && refusal.contains("abandon it in the Unknown queue"),
        "{refusal}"
    );
    assert_eq!(browser.count("#new-attempt").await, 0);
    assert_eq!(browser.count(".tl-row[data-state=unknown]").await, 1);
    assert_plain_legend(&browser).await;
    assert_timeline_readable(&browser).await;
    browser.assert_fits_at_each_width("job-unknown", save).await;
    pause().await;

    // The Unknown queue, by the page's link: the row names the job by id.
    browser
        .click_and_wait("#unknown-queue-link", |p| p == "/admin/unknown")
        .await;
    let row = format!(".unknown-row[data-job='{job_id}']");
    assert_eq!(browser.count(&row).await, 1);
    let job_cell = browser.text_of(&format!("{row} td.job")).await;
    assert!(job_cell.contains(&job_id), "{job_cell}");
    assert_eq!(
        browser
            .attr_of(&format!("{row} a.job-link"), "href")
            .await
            .as_deref(),
        Some(job_path.as_str())
    );
    browser
        .assert_fits_at_each_width("unknown-queue", save)
        .await;
    pause().await;

    // Abandon it, with a reason: back on the job page.
    browser
        .fill(
            &format!("{row} input[name=reason]"),
            "sim-slow is down; trying sim-fast",
        )
        .await;
    browser
        .click_and_wait(&format!("{row} button"), |p| p == job_path)
        .await;
    assert_eq!(
        summary(&attempt_rows(&app, &job_id).await),
        vec![(1, "sim-slow", "abandoned", None)]
    );
    pause().await;

    // The next attempt goes to the next untried provider and wins.
    // The scenario needs the new attempt to win before the late answer
    // comes: say so if this machine was too slow for it.
    let before_new_attempt = sent.elapsed();
    assert!(
        before_new_attempt < Duration::from_millis(DEMO_LATE_ANSWER_MS as u64),
        "the steps before the new attempt took {before_new_attempt:?}"
    );
    browser.click("#new-attempt").await;
    browser
        .wait_for_text("#job-status", |s| s == "succeeded")
        .await;
    assert_eq!(
        summary(&attempt_rows(&app, &job_id).await),
        vec![
            (1, "sim-slow", "abandoned", None),
            (2, "sim-fast", "succeeded", Some("won")),
        ],
        "the late answer has not come yet ({:?} after the submit)",
        sent.elapsed()
    );
    pause().await;

    // Later, sim-slow's answer arrives and loses: a reload shows it.
    browser
        .reload_until(
            &app,
            &job_path,
            "table.attempts",
            Duration::from_millis(DEMO_LATE_ANSWER_MS as u64 + 30_000),
            PERSON_PAUSE,
            |rows| rows.iter().any(|r| r.contains("lost")),
        )
        .await;
    assert_eq!(browser.count("svg rect.bar.lost").await, 1);
    assert_eq!(browser.count("svg rect.bar.won").await, 1);
    assert_timeline_readable(&browser).await;
    let attempts = attempt_rows(&app, &job_id).await;
    assert_eq!(
        summary(&attempts),
        vec![
            (1, "sim-slow", "succeeded", Some("lost")),
            (2, "sim-fast", "succeeded", Some("won")),
        ]
    );
    let job = app.get_job(&app.ada.token, &job_id).await;
    assert_eq!(job["result"]["provider"], "sim-fast", "the winner's answer");
    let races = race_rows(&app, &job_id).await;
    assert_eq!(races.len(), 1);
    assert_eq!(races[0].losing_attempt_id, attempts[0].id);
    assert_eq!(
        races[0].winning_attempt_id.as_deref(),
        Some(attempts[1].id.as_str())
    );
    assert_eq!(races[0].provider, "sim-slow");

    // The race log lists it.
    browser.goto(&app, "/admin/races").await;
    assert_eq!(browser.count(".race-row").await, 1);
    let race = browser.text_of(".race-row").await;
    assert!(
        race.contains("#1 sim-slow") && race.contains("#2 sim-fast"),
        "{race}"
    );
    browser.close().await;
}

/// sim-fast answers, sim-hang never does (its attempts go unknown), and the
/// task `refused` has one provider that refuses (its jobs fail).
const THREE_OUTCOMES: &str = r#"
[[providers]]
name = "sim-fast"
kind = "simulated"
latency_ms = 20

[[providers]]
name = "sim-hang"
kind = "simulated"
fail = "timeout-forever"
timeout_ms = 200
late_result_ms = 60000

[[providers]]
name = "sim-refuse"
kind = "simulated"
fail = "definite"
latency_ms = 20

[[tasks]]
name = "summarize"
providers = ["sim-fast", "sim-hang"]
input_fields = ["text"]

[[tasks.golden]]
input = { text = "golden example" }

[[tasks]]
name = "refused"
providers = ["sim-refuse"]
input_fields = ["text"]
"#;

/// The listed rows: (key, provider, status), top to bottom.
async fn listed(browser: &Browser) -> Vec<(String, String, String)> {
    let rows = browser
        .eval(
            "return [...document.querySelectorAll('tr.job-row')].map(r => [
               r.querySelector('td.key').textContent.trim(),
               r.querySelector('td[data-label=Provider]').textContent.trim(),
               r.dataset.status]);",
        )
        .await;
    serde_json::from_value(rows).unwrap()
}

fn owned(rows: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    rows.iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect()
}

async fn my_jobs_shows_key_provider_and_age_and_sorts_and_filters_by_status(backend: TestBackend) {
    let app = spawn_app_with(backend, test_config(THREE_OUTCOMES)).await;
    app.set_password("alice", "alice-pw").await;
    let fast = app
        .create_job(&app.alice.token, "order-1", &summarize("fast"))
        .await;
    app.wait_for_status(&fast, "succeeded", Duration::from_secs(15))
        .await;
    let mut hang = summarize("hang");
    hang["provider"] = json!("sim-hang");
    let hang = app.create_job(&app.alice.token, "order-2", &hang).await;
    app.wait_for_status(&hang, "unknown", Duration::from_secs(15))
        .await;
    let refused = app
        .create_job(
            &app.alice.token,
            "order-3",
            &json!({"task": "refused", "input": {"text": "no"}}),
        )
        .await;
    app.wait_for_status(&refused, "failed", Duration::from_secs(15))
        .await;
    // Someone else's job is never listed.
    app.create_job(&app.bob.token, "order-4", &summarize("bob's"))
        .await;

    let Some(browser) = Browser::start().await else {
        return;
    };
    browser.sign_in(&app, "alice", "alice-pw").await;
    browser.goto(&app, "/jobs").await;
    let headers = browser.text_of("table.my-jobs thead").await;
    for column in ["Job", "Key", "Task", "Provider", "Status", "Age"] {
        assert!(headers.contains(column), "{column} in {headers}");
    }
    assert_eq!(
        listed(&browser).await,
        owned(&[
            ("order-3", "sim-refuse", "failed"),
            ("order-2", "sim-hang", "unknown"),
            ("order-1", "sim-fast", "succeeded"),
        ]),
        "newest first"
    );
    let ages = browser
        .eval("return [...document.querySelectorAll('td.age')].map(c => c.textContent.trim());")
        .await;
    for age in ages.as_array().unwrap() {
        let age = age.as_str().unwrap();
        assert!(age.ends_with(" s") || age.ends_with(" ms"), "{age}");
    }
    browser
        .assert_fits_at_each_width("my-jobs", backend == TestBackend::Sqlite)
        .await;

    // The Age column's link turns the order around.
    browser
        .click_and_wait("#sort-by-age", |p| p == "/jobs")
        .await;
    assert_eq!(
        listed(&browser).await,
        owned(&[
            ("order-1", "sim-fast", "succeeded"),
            ("order-2", "sim-hang", "unknown"),
            ("order-3", "sim-refuse", "failed"),
        ]),
        "oldest first"
    );
    // One status, in the order chosen.
    browser
        .select("#jobs-filter select[name=status]", "unknown")
        .await;
    browser
        .click_and_wait("#jobs-filter button", |p| p == "/jobs")
        .await;
    assert_eq!(
        listed(&browser).await,
        owned(&[("order-2", "sim-hang", "unknown")])
    );
    let url = browser.client.current_url().await.unwrap();
    assert!(
        url.query()
            .is_some_and(|q| q.contains("status=unknown") && q.contains("order=oldest")),
        "{url}"
    );
    browser
        .assert_fits_at_each_width("my-jobs-filtered", false)
        .await;
    browser
        .select("#jobs-filter select[name=status]", "pending")
        .await;
    browser
        .click_and_wait("#jobs-filter button", |p| p == "/jobs")
        .await;
    assert_eq!(browser.count("tr.job-row").await, 0);
    assert!(browser
        .text_of("#no-jobs")
        .await
        .contains("No pending jobs."));
    browser.close().await;

    // A status that is none is a readable refusal.
    let form = FormClient::new(&app);
    form.sign_in("alice", "alice-pw").await;
    let response = form.get("/jobs?status=stuck").await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(response
        .text()
        .await
        .unwrap()
        .contains("That is not a job status."));
}

/// The test providers with a chat route on sim-fast beside `summarize`.
fn two_tasks() -> String {
    format!(
        "{}\n[[tasks]]\nname = \"ask\"\nkind = \"chat\"\nproviders = [\"sim-fast\"]\n",
        crate::support::harness::DEFAULT_TEST_PROVIDERS
    )
}

/// How many labels or lines of the page's content start with "Task".
async fn task_mentions(browser: &Browser) -> u64 {
    browser
        .eval(
            "return [...document.querySelectorAll('main label, main p')]
               .filter(e => e.textContent.trim().startsWith('Task')).length;",
        )
        .await
        .as_u64()
        .unwrap()
}

async fn the_submit_form_names_its_task_once_and_shows_a_chat_route_a_messages_example(
    backend: TestBackend,
) {
    let app = spawn_app_with(backend, test_config(&two_tasks())).await;
    app.set_password("alice", "alice-pw").await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    browser.sign_in(&app, "alice", "alice-pw").await;
    assert_eq!(task_mentions(&browser).await, 1, "the chooser alone");
    assert_eq!(browser.count("#task-name").await, 0);
    assert_eq!(browser.value_of("#task-chooser select").await, "summarize");
    browser
        .assert_fits_at_each_width("submit-two-tasks", false)
        .await;

    browser.select("#task-chooser select", "ask").await;
    browser
        .click_and_wait("#task-chooser button", |p| p == "/jobs/new")
        .await;
    assert_eq!(task_mentions(&browser).await, 1);
    assert_eq!(browser.value_of("#task-chooser select").await, "ask");
    let example = browser.value_of("#input-json").await;
    let request: Value = serde_json::from_str(&example).expect("the example is JSON");
    assert_eq!(request["messages"][1]["role"], "user", "{example}");
    let hint = browser.text_of("#chat-hint").await;
    assert!(
        hint.contains("messages") && hint.contains("role") && hint.contains("content"),
        "{hint}"
    );
    browser
        .assert_fits_at_each_width("submit-chat", false)
        .await;

    // The example, as it is, makes a job the route answers.
    let job_path = browser.click_and_wait("#submit-button", is_job_path).await;
    browser
        .wait_for_text("#job-status", |s| s == "succeeded")
        .await;
    let result = browser.text_of("#job-result").await;
    assert!(
        result.contains("simulated reply from sim-fast to: What does an idempotency key do?"),
        "{result}"
    );
    let job = app
        .get_job(&app.alice.token, job_path.trim_start_matches("/jobs/"))
        .await;
    assert_eq!(job["task"], "ask");
    assert_eq!(job["input"], request);
    browser.close().await;
}

on_both_backends!(
    the_built_in_demo_at_a_persons_pace_in_the_browser,
    my_jobs_shows_key_provider_and_age_and_sorts_and_filters_by_status,
    the_submit_form_names_its_task_once_and_shows_a_chat_route_a_messages_example,
);
