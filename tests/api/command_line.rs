//! The administration commands open only what they need: `users`,
//! `prune` and `migrate` read no provider secret, `qualify` only the key of
//! the provider it qualifies; every command names the database it opened;
//! one that would make a new SQLite file while administering refuses. And
//! only a process that serves pages creates the first user.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use crate::server_process::ServerProcess;
use crate::support::fake_provider::{Behaviour, FakeProvider, Shape};
use crate::support::harness::{postgres_server_url, TestBackend, TestDb};

/// Environment variables no test process sets: the keys of the two paid
/// providers and the callback key of the configuration below.
const KEY_A: &str = "ONEJOB_CLI_TEST_KEY_A";
const KEY_B: &str = "ONEJOB_CLI_TEST_KEY_B";
const CALLBACK: &str = "ONEJOB_CLI_TEST_CALLBACK_KEY";

/// Two HTTP providers with keys of their own, callbacks on, and a task
/// that fails over from one to the other.
fn paid_config(dir: &Path, fake: &FakeProvider) -> std::path::PathBuf {
    let toml = format!(
        r#"
[server]
public_url = "https://onejob.example.com"
callback_secret_env = "{CALLBACK}"

[[providers]]
name = "paid-a"
kind = "openai"
base_url = "{base}"
model = "model-a"
api_key_env = "{KEY_A}"
timeout_ms = 5000
connect_timeout_ms = 1000

[[providers]]
name = "paid-b"
kind = "openai"
base_url = "{base}"
model = "model-b"
api_key_env = "{KEY_B}"
timeout_ms = 5000
connect_timeout_ms = 1000

[[tasks]]
name = "summarize"
providers = ["paid-a", "paid-b"]
input_fields = ["text"]
template = "Summarize: {{{{ text }}}}"

[[tasks.golden]]
input = {{ text = "golden" }}
expect = {{ "/summary" = "fake summary" }}
"#,
        base = fake.base_url
    );
    let path = dir.join("onejob.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// `onejob ARGS` in `dir`, with none of the paid providers' secrets set
/// and nothing from the test process's own onejob environment.
fn onejob(dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_onejob"));
    command
        .args(args)
        .current_dir(dir)
        .env("RUST_LOG", "warn")
        .env_remove("ONEJOB_CONFIG")
        .env_remove("DATABASE_URL")
        .env_remove("ONEJOB_ROLE")
        .env_remove(KEY_A)
        .env_remove(KEY_B)
        .env_remove(CALLBACK);
    command
}

async fn run(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// How the commands must name `db`: its absolute file, or its URL.
fn named(db: &TestDb) -> String {
    db.url.described()
}

async fn users_prune_and_migrate_need_no_provider_secret_and_qualify_only_its_own(
    backend: TestBackend,
) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    fake.set_default(Behaviour::Answer(json!({"summary": "fake summary"})));
    let dir = tempfile::tempdir().unwrap();
    let config = paid_config(dir.path(), &fake);
    let config = config.to_str().unwrap();
    let db = TestDb::create_empty(backend);
    let url = db.url.as_str();
    let admin = |args: &[&str]| {
        let mut full = vec!["--config", config, "--database-url", url];
        full.extend_from_slice(args);
        onejob(dir.path(), &full)
    };

    // No key, no callback secret: the server refuses, naming the variable.
    let serve = run(admin(&["serve", "--bind", "127.0.0.1:0"])).await;
    assert!(!serve.status.success());
    assert!(stderr(&serve).contains(KEY_A), "{}", stderr(&serve));

    // The administration commands need none of them.
    let migrate = run(admin(&["migrate"])).await;
    assert!(migrate.status.success(), "{}", stderr(&migrate));
    assert!(
        stderr(&migrate).contains(&format!("onejob: using {}", named(&db))),
        "{}",
        stderr(&migrate)
    );
    let added = run(admin(&["users", "add", "admin", "--role", "admin"])).await;
    assert!(added.status.success(), "{}", stderr(&added));
    let token = run(admin(&["users", "token", "admin"])).await;
    assert!(token.status.success(), "{}", stderr(&token));
    assert!(stderr(&token).contains(&named(&db)), "{}", stderr(&token));
    let token = stdout(&token).trim().to_owned();
    assert!(
        token.starts_with("oj_"),
        "the token alone on stdout: {token}"
    );
    for args in [
        &["users", "password", "admin"][..],
        &["users", "disable", "admin"],
        &["users", "enable", "admin"],
        &["prune"],
    ] {
        let output = run(admin(args)).await;
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
        assert!(
            stderr(&output).contains(&named(&db)),
            "{args:?}: {}",
            stderr(&output)
        );
    }

    // `qualify` needs the key of the provider it calls, and only that one.
    let refused = run(admin(&[
        "qualify",
        "--provider",
        "paid-b",
        "--task",
        "summarize",
    ]))
    .await;
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("providers[1].api_key_env") && stderr(&refused).contains(KEY_B),
        "{}",
        stderr(&refused)
    );
    let mut qualify = admin(&["qualify", "--provider", "paid-b", "--task", "summarize"]);
    qualify.env(KEY_B, "sk-only-the-key-of-b");
    let qualified = run(qualify).await;
    assert!(
        qualified.status.success(),
        "{}{}",
        stdout(&qualified),
        stderr(&qualified)
    );
    assert!(stdout(&qualified).contains("qualified: paid-b may take failover for summarize"));
    let sent = fake.last_request().expect("the provider was called");
    assert_eq!(
        sent.header("authorization"),
        Some("Bearer sk-only-the-key-of-b")
    );

    // The token the command printed is one the server knows: the server,
    // with every secret, reads the same database.
    let port = crate::server_process::free_port();
    let mut server = onejob(
        dir.path(),
        &[
            "--config",
            config,
            "--database-url",
            url,
            "serve",
            "--bind",
            &format!("127.0.0.1:{port}"),
        ],
    );
    server
        .env(KEY_A, "sk-a")
        .env(KEY_B, "sk-b")
        .env(CALLBACK, "0123456789abcdef0123456789abcdef")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut server = ChildGuard(server.spawn().unwrap());
    let base = format!("http://127.0.0.1:{port}");
    let mut probe = ServerProcess::probe(port);
    probe.wait_ready_url().await;
    let status = reqwest::Client::new()
        .get(format!("{base}/api/v1/jobs"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, StatusCode::OK);
    server.stop();
}

/// Ends a child process when dropped.
struct ChildGuard(std::process::Child);

impl ChildGuard {
    fn stop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn admin_commands_name_the_database_and_make_no_stray_sqlite_file(backend: TestBackend) {
    let elsewhere = tempfile::tempdir().unwrap();
    match backend {
        TestBackend::Sqlite => {
            // Run from another directory, without the server's --config:
            // the default `onejob.db` there does not exist.
            let stray = elsewhere.path().join("onejob.db");
            for args in [
                &["users", "token", "admin"][..],
                &["users", "add", "kim"],
                &["prune"],
                &["qualify", "--provider", "sim-slow", "--task", "summarize"],
            ] {
                let output = run(onejob(elsewhere.path(), args)).await;
                assert!(!output.status.success(), "{args:?}");
                let said = stderr(&output);
                assert!(
                    said.contains(&format!("there is no database at {}", stray.display()))
                        && said.contains("onejob migrate")
                        && said.contains("--create-database"),
                    "{args:?}: {said}"
                );
                assert!(!stray.exists(), "{args:?} made a stray database file");
            }
            // Asked to, it creates the file, and says which when the user
            // is not there.
            let created = run(onejob(
                elsewhere.path(),
                &["--create-database", "users", "token", "admin"],
            ))
            .await;
            assert!(!created.status.success());
            assert!(stray.exists());
            let said = stderr(&created);
            assert!(
                said.contains(&format!(
                    "onejob: using the SQLite database {}",
                    stray.display()
                )) && said.contains("no user named \"admin\""),
                "{said}"
            );
        }
        TestBackend::Postgres => {
            // A URL with a password (trust authentication ignores it): the
            // commands name the database without it.
            let db = TestDb::create(backend);
            let name = db.postgres_name().unwrap();
            let with_password =
                postgres_server_url().replacen("://postgres@", "://postgres:hunter2@", 1);
            assert!(with_password.contains("hunter2"), "{with_password}");
            let url = format!("{with_password}/{name}");
            let output = run(onejob(
                elsewhere.path(),
                &["--database-url", &url, "users", "token", "admin"],
            ))
            .await;
            let said = stderr(&output);
            assert!(!output.status.success());
            assert!(
                said.contains("onejob: using the PostgreSQL database postgres://postgres:***@")
                    && said.contains(name)
                    && said.contains("no user named \"admin\""),
                "{said}"
            );
            assert!(!said.contains("hunter2"), "{said}");
        }
    }
}

/// `serve --role worker` creates no user and shows no password (nobody can
/// sign in to it); a process that serves pages does, and points at the
/// public URL. A worker-only process without worker slots refuses before
/// it touches the database.
async fn only_a_process_that_serves_pages_creates_the_first_user(backend: TestBackend) {
    let db = TestDb::create_empty(backend);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("onejob.toml");
    let base = format!(
        "[server]\npublic_url = \"https://onejob.example.com\"\n{}",
        crate::support::harness::DEFAULT_TEST_PROVIDERS
    );
    std::fs::write(&config, &base).unwrap();
    let password_file = db
        .url
        .sqlite_folder()
        .unwrap_or_else(|| dir.path().to_path_buf())
        .join("onejob-first-password.txt");

    let idle = dir.path().join("idle.toml");
    std::fs::write(&idle, format!("[worker]\nconcurrency = 0\n{base}")).unwrap();
    let port = crate::server_process::free_port();
    let mut no_slots = ServerProcess::spawn_as(
        dir.path(),
        "no-slots",
        &idle,
        db.url.as_str(),
        port,
        "worker",
    );
    assert!(!no_slots.wait_exit(Duration::from_secs(20)).await.success());
    assert!(no_slots
        .stderr()
        .contains("a worker-only process needs `[worker] concurrency` above 0"));
    assert!(!password_file.exists());
    if let Some(file) = db.url.sqlite_file() {
        assert!(!file.exists(), "refused before the database was made");
    }

    let port = crate::server_process::free_port();
    let mut worker = ServerProcess::spawn_as(
        dir.path(),
        "worker",
        &config,
        db.url.as_str(),
        port,
        "worker",
    );
    worker.wait_ready().await;
    assert!(!password_file.exists(), "a worker made a password");
    let logs = worker.stderr() + &worker.stdout();
    assert!(!logs.contains("first user"), "{logs}");
    assert!(!logs.contains("/login"), "{logs}");

    let port = crate::server_process::free_port();
    let mut http =
        ServerProcess::spawn_as(dir.path(), "http", &config, db.url.as_str(), port, "http");
    http.wait_ready().await;
    assert!(password_file.exists(), "the serving process handed it over");
    assert!(
        http.stderr()
            .contains("sign in at https://onejob.example.com/login"),
        "{}",
        http.stderr()
    );
    for server in [&worker, &http] {
        server.terminate();
    }
    for server in [&mut worker, &mut http] {
        server.wait_exit(Duration::from_secs(30)).await;
    }
}

on_both_backends!(
    users_prune_and_migrate_need_no_provider_secret_and_qualify_only_its_own,
    admin_commands_name_the_database_and_make_no_stray_sqlite_file,
    only_a_process_that_serves_pages_creates_the_first_user,
);
