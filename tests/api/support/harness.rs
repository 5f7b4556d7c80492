//! `TestApp`: spawns onejob on port 0 against an isolated database, with four
//! users (alice and bob: user, sue: support, ada: admin).

use std::io::Write;
use std::net::TcpListener;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use onejob::config::{Config, Environment};
use onejob::domain::{Role, UserId};
use onejob::providers::Providers;
use onejob::startup::{open_store, Application};
use onejob::store::{users, DatabaseUrl, Store};
use reqwest::{Response, StatusCode};
use serde_json::{json, Value};

/// Runs each listed scenario on both backends.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(crate::support::harness::TestBackend::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    if crate::support::harness::postgres_available() {
                        super::$name(crate::support::harness::TestBackend::Postgres).await
                    }
                }
            )*
        }
    };
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestBackend {
    Sqlite,
    Postgres,
}

/// The PostgreSQL server the tests use, without a database name.
pub fn postgres_server_url() -> String {
    std::env::var("ONEJOB_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

/// Whether this run is CI, where nothing may be skipped: `CI` set to
/// anything but empty, `false` or `0`.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// Whether PostgreSQL is reachable. In CI an unreachable server fails the
/// test; elsewhere the PostgreSQL half is skipped with a loud line on stderr
/// (written past the test harness's output capture).
pub fn postgres_available() -> bool {
    static AVAILABLE: OnceLock<Result<(), String>> = OnceLock::new();
    let status = AVAILABLE.get_or_init(|| {
        PgConnection::establish(&format!("{}/postgres", postgres_server_url()))
            .map(drop)
            .map_err(|e| e.to_string())
    });
    match status {
        Ok(()) => true,
        Err(error) if in_ci() => panic!(
            "PostgreSQL is required in CI but {} is unreachable: {error}",
            postgres_server_url()
        ),
        Err(error) => {
            static WARNED: OnceLock<()> = OnceLock::new();
            WARNED.get_or_init(|| {
                let _ = writeln!(
                    std::io::stderr(),
                    "\n!!!!!!!!\n!!! SKIPPING THE POSTGRESQL HALF OF THE SUITE: {} is unreachable ({error}).\n\
                     !!! Start PostgreSQL or set ONEJOB_TEST_POSTGRES; CI never skips.\n!!!!!!!!\n",
                    postgres_server_url()
                );
            });
            false
        }
    }
}

/// An isolated database: a SQLite file in a temp dir, or a fresh PostgreSQL
/// database dropped (with its connections) when the test ends.
pub struct TestDb {
    pub url: DatabaseUrl,
    pg_name: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    /// A database with every migration applied.
    pub fn create(backend: TestBackend) -> Self {
        Self::new(backend, Some(migrated_template()))
    }

    /// A database with nothing in it yet (PostgreSQL: copied from
    /// `template0`), for tests of what starting does to an empty database.
    pub fn create_empty(backend: TestBackend) -> Self {
        Self::new(backend, None)
    }

    /// A database made elsewhere (say, on a Citus coordinator), used as
    /// it is and never dropped.
    pub fn existing(url: &str) -> Self {
        Self {
            url: DatabaseUrl::parse(url).unwrap(),
            pg_name: None,
            _dir: None,
        }
    }

    /// The store over this database, opened as the server opens it (on a
    /// blocking thread: opening checks a connection).
    pub async fn open_store(&self) -> Store {
        let url = self.url.clone();
        tokio::task::spawn_blocking(move || {
            onejob::startup::open_store(&url, &test_config(DEFAULT_TEST_PROVIDERS)).unwrap()
        })
        .await
        .unwrap()
    }

    /// The PostgreSQL database's name (none for SQLite).
    pub fn postgres_name(&self) -> Option<&str> {
        self.pg_name.as_deref()
    }

    fn new(backend: TestBackend, template: Option<&str>) -> Self {
        match backend {
            TestBackend::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let path = dir.path().join("onejob-test.db");
                Self {
                    url: DatabaseUrl::parse(path.to_str().unwrap()).unwrap(),
                    pg_name: None,
                    _dir: Some(dir),
                }
            }
            TestBackend::Postgres => {
                let name = format!("onejob_test_{}", uuid::Uuid::now_v7().simple());
                let template = template.unwrap_or("template0");
                let mut admin =
                    PgConnection::establish(&format!("{}/postgres", postgres_server_url()))
                        .expect("connect to PostgreSQL");
                admin
                    .batch_execute(&format!("CREATE DATABASE {name} TEMPLATE {template}"))
                    .expect("create test database");
                Self {
                    url: DatabaseUrl::parse(&format!("{}/{name}", postgres_server_url())).unwrap(),
                    pg_name: Some(name),
                    _dir: None,
                }
            }
        }
    }
}

/// A PostgreSQL database with every migration applied, that test databases
/// are copied from (`CREATE DATABASE … TEMPLATE`) instead of each migrating
/// itself. Its name carries a digest of the migrations, so a changed
/// migration makes a new template; it is kept between runs.
fn migrated_template() -> &'static str {
    static TEMPLATE: OnceLock<String> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let name = format!("onejob_template_{}", migrations_digest());
        let server = postgres_server_url();
        let mut admin =
            PgConnection::establish(&format!("{server}/postgres")).expect("connect to PostgreSQL");
        // Another test process may be building the same template.
        admin
            .batch_execute("SELECT pg_advisory_lock(727272)")
            .expect("lock");
        let exists = diesel::select(diesel::dsl::sql::<diesel::sql_types::Bool>(&format!(
            "EXISTS (SELECT 1 FROM pg_database WHERE datname = '{name}')"
        )))
        .get_result::<bool>(&mut admin)
        .expect("look for the template");
        if !exists {
            let building = format!("{name}_building");
            // One statement per call: neither may run inside a transaction block.
            for statement in [
                format!("DROP DATABASE IF EXISTS {building} WITH (FORCE)"),
                format!("CREATE DATABASE {building}"),
            ] {
                admin
                    .batch_execute(&statement)
                    .expect("create the template database");
            }
            {
                let url = DatabaseUrl::parse(&format!("{server}/{building}")).unwrap();
                let store = open_store(&url, &test_config(DEFAULT_TEST_PROVIDERS))
                    .expect("migrate the template database");
                drop(store);
            }
            // Renamed only once complete: a half-built template is never used.
            for statement in [
                format!("ALTER DATABASE {building} RENAME TO {name}"),
                format!("ALTER DATABASE {name} IS_TEMPLATE true"),
            ] {
                admin
                    .batch_execute(&statement)
                    .expect("publish the template database");
            }
        }
        admin
            .batch_execute("SELECT pg_advisory_unlock(727272)")
            .expect("unlock");
        name
    })
}

/// A short digest of the PostgreSQL migrations' names and contents.
fn migrations_digest() -> String {
    use sha2::{Digest, Sha256};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/postgres");
    let mut files: Vec<_> = walk(&root);
    files.sort();
    let mut hasher = Sha256::new();
    for file in files {
        hasher.update(
            file.strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .as_bytes(),
        );
        hasher.update(std::fs::read(&file).unwrap());
    }
    hex::encode(&hasher.finalize()[..6])
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(name) = &self.pg_name {
            if let Ok(mut admin) =
                PgConnection::establish(&format!("{}/postgres", postgres_server_url()))
            {
                let _ =
                    admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
            }
        }
    }
}

/// The providers and tasks most scenarios use; a test may pass its own.
pub const DEFAULT_TEST_PROVIDERS: &str = r#"
[[providers]]
name = "sim-fast"
kind = "simulated"
latency_ms = 20
timeout_ms = 3000
late_result_ms = 5000

[[providers]]
name = "sim-slow"
kind = "simulated"
latency_ms = 1500
timeout_ms = 300
late_result_ms = 10000

[[tasks]]
name = "summarize"
providers = ["sim-fast", "sim-slow"]
input_fields = ["text"]

[[tasks.golden]]
input = { text = "golden example" }
"#;

/// The API key the fake providers expect (`api_key_env = "ONEJOB_TEST_FAKE_KEY"`).
pub const FAKE_API_KEY: &str = "sk-onejob-test-0123456789abcdef";
/// The callback key (`callback_secret_env = "ONEJOB_TEST_CALLBACK_KEY"`).
pub const CALLBACK_KEY: &str = "callback-key-for-tests-0123456789abcdef0123456789";

/// The environment test configurations are resolved in: given explicitly,
/// never set on the test process.
pub fn test_environment() -> Environment {
    Environment::from_pairs([
        ("ONEJOB_TEST_FAKE_KEY", FAKE_API_KEY),
        ("ONEJOB_TEST_CALLBACK_KEY", CALLBACK_KEY),
        ("AWS_ACCESS_KEY_ID", crate::support::aws::ACCESS_KEY_ID),
        (
            "AWS_SECRET_ACCESS_KEY",
            crate::support::aws::SECRET_ACCESS_KEY,
        ),
        ("AWS_SESSION_TOKEN", crate::support::aws::SESSION_TOKEN),
        ("AWS_REGION", crate::support::aws::REGION),
    ])
}

/// A configuration for tests: fast polling, short leases, 2 HTTP workers.
pub fn test_config(providers_and_tasks: &str) -> Config {
    let mut config = Config::from_toml(providers_and_tasks, "test", &test_environment())
        .expect("valid test configuration");
    config.server.http_workers = 2;
    config.server.shutdown_grace_ms = 1000;
    config.worker.poll_interval_ms = 50;
    config.worker.lease_ms = 2000;
    config
}

pub struct TestUser {
    pub id: UserId,
    pub token: String,
}

pub struct TestApp {
    /// The application the server fronts (use cases, providers).
    pub app: onejob::app::App,
    pub address: String,
    pub client: reqwest::Client,
    pub store: Store,
    pub providers: Providers,
    pub alice: TestUser,
    pub bob: TestUser,
    pub sue: TestUser,
    pub ada: TestUser,
    server: tokio::task::JoinHandle<()>,
    pub db: TestDb,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Spawns onejob with the default test providers.
pub async fn spawn_app(backend: TestBackend) -> TestApp {
    spawn_app_with(backend, test_config(DEFAULT_TEST_PROVIDERS)).await
}

pub async fn spawn_app_with(backend: TestBackend, config: Config) -> TestApp {
    PreparedApp::new(backend, config).await.start().await
}

/// [`spawn_app`], every statement its store sends recorded into `log`.
pub async fn spawn_recorded(
    backend: TestBackend,
    log: &super::statement_log::StatementLog,
) -> TestApp {
    PreparedApp::new(backend, test_config(DEFAULT_TEST_PROVIDERS))
        .await
        .recording(log)
        .await
        .start()
        .await
}

/// A database with users, before the server starts: a test can arrange rows
/// (as another process would have) and then start the app on them.
pub struct PreparedApp {
    pub db: TestDb,
    pub store: Store,
    pub config: Config,
    pub alice: TestUser,
    pub bob: TestUser,
    pub sue: TestUser,
    pub ada: TestUser,
}

impl PreparedApp {
    pub async fn new(backend: TestBackend, config: Config) -> Self {
        let db = TestDb::create(backend);
        let store = {
            let (url, config) = (db.url.clone(), config.clone());
            tokio::task::spawn_blocking(move || open_store(&url, &config))
                .await
                .unwrap()
                .expect("open store")
        };
        let make_users = {
            let store = store.clone();
            move || {
                let mut conn = store.conn().unwrap();
                let mut add = |name: &str, role| {
                    let (user, token) = users::add_user(&mut conn, name, role).unwrap();
                    TestUser {
                        id: user.id,
                        token: token.0,
                    }
                };
                (
                    add("alice", Role::User),
                    add("bob", Role::User),
                    add("sue", Role::Support),
                    add("ada", Role::Admin),
                )
            }
        };
        let (alice, bob, sue, ada) = tokio::task::spawn_blocking(make_users).await.unwrap();
        Self {
            db,
            store,
            config,
            alice,
            bob,
            sue,
            ada,
        }
    }

    /// Runs blocking store code against the database.
    pub async fn with_conn<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut onejob::store::DbConnection) -> T + Send + 'static,
    ) -> T {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || f(&mut store.conn().unwrap()))
            .await
            .unwrap()
    }

    /// The same database and users, served through `store` (one built
    /// another way, recording its statements, say).
    pub fn with_store(mut self, store: Store) -> Self {
        self.store = store;
        self
    }

    /// The same database and users, served through a store that records
    /// every statement its connections send into `log`.
    pub async fn recording(self, log: &super::statement_log::StatementLog) -> Self {
        let (url, settings, log) = (
            self.db.url.clone(),
            self.config.database.clone(),
            log.instrumenter(),
        );
        let store =
            tokio::task::spawn_blocking(move || Store::connect_instrumented(&url, &settings, log))
                .await
                .unwrap()
                .unwrap();
        self.with_store(store)
    }

    pub async fn start(self) -> TestApp {
        let (address, app, server) = start_instance(self.config.clone(), self.store.clone()).await;
        let providers = app.providers().clone();
        TestApp {
            app,
            address,
            client: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            store: self.store,
            providers,
            alice: self.alice,
            bob: self.bob,
            sue: self.sue,
            ada: self.ada,
            server,
            db: self.db,
        }
    }
}

/// Starts one server process's worth of onejob (HTTP server + worker) on `store`.
pub async fn start_instance(
    config: Config,
    store: Store,
) -> (String, onejob::app::App, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    let application = Application::build(config, store, listener)
        .await
        .expect("build app");
    let address = format!("http://127.0.0.1:{}", application.port());
    let app = application.app();
    let server = tokio::spawn(async move {
        let _ = application.run_until_stopped().await;
    });
    (address, app, server)
}

pub fn summarize(text: &str) -> Value {
    json!({"task": "summarize", "input": {"text": text}})
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    /// `POST /api/v1/jobs` with a JSON body.
    pub async fn post_job(&self, token: &str, key: &str, body: &Value) -> Response {
        self.client
            .post(self.url("/api/v1/jobs"))
            .bearer_auth(token)
            .header("Idempotency-Key", key)
            .json(body)
            .send()
            .await
            .expect("request sent")
    }

    /// Creates a job and returns its id, asserting 201.
    pub async fn create_job(&self, token: &str, key: &str, body: &Value) -> String {
        let response = self.post_job(token, key, body).await;
        assert_eq!(response.status(), StatusCode::CREATED);
        let job: Value = response.json().await.unwrap();
        job["id"].as_str().unwrap().to_owned()
    }

    pub async fn get(&self, token: &str, path: &str) -> Response {
        self.client
            .get(self.url(path))
            .bearer_auth(token)
            .send()
            .await
            .expect("request sent")
    }

    pub async fn get_job(&self, token: &str, job_id: impl AsRef<str>) -> Value {
        let job_id = job_id.as_ref();
        let response = self.get(token, &format!("/api/v1/jobs/{job_id}")).await;
        assert_eq!(response.status(), StatusCode::OK, "GET job {job_id}");
        response.json().await.unwrap()
    }

    /// Polls the job until `done` holds, or panics after `within`.
    pub async fn wait_for_job(
        &self,
        job_id: impl AsRef<str>,
        within: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let job_id = job_id.as_ref();
        let deadline = Instant::now() + within;
        loop {
            let job = self.get_job(&self.ada.token, job_id).await;
            if done(&job) {
                return job;
            }
            if Instant::now() > deadline {
                panic!("job {job_id} did not reach the expected state in {within:?}: {job:#}");
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    pub async fn wait_for_status(
        &self,
        job_id: impl AsRef<str>,
        status: &str,
        within: Duration,
    ) -> Value {
        self.wait_for_job(job_id, within, |j| j["status"] == status)
            .await
    }

    pub async fn start_attempt(
        &self,
        token: &str,
        job_id: impl AsRef<str>,
        body: Option<Value>,
    ) -> Response {
        let job_id = job_id.as_ref();
        let request = self
            .client
            .post(self.url(&format!("/api/v1/jobs/{job_id}/attempts")))
            .bearer_auth(token);
        let request = match body {
            Some(body) => request.json(&body),
            None => request,
        };
        request.send().await.expect("request sent")
    }

    pub async fn abandon(&self, token: &str, attempt_id: &str, reason: &str) -> Response {
        self.client
            .post(self.url(&format!("/api/v1/attempts/{attempt_id}/abandon")))
            .bearer_auth(token)
            .json(&json!({ "reason": reason }))
            .send()
            .await
            .expect("request sent")
    }

    /// Runs blocking store code against the app's database.
    pub async fn with_conn<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut onejob::store::DbConnection) -> T + Send + 'static,
    ) -> T {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || f(&mut store.conn().unwrap()))
            .await
            .unwrap()
    }

    /// How many job rows the user owns.
    pub async fn job_count(&self, owner_id: &UserId) -> i64 {
        use onejob::store::schema::jobs;
        let owner = owner_id.clone();
        self.with_conn(move |conn| {
            jobs::table
                .filter(jobs::owner_id.eq(owner))
                .count()
                .get_result(conn)
                .unwrap()
        })
        .await
    }

    /// Attempt ids the named provider has been sent, in order.
    pub fn sent(&self, provider: &str) -> Vec<String> {
        self.providers
            .get(provider)
            .expect("configured provider")
            .sent_attempts()
    }
}

/// Reads a problem+json response, asserting its status and `type`.
pub async fn assert_problem(response: Response, status: StatusCode, slug: &str) -> Value {
    assert_eq!(response.status(), status, "status for {slug}");
    let content_type = response
        .headers()
        .get("content-type")
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(content_type, "application/problem+json");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["type"], format!("/problems/{slug}"), "{body:#}");
    assert_eq!(body["status"], status.as_u16());
    body
}

impl TestApp {
    /// Gives a test user a browser password.
    pub async fn set_password(&self, name: &str, password: &str) {
        self.app.set_password(name, password).await.unwrap();
    }
}

/// A cookie-keeping HTTP client that behaves like a browser without JavaScript.
pub struct FormClient {
    pub http: reqwest::Client,
    pub base: String,
}

impl FormClient {
    pub fn new(app: &TestApp) -> Self {
        Self::at(&app.address)
    }

    /// A client for a server at `base` (e.g. one started as a separate process).
    pub fn at(base: &str) -> Self {
        let http = reqwest::Client::builder()
            .cookie_store(true)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        Self {
            http,
            base: base.to_owned(),
        }
    }

    pub async fn get(&self, path: &str) -> Response {
        self.http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap()
    }

    /// The page at `path` as htmx asks for it (`HX-Request`): its partial.
    pub async fn partial(&self, path: &str) -> String {
        self.http
            .get(format!("{}{path}", self.base))
            .header("HX-Request", "true")
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    pub async fn post_form(&self, path: &str, form: &[(&str, &str)]) -> Response {
        self.http
            .post(format!("{}{path}", self.base))
            .form(form)
            .send()
            .await
            .unwrap()
    }

    /// Abandons an unknown attempt from the console's Unknown queue, as
    /// support does, giving `reason`.
    pub async fn abandon_attempt(&self, csrf: &str, attempt: &str, reason: &str) -> Response {
        self.post_form(
            &format!("/admin/attempts/{attempt}/abandon"),
            &[("csrf", csrf), ("reason", reason)],
        )
        .await
    }

    /// Signs in through the sign-in form; returns the session's CSRF token.
    pub async fn sign_in(&self, name: &str, password: &str) -> String {
        let page = self.get("/login").await.text().await.unwrap();
        let csrf = hidden_value(&page, "csrf");
        let response = self
            .post_form(
                "/login",
                &[("name", name), ("password", password), ("csrf", &csrf)],
            )
            .await;
        assert_eq!(
            response.status(),
            StatusCode::SEE_OTHER,
            "sign-in as {name}"
        );
        let page = self.get("/jobs").await.text().await.unwrap();
        hidden_value(&page, "csrf")
    }

    /// Opens the submit form as a browser does: `/jobs/new` redirects to a
    /// URL that carries the form's key; returns that URL's path and the page.
    pub async fn open_submit_form(&self, query: &str) -> (String, String) {
        let response = self.get(&format!("/jobs/new{query}")).await;
        assert_eq!(
            response.status(),
            StatusCode::SEE_OTHER,
            "a fresh form gets its key first"
        );
        let location = response.headers()["location"].to_str().unwrap().to_owned();
        assert!(location.starts_with("/jobs/new?key="), "{location}");
        let page = self.get(&location).await;
        assert_eq!(page.status(), StatusCode::OK);
        (location, page.text().await.unwrap())
    }
}

/// The value of `<input type="hidden" name="NAME" value="…">` in a page.
pub fn hidden_value(html: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let start = html
        .find(&marker)
        .unwrap_or_else(|| panic!("no hidden {name} in the page"))
        + marker.len();
    html[start..].split('"').next().unwrap().to_owned()
}

/// Runs `onejob users <args>` against the app's database, as an operator
/// would from another process; it must succeed.
pub fn onejob_users(app: &TestApp, args: &[&str]) -> std::process::Output {
    onejob_users_on(&app.db, args)
}

/// Runs `onejob users <args>` against `db` (which must exist); it must
/// succeed.
pub fn onejob_users_on(db: &TestDb, args: &[&str]) -> std::process::Output {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_onejob"))
        .arg("users")
        .args(args)
        .env("DATABASE_URL", db.url.as_str())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "onejob users {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Keeps a bounded run's figures (load, chaos) where `.ci/run` prints them
/// after the suite: `target/test-figures/NAME.txt`.
pub fn record_figures(name: &str, figures: &str) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-figures");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}.txt")), format!("{figures}\n")).unwrap();
}

/// Alice's chat completion under `key`, not yet sent.
pub fn chat_request(app: &TestApp, key: &str, body: &serde_json::Value) -> reqwest::RequestBuilder {
    app.client
        .post(app.url("/v1/chat/completions"))
        .bearer_auth(&app.alice.token)
        .header("Idempotency-Key", key)
        .json(body)
}
