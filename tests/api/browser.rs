//! Real headless Chromium, driven through chromedriver: a real double click
//! (with htmx, with htmx's boost turned off, and with JavaScript off), Back
//! and submit again (with JavaScript on and off), the console's flows (the
//! Unknown queue, the race log, Users, job search), whether pages fit at 1280
//! and 390 px, and the screenshots in the README.
//!
//! Chromium and chromedriver come from Debian's packages (`.ci/run` installs
//! them). In CI a missing browser fails these tests; elsewhere they are
//! skipped with a loud line.
//!
//! Every process a browser test starts ends with the test, whether it passes,
//! fails or panics: see [`BrowserProcesses`]. Nothing here waits a fixed time
//! to order events: a test waits for a condition (a fresh page, a row, a held
//! provider request), with a deadline.

use std::io::Write;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use fantoccini::actions::{InputSource, MouseActions, PointerAction, MOUSE_BUTTON_LEFT};
use fantoccini::{Client, ClientBuilder, Locator};
use onejob::store::schema::{api_tokens, attempts, audit_log, jobs, race_log, users};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{oneshot, Notify};
use tokio::task::{AbortHandle, JoinSet};

use crate::fake_provider::{config_of, strict_task_toml, Behaviour, FakeProvider, Shape};
use crate::helpers::{
    in_ci, spawn_app, spawn_app_with, summarize, test_config, FormClient, TestApp, TestBackend,
};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";
const WAIT: Duration = Duration::from_secs(15);

/// The environment variable that marks every process of one browser: set on
/// chromedriver, inherited by Chromium and everything Chromium starts.
const MARKER_VAR: &str = "ONEJOB_TEST_BROWSER";

/// The processes of one browser, ended (SIGKILL) when this is dropped, also
/// while a failing test unwinds.
///
/// chromedriver leads a process group of its own, and Chromium, its zygotes,
/// renderers and utility processes stay in it, so one signal to the group
/// ends them. Chromium's crashpad handlers start sessions of their own and
/// leave the group; they, and anything else that leaves it, are found by the
/// marker in their environment (or this browser's `--user-data-dir` on their
/// command line) and ended one by one. Other tests' browsers carry other
/// markers and are never touched.
struct BrowserProcesses {
    driver: Child,
    marker: String,
    profile: PathBuf,
}

impl BrowserProcesses {
    fn spawn(port: u16, profile: &Path) -> Self {
        let marker = uuid::Uuid::now_v7().simple().to_string();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .env(MARKER_VAR, &marker)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        Self {
            driver,
            marker,
            profile: profile.to_owned(),
        }
    }

    /// Live processes of this browser, wherever they are (zombies have an
    /// empty environment and command line, so they are not listed).
    fn remaining(&self) -> Vec<u32> {
        let me = std::process::id();
        let env_mark = format!("{MARKER_VAR}={}", self.marker);
        let profile_arg = format!("--user-data-dir={}", self.profile.display());
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| pid != me)
            .filter(|pid| {
                let has = |file: &str, wanted: &[u8]| {
                    std::fs::read(format!("/proc/{pid}/{file}"))
                        .unwrap_or_default()
                        .split(|byte| *byte == 0)
                        .any(|item| item == wanted)
                };
                has("environ", env_mark.as_bytes()) || has("cmdline", profile_arg.as_bytes())
            })
            .collect()
    }
}

fn kill(args: &[String]) {
    let _ = Command::new("kill")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

impl Drop for BrowserProcesses {
    fn drop(&mut self) {
        // The group first, before chromedriver is reaped: until then its
        // pid, which is the group's id, cannot be reused.
        kill(&[
            "-KILL".into(),
            "--".into(),
            format!("-{}", self.driver.id()),
        ]);
        let _ = self.driver.wait();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = self.remaining();
            if left.is_empty() {
                return;
            }
            if Instant::now() > deadline {
                let _ = writeln!(
                    std::io::stderr(),
                    "!!! browser processes {left:?} survived SIGKILL for 10 s"
                );
                return;
            }
            let mut args = vec!["-KILL".to_owned(), "--".to_owned()];
            args.extend(left.iter().map(u32::to_string));
            kill(&args);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

pub struct Browser {
    pub client: Client,
    /// chromedriver's address, for the commands fantoccini does not speak.
    driver_url: String,
    /// Where pages are loaded from when not from the app itself (a proxy).
    origin: Option<String>,
    // Fields drop in this order: the processes end before the profile they
    // write to is removed.
    processes: BrowserProcesses,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session, or `None` (skip
    /// loudly) when they are not installed outside CI.
    pub async fn start() -> Option<Self> {
        Self::start_with(true).await
    }

    /// The same, with page scripts blocked by Chromium's JavaScript content
    /// setting (WebDriver's own scripts still run).
    async fn start_without_javascript() -> Option<Self> {
        Self::start_with(false).await
    }

    async fn start_with(javascript: bool) -> Option<Self> {
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
        let profile = tempfile::tempdir().unwrap();
        // From here on, a panic drops `processes` and ends them.
        let processes = BrowserProcesses::spawn(port, profile.path());
        let mut options = json!({
            "binary": CHROMIUM,
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1280,900",
                format!("--user-data-dir={}", profile.path().display()),
            ],
            // The performance log lists the requests the page sent.
            "perfLoggingPrefs": {"enableNetwork": true},
        });
        if !javascript {
            options["prefs"] = json!({"profile.managed_default_content_settings.javascript": 2});
        }
        let mut caps = serde_json::Map::new();
        caps.insert("goog:chromeOptions".into(), options);
        caps.insert("goog:loggingPrefs".into(), json!({"performance": "ALL"}));
        let driver_url = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        let client = loop {
            match ClientBuilder::rustls()
                .unwrap()
                .capabilities(caps.clone())
                .connect(&driver_url)
                .await
            {
                Ok(client) => break client,
                // chromedriver is not listening yet.
                Err(_) if started.elapsed() < Duration::from_secs(20) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("could not start a Chromium session: {e}"),
            }
        };
        Some(Self {
            client,
            driver_url,
            origin: None,
            processes,
            _profile: profile,
        })
    }

    /// Ends the WebDriver session politely (Chromium closes its windows and
    /// quits), then, on drop, whatever is left.
    pub async fn close(self) {
        let closed =
            tokio::time::timeout(Duration::from_secs(10), self.client.clone().close()).await;
        if !matches!(closed, Ok(Ok(()))) {
            let _ = writeln!(
                std::io::stderr(),
                "the WebDriver session did not close politely ({closed:?}); killing it"
            );
        }
        drop(self);
    }

    /// Loads `path` (no query) and waits until it is loaded.
    pub async fn goto(&self, app: &TestApp, path: &str) {
        let mark = self.mark_document().await;
        let origin = self.origin.as_deref().unwrap_or(&app.address);
        self.client.goto(&format!("{origin}{path}")).await.unwrap();
        self.wait_for_fresh_page(&mark, |p| p == path).await;
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

    /// Two real clicks (pointer down, up, down, up) on the element matching
    /// `css`, in one WebDriver action sequence.
    pub async fn double_click(&self, css: &str) {
        let element = self.client.find(Locator::Css(css)).await.unwrap();
        let double_click = MouseActions::new("mouse".into())
            .then(PointerAction::MoveToElement {
                element,
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
        self.client.perform_actions(double_click).await.unwrap();
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

    /// Marks the document shown now (a property of its `window`), so that
    /// [`Browser::wait_for_fresh_page`] can tell a newly loaded one from it.
    /// An htmx swap keeps the document, and the mark; a page load drops it.
    pub async fn mark_document(&self) -> String {
        let mark = uuid::Uuid::now_v7().to_string();
        let set = self
            .client
            .execute(
                "window.__onejob_marker = arguments[0]; return window.__onejob_marker;",
                vec![json!(mark)],
            )
            .await
            .unwrap();
        assert_eq!(set, json!(mark), "the document could not be marked");
        mark
    }

    /// Waits until a document other than the one marked with `mark` has
    /// loaded, and its path satisfies `ok`; returns the path.
    pub async fn wait_for_fresh_page(&self, mark: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            // An error means a navigation is under way: ask again.
            let state = self
                .client
                .execute(
                    "return window.__onejob_marker === arguments[0] ? 'marked' : document.readyState;",
                    vec![json!(mark)],
                )
                .await;
            if let Ok(Value::String(state)) = state {
                if state == "complete" {
                    let path = self.path().await;
                    if ok(&path) {
                        return path;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "no fresh page replaced the marked one (the browser is on {})",
                self.path().await
            );
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

    /// Runs a script in the page and returns its value.
    pub async fn eval(&self, script: &str) -> Value {
        self.client.execute(script, vec![]).await.unwrap()
    }

    /// Saves the page at 1280 and 390 px wide to `target/screenshots/NAME-WIDTH.png`.
    pub async fn screenshots(&self, name: &str) {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        for (width, height) in [(1280, 900), (390, 844)] {
            self.client.set_window_size(width, height).await.unwrap();
            self.wait_for_layout(width).await;
            let png = self.client.screenshot().await.unwrap();
            std::fs::write(dir.join(format!("{name}-{width}.png")), png).unwrap();
        }
        self.client.set_window_size(1280, 900).await.unwrap();
    }

    /// Waits until the page is laid out for a window `width` px wide: the
    /// viewport has that width, and two animation frames have passed since.
    async fn wait_for_layout(&self, width: u32) {
        let deadline = Instant::now() + WAIT;
        loop {
            let inner = self.eval("return window.innerWidth;").await;
            if inner.as_u64() == Some(u64::from(width)) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the viewport is {inner} px wide, not {width}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.client
            .execute_async(
                "const done = arguments[arguments.length - 1];
                 requestAnimationFrame(() => requestAnimationFrame(() => done(true)));",
                vec![],
            )
            .await
            .unwrap();
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

    /// The text of the element matching `css`.
    pub async fn text_of(&self, css: &str) -> String {
        let path = self.path().await;
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css} on {path}: {e}"))
            .text()
            .await
            .unwrap()
    }

    /// An attribute of the element matching `css`.
    pub async fn attr_of(&self, css: &str, name: &str) -> Option<String> {
        let path = self.path().await;
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css} on {path}: {e}"))
            .attr(name)
            .await
            .unwrap()
    }

    /// Chooses the option with this value in the `<select>` matching `css`.
    pub async fn select(&self, css: &str, value: &str) {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap()
            .select_by_value(value)
            .await
            .unwrap();
    }

    /// Empties the field matching `css`, then types `text` into it.
    pub async fn replace_text(&self, css: &str, text: &str) {
        let field = self.client.find(Locator::Css(css)).await.unwrap();
        field.clear().await.unwrap();
        if !text.is_empty() {
            field.send_keys(text).await.unwrap();
        }
    }

    /// Marks the page's `<main>`, so that [`Browser::wait_for_fresh_content`]
    /// can tell new content from it, whether it comes with a new document (a
    /// native navigation) or is swapped into this one (a boosted htmx
    /// request, a history restore).
    pub async fn mark_content(&self) -> String {
        let mark = uuid::Uuid::now_v7().to_string();
        let set = self
            .client
            .execute(
                "const main = document.querySelector('main');
                 main.setAttribute('data-test-mark', arguments[0]);
                 return main.getAttribute('data-test-mark');",
                vec![json!(mark)],
            )
            .await
            .unwrap();
        assert_eq!(set, json!(mark), "the content could not be marked");
        mark
    }

    /// Waits until the page's `<main>` is not the one marked with `mark`, the
    /// document is loaded, and its path satisfies `ok`; returns the path.
    pub async fn wait_for_fresh_content(&self, mark: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            // An error means a navigation is under way: ask again.
            let state = self
                .client
                .execute(
                    "const main = document.querySelector('main');
                     if (!main || main.getAttribute('data-test-mark') === arguments[0]) return 'marked';
                     return document.readyState;",
                    vec![json!(mark)],
                )
                .await;
            if let Ok(Value::String(state)) = state {
                if state == "complete" {
                    let path = self.path().await;
                    if ok(&path) {
                        return path;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "no fresh content replaced the marked one (the browser is on {})",
                self.path().await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Clicks the element matching `css` and waits for the content it brings,
    /// at a path that satisfies `ok`; returns the path.
    pub async fn click_and_wait(&self, css: &str, ok: impl Fn(&str) -> bool) -> String {
        let mark = self.mark_content().await;
        self.click(css).await;
        self.wait_for_fresh_content(&mark, ok).await
    }

    /// Signs out with the header's button.
    pub async fn sign_out(&self) {
        self.click_and_wait("form.signout button", |p| p == "/login")
            .await;
    }

    /// At 1280 and 390 px wide: asserts that the page does not scroll
    /// sideways (`scrollWidth <= innerWidth`), that no table scrolls inside
    /// its frame, and that every field, button, link and cell of the content
    /// lies within the viewport's width, so all of it can be reached and
    /// used; with `save`, also saves the screenshots as
    /// [`Browser::screenshots`] does.
    pub async fn assert_fits_at_each_width(&self, name: &str, save: bool) {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/screenshots");
        for (width, height) in [(1280, 900), (390, 844)] {
            self.client.set_window_size(width, height).await.unwrap();
            self.wait_for_layout(width).await;
            let problems = self
                .eval(
                    "const width = window.innerWidth, problems = [];
                     const page = document.documentElement.scrollWidth;
                     if (page > width) problems.push(`the page is ${page} px wide`);
                     for (const wrap of document.querySelectorAll('main .table-wrap')) {
                       if (wrap.scrollWidth > wrap.clientWidth + 1)
                         problems.push(`a table needs ${wrap.scrollWidth} px in ${wrap.clientWidth}`);
                     }
                     const parts = 'input:not([type=hidden]), select, textarea, button, a, td, th, h1, h2, code, p';
                     for (const element of document.querySelectorAll('header.top, main, main :is(' + parts + ')')) {
                       const r = element.getBoundingClientRect();
                       if (r.width === 0 && r.height === 0) continue;
                       if (r.left < -1 || r.right > width + 1) {
                         const what = element.tagName.toLowerCase() + (element.className ? '.' + element.className : '');
                         problems.push(`${what} '${element.textContent.trim().slice(0, 30)}' spans ${Math.round(r.left)}..${Math.round(r.right)} px`);
                       }
                     }
                     return problems;",
                )
                .await;
            assert_eq!(
                problems,
                json!([]),
                "{name} at {width} px ({}): something sticks out sideways",
                self.path().await
            );
            if save {
                std::fs::create_dir_all(&dir).unwrap();
                let png = self.client.screenshot().await.unwrap();
                std::fs::write(dir.join(format!("{name}-{width}.png")), png).unwrap();
            }
        }
        self.client.set_window_size(1280, 900).await.unwrap();
        self.wait_for_layout(1280).await;
    }

    /// The requests Chromium sent since the last call, from its performance
    /// log (`Network.requestWillBeSent`; reading drains the log).
    async fn sent_requests(&self) -> Vec<SentRequest> {
        let session = self
            .client
            .session_id()
            .await
            .unwrap()
            .expect("a WebDriver session");
        let log: Value = reqwest::Client::new()
            .post(format!("{}/session/{session}/se/log", self.driver_url))
            .json(&json!({"type": "performance"}))
            .send()
            .await
            .expect("chromedriver answers")
            .json()
            .await
            .expect("a JSON log");
        let entries = log["value"]
            .as_array()
            .unwrap_or_else(|| panic!("no performance log: {log}"));
        entries
            .iter()
            .filter_map(|entry| {
                let message: Value = serde_json::from_str(entry["message"].as_str()?).ok()?;
                let message = &message["message"];
                if message["method"] != "Network.requestWillBeSent" {
                    return None;
                }
                let params = &message["params"];
                let request = &params["request"];
                let url = reqwest::Url::parse(request["url"].as_str()?).ok()?;
                Some(SentRequest {
                    method: request["method"].as_str()?.to_owned(),
                    path: url.path().to_owned(),
                    kind: params["type"].as_str().unwrap_or_default().to_owned(),
                    headers: request["headers"].as_object().cloned().unwrap_or_default(),
                    post_data: request["postData"].as_str().map(str::to_owned),
                })
            })
            .collect()
    }
}

/// One request Chromium sent, as its performance log tells it.
#[derive(Debug)]
struct SentRequest {
    method: String,
    path: String,
    /// `Document` for a navigation (a native form submission), `XHR` or
    /// `Fetch` for a script's request.
    kind: String,
    headers: serde_json::Map<String, Value>,
    post_data: Option<String>,
}

impl SentRequest {
    fn has_header(&self, name: &str) -> bool {
        self.headers
            .keys()
            .any(|key| key.eq_ignore_ascii_case(name))
    }
}

pub(crate) fn is_job_path(path: &str) -> bool {
    path.strip_prefix("/jobs/")
        .is_some_and(|id| onejob::domain::JobId::parse(id).is_some())
}

/// A DevTools-protocol connection straight to one page of a browser (a
/// WebSocket to the port Chromium wrote into its profile), for what
/// chromedriver cannot do.
struct DevTools {
    socket: tokio::net::TcpStream,
    next_id: u64,
}

impl DevTools {
    /// Connects to the browser's page whose URL is `url`.
    async fn connect(browser: &Browser, url: &str) -> Self {
        let active = std::fs::read_to_string(browser.processes.profile.join("DevToolsActivePort"))
            .expect("Chromium wrote its DevTools port");
        let port: u16 = active.lines().next().unwrap().parse().unwrap();
        let targets: Value = reqwest::get(format!("http://127.0.0.1:{port}/json/list"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let target = targets
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == "page" && t["url"] == url)
            .unwrap_or_else(|| panic!("no page at {url}: {targets:#}"));
        let socket_url = target["webSocketDebuggerUrl"].as_str().unwrap();
        let path = socket_url
            .strip_prefix(&format!("ws://127.0.0.1:{port}"))
            .unwrap_or_else(|| panic!("an unexpected DevTools address: {socket_url}"));
        let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        socket
            .write_all(
                format!(
                    "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n\
                     Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
                     Sec-WebSocket-Version: 13\r\n\r\n"
                )
                .as_bytes(),
            )
            .await
            .unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            head.push(socket.read_u8().await.unwrap());
        }
        let head = String::from_utf8_lossy(&head);
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        Self { socket, next_id: 1 }
    }

    /// Calls a method and returns its result.
    async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let message = json!({"id": id, "method": method, "params": params}).to_string();
        // A client's frames are masked; one final text frame.
        let mask = [0x6f, 0x6e, 0x65, 0x6a];
        let mut frame = vec![0x81];
        match message.len() {
            len if len < 126 => frame.push(0x80 | len as u8),
            len if len <= 0xffff => {
                frame.push(0x80 | 126);
                frame.extend((len as u16).to_be_bytes());
            }
            len => {
                frame.push(0x80 | 127);
                frame.extend((len as u64).to_be_bytes());
            }
        }
        frame.extend(mask);
        frame.extend(message.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.socket.write_all(&frame).await.unwrap();
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let reply = tokio::time::timeout_at(deadline, self.read_message())
                .await
                .unwrap_or_else(|_| panic!("DevTools did not answer {method} in {WAIT:?}"));
            let reply: Value = serde_json::from_str(&reply).unwrap();
            if reply["id"] == id {
                assert!(reply["error"].is_null(), "{method}: {reply}");
                return reply["result"].clone();
            }
        }
    }

    /// Reads one whole message (text), skipping control frames.
    async fn read_message(&mut self) -> String {
        let mut message = Vec::new();
        loop {
            let first = self.socket.read_u8().await.unwrap();
            let second = self.socket.read_u8().await.unwrap();
            let len = match second & 0x7f {
                126 => u64::from(self.socket.read_u16().await.unwrap()),
                127 => self.socket.read_u64().await.unwrap(),
                len => u64::from(len),
            };
            let mut mask = [0u8; 4];
            if second & 0x80 != 0 {
                self.socket.read_exact(&mut mask).await.unwrap();
            }
            let mut payload = vec![0u8; len as usize];
            self.socket.read_exact(&mut payload).await.unwrap();
            if second & 0x80 != 0 {
                for (i, byte) in payload.iter_mut().enumerate() {
                    *byte ^= mask[i % 4];
                }
            }
            match first & 0x0f {
                0x8 => panic!("DevTools closed the connection"),
                0x9 | 0xa => continue,
                _ => message.extend(payload),
            }
            if first & 0x80 != 0 {
                return String::from_utf8(message).unwrap();
            }
        }
    }

    /// A left click at (`x`, `y`) (CSS pixels of the viewport): the pointer
    /// moves there, presses and releases; `count` is the click's place in a
    /// multi-click (2 for the second click of a double click).
    async fn click(&mut self, x: f64, y: f64, count: u32) {
        for (kind, buttons) in [("mouseMoved", 0), ("mousePressed", 1), ("mouseReleased", 0)] {
            let mut params = json!({"type": kind, "x": x, "y": y, "buttons": buttons});
            if kind != "mouseMoved" {
                params["button"] = json!("left");
                params["clickCount"] = json!(count);
            }
            self.call("Input.dispatchMouseEvent", params).await;
        }
    }
}

// What the server counted and stored.

/// One sample of a Prometheus text exposition.
struct Sample<'a> {
    name: &'a str,
    labels: Vec<(String, String)>,
    value: f64,
}

impl Sample<'_> {
    fn has(&self, key: &str, value: &str) -> bool {
        self.labels.iter().any(|(k, v)| k == key && v == value)
    }
}

/// Reads one sample line (`name{key="value",…} number`); `None` for
/// comments and anything else.
fn parse_sample(line: &str) -> Option<Sample<'_>> {
    if line.starts_with('#') {
        return None;
    }
    let name_end = line.find(['{', ' '])?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(mut set) = rest.strip_prefix('{') {
        loop {
            set = set.trim_start_matches(',');
            if let Some(after) = set.strip_prefix('}') {
                rest = after;
                break;
            }
            let (key, quoted) = set.split_once("=\"")?;
            let (mut value, mut escaped, mut end) = (String::new(), false, None);
            for (i, c) in quoted.char_indices() {
                match (escaped, c) {
                    (true, 'n') => value.push('\n'),
                    (true, other) => value.push(other),
                    (false, '\\') => {
                        escaped = true;
                        continue;
                    }
                    (false, '"') => {
                        end = Some(i);
                        break;
                    }
                    (false, other) => value.push(other),
                }
                escaped = false;
            }
            labels.push((key.to_owned(), value));
            set = &quoted[end? + 1..];
        }
    }
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// The sum of the samples called `name` whose labels include all of `labels`.
fn metric_sum(exposition: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    exposition
        .lines()
        .filter_map(parse_sample)
        .filter(|sample| sample.name == name && labels.iter().all(|(k, v)| sample.has(k, v)))
        .map(|sample| sample.value)
        .sum()
}

async fn metrics(app: &TestApp) -> String {
    let response = app.get(&app.ada.token, "/metrics").await;
    assert_eq!(response.status(), 200, "GET /metrics");
    response.text().await.unwrap()
}

/// How many `POST /jobs` (the submit form) the server has answered, any status.
async fn form_posts_served(app: &TestApp) -> u64 {
    let exposition = metrics(app).await;
    metric_sum(
        &exposition,
        "onejob_http_request_seconds_count",
        &[("method", "POST"), ("route", "/jobs")],
    ) as u64
}

/// A job row, as stored (JSON columns as their text).
#[derive(Debug, Queryable)]
struct JobRow {
    id: String,
    idempotency_key: String,
    status: String,
    input: String,
    result: Option<String>,
    completed_by: Option<String>,
}

impl JobRow {
    fn input(&self) -> Value {
        serde_json::from_str(&self.input).unwrap()
    }

    fn result(&self) -> Option<Value> {
        self.result
            .as_deref()
            .map(|result| serde_json::from_str(result).unwrap())
    }
}

/// Every job the user owns, oldest first.
async fn job_rows(app: &TestApp, owner: &onejob::domain::UserId) -> Vec<JobRow> {
    let owner = owner.clone();
    app.with_conn(move |conn| {
        jobs::table
            .filter(jobs::owner_id.eq(owner))
            .order(jobs::created_at)
            .select((
                jobs::id,
                jobs::idempotency_key,
                jobs::status,
                jobs::input,
                jobs::result,
                jobs::completed_by,
            ))
            .load(conn)
            .unwrap()
    })
    .await
}

/// An attempt row, as stored.
#[derive(Debug, Queryable)]
pub(crate) struct AttemptRow {
    pub id: String,
    pub number: i32,
    pub provider: String,
    pub state: String,
    pub outcome: Option<String>,
}

/// The job's attempts, by number.
pub(crate) async fn attempt_rows(app: &TestApp, job_id: &str) -> Vec<AttemptRow> {
    let job_id = job_id.to_owned();
    app.with_conn(move |conn| {
        attempts::table
            .filter(attempts::job_id.eq(job_id))
            .order(attempts::number)
            .select((
                attempts::id,
                attempts::number,
                attempts::provider,
                attempts::state,
                attempts::outcome,
            ))
            .load(conn)
            .unwrap()
    })
    .await
}

/// What attempt rows say: (number, provider, state, outcome) each.
pub(crate) fn summary(rows: &[AttemptRow]) -> Vec<(i32, &str, &str, Option<&str>)> {
    rows.iter()
        .map(|a| {
            (
                a.number,
                a.provider.as_str(),
                a.state.as_str(),
                a.outcome.as_deref(),
            )
        })
        .collect()
}

/// An audit-log row, as stored.
#[derive(Debug, Queryable)]
struct AuditRow {
    actor_id: String,
    action: String,
    job_id: Option<String>,
    attempt_id: Option<String>,
    reason: String,
}

/// The whole audit log, oldest first.
async fn audit_rows(app: &TestApp) -> Vec<AuditRow> {
    app.with_conn(|conn| {
        audit_log::table
            .order((audit_log::at, audit_log::id))
            .select((
                audit_log::actor_id,
                audit_log::action,
                audit_log::job_id,
                audit_log::attempt_id,
                audit_log::reason,
            ))
            .load(conn)
            .unwrap()
    })
    .await
}

/// A race-log row, as stored.
#[derive(Debug, Queryable)]
pub(crate) struct RaceRow {
    pub losing_attempt_id: String,
    pub winning_attempt_id: Option<String>,
    pub provider: String,
    version_read: i64,
    version_found: i64,
    payload_sha256: String,
}

/// The job's race-log rows.
pub(crate) async fn race_rows(app: &TestApp, job_id: &str) -> Vec<RaceRow> {
    let job_id = job_id.to_owned();
    app.with_conn(move |conn| {
        race_log::table
            .filter(race_log::job_id.eq(job_id))
            .select((
                race_log::losing_attempt_id,
                race_log::winning_attempt_id,
                race_log::provider,
                race_log::version_read,
                race_log::version_found,
                race_log::payload_sha256,
            ))
            .load(conn)
            .unwrap()
    })
    .await
}

/// A user row, as stored.
#[derive(Debug, Queryable)]
struct UserRow {
    role: String,
    disabled_at: Option<i64>,
    password_hash: Option<String>,
}

/// The user called `name`, if there is one.
async fn user_row(app: &TestApp, name: &str) -> Option<UserRow> {
    let name = name.to_owned();
    app.with_conn(move |conn| {
        users::table
            .filter(users::name.eq(name))
            .select((users::role, users::disabled_at, users::password_hash))
            .first(conn)
            .optional()
            .unwrap()
    })
    .await
}

/// How many API tokens the user called `name` has.
async fn token_count(app: &TestApp, name: &str) -> i64 {
    let name = name.to_owned();
    app.with_conn(move |conn| {
        api_tokens::table
            .inner_join(users::table)
            .filter(users::name.eq(name))
            .count()
            .get_result(conn)
            .unwrap()
    })
    .await
}

/// One audit entry about a user: (actor, action, subject, reason), names
/// for ids.
type UserAudit = (String, String, String, String);

/// The audit log's entries about users, oldest first.
async fn user_audit(app: &TestApp) -> Vec<UserAudit> {
    app.with_conn(|conn| {
        let names: Vec<(String, String)> = users::table
            .select((users::id, users::name))
            .load(conn)
            .unwrap();
        let name = |id: &str| {
            names
                .iter()
                .find(|(user, _)| user == id)
                .map_or_else(|| format!("unknown user {id}"), |(_, name)| name.clone())
        };
        let rows: Vec<(String, String, Option<String>, String)> = audit_log::table
            .filter(audit_log::subject_user_id.is_not_null())
            .order((audit_log::at, audit_log::id))
            .select((
                audit_log::actor_id,
                audit_log::action,
                audit_log::subject_user_id,
                audit_log::reason,
            ))
            .load(conn)
            .unwrap();
        rows.into_iter()
            .map(|(actor, action, subject, reason)| {
                (
                    name(&actor),
                    action,
                    name(subject.as_deref().unwrap_or_default()),
                    reason,
                )
            })
            .collect()
    })
    .await
}

/// A job as the search page lists it: (id, owner's name, key, status).
type ListedJob = (String, String, String, String);

/// Every job, newest first, with its owner's name.
async fn every_job(app: &TestApp) -> Vec<ListedJob> {
    app.with_conn(|conn| {
        jobs::table
            .inner_join(users::table.on(users::id.eq(jobs::owner_id)))
            .order((jobs::created_at.desc(), jobs::id.desc()))
            .select((jobs::id, users::name, jobs::idempotency_key, jobs::status))
            .load(conn)
            .unwrap()
    })
    .await
}

/// Polls the database until `done` holds for the job's attempts (panics
/// after `WAIT`).
async fn wait_for_attempts(
    app: &TestApp,
    job_id: &str,
    done: impl Fn(&[AttemptRow]) -> bool,
) -> Vec<AttemptRow> {
    let deadline = Instant::now() + WAIT;
    loop {
        let rows = attempt_rows(app, job_id).await;
        if done(&rows) {
            return rows;
        }
        assert!(
            Instant::now() < deadline,
            "the attempts of job {job_id} never reached the expected state: {rows:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

// Fake providers that hold every answer until the test releases it.

/// An OpenAI-compatible fake provider. `timeout_ms` is its soft timeout (the
/// connect timeout is shorter, as the configuration requires); the
/// late-result window is long, so that a held answer released after the soft
/// timeout is still heard, however slow the machine.
fn held_provider_toml(name: &str, base_url: &str, timeout_ms: u64) -> String {
    format!(
        r#"
[[providers]]
name = "{name}"
kind = "openai"
base_url = "{base_url}"
model = "fake-model"
api_key_env = "ONEJOB_TEST_FAKE_KEY"
timeout_ms = {timeout_ms}
late_result_ms = 600000
connect_timeout_ms = {connect_timeout_ms}
"#,
        connect_timeout_ms = (timeout_ms / 2).min(1000)
    )
}

fn answer(summary: &str) -> Behaviour {
    Behaviour::Answer(json!({ "summary": summary }))
}

/// onejob with one task, `summarize`, on one fake provider that holds every
/// call until the test releases it, with a soft timeout long enough that a
/// held call stays `running`.
async fn app_with_a_held_provider(backend: TestBackend) -> (TestApp, FakeProvider) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    fake.set_default(Behaviour::Hold);
    let toml = [
        held_provider_toml("held", &fake.base_url, 600_000),
        strict_task_toml("summarize", &["held"], "Summarize: {{ text }}"),
    ]
    .concat();
    (spawn_app_with(backend, config_of(&toml)).await, fake)
}

// A proxy that keeps one answer from the browser.

/// One request the proxy passed to the app, and the app's answer.
#[derive(Clone, Debug)]
struct ProxiedRequest {
    method: String,
    path: String,
    /// Whether it carried `HX-Request` (htmx sent it).
    from_htmx: bool,
    status: u16,
}

#[derive(Default)]
struct ProxyState {
    /// Hold the app's answer to the next `POST /jobs`.
    hold_next_form_post: bool,
    /// The held answer's release.
    held: Option<oneshot::Sender<()>>,
    /// How many answers have been held in all.
    held_count: usize,
    passed: Vec<ProxiedRequest>,
}

#[derive(Default)]
struct ProxyShared {
    state: std::sync::Mutex<ProxyState>,
    changed: Notify,
}

impl ProxyShared {
    fn state(&self) -> std::sync::MutexGuard<'_, ProxyState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A reverse proxy on 127.0.0.1 between the browser and the app, one request
/// per connection. It passes every request on at once, and can keep the
/// app's answer to one `POST /jobs` from the browser until the test releases
/// it: the app has handled that submission, but the browser, still waiting,
/// shows the form, so a second click lands while the first submission is in
/// flight. The test, not the clock, orders the two.
struct HoldingProxy {
    origin: String,
    shared: Arc<ProxyShared>,
    server: AbortHandle,
}

impl HoldingProxy {
    async fn start(app: &TestApp) -> Self {
        let upstream: std::net::SocketAddr = app
            .address
            .strip_prefix("http://")
            .unwrap()
            .parse()
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap());
        let shared = Arc::new(ProxyShared::default());
        let accept = {
            let shared = shared.clone();
            async move {
                // Dropping the set (when the loop is aborted) aborts every
                // connection, held ones too.
                let mut connections = JoinSet::new();
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    while connections.try_join_next().is_some() {}
                    connections.spawn(proxy_connection(stream, upstream, shared.clone()));
                }
            }
        };
        let server = tokio::spawn(accept).abort_handle();
        Self {
            origin,
            shared,
            server,
        }
    }

    /// Holds the app's answer to the next `POST /jobs`.
    fn hold_next_form_post(&self) {
        self.shared.state().hold_next_form_post = true;
    }

    /// Waits until an answer is held (panics after `WAIT`).
    async fn wait_held(&self) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let changed = self.shared.changed.notified();
            if self.shared.state().held.is_some() {
                return;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                panic!("no POST /jobs reached the proxy in {WAIT:?}");
            }
        }
    }

    /// Lets the held answer go to the browser (which may have moved on).
    fn release(&self) {
        let held = self.shared.state().held.take().expect("an answer is held");
        let _ = held.send(());
    }

    fn held_count(&self) -> usize {
        self.shared.state().held_count
    }

    /// The requests passed to the app so far, oldest first.
    fn passed(&self) -> Vec<ProxiedRequest> {
        self.shared.state().passed.clone()
    }
}

impl Drop for HoldingProxy {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Reads one request, passes it to the app with `Connection: close`, reads
/// the whole answer, holds it if asked to, and writes it back.
async fn proxy_connection(
    mut browser: tokio::net::TcpStream,
    upstream: std::net::SocketAddr,
    shared: Arc<ProxyShared>,
) {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos;
        }
        let mut chunk = [0u8; 8192];
        match browser.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let Ok(head) = std::str::from_utf8(&buf[..head_end]) else {
        return;
    };
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default().to_owned();
    let mut parts = request_line.split(' ');
    let method = parts.next().unwrap_or_default().to_owned();
    let path = parts.next().unwrap_or_default().to_owned();
    let mut forwarded = format!("{request_line}\r\n");
    let (mut length, mut from_htmx) = (0, false);
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let name = name.trim().to_ascii_lowercase();
        match name.as_str() {
            "connection" | "keep-alive" | "proxy-connection" => continue,
            "content-length" => length = value.trim().parse().unwrap_or(0),
            "hx-request" => from_htmx = true,
            _ => {}
        }
        forwarded.push_str(line);
        forwarded.push_str("\r\n");
    }
    forwarded.push_str("Connection: close\r\n\r\n");
    let mut body = buf.split_off(head_end + 4);
    while body.len() < length {
        let mut chunk = [0u8; 8192];
        match browser.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }

    let Ok(mut app) = tokio::net::TcpStream::connect(upstream).await else {
        return;
    };
    let mut answer = Vec::new();
    let sent = async {
        app.write_all(forwarded.as_bytes()).await?;
        app.write_all(&body).await?;
        app.read_to_end(&mut answer).await
    };
    if sent.await.is_err() {
        return;
    }
    let status = std::str::from_utf8(&answer[..answer.len().min(12)])
        .ok()
        .and_then(|line| line.get(9..12)?.parse().ok())
        .unwrap_or(0);

    let held = {
        let mut state = shared.state();
        state.passed.push(ProxiedRequest {
            method: method.clone(),
            path: path.clone(),
            from_htmx,
            status,
        });
        if state.hold_next_form_post && method == "POST" && path == "/jobs" {
            let (release, released) = oneshot::channel();
            state.hold_next_form_post = false;
            state.held = Some(release);
            state.held_count += 1;
            Some(released)
        } else {
            None
        }
    };
    shared.changed.notify_waiters();
    if let Some(released) = held {
        let _ = released.await;
    }
    // The app was asked to close, so its answer says `Connection: close`.
    let _ = browser.write_all(&answer).await;
    let _ = browser.shutdown().await;
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

async fn a_double_click_with_htmx_boost_off_sends_two_native_posts_and_makes_one_job(
    backend: TestBackend,
) {
    let (app, fake) = app_with_a_held_provider(backend).await;
    app.set_password("alice", "alice-pw").await;
    let proxy = HoldingProxy::start(&app).await;
    let Some(mut browser) = Browser::start().await else {
        return;
    };
    browser.origin = Some(proxy.origin.clone());
    browser.sign_in(&app, "alice", "alice-pw").await;
    browser.goto(&app, "/jobs/new").await;
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
    app.set_password("alice", "alice-pw").await;
    let proxy = HoldingProxy::start(&app).await;
    let Some(mut browser) = Browser::start_without_javascript().await else {
        return;
    };
    browser.origin = Some(proxy.origin.clone());
    browser.sign_in(&app, "alice", "alice-pw").await;
    browser.goto(&app, "/jobs/new").await;
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

/// Applies `action` to the user called `name` from their row of the Users
/// page, with `reason`, and waits for the answer; returns its path.
async fn act_on_user(browser: &Browser, name: &str, action: &str, reason: &str) -> String {
    let row = format!("tr.user-row[data-user='{name}']");
    browser
        .select(&format!("{row} select[name=action]"), action)
        .await;
    browser
        .fill(&format!("{row} input[name=reason]"), reason)
        .await;
    browser
        .click_and_wait(&format!("{row} button"), |p| p.starts_with("/admin/users"))
        .await
}

/// Asserts that `secret` is nowhere in the page, nor in the page's web
/// storage (where htmx would keep its history cache).
async fn assert_not_kept(browser: &Browser, secret: &str) {
    let source = browser.client.source().await.unwrap();
    assert!(
        !source.contains(secret),
        "the password is still in the page at {}",
        browser.path().await
    );
    let stored = browser
        .client
        .execute(
            "const found = [];
             for (const store of [localStorage, sessionStorage]) {
               for (let i = 0; i < store.length; i++) {
                 const key = store.key(i);
                 if ((key + store.getItem(key)).includes(arguments[0])) found.push(key);
               }
             }
             return found;",
            vec![json!(secret)],
        )
        .await
        .unwrap();
    assert_eq!(stored, json!([]), "the password is kept in web storage");
}

/// The Users page's rows: (name, role, disabled, tokens) each.
async fn listed_users(browser: &Browser) -> Value {
    browser
        .eval(
            "return [...document.querySelectorAll('tr.user-row')].map(row => [
               row.dataset.user,
               row.querySelector('td[data-label=Role]').textContent.trim(),
               row.querySelector('td[data-label=State]').textContent.trim(),
               row.querySelector('td[data-label=Tokens]').textContent.trim(),
             ]);",
        )
        .await
}

async fn an_admin_adds_resets_disables_enables_promotes_and_revokes_on_the_users_page(
    backend: TestBackend,
) {
    let app = spawn_app(backend).await;
    app.set_password("ada", "ada-pw").await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    browser.sign_in(&app, "ada", "ada-pw").await;
    browser.goto(&app, "/admin").await;
    let mark = browser.mark_content().await;
    browser.click_link("Users").await;
    browser
        .wait_for_fresh_content(&mark, |p| p == "/admin/users")
        .await;
    assert_eq!(
        listed_users(&browser).await,
        json!([
            ["ada", "admin", "active", "1"],
            ["alice", "user", "active", "1"],
            ["bob", "user", "active", "1"],
            ["sue", "support", "active", "1"],
        ])
    );

    // Add a support user: the password is shown once, on the answer page.
    browser.fill("form.add-user input[name=name]", "zoe").await;
    browser
        .select("form.add-user select[name=role]", "support")
        .await;
    browser
        .fill("form.add-user input[name=reason]", "new support hire")
        .await;
    browser
        .click_and_wait("form.add-user button", |p| p == "/admin/users")
        .await;
    assert_eq!(
        browser.text_of("#user-done h1").await,
        "added zoe as support"
    );
    let password = browser.text_of("#new-password").await;
    assert_eq!(password.len(), 20, "a generated password: {password:?}");
    let zoe = user_row(&app, "zoe").await.expect("zoe is stored");
    assert_eq!((zoe.role.as_str(), zoe.disabled_at), ("support", None));
    let hash = zoe.password_hash.clone().expect("zoe has a password");
    assert!(
        hash.starts_with("$argon2id$") && !hash.contains(&password),
        "only the password's hash is stored"
    );
    // Back to the list: the password is gone from the page and is kept
    // nowhere in the browser; going Back does not bring it again.
    browser
        .click_and_wait("#user-done a.button", |p| p == "/admin/users")
        .await;
    assert_eq!(
        browser
            .count("tr.user-row[data-user=zoe][data-role=support]")
            .await,
        1
    );
    assert_not_kept(&browser, &password).await;
    let mark = browser.mark_content().await;
    browser.client.back().await.unwrap();
    browser
        .wait_for_fresh_content(&mark, |p| p == "/admin/users")
        .await;
    assert_eq!(browser.count("#new-password").await, 0);
    assert_eq!(browser.count("tr.user-row").await, 5, "the list, again");
    assert_not_kept(&browser, &password).await;

    // The shown password is zoe's: she signs in with it. She is support:
    // the console opens, the Users page refuses her with a readable page.
    browser.sign_out().await;
    browser.sign_in(&app, "zoe", &password).await;
    browser.goto(&app, "/admin").await;
    assert_eq!(browser.text_of("main h1").await, "Console");
    assert_eq!(browser.count("a[href='/admin/users']").await, 0);
    browser.goto(&app, "/admin/users").await;
    assert_eq!(browser.text_of("main h1").await, "Not allowed");
    let refusal = browser.text_of("main").await;
    assert!(
        refusal.contains("This is for admins.") && refusal.contains("HTTP 403"),
        "{refusal}"
    );
    assert_eq!(browser.count("tr.user-row").await, 0, "no user is listed");
    browser.goto(&app, "/jobs/new").await;
    browser.sign_out().await;

    // Reset zoe's password: a new one is shown once; it works, the old
    // one does not.
    browser.sign_in(&app, "ada", "ada-pw").await;
    browser.goto(&app, "/admin/users").await;
    act_on_user(&browser, "zoe", "reset-password", "forgot her password").await;
    assert_eq!(
        browser.text_of("#user-done h1").await,
        "new password for zoe; their sessions ended"
    );
    let new_password = browser.text_of("#new-password").await;
    assert_eq!(new_password.len(), 20);
    assert_ne!(new_password, password);
    browser.assert_fits_at_each_width("user-done", false).await;
    let stored = user_row(&app, "zoe").await.unwrap().password_hash.unwrap();
    assert_ne!(stored, hash, "a new hash is stored");
    FormClient::new(&app).sign_in("zoe", &new_password).await;
    let old = FormClient::new(&app);
    let page = old.get("/login").await.text().await.unwrap();
    let csrf = crate::helpers::hidden_value(&page, "csrf");
    let refused = old
        .post_form(
            "/login",
            &[("name", "zoe"), ("password", &password), ("csrf", &csrf)],
        )
        .await;
    assert_ne!(refused.status(), 303, "the old password no longer signs in");
    browser
        .click_and_wait("#user-done a.button", |p| p == "/admin/users")
        .await;
    assert_not_kept(&browser, &new_password).await;

    // Disable bob, then enable him again.
    assert_eq!(
        act_on_user(&browser, "bob", "disable", "left the team").await,
        "/admin/users"
    );
    assert_eq!(
        browser
            .attr_of("tr.user-row[data-user=bob]", "data-disabled")
            .await
            .as_deref(),
        Some("true")
    );
    assert_eq!(
        browser
            .text_of("tr.user-row[data-user=bob] td[data-label=State]")
            .await,
        "disabled"
    );
    assert!(user_row(&app, "bob").await.unwrap().disabled_at.is_some());
    assert_eq!(
        browser
            .count("tr.user-row[data-user=bob] option[value=enable]")
            .await,
        1,
        "a disabled user can be enabled"
    );
    act_on_user(&browser, "bob", "enable", "back from leave").await;
    assert_eq!(
        browser
            .attr_of("tr.user-row[data-user=bob]", "data-disabled")
            .await
            .as_deref(),
        Some("false")
    );
    assert_eq!(user_row(&app, "bob").await.unwrap().disabled_at, None);

    // Make alice support.
    act_on_user(&browser, "alice", "role-support", "joined the support team").await;
    assert_eq!(
        browser
            .attr_of("tr.user-row[data-user=alice]", "data-role")
            .await
            .as_deref(),
        Some("support")
    );
    assert_eq!(user_row(&app, "alice").await.unwrap().role, "support");

    // Revoke alice's API tokens: her token stops working.
    assert_eq!(token_count(&app, "alice").await, 1);
    assert_eq!(
        app.get(&app.alice.token, "/api/v1/jobs").await.status(),
        200
    );
    act_on_user(&browser, "alice", "revoke-tokens", "laptop lost").await;
    assert_eq!(token_count(&app, "alice").await, 0);
    assert_eq!(
        app.get(&app.alice.token, "/api/v1/jobs").await.status(),
        401
    );
    assert_eq!(
        listed_users(&browser).await,
        json!([
            ["ada", "admin", "active", "1"],
            ["alice", "support", "active", "0"],
            ["bob", "user", "active", "1"],
            ["sue", "support", "active", "1"],
            ["zoe", "support", "active", "0"],
        ])
    );

    // Each action is audited as ada's, on its user, with its reason.
    let audit = user_audit(&app).await;
    let expected = [
        ("add_user", "zoe", "added zoe as support: new support hire"),
        (
            "reset_password",
            "zoe",
            "new password for zoe; their sessions ended: forgot her password",
        ),
        ("disable_user", "bob", "disabled bob: left the team"),
        ("enable_user", "bob", "enabled bob: back from leave"),
        (
            "set_role",
            "alice",
            "alice is now support: joined the support team",
        ),
        (
            "revoke_tokens",
            "alice",
            "revoked 1 API token(s) of alice: laptop lost",
        ),
    ];
    let expected: Vec<UserAudit> = expected
        .iter()
        .map(|(action, subject, reason)| {
            (
                "ada".to_owned(),
                (*action).to_owned(),
                (*subject).to_owned(),
                (*reason).to_owned(),
            )
        })
        .collect();
    assert_eq!(audit, expected);

    // The longest name allowed, with nowhere to break it, still fits.
    let longest = "w".repeat(64);
    app.with_conn(move |conn| {
        onejob::store::users::add_user(conn, &longest, onejob::domain::Role::User).map(drop)
    })
    .await
    .unwrap();
    browser.goto(&app, "/admin/users").await;
    browser
        .assert_fits_at_each_width("users", backend == TestBackend::Sqlite)
        .await;
    // So does its owner's own name in the page header.
    app.set_password(&"w".repeat(64), "long-pw").await;
    browser.sign_out().await;
    browser.sign_in(&app, &"w".repeat(64), "long-pw").await;
    browser
        .assert_fits_at_each_width("long-name", backend == TestBackend::Sqlite)
        .await;
    browser.close().await;
}

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

/// The server's count of `method route` answered with `status`.
fn answered(exposition: &str, method: &str, route: &str, status: &str) -> u64 {
    metric_sum(
        exposition,
        "onejob_http_request_seconds_count",
        &[("method", method), ("route", route), ("status", status)],
    ) as u64
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
    support_abandons_an_unknown_attempt_from_the_queue_and_starts_the_next_one,
    the_race_log_shows_a_reverse_order_finish_and_links_to_the_job,
    a_user_without_the_role_cannot_open_the_console,
    an_admin_adds_resets_disables_enables_promotes_and_revokes_on_the_users_page,
    support_finds_jobs_by_owner_status_key_and_id_and_opens_them,
    back_and_submit_again_unchanged_with_javascript_lands_on_the_same_job,
    back_and_submit_again_edited_with_javascript_gets_the_key_reused_page,
    back_and_submit_again_unchanged_without_javascript_lands_on_the_same_job,
    back_and_submit_again_edited_without_javascript_gets_the_key_reused_page,
);
