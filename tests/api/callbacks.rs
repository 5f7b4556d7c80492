//! Signed callbacks (`POST /api/v1/callbacks/attempts/{id}`; docs/design.md,
//! "Providers"): a provider that answers asynchronously posts its result or
//! error to a per-attempt URL, signed with that attempt's secret. A bad or
//! misdirected signature, an unknown attempt or a malformed body changes
//! nothing; a good callback is applied like any other outcome, through the
//! compare-and-swap (won, lost and race-logged, failed, or ignored once the
//! attempt is finished).
//!
//! The attempts here go to a provider that never answers (`Hang`), so the
//! soft timeout always makes them `unknown`; only callbacks move them on.

use diesel::prelude::*;
use onejob::config::Config;
use onejob::domain::{
    canonical_json, sha256_hex, AttemptId, AttemptState, CallbackKey, JobStatus, RaceResult, Secret,
};
use onejob::store::schema::attempts;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::db::stored;
use crate::support::fake_provider::{
    config_of, strict_task_toml, Behaviour, FakeProvider, ProviderToml, Shape, WAIT,
};
use crate::support::harness::{
    assert_problem, spawn_app_with, summarize, TestApp, TestBackend, CALLBACK_KEY,
};
use crate::support::metrics::{answered, metrics};

fn callback_config(fake: &FakeProvider) -> Config {
    let toml = [
        "[server]\npublic_url = \"http://127.0.0.1:9\"\ncallback_secret_env = \"ONEJOB_TEST_CALLBACK_KEY\"\n".to_owned(),
        ProviderToml::openai("async", &fake.base_url).with("callbacks = true").toml(),
        strict_task_toml("summarize", &["async"], "Summarize: {{ text }}"),
    ]
    .concat();
    config_of(&toml)
}

/// The server's callback key.
fn server_key() -> CallbackKey {
    CallbackKey::new(&Secret::new(CALLBACK_KEY))
}

/// Now, in Unix seconds, as a provider signs its callbacks.
fn now_s() -> i64 {
    onejob::domain::Timestamp::now().unix_seconds()
}

/// A timestamp and the signature over it and a body.
type Signed = (i64, String);

/// What the provider would send for `body` to `attempt_id`, signed now.
fn signed(attempt_id: &str, body: &str) -> Option<Signed> {
    Some(signed_at(attempt_id, body, now_s()))
}

fn signed_at(attempt_id: &str, body: &str, at: i64) -> Signed {
    (at, server_key().sign(attempt_id, at, body.as_bytes()))
}

async fn post_callback(
    app: &TestApp,
    attempt_id: &str,
    body: &str,
    signed: Option<Signed>,
) -> reqwest::Response {
    let mut request = app
        .client
        .post(app.url(&format!("/api/v1/callbacks/attempts/{attempt_id}")))
        .header("Content-Type", "application/json")
        .body(body.to_owned());
    if let Some((at, signature)) = signed {
        request = request
            .header("X-Onejob-Timestamp", at.to_string())
            .header("X-Onejob-Signature", signature);
    }
    request.send().await.unwrap()
}

/// Posts a correctly signed callback; asserts 200 and returns its `outcome`.
async fn callback_outcome(app: &TestApp, attempt_id: &str, body: &str) -> String {
    let response = post_callback(app, attempt_id, body, signed(attempt_id, body)).await;
    assert_eq!(response.status(), StatusCode::OK, "callback {body}");
    let outcome: Value = response.json().await.unwrap();
    outcome["outcome"].as_str().unwrap().to_owned()
}

/// Creates a job whose attempt goes to the callback provider, which never
/// answers; waits until the soft timeout has made it unknown. Returns the
/// job id and the attempt id.
async fn job_awaiting_callback(app: &TestApp, fake: &FakeProvider, key: &str) -> (String, String) {
    fake.push(Behaviour::Hang);
    let job_id = app.create_job(&app.alice.token, key, &summarize(key)).await;
    let job = app.wait_for_status(&job_id, "unknown", WAIT).await;
    let attempt_id = job["attempts"][0]["id"].as_str().unwrap().to_owned();
    let now = stored(app, &job_id).await;
    assert_eq!(now.attempts.len(), 1);
    assert_eq!(now.attempts[0].state, AttemptState::Unknown);
    assert_eq!(now.job.status, JobStatus::Unknown);
    (job_id, attempt_id)
}

/// A job awaiting its callback, on its own app.
async fn awaiting_callback(
    backend: TestBackend,
    key: &str,
) -> (FakeProvider, TestApp, String, String) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let app = spawn_app_with(backend, callback_config(&fake)).await;
    let (job_id, attempt_id) = job_awaiting_callback(&app, &fake, key).await;
    (fake, app, job_id, attempt_id)
}

async fn a_callback_with_a_bad_signature_is_401_and_changes_nothing(backend: TestBackend) {
    let (_fake, app, job_id, attempt_id) = awaiting_callback(backend, "cb-bad").await;
    let before = stored(&app, &job_id).await;
    let body = r#"{"result": {"summary": "forged"}}"#;
    let now = now_s();
    let forged = CallbackKey::new(&Secret::new("not the server's key")).sign(
        &attempt_id,
        now,
        body.as_bytes(),
    );
    // Signed for another body: the signature covers the body.
    let other_body = server_key().sign(&attempt_id, now, br#"{"result": {"summary": "real"}}"#);
    // Signed at another time: the signature covers the timestamp.
    let other_time = server_key().sign(&attempt_id, now - 1, body.as_bytes());
    for signed in [
        None,
        Some((now, "sha256=00".to_owned())),
        Some((now, forged)),
        Some((now, other_body)),
        Some((now, other_time)),
    ] {
        let response = post_callback(&app, &attempt_id, body, signed).await;
        assert_problem(response, StatusCode::UNAUTHORIZED, "invalid-signature").await;
    }
    // Signed correctly but without its timestamp: nothing to verify against.
    let (_, signature) = signed_at(&attempt_id, body, now);
    let response = app
        .client
        .post(app.url(&format!("/api/v1/callbacks/attempts/{attempt_id}")))
        .header("Content-Type", "application/json")
        .header("X-Onejob-Signature", signature)
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    assert_problem(response, StatusCode::UNAUTHORIZED, "invalid-signature").await;
    let after = app.get_job(&app.alice.token, &job_id).await;
    assert_eq!(after["status"], "unknown");
    assert!(after["result"].is_null());
    assert_eq!(stored(&app, &job_id).await, before, "nothing changed");
}

async fn a_signed_callback_goes_through_the_cas(backend: TestBackend) {
    let (fake, app, job_id, attempt_id) = awaiting_callback(backend, "cb-ok").await;
    let key = server_key();
    let request = fake.last_request().unwrap();
    assert_eq!(
        request.header("x-onejob-callback-secret"),
        Some(key.attempt_secret(&attempt_id).expose())
    );
    assert_eq!(
        request.header("x-onejob-callback-url"),
        Some(format!("http://127.0.0.1:9/api/v1/callbacks/attempts/{attempt_id}").as_str())
    );
    let body = r#"{"result": {"summary": "called back"}}"#;
    let delivery = signed(&attempt_id, body);
    let response = post_callback(&app, &attempt_id, body, delivery.clone()).await;
    assert_eq!(response.status(), StatusCode::OK);
    let outcome: Value = response.json().await.unwrap();
    assert_eq!(outcome["outcome"], "won");
    let job = app.get_job(&app.alice.token, &job_id).await;
    assert_eq!(job["status"], "succeeded");
    assert_eq!(job["result"]["summary"], "called back");
    let after = stored(&app, &job_id).await;
    assert_eq!(
        (after.attempts[0].state, after.attempts[0].outcome),
        (AttemptState::Succeeded, Some(RaceResult::Won))
    );
    assert_eq!(after.job.completed_by, Some(after.attempts[0].id.clone()));
    assert_eq!(after.job.version, 1);
    assert_eq!(
        after.job.result.as_ref().map(|r| r.value()),
        Some(json!({"summary": "called back"}))
    );
    // The same callback again, as delivered, and once more signed anew:
    // each answers as the first did, and writes nothing.
    for again in [delivery, signed(&attempt_id, body)] {
        let response = post_callback(&app, &attempt_id, body, again).await;
        assert_eq!(response.status(), StatusCode::OK);
        let outcome: Value = response.json().await.unwrap();
        assert_eq!(outcome["outcome"], "won", "answered as the first delivery");
    }
    assert_eq!(
        stored(&app, &job_id).await,
        after,
        "a repeat writes nothing: no race-log row, no change"
    );
    // Another answer for the finished attempt is not a repeat: it is
    // discarded and written to the race log.
    let other = r#"{"result": {"summary": "a second opinion"}}"#;
    assert_eq!(callback_outcome(&app, &attempt_id, other).await, "ignored");
    let later = stored(&app, &job_id).await;
    assert_eq!(later.races.len(), 1, "{:?}", later.races);
    let race = &later.races[0];
    assert_eq!(race.losing_attempt_id, after.attempts[0].id);
    assert_eq!(
        race.reason,
        "a repeated answer: the attempt had already answered"
    );
    assert_eq!(
        race.payload_sha256,
        sha256_hex(canonical_json(&json!({"summary": "a second opinion"})).as_bytes())
    );
    // The metrics name the callback's route by its pattern, never its path.
    let exposition = metrics(&app).await;
    assert_eq!(
        answered(
            &exposition,
            "POST",
            "/api/v1/callbacks/attempts/{id}",
            "200"
        ),
        4,
        "{exposition}"
    );
}

/// Item: signed callbacks expire and repeat harmlessly. A captured callback
/// replayed many times adds nothing after its first delivery, and one
/// signed longer ago than the window is refused and changes nothing.
async fn a_replayed_callback_writes_nothing_new_and_an_old_one_is_refused(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let app = spawn_app_with(backend, callback_config(&fake)).await;
    let (job_id, first) = job_awaiting_callback(&app, &fake, "cb-replay").await;
    assert_eq!(
        app.abandon(&app.sue.token, &first, "try again")
            .await
            .status(),
        StatusCode::OK
    );
    fake.push(Behaviour::Hang);
    let response = app
        .start_attempt(&app.sue.token, &job_id, Some(json!({"provider": "async"})))
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let job = app
        .wait_for_job(&job_id, WAIT, |j| j["attempts"][1]["state"] == "unknown")
        .await;
    let second = job["attempts"][1]["id"].as_str().unwrap().to_owned();
    let winning = r#"{"result": {"summary": "the winner"}}"#;
    assert_eq!(callback_outcome(&app, &second, winning).await, "won");

    // The first attempt's callback loses, once; its replays write nothing.
    let losing = r#"{"result": {"summary": "the loser"}}"#;
    let captured = signed(&first, losing);
    let response = post_callback(&app, &first, losing, captured.clone()).await;
    assert_eq!(response.json::<Value>().await.unwrap()["outcome"], "lost");
    let after = stored(&app, &job_id).await;
    assert_eq!(after.races.len(), 1);
    for _ in 0..5 {
        let response = post_callback(&app, &first, losing, captured.clone()).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.json::<Value>().await.unwrap()["outcome"], "lost");
    }
    assert_eq!(
        stored(&app, &job_id).await,
        after,
        "five replays, nothing new"
    );

    // Signed six minutes ago: refused, whatever it says.
    let old = r#"{"result": {"summary": "from the past"}}"#;
    let stale = signed_at(&second, old, now_s() - 360);
    let response = post_callback(&app, &second, old, Some(stale)).await;
    let problem = assert_problem(response, StatusCode::UNAUTHORIZED, "callback-expired").await;
    assert_eq!(problem["window_seconds"], 300);
    assert!(problem["age_seconds"].as_i64().unwrap() >= 360, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("older than 300 s"),
        "{problem}"
    );
    // And a timestamp far ahead of the server's clock.
    let ahead = signed_at(&second, old, now_s() + 3600);
    let response = post_callback(&app, &second, old, Some(ahead)).await;
    assert_problem(response, StatusCode::UNAUTHORIZED, "callback-expired").await;
    assert_eq!(stored(&app, &job_id).await, after, "nothing changed");
}

async fn a_callback_with_an_error_fails_the_attempt_with_that_error(backend: TestBackend) {
    let (fake, app, job_id, attempt_id) = awaiting_callback(backend, "cb-error").await;
    let body = r#"{"error": "the model refused the input"}"#;
    assert_eq!(callback_outcome(&app, &attempt_id, body).await, "failed");
    let after = stored(&app, &job_id).await;
    assert_eq!(after.attempts.len(), 1, "no other provider in the chain");
    let attempt = &after.attempts[0];
    assert_eq!(attempt.state, AttemptState::Failed);
    assert_eq!(attempt.outcome, None);
    assert_eq!(
        attempt.reason().map(|r| r.for_staff()).as_deref(),
        Some(
            "the provider reported a failure by callback\n— the provider said: \
             the model refused the input"
        ),
        "the owner's summary, then the provider's words for staff"
    );
    // A definite failure with nowhere to fail over to fails the job.
    assert_eq!(after.job.status, JobStatus::Failed);
    assert_eq!((after.job.result, after.job.completed_by), (None, None));
    let reason = after.job.failure_reason.unwrap();
    assert!(
        reason.contains("last error: the provider reported a failure by callback"),
        "{reason}"
    );
    assert!(
        !reason.contains("the model refused the input"),
        "the job's reason is the owner's: {reason}"
    );
    assert!(after.races.is_empty());
    assert_eq!(fake.requests_for(&attempt_id), 1);
}

/// An error callback's text can name internal hosts and accounts, or echo a
/// secret: its owner sees a summary (in the API and on the job page), staff
/// see the provider's words with secrets masked, as for an error answered
/// at once.
async fn a_callback_error_shows_the_owner_only_a_summary(backend: TestBackend) {
    let (_fake, app, job_id, attempt_id) = awaiting_callback(backend, "cb-leak").await;
    let secret = server_key().attempt_secret(&attempt_id);
    let body = format!(
        r#"{{"error": "boom: internal host db-9.corp leaked, account acct-5555, key {}, secret {}"}}"#,
        crate::support::harness::FAKE_API_KEY,
        secret.expose()
    );
    assert_eq!(callback_outcome(&app, &attempt_id, &body).await, "failed");
    let owner = app.get_job(&app.alice.token, &job_id).await;
    let owner_text = owner.to_string();
    assert_eq!(owner["status"], "failed");
    assert_eq!(
        owner["attempts"][0]["error"],
        "the provider reported a failure by callback"
    );
    for leak in ["db-9.corp", "acct-5555", "boom"] {
        assert!(
            !owner_text.contains(leak),
            "the owner sees {leak}: {owner_text}"
        );
    }
    app.set_password("alice", "alice-password").await;
    let browser = crate::support::harness::FormClient::new(&app);
    browser.sign_in("alice", "alice-password").await;
    let page = browser
        .get(&format!("/jobs/{job_id}"))
        .await
        .text()
        .await
        .unwrap();
    assert!(page.contains("the provider reported a failure by callback"));
    assert!(
        !page.contains("db-9.corp"),
        "the job page shows the summary only"
    );
    let staff = app.get_job(&app.sue.token, &job_id).await;
    let staff_error = staff["attempts"][0]["error"].as_str().unwrap().to_owned();
    assert!(staff_error.contains("db-9.corp"), "{staff_error}");
    for secret in [crate::support::harness::FAKE_API_KEY, secret.expose()] {
        assert!(!staff_error.contains(secret), "masked: {staff_error}");
        assert!(!owner_text.contains(secret));
    }
    assert!(staff_error.contains("key ***, secret ***"), "{staff_error}");
}

async fn a_signature_for_one_attempt_is_refused_for_another(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let app = spawn_app_with(backend, callback_config(&fake)).await;
    let (job_a, attempt_a) = job_awaiting_callback(&app, &fake, "cb-a").await;
    let (job_b, attempt_b) = job_awaiting_callback(&app, &fake, "cb-b").await;
    let before = (stored(&app, &job_a).await, stored(&app, &job_b).await);
    let body = r#"{"result": {"summary": "meant for A"}}"#;
    // A good signature of this body for A, presented at B's URL (a
    // provider that mixed up its callbacks).
    let response = post_callback(&app, &attempt_b, body, signed(&attempt_a, body)).await;
    assert_problem(response, StatusCode::UNAUTHORIZED, "invalid-signature").await;
    let after = (stored(&app, &job_a).await, stored(&app, &job_b).await);
    assert_eq!(after, before, "nothing changed on either job");
    assert_eq!(after.0.attempts[0].state, AttemptState::Unknown);
    assert_eq!(after.1.attempts[0].state, AttemptState::Unknown);
    // The same signature at A's own URL is good.
    assert_eq!(callback_outcome(&app, &attempt_a, body).await, "won");
    assert_eq!(stored(&app, &job_b).await, before.1, "B is still untouched");
}

async fn a_callback_for_an_attempt_that_already_lost_is_race_logged(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let app = spawn_app_with(backend, callback_config(&fake)).await;
    let (job_id, first) = job_awaiting_callback(&app, &fake, "cb-lost").await;
    assert_eq!(
        app.abandon(&app.sue.token, &first, "no callback yet")
            .await
            .status(),
        StatusCode::OK
    );
    // A second attempt on the same provider, also answered by callback.
    fake.push(Behaviour::Hang);
    let response = app
        .start_attempt(&app.sue.token, &job_id, Some(json!({"provider": "async"})))
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let job = app
        .wait_for_job(&job_id, WAIT, |j| j["attempts"][1]["state"] == "unknown")
        .await;
    let second = job["attempts"][1]["id"].as_str().unwrap().to_owned();
    let winning = r#"{"result": {"summary": "the second attempt"}}"#;
    assert_eq!(callback_outcome(&app, &second, winning).await, "won");

    // Now the first attempt's answer arrives: it lost.
    let losing = r#"{"result": {"summary": "the first attempt"}}"#;
    assert_eq!(callback_outcome(&app, &first, losing).await, "lost");
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
        (winner.id.as_str(), winner.outcome),
        (second.as_str(), Some(RaceResult::Won))
    );
    assert_eq!(after.job.status, JobStatus::Succeeded);
    assert_eq!(after.job.completed_by.as_ref(), Some(&winner.id));
    assert_eq!(
        after.job.result.as_ref().map(|r| r.value()),
        Some(json!({"summary": "the second attempt"})),
        "the losing answer changed nothing"
    );
    assert_eq!(after.races.len(), 1, "{:?}", after.races);
    let race = &after.races[0];
    assert_eq!(race.losing_attempt_id, loser.id);
    assert_eq!(race.winning_attempt_id.as_ref(), Some(&winner.id));
    assert_eq!((race.version_read, race.version_found), (0, 1));
    assert_eq!(race.provider, "async");
    assert_eq!(
        race.payload_sha256,
        sha256_hex(canonical_json(&json!({"summary": "the first attempt"})).as_bytes())
    );
    assert_eq!(
        after.audit_actions(),
        vec!["abandon_attempt", "start_attempt"]
    );

    // The loser's attempt is finished: the same answer again answers as it
    // did and writes nothing; an error is ignored. Neither changes anything.
    assert_eq!(callback_outcome(&app, &first, losing).await, "lost");
    let error = r#"{"error": "too late to fail"}"#;
    assert_eq!(callback_outcome(&app, &first, error).await, "ignored");
    let later = stored(&app, &job_id).await;
    assert_eq!(later, after, "nothing changed, nothing logged");
}

async fn a_callback_for_an_abandoned_attempt_goes_through_the_cas_and_wins(backend: TestBackend) {
    let (_fake, app, job_id, attempt_id) = awaiting_callback(backend, "cb-abandoned").await;
    assert_eq!(
        app.abandon(&app.sue.token, &attempt_id, "no callback yet")
            .await
            .status(),
        StatusCode::OK
    );
    let abandoned = stored(&app, &job_id).await;
    assert_eq!(abandoned.attempts[0].state, AttemptState::Abandoned);
    assert_eq!(abandoned.job.status, JobStatus::Pending);

    let body = r#"{"result": {"summary": "after all"}}"#;
    assert_eq!(callback_outcome(&app, &attempt_id, body).await, "won");
    let after = stored(&app, &job_id).await;
    assert_eq!(after.attempts.len(), 1);
    assert_eq!(
        (after.attempts[0].state, after.attempts[0].outcome),
        (AttemptState::Succeeded, Some(RaceResult::Won))
    );
    assert_eq!(after.job.status, JobStatus::Succeeded);
    assert_eq!(after.job.completed_by.as_ref(), Some(&after.attempts[0].id));
    assert_eq!(after.job.version, 1);
    assert_eq!(
        after.job.result.as_ref().map(|r| r.value()),
        Some(json!({"summary": "after all"}))
    );
    assert!(after.races.is_empty());
    assert_eq!(after.audit_actions(), vec!["abandon_attempt"]);
}

async fn a_callback_for_an_attempt_that_does_not_exist_is_404(backend: TestBackend) {
    let (_fake, app, job_id, _attempt_id) = awaiting_callback(backend, "cb-404").await;
    let before = stored(&app, &job_id).await;
    let body = r#"{"result": {"summary": "to nowhere"}}"#;
    // A well-formed id never issued, correctly signed for itself.
    let never_issued = AttemptId::new().to_string();
    let response = post_callback(&app, &never_issued, body, signed(&never_issued, body)).await;
    assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
    // Not an id at all.
    let response = post_callback(&app, "not-an-id", body, signed("not-an-id", body)).await;
    assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
    // A path under the callbacks that names no attempt, and none at all.
    let nested = format!("{never_issued}/more");
    let response = post_callback(&app, &nested, body, signed(&nested, body)).await;
    assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
    let response = app
        .client
        .post(app.url("/api/v1/callbacks/attempts"))
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
    // The callback's path answers POST only.
    let response = app
        .client
        .get(app.url(&format!("/api/v1/callbacks/attempts/{never_issued}")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["allow"], "POST");
    assert_problem(
        response,
        StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
    )
    .await;
    assert_eq!(stored(&app, &job_id).await, before);
    let attempts: i64 = app
        .with_conn(|conn| attempts::table.count().get_result(conn).unwrap())
        .await;
    assert_eq!(attempts, 1, "no attempt was made up");
}

async fn a_callback_body_without_exactly_one_of_result_and_error_is_422_and_changes_nothing(
    backend: TestBackend,
) {
    let (_fake, app, job_id, attempt_id) = awaiting_callback(backend, "cb-422").await;
    let before = stored(&app, &job_id).await;
    for body in [
        "this is not JSON",
        "",
        "[]",
        "{}",
        r#"{"result": {"summary": "both"}, "error": "and an error"}"#,
        r#"{"result": null, "error": null}"#,
        r#"{"outcome": "won"}"#,
        // A name given twice: one reader's result is not another's.
        r#"{"result": {"summary": "first", "summary": "second"}}"#,
        r#"{"result": {"summary": "x"}, "result": {"summary": "y"}}"#,
    ] {
        let response = post_callback(&app, &attempt_id, body, signed(&attempt_id, body)).await;
        assert_problem(response, StatusCode::UNPROCESSABLE_ENTITY, "invalid-body").await;
        assert_eq!(
            stored(&app, &job_id).await,
            before,
            "{body:?} changed nothing"
        );
    }
    // The attempt still takes a well-formed callback.
    let body = r#"{"result": {"summary": "well formed"}}"#;
    assert_eq!(callback_outcome(&app, &attempt_id, body).await, "won");
}

on_both_backends!(
    a_callback_error_shows_the_owner_only_a_summary,
    a_callback_with_a_bad_signature_is_401_and_changes_nothing,
    a_signed_callback_goes_through_the_cas,
    a_callback_with_an_error_fails_the_attempt_with_that_error,
    a_signature_for_one_attempt_is_refused_for_another,
    a_callback_for_an_attempt_that_already_lost_is_race_logged,
    a_callback_for_an_abandoned_attempt_goes_through_the_cas_and_wins,
    a_callback_for_an_attempt_that_does_not_exist_is_404,
    a_callback_body_without_exactly_one_of_result_and_error_is_422_and_changes_nothing,
    a_replayed_callback_writes_nothing_new_and_an_old_one_is_refused,
);
