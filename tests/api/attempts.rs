//! Attempts: unknown is not failed, the first result back wins, definite
//! failures fail over, and a dead process's attempt is never re-sent.

use diesel::prelude::*;
use onejob::app::RaceEntry;
use onejob::domain::{AttemptState, JobId, JsonText};
use onejob::store::schema::race_log;
use onejob::store::{console, jobs as job_store, queue};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::db::attempts_of;
use crate::support::fake_provider::{
    answer, config_of, strict_task_toml, Behaviour, FakeProvider, ProviderToml, Shape, WAIT,
};
use crate::support::harness::{
    assert_problem, spawn_app_with, summarize, test_config, PreparedApp, TestApp, TestBackend,
};

fn attempt(job: &Value, index: usize) -> &Value {
    &job["attempts"][index]
}

fn attempt_id(job: &Value, index: usize) -> String {
    attempt(job, index)["id"].as_str().unwrap().to_owned()
}

pub const HANGING_PRIMARY: &str = r#"
[[providers]]
name = "sim-hang"
kind = "simulated"
fail = "timeout-forever"
timeout_ms = 200
late_result_ms = 60000

[[providers]]
name = "sim-fast"
kind = "simulated"
latency_ms = 20

[[tasks]]
name = "summarize"
providers = ["sim-hang", "sim-fast"]
input_fields = ["text"]

[[tasks.golden]]
input = { text = "golden example" }
"#;

async fn a_timeout_makes_the_attempt_unknown_and_blocks_new_attempts_until_support_abandons_it(
    backend: TestBackend,
) {
    let app = spawn_app_with(backend, test_config(HANGING_PRIMARY)).await;
    let job_id = app
        .create_job(&app.alice.token, "timeout", &summarize("slow"))
        .await;

    let job = app.wait_for_status(&job_id, "unknown", WAIT).await;
    assert_eq!(
        attempt(&job, 0)["state"],
        "unknown",
        "a timeout is unknown, never failed"
    );
    assert!(job["failure_reason"].is_null());
    assert_eq!(
        job["attempts"].as_array().unwrap().len(),
        1,
        "no automatic failover after a timeout"
    );
    let first = attempt_id(&job, 0);

    // The unknown queue shows it to support.
    let queue: Value = app
        .get(&app.sue.token, "/api/v1/admin/unknown")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(queue[0]["attempt_id"], first.as_str());
    assert_eq!(queue[0]["owner"], "alice");
    assert_eq!(queue[0]["provider"], "sim-hang");

    // While it is unknown, nobody may start another attempt.
    for token in [&app.alice.token, &app.sue.token] {
        let response = app.start_attempt(token, &job_id, None).await;
        let problem = assert_problem(response, StatusCode::CONFLICT, "attempt-in-flight").await;
        assert_eq!(problem["attempt_id"], first.as_str());
        assert_eq!(problem["attempt_state"], "unknown");
    }

    // The owner cannot abandon; support can, with a reason.
    let response = app.abandon(&app.alice.token, &first, "impatient").await;
    assert_problem(response, StatusCode::FORBIDDEN, "forbidden").await;
    let response = app.abandon(&app.sue.token, &first, "   ").await;
    assert_problem(response, StatusCode::UNPROCESSABLE_ENTITY, "invalid-body").await;
    let response = app
        .abandon(
            &app.sue.token,
            &first,
            "provider status page shows an outage",
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let abandoned: Value = response.json().await.unwrap();
    assert_eq!(abandoned["state"], "abandoned");

    let entries = app
        .with_conn(|conn| console::audit_entries(conn, 10).unwrap())
        .await;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].actor, "sue");
    assert_eq!(entries[0].action, "abandon_attempt");
    assert_eq!(
        entries[0].attempt_id.as_ref().map(|a| a.as_str()),
        Some(first.as_str())
    );
    assert_eq!(entries[0].reason, "provider status page shows an outage");

    // Now a new attempt may start; by default on the next untried provider.
    let response = app.start_attempt(&app.alice.token, &job_id, None).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let second: Value = response.json().await.unwrap();
    assert_eq!(second["provider"], "sim-fast");
    assert_eq!(second["number"], 2);

    let job = app.wait_for_status(&job_id, "succeeded", WAIT).await;
    assert_eq!(job["completed_by"], second["id"]);
    assert_eq!(job["result"]["provider"], "sim-fast");

    let response = app.abandon(&app.sue.token, &first, "again").await;
    assert_problem(response, StatusCode::CONFLICT, "attempt-not-unknown").await;
    let response = app.start_attempt(&app.alice.token, &job_id, None).await;
    assert_problem(response, StatusCode::CONFLICT, "job-finished").await;
}

/// Two fake HTTP providers that hold every answer until the test releases
/// it: the test, not the clock, orders each race. `fast` is qualified, so
/// new attempts and failover may use it.
async fn held_pair(backend: TestBackend) -> (TestApp, FakeProvider, FakeProvider) {
    let slow = FakeProvider::start(Shape::OpenAi).await;
    let fast = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        ProviderToml::openai("slow", &slow.base_url).toml(),
        ProviderToml::openai("fast", &fast.base_url).toml(),
        strict_task_toml("summarize", &["slow", "fast"], "Summarize: {{ text }}"),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    assert!(app
        .app
        .qualify(None, "fast", "summarize")
        .await
        .unwrap()
        .passed());
    slow.set_default(Behaviour::Hold);
    fast.set_default(Behaviour::Hold);
    (app, slow, fast)
}

/// Creates a job whose first attempt (on `slow`) is held until its soft
/// timeout made it unknown; returns the job and attempt ids.
async fn job_with_an_unknown_attempt(
    app: &TestApp,
    slow: &FakeProvider,
    key: &str,
) -> (String, String) {
    let job_id = app.create_job(&app.alice.token, key, &summarize(key)).await;
    let job = app.wait_for_status(&job_id, "unknown", WAIT).await;
    let first = attempt_id(&job, 0);
    slow.wait_held(&first).await;
    (job_id, first)
}

async fn race_log_rows(app: &TestApp, job_id: &str) -> Vec<RaceEntry> {
    let job_id = JobId::parse(job_id).unwrap();
    app.with_conn(move |conn| {
        race_log::table
            .filter(race_log::job_id.eq(job_id))
            .select(RaceEntry::as_select())
            .load(conn)
            .unwrap()
    })
    .await
}

async fn reverse_order_the_late_primary_loses_to_the_fallback_and_is_race_logged(
    backend: TestBackend,
) {
    let (app, slow, fast) = held_pair(backend).await;
    let (job_id, first) = job_with_an_unknown_attempt(&app, &slow, "reverse").await;
    let response = app
        .abandon(&app.sue.token, &first, "fall back to the fast provider")
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let response = app.start_attempt(&app.alice.token, &job_id, None).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let second: Value = response.json().await.unwrap();
    assert_eq!(second["provider"], "fast");
    let second_id = second["id"].as_str().unwrap().to_owned();

    // The fallback answers first and wins.
    fast.wait_held(&second_id).await;
    fast.release(&second_id, answer("from the fallback"));
    let won = app.wait_for_status(&job_id, "succeeded", WAIT).await;
    assert_eq!(won["completed_by"], second_id.as_str());
    assert_eq!(won["result"]["summary"], "from the fallback");
    assert_eq!(won["version"], 1);

    // Then the primary's late answer arrives, and loses.
    slow.release(&first, answer("too late"));
    let job = app
        .wait_for_job(&job_id, WAIT, |j| j["attempts"][0]["outcome"] == "lost")
        .await;
    assert_eq!(attempt(&job, 0)["state"], "succeeded");
    assert_eq!(attempt(&job, 1)["outcome"], "won");
    assert_eq!(
        job["result"], won["result"],
        "the job's result is untouched"
    );
    assert_eq!(job["completed_by"], second_id.as_str());
    assert_eq!(job["version"], 1);

    let response = app.get(&app.sue.token, "/api/v1/admin/races").await;
    assert_problem(response, StatusCode::FORBIDDEN, "forbidden").await;
    let races = race_log_rows(&app, &job_id).await;
    assert_eq!(races.len(), 1, "{races:?}");
    let race = &races[0];
    assert_eq!(race.losing_attempt_id.as_str(), first);
    assert_eq!(
        race.winning_attempt_id.as_ref().map(|a| a.as_str()),
        Some(second_id.as_str())
    );
    assert_eq!(race.provider, "slow");
    assert_eq!((race.version_read, race.version_found), (0, 1));
    assert_eq!(
        race.payload_sha256,
        onejob::domain::sha256_hex(br#"{"summary":"too late"}"#),
        "the digest is of the discarded answer"
    );
    assert!(race.reason.contains("already completed"), "{}", race.reason);
    // The API shows the same row to admins.
    let listed: Value = app
        .get(&app.ada.token, "/api/v1/admin/races")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed[0]["losing_attempt_id"], first.as_str());
}

async fn the_first_started_attempt_wins_when_it_returns_first(backend: TestBackend) {
    let (app, slow, fast) = held_pair(backend).await;
    let (job_id, first) = job_with_an_unknown_attempt(&app, &slow, "mirror").await;
    assert_eq!(
        app.abandon(&app.sue.token, &first, "try fast")
            .await
            .status(),
        StatusCode::OK
    );
    let response = app
        .start_attempt(&app.sue.token, &job_id, Some(json!({"provider": "fast"})))
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let second: Value = response.json().await.unwrap();
    let second_id = second["id"].as_str().unwrap().to_owned();
    fast.wait_held(&second_id).await;

    // Both are out; the abandoned first attempt answers first: it wins,
    // though it was abandoned and started first.
    slow.release(&first, answer("from the primary"));
    let job = app.wait_for_status(&job_id, "succeeded", WAIT).await;
    assert_eq!(job["completed_by"], first.as_str());
    assert_eq!(job["result"]["summary"], "from the primary");
    assert_eq!(attempt(&job, 0)["outcome"], "won");

    fast.release(&second_id, answer("from the fallback"));
    let job = app
        .wait_for_job(&job_id, WAIT, |j| j["attempts"][1]["outcome"] == "lost")
        .await;
    assert_eq!(
        job["result"]["summary"], "from the primary",
        "the later answer changed nothing"
    );
    let races = race_log_rows(&app, &job_id).await;
    assert_eq!(races.len(), 1);
    assert_eq!(races[0].losing_attempt_id.as_str(), second_id);
    assert_eq!(
        races[0].winning_attempt_id.as_ref().map(|a| a.as_str()),
        Some(first.as_str())
    );
}

async fn simultaneous_new_attempts_on_one_job_make_one_and_the_rest_get_409(backend: TestBackend) {
    let (app, slow, _fast) = held_pair(backend).await;
    let (job_id, first) = job_with_an_unknown_attempt(&app, &slow, "together").await;
    assert_eq!(
        app.abandon(&app.sue.token, &first, "start over")
            .await
            .status(),
        StatusCode::OK
    );
    // Ten requests for a new attempt at the same moment.
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(10));
    let app = std::sync::Arc::new(app);
    let requests: Vec<_> = (0..10)
        .map(|_| {
            let (app, barrier, job_id) = (app.clone(), barrier.clone(), job_id.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let response = app.start_attempt(&app.alice.token, &job_id, None).await;
                let status = response.status();
                (status, response.json::<Value>().await.unwrap())
            })
        })
        .collect();
    let mut created = Vec::new();
    let mut refused = Vec::new();
    for request in requests {
        let (status, body) = request.await.unwrap();
        match status {
            StatusCode::CREATED => created.push(body),
            StatusCode::CONFLICT => refused.push(body),
            other => panic!("unexpected {other}: {body:#}"),
        }
    }
    assert_eq!(created.len(), 1, "exactly one new attempt: {created:#?}");
    assert_eq!(refused.len(), 9);
    for problem in &refused {
        assert_eq!(
            problem["type"], "/problems/attempt-in-flight",
            "{problem:#}"
        );
        assert_eq!(
            problem["attempt_id"], created[0]["id"],
            "names the attempt that won"
        );
    }
    let attempts = attempts_of(&app, &job_id).await;
    assert_eq!(attempts.len(), 2, "one new row: {attempts:?}");
    assert_eq!(
        attempts.iter().filter(|a| a.state.is_live()).count(),
        1,
        "one live attempt"
    );
}

async fn a_late_failure_fails_over_once_while_owners_ask_for_new_attempts(backend: TestBackend) {
    let (app, slow, fast) = held_pair(backend).await;
    let (job_id, first) = job_with_an_unknown_attempt(&app, &slow, "failover-race").await;
    // The unknown attempt's provider refuses after all (a definite failure:
    // failover) at the moment its owner asks for new attempts.
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(6));
    let app = std::sync::Arc::new(app);
    let owners: Vec<_> = (0..5)
        .map(|_| {
            let (app, barrier, job_id) = (app.clone(), barrier.clone(), job_id.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                app.start_attempt(&app.alice.token, &job_id, None)
                    .await
                    .status()
            })
        })
        .collect();
    barrier.wait().await;
    slow.release(
        &first,
        Behaviour::Status {
            status: 400,
            retry_after: None,
            body: "{}".into(),
        },
    );
    let mut statuses = Vec::new();
    for owner in owners {
        statuses.push(owner.await.unwrap());
    }
    let second = app
        .wait_for_job(&job_id, WAIT, |j| {
            j["attempts"].as_array().unwrap().len() == 2
        })
        .await;
    let second_id = attempt_id(&second, 1);
    fast.wait_held(&second_id).await;
    fast.release(&second_id, answer("after failover"));
    let job = app.wait_for_status(&job_id, "succeeded", WAIT).await;
    // Whoever came first, there was never a moment without a live attempt:
    // the failure and its failover are one transaction. Every owner's
    // request was refused, and the job got exactly one new attempt.
    assert!(
        statuses.iter().all(|s| *s == StatusCode::CONFLICT),
        "{statuses:?}"
    );
    let attempts = attempts_of(&app, &job_id).await;
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(attempts[0].state, AttemptState::Failed);
    assert_eq!(attempts[1].provider, "fast");
    assert_eq!(job["result"]["summary"], "after failover");
}

async fn chain_exhausted_when_every_provider_of_the_chain_was_tried(backend: TestBackend) {
    let (app, slow, fast) = held_pair(backend).await;
    let (job_id, first) = job_with_an_unknown_attempt(&app, &slow, "exhaust").await;
    assert_eq!(
        app.abandon(&app.sue.token, &first, "next").await.status(),
        StatusCode::OK
    );
    let response = app.start_attempt(&app.alice.token, &job_id, None).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let second: Value = response.json().await.unwrap();
    let second_id = second["id"].as_str().unwrap().to_owned();
    fast.wait_held(&second_id).await;
    app.wait_for_job(&job_id, WAIT, |j| j["attempts"][1]["state"] == "unknown")
        .await;
    assert_eq!(
        app.abandon(&app.sue.token, &second_id, "next")
            .await
            .status(),
        StatusCode::OK
    );
    let response = app.start_attempt(&app.alice.token, &job_id, None).await;
    let problem = assert_problem(response, StatusCode::CONFLICT, "chain-exhausted").await;
    assert!(problem["detail"].as_str().unwrap().contains("name one"));
    assert_eq!(
        attempts_of(&app, &job_id).await.len(),
        2,
        "nothing was added"
    );
    // Naming a provider is still allowed: the primary takes attempt 3.
    let response = app
        .start_attempt(&app.alice.token, &job_id, Some(json!({"provider": "slow"})))
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let attempts = attempts_of(&app, &job_id).await;
    assert_eq!(attempts.len(), 3);
    assert_eq!(
        (attempts[2].number, attempts[2].provider.as_str()),
        (3, "slow")
    );
}

const BROKEN_PRIMARY: &str = r#"
[[providers]]
name = "sim-broken"
kind = "simulated"
fail = "definite"
latency_ms = 10

# Qualifies (qualification calls are not attempts), then fails a job's attempt 2.
[[providers]]
name = "sim-broken-too"
kind = "simulated"
latency_ms = 10
script = [{ attempt = 2, fail = "definite" }]

[[providers]]
name = "sim-fast"
kind = "simulated"
latency_ms = 10

[[tasks]]
name = "summarize"
providers = ["sim-broken", "sim-fast"]
input_fields = ["text"]

[[tasks.golden]]
input = { text = "golden example" }

[[tasks]]
name = "doomed"
providers = ["sim-broken", "sim-broken-too"]

[[tasks.golden]]
input = {}
"#;

async fn a_definite_failure_fails_over_to_the_next_provider_automatically(backend: TestBackend) {
    let app = spawn_app_with(backend, test_config(BROKEN_PRIMARY)).await;
    let job_id = app
        .create_job(&app.alice.token, "failover", &summarize("x"))
        .await;
    let job = app.wait_for_status(&job_id, "succeeded", WAIT).await;
    let attempts = job["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0]["provider"], "sim-broken");
    assert_eq!(attempts[0]["state"], "failed");
    assert!(attempts[0]["error"].as_str().unwrap().contains("refused"));
    assert_eq!(attempts[1]["provider"], "sim-fast");
    assert_eq!(attempts[1]["outcome"], "won");
    assert_eq!(job["result"]["provider"], "sim-fast");
}

async fn an_exhausted_chain_fails_the_job(backend: TestBackend) {
    let app = spawn_app_with(backend, test_config(BROKEN_PRIMARY)).await;
    let job_id = app
        .create_job(
            &app.alice.token,
            "doomed",
            &json!({"task": "doomed", "input": {}}),
        )
        .await;
    let job = app.wait_for_status(&job_id, "failed", WAIT).await;
    let attempts = job["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2);
    assert!(attempts.iter().all(|a| a["state"] == "failed"));
    let reason = job["failure_reason"].as_str().unwrap();
    assert!(
        reason.contains("sim-broken") && reason.contains("sim-broken-too"),
        "{reason}"
    );
    assert_eq!(
        job["version"], 1,
        "failing the job is an outcome: the version moves"
    );
    assert!(job["result"].is_null() && job["completed_by"].is_null());
    let response = app.start_attempt(&app.alice.token, &job_id, None).await;
    assert_problem(response, StatusCode::CONFLICT, "job-finished").await;
}

/// What another process did before it died: created a job and claimed its
/// attempt with a short lease, and, if `sent`, confirmed the claim and sent
/// it.
async fn claimed_by_a_process_that_died(
    prepared: &PreparedApp,
    key: &'static str,
    sent: bool,
) -> (JobId, onejob::domain::AttemptId) {
    let owner = prepared.alice.id.clone();
    prepared
        .with_conn(move |conn| {
            let new = job_store::NewJob {
                id: onejob::domain::JobId::new(),
                start: None,
                reservation: Default::default(),
                trace_context: None,
                kept_grant: None,
                owner_id: owner,
                key: onejob::domain::IdempotencyKey::parse(key).unwrap(),
                task: "summarize".into(),
                provider: "sim-fast".into(),
                requested_provider: None,
                input: JsonText::from_value(&json!({"text": "orphan"})),
                params: JsonText::from_value(&json!({})),
                fingerprint: "0".repeat(64),
            };
            let job = match job_store::create_job(conn, &new).unwrap() {
                job_store::CreateOutcome::Created(job) => job,
                other => panic!("{other:?}"),
            };
            // Claimed, and, if `sent`, confirmed by the claim and sent.
            let mut admit = |_: &onejob::domain::AttemptId, _: &str| true;
            let claim = queue::claim_batch(
                conn,
                queue::ClaimRules {
                    lease_owner: "a-process-that-died",
                    lease_ms: 300,
                    limit: 1,
                    soft_timeout_ms: &|_| 3000,
                    closed: &[],
                    admit: &mut admit,
                    confirm: sent,
                },
            )
            .unwrap()
            .claims
            .pop()
            .expect("the queued attempt is claimed");
            assert_eq!(claim.attempt.sent_at.is_some(), sent);
            (job.id, claim.attempt.id)
        })
        .await
}

async fn a_sent_attempt_whose_process_died_becomes_unknown_and_is_not_resent(backend: TestBackend) {
    let prepared = PreparedApp::new(
        backend,
        test_config(crate::support::harness::DEFAULT_TEST_PROVIDERS),
    )
    .await;
    let (job_id, attempt_id) =
        claimed_by_a_process_that_died(&prepared, "dead-process", true).await;

    let app = prepared.start().await;
    let job = app.wait_for_status(&job_id, "unknown", WAIT).await;
    assert_eq!(attempt(&job, 0)["id"], attempt_id.as_str());
    assert_eq!(attempt(&job, 0)["state"], "unknown");
    assert!(attempt(&job, 0)["error"]
        .as_str()
        .unwrap()
        .contains("lease expired"));

    // The reaper has run; the live workers were free all along. Nothing
    // was sent again, and no new attempt was started.
    let rows = attempts_of(&app, job_id.as_str()).await;
    assert_eq!(rows.len(), 1, "and no new attempt was started");
    assert_eq!(rows[0].state, AttemptState::Unknown);
    assert!(rows[0].sent_at.is_some());
    assert!(
        app.sent("sim-fast").is_empty(),
        "the attempt must never be re-sent: {:?}",
        app.sent("sim-fast")
    );
    assert!(app.sent("sim-slow").is_empty());
}

async fn a_claimed_attempt_never_sent_by_a_process_that_died_is_requeued_and_sent_once(
    backend: TestBackend,
) {
    let prepared = PreparedApp::new(
        backend,
        test_config(crate::support::harness::DEFAULT_TEST_PROVIDERS),
    )
    .await;
    let (job_id, attempt_id) =
        claimed_by_a_process_that_died(&prepared, "died-before-sending", false).await;
    let app = prepared.start().await;
    let job = app.wait_for_status(&job_id, "succeeded", WAIT).await;
    assert_eq!(
        job["completed_by"],
        attempt_id.as_str(),
        "the same attempt, not a new one"
    );
    let rows = attempts_of(&app, job_id.as_str()).await;
    assert_eq!(rows.len(), 1);
    assert!(rows[0].sent_at.is_some());
    assert_eq!(
        app.sent("sim-fast"),
        vec![attempt_id.to_string()],
        "sent exactly once, by a live process"
    );
}

on_both_backends!(
    a_timeout_makes_the_attempt_unknown_and_blocks_new_attempts_until_support_abandons_it,
    reverse_order_the_late_primary_loses_to_the_fallback_and_is_race_logged,
    the_first_started_attempt_wins_when_it_returns_first,
    simultaneous_new_attempts_on_one_job_make_one_and_the_rest_get_409,
    a_late_failure_fails_over_once_while_owners_ask_for_new_attempts,
    chain_exhausted_when_every_provider_of_the_chain_was_tried,
    a_definite_failure_fails_over_to_the_next_provider_automatically,
    an_exhausted_chain_fails_the_job,
    a_sent_attempt_whose_process_died_becomes_unknown_and_is_not_resent,
    a_claimed_attempt_never_sent_by_a_process_that_died_is_requeued_and_sent_once,
);
