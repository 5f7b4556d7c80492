//! Three `onejob serve` processes on one PostgreSQL; A, through the proxy,
//! is cut off while it holds leases with calls in flight. See the module
//! above for the story; each phase is a method of [`Run`].

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onejob::domain::{AttemptState, JobStatus, RaceResult};
use onejob::store::Store;
use serde_json::json;

use super::clients::{self, create_until_acknowledged, Seen};
use super::rows::{pid_of, wait_rows, Outcome, Rows};
use super::setup::{qualify, seed, stale_writes, watch_stale_writes, write_config};
use super::{HELD, LEASE_MS, QUEUED, RESOLVED, STEP};
use crate::history::History;
use crate::server_process::ServerProcess;
use crate::support::db_proxy::DbProxy;
use crate::support::fake_provider::{answer, Behaviour, FakeProvider, Shape};
use crate::support::harness::{record_figures, TestBackend, TestDb};

/// The key of the job A is asked to create after the heal.
const RECOVERED: &str = "created-through-a-after-the-heal";

/// Everything the run holds.
struct Run {
    _db: TestDb,
    url: String,
    store: Store,
    token: String,
    support: String,
    dir: tempfile::TempDir,
    config: std::path::PathBuf,
    fake: FakeProvider,
    backup: FakeProvider,
    history: Arc<History>,
    proxy: DbProxy,
    /// A reaches the database through the proxy; B and C straight.
    a: ServerProcess,
    others: Vec<ServerProcess>,
}

/// What happened while A was cut off.
struct Meanwhile {
    /// How long after the cut A's attempts were all `unknown`.
    unknown_after: Duration,
    /// The resolved jobs, each with the backup attempt support started.
    resolved: Vec<(String, String)>,
    /// The finished jobs' results and winners, just before the heal.
    settled: HashMap<String, Outcome>,
    clients: Vec<Seen>,
}

/// What the heal brought.
struct Healed {
    /// How long A was cut off.
    cut_for: Duration,
    /// From the heal until A's late answers were all written.
    settled_after: Duration,
    /// From the heal until A acknowledged a new creation.
    served_after: Duration,
    end: Rows,
}

pub async fn a_cut_off_process_sends_nothing_again_and_overwrites_no_result() {
    let started = Instant::now();
    let mut run = Run::start().await;
    let held = run.a_sends_its_calls().await;
    let cut = run.cut_off().await;
    let meanwhile = run.meanwhile(&held, cut).await;
    let healed = run.release_and_heal(&held, cut).await;
    run.judge(&held, &meanwhile, &healed, started).await;
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "bounded in time"
    );
    run.a.kill();
    for process in &mut run.others {
        process.kill();
    }
}

impl Run {
    /// The database, the users, the two fakes (the backup qualified), and
    /// A, through the proxy. `fake` holds the first HELD calls and answers
    /// the rest.
    async fn start() -> Self {
        let db = TestDb::create(TestBackend::Postgres);
        let url = db.url.as_str().to_owned();
        let (store, token, support) = seed(&db).await;
        watch_stale_writes(&store).await;
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeProvider::start(Shape::OpenAi).await;
        let backup = FakeProvider::start(Shape::OpenAi).await;
        let config = write_config(dir.path(), &fake, &backup);
        qualify(dir.path(), &config, &url, "backup").await;
        backup.set_default(answer("from the backup"));
        fake.set_default(answer("from B or C"));
        for _ in 0..HELD {
            fake.push(Behaviour::Hold);
        }
        let proxy = DbProxy::start(&url).await;
        let mut a = ServerProcess::spawn(dir.path(), "a", &config, &proxy.url_for(&url));
        a.wait_ready().await;
        Run {
            _db: db,
            url,
            store,
            token,
            support,
            dir,
            config,
            fake,
            backup,
            history: Arc::new(History::default()),
            proxy,
            a,
            others: Vec::new(),
        }
    }

    /// HELD + QUEUED jobs created through A: A sends HELD (held at the
    /// fake), the others wait in the queue behind its full slots. The ids
    /// of A's attempts.
    async fn a_sends_its_calls(&self) -> Vec<String> {
        for i in 0..HELD + QUEUED {
            let key = format!("before-the-cut-{i}");
            create_until_acknowledged(&self.history, &self.a.base, &self.token, &key).await;
        }
        let held = tokio::time::timeout(STEP, self.fake.wait_held_count(HELD))
            .await
            .expect("A sent its calls");
        let rows = wait_rows(&self.store, "A holds its claims, the rest queued", |rows| {
            let queued = rows
                .attempts
                .iter()
                .filter(|a| a.state == AttemptState::Queued);
            rows.attempts.len() == HELD + QUEUED && queued.count() == QUEUED
        })
        .await;
        for id in &held {
            let attempt = rows.attempt(id);
            assert_eq!(attempt.state, AttemptState::Running, "{attempt:?}");
            assert_eq!(pid_of(attempt), self.a.pid, "A holds {id}");
            assert!(attempt.sent_at.is_some(), "A sent {id}");
        }
        held
    }

    /// The cut: A is cut off with HELD leases and calls in flight; B and C
    /// start, straight on the database. When it began.
    async fn cut_off(&mut self) -> Instant {
        let cut = Instant::now();
        self.proxy.partition();
        for name in ["b", "c"] {
            let process = ServerProcess::spawn(self.dir.path(), name, &self.config, &self.url);
            self.others.push(process);
        }
        for process in &mut self.others {
            process.wait_ready().await;
        }
        cut
    }

    /// While A is cut off: its leases run out and B's and C's reapers make
    /// its attempts `unknown`; they take the queued jobs; support resolves
    /// RESOLVED unknown attempts on the backup, and B or C finishes those
    /// jobs. A's clients meanwhile try A, then B.
    async fn meanwhile(&self, held: &[String], cut: Instant) -> Meanwhile {
        let b = self.others[0].base.clone();
        let clients = tokio::spawn(clients::of_a_meanwhile(
            self.history.clone(),
            self.a.base.clone(),
            b.clone(),
            self.token.clone(),
        ));
        let rows = wait_rows(
            &self.store,
            "A's attempts unknown, the queue served",
            |rows| {
                let succeeded = rows
                    .jobs
                    .iter()
                    .filter(|j| j.status == JobStatus::Succeeded);
                held.iter()
                    .all(|id| rows.state(id) == AttemptState::Unknown)
                    && succeeded.count() == QUEUED
            },
        )
        .await;
        let unknown_after = cut.elapsed();
        let mut resolved = Vec::new();
        for id in &held[..RESOLVED] {
            let job = rows.attempt(id).job_id.to_string();
            let next = clients::resolve_on_backup(&b, &self.support, &job, id).await;
            resolved.push((job, next));
        }
        let rows = wait_rows(
            &self.store,
            "the resolved jobs finished on the backup",
            |rows| {
                resolved
                    .iter()
                    .all(|(job, _)| rows.job(job).status == JobStatus::Succeeded)
            },
        )
        .await;
        let clients = tokio::time::timeout(STEP, clients)
            .await
            .expect("A's clients gave up in time")
            .unwrap();
        Meanwhile {
            unknown_after,
            resolved,
            settled: rows.outcomes(),
            clients,
        }
    }

    /// A's provider answers come back to A, still cut off (its writes of
    /// them hang with the rest); then the heal. A's stale writes arrive:
    /// every attempt of A reaches its end, and A serves again.
    async fn release_and_heal(&self, held: &[String], cut: Instant) -> Healed {
        for (i, id) in held.iter().enumerate() {
            self.fake
                .release(id, answer(&format!("late answer {i} from A")));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let cut_for = cut.elapsed();
        self.proxy.heal();
        let healed = Instant::now();
        wait_rows(&self.store, "A's late answers written", |rows| {
            held.iter()
                .all(|id| rows.state(id) == AttemptState::Succeeded)
        })
        .await;
        let settled_after = healed.elapsed();
        create_until_acknowledged(&self.history, &self.a.base, &self.token, RECOVERED).await;
        let served_after = healed.elapsed();
        let end = wait_rows(&self.store, "every job finished", |rows| {
            rows.jobs.iter().all(|j| j.status == JobStatus::Succeeded)
                && rows.attempts.iter().all(|a| !a.state.is_live())
        })
        .await;
        Healed {
            cut_for,
            settled_after,
            served_after,
            end,
        }
    }

    /// The figures, printed and kept, then the verdicts.
    async fn judge(
        &self,
        held: &[String],
        meanwhile: &Meanwhile,
        healed: &Healed,
        started: Instant,
    ) {
        let end = &healed.end;
        let mut requests = self.fake.requests();
        requests.extend(self.backup.requests());
        let ids: Vec<&str> = requests
            .iter()
            .filter_map(|r| r.header("x-request-id"))
            .filter(|id| !id.starts_with("qualify-"))
            .collect();
        let mut seen = HashSet::new();
        let sent_twice: Vec<&str> = ids.iter().copied().filter(|id| !seen.insert(*id)).collect();
        let outcomes = end.outcomes();
        let overwritten: Vec<&String> = meanwhile
            .settled
            .iter()
            .filter(|(job, outcome)| outcomes.get(*job) != Some(outcome))
            .map(|(job, _)| job)
            .collect();
        let race_logged = end
            .races
            .iter()
            .filter(|r| held.iter().any(|id| r.losing_attempt_id.as_str() == id));
        let late_wins = held
            .iter()
            .filter(|id| end.attempt(id).outcome == Some(RaceResult::Won));
        let renewals_refused = self
            .a
            .stderr()
            .matches("lease lost: the attempt is no longer running under this process")
            .count();
        let stale = stale_writes(&self.store).await;
        let verdict = crate::history::check_run(&self.history, &requests, &self.store).await;
        let figures = format!(
            "partition: 3 processes on one PostgreSQL; A cut off by the proxy with {HELD} leases \
             and {HELD} calls in flight, {QUEUED} jobs queued behind it; lease {LEASE_MS} ms\n\
             partition: A cut off {:.1} s; its {HELD} attempts unknown {:.1} s after the cut; \
             B and C took the {QUEUED} queued jobs; support resolved {RESOLVED} unknown attempts \
             on the backup, which finished those jobs\n\
             partition: A's clients meanwhile: {}\n\
             partition: after the heal: A's late answers written in {:.1} s ({} taken as their job's result, nobody \
             else having finished it; {} race-logged behind the backup's result); A's stale lease renewals \
             refused: {renewals_refused}; A acknowledged a new creation {:.1} s after the heal\n\
             partition: {} provider calls, {} attempt ids sent twice, {} results overwritten \
             (of {} finished before the heal), {} stale writes the database's triggers caught \
             (a lease renewed on an attempt no longer running, a finished job's result written \
             over); whole run {:.1} s\n{}",
            healed.cut_for.as_secs_f64(),
            meanwhile.unknown_after.as_secs_f64(),
            meanwhile
                .clients
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
            healed.settled_after.as_secs_f64(),
            late_wins.count(),
            race_logged.clone().count(),
            healed.served_after.as_secs_f64(),
            ids.len(),
            sent_twice.len(),
            overwritten.len(),
            meanwhile.settled.len(),
            stale.len(),
            started.elapsed().as_secs_f64(),
            verdict.line(),
        );
        eprintln!("{figures}");
        record_figures("partition", &figures);
        assert!(
            sent_twice.is_empty(),
            "attempt ids sent twice: {sent_twice:?}"
        );
        assert!(
            overwritten.is_empty(),
            "results written over: {overwritten:?}"
        );
        assert!(stale.is_empty(), "stale writes landed: {stale:?}");
        assert!(
            verdict.violations.is_empty(),
            "the history breaks an invariant: {:#?}",
            verdict.violations
        );
        self.judge_each_job(held, meanwhile, end, race_logged.collect());
    }

    /// Who finished each job, as docs/design.md says it must be.
    fn judge_each_job(
        &self,
        held: &[String],
        meanwhile: &Meanwhile,
        end: &Rows,
        race_logged: Vec<&onejob::app::RaceEntry>,
    ) {
        for id in held {
            assert_eq!(self.fake.requests_for(id), 1, "A's {id} sent once, by A");
        }
        // The resolved jobs keep the backup's answer and winner, sent by B
        // or C; A's late answers to them are in the race log behind it.
        for (job, next) in &meanwhile.resolved {
            let job = end.job(job);
            assert_eq!(
                job.completed_by.as_ref().map(|a| a.as_str()),
                Some(next.as_str())
            );
            let result = job.result.as_ref().map(|r| r.value());
            assert_eq!(result, Some(json!({"summary": "from the backup"})));
            assert_ne!(pid_of(end.attempt(next)), self.a.pid, "B or C sent {next}");
        }
        assert_eq!(race_logged.len(), RESOLVED, "{:#?}", end.races);
        for race in race_logged {
            let winner = race.winning_attempt_id.as_ref().map(|a| a.to_string());
            let resolved = (race.job_id.to_string(), winner.unwrap_or_default());
            assert!(meanwhile.resolved.contains(&resolved), "{race:?}");
        }
        // An unknown attempt whose job nobody else finished is settled by
        // its late answer (docs/design.md, "First result wins").
        for id in &held[RESOLVED..] {
            let attempt = end.attempt(id);
            assert_eq!(attempt.outcome, Some(RaceResult::Won), "{attempt:?}");
            let job = end.job(attempt.job_id.as_str());
            assert_eq!(job.completed_by.as_ref(), Some(&attempt.id));
        }
        // Every other attempt was B's or C's, but the one of the job A
        // acknowledged after the heal.
        for attempt in &end.attempts {
            let job = end.job(attempt.job_id.as_str());
            if !held.iter().any(|id| attempt.id.as_str() == id) && job.idempotency_key != RECOVERED
            {
                assert_ne!(pid_of(attempt), self.a.pid, "A sent {attempt:?}");
            }
        }
    }
}
