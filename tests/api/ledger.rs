//! The usage ledger (docs/design.md, "Usage, prices and budgets") against
//! real HTTP fake providers: every answer's tokens and cost are recorded
//! once, the winner's, the loser's and the late one's alike; an unknown
//! attempt's usage is unknown, never zero; a cost is fixed when recorded.

use diesel::prelude::*;
use onejob::store::ledger::LedgerEntry;
use onejob::store::schema::usage_ledger;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::fake_provider::{
    config_of, strict_task_toml, Behaviour, FakeProvider, ProviderToml, Shape, WAIT,
};
use crate::support::harness::{spawn_app_with, summarize, TestApp, TestBackend};
use crate::support::metrics::{metric_sum, metrics};

/// A provider whose held requests pass the 400 ms soft timeout and whose
/// late answers are awaited far longer than any test.
fn held_provider(name: &str, base_url: &str) -> String {
    ProviderToml::openai(name, base_url)
        .late_result_ms(120_000)
        .toml()
}

/// Prices per million tokens: `slow` dear, `fast` cheap.
const PRICES: &str = r#"
[ledger]
currency = "EUR"

[[ledger.prices]]
provider = "slow"
model = "fake-model"
input = 2.0
output = 10.0
cached = 1.0

[[ledger.prices]]
provider = "fast"
model = "fake-model"
input = 1.0
output = 4.0
"#;

/// [`PRICES`]' currency with `provider`'s price alone.
fn price_of(provider: &str) -> String {
    let header = &PRICES[..PRICES.find("\n[[ledger.prices]]").unwrap()];
    let entry = PRICES
        .split("\n[[ledger.prices]]")
        .find(|entry| entry.starts_with(&format!("\nprovider = \"{provider}\"")))
        .unwrap();
    format!("{header}\n[[ledger.prices]]{entry}")
}

fn openai_usage(prompt: u64, completion: u64, cached: u64) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

async fn ledger_rows(app: &TestApp, job_id: &str) -> Vec<LedgerEntry> {
    let job_id = job_id.to_owned();
    app.with_conn(move |conn| {
        usage_ledger::table
            .filter(usage_ledger::job_id.eq(&job_id))
            .order(usage_ledger::recorded_at.asc())
            .select(LedgerEntry::as_select())
            .load(conn)
            .unwrap()
    })
    .await
}

async fn job_usage(app: &TestApp, token: &str, job_id: &str) -> Value {
    let response = app
        .get(token, &format!("/api/v1/jobs/{job_id}/usage"))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    response.json().await.unwrap()
}

async fn usage_report(app: &TestApp, token: &str, query: &str) -> Value {
    let response = app.get(token, &format!("/api/v1/usage?{query}")).await;
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "GET /api/v1/usage?{query}"
    );
    response.json().await.unwrap()
}

/// A job whose first attempt `slow` holds until it is unknown, then is
/// abandoned; `fast` answers the second attempt and wins; then `slow`'s
/// late answer arrives and loses. Both calls are in the ledger, at their
/// own provider's price, the late one marked late and lost.
async fn usage_and_cost_are_recorded_for_winning_losing_and_late_answers(backend: TestBackend) {
    let slow = FakeProvider::start(Shape::OpenAi).await;
    let fast = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        held_provider("slow", &slow.base_url),
        held_provider("fast", &fast.base_url),
        strict_task_toml("summarize", &["slow", "fast"], "Summarize: {{ text }}"),
        PRICES.to_owned(),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    let report = app.app.qualify(None, "fast", "summarize").await.unwrap();
    assert!(report.passed(), "{:?}", report.checks);

    slow.push(Behaviour::Hold);
    let job_id = app
        .create_job(&app.alice.token, "race", &summarize("race"))
        .await;
    let first = slow.wait_held_count(1).await.remove(0);
    app.wait_for_status(&job_id, "unknown", WAIT).await;
    let unknown = job_usage(&app, &app.alice.token, &job_id).await;
    assert_eq!(unknown["attempts"][0]["status"], "unknown");
    assert_eq!(unknown["attempts"][0]["cost"], Value::Null);
    assert_eq!(unknown["incomplete"], true);

    assert_eq!(
        app.abandon(&app.sue.token, &first, "slow provider")
            .await
            .status(),
        StatusCode::OK
    );
    fast.push(Behaviour::AnswerWithUsage {
        value: json!({"summary": "fast"}),
        usage: openai_usage(1000, 200, 0),
    });
    assert_eq!(
        app.start_attempt(&app.alice.token, &job_id, None)
            .await
            .status(),
        StatusCode::CREATED
    );
    app.wait_for_status(&job_id, "succeeded", WAIT).await;
    slow.release(
        &first,
        Behaviour::AnswerWithUsage {
            value: json!({"summary": "slow"}),
            usage: openai_usage(3000, 500, 1000),
        },
    );
    // The late answer is recorded when it arrives.
    let deadline = tokio::time::Instant::now() + WAIT;
    let rows = loop {
        let rows = ledger_rows(&app, &job_id).await;
        if rows.len() == 2 || tokio::time::Instant::now() > deadline {
            break rows;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(rows.len(), 2, "{rows:?}");
    let won = rows.iter().find(|r| r.provider == "fast").unwrap();
    let lost = rows.iter().find(|r| r.provider == "slow").unwrap();
    assert_eq!((won.kind.as_str(), won.late), ("won", false));
    assert_eq!(
        (won.prompt_tokens, won.completion_tokens, won.cached_tokens),
        (1000, 200, 0)
    );
    assert_eq!(won.usage_source, onejob::domain::UsageSource::Reported);
    // 1000 × 1.0 + 200 × 4.0 per million: 0.0018 EUR.
    assert_eq!(won.cost_micros, Some(1800));
    assert_eq!(won.currency.as_deref(), Some("EUR"));
    assert_eq!((lost.kind.as_str(), lost.late), ("lost", true));
    assert_eq!(
        (
            lost.prompt_tokens,
            lost.completion_tokens,
            lost.cached_tokens
        ),
        (3000, 500, 1000)
    );
    // 2000 × 2.0 + 1000 × 1.0 (cached) + 500 × 10.0 per million: 0.01 EUR.
    assert_eq!(lost.cost_micros, Some(10_000));

    let usage = job_usage(&app, &app.alice.token, &job_id).await;
    assert_eq!(usage["cost"], "0.0118");
    assert_eq!(usage["currency"], "EUR");
    assert_eq!(usage["incomplete"], false);
    let by_attempt = |id: &str| {
        usage["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["attempt_id"] == id)
            .cloned()
            .unwrap()
    };
    let late = by_attempt(&first);
    assert_eq!(
        (&late["status"], &late["kind"], &late["late"], &late["cost"]),
        (
            &json!("recorded"),
            &json!("lost"),
            &json!(true),
            &json!("0.01")
        )
    );

    // A late answer repeated (the same news again) is not counted twice.
    assert_eq!(ledger_rows(&app, &job_id).await.len(), 2);

    // Two replays of the key: duplicates absorbed, each estimated at the
    // job's own (winning) cost. The counts reach the database within a
    // flush interval.
    for _ in 0..2 {
        let replay = app
            .post_job(&app.alice.token, "race", &summarize("race"))
            .await;
        assert_eq!(replay.status(), StatusCode::OK);
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    let total = loop {
        let report = usage_report(&app, &app.ada.token, "").await;
        if report["total"]["replays"] == 2 || tokio::time::Instant::now() > deadline {
            break report["total"].clone();
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(total["replays"], 2, "{total:#}");
    assert_eq!(total["duplicates_estimated_spend"], "0.0036");

    let report = usage_report(&app, &app.ada.token, "group_by=provider").await;
    let total = &report["total"];
    assert_eq!(total["calls"], 2);
    assert_eq!(total["spend"], "0.0118");
    assert_eq!(
        (&total["lost_calls"], &total["lost_spend"]),
        (&json!(1), &json!("0.01"))
    );
    assert_eq!(
        (&total["late_calls"], &total["late_spend"]),
        (&json!(1), &json!("0.01"))
    );
    assert_eq!(total["prompt_tokens"], 4000);
    assert_eq!(total["cached_tokens"], 1000);
    let providers: Vec<&str> = report["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["key"].as_str().unwrap())
        .collect();
    assert_eq!(providers, ["fast", "slow"]);
    // The owner sees the same in their own report.
    let own = usage_report(&app, &app.alice.token, "").await;
    assert_eq!(own["total"]["spend"], "0.0118");
    // Another owner sees none of it.
    let other = usage_report(&app, &app.bob.token, "").await;
    assert_eq!(other["total"]["calls"], 0);

    let exposition = metrics(&app).await;
    let tokens = |provider: &str, kind: &str| {
        metric_sum(
            &exposition,
            "onejob_tokens_total",
            &[("provider", provider), ("kind", kind)],
        )
    };
    // The qualification's own calls to `fast` count too: at least ours.
    assert!(tokens("fast", "prompt") >= 1000.0);
    assert_eq!(tokens("slow", "prompt"), 3000.0);
    assert_eq!(tokens("slow", "cached"), 1000.0);
    assert_eq!(
        metric_sum(&exposition, "onejob_spend_total", &[("provider", "slow")]),
        10_000.0
    );
}

/// While an attempt's outcome is unknown, its usage is unknown: no ledger
/// row, shown as `unknown` (never 0), and the job's cost marked incomplete.
/// Priced and unpriced calls recorded in turn by one process: the ledger's
/// insert is kept prepared by its type, so its text must be one whatever a
/// row leaves empty. Each row keeps its own cost, or its lack of one.
async fn priced_and_unpriced_calls_in_turn_each_keep_their_cost(backend: TestBackend) {
    let fast = FakeProvider::start(Shape::OpenAi).await;
    let free = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        held_provider("fast", &fast.base_url),
        held_provider("free", &free.base_url),
        strict_task_toml("summarize", &["fast"], "Summarize: {{ text }}"),
        strict_task_toml("gratis", &["free"], "Summarize: {{ text }}"),
        // `free` has no price.
        price_of("fast"),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    for n in 0..4 {
        let priced = n % 2 == 1;
        let (provider, task) = match priced {
            true => (&fast, "summarize"),
            false => (&free, "gratis"),
        };
        provider.push(Behaviour::AnswerWithUsage {
            value: json!({"summary": "ok"}),
            usage: openai_usage(1000, 200, 0),
        });
        let body = json!({"task": task, "input": {"text": format!("turn {n}")}});
        let job_id = app
            .create_job(&app.alice.token, &format!("turn-{n}"), &body)
            .await;
        app.wait_for_status(&job_id, "succeeded", WAIT).await;
        let rows = ledger_rows(&app, &job_id).await;
        assert_eq!(rows.len(), 1, "job {n}: {rows:?}");
        let row = &rows[0];
        assert_eq!(row.cost_micros, priced.then_some(1800), "job {n}");
        assert_eq!(row.currency.as_deref(), priced.then_some("EUR"), "job {n}");
        assert_eq!(row.price_effective_from.is_some(), priced, "job {n}");
        assert_eq!((row.prompt_tokens, row.completion_tokens), (1000, 200));
    }
}

async fn an_unknown_attempt_shows_unknown_usage(backend: TestBackend) {
    let slow = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        held_provider("slow", &slow.base_url),
        strict_task_toml("summarize", &["slow"], "Summarize: {{ text }}"),
        price_of("slow"),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    slow.push(Behaviour::Hold);
    let job_id = app
        .create_job(&app.alice.token, "unknown", &summarize("unknown"))
        .await;
    let attempt = slow.wait_held_count(1).await.remove(0);
    app.wait_for_status(&job_id, "unknown", WAIT).await;

    let usage = job_usage(&app, &app.alice.token, &job_id).await;
    let only = &usage["attempts"][0];
    assert_eq!(only["attempt_id"], attempt.as_str());
    assert_eq!(only["status"], "unknown");
    for field in ["prompt_tokens", "completion_tokens", "cost", "kind"] {
        assert_eq!(only[field], Value::Null, "{field} is unknown, not zero");
    }
    assert_eq!(usage["incomplete"], true);
    assert!(ledger_rows(&app, &job_id).await.is_empty());
    let report = usage_report(&app, &app.ada.token, "").await;
    assert_eq!(report["total"]["calls"], 0);

    // The job page says so too.
    app.set_password("alice", "correct horse battery").await;
    let page = crate::support::harness::FormClient::new(&app);
    page.sign_in("alice", "correct horse battery").await;
    let html = page
        .get(&format!("/jobs/{job_id}"))
        .await
        .text()
        .await
        .unwrap();
    assert!(
        html.contains("usage unknown"),
        "the job page shows the unknown usage"
    );
    slow.release(&attempt, Behaviour::Answer(json!({"summary": "late"})));
}

/// A cost is computed with the price in force when the answer is
/// recorded, and kept: a price that takes effect later prices later calls
/// only.
async fn a_price_change_leaves_past_costs_alone(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let change_at = chrono::Utc::now() + chrono::Duration::seconds(4);
    let toml = [
        ProviderToml::openai("fake", &fake.base_url).toml(),
        strict_task_toml("summarize", &["fake"], "Summarize: {{ text }}"),
        format!(
            r#"
[[ledger.prices]]
provider = "fake"
input = 1.0
output = 1.0

[[ledger.prices]]
provider = "fake"
input = 3.0
output = 3.0
effective_from = "{}"
"#,
            change_at.to_rfc3339()
        ),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    let answer = || Behaviour::AnswerWithUsage {
        value: json!({"summary": "s"}),
        usage: openai_usage(100_000, 100_000, 0),
    };
    fake.push(answer());
    let before = app
        .create_job(&app.alice.token, "before", &summarize("before"))
        .await;
    app.wait_for_status(&before, "succeeded", WAIT).await;
    let old = ledger_rows(&app, &before).await;
    assert_eq!(old.len(), 1);
    assert!(
        old[0].recorded_at.millis() < change_at.timestamp_millis(),
        "the first answer was recorded before the change (the machine was too slow to show it)"
    );
    assert_eq!(old[0].cost_micros, Some(200_000), "0.2 at the old price");

    let wait = change_at.timestamp_millis() - chrono::Utc::now().timestamp_millis();
    tokio::time::sleep(std::time::Duration::from_millis(wait.max(0) as u64 + 50)).await;
    fake.push(answer());
    let after = app
        .create_job(&app.alice.token, "after", &summarize("after"))
        .await;
    app.wait_for_status(&after, "succeeded", WAIT).await;
    let new = ledger_rows(&app, &after).await;
    assert_eq!(new[0].cost_micros, Some(600_000), "0.6 at the new price");
    assert_eq!(
        new[0].price_effective_from.map(|at| at.millis()),
        Some(change_at.timestamp_millis())
    );
    // The first job's cost is what it was.
    assert_eq!(ledger_rows(&app, &before).await, old);
    let report = usage_report(&app, &app.alice.token, "").await;
    assert_eq!(report["total"]["spend"], "0.80");
}

/// Admins set, read and remove budgets over the API, audited; an owner
/// reads their own and no one else's.
async fn admins_set_budgets_and_owners_read_their_own(backend: TestBackend) {
    let app = crate::support::harness::spawn_app(backend).await;
    let put = |token: String, body: Value| {
        let app = &app;
        async move {
            app.client
                .put(app.url("/api/v1/budgets/alice"))
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .unwrap()
        }
    };
    let refused = put(
        app.alice.token.clone(),
        json!({"spend_limit": 5, "reason": "mine"}),
    )
    .await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let set = put(
        app.ada.token.clone(),
        json!({"spend_limit": 12.5, "token_limit": 1000, "reason": "trial account"}),
    )
    .await;
    assert_eq!(set.status(), StatusCode::OK);
    let budget: Value = set.json().await.unwrap();
    assert_eq!(budget["spend_limit"], "12.50");
    assert_eq!(budget["token_limit"], 1000);
    let own = app.get(&app.alice.token, "/api/v1/budgets/alice").await;
    assert_eq!(own.status(), StatusCode::OK);
    assert_eq!(
        app.get(&app.bob.token, "/api/v1/budgets/alice")
            .await
            .status(),
        StatusCode::FORBIDDEN
    );
    let bad = put(
        app.ada.token.clone(),
        json!({"spend_limit": -1, "reason": "negative"}),
    )
    .await;
    assert_eq!(bad.status(), StatusCode::UNPROCESSABLE_ENTITY);
    // Finer than a millionth: refused, never rounded silently.
    let finer = put(
        app.ada.token.clone(),
        json!({"spend_limit": 12.3456789, "reason": "too fine"}),
    )
    .await;
    assert_eq!(finer.status(), StatusCode::UNPROCESSABLE_ENTITY);
    // To the millionth, and a whole number written as 1000.0.
    let fine = put(
        app.ada.token.clone(),
        json!({"spend_limit": 12.345679, "token_limit": 1000.0, "reason": "exact"}),
    )
    .await;
    assert_eq!(fine.status(), StatusCode::OK);
    let fine: Value = fine.json().await.unwrap();
    assert_eq!(fine["spend_limit"], "12.345679");
    assert_eq!(fine["token_limit"], 1000);
    let removed = app
        .client
        .delete(app.url("/api/v1/budgets/alice"))
        .bearer_auth(&app.ada.token)
        .json(&json!({"reason": "trial over"}))
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        app.get(&app.ada.token, "/api/v1/budgets/alice")
            .await
            .status(),
        StatusCode::NOT_FOUND
    );
    let audit: Vec<String> = app
        .with_conn(|conn| {
            onejob::store::schema::audit_log::table
                .select(onejob::store::schema::audit_log::action)
                .load::<String>(conn)
                .unwrap()
        })
        .await;
    assert!(audit.contains(&"set_budget".to_owned()), "{audit:?}");
    assert!(audit.contains(&"remove_budget".to_owned()), "{audit:?}");
}

/// Past the budget, a chat completion is refused in OpenAI's shape, so the
/// SDKs raise it and do not retry; its replay is still answered.
async fn a_chat_completion_past_the_budget_is_refused_in_openais_shape(backend: TestBackend) {
    let upstream = FakeProvider::start(Shape::OpenAi).await;
    let toml = format!(
        "{}\n[[tasks]]\nname = \"gpt-safe\"\nkind = \"chat\"\nproviders = [\"up\"]\n\n[[ledger.prices]]\nprovider = \"up\"\ninput = 1.0\noutput = 1.0\n",
        ProviderToml::openai("up", &format!("{}/v1", upstream.base_url)).toml()
    );
    let app = spawn_app_with(backend, config_of(&toml)).await;
    // The first answer uses 200 tokens: past the limit once recorded.
    upstream.set_default(Behaviour::AnswerWithUsage {
        value: json!("hello"),
        usage: openai_usage(100, 100, 0),
    });
    // Room for one request's reservation (its prompt estimate and 20).
    let set = app
        .client
        .put(app.url("/api/v1/budgets/alice"))
        .bearer_auth(&app.ada.token)
        .json(&json!({"token_limit": 120, "reason": "test"}))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), StatusCode::OK);
    let hello = |text: &str| {
        json!({"model": "gpt-safe", "max_tokens": 20,
               "messages": [{"role": "user", "content": text}]})
    };
    let first = crate::support::harness::chat_request(&app, "first", &hello("hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let refused = crate::support::harness::chat_request(&app, "second", &hello("hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        refused
            .headers()
            .get("x-should-retry")
            .and_then(|v| v.to_str().ok()),
        Some("false")
    );
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["type"], "insufficient_quota", "{body:#}");
    assert_eq!(body["error"]["code"], "budget_exceeded");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("monthly token limit of 120 tokens") && message.contains("resets at"),
        "{message}"
    );
    let replay = crate::support::harness::chat_request(&app, "first", &hello("hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), StatusCode::OK, "a replay is never refused");
    let exposition = metrics(&app).await;
    assert_eq!(
        metric_sum(&exposition, "onejob_budget_refusals_total", &[]),
        1.0
    );
}

on_both_backends!(
    a_chat_completion_past_the_budget_is_refused_in_openais_shape,
    priced_and_unpriced_calls_in_turn_each_keep_their_cost,
    usage_and_cost_are_recorded_for_winning_losing_and_late_answers,
    an_unknown_attempt_shows_unknown_usage,
    a_price_change_leaves_past_costs_alone,
    admins_set_budgets_and_owners_read_their_own,
);
