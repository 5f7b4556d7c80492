//! The database is the enforcer: these tests bypass onejob's code and write
//! raw SQL, and the constraints still refuse what the rules forbid.

use diesel::connection::SimpleConnection;
use diesel::result::{DatabaseErrorKind, Error};

use crate::helpers::{test_config, PreparedApp, TestBackend, DEFAULT_TEST_PROVIDERS};

fn insert_job(id: &str, owner: &onejob::domain::UserId, key: &str) -> String {
    format!(
        "INSERT INTO jobs (id, owner_id, idempotency_key, task, provider, input, params, fingerprint, \
         status, version, created_at, updated_at) \
         VALUES ('{id}', '{owner}', '{key}', 'summarize', 'sim-fast', '{{}}', '{{}}', '{fp}', 'pending', 0, 0, 0)",
        fp = "a".repeat(64)
    )
}

fn insert_attempt(id: &str, job: &str, number: i32, state: &str) -> String {
    format!(
        "INSERT INTO attempts (id, job_id, number, provider, state, created_at) \
         VALUES ('{id}', '{job}', {number}, 'sim-fast', '{state}', 0)"
    )
}

fn assert_unique_violation(result: Result<(), Error>, what: &str) {
    match result {
        Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => {}
        other => panic!("{what}: expected a unique violation, got {other:?}"),
    }
}

fn assert_refused(result: Result<(), Error>, what: &str) {
    assert!(
        matches!(result, Err(Error::DatabaseError(..))),
        "{what}: expected the database to refuse, got {result:?}"
    );
}

async fn raw_sql_cannot_insert_a_second_job_under_one_owners_key(backend: TestBackend) {
    let prepared = PreparedApp::new(backend, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let (alice, bob) = (prepared.alice.id.clone(), prepared.bob.id.clone());
    prepared
        .with_conn(move |conn| {
            conn.batch_execute(&insert_job("job-1", &alice, "k"))
                .unwrap();
            assert_unique_violation(
                conn.batch_execute(&insert_job("job-2", &alice, "k")),
                "same owner, same key",
            );
            // Another owner may use the same key.
            conn.batch_execute(&insert_job("job-3", &bob, "k")).unwrap();
        })
        .await;
}

async fn raw_sql_cannot_insert_a_second_live_attempt_for_one_job(backend: TestBackend) {
    let prepared = PreparedApp::new(backend, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let alice = prepared.alice.id.clone();
    prepared
        .with_conn(move |conn| {
            conn.batch_execute(&insert_job("job-1", &alice, "k"))
                .unwrap();
            conn.batch_execute(&insert_attempt("a1", "job-1", 1, "unknown"))
                .unwrap();
            for (i, live) in ["queued", "running", "unknown"].into_iter().enumerate() {
                let id = format!("a-live-{i}");
                assert_unique_violation(
                    conn.batch_execute(&insert_attempt(&id, "job-1", 10 + i as i32, live)),
                    &format!("a second live attempt ({live})"),
                );
            }
            // Finished attempts do not count as live.
            conn.batch_execute(&insert_attempt("a2", "job-1", 2, "failed"))
                .unwrap();
            conn.batch_execute(&insert_attempt("a3", "job-1", 3, "abandoned"))
                .unwrap();
            // Once the live one is over, another may start.
            conn.batch_execute("UPDATE attempts SET state = 'abandoned' WHERE id = 'a1'")
                .unwrap();
            conn.batch_execute(&insert_attempt("a4", "job-1", 4, "queued"))
                .unwrap();
            // An update that would make two live attempts is refused too.
            assert_unique_violation(
                conn.batch_execute("UPDATE attempts SET state = 'unknown' WHERE id = 'a1'"),
                "reviving a second live attempt",
            );
        })
        .await;
}

async fn raw_sql_cannot_store_an_unknown_state_or_status(backend: TestBackend) {
    let prepared = PreparedApp::new(backend, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let alice = prepared.alice.id.clone();
    prepared
        .with_conn(move |conn| {
            conn.batch_execute(&insert_job("job-1", &alice, "k"))
                .unwrap();
            assert_refused(
                conn.batch_execute(&insert_attempt("a1", "job-1", 1, "done")),
                "attempt state 'done'",
            );
            assert_refused(
                conn.batch_execute("UPDATE jobs SET status = 'finished' WHERE id = 'job-1'"),
                "job status",
            );
            assert_refused(
                conn.batch_execute("UPDATE jobs SET status = 'succeeded' WHERE id = 'job-1'"),
                "succeeded without a result and a winner",
            );
            assert_refused(
                conn.batch_execute(&insert_attempt("a2", "no-such-job", 1, "queued")),
                "foreign key",
            );
            assert_refused(
                conn.batch_execute(&insert_job("job-2", &onejob::domain::UserId::new(), "k2")),
                "owner foreign key",
            );
        })
        .await;
}

on_both_backends!(
    raw_sql_cannot_insert_a_second_job_under_one_owners_key,
    raw_sql_cannot_insert_a_second_live_attempt_for_one_job,
    raw_sql_cannot_store_an_unknown_state_or_status,
);
