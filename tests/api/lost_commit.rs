//! A lost commit reply: PostgreSQL committed, and the connection broke
//! before its reply reached onejob (`support::db_proxy` forwards the
//! `COMMIT`, or the `Sync` that ends an implicit transaction, waits for the
//! server's answer and drops it). onejob cannot know whether the write
//! happened; each write that matters must still end right:
//!
//! - a creation: the request that made it answers with the job (onejob
//!   checks on a fresh connection whether its job exists), and its started
//!   attempt is sent once;
//! - the claim that records `sent_at`: the claimed attempts are found and
//!   sent, once, not left to run out their lease into `unknown`;
//! - the compare-and-swap: the worker's retry finds its own answer
//!   recorded (`Repeated`), so the answer is recorded once, billed once and
//!   nothing goes to the race log;
//! - the webhook outbox: the event written with the answer exists once
//!   and is delivered once; the write that marks a delivery done, its
//!   reply lost, leaves the event delivered, never sent again;
//! - a budget reservation: made once, with its job, and given back once.
//!
//! PostgreSQL only: SQLite is in the process, with no reply to lose.

use std::time::Duration;

use diesel::prelude::*;
use onejob::config::Config;
use onejob::domain::webhook::WebhookKey;
use onejob::domain::{AttemptState, Secret};
use onejob::store::schema::{attempts, webhook_events};
use onejob::store::{DatabaseUrl, Store};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::db::new_job;
use crate::support::db_proxy::DbProxy;
use crate::support::fake_provider::{answer, one_fake_config, FakeProvider, Shape, WAIT};
use crate::support::harness::{
    postgres_available, record_figures, start_instance, summarize, PreparedApp, TestApp,
    TestBackend,
};
use crate::support::webhook_receiver::WebhookReceiver;
use crate::webhooks::WEBHOOK_KEY;

/// Text each trapped write's statement has (see the proxy's `normalized`).
const CLAIM: &str = "version_read = (select jobs.version from jobs where jobs.id = attempts.job_id";
/// Both forms of the compare-and-swap: a plain win's one statement
/// (autocommitted) and the transaction's.
const COMPARE_AND_SWAP: &str = "update jobs set result = $1, completed_by = $2";
const OUTBOX_EVENT: &str = "insert into webhook_events (";
const DELIVERY_DONE: &str = "update webhook_events set state = $1, delivered_at = $2";
const RESERVATION: &str = "insert into budget_reservations (";

/// How long a trap may wait for its transaction.
const TRAP_WAIT: Duration = Duration::from_secs(20);

/// The app on PostgreSQL, every connection of its store through a proxy;
/// `direct` reads the same database around the proxy.
struct Behind {
    app: TestApp,
    proxy: DbProxy,
    direct: Store,
}

/// [`Behind`] before its server starts: a test can arrange rows, and arm
/// the proxy, first.
struct Staged {
    prepared: PreparedApp,
    proxy: DbProxy,
    store: Store,
}

impl Staged {
    async fn new(config: Config) -> Option<Self> {
        if !postgres_available() {
            return None;
        }
        let prepared = PreparedApp::new(TestBackend::Postgres, config).await;
        let url = prepared.db.url.as_str().to_owned();
        let proxy = DbProxy::start(&url).await;
        let proxied = DatabaseUrl::parse(&proxy.url_for(&url)).unwrap();
        let config = prepared.config.clone();
        let store = tokio::task::spawn_blocking(move || {
            onejob::startup::open_store(&proxied, &config).unwrap()
        })
        .await
        .unwrap();
        Some(Self {
            prepared,
            proxy,
            store,
        })
    }

    /// A job of alice's for the fake provider, its attempt queued.
    async fn queued_job(&self, key: &'static str) -> String {
        let owner = self.prepared.alice.id.clone();
        self.prepared
            .with_conn(move |conn| {
                let new = onejob::store::jobs::NewJob {
                    provider: "fake".into(),
                    ..new_job(&owner, key)
                };
                match onejob::store::jobs::create_job(conn, &new).unwrap() {
                    onejob::store::jobs::CreateOutcome::Created(job) => job.id.to_string(),
                    other => panic!("{other:?}"),
                }
            })
            .await
    }

    async fn start(self) -> Behind {
        let direct = self.prepared.store.clone();
        let app = self.prepared.with_store(self.store).start().await;
        Behind {
            app,
            proxy: self.proxy,
            direct,
        }
    }
}

impl Behind {
    async fn start(config: Config) -> Option<Self> {
        Some(Staged::new(config).await?.start().await)
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut onejob::store::DbConnection) -> T + Send + 'static,
    ) -> T {
        let store = self.direct.clone();
        tokio::task::spawn_blocking(move || f(&mut store.conn().unwrap()))
            .await
            .unwrap()
    }

    /// How many rows of `table` have `value` in `column`, around the proxy.
    async fn rows_where(&self, table: &'static str, column: &'static str, value: &str) -> i64 {
        #[derive(QueryableByName)]
        struct Count {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        let value = value.to_owned();
        self.read(move |conn| {
            diesel::sql_query(format!(
                "SELECT count(*) AS n FROM {table} WHERE {column} = $1"
            ))
            .bind::<diesel::sql_types::Text, _>(value)
            .get_result::<Count>(conn)
            .unwrap()
            .n
        })
        .await
    }

    /// The job's attempts as (id, state, sent) around the proxy.
    async fn attempts(&self, job_id: &str) -> Vec<(String, AttemptState, bool)> {
        let job_id = job_id.to_owned();
        self.read(move |conn| {
            attempts::table
                .filter(attempts::job_id.eq(job_id))
                .order(attempts::number)
                .select((
                    attempts::id,
                    attempts::state,
                    attempts::sent_at.is_not_null(),
                ))
                .load::<(String, AttemptState, bool)>(conn)
                .unwrap()
        })
        .await
    }
}

impl Behind {
    /// The job's one attempt, which succeeded, sent once (the provider's
    /// only request): its id.
    async fn one_attempt_sent_once(&self, fake: &FakeProvider, job_id: &str) -> String {
        let attempts = self.attempts(job_id).await;
        assert_eq!(attempts.len(), 1, "{attempts:?}");
        assert_eq!(attempts[0].1, AttemptState::Succeeded);
        assert_eq!(fake.requests_for(&attempts[0].0), 1, "sent once");
        assert_eq!(fake.total_requests(), 1);
        attempts[0].0.clone()
    }

    /// Waits until the worker's one slot is free again: every attempt it
    /// ran is done, its outcome applied (retries included).
    async fn wait_worker_idle(&self) {
        let deadline = std::time::Instant::now() + WAIT;
        while !self.app.app.starts_at_creation_now() {
            assert!(
                std::time::Instant::now() < deadline,
                "the worker never went idle"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the job's one event is recorded delivered.
    async fn wait_delivered(&self, job_id: &str) {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let job_id = job_id.to_owned();
            let states: Vec<String> = self
                .read(move |conn| {
                    webhook_events::table
                        .filter(webhook_events::job_id.eq(job_id))
                        .select(webhook_events::state)
                        .load(conn)
                        .unwrap()
                })
                .await;
            if states == ["delivered"] {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never delivered: {states:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn reserved(&self, owner: &onejob::domain::UserId) -> i64 {
        let owner = owner.clone();
        self.read(move |conn| {
            onejob::store::budgets::find(conn, &owner)
                .unwrap()
                .map_or(0, |row| row.reserved_tokens)
        })
        .await
    }
}

async fn answering_app() -> Option<(FakeProvider, Behind)> {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    fake.set_default(answer("done"));
    let behind = Behind::start(one_fake_config(&fake)).await?;
    Some((fake, behind))
}

/// Posts a job until an answer comes that is not a `503` (a client's
/// retry under the same key), at most five times. Returns every status
/// seen and the last body.
async fn post_until_answered(app: &TestApp, key: &str) -> (Vec<u16>, Value) {
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let response = app.post_job(&app.alice.token, key, &summarize(key)).await;
        let status = response.status();
        statuses.push(status.as_u16());
        if status != StatusCode::SERVICE_UNAVAILABLE {
            return (statuses, response.json().await.unwrap());
        }
        let retry_after = response.headers().get("retry-after").cloned();
        assert!(retry_after.is_some(), "a 503 says when to retry");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("no answer but 503 in five tries: {statuses:?}");
}

mod postgres {
    use super::*;

    /// The creating statement (job and started attempt, one statement)
    /// commits and its reply is lost: the request still answers with its
    /// job, and the started attempt is sent once and succeeds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_creation_whose_commit_reply_is_lost_answers_with_its_job_and_sends_once() {
        let Some((fake, behind)) = answering_app().await else {
            return;
        };
        let app = &behind.app;
        behind.proxy.lose_commit_reply("with job as (");
        let (statuses, body) = post_until_answered(app, "lost-create").await;
        let trapped = behind.proxy.tripped(TRAP_WAIT).await;
        assert!(
            trapped.iter().any(|s| s.contains("INSERT INTO jobs")),
            "{trapped:#?}"
        );
        let job_id = body["id"].as_str().unwrap().to_owned();
        let job = app.wait_for_status(&job_id, "succeeded", WAIT).await;
        behind.wait_worker_idle().await;
        let attempt = behind.one_attempt_sent_once(&fake, &job_id).await;
        assert_eq!(
            behind
                .rows_where("jobs", "idempotency_key", "lost-create")
                .await,
            1
        );
        assert_eq!(job["attempts"][0]["outcome"], "won");
        record_figures(
            "lost_commit_creation",
            &format!(
                "creation: statuses {statuses:?}; 1 job under the key; attempt sent {} time(s); job {}",
                fake.requests_for(&attempt),
                job["status"]
            ),
        );
    }

    /// The claim that records `sent_at` commits and its reply is lost: the
    /// worker finds its claim on a fresh connection and sends the attempt,
    /// once, instead of leaving it to run out its lease into `unknown`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_claim_whose_commit_reply_is_lost_is_sent_once_not_left_unknown() {
        let fake = FakeProvider::start(Shape::OpenAi).await;
        fake.set_default(answer("done"));
        let Some(staged) = Staged::new(one_fake_config(&fake)).await else {
            return;
        };
        // Queued before the server starts: its worker's first claim takes it.
        let job_id = staged.queued_job("lost-claim").await;
        staged.proxy.lose_commit_reply(CLAIM);
        let behind = staged.start().await;
        let trapped = behind.proxy.tripped(TRAP_WAIT).await;
        assert!(
            trapped.iter().any(|s| s.contains("sent_at")),
            "{trapped:#?}"
        );
        let job = behind.app.wait_for_status(&job_id, "succeeded", WAIT).await;
        behind.wait_worker_idle().await;
        let attempt = behind.one_attempt_sent_once(&fake, &job_id).await;
        record_figures(
            "lost_commit_claim",
            &format!(
                "claim: attempt sent {} time(s); job {}; attempt {:?}",
                fake.requests_for(&attempt),
                job["status"],
                AttemptState::Succeeded
            ),
        );
    }

    /// The compare-and-swap commits and its reply is lost: the worker's
    /// retry finds the answer recorded as its own, so it is recorded once,
    /// billed once, and nothing goes to the race log.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_compare_and_swap_whose_commit_reply_is_lost_records_the_answer_once() {
        let Some((fake, behind)) = answering_app().await else {
            return;
        };
        let app = &behind.app;
        behind.proxy.lose_commit_reply(COMPARE_AND_SWAP);
        let job_id = app
            .create_job(&app.alice.token, "lost-cas", &summarize("lost-cas"))
            .await;
        let trapped = behind.proxy.tripped(TRAP_WAIT).await;
        assert!(trapped.iter().any(|s| s.contains("result")), "{trapped:#?}");
        let job = app.wait_for_status(&job_id, "succeeded", WAIT).await;
        assert_eq!(job["result"]["summary"], "done");
        // The worker retried its write (the reply was lost) and is done.
        behind.wait_worker_idle().await;
        let attempts = behind.attempts(&job_id).await;
        assert_eq!(attempts.len(), 1, "{attempts:?}");
        assert_eq!(job["attempts"][0]["outcome"], "won");
        assert_eq!(fake.total_requests(), 1, "sent once");
        let (races, ledger) = (
            behind.rows_where("race_log", "job_id", &job_id).await,
            behind.rows_where("usage_ledger", "job_id", &job_id).await,
        );
        assert_eq!(races, 0, "the retry is not a late answer");
        assert_eq!(ledger, 1, "billed once");
        record_figures(
            "lost_commit_compare_and_swap",
            &format!(
                "compare-and-swap: job {}, outcome {}; race log rows {races}; ledger rows {ledger}; sends {}",
                job["status"],
                job["attempts"][0]["outcome"],
                fake.total_requests()
            ),
        );
    }

    /// The webhook outbox, twice: the event written in the answer's
    /// transaction, whose reply is lost, exists once and is delivered once;
    /// the write that marks a delivery done, its reply lost, leaves the
    /// event delivered, and it is not sent again once its lease is over.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn webhook_outbox_writes_whose_commit_replies_are_lost_keep_one_event_per_job() {
        let fake = FakeProvider::start(Shape::OpenAi).await;
        fake.set_default(answer("done"));
        let receiver = WebhookReceiver::start().await;
        let mut config = one_fake_config(&fake);
        config.webhooks.key = Some(WebhookKey::new(&Secret::new(WEBHOOK_KEY)));
        let settings = &mut config.webhooks.settings;
        settings.allow_private_addresses = true;
        settings.poll_interval_ms = 50;
        // A short delivery lease: a delivery whose end was not recorded is
        // tried again soon.
        settings.timeout_ms = 500;
        let Some(behind) = Behind::start(config).await else {
            return;
        };
        let app = &behind.app;
        let registered = app
            .client
            .post(app.url("/api/v1/webhooks"))
            .bearer_auth(&app.alice.token)
            .json(&json!({"url": receiver.url("/"), "events": ["job.succeeded"]}))
            .send()
            .await
            .unwrap();
        assert_eq!(registered.status(), StatusCode::CREATED);

        behind.proxy.lose_commit_reply(OUTBOX_EVENT);
        let first = app
            .create_job(&app.alice.token, "lost-event", &summarize("lost-event"))
            .await;
        behind.proxy.tripped(TRAP_WAIT).await;
        app.wait_for_status(&first, "succeeded", WAIT).await;
        let delivered = receiver.wait_for(1, WAIT).await;
        assert_eq!(
            behind.rows_where("webhook_events", "job_id", &first).await,
            1,
            "one event for the job"
        );

        behind.proxy.lose_commit_reply(DELIVERY_DONE);
        let second = app
            .create_job(&app.alice.token, "lost-mark", &summarize("lost-mark"))
            .await;
        behind.proxy.tripped(TRAP_WAIT).await;
        // The mark committed: the event is delivered, and stays so past
        // the delivery lease (no process sends it again).
        behind.wait_delivered(&second).await;
        let lease = Duration::from_millis(500 + 5_000 + 500);
        tokio::time::sleep(lease).await;
        let of_second: Vec<String> = receiver
            .received()
            .iter()
            .filter(|r| r.json()["data"]["id"] == second.as_str())
            .map(|r| r.webhook_id().to_owned())
            .collect();
        assert_eq!(of_second.len(), 1, "delivered once: {of_second:?}");
        assert_eq!(
            behind.rows_where("webhook_events", "job_id", &second).await,
            1,
            "one event for the job"
        );
        let first_ids: Vec<&str> = delivered.iter().map(|r| r.webhook_id()).collect();
        record_figures(
            "lost_commit_webhook_outbox",
            &format!(
                "event write lost: 1 event, deliveries {first_ids:?}; delivered mark lost: 1 event, delivered {} time(s) in {lease:?}",
                of_second.len()
            ),
        );
    }

    /// A budget reservation, made in the creating transaction, commits and
    /// the reply is lost: the creation answers with its job, the
    /// reservation was made once, and it is given back once the job ends.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_budget_reservation_whose_commit_reply_is_lost_is_made_and_given_back_once() {
        let Some((fake, behind)) = answering_app().await else {
            return;
        };
        let app = &behind.app;
        let owner = app.alice.id.clone();
        behind
            .read(move |conn| {
                onejob::store::budgets::set_limits(
                    conn,
                    &owner,
                    onejob::domain::ledger::BudgetLimits {
                        spend_micros: None,
                        tokens: Some(1_000_000),
                    },
                    Default::default(),
                    onejob::domain::Timestamp::now(),
                )
                .unwrap()
            })
            .await;
        behind.proxy.lose_commit_reply(RESERVATION);
        let (statuses, body) = post_until_answered(app, "lost-budget").await;
        let trapped = behind.proxy.tripped(TRAP_WAIT).await;
        assert!(trapped.iter().any(|s| s.contains("budget")), "{trapped:#?}");
        let job_id = body["id"].as_str().unwrap().to_owned();
        let owner = app.alice.id.clone();
        let reserved_while_running = behind.reserved(&owner).await;
        app.wait_for_status(&job_id, "succeeded", WAIT).await;
        behind.wait_worker_idle().await;
        assert_eq!(
            behind
                .rows_where("jobs", "idempotency_key", "lost-budget")
                .await,
            1
        );
        assert_eq!(fake.total_requests(), 1, "sent once");
        // Given back when the job ended: nothing left reserved.
        let deadline = std::time::Instant::now() + WAIT;
        let (reservations, reserved) = loop {
            let counted = (
                behind
                    .rows_where("budget_reservations", "job_id", &job_id)
                    .await,
                behind.reserved(&owner).await,
            );
            if counted == (0, 0) || std::time::Instant::now() > deadline {
                break counted;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(
            (reservations, reserved),
            (0, 0),
            "the reservation given back"
        );
        record_figures(
            "lost_commit_budget",
            &format!(
                "budget: statuses {statuses:?}; reserved tokens while running {reserved_while_running}; after the job: {reservations} reservations, {reserved} tokens reserved"
            ),
        );
    }

    /// The claim commits, and a partition holds its reply past the lease:
    /// meanwhile another process's reaper makes the attempt `unknown`.
    /// When the reply comes, the worker sees its lease has surely run out
    /// and does not send: the attempt stays as the reaper left it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_claim_whose_reply_a_partition_holds_past_its_lease_is_not_sent() {
        let fake = FakeProvider::start(Shape::OpenAi).await;
        fake.set_default(answer("done"));
        let mut config = one_fake_config(&fake);
        config.worker.lease_ms = 1_000;
        let Some(staged) = Staged::new(config.clone()).await else {
            return;
        };
        let job_id = staged.queued_job("held-claim").await;
        staged.proxy.partition_after_commit(CLAIM);
        let direct = staged.prepared.store.clone();
        let behind = staged.start().await;
        let cut = std::time::Instant::now();
        behind.proxy.tripped(TRAP_WAIT).await;
        // Another process, on the database directly: its reaper finds the
        // lease run out.
        let (_, _other, other_server) = start_instance(config, direct).await;
        let deadline = std::time::Instant::now() + WAIT;
        let attempt = loop {
            let attempts = behind.attempts(&job_id).await;
            if attempts[0].1 == AttemptState::Unknown {
                break attempts[0].clone();
            }
            assert!(std::time::Instant::now() < deadline, "{attempts:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let unknown_after = cut.elapsed();
        behind.proxy.heal();
        // The claim's reply reaches the worker, which goes idle without
        // sending it.
        behind.wait_worker_idle().await;
        assert_eq!(fake.requests_for(&attempt.0), 0, "never sent");
        assert_eq!(fake.total_requests(), 0);
        let after = behind.attempts(&job_id).await;
        assert_eq!(after[0].1, AttemptState::Unknown, "{after:?}");
        other_server.abort();
        record_figures(
            "lost_commit_claim_held_past_its_lease",
            &format!(
                "claim reply held by a partition: attempt unknown {unknown_after:?} after the cut; after the heal: sent 0 times, still {:?}",
                after[0].1
            ),
        );
    }
}
