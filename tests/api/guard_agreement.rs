//! The SQL of each guarded statement and its predicate in `domain::guards`
//! agree (the model checker in `tests/model` applies the predicates): for
//! every combination of the column values a guard reads, rows are written
//! as that combination and the real statement runs; what it changed is
//! what the predicate says.

use diesel::connection::SimpleConnection;
use onejob::domain::guards;
use onejob::domain::{
    AttemptId, AttemptState, Fingerprint, JobId, JobIntent, JobStatus, Timestamp, UserId,
};
use onejob::store::jobs::{create_job, CreateOutcome};
use onejob::store::queue::{self, ClaimRules, SendPermit};
use onejob::store::DbConnection;
use serde_json::json;

use crate::support::db::{attempts_in, new_job};
use crate::support::harness::{test_config, PreparedApp, TestBackend, DEFAULT_TEST_PROVIDERS};

/// A fresh job with one queued attempt.
fn case(conn: &mut DbConnection, owner: &UserId, key: &str) -> (JobId, AttemptId) {
    let job = new_job(owner, key);
    let CreateOutcome::Created(job) = create_job(conn, &job).unwrap() else {
        panic!("{key} existed");
    };
    let attempt = attempts_in(conn, &job.id).remove(0).id;
    (job.id, attempt)
}

fn sql_instant(value: Option<Timestamp>) -> String {
    value.map_or("NULL".into(), |v| v.millis().to_string())
}

fn sql_text(value: Option<&str>) -> String {
    value.map_or("NULL".into(), |v| format!("'{v}'"))
}

/// The columns a case writes: its attempt's, and its job's status.
struct Shape<'a> {
    state: AttemptState,
    status: JobStatus,
    provider: &'a str,
    not_before: Option<Timestamp>,
    lease: (Option<&'a str>, Option<Timestamp>),
    sent_at: Option<Timestamp>,
}

impl Shape<'_> {
    /// An attempt in `state` of a job in `status`, on `sim-fast`, due, not
    /// leased, not sent.
    fn new(state: AttemptState, status: JobStatus) -> Self {
        Self {
            state,
            status,
            provider: "sim-fast",
            not_before: None,
            lease: (None, None),
            sent_at: None,
        }
    }
}

/// Writes `shape` to the attempt and its job (a succeeded job gets the
/// `completed_by` and `result` its CHECK asks for).
fn shape(conn: &mut DbConnection, job: &JobId, attempt: &AttemptId, shape: Shape<'_>) {
    let Shape {
        state,
        status,
        provider,
        not_before,
        lease,
        sent_at,
    } = shape;
    conn.batch_execute(&format!(
        "UPDATE attempts SET state = '{state}', provider = '{provider}', not_before = {}, \
         lease_owner = {}, lease_expires_at = {}, sent_at = {}, version_read = 0 \
         WHERE id = '{attempt}'",
        sql_instant(not_before),
        sql_text(lease.0),
        sql_instant(lease.1),
        sql_instant(sent_at),
    ))
    .unwrap();
    let completed = if status == JobStatus::Succeeded {
        format!("completed_by = '{attempt}', result = '{{}}'")
    } else {
        "completed_by = NULL, result = NULL".into()
    };
    conn.batch_execute(&format!(
        "UPDATE jobs SET status = '{status}', {completed} WHERE id = '{job}'"
    ))
    .unwrap();
}

fn state_of(conn: &mut DbConnection, job: &JobId) -> AttemptState {
    attempts_in(conn, job)[0].state
}

/// `claim_batch`'s statement and `guards::may_claim`.
fn claims_agree(conn: &mut DbConnection, owner: &UserId) -> usize {
    let now = onejob::store::connection::db_clock(conn).unwrap();
    let mut cases = Vec::new();
    for state in AttemptState::ALL {
        for status in JobStatus::ALL {
            for not_before in [None, Some(now - 60_000), Some(now + 60_000)] {
                for provider in ["sim-fast", "sim-slow"] {
                    let key = format!("claim-{}", cases.len());
                    let (job, attempt) = case(conn, owner, &key);
                    shape(
                        conn,
                        &job,
                        &attempt,
                        Shape {
                            provider,
                            not_before,
                            ..Shape::new(state, status)
                        },
                    );
                    let expected =
                        guards::may_claim(state, status, provider == "sim-slow", not_before, now);
                    cases.push((
                        attempt,
                        expected,
                        format!("{state} {status} {not_before:?} {provider}"),
                    ));
                }
            }
        }
    }
    let mut admit = |_: &AttemptId, _: &str| true;
    let closed = vec!["sim-slow".to_owned()];
    let claimed: Vec<AttemptId> = queue::claim_batch(
        conn,
        ClaimRules {
            lease_owner: "w",
            lease_ms: 60_000,
            limit: 1000,
            soft_timeout_ms: &|_| 3000,
            closed: &closed,
            admit: &mut admit,
            confirm: true,
        },
    )
    .unwrap()
    .claims
    .into_iter()
    .map(|c| c.attempt.id)
    .collect();
    for (attempt, expected, what) in &cases {
        assert_eq!(claimed.contains(attempt), *expected, "claim of {what}");
    }
    assert!(cases.iter().any(|(_, expected, _)| *expected));
    cases.len()
}

/// `expire_leases` and `guards::lease_has_run_out` with
/// `guards::on_lease_expiry`.
fn expiries_agree(conn: &mut DbConnection, owner: &UserId) -> usize {
    let now = onejob::store::connection::db_clock(conn).unwrap();
    let mut cases = Vec::new();
    for state in AttemptState::ALL {
        for lease in [None, Some(now - 60_000), Some(now + 60_000)] {
            for sent_at in [None, Some(now - 1)] {
                for status in [JobStatus::Running, JobStatus::Failed] {
                    let key = format!("expire-{}", cases.len());
                    let (job, attempt) = case(conn, owner, &key);
                    shape(
                        conn,
                        &job,
                        &attempt,
                        Shape {
                            lease: (Some("w"), lease),
                            sent_at,
                            ..Shape::new(state, status)
                        },
                    );
                    let expected = guards::lease_has_run_out(state, lease, now).then(|| {
                        guards::on_lease_expiry(sent_at.is_some(), status.is_terminal()).target()
                    });
                    cases.push((job, attempt, state, expected));
                }
            }
        }
    }
    let mut expired = Vec::new();
    loop {
        let batch = queue::expire_leases(conn).unwrap();
        if batch.is_empty() {
            break;
        }
        expired.extend(batch);
    }
    for (job, attempt, state, expected) in &cases {
        let got = expired
            .iter()
            .find(|(id, _)| id == attempt)
            .map(|(_, state)| *state);
        assert_eq!(got, *expected, "expiry of {attempt} ({state})");
        if let Some(target) = expected {
            assert_eq!(state_of(conn, job), *target);
        }
    }
    assert!(cases.iter().filter(|c| c.3.is_some()).count() >= 4);
    cases.len()
}

/// `renew_lease` and `guards::may_renew`; `give_back_*` and
/// `guards::may_give_back`.
fn leases_agree(conn: &mut DbConnection, owner: &UserId) -> usize {
    let now = onejob::store::connection::db_clock(conn).unwrap();
    let mut count = 0;
    for state in AttemptState::ALL {
        for lease_owner in [Some("w"), Some("v"), None] {
            let key = format!("renew-{count}");
            count += 1;
            let (job, attempt) = case(conn, owner, &key);
            let lease = (lease_owner, Some(now + 60_000));
            let status = JobStatus::Running;
            shape(
                conn,
                &job,
                &attempt,
                Shape {
                    lease,
                    sent_at: Some(now),
                    ..Shape::new(state, status)
                },
            );
            let renewed = queue::renew_lease(conn, &attempt, owner, "w", 60_000).unwrap();
            assert_eq!(
                renewed,
                guards::may_renew(state, lease_owner, "w"),
                "renewal of {state} under {lease_owner:?}"
            );
            // A claim given back while its job finished elsewhere is closed
            // unsent, never left queued (it would block retention).
            for (sent_at, judged_by_row, job_status) in give_back_cases(now) {
                {
                    let key = format!("give-back-{count}");
                    count += 1;
                    let (job, attempt) = case(conn, owner, &key);
                    shape(
                        conn,
                        &job,
                        &attempt,
                        Shape {
                            lease,
                            sent_at,
                            ..Shape::new(state, job_status)
                        },
                    );
                    let key = onejob::store::rows::AttemptKey {
                        id: attempt.clone(),
                        owner_id: owner.clone(),
                    };
                    let permit = if judged_by_row {
                        queue::give_back_unsent(conn, &key, "w").unwrap()
                    } else {
                        queue::give_back_before_sending(conn, &key, "w").unwrap()
                    };
                    let expected = guards::may_give_back(
                        state,
                        lease_owner,
                        Some("w"),
                        sent_at.is_some(),
                        judged_by_row,
                    );
                    assert_eq!(
                        permit != SendPermit::Lost,
                        expected,
                        "give-back of {state} under {lease_owner:?}, sent {sent_at:?}, \
                         judged by the row {judged_by_row}, job {job_status}"
                    );
                    if expected && job_status.is_terminal() {
                        assert!(
                            matches!(permit, SendPermit::Withdrawn(_)),
                            "a finished job's claim is closed: {permit:?}"
                        );
                        let row = attempts_in(conn, &job).remove(0);
                        assert_eq!((row.state, row.sent_at), (AttemptState::Failed, None));
                    } else if expected {
                        assert_eq!(permit, SendPermit::Requeued);
                        let row = attempts_in(conn, &job).remove(0);
                        assert_eq!((row.state, row.sent_at), (AttemptState::Queued, None));
                    }
                }
            }
        }
    }
    count
}

/// Every give-back case: sent or not, judged by the row or by the worker,
/// the job running or finished elsewhere.
fn give_back_cases(now: Timestamp) -> Vec<(Option<Timestamp>, bool, JobStatus)> {
    let mut cases = Vec::new();
    for sent_at in [None, Some(now)] {
        for judged_by_row in [false, true] {
            for job_status in [JobStatus::Running, JobStatus::Succeeded] {
                cases.push((sent_at, judged_by_row, job_status));
            }
        }
    }
    cases
}

/// The compare-and-swap and `guards::cas_wins`; `fail_job` and
/// `guards::may_fail_job`.
fn completions_agree(conn: &mut DbConnection, owner: &UserId) -> usize {
    use onejob::store::completion::complete_success;
    use onejob::store::reads::get_job;
    use onejob::store::rows::AttemptKey;
    use onejob::store::transitions::fail_job;
    let mut count = 0;
    for bumped in [0, 1] {
        for completed in [false, true] {
            let key = format!("cas-{count}");
            count += 1;
            let (job, attempt) = case(conn, owner, &key);
            let status = if completed {
                JobStatus::Succeeded
            } else {
                JobStatus::Running
            };
            let lease = (Some("w"), Some(Timestamp::from_millis(i64::MAX / 2)));
            shape(
                conn,
                &job,
                &attempt,
                Shape {
                    lease,
                    sent_at: Some(Timestamp::from_millis(1)),
                    ..Shape::new(AttemptState::Running, status)
                },
            );
            conn.batch_execute(&format!(
                "UPDATE jobs SET version = 5 + {bumped} WHERE id = '{job}'; \
                 UPDATE attempts SET version_read = 5 WHERE id = '{attempt}'"
            ))
            .unwrap();
            let key = AttemptKey {
                id: attempt.clone(),
                owner_id: owner.clone(),
            };
            let (applied, _) = complete_success(conn, &key, &json!({"summary": "s"})).unwrap();
            assert_eq!(
                applied == onejob::domain::Applied::Won,
                guards::cas_wins(5 + bumped, completed, 5),
                "the CAS with the version {} read {bumped} behind, completed {completed}: {applied:?}",
                5
            );
        }
    }
    for status in JobStatus::ALL {
        for bumped in [0, 1] {
            let key = format!("fail-{count}");
            count += 1;
            let (job_id, attempt) = case(conn, owner, &key);
            shape(
                conn,
                &job_id,
                &attempt,
                Shape::new(AttemptState::Failed, status),
            );
            let job_key = onejob::store::rows::JobKey {
                id: job_id.clone(),
                owner_id: owner.clone(),
            };
            let read = get_job(conn, &job_key).unwrap();
            conn.batch_execute(&format!(
                "UPDATE jobs SET version = version + {bumped} WHERE id = '{job_id}'"
            ))
            .unwrap();
            let failed =
                fail_job(conn, &read, &"reason".into(), Timestamp::from_millis(1)).unwrap();
            assert_eq!(
                failed,
                guards::may_fail_job(
                    status,
                    read.version + bumped,
                    status == JobStatus::Succeeded,
                    read.version
                ),
                "fail_job of a {status} job, {bumped} versions on"
            );
        }
    }
    count
}

/// Retention's statements and `guards::may_prune`: a job in every status,
/// its window ended or not, with a live attempt or not, with an audit
/// entry about it or not; one prune; what is left is what the predicate
/// keeps.
fn prunes_agree(conn: &mut DbConnection, owner: &UserId) -> usize {
    let now = Timestamp::now();
    let cutoff = now + 60_000;
    let mut cases = Vec::new();
    for status in JobStatus::ALL {
        for window_ended in [true, false] {
            for state in [AttemptState::Queued, AttemptState::Abandoned] {
                for logged in [false, true] {
                    let key = format!("prune-{}", cases.len());
                    let (job, attempt) = case(conn, owner, &key);
                    shape(conn, &job, &attempt, Shape::new(state, status));
                    let updated_at = if window_ended {
                        now - 1_000
                    } else {
                        cutoff + 60_000
                    };
                    conn.batch_execute(&format!(
                        "UPDATE jobs SET updated_at = {} WHERE id = '{job}'",
                        updated_at.millis()
                    ))
                    .unwrap();
                    if logged {
                        conn.batch_execute(&format!(
                            "INSERT INTO audit_log (id, owner_id, actor_id, action, job_id, reason, at) \
                             VALUES ('{}', '{owner}', '{owner}', 'abandon', '{job}', 'a reason', {})",
                            uuid::Uuid::now_v7(),
                            now.millis()
                        ))
                        .unwrap();
                    }
                    let expected = guards::may_prune(status, window_ended, state.is_live(), logged);
                    cases.push((job, expected, (status, window_ended, state, logged)));
                }
            }
        }
    }
    onejob::store::retention::prune_finished_jobs(conn, cutoff, None, 10_000).unwrap();
    for (job, expected, case) in &cases {
        let left: i64 = diesel::RunQueryDsl::get_result(
            diesel::dsl::sql::<diesel::sql_types::BigInt>(&format!(
                "SELECT count(*) FROM jobs WHERE id = '{job}'"
            )),
            conn,
        )
        .unwrap();
        assert_eq!(
            left == 0,
            *expected,
            "retention and may_prune disagree on (status, window ended, attempt, logged) = {case:?}"
        );
    }
    cases.len()
}

/// The check a creation on a kept grant makes of its token
/// (`users::grant_holds`, both backends; on PostgreSQL also the `EXISTS`
/// the creating statements embed, `users::grant_holds_sql`) and
/// `guards::kept_grant_holds`, over every token and user the check reads.
fn grants_agree(conn: &mut DbConnection, owner: &UserId, other: &UserId) -> usize {
    use onejob::domain::Role;
    use onejob::store::users::{grant_holds, grant_holds_sql, GrantToCheck};
    let now = Timestamp::now();
    let expiries = [None, Some(now - 60_000), Some(now + 3_600_000)];
    let mut cases = 0;
    for present in [false, true] {
        for of_owner in [true, false] {
            for expires_at in expiries {
                for user_disabled in [false, true] {
                    for role in [Role::User, Role::Support] {
                        cases += 1;
                        let digest = format!("{cases:064x}");
                        let user = if of_owner { owner } else { other };
                        if present {
                            conn.batch_execute(&format!(
                                "INSERT INTO api_tokens (id, user_id, token_sha256, created_at, expires_at) \
                                 VALUES ('grant-{cases}', '{user}', '{digest}', 1, {})",
                                sql_instant(expires_at)
                            ))
                            .unwrap();
                        }
                        conn.batch_execute(&format!(
                            "UPDATE users SET role = '{role}', disabled_at = {} WHERE id = '{user}'",
                            if user_disabled { "1" } else { "NULL" }
                        ))
                        .unwrap();
                        let found = present.then_some(guards::TokenFound {
                            of_owner,
                            expires_at,
                            user_disabled,
                            role,
                        });
                        let expected = guards::kept_grant_holds(found, Role::User, now);
                        let grant = GrantToCheck {
                            digest: digest.clone(),
                            role: Role::User,
                        };
                        let case = (present, of_owner, expires_at, user_disabled, role);
                        assert_eq!(
                            grant_holds(conn, owner, &grant).unwrap(),
                            expected,
                            "grant_holds and kept_grant_holds disagree on \
                             (present, of owner, expires, disabled, role) = {case:?}"
                        );
                        if let DbConnection::Postgresql(pg) = conn {
                            use diesel::sql_types::{BigInt, Bool, Text};
                            #[derive(diesel::QueryableByName)]
                            struct Holds {
                                #[diesel(sql_type = Bool)]
                                holds: bool,
                            }
                            let sql = format!(
                                "SELECT {} AS holds",
                                grant_holds_sql("$1", "$2", "$3", "$4")
                            );
                            let holds: Holds = diesel::RunQueryDsl::get_result(
                                diesel::sql_query(sql)
                                    .bind::<Text, _>(owner.as_str())
                                    .bind::<Text, _>(&digest)
                                    .bind::<Text, _>(Role::User.as_str())
                                    .bind::<BigInt, _>(now),
                                pg,
                            )
                            .unwrap();
                            assert_eq!(
                                holds.holds, expected,
                                "the creating statements' EXISTS and kept_grant_holds disagree on \
                                 (present, of owner, expires, disabled, role) = {case:?}"
                            );
                        }
                        conn.batch_execute(&format!(
                            "UPDATE users SET role = 'user', disabled_at = NULL WHERE id = '{user}'"
                        ))
                        .unwrap();
                    }
                }
            }
        }
    }
    cases
}

/// The replay test of `app::intake` and `guards::is_replay`: the same
/// intent spelled another way is a replay, another intent is not.
fn replays_agree() -> usize {
    let fingerprint = |input: &str| {
        Fingerprint::of(&JobIntent {
            task: "summarize",
            input,
            params: "{}",
            provider: None,
        })
        .unwrap()
    };
    let stored = fingerprint(r#"{"text":"a","n":1}"#);
    assert!(guards::is_replay(
        stored.as_str(),
        &fingerprint(r#"{ "n" : 1.0, "text" : "a" }"#)
    ));
    assert!(!guards::is_replay(
        stored.as_str(),
        &fingerprint(r#"{"text":"b","n":1}"#)
    ));
    2
}

async fn every_guarded_statement_agrees_with_its_predicate(backend: TestBackend) {
    let prepared = PreparedApp::new(backend, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let (owner, other) = (prepared.alice.id.clone(), prepared.bob.id.clone());
    let cases = prepared
        .with_conn(move |conn| {
            grants_agree(conn, &owner, &other)
                + claims_agree(conn, &owner)
                + expiries_agree(conn, &owner)
                + leases_agree(conn, &owner)
                + completions_agree(conn, &owner)
                + prunes_agree(conn, &owner)
                + replays_agree()
        })
        .await;
    eprintln!("guard agreement: {cases} combinations, the SQL and the predicates agree");
}

on_both_backends!(every_guarded_statement_agrees_with_its_predicate);
