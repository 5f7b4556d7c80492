//! The database is the enforcer: these tests bypass onejob's code and write
//! raw SQL, and the constraints still refuse what the rules forbid.

use diesel::connection::SimpleConnection;
use diesel::result::{DatabaseErrorKind, Error};
use onejob::domain::Timestamp;
use onejob::store::DbConnection;

use crate::support::harness::{test_config, PreparedApp, TestBackend, DEFAULT_TEST_PROVIDERS};

/// Any instant: the statements under test judge states, not times.
const TICK: Timestamp = Timestamp::from_millis(1);

fn insert_job(id: &str, owner: &onejob::domain::UserId, key: &str) -> String {
    format!(
        "INSERT INTO jobs (id, owner_id, idempotency_key, task, provider, input, params, fingerprint, \
         status, version, created_at, updated_at) \
         VALUES ('{id}', '{owner}', '{key}', 'summarize', 'sim-fast', '{{}}', '{{}}', '{fp}', 'pending', 0, 0, 0)",
        fp = "a".repeat(64)
    )
}

fn insert_attempt(
    id: &str,
    job: &str,
    owner: &onejob::domain::UserId,
    number: i32,
    state: &str,
) -> String {
    format!(
        "INSERT INTO attempts (id, job_id, owner_id, number, provider, state, created_at) \
         VALUES ('{id}', '{job}', '{owner}', {number}, 'sim-fast', '{state}', 0)"
    )
}

/// Which constraint must refuse a statement: its kind, its name as
/// PostgreSQL reports it, and what SQLite's message names.
struct Refusal {
    kind: DatabaseErrorKind,
    postgres_constraint: &'static str,
    sqlite_message: &'static str,
}

const SECOND_JOB_UNDER_ONE_KEY: Refusal = Refusal {
    kind: DatabaseErrorKind::UniqueViolation,
    postgres_constraint: "jobs_owner_key_unique",
    sqlite_message: "UNIQUE constraint failed: jobs.owner_id, jobs.idempotency_key",
};
const SECOND_LIVE_ATTEMPT: Refusal = Refusal {
    kind: DatabaseErrorKind::UniqueViolation,
    postgres_constraint: "attempts_one_live_per_job",
    sqlite_message: "UNIQUE constraint failed: attempts.job_id, attempts.owner_id",
};
const UNKNOWN_ATTEMPT_STATE: Refusal = Refusal {
    kind: DatabaseErrorKind::CheckViolation,
    postgres_constraint: "attempts_state_check",
    sqlite_message: "CHECK constraint failed: state = 'queued' OR",
};
const UNKNOWN_JOB_STATUS: Refusal = Refusal {
    kind: DatabaseErrorKind::CheckViolation,
    postgres_constraint: "jobs_status_check",
    sqlite_message: "CHECK constraint failed: status = 'pending' OR",
};
const SUCCEEDED_WITHOUT_WINNER: Refusal = Refusal {
    kind: DatabaseErrorKind::CheckViolation,
    postgres_constraint: "jobs_check",
    sqlite_message: "CHECK constraint failed: (status = 'succeeded') = (completed_by IS NOT NULL AND result IS NOT NULL)",
};
const ATTEMPT_WITHOUT_JOB: Refusal = Refusal {
    kind: DatabaseErrorKind::ForeignKeyViolation,
    postgres_constraint: "attempts_job_id_fkey",
    sqlite_message: "FOREIGN KEY constraint failed",
};
const RACE_WITHOUT_JOB: Refusal = Refusal {
    kind: DatabaseErrorKind::ForeignKeyViolation,
    postgres_constraint: "race_log_job_id_fkey",
    sqlite_message: "FOREIGN KEY constraint failed",
};
const AUDIT_WITHOUT_JOB: Refusal = Refusal {
    kind: DatabaseErrorKind::ForeignKeyViolation,
    postgres_constraint: "audit_log_job_id_fkey",
    sqlite_message: "FOREIGN KEY constraint failed",
};
const JOB_WITHOUT_OWNER: Refusal = Refusal {
    kind: DatabaseErrorKind::ForeignKeyViolation,
    postgres_constraint: "jobs_owner_id_fkey",
    sqlite_message: "FOREIGN KEY constraint failed",
};

/// Runs `sql` and asserts that exactly the named constraint refused it.
fn assert_refused(conn: &mut DbConnection, sql: &str, refusal: &Refusal) {
    match conn.batch_execute(sql) {
        Err(Error::DatabaseError(kind, info)) => {
            assert_eq!(
                std::mem::discriminant(&kind),
                std::mem::discriminant(&refusal.kind),
                "{sql}: refused, but as {kind:?}: {}",
                info.message()
            );
            match conn {
                DbConnection::Postgresql(_) => assert_eq!(
                    info.constraint_name(),
                    Some(refusal.postgres_constraint),
                    "{sql}: {}",
                    info.message()
                ),
                DbConnection::Sqlite(_) => assert!(
                    info.message().contains(refusal.sqlite_message),
                    "{sql}: {}",
                    info.message()
                ),
            }
        }
        other => panic!("{sql}: expected the database to refuse it, got {other:?}"),
    }
}

async fn raw_sql_cannot_insert_a_second_job_under_one_owners_key(backend: TestBackend) {
    let prepared = PreparedApp::new(backend, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let (alice, bob) = (prepared.alice.id.clone(), prepared.bob.id.clone());
    prepared
        .with_conn(move |conn| {
            conn.batch_execute(&insert_job("job-1", &alice, "k"))
                .unwrap();
            assert_refused(
                conn,
                &insert_job("job-2", &alice, "k"),
                &SECOND_JOB_UNDER_ONE_KEY,
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
            conn.batch_execute(&insert_attempt("a1", "job-1", &alice, 1, "unknown"))
                .unwrap();
            for (i, live) in ["queued", "running", "unknown"].into_iter().enumerate() {
                let id = format!("a-live-{i}");
                assert_refused(
                    conn,
                    &insert_attempt(&id, "job-1", &alice, 10 + i as i32, live),
                    &SECOND_LIVE_ATTEMPT,
                );
            }
            // Finished attempts do not count as live.
            conn.batch_execute(&insert_attempt("a2", "job-1", &alice, 2, "failed"))
                .unwrap();
            conn.batch_execute(&insert_attempt("a3", "job-1", &alice, 3, "abandoned"))
                .unwrap();
            // Once the live one is over, another may start.
            conn.batch_execute("UPDATE attempts SET state = 'abandoned' WHERE id = 'a1'")
                .unwrap();
            conn.batch_execute(&insert_attempt("a4", "job-1", &alice, 4, "queued"))
                .unwrap();
            // An update that would make two live attempts is refused too.
            assert_refused(
                conn,
                "UPDATE attempts SET state = 'unknown' WHERE id = 'a1'",
                &SECOND_LIVE_ATTEMPT,
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
                conn,
                &insert_attempt("a1", "job-1", &alice, 1, "done"),
                &UNKNOWN_ATTEMPT_STATE,
            );
            assert_refused(
                conn,
                "UPDATE jobs SET status = 'finished' WHERE id = 'job-1'",
                &UNKNOWN_JOB_STATUS,
            );
            assert_refused(
                conn,
                "UPDATE jobs SET status = 'succeeded' WHERE id = 'job-1'",
                &SUCCEEDED_WITHOUT_WINNER,
            );
            assert_refused(
                conn,
                &insert_attempt("a2", "no-such-job", &alice, 1, "queued"),
                &ATTEMPT_WITHOUT_JOB,
            );
            assert_refused(
                conn,
                &insert_job("job-2", &onejob::domain::UserId::new(), "k2"),
                &JOB_WITHOUT_OWNER,
            );
        })
        .await;
}

/// A job's attempts, race-log rows and audit entries carry the job's owner
/// (docs/scaling.md): the foreign keys match on (id, owner), so a row filed
/// under another owner than its job's is refused.
async fn raw_sql_cannot_file_a_jobs_rows_under_another_owner(backend: TestBackend) {
    let prepared = PreparedApp::new(backend, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let (alice, bob, sue) = (
        prepared.alice.id.clone(),
        prepared.bob.id.clone(),
        prepared.sue.id.clone(),
    );
    prepared
        .with_conn(move |conn| {
            conn.batch_execute(&insert_job("job-1", &alice, "k"))
                .unwrap();
            assert_refused(
                conn,
                &insert_attempt("a-bob", "job-1", &bob, 1, "queued"),
                &ATTEMPT_WITHOUT_JOB,
            );
            conn.batch_execute(&insert_attempt("a1", "job-1", &alice, 1, "succeeded"))
                .unwrap();
            conn.batch_execute(&insert_job("job-2", &bob, "k")).unwrap();
            conn.batch_execute(&insert_attempt("b1", "job-2", &bob, 1, "succeeded"))
                .unwrap();
            // Bob's attempt, logged as losing a race on Alice's job.
            let race = |owner: &onejob::domain::UserId, loser: &str| {
                format!(
                    "INSERT INTO race_log (id, job_id, owner_id, losing_attempt_id, reason, \
                     version_read, version_found, provider, payload_sha256, lost_at) \
                     VALUES ('r-{loser}', 'job-1', '{owner}', '{loser}', 'late', 0, 1, 'sim-fast', '{}', 0)",
                    "b".repeat(64)
                )
            };
            assert_refused(conn, &race(&bob, "b1"), &RACE_WITHOUT_JOB);
            conn.batch_execute(&race(&alice, "a1")).unwrap();
            let audit = |owner: &onejob::domain::UserId| {
                format!(
                    "INSERT INTO audit_log (id, actor_id, owner_id, action, job_id, reason, at) \
                     VALUES ('e-{owner}', '{sue}', '{owner}', 'fail_job', 'job-1', 'why', 0)"
                )
            };
            assert_refused(conn, &audit(&bob), &AUDIT_WITHOUT_JOB);
            conn.batch_execute(&audit(&alice)).unwrap();
        })
        .await;
}

/// Item: every state change goes through `domain::state`. For every event
/// and every state an attempt can be in, the store's guarded transition
/// moves the row exactly when the state machine allows the event from that
/// state, to the state it names; giving back or closing a claim as unsent
/// never touches an attempt that was sent.
async fn every_transition_takes_its_starting_states_from_the_state_machine(backend: TestBackend) {
    use diesel::prelude::*;
    use onejob::domain::{AttemptEvent as E, AttemptId, AttemptState};
    use onejob::store::schema::attempts;
    use onejob::store::transitions::{self, Guard};
    let prepared = PreparedApp::new(backend, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let owner = prepared.alice.id.clone();
    prepared
        .with_conn(move |conn| {
            conn.batch_execute(&insert_job("j-states", &owner, "k-states"))
                .unwrap();
            conn.batch_execute(&insert_attempt("a-states", "j-states", &owner, 1, "queued"))
                .unwrap();
            let id = AttemptId::from_stored("a-states".to_owned());
            let set = |conn: &mut DbConnection, state: AttemptState, sent: Option<i64>| {
                diesel::update(attempts::table.find(&id))
                    .set((
                        attempts::state.eq(state),
                        attempts::sent_at.eq(sent),
                        attempts::lease_owner.eq(Some("me")),
                    ))
                    .execute(conn)
                    .unwrap();
                onejob::store::reads::get_attempt(conn, &id).unwrap()
            };
            let events = [
                E::Claimed,
                E::Skipped,
                E::ProviderSucceeded,
                E::ProviderFailed,
                E::SoftTimeout,
                E::LeaseExpired,
                E::Abandoned,
                E::GivenBack,
                E::ClosedUnsent,
                E::Superseded,
            ];
            for event in events {
                for state in AttemptState::ALL {
                    let attempt = set(conn, state, None);
                    let moved = transitions::transition(conn, &attempt, event, TICK, None).unwrap();
                    let allowed = event.apply(state);
                    assert_eq!(moved, allowed.is_ok(), "{event:?} from {state}");
                    let now = onejob::store::reads::get_attempt(conn, &id).unwrap();
                    assert_eq!(
                        now.state,
                        allowed.unwrap_or(state),
                        "{event:?} from {state}"
                    );
                    if event == E::GivenBack && moved {
                        assert_eq!((now.sent_at, now.lease_expires_at), (None, None));
                    }
                }
                if matches!(event, E::GivenBack | E::ClosedUnsent) {
                    let sent = set(conn, AttemptState::Running, Some(1));
                    let unsent_only = Guard {
                        lease_owner: Some("me"),
                        never_sent: true,
                    };
                    assert!(
                        !transitions::transition_guarded(
                            conn,
                            &sent,
                            event,
                            TICK,
                            None,
                            unsent_only
                        )
                        .unwrap(),
                        "{event:?} of a sent attempt"
                    );
                    let someone_else = Guard {
                        lease_owner: Some("someone else"),
                        never_sent: false,
                    };
                    assert!(
                        !transitions::transition_guarded(
                            conn,
                            &sent,
                            event,
                            TICK,
                            None,
                            someone_else
                        )
                        .unwrap(),
                        "{event:?} under another lease"
                    );
                }
            }
        })
        .await;
}

on_both_backends!(
    every_transition_takes_its_starting_states_from_the_state_machine,
    raw_sql_cannot_file_a_jobs_rows_under_another_owner,
    raw_sql_cannot_insert_a_second_job_under_one_owners_key,
    raw_sql_cannot_insert_a_second_live_attempt_for_one_job,
    raw_sql_cannot_store_an_unknown_state_or_status,
);

/// SQLite checks a list of more than two values (`state IN ('a', 'b', 'c')`)
/// by building a table of the values for every statement that checks it:
/// the constraints and the partial index on the tables a job writes spell
/// their lists out (`state = 'a' OR …`), so no statement that writes them
/// opens such a table. The statements write each constrained column.
#[tokio::test]
async fn sqlite_checks_the_job_tables_constraints_without_a_table_per_statement() {
    #[derive(diesel::QueryableByName)]
    struct Step {
        #[diesel(sql_type = diesel::sql_types::Text)]
        opcode: String,
    }
    let statements = [
        insert_job("j", &onejob::domain::UserId::new(), "k"),
        "UPDATE jobs SET status = 'failed' WHERE id = 'j'".to_owned(),
        insert_attempt("a", "j", &onejob::domain::UserId::new(), 1, "running"),
        "UPDATE attempts SET state = 'succeeded', outcome = 'won' WHERE id = 'a'".to_owned(),
        "INSERT INTO usage_ledger (attempt_id, owner_id, job_id, task, provider, model, kind, \
         late, prompt_tokens, completion_tokens, cached_tokens, usage_source, recorded_at) \
         VALUES ('a', 'o', 'j', 't', 'p', 'm', 'won', 0, 1, 1, 0, 'reported', 0)"
            .to_owned(),
        "INSERT INTO usage_tallies (owner_id, day, task, provider, job_id, kind, count) \
         VALUES ('o', 0, 't', 'p', 'j', 'joined', 1)"
            .to_owned(),
        "INSERT INTO webhook_events (id, owner_id, endpoint_id, job_id, kind, subject, \
         webhook_id, body, next_attempt_at, window_start_at, created_at) \
         VALUES ('e', 'o', 'w', 'j', 'job.failed', 's', 'msg_1', '{}', 0, 0, 0)"
            .to_owned(),
        "UPDATE webhook_events SET state = 'dead' WHERE id = 'e'".to_owned(),
        "INSERT INTO webhook_deliveries (id, owner_id, event_id, endpoint_id, number, outcome, \
         latency_ms, at) VALUES ('d', 'o', 'e', 'w', 1, 'failed', 0, 0)"
            .to_owned(),
    ];
    let prepared = PreparedApp::new(TestBackend::Sqlite, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let built: Vec<(String, usize)> = prepared
        .with_conn(move |conn| {
            let DbConnection::Sqlite(sqlite) = conn else {
                unreachable!("a SQLite test database")
            };
            statements
                .into_iter()
                .map(|statement| {
                    let steps: Vec<Step> = diesel::RunQueryDsl::load(
                        diesel::sql_query(format!("EXPLAIN {statement}")),
                        sqlite,
                    )
                    .unwrap();
                    assert!(!steps.is_empty(), "{statement}: no program");
                    let tables = steps.iter().filter(|s| s.opcode == "OpenEphemeral").count();
                    (statement, tables)
                })
                .collect()
        })
        .await;
    for (statement, tables) in built {
        assert_eq!(
            tables, 0,
            "{statement}: builds {tables} table(s) of a list's values"
        );
    }
}
