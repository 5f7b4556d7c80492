//! The last holes in exactly-once on the send path (docs/design.md,
//! "States"), against real HTTP fake providers: an outcome the store
//! refuses is never rewritten into a failure that fails over; a sent
//! attempt whose job finished elsewhere is closed, not stranded as
//! `unknown`; open late calls are capped.

use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use onejob::domain::{AttemptState, JobStatus, RaceResult};
use onejob::store::retention::{self, Log};
use onejob::store::schema::race_log;
use onejob::store::DbConnection;
use reqwest::StatusCode;
use serde_json::Value;

use crate::support::db::{attempts_of, new_job};
use crate::support::fake_provider::{
    answer, config_of, strict_task_toml, Behaviour, FakeProvider, ProviderToml, Shape, WAIT,
};
use crate::support::harness::{spawn_app_with, summarize, TestBackend};

/// A provider entry with its own soft timeout.
fn provider_with_timeout(name: &str, base_url: &str, timeout_ms: u64, extra: &str) -> String {
    ProviderToml::openai(name, base_url)
        .timeout_ms(timeout_ms)
        .with(extra)
        .toml()
}

/// Makes the database refuse to mark any attempt `unknown`, as a trigger
/// raising an error would for any reason a retry cannot fix.
fn refuse_unknown(conn: &mut DbConnection) {
    match conn {
        DbConnection::Sqlite(c) => c.batch_execute(
            "CREATE TRIGGER refuse_unknown BEFORE UPDATE OF state ON attempts \
             WHEN NEW.state = 'unknown' \
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;",
        ),
        DbConnection::Postgresql(c) => c.batch_execute(
            "CREATE FUNCTION refuse_unknown() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$; \
             CREATE TRIGGER refuse_unknown BEFORE UPDATE OF state ON attempts FOR EACH ROW \
             WHEN (NEW.state = 'unknown') EXECUTE FUNCTION refuse_unknown();",
        ),
    }
    .unwrap();
}

fn stop_refusing_unknown(conn: &mut DbConnection) {
    match conn {
        DbConnection::Sqlite(c) => c.batch_execute("DROP TRIGGER refuse_unknown"),
        DbConnection::Postgresql(c) => c.batch_execute("DROP TRIGGER refuse_unknown ON attempts"),
    }
    .unwrap();
}

/// Item: an outcome is never rewritten. The database refuses to record a
/// soft timeout's `unknown` (a trigger). The worker retries the write
/// until its lease runs out and leaves the attempt `running`; nothing is
/// turned into a failure, so no second provider is called while the first
/// call is open. Once the database takes writes again the reaper makes the
/// attempt `unknown`, and the first call's late answer wins.
async fn a_refused_outcome_is_retried_not_rewritten_and_nothing_fails_over(backend: TestBackend) {
    let primary = FakeProvider::start(Shape::OpenAi).await;
    let fallback = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        ProviderToml::openai("primary", &primary.base_url).toml(),
        ProviderToml::openai("fallback", &fallback.base_url).toml(),
        strict_task_toml(
            "summarize",
            &["primary", "fallback"],
            "Summarize: {{ text }}",
        ),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    assert!(app
        .app
        .qualify(None, "fallback", "summarize")
        .await
        .unwrap()
        .passed());
    let fallback_before = fallback.total_requests();
    app.with_conn(refuse_unknown).await;

    primary.push(Behaviour::Hold);
    let job_id = app
        .create_job(&app.alice.token, "refused", &summarize("x"))
        .await;
    let attempt_id = primary.wait_held_count(1).await.remove(0);
    // The soft timeout (400 ms) passes, the worker's retries of the
    // refused write outlast the lease (2 s), and the reaper's own attempt
    // is refused too: through all of it the attempt stays running, and the
    // fallback is never called.
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        let rows = attempts_of(&app, &job_id).await;
        assert_eq!(rows.len(), 1, "no second attempt: {rows:#?}");
        assert_eq!(rows[0].state, AttemptState::Running, "{:#?}", rows[0]);
        assert_eq!(rows[0].error, None, "nothing rewritten: {:#?}", rows[0]);
        assert_eq!(fallback.total_requests(), fallback_before);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    app.with_conn(stop_refusing_unknown).await;
    let job = app.wait_for_status(&job_id, "unknown", WAIT).await;
    let error = job["attempts"][0]["error"].as_str().unwrap();
    assert!(error.contains("lease expired"), "{error}");
    assert_eq!(job["attempts"].as_array().unwrap().len(), 1);
    // The first call was open all along: its answer lands.
    primary.release(&attempt_id, answer("late, and the only one"));
    let job = app.wait_for_status(&job_id, "succeeded", WAIT).await;
    assert_eq!(job["completed_by"], attempt_id.as_str());
    assert_eq!(job["result"]["summary"], "late, and the only one");
    assert_eq!(fallback.total_requests(), fallback_before, "never called");
    assert_eq!(primary.requests_for(&attempt_id), 1);
}

/// Item: a sent attempt whose job finished elsewhere is closed, not
/// stranded. Attempt A is abandoned; B is sent to another provider; A's
/// late answer wins while B's call is out. B keeps its lease (its process
/// is alive), and at its soft timeout it is closed with a note, never
/// "the process stopped"; it is not in the unknown queue, its late answer
/// goes to the race log, and it does not keep the job from retention.
async fn a_sent_attempt_whose_job_finished_elsewhere_is_closed_not_stranded(backend: TestBackend) {
    let slow = FakeProvider::start(Shape::OpenAi).await;
    let fast = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        ProviderToml::openai("slow", &slow.base_url).toml(),
        // Its soft timeout (3 s) outlasts the lease (2 s): a lease left to
        // run out would be reaped first.
        provider_with_timeout("fast", &fast.base_url, 3000, ""),
        strict_task_toml("summarize", &["slow", "fast"], "Summarize: {{ text }}"),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    assert!(app
        .app
        .qualify(None, "fast", "summarize")
        .await
        .unwrap()
        .passed());
    slow.push(Behaviour::Hold);
    fast.push(Behaviour::Hold);
    let job_id = app
        .create_job(&app.alice.token, "elsewhere", &summarize("x"))
        .await;
    let first = slow.wait_held_count(1).await.remove(0);
    app.wait_for_status(&job_id, "unknown", WAIT).await;
    assert_eq!(
        app.abandon(&app.sue.token, &first, "try fast")
            .await
            .status(),
        StatusCode::OK
    );
    let response = app.start_attempt(&app.alice.token, &job_id, None).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let second = fast.wait_held_count(1).await.remove(0);
    let sent = Instant::now();

    slow.release(&first, answer("the abandoned one was first"));
    app.wait_for_status(&job_id, "succeeded", WAIT).await;
    let rows = attempts_of(&app, &job_id).await;
    assert_eq!(
        rows[1].state,
        AttemptState::Running,
        "still awaiting its answer"
    );
    // Past the lease, before the soft timeout: still running, still leased.
    while sent.elapsed() < Duration::from_millis(2600) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rows = attempts_of(&app, &job_id).await;
    assert_eq!(
        rows[1].state,
        AttemptState::Running,
        "its process is alive: not reaped: {:#?}",
        rows[1]
    );

    let closed = {
        let deadline = Instant::now() + WAIT;
        loop {
            let rows = attempts_of(&app, &job_id).await;
            if rows[1].state != AttemptState::Running {
                break rows[1].clone();
            }
            assert!(Instant::now() < deadline, "{rows:#?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    assert_eq!(closed.state, AttemptState::Abandoned, "{closed:#?}");
    let note = closed.reason().unwrap().for_staff();
    assert!(
        note.contains("no answer within the soft timeout of 3000 ms")
            && note.contains(&format!(
                "closed, not left unknown: its job had already succeeded through attempt {first}"
            )),
        "{note}"
    );
    assert!(!note.contains("stopped"), "{note}");
    let unknown: Vec<Value> = app
        .get(&app.sue.token, "/api/v1/admin/unknown")
        .await
        .json()
        .await
        .unwrap();
    assert!(
        unknown.iter().all(|u| u["attempt_id"] != second.as_str()),
        "not in the unknown queue: {unknown:#?}"
    );
    let job = app.get_job(&app.alice.token, &job_id).await;
    assert_eq!(job["status"], "succeeded");
    assert_eq!(job["completed_by"], first.as_str());

    // Its late answer still goes through the compare-and-swap, and loses.
    fast.release(&second, answer("too late"));
    let job = app
        .wait_for_job(&job_id, WAIT, |j| j["attempts"][1]["outcome"] == "lost")
        .await;
    assert_eq!(job["result"]["summary"], "the abandoned one was first");
    let rows = attempts_of(&app, &job_id).await;
    assert_eq!(
        (rows[1].state, rows[1].outcome),
        (AttemptState::Succeeded, Some(RaceResult::Lost))
    );
    let races: i64 = {
        let id = job_id.clone();
        app.with_conn(move |conn| {
            race_log::table
                .filter(race_log::job_id.eq(id))
                .count()
                .get_result(conn)
                .unwrap()
        })
        .await
    };
    assert_eq!(races, 1);
    assert_eq!(fast.requests_for(&second), 1);

    // Nothing of B holds the job: once the logs' own windows have passed
    // (here: a cutoff a day ahead), retention removes it.
    let removed = app
        .with_conn(|conn| {
            let cutoff = onejob::domain::Timestamp::now() + 86_400_000;
            retention::prune_log(conn, Log::Audit, cutoff, 500).unwrap();
            retention::prune_log(conn, Log::Races, cutoff, 500).unwrap();
            retention::prune_finished_jobs(conn, cutoff, None, 500).unwrap()
        })
        .await;
    assert_eq!((removed.jobs, removed.attempts), (1, 2), "{removed:?}");
}

/// Item: bounded memory. With `max_late_calls = 1`, the first call to reach
/// its soft timeout is kept open for a late answer; the second is dropped
/// (its connection closed), counted, and its attempt stays unknown.
async fn past_max_late_calls_a_timed_out_call_is_dropped_and_counted(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        ProviderToml::openai("hang", &fake.base_url)
            .with("max_late_calls = 1")
            .toml(),
        strict_task_toml("summarize", &["hang"], "Summarize: {{ text }}"),
    ]
    .concat();
    let mut config = config_of(&toml);
    config.worker.concurrency = 2;
    let app = spawn_app_with(backend, config).await;
    fake.set_default(Behaviour::Hold);
    let mut jobs = Vec::new();
    for key in ["late-1", "late-2"] {
        let job_id = app.create_job(&app.alice.token, key, &summarize(key)).await;
        app.wait_for_status(&job_id, "unknown", WAIT).await;
        jobs.push(job_id);
    }
    let held = fake.wait_held_count(2).await;
    let metrics = app
        .get(&app.ada.token, "/metrics")
        .await
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("onejob_late_calls_dropped_total{provider=\"hang\"} 1"),
        "{metrics}"
    );
    // Both answer now: only the call still open can land.
    for id in &held {
        fake.release(id, answer("late"));
    }
    let kept = app.wait_for_status(&jobs[0], "succeeded", WAIT).await;
    assert_eq!(kept["completed_by"], held[0].as_str());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let dropped = app.get_job(&app.alice.token, &jobs[1]).await;
    assert_eq!(dropped["status"], "unknown", "{dropped:#}");
    assert_eq!(dropped["attempts"][0]["state"], "unknown");
    let rows = attempts_of(&app, &jobs[1]).await;
    assert_eq!(rows.len(), 1);
    assert!(rows[0].error.as_deref().unwrap().contains("soft timeout"));
    let job = app.get_job(&app.alice.token, &jobs[0]).await;
    assert_eq!(job["status"], JobStatus::Succeeded.as_str());
}

/// The statements the send path's new steps send keep the distribution
/// rule (`store::distribution`): every write to `attempts` names its owner,
/// and no write evaluates a volatile function (the database's clock is
/// read first and bound). Statements those steps reuse from before (the
/// job-row lock, re-deriving a job's status) are left to the rule's own
/// rewrite, and only checked for volatile functions.
async fn the_send_paths_new_statements_keep_the_distribution_rule(backend: TestBackend) {
    use crate::support::statement_log::StatementLog;
    use crate::support::statement_rule::{judge, normalize, Breach, Verdict};
    use onejob::domain::retry::Failure;
    use onejob::domain::{AllowedProviders, RetryPolicy};
    use onejob::store::completion::{complete_failure, FailurePlan};
    use onejob::store::jobs::{create_job, CreateOutcome};
    use onejob::store::queue::{self, ClaimRules};
    let log = StatementLog::new();
    let prepared = crate::support::harness::PreparedApp::new(
        backend,
        crate::support::harness::test_config(crate::support::harness::DEFAULT_TEST_PROVIDERS),
    )
    .await
    .recording(&log)
    .await;
    let owner = prepared.alice.id.clone();
    let checked = prepared
        .with_conn(move |conn| {
            let claim = |conn: &mut DbConnection, lease_ms: i64, confirm: bool| {
                let mut admit = |_: &onejob::domain::AttemptId, _: &str| true;
                queue::claim_batch(
                    conn,
                    ClaimRules {
                        lease_owner: "w",
                        lease_ms,
                        limit: 1,
                        soft_timeout_ms: &|_| 3000,
                        closed: &[],
                        admit: &mut admit,
                        confirm,
                    },
                )
                .unwrap()
                .claims
                .pop()
                .unwrap()
            };
            let mut chunks: Vec<(&str, Vec<String>)> = Vec::new();
            let job =
                |conn: &mut DbConnection, key: &str| match create_job(conn, &new_job(&owner, key))
                    .unwrap()
                {
                    CreateOutcome::Created(job) => job,
                    other => panic!("{other:?}"),
                };

            job(conn, "renew");
            let claimed = claim(conn, 2000, true);
            log.take();
            assert!(queue::renew_lease(
                conn,
                &claimed.attempt.id,
                &claimed.attempt.owner_id,
                "w",
                2000
            )
            .unwrap());
            chunks.push(("renewing a lease", log.take()));
            assert_eq!(
                queue::give_back_before_sending(conn, &claimed.attempt.key(), "w").unwrap(),
                queue::SendPermit::Requeued
            );
            chunks.push(("giving a claim back", log.take()));

            let claimed = claim(conn, 2000, true);
            conn.batch_execute(&format!(
                "UPDATE jobs SET status = 'failed', version = version + 1 WHERE id = '{}'",
                claimed.job.id
            ))
            .unwrap();
            log.take();
            assert_eq!(
                queue::mark_unknown(conn, &claimed.attempt.key(), &"soft timeout".into()).unwrap(),
                onejob::domain::Applied::Superseded
            );
            chunks.push(("closing a superseded attempt", log.take()));

            job(conn, "retry");
            let claimed = claim(conn, 2000, true);
            log.take();
            let plan = FailurePlan {
                gate: AllowedProviders {
                    allowed: vec!["sim-fast".into()],
                    skipped: vec![],
                },
                policy: RetryPolicy::default(),
                jitter: 0.5,
            };
            let retried = complete_failure(
                conn,
                &claimed.attempt.key(),
                &"rate limited (429)".into(),
                Failure::NothingHappened {
                    retry_after_ms: Some(60_000),
                },
                &plan,
            )
            .unwrap();
            assert!(matches!(
                retried,
                onejob::domain::Applied::RetryScheduled { .. }
            ));
            chunks.push(("scheduling a retry", log.take()));

            job(conn, "unsent");
            claim(conn, 1, false);
            job(conn, "sent");
            std::thread::sleep(Duration::from_millis(20));
            claim(conn, 1, true);
            std::thread::sleep(Duration::from_millis(20));
            log.take();
            let expired = queue::expire_leases(conn).unwrap();
            assert_eq!(expired.len(), 2, "{expired:?}");
            chunks.push(("expiring leases", log.take()));
            chunks
        })
        .await;
    // SQLite's statements quote names with backticks, PostgreSQL's with
    // double quotes (which the rule already ignores).
    let checked: Vec<(&str, Vec<String>)> = checked
        .into_iter()
        .map(|(step, statements)| {
            (
                step,
                statements.iter().map(|s| s.replace('`', "")).collect(),
            )
        })
        .collect();
    for (step, statements) in &checked {
        let writes = statements
            .iter()
            .filter(|sql| normalize(sql).starts_with("update attempts"))
            .count();
        assert!(
            writes > 0,
            "{step}: no write to attempts recorded: {statements:#?}"
        );
        for sql in statements {
            let verdict = judge(sql);
            assert_ne!(
                verdict,
                Verdict::Refused(Breach::VolatileInWrite),
                "{step}: {sql}"
            );
            let normal = normalize(sql);
            if normal.starts_with("update attempts") || normal.starts_with("delete from attempts") {
                assert_eq!(verdict, Verdict::Routed, "{step}: {sql}");
            }
        }
    }
}

on_both_backends!(
    the_send_paths_new_statements_keep_the_distribution_rule,
    a_refused_outcome_is_retried_not_rewritten_and_nothing_fails_over,
    a_sent_attempt_whose_job_finished_elsewhere_is_closed_not_stranded,
    past_max_late_calls_a_timed_out_call_is_dropped_and_counted,
);
