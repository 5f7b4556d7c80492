//! Every guard of the send path bites (docs/design.md, "Invariants and what
//! enforces them"): the claim is the confirmation before sending, so a
//! second confirmation of one claim is never granted, and a claim whose
//! lease ran out goes back to the queue unsent (`sent_at` still NULL) when
//! its request never left, or becomes `unknown` when it did. And a job page
//! never offers a new attempt while one is unknown.

use std::time::Duration;

use onejob::domain::{AttemptId, AttemptState};
use onejob::store::jobs::{create_job, create_job_with_attempts, CreateOutcome, NewJob};
use onejob::store::queue::{self, Claim, ClaimRules, SendPermit, StartNow};
use onejob::store::{Attempt, DbConnection};
use reqwest::StatusCode;

use crate::support::db::{attempts_in, new_job};
use crate::support::harness::{
    summarize, test_config, FormClient, PreparedApp, TestBackend, DEFAULT_TEST_PROVIDERS,
};

/// A queued job of `owner` under `key`, straight through the store.
fn queued_job(conn: &mut DbConnection, owner: &onejob::domain::UserId, key: &str) {
    let job = new_job(owner, key);
    match create_job(conn, &job).unwrap() {
        CreateOutcome::Created(_) => {}
        other => panic!("{other:?}"),
    }
}

/// The soft timeout every claim of these scenarios gives its provider.
const SOFT_TIMEOUT_MS: i64 = 3000;

/// Claims what `worker` may take, confirmed for sending or not.
fn claim(conn: &mut DbConnection, worker: &str, lease_ms: i64, confirm: bool) -> Vec<Claim> {
    claim_up_to(conn, worker, lease_ms, confirm, 10)
}

/// Claims at most `limit` attempts for `worker`.
fn claim_up_to(
    conn: &mut DbConnection,
    worker: &str,
    lease_ms: i64,
    confirm: bool,
    limit: i64,
) -> Vec<Claim> {
    let mut admit = |_: &AttemptId, _: &str| true;
    queue::claim_batch(
        conn,
        ClaimRules {
            lease_owner: worker,
            lease_ms,
            limit,
            soft_timeout_ms: &|_| SOFT_TIMEOUT_MS,
            closed: &[],
            admit: &mut admit,
            confirm,
        },
    )
    .unwrap()
    .claims
}

/// The idempotency keys of the claimed jobs, sorted.
fn keys_of(claims: &[Claim]) -> Vec<String> {
    let mut keys: Vec<String> = claims
        .iter()
        .map(|c| c.job.idempotency_key.clone())
        .collect();
    keys.sort();
    keys
}

fn only_attempt(conn: &mut DbConnection, claim: &Claim) -> Attempt {
    let rows = attempts_in(conn, &claim.job.id);
    assert_eq!(rows.len(), 1, "{rows:#?}");
    rows.into_iter().next().unwrap()
}

/// A confirmed claim (the claim records `sent_at`: "this request is
/// leaving now") is granted once: a second claim, by the same worker or
/// another process's, takes nothing, and neither giving it back as unsent
/// nor the reaper (its lease still running) moves it.
async fn a_second_confirmation_of_one_claim_is_not_granted(backend: TestBackend) {
    let prepared = PreparedApp::new(backend, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let owner = prepared.alice.id.clone();
    prepared
        .with_conn(move |conn| {
            queued_job(conn, &owner, "confirm-once");
            let first = claim(conn, "w1", 60_000, true);
            assert_eq!(first.len(), 1, "the first confirmation is granted");
            let granted = only_attempt(conn, &first[0]);
            assert_eq!(granted.state, AttemptState::Running);
            let sent_at = granted.sent_at.expect("the claim records sent_at");
            assert_eq!(granted.lease_owner.as_deref(), Some("w1"));

            for worker in ["w1", "w2"] {
                let again = claim(conn, worker, 60_000, true);
                assert!(
                    again.is_empty(),
                    "{worker}: a second confirmation is not granted: {again:#?}"
                );
            }
            for worker in ["w1", "w2"] {
                assert_eq!(
                    queue::give_back_unsent(conn, &granted.key(), worker).unwrap(),
                    SendPermit::Lost,
                    "{worker}: a sent claim is never given back as unsent"
                );
            }
            assert!(
                queue::expire_leases(conn).unwrap().is_empty(),
                "a running lease is not reaped"
            );
            let after = only_attempt(conn, &first[0]);
            assert_eq!(after.state, AttemptState::Running);
            assert_eq!(after.sent_at, Some(sent_at), "sent_at untouched");
            assert_eq!(after.lease_owner.as_deref(), Some("w1"), "still w1's");
        })
        .await;
}

/// A claim whose lease ran out before its request left (never confirmed)
/// goes back to the queue with `sent_at` still NULL, and is then granted
/// once; a confirmed claim whose lease ran out becomes `unknown`, keeping
/// its `sent_at`, and is never claimed again.
async fn a_claim_whose_lease_ran_out_is_requeued_with_sent_at_still_null(backend: TestBackend) {
    let prepared = PreparedApp::new(backend, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let owner = prepared.alice.id.clone();
    prepared
        .with_conn(move |conn| {
            queued_job(conn, &owner, "unsent");
            let unsent = claim(conn, "w1", 1, false);
            assert_eq!(unsent.len(), 1);
            assert_eq!(only_attempt(conn, &unsent[0]).sent_at, None);
            std::thread::sleep(Duration::from_millis(30));
            let expired = queue::expire_leases(conn).unwrap();
            assert_eq!(
                expired,
                vec![(unsent[0].attempt.id.clone(), AttemptState::Queued)]
            );
            let requeued = only_attempt(conn, &unsent[0]);
            assert_eq!(requeued.state, AttemptState::Queued);
            assert_eq!(requeued.sent_at, None, "nothing was sent");
            assert_eq!(requeued.lease_expires_at, None);

            // Requeued, it is granted once, to one worker.
            let regranted = claim(conn, "w2", 1, true);
            assert_eq!(regranted.len(), 1);
            assert_eq!(regranted[0].attempt.id, unsent[0].attempt.id);
            assert!(claim(conn, "w1", 60_000, true).is_empty());
            let sent_at = only_attempt(conn, &regranted[0])
                .sent_at
                .expect("confirmed");

            // Its lease runs out too: it was sent, so it is unknown.
            std::thread::sleep(Duration::from_millis(30));
            let expired = queue::expire_leases(conn).unwrap();
            assert_eq!(
                expired,
                vec![(unsent[0].attempt.id.clone(), AttemptState::Unknown)]
            );
            let unknown = only_attempt(conn, &regranted[0]);
            assert_eq!(unknown.state, AttemptState::Unknown);
            assert_eq!(unknown.sent_at, Some(sent_at), "sent_at kept");
            assert!(claim(conn, "w3", 60_000, true).is_empty(), "never re-sent");
            assert!(queue::expire_leases(conn).unwrap().is_empty());
        })
        .await;
}

/// A claim takes no more than its limit, oldest first, even with more
/// attempts due; the next claim takes the rest.
async fn a_claim_takes_no_more_than_its_limit_oldest_first(backend: TestBackend) {
    let prepared = PreparedApp::new(backend, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let owner = prepared.alice.id.clone();
    prepared
        .with_conn(move |conn| {
            let keys = ["limit-1", "limit-2", "limit-3", "limit-4"];
            for key in keys {
                queued_job(conn, &owner, key);
                std::thread::sleep(Duration::from_millis(3));
            }
            let first = claim_up_to(conn, "w1", 60_000, false, 2);
            assert_eq!(keys_of(&first), ["limit-1", "limit-2"], "{first:#?}");
            let rest = claim_up_to(conn, "w2", 60_000, false, 10);
            assert_eq!(keys_of(&rest), ["limit-3", "limit-4"], "{rest:#?}");
        })
        .await;
}

/// A claim gives its attempt the provider's soft timeout, counted from
/// the claim: `timeout_at` is `started_at` plus the soft timeout, whether
/// the claim confirms the send or not.
async fn a_claim_sets_the_soft_timeout_from_its_start(backend: TestBackend) {
    let prepared = PreparedApp::new(backend, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let owner = prepared.alice.id.clone();
    prepared
        .with_conn(move |conn| {
            for (key, confirm) in [("timeout-confirmed", true), ("timeout-unconfirmed", false)] {
                queued_job(conn, &owner, key);
                let claims = claim(conn, "w1", 60_000, confirm);
                assert_eq!(claims.len(), 1, "{key}");
                for attempt in [claims[0].attempt.clone(), only_attempt(conn, &claims[0])] {
                    let started_at = attempt.started_at.expect("a claim records its start");
                    assert_eq!(
                        attempt.timeout_at,
                        Some(started_at + SOFT_TIMEOUT_MS),
                        "{key}: {attempt:#?}"
                    );
                }
            }
        })
        .await;
}

/// A job started in its creating transaction gives its first attempt the
/// provider's soft timeout from that start, as a claim does.
async fn a_started_attempt_gets_the_soft_timeout_from_its_start(backend: TestBackend) {
    let prepared = PreparedApp::new(backend, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let owner = prepared.alice.id.clone();
    prepared
        .with_conn(move |conn| {
            let job = NewJob {
                id: onejob::domain::JobId::new(),
                start: Some(StartNow {
                    lease_owner: "w1".into(),
                    lease_ms: 60_000,
                    soft_timeout_ms: SOFT_TIMEOUT_MS,
                }),
                ..new_job(&owner, "started-timeout")
            };
            let (created, attempts) = create_job_with_attempts(conn, &job).unwrap();
            let CreateOutcome::Created(job) = created else {
                panic!("{created:?}");
            };
            assert_eq!(attempts.len(), 1);
            for attempt in [attempts[0].clone(), attempts_in(conn, &job.id).remove(0)] {
                assert_eq!(attempt.state, AttemptState::Running);
                let started_at = attempt.started_at.expect("a started attempt records it");
                assert_eq!(
                    attempt.timeout_at,
                    Some(started_at + SOFT_TIMEOUT_MS),
                    "{attempt:#?}"
                );
            }
        })
        .await;
}

/// A renewal extends the lease by its length from the database's clock,
/// no further: a lease renewed for a second has run out a second and a half
/// later, and the reaper takes the sent attempt for unknown.
async fn a_renewed_lease_runs_out_after_its_length(backend: TestBackend) {
    let prepared = PreparedApp::new(backend, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let owner = prepared.alice.id.clone();
    prepared
        .with_conn(move |conn| {
            queued_job(conn, &owner, "renewed");
            let claims = claim(conn, "w1", 60_000, true);
            assert_eq!(claims.len(), 1);
            let attempt = &claims[0].attempt;
            assert!(queue::renew_lease(conn, &attempt.id, &owner, "w1", 1000).unwrap());
            assert!(
                queue::expire_leases(conn).unwrap().is_empty(),
                "the renewed lease still runs"
            );
            std::thread::sleep(Duration::from_millis(1500));
            assert_eq!(
                queue::expire_leases(conn).unwrap(),
                vec![(attempt.id.clone(), AttemptState::Unknown)]
            );
        })
        .await;
}

/// Two claimers at once: the second passes over the jobs the first holds
/// while it claims (on PostgreSQL, their rows locked `FOR UPDATE`, the
/// first's candidates, twice its limit) and takes the next one, without
/// waiting for the first to commit. On SQLite the claimers take turns, so
/// the second, after the first, takes what is left.
async fn a_claim_passes_over_jobs_another_claimer_holds(backend: TestBackend) {
    let prepared = PreparedApp::new(backend, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let owner = prepared.alice.id.clone();
    prepared
        .with_conn(move |conn| {
            for key in ["held-1", "held-2", "free-3"] {
                queued_job(conn, &owner, key);
                std::thread::sleep(Duration::from_millis(3));
            }
        })
        .await;
    let (claimed, claiming) = std::sync::mpsc::channel::<()>();
    let first = prepared.with_conn(move |conn| {
        onejob::store::connection::write_transaction(conn, |conn| {
            let claims = claim_up_to(conn, "w1", 60_000, true, 1);
            claimed.send(()).unwrap();
            // Held open while the second claimer runs.
            std::thread::sleep(Duration::from_millis(800));
            Ok::<_, diesel::result::Error>((claims, std::time::Instant::now()))
        })
        .unwrap()
    });
    let second = prepared.with_conn(move |conn| {
        claiming.recv().unwrap();
        let claims = claim_up_to(conn, "w2", 60_000, true, 2);
        (claims, std::time::Instant::now())
    });
    let ((first, first_committed), (second, second_done)) = tokio::join!(first, second);
    assert_eq!(keys_of(&first), ["held-1"]);
    match backend {
        TestBackend::Postgres => {
            assert_eq!(keys_of(&second), ["free-3"], "{second:#?}");
            assert!(
                second_done < first_committed,
                "the second claimer did not wait for the first"
            );
        }
        TestBackend::Sqlite => {
            assert_eq!(keys_of(&second), ["free-3", "held-2"], "{second:#?}");
        }
    }
}

/// The job page of a job whose attempt is unknown offers no new attempt,
/// to its owner or to staff, in the page and in its live partial, and says
/// why; once support abandons the attempt, it does.
async fn an_unknown_jobs_page_offers_no_new_attempt(backend: TestBackend) {
    let app = crate::support::harness::spawn_app_with(
        backend,
        test_config(crate::attempts::HANGING_PRIMARY),
    )
    .await;
    app.set_password("alice", "a-pw").await;
    app.set_password("sue", "s-pw").await;
    let job_id = app
        .create_job(&app.alice.token, "unknown-page", &summarize("x"))
        .await;
    let job = app
        .wait_for_status(&job_id, "unknown", Duration::from_secs(15))
        .await;
    let attempt = job["attempts"][0]["id"].as_str().unwrap().to_owned();
    let alice = FormClient::new(&app);
    alice.sign_in("alice", "a-pw").await;
    let sue = FormClient::new(&app);
    let csrf = sue.sign_in("sue", "s-pw").await;
    let page = format!("/jobs/{job_id}");
    for (who, client) in [("owner", &alice), ("support", &sue)] {
        let html = client.get(&page).await.text().await.unwrap();
        assert!(html.contains("data-state=\"unknown\""), "{who}: {html}");
        assert!(
            !html.contains("id=\"new-attempt\""),
            "{who}: no new attempt is offered while one is unknown: {html}"
        );
        assert!(
            !html.contains(&format!("action=\"/jobs/{job_id}/attempts\"")),
            "{who}: no form posts a new attempt: {html}"
        );
        assert!(html.contains("id=\"retry-refusal\""), "{who}: {html}");
        assert!(html.contains("outcome is unknown"), "{who}: {html}");
    }
    let partial = sue.partial(&page).await;
    assert!(partial.contains("id=\"retry-refusal\""), "{partial}");
    assert!(!partial.contains("id=\"new-attempt\""), "{partial}");

    let response = sue
        .abandon_attempt(&csrf, &attempt, "provider outage")
        .await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let html = alice.get(&page).await.text().await.unwrap();
    assert!(
        html.contains("id=\"new-attempt\""),
        "offered once the attempt is abandoned: {html}"
    );
    assert!(!html.contains("id=\"retry-refusal\""), "{html}");
}

/// A job read just before its only attempt finished, paired with the
/// attempts read just after: `with_attempts` reads the job again, so the
/// pair says "succeeded" and never "running, nothing live" (which a
/// duplicate would be answered `job_needs_support` for).
async fn a_job_read_across_its_attempts_finish_is_read_again(backend: TestBackend) {
    use onejob::store::completion::complete_success;
    use onejob::store::reads::with_attempts;
    use onejob::store::rows::AttemptKey;

    let prepared = PreparedApp::new(backend, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let owner = prepared.alice.id.clone();
    prepared
        .with_conn(move |conn| {
            queued_job(conn, &owner, "read-across");
            let claimed = claim(conn, "w1", 60_000, true);
            let job_before = claimed[0].job.clone();
            assert!(!job_before.status.is_terminal());
            let key = AttemptKey {
                id: claimed[0].attempt.id.clone(),
                owner_id: owner.clone(),
            };
            complete_success(conn, &key, &serde_json::json!({"summary": "s"})).unwrap();

            let (job, attempts) = with_attempts(conn, job_before.clone()).unwrap();
            assert_eq!(attempts[0].state, AttemptState::Succeeded);
            assert_eq!(job.status, onejob::domain::JobStatus::Succeeded, "{job:#?}");
            assert_eq!(job.completed_by.as_ref(), Some(&key.id));
        })
        .await;
}

/// The winning compare-and-swap hands back the job's row as it stored it
/// (SQLite's `UPDATE … RETURNING`, PostgreSQL's one statement reading each
/// column from its `cas` step), which a waiter answers from: it must be
/// the row a read finds afterwards, column for column. An answer that does
/// not win hands back none.
async fn the_winning_compare_and_swap_returns_the_row_it_stored(backend: TestBackend) {
    use onejob::store::completion::settle_answer;
    use onejob::store::ledger::Charge;
    use onejob::store::reads::get_job;
    use onejob::store::rows::{AttemptKey, JobKey};

    let prepared = PreparedApp::new(backend, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let owner = prepared.alice.id.clone();
    prepared
        .with_conn(move |conn| {
            queued_job(conn, &owner, "returned-row");
            let claimed = claim(conn, "w1", 60_000, true);
            let key = AttemptKey {
                id: claimed[0].attempt.id.clone(),
                owner_id: owner.clone(),
            };
            let answer = serde_json::json!({"summary": "the stored one"});
            let won = settle_answer(conn, &key, &answer, &Charge::unpriced("m")).unwrap();
            let returned = won.finished.expect("the winner's row comes back");
            let stored = get_job(
                conn,
                &JobKey {
                    id: claimed[0].job.id.clone(),
                    owner_id: owner.clone(),
                },
            )
            .unwrap();
            assert_eq!(returned, stored);
            assert_eq!(stored.version, claimed[0].job.version + 1);
            assert_eq!(stored.completed_by.as_ref(), Some(&key.id));

            let again = serde_json::json!({"summary": "a second, different answer"});
            let late = settle_answer(conn, &key, &again, &Charge::unpriced("m")).unwrap();
            assert!(late.finished.is_none(), "{:?}", late.applied);
        })
        .await;
}

on_both_backends!(
    a_second_confirmation_of_one_claim_is_not_granted,
    the_winning_compare_and_swap_returns_the_row_it_stored,
    a_job_read_across_its_attempts_finish_is_read_again,
    a_claim_whose_lease_ran_out_is_requeued_with_sent_at_still_null,
    an_unknown_jobs_page_offers_no_new_attempt,
    a_claim_takes_no_more_than_its_limit_oldest_first,
    a_claim_sets_the_soft_timeout_from_its_start,
    a_claim_passes_over_jobs_another_claimer_holds,
    a_started_attempt_gets_the_soft_timeout_from_its_start,
    a_renewed_lease_runs_out_after_its_length,
);
