//! Qualification and the failover gate (docs/design.md, "Qualification"),
//! against real HTTP fake providers: what a contract check runs and how it
//! fails; that a change of template, model or output schema makes a passed
//! run stale; and that automatic failover and new attempts go only to the
//! job's primary and to providers whose qualification is current.

use diesel::prelude::*;
use onejob::app::qualification::{check_contract, Check};
use onejob::app::App;
use onejob::domain::{AttemptState, JobStatus, RaceResult};
use onejob::providers::Providers;
use onejob::store::schema::{audit_log, qualifications};
use onejob::store::QualificationRun;
use reqwest::StatusCode;
use serde_json::json;

use crate::support::db::{stored, StoredJob};
use crate::support::fake_provider::{
    config_of, settled_attempt, strict_task_toml, Behaviour, FakeProvider, ProviderToml, Shape,
    WAIT,
};
use crate::support::harness::{
    assert_problem, spawn_app_with, summarize, PreparedApp, TestApp, TestBackend,
};

const TEMPLATE: &str = "Summarize: {{ text }}";

/// An OpenAI-compatible provider entry running `model`, whose soft timeout
/// no answer from 127.0.0.1 comes near (an answer is never raced by the
/// clock into `unknown`).
fn provider(name: &str, base_url: &str, model: &str) -> String {
    ProviderToml::openai(name, base_url)
        .model(model)
        .timeout_ms(30_000)
        .late_result_ms(5000)
        .connect_timeout_ms(Some(1000))
        .toml()
}

/// The audit rows about a job: `(action, attempt_id, reason)`.
async fn audit_of(app: &TestApp, job_id: &str) -> Vec<(String, Option<String>, String)> {
    let job_id = job_id.to_owned();
    app.with_conn(move |conn| {
        audit_log::table
            .filter(audit_log::job_id.eq(&job_id))
            .order((audit_log::at.asc(), audit_log::id.asc()))
            .select((audit_log::action, audit_log::attempt_id, audit_log::reason))
            .load(conn)
            .unwrap()
    })
    .await
}

/// Every stored qualification run of `provider`, oldest first.
async fn runs_of(prepared: &PreparedApp, provider: &str) -> Vec<QualificationRun> {
    let provider = provider.to_owned();
    prepared
        .with_conn(move |conn| {
            qualifications::table
                .filter(qualifications::provider.eq(&provider))
                .order((qualifications::qualified_at.asc(), qualifications::id.asc()))
                .select(QualificationRun::as_select())
                .load(conn)
                .unwrap()
        })
        .await
}

async fn failover_skips_an_unqualified_provider_and_takes_a_qualified_one(backend: TestBackend) {
    let (a, b, c) = (
        FakeProvider::start(Shape::OpenAi).await,
        FakeProvider::start(Shape::OpenAi).await,
        FakeProvider::start(Shape::OpenAi).await,
    );
    let toml = [
        ProviderToml::openai("fake-a", &a.base_url).toml(),
        provider("fake-b", &b.base_url, "fake-model"),
        provider("fake-c", &c.base_url, "fake-model"),
        strict_task_toml("summarize", &["fake-a", "fake-b", "fake-c"], TEMPLATE),
        strict_task_toml("two", &["fake-a", "fake-b"], TEMPLATE),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    let report = app.app.qualify(None, "fake-c", "summarize").await.unwrap();
    assert!(report.passed(), "{:?}", report.checks);
    let b_before = b.total_requests();
    a.push(Behaviour::Status {
        status: 400,
        retry_after: None,
        body: "{}".into(),
    });
    let job_id = app
        .create_job(&app.alice.token, "gate", &summarize("x"))
        .await;
    let job = app.wait_for_status(&job_id, "succeeded", WAIT).await;
    let providers: Vec<&str> = job["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["provider"].as_str().unwrap())
        .collect();
    assert_eq!(providers, vec!["fake-a", "fake-c"], "fake-b was skipped");
    assert_eq!(
        b.total_requests(),
        b_before,
        "the unqualified provider got nothing"
    );
    let StoredJob {
        job: stored_job,
        attempts: rows,
        ..
    } = stored(&app, &job_id).await;
    let summary: Vec<_> = rows
        .iter()
        .map(|r| (r.number, r.provider.as_str(), r.state, r.outcome))
        .collect();
    assert_eq!(
        summary,
        vec![
            (1, "fake-a", AttemptState::Failed, None),
            (2, "fake-c", AttemptState::Succeeded, Some(RaceResult::Won)),
        ]
    );
    assert_eq!(stored_job.completed_by.as_ref(), Some(&rows[1].id));
    assert_eq!(c.requests_for(rows[1].id.as_str()), 1);

    // With no qualified fallback in the chain, a definite failure fails the job.
    let mut body = summarize("y");
    body["task"] = "two".into();
    a.push(Behaviour::Status {
        status: 400,
        retry_after: None,
        body: "{}".into(),
    });
    let job_id = app.create_job(&app.alice.token, "no-fallback", &body).await;
    let job = app.wait_for_status(&job_id, "failed", WAIT).await;
    let reason = job["failure_reason"].as_str().unwrap();
    assert!(
        reason.contains("no qualified fallback") && reason.contains("fake-b (never)"),
        "{reason}"
    );
    assert_eq!(job["attempts"].as_array().unwrap().len(), 1);
    let StoredJob {
        job: stored_job,
        attempts: rows,
        ..
    } = stored(&app, &job_id).await;
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(
        (rows[0].provider.as_str(), rows[0].state),
        ("fake-a", AttemptState::Failed)
    );
    assert_eq!(stored_job.status, JobStatus::Failed);
    assert_eq!(stored_job.failure_reason.as_deref(), Some(reason));
    assert_eq!(b.total_requests(), b_before, "fake-b still got nothing");
}

async fn a_new_attempt_on_an_unqualified_provider_is_refused(backend: TestBackend) {
    let (a, b) = (
        FakeProvider::start(Shape::OpenAi).await,
        FakeProvider::start(Shape::OpenAi).await,
    );
    let toml = [
        ProviderToml::openai("fake-a", &a.base_url).toml(),
        provider("fake-b", &b.base_url, "fake-model"),
        strict_task_toml("summarize", &["fake-a", "fake-b"], TEMPLATE),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    a.push(Behaviour::Hang);
    let job_id = app
        .create_job(&app.alice.token, "manual", &summarize("x"))
        .await;
    let job = app.wait_for_status(&job_id, "unknown", WAIT).await;
    let first = job["attempts"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        app.abandon(&app.sue.token, &first, "stuck").await.status(),
        StatusCode::OK
    );
    let response = app
        .start_attempt(&app.sue.token, &job_id, Some(json!({"provider": "fake-b"})))
        .await;
    let problem = assert_problem(response, StatusCode::CONFLICT, "provider-not-qualified").await;
    assert_eq!(problem["allowed_providers"], json!(["fake-a"]));
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("fake-b (never)"),
        "{problem:#}"
    );
    let StoredJob {
        job: stored_job,
        attempts: rows,
        ..
    } = stored(&app, &job_id).await;
    assert_eq!(rows.len(), 1, "the refusal added no attempt: {rows:#?}");
    assert_eq!(rows[0].state, AttemptState::Abandoned);
    assert_eq!(stored_job.status, JobStatus::Pending);
    assert_eq!(
        audit_of(&app, &job_id).await,
        vec![(
            "abandon_attempt".to_owned(),
            Some(first),
            "stuck".to_owned()
        )],
        "a refused attempt is not audited as started"
    );
    assert_eq!(b.total_requests(), 0);

    let report = app.app.qualify(None, "fake-b", "summarize").await.unwrap();
    assert!(report.passed(), "{:?}", report.checks);
    let response = app
        .start_attempt(&app.sue.token, &job_id, Some(json!({"provider": "fake-b"})))
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    app.wait_for_status(&job_id, "succeeded", WAIT).await;
    let StoredJob {
        job: stored_job,
        attempts: rows,
        ..
    } = stored(&app, &job_id).await;
    assert_eq!(rows.len(), 2);
    assert_eq!(
        (rows[1].provider.as_str(), rows[1].state),
        ("fake-b", AttemptState::Succeeded)
    );
    assert_eq!(stored_job.completed_by.as_ref(), Some(&rows[1].id));
    let audit = audit_of(&app, &job_id).await;
    assert_eq!(
        audit.last().unwrap(),
        &(
            "start_attempt".to_owned(),
            Some(rows[1].id.to_string()),
            "started attempt 2 on fake-b".to_owned()
        ),
        "support's attempt on alice's job is audited"
    );
}

/// What a configuration change touched, of the things a run is bound to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Changed {
    Template,
    Model,
    OutputSchema,
}

/// Qualifies `fake` for `summarize` under the configuration `before`, then
/// reads its status under `before` and `after` (two applications over one
/// store, as one database outlives a configuration change). Asserts that
/// the stored run is bound to `before` and that `after` differs from it in
/// exactly the `changed` binding, then that the run counts under `before`
/// and is stale under `after`, and that qualifying again under `after`
/// makes it count again.
async fn assert_the_change_voids_the_qualification(
    backend: TestBackend,
    fake: &FakeProvider,
    before: &str,
    after: &str,
    changed: Changed,
) {
    let prepared = PreparedApp::new(backend, config_of(before)).await;
    let before_change = App::new(prepared.store.clone(), config_of(before));
    let after_change = App::new(prepared.store.clone(), config_of(after));
    let report = before_change
        .qualify(None, "fake", "summarize")
        .await
        .unwrap();
    assert!(report.passed(), "{:?}", report.checks);
    assert!(fake.total_requests() > 0, "the run called the provider");

    let runs = runs_of(&prepared, "fake").await;
    assert_eq!(runs.len(), 1);
    let run = &runs[0];
    assert!(run.passed);
    assert_eq!(run.task, "summarize");
    let old = before_change.config().contracts.get("summarize").unwrap();
    let new = after_change.config().contracts.get("summarize").unwrap();
    let model_of = |app: &App| {
        app.config()
            .provider("fake")
            .unwrap()
            .model_name()
            .to_owned()
    };
    assert_eq!(
        (
            run.model.as_str(),
            run.template_sha256.as_str(),
            run.output_schema_sha256.as_str()
        ),
        (
            model_of(&before_change).as_str(),
            old.template_sha256.as_str(),
            old.output_schema_sha256.as_str()
        ),
        "the run is bound to the configuration it ran under"
    );
    assert_eq!(
        (
            model_of(&after_change) != run.model,
            new.template_sha256 != run.template_sha256,
            new.output_schema_sha256 != run.output_schema_sha256,
        ),
        (
            changed == Changed::Model,
            changed == Changed::Template,
            changed == Changed::OutputSchema,
        ),
        "the change touched exactly the {changed:?}"
    );

    let before_status = before_change.statuses_for_task("summarize").await.unwrap();
    let after_status = after_change.statuses_for_task("summarize").await.unwrap();
    assert_eq!(
        (before_status["fake"].label(), after_status["fake"].label()),
        ("qualified", "stale")
    );
    assert_eq!(after_status["fake"].at(), Some(run.qualified_at));

    let report = after_change
        .qualify(None, "fake", "summarize")
        .await
        .unwrap();
    assert!(report.passed(), "{:?}", report.checks);
    let after_status = after_change.statuses_for_task("summarize").await.unwrap();
    assert_eq!(after_status["fake"].label(), "qualified");
    assert_eq!(runs_of(&prepared, "fake").await.len(), 2);
}

async fn changing_the_template_voids_the_qualification(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let v1 = [
        provider("fake", &fake.base_url, "fake-model"),
        strict_task_toml("summarize", &["fake"], TEMPLATE),
    ]
    .concat();
    let v2 = [
        provider("fake", &fake.base_url, "fake-model"),
        strict_task_toml("summarize", &["fake"], "Summarize briefly: {{ text }}"),
    ]
    .concat();
    assert_the_change_voids_the_qualification(backend, &fake, &v1, &v2, Changed::Template).await;
}

async fn changing_the_model_voids_the_qualification(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let v1 = [
        provider("fake", &fake.base_url, "fake-model"),
        strict_task_toml("summarize", &["fake"], TEMPLATE),
    ]
    .concat();
    let v2 = [
        provider("fake", &fake.base_url, "fake-model-2"),
        strict_task_toml("summarize", &["fake"], TEMPLATE),
    ]
    .concat();
    assert_the_change_voids_the_qualification(backend, &fake, &v1, &v2, Changed::Model).await;
}

/// `strict_task_toml` with a different output schema: the summary is also
/// limited in length (the golden answer still fits).
fn task_with_a_longer_schema(chain: &[&str]) -> String {
    let task = strict_task_toml("summarize", chain, TEMPLATE);
    let changed = task.replace(
        "summary = { type = \"string\" }",
        "summary = { type = \"string\", maxLength = 500 }",
    );
    assert_ne!(changed, task, "the schema was changed");
    changed
}

async fn changing_the_output_schema_voids_the_qualification(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let v1 = [
        provider("fake", &fake.base_url, "fake-model"),
        strict_task_toml("summarize", &["fake"], TEMPLATE),
    ]
    .concat();
    let v2 = [
        provider("fake", &fake.base_url, "fake-model"),
        task_with_a_longer_schema(&["fake"]),
    ]
    .concat();
    assert_the_change_voids_the_qualification(backend, &fake, &v1, &v2, Changed::OutputSchema)
        .await;
}

/// A chain `[fake-a, fake-b]` where fake-b passed a run under an earlier
/// configuration (another model): the app is serving the new one, under
/// which that run is stale.
async fn a_chain_with_a_stale_fallback(
    backend: TestBackend,
) -> (FakeProvider, FakeProvider, TestApp) {
    let (a, b) = (
        FakeProvider::start(Shape::OpenAi).await,
        FakeProvider::start(Shape::OpenAi).await,
    );
    let config = |b_model: &str| {
        config_of(
            &[
                ProviderToml::openai("fake-a", &a.base_url).toml(),
                provider("fake-b", &b.base_url, b_model),
                strict_task_toml("summarize", &["fake-a", "fake-b"], TEMPLATE),
            ]
            .concat(),
        )
    };
    let prepared = PreparedApp::new(backend, config("fake-model-2")).await;
    let earlier = App::new(prepared.store.clone(), config("fake-model"));
    let report = earlier.qualify(None, "fake-b", "summarize").await.unwrap();
    assert!(report.passed(), "{:?}", report.checks);
    let runs = runs_of(&prepared, "fake-b").await;
    assert_eq!(runs.len(), 1);
    assert!(runs[0].passed);
    assert_eq!(runs[0].model, "fake-model");
    let app = prepared.start().await;
    let statuses = app.app.statuses_for_task("summarize").await.unwrap();
    assert_eq!(statuses["fake-b"].label(), "stale");
    (a, b, app)
}

async fn failover_skips_a_provider_whose_qualification_went_stale(backend: TestBackend) {
    let (a, b, app) = a_chain_with_a_stale_fallback(backend).await;
    let b_before = b.total_requests();
    a.push(Behaviour::Status {
        status: 400,
        retry_after: None,
        body: "{}".into(),
    });
    let job_id = app
        .create_job(&app.alice.token, "stale-failover", &summarize("x"))
        .await;
    app.wait_for_status(&job_id, "failed", WAIT).await;
    let StoredJob {
        job,
        attempts: rows,
        ..
    } = stored(&app, &job_id).await;
    assert_eq!(
        rows.len(),
        1,
        "no failover to the stale provider: {rows:#?}"
    );
    assert_eq!(
        (rows[0].provider.as_str(), rows[0].state),
        ("fake-a", AttemptState::Failed)
    );
    assert_eq!(job.status, JobStatus::Failed);
    let reason = job.failure_reason.unwrap();
    assert!(
        reason.contains("no qualified fallback") && reason.contains("fake-b (stale)"),
        "{reason}"
    );
    assert_eq!(
        b.total_requests(),
        b_before,
        "the stale provider got nothing"
    );
}

async fn a_new_attempt_on_a_provider_whose_qualification_went_stale_is_refused(
    backend: TestBackend,
) {
    let (a, b, app) = a_chain_with_a_stale_fallback(backend).await;
    let b_before = b.total_requests();
    // A 502: unknown at once, whatever the clock.
    a.push(Behaviour::Status {
        status: 502,
        retry_after: None,
        body: "{}".into(),
    });
    let job_id = app
        .create_job(&app.alice.token, "stale-attempt", &summarize("x"))
        .await;
    let attempt = settled_attempt(&app, &job_id, 0).await;
    assert_eq!(attempt["state"], "unknown");
    let first = attempt["id"].as_str().unwrap().to_owned();
    assert_eq!(
        app.abandon(&app.sue.token, &first, "the provider answered 502")
            .await
            .status(),
        StatusCode::OK
    );

    let response = app
        .start_attempt(&app.sue.token, &job_id, Some(json!({"provider": "fake-b"})))
        .await;
    let problem = assert_problem(response, StatusCode::CONFLICT, "provider-not-qualified").await;
    assert_eq!(problem["allowed_providers"], json!(["fake-a"]));
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("fake-b (stale)"),
        "{problem:#}"
    );
    let StoredJob {
        job,
        attempts: rows,
        ..
    } = stored(&app, &job_id).await;
    assert_eq!(rows.len(), 1, "no attempt row was added: {rows:#?}");
    assert_eq!(rows[0].state, AttemptState::Abandoned);
    assert_eq!(job.status, JobStatus::Pending);
    let audit = audit_of(&app, &job_id).await;
    assert!(
        audit.iter().all(|(action, ..)| action != "start_attempt"),
        "{audit:?}"
    );
    assert_eq!(
        b.total_requests(),
        b_before,
        "the stale provider got nothing"
    );

    // Qualified again under the current configuration, it may take the attempt.
    let report = app.app.qualify(None, "fake-b", "summarize").await.unwrap();
    assert!(report.passed(), "{:?}", report.checks);
    let response = app
        .start_attempt(&app.sue.token, &job_id, Some(json!({"provider": "fake-b"})))
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    app.wait_for_status(&job_id, "succeeded", WAIT).await;
    let StoredJob { attempts: rows, .. } = stored(&app, &job_id).await;
    assert_eq!(
        (rows.len(), rows[1].provider.as_str()),
        (2, "fake-b"),
        "{rows:#?}"
    );
}

async fn qualification_fails_on_an_extra_key_on_prose_and_on_a_golden_mismatch(
    backend: TestBackend,
) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        provider("fake", &fake.base_url, "fake-model"),
        strict_task_toml("summarize", &["fake"], TEMPLATE),
    ]
    .concat();
    let config = config_of(&toml);
    let prepared = PreparedApp::new(backend, config.clone()).await;
    let providers = Providers::from_settings(&config.providers);
    let (provider, task) = (
        providers.get("fake").unwrap(),
        config.contracts.get("summarize").unwrap(),
    );
    let cases = [
        (
            Behaviour::Answer(json!({"summary": "fake summary", "extra": true})),
            "invalid_output",
        ),
        (
            Behaviour::AnswerText("Here you go: a summary.".into()),
            "not JSON",
        ),
        (
            Behaviour::Answer(json!({"summary": "something else"})),
            "golden expectations not met",
        ),
    ];
    for (behaviour, expected) in cases {
        fake.set_default(behaviour);
        let report = check_contract(&provider, &task).await;
        assert!(!report.passed());
        let failure = report.first_failure().unwrap();
        assert_eq!(failure.name, "golden[0] answer");
        assert!(
            failure.detail.contains(expected),
            "{expected}: {}",
            failure.detail
        );
    }
    fake.set_default(Behaviour::Answer(json!({"summary": "fake summary"})));
    let report = check_contract(&provider, &task).await;
    assert!(report.passed(), "{:?}", report.checks);
    let names: Vec<&str> = report.checks.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "template renders",
            "fits the context budget",
            "golden[0] answer",
            "round trip"
        ]
    );

    // Recorded: a failed run keeps the provider out, with its failing check;
    // a passed one lets it in.
    let app = App::new(prepared.store.clone(), config.clone());
    fake.set_default(Behaviour::Answer(
        json!({"summary": "fake summary", "extra": true}),
    ));
    let report = app.qualify(None, "fake", "summarize").await.unwrap();
    assert!(!report.passed());
    let status = &app.statuses_for_task("summarize").await.unwrap()["fake"];
    assert_eq!(status.label(), "failed");
    fake.set_default(Behaviour::Answer(json!({"summary": "fake summary"})));
    let report = app.qualify(None, "fake", "summarize").await.unwrap();
    assert!(report.passed(), "{:?}", report.checks);
    let status = &app.statuses_for_task("summarize").await.unwrap()["fake"];
    assert_eq!(status.label(), "qualified");
    let runs = runs_of(&prepared, "fake").await;
    assert_eq!(
        runs.iter().map(|r| r.passed).collect::<Vec<_>>(),
        vec![false, true]
    );
    let checks: Vec<Check> = serde_json::from_str(&runs[0].checks).unwrap();
    let failed = checks.iter().find(|c| !c.passed).unwrap();
    assert_eq!(failed.name, "golden[0] answer");
    assert!(
        failed.detail.contains("invalid_output"),
        "{}",
        failed.detail
    );
}

async fn a_prompt_over_the_context_budget_fails_qualification_without_a_call(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        ProviderToml::openai("fake", &fake.base_url)
            .with("context_tokens = 100\nmax_tokens = 90")
            .toml(),
        strict_task_toml(
            "summarize",
            &["fake"],
            "Summarize this long text: {{ text }} {{ text }} {{ text }} {{ text }}",
        ),
    ]
    .concat();
    let config = config_of(&toml);
    let prepared = PreparedApp::new(backend, config.clone()).await;
    let providers = Providers::from_settings(&config.providers);
    let report = check_contract(
        &providers.get("fake").unwrap(),
        &config.contracts.get("summarize").unwrap(),
    )
    .await;
    let failure = report.first_failure().unwrap();
    assert_eq!(failure.name, "fits the context budget");
    assert!(failure.detail.contains("tiktoken"), "{}", failure.detail);
    assert_eq!(fake.total_requests(), 0, "nothing was sent");

    // Recorded as a failed run, still without a call.
    let app = App::new(prepared.store.clone(), config);
    let report = app.qualify(None, "fake", "summarize").await.unwrap();
    assert_eq!(
        report.first_failure().unwrap().name,
        "fits the context budget"
    );
    let runs = runs_of(&prepared, "fake").await;
    assert_eq!(runs.len(), 1);
    assert!(!runs[0].passed);
    let status = &app.statuses_for_task("summarize").await.unwrap()["fake"];
    assert_eq!(status.label(), "failed");
    assert_eq!(fake.total_requests(), 0, "nothing was sent");
}

on_both_backends!(
    failover_skips_an_unqualified_provider_and_takes_a_qualified_one,
    a_new_attempt_on_an_unqualified_provider_is_refused,
    changing_the_template_voids_the_qualification,
    changing_the_model_voids_the_qualification,
    changing_the_output_schema_voids_the_qualification,
    failover_skips_a_provider_whose_qualification_went_stale,
    a_new_attempt_on_a_provider_whose_qualification_went_stale_is_refused,
    qualification_fails_on_an_extra_key_on_prose_and_on_a_golden_mismatch,
    a_prompt_over_the_context_budget_fails_qualification_without_a_call,
);

/// A chat route has no template and no output schema: its qualification
/// reports neither, and its budget counts each golden request's own token
/// limit, else the provider's `max_tokens`, as the call is sent with. A
/// task without a template reports no "template renders" either. (No
/// storage: the checks alone.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn qualification_reports_only_the_checks_a_task_has() {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    fake.set_default(Behaviour::AnswerText("OK".into()));
    let toml = format!(
        r#"{}
[[tasks]]
name = "gpt-safe"
kind = "chat"
providers = ["fake"]

[[tasks.golden]]
input = {{ messages = [{{ role = "user", content = "Say OK." }}] }}
expect = {{ "/message/content" = "OK" }}

[[tasks.golden]]
input = {{ messages = [{{ role = "user", content = "Say OK." }}], max_tokens = 300 }}
"#,
        ProviderToml::openai("fake", &fake.base_url)
            .with("max_tokens = 200")
            .toml()
    );
    let config = config_of(&toml);
    let providers = Providers::from_settings(&config.providers);
    let report = check_contract(
        &providers.get("fake").unwrap(),
        &config.contracts.get("gpt-safe").unwrap(),
    )
    .await;
    assert!(report.passed(), "{:?}", report.checks);
    let names: Vec<&str> = report.checks.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "fits the context budget",
            "golden[0] answer",
            "golden[1] answer",
            "round trip"
        ]
    );
    let budget = &report.checks[0].detail;
    assert!(
        budget.starts_with("longest request ") && budget.contains("+ max_tokens 300 = "),
        "the larger of the requests' own limit and the provider's: {budget}"
    );
    let answers = [&report.checks[1].detail, &report.checks[2].detail];
    assert_eq!(answers[0], "an answer, expectations met");
    assert_eq!(answers[1], "an answer, no expectations to meet");
    let sent = fake.requests();
    assert_eq!(sent[0].body["max_tokens"], 200, "the provider's limit");
    assert_eq!(sent[1].body["max_tokens"], 300, "the request's own");

    // A prompt task without a template or output schema (a simulated
    // provider gets the input itself).
    let config = config_of(crate::support::harness::DEFAULT_TEST_PROVIDERS);
    let providers = Providers::from_settings(&config.providers);
    let report = check_contract(
        &providers.get("sim-fast").unwrap(),
        &config.contracts.get("summarize").unwrap(),
    )
    .await;
    let names: Vec<&str> = report.checks.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        vec!["fits the context budget", "golden[0] answer", "round trip"]
    );
    assert_eq!(report.checks[1].detail, "JSON, no expectations to meet");
}

/// Qualification counts a golden prompt with the provider's own tokenizer
/// where it has one: Anthropic's `count_tokens`, Gemini's `countTokens`,
/// Bedrock's `CountTokens` (each a call to the fake, not an attempt), and
/// says which counted. An OpenAI-kind provider counts with tiktoken,
/// locally.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn qualification_counts_with_the_providers_own_tokenizer() {
    for (shape, provider, counter, count_path) in [
        (
            Shape::Anthropic,
            ProviderToml::anthropic("p", &FakeProvider::placeholder()),
            "Anthropic count_tokens",
            "/v1/messages/count_tokens",
        ),
        (
            Shape::Gemini,
            ProviderToml::gemini("p", &FakeProvider::placeholder()),
            "Gemini countTokens",
            ":countTokens",
        ),
        (
            Shape::Bedrock,
            ProviderToml::bedrock("p", &FakeProvider::placeholder()),
            "Bedrock CountTokens",
            "/count-tokens",
        ),
        (
            Shape::OpenAi,
            ProviderToml::openai("p", &FakeProvider::placeholder()),
            "tiktoken",
            "",
        ),
    ] {
        let fake = FakeProvider::start(shape).await;
        fake.set_default(Behaviour::AnswerText("OK".into()));
        let provider = provider.base_url(&fake.base_url);
        let toml = format!(
            r#"{}
[[tasks]]
name = "chat"
kind = "chat"
providers = ["p"]

[[tasks.golden]]
input = {{ messages = [{{ role = "user", content = "Say OK now please." }}] }}
"#,
            provider.toml()
        );
        let config = config_of(&toml);
        let providers = Providers::from_settings(&config.providers);
        let report = check_contract(
            &providers.get("p").unwrap(),
            &config.contracts.get("chat").unwrap(),
        )
        .await;
        assert!(report.passed(), "{shape:?}: {:?}", report.checks);
        let budget = &report.checks[0].detail;
        assert!(
            budget.contains(&format!("({counter})")),
            "{shape:?}: {budget}"
        );
        let counts: Vec<_> = fake
            .requests()
            .into_iter()
            .filter(|r| !count_path.is_empty() && r.path.ends_with(count_path))
            .collect();
        if count_path.is_empty() {
            assert_eq!(fake.total_requests(), 1, "only the golden call");
        } else {
            assert_eq!(counts.len(), 1, "{shape:?}: one count call");
            assert!(
                budget.starts_with("longest request 4 tokens"),
                "{shape:?}: the counter's figure: {budget}"
            );
            assert_eq!(fake.total_requests(), 2, "the count and the golden call");
        }
    }
}
