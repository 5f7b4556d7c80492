//! Retention: finished jobs go with their attempts once their window has
//! passed, and their keys make new jobs again; live jobs and recent ones
//! stay; the race and audit logs keep their own windows, and a job stays as
//! long as an entry about it does. Pruning is given its `now`, so days pass
//! without waiting; rows of "three days ago" are written with ids and times
//! of three days ago.

use std::collections::BTreeSet;
use std::process::Command;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use onejob::app::retention::Pruned;
use onejob::config::Config;
use onejob::domain::Timestamp;
use onejob::domain::UserId;
use onejob::store::connection::write_transaction;
use onejob::store::retention::{self, BATCH_ROWS};
use onejob::store::schema::jobs;
use onejob::store::DbConnection;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::db::{snapshot, snapshot_in};
use crate::support::fake_provider::WAIT;
use crate::support::harness::{
    assert_problem, spawn_app_with, test_config, PreparedApp, TestApp, TestBackend,
    DEFAULT_TEST_PROVIDERS,
};

/// The wall clock in the milliseconds the rows below are written with.
fn now_ms() -> i64 {
    Timestamp::now().millis()
}

const DAY_MS: i64 = 86_400_000;

/// `summarize` succeeds, `doomed` fails, `stuck` stays unknown; `flaky`
/// hangs on its primary and may fall back to `sim-fast`.
const PROVIDERS: &str = r#"
[[providers]]
name = "sim-fast"
kind = "simulated"
latency_ms = 20

[[providers]]
name = "sim-fails"
kind = "simulated"
fail = "definite"

[[providers]]
name = "sim-hang"
kind = "simulated"
fail = "timeout-forever"
timeout_ms = 200
late_result_ms = 60000

[[tasks]]
name = "summarize"
providers = ["sim-fast"]
input_fields = ["text"]

[[tasks]]
name = "doomed"
providers = ["sim-fails"]
input_fields = ["text"]

[[tasks]]
name = "stuck"
providers = ["sim-hang"]
input_fields = ["text"]

[[tasks]]
name = "flaky"
providers = ["sim-hang", "sim-fast"]
input_fields = ["text"]

[[tasks.golden]]
input = { text = "golden" }
"#;

fn config_keeping(jobs: Option<u32>, races: Option<u32>, audit: Option<u32>) -> Config {
    let mut config = test_config(PROVIDERS);
    config.retention.jobs_days = jobs;
    config.retention.races_days = races;
    config.retention.audit_days = audit;
    config
}

fn task(name: &str, text: &str) -> Value {
    json!({"task": name, "input": {"text": text}})
}

/// A UUIDv7 as onejob would have made it at `ms`.
fn id_made_at(ms: i64) -> String {
    let fresh = uuid::Uuid::now_v7();
    let random: [u8; 10] = fresh.as_bytes()[6..].try_into().unwrap();
    uuid::Builder::from_unix_timestamp_millis(ms as u64, &random)
        .into_uuid()
        .hyphenated()
        .to_string()
}

/// A job row as onejob writes one, in `status` (not `succeeded`: that
/// needs a winner, see [`won_by`]), created and last changed at `at`.
fn job_sql(id: &str, owner: &UserId, key: &str, status: &str, at: i64) -> String {
    format!(
        "INSERT INTO jobs (id, owner_id, idempotency_key, task, provider, input, params, \
         fingerprint, status, version, created_at, updated_at) \
         VALUES ('{id}', '{owner}', '{key}', 'summarize', 'sim-fast', '{{\"text\":\"x\"}}', '{{}}', \
         '{fp}', '{status}', 0, {at}, {at});\n",
        fp = "f".repeat(64)
    )
}

fn attempt_sql(id: &str, job: &str, owner: &UserId, number: i32, state: &str, at: i64) -> String {
    let finished = if ["queued", "running", "unknown"].contains(&state) {
        "NULL".to_owned()
    } else {
        at.to_string()
    };
    format!(
        "INSERT INTO attempts (id, job_id, owner_id, number, provider, state, created_at, \
         started_at, sent_at, finished_at) \
         VALUES ('{id}', '{job}', '{owner}', {number}, 'sim-fast', '{state}', {at}, {at}, {at}, \
         {finished});\n"
    )
}

/// Makes a job `succeeded`, won by `attempt`, at `at`.
fn won_by(job: &str, attempt: &str, at: i64) -> String {
    format!(
        "UPDATE jobs SET status = 'succeeded', result = '{{\"summary\":\"s\"}}', \
         completed_by = '{attempt}', version = 1, updated_at = {at} WHERE id = '{job}';\n"
    )
}

fn race_sql(job: &str, owner: &UserId, loser: &str, winner: &str, at: i64) -> String {
    format!(
        "INSERT INTO race_log (id, job_id, owner_id, losing_attempt_id, winning_attempt_id, \
         reason, version_read, version_found, provider, payload_sha256, lost_at) \
         VALUES ('{id}', '{job}', '{owner}', '{loser}', '{winner}', \
         'the job had already completed', 0, 1, 'sim-fast', '{digest}', {at});\n",
        id = id_made_at(at),
        digest = "d".repeat(64)
    )
}

fn user_audit_sql(actor: &UserId, subject: &UserId, at: i64) -> String {
    format!(
        "INSERT INTO audit_log (id, owner_id, actor_id, action, subject_user_id, reason, at) \
         VALUES ('{id}', '{subject}', '{actor}', 'disable_user', '{subject}', 'left the team', \
         {at});\n",
        id = id_made_at(at)
    )
}

fn write(conn: &mut DbConnection, sql: &str) {
    write_transaction(conn, |conn| conn.batch_execute(sql)).unwrap();
}

async fn finished_at(app: &TestApp, job_id: &str) -> i64 {
    let job_id = job_id.to_owned();
    app.with_conn(move |conn| {
        jobs::table
            .find(job_id)
            .select(jobs::updated_at)
            .first(conn)
            .unwrap()
    })
    .await
}

async fn prune(app: &TestApp, now: i64) -> Pruned {
    app.app
        .prune_expired(Timestamp::from_millis(now))
        .await
        .unwrap()
}

fn pruned(jobs: u64, attempts: u64, race_entries: u64, audit_entries: u64) -> Pruned {
    Pruned {
        jobs,
        attempts,
        race_entries,
        audit_entries,
    }
}

/// Waits past the current millisecond, so that what happens next is
/// strictly later than anything before.
async fn next_millisecond() -> i64 {
    let now = now_ms();
    while now_ms() <= now + 1 {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    now
}

async fn old_finished_jobs_go_with_their_attempts_and_recent_and_live_ones_stay(
    backend: TestBackend,
) {
    let app = spawn_app_with(backend, config_keeping(Some(7), None, None)).await;
    let alice = app.alice.token.clone();
    let succeeded = app
        .create_job(&alice, "old-ok", &task("summarize", "a"))
        .await;
    let failed = app
        .create_job(&alice, "old-failed", &task("doomed", "b"))
        .await;
    let unknown = app
        .create_job(&alice, "old-unknown", &task("stuck", "c"))
        .await;
    app.wait_for_status(&succeeded, "succeeded", WAIT).await;
    app.wait_for_status(&failed, "failed", WAIT).await;
    app.wait_for_status(&unknown, "unknown", WAIT).await;
    // Written as another process would have: a job whose attempt is still
    // running (its lease held far into the future), and a succeeded job whose
    // earlier attempt is unknown (an answer that may still come). Both
    // changed last at the epoch.
    let (running, running_attempt) = (id_made_at(now_ms()), id_made_at(now_ms()));
    let (finished_live, still_unknown, winner) = (
        id_made_at(now_ms()),
        id_made_at(now_ms()),
        id_made_at(now_ms()),
    );
    let owner = app.alice.id.clone();
    let sql = [
        job_sql(&running, &owner, "old-running", "running", 0),
        attempt_sql(&running_attempt, &running, &owner, 1, "running", 0),
        format!(
            "UPDATE attempts SET lease_owner = 'another-process', lease_expires_at = {} \
             WHERE id = '{running_attempt}';\n",
            now_ms() + 10 * DAY_MS
        ),
        job_sql(&finished_live, &owner, "old-finished-live", "pending", 0),
        attempt_sql(&still_unknown, &finished_live, &owner, 1, "unknown", 0),
        attempt_sql(&winner, &finished_live, &owner, 2, "succeeded", 0),
        won_by(&finished_live, &winner, 0),
    ]
    .concat();
    app.with_conn(move |conn| write(conn, &sql)).await;
    let old_until = next_millisecond().await;
    let recent = app
        .create_job(&alice, "recent", &task("summarize", "d"))
        .await;
    app.wait_for_status(&recent, "succeeded", WAIT).await;
    assert!(finished_at(&app, &recent).await > old_until);

    let before = snapshot(&app).await;
    assert_eq!(before.jobs.len(), 6);
    // Seven days after the old ones finished, and not yet after the recent one.
    let now = old_until + 7 * DAY_MS + 1;
    assert_eq!(prune(&app, now).await, pruned(2, 2, 0, 0));
    let after = snapshot(&app).await;
    let kept: BTreeSet<String> = [&unknown, &running, &finished_live, &recent]
        .into_iter()
        .cloned()
        .collect();
    assert_eq!(after.jobs, kept, "only the old finished jobs went");
    let expected_attempts: Vec<(String, i64)> = before
        .attempts_of
        .iter()
        .filter(|(job, _)| kept.contains(job))
        .cloned()
        .collect();
    assert_eq!(
        after.attempts_of, expected_attempts,
        "the attempts of kept jobs are untouched, those of pruned ones gone"
    );
    for gone in [&succeeded, &failed] {
        let response = app.get(&alice, &format!("/api/v1/jobs/{gone}")).await;
        assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
    }
    assert_eq!(app.get_job(&alice, &unknown).await["status"], "unknown");
    assert_eq!(
        prune(&app, now).await,
        Pruned::default(),
        "a second run finds nothing"
    );

    // Much later, the recent job goes too; live jobs never do.
    assert_eq!(prune(&app, now + 365 * DAY_MS).await, pruned(1, 1, 0, 0));
    assert_eq!(
        snapshot(&app).await.jobs,
        [&unknown, &running, &finished_live]
            .into_iter()
            .cloned()
            .collect::<BTreeSet<_>>()
    );

    let metrics = app
        .get(&app.ada.token, "/metrics")
        .await
        .text()
        .await
        .unwrap();
    for line in [
        "onejob_pruned_rows_total{table=\"jobs\"} 3",
        "onejob_pruned_rows_total{table=\"attempts\"} 3",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in:\n{metrics}");
    }
}

async fn a_key_makes_a_new_job_only_after_its_window(backend: TestBackend) {
    let app = spawn_app_with(backend, config_keeping(Some(1), None, None)).await;
    let alice = app.alice.token.clone();
    let (first_body, second_body) = (task("summarize", "first"), task("summarize", "second"));
    let first = app.create_job(&alice, "reused-key", &first_body).await;
    app.wait_for_status(&first, "succeeded", WAIT).await;
    let finished = finished_at(&app, &first).await;

    // A day after it finished, to the millisecond, the key still holds.
    assert_eq!(prune(&app, finished + DAY_MS).await, Pruned::default());
    let replay = app.post_job(&alice, "reused-key", &first_body).await;
    assert_eq!(replay.status(), StatusCode::OK);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.json::<Value>().await.unwrap()["id"], first.as_str());
    let conflict = app.post_job(&alice, "reused-key", &second_body).await;
    let problem = assert_problem(conflict, StatusCode::CONFLICT, "idempotency-key-reused").await;
    assert_eq!(problem["job_id"], first.as_str());

    // One millisecond later the job goes, and the key makes a new job.
    assert_eq!(prune(&app, finished + DAY_MS + 1).await, pruned(1, 1, 0, 0));
    let response = app.post_job(&alice, "reused-key", &second_body).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let second: Value = response.json().await.unwrap();
    let second_id = second["id"].as_str().unwrap().to_owned();
    assert_ne!(second_id, first);
    let done = app.wait_for_status(&second_id, "succeeded", WAIT).await;
    assert_eq!(done["input"]["text"], "second");
    let gone = app.get(&alice, &format!("/api/v1/jobs/{first}")).await;
    assert_problem(gone, StatusCode::NOT_FOUND, "not-found").await;
    // And the new job holds the key as the first one did.
    let replay = app.post_job(&alice, "reused-key", &second_body).await;
    assert_eq!(replay.status(), StatusCode::OK);
    assert_eq!(replay.json::<Value>().await.unwrap()["id"], second_id);
}

/// A cancelled job is finished too: past its window it goes with its
/// withdrawn attempt and frees its key; one whose sent attempt may still
/// answer (unknown) stays, as any finished job with a live attempt does.
async fn cancelled_jobs_go_like_every_finished_job(backend: TestBackend) {
    let app = spawn_app_with(backend, config_keeping(Some(1), None, None)).await;
    let owner = app.alice.id.clone();
    let (withdrawn, withdrawn_attempt) = (id_made_at(0), id_made_at(0));
    let (awaited, awaited_attempt) = (id_made_at(0), id_made_at(0));
    let sql = [
        job_sql(&withdrawn, &owner, "cancelled-early", "cancelled", 0),
        attempt_sql(&withdrawn_attempt, &withdrawn, &owner, 1, "failed", 0),
        job_sql(&awaited, &owner, "cancelled-while-sent", "cancelled", 0),
        attempt_sql(&awaited_attempt, &awaited, &owner, 1, "unknown", 0),
    ]
    .concat();
    app.with_conn(move |conn| write(conn, &sql)).await;
    assert_eq!(prune(&app, now_ms()).await, pruned(1, 1, 0, 0));
    let gone = app
        .get(&app.alice.token, &format!("/api/v1/jobs/{withdrawn}"))
        .await;
    assert_problem(gone, StatusCode::NOT_FOUND, "not-found").await;
    let kept = app.get_job(&app.alice.token, &awaited).await;
    assert_eq!(kept["status"], "cancelled");
    // Its key makes a new job.
    let again = app
        .post_job(
            &app.alice.token,
            "cancelled-early",
            &task("summarize", "again"),
        )
        .await;
    assert_eq!(again.status(), StatusCode::CREATED);
}

async fn logs_keep_their_own_windows_and_their_jobs_while_they_last(backend: TestBackend) {
    let app = spawn_app_with(backend, config_keeping(Some(7), Some(30), Some(90))).await;
    let alice = app.alice.token.clone();
    // An audited job: its primary hangs, support abandons the attempt, the
    // owner's new attempt on the fallback succeeds.
    let audited = app.create_job(&alice, "audited", &task("flaky", "a")).await;
    let job = app.wait_for_status(&audited, "unknown", WAIT).await;
    let hung = job["attempts"][0]["id"].as_str().unwrap().to_owned();
    let response = app
        .abandon(&app.sue.token, &hung, "the provider hangs")
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let response = app.start_attempt(&alice, &audited, None).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    app.wait_for_status(&audited, "succeeded", WAIT).await;
    // A raced job: a second answer lost to the first.
    let raced = app
        .create_job(&alice, "raced", &task("summarize", "b"))
        .await;
    let job = app.wait_for_status(&raced, "succeeded", WAIT).await;
    let won = job["attempts"][0]["id"].as_str().unwrap().to_owned();
    // A job nothing was written about, and an audit entry about a user.
    let plain = app
        .create_job(&alice, "plain", &task("summarize", "c"))
        .await;
    app.wait_for_status(&plain, "succeeded", WAIT).await;
    let now = now_ms();
    let lost = id_made_at(now);
    let owner = app.alice.id.clone();
    let sql = [
        attempt_sql(&lost, &raced, &owner, 2, "succeeded", now),
        format!("UPDATE attempts SET outcome = 'lost' WHERE id = '{lost}';\n"),
        race_sql(&raced, &owner, &lost, &won, now),
        user_audit_sql(&app.ada.id, &app.bob.id, now),
    ]
    .concat();
    app.with_conn(move |conn| write(conn, &sql)).await;
    let written_until = next_millisecond().await;
    let before = snapshot(&app).await;
    assert_eq!((before.races, before.audit), (1, 2), "{before:?}");

    let all = |ids: &[&String]| ids.iter().map(|id| (*id).clone()).collect::<BTreeSet<_>>();
    // Past the jobs' window: only the job nothing refers to goes.
    let day = |n: i64| written_until + n * DAY_MS + 1;
    assert_eq!(prune(&app, day(8)).await, pruned(1, 1, 0, 0));
    assert_eq!(snapshot(&app).await.jobs, all(&[&audited, &raced]));
    // Past the race log's: the race entry goes, and with it its job.
    assert_eq!(prune(&app, day(31)).await, pruned(1, 2, 1, 0));
    let after = snapshot(&app).await;
    assert_eq!(after.jobs, all(&[&audited]));
    assert_eq!((after.races, after.audit), (0, 2));
    // Past the audit log's: both entries go, and the audited job with them.
    assert_eq!(prune(&app, day(91)).await, pruned(1, 2, 0, 2));
    let after = snapshot(&app).await;
    assert!(
        after.jobs.is_empty() && after.attempts_of.is_empty(),
        "{after:?}"
    );
    assert_eq!((after.races, after.audit), (0, 0));
}

/// A log entry goes by its own window even while its job is live.
async fn a_live_jobs_old_log_entries_go_and_the_job_stays(backend: TestBackend) {
    let app = spawn_app_with(backend, config_keeping(Some(1), Some(1), Some(1))).await;
    let stuck = app
        .create_job(&app.alice.token, "stuck", &task("flaky", "a"))
        .await;
    let job = app.wait_for_status(&stuck, "unknown", WAIT).await;
    let attempt = job["attempts"][0]["id"].as_str().unwrap().to_owned();
    // An old race entry about it (the attempt lost a race long ago, as far
    // as retention can tell).
    let long_ago = now_ms() - 3 * DAY_MS;
    let owner = app.alice.id.clone();
    let sql = race_sql(&stuck, &owner, &attempt, &attempt, long_ago);
    app.with_conn(move |conn| write(conn, &sql)).await;
    assert_eq!(prune(&app, now_ms()).await, pruned(0, 0, 1, 0));
    let after = snapshot(&app).await;
    assert_eq!(after.jobs, BTreeSet::from([stuck.clone()]));
    assert_eq!(after.attempts_of, vec![(stuck, 1)]);
}

/// Inserts `count` jobs that succeeded at `at` (with ids of that time), one
/// attempt each.
fn insert_finished_jobs(conn: &mut DbConnection, owner: &UserId, count: usize, at: i64) {
    let mut sql = String::new();
    for n in 0..count {
        let (job, attempt) = (id_made_at(at), id_made_at(at));
        sql += &job_sql(&job, owner, &format!("bulk-{n}"), "pending", at);
        sql += &attempt_sql(&attempt, &job, owner, 1, "succeeded", at);
        sql += &won_by(&job, &attempt, at);
    }
    write(conn, &sql);
}

async fn pruning_removes_one_bounded_batch_per_statement(backend: TestBackend) {
    let app = spawn_app_with(backend, config_keeping(Some(1), None, None)).await;
    let long_ago = now_ms() - 10 * DAY_MS;
    let owner = app.alice.id.clone();
    let total = 2 * BATCH_ROWS as usize + 203;
    app.with_conn(move |conn| insert_finished_jobs(conn, &owner, total, long_ago))
        .await;
    let cutoff = Timestamp::now() - DAY_MS;
    let batch = app
        .with_conn(move |conn| retention::prune_finished_jobs(conn, cutoff, None, BATCH_ROWS))
        .await
        .unwrap();
    assert_eq!((batch.jobs, batch.attempts), (500, 500));
    let last = batch.last_id.unwrap();
    let left = snapshot(&app).await.jobs;
    assert_eq!(left.len(), total - 500);
    assert!(
        left.iter().all(|id| id.as_str() > last.as_str()),
        "a batch takes the oldest ids"
    );
    // One run takes the rest, batch after batch.
    assert_eq!(prune(&app, now_ms()).await, pruned(703, 703, 0, 0));
    assert!(snapshot(&app).await.jobs.is_empty());
}

/// The configuration file for a `onejob` process: the test providers, and
/// `retention` when given.
fn config_file(dir: &std::path::Path, retention: &str) -> std::path::PathBuf {
    let path = dir.join("onejob.toml");
    std::fs::write(&path, format!("{retention}\n{DEFAULT_TEST_PROVIDERS}")).unwrap();
    path
}

async fn run_prune(config: std::path::PathBuf, database_url: String) -> String {
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_onejob"))
            .arg("prune")
            .env("ONEJOB_CONFIG", config)
            .env("DATABASE_URL", database_url)
            .env("RUST_LOG", "warn")
            .output()
            .expect("run onejob prune")
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "onejob prune failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The count printed on the line for `what`.
fn count_of(report: &str, what: &str) -> u64 {
    let line = report
        .lines()
        .find(|l| l.starts_with(what))
        .unwrap_or_else(|| panic!("no {what} line in:\n{report}"));
    line[what.len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

async fn onejob_prune_removes_what_outlived_its_window_and_says_so(backend: TestBackend) {
    let prepared = PreparedApp::new(backend, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let now = now_ms();
    let three_days_ago = now - 3 * DAY_MS;
    let (old, old_attempt) = (id_made_at(three_days_ago), id_made_at(three_days_ago));
    let (recent, recent_attempt, loser) = (id_made_at(now), id_made_at(now), id_made_at(now));
    let owner = prepared.alice.id.clone();
    let sql = [
        job_sql(&old, &owner, "three-days-ago", "pending", three_days_ago),
        attempt_sql(&old_attempt, &old, &owner, 1, "succeeded", three_days_ago),
        won_by(&old, &old_attempt, three_days_ago),
        job_sql(&recent, &owner, "today", "failed", now),
        attempt_sql(&recent_attempt, &recent, &owner, 1, "failed", now),
        attempt_sql(&loser, &recent, &owner, 2, "failed", now),
        // An old race entry about today's job, and an old audit entry.
        race_sql(&recent, &owner, &loser, &recent_attempt, three_days_ago),
        user_audit_sql(&prepared.ada.id, &prepared.bob.id, three_days_ago),
    ]
    .concat();
    prepared.with_conn(move |conn| write(conn, &sql)).await;
    let dir = tempfile::tempdir().unwrap();
    let url = prepared.db.url.as_str().to_owned();

    let unset = run_prune(config_file(dir.path(), ""), url.clone()).await;
    assert!(unset.contains("nothing to prune"), "{unset}");
    assert_eq!(prepared.with_conn(snapshot_in).await.jobs.len(), 2);

    let config = config_file(dir.path(), "[retention]\njobs_days = 2\nraces_days = 2\n");
    let report = run_prune(config.clone(), url.clone()).await;
    assert_eq!(
        [
            count_of(&report, "jobs"),
            count_of(&report, "attempts"),
            count_of(&report, "race log"),
            count_of(&report, "audit log"),
        ],
        [1, 1, 1, 0],
        "{report}"
    );
    assert!(report.contains("keys are free again"), "{report}");
    assert!(report.contains("kept forever"), "the audit log: {report}");
    let after = prepared.with_conn(snapshot_in).await;
    assert_eq!(after.jobs, BTreeSet::from([recent.clone()]));
    assert_eq!(after.attempts_of, vec![(recent, 2)]);
    assert_eq!((after.races, after.audit), (0, 1));

    let again = run_prune(config, url).await;
    assert_eq!(count_of(&again, "jobs"), 0, "{again}");
}

on_both_backends!(
    old_finished_jobs_go_with_their_attempts_and_recent_and_live_ones_stay,
    a_key_makes_a_new_job_only_after_its_window,
    cancelled_jobs_go_like_every_finished_job,
    logs_keep_their_own_windows_and_their_jobs_while_they_last,
    a_live_jobs_old_log_entries_go_and_the_job_stays,
    pruning_removes_one_bounded_batch_per_statement,
    onejob_prune_removes_what_outlived_its_window_and_says_so,
);
