//! `/metrics`: every series is exported, each moves when what it counts
//! happens (a job created, replayed and refused, an attempt going unknown,
//! abandoned, won and lost, a race), and only admins may read them. The
//! stream series (time to first token, streams followed, stream limits)
//! move in `crate::streaming`, where streams run.

use std::collections::HashMap;

use reqwest::StatusCode;
use serde_json::Value;

use crate::support::fake_provider::{
    answer, config_of, strict_task_toml, Behaviour, FakeProvider, ProviderToml, Shape, WAIT,
};
use crate::support::harness::{
    assert_problem, spawn_app, spawn_app_with, summarize, TestApp, TestBackend,
};

/// Every family onejob exports, with its Prometheus type.
const FAMILIES: [(&str, &str); 16] = [
    ("onejob_jobs_created", "counter"),
    ("onejob_jobs_replayed", "counter"),
    ("onejob_idempotency_conflicts", "counter"),
    ("onejob_twins_joined", "counter"),
    ("onejob_attempts", "counter"),
    ("onejob_races", "counter"),
    ("onejob_provider_call_seconds", "histogram"),
    ("onejob_claim_lag_seconds", "histogram"),
    ("onejob_pool_wait_seconds", "histogram"),
    ("onejob_http_request_seconds", "histogram"),
    ("onejob_pruned_rows", "counter"),
    ("onejob_unknown_attempts", "gauge"),
    ("onejob_oldest_unknown_attempt_age_seconds", "gauge"),
    ("onejob_time_to_first_token_seconds", "histogram"),
    ("onejob_streams_followed", "gauge"),
    ("onejob_stream_limits_hit", "counter"),
];

/// One scrape: the text, and each sample by its series (name and labels,
/// as written).
struct Scrape {
    text: String,
    samples: HashMap<String, f64>,
}

impl Scrape {
    /// The sample's value; a series not written yet counts as 0.
    fn value(&self, series: &str) -> f64 {
        self.samples.get(series).copied().unwrap_or(0.0)
    }

    fn announces(&self, family: &str, kind: &str) -> bool {
        self.text
            .lines()
            .any(|l| l == format!("# TYPE {family} {kind}"))
    }
}

async fn scrape(app: &TestApp) -> Scrape {
    let response = app.get(&app.ada.token, "/metrics").await;
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response.headers()["content-type"].to_str().unwrap();
    assert_eq!(
        content_type, "application/openmetrics-text; version=1.0.0; charset=utf-8",
        "what the text is: counters' samples end in _total, and # EOF ends it"
    );
    let text = response.text().await.unwrap();
    assert!(text.ends_with("# EOF\n"), "{text}");
    let samples = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("a sample line");
            let value = value.parse().unwrap_or_else(|_| panic!("{l}"));
            (series.to_owned(), value)
        })
        .collect();
    Scrape { text, samples }
}

fn attempts(provider: &str, state: &str) -> String {
    format!("onejob_attempts_total{{provider=\"{provider}\",state=\"{state}\"}}")
}

fn http(method: &str, route: &str, status: u16) -> String {
    format!(
        "onejob_http_request_seconds_count{{method=\"{method}\",route=\"{route}\",status=\"{status}\"}}"
    )
}

fn provider_calls(provider: &str) -> String {
    format!("onejob_provider_call_seconds_count{{provider=\"{provider}\"}}")
}

const UNKNOWN_NOW: &str = "onejob_unknown_attempts";
const OLDEST_UNKNOWN: &str = "onejob_oldest_unknown_attempt_age_seconds";
const CLAIM_LAG: &str = "onejob_claim_lag_seconds_count";
const POOL_WAITS: &str = "onejob_pool_wait_seconds_count";

/// Two fake providers that hold every answer until the test releases it:
/// `slow` first, then `fast` (qualified, so it may take a new attempt).
async fn held_pair(backend: TestBackend) -> (TestApp, FakeProvider, FakeProvider) {
    let slow = FakeProvider::start(Shape::OpenAi).await;
    let fast = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        ProviderToml::openai("slow", &slow.base_url).toml(),
        ProviderToml::openai("fast", &fast.base_url).toml(),
        strict_task_toml("summarize", &["slow", "fast"], "Summarize: {{ text }}"),
    ]
    .concat();
    let mut config = config_of(&toml);
    config.retention.jobs_days = Some(1);
    config.retention.races_days = Some(1);
    config.retention.audit_days = Some(1);
    let app = spawn_app_with(backend, config).await;
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

async fn the_series_move_as_jobs_run(backend: TestBackend) {
    let (app, slow, fast) = held_pair(backend).await;
    let start = scrape(&app).await;
    // Every family but the HTTP timings (which appear with the first
    // answered request) is there from the start, each provider's and each
    // table's series at zero.
    for (family, kind) in FAMILIES {
        assert!(
            start.announces(family, kind) || family == "onejob_http_request_seconds",
            "{family} ({kind}) in:\n{}",
            start.text
        );
    }
    for series in [
        "onejob_jobs_created_total".to_owned(),
        attempts("slow", "unknown"),
        attempts("fast", "succeeded"),
        provider_calls("slow"),
        "onejob_pruned_rows_total{table=\"jobs\"}".to_owned(),
        UNKNOWN_NOW.to_owned(),
        "onejob_streams_followed".to_owned(),
        "onejob_stream_limits_hit_total{limit=\"followers\"}".to_owned(),
        "onejob_stream_limits_hit_total{limit=\"buffer\"}".to_owned(),
        "onejob_time_to_first_token_seconds_count{provider=\"slow\"}".to_owned(),
    ] {
        assert_eq!(start.samples.get(&series), Some(&0.0), "{series}");
    }

    // Created, replayed, refused.
    let body = summarize("metrics");
    let job_id = app.create_job(&app.alice.token, "m-1", &body).await;
    let replay = app.post_job(&app.alice.token, "m-1", &body).await;
    assert_eq!(replay.status(), StatusCode::OK);
    let conflict = app
        .post_job(&app.alice.token, "m-1", &summarize("other"))
        .await;
    assert_eq!(conflict.status(), StatusCode::CONFLICT);

    // The primary holds its answer past the soft timeout: unknown.
    let job = app.wait_for_status(&job_id, "unknown", WAIT).await;
    let first = job["attempts"][0]["id"].as_str().unwrap().to_owned();
    slow.wait_held(&first).await;
    let during = scrape(&app).await;
    assert_eq!(during.value("onejob_jobs_created_total"), 1.0);
    assert_eq!(during.value("onejob_jobs_replayed_total"), 1.0);
    assert_eq!(during.value("onejob_idempotency_conflicts_total"), 1.0);
    assert_eq!(during.value(&attempts("slow", "unknown")), 1.0);
    assert_eq!(during.value(UNKNOWN_NOW), 1.0);
    assert!(
        during.value(OLDEST_UNKNOWN) >= 0.4,
        "sent at least the 400 ms soft timeout ago: {}",
        during.value(OLDEST_UNKNOWN)
    );
    assert_eq!(during.value(CLAIM_LAG), 1.0, "one attempt sent");
    assert_eq!(during.value(&provider_calls("slow")), 0.0, "no answer yet");
    assert_eq!(during.value(&http("POST", "/api/v1/jobs", 201)), 1.0);
    assert_eq!(during.value(&http("POST", "/api/v1/jobs", 200)), 1.0);
    assert_eq!(during.value(&http("POST", "/api/v1/jobs", 409)), 1.0);
    assert!(during.value(&http("GET", "/api/v1/jobs/{id}", 200)) >= 1.0);
    assert_eq!(
        during.value(&http("GET", "/metrics", 200)),
        1.0,
        "the first scrape, timed once it was answered"
    );
    assert!(during.value(POOL_WAITS) > start.value(POOL_WAITS));
    assert!(during.value("onejob_pool_wait_seconds_sum") >= 0.0);

    // Support abandons it; the fallback is sent and wins.
    let response = app
        .abandon(&app.sue.token, &first, "the primary is stuck")
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let response = app.start_attempt(&app.alice.token, &job_id, None).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let second: Value = response.json().await.unwrap();
    let second = second["id"].as_str().unwrap().to_owned();
    fast.wait_held(&second).await;
    fast.release(&second, answer("from the fallback"));
    app.wait_for_status(&job_id, "succeeded", WAIT).await;

    // Then the primary's late answer arrives and loses: a race.
    slow.release(&first, answer("too late"));
    app.wait_for_job(&job_id, WAIT, |j| j["attempts"][0]["outcome"] == "lost")
        .await;
    let end = scrape(&app).await;
    assert_eq!(end.value(&attempts("slow", "abandoned")), 1.0);
    assert_eq!(end.value(&attempts("fast", "succeeded")), 1.0);
    assert_eq!(
        end.value(&attempts("slow", "succeeded")),
        1.0,
        "the loser's answer was a success too"
    );
    assert_eq!(end.value("onejob_races_total"), 1.0);
    assert_eq!(end.value(&provider_calls("fast")), 1.0);
    assert_eq!(end.value(&provider_calls("slow")), 1.0);
    assert_eq!(end.value(CLAIM_LAG), 2.0, "two attempts sent");
    assert_eq!(end.value(UNKNOWN_NOW), 0.0);
    assert_eq!(end.value(OLDEST_UNKNOWN), 0.0);
    assert_eq!(
        end.value(&http("POST", "/api/v1/attempts/{id}/abandon", 200)),
        1.0
    );
    assert_eq!(
        end.value(&http("POST", "/api/v1/jobs/{id}/attempts", 201)),
        1.0
    );
    assert_eq!(end.value(&http("GET", "/metrics", 200)), 2.0);
    assert!(end.value(POOL_WAITS) > during.value(POOL_WAITS));
    assert_eq!(
        end.value("onejob_jobs_created_total"),
        1.0,
        "a new attempt is not a new job"
    );
    for (family, kind) in FAMILIES {
        assert!(end.announces(family, kind), "{family} ({kind})");
    }

    // Two days on, retention removes the race entry, the abandon's audit
    // entry, and then the job with its two attempts.
    let pruned = app
        .app
        .prune_expired(onejob::domain::Timestamp::now() + 2 * 86_400_000)
        .await
        .unwrap();
    assert_eq!(
        (
            pruned.jobs,
            pruned.attempts,
            pruned.race_entries,
            pruned.audit_entries
        ),
        (1, 2, 1, 1)
    );
    let pruned = scrape(&app).await;
    for (table, rows) in [
        ("jobs", 1.0),
        ("attempts", 2.0),
        ("race_log", 1.0),
        ("audit_log", 1.0),
    ] {
        assert_eq!(
            pruned.value(&format!("onejob_pruned_rows_total{{table=\"{table}\"}}")),
            rows,
            "{table}"
        );
    }
}

async fn only_admins_read_the_metrics(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let response = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_problem(response, StatusCode::UNAUTHORIZED, "unauthorized").await;
    let response = app.get("not-a-token", "/metrics").await;
    assert_problem(response, StatusCode::UNAUTHORIZED, "unauthorized").await;
    for (who, token) in [("a user", &app.alice.token), ("support", &app.sue.token)] {
        let response = app.get(token, "/metrics").await;
        let problem = assert_problem(response, StatusCode::FORBIDDEN, "forbidden").await;
        assert!(
            !problem.to_string().contains("onejob_"),
            "{who} sees no series: {problem}"
        );
    }
    let admin = scrape(&app).await;
    assert!(admin.announces("onejob_jobs_created", "counter"));
    // The refusals were counted, under their own statuses.
    assert_eq!(admin.value(&http("GET", "/metrics", 401)), 2.0);
    assert_eq!(admin.value(&http("GET", "/metrics", 403)), 2.0);
}

on_both_backends!(the_series_move_as_jobs_run, only_admins_read_the_metrics);
