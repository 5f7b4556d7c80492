//! The real `onejob` binary against fake providers, on both backends: the
//! API key reaches the provider and nowhere else (not the logs at debug
//! level, the API, the pages or the database), and `onejob qualify` names
//! the failing check, records the failed run and exits non-zero.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use onejob::store::schema::{attempts, audit_log, jobs, qualifications, race_log};
use onejob::store::{Attempt, Job, QualificationRun, RaceEntry, Store};
use serde_json::Value;

use crate::support::fake_provider::{
    strict_task_toml, Behaviour, FakeProvider, ProviderToml, Shape, WAIT,
};
use crate::support::harness::{
    summarize, test_config, FormClient, TestBackend, TestDb, DEFAULT_TEST_PROVIDERS, FAKE_API_KEY,
};

/// An OpenAI-compatible provider entry whose soft timeout no answer from
/// 127.0.0.1 comes near (a refusal is never raced by the clock into
/// `unknown`).
fn provider(name: &str, base_url: &str) -> String {
    ProviderToml::openai(name, base_url)
        .timeout_ms(30_000)
        .late_result_ms(5000)
        .connect_timeout_ms(Some(1000))
        .toml()
}

/// The binary, configured by `config_path`, on the test database.
fn onejob(config_path: &std::path::Path, db: &TestDb) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_onejob"));
    command
        .env("ONEJOB_CONFIG", config_path)
        .env("DATABASE_URL", db.url.as_str())
        .env("ONEJOB_TEST_FAKE_KEY", FAKE_API_KEY);
    command
}

/// Runs a command to completion off the async threads.
async fn output_of(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

/// Opens the test database (as another process would) after the binary is done with it.
async fn open(db: &TestDb) -> Store {
    let url = db.url.clone();
    tokio::task::spawn_blocking(move || {
        onejob::startup::open_store(&url, &test_config(DEFAULT_TEST_PROVIDERS)).unwrap()
    })
    .await
    .unwrap()
}

/// Every stored row that can hold text from a provider or an operator.
#[derive(Debug)]
struct Everything {
    jobs: Vec<Job>,
    attempts: Vec<Attempt>,
    races: Vec<RaceEntry>,
    audit_reasons: Vec<String>,
    qualifications: Vec<QualificationRun>,
}

async fn everything(store: &Store) -> Everything {
    let store = store.clone();
    tokio::task::spawn_blocking(move || {
        let conn = &mut store.conn().unwrap();
        Everything {
            jobs: jobs::table.select(Job::as_select()).load(conn).unwrap(),
            attempts: attempts::table
                .order(attempts::number.asc())
                .select(Attempt::as_select())
                .load(conn)
                .unwrap(),
            races: race_log::table
                .select(RaceEntry::as_select())
                .load(conn)
                .unwrap(),
            audit_reasons: audit_log::table
                .select(audit_log::reason)
                .load(conn)
                .unwrap(),
            qualifications: qualifications::table
                .order((qualifications::qualified_at.asc(), qualifications::id.asc()))
                .select(QualificationRun::as_select())
                .load(conn)
                .unwrap(),
        }
    })
    .await
    .unwrap()
}

/// Runs the real binary against a fake provider: the API key must reach the
/// provider and nowhere else (logs at debug level, the API, the job page,
/// the providers page, the database).
async fn the_api_key_never_appears_in_logs_or_pages(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    // The provider echoes the request back in an error, as some do.
    fake.push(Behaviour::Status {
        status: 400,
        retry_after: None,
        body: format!("bad request; key {FAKE_API_KEY}? no: redacted"),
    });
    let db = TestDb::create(backend);
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("onejob.toml");
    let toml = [
        provider("fake", &fake.base_url),
        provider("fake2", &fake.base_url),
        strict_task_toml("summarize", &["fake", "fake2"], "Summarize: {{ text }}"),
    ]
    .concat();
    std::fs::write(&config_path, toml).unwrap();
    let port = crate::server_process::free_port();
    let cli = |args: &[&str]| {
        let mut command = onejob(&config_path, &db);
        command.args(args).env("RUST_LOG", "debug");
        output_of(command)
    };
    // As an operator would: the database first, then its first user.
    let migrated = cli(&["migrate"]).await;
    assert!(
        migrated.status.success(),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );
    let added = cli(&["users", "add", "kim", "--role", "admin"]).await;
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    let token = String::from_utf8(added.stdout).unwrap().trim().to_owned();
    let password = String::from_utf8(cli(&["users", "password", "kim"]).await.stdout)
        .unwrap()
        .trim()
        .to_owned();
    let log = dir.path().join("serve.log");
    let err_log = dir.path().join("serve.err");
    let mut server = onejob(&config_path, &db)
        .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
        .env("RUST_LOG", "debug")
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(&err_log).unwrap())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder()
        .cookie_store(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let mut ready = false;
    for _ in 0..100 {
        if client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "the server did not start");
    let created: Value = client
        .post(format!("{base}/api/v1/jobs"))
        .bearer_auth(&token)
        .header("Idempotency-Key", "secret-check")
        .json(&summarize("keep it secret"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let job_id = created["id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + WAIT;
    let job = loop {
        let job: Value = client
            .get(format!("{base}/api/v1/jobs/{job_id}"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if job["status"] == "failed" || job["status"] == "succeeded" || Instant::now() > deadline {
            break job;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The 400 is a definite failure; fake2 was never qualified, so the job
    // failed, quoting the provider's answer with the key masked.
    assert_eq!(job["status"], "failed", "{job:#}");
    let error = job["attempts"][0]["error"].as_str().unwrap();
    assert!(
        error.contains("bad request; key ***? no: redacted"),
        "{error}"
    );
    assert!(
        fake.requests()
            .iter()
            .any(|r| r.header("authorization") == Some(format!("Bearer {FAKE_API_KEY}").as_str())),
        "the key reached the provider"
    );
    // Sign in and read the pages.
    let browser = FormClient::at(&base);
    browser.sign_in("kim", &password).await;
    let page = browser
        .get(&format!("/jobs/{job_id}"))
        .await
        .text()
        .await
        .unwrap();
    let providers_page = browser.get("/admin/providers").await.text().await.unwrap();
    let _ = server.kill();
    let _ = server.wait();
    let logs = std::fs::read_to_string(&err_log).unwrap() + &std::fs::read_to_string(&log).unwrap();
    assert!(
        page.contains(&job_id) && providers_page.contains("fake2"),
        "the pages were read"
    );
    assert!(logs.contains("attempt sent"), "debug logs were captured");

    let stored = everything(&open(&db).await).await;
    assert_eq!(stored.jobs.len(), 1);
    assert!(stored.races.is_empty() && stored.audit_reasons.is_empty());
    assert_eq!(
        stored.attempts[0]
            .reason()
            .map(|r| r.for_staff())
            .as_deref(),
        Some(error),
        "the API shows what is stored"
    );
    assert!(
        stored.jobs[0]
            .failure_reason
            .as_deref()
            .is_some_and(|r| r.contains("refused the request with 400")),
        "{:?}",
        stored.jobs[0].failure_reason
    );
    let database = format!("{stored:?}");
    for (what, text) in [
        ("the logs", logs.as_str()),
        ("the API", &job.to_string()),
        ("the job page", page.as_str()),
        ("the providers page", providers_page.as_str()),
        ("the database", database.as_str()),
    ] {
        let leak = text.find(FAKE_API_KEY).map(|at| around(text, at));
        assert!(
            leak.is_none(),
            "the API key leaked into {what}: …{}…",
            leak.unwrap_or_default()
        );
    }
}

/// Up to 300 bytes before `at` and 60 after, cut at character boundaries.
fn around(text: &str, at: usize) -> &str {
    let mut start = at.saturating_sub(300);
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    let mut end = (at + 60).min(text.len());
    while !text.is_char_boundary(end) {
        end += 1;
    }
    &text[start..end]
}

/// `onejob qualify` against a misbehaving provider names the failing check,
/// records the failed run, and exits non-zero.
async fn onejob_qualify_names_the_failing_check_and_exits_non_zero(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    fake.set_default(Behaviour::AnswerText(
        "I would be glad to summarize that for you.".into(),
    ));
    let db = TestDb::create(backend);
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("onejob.toml");
    let toml = [
        provider("primary", &fake.base_url),
        provider("chatty", &fake.base_url),
        strict_task_toml("summarize", &["primary", "chatty"], "Summarize: {{ text }}"),
    ]
    .concat();
    std::fs::write(&config_path, toml).unwrap();
    // The database the server would have made.
    drop(open(&db).await);
    let mut command = onejob(&config_path, &db);
    command.args(["qualify", "--provider", "chatty", "--task", "summarize"]);
    let output = output_of(command).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "exit status: {:?}", output.status);
    assert!(stdout.contains("PASS template renders"), "{stdout}");
    assert!(
        stdout.contains("FAIL golden[0] answer: invalid_output: the answer is not JSON"),
        "{stdout}"
    );
    assert!(
        stderr.contains("not qualified: golden[0] answer failed"),
        "{stderr}"
    );
    assert!(fake.total_requests() > 0, "the provider was called");

    // The failed run is recorded, so the gate keeps chatty out.
    let stored = everything(&open(&db).await).await;
    assert_eq!(
        stored.qualifications.len(),
        1,
        "{:?}",
        stored.qualifications
    );
    let run = &stored.qualifications[0];
    assert_eq!(
        (run.provider.as_str(), run.task.as_str(), run.model.as_str()),
        ("chatty", "summarize", "fake-model")
    );
    assert!(!run.passed);
    assert!(
        run.checks.contains("the answer is not JSON"),
        "{}",
        run.checks
    );
    assert!(stored.jobs.is_empty() && stored.attempts.is_empty());
}

on_both_backends!(
    the_api_key_never_appears_in_logs_or_pages,
    onejob_qualify_names_the_failing_check_and_exits_non_zero,
);
