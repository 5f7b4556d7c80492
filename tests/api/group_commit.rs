//! Group commit (docs/design.md, "Group commit"): creations waiting for
//! SQLite's write lock share one transaction (a savepoint each only when one
//! of them failed, and the batch runs again); on PostgreSQL they share one
//! multi-row statement. Each request is
//! answered only after the commit that holds its row.
//!
//! A batch is made by holding the database's write lock from a connection
//! of the test's own while the requests arrive: they queue, and the
//! transaction after the lock is released takes them all.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::statement_log::StatementLog;
use diesel::prelude::*;
use onejob::domain::{Role, Timestamp, UserId};
use onejob::store::connection::{write_transaction, Placement};
use onejob::store::group_commit::{AfterCommit, Created};
use onejob::store::jobs::{create_many_of_one_owner, CreateOutcome, MAX_ROWS_PER_STATEMENT};
use onejob::store::schema::{attempts, jobs};
use onejob::store::{
    users as user_store, Attempt, Backend, DbConnection, Job, Store, StoreError, StoreResult,
};
use reqwest::StatusCode;
use serde_json::Value;

use crate::server_process::ServerProcess;
use crate::support::harness::{
    assert_problem, record_figures, spawn_app_with, summarize, test_config, PreparedApp, TestApp,
    TestBackend, TestDb, DEFAULT_TEST_PROVIDERS,
};
use crate::support::metrics::metric_sum;

/// The database's write lock, held by a connection outside the app until
/// released: SQLite's `BEGIN IMMEDIATE`; on PostgreSQL a lock on `jobs`
/// that lets reads through and stops inserts.
struct WriteLock {
    release: std::sync::mpsc::Sender<()>,
    held: std::thread::JoinHandle<()>,
}

impl WriteLock {
    fn take(store: &Store) -> Self {
        let store = store.clone();
        let (taken_tx, taken) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let held = std::thread::spawn(move || {
            let mut conn = store.conn().unwrap();
            let conn: &mut DbConnection = &mut conn;
            let lock = match store.backend() {
                Backend::Sqlite => "BEGIN IMMEDIATE",
                Backend::Postgres => "BEGIN; LOCK TABLE jobs IN SHARE ROW EXCLUSIVE MODE",
            };
            diesel::connection::SimpleConnection::batch_execute(conn, lock).unwrap();
            taken_tx.send(()).unwrap();
            let _ = released.recv();
            diesel::connection::SimpleConnection::batch_execute(conn, "COMMIT").unwrap();
        });
        taken.recv().unwrap();
        Self { release, held }
    }

    fn release(self) {
        self.release.send(()).unwrap();
        self.held.join().unwrap();
    }
}

/// The owner's stored jobs: key → (id, input text), and their attempts'
/// count per job id.
async fn stored_jobs(
    app: &TestApp,
    owner: &UserId,
) -> (HashMap<String, (String, String)>, HashMap<String, i64>) {
    let owner = owner.as_str().to_owned();
    app.with_conn(move |conn| {
        let rows: Vec<(String, String, String)> = jobs::table
            .filter(jobs::owner_id.eq(&owner))
            .select((jobs::idempotency_key, jobs::id, jobs::input))
            .load(conn)
            .unwrap();
        let attempts: Vec<String> = attempts::table
            .filter(attempts::owner_id.eq(&owner))
            .select(attempts::job_id)
            .load(conn)
            .unwrap();
        let mut per_job = HashMap::new();
        for job in attempts {
            *per_job.entry(job).or_insert(0) += 1;
        }
        let jobs = rows
            .into_iter()
            .map(|(key, id, input)| (key, (id, input)))
            .collect();
        (jobs, per_job)
    })
    .await
}

async fn a_batch_with_a_replay_and_a_reused_key_answers_each_and_stores_the_right_rows(
    backend: TestBackend,
) {
    const NEW: usize = 6;
    // Nothing is sent, so no compare-and-swap joins the batch.
    let mut config = test_config(DEFAULT_TEST_PROVIDERS);
    config.worker.concurrency = 0;
    // The leader may take the first comers before the lock is freed and the
    // rest once its transaction is open: a slow machine must not close the
    // batch between the two (the default keeps it open 5 ms).
    config.database.group_commit_ms = 2_000;
    wait_for_the_lock_however_slowly(&mut config);
    let app = Arc::new(spawn_app_with(backend, config).await);
    let token = app.alice.token.clone();
    let replayed = app
        .create_job(&token, "made-before", &summarize("made before"))
        .await;
    let reused = app
        .create_job(&token, "reused", &summarize("the first payload"))
        .await;
    let batches_before = app.store.group_commit_counts();
    // Read before any request is sent: a request queues as soon as it is
    // spawned, so a count read after them could already hold one.
    let queued_before = app
        .store
        .batched_writes_queued()
        .expect("creations are batched");

    // The lock is held while every request arrives: they queue behind it.
    let lock = WriteLock::take(&app.store);
    let mut requests = Vec::new();
    let mut send = |key: String, text: &str| {
        let (app, token, body) = (app.clone(), token.clone(), summarize(text));
        requests.push((
            key.clone(),
            tokio::spawn(async move { app.post_job(&token, &key, &body).await }),
        ));
    };
    for i in 0..NEW {
        send(format!("new-{i}"), &format!("new job {i}"));
    }
    send("made-before".into(), "made before");
    send("reused".into(), "another payload");
    let everyone = requests.len();
    wait_until_queued(&app, queued_before + everyone as u64).await;
    // The last comer is in the queue, and the leader waits for the lock.
    tokio::time::sleep(Duration::from_millis(100)).await;
    for (_, request) in &requests {
        assert!(
            !request.is_finished(),
            "nothing is answered before its commit"
        );
    }
    lock.release();

    let mut created = HashMap::new();
    for (key, request) in requests {
        let response = request.await.unwrap();
        match key.as_str() {
            "made-before" => {
                assert_eq!(response.status(), StatusCode::OK, "a replay");
                let job: Value = response.json().await.unwrap();
                assert_eq!(job["id"], replayed.as_str());
            }
            "reused" => {
                assert_problem(response, StatusCode::CONFLICT, "idempotency-key-reused").await;
            }
            _ => {
                assert_eq!(response.status(), StatusCode::CREATED, "{key}");
                let job: Value = response.json().await.unwrap();
                created.insert(key, job["id"].as_str().unwrap().to_owned());
            }
        }
    }

    // Exactly the right rows: the six new jobs, the two made before (the
    // reused key's with its first payload), one attempt each.
    let (stored, attempts) = stored_jobs(&app, &app.alice.id).await;
    assert_eq!(stored.len(), NEW + 2, "{stored:?}");
    for (key, id) in &created {
        assert_eq!(&stored[key].0, id, "{key}");
    }
    assert_eq!(stored["made-before"].0, replayed);
    assert_eq!(stored["reused"].0, reused);
    assert!(
        stored["reused"].1.contains("the first payload"),
        "{:?}",
        stored["reused"]
    );
    assert_eq!(attempts.len(), NEW + 2);
    assert!(attempts.values().all(|n| *n == 1), "{attempts:?}");

    // SQLite: the transaction that waited for the lock took everyone who
    // queued meanwhile. PostgreSQL: the statement that waited held those
    // who came first, the next one all the others.
    let (commits, rows) = app.store.group_commit_counts();
    let (commits, rows) = (commits - batches_before.0, rows - batches_before.1);
    assert_eq!(rows, everyone as u64);
    match backend {
        TestBackend::Sqlite => assert_eq!(commits, 1, "one commit carried every request"),
        TestBackend::Postgres => assert!(commits <= 2, "{commits} statements"),
    }
}

/// The leader's wait for the lock a test holds ([`WriteLock`]) lasts as
/// long as that test's requests take to queue, on however loaded a
/// machine: a wait that ran out would run each write alone, not as the
/// one batch the test looks at.
fn wait_for_the_lock_however_slowly(config: &mut onejob::config::Config) {
    config.database.sqlite_busy_timeout_ms = 60_000;
    config.database.postgres_lock_timeout_ms = 60_000;
    // A lease must outlast two such waits (`config::checks`).
    config.worker.lease_ms = 4 * 60_000;
}

/// Waits until the app's batched writes queued since its start reach
/// `queued` (at most 10 s).
async fn wait_until_queued(app: &TestApp, queued: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.store.batched_writes_queued() != Some(queued) {
        assert!(
            Instant::now() < deadline,
            "the requests never queued: {:?} of {queued}",
            app.store.batched_writes_queued()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Creations sent while the write lock is held, each queued before the
/// next is sent, then let through together: one batch, in that order.
/// Their answers, in order.
async fn as_one_batch(app: &Arc<TestApp>, requests: Vec<(String, String)>) -> Vec<StatusCode> {
    let mut queued = app
        .store
        .batched_writes_queued()
        .expect("creations are batched");
    let lock = WriteLock::take(&app.store);
    let mut sent = Vec::new();
    for (token, key) in requests {
        let app_ = app.clone();
        let body = summarize(&format!("{key} text"));
        sent.push(tokio::spawn(async move {
            app_.post_job(&token, &key, &body).await.status()
        }));
        queued += 1;
        wait_until_queued(app, queued).await;
    }
    lock.release();
    let mut answers = Vec::new();
    for request in sent {
        answers.push(request.await.unwrap());
    }
    answers
}

/// SQLite: a batch whose writes all succeed runs them with no savepoint. In
/// one where a write fails (a creation past its owner's budget), nothing
/// more runs, the transaction is rolled back whole, and the batch runs
/// again, a savepoint each: the refused request gets its 429 and leaves
/// nothing behind, the others are made, once, by the one commit.
#[tokio::test]
async fn a_batch_runs_without_savepoints_until_a_write_fails_then_again_with_them() {
    let mut config = test_config(DEFAULT_TEST_PROVIDERS);
    config.worker.concurrency = 0;
    // The leader may take the first comers before the lock is freed and the
    // rest once its transaction is open: the batch stays open for them.
    config.database.group_commit_ms = 2_000;
    wait_for_the_lock_however_slowly(&mut config);
    let log = StatementLog::new();
    let prepared = PreparedApp::new(TestBackend::Sqlite, config)
        .await
        .recording(&log)
        .await;
    let app = Arc::new(prepared.start().await);
    let alice = app.alice.id.clone();
    app.with_conn(move |conn| {
        onejob::store::budgets::set_limits(
            conn,
            &alice,
            onejob::domain::ledger::BudgetLimits {
                spend_micros: None,
                tokens: Some(1),
            },
            onejob::domain::ledger::Reservation::default(),
            Timestamp::now(),
        )
        .unwrap()
    })
    .await;
    let bob = |key: &str| (app.bob.token.clone(), key.to_owned());
    let savepoints = |statements: &[String]| {
        statements
            .iter()
            .filter(|sql| sql.to_uppercase().starts_with("SAVEPOINT"))
            .count()
    };

    log.take();
    let answers = as_one_batch(&app, vec![bob("b-1"), bob("b-2"), bob("b-3")]).await;
    assert_eq!(answers, [StatusCode::CREATED; 3]);
    let statements = sent_on_one_connection(log.take_sent());
    assert_eq!(savepoints(&statements), 0, "{statements:#?}");
    assert!(
        !statements.iter().any(|sql| sql == "ROLLBACK"),
        "{statements:#?}"
    );

    let (commits_before, _) = app.store.group_commit_counts();
    let refused = (app.alice.token.clone(), "a-1".to_owned());
    let answers = as_one_batch(&app, vec![bob("b-4"), refused, bob("b-5")]).await;
    assert_eq!(
        answers,
        [
            StatusCode::CREATED,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::CREATED
        ]
    );
    let statements = sent_on_one_connection(log.take_sent());
    let rollback = statements.iter().position(|sql| sql == "ROLLBACK");
    let first_savepoint = statements
        .iter()
        .position(|sql| sql.to_uppercase().starts_with("SAVEPOINT"));
    assert!(
        matches!((rollback, first_savepoint), (Some(r), Some(s)) if r < s),
        "rolled back, then again in savepoints: {statements:#?}"
    );
    // The leader took b-4 while the lock was held, the others once its
    // transaction opened: b-5 ran before alice's refusal (bob's creations
    // together) or, if after it, not at all before the rollback.
    let refused_at = statements.iter().position(|sql| sql.contains("\"a-1\""));
    let after_refusal = &statements[refused_at.unwrap()..rollback.unwrap()];
    assert!(
        !after_refusal.iter().any(|sql| sql.contains("\"b-5\"")),
        "nothing ran after the failed write: {statements:#?}"
    );
    let (commits, _) = app.store.group_commit_counts();
    assert_eq!(commits - commits_before, 1, "one commit stored the batch");

    let (bobs, bob_attempts) = stored_jobs(&app, &app.bob.id).await;
    assert_eq!(bobs.len(), 5, "{bobs:?}");
    assert_eq!(bob_attempts.len(), 5);
    assert!(bob_attempts.values().all(|n| *n == 1), "{bob_attempts:?}");
    let (alices, _) = stored_jobs(&app, &app.alice.id).await;
    assert!(
        alices.is_empty(),
        "the refused creation left nothing: {alices:?}"
    );
}

/// The two group-commit gauges of a server's `/metrics`.
async fn group_commit_gauges(base: &str, admin: &str) -> (f64, f64) {
    let text = reqwest::Client::new()
        .get(format!("{base}/metrics"))
        .bearer_auth(admin)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    (
        metric_sum(&text, "onejob_group_commits", &[]),
        metric_sum(&text, "onejob_group_commit_rows", &[]),
    )
}

/// What a creator heard for one key.
enum Heard {
    Created(String),
    Other(StatusCode),
    Nothing,
}

/// 32 creators post new keys to a real `onejob serve` until it is killed
/// (SIGKILL) while requests are in flight. After a restart every
/// acknowledged job is stored under its key with the id it was
/// acknowledged with, nothing is stored under a key never sent, and a
/// retry of each key that got no answer finds or makes exactly one job.
async fn a_kill_9_mid_batch_loses_no_acknowledged_job(backend: TestBackend) {
    const CREATORS: usize = 32;
    let db = TestDb::create(backend);
    let url = db.url.as_str().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let store = db.open_store().await;
    let (owner, token, admin) = tokio::task::spawn_blocking({
        let store = store.clone();
        move || {
            let mut conn = store.conn().unwrap();
            let (user, token) = user_store::add_user(&mut conn, "creator", Role::User).unwrap();
            let (_, admin) = user_store::add_user(&mut conn, "ops", Role::Admin).unwrap();
            (user.id, token.0, admin.0)
        }
    })
    .await
    .unwrap();
    // Nothing is sent: the attempts stay queued, the creations are all
    // there is.
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!("{DEFAULT_TEST_PROVIDERS}\n[worker]\nconcurrency = 0\n"),
    )
    .unwrap();
    let mut first = ServerProcess::spawn(dir.path(), "first", &config, &url);
    first.wait_ready().await;

    let killed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client = reqwest::Client::new();
    let creators: Vec<_> = (0..CREATORS)
        .map(|c| {
            let (client, base, token, killed) = (
                client.clone(),
                first.base.clone(),
                token.clone(),
                killed.clone(),
            );
            tokio::spawn(async move {
                let mut heard = Vec::new();
                for n in 0.. {
                    let key = format!("c{c}-{n}");
                    let answer = client
                        .post(format!("{base}/api/v1/jobs"))
                        .bearer_auth(&token)
                        .header("Idempotency-Key", &key)
                        .json(&summarize(&key))
                        .timeout(Duration::from_secs(10))
                        .send()
                        .await;
                    let got = match answer {
                        Ok(response) if response.status() == StatusCode::CREATED => {
                            match response.json::<Value>().await {
                                Ok(job) => Heard::Created(job["id"].as_str().unwrap().to_owned()),
                                Err(_) => Heard::Nothing,
                            }
                        }
                        Ok(response) => Heard::Other(response.status()),
                        Err(_) => Heard::Nothing,
                    };
                    let nothing = matches!(got, Heard::Nothing);
                    heard.push((key, got));
                    if nothing && killed.load(std::sync::atomic::Ordering::SeqCst) {
                        return heard;
                    }
                }
                unreachable!()
            })
        })
        .collect();

    // Kill it once creations are flowing, batched.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (commits, rows) = group_commit_gauges(&first.base, &admin).await;
    assert!(
        rows > commits && commits > 0.0,
        "creations share commits: {rows} rows in {commits} commits"
    );
    killed.store(true, std::sync::atomic::Ordering::SeqCst);
    first.kill();
    first.wait_exit(Duration::from_secs(10)).await;

    let mut heard = Vec::new();
    for creator in creators {
        heard.extend(creator.await.unwrap());
    }
    let sent: HashSet<&str> = heard.iter().map(|(key, _)| key.as_str()).collect();
    let acknowledged: Vec<(&str, &str)> = heard
        .iter()
        .filter_map(|(key, got)| match got {
            Heard::Created(id) => Some((key.as_str(), id.as_str())),
            _ => None,
        })
        .collect();
    let unanswered: Vec<&str> = heard
        .iter()
        .filter(|(_, got)| matches!(got, Heard::Nothing))
        .map(|(key, _)| key.as_str())
        .collect();
    for (key, got) in &heard {
        if let Heard::Other(status) = got {
            panic!("{key} was answered {status}");
        }
    }
    assert!(
        !unanswered.is_empty(),
        "the kill came while requests were in flight"
    );

    let mut second = ServerProcess::spawn(dir.path(), "second", &config, &url);
    second.wait_ready().await;
    let stored: HashMap<String, String> = {
        let (store, owner) = (store.clone(), owner.as_str().to_owned());
        tokio::task::spawn_blocking(move || {
            jobs::table
                .filter(jobs::owner_id.eq(&owner))
                .select((jobs::idempotency_key, jobs::id))
                .load::<(String, String)>(&mut store.conn().unwrap())
                .unwrap()
                .into_iter()
                .collect()
        })
        .await
        .unwrap()
    };
    for (key, id) in &acknowledged {
        assert_eq!(
            stored.get(*key).map(String::as_str),
            Some(*id),
            "acknowledged {key} is stored with the id it was given"
        );
    }
    for key in stored.keys() {
        assert!(sent.contains(key.as_str()), "{key} was never sent");
    }
    let stored_unanswered = unanswered
        .iter()
        .filter(|key| stored.contains_key(**key))
        .count();

    // Each unanswered key, retried: its job, or a new one; never two.
    for key in &unanswered {
        let response = client
            .post(format!("{}/api/v1/jobs", second.base))
            .bearer_auth(&token)
            .header("Idempotency-Key", *key)
            .json(&summarize(key))
            .send()
            .await
            .unwrap();
        let status = response.status();
        let job: Value = response.json().await.unwrap();
        match stored.get(*key) {
            Some(id) => {
                assert_eq!(status, StatusCode::OK, "{key} was stored: a replay");
                assert_eq!(job["id"], id.as_str());
            }
            None => assert_eq!(status, StatusCode::CREATED, "{key}"),
        }
    }
    let (jobs_now, attempts_now): (i64, i64) = {
        let (store, owner) = (store.clone(), owner.as_str().to_owned());
        tokio::task::spawn_blocking(move || {
            let mut conn = store.conn().unwrap();
            (
                jobs::table
                    .filter(jobs::owner_id.eq(&owner))
                    .count()
                    .get_result(&mut conn)
                    .unwrap(),
                attempts::table
                    .filter(attempts::owner_id.eq(&owner))
                    .count()
                    .get_result(&mut conn)
                    .unwrap(),
            )
        })
        .await
        .unwrap()
    };
    assert_eq!(jobs_now as usize, sent.len(), "one job per key");
    assert_eq!(attempts_now, jobs_now, "one attempt per job");
    record_figures(
        &format!("kill-mid-batch-{backend:?}"),
        &format!(
            "kill -9 mid-batch: {} acknowledged, all stored; {} in flight at the kill, {} of them \
             stored (committed, unanswered), the rest created on retry; before the kill {rows} \
             creations in {commits} commits\n",
            acknowledged.len(),
            unanswered.len(),
            stored_unanswered,
        ),
    );
}

/// What a creation stores, less what differs between any two (ids, keys,
/// the clock): the job's status and version, and its attempt's columns,
/// its times as offsets from its creation.
fn shape(job: &Job, attempt: &Attempt, lease_ms: i64) -> String {
    let since = |at: Option<Timestamp>| at.map(|at| at - attempt.created_at);
    // The lease runs on the database's clock, the rest on the process's.
    let lease_off = attempt
        .lease_expires_at
        .map(|at| (at - attempt.created_at - lease_ms).abs() < 2_000);
    format!(
        "{:?} v{} created={} | #{} {} {:?} {:?} read={:?} lease={:?}/{lease_off:?} \
         started={:?} timeout={:?} sent={:?} finished={:?} not_before={:?} error={:?}",
        job.status,
        job.version,
        job.created_at == job.updated_at && job.created_at == attempt.created_at,
        attempt.number,
        attempt.provider,
        attempt.state,
        attempt.outcome,
        attempt.version_read,
        attempt.lease_owner,
        since(attempt.started_at),
        since(attempt.timeout_at),
        since(attempt.sent_at),
        attempt.finished_at,
        attempt.not_before,
        attempt.reason(),
    )
}

/// The lease of [`batch_creation`]'s started attempts.
const BATCH_LEASE_MS: i64 = 30_000;

/// An app whose worker claims nothing (the rows stay as stored), its
/// store recording every statement in the log returned.
/// The statements of the connection that wrote the batch (the one that
/// inserted into `jobs`): the app's own background reads, on other
/// connections, may fall inside the window.
fn sent_on_one_connection(sent: Vec<crate::support::statement_log::Sent>) -> Vec<String> {
    let batch = sent
        .iter()
        .find(|s| s.sql.to_lowercase().contains("into jobs"))
        .map(|s| s.connection);
    sent.into_iter()
        .filter(|s| Some(s.connection) == batch)
        .map(|s| s.sql)
        .collect()
}

async fn recording_app(backend: TestBackend) -> (PreparedApp, StatementLog) {
    let mut config = test_config(DEFAULT_TEST_PROVIDERS);
    config.worker.concurrency = 0;
    let log = StatementLog::new();
    let prepared = PreparedApp::new(backend, config)
        .await
        .recording(&log)
        .await;
    (prepared, log)
}

/// `owner`'s creation under `key`, its first attempt started in the
/// creating transaction or queued.
fn batch_creation(owner: &UserId, key: &str, started: bool) -> onejob::store::jobs::NewJob {
    use onejob::domain::{IdempotencyKey, JsonText};
    onejob::store::jobs::NewJob {
        id: onejob::domain::JobId::new(),
        owner_id: owner.clone(),
        key: IdempotencyKey::parse(key).unwrap(),
        task: "summarize".into(),
        provider: "alpha".into(),
        requested_provider: None,
        input: JsonText::parse(format!("{{\"text\":\"{key}\"}}")).unwrap(),
        params: JsonText::parse("{}").unwrap(),
        // A digest's length, as the table requires; unique to the key.
        fingerprint: format!(
            "{:0<64}",
            key.bytes().map(|b| format!("{b:02x}")).collect::<String>()
        ),
        start: started.then(|| onejob::store::queue::StartNow {
            lease_owner: "pid1-test".into(),
            lease_ms: BATCH_LEASE_MS,
            soft_timeout_ms: 7_000,
        }),
        reservation: Default::default(),
        trace_context: None,
        kept_grant: None,
    }
}

/// Each of `owner`'s keys with the count of its job's attempts, sorted by key.
fn attempts_by_key(conn: &mut DbConnection, owner: &UserId) -> Vec<(String, i64)> {
    jobs::table
        .inner_join(attempts::table.on(attempts::job_id.eq(jobs::id)))
        .filter(jobs::owner_id.eq(owner))
        .group_by(jobs::idempotency_key)
        .select((jobs::idempotency_key, diesel::dsl::count(attempts::id)))
        .order(jobs::idempotency_key)
        .load(conn)
        .unwrap()
}

/// One owner's creations as the batch's leader runs them: in its
/// transaction on SQLite, a statement committing by itself on PostgreSQL.
fn as_the_leader_runs(
    conn: &mut DbConnection,
    owner: &UserId,
    news: &[&onejob::store::jobs::NewJob],
) -> Vec<StoreResult<Created>> {
    match conn {
        DbConnection::Sqlite(_) => write_transaction(conn, |conn| {
            Ok::<_, StoreError>(create_many_of_one_owner(
                conn,
                owner,
                news,
                Placement::OneDatabase,
            ))
        })
        .unwrap(),
        DbConnection::Postgresql(_) => {
            create_many_of_one_owner(conn, owner, news, Placement::OneDatabase)
        }
    }
}

/// One owner's creations in a batch go in together (multi-row statements
/// on both backends), yet each job and attempt stored is the row that
/// creation would make alone, started or queued; a key given twice in the
/// batch makes one job, the second hearing of it; and on SQLite the batch
/// is a few statements, not a savepoint, two inserts, a budget's read and
/// a release per creation.
async fn one_owners_batch_stores_what_each_creation_alone_would(backend: TestBackend) {
    use onejob::store::jobs::{create_job_with_attempts, NewJob};

    let (prepared, log) = recording_app(backend).await;
    let owner = prepared.alice.id.clone();
    let new_job = {
        let owner = owner.clone();
        move |key: &str, started: bool| batch_creation(&owner, key, started)
    };
    let (alone, outcomes, statements, rows) = prepared
        .with_conn(move |conn| {
            let alone: Vec<(&str, Vec<Attempt>)> =
                [("alone-started", true), ("alone-queued", false)]
                    .into_iter()
                    .map(|(key, started)| {
                        let (_, attempts) =
                            create_job_with_attempts(conn, &new_job(key, started)).unwrap();
                        (key, attempts)
                    })
                    .collect();
            let mut news: Vec<NewJob> = (0..4)
                .map(|i| new_job(&format!("started-{i}"), true))
                .chain((0..3).map(|i| new_job(&format!("queued-{i}"), false)))
                .collect();
            news.push(new_job("started-1", true));
            let news: Vec<&NewJob> = news.iter().collect();
            log.take();
            let outcomes = as_the_leader_runs(conn, &owner, &news);
            let statements = sent_on_one_connection(log.take_sent());
            let jobs: Vec<Job> = jobs::table
                .filter(jobs::owner_id.eq(&owner))
                .select(Job::as_select())
                .load(conn)
                .unwrap();
            let attempts: Vec<Attempt> = attempts::table
                .filter(attempts::owner_id.eq(&owner))
                .select(Attempt::as_select())
                .load(conn)
                .unwrap();
            let rows: HashMap<String, (Job, Attempt)> = jobs
                .into_iter()
                .map(|job| {
                    let mut of_job = attempts.iter().filter(|a| a.job_id == job.id);
                    let attempt = of_job.next().expect("an attempt").clone();
                    assert!(of_job.next().is_none(), "one attempt for {job:?}");
                    (job.idempotency_key.clone(), (job, attempt))
                })
                .collect();
            (alone, outcomes, statements, rows)
        })
        .await;

    assert_eq!(rows.len(), 9, "two alone, seven in the batch: {rows:?}");
    // Alone too, each creation answers with the attempt as stored.
    for (key, attempts) in &alone {
        assert_eq!(
            attempts.as_slice(),
            std::slice::from_ref(&rows[*key].1),
            "{key}"
        );
    }
    let keys = ["started-0", "started-1", "started-2", "started-3"]
        .into_iter()
        .chain(["queued-0", "queued-1", "queued-2", "started-1"]);
    for (key, outcome) in keys.zip(&outcomes) {
        let (job, attempt) = &rows[key];
        match outcome.as_ref().unwrap() {
            (CreateOutcome::Created(made), made_attempts) => {
                assert_eq!(
                    (made, made_attempts.as_slice()),
                    (job, std::slice::from_ref(attempt))
                );
            }
            (CreateOutcome::Existing(found), _) => {
                assert_eq!(key, "started-1", "only the second comer finds a job");
                assert_eq!(found, job);
            }
        }
    }
    let made = outcomes
        .iter()
        .filter(|o| matches!(o, Ok((CreateOutcome::Created(_), _))))
        .count();
    assert_eq!(made, 7, "the repeated key was made once");
    let alone = |key: &str| shape(&rows[key].0, &rows[key].1, BATCH_LEASE_MS);
    for key in ["started-0", "started-1", "started-2", "started-3"] {
        assert_eq!(
            shape(&rows[key].0, &rows[key].1, BATCH_LEASE_MS),
            alone("alone-started"),
            "{key}"
        );
    }
    for key in ["queued-0", "queued-1", "queued-2"] {
        assert_eq!(
            shape(&rows[key].0, &rows[key].1, BATCH_LEASE_MS),
            alone("alone-queued"),
            "{key}"
        );
    }
    // Alone, the eight would be eight savepoints of five statements each.
    if backend == TestBackend::Sqlite {
        assert!(
            statements.len() <= 16,
            "{} statements: {statements:#?}",
            statements.len()
        );
    }
}

/// A storm of twins in one batch (sixteen creations under one key) costs
/// the statements one creation under that key costs: the first is made,
/// and the fifteen others hear of its job, as the database stored it,
/// without a statement each.
async fn twins_in_one_batch_are_answered_from_the_first_without_statements_of_their_own(
    backend: TestBackend,
) {
    use onejob::store::jobs::NewJob;

    let (prepared, log) = recording_app(backend).await;
    let owner = prepared.alice.id.clone();
    let (outcomes, storm_statements, calm_statements, stored) = prepared
        .with_conn(move |conn| {
            let mut send = |keys: &[&str]| {
                let news: Vec<NewJob> = keys
                    .iter()
                    .map(|key| batch_creation(&owner, key, false))
                    .collect();
                let news: Vec<&NewJob> = news.iter().collect();
                log.take();
                let outcomes = as_the_leader_runs(conn, &owner, &news);
                (outcomes, sent_on_one_connection(log.take_sent()))
            };
            let (_, calm_statements) = send(&["calm-0", "calm-1"]);
            let mut storm = vec!["storm"; 16];
            storm.push("after-storm");
            let (outcomes, storm_statements) = send(&storm);
            let stored: Vec<Job> = jobs::table
                .filter(jobs::idempotency_key.eq("storm"))
                .select(Job::as_select())
                .load(conn)
                .unwrap();
            (outcomes, storm_statements, calm_statements, stored)
        })
        .await;

    assert_eq!(stored.len(), 1, "one job under the key: {stored:?}");
    let job = &stored[0];
    let (first, twins) = outcomes[..16].split_first().unwrap();
    assert!(
        matches!(first, Ok((CreateOutcome::Created(made), _)) if made == job),
        "{first:?}"
    );
    for twin in twins {
        assert!(
            matches!(twin, Ok((CreateOutcome::Existing(found), attempts)) if found == job && attempts.len() == 1),
            "{twin:?}"
        );
    }
    assert!(matches!(outcomes[16], Ok((CreateOutcome::Created(_), _))));
    assert_eq!(
        storm_statements.len(),
        calm_statements.len(),
        "sixteen twins and one other key cost what two keys cost: {storm_statements:#?}"
    );
}

/// A batch as large as `database.group_commit_rows` may let one be (here
/// 5,000 creations of one owner) is stored whole, every creation made
/// once with its first attempt, and stays a few statements: on SQLite, in
/// multi-row inserts of at most 64 rows, far under the bound values SQLite
/// allows one statement (a single insert of 4,096 rows would pass it, fail,
/// and leave every creation to be made alone).
async fn a_batch_of_thousands_is_stored_whole_in_a_few_statements(backend: TestBackend) {
    const CREATIONS: usize = 5_000;
    let (prepared, log) = recording_app(backend).await;
    let owner = prepared.alice.id.clone();
    let (outcomes, statements, stored) = prepared
        .with_conn(move |conn| {
            let news: Vec<_> = (0..CREATIONS)
                .map(|i| batch_creation(&owner, &format!("many-{i}"), i % 2 == 0))
                .collect();
            let news: Vec<_> = news.iter().collect();
            log.take();
            let outcomes = as_the_leader_runs(conn, &owner, &news);
            let statements = sent_on_one_connection(log.take_sent());
            let stored = attempts_by_key(conn, &owner);
            (outcomes, statements, stored)
        })
        .await;

    assert_eq!(outcomes.len(), CREATIONS);
    for (i, outcome) in outcomes.iter().enumerate() {
        match outcome {
            Ok((CreateOutcome::Created(job), attempts)) => {
                assert_eq!(job.idempotency_key, format!("many-{i}"));
                assert_eq!(attempts.len(), 1, "{job:?}");
            }
            other => panic!("creation {i}: {other:?}"),
        }
    }
    assert_eq!(stored.len(), CREATIONS, "one job a key");
    assert!(stored.iter().all(|(_, attempts)| *attempts == 1));
    // SQLite: for each chunk of up to 64 rows the jobs' insert, its count of
    // the rows it stored and the attempts' insert, and the savepoint around
    // them; PostgreSQL: one statement.
    let most = match backend {
        TestBackend::Sqlite => 3 * CREATIONS.div_ceil(MAX_ROWS_PER_STATEMENT) + 4,
        TestBackend::Postgres => 4,
    };
    assert!(
        statements.len() <= most,
        "{} statements for {CREATIONS} creations, at most {most} expected",
        statements.len()
    );
}

/// A batch whose chunk holds a key that made a job before and new keys:
/// the chunk's insert stores some of its rows but not all, and each
/// creation hears what became of its own (on SQLite, read back by id, since
/// the insert returns nothing): the old key its old job, each new key a
/// job of its own with its first attempt.
async fn a_batch_beside_an_old_key_tells_each_creation_what_it_made(backend: TestBackend) {
    use onejob::store::jobs::create_job_with_attempts;

    let (prepared, _log) = recording_app(backend).await;
    let owner = prepared.alice.id.clone();
    let (old, outcomes, stored) = prepared
        .with_conn(move |conn| {
            let old = match create_job_with_attempts(conn, &batch_creation(&owner, "old", false)) {
                Ok((CreateOutcome::Created(job), _)) => job,
                other => panic!("the old key's job: {other:?}"),
            };
            // Four rows: one chunk of four, the old key among the new.
            let news: Vec<_> = ["new-0", "old", "new-1", "new-2"]
                .into_iter()
                .map(|key| batch_creation(&owner, key, false))
                .collect();
            let news: Vec<_> = news.iter().collect();
            let outcomes = as_the_leader_runs(conn, &owner, &news);
            let stored = attempts_by_key(conn, &owner);
            (old, outcomes, stored)
        })
        .await;

    let keys = ["new-0", "old", "new-1", "new-2"];
    for (key, outcome) in keys.into_iter().zip(&outcomes) {
        match outcome {
            Ok((CreateOutcome::Existing(job), _)) if key == "old" => assert_eq!(job, &old),
            Ok((CreateOutcome::Created(job), attempts)) if key != "old" => {
                assert_eq!(job.idempotency_key, key);
                assert_eq!(attempts.len(), 1, "{key}");
                assert_eq!(attempts[0].job_id, job.id, "{key}");
            }
            other => panic!("{key}: {other:?}"),
        }
    }
    let expected: Vec<(String, i64)> = ["new-0", "new-1", "new-2", "old"]
        .into_iter()
        .map(|key| (key.to_owned(), 1))
        .collect();
    assert_eq!(stored, expected, "one job and one attempt a key");
}

/// The store `config` opens on `db`, opened as the server opens it (on a
/// blocking thread).
async fn open_store(db: &TestDb, config: onejob::config::Config) -> Store {
    let url = db.url.clone();
    tokio::task::spawn_blocking(move || onejob::startup::open_store(&url, &config).unwrap())
        .await
        .unwrap()
}

/// A leader that gets no pooled connection in time refuses its batch (a
/// 503) and gives up the lead: the next creation leads and commits. (A
/// leader that returned still leading left every later creation waiting
/// for it, until a restart: a database outage that outlasted the pool's
/// wait wedged creations for good.)
async fn a_leader_without_a_connection_refuses_its_batch_and_the_next_comer_leads(
    backend: TestBackend,
) {
    let db = TestDb::create(backend);
    let mut config = test_config(DEFAULT_TEST_PROVIDERS);
    config.database.pool_size = 1;
    config.database.pool_timeout_ms = 200;
    let store = open_store(&db, config).await;
    // The pool's one connection, held by the test while the first
    // creation queues: its leader gets none.
    let (held, owner) = {
        let store = store.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = store.conn().unwrap();
            let (user, _) = user_store::add_user(&mut conn, "alice", Role::User).unwrap();
            (conn, user.id)
        })
        .await
        .unwrap()
    };
    let first = tokio::time::timeout(
        Duration::from_secs(10),
        store.create_job(
            crate::support::db::new_job(&owner, "no-connection"),
            None,
            None,
        ),
    )
    .await
    .expect("the first creation is answered");
    assert!(
        matches!(first, Err(StoreError::Busy(_))),
        "refused as busy: {:?}",
        first.map(|_| ())
    );
    drop(held);
    let next = tokio::time::timeout(
        Duration::from_secs(10),
        store.create_job(
            crate::support::db::new_job(&owner, "next-comer"),
            None,
            None,
        ),
    )
    .await
    .expect("the next creation leads, not waits for a leader that has gone");
    assert!(
        matches!(next, Ok((CreateOutcome::Created(_), _))),
        "created: {:?}",
        next.map(|_| ())
    );
}

/// A batch that panics (here in what runs after its commit) is answered as
/// cancelled, and the creations after it are led and committed. (The
/// leader's guard once cancelled whatever had queued while the panic
/// unwound, with the lead still taken: the next creation came back
/// cancelled, on one backend or the other as the threads fell.)
async fn a_batch_that_panics_leaves_the_next_creations_committed(backend: TestBackend) {
    let db = TestDb::create(backend);
    let config = test_config(DEFAULT_TEST_PROVIDERS);
    let store = open_store(&db, config).await;
    let owner = {
        let store = store.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = store.conn().unwrap();
            user_store::add_user(&mut conn, "alice", Role::User)
                .unwrap()
                .0
                .id
        })
        .await
        .unwrap()
    };
    let create = |key: &str, after: Option<AfterCommit>| {
        let job = crate::support::db::new_job(&owner, key);
        let store = store.clone();
        async move {
            tokio::time::timeout(Duration::from_secs(10), store.create_job(job, None, after))
                .await
                .expect("answered")
        }
    };
    let first = create("first", None).await;
    assert!(
        matches!(first, Ok((CreateOutcome::Created(_), _))),
        "first created"
    );
    let panics: AfterCommit = Box::new(|_: &Created| panic!("what runs after the commit panics"));
    let panicked = create("panics", Some(panics)).await;
    assert!(
        matches!(panicked, Err(StoreError::Cancelled)),
        "cancelled: {:?}",
        panicked.map(|_| ())
    );
    for key in ["after-the-panic", "and-the-next"] {
        let made = create(key, None).await;
        assert!(
            matches!(made, Ok((CreateOutcome::Created(_), _))),
            "{key} created: {:?}",
            made.map(|(outcome, _)| matches!(outcome, CreateOutcome::Created(_)))
        );
    }
}

on_both_backends!(
    twins_in_one_batch_are_answered_from_the_first_without_statements_of_their_own,
    a_leader_without_a_connection_refuses_its_batch_and_the_next_comer_leads,
    one_owners_batch_stores_what_each_creation_alone_would,
    a_batch_of_thousands_is_stored_whole_in_a_few_statements,
    a_batch_beside_an_old_key_tells_each_creation_what_it_made,
    a_batch_with_a_replay_and_a_reused_key_answers_each_and_stores_the_right_rows,
    a_kill_9_mid_batch_loses_no_acknowledged_job,
    a_batch_that_panics_leaves_the_next_creations_committed,
);
