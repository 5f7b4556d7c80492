//! A token's check, kept (`app::credentials`, docs/design.md): on SQLite a
//! job-creating request takes its token's user from the grants the process
//! has read, and the creating transaction confirms that no token or user
//! changed since. Revocation still stops a token at once, across processes.

use diesel::prelude::*;
use onejob::store::schema::jobs;
use onejob::store::{DbConnection, StoreError};
use reqwest::StatusCode;
use serde_json::json;

use crate::support::db::new_job;
use crate::support::harness::{onejob_users, spawn_app, summarize, TestApp, TestBackend};
use crate::support::metrics::{metric_sum, metrics};

async fn kept_checks(app: &TestApp) -> f64 {
    metric_sum(&metrics(app).await, "onejob_token_checks_kept_total", &[])
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
    let kept = kept_checks(&app).await;
    match backend {
        TestBackend::Sqlite => assert!(kept >= 1.0, "alice's second creation kept its check"),
        TestBackend::Postgres => assert_eq!(kept, 0.0, "PostgreSQL reads every token"),
    }

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

on_both_backends!(a_kept_token_is_refused_at_once_when_another_process_revokes_it);

/// SQLite only: PostgreSQL keeps no grant, and nothing moves its counter.
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
