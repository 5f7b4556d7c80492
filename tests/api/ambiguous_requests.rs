//! A request that two readers could read two ways is refused, at every
//! door: a JSON body that names a member twice, two idempotency keys, two
//! credentials naming different tokens. And what a client chooses freely
//! is bounded where a budget depends on it: the output-token limit a job
//! reserves for, a spend limit finer than the ledger counts, a webhook
//! address that reaches a private network through an IPv6 form.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::fake_provider::{answer, config_of, FakeProvider, ProviderToml, Shape, WAIT};
use crate::support::harness::{
    assert_problem, hidden_value, spawn_app_with, summarize, FormClient, TestApp, TestBackend,
};

/// A chat route and a summarize task on the fake, webhooks signed (their
/// addresses checked as in production).
async fn app_with_doors(backend: TestBackend) -> (FakeProvider, TestApp) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    fake.set_default(answer("done"));
    let mut config = config_of(&format!(
        r#"{}
[[tasks]]
name = "summarize"
providers = ["up"]
input_fields = ["text"]
template = "Summarize: {{{{ text }}}}"

[[tasks]]
name = "gpt-safe"
kind = "chat"
providers = ["up"]
"#,
        ProviderToml::openai("up", &format!("{}/v1", fake.base_url)).toml()
    ));
    config.webhooks.key = Some(onejob::domain::webhook::WebhookKey::new(
        &onejob::domain::Secret::new(crate::webhooks::WEBHOOK_KEY),
    ));
    let app = spawn_app_with(backend, config).await;
    (fake, app)
}

/// The body each create door takes, well formed.
fn create_doors() -> Vec<(&'static str, Value)> {
    let messages = json!([{"role": "user", "content": "hi"}]);
    vec![
        ("/api/v1/jobs", summarize("a")),
        (
            "/v1/chat/completions",
            json!({"model": "gpt-safe", "messages": messages}),
        ),
        (
            "/v1/messages",
            json!({"model": "gpt-safe", "max_tokens": 64, "messages": messages}),
        ),
        ("/v1/responses", json!({"model": "gpt-safe", "input": "hi"})),
    ]
}

async fn jobs_of(app: &TestApp, token: &str) -> usize {
    let page: Value = app
        .get(token, "/api/v1/jobs?limit=100")
        .await
        .json()
        .await
        .unwrap();
    page["jobs"].as_array().unwrap().len()
}

/// Every operation of the served OpenAPI document that takes a JSON body
/// refuses one that names a member twice, so a door added later that
/// reads its body another way fails here. Signed provider callbacks are
/// checked with a signature in `callbacks`.
async fn every_json_body_refuses_a_member_named_twice(backend: TestBackend) {
    let (_fake, app) = app_with_doors(backend).await;
    let alice = app.alice.token.clone();
    let job = app.create_job(&alice, "fixture", &summarize("x")).await;
    let stored = app.wait_for_status(&job, "succeeded", WAIT).await;
    let attempt = stored["attempts"][0]["id"].as_str().unwrap().to_owned();
    let doc: Value = app
        .client
        .get(app.url("/api/v1/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut checked = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            if operation["requestBody"]["content"]["application/json"].is_null()
                || path.starts_with("/api/v1/callbacks/")
            {
                continue;
            }
            let id = if path.starts_with("/api/v1/attempts/") {
                attempt.as_str()
            } else if path.starts_with("/api/v1/webhooks/") {
                "01a2426c-0000-7000-8000-000000000000"
            } else {
                job.as_str()
            };
            let url = path
                .replace("{owner}", "alice")
                .replace("{event_id}", id)
                .replace("{id}", id);
            let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let send = |token: String| {
                app.client
                    .request(method.clone(), app.url(&url))
                    .bearer_auth(token)
                    .header("Idempotency-Key", format!("twice-{}", checked.len()))
                    .header("Content-Type", "application/json")
                    .body(r#"{"reason": "one", "reason": "two", "model": "gpt-safe"}"#)
                    .send()
            };
            let mut response = send(alice.clone()).await.unwrap();
            // Some staff actions check the role before reading the body.
            if response.status() == StatusCode::FORBIDDEN {
                response = send(app.ada.token.clone()).await.unwrap();
            }
            let status = response.status();
            let text = response.text().await.unwrap();
            assert!(
                matches!(status.as_u16(), 400 | 422) && text.contains("appears twice"),
                "{method} {path}: {status} {text}"
            );
            checked.push(format!("{} {path}", method.as_str().to_lowercase()));
        }
    }
    for door in [
        "post /api/v1/jobs",
        "post /v1/chat/completions",
        "post /v1/messages",
        "post /v1/responses",
        "put /api/v1/budgets/{owner}",
        "post /api/v1/webhooks",
    ] {
        assert!(checked.iter().any(|c| c == door), "{door} in {checked:?}");
    }
    eprintln!(
        "{} operations refused a member named twice: {checked:?}",
        checked.len()
    );
    assert_eq!(jobs_of(&app, &alice).await, 1, "nothing was created");
}

/// Two `Idempotency-Key` headers, even equal ones, are refused on every
/// create door with `invalid-idempotency-key` naming why; so is a browser
/// form with two key fields. Nothing is created.
async fn two_idempotency_keys_are_refused_at_every_create_door(backend: TestBackend) {
    let (_fake, app) = app_with_doors(backend).await;
    let alice = app.alice.token.clone();
    for (door, body) in create_doors() {
        for (first, second) in [("key-a", "key-b"), ("key-a", "key-a")] {
            let response = app
                .client
                .post(app.url(door))
                .bearer_auth(&alice)
                .header("Idempotency-Key", first)
                .header("Idempotency-Key", second)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{door}");
            let text = response.text().await.unwrap();
            assert!(
                text.contains("carries 2 idempotency keys"),
                "{door}: {text}"
            );
            if door.starts_with("/api/") {
                assert!(text.contains("invalid-idempotency-key"), "{text}");
            }
        }
    }
    assert_eq!(jobs_of(&app, &alice).await, 0);

    app.set_password("alice", "alice-password").await;
    let browser = FormClient::new(&app);
    browser.sign_in("alice", "alice-password").await;
    let (_, page) = browser.open_submit_form("?task=summarize").await;
    let (csrf, key) = (
        hidden_value(&page, "csrf"),
        hidden_value(&page, "idempotency_key"),
    );
    let response = browser
        .post_form(
            "/jobs",
            &[
                ("csrf", csrf.as_str()),
                ("idempotency_key", key.as_str()),
                ("idempotency_key", "another-key"),
                ("task", "summarize"),
                ("input.text", "hello"),
            ],
        )
        .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let text = response.text().await.unwrap();
    assert!(text.contains("2 submission keys"), "{text}");
    assert_eq!(jobs_of(&app, &alice).await, 0);
}

/// Two credentials that name different tokens are refused on every door
/// (the API, each `/v1` door), whichever headers carry them; the same
/// token twice is one caller.
async fn two_credentials_naming_different_tokens_are_refused(backend: TestBackend) {
    let (_fake, app) = app_with_doors(backend).await;
    let (alice, bob) = (app.alice.token.clone(), app.bob.token.clone());
    let mut doors: Vec<(Method, &str, Option<Value>)> = create_doors()
        .into_iter()
        .map(|(door, body)| (Method::POST, door, Some(body)))
        .collect();
    doors.push((Method::GET, "/api/v1/jobs", None));
    doors.push((Method::GET, "/v1/models", None));
    let mut n = 0;
    for (method, door, body) in &doors {
        let conflicting: [&[(&str, String)]; 3] = [
            &[
                ("Authorization", format!("Bearer {alice}")),
                ("x-api-key", bob.clone()),
            ],
            &[
                ("Authorization", format!("Bearer {alice}")),
                ("Authorization", format!("Bearer {bob}")),
            ],
            &[("x-api-key", alice.clone()), ("x-api-key", bob.clone())],
        ];
        for headers in conflicting {
            n += 1;
            let mut request = app
                .client
                .request(method.clone(), app.url(door))
                .header("Idempotency-Key", format!("cred-{n}"));
            for (name, value) in headers {
                request = request.header(*name, value);
            }
            if let Some(body) = body {
                request = request.json(body);
            }
            let response = request.send().await.unwrap();
            assert_eq!(
                response.status(),
                StatusCode::UNAUTHORIZED,
                "{door} with {:?}",
                headers.iter().map(|(n, _)| n).collect::<Vec<_>>()
            );
        }
        // The same token twice is fine.
        n += 1;
        let mut request = app
            .client
            .request(method.clone(), app.url(door))
            .header("Idempotency-Key", format!("cred-{n}"))
            .header("Authorization", format!("Bearer {alice}"))
            .header("x-api-key", alice.clone());
        if let Some(body) = body {
            request = request.json(body);
        }
        let status = request.send().await.unwrap().status();
        assert!(status.is_success(), "{door} with one token twice: {status}");
    }
    assert_eq!(jobs_of(&app, &bob).await, 0, "nothing acted as bob");
}

/// A job's output-token limit above what its route can produce (the
/// largest context window of its providers, 128000 for an OpenAI-kind
/// one) is refused at each door, naming the field; one within it runs.
async fn an_output_token_limit_past_the_routes_ceiling_is_refused(backend: TestBackend) {
    let (_fake, app) = app_with_doors(backend).await;
    let alice = app.alice.token.clone();
    let messages = json!([{"role": "user", "content": "hi"}]);
    for (door, body) in [
        (
            "/v1/chat/completions",
            json!({"model": "gpt-safe", "messages": messages, "max_tokens": 1_000_000_000}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "gpt-safe", "messages": messages, "max_completion_tokens": 128_001}),
        ),
        (
            "/v1/messages",
            json!({"model": "gpt-safe", "messages": messages, "max_tokens": 1_000_000_000}),
        ),
        (
            "/v1/responses",
            json!({"model": "gpt-safe", "input": "hi", "max_output_tokens": 1_000_000_000}),
        ),
    ] {
        let response = app
            .client
            .post(app.url(door))
            .bearer_auth(&alice)
            .header("Idempotency-Key", format!("big-{door}"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{door}");
        let text = response.text().await.unwrap();
        assert!(
            text.contains("max_tokens") && text.contains("at most 128000"),
            "{door}: {text}"
        );
    }
    assert_eq!(jobs_of(&app, &alice).await, 0);
    let within = app
        .client
        .post(app.url("/v1/chat/completions"))
        .bearer_auth(&alice)
        .header("Idempotency-Key", "within")
        .json(&json!({"model": "gpt-safe", "messages": messages, "max_tokens": 128_000}))
        .send()
        .await
        .unwrap();
    assert_eq!(within.status(), StatusCode::OK);
}

/// A spend limit finer than a millionth is refused, not rounded to a
/// limit the admin did not set; nothing is stored.
async fn a_spend_limit_finer_than_the_ledger_counts_is_refused(backend: TestBackend) {
    let (_fake, app) = app_with_doors(backend).await;
    let put = |limit: Value| {
        app.client
            .put(app.url("/api/v1/budgets/alice"))
            .bearer_auth(&app.ada.token)
            .json(&json!({"spend_limit": limit, "reason": "a plan"}))
            .send()
    };
    let refused = put(json!(0.0000001)).await.unwrap();
    let problem = assert_problem(refused, StatusCode::UNPROCESSABLE_ENTITY, "invalid-body").await;
    assert_eq!(problem["field"], "spend_limit");
    assert!(problem["detail"].as_str().unwrap().contains("0.0000001"));
    let none = app.get(&app.ada.token, "/api/v1/budgets/alice").await;
    assert_eq!(none.status(), StatusCode::NOT_FOUND, "nothing was stored");
    let kept = put(json!(12.345678)).await.unwrap();
    assert_eq!(kept.status(), StatusCode::OK);
    let kept: Value = kept.json().await.unwrap();
    assert_eq!(kept["spend_limit"], "12.345678");
}

/// A webhook address written as an IPv6 form that carries a private,
/// loopback or link-local IPv4 address is refused at registration.
async fn webhook_addresses_that_carry_a_private_ipv4_are_refused(backend: TestBackend) {
    let (_fake, app) = app_with_doors(backend).await;
    for url in [
        "http://[64:ff9b::a9fe:a9fe]/",
        "http://[64:ff9b::7f00:1]/",
        "http://[64:ff9b:1::808:808]/",
        "http://[2002:a9fe:a9fe::1]/",
        "http://[2002:c0a8:101::1]/",
        "http://[::ffff:0:a9fe:a9fe]/",
        "http://[::ffff:169.254.169.254]/",
        "http://[::10.0.0.1]/",
        "http://[2001:0:4136:e378::5601:5601]/",
        "http://[2001:0:a00:1::f7f7:f7f7]/",
    ] {
        let response = app
            .client
            .post(app.url("/api/v1/webhooks"))
            .bearer_auth(&app.alice.token)
            .json(&json!({"url": url, "events": ["job.succeeded"]}))
            .send()
            .await
            .unwrap();
        let problem =
            assert_problem(response, StatusCode::UNPROCESSABLE_ENTITY, "invalid-body").await;
        assert_eq!(problem["field"], "url", "{url}");
    }
    let listed: Value = app
        .get(&app.alice.token, "/api/v1/webhooks")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed["webhooks"].as_array().unwrap().len(), 0);
}

on_both_backends!(
    every_json_body_refuses_a_member_named_twice,
    two_idempotency_keys_are_refused_at_every_create_door,
    two_credentials_naming_different_tokens_are_refused,
    an_output_token_limit_past_the_routes_ceiling_is_refused,
    a_spend_limit_finer_than_the_ledger_counts_is_refused,
    webhook_addresses_that_carry_a_private_ipv4_are_refused,
);
