//! Real `onejob serve` processes: killed with SIGKILL and restarted, or
//! three at once on one PostgreSQL.

use std::collections::HashMap;
use std::time::Duration;

use onejob::store::users as user_store;
use onejob::store::Store;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::server_process::ServerProcess;
use crate::support::harness::{
    postgres_available, summarize, TestBackend, TestDb, DEFAULT_TEST_PROVIDERS,
};
use crate::support::webhook_receiver::WebhookReceiver;

fn config_file(dir: &std::path::Path, name: &str, deliver: bool) -> std::path::PathBuf {
    let toml = format!(
        r#"
[worker]
concurrency = 2
poll_interval_ms = 50
lease_ms = 20000

[webhooks]
signing_key_env = "ONEJOB_TEST_WEBHOOK_KEY"
allow_private_addresses = true
deliver = {deliver}
backoff_initial_ms = 100
backoff_max_ms = 400
poll_interval_ms = 50
timeout_ms = 2000
{DEFAULT_TEST_PROVIDERS}"#
    );
    let path = dir.join(name);
    std::fs::write(&path, toml).unwrap();
    path
}

async fn open(db: &TestDb) -> Store {
    db.open_store().await
}

async fn admin_token(store: &Store) -> String {
    let store = store.clone();
    tokio::task::spawn_blocking(move || {
        let mut conn = store.conn().unwrap();
        user_store::issue_token(&mut conn, "admin", None).unwrap().0
    })
    .await
    .unwrap()
}

async fn register(base: &str, token: &str, url: &str) {
    let response = reqwest::Client::new()
        .post(format!("{base}/api/v1/webhooks"))
        .bearer_auth(token)
        .json(&json!({"url": url, "events": ["job.succeeded"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
}

async fn create_job(base: &str, token: &str, key: &str) -> String {
    let response = reqwest::Client::new()
        .post(format!("{base}/api/v1/jobs"))
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .header("Prefer", "wait=10")
        .json(&summarize(key))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let job: Value = response.json().await.unwrap();
    assert_eq!(job["status"], "succeeded", "{job}");
    job["id"].as_str().unwrap().to_owned()
}

on_both_backends!(a_kill_9_before_or_during_delivery_still_delivers_after_restart);

/// The job's state change commits; the first process delivers nothing
/// (`deliver = false`) and is killed; the second claims the event, the
/// receiver stalls, and it is killed mid-delivery; the third delivers
/// once the lease runs out: the same `webhook-id`, one event, delivered.
async fn a_kill_9_before_or_during_delivery_still_delivers_after_restart(backend: TestBackend) {
    let db = TestDb::create_empty(backend);
    let url = db.url.as_str().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let receiver = WebhookReceiver::start().await;
    let holding = config_file(dir.path(), "holding.toml", false);
    let delivering = config_file(dir.path(), "delivering.toml", true);

    let mut first = ServerProcess::spawn(dir.path(), "first", &holding, &url);
    first.wait_ready().await;
    let store = open(&db).await;
    let token = admin_token(&store).await;
    register(&first.base, &token, &receiver.url("/hook")).await;
    let job_id = create_job(&first.base, &token, "killed-1").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        receiver.received().is_empty(),
        "the first process delivers nothing"
    );
    first.kill();
    first.wait_exit(Duration::from_secs(10)).await;

    receiver.stall_first(1);
    let mut second = ServerProcess::spawn(dir.path(), "second", &delivering, &url);
    second.wait_ready().await;
    let stalled = receiver.wait_for(1, Duration::from_secs(10)).await;
    second.kill();
    second.wait_exit(Duration::from_secs(10)).await;
    receiver.release();

    let mut third = ServerProcess::spawn(dir.path(), "third", &delivering, &url);
    third.wait_ready().await;
    let got = receiver.wait_for(2, Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let got_now = receiver.received();
    assert_eq!(got_now.len(), 2, "{}", third.stderr());
    assert_eq!(got[1].webhook_id(), stalled[0].webhook_id());
    assert_eq!(got[1].body, stalled[0].body);
    assert_eq!(got[1].json()["data"]["id"], job_id.as_str());
    let events = {
        let store = store.clone();
        tokio::task::spawn_blocking(move || {
            use diesel::prelude::*;
            use onejob::store::schema::webhook_events;
            let mut conn = store.conn().unwrap();
            webhook_events::table
                .select((webhook_events::state, webhook_events::attempts))
                .load::<(String, i32)>(&mut conn)
                .unwrap()
        })
        .await
        .unwrap()
    };
    assert_eq!(events, [("delivered".to_owned(), 2)]);
}

/// Three processes on one PostgreSQL, a healthy receiver: every event
/// is delivered exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_processes_deliver_each_event_once() {
    if !postgres_available() {
        return;
    }
    const JOBS: usize = 30;
    let db = TestDb::create_empty(TestBackend::Postgres);
    let url = db.url.as_str().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let receiver = WebhookReceiver::start().await;
    let config = config_file(dir.path(), "config.toml", true);
    let mut servers: Vec<ServerProcess> = (0..3)
        .map(|i| ServerProcess::spawn(dir.path(), &format!("p{i}"), &config, &url))
        .collect();
    for server in &mut servers {
        server.wait_ready().await;
    }
    let store = open(&db).await;
    let token = admin_token(&store).await;
    register(&servers[0].base, &token, &receiver.url("/")).await;
    let mut jobs = Vec::new();
    for i in 0..JOBS {
        jobs.push(create_job(&servers[i % 3].base, &token, &format!("three-{i}")).await);
    }
    receiver.wait_for(JOBS, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let got = receiver.received();
    let mut per_id: HashMap<String, usize> = HashMap::new();
    for r in &got {
        *per_id.entry(r.webhook_id().to_owned()).or_default() += 1;
    }
    assert_eq!(per_id.len(), JOBS, "one webhook-id per job");
    assert!(
        per_id.values().all(|n| *n == 1),
        "each delivered once: {per_id:?}"
    );
    let mut delivered: Vec<String> = got
        .iter()
        .map(|r| r.json()["data"]["id"].as_str().unwrap().to_owned())
        .collect();
    delivered.sort();
    jobs.sort();
    assert_eq!(delivered, jobs);
}
