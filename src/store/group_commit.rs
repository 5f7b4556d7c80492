//! Group commit for creations.
//!
//! Each SQLite commit in `synchronous = FULL` waits for its own flush, and
//! this process's writers queue for the write lock one at a time (see
//! [`super::connection::WriterTurn`]). So creations queue here instead: the first
//! to arrive leads, and its one transaction takes every creation waiting
//! behind it, each in its own savepoint, until the batch holds
//! [`BatchLimits::max_rows`] or has been open [`BatchLimits::max_wait`].
//! One commit, one flush, for all of them; each request is answered only
//! after that commit.
//!
//! Nothing about idempotency changes: every creation is the same
//! [`jobs::create_job_with_attempts`] it would be alone, so the unique key
//! still decides. One creation's failure (a budget refusal, a constraint)
//! rolls back only its savepoint. If the commit itself fails, nothing of
//! the batch was stored, and each creation is tried again in a
//! transaction of its own.
//!
//! On PostgreSQL, which flushes concurrent commits together by itself, a
//! batch is one multi-row statement per owner instead: one round trip and
//! one commit for many creations, each then given its own verdict
//! ([`jobs::create_many_of_one_owner`]).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::connection::write_transaction;
use super::jobs::{self, CreateOutcome, NewJob};
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

struct Waiting {
    job: NewJob,
    after_commit: Option<AfterCommit>,
    reply: oneshot::Sender<StoreResult<Created>>,
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

/// The creations queue of one store.
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

    /// Creations queued since the start, taken into a transaction or not.
    pub fn queued(&self) -> u64 {
        self.counts
            .queued
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Queues `job`, leading the batches if no one is, and waits for the
    /// commit that holds it.
    pub async fn create(
        &self,
        store: &Store,
        job: NewJob,
        after_commit: Option<AfterCommit>,
    ) -> StoreResult<Created> {
        let (reply, answer) = oneshot::channel();
        let lead = {
            let mut queue = self.lock();
            queue.waiting.push_back(Waiting {
                job,
                after_commit,
                reply,
            });
            !std::mem::replace(&mut queue.leading, true)
        };
        self.counts
            .queued
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if lead {
            let (group, store) = (self.clone(), store.clone());
            tokio::task::spawn_blocking(move || group.lead(&store));
        }
        answer.await.map_err(|_| StoreError::Cancelled)?
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

    /// The leader's loop, on a blocking thread: batch after batch until no
    /// creation waits.
    fn lead(&self, store: &Store) {
        // A panic below must not leave the queue thinking it has a leader:
        // the waiting are answered (cancelled) and the next comer leads.
        struct Abdicate<'a>(&'a GroupCommit);
        impl Drop for Abdicate<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    let mut queue = self.0.lock();
                    queue.leading = false;
                    queue.waiting.clear();
                }
            }
        }
        let _abdicate = Abdicate(self);
        let mut conn = match store.conn() {
            Ok(conn) => conn,
            Err(_) => {
                for waiting in self.take(usize::MAX, true) {
                    let _ = waiting.reply.send(Err(StoreError::Busy(
                        "no database connection became free in time".into(),
                    )));
                }
                return;
            }
        };
        let run = |conn: &mut DbConnection| loop {
            let batch = self.take(self.limits.max_rows, true);
            if batch.is_empty() {
                return;
            }
            match conn {
                DbConnection::Sqlite(_) => self.commit(conn, batch),
                DbConnection::Postgresql(_) => self.insert_by_owner(conn, batch),
            }
        };
        match store.writer_turn() {
            Some(turn) => turn.within(|| run(&mut conn)),
            None => run(&mut conn),
        }
    }

    /// One transaction for `batch` and whoever queues while it is open.
    fn commit(&self, conn: &mut DbConnection, batch: Vec<Waiting>) {
        let mut done: Vec<(Waiting, StoreResult<Created>)> = Vec::with_capacity(batch.len());
        let mut pending = batch;
        let committed = write_transaction(conn, |conn| {
            // From the lock's taking: how long newcomers may still join.
            let opened = Instant::now();
            let mut next = std::mem::take(&mut pending);
            loop {
                for waiting in next {
                    // A savepoint each (the transaction is open): a refusal
                    // or an error undoes this creation alone.
                    let outcome = jobs::create_job_with_attempts(conn, &waiting.job);
                    done.push((waiting, outcome));
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
            Ok(()) => {
                self.count(done.len());
                for (waiting, outcome) in done {
                    answer(waiting, outcome);
                }
            }
            Err(error) => {
                // Nothing of the batch was stored: each on its own.
                let rows = done.len() + pending.len();
                tracing::warn!(%error, rows, "a batch of creations did not commit; trying each alone");
                let unanswered = done.into_iter().map(|(waiting, _)| waiting);
                for waiting in unanswered.chain(pending) {
                    let outcome = jobs::create_job_with_attempts(conn, &waiting.job);
                    self.count(1);
                    answer(waiting, outcome);
                }
            }
        }
    }

    /// PostgreSQL: one multi-row statement per owner in the batch (each
    /// names its owner, so a distributed database routes it to one shard);
    /// each statement commits by itself.
    fn insert_by_owner(&self, conn: &mut DbConnection, batch: Vec<Waiting>) {
        let mut owners: Vec<(UserId, Vec<Waiting>)> = Vec::new();
        for waiting in batch {
            let owner = waiting.job.owner_id.clone();
            match owners.iter_mut().find(|(o, _)| *o == owner) {
                Some((_, group)) => group.push(waiting),
                None => owners.push((owner, vec![waiting])),
            }
        }
        for (owner, group) in owners {
            let news: Vec<&NewJob> = group.iter().map(|waiting| &waiting.job).collect();
            let outcomes = jobs::create_many_of_one_owner(conn, &owner, &news);
            self.count(group.len());
            for (waiting, outcome) in group.into_iter().zip(outcomes) {
                answer(waiting, outcome);
            }
        }
    }

    fn count(&self, rows: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.counts.commits.fetch_add(1, Relaxed);
        self.counts.rows.fetch_add(rows as u64, Relaxed);
    }
}

/// Hands a committed creation on, then answers its request (which may
/// have gone away: the answer is then dropped).
fn answer(waiting: Waiting, outcome: StoreResult<Created>) {
    if let (Ok(created), Some(after_commit)) = (&outcome, waiting.after_commit) {
        after_commit(created);
    }
    let _ = waiting.reply.send(outcome);
}
