//! The README's quick start and the API walk-through it leads to
//! (docs/api.md, "Walk-through"), run as written, at a person's pace: every
//! shell command of the README's "Quick start" section, then of
//! docs/api.md's "Walk-through" (each up to the next `## ` heading), runs
//! in order, in bash, with the built `onejob` on the PATH (what
//! `cargo install --path .` gives) and the real server the quick start
//! starts.
//!
//! What a command's comment claims is checked against its output:
//!
//! - `→ NNN`: the HTTP status it answers (the command prints it: `curl -i`);
//! - each `…` in backquotes: text the output holds (case aside, for headers);
//! - a comment starting "N s later": the step waits at least that long (and
//!   a person's pause), and its claims hold at once then;
//! - a comment starting "Later": the claims come true while the step is
//!   repeated, a pause apart (the late answer).
//!
//! `localhost:8080` is the test server's address; `<id>` the job the last
//! `POST /api/v1/jobs` made, `<attempt-id>` that job's attempt in the last
//! Unknown queue read, `<webhook-id>` the endpoint the last `POST
//! /api/v1/webhooks` registered, `<next>` the `next` of the last answer
//! that had one; `NAME=$(…)` sets NAME for the commands after it. The
//! server runs the demo's configuration ([`crate::demo`]): the built-in one
//! with the late answer sooner, so `src/config/default_config.toml` (the
//! built-in configuration, as a file) stands for it. `NAME=$(…) onejob
//! serve --config FILE` stops the server and starts it again on FILE, with
//! NAME set for it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::demo::{demo_config_toml, DEMO_LATE_ANSWER_MS, PERSON_PAUSE};
use crate::server_process::{free_port, ServerProcess};
use crate::support::harness::{in_ci, TestBackend, TestDb};

/// One shell command of the README and the comment above it.
#[derive(Debug, Clone)]
pub struct Step {
    pub comment: String,
    pub command: String,
}

/// The shell commands of the section under `heading` (up to the next
/// `## ` heading), in order.
pub fn section_steps(text: &str, heading: &str) -> Vec<Step> {
    let start = text
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("a section {heading:?}"));
    let end = text[start + 1..]
        .find("\n## ")
        .map_or(text.len(), |at| start + 1 + at);
    let section = &text[start..end];
    let mut steps = Vec::new();
    let mut in_sh = false;
    let mut comment = String::new();
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        if line.starts_with("```") {
            in_sh = !in_sh && line.trim() == "```sh";
            comment.clear();
            continue;
        }
        if !in_sh || line.trim().is_empty() {
            continue;
        }
        if let Some(text) = line.trim().strip_prefix('#') {
            comment.push_str(text.trim());
            comment.push(' ');
            continue;
        }
        let mut command = line.to_owned();
        while command.ends_with('\\') {
            command.push('\n');
            command.push_str(lines.next().expect("a continued line"));
        }
        steps.push(Step {
            comment: std::mem::take(&mut comment).trim().to_owned(),
            command,
        });
    }
    steps
}

/// What a comment claims about its command's output.
#[derive(Debug, Default, PartialEq)]
pub struct Claims {
    pub status: Option<u16>,
    pub fragments: Vec<String>,
    /// "N s later": wait this long first.
    pub wait: Option<Duration>,
    /// "Later": repeat until the claims hold.
    pub eventually: bool,
}

pub fn claims_of(comment: &str) -> Claims {
    let mut claims = Claims::default();
    if let Some(at) = comment.find('→') {
        let digits: String = comment[at + '→'.len_utf8()..]
            .trim_start()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        claims.status = digits.parse().ok();
    }
    claims.fragments = comment
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    let first = comment.split_whitespace().collect::<Vec<_>>();
    if let [n, "s", "later", ..] = first.as_slice() {
        claims.wait = n.parse().ok().map(Duration::from_secs);
    }
    claims.eventually = comment.starts_with("Later");
    claims
}

/// Whether `output` bears out the claims; the first that does not, if any.
pub fn unmet(claims: &Claims, output: &str) -> Option<String> {
    if let Some(status) = claims.status {
        let said = output
            .lines()
            .find(|l| l.starts_with("HTTP/"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|s| s.parse::<u16>().ok());
        if said != Some(status) {
            return Some(format!("status {status}, but the answer is {said:?}"));
        }
    }
    let lower = output.to_lowercase();
    claims
        .fragments
        .iter()
        .find(|f| !lower.contains(&f.to_lowercase()))
        .map(|f| format!("`{f}` is not in the output"))
}

/// The JSON body of a command's output (after the headers of `curl -i`).
fn body_of(output: &str) -> Option<Value> {
    let body = match output.find("\r\n\r\n") {
        Some(at) if output.starts_with("HTTP/") => &output[at + 4..],
        _ => output,
    };
    serde_json::from_str(body.trim()).ok()
}

/// A directory holding `onejob`, the built binary: what `cargo install
/// --path .` puts on the PATH.
fn bin_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_onejob"), dir.path().join("onejob")).unwrap();
    dir
}

struct Shell {
    path: String,
    cwd: PathBuf,
    env: Vec<(String, String)>,
}

impl Shell {
    /// Runs `command` in bash: whether it succeeded, its stdout, and its
    /// stdout and stderr together.
    async fn run(&self, command: &str) -> (bool, String, String) {
        let mut bash = Command::new("bash");
        bash.arg("-c")
            .arg(command)
            .current_dir(&self.cwd)
            .env("PATH", &self.path)
            .env_remove("RUST_LOG");
        for (k, v) in &self.env {
            bash.env(k, v);
        }
        let output = tokio::task::spawn_blocking(move || bash.output().unwrap())
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let both = stdout.clone() + &String::from_utf8_lossy(&output.stderr);
        (output.status.success(), stdout, both)
    }
}

/// `NAME=$(…) onejob serve --config FILE`: the server started again on
/// FILE with NAME set to what `$(…)` prints; the name, `$(…)` and FILE.
fn restart(command: &str) -> Option<(&str, &str, &str)> {
    let (assignment, file) = command.split_once(" onejob serve --config ")?;
    let name = assigned(assignment)?;
    Some((name, &assignment[name.len() + 1..], file.trim()))
}

/// `NAME=$(…)`: the variable's name, when the line sets one.
fn assigned(command: &str) -> Option<&str> {
    let (name, rest) = command.split_once('=')?;
    (rest.starts_with("$(") && name.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .then_some(name)
}

async fn the_readme_quick_start_works_as_written_at_a_persons_pace(backend: TestBackend) {
    if Command::new("curl").arg("--version").output().is_err() {
        assert!(!in_ci(), "curl is required in CI");
        eprintln!("!!! SKIPPING THE README WALK-THROUGH: curl is not installed");
        return;
    }
    let read = |file: &str| {
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap()
    };
    let mut steps = section_steps(&read("README.md"), "## Quick start");
    assert!(
        steps.iter().any(|step| step.command == "onejob serve"),
        "the README's quick start starts the server: {steps:#?}"
    );
    let walk_through = section_steps(&read("docs/api.md"), "## Walk-through");
    assert!(
        walk_through.len() >= 15,
        "docs/api.md's walk-through: {walk_through:#?}"
    );
    steps.extend(walk_through);
    let work = tempfile::tempdir().unwrap();
    let bin = bin_dir();
    let config = work.path().join("demo.toml");
    std::fs::write(&config, demo_config_toml()).unwrap();
    // The PostgreSQL half names its database, as a deployment would; the
    // SQLite half uses the default `onejob.db` in the working directory.
    let db = (backend == TestBackend::Postgres).then(|| TestDb::create_empty(backend));
    let port = free_port();
    let mut shell = Shell {
        path: format!(
            "{}:{}",
            bin.path().display(),
            std::env::var("PATH").unwrap_or_default()
        ),
        cwd: work.path().to_path_buf(),
        env: vec![("ONEJOB_CONFIG".into(), config.display().to_string())],
    };
    if let Some(db) = &db {
        shell
            .env
            .push(("DATABASE_URL".into(), db.url.as_str().to_owned()));
    }
    let database = db
        .as_ref()
        .map_or_else(|| "onejob.db".to_owned(), |db| db.url.as_str().to_owned());
    let mut server: Option<ServerProcess> = None;
    let (mut job_id, mut attempt_id) = (String::new(), String::new());
    // The job whose attempt went unknown, and whose late answer lost.
    let mut raced_job = String::new();
    let (mut webhook_id, mut next) = (String::new(), String::new());
    let mut ran = 0;
    let mut curls = 0;
    for step in &steps {
        let claims = claims_of(&step.comment);
        let command = step.command.trim();
        match command {
            // The test's binary is on the PATH already.
            "cargo install --path ." => continue,
            "onejob serve" => {
                let mut process =
                    ServerProcess::spawn_on(work.path(), "serve", &config, &database, port);
                process.wait_ready().await;
                server = Some(process);
                ran += 1;
                continue;
            }
            _ => {}
        }
        assert!(
            server.is_some(),
            "{command:?} runs before the server starts"
        );
        if let Some((name, value, file)) = restart(command) {
            let (ok, key, said) = shell.run(&format!("printf '%s' {value}")).await;
            assert!(ok && !key.is_empty(), "{command}: {said}");
            let mut stopped = server.take().unwrap();
            stopped.terminate();
            stopped.wait_exit(Duration::from_secs(30)).await;
            let mut process = ServerProcess::spawn_on_with_env(
                work.path(),
                "restarted",
                &work.path().join(file),
                &database,
                port,
                &[(name, key.as_str())],
            );
            process.wait_ready().await;
            server = Some(process);
            ran += 1;
            continue;
        }
        if let Some(name) = assigned(command) {
            let (ok, stdout, said) = shell
                .run(&format!("{command}\nprintf '\\n%s' \"${name}\""))
                .await;
            assert!(ok, "{command}: {said}");
            let value = stdout.lines().last().unwrap_or_default().to_owned();
            assert!(!value.is_empty(), "{command} set nothing");
            shell.env.push((name.to_owned(), value));
            ran += 1;
            continue;
        }
        let is_curl = command.starts_with("curl");
        let command = command
            .replace("localhost:8080", &format!("127.0.0.1:{port}"))
            .replace("<attempt-id>", &attempt_id)
            .replace("<webhook-id>", &webhook_id)
            .replace("<next>", &next)
            .replace("<id>", &job_id)
            .replace(
                "src/config/default_config.toml",
                &config.display().to_string(),
            );
        if is_curl {
            let pause = claims.wait.map_or(PERSON_PAUSE, |wait| {
                (wait + Duration::from_millis(1500)).max(PERSON_PAUSE)
            });
            if curls > 0 {
                tokio::time::sleep(pause).await;
            }
            curls += 1;
        }
        let deadline = Instant::now() + Duration::from_millis(DEMO_LATE_ANSWER_MS as u64 + 30_000);
        let stdout = loop {
            let (ok, stdout, output) = shell.run(&command).await;
            assert!(ok, "{command}\nfailed:\n{output}");
            match unmet(&claims, &output) {
                None => break stdout,
                Some(_) if claims.eventually && Instant::now() < deadline => {
                    tokio::time::sleep(PERSON_PAUSE).await;
                }
                Some(problem) => panic!(
                    "README.md or docs/api.md, the command after \"# {}\":\n{command}\n{problem}; it answered:\n{output}",
                    step.comment
                ),
            }
        };
        ran += 1;
        let body = body_of(&stdout);
        let creates_a_job = command.contains("-X POST")
            && command
                .match_indices("/api/v1/jobs")
                .any(|(at, path)| command[at + path.len()..].starts_with(char::is_whitespace));
        if creates_a_job {
            if let Some(id) = body.as_ref().and_then(|b| b["id"].as_str()) {
                if claims.status.is_some_and(|s| s == 200 || s == 201) {
                    job_id = id.to_owned();
                }
            }
        }
        let registers = command.contains("-X POST")
            && command.contains("/api/v1/webhooks ")
            && claims.status == Some(201);
        if let Some(id) = body.as_ref().and_then(|b| b["webhook"]["id"].as_str()) {
            if registers {
                webhook_id = id.to_owned();
            }
        }
        if let Some(link) = body.as_ref().and_then(|b| b["next"].as_str()) {
            next = link.to_owned();
        }
        if command.contains("/api/v1/admin/unknown") {
            raced_job = job_id.clone();
            let rows = body.expect("the Unknown queue is JSON");
            attempt_id = rows
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["job_id"] == job_id.as_str())
                .and_then(|r| r["attempt_id"].as_str())
                .expect("the job's attempt is in the queue")
                .to_owned();
        }
    }
    assert!(ran >= 20, "only {ran} steps were found and run: {steps:#?}");

    // What the README says happened, read from the server.
    let token = &shell.env.iter().find(|(k, _)| k == "TOKEN").unwrap().1;
    let job: Value = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/api/v1/jobs/{raced_job}"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let attempts: Vec<(&str, &str, &str)> = job["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["provider"].as_str().unwrap(),
                a["state"].as_str().unwrap(),
                a["outcome"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        attempts,
        vec![
            ("sim-slow", "succeeded", "lost"),
            ("sim-fast", "succeeded", "won")
        ],
        "the late answer lost: {job:#}"
    );
    assert_eq!(job["result"]["provider"], "sim-fast");
    if let Some(mut server) = server {
        server.terminate();
        server.wait_exit(Duration::from_secs(30)).await;
    }
}

#[test]
fn a_claim_the_output_does_not_bear_out_is_caught() {
    let steps = section_steps(
        "\n## Quick start\n```sh\n# Create: → 201 Created, `\"status\":\"pending\"`.\ncurl -i x \\\n  -d y\n```\n\n## Running the tests\n",
        "## Quick start",
    );
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].command, "curl -i x \\\n  -d y");
    let claims = claims_of(&steps[0].comment);
    assert_eq!(claims.status, Some(201));
    assert_eq!(claims.fragments, vec!["\"status\":\"pending\""]);
    let answered =
        "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\n\r\n{\"status\":\"running\"}";
    assert_eq!(
        unmet(&claims, answered).as_deref(),
        Some("`\"status\":\"pending\"` is not in the output")
    );
    let refused = "HTTP/1.1 409 Conflict\r\n\r\n{\"status\":\"pending\"}";
    assert!(unmet(&claims, refused).unwrap().starts_with("status 201"));
    assert_eq!(
        unmet(
            &claims,
            "HTTP/1.1 201 Created\r\n\r\n{\"status\":\"pending\"}"
        ),
        None
    );
    let later = claims_of("5 s later the job is `\"status\":\"unknown\"`.");
    assert_eq!(later.wait, Some(Duration::from_secs(5)));
    assert!(claims_of("Later, the race log lists it").eventually);
}

on_both_backends!(the_readme_quick_start_works_as_written_at_a_persons_pace);
