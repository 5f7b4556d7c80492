//! A cut that catches a process inside a transaction: A's renewal of one
//! lease ran, its `COMMIT` is held. The row stays locked by a session the
//! server still sees as alive, until PostgreSQL ends it (idle in
//! transaction) and rolls the renewal back. The reapers must pass that one
//! attempt over and reap the others meanwhile (`store::queue::expire_leases`
//! goes on past a row it cannot lock); that one becomes `unknown` once the
//! server ended A's session, and A's renewal never lands.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use onejob::domain::{AttemptId, AttemptState, Role};
use onejob::store::{jobs as job_store, queue, Attempt, DatabaseSettings, Store};

use super::rows::{expired_leases, Rows};
use super::{IDLE_IN_TRANSACTION_MS, LEASE_MS, STEP};
use crate::support::db::new_job;
use crate::support::db_proxy::DbProxy;
use crate::support::harness::{record_figures, TestBackend, TestDb};

/// The reapers' lock wait, well under the idle-in-transaction timeout: a
/// reaper meets A's lock for this long, then moves on.
const REAPER_LOCK_WAIT_MS: u64 = 300;

pub async fn a_renewal_caught_open_by_the_cut_delays_only_its_own_attempts_reaping() {
    let db = TestDb::create(TestBackend::Postgres);
    let url = db.url.as_str().to_owned();
    let reaper = reaper_store(&db).await;
    let claimed = three_claims_of_a(&reaper).await;
    let locked = claimed[0].clone();

    // A renews the first lease through the proxy; the cut comes before its
    // COMMIT, which A then sends (and the proxy holds).
    let proxy = DbProxy::start(&url).await;
    let (renewed_tx, renewed) = mpsc::channel();
    let (commit, commit_rx) = mpsc::channel();
    let a = {
        let (url, attempt) = (proxy.url_for(&url), locked.clone());
        tokio::task::spawn_blocking(move || cut_off_renewal(url, attempt, renewed_tx, commit_rx))
    };
    tokio::task::spawn_blocking(move || renewed.recv_timeout(STEP))
        .await
        .unwrap()
        .expect("A renewed its lease");
    proxy.partition();
    let cut = Instant::now();
    commit.send(()).unwrap();

    // The leases run out. The reaper meets the locked attempt first (the
    // premise: a reaper that stopped there would reap nothing).
    let candidates = loop {
        let candidates = reaper.run(expired_leases).await.unwrap();
        if candidates.len() == claimed.len() {
            break candidates;
        }
        assert!(cut.elapsed() < STEP, "the leases never ran out");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        candidates[0], locked.id,
        "premise: the locked one comes first"
    );

    // B's reaper, every 100 ms: the other two are reaped while A's session
    // still holds the first one's row; that one once the server ended it.
    let mut failed_turns = 0;
    let (others_reaped, locked_then) = loop {
        failed_turns += usize::from(reaper.run(queue::expire_leases).await.is_err());
        let rows = Rows::read(&reaper).await;
        let others = claimed[1..].iter().map(|a| rows.state(a.id.as_str()));
        if others.into_iter().all(|s| s == AttemptState::Unknown) {
            break (cut.elapsed(), rows.state(locked.id.as_str()));
        }
        assert!(cut.elapsed() < STEP, "the others were never reaped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let locked_reaped = loop {
        failed_turns += usize::from(reaper.run(queue::expire_leases).await.is_err());
        let rows = Rows::read(&reaper).await;
        if rows.state(locked.id.as_str()) == AttemptState::Unknown {
            break cut.elapsed();
        }
        assert!(cut.elapsed() < STEP, "the locked attempt was never reaped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let a_heard_before_the_heal = a.is_finished();
    proxy.heal();
    let committed = tokio::time::timeout(STEP, a)
        .await
        .expect("A's COMMIT was answered after the heal")
        .unwrap();
    let end = Rows::read(&reaper).await;

    let figures = format!(
        "partition (a renewal caught open by the cut): the other leases reaped {:.1} s after \
         the cut, the locked one still {locked_then}; the locked one unknown {:.1} s after the \
         cut (idle-in-transaction timeout {IDLE_IN_TRANSACTION_MS} ms); reaper turns that \
         failed: {failed_turns}; A's held COMMIT, answered after the heal: {}",
        others_reaped.as_secs_f64(),
        locked_reaped.as_secs_f64(),
        match &committed {
            Ok(()) => "committed".to_owned(),
            Err(error) => format!("refused ({})", error.lines().next().unwrap_or_default()),
        },
    );
    eprintln!("{figures}");
    record_figures("partition-locked-row", &figures);
    assert_eq!(
        locked_then,
        AttemptState::Running,
        "the others were reaped while A's session held the first"
    );
    assert!(
        locked_reaped >= Duration::from_millis(IDLE_IN_TRANSACTION_MS - 500),
        "the locked attempt waited for the server to end A's session"
    );
    assert!(!a_heard_before_the_heal, "A heard nothing while cut off");
    assert!(committed.is_err(), "A's renewal never landed");
    for attempt in &claimed {
        let row = end.attempt(attempt.id.as_str());
        assert_eq!(row.state, AttemptState::Unknown, "{row:?}");
        assert_eq!(row.lease_expires_at, None, "{row:?}");
    }
}

/// B's store, straight on the database, with a short lock wait.
async fn reaper_store(db: &TestDb) -> Store {
    let settings = DatabaseSettings {
        postgres_lock_timeout_ms: REAPER_LOCK_WAIT_MS,
        ..Default::default()
    };
    let url = db.url.clone();
    tokio::task::spawn_blocking(move || Store::connect(&url, &settings).unwrap())
        .await
        .unwrap()
}

/// Three jobs, their attempts claimed by A (`pid0-a`) and confirmed sent,
/// in the order they were created.
async fn three_claims_of_a(store: &Store) -> Vec<Attempt> {
    let claimed = store
        .run(|conn| {
            let (owner, _) = onejob::store::users::add_user(conn, "client", Role::User).unwrap();
            for key in ["first", "second", "third"] {
                job_store::create_job(conn, &new_job(&owner.id, key))?;
            }
            let mut admit = |_: &AttemptId, _: &str| true;
            let rules = queue::ClaimRules {
                lease_owner: "pid0-a",
                lease_ms: LEASE_MS as i64,
                limit: 3,
                soft_timeout_ms: &|_| 30_000,
                closed: &[],
                admit: &mut admit,
                confirm: true,
            };
            Ok(queue::claim_batch(conn, rules)?.claims)
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 3);
    claimed.into_iter().map(|claim| claim.attempt).collect()
}

/// A's side, on a thread of its own: a session through the proxy renews
/// the lease of `attempt` as `store::queue::renew_lease` does, says so on
/// `renewed`, waits for `commit` (the cut comes in between), and reports
/// how its `COMMIT` went.
fn cut_off_renewal(
    url: String,
    attempt: Attempt,
    renewed: mpsc::Sender<()>,
    commit: mpsc::Receiver<()>,
) -> Result<(), String> {
    use diesel::connection::SimpleConnection;
    use diesel::sql_types::Text;
    let mut conn = diesel::PgConnection::establish(&url).map_err(|e| e.to_string())?;
    conn.batch_execute(&format!(
        "SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_MS}; BEGIN"
    ))
    .map_err(|e| e.to_string())?;
    let changed = diesel::sql_query(format!(
        "UPDATE attempts SET lease_expires_at = {} + {LEASE_MS} \
         WHERE id = $1 AND owner_id = $2 AND state = 'running' AND lease_owner = $3",
        onejob::store::connection::PG_NOW_MS
    ))
    .bind::<Text, _>(attempt.id.as_str())
    .bind::<Text, _>(attempt.owner_id.as_str())
    .bind::<Text, _>(attempt.lease_owner.clone().unwrap_or_default())
    .execute(&mut conn)
    .map_err(|e| e.to_string())?;
    assert_eq!(changed, 1, "A renewed its lease");
    renewed.send(()).unwrap();
    commit.recv().unwrap();
    conn.batch_execute("COMMIT").map_err(|e| e.to_string())
}
