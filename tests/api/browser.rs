//! Real headless Chromium, driven through chromedriver: a real double click,
//! the console's flows, and the screenshots in the README.
//!
//! Chromium and chromedriver come from Debian's packages (`.ci/run` installs
//! them). In CI a missing browser fails these tests; elsewhere they are
//! skipped with a loud line.

use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::actions::{InputSource, MouseActions, PointerAction, MOUSE_BUTTON_LEFT};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

use crate::helpers::{
    in_ci, spawn_app, spawn_app_with, summarize, test_config, TestApp, TestBackend,
};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";
const WAIT: Duration = Duration::from_secs(15);

pub struct Browser {
    pub client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session, or `None` (skip
    /// loudly) when they are not installed outside CI.
    pub async fn start() -> Option<Self> {
        if !std::path::Path::new(CHROMEDRIVER).exists() || !std::path::Path::new(CHROMIUM).exists()
        {
            if in_ci() {
                panic!("Chromium and chromedriver are required in CI ({CHROMIUM}, {CHROMEDRIVER})");
            }
            let _ = writeln!(
                std::io::stderr(),
                "!!! SKIPPING A BROWSER TEST: install Debian's chromium and chromium-driver to run it"
            );
            return None;
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let profile = tempfile::tempdir().unwrap();
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": CHROMIUM,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", "--window-size=1280,900",
                    format!("--user-data-dir={}", profile.path().display()),
                ]
            }),
        );
        let started = Instant::now();
        let client = loop {
            match ClientBuilder::rustls()
                .unwrap()
                .capabilities(caps.clone())
                .connect(&format!("http://127.0.0.1:{port}"))
                .await
            {
                Ok(client) => break client,
                Err(e) if started.elapsed() < Duration::from_secs(20) => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("could not start a Chromium session: {e}"),
            }
        };
        Some(Self {
            client,
            driver,
            _profile: profile,
        })
    }

    pub async fn goto(&self, app: &TestApp, path: &str) {
        self.client.goto(&app.url(path)).await.unwrap();
    }

    pub async fn sign_in(&self, app: &TestApp, name: &str, password: &str) {
        self.goto(app, "/login").await;
        self.fill("input[name=name]", name).await;
        self.fill("input[name=password]", password).await;
        self.click("form[action='/login'] button").await;
        self.wait_for_path(|p| p == "/jobs/new").await;
    }

    /// Types into the element matching `css`.
    pub async fn fill(&self, css: &str, text: &str) {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap()
            .send_keys(text)
            .await
            .unwrap();
    }

    /// Clicks the element matching `css`.
    pub async fn click(&self, css: &str) {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
    }

    pub async fn click_link(&self, text: &str) {
        self.client
            .find(Locator::LinkText(text))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
    }

    pub async fn path(&self) -> String {
        self.client.current_url().await.unwrap().path().to_owned()
    }

    pub async fn wait_for_path(&self, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let path = self.path().await;
            if ok(&path) {
                return path;
            }
            assert!(Instant::now() < deadline, "the browser stayed on {path}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until an element's text satisfies `ok`.
    pub async fn wait_for_text(&self, css: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(element) = self.client.find(Locator::Css(css)).await {
                if let Ok(text) = element.text().await {
                    if ok(&text) {
                        return text;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "{css} never showed the expected text"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn count(&self, css: &str) -> usize {
        self.client.find_all(Locator::Css(css)).await.unwrap().len()
    }

    /// Saves the page at 1280 and 390 px wide to `target/screenshots/NAME-WIDTH.png`.
    pub async fn screenshots(&self, name: &str) {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        for (width, height) in [(1280, 900), (390, 844)] {
            self.client.set_window_size(width, height).await.unwrap();
            tokio::time::sleep(Duration::from_millis(150)).await;
            let png = self.client.screenshot().await.unwrap();
            std::fs::write(dir.join(format!("{name}-{width}.png")), png).unwrap();
        }
        self.client.set_window_size(1280, 900).await.unwrap();
    }

    /// Posts a form with these fields from inside the page, natively (no
    /// htmx): what a browser does when a page's form is submitted again.
    pub async fn post_natively(&self, action: &str, fields: &[(&str, &str)]) {
        let fields: Vec<Value> = fields.iter().map(|(k, v)| json!([k, v])).collect();
        self.client
            .execute(
                "const [action, fields] = arguments;
                 const form = document.createElement('form');
                 form.method = 'post'; form.action = action;
                 for (const [name, value] of fields) {
                   const input = document.createElement('input');
                   input.type = 'hidden'; input.name = name; input.value = value;
                   form.appendChild(input);
                 }
                 document.body.appendChild(form);
                 HTMLFormElement.prototype.submit.call(form);",
                vec![json!(action), json!(fields)],
            )
            .await
            .unwrap();
    }

    pub async fn value_of(&self, css: &str) -> String {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap()
            .prop("value")
            .await
            .unwrap()
            .unwrap_or_default()
    }
}

fn is_job_path(path: &str) -> bool {
    path.strip_prefix("/jobs/")
        .is_some_and(|id| onejob::domain::JobId::parse(id).is_some())
}

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
    let button = browser
        .client
        .find(Locator::Id("submit-button"))
        .await
        .unwrap();
    let double_click = MouseActions::new("mouse".into())
        .then(PointerAction::MoveToElement {
            element: button,
            duration: None,
            x: 0.0,
            y: 0.0,
        })
        .then(PointerAction::Down {
            button: MOUSE_BUTTON_LEFT,
        })
        .then(PointerAction::Up {
            button: MOUSE_BUTTON_LEFT,
        })
        .then(PointerAction::Down {
            button: MOUSE_BUTTON_LEFT,
        })
        .then(PointerAction::Up {
            button: MOUSE_BUTTON_LEFT,
        });
    browser.client.perform_actions(double_click).await.unwrap();
    let landed = browser.wait_for_path(is_job_path).await;
    assert_eq!(
        app.job_count(&app.alice.id).await,
        1,
        "a double click made one job"
    );

    // The same form submitted again (a reload that re-POSTs): the same job.
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
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        browser.wait_for_path(is_job_path).await,
        landed,
        "lands on the same job"
    );
    assert_eq!(app.job_count(&app.alice.id).await, 1, "still one job");
    browser
        .wait_for_text("#job-status", |s| s == "succeeded")
        .await;
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
    let notice = browser
        .wait_for_text("#key-reused h1", |t| !t.is_empty())
        .await;
    assert!(notice.contains("already submitted"), "{notice}");
    assert_eq!(app.job_count(&app.alice.id).await, 1, "no second job");
    browser.click_link("See the existing job").await;
    assert_eq!(browser.wait_for_path(is_job_path).await, job_path);
}

async fn support_abandons_an_unknown_attempt_from_the_queue_and_starts_the_next_one(
    backend: TestBackend,
) {
    let app = spawn_app_with(backend, test_config(crate::attempts::HANGING_PRIMARY)).await;
    app.set_password("sue", "sue-pw").await;
    let job_id = app
        .create_job(&app.alice.token, "stuck", &summarize("will hang"))
        .await;
    app.wait_for_status(&job_id, "unknown", WAIT).await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    browser.sign_in(&app, "sue", "sue-pw").await;
    browser.goto(&app, "/admin").await;
    browser.wait_for_text("#unknown-now", |t| t == "1").await;
    browser.goto(&app, "/admin/unknown").await;
    assert_eq!(browser.count(".unknown-row").await, 1);
    if backend == TestBackend::Sqlite {
        browser.screenshots("unknown-queue").await;
    }
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
}

async fn the_race_log_shows_a_reverse_order_finish_and_links_to_the_job(backend: TestBackend) {
    let app = spawn_app(backend).await;
    app.set_password("ada", "ada-pw").await;
    let mut body = summarize("race");
    body["provider"] = "sim-slow".into();
    let job_id = app.create_job(&app.alice.token, "race", &body).await;
    let job = app.wait_for_status(&job_id, "unknown", WAIT).await;
    let first = job["attempts"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        app.abandon(&app.sue.token, &first, "fall back")
            .await
            .status(),
        200
    );
    assert_eq!(
        app.start_attempt(&app.alice.token, &job_id, None)
            .await
            .status(),
        201
    );
    app.wait_for_job(&job_id, WAIT, |j| j["attempts"][0]["outcome"] == "lost")
        .await;

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
        row.contains("#2 sim-fast") && row.contains("#1 sim-slow"),
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
}

on_both_backends!(
    a_real_double_click_on_submit_makes_one_job_and_lands_on_it,
    changed_content_under_the_same_key_explains_itself_and_makes_no_second_job,
    support_abandons_an_unknown_attempt_from_the_queue_and_starts_the_next_one,
    the_race_log_shows_a_reverse_order_finish_and_links_to_the_job,
    a_user_without_the_role_cannot_open_the_console,
);
