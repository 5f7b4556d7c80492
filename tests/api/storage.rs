//! Storage traps measured when this stack was first tried: SQLite pragmas,
//! PostgreSQL's own error text, HEAD on GET routes.

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use onejob::config::Config;
use onejob::store::{DatabaseUrl, DbConnection, Store};
use reqwest::StatusCode;

use crate::support::harness::{
    spawn_app, test_config, PreparedApp, TestBackend, DEFAULT_TEST_PROVIDERS,
};

#[derive(QueryableByName)]
struct Number {
    #[diesel(sql_type = BigInt)]
    value: i64,
}

#[derive(QueryableByName)]
struct Word {
    #[diesel(sql_type = Text)]
    value: String,
}

fn pragma_number(conn: &mut DbConnection, pragma: &str) -> i64 {
    // The busy_timeout pragma's result column is called `timeout`.
    let column = if pragma == "busy_timeout" {
        "timeout"
    } else {
        pragma
    };
    diesel::sql_query(format!("SELECT {column} AS value FROM pragma_{pragma}()"))
        .get_result::<Number>(conn)
        .unwrap()
        .value
}

#[tokio::test]
async fn every_pooled_sqlite_connection_uses_wal_full_sync_foreign_keys_and_a_busy_timeout() {
    let prepared = PreparedApp::new(TestBackend::Sqlite, test_config(DEFAULT_TEST_PROVIDERS)).await;
    let store = prepared.store.clone();
    tokio::task::spawn_blocking(move || {
        // Check several pooled connections, not just the first.
        let mut held = Vec::new();
        for _ in 0..3 {
            let mut conn = store.conn().unwrap();
            let mode = diesel::sql_query("SELECT journal_mode AS value FROM pragma_journal_mode()")
                .get_result::<Word>(&mut *conn)
                .unwrap()
                .value;
            assert_eq!(mode, "wal");
            assert_eq!(
                pragma_number(&mut conn, "synchronous"),
                2,
                "synchronous=FULL"
            );
            assert_eq!(pragma_number(&mut conn, "foreign_keys"), 1);
            assert_eq!(pragma_number(&mut conn, "busy_timeout"), 5000);
            held.push(conn);
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn sqlite_synchronous_normal_is_an_explicit_opt_in() {
    let dir = tempfile::tempdir().unwrap();
    let url = DatabaseUrl::parse(dir.path().join("normal.db").to_str().unwrap()).unwrap();
    let mut config: Config = test_config(DEFAULT_TEST_PROVIDERS);
    config.database.sqlite_synchronous = onejob::store::SqliteSynchronous::Normal;
    let store = Store::connect(&url, &config.database).unwrap();
    let synchronous = tokio::task::spawn_blocking(move || {
        pragma_number(&mut store.conn().unwrap(), "synchronous")
    })
    .await
    .unwrap();
    assert_eq!(synchronous, 1, "synchronous=NORMAL");
}

#[tokio::test]
async fn an_unreachable_postgres_is_reported_with_the_drivers_own_message() {
    let url = DatabaseUrl::parse("postgres://postgres@127.0.0.1:1/onejob").unwrap();
    let config = test_config(DEFAULT_TEST_PROVIDERS);
    let error = match Store::connect(&url, &config.database) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("connected to a closed port"),
    };
    assert!(
        error.contains("127.0.0.1:1") || error.contains("port 1"),
        "{error}"
    );
    assert!(
        error.to_lowercase().contains("refused"),
        "the libpq reason is kept: {error}"
    );
    assert!(
        !error.contains("Invalid connection url for multiconnection"),
        "{error}"
    );
}

async fn get_routes_also_answer_head(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let response = app.client.head(app.url("/healthz")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let response = app
        .client
        .head(app.url("/api/v1/jobs"))
        .bearer_auth(&app.alice.token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        response.text().await.unwrap().is_empty(),
        "HEAD has no body"
    );
}

/// Item: a 2xx means the job is on disk, whatever the server's settings.
/// SQLite sessions run `synchronous=FULL`; PostgreSQL sessions pin
/// `synchronous_commit = on` even when the database (or a role) defaults
/// to `off`, which would lose acknowledged jobs on a crash.
async fn every_session_commits_durably_whatever_the_database_default(backend: TestBackend) {
    let prepared = PreparedApp::new(backend, test_config(DEFAULT_TEST_PROVIDERS)).await;
    match backend {
        TestBackend::Sqlite => {
            let synchronous = prepared
                .with_conn(|conn| pragma_number(conn, "synchronous"))
                .await;
            assert_eq!(synchronous, 2, "synchronous=FULL");
        }
        TestBackend::Postgres => {
            let name = prepared.db.postgres_name().unwrap().to_owned();
            let url = prepared.db.url.clone();
            tokio::task::spawn_blocking(move || {
                use diesel::connection::SimpleConnection;
                let show = |conn: &mut PgConnection| {
                    diesel::sql_query("SELECT current_setting('synchronous_commit') AS value")
                        .get_result::<Word>(conn)
                        .unwrap()
                        .value
                };
                let mut plain = PgConnection::establish(url.as_str()).unwrap();
                plain
                    .batch_execute(&format!(
                        "ALTER DATABASE {name} SET synchronous_commit = off"
                    ))
                    .unwrap();
                // A session without onejob's settings now gets `off`…
                let mut fresh = PgConnection::establish(url.as_str()).unwrap();
                assert_eq!(show(&mut fresh), "off", "the database's default took");
                // …and every session of onejob's pool `on`.
                let store =
                    Store::connect(&url, &test_config(DEFAULT_TEST_PROVIDERS).database).unwrap();
                let mut held = Vec::new();
                for _ in 0..3 {
                    let mut conn = store.conn().unwrap();
                    let DbConnection::Postgresql(pg) = &mut *conn else {
                        panic!("a PostgreSQL store");
                    };
                    assert_eq!(show(pg), "on");
                    held.push(conn);
                }
            })
            .await
            .unwrap();
        }
    }
}

on_both_backends!(
    get_routes_also_answer_head,
    every_session_commits_durably_whatever_the_database_default,
);

/// PostgreSQL ends every session of a store's pool (a restart or a
/// failover does that): the call that finds its connection dead fails, as
/// `ConnectionLost` (answered `503`), and every later one is served,
/// however many dead connections the pool held: for a while after a break
/// each checkout is tried first, and a dead connection swapped for a fresh
/// one. Without that, each pooled connection fails one call.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pool_whose_sessions_all_died_fails_one_call_not_one_per_connection() {
    if !crate::support::harness::postgres_available() {
        return;
    }
    let (db, store) = postgres_store_of_pool(6).await;
    let url = db.url.as_str().to_owned();
    let (pool_store, ended) = tokio::task::spawn_blocking(move || {
        // Every connection of the pool opened, then back in it, idle.
        let held: Vec<_> = (0..6).map(|_| pool_store_conn(&store)).collect();
        drop(held);
        let mut admin = diesel::PgConnection::establish(&url).unwrap();
        let ended = diesel::sql_query(
            "SELECT count(pg_terminate_backend(pid)) AS value FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .get_result::<Number>(&mut admin)
        .unwrap()
        .value;
        (store, ended)
    })
    .await
    .unwrap();
    assert_eq!(ended, 6, "the pool's sessions were ended");
    let mut outcomes = Vec::new();
    for _ in 0..12 {
        let read = pool_store
            .run(|conn| {
                diesel::sql_query("SELECT 1::bigint AS value")
                    .get_result::<Number>(conn)
                    .map_err(onejob::store::StoreError::from)
            })
            .await;
        outcomes.push(match read {
            Ok(_) => "ok".to_owned(),
            Err(error) => format!("{error:?}").chars().take(14).collect(),
        });
    }
    let failed = outcomes.iter().filter(|o| *o != "ok").count();
    assert!(failed <= 1, "one call failed at most: {outcomes:?}");
    assert!(
        outcomes
            .iter()
            .all(|o| o == "ok" || o.starts_with("ConnectionLost")),
        "{outcomes:?}"
    );
    crate::support::harness::record_figures(
        "dead_pool",
        &format!("{ended} sessions of a pool of 6 ended; the next 12 calls: {outcomes:?}"),
    );
}

/// A process opens its pool's connections as the load needs them: calls
/// one at a time are served by one connection, however large the pool,
/// and calls at once get as many as there are of them, up to
/// `pool_size`. Counted by PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quiet_pool_holds_one_connection_and_opens_more_as_callers_come() {
    if !crate::support::harness::postgres_available() {
        return;
    }
    let (db, store) = postgres_store_of_pool(12).await;
    let sessions = {
        let url = db.url.as_str().to_owned();
        move || sessions_settled(&url)
    };
    for _ in 0..20 {
        store
            .run(|conn| sleep_in_database(conn, 0.0))
            .await
            .unwrap();
    }
    let quiet = tokio::task::spawn_blocking(sessions.clone()).await.unwrap();
    let calls = (0..12).map(|_| store.run(|conn| sleep_in_database(conn, 0.3)));
    let answered = futures_util::future::join_all(calls).await;
    assert!(answered.iter().all(Result::is_ok), "{answered:?}");
    let busy = tokio::task::spawn_blocking(sessions).await.unwrap();
    crate::support::harness::record_figures(
        "pool_on_demand",
        &format!(
            "a pool of 12: {quiet} sessions after 20 calls one at a time, \
             {busy} after 12 at once"
        ),
    );
    assert_eq!(quiet, 1, "calls one at a time opened {quiet} connections");
    assert_eq!(
        busy, 12,
        "twelve callers at once were given twelve connections"
    );
}

/// `pg_sleep(seconds)` on `conn`.
fn sleep_in_database(conn: &mut DbConnection, seconds: f64) -> onejob::store::StoreResult<()> {
    diesel::sql_query(format!("SELECT pg_sleep({seconds})"))
        .execute(conn)
        .map(drop)
        .map_err(onejob::store::StoreError::from)
}

/// The sessions on `url`'s database besides the one counting them, read
/// again until the count has held for half a second (a pool opens its
/// connections in the background).
fn sessions_settled(url: &str) -> i64 {
    let mut admin = diesel::PgConnection::establish(url).unwrap();
    let mut count = || {
        diesel::sql_query(
            "SELECT count(*) AS value FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .get_result::<Number>(&mut admin)
        .unwrap()
        .value
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (mut last, mut since) = (count(), std::time::Instant::now());
    while since.elapsed() < std::time::Duration::from_millis(500) {
        assert!(
            std::time::Instant::now() < deadline,
            "the count never settled"
        );
        std::thread::sleep(std::time::Duration::from_millis(25));
        let now = count();
        if now != last {
            (last, since) = (now, std::time::Instant::now());
        }
    }
    last
}

/// A fresh PostgreSQL database, migrated, and a store whose pool holds at
/// most `pool_size` connections.
async fn postgres_store_of_pool(pool_size: u32) -> (crate::support::harness::TestDb, Store) {
    let mut config = test_config(DEFAULT_TEST_PROVIDERS);
    config.database.pool_size = pool_size;
    let db = crate::support::harness::TestDb::create(TestBackend::Postgres);
    let url = db.url.clone();
    let store =
        tokio::task::spawn_blocking(move || onejob::startup::open_store(&url, &config).unwrap())
            .await
            .unwrap();
    (db, store)
}

fn pool_store_conn(
    store: &Store,
) -> diesel::r2d2::PooledConnection<onejob::store::DbConnectionManager> {
    store.conn().unwrap()
}
