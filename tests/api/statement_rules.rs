//! The statement rule Citus needs (`store::distribution`), enforced without
//! Citus: on plain PostgreSQL, every statement of a full lifecycle is
//! recorded (diesel's instrumentation) and judged. A statement that locks,
//! updates or deletes rows of a distributed table without naming its owner,
//! or evaluates a volatile function inside an UPDATE or DELETE, fails the
//! test; so does a read across every shard that is not one of the listed
//! fan-out reads. Migrations keep one subcommand per `ALTER TABLE` on a
//! distributed table.

use std::collections::BTreeMap;
use std::time::Duration;

use onejob::store::distribution::{self, Verdict};
use onejob::store::statement_log::StatementLog;
use reqwest::StatusCode;
use serde_json::json;

use crate::support::fake_provider::{
    answer, config_of, Behaviour, FakeProvider, ProviderToml, Shape, WAIT,
};
use crate::support::harness::{
    postgres_available, record_figures, summarize, FormClient, PreparedApp, TestApp, TestBackend,
};

/// Two providers on one fake: `up` times out soon (its calls go unknown),
/// `slow` never within the test; a chat route; retention windows of a day.
fn lifecycle_config(fake: &FakeProvider) -> onejob::config::Config {
    let mut config = config_of(&format!(
        r#"[retention]
jobs_days = 1
races_days = 1
audit_days = 1
{}{}
[[tasks]]
name = "summarize"
providers = ["up"]
input_fields = ["text"]
template = "Summarize: {{{{ text }}}}"

[[tasks]]
name = "held"
providers = ["slow"]
input_fields = ["text"]
template = "Summarize: {{{{ text }}}}"

[[tasks]]
name = "gpt-safe"
kind = "chat"
providers = ["up"]
"#,
        ProviderToml::openai("up", &format!("{}/v1", fake.base_url)).toml(),
        ProviderToml::openai("slow", &format!("{}/v1", fake.base_url))
            .timeout_ms(60_000)
            .toml()
    ));
    config.worker.concurrency = 1;
    config.server.shutdown_grace_ms = 61_000;
    config
}

async fn recording_app(fake: &FakeProvider) -> (TestApp, StatementLog) {
    let log = StatementLog::new();
    let app = PreparedApp::new(TestBackend::Postgres, lifecycle_config(fake))
        .await
        .recording(&log)
        .await
        .start()
        .await;
    (app, log)
}

/// Every statement of a job's whole life, judged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_statement_of_a_full_lifecycle_can_be_routed_by_owner() {
    if !postgres_available() {
        return;
    }
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let (app, log) = recording_app(&fake).await;
    fake.set_default(answer("done"));

    // Alice has a budget: her creations reserve in their transaction.
    let budget = app
        .client
        .put(app.url("/api/v1/budgets/alice"))
        .bearer_auth(&app.ada.token)
        .json(&json!({"spend_limit": 100, "token_limit": 100000000, "reason": "a plan"}))
        .send()
        .await
        .unwrap();
    assert_eq!(budget.status(), StatusCode::OK);

    // Creation, replay and a conflicting payload.
    let done = app
        .create_job(&app.alice.token, "k-done", &summarize("a"))
        .await;
    app.wait_for_status(&done, "succeeded", WAIT).await;
    let replay = app
        .post_job(&app.alice.token, "k-done", &summarize("a"))
        .await;
    assert_eq!(replay.status(), StatusCode::OK);
    let conflict = app
        .post_job(&app.alice.token, "k-done", &summarize("b"))
        .await;
    assert_eq!(conflict.status(), StatusCode::CONFLICT);

    // Soft timeout, unknown, and the late answer that wins.
    fake.set_default(Behaviour::Hold);
    let late = app
        .create_job(&app.alice.token, "k-late", &summarize("b"))
        .await;
    let job = app.wait_for_status(&late, "unknown", WAIT).await;
    let late_attempt = job["attempts"][0]["id"].as_str().unwrap().to_owned();
    fake.release(&late_attempt, answer("late"));
    app.wait_for_status(&late, "succeeded", WAIT).await;

    // Abandon, a new attempt that wins, and the abandoned one's answer lost.
    let raced = app
        .create_job(&app.bob.token, "k-race", &summarize("c"))
        .await;
    let job = app.wait_for_status(&raced, "unknown", WAIT).await;
    let first = job["attempts"][0]["id"].as_str().unwrap().to_owned();
    fake.wait_held(&first).await;
    let abandoned = app
        .abandon(&app.sue.token, &first, "the provider lost it")
        .await;
    assert_eq!(abandoned.status(), StatusCode::OK);
    fake.set_default(answer("second"));
    let started = app
        .start_attempt(&app.sue.token, &raced, Some(json!({"provider": "up"})))
        .await;
    assert!(started.status().is_success(), "{}", started.status());
    app.wait_for_status(&raced, "succeeded", WAIT).await;
    fake.release(&first, answer("first, too late"));
    app.wait_for_job(&raced, WAIT, |j| j["attempts"][0]["outcome"] == "lost")
        .await;

    // A chat completion, through the OpenAI-compatible door.
    let chat = app
        .client
        .post(app.url("/v1/chat/completions"))
        .bearer_auth(&app.alice.token)
        .header("Idempotency-Key", "k-chat")
        .json(&json!({"model": "gpt-safe", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(chat.status(), StatusCode::OK);

    // A process that claimed and sent, then died: the lease runs out and
    // the reaper makes the attempt unknown. The one worker slot is busy
    // with a held call, so the job waits queued for the dead claimer.
    fake.set_default(Behaviour::Hold);
    let busy = app
        .create_job(
            &app.bob.token,
            "k-busy",
            &json!({"task": "held", "input": {"text": "x"}}),
        )
        .await;
    app.wait_for_status(&busy, "running", WAIT).await;
    let orphan = app
        .create_job(&app.bob.token, "k-orphan", &summarize("d"))
        .await;
    let claimed = app
        .with_conn(|conn| {
            let mut admit = |_: &onejob::domain::AttemptId, _: &str| true;
            onejob::store::queue::claim_batch(
                conn,
                onejob::store::queue::ClaimRules {
                    lease_owner: "a-process-that-dies",
                    lease_ms: 1000,
                    limit: 1,
                    soft_timeout_ms: &|_| 400,
                    closed: &[],
                    admit: &mut admit,
                    confirm: true,
                },
            )
            .unwrap()
            .claims
        })
        .await;
    assert_eq!(claimed.len(), 1, "the dead process claimed the queued job");
    app.wait_for_status(&orphan, "unknown", Duration::from_secs(10))
        .await;

    // Staff resolve it as failed; the console and the pages.
    let orphan_attempt = app.get_job(&app.sue.token, &orphan).await["attempts"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        app.abandon(&app.sue.token, &orphan_attempt, "the process died")
            .await
            .status(),
        StatusCode::OK
    );
    app.set_password("ada", "ada-password").await;
    let admin = FormClient::new(&app);
    let csrf = admin.sign_in("ada", "ada-password").await;
    let failed = admin
        .post_form(
            &format!("/jobs/{orphan}/fail"),
            &[("csrf", &csrf), ("reason", "nobody will answer")],
        )
        .await;
    assert_eq!(failed.status(), StatusCode::SEE_OTHER);
    for page in [
        "/admin",
        "/admin/unknown",
        "/admin/races",
        "/admin/audit",
        "/admin/jobs",
        "/admin/jobs?owner=bob&status=failed&provider=up&key=k-orphan",
        &format!("/admin/jobs?id={raced}"),
        "/admin/users",
        "/admin/providers",
        "/admin/usage",
        "/admin/usage?group_by=owner&provider=up",
        "/usage",
        "/jobs",
        &format!("/jobs/{raced}"),
    ] {
        assert_eq!(admin.get(page).await.status(), StatusCode::OK, "{page}");
    }
    for path in [
        "/api/v1/jobs",
        &format!("/api/v1/jobs/{late}"),
        &format!("/api/v1/jobs/{late}/usage"),
        "/api/v1/usage?group_by=task",
        "/api/v1/budgets/alice",
    ] {
        assert_eq!(
            app.get(&app.alice.token, path).await.status(),
            StatusCode::OK
        );
    }

    // A background response, queued behind the busy slot, polled and
    // cancelled: the cancel's lock, guarded update, withdrawal and outbox.
    let created = app
        .client
        .post(app.url("/v1/responses"))
        .bearer_auth(&app.alice.token)
        .header("Idempotency-Key", "k-response")
        .json(&json!({"model": "gpt-safe", "input": "hi", "background": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::OK);
    let response: serde_json::Value = created.json().await.unwrap();
    let response_id = response["id"].as_str().unwrap().to_owned();
    let poll = format!("/v1/responses/{response_id}");
    assert_eq!(
        app.get(&app.alice.token, &poll).await.status(),
        StatusCode::OK
    );
    let cancelled = app
        .client
        .post(app.url(&format!("{poll}/cancel")))
        .bearer_auth(&app.alice.token)
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status(), StatusCode::OK);
    let cancelled: serde_json::Value = cancelled.json().await.unwrap();
    assert_eq!(cancelled["status"], "cancelled");

    // Retention, as if three days had passed.
    let held = app.get_job(&app.bob.token, &busy).await["attempts"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    fake.release(&held, answer("held"));
    app.wait_for_status(&busy, "succeeded", WAIT).await;
    let pruned = app
        .app
        .prune_expired(onejob::app::now_ms() + 3 * 86_400_000)
        .await
        .unwrap();
    assert!(pruned.jobs >= 2, "{pruned:?}");

    judge_all(log.take());
}

/// Judges every statement; fails listing each that breaks the rule.
pub(crate) fn judge_all(statements: Vec<String>) {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut refused: BTreeMap<String, (distribution::Breach, usize)> = BTreeMap::new();
    for statement in &statements {
        let verdict = distribution::judge(statement);
        let label = match &verdict {
            Verdict::Unrelated => "other tables".to_owned(),
            Verdict::Routed => "routed to one owner's shard".to_owned(),
            Verdict::Insert => "inserts".to_owned(),
            Verdict::FanOut(purpose) => format!("fan-out read: {purpose}"),
            Verdict::Refused(breach) => {
                let sql = distribution::normalize(statement);
                refused.entry(sql).or_insert((*breach, 0)).1 += 1;
                "refused".to_owned()
            }
        };
        *counts.entry(label).or_default() += 1;
    }
    let mut figures = format!("statement rule: {} statements recorded\n", statements.len());
    for (label, n) in &counts {
        figures.push_str(&format!("  {n:>6}  {label}\n"));
    }
    eprintln!("{figures}");
    record_figures("statement-rule", &figures);
    let report: Vec<String> = refused
        .iter()
        .map(|(sql, (breach, n))| format!("{breach} ({n}×):\n    {sql}"))
        .collect();
    assert!(
        report.is_empty(),
        "{} statements break the rule:\n{}",
        report.len(),
        report.join("\n")
    );
}

/// Every migration alters a distributed table one subcommand at a time,
/// except those that ran before a database could be distributed:
/// `onejob citus distribute` refuses a database with migrations pending.
#[test]
fn migrations_alter_distributed_tables_one_subcommand_at_a_time() {
    /// Written before the conversion existed; never run on Citus.
    const BEFORE_DISTRIBUTION: &[&str] = &["2026-11-30-000006_distribution_column"];
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/postgres");
    let mut checked = 0;
    let mut offending = Vec::new();
    for entry in std::fs::read_dir(&root).unwrap() {
        let dir = entry.unwrap().path();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let up = std::fs::read_to_string(dir.join("up.sql")).unwrap();
        for statement in sql_statements(&up) {
            checked += 1;
            if distribution::alters_with_several_subcommands(&statement)
                && !BEFORE_DISTRIBUTION.contains(&name.as_str())
            {
                offending.push(format!("{name}: {statement}"));
            }
        }
    }
    assert!(checked > 0);
    assert!(
        offending.is_empty(),
        "one subcommand per ALTER TABLE on a distributed table:\n{}",
        offending.join("\n")
    );
    // The check itself bites: the grandfathered migration breaks it.
    let old = std::fs::read_to_string(root.join(BEFORE_DISTRIBUTION[0]).join("up.sql")).unwrap();
    assert!(sql_statements(&old)
        .iter()
        .any(|s| distribution::alters_with_several_subcommands(s)));
}

/// The statements of a migration file (comments dropped, split on `;`).
fn sql_statements(file: &str) -> Vec<String> {
    let text: String = file
        .lines()
        .map(|line| line.split("--").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    text.split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `onejob citus distribute` refuses a server without Citus before it
/// touches the database (not even the migrations run), and SQLite.
#[tokio::test]
async fn citus_distribute_refuses_a_server_without_citus_and_changes_nothing() {
    if !postgres_available() {
        return;
    }
    let db = crate::support::harness::TestDb::create_empty(TestBackend::Postgres);
    let run = |url: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_onejob"))
            .args(["citus", "distribute", "--worker", "127.0.0.1:9701"])
            .env("DATABASE_URL", url)
            .output()
            .unwrap()
    };
    let refused = run(db.url.as_str());
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("the Citus extension is not installed"),
        "{said}"
    );
    let tables: i64 = {
        use diesel::prelude::*;
        let mut conn = diesel::PgConnection::establish(db.url.as_str()).unwrap();
        diesel::dsl::sql::<diesel::sql_types::BigInt>(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'",
        )
        .get_result(&mut conn)
        .unwrap()
    };
    assert_eq!(tables, 0, "nothing was migrated");
    let dir = tempfile::tempdir().unwrap();
    let sqlite = run(dir.path().join("x.db").to_str().unwrap());
    assert!(String::from_utf8_lossy(&sqlite.stderr).contains("Citus runs on PostgreSQL"));
}
