//! Real concurrency: many writers at once, two completions racing for one job,
//! and two server processes sharing one database.

use std::sync::{Arc, Barrier};

use diesel::prelude::*;
use onejob::domain::{Applied, AttemptId, JobId, JsonText, UserId};
use onejob::store::jobs::{self as job_store, CreateOutcome, NewJob};
use onejob::store::rows::{AttemptKey, JobKey};
use onejob::store::schema::{jobs, race_log};
use onejob::store::DbConnection;
use onejob::store::{completion, operator, queue};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::harness::{
    spawn_app, summarize, test_config, PreparedApp, TestBackend, DEFAULT_TEST_PROVIDERS,
};

async fn sixteen_concurrent_writers_see_no_lock_errors_and_every_success_is_stored(
    backend: TestBackend,
) {
    const WRITERS: usize = 16;
    const JOBS_EACH: usize = 8;
    let app = Arc::new(spawn_app(backend).await);
    let barrier = Arc::new(tokio::sync::Barrier::new(WRITERS));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (app, barrier) = (app.clone(), barrier.clone());
        writers.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut outcomes = Vec::new();
            for j in 0..JOBS_EACH {
                let response = app
                    .post_job(
                        &app.alice.token,
                        &format!("w{w}-j{j}"),
                        &summarize(&format!("{w}/{j}")),
                    )
                    .await;
                let status = response.status();
                let text = response.text().await.unwrap();
                outcomes.push((status, text));
            }
            outcomes
        }));
    }
    let mut created_ids = Vec::new();
    for writer in writers {
        for (status, text) in writer.await.unwrap() {
            assert!(
                !text.to_lowercase().contains("locked"),
                "a lock error reached the client: {text}"
            );
            assert_eq!(status, StatusCode::CREATED, "{text}");
            let job: Value = serde_json::from_str(&text).unwrap();
            created_ids.push(job["id"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(created_ids.len(), WRITERS * JOBS_EACH);
    let ids = created_ids.clone();
    let stored: i64 = app
        .with_conn(move |conn| {
            jobs::table
                .filter(jobs::id.eq_any(ids))
                .count()
                .get_result(conn)
                .unwrap()
        })
        .await;
    assert_eq!(
        stored as usize,
        created_ids.len(),
        "every reported success is a stored row"
    );
    assert_eq!(
        app.job_count(&app.alice.id).await as usize,
        created_ids.len(),
        "and nothing else was stored"
    );
}

/// Claims the oldest due queued attempt for the lease owner "racer", as the
/// worker's claim does, without confirming it for sending.
fn claim_one(conn: &mut DbConnection) -> onejob::store::StoreResult<Option<queue::Claim>> {
    let mut admit_all = |_: &AttemptId, _: &str| true;
    let rules = queue::ClaimRules {
        lease_owner: "racer",
        lease_ms: 60_000,
        limit: 1,
        soft_timeout_ms: &|_| 100,
        closed: &[],
        admit: &mut admit_all,
        confirm: false,
    };
    Ok(queue::claim_batch(conn, rules)?.claims.pop())
}

/// Builds a job whose abandoned attempt 1 and running attempt 2 both read
/// version 0, ready to race.
fn two_attempts_ready_to_race(
    conn: &mut DbConnection,
    owner: &UserId,
    key: &str,
) -> (JobId, AttemptId, AttemptId) {
    let (job_id, first) = job_with_an_abandoned_attempt(conn, owner, key);
    let job = JobKey {
        id: job_id.clone(),
        owner_id: owner.clone(),
    };
    operator::start_attempt(conn, &job, Some("sim-fast"), &[], None).unwrap();
    let second = claim_one(conn).unwrap().unwrap().attempt.id;
    (job_id, first, second)
}

async fn two_completions_racing_for_one_job_have_exactly_one_winner(backend: TestBackend) {
    let prepared = PreparedApp::new(backend, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let store = prepared.store.clone();
    let owner = prepared.ada.id.clone();
    tokio::task::spawn_blocking(move || {
        for round in 0..15 {
            let (job_id, first, second) = two_attempts_ready_to_race(
                &mut store.conn().unwrap(),
                &owner,
                &format!("race-{round}"),
            );
            let barrier = Arc::new(Barrier::new(2));
            let racers: Vec<_> = [first.clone(), second.clone()]
                .into_iter()
                .map(|attempt_id| {
                    let (store, barrier) = (store.clone(), barrier.clone());
                    let key = AttemptKey {
                        id: attempt_id.clone(),
                        owner_id: owner.clone(),
                    };
                    std::thread::spawn(move || {
                        let mut conn = store.conn().unwrap();
                        let payload = json!({"from": attempt_id});
                        barrier.wait();
                        (
                            attempt_id.clone(),
                            completion::complete_success(&mut conn, &key, &payload)
                                .unwrap()
                                .0,
                        )
                    })
                })
                .collect();
            let results: Vec<(AttemptId, Applied)> =
                racers.into_iter().map(|t| t.join().unwrap()).collect();
            let winners: Vec<_> = results.iter().filter(|r| r.1 == Applied::Won).collect();
            assert_eq!(winners.len(), 1, "round {round}: {results:?}");
            let winner = winners[0].0.clone();
            let mut conn = store.conn().unwrap();
            let job = onejob::store::reads::get_job(
                &mut conn,
                &JobKey {
                    id: job_id.clone(),
                    owner_id: owner.clone(),
                },
            )
            .unwrap();
            assert_eq!(job.completed_by.as_ref(), Some(&winner));
            assert_eq!(job.result.map(|r| r.value()), Some(json!({"from": winner})));
            assert_eq!(job.version, 1);
            let logged: i64 = race_log::table
                .filter(race_log::job_id.eq(&job_id))
                .count()
                .get_result(&mut conn)
                .unwrap();
            assert_eq!(logged, 1, "the loser is in the race log");
        }
    })
    .await
    .unwrap();
}

/// A job whose attempt 1 is abandoned (its late answer still to come).
fn job_with_an_abandoned_attempt(
    conn: &mut DbConnection,
    owner: &UserId,
    key: &str,
) -> (JobId, AttemptId) {
    let new = NewJob {
        id: onejob::domain::JobId::new(),
        start: None,
        reservation: Default::default(),
        trace_context: None,
        kept_grant: None,
        owner_id: owner.clone(),
        key: onejob::domain::IdempotencyKey::parse(key).unwrap(),
        task: "summarize".into(),
        provider: "sim-slow".into(),
        requested_provider: None,
        input: JsonText::from_value(&json!({"text": key})),
        params: JsonText::from_value(&json!({})),
        fingerprint: "2".repeat(64),
    };
    let CreateOutcome::Created(job) = job_store::create_job(conn, &new).unwrap() else {
        panic!("not created")
    };
    let first = claim_one(conn).unwrap().unwrap().attempt.id;
    let first_key = AttemptKey {
        id: first.clone(),
        owner_id: owner.clone(),
    };
    assert_eq!(
        queue::mark_unknown(conn, &first_key, &"soft timeout".into()).unwrap(),
        Applied::MarkedUnknown
    );
    operator::abandon(conn, &first_key, owner, "race test").unwrap();
    (job.id, first)
}

async fn a_new_attempt_racing_a_winning_late_result_is_never_sent(backend: TestBackend) {
    let prepared = PreparedApp::new(backend, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let store = prepared.store.clone();
    let owner = prepared.ada.id.clone();
    tokio::task::spawn_blocking(move || {
        let order = vec!["sim-slow".to_owned(), "sim-fast".to_owned()];
        let (mut new_attempt_first, mut late_first) = (0, 0);
        for round in 0..15 {
            let (job_id, first) = job_with_an_abandoned_attempt(
                &mut store.conn().unwrap(),
                &owner,
                &format!("late-{round}"),
            );
            let barrier = Arc::new(Barrier::new(2));
            let late = {
                let (store, barrier) = (store.clone(), barrier.clone());
                let first = AttemptKey {
                    id: first.clone(),
                    owner_id: owner.clone(),
                };
                std::thread::spawn(move || {
                    let mut conn = store.conn().unwrap();
                    barrier.wait();
                    completion::complete_success(&mut conn, &first, &json!({"late": true})).unwrap().0
                })
            };
            let retry = {
                let (store, barrier, order) = (store.clone(), barrier.clone(), order.clone());
                let job = JobKey {
                    id: job_id.clone(),
                    owner_id: owner.clone(),
                };
                std::thread::spawn(move || {
                    let mut conn = store.conn().unwrap();
                    barrier.wait();
                    operator::start_attempt(&mut conn, &job, None, &order, None)
                })
            };
            assert_eq!(late.join().unwrap(), Applied::Won, "round {round}");
            let retried = retry.join().unwrap();
            let mut conn = store.conn().unwrap();
            let attempts = crate::support::db::attempts_in(&mut conn, &job_id);
            match retried {
                // The new attempt came first; the late answer then won and
                // closed it before anyone could send it.
                Ok(second) => {
                    new_attempt_first += 1;
                    let second = attempts.iter().find(|a| a.id == second.id).unwrap();
                    assert_eq!(second.state, onejob::domain::AttemptState::Failed, "round {round}");
                    assert_eq!(
                        second.error.as_deref(),
                        Some("not sent: the job had already finished"),
                        "round {round}"
                    );
                    assert!(second.started_at.is_none(), "round {round}: never claimed");
                }
                // The late answer came first: the job was finished.
                Err(operator::ActionError::JobFinished(status)) => {
                    late_first += 1;
                    assert_eq!(status, onejob::domain::JobStatus::Succeeded);
                    assert_eq!(attempts.len(), 1, "round {round}: nothing was added");
                }
                Err(other) => panic!("round {round}: {other:?}"),
            }
            assert!(
                attempts.iter().all(|a| !a.state.is_live()),
                "round {round}: a finished job keeps no live attempt: {attempts:?}"
            );
            assert!(
                claim_one(&mut conn)
                    .unwrap()
                    .is_none(),
                "round {round}: nothing is left to send"
            );
        }
        eprintln!(
            "late answer vs new attempt: new attempt first {new_attempt_first}, late answer first {late_first}"
        );
    })
    .await
    .unwrap();
}

on_both_backends!(
    sixteen_concurrent_writers_see_no_lock_errors_and_every_success_is_stored,
    two_completions_racing_for_one_job_have_exactly_one_winner,
    a_new_attempt_racing_a_winning_late_result_is_never_sent,
);
