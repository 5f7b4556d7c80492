//! Late answers and the compare-and-swap (docs/design.md, "First result
//! wins"), against real HTTP fake providers. Every race is ordered by the
//! test, not the clock: the provider holds the request, the test waits until
//! the soft timeout has made the attempt `unknown` (however slow the
//! machine), acts, and only then releases the answer.
//!
//! Covered: a late answer wins when nothing else did; it loses to a
//! qualified fallback and goes to the race log; a late failure of an
//! abandoned attempt is recorded and starts no failover; a late success after
//! support failed the job goes to the race log and the job stays failed.

use onejob::domain::{canonical_json, sha256_hex, AttemptState, JobId, JobStatus, RaceResult};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::db::stored;
use crate::support::fake_provider::{
    config_of, strict_task_toml, Behaviour, FakeProvider, ProviderToml, Shape, WAIT,
};
use crate::support::harness::{spawn_app_with, summarize, TestApp, TestBackend};

/// An OpenAI-compatible provider entry: a 400 ms soft timeout (a held
/// request always runs past it) and a late-result window far longer than
/// any test, so that the window never closes before the test releases the
/// answer.
fn held_provider(name: &str, base_url: &str) -> String {
    ProviderToml::openai(name, base_url)
        .late_result_ms(120_000)
        .toml()
}

/// Creates a job whose first attempt the provider holds, and waits until
/// the soft timeout has made it `unknown` while held. Returns the job id
/// and the attempt id.
async fn held_until_unknown(app: &TestApp, fake: &FakeProvider, key: &str) -> (String, String) {
    fake.push(Behaviour::Hold);
    let job_id = app.create_job(&app.alice.token, key, &summarize(key)).await;
    let attempt_id = fake.wait_held_count(1).await.remove(0);
    let job = app.wait_for_status(&job_id, "unknown", WAIT).await;
    assert_eq!(job["attempts"][0]["id"], attempt_id.as_str());
    assert_eq!(job["attempts"][0]["state"], "unknown");
    let before = stored(app, &job_id).await;
    assert_eq!(before.attempts.len(), 1);
    assert_eq!(before.attempts[0].state, AttemptState::Unknown);
    let error = before.attempts[0].error.as_deref().unwrap();
    assert!(
        error.contains("no answer within the soft timeout of 400 ms"),
        "{error}"
    );
    assert_eq!(before.job.status, JobStatus::Unknown);
    assert_eq!((before.job.version, before.job.result), (0, None));
    (job_id, attempt_id)
}

async fn a_late_answer_after_the_soft_timeout_wins_the_cas(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        held_provider("fake", &fake.base_url),
        strict_task_toml("summarize", &["fake"], "Summarize: {{ text }}"),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    let (job_id, attempt_id) = held_until_unknown(&app, &fake, "late").await;

    fake.release(
        &attempt_id,
        Behaviour::Answer(json!({"summary": "late but first"})),
    );
    let job = app.wait_for_status(&job_id, "succeeded", WAIT).await;
    assert_eq!(job["attempts"][0]["outcome"], "won");
    assert_eq!(job["result"]["summary"], "late but first");
    assert_eq!(fake.requests_for(&attempt_id), 1, "sent once, never again");

    let after = stored(&app, &job_id).await;
    assert_eq!(after.attempts.len(), 1, "no second attempt");
    let attempt = &after.attempts[0];
    assert_eq!(attempt.id.as_str(), attempt_id);
    assert_eq!(
        (attempt.state, attempt.outcome),
        (AttemptState::Succeeded, Some(RaceResult::Won))
    );
    assert_eq!(after.job.status, JobStatus::Succeeded);
    assert_eq!(after.job.completed_by.as_ref(), Some(&attempt.id));
    assert_eq!(after.job.version, 1, "the CAS moved the version once");
    assert_eq!(
        after.job.result.map(|r| r.value()),
        Some(json!({"summary": "late but first"}))
    );
    assert!(after.races.is_empty(), "{:?}", after.races);
}

async fn a_late_answer_loses_to_a_qualified_fallback_and_is_race_logged(backend: TestBackend) {
    let slow = FakeProvider::start(Shape::OpenAi).await;
    let fast = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        held_provider("slow", &slow.base_url),
        held_provider("fast", &fast.base_url),
        strict_task_toml("summarize", &["slow", "fast"], "Summarize: {{ text }}"),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    let report = app.app.qualify(None, "fast", "summarize").await.unwrap();
    assert!(report.passed(), "{:?}", report.checks);
    let (job_id, first) = held_until_unknown(&app, &slow, "race").await;
    assert_eq!(
        app.abandon(&app.sue.token, &first, "slow provider")
            .await
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        app.start_attempt(&app.alice.token, &job_id, None)
            .await
            .status(),
        StatusCode::CREATED
    );
    let won = app.wait_for_status(&job_id, "succeeded", WAIT).await;
    assert_eq!(won["result"]["summary"], "fake summary");
    let second = won["attempts"][1]["id"].as_str().unwrap().to_owned();
    assert_eq!(won["attempts"][1]["provider"], "fast");

    // The fallback has won; now the held answer comes back.
    slow.release(&first, Behaviour::Answer(json!({"summary": "too late"})));
    let job = app
        .wait_for_job(&job_id, WAIT, |j| j["attempts"][0]["outcome"] == "lost")
        .await;
    assert_eq!(
        job["result"], won["result"],
        "the late answer changed nothing"
    );
    let races: Value = app
        .get(&app.ada.token, "/api/v1/admin/races")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(races[0]["losing_attempt_id"], first.as_str());
    assert_eq!(races[0]["provider"], "slow");

    let after = stored(&app, &job_id).await;
    assert_eq!(after.attempts.len(), 2);
    let (loser, winner) = (&after.attempts[0], &after.attempts[1]);
    assert_eq!(
        (loser.id.as_str(), loser.state, loser.outcome),
        (
            first.as_str(),
            AttemptState::Succeeded,
            Some(RaceResult::Lost)
        )
    );
    assert_eq!(
        (winner.id.as_str(), winner.state, winner.outcome),
        (
            second.as_str(),
            AttemptState::Succeeded,
            Some(RaceResult::Won)
        )
    );
    assert_eq!(after.job.status, JobStatus::Succeeded);
    assert_eq!(after.job.completed_by.as_ref(), Some(&winner.id));
    assert_eq!(after.job.version, 1, "only the winner moved the version");
    assert_eq!(
        after.job.result.map(|r| r.value()),
        Some(json!({"summary": "fake summary"}))
    );
    assert_eq!(after.races.len(), 1, "{:?}", after.races);
    let race = &after.races[0];
    assert_eq!(race.losing_attempt_id, loser.id);
    assert_eq!(race.winning_attempt_id.as_ref(), Some(&winner.id));
    assert_eq!(race.provider, "slow");
    assert_eq!((race.version_read, race.version_found), (0, 1));
    assert_eq!(race.loser_started_at, loser.started_at);
    assert_eq!(
        race.payload_sha256,
        sha256_hex(canonical_json(&json!({"summary": "too late"})).as_bytes()),
        "the discarded payload's digest"
    );
    assert!(
        race.reason.contains("had already completed"),
        "{}",
        race.reason
    );
    assert_eq!(
        after.audit,
        vec![(
            "abandon_attempt".to_owned(),
            Some(first.clone()),
            "slow provider".to_owned()
        )]
    );
    assert_eq!(slow.requests_for(&first), 1);
    assert_eq!(fast.requests_for(&second), 1);
}

async fn a_late_failure_of_an_abandoned_attempt_is_recorded_and_starts_no_failover(
    backend: TestBackend,
) {
    let slow = FakeProvider::start(Shape::OpenAi).await;
    let fast = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        held_provider("slow", &slow.base_url),
        held_provider("fast", &fast.base_url),
        strict_task_toml("summarize", &["slow", "fast"], "Summarize: {{ text }}"),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    // A qualified fallback exists: only the rule, not a closed gate, keeps
    // the late failure from failing over.
    let report = app.app.qualify(None, "fast", "summarize").await.unwrap();
    assert!(report.passed(), "{:?}", report.checks);
    let fast_before = fast.total_requests();
    let (job_id, attempt_id) = held_until_unknown(&app, &slow, "late-failure").await;
    assert_eq!(
        app.abandon(&app.sue.token, &attempt_id, "provider is not answering")
            .await
            .status(),
        StatusCode::OK
    );
    let abandoned = stored(&app, &job_id).await;
    assert_eq!(abandoned.attempts[0].state, AttemptState::Abandoned);
    assert_eq!(abandoned.job.status, JobStatus::Pending);

    slow.release(
        &attempt_id,
        Behaviour::Status {
            status: 400,
            retry_after: None,
            body: r#"{"error":"bad request"}"#.into(),
        },
    );
    app.wait_for_job(&job_id, WAIT, |j| j["attempts"][0]["state"] == "failed")
        .await;

    // The failure and any failover are one transaction: what is stored now is final.
    let after = stored(&app, &job_id).await;
    assert_eq!(after.attempts.len(), 1, "no failover: {:?}", after.attempts);
    let attempt = &after.attempts[0];
    assert_eq!(attempt.state, AttemptState::Failed);
    assert_eq!(attempt.outcome, None);
    let error = attempt.reason().unwrap().for_staff();
    assert!(
        error.contains("refused the request with 400") && error.contains("bad request"),
        "{error}"
    );
    assert_eq!(
        after.job.status,
        JobStatus::Pending,
        "the job is not failed"
    );
    assert_eq!(after.job.failure_reason, None);
    assert_eq!((after.job.version, after.job.completed_by), (0, None));
    assert!(after.races.is_empty());
    assert_eq!(
        after.audit,
        vec![(
            "abandon_attempt".to_owned(),
            Some(attempt_id.clone()),
            "provider is not answering".to_owned()
        )]
    );
    assert_eq!(
        fast.total_requests(),
        fast_before,
        "nothing went to the fallback"
    );

    // What follows is support's decision: the job still takes a new attempt.
    assert_eq!(
        app.start_attempt(&app.sue.token, &job_id, None)
            .await
            .status(),
        StatusCode::CREATED
    );
    let job = app.wait_for_status(&job_id, "succeeded", WAIT).await;
    assert_eq!(job["attempts"][1]["provider"], "fast");
}

async fn a_late_success_after_support_failed_the_job_is_race_logged_and_the_job_stays_failed(
    backend: TestBackend,
) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        held_provider("slow", &fake.base_url),
        strict_task_toml("summarize", &["slow"], "Summarize: {{ text }}"),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    let (job_id, attempt_id) = held_until_unknown(&app, &fake, "late-success").await;
    assert_eq!(
        app.abandon(&app.sue.token, &attempt_id, "provider is not answering")
            .await
            .status(),
        StatusCode::OK
    );
    let sue = app
        .with_conn(|conn| onejob::store::users::find_by_name(conn, "sue"))
        .await
        .unwrap()
        .unwrap();
    let failed = app
        .app
        .fail_job(
            &sue,
            &JobId::parse(&job_id).unwrap(),
            "the provider lost the request",
        )
        .await
        .unwrap();
    assert_eq!(failed.status, JobStatus::Failed);

    fake.release(
        &attempt_id,
        Behaviour::Answer(json!({"summary": "after the job failed"})),
    );
    let job = app
        .wait_for_job(&job_id, WAIT, |j| j["attempts"][0]["outcome"] == "lost")
        .await;
    assert_eq!(job["status"], "failed");
    assert!(job["result"].is_null(), "{job:#}");

    let after = stored(&app, &job_id).await;
    assert_eq!(after.job.status, JobStatus::Failed, "the job stays failed");
    assert_eq!((after.job.result, after.job.completed_by), (None, None));
    assert_eq!(after.job.version, 1, "only the failing moved the version");
    assert_eq!(
        after.job.failure_reason.as_deref(),
        Some("marked failed by support: the provider lost the request")
    );
    assert_eq!(after.attempts.len(), 1);
    let attempt = &after.attempts[0];
    assert_eq!(
        (attempt.state, attempt.outcome),
        (AttemptState::Succeeded, Some(RaceResult::Lost))
    );
    assert_eq!(after.races.len(), 1, "{:?}", after.races);
    let race = &after.races[0];
    assert_eq!(race.losing_attempt_id, attempt.id);
    assert_eq!(race.winning_attempt_id, None, "nothing won");
    assert!(race.reason.contains("failed"), "{}", race.reason);
    assert_eq!((race.version_read, race.version_found), (0, 1));
    assert_eq!(race.provider, "slow");
    assert_eq!(
        race.payload_sha256,
        sha256_hex(canonical_json(&json!({"summary": "after the job failed"})).as_bytes())
    );
    assert_eq!(
        after.audit,
        vec![
            (
                "abandon_attempt".to_owned(),
                Some(attempt_id.clone()),
                "provider is not answering".to_owned()
            ),
            (
                "fail_job".to_owned(),
                None,
                "the provider lost the request".to_owned()
            ),
        ]
    );
}

on_both_backends!(
    a_late_answer_after_the_soft_timeout_wins_the_cas,
    a_late_answer_loses_to_a_qualified_fallback_and_is_race_logged,
    a_late_failure_of_an_abandoned_attempt_is_recorded_and_starts_no_failover,
    a_late_success_after_support_failed_the_job_is_race_logged_and_the_job_stays_failed,
);
