//! The statement rule Citus needs (`support::statement_rule`), enforced
//! without Citus: on plain PostgreSQL, every statement of a full lifecycle
//! is recorded (diesel's instrumentation) and judged, and so is every
//! transaction. A statement that locks, updates or deletes rows of a
//! distributed table without naming its owner by value (in itself and in
//! each subquery), sets the distribution column, or evaluates a volatile
//! function inside an UPDATE or DELETE fails the test; so does a read
//! across every shard that is not one of the listed fan-out reads, and a
//! transaction that touches several owners' rows. The lifecycle exercises
//! every store function that writes a distributed table (a scan of
//! `src/store` finds them), and retention removes every terminal state.
//! Migrations keep one subcommand per `ALTER TABLE` on a distributed table.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::support::statement_log::{Sent, StatementLog};
use onejob::domain::webhook::WebhookKey;
use onejob::domain::Secret;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::fake_provider::{
    answer, config_of, Behaviour, FakeProvider, ProviderToml, Shape, StreamStep, WAIT,
};
use crate::support::harness::{
    postgres_available, record_figures, summarize, FormClient, PreparedApp, TestApp, TestBackend,
};
use crate::support::sse::SseReader;
use crate::support::statement_rule::{self as distribution, Verdict};
use crate::support::webhook_receiver::WebhookReceiver;

/// Two providers on one fake: `up` times out soon (its calls go unknown),
/// `slow` never within the test; a chat route; retention windows of a day;
/// webhooks to a receiver on 127.0.0.1; tallies flushed only when asked.
fn lifecycle_config(fake: &FakeProvider) -> onejob::config::Config {
    let mut config = config_of(&format!(
        r#"[retention]
jobs_days = 1
races_days = 1
audit_days = 1
{}{}
[[tasks]]
name = "summarize"
providers = ["up"]
input_fields = ["text"]
template = "Summarize: {{{{ text }}}}"

[[tasks]]
name = "held"
providers = ["slow"]
input_fields = ["text"]
template = "Summarize: {{{{ text }}}}"

[[tasks]]
name = "gpt-safe"
kind = "chat"
providers = ["up"]
"#,
        ProviderToml::openai("up", &format!("{}/v1", fake.base_url)).toml(),
        ProviderToml::openai("slow", &format!("{}/v1", fake.base_url))
            .timeout_ms(60_000)
            .toml()
    ));
    config.worker.concurrency = 1;
    config.server.shutdown_grace_ms = 61_000;
    config.ledger.tally_flush_ms = 3_600_000;
    config.webhooks.key = Some(WebhookKey::new(&Secret::new(crate::webhooks::WEBHOOK_KEY)));
    let hooks = &mut config.webhooks.settings;
    hooks.allow_private_addresses = true;
    hooks.backoff_initial_ms = 100;
    hooks.backoff_max_ms = 400;
    hooks.poll_interval_ms = 50;
    hooks.disable_after_failures = 100;
    config
}

/// The app under test, the fake provider, the statements recorded.
struct Lifecycle {
    app: TestApp,
    fake: FakeProvider,
    log: StatementLog,
}

impl Lifecycle {
    async fn start() -> Self {
        let fake = FakeProvider::start(Shape::OpenAi).await;
        let log = StatementLog::new();
        let app = PreparedApp::new(TestBackend::Postgres, lifecycle_config(&fake))
            .await
            .recording(&log)
            .await
            .start()
            .await;
        fake.set_default(answer("done"));
        Self { app, fake, log }
    }

    async fn put_budget(&self, owner: &str, body: Value) {
        let response = self
            .app
            .client
            .put(self.app.url(&format!("/api/v1/budgets/{owner}")))
            .bearer_auth(&self.app.ada.token)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "PUT budget of {owner}");
    }

    async fn chat(&self, key: &str, body: Value) -> reqwest::Response {
        self.app
            .client
            .post(self.app.url("/v1/chat/completions"))
            .bearer_auth(&self.app.alice.token)
            .header("Idempotency-Key", key)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    fn first_attempt(job: &Value) -> String {
        job["attempts"][0]["id"].as_str().unwrap().to_owned()
    }

    /// Budgets: made, changed (the write Citus refused when it set the
    /// owner), reserved and released by jobs, and removed.
    async fn budgets(&self) {
        let app = &self.app;
        let limits = json!({"spend_limit": 100, "token_limit": 100000000, "reason": "a plan"});
        self.put_budget("alice", limits.clone()).await;
        self.put_budget(
            "alice",
            json!({"spend_limit": 90, "token_limit": 100000000, "reason": "a smaller plan"}),
        )
        .await;
        let done = app
            .create_job(&app.alice.token, "k-budget", &summarize("a"))
            .await;
        app.wait_for_status(&done, "succeeded", WAIT).await;
        self.put_budget("bob", limits).await;
        let removed = app
            .client
            .delete(app.url("/api/v1/budgets/bob"))
            .bearer_auth(&app.ada.token)
            .json(&json!({"reason": "no plan"}))
            .send()
            .await
            .unwrap();
        assert!(removed.status().is_success(), "{}", removed.status());
    }

    /// Creations (one alone, a batch of one owner's at once), a replay and
    /// a conflicting payload of two owners (tallies for both, flushed
    /// together later).
    async fn creations(&self) -> String {
        let app = &self.app;
        let done = app
            .create_job(&app.alice.token, "k-done", &summarize("a"))
            .await;
        app.wait_for_status(&done, "succeeded", WAIT).await;
        let bobs = app
            .create_job(&app.bob.token, "k-bob", &summarize("b"))
            .await;
        app.wait_for_status(&bobs, "succeeded", WAIT).await;
        for (token, key, text) in [
            (&app.alice.token, "k-done", "a"),
            (&app.bob.token, "k-bob", "b"),
        ] {
            let replay = app.post_job(token, key, &summarize(text)).await;
            assert_eq!(replay.status(), StatusCode::OK);
            let conflict = app.post_job(token, key, &summarize("other")).await;
            assert_eq!(conflict.status(), StatusCode::CONFLICT);
        }
        // One owner's creations at once: group commit's multi-row insert.
        let batch = futures::future::join_all((0..8).map(|i| async move {
            let key = format!("k-batch-{i}");
            app.post_job(&app.bob.token, &key, &summarize("batch"))
                .await
        }))
        .await;
        assert!(batch.iter().all(|r| r.status() == StatusCode::CREATED));
        done
    }

    /// Unknown then a late winner; abandon, a new attempt that wins, and
    /// the abandoned one's answer lost (race log, audit).
    async fn races(&self) -> String {
        let (app, fake) = (&self.app, &self.fake);
        fake.set_default(Behaviour::Hold);
        let late = app
            .create_job(&app.alice.token, "k-late", &summarize("b"))
            .await;
        let job = app.wait_for_status(&late, "unknown", WAIT).await;
        fake.release(&Self::first_attempt(&job), answer("late"));
        app.wait_for_status(&late, "succeeded", WAIT).await;

        let raced = app
            .create_job(&app.bob.token, "k-race", &summarize("c"))
            .await;
        let job = app.wait_for_status(&raced, "unknown", WAIT).await;
        let first = Self::first_attempt(&job);
        fake.wait_held(&first).await;
        let abandoned = app
            .abandon(&app.sue.token, &first, "the provider lost it")
            .await;
        assert_eq!(abandoned.status(), StatusCode::OK);
        fake.set_default(answer("second"));
        let started = app
            .start_attempt(&app.sue.token, &raced, Some(json!({"provider": "up"})))
            .await;
        assert!(started.status().is_success(), "{}", started.status());
        app.wait_for_status(&raced, "succeeded", WAIT).await;
        fake.release(&first, answer("first, too late"));
        app.wait_for_job(&raced, WAIT, |j| j["attempts"][0]["outcome"] == "lost")
            .await;
        late
    }

    /// A chat completion plain and streamed, through the OpenAI door.
    async fn chats(&self) {
        let plain = self
            .chat(
                "k-chat",
                json!({"model": "gpt-safe", "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await;
        assert_eq!(plain.status(), StatusCode::OK);
        self.fake.push(Behaviour::Stream(vec![
            StreamStep::Text("one ".into()),
            StreamStep::Text("two".into()),
        ]));
        let streamed = self
            .chat(
                "k-stream",
                json!({"model": "gpt-safe", "stream": true,
                       "messages": [{"role": "user", "content": "count"}]}),
            )
            .await;
        assert_eq!(streamed.status(), StatusCode::OK);
        let events = SseReader::new(streamed).rest().await;
        assert_eq!(crate::support::sse::content_of(&events), "one two");
    }

    /// A process that claimed and sent, then died: the lease runs out and
    /// the reaper makes the attempt unknown. The one worker slot is busy
    /// with a held call (its lease renewed meanwhile), so the job waits
    /// queued for the dead claimer. Staff resolve it as failed. Returns
    /// the busy job and the failed one.
    async fn dead_process(&self) -> (String, String) {
        let (app, fake) = (&self.app, &self.fake);
        fake.set_default(Behaviour::Hold);
        let busy = app
            .create_job(
                &app.bob.token,
                "k-busy",
                &json!({"task": "held", "input": {"text": "x"}}),
            )
            .await;
        app.wait_for_status(&busy, "running", WAIT).await;
        let orphan = app
            .create_job(&app.bob.token, "k-orphan", &summarize("d"))
            .await;
        let claimed = app
            .with_conn(|conn| {
                let mut admit = |_: &onejob::domain::AttemptId, _: &str| true;
                onejob::store::queue::claim_batch(
                    conn,
                    onejob::store::queue::ClaimRules {
                        lease_owner: "a-process-that-dies",
                        lease_ms: 1000,
                        limit: 1,
                        soft_timeout_ms: &|_| 400,
                        closed: &[],
                        admit: &mut admit,
                        confirm: true,
                    },
                )
                .unwrap()
                .claims
            })
            .await;
        assert_eq!(claimed.len(), 1, "the dead process claimed the queued job");
        app.wait_for_status(&orphan, "unknown", Duration::from_secs(10))
            .await;
        let attempt = Self::first_attempt(&app.get_job(&app.sue.token, &orphan).await);
        assert_eq!(
            app.abandon(&app.sue.token, &attempt, "the process died")
                .await
                .status(),
            StatusCode::OK
        );
        app.set_password("ada", "ada-password").await;
        let admin = FormClient::new(app);
        let csrf = admin.sign_in("ada", "ada-password").await;
        let failed = admin
            .post_form(
                &format!("/jobs/{orphan}/fail"),
                &[("csrf", &csrf), ("reason", "nobody will answer")],
            )
            .await;
        assert_eq!(failed.status(), StatusCode::SEE_OTHER);
        (busy, orphan)
    }

    /// What staff and owners read: the console, the pages, the API.
    async fn pages(&self, raced: &str, late: &str) {
        let app = &self.app;
        let admin = FormClient::new(app);
        admin.sign_in("ada", "ada-password").await;
        for page in [
            "/admin",
            "/admin/unknown",
            "/admin/races",
            "/admin/audit",
            "/admin/jobs",
            "/admin/jobs?owner=bob&status=failed&provider=up&key=k-orphan",
            &format!("/admin/jobs?id={raced}"),
            "/admin/users",
            "/admin/providers",
            "/admin/usage",
            "/admin/usage?group_by=owner&provider=up",
            "/usage",
            "/jobs",
            &format!("/jobs/{raced}"),
        ] {
            assert_eq!(admin.get(page).await.status(), StatusCode::OK, "{page}");
        }
        for path in [
            "/api/v1/jobs",
            &format!("/api/v1/jobs/{late}"),
            &format!("/api/v1/jobs/{late}/usage"),
            "/api/v1/usage?group_by=task",
            "/api/v1/budgets/alice",
        ] {
            assert_eq!(
                app.get(&app.alice.token, path).await.status(),
                StatusCode::OK
            );
        }
    }

    /// A background response, queued behind the busy slot, polled and
    /// cancelled: the cancel's lock, guarded update, withdrawal (tallied
    /// in its transaction) and outbox. Returns the cancelled job's id.
    async fn cancel(&self) -> String {
        let app = &self.app;
        let created = app
            .client
            .post(app.url("/v1/responses"))
            .bearer_auth(&app.alice.token)
            .header("Idempotency-Key", "k-response")
            .json(&json!({"model": "gpt-safe", "input": "hi", "background": true}))
            .send()
            .await
            .unwrap();
        assert_eq!(created.status(), StatusCode::OK);
        let response: Value = created.json().await.unwrap();
        let response_id = response["id"].as_str().unwrap().to_owned();
        let poll = format!("/v1/responses/{response_id}");
        assert_eq!(
            app.get(&app.alice.token, &poll).await.status(),
            StatusCode::OK
        );
        let cancelled = app
            .client
            .post(app.url(&format!("{poll}/cancel")))
            .bearer_auth(&app.alice.token)
            .send()
            .await
            .unwrap();
        assert_eq!(cancelled.status(), StatusCode::OK);
        let cancelled: Value = cancelled.json().await.unwrap();
        assert_eq!(cancelled["status"], "cancelled");
        self.job_of_key(&app.alice.token, "k-response").await
    }

    /// The id of the caller's job made under `key`.
    async fn job_of_key(&self, token: &str, key: &str) -> String {
        let jobs: Value = self
            .app
            .get(token, "/api/v1/jobs?limit=100")
            .await
            .json()
            .await
            .unwrap();
        jobs["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|job| job["idempotency_key"] == key)
            .and_then(|job| job["id"].as_str())
            .unwrap_or_else(|| panic!("no job under {key}"))
            .to_owned()
    }

    /// Webhooks: registering, the outbox rows in the job's transaction,
    /// claims, a failed and a successful delivery, resend, rotation,
    /// disabling, the metrics, the admin's list and deletion.
    async fn webhooks(&self) {
        let app = &self.app;
        let receiver = WebhookReceiver::start().await;
        receiver.fail_first(1);
        self.fake.set_default(answer("done"));
        let registered = app
            .client
            .post(app.url("/api/v1/webhooks"))
            .bearer_auth(&app.alice.token)
            .json(&json!({"url": receiver.url("/"), "events": ["job.succeeded", "job.failed", "job.unknown"]}))
            .send()
            .await
            .unwrap();
        assert_eq!(registered.status(), StatusCode::CREATED);
        let registered: Value = registered.json().await.unwrap();
        let endpoint = registered["webhook"]["id"].as_str().unwrap().to_owned();
        let job_id = app
            .create_job(&app.alice.token, "k-hook", &summarize("hook"))
            .await;
        app.wait_for_status(&job_id, "succeeded", WAIT).await;
        receiver.wait_for(2, WAIT).await;
        let events_path = format!("/api/v1/webhooks/{endpoint}/events");
        let event_id = loop {
            let events: Value = app
                .get(&app.alice.token, &events_path)
                .await
                .json()
                .await
                .unwrap();
            if events["events"][0]["state"] == "delivered" {
                break events["events"][0]["id"].as_str().unwrap().to_owned();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let post = |path: String| {
            let request = app
                .client
                .post(app.url(&path))
                .bearer_auth(&app.alice.token);
            async move { request.send().await.unwrap().status() }
        };
        assert_eq!(
            post(format!("{events_path}/{event_id}/resend")).await,
            StatusCode::ACCEPTED
        );
        receiver.wait_for(3, WAIT).await;
        assert_eq!(
            post(format!("/api/v1/webhooks/{endpoint}/rotate-secret")).await,
            StatusCode::OK
        );
        for (token, path) in [
            (
                &app.alice.token,
                format!("/api/v1/webhooks/{endpoint}/deliveries"),
            ),
            (&app.ada.token, "/api/v1/webhooks?all=true".to_owned()),
            (&app.ada.token, "/metrics".to_owned()),
        ] {
            assert_eq!(
                app.get(token, &path).await.status(),
                StatusCode::OK,
                "{path}"
            );
        }
        let patched = app
            .client
            .patch(app.url(&format!("/api/v1/webhooks/{endpoint}")))
            .bearer_auth(&app.alice.token)
            .json(&json!({"enabled": false, "events": ["job.failed"]}))
            .send()
            .await
            .unwrap();
        assert_eq!(patched.status(), StatusCode::OK);
        let deleted = app
            .client
            .delete(app.url(&format!("/api/v1/webhooks/{endpoint}")))
            .bearer_auth(&app.alice.token)
            .send()
            .await
            .unwrap();
        assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    }
}

/// Every statement of a job's whole life, and every transaction, judged;
/// every store function that writes an owner's table exercised; and
/// retention removing jobs in every terminal state.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_statement_of_a_full_lifecycle_can_be_routed_by_owner() {
    if !postgres_available() {
        return;
    }
    let life = Lifecycle::start().await;
    let app = &life.app;
    life.budgets().await;
    let done = life.creations().await;
    let late = life.races().await;
    let raced = life.job_of_key(&app.bob.token, "k-race").await;
    life.chats().await;
    let (busy, failed) = life.dead_process().await;
    life.pages(&raced, &late).await;
    let cancelled = life.cancel().await;

    // The held call ends; the webhooks run on a free slot.
    let held = Lifecycle::first_attempt(&app.get_job(&app.bob.token, &busy).await);
    life.fake.release(&held, answer("held"));
    app.wait_for_status(&busy, "succeeded", WAIT).await;
    life.webhooks().await;

    // Both owners' replays, in one flush.
    let flushed = app.app.flush_tallies().await.unwrap();
    assert!(flushed >= 2, "{flushed} tallies flushed");

    // Retention, as if three days had passed: every terminal state goes.
    let pruned = app
        .app
        .prune_expired(onejob::domain::Timestamp::now() + 3 * 86_400_000)
        .await
        .unwrap();
    let mut problems = Vec::new();
    for (owner, job, status) in [
        (&app.alice.token, &done, "succeeded"),
        (&app.bob.token, &failed, "failed"),
        (&app.alice.token, &cancelled, "cancelled"),
    ] {
        let found = app
            .get(owner, &format!("/api/v1/jobs/{job}"))
            .await
            .status();
        if found != StatusCode::NOT_FOUND {
            problems.push(format!(
                "retention left a {status} job behind ({job}: {found}); pruned {pruned:?}"
            ));
        }
    }

    let sent = life.log.take_sent();
    problems.extend(unexercised_writers(&sent));
    problems.extend(judge_all(sent));
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// On a database distributed by owner (Citus) a creation is plain inserts
/// in one transaction of its owner's, a batch of one owner's creations
/// too: Citus runs an `INSERT … SELECT` (the one-statement creation, the
/// multi-row one) through the coordinator, with a two-phase commit each
/// time. Tried here on one PostgreSQL, the store told it is distributed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_distributed_database_creations_are_plain_inserts() {
    use onejob::store::connection::Placement;
    if !postgres_available() {
        return;
    }
    let fake = FakeProvider::start(Shape::OpenAi).await;
    fake.set_default(answer("done"));
    let log = StatementLog::new();
    let prepared = PreparedApp::new(TestBackend::Postgres, lifecycle_config(&fake))
        .await
        .recording(&log)
        .await;
    let store = prepared.store.clone().placed_as(Placement::ByOwner);
    let app = prepared.with_store(store).start().await;
    log.take_sent();
    let one = app
        .create_job(&app.alice.token, "k-one", &summarize("a"))
        .await;
    let batch = futures::future::join_all((0..8).map(|i| {
        let app = &app;
        async move {
            let key = format!("k-batch-{i}");
            app.post_job(&app.bob.token, &key, &summarize("b"))
                .await
                .status()
        }
    }))
    .await;
    assert!(batch.iter().all(|s| *s == StatusCode::CREATED), "{batch:?}");
    let replay = app
        .post_job(&app.alice.token, "k-one", &summarize("a"))
        .await;
    assert_eq!(replay.status(), StatusCode::OK);
    app.wait_for_status(&one, "succeeded", WAIT).await;
    let sent = log.take_sent();
    let creations: Vec<String> = sent
        .iter()
        .map(|s| distribution::normalize(&s.sql))
        .filter(|sql| sql.contains("insert into jobs") || sql.contains("insert into attempts"))
        .collect();
    assert!(creations.len() >= 18, "{creations:#?}");
    for sql in &creations {
        assert!(
            sql.starts_with("insert into jobs (") || sql.starts_with("insert into attempts ("),
            "an INSERT … SELECT on a distributed database: {sql}"
        );
        assert!(sql.contains(") values ("), "{sql}");
    }
    let problems = judge_all(sent);
    assert!(problems.is_empty(), "{problems:#?}");
}

/// The webhook claim takes each owner's events in a transaction of its
/// own, however many owners have events due at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_webhook_claim_takes_one_owner_per_transaction() {
    if !postgres_available() {
        return;
    }
    let fake = FakeProvider::start(Shape::OpenAi).await;
    fake.set_default(answer("done"));
    let receiver = WebhookReceiver::start().await;
    let log = StatementLog::new();
    let mut config = lifecycle_config(&fake);
    config.webhooks.settings.deliver = false;
    let app = PreparedApp::new(TestBackend::Postgres, config)
        .await
        .recording(&log)
        .await
        .start()
        .await;
    for (token, key) in [(&app.alice.token, "a"), (&app.bob.token, "b")] {
        let registered = app
            .client
            .post(app.url("/api/v1/webhooks"))
            .bearer_auth(token)
            .json(&json!({"url": receiver.url("/"), "events": ["job.succeeded"]}))
            .send()
            .await
            .unwrap();
        assert_eq!(registered.status(), StatusCode::CREATED);
        let job = app.create_job(token, key, &summarize(key)).await;
        app.wait_for_status(&job, "succeeded", WAIT).await;
    }
    log.take_sent();
    let claimed = app
        .with_conn(|conn| onejob::store::webhooks::claim_due(conn, "claimer", 10_000, 16).unwrap())
        .await;
    let owners: BTreeSet<String> = claimed
        .iter()
        .map(|c| c.event.owner_id.to_string())
        .collect();
    assert_eq!(owners.len(), 2, "both owners' events were due: {claimed:?}");
    let verdicts = distribution::judge_transactions(&log.take_sent());
    assert!(verdicts.mixed.is_empty(), "{:#?}", verdicts.mixed);
    assert!(verdicts.touching >= 2, "one transaction per owner");
}

/// The store functions that write a distributed table, each with text only
/// its statement has (after `normalize`): the lifecycle must send each.
/// `None` for a function whose writes run on SQLite only (the rule is
/// Citus's). A function the scan finds that is not here fails the test.
const WRITERS: &[(&str, Option<&str>)] = &[
    ("budgets.rs::remove", Some("delete from budgets where (budgets.owner_id = $1)")),
    ("budgets.rs::reserve", Some("insert into budget_reservations (")),
    ("budgets.rs::set_limits", Some("insert into budgets (owner_id")),
    ("budgets.rs::take_reservation", Some("delete from budget_reservations where job_id = $1 and owner_id = $2 returning")),
    ("budgets.rs::write", Some("update budgets set ")),
    ("cancel.rs::cancel_statement", Some("update jobs set status = $1, version = (jobs.version + $2), updated_at = $3 where")),
    ("completion.rs::SETTLE_IN_ONE_STATEMENT", Some("with cas as ( update jobs set result = $1")),
    ("completion.rs::cas_job_result", None),
    ("completion.rs::log_race", Some("insert into race_log (")),
    ("completion.rs::settle_success", None),
    ("completion.rs::skip_queued_attempts", Some("update attempts set state = $1, finished_at = $2, lease_expires_at = $3, error_kind = $4, error = $5, error_detail = $6 where (((attempts.job_id = $7)")),
    ("jobs.rs::insert_job_and_attempt", Some("with job as ( insert into jobs (")),
    ("jobs.rs::insert_job_unless_key_exists", Some("fingerprint, status, version, result, completed_by, failure_reason, created_at, updated_at, failure_kind, failure_detail, trace_context) values")),
    ("jobs.rs::multi_row_creation_statement", Some("with input as ( select * from unnest(")),
    ("ledger.rs::add_tallies", Some("insert into usage_tallies (")),
    ("ledger.rs::record_call", Some("insert into usage_ledger (")),
    ("operator.rs::record_audit", Some("insert into audit_log (")),
    ("plain_win.rs::STATEMENT", Some("with j as ( select jobs.id from jobs where jobs.owner_id = $4")),
    ("queue.rs::claim_of_owner", Some("version_read = (select jobs.version from jobs where jobs.id = attempts.job_id and jobs.owner_id = $")),
    ("queue.rs::insert_started_attempt", Some("timeout_at, sent_at) values")),
    ("queue.rs::renew_lease", Some("update attempts set lease_expires_at = $1 where")),
    // Its PostgreSQL branch reads candidates and hands each owner's to
    // `prune_owners_jobs`; its own deletes are SQLite's.
    ("retention.rs::prune_finished_jobs", None),
    ("retention.rs::prune_log", Some("delete from race_log where owner_id = $1 and id = any($2)")),
    ("retention.rs::prune_owners_jobs", Some("with doomed as ( select j.id, j.owner_id from jobs j where j.owner_id = $1")),
    // The multi-row inserts of a batch's jobs and attempts.
    ("sqlite_batch.rs::walk_ast", None),
    ("stream_chunks.rs::append", Some("insert into stream_chunks (")),
    ("stream_chunks.rs::clear", Some("delete from stream_chunks where")),
    ("transitions.rs::fail_job", Some("update jobs set status = $1, failure_kind = $2, failure_reason = $3, failure_detail = $4")),
    ("transitions.rs::insert_waiting_attempt", Some("insert into attempts (id, job_id, owner_id, number, provider, state, outcome,")),
    ("transitions.rs::refresh_job_status", Some("update jobs set status = $1, updated_at = $2 where (((jobs.id = $3)")),
    ("transitions.rs::transition_guarded", Some("update attempts set state = $1, finished_at = $2, lease_expires_at = $3, error_kind = $4, error = $5, error_detail = $6 where (((attempts.id = $7)")),
    ("webhooks.rs::claim_of_owner", Some("update webhook_events set lease_owner = $1, lease_expires_at = $2, attempts =")),
    ("webhooks.rs::create_endpoint", Some("insert into webhook_endpoints (")),
    ("webhooks.rs::delete_endpoint", Some("delete from webhook_endpoints where")),
    ("webhooks.rs::insert_subscriptions", Some("insert into webhook_subscriptions (owner_id, endpoint_id, kind)")),
    ("webhooks.rs::record_delivery", Some("insert into webhook_deliveries (")),
    ("webhooks.rs::record_event", Some("insert into webhook_events (")),
    ("webhooks.rs::replace_subscriptions", Some("delete from webhook_subscriptions where")),
    ("webhooks.rs::resend", Some("update webhook_events set state = $1, delivered_at = $2, next_attempt_at = $3, window_start_at")),
    ("webhooks.rs::rotate_secret", Some("update webhook_endpoints set generation = $1")),
    ("webhooks.rs::update_endpoint", Some("update webhook_endpoints set url = $1")),
    ("webhooks.rs::write_event", Some("update webhook_events set state = $1, delivered_at = $2, lease_owner = $3, lease_expires_at = $4 where")),
];

/// Every item of `src/store` (a function, or a `static` holding SQL) whose
/// body writes a distributed table (`diesel::update/insert_into/delete` on
/// one, or SQL that inserts into, updates or deletes from one), as
/// `file.rs::name`.
fn store_writers() -> BTreeSet<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store");
    let mut writers = BTreeSet::new();
    for entry in std::fs::read_dir(&root).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        if !file.ends_with(".rs") || ["schema.rs", "distribution.rs"].contains(&file.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text.split("\n#[cfg(test)]").next().unwrap();
        let mut item = String::new();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if let Some(name) = item_name(line) {
                item = name;
            }
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            let window = lines[i..lines.len().min(i + 3)].join(" ");
            if writes_distributed(line) || diesel_write_on_distributed(&window, line) {
                writers.insert(format!("{file}::{item}"));
            }
        }
    }
    writers
}

/// The name of the item a line opens: a function at the top or in an
/// `impl` (four spaces in), or a top-level `static` or `const`.
fn item_name(line: &str) -> Option<String> {
    let indent = line.len() - line.trim_start().len();
    let mut rest = line.trim_start();
    for visibility in ["pub(crate) ", "pub(super) ", "pub "] {
        rest = rest.strip_prefix(visibility).unwrap_or(rest);
    }
    let name = if let Some(r) = rest.strip_prefix("fn ") {
        (indent <= 4).then_some(r)?
    } else {
        let r = rest
            .strip_prefix("static ")
            .or_else(|| rest.strip_prefix("const "))?;
        (indent == 0).then_some(r)?
    };
    Some(
        name.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect(),
    )
}

/// SQL text on `line` that writes a distributed table (or a table named
/// by a placeholder, `{table}`).
fn writes_distributed(line: &str) -> bool {
    ["INSERT INTO ", "UPDATE ", "DELETE FROM "]
        .iter()
        .any(|verb| {
            line.match_indices(verb).any(|(at, _)| {
                let table: String = line[at + verb.len()..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '{')
                    .collect();
                table.starts_with('{') || onejob::store::distribution::LAYOUT.is_distributed(&table)
            })
        })
}

/// A diesel write that starts on `line` and names a distributed table in
/// `window` (the statement may wrap).
fn diesel_write_on_distributed(window: &str, line: &str) -> bool {
    ["diesel::update(", "diesel::insert_into(", "diesel::delete("]
        .iter()
        .any(|call| {
            line.contains(call)
                && window.split(call).nth(1).is_some_and(|after| {
                    let after = after.trim_start().trim_start_matches("t::");
                    let table: String = after
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    onejob::store::distribution::LAYOUT.is_distributed(&table)
                })
        })
}

/// What keeps every store function that writes an owner's table from
/// having sent its statement in the recorded lifecycle (so that the rule
/// judged it), or the list of them from being whole.
fn unexercised_writers(sent: &[Sent]) -> Vec<String> {
    let found = store_writers();
    let listed: BTreeSet<String> = WRITERS.iter().map(|(name, _)| (*name).to_owned()).collect();
    let unlisted: Vec<&String> = found.difference(&listed).collect();
    let gone: Vec<&String> = listed.difference(&found).collect();
    let statements: Vec<String> = sent
        .iter()
        .map(|s| distribution::normalize(&s.sql))
        .collect();
    if std::env::var_os("ONEJOB_DUMP_WRITES").is_some() {
        let writes: BTreeSet<&String> = statements
            .iter()
            .filter(|s| {
                ["insert", "update", "delete", "with"]
                    .iter()
                    .any(|w| s.starts_with(w))
            })
            .collect();
        for write in writes {
            eprintln!("WRITE: {write}");
        }
    }
    let unsent: Vec<&str> = WRITERS
        .iter()
        .filter_map(|(name, marker)| {
            let marker = (*marker)?;
            (!statements.iter().any(|s| s.contains(marker))).then_some(*name)
        })
        .collect();
    let mut problems = Vec::new();
    if !unlisted.is_empty() {
        problems.push(format!("store writers not listed in WRITERS: {unlisted:?}"));
    }
    if !gone.is_empty() {
        problems.push(format!("in WRITERS but no longer in src/store: {gone:?}"));
    }
    if !unsent.is_empty() {
        problems.push(format!("store writers the lifecycle never ran: {unsent:?}"));
    }
    problems
}

/// Judges every statement, and every transaction; returns each that
/// breaks the rule.
fn judge_all(sent: Vec<Sent>) -> Vec<String> {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut refused: BTreeMap<String, (distribution::Breach, usize)> = BTreeMap::new();
    for statement in &sent {
        let verdict = distribution::judge(&statement.sql);
        let label = match &verdict {
            Verdict::Unrelated => "other tables".to_owned(),
            Verdict::Routed => "routed to one owner's shard".to_owned(),
            Verdict::Insert => "inserts".to_owned(),
            Verdict::FanOut(purpose) => format!("fan-out read: {purpose}"),
            Verdict::Refused(breach) => {
                let sql = distribution::normalize(&statement.sql);
                refused.entry(sql).or_insert((*breach, 0)).1 += 1;
                "refused".to_owned()
            }
        };
        *counts.entry(label).or_default() += 1;
    }
    let transactions = distribution::judge_transactions(&sent);
    let mut figures = format!(
        "statement rule: {} statements recorded; {} transactions on owner tables, \
         {} of them across owners unlisted\n",
        sent.len(),
        transactions.touching,
        transactions.mixed.len()
    );
    for (label, n) in &counts {
        figures.push_str(&format!("  {n:>6}  {label}\n"));
    }
    for (purpose, n) in &transactions.allowed {
        figures.push_str(&format!(
            "  {n:>6}  transactions across owners: {purpose}\n"
        ));
    }
    eprintln!("{figures}");
    record_figures("statement-rule", &figures);
    let mut report: Vec<String> = refused
        .iter()
        .map(|(sql, (breach, n))| format!("{breach} ({n}×):\n    {sql}"))
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    for transaction in transactions.mixed {
        // One report per shape of transaction.
        if seen.insert(transaction.statements.clone()) {
            report.push(format!(
                "a transaction touches {} owners ({}):\n    {}",
                transaction.owners.len(),
                transaction
                    .owners
                    .iter()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
                transaction.statements.join("\n    ")
            ));
        }
    }
    report
}

/// Every migration alters a distributed table one subcommand at a time,
/// except those that ran before a database could be distributed:
/// `onejob citus distribute` refuses a database with migrations pending.
#[test]
fn migrations_alter_distributed_tables_one_subcommand_at_a_time() {
    /// Written before the conversion existed; never run on Citus.
    const BEFORE_DISTRIBUTION: &[&str] = &["2026-11-30-000006_distribution_column"];
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/postgres");
    let mut checked = 0;
    let mut offending = Vec::new();
    for entry in std::fs::read_dir(&root).unwrap() {
        let dir = entry.unwrap().path();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let up = std::fs::read_to_string(dir.join("up.sql")).unwrap();
        for statement in sql_statements(&up) {
            checked += 1;
            if distribution::alters_with_several_subcommands(&statement)
                && !BEFORE_DISTRIBUTION.contains(&name.as_str())
            {
                offending.push(format!("{name}: {statement}"));
            }
        }
    }
    assert!(checked > 0);
    assert!(
        offending.is_empty(),
        "one subcommand per ALTER TABLE on a distributed table:\n{}",
        offending.join("\n")
    );
    // The check itself bites: the grandfathered migration breaks it.
    let old = std::fs::read_to_string(root.join(BEFORE_DISTRIBUTION[0]).join("up.sql")).unwrap();
    assert!(sql_statements(&old)
        .iter()
        .any(|s| distribution::alters_with_several_subcommands(s)));
}

/// The statements of a migration file (comments dropped, split on `;`).
fn sql_statements(file: &str) -> Vec<String> {
    let text: String = file
        .lines()
        .map(|line| line.split("--").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    text.split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `onejob citus distribute` refuses a server without Citus before it
/// touches the database (not even the migrations run), and SQLite.
#[tokio::test]
async fn citus_distribute_refuses_a_server_without_citus_and_changes_nothing() {
    if !postgres_available() {
        return;
    }
    let db = crate::support::harness::TestDb::create_empty(TestBackend::Postgres);
    let run = |url: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_onejob"))
            .args(["citus", "distribute", "--worker", "127.0.0.1:9701"])
            .env("DATABASE_URL", url)
            .output()
            .unwrap()
    };
    let refused = run(db.url.as_str());
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("the Citus extension is not installed"),
        "{said}"
    );
    let tables: i64 = {
        use diesel::prelude::*;
        let mut conn = diesel::PgConnection::establish(db.url.as_str()).unwrap();
        diesel::dsl::sql::<diesel::sql_types::BigInt>(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'",
        )
        .get_result(&mut conn)
        .unwrap()
    };
    assert_eq!(tables, 0, "nothing was migrated");
    let dir = tempfile::tempdir().unwrap();
    let sqlite = run(dir.path().join("x.db").to_str().unwrap());
    assert!(String::from_utf8_lossy(&sqlite.stderr).contains("Citus runs on PostgreSQL"));
}
