//! A chat job's page shows its text as it streams (docs/browser.md, "Live
//! text"), in real headless Chromium against a fake upstream that streams:
//! the text is on screen while the upstream is held at a gate, it is
//! inserted as text (never as HTML), the final text is the stored answer,
//! another user cannot follow the stream, a stream that fails keeps what
//! was seen and says why, a follower past the cap reads a message instead, and with JavaScript off the page still reaches the
//! answer by reloading itself.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::fake_provider::{
    config_of, Behaviour, FakeProvider, ProviderToml, Shape, StreamStep, WAIT,
};
use crate::support::harness::{chat_request, spawn_app_with, TestApp, TestBackend};
use crate::support::sse::SseReader;
use crate::support::webdriver::{is_job_path, Browser};

/// One chat route, `gpt-stream`, on the streaming fake upstream `up`.
fn live_config(up: &FakeProvider, max_followers: usize) -> onejob::config::Config {
    let toml = ProviderToml::openai("up", &format!("{}/v1", up.base_url))
        .timeout_ms(10_000)
        .with("idle_timeout_ms = 10000")
        .toml()
        + r#"
[[tasks]]
name = "gpt-stream"
kind = "chat"
providers = ["up"]
"#;
    let mut config = config_of(&toml);
    config.server.max_wait_seconds = 20;
    config.server.max_followers_per_job = max_followers;
    config
}

/// The one request id the upstream has been sent.
async fn the_request_id(upstream: &FakeProvider) -> String {
    upstream.wait_requests(1).await;
    upstream.request_ids()[0].clone()
}

/// The exact text of the element matching `css` (its `textContent`), or
/// `None` when there is no such element.
async fn text_content(browser: &Browser, css: &str) -> Option<String> {
    browser
        .client
        .execute(
            "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;",
            vec![json!(css)],
        )
        .await
        .unwrap()
        .as_str()
        .map(str::to_owned)
}

/// Waits until the exact text of `css` satisfies `ok`; returns it.
async fn wait_for_content(browser: &Browser, css: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(text) = text_content(browser, css).await.filter(|t| ok(t)) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{css} never showed the expected text; it shows {:?}",
            text_content(browser, css).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The job's stored answer text, once it has succeeded.
async fn stored_answer(app: &TestApp, job_id: &str) -> String {
    let job = app
        .wait_for_job(job_id, WAIT, |j| j["status"] == "succeeded")
        .await;
    job["result"]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// What the page's own script sees when it asks for `path`: the status and
/// whether the body names `needle`.
async fn fetch_from_page(browser: &Browser, path: &str, needle: &str) -> (u64, bool) {
    let seen = browser
        .client
        .execute_async(
            "const [path, needle, done] = arguments;
             fetch(path).then(async r => done([r.status, (await r.text()).includes(needle)]),
                              e => done([0, String(e)]));",
            vec![json!(path), json!(needle)],
        )
        .await
        .unwrap();
    (seen[0].as_u64().unwrap(), seen[1] == Value::Bool(true))
}

async fn a_chat_jobs_page_shows_its_text_as_it_streams_and_then_the_stored_answer(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.push(Behaviour::Stream(vec![
        StreamStep::Text("Exactly ".into()),
        StreamStep::Gate,
        StreamStep::Text("<b>once</b>, ".into()),
        StreamStep::Gate,
        StreamStep::Text("as text.".into()),
    ]));
    let app = spawn_app_with(backend, live_config(&upstream, 64)).await;
    app.set_password("alice", "alice-pw").await;
    app.set_password("bob", "bob-pw").await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    browser.sign_in(&app, "alice", "alice-pw").await;

    // The Submit form's chat example asks for a stream; submitting it as
    // it is lands on the job's page.
    let example: Value =
        serde_json::from_str(&browser.value_of("#input-json").await).expect("JSON");
    assert_eq!(example["stream"], true, "{example}");
    let job_path = browser.click_and_wait("#submit-button", is_job_path).await;
    let job_id = job_path.trim_start_matches("/jobs/").to_owned();
    let request_id = the_request_id(&upstream).await;

    // The first chunk is on screen while the upstream is held before its
    // second: the page did not wait for the answer.
    let shown = wait_for_content(&browser, "#live-text-output", |t| !t.is_empty()).await;
    assert_eq!(shown, "Exactly ");
    upstream.wait_gate(&request_id, 1).await;
    assert_eq!(upstream.chunks_sent(&request_id), 1, "the upstream is held");
    assert_eq!(
        browser.attr_of("#live-text", "hidden").await,
        None,
        "the live text is shown"
    );
    // The page's live part says the job runs (it refreshes every second).
    browser
        .wait_for_text("#job-status", |s| s == "running")
        .await;
    assert_eq!(upstream.chunks_sent(&request_id), 1, "still held");

    // Markup in the answer arrives as text: no element is made of it.
    upstream.open_gate(&request_id);
    wait_for_content(&browser, "#live-text-output", |t| {
        t == "Exactly <b>once</b>, "
    })
    .await;
    assert_eq!(browser.count("#live-text-output *").await, 0, "text only");
    upstream.wait_gate(&request_id, 2).await;
    assert_eq!(upstream.chunks_sent(&request_id), 2);

    // Once the job ends, the page shows its final state: the stored answer,
    // in place of the live text.
    upstream.open_gate(&request_id);
    browser
        .wait_for_text("#job-status", |s| s == "succeeded")
        .await;
    let stored = stored_answer(&app, &job_id).await;
    assert_eq!(stored, "Exactly <b>once</b>, as text.");
    let answer = wait_for_content(&browser, "#job-answer", |t| !t.is_empty()).await;
    assert_eq!(answer, stored, "the page's final text is the stored answer");
    assert_eq!(browser.count("#job-answer *").await, 0, "text only");
    let deadline = Instant::now() + WAIT;
    while browser.count("#live-text").await != 0 {
        assert!(
            Instant::now() < deadline,
            "the live text stayed beside the answer"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(upstream.total_requests(), 1, "one upstream call");
    if backend == TestBackend::Sqlite {
        browser.screenshots("job-chat-answer").await;
    }

    // Another user can neither see the job nor follow its stream: the same
    // 404 as for a job that does not exist, naming nothing.
    browser.sign_out().await;
    browser.sign_in(&app, "bob", "bob-pw").await;
    let stream = format!("{job_path}/stream");
    let (status, named) = fetch_from_page(&browser, &stream, &job_id).await;
    assert_eq!(
        (status, named),
        (404, false),
        "bob following alice's stream"
    );
    let nowhere = format!("/jobs/{}/stream", onejob::domain::JobId::new());
    assert_eq!(fetch_from_page(&browser, &nowhere, "").await.0, 404);
    browser.goto(&app, &job_path).await;
    assert_eq!(browser.count("#live-text").await, 0);
    assert_eq!(
        browser.count("#job-answer").await,
        0,
        "nothing of the answer"
    );
    browser.close().await;
}

async fn a_follower_past_the_cap_reads_why_and_the_page_still_reaches_the_answer(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.push(Behaviour::Stream(vec![
        StreamStep::Text("busy ".into()),
        StreamStep::Gate,
        StreamStep::Text("stream".into()),
    ]));
    let app = spawn_app_with(backend, live_config(&upstream, 1)).await;
    app.set_password("alice", "alice-pw").await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    browser.sign_in(&app, "alice", "alice-pw").await;
    // An API client follows the job first and takes its only place.
    let body = json!({"model": "gpt-stream", "stream": true,
        "messages": [{"role": "user", "content": "capped"}]});
    let response = chat_request(&app, "capped", &body).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let job_id = response.headers()["x-onejob-job-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let mut api = SseReader::new(response);
    let request_id = the_request_id(&upstream).await;
    let _ = api.until_content().await;

    browser.goto(&app, &format!("/jobs/{job_id}")).await;
    let note = wait_for_content(&browser, "#live-text-note", |t| !t.is_empty()).await;
    assert!(
        note.contains("The live text is not shown")
            && note.contains("already has 1 followers")
            && note.contains("shows the answer once the job ends"),
        "{note}"
    );
    assert_eq!(browser.attr_of("#live-text", "hidden").await, None);

    upstream.wait_gate(&request_id, 1).await;
    upstream.open_gate(&request_id);
    let _ = api.rest().await;
    browser
        .wait_for_text("#job-status", |s| s == "succeeded")
        .await;
    let answer = wait_for_content(&browser, "#job-answer", |t| !t.is_empty()).await;
    assert_eq!(answer, stored_answer(&app, &job_id).await);
    browser.close().await;
}

async fn with_javascript_off_a_chat_jobs_page_reaches_the_answer_by_reloading(
    backend: TestBackend,
) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.push(Behaviour::Stream(vec![
        StreamStep::Text("no ".into()),
        StreamStep::Gate,
        StreamStep::Text("script".into()),
    ]));
    let app = spawn_app_with(backend, live_config(&upstream, 64)).await;
    app.set_password("alice", "alice-pw").await;
    let Some(browser) = Browser::start_without_javascript().await else {
        return;
    };
    browser.sign_in(&app, "alice", "alice-pw").await;
    let job_path = browser.click_and_wait("#submit-button", is_job_path).await;
    let job_id = job_path.trim_start_matches("/jobs/").to_owned();
    let request_id = the_request_id(&upstream).await;
    upstream.wait_gate(&request_id, 1).await;
    // Without the script the live text stays hidden, and empty.
    assert_eq!(
        browser.attr_of("#live-text", "hidden").await.as_deref(),
        Some("true")
    );
    assert_eq!(
        text_content(&browser, "#live-text-output").await.as_deref(),
        Some("")
    );
    upstream.open_gate(&request_id);
    // The page reloads itself (a <noscript> refresh) until the answer.
    let answer = wait_for_content(&browser, "#job-answer", |t| !t.is_empty()).await;
    assert_eq!(answer, stored_answer(&app, &job_id).await);
    assert_eq!(answer, "no script");
    assert_eq!(
        browser.count("#live-text").await,
        0,
        "a finished job has none"
    );
    browser.close().await;
}

async fn a_stream_that_fails_after_a_chunk_keeps_what_was_seen_and_says_why(backend: TestBackend) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    upstream.push(Behaviour::Stream(vec![
        StreamStep::Text("half an ".into()),
        StreamStep::Gate,
        StreamStep::Error("the model crashed".into()),
    ]));
    let app = spawn_app_with(backend, live_config(&upstream, 64)).await;
    app.set_password("alice", "alice-pw").await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    browser.sign_in(&app, "alice", "alice-pw").await;
    browser.click_and_wait("#submit-button", is_job_path).await;
    let request_id = the_request_id(&upstream).await;
    wait_for_content(&browser, "#live-text-output", |t| t == "half an ").await;
    upstream.wait_gate(&request_id, 1).await;
    upstream.open_gate(&request_id);
    browser
        .wait_for_text("#job-status", |s| s == "failed")
        .await;
    let note = wait_for_content(&browser, "#live-text-note", |t| !t.is_empty()).await;
    assert!(note.starts_with("The job failed: "), "{note}");
    assert!(note.contains("part of the answer"), "{note}");
    assert_eq!(browser.attr_of("#live-text", "hidden").await, None);
    assert_eq!(
        text_content(&browser, "#live-text-output").await.as_deref(),
        Some("half an "),
        "what was seen stays, and nothing is spliced onto it"
    );
    assert_eq!(browser.count("#job-answer").await, 0, "no answer");
    browser.close().await;
}

on_both_backends!(
    a_stream_that_fails_after_a_chunk_keeps_what_was_seen_and_says_why,
    a_chat_jobs_page_shows_its_text_as_it_streams_and_then_the_stored_answer,
    a_follower_past_the_cap_reads_why_and_the_page_still_reaches_the_answer,
    with_javascript_off_a_chat_jobs_page_reaches_the_answer_by_reloading,
);
