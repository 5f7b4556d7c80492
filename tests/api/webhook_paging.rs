//! An endpoint's events a page at a time (docs/api.md, "Reading the
//! events"): `limit`, `before` and `next` as `GET /api/v1/jobs` pages; the
//! `400 invalid-query` every `GET` under `/api/v1` answers for a query
//! parameter it does not take or one out of range, never ignoring it
//! (docs/api.md, "Errors"); and the webhook examples of docs/api.md (the
//! answer to registering an endpoint, a delivery's body and what `data`
//! holds for each event type) held against what onejob answers and sends.

use std::collections::BTreeSet;
use std::time::Duration;

use onejob::config::Config;
use onejob::domain::webhook::{base64_decode, WebhookKey};
use onejob::domain::Secret;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::harness::{
    assert_problem, spawn_app_with, summarize, test_config, TestApp, TestBackend,
    DEFAULT_TEST_PROVIDERS,
};
use crate::support::webhook_receiver::WebhookReceiver;

on_both_backends!(
    an_endpoints_events_come_a_page_at_a_time_and_next_links_the_rest,
    an_endpoints_deliveries_come_a_page_at_a_time_and_next_links_the_rest,
    a_query_parameter_a_get_does_not_take_is_400_invalid_query,
    the_documented_answer_and_bodies_are_what_onejob_sends,
);

const WEBHOOK_KEY: &str = "webhook-key-for-the-paging-tests-0123456789abcdef";

/// Webhooks on, the receiver on 127.0.0.1 allowed, quick polling;
/// `deliver: false` leaves every event pending in the outbox.
fn webhooks_on(providers_and_tasks: &str, deliver: bool) -> Config {
    let mut config = test_config(providers_and_tasks);
    config.webhooks.key = Some(WebhookKey::new(&Secret::new(WEBHOOK_KEY)));
    let s = &mut config.webhooks.settings;
    s.allow_private_addresses = true;
    s.deliver = deliver;
    s.poll_interval_ms = 50;
    s.backoff_initial_ms = 100;
    s.backoff_max_ms = 400;
    s.timeout_ms = 2_000;
    config
}

const ALL_EVENTS: [&str; 4] = [
    "job.succeeded",
    "job.failed",
    "job.unknown",
    "job.cancelled",
];

/// Registers `url` for `events`; the answer's status, headers and body.
async fn register(app: &TestApp, token: &str, url: &str, events: &[&str]) -> (String, Value) {
    let response = app
        .client
        .post(app.url("/api/v1/webhooks"))
        .bearer_auth(token)
        .json(&json!({"url": url, "events": events}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let body: Value = response.json().await.unwrap();
    (body["webhook"]["id"].as_str().unwrap().to_owned(), body)
}

async fn get_ok(app: &TestApp, token: &str, path: &str) -> Value {
    let response = app.get(token, path).await;
    assert_eq!(response.status(), StatusCode::OK, "GET {path}");
    response.json().await.unwrap()
}

fn ids(page: &Value) -> Vec<String> {
    ids_of(page, "events")
}

fn ids_of(page: &Value, list: &str) -> Vec<String> {
    page[list]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Five jobs succeed and one is cancelled: the endpoint's events, read two
/// at a time by following `next`, are the whole list in the same order,
/// each once; `next` is `null` on the last page, and `before` continues
/// after any event id.
async fn an_endpoints_events_come_a_page_at_a_time_and_next_links_the_rest(backend: TestBackend) {
    let app = spawn_app_with(backend, webhooks_on(DEFAULT_TEST_PROVIDERS, false)).await;
    let (endpoint, _) = register(
        &app,
        &app.alice.token,
        "https://hooks.example.com/in",
        &ALL_EVENTS,
    )
    .await;
    for i in 0..5 {
        let job = app
            .create_job(&app.alice.token, &format!("page-{i}"), &summarize("x"))
            .await;
        app.wait_for_status(&job, "succeeded", Duration::from_secs(10))
            .await;
    }
    // sim-slow answers after its soft timeout: cancelled while it runs (or
    // once it is unknown), the job takes no other event.
    let slow = json!({"task": "summarize", "input": {"text": "slow"}, "provider": "sim-slow"});
    let cancelled = app.create_job(&app.alice.token, "page-cancel", &slow).await;
    let answer = app
        .client
        .post(app.url(&format!("/api/v1/jobs/{cancelled}/cancel")))
        .bearer_auth(&app.alice.token)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK);

    let path = format!("/api/v1/webhooks/{endpoint}/events");
    let all = get_ok(&app, &app.alice.token, &format!("{path}?limit=200")).await;
    assert_eq!(all["next"], Value::Null, "{all:#}");
    let everything = ids(&all);
    let types: Vec<&str> = all["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(types[0], "job.cancelled", "newest first: {types:?}");
    assert_eq!(
        all["events"][0]["job_id"],
        cancelled.as_str(),
        "the cancel's transaction recorded it"
    );
    assert_eq!(
        types.iter().filter(|t| **t == "job.succeeded").count(),
        5,
        "{types:?}"
    );
    assert!(
        types.len() == 6 || (types.len() == 7 && types[1] == "job.unknown"),
        "{types:?}"
    );
    let mut sorted = everything.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    sorted.dedup();
    assert_eq!(sorted, everything, "newest first, each once");
    // No query: the default page (50) holds them all.
    assert_eq!(get_ok(&app, &app.alice.token, &path).await, all);

    // Two at a time, following `next`.
    let mut read = Vec::new();
    let mut pages = 0;
    let mut at = format!("{path}?limit=2");
    loop {
        let page = get_ok(&app, &app.alice.token, &at).await;
        let got = ids(&page);
        assert!(!got.is_empty() && got.len() <= 2, "{page:#}");
        read.extend(got.iter().cloned());
        pages += 1;
        match page["next"].as_str() {
            Some(next) => {
                assert_eq!(
                    next,
                    format!("{path}?limit=2&before={}", got.last().unwrap())
                );
                at = next.to_owned();
            }
            None => break,
        }
    }
    assert_eq!(read, everything);
    assert_eq!(pages, everything.len().div_ceil(2));
    // A page exactly as long as the list has no `next`.
    let exact = get_ok(
        &app,
        &app.alice.token,
        &format!("{path}?limit={}", everything.len()),
    )
    .await;
    assert_eq!(ids(&exact), everything);
    assert_eq!(exact["next"], Value::Null);
    // `before` any event: the ones older than it.
    let after_third = get_ok(
        &app,
        &app.alice.token,
        &format!("{path}?before={}", everything[2].to_uppercase()),
    )
    .await;
    assert_eq!(ids(&after_third), everything[3..]);
    let none = get_ok(
        &app,
        &app.alice.token,
        &format!("{path}?before=00000000-0000-0000-0000-000000000000"),
    )
    .await;
    assert_eq!(none, json!({"events": [], "next": null}));
    // Another owner's endpoint is not found, paged or not.
    for query in ["", "?limit=2"] {
        assert_problem(
            app.get(&app.bob.token, &format!("{path}{query}")).await,
            StatusCode::NOT_FOUND,
            "not-found",
        )
        .await;
    }
}

/// A receiver that fails four times, then takes the event: five delivery
/// attempts, read two at a time by following `next`, are the whole list,
/// newest first, each once; `before` continues after any of them, and an
/// id that is none of them gives an empty page.
async fn an_endpoints_deliveries_come_a_page_at_a_time_and_next_links_the_rest(
    backend: TestBackend,
) {
    let app = spawn_app_with(backend, webhooks_on(DEFAULT_TEST_PROVIDERS, true)).await;
    let receiver = WebhookReceiver::start().await;
    receiver.fail_first(4);
    let (endpoint, _) = register(
        &app,
        &app.alice.token,
        &receiver.url("/hook"),
        &["job.succeeded"],
    )
    .await;
    let job = app
        .create_job(&app.alice.token, "deliveries", &summarize("x"))
        .await;
    app.wait_for_status(&job, "succeeded", Duration::from_secs(10))
        .await;
    receiver.wait_for(5, Duration::from_secs(20)).await;
    // The fifth attempt's row commits after the receiver answered it:
    // re-read until all five are there.
    let path = format!("/api/v1/webhooks/{endpoint}/deliveries");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let all = loop {
        let all = get_ok(&app, &app.alice.token, &format!("{path}?limit=200")).await;
        if ids_of(&all, "deliveries").len() == 5 {
            break all;
        }
        assert!(std::time::Instant::now() < deadline, "{all:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(all["next"], Value::Null, "{all:#}");
    let everything = ids_of(&all, "deliveries");
    let numbers: Vec<i64> = all["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["number"].as_i64().unwrap())
        .collect();
    assert_eq!(numbers, [5, 4, 3, 2, 1], "newest first: {all:#}");
    assert_eq!(all["deliveries"][0]["outcome"], "delivered");

    let mut read = Vec::new();
    let mut at = format!("{path}?limit=2");
    loop {
        let page = get_ok(&app, &app.alice.token, &at).await;
        let got = ids_of(&page, "deliveries");
        assert!(!got.is_empty() && got.len() <= 2, "{page:#}");
        read.extend(got.iter().cloned());
        match page["next"].as_str() {
            Some(next) => {
                assert_eq!(
                    next,
                    format!("{path}?limit=2&before={}", got.last().unwrap())
                );
                at = next.to_owned();
            }
            None => break,
        }
    }
    assert_eq!(read, everything);
    let after_second = get_ok(
        &app,
        &app.alice.token,
        &format!("{path}?before={}", everything[1]),
    )
    .await;
    assert_eq!(ids_of(&after_second, "deliveries"), everything[2..]);
    let none = get_ok(
        &app,
        &app.alice.token,
        &format!("{path}?before=00000000-0000-0000-0000-000000000000"),
    )
    .await;
    assert_eq!(none, json!({"deliveries": [], "next": null}));
    let bad = app
        .get(&app.alice.token, &format!("{path}?before=nope"))
        .await;
    let problem = assert_problem(bad, StatusCode::BAD_REQUEST, "invalid-query").await;
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("`before` must be a delivery id"),
        "{problem:#}"
    );
}

/// The events' own bad queries, and every `GET` under `/api/v1` given a
/// parameter it does not take: `400 invalid-query`, naming the parameter;
/// the same paths without it answer `200`.
async fn a_query_parameter_a_get_does_not_take_is_400_invalid_query(backend: TestBackend) {
    let app = spawn_app_with(backend, webhooks_on(DEFAULT_TEST_PROVIDERS, false)).await;
    let (endpoint, _) = register(
        &app,
        &app.alice.token,
        "https://hooks.example.com/in",
        &["job.succeeded"],
    )
    .await;
    let job = app
        .create_job(&app.alice.token, "query-1", &summarize("x"))
        .await;
    app.wait_for_status(&job, "succeeded", Duration::from_secs(10))
        .await;
    let budget = app
        .client
        .put(app.url("/api/v1/budgets/alice"))
        .bearer_auth(&app.ada.token)
        .json(&json!({"token_limit": 1_000_000, "reason": "a budget to read"}))
        .send()
        .await
        .unwrap();
    assert_eq!(budget.status(), StatusCode::OK);

    let events = format!("/api/v1/webhooks/{endpoint}/events");
    for (query, said) in [
        ("?limit=500", "`limit` must be between 1 and 200"),
        ("?limit=0", "`limit` must be between 1 and 200"),
        ("?limit=two", "`limit`: invalid digit"),
        ("?before=nope", "`before` must be an event id"),
        ("?limt=2", "limt"),
        ("?limit=2&page=3", "page"),
    ] {
        let problem = assert_problem(
            app.get(&app.alice.token, &format!("{events}{query}")).await,
            StatusCode::BAD_REQUEST,
            "invalid-query",
        )
        .await;
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains(said), "{query}: {detail}");
    }

    let (alice, ada) = (&app.alice.token, &app.ada.token);
    let gets = [
        (alice, "/api/v1/jobs".to_owned()),
        (alice, format!("/api/v1/jobs/{job}")),
        (alice, format!("/api/v1/jobs/{job}/usage")),
        (alice, "/api/v1/webhooks".to_owned()),
        (alice, format!("/api/v1/webhooks/{endpoint}")),
        (alice, format!("/api/v1/webhooks/{endpoint}/deliveries")),
        (alice, events.clone()),
        (alice, "/api/v1/usage".to_owned()),
        (alice, "/api/v1/budgets/alice".to_owned()),
        (ada, "/api/v1/admin/unknown".to_owned()),
        (ada, "/api/v1/admin/races".to_owned()),
        (ada, "/api/v1/budgets".to_owned()),
    ];
    for (token, path) in &gets {
        assert_eq!(
            app.get(token, path).await.status(),
            StatusCode::OK,
            "GET {path}"
        );
        let problem = assert_problem(
            app.get(token, &format!("{path}?zz_unknown=1")).await,
            StatusCode::BAD_REQUEST,
            "invalid-query",
        )
        .await;
        assert!(
            problem["detail"].as_str().unwrap().contains("zz_unknown"),
            "GET {path}: {problem}"
        );
    }
}

/// The example that follows `<!-- example: {what} -->` in docs/api.md.
fn documented(what: &str) -> Value {
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/api.md")).unwrap();
    let marker = format!("<!-- example: {what} -->\n```json\n");
    let start = page
        .find(&marker)
        .unwrap_or_else(|| panic!("docs/api.md shows {what}"))
        + marker.len();
    let end = start + page[start..].find("```").unwrap();
    serde_json::from_str(&page[start..end])
        .unwrap_or_else(|e| panic!("docs/api.md's {what} is JSON: {e}"))
}

/// The members of an object, and of each object it holds, as paths.
fn shape(value: &Value) -> BTreeSet<String> {
    let mut paths = BTreeSet::new();
    if let Some(object) = value.as_object() {
        for (key, member) in object {
            paths.insert(key.clone());
            if member.is_object() && key != "result" {
                paths.extend(shape(member).into_iter().map(|p| format!("{key}.{p}")));
            }
        }
    }
    paths
}

const EVERY_EVENT_TOML: &str = r#"
[[providers]]
name = "sim-fast"
kind = "simulated"
latency_ms = 20
timeout_ms = 3000
late_result_ms = 5000

[[providers]]
name = "sim-hold"
kind = "simulated"
latency_ms = 4000
timeout_ms = 8000
late_result_ms = 5000

[[providers]]
name = "sim-late"
kind = "simulated"
latency_ms = 1000
timeout_ms = 300
late_result_ms = 5000

[[providers]]
name = "sim-broken"
kind = "simulated"
fail = "definite"

[[tasks]]
name = "summarize"
providers = ["sim-fast"]
input_fields = ["text"]

[[tasks]]
name = "hold"
providers = ["sim-hold"]
input_fields = ["text"]

[[tasks]]
name = "late"
providers = ["sim-late"]
input_fields = ["text"]

[[tasks]]
name = "broken"
providers = ["sim-broken"]
input_fields = ["text"]
"#;

/// docs/api.md's registration answer and delivery body have the members
/// onejob's have, and each event type's `data` is as its table says.
async fn the_documented_answer_and_bodies_are_what_onejob_sends(backend: TestBackend) {
    let receiver = WebhookReceiver::start().await;
    let app = spawn_app_with(backend, webhooks_on(EVERY_EVENT_TOML, true)).await;
    let response = app
        .client
        .post(app.url("/api/v1/webhooks"))
        .bearer_auth(&app.alice.token)
        .json(&json!({"url": receiver.url("/hook"), "events": ALL_EVENTS}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let header = |name: &str| response.headers()[name].to_str().unwrap().to_owned();
    let (location, cache) = (header("location"), header("cache-control"));
    let answer: Value = response.json().await.unwrap();
    let endpoint = answer["webhook"]["id"].as_str().unwrap();
    assert_eq!(location, format!("/api/v1/webhooks/{endpoint}"));
    assert_eq!(cache, "no-store");
    let example = documented("the answer to registering an endpoint");
    assert_eq!(shape(&answer), shape(&example), "{answer:#}");
    let secret = answer["secret"].as_str().unwrap();
    let key = base64_decode(secret.strip_prefix("whsec_").unwrap()).unwrap();
    assert_eq!(key.len(), 32, "{secret}");
    assert!(example["secret"].as_str().unwrap().starts_with("whsec_"));
    assert_eq!(
        base64_decode(&example["secret"].as_str().unwrap()["whsec_".len()..])
            .unwrap()
            .len(),
        32,
        "the documented secret has the real one's length"
    );
    let shown = get_ok(&app, &app.alice.token, &location).await;
    assert_eq!(shown, answer["webhook"], "GET answers the endpoint alone");

    let body_shape = shape(&documented("a delivery's body"));
    let succeeded = app
        .create_job(
            &app.alice.token,
            "doc-1",
            &json!({"task": "summarize", "input": {"text": "x"}}),
        )
        .await;
    let failed = app
        .create_job(
            &app.alice.token,
            "doc-2",
            &json!({"task": "broken", "input": {"text": "x"}}),
        )
        .await;
    let late = app
        .create_job(
            &app.alice.token,
            "doc-3",
            &json!({"task": "late", "input": {"text": "x"}}),
        )
        .await;
    let held = app
        .create_job(
            &app.alice.token,
            "doc-4",
            &json!({"task": "hold", "input": {"text": "x"}}),
        )
        .await;
    app.wait_for_job(&held, Duration::from_secs(10), |j| j["status"] == "running")
        .await;
    let cancel = app
        .client
        .post(app.url(&format!("/api/v1/jobs/{held}/cancel")))
        .bearer_auth(&app.alice.token)
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status(), StatusCode::OK);
    app.wait_for_status(&late, "succeeded", Duration::from_secs(15))
        .await;
    app.wait_for_status(&failed, "failed", Duration::from_secs(10))
        .await;
    // succeeded, failed, cancelled, and the late job's unknown then succeeded.
    receiver.wait_for(5, Duration::from_secs(20)).await;
    let bodies: Vec<Value> = receiver.received().iter().map(|r| r.json()).collect();
    for received in receiver.received() {
        let id = received.webhook_id();
        assert!(
            id.len() == 36
                && id.starts_with("msg_")
                && id[4..].bytes().all(|b| b.is_ascii_hexdigit()),
            "{id}"
        );
        assert_eq!(received.header("content-type"), "application/json");
        assert!(received.header("webhook-signature").starts_with("v1,"));
    }
    let event = |job: &str, kind: &str| -> Value {
        bodies
            .iter()
            .find(|b| b["data"]["id"] == job && b["type"] == kind)
            .unwrap_or_else(|| panic!("no {kind} for {job}: {bodies:#?}"))
            .clone()
    };
    let job = |id: &str| {
        let id = id.to_owned();
        let app = &app;
        async move { app.get_job(&app.alice.token, &id).await }
    };
    for (id, kind, status) in [
        (&succeeded, "job.succeeded", "succeeded"),
        (&failed, "job.failed", "failed"),
        (&late, "job.unknown", "unknown"),
        (&late, "job.succeeded", "succeeded"),
        (&held, "job.cancelled", "cancelled"),
    ] {
        let body = event(id, kind);
        assert_eq!(shape(&body), body_shape, "{kind}: {body:#}");
        chrono::DateTime::parse_from_rfc3339(body["timestamp"].as_str().unwrap()).unwrap();
        let data = &body["data"];
        let now = job(id).await;
        assert_eq!(data["status"], status, "{kind}");
        assert_eq!(data["owner"], app.alice.id.as_str());
        assert_eq!(data["task"], now["task"]);
        assert_eq!(data["idempotency_key"], now["idempotency_key"]);
        let present = |member: &str| !data[member].is_null();
        match kind {
            "job.succeeded" => {
                assert_eq!(data["completed_by"], now["completed_by"], "{body:#}");
                assert!(present("completed_by"), "{body:#}");
                assert!(data["result"].is_object(), "{body:#}");
                assert!(!present("failure_reason") && !present("attempt_id"));
            }
            "job.failed" => {
                assert_eq!(data["failure_reason"], now["failure_reason"]);
                assert!(present("failure_reason"), "{body:#}");
                assert!(!present("completed_by") && !present("result") && !present("attempt_id"));
            }
            "job.unknown" => {
                assert_eq!(data["attempt_id"], now["attempts"][0]["id"], "{body:#}");
                assert!(!present("completed_by") && !present("result"));
                assert!(!present("failure_reason"));
            }
            _ => {
                assert!(!present("completed_by") && !present("result"), "{body:#}");
                assert!(!present("failure_reason") && !present("attempt_id"));
            }
        }
    }
}
