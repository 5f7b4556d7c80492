//! One key, one job: double clicks, replays, conflicts, and owners.

use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::Value;
use tokio::sync::Barrier;

use crate::support::harness::{assert_problem, spawn_app, summarize, TestApp, TestBackend};

/// Fires `n` POSTs with one key at the same instant; returns (status, job id) pairs.
async fn simultaneous_posts(
    app: &Arc<TestApp>,
    n: usize,
    key: &str,
) -> Vec<(StatusCode, String, Option<String>)> {
    let barrier = Arc::new(Barrier::new(n));
    let mut tasks = Vec::new();
    for _ in 0..n {
        let (app, barrier, key) = (app.clone(), barrier.clone(), key.to_owned());
        tasks.push(tokio::spawn(async move {
            let request = app
                .client
                .post(app.url("/api/v1/jobs"))
                .bearer_auth(&app.alice.token)
                .header("Idempotency-Key", &key)
                .json(&summarize("double click"));
            barrier.wait().await;
            let response = request.send().await.unwrap();
            let status = response.status();
            let replayed = response
                .headers()
                .get("Idempotent-Replayed")
                .map(|v| v.to_str().unwrap().to_owned());
            let body: Value = response.json().await.unwrap();
            (
                status,
                body["id"].as_str().unwrap_or_default().to_owned(),
                replayed,
            )
        }));
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    results
}

async fn simultaneous_posts_make_one_job(backend: TestBackend, n: usize) {
    let app = Arc::new(spawn_app(backend).await);
    let results = simultaneous_posts(&app, n, "double-click-key").await;
    let created: Vec<_> = results
        .iter()
        .filter(|r| r.0 == StatusCode::CREATED)
        .collect();
    let replayed: Vec<_> = results.iter().filter(|r| r.0 == StatusCode::OK).collect();
    assert_eq!(created.len(), 1, "exactly one 201: {results:?}");
    assert_eq!(
        replayed.len(),
        n - 1,
        "every other request is a 200 replay: {results:?}"
    );
    assert!(
        created[0].2.is_none(),
        "the creating response is not marked replayed"
    );
    assert!(
        replayed.iter().all(|r| r.2.as_deref() == Some("true")),
        "replays carry Idempotent-Replayed: true"
    );
    let job_id = &created[0].1;
    assert!(
        results.iter().all(|r| &r.1 == job_id),
        "every response names the same job"
    );
    assert_eq!(app.job_count(&app.alice.id).await, 1, "exactly one row");
    let job = app.get_job(&app.alice.token, job_id).await;
    assert_eq!(
        job["attempts"].as_array().unwrap().len(),
        1,
        "and one attempt"
    );
}

async fn two_simultaneous_posts_with_one_key_make_one_job(backend: TestBackend) {
    simultaneous_posts_make_one_job(backend, 2).await;
}

async fn fifty_simultaneous_posts_with_one_key_make_one_job(backend: TestBackend) {
    simultaneous_posts_make_one_job(backend, 50).await;
}

async fn replay_returns_the_same_job_with_location_and_replayed_header(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let first = app
        .post_job(&app.alice.token, "replay-1", &summarize("hello"))
        .await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let location = first.headers()["location"].to_str().unwrap().to_owned();
    let first: Value = first.json().await.unwrap();
    assert_eq!(
        location,
        format!("/api/v1/jobs/{}", first["id"].as_str().unwrap())
    );

    let again = app
        .post_job(&app.alice.token, "replay-1", &summarize("hello"))
        .await;
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["location"].to_str().unwrap(), location);
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["id"], first["id"]);
}

async fn same_key_with_different_input_is_409_and_the_first_job_is_unchanged(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let job_id = app
        .create_job(&app.alice.token, "k-409", &summarize("original"))
        .await;
    let before = app
        .wait_for_status(&job_id, "succeeded", std::time::Duration::from_secs(10))
        .await;

    let response = app
        .post_job(&app.alice.token, "k-409", &summarize("changed"))
        .await;
    let problem = assert_problem(response, StatusCode::CONFLICT, "idempotency-key-reused").await;
    assert_eq!(problem["job_id"], job_id.as_str());

    let after = app.get_job(&app.alice.token, &job_id).await;
    assert_eq!(after, before, "the first job is untouched");
    assert_eq!(after["input"]["text"], "original");
    assert_eq!(app.job_count(&app.alice.id).await, 1);
}

async fn a_different_provider_or_params_under_the_same_key_is_also_409(backend: TestBackend) {
    let app = spawn_app(backend).await;
    app.create_job(&app.alice.token, "k-p", &summarize("same"))
        .await;
    let mut with_provider = summarize("same");
    with_provider["provider"] = "sim-slow".into();
    let response = app.post_job(&app.alice.token, "k-p", &with_provider).await;
    assert_problem(response, StatusCode::CONFLICT, "idempotency-key-reused").await;
    let mut with_params = summarize("same");
    with_params["params"] = serde_json::json!({"temperature": 0.2});
    let response = app.post_job(&app.alice.token, "k-p", &with_params).await;
    assert_problem(response, StatusCode::CONFLICT, "idempotency-key-reused").await;
}

async fn key_order_and_whitespace_changes_are_not_a_conflict(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let send = |body: &'static str| {
        app.client
            .post(app.url("/api/v1/jobs"))
            .bearer_auth(&app.alice.token)
            .header("Idempotency-Key", "order-key")
            .header("Content-Type", "application/json")
            .body(body)
            .send()
    };
    let first = send(
        r#"{"task":"summarize","input":{"text":"hi","lang":"en"},"params":{"a":1,"b":[1,2]}}"#,
    )
    .await
    .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.unwrap();
    let second = send("{\n  \"params\" : { \"b\" : [1, 2], \"a\" : 1 },\n  \"input\" : {\"lang\":\"en\",   \"text\":\"hi\"},\n  \"task\":\"summarize\"\n}")
        .await
        .unwrap();
    assert_eq!(second.status(), StatusCode::OK);
    let second: Value = second.json().await.unwrap();
    assert_eq!(second["id"], first["id"]);
    assert_eq!(app.job_count(&app.alice.id).await, 1);
}

/// POSTs a raw body under a key as alice.
/// Jobs that name a provider and jobs that do not, made in turn by one
/// process: the job's insert is kept prepared by its type, so its text must
/// be one whatever a job leaves empty (every column, `None` as NULL). Each
/// job stores what it was sent.
async fn jobs_naming_a_provider_or_not_in_turn_each_store_what_they_sent(backend: TestBackend) {
    use diesel::prelude::*;
    use onejob::store::schema::jobs;
    let app = spawn_app(backend).await;
    for n in 0..4 {
        let named = n % 2 == 1;
        let mut body = summarize(&format!("turn {n}"));
        if named {
            body["provider"] = "sim-fast".into();
        }
        let job_id = app
            .create_job(&app.alice.token, &format!("turn-{n}"), &body)
            .await;
        let stored: Option<String> = app
            .with_conn(move |conn| {
                jobs::table
                    .filter(jobs::id.eq(job_id))
                    .select(jobs::requested_provider)
                    .first(conn)
                    .unwrap()
            })
            .await;
        assert_eq!(stored, named.then(|| "sim-fast".to_owned()), "job {n}");
    }
}

async fn post_raw(app: &TestApp, key: &str, body: &str) -> reqwest::Response {
    app.client
        .post(app.url("/api/v1/jobs"))
        .bearer_auth(&app.alice.token)
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
}

/// The stored `input` column of alice's job under `key`, as text.
async fn stored_input(app: &TestApp, key: &str) -> String {
    use diesel::prelude::*;
    use onejob::store::schema::jobs;
    let key = key.to_owned();
    app.with_conn(move |conn| {
        jobs::table
            .filter(jobs::idempotency_key.eq(key))
            .select(jobs::input)
            .first::<String>(conn)
            .unwrap()
    })
    .await
}

async fn one_and_one_point_zero_are_one_payload(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let first = post_raw(
        &app,
        "one",
        r#"{"task":"summarize","input":{"text":"x","n":1}}"#,
    )
    .await;
    assert_eq!(first.status(), StatusCode::CREATED);
    for same in [
        r#"{"task":"summarize","input":{"text":"x","n":1.0}}"#,
        r#"{"task":"summarize","input":{"text":"x","n":1e0}}"#,
        r#"{"task":"summarize","input":{"text":"x","n":10E-1}}"#,
    ] {
        let again = post_raw(&app, "one", same).await;
        assert_eq!(again.status(), StatusCode::OK, "{same}");
        assert_eq!(again.headers()["idempotent-replayed"], "true");
    }
    assert_eq!(app.job_count(&app.alice.id).await, 1);
    assert_eq!(
        stored_input(&app, "one").await,
        r#"{"text":"x","n":1}"#,
        "stored as first sent"
    );
}

async fn numbers_that_differ_are_different_payloads_and_none_is_rounded(backend: TestBackend) {
    let app = spawn_app(backend).await;
    // Both are exact (within ±(2^53 − 1)): they differ, so the second is a conflict.
    let big = r#"{"task":"summarize","input":{"text":"x","seed":9007199254740991}}"#;
    let bigger = r#"{"task":"summarize","input":{"text":"x","seed":9007199254740990}}"#;
    assert_eq!(
        post_raw(&app, "seed", big).await.status(),
        StatusCode::CREATED
    );
    assert_problem(
        post_raw(&app, "seed", bigger).await,
        StatusCode::CONFLICT,
        "idempotency-key-reused",
    )
    .await;
    // No double holds these: refused, never rounded into one another.
    for (key, body) in [
        (
            "huge-1",
            r#"{"task":"summarize","input":{"text":"x","seed":123456789012345678901}}"#,
        ),
        (
            "huge-2",
            r#"{"task":"summarize","input":{"text":"x","seed":123456789012345678902}}"#,
        ),
        (
            "tiny",
            r#"{"task":"summarize","input":{"text":"x","p":1e-400}}"#,
        ),
        (
            "params",
            r#"{"task":"summarize","input":{"text":"x"},"params":{"seed":9007199254740993}}"#,
        ),
    ] {
        let problem = assert_problem(
            post_raw(&app, key, body).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-body",
        )
        .await;
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("cannot be held exactly"),
            "{problem:#}"
        );
    }
    // Beyond the range where every integer is exact: refused, to travel as a string.
    for (key, number) in [("range-1", "9007199254740992"), ("range-2", "6.02e23")] {
        let body = format!(r#"{{"task":"summarize","input":{{"text":"x","n":{number}}}}}"#);
        let problem = assert_problem(
            post_raw(&app, key, &body).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-body",
        )
        .await;
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains("send it as a string"), "{detail}");
    }
    assert_eq!(app.job_count(&app.alice.id).await, 1, "nothing else stored");
    // What was accepted is stored and returned digit for digit, as sent.
    let exact = r#"{"task":"summarize","input":{"text":"x","price":19.90,"big":1e15}}"#;
    let response = post_raw(&app, "exact", exact).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let text = response.text().await.unwrap();
    assert!(
        text.contains(r#""input":{"text":"x","price":19.90,"big":1e15}"#),
        "{text}"
    );
    assert_eq!(
        stored_input(&app, "exact").await,
        r#"{"text":"x","price":19.90,"big":1e15}"#
    );
}

async fn strings_in_other_unicode_forms_are_different_payloads(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let nfc = "{\"task\":\"summarize\",\"input\":{\"text\":\"caf\u{e9}\"}}";
    let nfd = "{\"task\":\"summarize\",\"input\":{\"text\":\"cafe\u{301}\"}}";
    let escaped = r#"{"task":"summarize","input":{"text":"caf\u00e9"}}"#;
    assert_eq!(
        post_raw(&app, "unicode", nfc).await.status(),
        StatusCode::CREATED
    );
    assert_eq!(
        post_raw(&app, "unicode", escaped).await.status(),
        StatusCode::OK,
        "an escape of the same code point is the same string"
    );
    assert_problem(
        post_raw(&app, "unicode", nfd).await,
        StatusCode::CONFLICT,
        "idempotency-key-reused",
    )
    .await;
}

async fn a_retry_after_a_configuration_change_gets_its_replay_not_a_422(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let job_id = app
        .create_job(&app.alice.token, "before-deploy", &summarize("keep me"))
        .await;
    // The next version of the configuration renames the task and adds a
    // rule the old request breaks; a process running it shares the database.
    let renamed = crate::support::harness::DEFAULT_TEST_PROVIDERS
        .replace("name = \"summarize\"", "name = \"summarize-v2\"")
        .replace(
            "input_fields = [\"text\"]",
            "input_fields = [\"text\", \"lang\"]",
        );
    let store = {
        let (url, config) = (
            app.db.url.clone(),
            crate::support::harness::test_config(&renamed),
        );
        tokio::task::spawn_blocking(move || onejob::startup::open_store(&url, &config))
            .await
            .unwrap()
            .unwrap()
    };
    let (next, _, next_server) = crate::support::harness::start_instance(
        crate::support::harness::test_config(&renamed),
        store,
    )
    .await;
    let send = |body: Value| {
        app.client
            .post(format!("{next}/api/v1/jobs"))
            .bearer_auth(&app.alice.token)
            .header("Idempotency-Key", "before-deploy")
            .json(&body)
            .send()
    };
    let replay = send(summarize("keep me")).await.unwrap();
    assert_eq!(
        replay.status(),
        StatusCode::OK,
        "the acknowledged request replays"
    );
    let job: Value = replay.json().await.unwrap();
    assert_eq!(job["id"], job_id.as_str());
    assert_problem(
        send(summarize("something else")).await.unwrap(),
        StatusCode::CONFLICT,
        "idempotency-key-reused",
    )
    .await;
    // A new key is held to the new configuration.
    let fresh = app
        .client
        .post(format!("{next}/api/v1/jobs"))
        .bearer_auth(&app.alice.token)
        .header("Idempotency-Key", "after-deploy")
        .json(&summarize("new"))
        .send()
        .await
        .unwrap();
    assert_problem(fresh, StatusCode::UNPROCESSABLE_ENTITY, "unknown-task").await;
    assert_eq!(app.job_count(&app.alice.id).await, 1);
    next_server.abort();
}

async fn quoted_key_form_is_the_same_key_unquoted(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let first = app
        .post_job(&app.alice.token, "quoted", &summarize("q"))
        .await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let second = app
        .post_job(&app.alice.token, "\"quoted\"", &summarize("q"))
        .await;
    assert_eq!(second.status(), StatusCode::OK);
    let job: Value = second.json().await.unwrap();
    assert_eq!(job["idempotency_key"], "quoted");
}

async fn the_same_key_from_two_owners_makes_two_jobs(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let alices = app
        .create_job(&app.alice.token, "shared-key", &summarize("a"))
        .await;
    let bobs = app
        .create_job(&app.bob.token, "shared-key", &summarize("b"))
        .await;
    assert_ne!(alices, bobs);
    assert_eq!(app.job_count(&app.alice.id).await, 1);
    assert_eq!(app.job_count(&app.bob.id).await, 1);
}

async fn another_owners_job_is_404(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let job_id = app
        .create_job(&app.alice.token, "private", &summarize("mine"))
        .await;
    let response = app
        .get(&app.bob.token, &format!("/api/v1/jobs/{job_id}"))
        .await;
    assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
    let response = app.start_attempt(&app.bob.token, &job_id, None).await;
    assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
    // Staff may look.
    let response = app
        .get(&app.sue.token, &format!("/api/v1/jobs/{job_id}"))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
}

async fn job_list_is_the_callers_own_newest_first_and_paginated(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            app.create_job(
                &app.alice.token,
                &format!("list-{i}"),
                &summarize(&format!("t{i}")),
            )
            .await,
        );
    }
    app.create_job(&app.bob.token, "bobs", &summarize("not alice's"))
        .await;
    let page1: Value = app
        .get(&app.alice.token, "/api/v1/jobs?limit=2")
        .await
        .json()
        .await
        .unwrap();
    let got: Vec<&str> = page1["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap())
        .collect();
    assert_eq!(got, vec![ids[4].as_str(), ids[3].as_str()]);
    let next = page1["next"].as_str().unwrap().to_owned();
    let page2: Value = app.get(&app.alice.token, &next).await.json().await.unwrap();
    let got: Vec<&str> = page2["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap())
        .collect();
    assert_eq!(got, vec![ids[2].as_str(), ids[1].as_str()]);
    let page3: Value = app
        .get(&app.alice.token, page2["next"].as_str().unwrap())
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(page3["jobs"].as_array().unwrap().len(), 1);
    assert!(page3["next"].is_null());
    let response = app.get(&app.alice.token, "/api/v1/jobs?limit=0").await;
    assert_problem(response, StatusCode::BAD_REQUEST, "invalid-query").await;
}

on_both_backends!(
    jobs_naming_a_provider_or_not_in_turn_each_store_what_they_sent,
    one_and_one_point_zero_are_one_payload,
    numbers_that_differ_are_different_payloads_and_none_is_rounded,
    strings_in_other_unicode_forms_are_different_payloads,
    a_retry_after_a_configuration_change_gets_its_replay_not_a_422,
    a_key_whose_job_vanished_mid_request_makes_a_new_job_not_a_404,
    two_simultaneous_posts_with_one_key_make_one_job,
    fifty_simultaneous_posts_with_one_key_make_one_job,
    replay_returns_the_same_job_with_location_and_replayed_header,
    same_key_with_different_input_is_409_and_the_first_job_is_unchanged,
    a_different_provider_or_params_under_the_same_key_is_also_409,
    key_order_and_whitespace_changes_are_not_a_conflict,
    quoted_key_form_is_the_same_key_unquoted,
    the_same_key_from_two_owners_makes_two_jobs,
    another_owners_job_is_404,
    job_list_is_the_callers_own_newest_first_and_paginated,
);

/// Item: no 404 on creation. The job a retried key conflicts with is
/// removed by retention in the middle of the request (a trigger deletes the
/// finished job as the insert runs: on PostgreSQL after the insert found the
/// conflict and before the read, on SQLite just before the insert): the key
/// is free again, and the request makes a new job, `201`, never a 404.
async fn a_key_whose_job_vanished_mid_request_makes_a_new_job_not_a_404(backend: TestBackend) {
    use diesel::connection::SimpleConnection;
    let fake = crate::support::fake_provider::FakeProvider::start(
        crate::support::fake_provider::Shape::OpenAi,
    )
    .await;
    let app = crate::support::harness::spawn_app_with(
        backend,
        crate::support::fake_provider::one_fake_config(&fake),
    )
    .await;
    fake.push(crate::support::fake_provider::Behaviour::Status {
        status: 400,
        retry_after: None,
        body: "{}".into(),
    });
    let old = app
        .create_job(&app.alice.token, "vanishing", &summarize("x"))
        .await;
    app.wait_for_status(&old, "failed", crate::support::fake_provider::WAIT)
        .await;
    app.with_conn(|conn| {
        match conn {
        onejob::store::DbConnection::Postgresql(c) => c.batch_execute(
            "CREATE FUNCTION vanish() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
               DELETE FROM attempts WHERE job_id IN \
                 (SELECT id FROM jobs WHERE idempotency_key = 'vanishing' AND status = 'failed'); \
               DELETE FROM jobs WHERE idempotency_key = 'vanishing' AND status = 'failed'; \
               RETURN NULL; END $$; \
             CREATE TRIGGER vanish AFTER INSERT ON jobs FOR EACH STATEMENT \
               EXECUTE FUNCTION vanish();",
        ),
        onejob::store::DbConnection::Sqlite(c) => c.batch_execute(
            "CREATE TRIGGER vanish BEFORE INSERT ON jobs WHEN NEW.idempotency_key = 'vanishing' \
             BEGIN \
               DELETE FROM attempts WHERE job_id IN \
                 (SELECT id FROM jobs WHERE idempotency_key = 'vanishing' AND status = 'failed'); \
               DELETE FROM jobs WHERE idempotency_key = 'vanishing' AND status = 'failed'; \
             END;",
        ),
    }
    .unwrap()
    })
    .await;
    let retried = app
        .post_job(&app.alice.token, "vanishing", &summarize("x"))
        .await;
    assert_eq!(
        retried.status(),
        StatusCode::CREATED,
        "a new job, not a 404"
    );
    let job: Value = retried.json().await.unwrap();
    assert_ne!(job["id"], old.as_str());
    assert_eq!(app.job_count(&app.alice.id).await, 1, "the old job is gone");
    let response = app
        .get(&app.alice.token, &format!("/api/v1/jobs/{old}"))
        .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    app.wait_for_status(
        job["id"].as_str().unwrap(),
        "succeeded",
        crate::support::fake_provider::WAIT,
    )
    .await;
}
