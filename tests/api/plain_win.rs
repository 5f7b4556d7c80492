//! PostgreSQL's plain win in one statement (`store::plain_win`): a running
//! attempt's answer that wins its job, for an owner with no budget and no
//! endpoint for `job.succeeded`, is decided and counted by one
//! autocommitted statement. Anything else, the statement changes nothing
//! and the compare-and-swap's transaction decides, as on SQLite.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use onejob::domain::ledger::{Price, Rate};
use onejob::domain::{AttemptId, AttemptState, JobStatus, RaceResult, UserId};
use onejob::store::completion::settle_answer;
use onejob::store::jobs::{create_job, CreateOutcome};
use onejob::store::ledger::Charge;
use onejob::store::plain_win::settle_plain_win;
use onejob::store::queue::{self, ClaimRules};
use onejob::store::rows::{AttemptKey, Job};
use onejob::store::schema::usage_ledger;
use onejob::store::{Attempt, DbConnection};
use reqwest::StatusCode;

use crate::support::db::new_job;
use crate::support::harness::{
    postgres_available, spawn_recorded, summarize, test_config, PreparedApp, TestApp, TestBackend,
    DEFAULT_TEST_PROVIDERS,
};
use crate::support::statement_log::StatementLog;

/// A job of `owner` under `key`, its attempt claimed and confirmed for
/// sending, straight through the store.
fn sent_job(conn: &mut DbConnection, owner: &UserId, key: &str) -> (Job, Attempt) {
    match create_job(conn, &new_job(owner, key)).unwrap() {
        CreateOutcome::Created(_) => {}
        other => panic!("{other:?}"),
    }
    let mut admit = |_: &AttemptId, _: &str| true;
    let claim = queue::claim_batch(
        conn,
        ClaimRules {
            lease_owner: "w",
            lease_ms: 60_000,
            limit: 1,
            soft_timeout_ms: &|_| 3000,
            closed: &[],
            admit: &mut admit,
            confirm: true,
        },
    )
    .unwrap()
    .claims
    .remove(0);
    (claim.job, claim.attempt)
}

/// Everything a settlement can change for one attempt: its job, the
/// attempt, and its calls in the ledger.
fn rows_of(conn: &mut DbConnection, attempt: &Attempt) -> (Job, Attempt, i64) {
    let job = onejob::store::reads::get_job(conn, &attempt.job_key()).unwrap();
    let row = onejob::store::reads::find_owned_attempt(conn, &attempt.id, &attempt.owner_id)
        .unwrap()
        .unwrap();
    let calls = usage_ledger::table
        .filter(usage_ledger::attempt_id.eq(&attempt.id))
        .count()
        .get_result(conn)
        .unwrap();
    (job, row, calls)
}

fn key_of(attempt: &Attempt) -> AttemptKey {
    AttemptKey {
        id: attempt.id.clone(),
        owner_id: attempt.owner_id.clone(),
    }
}

/// The statement alone, bypassing the rest of onejob. A plain win stores
/// the answer, moves the job's version on, marks the attempt `won` and
/// counts the call, in one statement. Each way a win is not plain (the
/// job's version moved, the job completed by another, the attempt
/// `unknown`, the owner with a budget row or a subscribed endpoint, a
/// priced call whose tokens were not reported, the attempt already
/// answered) finds it changing nothing: every row as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_one_statement_changes_nothing_unless_the_win_is_plain() {
    if !postgres_available() {
        return;
    }
    // No server: no worker of its own claims these jobs.
    let app = PreparedApp::new(TestBackend::Postgres, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let (alice, bob) = (app.alice.id.clone(), app.bob.id.clone());
    app.with_conn(move |conn| {
        let DbConnection::Postgresql(_) = conn else {
            unreachable!()
        };
        let answer = r#"{"summary":"plain"}"#;
        let now = onejob::domain::Timestamp::now();
        let plain = |conn: &mut DbConnection, attempt: &Attempt, charge: &Charge| {
            let DbConnection::Postgresql(pg) = conn else {
                unreachable!()
            };
            settle_plain_win(pg, &key_of(attempt), answer, charge, now).unwrap()
        };
        let unpriced = Charge::unpriced("m");

        // The plain win.
        let (job, attempt) = sent_job(conn, &alice, "plain");
        let won = plain(conn, &attempt, &unpriced).expect("a plain win");
        let (stored, row, calls) = rows_of(conn, &attempt);
        assert_eq!(won.job, stored, "the row it returns is the row it stored");
        assert_eq!(stored.status, JobStatus::Succeeded);
        assert_eq!(stored.version, job.version + 1);
        assert_eq!(stored.completed_by.as_ref(), Some(&attempt.id));
        assert_eq!(stored.result.as_ref().map(|r| r.as_str()), Some(answer));
        assert_eq!(row.state, AttemptState::Succeeded);
        assert_eq!(row.outcome, Some(RaceResult::Won));
        assert_eq!(row.lease_expires_at, None);
        assert_eq!(calls, 1);
        let entry = won.entry.expect("the call counted");
        assert_eq!(entry.kind, "won");
        // Estimated: the input's bytes and the answer's, three to a token.
        let input_bytes = stored.input.as_str().len() as i64;
        assert_eq!(entry.prompt_tokens, (input_bytes + 2) / 3);
        assert_eq!(entry.completion_tokens, (answer.len() as i64 + 2) / 3);
        let stored_entry = onejob::store::ledger::entries_of_job(conn, &stored.id, &alice)
            .unwrap()
            .remove(0);
        assert_eq!(
            entry, stored_entry,
            "the entry it returns is the one it stored"
        );
        // Answered already: nothing more.
        assert!(plain(conn, &attempt, &unpriced).is_none());
        assert_eq!(rows_of(conn, &attempt), (stored, row, calls));

        // Each way a win is not plain, arranged by hand.
        let arrangements: [(&str, &str); 5] = [
            (
                "version-moved",
                "UPDATE jobs SET version = version + 1 WHERE id = '{job}'",
            ),
            (
                "completed",
                "UPDATE jobs SET completed_by = '{attempt}' WHERE id = '{job}'",
            ),
            (
                "unknown",
                "UPDATE attempts SET state = 'unknown' WHERE id = '{attempt}'",
            ),
            (
                "budget",
                "INSERT INTO budgets (owner_id, spend_limit_micros, token_limit, period_start, \
                 spent_micros, spent_tokens, reserved_micros, reserved_tokens, updated_at) \
                 VALUES ('{owner}', NULL, 1000000, 0, 0, 0, 0, 0, 0)",
            ),
            (
                "subscribed",
                "INSERT INTO webhook_endpoints (id, owner_id, url, enabled, generation, \
                 secret_fingerprint, retry_for_ms, consecutive_failures, created_at, updated_at) \
                 VALUES ('ep-{owner}', '{owner}', 'https://example.com/hook', TRUE, 1, 'f', \
                 60000, 0, 0, 0); \
                 INSERT INTO webhook_subscriptions (owner_id, endpoint_id, kind) \
                 VALUES ('{owner}', 'ep-{owner}', 'job.succeeded')",
            ),
        ];
        for (name, sql) in arrangements {
            // Bob's jobs for the owner-wide arrangements, so that each
            // case starts from an owner without them.
            let owner = if matches!(name, "budget" | "subscribed") {
                &bob
            } else {
                &alice
            };
            let (job, attempt) = sent_job(conn, owner, name);
            let sql = sql
                .replace("{job}", job.id.as_str())
                .replace("{attempt}", attempt.id.as_str())
                .replace("{owner}", owner.as_str());
            conn.batch_execute(&sql).unwrap();
            let before = rows_of(conn, &attempt);
            assert!(
                plain(conn, &attempt, &unpriced).is_none(),
                "{name}: not plain"
            );
            assert_eq!(rows_of(conn, &attempt), before, "{name}: nothing changed");
            if name == "budget" {
                conn.batch_execute(&format!("DELETE FROM budgets WHERE owner_id = '{bob}'"))
                    .unwrap();
            }
        }
        // Priced on tokens the provider did not report: the cost depends
        // on an estimate, which the transaction makes.
        let (_, attempt) = sent_job(conn, &alice, "priced");
        let priced = Charge {
            price: Some(Price {
                provider: attempt.provider.clone(),
                model: "m".into(),
                input: Rate::per_million(1.0).unwrap(),
                output: Rate::per_million(2.0).unwrap(),
                cached: Rate::per_million(0.5).unwrap(),
                effective_from: now,
            }),
            ..Charge::unpriced("m")
        };
        let before = rows_of(conn, &attempt);
        assert!(plain(conn, &attempt, &priced).is_none());
        assert_eq!(rows_of(conn, &attempt), before);
        // The transaction settles it, as before.
        let settled = settle_answer(
            conn,
            &key_of(&attempt),
            &serde_json::json!({"s": 1}),
            &priced,
        )
        .unwrap();
        assert_eq!(settled.applied, onejob::domain::Applied::Won);
        assert!(settled.entry.unwrap().cost_micros.is_some());
    })
    .await;
}

/// A job of alice's under `key`, created through the server, once it has
/// succeeded.
async fn succeeded(app: &TestApp, key: &str) -> serde_json::Value {
    let response = app.post_job(&app.alice.token, key, &summarize(key)).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let job: serde_json::Value = response.json().await.unwrap();
    let id = job["id"].as_str().unwrap();
    app.wait_for_status(id, "succeeded", crate::support::fake_provider::WAIT)
        .await
}

/// Through the server: a job's answer is settled by one statement that
/// runs in no transaction, and nothing locks the job first. With a budget
/// set for the owner, that statement changes nothing and the answer takes
/// the transaction (the job locked first), which settles the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plain_win_is_one_statement_and_a_budgeted_one_a_transaction() {
    if !postgres_available() {
        return;
    }
    let log = StatementLog::new();
    let app = spawn_recorded(TestBackend::Postgres, &log).await;
    // The statements that write the attempt's ledger row: the one
    // statement's, and the transaction's insert; and the locks taken on
    // its job before them.
    let settled_by = |log: &StatementLog, job: &serde_json::Value| {
        let attempt = job["attempts"][0]["id"].as_str().unwrap().to_owned();
        let sent = log.take_sent();
        let ledger = sent
            .iter()
            .filter(|s| s.sql.contains("INSERT INTO") && s.sql.contains("usage_ledger"))
            .filter(|s| s.sql.contains(&attempt));
        let (one, inserts): (Vec<_>, Vec<_>) =
            ledger.cloned().partition(|s| s.sql.contains("WITH j AS"));
        let locks = sent
            .iter()
            .filter(|s| s.sql.contains("FOR UPDATE") && s.sql.contains(&attempt))
            .filter(|s| !s.sql.contains("WITH j AS"))
            .count();
        (one, inserts, locks)
    };

    let job = succeeded(&app, "plain").await;
    let (one, inserts, locks) = settled_by(&log, &job);
    assert_eq!(one.len(), 1, "{one:#?}");
    assert_eq!(one[0].transaction, None, "autocommitted: {one:#?}");
    assert!(inserts.is_empty(), "no transaction after it: {inserts:#?}");
    assert_eq!(locks, 0, "no lock taken before it");

    let alice = app.alice.id.clone();
    app.with_conn(move |conn| {
        let limits = onejob::domain::ledger::BudgetLimits {
            spend_micros: None,
            tokens: Some(1_000_000),
        };
        let now = onejob::domain::Timestamp::now();
        onejob::store::budgets::set_limits(conn, &alice, limits, Default::default(), now).unwrap();
    })
    .await;
    log.take_sent();
    let job = succeeded(&app, "budgeted").await;
    let (one, inserts, locks) = settled_by(&log, &job);
    assert_eq!(one.len(), 1, "tried first, changing nothing: {one:#?}");
    assert_eq!(inserts.len(), 1, "{inserts:#?}");
    assert!(
        inserts[0].transaction.is_some(),
        "in the transaction: {inserts:#?}"
    );
    assert_eq!(locks, 1, "the job locked first");
    let alice = app.alice.id.clone();
    let budget = app
        .with_conn(move |conn| onejob::store::budgets::find(conn, &alice).unwrap().unwrap())
        .await;
    assert!(budget.spent_tokens > 0, "{budget:?}");
    assert_eq!(
        budget.reserved_tokens, 0,
        "its reservation released: {budget:?}"
    );
}

/// A statement that finds one attempt by its key and checks its state
/// (the plain win's, a transition's, the claim's, a lease renewal's) is
/// planned on the primary key whatever the statistics say: with 2,005
/// finished attempts analysed, then three of them running (as a busy
/// table is analysed when its work has finished), PostgreSQL plans
/// `state = 'running' AND id = …` on `attempts_state_order` (walking every
/// running entry for one row), and the check as onejob writes it
/// (`transitions::state_on_row_sql`) on `attempts_pkey`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_state_check_by_key_is_planned_on_the_primary_key_whatever_the_statistics() {
    use onejob::domain::AttemptState;
    use onejob::store::transitions::state_on_row_sql;

    if !postgres_available() {
        return;
    }
    let app = PreparedApp::new(TestBackend::Postgres, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let owner = app.alice.id.clone();
    let plans = app
        .with_conn(move |conn| {
            let fingerprint = "0".repeat(64);
            conn.batch_execute(&format!(
                "INSERT INTO jobs (id, owner_id, idempotency_key, task, provider, input, params, \
                   fingerprint, status, version, created_at, updated_at) \
                 SELECT 'j' || n, '{owner}', 'k' || n, 'summarize', 'sim-fast', '{{}}', '{{}}', \
                   '{fingerprint}', 'failed', 0, n, n \
                 FROM generate_series(1, 2005) AS n; \
                 INSERT INTO attempts (id, job_id, owner_id, number, provider, state, created_at) \
                 SELECT 'a' || n, 'j' || n, '{owner}', 1, 'sim-fast', 'failed', n \
                 FROM generate_series(1, 2005) AS n; \
                 ANALYZE attempts; \
                 UPDATE jobs SET status = 'running' WHERE id IN ('j2001', 'j2002', 'j2003'); \
                 UPDATE attempts SET state = 'running' WHERE id IN ('a2001', 'a2002', 'a2003');"
            ))
            .unwrap();
            let mut plan = |check: &str| -> String {
                #[derive(diesel::QueryableByName)]
                struct Line {
                    #[diesel(sql_type = diesel::sql_types::Text, column_name = "QUERY PLAN")]
                    line: String,
                }
                let lines: Vec<Line> = diesel::sql_query(format!(
                    "EXPLAIN UPDATE attempts SET outcome = 'won' \
                     WHERE id = 'a2003' AND owner_id = '{owner}' AND {check}"
                ))
                .load(conn)
                .unwrap();
                lines
                    .into_iter()
                    .map(|l| l.line)
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            let naive = plan("state = 'running'");
            (naive, plan(&state_on_row_sql(&[AttemptState::Running])))
        })
        .await;
    let (naive, onejob) = plans;
    assert!(
        naive.contains("attempts_state_order"),
        "the statistics no longer mislead the planner, so this test shows nothing: {naive}"
    );
    assert!(onejob.contains("attempts_pkey"), "{onejob}");
    assert!(!onejob.contains("attempts_state_order"), "{onejob}");
}
