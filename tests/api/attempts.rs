//! Attempts: unknown is not failed, the first result back wins, definite
//! failures fail over, and a dead process's attempt is never re-sent.

use std::time::Duration;

use onejob::domain::JsonText;
use onejob::store::{console, jobs as job_store, queue};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{
    assert_problem, spawn_app, spawn_app_with, summarize, test_config, PreparedApp, TestBackend,
};

const WAIT: Duration = Duration::from_secs(15);

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

async fn reverse_order_the_late_primary_loses_to_the_fallback_and_is_race_logged(
    backend: TestBackend,
) {
    // sim-slow answers after 1500 ms but its soft timeout is 300 ms.
    let app = spawn_app(backend).await;
    let mut body = summarize("race me");
    body["provider"] = "sim-slow".into();
    let job_id = app.create_job(&app.alice.token, "reverse", &body).await;

    let job = app.wait_for_status(&job_id, "unknown", WAIT).await;
    let first = attempt_id(&job, 0);
    assert_eq!(attempt(&job, 0)["provider"], "sim-slow");
    let response = app
        .abandon(&app.sue.token, &first, "fall back to the fast provider")
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let response = app.start_attempt(&app.alice.token, &job_id, None).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let second: Value = response.json().await.unwrap();
    assert_eq!(second["provider"], "sim-fast");

    let won = app.wait_for_status(&job_id, "succeeded", WAIT).await;
    assert_eq!(won["completed_by"], second["id"]);
    assert_eq!(won["result"]["provider"], "sim-fast");
    assert_eq!(won["version"], 1);

    // The primary's late answer arrives and loses.
    let job = app
        .wait_for_job(&job_id, WAIT, |j| j["attempts"][0]["outcome"] == "lost")
        .await;
    assert_eq!(attempt(&job, 0)["state"], "succeeded");
    assert_eq!(attempt(&job, 1)["outcome"], "won");
    assert_eq!(
        job["result"], won["result"],
        "the job's result is untouched"
    );
    assert_eq!(job["completed_by"], second["id"]);
    assert_eq!(job["version"], 1);

    let response = app.get(&app.sue.token, "/api/v1/admin/races").await;
    assert_problem(response, StatusCode::FORBIDDEN, "forbidden").await;
    let races: Value = app
        .get(&app.ada.token, "/api/v1/admin/races")
        .await
        .json()
        .await
        .unwrap();
    let races = races.as_array().unwrap();
    assert_eq!(races.len(), 1);
    let race = &races[0];
    assert_eq!(race["job_id"], job_id.as_str());
    assert_eq!(race["losing_attempt_id"], first.as_str());
    assert_eq!(race["winning_attempt_id"], second["id"]);
    assert_eq!(race["provider"], "sim-slow");
    assert_eq!(race["version_read"], 0);
    assert_eq!(race["version_found"], 1);
    assert_eq!(race["payload_sha256"].as_str().unwrap().len(), 64);
    assert!(race["reason"]
        .as_str()
        .unwrap()
        .contains("already completed"));
}

const FIRST_BACK_WINS: &str = r#"
[[providers]]
name = "sim-a"
kind = "simulated"
latency_ms = 1200
timeout_ms = 200
late_result_ms = 20000

[[providers]]
name = "sim-b"
kind = "simulated"
latency_ms = 10
timeout_ms = 20000
script = [{ attempt = 2, latency_ms = 3500 }]

[[tasks]]
name = "summarize"
providers = ["sim-a", "sim-b"]
input_fields = ["text"]

[[tasks.golden]]
input = { text = "golden example" }
"#;

async fn the_first_started_attempt_wins_when_it_returns_first(backend: TestBackend) {
    let app = spawn_app_with(backend, test_config(FIRST_BACK_WINS)).await;
    let job_id = app
        .create_job(&app.alice.token, "mirror", &summarize("mirror"))
        .await;
    let job = app.wait_for_status(&job_id, "unknown", WAIT).await;
    let first = attempt_id(&job, 0);
    assert_eq!(
        app.abandon(&app.sue.token, &first, "try sim-b")
            .await
            .status(),
        StatusCode::OK
    );
    let response = app
        .start_attempt(&app.sue.token, &job_id, Some(json!({"provider": "sim-b"})))
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let second: Value = response.json().await.unwrap();

    // sim-a's late answer (1.2 s) comes back before sim-b's (3.5 s): it wins,
    // though it was abandoned and started first.
    let job = app.wait_for_status(&job_id, "succeeded", WAIT).await;
    assert_eq!(job["completed_by"], first.as_str());
    assert_eq!(job["result"]["provider"], "sim-a");
    assert_eq!(attempt(&job, 0)["outcome"], "won");

    let job = app
        .wait_for_job(&job_id, WAIT, |j| j["attempts"][1]["outcome"] == "lost")
        .await;
    assert_eq!(
        job["result"]["provider"], "sim-a",
        "the later answer changed nothing"
    );
    let races: Value = app
        .get(&app.ada.token, "/api/v1/admin/races")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(races[0]["losing_attempt_id"], second["id"]);
    assert_eq!(races[0]["winning_attempt_id"], first.as_str());
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

async fn a_running_attempt_whose_process_died_becomes_unknown_and_is_not_resent(
    backend: TestBackend,
) {
    let prepared =
        PreparedApp::new(backend, test_config(crate::helpers::DEFAULT_TEST_PROVIDERS)).await;
    // Another process created the job, claimed its attempt with a short lease,
    // and died before reporting anything.
    let owner = prepared.alice.id.clone();
    let (job_id, attempt_id) = prepared
        .with_conn(move |conn| {
            let new = job_store::NewJob {
                owner_id: owner,
                key: onejob::domain::IdempotencyKey::parse("dead-process").unwrap(),
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
            let claim = queue::claim_next(conn, "a-process-that-died", 200, &|_| 3000)
                .unwrap()
                .expect("the queued attempt is claimed");
            (job.id, claim.attempt.id)
        })
        .await;

    let app = prepared.start().await;
    let job = app.wait_for_status(&job_id, "unknown", WAIT).await;
    assert_eq!(attempt(&job, 0)["id"], attempt_id.as_str());
    assert_eq!(attempt(&job, 0)["state"], "unknown");
    assert!(attempt(&job, 0)["error"]
        .as_str()
        .unwrap()
        .contains("lease expired"));

    // Give the live workers time to (wrongly) pick it up, then check they did not.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        app.sent("sim-fast").is_empty(),
        "the attempt must never be re-sent: {:?}",
        app.sent("sim-fast")
    );
    assert!(app.sent("sim-slow").is_empty());
    let job = app.get_job(&app.alice.token, &job_id).await;
    assert_eq!(
        job["attempts"].as_array().unwrap().len(),
        1,
        "and no new attempt was started"
    );
    assert_eq!(job["status"], "unknown");
}

on_both_backends!(
    a_timeout_makes_the_attempt_unknown_and_blocks_new_attempts_until_support_abandons_it,
    reverse_order_the_late_primary_loses_to_the_fallback_and_is_race_logged,
    the_first_started_attempt_wins_when_it_returns_first,
    a_definite_failure_fails_over_to_the_next_provider_automatically,
    an_exhausted_chain_fails_the_job,
    a_running_attempt_whose_process_died_becomes_unknown_and_is_not_resent,
);
