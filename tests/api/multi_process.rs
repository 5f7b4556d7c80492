//! Several real `onejob serve` processes on one PostgreSQL database: they
//! start together on an empty database (migrations and the first admin are
//! made once), share one queue (every process claims work), and never send
//! an attempt twice.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use diesel::prelude::*;
use onejob::domain::{AttemptId, JobStatus};
use onejob::store::schema::{attempts, jobs, users};
use onejob::store::users as user_store;

use crate::server_process::ServerProcess;
use crate::support::fake_provider::{
    strict_task_toml, Behaviour, FakeProvider, ProviderToml, Shape,
};
use crate::support::harness::{postgres_available, summarize, TestBackend, TestDb};

const PROCESSES: usize = 3;
const CONCURRENCY: usize = 2;
const JOBS: usize = 60;

fn config_file(
    dir: &std::path::Path,
    name: &str,
    fake: &FakeProvider,
    concurrency: usize,
) -> std::path::PathBuf {
    let toml = format!(
        r#"
[worker]
concurrency = {concurrency}
poll_interval_ms = 50
lease_ms = 20000

{provider}{task}"#,
        provider = ProviderToml::openai("fake", &fake.base_url)
            .timeout_ms(60_000)
            .connect_timeout_ms(None)
            .toml(),
        task = strict_task_toml("summarize", &["fake"], "Summarize: {{ text }}"),
    );
    let path = dir.join(name);
    std::fs::write(&path, toml).unwrap();
    path
}

/// The process id in a lease owner (`pid<N>-<uuid>`).
fn pid_of(lease_owner: &str) -> u32 {
    lease_owner
        .strip_prefix("pid")
        .and_then(|rest| rest.split('-').next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("lease owner {lease_owner:?} names no process"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_processes_start_together_share_the_queue_and_never_send_an_attempt_twice() {
    if !postgres_available() {
        return;
    }
    let db = TestDb::create_empty(TestBackend::Postgres);
    let url = db.url.as_str().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeProvider::start(Shape::OpenAi).await;

    // Phase 1: three processes start at once on an empty database, sending
    // nothing (concurrency 0), and take the jobs.
    let serving_only = config_file(dir.path(), "serving.toml", &fake, 0);
    let mut servers: Vec<ServerProcess> = (0..PROCESSES)
        .map(|i| ServerProcess::spawn(dir.path(), &format!("first-{i}"), &serving_only, &url))
        .collect();
    for server in &mut servers {
        server.wait_ready().await;
    }
    let announced = servers
        .iter()
        .filter(|s| s.stderr().contains("onejob created the first user"))
        .count();
    assert_eq!(announced, 1, "exactly one process created the first admin");
    let store = db.open_store().await;
    let (admins, migrations, token) = {
        let store = store.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = store.conn().unwrap();
            let admins: i64 = users::table.count().get_result(&mut conn).unwrap();
            let migrations: i64 = diesel::dsl::sql::<diesel::sql_types::BigInt>(
                "SELECT count(*) FROM __diesel_schema_migrations",
            )
            .get_result(&mut conn)
            .unwrap();
            let token = user_store::issue_token(&mut conn, "admin", None).unwrap();
            (admins, migrations, token.0)
        })
        .await
        .unwrap()
    };
    assert_eq!(admins, 1, "one user: the first admin, made once");
    let folders = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/postgres"))
        .unwrap()
        .count() as i64;
    assert_eq!(migrations, folders, "each migration applied once");

    let client = reqwest::Client::new();
    for i in 0..JOBS {
        let base = &servers[i % PROCESSES].base;
        let response = client
            .post(format!("{base}/api/v1/jobs"))
            .bearer_auth(&token)
            .header("Idempotency-Key", format!("shared-{i}"))
            .json(&summarize(&format!("job {i}")))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), reqwest::StatusCode::CREATED, "job {i}");
    }
    for server in &servers {
        server.terminate();
    }
    for server in &mut servers {
        assert!(server.wait_exit(Duration::from_secs(20)).await.success());
    }

    // Phase 2: three sending processes start together on the queued jobs.
    // The provider holds every answer, so each process fills its slots and
    // stops claiming: exactly PROCESSES × CONCURRENCY calls are held.
    fake.set_default(Behaviour::Hold);
    let sending = config_file(dir.path(), "sending.toml", &fake, CONCURRENCY);
    let mut servers: Vec<ServerProcess> = (0..PROCESSES)
        .map(|i| ServerProcess::spawn(dir.path(), &format!("second-{i}"), &sending, &url))
        .collect();
    let held = fake.wait_held_count(PROCESSES * CONCURRENCY).await;
    let pids: HashSet<u32> = servers.iter().map(|s| s.pid).collect();
    let running: Vec<(AttemptId, Option<String>)> = {
        let store = store.clone();
        tokio::task::spawn_blocking(move || {
            attempts::table
                .filter(attempts::state.eq(onejob::domain::AttemptState::Running))
                .select((attempts::id, attempts::lease_owner))
                .load(&mut store.conn().unwrap())
                .unwrap()
        })
        .await
        .unwrap()
    };
    let mut claims: HashMap<u32, usize> = HashMap::new();
    for (_, owner) in &running {
        *claims.entry(pid_of(owner.as_deref().unwrap())).or_default() += 1;
    }
    eprintln!("multi-process: running attempts per process while held: {claims:?}");
    assert_eq!(running.len(), PROCESSES * CONCURRENCY, "{running:?}");
    assert_eq!(
        claims.keys().copied().collect::<HashSet<_>>(),
        pids,
        "every process claimed work"
    );
    assert!(claims.values().all(|n| *n == CONCURRENCY), "{claims:?}");

    fake.set_default(Behaviour::Answer(
        serde_json::json!({"summary": "fake summary"}),
    ));
    for id in &held {
        fake.release(
            id,
            Behaviour::Answer(serde_json::json!({"summary": "fake summary"})),
        );
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let store = store.clone();
        let done: i64 = tokio::task::spawn_blocking(move || {
            jobs::table
                .filter(jobs::status.eq(JobStatus::Succeeded))
                .count()
                .get_result(&mut store.conn().unwrap())
                .unwrap()
        })
        .await
        .unwrap();
        if done as usize == JOBS {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{done} of {JOBS} jobs succeeded in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sent: Vec<(AttemptId, Option<String>)> = {
        let store = store.clone();
        tokio::task::spawn_blocking(move || {
            attempts::table
                .select((attempts::id, attempts::lease_owner))
                .load(&mut store.conn().unwrap())
                .unwrap()
        })
        .await
        .unwrap()
    };
    assert_eq!(sent.len(), JOBS, "one attempt per job");
    let mut per_process: HashMap<u32, usize> = HashMap::new();
    for (id, owner) in &sent {
        assert_eq!(
            fake.requests_for(id.as_str()),
            1,
            "attempt {id} sent exactly once"
        );
        let pid = pid_of(owner.as_deref().unwrap());
        assert!(pids.contains(&pid), "claimed by one of the three: {pid}");
        *per_process.entry(pid).or_default() += 1;
    }
    assert_eq!(
        fake.total_requests(),
        JOBS,
        "no request beyond one per attempt"
    );
    eprintln!("multi-process: attempts sent per process: {per_process:?}");
    for server in &mut servers {
        server.kill();
    }
}
