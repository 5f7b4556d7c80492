//! A job created while this process's worker has a free slot starts in its
//! creating transaction (`app::work::StartOffer`): the attempt comes back
//! already running, confirmed for sending, and is sent once. Without a free
//! slot the attempt is queued and the claimer takes it, in order, as before;
//! while attempts are queued, a claim gathers freed slots into one batch.

use onejob::domain::AttemptState;
use reqwest::StatusCode;
use serde_json::Value;

use crate::support::db::attempts_of;
use crate::support::fake_provider::{
    answer, one_fake_config, Behaviour, FakeProvider, Shape, WAIT,
};
use crate::support::harness::{spawn_app_with, summarize, TestApp, TestBackend};

async fn created(app: &TestApp, key: &str) -> Value {
    let response = app.post_job(&app.alice.token, key, &summarize(key)).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    response.json().await.unwrap()
}

/// A server whose worker has one slot, sending `summarize` to a fake.
async fn one_slot_app(backend: TestBackend) -> (FakeProvider, TestApp) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let mut config = one_fake_config(&fake);
    assert_eq!(config.worker.concurrency, 1);
    // The claimer wakes when told an attempt was queued; no polling
    // claim takes the slot at a moment the test does not choose.
    config.worker.poll_interval_ms = 60_000;
    let app = spawn_app_with(backend, config).await;
    until_idle(&app).await;
    (fake, app)
}

/// Until the claimer's first claim, at start, has found the queue empty.
async fn until_idle(app: &TestApp) {
    let deadline = std::time::Instant::now() + WAIT;
    while !app.app.starts_at_creation_now() {
        assert!(
            std::time::Instant::now() < deadline,
            "the worker never went idle"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// One slot. The first job takes it at creation: its answer says `running`,
/// and the row shows the claim and the confirmation made with the insert
/// (same instant, this process's lease). The second finds no slot and is
/// queued; the claimer sends it once the first is answered. Each is sent
/// exactly once.
async fn a_job_created_with_a_free_slot_starts_in_its_creating_transaction(backend: TestBackend) {
    let (fake, app) = one_slot_app(backend).await;
    fake.set_default(Behaviour::Hold);

    let first = created(&app, "first").await;
    assert_eq!(first["status"], "running", "{first:#}");
    assert_eq!(first["attempts"][0]["state"], "running", "{first:#}");
    let first_id = first["id"].as_str().unwrap().to_owned();
    let first_attempt = &attempts_of(&app, &first_id).await[0];
    assert_eq!(first_attempt.sent_at, Some(first_attempt.created_at));
    assert_eq!(first_attempt.started_at, Some(first_attempt.created_at));
    assert_eq!(first_attempt.version_read, Some(0));
    assert!(first_attempt.lease_expires_at.is_some());
    let lease_owner = first_attempt.lease_owner.clone().expect("leased");
    fake.wait_held(first_attempt.id.as_str()).await;

    let second = created(&app, "second").await;
    assert_eq!(second["status"], "pending", "{second:#}");
    assert_eq!(second["attempts"][0]["state"], "queued", "{second:#}");
    let second_id = second["id"].as_str().unwrap().to_owned();
    let second_attempt = attempts_of(&app, &second_id).await[0].clone();
    assert_eq!(second_attempt.state, AttemptState::Queued);
    assert_eq!(fake.requests_for(second_attempt.id.as_str()), 0);

    fake.release(first_attempt.id.as_str(), answer("first"));
    app.wait_for_status(&first_id, "succeeded", WAIT).await;
    fake.wait_held(second_attempt.id.as_str()).await;
    let claimed = &attempts_of(&app, &second_id).await[0];
    assert_eq!(claimed.state, AttemptState::Running);
    assert_eq!(claimed.lease_owner.as_deref(), Some(lease_owner.as_str()));
    assert!(claimed.sent_at.is_some(), "confirmed by the claim");
    fake.release(second_attempt.id.as_str(), answer("second"));
    app.wait_for_status(&second_id, "succeeded", WAIT).await;

    assert_eq!(fake.requests_for(first_attempt.id.as_str()), 1);
    assert_eq!(fake.requests_for(second_attempt.id.as_str()), 1);
    assert_eq!(fake.total_requests(), 2);
}

/// A replay never starts anything: the key's job already has its attempt,
/// and the slot reserved for the request is given back (the next new job
/// still starts at once).
async fn a_replay_starts_nothing_and_gives_its_slot_back(backend: TestBackend) {
    let (fake, app) = one_slot_app(backend).await;
    fake.set_default(answer("done"));

    let job = created(&app, "once").await;
    let job_id = job["id"].as_str().unwrap().to_owned();
    app.wait_for_status(&job_id, "succeeded", WAIT).await;
    for _ in 0..3 {
        let response = app
            .post_job(&app.alice.token, "once", &summarize("once"))
            .await;
        assert_eq!(response.status(), StatusCode::OK, "a replay");
    }
    assert_eq!(attempts_of(&app, &job_id).await.len(), 1);

    fake.set_default(Behaviour::Hold);
    let next = created(&app, "next").await;
    assert_eq!(next["attempts"][0]["state"], "running", "{next:#}");
    let attempt = next["attempts"][0]["id"].as_str().unwrap().to_owned();
    fake.wait_held(&attempt).await;
    fake.release(&attempt, answer("next"));
    app.wait_for_status(next["id"].as_str().unwrap(), "succeeded", WAIT)
        .await;
    assert_eq!(
        fake.total_requests(),
        2,
        "one call per job, none per replay"
    );
}

/// The claims this process made that took attempts, and the attempts they
/// took.
fn claims(app: &TestApp) -> (u64, u64) {
    let metrics = app.app.metrics();
    (metrics.claims.get(), metrics.claimed_attempts.get())
}

/// Eight slots (a batch of two), all held by jobs started at creation; four
/// more jobs queue. The first slot to free after an empty queue is claimed
/// at once (one attempt). That claim took all it asked for, so attempts are
/// queued: the next claim waits (`claim_gather_ms`) for a second slot, and
/// the two slots freed 100 ms apart go in one claim of two attempts, not
/// two claims. Every job is sent once and succeeds.
async fn under_a_backlog_a_claim_gathers_the_slots_that_free(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let mut config = one_fake_config(&fake);
    config.worker.concurrency = 8;
    config.worker.poll_interval_ms = 60_000;
    config.worker.claim_gather_ms = 1_000;
    let app = spawn_app_with(backend, config).await;
    until_idle(&app).await;
    fake.set_default(Behaviour::Hold);
    let mut started = Vec::new();
    for n in 0..8 {
        let job = created(&app, &format!("started-{n}")).await;
        assert_eq!(job["attempts"][0]["state"], "running", "{job:#}");
        let attempt = job["attempts"][0]["id"].as_str().unwrap().to_owned();
        fake.wait_held(&attempt).await;
        started.push((job["id"].as_str().unwrap().to_owned(), attempt));
    }
    let mut queued = Vec::new();
    for n in 0..4 {
        let job = created(&app, &format!("queued-{n}")).await;
        assert_eq!(job["attempts"][0]["state"], "queued", "{job:#}");
        queued.push((
            job["id"].as_str().unwrap().to_owned(),
            job["attempts"][0]["id"].as_str().unwrap().to_owned(),
        ));
    }
    assert_eq!(claims(&app), (0, 0));

    // After an empty queue: claimed as the slot frees, alone.
    fake.release(&started[0].1, answer("0"));
    fake.wait_held(&queued[0].1).await;
    assert_eq!(
        claims(&app),
        (1, 1),
        "the first claim takes the one free slot"
    );

    // Under the backlog: two slots freed 100 ms apart, one claim.
    fake.release(&started[1].1, answer("1"));
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(fake.requests_for(&queued[1].1), 0, "still gathering");
    fake.release(&started[2].1, answer("2"));
    fake.wait_held(&queued[1].1).await;
    fake.wait_held(&queued[2].1).await;
    assert_eq!(
        claims(&app),
        (2, 3),
        "the two freed slots went in one claim"
    );

    fake.set_default(answer("rest"));
    for (_, attempt) in started.iter().skip(3).chain(&queued[..3]) {
        fake.release(attempt, answer("rest"));
    }
    for (job, _) in started.iter().chain(&queued) {
        app.wait_for_status(job, "succeeded", WAIT).await;
    }
    for (_, attempt) in started.iter().chain(&queued) {
        assert_eq!(fake.requests_for(attempt), 1, "sent once: {attempt}");
    }
    assert_eq!(fake.total_requests(), 12);
}

on_both_backends!(
    a_job_created_with_a_free_slot_starts_in_its_creating_transaction,
    a_replay_starts_nothing_and_gives_its_slot_back,
    under_a_backlog_a_claim_gathers_the_slots_that_free,
);
