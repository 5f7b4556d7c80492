//! The outbox underneath, bypassing the application where it must: the
//! event's row commits and rolls back with the job's state change, the
//! outbox's SQL records and claims exactly what the domain's rules say, and
//! a winner with no endpoint for its event skips the endpoints' look-up.

use std::collections::HashMap;
use std::time::Duration;

use diesel::prelude::*;
use onejob::domain::webhook::{may_claim_event, records_event, EventKind, EventState};
use onejob::domain::{JobStatus, Timestamp};
use onejob::store::reads::find_owned_job;
use onejob::store::rows::JobKey;
use onejob::store::transitions::fail_job;
use onejob::store::webhooks as outbox;
use reqwest::StatusCode;
use serde_json::{json, Value};

use super::{get_json, register, register_ok, webhook_config};
use crate::support::harness::{spawn_app_with, summarize, TestBackend};
use crate::support::webhook_receiver::WebhookReceiver;

/// On PostgreSQL the compare-and-swap's statement also says whether the
/// owner has an enabled endpoint for `job.succeeded`; a winner with none
/// skips the endpoints' look-up (a round trip) and records no event, while
/// another owner's endpoint, or one for other events, does not count. Once
/// the endpoint subscribes, the next winner's event is recorded. SQLite,
/// with no round trips to save, looks up as before.
pub(super) async fn a_winner_with_no_endpoint_for_it_looks_none_up(backend: TestBackend) {
    use crate::support::harness::PreparedApp;
    let receiver = WebhookReceiver::start().await;
    let log = crate::support::statement_log::StatementLog::new();
    let app = PreparedApp::new(backend, webhook_config(|_| {}))
        .await
        .recording(&log)
        .await
        .start()
        .await;
    let only_failures = register(
        &app,
        &app.alice.token,
        json!({"url": receiver.url("/"), "events": ["job.failed"]}),
    )
    .await;
    assert_eq!(only_failures.status(), StatusCode::CREATED);
    let endpoint = only_failures.json::<Value>().await.unwrap()["webhook"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    register_ok(&app, &app.bob.token, &receiver.url("/")).await;
    let look_ups = |statements: &[String]| {
        statements
            .iter()
            .filter(|s| {
                s.contains("FROM (\"webhook_endpoints\" INNER JOIN \"webhook_subscriptions\"")
                    || s.contains("FROM (`webhook_endpoints` INNER JOIN `webhook_subscriptions`")
            })
            .count()
    };
    let events_path = format!("/api/v1/webhooks/{endpoint}/events");
    let finish = |key: &'static str| {
        let app = &app;
        async move {
            let job_id = app.create_job(&app.alice.token, key, &summarize(key)).await;
            app.wait_for_status(&job_id, "succeeded", Duration::from_secs(10))
                .await;
            job_id
        }
    };

    log.take();
    finish("wh-none").await;
    let expected = match backend {
        TestBackend::Postgres => 0,
        TestBackend::Sqlite => 1,
    };
    assert_eq!(
        look_ups(&log.take()),
        expected,
        "endpoint look-ups for a winner"
    );
    assert_eq!(
        get_json(&app, &app.alice.token, &events_path).await["events"],
        json!([]),
        "no event for an endpoint that does not subscribe to it"
    );

    let patched = app
        .client
        .patch(app.url(&format!("/api/v1/webhooks/{endpoint}")))
        .bearer_auth(&app.alice.token)
        .json(&json!({"events": ["job.succeeded"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(patched.status(), StatusCode::OK);
    log.take();
    let job_id = finish("wh-some").await;
    assert_eq!(
        look_ups(&log.take()),
        1,
        "the look-up once an endpoint subscribes"
    );
    let events = get_json(&app, &app.alice.token, &events_path).await;
    let events = events["events"].as_array().unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["type"], "job.succeeded", "{events:?}");
    assert_eq!(events[0]["job_id"], job_id.as_str(), "{events:?}");
}

/// Bypassing the application: `fail_job` in a transaction that rolls back
/// leaves neither the failed status nor an outbox row; committed, both are
/// there. The database refuses a second row for the same occurrence.
pub(super) async fn the_outbox_row_commits_and_rolls_back_with_the_state_change(
    backend: TestBackend,
) {
    let receiver = WebhookReceiver::start().await;
    let app = spawn_app_with(
        backend,
        webhook_config(|c| {
            c.worker.concurrency = 0;
            c.webhooks.settings.deliver = false;
        }),
    )
    .await;
    register_ok(&app, &app.alice.token, &receiver.url("/")).await;
    let job_id = app
        .create_job(&app.alice.token, "wh-tx", &summarize("rolled back"))
        .await;
    let key = JobKey {
        id: onejob::domain::JobId::parse(&job_id).unwrap(),
        owner_id: app.alice.id.clone(),
    };
    let count_rows = |job_id: &str| {
        format!("SELECT count(*) AS n FROM webhook_events WHERE job_id = '{job_id}'")
    };
    #[derive(QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let (inside, after_rollback, status_after_rollback) = {
        let (key, sql) = (key.clone(), count_rows(&job_id));
        app.with_conn(move |conn| {
            let mut inside = 0;
            let rolled: Result<(), diesel::result::Error> = conn.transaction(|conn| {
                let job = find_owned_job(conn, &key).unwrap().unwrap();
                assert!(fail_job(
                    conn,
                    &job,
                    &"failed inside a rolled-back transaction".into(),
                    Timestamp::from_millis(1)
                )
                .unwrap());
                inside = diesel::sql_query(&sql).get_result::<N>(conn).unwrap().n;
                Err(diesel::result::Error::RollbackTransaction)
            });
            assert!(rolled.is_err());
            let after = diesel::sql_query(&sql).get_result::<N>(conn).unwrap().n;
            let status = find_owned_job(conn, &key).unwrap().unwrap().status;
            (inside, after, status)
        })
        .await
    };
    assert_eq!(
        inside, 1,
        "the row is written in the state change's transaction"
    );
    assert_eq!(after_rollback, 0, "rolled back with it");
    assert_ne!(status_after_rollback, JobStatus::Failed);

    let (rows, status, duplicate) = {
        let (key, sql) = (key.clone(), count_rows(&job_id));
        app.with_conn(move |conn| {
            conn.transaction(|conn| {
                let job = find_owned_job(conn, &key).unwrap().unwrap();
                assert!(fail_job(
                    conn,
                    &job,
                    &"failed for good".into(),
                    Timestamp::from_millis(1)
                )
                .unwrap());
                Ok::<_, diesel::result::Error>(())
            })
            .unwrap();
            let rows = diesel::sql_query(&sql).get_result::<N>(conn).unwrap().n;
            let status = find_owned_job(conn, &key).unwrap().unwrap().status;
            // The same occurrence again, by raw SQL: refused by the database.
            let duplicate = diesel::sql_query(format!(
                "INSERT INTO webhook_events (id, owner_id, endpoint_id, job_id, kind, subject, \
                 webhook_id, body, state, attempts, next_attempt_at, window_start_at, created_at) \
                 SELECT '{id}', owner_id, endpoint_id, job_id, kind, subject, 'msg_dup', body, \
                 state, 0, 0, 0, 0 FROM webhook_events WHERE job_id = '{job}'",
                id = uuid::Uuid::now_v7(),
                job = key.id
            ))
            .execute(conn);
            (rows, status, duplicate)
        })
        .await
    };
    assert_eq!(rows, 1);
    assert_eq!(status, JobStatus::Failed);
    assert!(duplicate.is_err(), "one row per occurrence: {duplicate:?}");
    let events = app
        .with_conn(move |conn| outbox::events_of_job(conn, &key).unwrap())
        .await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, "job.failed");
    let body: Value = serde_json::from_str(&events[0].body).unwrap();
    assert_eq!(body["data"]["failure_reason"], "failed for good");
}

/// The outbox's SQL keeps the domain's rules: `record_event` writes a row
/// for exactly the endpoints `records_event` accepts, and `claim_due`
/// claims exactly the rows `may_claim_event` accepts.
pub(super) async fn the_outbox_sql_agrees_with_the_domain_rules(backend: TestBackend) {
    let app = spawn_app_with(
        backend,
        webhook_config(|c| {
            c.worker.concurrency = 0;
            c.webhooks.settings.deliver = false;
        }),
    )
    .await;
    let job_id = app
        .create_job(&app.alice.token, "wh-agree", &summarize("agreement"))
        .await;
    let owner = app.alice.id.clone();
    let key = JobKey {
        id: onejob::domain::JobId::parse(&job_id).unwrap(),
        owner_id: owner.clone(),
    };
    app.with_conn(move |conn| {
        // Every combination of enabled and subscription.
        let mut expected: HashMap<String, bool> = HashMap::new();
        let mut disabled_endpoint = String::new();
        for enabled in [true, false] {
            for events in [
                vec![EventKind::JobFailed],
                vec![EventKind::JobSucceeded, EventKind::JobUnknown],
                vec![EventKind::JobFailed, EventKind::JobCancelled],
            ] {
                let id = uuid::Uuid::now_v7().to_string();
                let endpoint = outbox::create_endpoint(
                    conn,
                    &outbox::NewEndpoint {
                        id: id.clone(),
                        owner_id: owner.clone(),
                        url: "https://receiver.example/".into(),
                        events,
                        retry_for_ms: 60_000,
                        secret_fingerprint: "00000000".into(),
                    },
                    usize::MAX,
                    Timestamp::from_millis(1),
                )
                .unwrap()
                .unwrap();
                if !enabled {
                    outbox::update_endpoint(
                        conn,
                        &endpoint.key(),
                        &outbox::EndpointChange {
                            enabled: Some(false),
                            ..Default::default()
                        },
                        Timestamp::from_millis(1),
                    )
                    .unwrap();
                    disabled_endpoint = id.clone();
                }
                expected.insert(
                    id,
                    records_event(enabled, &endpoint.events, EventKind::JobFailed),
                );
            }
        }
        let written =
            outbox::record_event(conn, &key, EventKind::JobFailed, Timestamp::from_millis(5))
                .unwrap();
        let rows = outbox::events_of_job(conn, &key).unwrap();
        assert_eq!(written, rows.len());
        for (id, wanted) in &expected {
            assert_eq!(
                rows.iter().any(|r| &r.endpoint_id == id),
                *wanted,
                "endpoint {id}"
            );
        }
        assert_eq!(expected.values().filter(|w| **w).count(), 2);
        // Recording the same occurrence again writes nothing.
        assert_eq!(
            outbox::record_event(conn, &key, EventKind::JobFailed, Timestamp::from_millis(6))
                .unwrap(),
            0
        );

        // Claims: rows in every state, due or not, leased or not.
        let now = onejob::store::connection::db_clock(conn).unwrap();
        let enabled_endpoint = rows[0].endpoint_id.clone();
        let mut cases: Vec<(String, bool)> = Vec::new();
        for (i, (state, next, lease)) in [
            (EventState::Pending, now - 1_000, None),
            (EventState::Pending, now + 60_000, None),
            (EventState::Pending, now - 1_000, Some(now + 60_000)),
            (EventState::Pending, now - 1_000, Some(now - 1)),
            (EventState::Delivered, now - 1_000, None),
            (EventState::Dead, now - 1_000, None),
        ]
        .into_iter()
        .enumerate()
        {
            let id = uuid::Uuid::now_v7().to_string();
            diesel::sql_query(format!(
                "INSERT INTO webhook_events (id, owner_id, endpoint_id, job_id, kind, subject, \
                 webhook_id, body, state, attempts, next_attempt_at, window_start_at, \
                 lease_owner, lease_expires_at, delivered_at, created_at) VALUES \
                 ('{id}', '{owner}', '{enabled_endpoint}', '{job}', 'job.unknown', 'case-{i}', \
                 'msg_case{i}', '{{}}', '{state}', 0, {next_ms}, {now_ms}, {lease_owner}, {lease}, \
                 {delivered}, {now_ms})",
                job = key.id,
                next_ms = next.millis(),
                now_ms = now.millis(),
                lease_owner = if lease.is_some() { "'someone'" } else { "NULL" },
                lease = lease.map_or("NULL".to_owned(), |l| l.millis().to_string()),
                delivered = if state == EventState::Delivered {
                    now.millis().to_string()
                } else {
                    "NULL".into()
                },
            ))
            .execute(conn)
            .unwrap();
            cases.push((id, may_claim_event(state, next, lease, true, now)));
        }
        // A due row of a disabled endpoint is not claimed.
        let id = uuid::Uuid::now_v7().to_string();
        diesel::sql_query(format!(
            "INSERT INTO webhook_events (id, owner_id, endpoint_id, job_id, kind, subject, \
             webhook_id, body, state, attempts, next_attempt_at, window_start_at, created_at) \
             VALUES ('{id}', '{owner}', '{disabled_endpoint}', '{job}', 'job.unknown', 'off', \
             'msg_off', '{{}}', 'pending', 0, {due}, {now_ms}, {now_ms})",
            job = key.id,
            due = (now - 1_000).millis(),
            now_ms = now.millis(),
        ))
        .execute(conn)
        .unwrap();
        cases.push((
            id,
            may_claim_event(EventState::Pending, now - 1_000, None, false, now),
        ));
        // The earlier rows: pending and due, for enabled endpoints only.
        for row in &rows {
            cases.push((
                row.id.clone(),
                may_claim_event(EventState::Pending, row.next_attempt_at, None, true, now),
            ));
        }
        let claimed = outbox::claim_due(conn, "agreement", 60_000, 100).unwrap();
        for (id, wanted) in &cases {
            assert_eq!(
                claimed.iter().any(|c| &c.event.id == id),
                *wanted,
                "event {id}"
            );
        }
        assert_eq!(claimed.len(), cases.iter().filter(|c| c.1).count());
        // Claimed once: a second claim finds them leased.
        assert!(outbox::claim_due(conn, "other", 60_000, 100)
            .unwrap()
            .is_empty());
    })
    .await;
}
