//! A headless Chromium driven through chromedriver (WebDriver, by
//! fantoccini), with the processes it starts ended when it is dropped.
//!
//! Chromium and chromedriver come from Debian's packages (`.ci/run` installs
//! them). In CI a missing browser fails the tests that ask for one;
//! elsewhere [`Browser::start`] returns `None` and they are skipped with a
//! loud line.
//!
//! Every process a browser starts ends with its test, whether it passes,
//! fails or panics: see [`BrowserProcesses`]. Nothing here waits a fixed time
//! to order events: a test waits for a condition (a fresh page, a row), with
//! a deadline.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::actions::{InputSource, MouseActions, PointerAction, MOUSE_BUTTON_LEFT};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

use crate::support::harness::{in_ci, TestApp};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";
pub const WAIT: Duration = Duration::from_secs(15);

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
    pub origin: Option<String>,
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
    pub async fn start_without_javascript() -> Option<Self> {
        Self::start_with(false).await
    }

    pub async fn start_with(javascript: bool) -> Option<Self> {
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
        let port = crate::server_process::free_port();
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

    /// The browser's profile directory (where Chromium writes its DevTools
    /// port).
    pub fn profile(&self) -> &Path {
        &self.processes.profile
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

    /// Clicks the element matching `css`. A page that refreshes itself may
    /// swap the element for a fresh copy between finding and clicking it;
    /// then the fresh one is clicked, as a person would, until [`WAIT`].
    pub async fn click(&self, css: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            let element = self.client.find(Locator::Css(css)).await.unwrap();
            match element.click().await {
                Ok(()) => return,
                Err(e) if e.is_stale_element_reference() && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("clicking {css}: {e:?}"),
            }
        }
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
        self.wait_until_replaced(
            "return window.__onejob_marker === arguments[0] ? 'marked' : document.readyState;",
            mark,
            ok,
            "no fresh page replaced the marked one",
        )
        .await
    }

    /// Waits until `probe`, a script given `mark`, answers `complete` (it
    /// answers something else while the marked document or content is still
    /// there) and the path satisfies `ok`; returns the path. Fails with
    /// `failure` after [`WAIT`].
    async fn wait_until_replaced(
        &self,
        probe: &str,
        mark: &str,
        ok: impl Fn(&str) -> bool,
        failure: &str,
    ) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            // An error means a navigation is under way: ask again.
            let state = self.client.execute(probe, vec![json!(mark)]).await;
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
                "{failure} (the browser is on {})",
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

    /// Loads `path` again, `every` apart, until the texts of the elements
    /// matching `css` (none, one or many, in document order) satisfy `ok`;
    /// returns them. Fails after `within`, saying what the page last showed.
    ///
    /// For state that another task commits after the page is read: a page
    /// that does not refresh itself (a finished job's, say) stays as it was
    /// read, so waiting on it for that state waits in vain.
    pub async fn reload_until(
        &self,
        app: &TestApp,
        path: &str,
        css: &str,
        within: Duration,
        every: Duration,
        ok: impl Fn(&[String]) -> bool,
    ) -> Vec<String> {
        let deadline = Instant::now() + within;
        loop {
            self.goto(app, path).await;
            let read = self
                .client
                .execute(
                    "return [...document.querySelectorAll(arguments[0])]
                       .map(e => e.innerText.trim());",
                    vec![json!(css)],
                )
                .await
                .unwrap();
            let texts: Vec<String> = serde_json::from_value(read).unwrap();
            if ok(&texts) {
                return texts;
            }
            assert!(
                Instant::now() < deadline,
                "{path} never showed {css} as expected within {within:?}; it shows {texts:?}"
            );
            tokio::time::sleep(every).await;
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
        for (width, height) in [(1280, 900), (390, 844)] {
            self.screenshot_at(name, width, height).await;
        }
        self.client.set_window_size(1280, 900).await.unwrap();
    }

    /// Saves the page in a window of `width` × `height` px to
    /// `target/screenshots/NAME-WIDTH.png`.
    pub async fn screenshot_at(&self, name: &str, width: u32, height: u32) {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        self.client.set_window_size(width, height).await.unwrap();
        self.wait_for_layout(width).await;
        let png = self.client.screenshot().await.unwrap();
        std::fs::write(dir.join(format!("{name}-{width}.png")), png).unwrap();
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
        self.read_fresh(css, |element| async move { element.prop("value").await })
            .await
            .unwrap_or_default()
    }

    /// The text of the element matching `css`.
    pub async fn text_of(&self, css: &str) -> String {
        self.read_fresh(css, |element| async move { element.text().await })
            .await
    }

    /// An attribute of the element matching `css`.
    pub async fn attr_of(&self, css: &str, name: &str) -> Option<String> {
        self.read_fresh(css, |element| async move { element.attr(name).await })
            .await
    }

    /// `read` of the element matching `css`. An element the page swaps
    /// between the look-up and the read (htmx refreshing a job's status,
    /// say) has gone stale: it is looked up again.
    async fn read_fresh<T, F, Fut>(&self, css: &str, read: F) -> T
    where
        F: Fn(fantoccini::elements::Element) -> Fut,
        Fut: std::future::Future<Output = Result<T, fantoccini::error::CmdError>>,
    {
        let path = self.path().await;
        for _ in 0..10 {
            let element = self
                .client
                .find(Locator::Css(css))
                .await
                .unwrap_or_else(|e| panic!("no {css} on {path}: {e}"));
            match read(element).await {
                Ok(value) => return value,
                Err(e) if e.is_stale_element_reference() => continue,
                Err(e) => panic!("reading {css} on {path}: {e}"),
            }
        }
        panic!("{css} on {path} was swapped before every one of ten reads")
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
        self.wait_until_replaced(
            "const main = document.querySelector('main');
             if (!main || main.getAttribute('data-test-mark') === arguments[0]) return 'marked';
             return document.readyState;",
            mark,
            ok,
            "no fresh content replaced the marked one",
        )
        .await
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
    pub async fn sent_requests(&self) -> Vec<SentRequest> {
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
                    query: url.query().map(str::to_owned),
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
pub struct SentRequest {
    pub method: String,
    pub path: String,
    /// The query, if the URL had one.
    pub query: Option<String>,
    /// `Document` for a navigation (a native form submission), `XHR` or
    /// `Fetch` for a script's request.
    pub kind: String,
    pub headers: serde_json::Map<String, Value>,
    pub post_data: Option<String>,
}

impl SentRequest {
    pub fn has_header(&self, name: &str) -> bool {
        self.headers
            .keys()
            .any(|key| key.eq_ignore_ascii_case(name))
    }
}

pub fn is_job_path(path: &str) -> bool {
    path.strip_prefix("/jobs/")
        .is_some_and(|id| onejob::domain::JobId::parse(id).is_some())
}
