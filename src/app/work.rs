//! What a worker asks of the application: a queued attempt to send, with a
//! lease; renewing that lease; reaping the leases of processes that stopped
//! (their running attempts become `unknown`, never re-sent); and its offer
//! to start new jobs' first attempts in their creating transactions.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;

use super::{App, AppResult, Claim};
use crate::domain::{AttemptId, AttemptState};
use crate::store::queue::{self, SendPermit, StartNow};

impl App {
    /// Claims up to `limit` of the oldest queued attempts for `lease_owner`,
    /// in one transaction. An attempt whose provider asked for no pause is
    /// confirmed for sending by the claim itself (its `sent_at` is set): the
    /// caller sends it at once.
    pub async fn claim_batch(&self, lease_owner: &str, limit: usize) -> AppResult<Vec<Claim>> {
        let owner = lease_owner.to_owned();
        let lease_ms = self.config().worker.lease_ms as i64;
        let providers = self.providers().clone();
        Ok(self
            .store()
            .run(move |conn| {
                let soft_timeout_ms = |name: &str| {
                    providers
                        .get(name)
                        .map_or(0, |p| p.soft_timeout().as_millis() as i64)
                };
                let send_now = |name: &str| {
                    providers
                        .get(name)
                        .is_some_and(|p| p.not_before().is_none())
                };
                queue::claim_batch(
                    conn,
                    &owner,
                    lease_ms,
                    limit as i64,
                    &soft_timeout_ms,
                    &send_now,
                )
            })
            .await?)
    }

    /// Extends this worker's lease on a running attempt; false when the
    /// attempt is no longer running under it.
    pub async fn renew_lease(&self, attempt_id: &AttemptId, lease_owner: &str) -> AppResult<bool> {
        let (id, owner) = (attempt_id.clone(), lease_owner.to_owned());
        let lease_ms = self.config().worker.lease_ms as i64;
        Ok(self
            .store()
            .run(move |conn| queue::renew_lease(conn, &id, &owner, lease_ms))
            .await?)
    }

    /// Reaps running attempts whose lease ran out: `unknown` if they were
    /// sent, back to the queue if not. Returns what each became.
    pub async fn expire_leases(&self) -> AppResult<Vec<(AttemptId, AttemptState)>> {
        Ok(self.store().run(queue::expire_leases).await?)
    }

    /// Confirms this worker's claim immediately before sending (see
    /// `store::queue::confirm_send`).
    pub async fn confirm_send(
        &self,
        attempt_id: &AttemptId,
        lease_owner: &str,
    ) -> AppResult<SendPermit> {
        let (id, owner) = (attempt_id.clone(), lease_owner.to_owned());
        let lease_ms = self.config().worker.lease_ms as i64;
        Ok(self
            .store()
            .run(move |conn| queue::confirm_send(conn, &id, &owner, lease_ms))
            .await?)
    }

    /// Gives an unsent claim back to the queue (or closes it, if its job
    /// finished): at shutdown, or when the claim became void.
    pub async fn give_back_unsent(
        &self,
        attempt_id: &AttemptId,
        lease_owner: &str,
    ) -> AppResult<SendPermit> {
        let (id, owner) = (attempt_id.clone(), lease_owner.to_owned());
        Ok(self
            .store()
            .run(move |conn| queue::give_back_unsent(conn, &id, &owner))
            .await?)
    }
}

/// A worker's standing offer to start a new job's first attempt in the
/// transaction that creates it, so that an idle worker costs the job no
/// claiming transaction of its own. The offer holds while the worker has a
/// free slot, nothing was left queued at its last claim (a new job never
/// jumps ahead of queued ones) and it is not stopping; the attempt's
/// provider must have asked for no pause.
pub struct StartOffer {
    lease_owner: String,
    slots: Arc<Semaphore>,
    /// The worker's last claim took as many attempts as it asked for, so
    /// more may be queued.
    backlog: AtomicBool,
    withdrawn: AtomicBool,
    /// The worker's tasks: a reservation holds a token of it, so that the
    /// worker's shutdown waits for a creation under way to hand its attempt
    /// over (and that attempt to be sent and answered).
    tracker: TaskTracker,
    /// Runs a started attempt, holding its slot (the worker's task).
    run: Box<dyn Fn(Claim, OwnedSemaphorePermit) + Send + Sync>,
}

impl StartOffer {
    pub fn new(
        lease_owner: String,
        slots: Arc<Semaphore>,
        tracker: TaskTracker,
        run: Box<dyn Fn(Claim, OwnedSemaphorePermit) + Send + Sync>,
    ) -> Self {
        Self {
            lease_owner,
            slots,
            tracker,
            // Until the first claim says otherwise, attempts may be queued
            // from before this process started.
            backlog: AtomicBool::new(true),
            withdrawn: AtomicBool::new(false),
            run,
        }
    }

    /// What the worker's last claim found: `true` when it took all it asked
    /// for (more may be waiting).
    pub fn set_backlog(&self, backlog: bool) {
        self.backlog.store(backlog, Ordering::Relaxed);
    }

    /// No new job starts in its creating transaction any more (the worker
    /// is stopping).
    pub fn withdraw(&self) {
        self.withdrawn.store(true, Ordering::SeqCst);
    }

    /// Not withdrawn, and nothing was left queued at the last claim.
    fn is_open(&self) -> bool {
        !self.withdrawn.load(Ordering::SeqCst) && !self.backlog.load(Ordering::Relaxed)
    }
}

/// A slot reserved for a job being created, released if the job is not
/// created (its key had made one already, or the transaction failed).
pub(crate) struct StartSlot {
    offer: Arc<StartOffer>,
    slot: OwnedSemaphorePermit,
    /// Keeps the worker's shutdown waiting until this slot is handed over
    /// or given back.
    _in_flight: TaskTrackerToken,
    pub start: StartNow,
}

impl StartSlot {
    /// Hands the committed, started attempt to the worker. Called in the
    /// blocking task that committed it, which runs to the end even when the
    /// request that asked is dropped: a started attempt is never stranded.
    pub fn run(self, claim: Claim) {
        (self.offer.run)(claim, self.slot);
    }
}

impl App {
    /// Registers this process's worker's offer (replacing any earlier one).
    /// The application keeps it weakly: it lapses when the worker's claimer
    /// ends, and the offer (which holds the worker, which holds the
    /// application) makes no cycle.
    pub fn offer_starts(&self, offer: &Arc<StartOffer>) {
        *self.inner.start_offer.write().expect("never poisoned") = Arc::downgrade(offer);
    }

    /// Whether a job created now, for a provider that asked for no pause,
    /// would start in its creating transaction (diagnostics and tests).
    pub fn starts_at_creation_now(&self) -> bool {
        self.inner
            .start_offer
            .read()
            .expect("never poisoned")
            .upgrade()
            .is_some_and(|offer| offer.is_open() && offer.slots.available_permits() > 0)
    }

    /// A free worker slot for a new job's first attempt on `provider`, if
    /// the offer holds (see [`StartOffer`]).
    pub(crate) fn reserve_start(&self, provider: &str) -> Option<StartSlot> {
        let offer = self
            .inner
            .start_offer
            .read()
            .expect("never poisoned")
            .upgrade()?;
        // Taken before `withdrawn` is read: either the worker's shutdown
        // waits for this token, or the offer is already withdrawn.
        let in_flight = offer.tracker.token();
        if !offer.is_open() {
            return None;
        }
        let provider = self.providers().get(provider)?;
        if provider.not_before().is_some() {
            return None;
        }
        let slot = offer.slots.clone().try_acquire_owned().ok()?;
        let start = StartNow {
            lease_owner: offer.lease_owner.clone(),
            lease_ms: self.config().worker.lease_ms as i64,
            soft_timeout_ms: provider.soft_timeout().as_millis() as i64,
        };
        Some(StartSlot {
            _in_flight: in_flight,
            offer,
            slot,
            start,
        })
    }
}
