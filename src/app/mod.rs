//! The application layer: every use case, written once, called by every front
//! end (the JSON API, the pages, the worker, the callback endpoint and the
//! CLI). Handlers parse, call one use case and render; the use cases check
//! roles, validate, and drive the store, the providers and the task
//! contracts.
//!
//! | use case | module |
//! |---|---|
//! | create a job under an idempotency key | [`intake`] |
//! | let a duplicate in flight wait for its twin's creation | `singleflight` |
//! | share one call among the requests that ask for it at once (a creation's twins, a token's read) | `flights` |
//! | start a new attempt (behind the failover gate) | [`retry`] |
//! | the failover gate: which providers a job may go to | [`gate`] |
//! | cancel a job (no new attempts; a late answer is race-logged) | [`cancel`] |
//! | apply a provider's outcome (CAS, race log, failover) | [`outcomes`] |
//! | abandon an unknown attempt, mark a job failed (audited) | [`resolve`] |
//! | run and record a contract qualification | [`qualification`] |
//! | send an attempt (render, call, judge) | [`dispatch`] |
//! | a provider's signed late answer | [`callbacks`] |
//! | claim, lease and reap attempts (the worker) | [`work`] |
//! | wait for a job to finish (`Prefer: wait`, the chat doors) | [`waiting`] |
//! | a job's stream: release, batch, follow | [`streams`] |
//! | users, tokens, sessions | [`accounts`] |
//! | a creation's token check, kept and confirmed by its transaction | [`credentials`] |
//! | take password checks in turn | [`password_queue`] |
//! | what people read: jobs, the console | [`queries`] |
//! | the console's charts | [`charts`] |
//! | usage, prices, budgets and the usage report | [`ledger`] |
//! | completion webhooks: endpoints, delivery | [`webhooks`] |
//! | what the webhook pages read | [`webhook_views`] |
//! | remove what retention no longer keeps | [`retention`] |
//! | the Prometheus metrics | [`metrics`] |
//! | the one error type, storage errors mapped once | [`error`] |
//!
//! `web` reaches the store only through here: the rows and reports the use
//! cases return are re-exported below.

pub mod accounts;
pub mod callbacks;
pub mod cancel;
pub mod charts;
pub mod credentials;
pub mod dispatch;
pub mod error;
mod flights;
pub mod gate;
pub mod intake;
pub mod ledger;
pub mod metrics;
pub mod outcomes;
pub mod password_queue;
pub mod qualification;
pub mod queries;
pub mod resolve;
pub mod retention;
pub mod retry;
mod singleflight;
pub mod streams;
pub mod waiting;
pub mod webhook_views;
pub mod webhooks;
pub mod work;

use std::sync::Arc;

use tokio::sync::{broadcast, watch, Notify};

use crate::domain::{JobId, Role, Timestamp};

/// How many finished job ids a slow waiter may fall behind by before it
/// re-reads its job anyway.
const FINISHED_BACKLOG: usize = 1024;

pub use crate::contracts::TaskDefinition;
pub use crate::store::console::{
    AttemptBrief, AuditEntry, ConsoleCounts, RaceDetail, UnknownAttempt,
};
pub use crate::store::ledger::LedgerEntry;
pub use crate::store::queue::{Claim, SendPermit};
pub use crate::store::reports::{LedgerSums, UsageFilter, UsageGrouping};
pub use crate::store::rows::{AttemptKey, JobKey};
pub use crate::store::users::User;
pub use crate::store::webhooks::{Delivery, Endpoint, Event, Resent};
pub use crate::store::{Attempt, Job, QualificationRun, RaceEntry, StoreError};
pub use accounts::SignIn;
pub use credentials::Credential;
pub use error::{AppError, AppResult, BudgetRefusal};

use crate::config::Config;
use crate::providers::Providers;
use crate::store::Store;

/// The application: the store, the resolved configuration and the
/// providers, shared by every front end. Cheap to clone.
#[derive(Clone)]
pub struct App {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    config: Config,
    providers: Providers,
    /// Wakes an idle worker when an attempt is queued.
    queued: Notify,
    /// When this process's waiting retries fall due (`not_before`, Unix
    /// ms): the idle worker wakes then rather than at its next poll.
    retries_due: std::sync::Mutex<std::collections::BTreeSet<Timestamp>>,
    /// Becomes true once the start-up qualification of simulated providers
    /// has finished; the failover gate waits for it.
    startup_qualified: watch::Sender<bool>,
    metrics: metrics::Metrics,
    /// Every job that finishes in this process: a waiter answers from the
    /// row that comes with it, or re-reads its job when only its id comes
    /// by (jobs other processes finish are seen by polling).
    job_finished: broadcast::Sender<waiting::Finished>,
    /// Argon2 runs here, a few at a time (see `accounts`).
    password_queue: Arc<password_queue::PasswordQueue>,
    /// This process's worker's offer to start new jobs at once (`work`).
    start_offer: std::sync::RwLock<std::sync::Weak<work::StartOffer>>,
    /// Keys this process is creating jobs for (`twins`).
    creations: singleflight::Singleflight,
    /// The bearer tokens' grants this process has read (`credentials`).
    kept_grants: credentials::KeptGrants,
    /// The reads of tokens' grants waiting to begin, shared.
    grant_reads: credentials::GrantReads,
    tallies: ledger::Tallies,
    /// The streams running in this process, by job.
    streams: streams::StreamHub,
}

impl App {
    /// An application over `store`, with the providers the configuration names.
    pub fn new(store: Store, config: Config) -> Self {
        let providers = Providers::from_settings(&config.providers);
        Self::with_providers(store, config, providers)
    }

    /// An application whose providers are given (tests inject clients).
    pub fn with_providers(store: Store, config: Config, providers: Providers) -> Self {
        let (startup_qualified, _) = watch::channel(true);
        let metrics = metrics::Metrics::new();
        metrics.start_at_zero(config.providers.iter().map(|p| p.name.as_str()));
        let pool_wait = metrics.pool_wait_seconds.clone();
        let store = store.observing_pool_wait(Arc::new(move |waited| {
            pool_wait.observe(waited.as_secs_f64())
        }));
        Self {
            inner: Arc::new(Inner {
                password_queue: password_queue::PasswordQueue::new(
                    config.server.password_hashing_concurrency,
                ),
                store,
                config,
                providers,
                queued: Notify::new(),
                retries_due: Default::default(),
                job_finished: broadcast::channel(FINISHED_BACKLOG).0,
                startup_qualified,
                metrics,
                start_offer: Default::default(),
                creations: Default::default(),
                kept_grants: Default::default(),
                grant_reads: Default::default(),
                tallies: Default::default(),
                streams: Default::default(),
            }),
        }
    }

    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    pub fn providers(&self) -> &Providers {
        &self.inner.providers
    }

    pub fn metrics(&self) -> &metrics::Metrics {
        &self.inner.metrics
    }

    /// Tells an idle worker that an attempt was queued.
    pub fn notify_queued(&self) {
        self.inner.queued.notify_one();
    }

    /// Tells waiting requests that this job finished, with its row when
    /// the statement that finished it returned one.
    pub fn notify_job_finished(&self, job_id: &JobId, row: Option<Job>) {
        // No receiver: nobody is waiting.
        let _ = self.inner.job_finished.send(waiting::Finished {
            id: job_id.clone(),
            row: row.map(Arc::new),
        });
    }

    /// Resolves when an attempt is queued (or was, since the last wait).
    pub async fn attempt_queued(&self) {
        self.inner.queued.notified().await;
    }

    /// Tells an idle worker that a retry was queued that may not be sent
    /// before `not_before`.
    pub fn notify_retry_due(&self, not_before: Timestamp) {
        {
            let mut due = self.retries_due();
            // Beyond the cap the poll still finds the rest.
            if due.len() < MAX_RETRIES_REMEMBERED {
                due.insert(not_before);
            }
        }
        self.notify_queued();
    }

    /// When the worker should claim for the earliest retry of this process
    /// that its last claim, begun at `claimed_at`, may not have
    /// found: `RETRY_CLAIM_SLACK_MS` after the retry falls due, so that a
    /// database clock a little behind this process's still finds it due.
    /// The retries that claim could find are forgotten.
    pub fn next_retry_claim(&self, claimed_at: Timestamp) -> Option<Timestamp> {
        let mut due = self.retries_due();
        *due = due.split_off(&(claimed_at - (RETRY_CLAIM_SLACK_MS - 1)));
        due.first().map(|at| *at + RETRY_CLAIM_SLACK_MS)
    }

    fn retries_due(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeSet<Timestamp>> {
        self.inner
            .retries_due
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// How many waiting retries' due times a process remembers to wake for.
const MAX_RETRIES_REMEMBERED: usize = 4096;

/// How long after a retry falls due the worker claims for it. The claim
/// compares `not_before` with the database's clock, which may read a
/// millisecond or so behind this process's (SQLite's `julianday`, rounded
/// down); a claim made exactly on time could find nothing due and, the
/// retry forgotten, leave it to the next poll.
const RETRY_CLAIM_SLACK_MS: i64 = 5;

/// A job is visible to its owner and to support staff; to anyone else it does
/// not exist (not found, never forbidden, so ids leak nothing).
pub fn visible_to(job: &Job, user: &User) -> bool {
    job.owner_id == user.id || user.role.is_staff()
}

/// Refuses a user who is not support or admin.
pub fn require_staff(user: &User) -> AppResult<()> {
    if user.role.is_staff() {
        Ok(())
    } else {
        Err(AppError::Forbidden(Role::Support))
    }
}

/// Refuses a user who is not an admin.
pub fn require_admin(user: &User) -> AppResult<()> {
    if user.role.is_admin() {
        Ok(())
    } else {
        Err(AppError::Forbidden(Role::Admin))
    }
}
