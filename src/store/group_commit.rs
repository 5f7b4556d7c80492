//! Group commit: many writes, one commit.
//!
//! Each SQLite commit in `synchronous = FULL` waits for its own flush, and
//! this process's writers queue for the write lock one at a time (see
//! [`super::connection::WriterTurn`]). So creations and compare-and-swaps
//! queue here instead: the first to arrive leads, and its one transaction
//! takes every write waiting behind it, until the batch holds
//! [`BatchLimits::max_rows`] or has been open [`BatchLimits::max_wait`].
//! Each compare-and-swap runs in that transaction, and so do each owner's
//! creations, as multi-row inserts ([`jobs::create_many_of_one_owner`]). One
//! commit, one flush, for all of them; each request is answered only after
//! that commit. Within a batch the compare-and-swaps run first, then the
//! creations: none of them is answered before the commit, so any order
//! inside it is one in which those concurrent requests could have arrived.
//!
//! Nothing about idempotency or the compare-and-swap changes: the unique
//! key and the versioned update still decide, and a creation the
//! multi-row insert left out is made or found alone. The writes run with no
//! savepoint each (one costs two statements, and a copy of every page it
//! changes): if one fails (a budget refusal, a constraint), the whole
//! transaction is rolled back and the batch runs again, each write in a
//! savepoint of its own, so that the failure undoes only its own write. A
//! batch with a failure costs twice its work; one without, no savepoint at
//! all. If the commit itself fails,
//! nothing of the batch was stored, and each write runs again in a
//! transaction of its own. So it goes when SQLite ends the batch's
//! transaction by itself (a statement that found the disk full rolls it
//! all back): nothing more runs in it (`write_transaction` refuses), and
//! its commit fails.
//!
//! On PostgreSQL, which flushes concurrent commits together by itself,
//! only creations queue, and a batch is one multi-row statement per owner:
//! one round trip and one commit for many creations, each then given its
//! own verdict ([`jobs::create_many_of_one_owner`]).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::r2d2::PooledConnection;

use super::connection::{without_savepoints, write_transaction};
use super::connection::{DbConnectionManager, Placement};
use super::jobs::{self, CreateOutcome, NewJob};
use super::mailbox::{Replies, Reply};
use super::{Attempt, DbConnection, Store, StoreError, StoreResult};
use crate::domain::UserId;

/// A creation's outcome and its job's attempts.
pub type Created = (CreateOutcome, Vec<Attempt>);

/// Run on the committing thread once the creation is durable, before its
/// request is answered, even when that request has gone away meanwhile
/// (a started attempt is handed to the worker here, never stranded).
pub type AfterCommit = Box<dyn FnOnce(&Created) + Send>;

/// How much one batch may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// The most creations one commit carries (1: no batching).
    pub max_rows: usize,
    /// How long a batch keeps taking newcomers once its transaction opened.
    pub max_wait: Duration,
}

/// A write of another kind, run in the batch as the creations are.
trait Write: Send {
    fn run(&mut self, conn: &mut DbConnection);
    fn answer(self: Box<Self>, replies: &mut Replies);
    fn refuse(self: Box<Self>, detail: &str);
}

/// A write transaction's body, which may run again: in a savepoint, if a
/// write of its batch failed, and alone, if the batch did not commit.
type Work<T> = Box<dyn Fn(&mut DbConnection) -> StoreResult<T> + Send>;

/// Run on the committing thread with a write's outcome once it is durable,
/// before its waiter hears of it.
/// It may take what it hands on out of the outcome.
pub type ThenCommitted<T> = Box<dyn FnOnce(&mut T) + Send>;

/// Any write: its work, its outcome once run, and who waits for it.
struct Queued<T> {
    work: Work<T>,
    then: Option<ThenCommitted<T>>,
    outcome: Option<StoreResult<T>>,
    reply: Reply<StoreResult<T>>,
}

impl<T: Send + 'static> Write for Queued<T> {
    fn run(&mut self, conn: &mut DbConnection) {
        // In the batch's transaction (bare, or in a savepoint of its own),
        // or in its own transaction alone.
        self.outcome = Some(write_transaction(conn, |conn| (self.work)(conn)));
    }

    fn answer(self: Box<Self>, replies: &mut Replies) {
        let mut outcome = self.outcome.unwrap_or(Err(StoreError::Cancelled));
        if let (Ok(value), Some(then)) = (&mut outcome, self.then) {
            then(value);
        }
        replies.send(self.reply, outcome);
    }

    fn refuse(self: Box<Self>, detail: &str) {
        self.reply
            .send_now(Err(StoreError::Busy(detail.to_owned())));
    }
}

/// A creation, kept apart from other writes: PostgreSQL inserts a batch's
/// creations in one statement.
struct Creation {
    job: NewJob,
    /// The credential counter its transaction must read unchanged, if its
    /// caller's token check was kept (`app::credentials`).
    kept_counter: Option<i64>,
    placement: Placement,
    after_commit: Option<AfterCommit>,
    outcome: Option<StoreResult<Created>>,
    reply: Reply<StoreResult<Created>>,
}

enum Waiting {
    Creation(Box<Creation>),
    Write(Box<dyn Write>),
}

impl Waiting {
    /// Runs it: in the batch's transaction, or alone.
    fn run(&mut self, conn: &mut DbConnection) {
        match self {
            Self::Creation(creation) => {
                creation.outcome = Some(jobs::create_job_checked(
                    conn,
                    &creation.job,
                    creation.kept_counter,
                    creation.placement,
                ));
            }
            Self::Write(write) => write.run(conn),
        }
    }

    /// Once its outcome is durable: hands a creation on, then answers the
    /// request (which may have gone away: the answer is then dropped),
    /// through `replies`.
    fn answer(self, replies: &mut Replies) {
        match self {
            Self::Creation(creation) => {
                let outcome = creation.outcome.unwrap_or(Err(StoreError::Cancelled));
                if let (Ok(created), Some(after_commit)) = (&outcome, creation.after_commit) {
                    after_commit(created);
                }
                replies.send(creation.reply, outcome);
            }
            Self::Write(write) => write.answer(replies),
        }
    }

    /// Answers with a failure before anything ran.
    fn refuse(self, detail: &str) {
        match self {
            Self::Creation(creation) => {
                creation
                    .reply
                    .send_now(Err(StoreError::Busy(detail.to_owned())));
            }
            Self::Write(write) => write.refuse(detail),
        }
    }
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Waiting>,
    /// A blocking task is committing batches; newcomers only queue.
    leading: bool,
}

/// What the batches have carried, for the metrics.
#[derive(Debug, Default)]
pub struct BatchCounts {
    pub queued: std::sync::atomic::AtomicU64,
    pub commits: std::sync::atomic::AtomicU64,
    pub rows: std::sync::atomic::AtomicU64,
}

/// The batched writes' queue of one store.
#[derive(Clone)]
pub struct GroupCommit {
    queue: Arc<Mutex<Queue>>,
    limits: BatchLimits,
    counts: Arc<BatchCounts>,
}

impl GroupCommit {
    pub fn new(limits: BatchLimits) -> Self {
        Self {
            queue: Arc::default(),
            limits,
            counts: Arc::default(),
        }
    }

    pub fn counts(&self) -> &BatchCounts {
        &self.counts
    }

    /// Writes queued since the start, taken into a transaction or not.
    pub fn queued(&self) -> u64 {
        self.counts
            .queued
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Queues the creation of `job`, leading the batches if no one is, and
    /// waits for the commit that holds it. With `kept_counter`, the batch
    /// first reads the credential counter ([`jobs::create_job_checked`]).
    pub async fn create(
        &self,
        store: &Store,
        job: NewJob,
        kept_counter: Option<i64>,
        after_commit: Option<AfterCommit>,
    ) -> StoreResult<Created> {
        let (reply, answer) = Reply::channel();
        self.queue(
            store,
            Waiting::Creation(Box::new(Creation {
                job,
                kept_counter,
                placement: store.placement(),
                after_commit,
                outcome: None,
                reply,
            })),
        );
        answer.await.map_err(|_| StoreError::Cancelled)?
    }

    /// Queues `work` (SQLite only), which runs in a batch's transaction,
    /// and waits for the commit that holds it. `work` may run more than
    /// once: again in a savepoint, if a write of its batch failed, and
    /// alone, if the batch's commit failed.
    /// `then` runs with its outcome on the committing thread, once durable.
    pub async fn write<T: Send + 'static>(
        &self,
        store: &Store,
        work: impl Fn(&mut DbConnection) -> StoreResult<T> + Send + 'static,
        then: Option<ThenCommitted<T>>,
    ) -> StoreResult<T> {
        let (reply, answer) = Reply::channel();
        self.queue(
            store,
            Waiting::Write(Box::new(Queued {
                work: Box::new(work),
                then,
                outcome: None,
                reply,
            })),
        );
        answer.await.map_err(|_| StoreError::Cancelled)?
    }

    fn queue(&self, store: &Store, waiting: Waiting) {
        let lead = {
            let mut queue = self.lock();
            queue.waiting.push_back(waiting);
            !std::mem::replace(&mut queue.leading, true)
        };
        self.counts
            .queued
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if lead {
            let (group, store) = (self.clone(), store.clone());
            tokio::task::spawn_blocking(move || group.lead_through_panics(&store));
        }
    }

    /// Leads until no write waits, and again after a batch that panicked:
    /// that batch's writes were answered (cancelled) as it unwound, and
    /// whatever queued meanwhile, while the lead was still taken, is led
    /// next. (Cancelled with it, as it once was, a creation that queued
    /// behind a panic failed for nothing of its own.)
    fn lead_through_panics(&self, store: &Store) {
        loop {
            let lead = std::panic::AssertUnwindSafe(|| self.lead(store));
            if std::panic::catch_unwind(lead).is_ok() {
                return;
            }
            let mut queue = self.lock();
            if queue.waiting.is_empty() {
                queue.leading = false;
                return;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        // Every change to the queue is a push or a drain: a panic leaves it whole.
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Up to `rows` of the waiting creations; none (and no longer leading)
    /// when `give_up_lead` and the queue is empty.
    fn take(&self, rows: usize, give_up_lead: bool) -> Vec<Waiting> {
        let mut queue = self.lock();
        let n = rows.min(queue.waiting.len());
        if n == 0 && give_up_lead {
            queue.leading = false;
        }
        queue.waiting.drain(..n).collect()
    }

    /// Every waiting write, and no longer leading.
    fn take_all_and_abdicate(&self) -> Vec<Waiting> {
        let mut queue = self.lock();
        queue.leading = false;
        queue.waiting.drain(..).collect()
    }

    /// The leader's loop, on a blocking thread: batch after batch until no
    /// creation waits.
    fn lead(&self, store: &Store) {
        let Ok(mut conn) = store.conn() else {
            // What waited through the failed checkout is refused, and the
            // lead given up in the same turn of the lock: a write queued
            // after that leads anew and tries for a connection itself (a
            // leader that returned still leading would leave every later
            // write waiting for it; one that refused later comers too would
            // refuse them without a try, after a connection came free).
            for waiting in self.take_all_and_abdicate() {
                waiting.refuse("no database connection became free in time");
            }
            return;
        };
        let run = |conn: &mut PooledConnection<DbConnectionManager>| loop {
            let batch = self.take(self.limits.max_rows, true);
            if batch.is_empty() {
                return;
            }
            let lost = match &mut **conn {
                DbConnection::Sqlite(_) => {
                    self.commit(conn, batch);
                    false
                }
                DbConnection::Postgresql(_) => self.insert_by_owner(store, conn, batch),
            };
            // The broken connection goes back (and out of the pool); the
            // next batch takes a fresh one.
            if let (true, Ok(fresh)) = (lost, store.conn()) {
                *conn = fresh;
            }
        };
        match store.writer_turn() {
            Some(turn) => turn.within(|| run(&mut conn)),
            None => run(&mut conn),
        }
    }

    /// One transaction for `batch` and whoever queues while it is open. Its
    /// writes run in the transaction itself, with no savepoint each
    /// ([`without_savepoints`]); if one fails, nothing of the batch is kept
    /// and the batch runs again, each write in a savepoint of its own
    /// ([`GroupCommit::commit_in_savepoints`]).
    fn commit(&self, conn: &mut DbConnection, batch: Vec<Waiting>) {
        let mut done: Vec<Waiting> = Vec::with_capacity(batch.len());
        let mut pending = batch;
        let mut spoiled = false;
        let committed = write_transaction(conn, |conn| {
            // From the lock's taking: how long newcomers may still join.
            let opened = Instant::now();
            let mut next = std::mem::take(&mut pending);
            loop {
                let (ran, failed) = without_savepoints(|| run_grouped(conn, next));
                done.extend(ran.into_iter().flatten());
                if failed {
                    spoiled = true;
                    return Err(StoreError::Cancelled);
                }
                let room = self.limits.max_rows.saturating_sub(done.len());
                if room == 0 || opened.elapsed() >= self.limits.max_wait {
                    return Ok::<_, StoreError>(());
                }
                next = self.take(room, false);
                if next.is_empty() {
                    return Ok(());
                }
            }
        });
        match committed {
            // Rolled back as asked: nothing of it was stored.
            Err(StoreError::Cancelled) if spoiled => {
                self.commit_in_savepoints(conn, done);
            }
            committed => self.settle(conn, committed, done, pending),
        }
    }

    /// A batch one of whose writes failed, again: one transaction, each
    /// write in a savepoint, so that a refusal or an error undoes only its
    /// own write (or one owner's multi-row insert).
    fn commit_in_savepoints(&self, conn: &mut DbConnection, batch: Vec<Waiting>) {
        let mut done: Vec<Waiting> = Vec::with_capacity(batch.len());
        let mut pending = batch;
        let committed = write_transaction(conn, |conn| {
            let next = std::mem::take(&mut pending);
            done.extend(run_grouped(conn, next).into_iter().flatten());
            Ok::<_, StoreError>(())
        });
        self.settle(conn, committed, done, pending);
    }

    /// Answers a batch's writes once its commit is known: each with its
    /// outcome if it committed; else each run again alone.
    fn settle(
        &self,
        conn: &mut DbConnection,
        committed: StoreResult<()>,
        done: Vec<Waiting>,
        pending: Vec<Waiting>,
    ) {
        match committed {
            Ok(()) => {
                self.count(done.len());
                // Posted together, one wake-up a waiting thread.
                let mut replies = Replies::default();
                for waiting in done {
                    waiting.answer(&mut replies);
                }
            }
            Err(error) => {
                // Nothing of the batch was stored: each on its own.
                let rows = done.len() + pending.len();
                tracing::warn!(%error, rows, "a batch of writes did not commit; running each alone");
                for mut waiting in done.into_iter().chain(pending) {
                    waiting.run(conn);
                    self.count(1);
                    waiting.answer(&mut Replies::default());
                }
            }
        }
    }

    /// PostgreSQL: one multi-row statement per owner in the batch (each
    /// names its owner, so a distributed database routes it to one shard);
    /// each statement commits by itself. Only creations queue here.
    /// A creation whose connection broke is confirmed on a fresh one
    /// ([`Store::confirm_if_lost`]) before it is answered. Returns whether
    /// the connection broke.
    fn insert_by_owner(&self, store: &Store, conn: &mut DbConnection, batch: Vec<Waiting>) -> bool {
        let mut lost = false;
        for group in run_grouped(conn, batch) {
            self.count(group.len());
            let mut replies = Replies::default();
            for mut waiting in group {
                if let Waiting::Creation(creation) = &mut waiting {
                    let outcome = creation
                        .outcome
                        .take()
                        .unwrap_or(Err(StoreError::Cancelled));
                    lost |= matches!(outcome, Err(StoreError::ConnectionLost(_)));
                    creation.outcome = Some(store.confirm_if_lost(conn, &creation.job, outcome));
                }
                waiting.answer(&mut replies);
            }
        }
        lost
    }

    fn count(&self, rows: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.counts.commits.fetch_add(1, Relaxed);
        self.counts.rows.fetch_add(rows as u64, Relaxed);
    }
}

/// Runs `batch`: each other write alone, then each owner's creations
/// together ([`jobs::create_many_of_one_owner`]: multi-row statements,
/// then a verdict each). Returns them run, one group per statement.
fn run_grouped(conn: &mut DbConnection, batch: Vec<Waiting>) -> Vec<Vec<Waiting>> {
    let mut groups: Vec<Vec<Waiting>> = Vec::new();
    let mut owners: Vec<(UserId, Vec<Box<Creation>>)> = Vec::new();
    let mut counter = CounterOnce::default();
    for waiting in batch {
        match waiting {
            Waiting::Creation(mut creation) => {
                if let Some(refused) = counter.refusal(conn, creation.kept_counter) {
                    creation.outcome = Some(Err(refused));
                    groups.push(vec![Waiting::Creation(creation)]);
                    continue;
                }
                let owner = &creation.job.owner_id;
                match owners.iter_mut().find(|(o, _)| o == owner) {
                    Some((_, group)) => group.push(creation),
                    None => owners.push((owner.clone(), vec![creation])),
                }
            }
            mut write => {
                write.run(conn);
                groups.push(vec![write]);
            }
        }
    }
    for (owner, mut group) in owners {
        let news: Vec<&NewJob> = group.iter().map(|creation| &creation.job).collect();
        let placement = group[0].placement;
        let outcomes = jobs::create_many_of_one_owner(conn, &owner, &news, placement);
        for (creation, outcome) in group.iter_mut().zip(outcomes) {
            creation.outcome = Some(outcome);
        }
        groups.push(group.into_iter().map(Waiting::Creation).collect());
    }
    groups
}

/// The credential counter, read at most once per batch (under SQLite's
/// write lock, which every change to tokens and users takes too).
#[derive(Default)]
struct CounterOnce(Option<Result<Option<i64>, String>>);

impl CounterOnce {
    /// Why a creation whose token check was kept at `kept` may not be
    /// stored: the counter moved since, or could not be read.
    fn refusal(&mut self, conn: &mut DbConnection, kept: Option<i64>) -> Option<StoreError> {
        let kept = kept?;
        let now = self.0.get_or_insert_with(|| {
            super::users::credential_counter(conn).map_err(|error| error.to_string())
        });
        match now {
            Ok(now) if crate::domain::guards::kept_check_holds(kept, *now) => None,
            Ok(_) => Some(StoreError::CredentialsChanged),
            Err(reason) => Some(StoreError::Busy(reason.clone())),
        }
    }
}
