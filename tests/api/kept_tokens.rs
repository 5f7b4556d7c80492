//! A token's check, kept (`app::credentials`, docs/design.md): a
//! job-creating request takes its token's user from the grants the process
//! has read, and the write that stores the job confirms it: on SQLite the
//! creating transaction finds that no token or user changed since; on
//! PostgreSQL the storing statement finds the token still good. Revocation
//! still stops a token at once, across processes.

use std::time::Duration;

use diesel::prelude::*;
use onejob::app::AppError;
use onejob::store::schema::jobs;
use onejob::store::{DbConnection, StoreError};
use reqwest::StatusCode;
use serde_json::json;

use crate::support::db::new_job;
use crate::support::harness::{
    onejob_users, spawn_app, spawn_recorded, summarize, test_config, PreparedApp, TestApp,
    TestBackend, DEFAULT_TEST_PROVIDERS,
};
use crate::support::metrics::{metric_sum, metrics};
use crate::support::statement_log::StatementLog;

async fn kept_checks(app: &TestApp) -> f64 {
    metric_sum(&metrics(app).await, "onejob_token_checks_kept_total", &[])
}

/// The reads of a token's grant among the statements `log` recorded
/// since it was last taken.
fn token_reads(log: &StatementLog) -> usize {
    log.take()
        .into_iter()
        .filter(|sql| sql.starts_with("SELECT users.id") && sql.contains("api_tokens"))
        .count()
}

/// A new token of alice's, not yet read by the app, and every one of the
/// app's `pool_size` pooled connections, held until dropped.
async fn new_token_and_every_connection(app: &TestApp, pool_size: u32) -> (String, Vec<impl Drop>) {
    let issued = onejob_users(app, &["token", "alice", "--days", "1"]).stdout;
    let token = String::from_utf8(issued).unwrap().trim().to_owned();
    let store = app.store.clone();
    let held = tokio::task::spawn_blocking(move || {
        (0..pool_size)
            .map(|_| store.conn().unwrap())
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    (token, held)
}

async fn jobs_under(app: &TestApp, key: &'static str) -> i64 {
    app.with_conn(move |conn| {
        jobs::table
            .filter(jobs::idempotency_key.eq(key))
            .count()
            .get_result(conn)
            .unwrap()
    })
    .await
}

/// A token that has created jobs (its grant kept on SQLite) is refused at
/// once, with nothing stored, when another process (the command line)
/// revokes it or disables its user: a new job, a replay of a job it made,
/// and a request today's configuration refuses all answer 401, not what
/// they would have answered. Another user's kept token goes on working
/// once read again, and an enabled user's token works again.
async fn a_kept_token_is_refused_at_once_when_another_process_revokes_it(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let alice = app.alice.token.clone();
    let post = |token: String, key: &'static str, body: serde_json::Value| {
        let app = &app;
        async move { app.post_job(&token, key, &body).await.status() }
    };
    assert_eq!(
        post(alice.clone(), "one", summarize("one")).await,
        StatusCode::CREATED
    );
    assert_eq!(
        post(alice.clone(), "two", summarize("two")).await,
        StatusCode::CREATED
    );
    assert_eq!(
        post(app.bob.token.clone(), "bob", summarize("bob")).await,
        StatusCode::CREATED
    );
    assert!(
        kept_checks(&app).await >= 1.0,
        "alice's second creation kept its check"
    );

    onejob_users(&app, &["revoke-tokens", "alice"]);
    assert_eq!(
        post(alice.clone(), "three", summarize("three")).await,
        StatusCode::UNAUTHORIZED,
        "a new job"
    );
    assert_eq!(
        post(alice.clone(), "one", summarize("one")).await,
        StatusCode::UNAUTHORIZED,
        "a replay of a job the token made"
    );
    assert_eq!(
        post(
            alice.clone(),
            "four",
            json!({"task": "no-such-task", "input": {}})
        )
        .await,
        StatusCode::UNAUTHORIZED,
        "a request today's configuration refuses"
    );
    assert_eq!(jobs_under(&app, "three").await, 0, "nothing stored");
    assert_eq!(
        post(app.bob.token.clone(), "bob-2", summarize("bob")).await,
        StatusCode::CREATED,
        "bob's token is still good"
    );

    let issued = onejob_users(&app, &["token", "alice", "--days", "1"]).stdout;
    let fresh = String::from_utf8(issued).unwrap().trim().to_owned();
    assert_eq!(
        post(fresh.clone(), "five", summarize("five")).await,
        StatusCode::CREATED
    );
    assert_eq!(
        post(fresh.clone(), "six", summarize("six")).await,
        StatusCode::CREATED
    );
    onejob_users(&app, &["disable", "alice"]);
    assert_eq!(
        post(fresh.clone(), "seven", summarize("seven")).await,
        StatusCode::UNAUTHORIZED,
        "a disabled user's token"
    );
    assert_eq!(jobs_under(&app, "seven").await, 0, "nothing stored");
    onejob_users(&app, &["enable", "alice"]);
    assert_eq!(
        post(fresh, "seven", summarize("seven")).await,
        StatusCode::CREATED
    );
}

/// The counter the creating transaction reads moves with every change to
/// what a token grants, made in SQL by hand (the triggers move it, not
/// onejob's code), and with nothing else.
async fn the_credential_counter_moves_with_every_change_to_what_a_token_grants(
    backend: TestBackend,
) {
    let app = spawn_app(backend).await;
    let alice = app.alice.id.clone();
    let moves = app
        .with_conn(move |conn| {
            let counter = |conn: &mut DbConnection| {
                onejob::store::users::credential_counter(conn)
                    .unwrap()
                    .expect("SQLite keeps the counter")
            };
            let moved = |conn: &mut DbConnection, change: &str| {
                let before = counter(conn);
                diesel::connection::SimpleConnection::batch_execute(conn, change).unwrap();
                (change.to_owned(), counter(conn) - before)
            };
            let alice = alice.as_str();
            vec![
                moved(
                    conn,
                    &format!("UPDATE users SET last_sign_in_at = 1 WHERE id = '{alice}'"),
                ),
                moved(
                    conn,
                    &format!("UPDATE users SET password_hash = 'x' WHERE id = '{alice}'"),
                ),
                moved(
                    conn,
                    &format!(
                        "INSERT INTO api_tokens (id, user_id, token_sha256, created_at) \
                         VALUES ('t-new', '{alice}', '{}', 1)",
                        "0".repeat(64)
                    ),
                ),
                moved(
                    conn,
                    "UPDATE api_tokens SET expires_at = 1 WHERE id = 't-new'",
                ),
                moved(conn, "DELETE FROM api_tokens WHERE id = 't-new'"),
                moved(
                    conn,
                    &format!("UPDATE users SET disabled_at = 1 WHERE id = '{alice}'"),
                ),
                moved(
                    conn,
                    &format!("UPDATE users SET disabled_at = NULL WHERE id = '{alice}'"),
                ),
                moved(
                    conn,
                    &format!("UPDATE users SET role = 'support' WHERE id = '{alice}'"),
                ),
            ]
        })
        .await;
    let expected = [0, 0, 0, 1, 1, 1, 1, 1];
    for ((change, moved), expected) in moves.iter().zip(expected) {
        assert_eq!(*moved, expected, "{change}");
    }
}

/// A creation whose token check was kept at an older counter is refused
/// by the transaction that would store it, storing nothing, while one
/// sent at the same moment, kept at the current counter, is stored.
async fn a_creation_kept_at_an_old_counter_stores_nothing_and_the_current_one_is_stored(
    backend: TestBackend,
) {
    let app = spawn_app(backend).await;
    let now = app
        .with_conn(|conn| onejob::store::users::credential_counter(conn).unwrap())
        .await
        .expect("SQLite keeps the counter");
    let owner = app.alice.id.clone();
    let (stale, current) = tokio::join!(
        app.store
            .create_job(new_job(&owner, "kept-stale"), Some(now - 1), None),
        app.store
            .create_job(new_job(&owner, "kept-current"), Some(now), None),
    );
    assert!(
        matches!(stale, Err(StoreError::CredentialsChanged)),
        "{stale:?}"
    );
    assert!(current.is_ok(), "{current:?}");
    assert_eq!(jobs_under(&app, "kept-stale").await, 0);
    assert_eq!(jobs_under(&app, "kept-current").await, 1);
}

/// Checks of one token at once share one read (`app::credentials`,
/// `GrantReads`), as the twins of a storm under one key confirm their
/// token: with every connection of the pool taken, sixteen checks of a
/// token this process has not read yet wait on one read, and once the
/// connections are free, one statement reads the token for all sixteen,
/// each given its user. A read that failed to share would show as more
/// statements; one begun before a check asked would leave that check to
/// a read of its own.
async fn checks_of_one_token_at_once_share_one_read(backend: TestBackend) {
    let log = StatementLog::new();
    let app = spawn_recorded(backend, &log).await;
    let pool_size = test_config(DEFAULT_TEST_PROVIDERS).database.pool_size;
    let (token, held) = new_token_and_every_connection(&app, pool_size).await;
    log.take();
    let checks: Vec<_> = (0..16)
        .map(|_| {
            let (app, token) = (app.app.clone(), token.clone());
            tokio::spawn(async move { app.user_for_creating_token(&token).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        checks.iter().all(|check| !check.is_finished()),
        "no check is answered while every connection is taken"
    );
    drop(held);
    for check in checks {
        let (user, _) = check.await.unwrap().unwrap().expect("alice's token");
        assert_eq!(user.id, app.alice.id);
    }
    assert_eq!(token_reads(&log), 1, "sixteen checks, one read");
}

/// A shared read that found no connection free (every one held past the
/// pool's wait) answers every check that joined it with the same
/// retryable refusal: none of them reads again alone, even once
/// connections are free again.
async fn a_shared_read_the_database_was_too_busy_for_refuses_every_check_that_joined_it(
    backend: TestBackend,
) {
    let log = StatementLog::new();
    let mut config = test_config(DEFAULT_TEST_PROVIDERS);
    config.database.pool_timeout_ms = 400;
    let pool_size = config.database.pool_size;
    let app = PreparedApp::new(backend, config)
        .await
        .recording(&log)
        .await
        .start()
        .await;
    let (token, held) = new_token_and_every_connection(&app, pool_size).await;
    log.take();
    let mut checks = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let (app, token) = (app.app.clone(), token.clone());
        checks.spawn(async move { app.user_for_creating_token(&token).await });
    }
    let first = checks.join_next().await.unwrap().unwrap();
    assert!(
        matches!(first, Err(AppError::Unavailable(_))),
        "the read found no connection: {first:?}"
    );
    drop(held);
    while let Some(check) = checks.join_next().await {
        let check = check.unwrap();
        assert!(
            matches!(check, Err(AppError::Unavailable(_))),
            "a check that joined the busy read is refused as it was: {check:?}"
        );
    }
    assert_eq!(token_reads(&log), 0, "no check read again alone");
}

on_both_backends!(
    a_kept_token_is_refused_at_once_when_another_process_revokes_it,
    checks_of_one_token_at_once_share_one_read,
    a_shared_read_the_database_was_too_busy_for_refuses_every_check_that_joined_it,
);

/// SQLite only: nothing moves a counter on PostgreSQL.
mod sqlite_only {
    use crate::support::harness::TestBackend;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_credential_counter_moves_with_every_change_to_what_a_token_grants() {
        super::the_credential_counter_moves_with_every_change_to_what_a_token_grants(
            TestBackend::Sqlite,
        )
        .await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_creation_kept_at_an_old_counter_stores_nothing_and_the_current_one_is_stored() {
        super::a_creation_kept_at_an_old_counter_stores_nothing_and_the_current_one_is_stored(
            TestBackend::Sqlite,
        )
        .await
    }
}

/// PostgreSQL: the storing statement checks a kept grant itself.
mod postgres_only {
    use std::sync::Arc;

    use diesel::connection::SimpleConnection;
    use onejob::domain::Role;
    use onejob::domain::UserId;
    use onejob::store::connection::Placement;
    use onejob::store::jobs::{self, CreateOutcome};
    use onejob::store::rows::Attempt;
    use onejob::store::users::{token_digest, GrantToCheck};
    use onejob::store::{DbConnection, StoreError, StoreResult};
    use reqwest::StatusCode;

    use super::{jobs_under, token_reads};
    use crate::support::db::new_job;
    use crate::support::harness::{
        postgres_available, spawn_app, spawn_recorded, summarize, TestBackend,
    };
    use crate::support::statement_log::StatementLog;

    /// A creation kept on a grant is stored, alone and in a batch's
    /// multi-row statement, only where the token still grants its owner
    /// what it did: revoked or changed by hand in SQL (bypassing onejob),
    /// the statement stores nothing and the creation answers
    /// `CredentialsChanged`, while a good grant beside it is stored.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_storing_statement_stores_nothing_once_a_kept_grant_no_longer_holds() {
        if !postgres_available() {
            return;
        }
        let app = spawn_app(TestBackend::Postgres).await;
        let (alice, bob) = (app.alice.id.clone(), app.bob.id.clone());
        let alice_grant = GrantToCheck {
            digest: token_digest(&app.alice.token),
            role: Role::User,
        };
        let bob_grant = GrantToCheck {
            digest: token_digest(&app.bob.token),
            role: Role::User,
        };
        let verdicts = app
            .with_conn(move |conn| {
                let mut verdicts = vec![alone(conn, &kept(&alice, "good", &alice_grant))];
                // Another role, by hand: the grant no longer holds.
                conn.batch_execute(&format!(
                    "UPDATE users SET role = 'support' WHERE id = '{alice}'"
                ))
                .unwrap();
                verdicts.push(alone(conn, &kept(&alice, "other-role", &alice_grant)));
                conn.batch_execute(&format!(
                    "UPDATE users SET role = 'user' WHERE id = '{alice}'"
                ))
                .unwrap();
                verdicts.push(alone(conn, &kept(&alice, "role-back", &alice_grant)));
                // Revoked by hand: alone, and in one multi-row statement
                // with bob's good grant.
                conn.batch_execute(&format!(
                    "DELETE FROM api_tokens WHERE token_sha256 = '{}'",
                    alice_grant.digest
                ))
                .unwrap();
                verdicts.push(alone(conn, &kept(&alice, "revoked", &alice_grant)));
                let (stale, good) = (
                    kept(&bob, "bob-stale", &alice_grant),
                    kept(&bob, "bob-good", &bob_grant),
                );
                let stale_other = kept(&bob, "bob-stale-2", &alice_grant);
                for outcome in jobs::create_many_of_one_owner(
                    conn,
                    &bob,
                    &[&stale, &good, &stale_other],
                    Placement::OneDatabase,
                ) {
                    verdicts.push(verdict(outcome));
                }
                verdicts
            })
            .await;
        assert_eq!(
            verdicts,
            ["created", "refused", "created", "refused", "refused", "created", "refused"]
        );
        for (key, stored) in [
            ("good", 1),
            ("other-role", 0),
            ("role-back", 1),
            ("revoked", 0),
            ("bob-stale", 0),
            ("bob-good", 1),
            ("bob-stale-2", 0),
        ] {
            assert_eq!(jobs_under(&app, key).await, stored, "{key}");
        }
    }

    fn kept(owner: &UserId, key: &str, grant: &GrantToCheck) -> jobs::NewJob {
        jobs::NewJob {
            kept_grant: Some(grant.clone()),
            ..new_job(owner, key)
        }
    }

    fn alone(conn: &mut DbConnection, new: &jobs::NewJob) -> &'static str {
        verdict(jobs::create_job_placed(conn, new, Placement::OneDatabase))
    }

    fn verdict(outcome: StoreResult<(CreateOutcome, Vec<Attempt>)>) -> &'static str {
        match outcome {
            Ok((CreateOutcome::Created(_), _)) => "created",
            Ok((CreateOutcome::Existing(_), _)) => "existing",
            Err(StoreError::CredentialsChanged) => "refused",
            Err(other) => panic!("{other:?}"),
        }
    }

    /// A creation on a kept grant is one statement: no read of the token
    /// before it. A replay on the same kept grant reads the token again
    /// (the job it found was read without the check), and a revoked token
    /// gets 401 for both.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_kept_creation_is_one_statement_and_a_replay_reads_the_token_again() {
        if !postgres_available() {
            return;
        }
        let log = StatementLog::new();
        let app = Arc::new(spawn_recorded(TestBackend::Postgres, &log).await);
        let token = app.alice.token.clone();
        let post = |key: &'static str| {
            let (app, token) = (app.clone(), token.clone());
            async move { app.post_job(&token, key, &summarize(key)).await.status() }
        };
        assert_eq!(post("first").await, StatusCode::CREATED);
        log.take();
        assert_eq!(post("kept").await, StatusCode::CREATED);
        let of_request: Vec<String> = log
            .take()
            .into_iter()
            .filter(|sql| sql.contains("api_tokens") || sql.contains("\"kept\""))
            .collect();
        assert_eq!(of_request.len(), 1, "{of_request:#?}");
        assert!(
            of_request[0].starts_with("WITH job AS") && of_request[0].contains("api_tokens"),
            "{of_request:#?}"
        );

        assert_eq!(post("kept").await, StatusCode::OK);
        assert_eq!(token_reads(&log), 1, "a replay reads the token again");

        let digest = token_digest(&token);
        app.with_conn(move |conn| {
            conn.batch_execute(&format!(
                "DELETE FROM api_tokens WHERE token_sha256 = '{digest}'"
            ))
            .unwrap()
        })
        .await;
        assert_eq!(post("kept").await, StatusCode::UNAUTHORIZED, "a replay");
        assert_eq!(post("after").await, StatusCode::UNAUTHORIZED, "a new job");
        assert_eq!(jobs_under(&app, "after").await, 0, "nothing stored");
    }
}
