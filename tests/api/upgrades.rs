//! Upgrades from the previous release: a database migrated only up to
//! `2026-12-02-000014_ledger`, holding rows in that release's shape, then
//! migrated the rest of the way by onejob itself
//! (`store::migrations::run_pending`, as the server does at start). The
//! rows come out converted, and the store reads them as before.

use diesel::prelude::*;
use onejob::domain::webhook::EventKind;
use onejob::domain::{JobId, Reason, ReasonKind, Timestamp, UserId};
use onejob::store::reads::{attempts_of, get_job};
use onejob::store::rows::JobKey;
use onejob::store::webhooks::{self, EndpointKey};
use onejob::store::DbConnection;

use crate::support::harness::{TestBackend, TestDb};
use crate::support::migrations::as_of;

/// The previous release's last migration.
const PREVIOUS_RELEASE: &str = "2026-12-02-000014_ledger";

/// Failure reasons as the previous release stored them, in one text, and
/// the kind, summary and detail it read from each
/// (`Reason::from_stored`: split at the first marker, then the prefix).
const STORED_REASONS: &[(&str, ReasonKind, &str, Option<&str>)] = &[
    (
        "every provider failed",
        ReasonKind::Other,
        "every provider failed",
        None,
    ),
    (
        "invalid_output: the answer is not JSON",
        ReasonKind::InvalidOutput,
        "the answer is not JSON",
        None,
    ),
    (
        "timeout after 30 s\n— the provider said: reset by db-7.internal",
        ReasonKind::Other,
        "timeout after 30 s",
        Some("reset by db-7.internal"),
    ),
    (
        "invalid_output: too large\n— the provider said: <html>\n— the provider said: again",
        ReasonKind::InvalidOutput,
        "too large",
        Some("<html>\n— the provider said: again"),
    ),
    (
        "réponse refusée (400)\n— the provider said: über-quota ✗",
        ReasonKind::Other,
        "réponse refusée (400)",
        Some("über-quota ✗"),
    ),
    (
        "invalid_output:no space\n— the provider said: ",
        ReasonKind::Other,
        "invalid_output:no space",
        Some(""),
    ),
];

/// Rows as the previous release wrote them: two owners; Alice's endpoints
/// with their subscriptions as comma-separated text (one disabled), Bob's
/// with every kind; a job of Alice's that failed; and for each of
/// [`STORED_REASONS`] a failed job of Bob's whose attempt failed with it.
fn previous_release_rows() -> String {
    let a64 = "a".repeat(64);
    let mut failures = String::new();
    for (n, (text, ..)) in STORED_REASONS.iter().enumerate() {
        let text = text.replace('\'', "''");
        failures.push_str(&format!(
            "INSERT INTO jobs (id, owner_id, idempotency_key, task, provider, input, params,
                               fingerprint, status, version, failure_reason, created_at,
                               updated_at)
                 VALUES ('j-{n}', 'u-bob', 'k-{n}', 'summarize', 'sim-fast', '{{}}', '{{}}',
                         '{a64}', 'failed', 1, '{text}', 0, 0);
             INSERT INTO attempts (id, job_id, owner_id, number, provider, state, created_at,
                                   error)
                 VALUES ('a-{n}', 'j-{n}', 'u-bob', 1, 'sim-fast', 'failed', 0, '{text}');\n"
        ));
    }
    format!(
        "INSERT INTO users (id, name, role, created_at) VALUES
             ('u-alice', 'alice', 'user', 0), ('u-bob', 'bob', 'user', 0);
         INSERT INTO webhook_endpoints (id, owner_id, url, events, enabled, disabled_reason,
                                        disabled_at, secret_fingerprint, retry_for_ms,
                                        created_at, updated_at) VALUES
             ('e-both', 'u-alice', 'https://a.example/', ',job.succeeded,job.failed,', TRUE,
              NULL, NULL, '00000000', 60000, 1, 1),
             ('e-unknown', 'u-alice', 'https://b.example/', ',job.unknown,', TRUE,
              NULL, NULL, '00000000', 60000, 2, 2),
             ('e-off', 'u-alice', 'https://c.example/', ',job.failed,', FALSE,
              'disabled by its owner', 3, '00000000', 60000, 3, 3),
             ('e-bob', 'u-bob', 'https://d.example/',
              ',job.cancelled,job.failed,job.succeeded,job.unknown,', TRUE,
              NULL, NULL, '00000000', 60000, 4, 4);
         INSERT INTO jobs (id, owner_id, idempotency_key, task, provider, input, params,
                           fingerprint, status, version, failure_reason, created_at,
                           updated_at) VALUES
             ('j-failed', 'u-alice', 'k1', 'summarize', 'sim-fast', '{{}}', '{{}}', '{a64}',
              'failed', 1, 'every provider failed', 0, 0);"
    ) + &failures
}

/// The database as the previous release left it, migrated by onejob.
fn upgraded(backend: TestBackend) -> (TestDb, DbConnection) {
    let db = TestDb::create_empty(backend);
    as_of(&db, backend, PREVIOUS_RELEASE, &previous_release_rows());
    let mut conn = <DbConnection as Connection>::establish(db.url.as_str()).unwrap();
    let applied = onejob::store::migrations::run_pending(&mut conn).unwrap();
    assert!(!applied.is_empty(), "nothing was left to migrate");
    (db, conn)
}

fn endpoint_key(id: &str, owner: &str) -> EndpointKey {
    EndpointKey {
        id: id.to_owned(),
        owner_id: UserId::from_stored(owner.to_owned()),
    }
}

#[derive(QueryableByName, Debug, PartialEq)]
struct SubscriptionRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    owner_id: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    endpoint_id: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    kind: String,
}

/// Each kind the old text named becomes a `webhook_subscriptions` row of
/// the endpoint's owner; the endpoints read back with the same `events`;
/// a failure's event goes to exactly the endpoints the old `LIKE` chose.
async fn subscriptions_become_rows_of_their_own(backend: TestBackend) {
    tokio::task::spawn_blocking(move || {
        let (_db, mut conn) = upgraded(backend);
        let mut rows: Vec<SubscriptionRow> =
            diesel::sql_query("SELECT owner_id, endpoint_id, kind FROM webhook_subscriptions")
                .load(&mut conn)
                .unwrap();
        rows.sort_by(|a, b| (&a.endpoint_id, &a.kind).cmp(&(&b.endpoint_id, &b.kind)));
        let row = |owner: &str, endpoint: &str, kind: &str| SubscriptionRow {
            owner_id: owner.to_owned(),
            endpoint_id: endpoint.to_owned(),
            kind: kind.to_owned(),
        };
        assert_eq!(
            rows,
            vec![
                row("u-bob", "e-bob", "job.cancelled"),
                row("u-bob", "e-bob", "job.failed"),
                row("u-bob", "e-bob", "job.succeeded"),
                row("u-bob", "e-bob", "job.unknown"),
                row("u-alice", "e-both", "job.failed"),
                row("u-alice", "e-both", "job.succeeded"),
                row("u-alice", "e-off", "job.failed"),
                row("u-alice", "e-unknown", "job.unknown"),
            ]
        );

        let both = webhooks::get_endpoint(&mut conn, &endpoint_key("e-both", "u-alice"))
            .unwrap()
            .unwrap();
        assert_eq!(
            both.kinds(),
            [EventKind::JobFailed, EventKind::JobSucceeded]
        );
        assert_eq!(both.url, "https://a.example/");
        let alice = UserId::from_stored("u-alice".to_owned());
        let listed: Vec<(String, Vec<EventKind>)> = webhooks::list_endpoints(&mut conn, &alice)
            .unwrap()
            .into_iter()
            .map(|e| (e.id.clone(), e.events))
            .collect();
        assert_eq!(
            listed,
            vec![
                ("e-unknown".to_owned(), vec![EventKind::JobUnknown]),
                ("e-off".to_owned(), vec![EventKind::JobFailed]),
                (
                    "e-both".to_owned(),
                    vec![EventKind::JobFailed, EventKind::JobSucceeded]
                ),
            ]
        );
        let every = webhooks::list_all_endpoints(&mut conn).unwrap();
        let bob = every.iter().find(|e| e.id == "e-bob").unwrap();
        assert_eq!(
            bob.kinds(),
            [
                EventKind::JobCancelled,
                EventKind::JobFailed,
                EventKind::JobSucceeded,
                EventKind::JobUnknown
            ]
        );

        // Alice's failure goes to her enabled endpoint for it, not to the
        // disabled one, the one for other kinds, or Bob's.
        let job = JobKey {
            id: JobId::from_stored("j-failed".to_owned()),
            owner_id: alice,
        };
        let written = webhooks::record_event(
            &mut conn,
            &job,
            EventKind::JobFailed,
            Timestamp::from_millis(10),
        )
        .unwrap();
        let sent_to: Vec<String> = webhooks::events_of_job(&mut conn, &job)
            .unwrap()
            .into_iter()
            .map(|e| e.endpoint_id)
            .collect();
        assert_eq!((written, sent_to), (1, vec!["e-both".to_owned()]));
    })
    .await
    .unwrap();
}

#[derive(QueryableByName, Debug, PartialEq)]
struct ReasonColumns {
    #[diesel(sql_type = diesel::sql_types::Text)]
    id: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    kind: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    summary: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    detail: Option<String>,
}

/// Each stored reason is split into its kind, summary and detail columns,
/// on jobs and on attempts, exactly as the old text was read; the store
/// reads them back as the same `Reason`, whose text for staff is the old
/// text and whose text for the owner is the words before the marker.
async fn failure_reasons_are_split_into_columns(backend: TestBackend) {
    tokio::task::spawn_blocking(move || {
        let (_db, mut conn) = upgraded(backend);
        for (table, columns) in [
            (
                "jobs",
                "failure_kind AS kind, failure_reason AS summary, failure_detail AS detail",
            ),
            (
                "attempts",
                "error_kind AS kind, error AS summary, error_detail AS detail",
            ),
        ] {
            let mut rows: Vec<ReasonColumns> = diesel::sql_query(format!(
                "SELECT id, {columns} FROM {table} WHERE owner_id = 'u-bob'"
            ))
            .load::<ReasonColumns>(&mut conn)
            .unwrap();
            rows.sort_by(|a, b| a.id.cmp(&b.id));
            let prefix = &table[..1];
            let expected: Vec<ReasonColumns> = STORED_REASONS
                .iter()
                .enumerate()
                .map(|(n, (_, kind, summary, detail))| ReasonColumns {
                    id: format!("{prefix}-{n}"),
                    kind: Some(kind.as_str().to_owned()),
                    summary: Some((*summary).to_owned()),
                    detail: detail.map(str::to_owned),
                })
                .collect();
            assert_eq!(rows, expected, "{table}");
        }
        // Alice's failed job: a plain reason, of the other kind.
        let alice = JobKey {
            id: JobId::from_stored("j-failed".to_owned()),
            owner_id: UserId::from_stored("u-alice".to_owned()),
        };
        let failure = get_job(&mut conn, &alice).unwrap().failure();
        assert_eq!(
            failure.map(|r| (r.kind(), r.for_staff())),
            Some((ReasonKind::Other, "every provider failed".to_owned()))
        );

        for (n, (text, kind, summary, detail)) in STORED_REASONS.iter().enumerate() {
            let key = JobKey {
                id: JobId::from_stored(format!("j-{n}")),
                owner_id: UserId::from_stored("u-bob".to_owned()),
            };
            let expected =
                Reason::from_columns(*kind, (*summary).to_owned(), detail.map(str::to_owned));
            let job = get_job(&mut conn, &key).unwrap();
            let attempts = attempts_of(&mut conn, &key).unwrap();
            for (what, reason) in [("job", job.failure()), ("attempt", attempts[0].reason())] {
                let reason = reason.unwrap_or_else(|| panic!("{what} {n} has no reason"));
                assert_eq!(reason, expected, "{what} {n}");
                assert_eq!(
                    reason.for_staff(),
                    *text,
                    "{what} {n}: staff see the old text"
                );
                let owner_sees = text.split('\n').next().unwrap();
                assert_eq!(
                    reason.for_owner(),
                    owner_sees,
                    "{what} {n}: the owner's words"
                );
            }
        }
    })
    .await
    .unwrap();
}

on_both_backends!(
    subscriptions_become_rows_of_their_own,
    failure_reasons_are_split_into_columns,
);
