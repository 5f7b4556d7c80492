//! What a worker asks of the application: a queued attempt to send, with a
//! lease; renewing that lease; reaping the leases of processes that stopped
//! (their running attempts become `unknown`, never re-sent); and its offer
//! to start new jobs' first attempts in their creating transactions.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;

use super::{App, AppResult, AttemptKey, Claim};
use crate::domain::{AttemptId, AttemptState, UserId};
use crate::providers::limits::SendSlot;
use crate::store::queue::{self, ClaimRules, SendPermit, StartNow};

/// A claimed (or started) attempt, with the room its provider's limits
/// gave it: it is sent at once, holding the slot until its call ends.
#[derive(Debug)]
pub struct Admitted {
    pub claim: Claim,
    /// `None` only for a provider this process does not have (the attempt
    /// then fails unsent).
    pub slot: Option<SendSlot>,
    /// Taken before the claim (or the creation that started it) was asked
    /// of the database: its lease began later, so by `leased_since +
    /// lease_ms` on this process's clock it has surely run out. A claim
    /// whose reply comes after that (held by a partition, say) is not sent.
    pub leased_since: Instant,
}

/// What a claim took, and the providers whose due attempts it left queued
/// (paused, or at their limits).
#[derive(Debug, Default)]
pub struct Claimed {
    pub admitted: Vec<Admitted>,
    pub held: Vec<String>,
}

impl App {
    /// Claims up to `limit` of the oldest due queued attempts for
    /// `lease_owner`, in one transaction, each admitted by its provider's
    /// limits (a provider that is paused or at a limit has its attempts
    /// left queued) and confirmed for sending by the claim itself (its
    /// `sent_at` is set): the caller sends them at once.
    pub async fn claim_batch(&self, lease_owner: &str, limit: usize) -> AppResult<Claimed> {
        let leased_since = Instant::now();
        let owner = lease_owner.to_owned();
        let lease_ms = self.config().worker.lease_ms as i64;
        let providers = self.providers().clone();
        let closed = providers.closed_now();
        for (provider, why) in &closed {
            self.metrics().held_back(provider, why.is_pause());
        }
        let closed: Vec<String> = closed.into_iter().map(|(name, _)| name).collect();
        let mut held = closed.clone();
        let (batch, mut slots) = self
            .store()
            .run(move |conn| {
                let soft_timeout_ms = |name: &str| {
                    providers
                        .get(name)
                        .map_or(0, |p| p.soft_timeout().as_millis() as i64)
                };
                let mut slots: HashMap<AttemptId, SendSlot> = HashMap::new();
                // The prompt is not rendered yet: one token stands in for
                // it until the send settles the estimate.
                let mut admit = |id: &AttemptId, name: &str| match providers.get(name) {
                    None => true,
                    Some(provider) => match provider.limiter().try_admit(1) {
                        Ok(slot) => {
                            slots.insert(id.clone(), slot);
                            true
                        }
                        Err(_) => false,
                    },
                };
                let batch = queue::claim_batch(
                    conn,
                    ClaimRules {
                        lease_owner: &owner,
                        lease_ms,
                        limit: limit as i64,
                        soft_timeout_ms: &soft_timeout_ms,
                        closed: &closed,
                        admit: &mut admit,
                        confirm: true,
                    },
                )?;
                Ok((batch, slots))
            })
            .await?;
        for provider in &batch.held_back {
            self.metrics().held_back(provider, false);
        }
        held.extend(batch.held_back);
        let mut claims = batch.claims;
        if !batch.unconfirmed.is_empty() {
            claims.extend(self.confirm_claims(lease_owner, batch.unconfirmed).await);
        }
        let admitted = claims
            .into_iter()
            .map(|claim| {
                let slot = slots.remove(&claim.attempt.id);
                Admitted {
                    claim,
                    slot,
                    leased_since,
                }
            })
            .collect();
        // Slots left over (an admitted attempt another process took) are
        // dropped unused: what they counted is given back.
        drop(slots);
        Ok(Claimed { admitted, held })
    }

    /// The attempts a claim took though its reply was lost, found on a
    /// fresh connection ([`queue::confirm_claims`]). If even that fails,
    /// none: those attempts run out their lease and the reaper makes them
    /// `unknown`, as for a process that stopped.
    async fn confirm_claims(
        &self,
        lease_owner: &str,
        unconfirmed: Vec<(UserId, Vec<AttemptId>)>,
    ) -> Vec<Claim> {
        let owner = lease_owner.to_owned();
        let confirmed = self
            .store()
            .run(move |conn| queue::confirm_claims(conn, &owner, &unconfirmed))
            .await;
        match confirmed {
            Ok(claims) => {
                tracing::warn!(
                    confirmed = claims.len(),
                    "a claim's reply was lost; what it took is sent"
                );
                claims
            }
            Err(error) => {
                tracing::error!(%error, "a claim's reply was lost and it could not be confirmed; its attempts will surface as unknown");
                Vec::new()
            }
        }
    }

    /// Extends this worker's lease on a running attempt; false when the
    /// attempt is no longer running under it.
    pub async fn renew_lease(
        &self,
        attempt_id: &AttemptId,
        owner_id: &UserId,
        lease_owner: &str,
    ) -> AppResult<bool> {
        let (id, owner_id, owner) = (attempt_id.clone(), owner_id.clone(), lease_owner.to_owned());
        let lease_ms = self.config().worker.lease_ms as i64;
        Ok(self
            .store()
            .run(move |conn| queue::renew_lease(conn, &id, &owner_id, &owner, lease_ms))
            .await?)
    }

    /// Reaps running attempts whose lease ran out: `unknown` if they were
    /// sent, back to the queue if not. Returns what each became.
    pub async fn expire_leases(&self) -> AppResult<Vec<(AttemptId, AttemptState)>> {
        Ok(self.store().run(queue::expire_leases).await?)
    }

    /// Gives back a claim this worker did not send after all (its provider
    /// asked for a pause between the claim and the send): back to the
    /// queue with `sent_at` cleared, or closed if its job finished.
    pub async fn give_back_before_sending(
        &self,
        attempt: &AttemptKey,
        lease_owner: &str,
    ) -> AppResult<SendPermit> {
        let (key, owner) = (attempt.clone(), lease_owner.to_owned());
        let permit = self
            .store()
            .run(move |conn| queue::give_back_before_sending(conn, &key, &owner))
            .await?;
        if permit == SendPermit::Requeued {
            self.notify_queued();
        }
        Ok(permit)
    }
}

/// A worker's standing offer to start a new job's first attempt in the
/// transaction that creates it, so that an idle worker costs the job no
/// claiming transaction of its own. The offer holds while the worker has a
/// free slot, nothing was left queued at its last claim (a new job never
/// jumps ahead of queued ones) and it is not stopping; the attempt's
/// provider must have room under its limits, no pause running, and no
/// attempts its last claim had to leave queued.
pub struct StartOffer {
    lease_owner: String,
    slots: Arc<Semaphore>,
    /// The worker's last claim took as many attempts as it asked for, so
    /// more may be queued.
    backlog: AtomicBool,
    /// Providers whose due attempts the last claim left queued (paused, or
    /// at their limits): their new jobs queue behind them.
    held: Mutex<HashSet<String>>,
    withdrawn: AtomicBool,
    /// The worker's tasks: a reservation holds a token of it, so that the
    /// worker's shutdown waits for a creation under way to hand its attempt
    /// over (and that attempt to be sent and answered).
    tracker: TaskTracker,
    /// Runs a started attempt, holding its slot (the worker's task).
    run: Box<dyn Fn(Admitted, OwnedSemaphorePermit) + Send + Sync>,
}

impl StartOffer {
    pub fn new(
        lease_owner: String,
        slots: Arc<Semaphore>,
        tracker: TaskTracker,
        run: Box<dyn Fn(Admitted, OwnedSemaphorePermit) + Send + Sync>,
    ) -> Self {
        Self {
            lease_owner,
            slots,
            tracker,
            // Until the first claim says otherwise, attempts may be queued
            // from before this process started.
            backlog: AtomicBool::new(true),
            held: Mutex::default(),
            withdrawn: AtomicBool::new(false),
            run,
        }
    }

    /// What the worker's last claim found: `true` when it took all it asked
    /// for (more may be waiting).
    pub fn set_backlog(&self, backlog: bool) {
        self.backlog.store(backlog, Ordering::Relaxed);
    }

    /// The providers whose due attempts the worker's last claim left queued.
    pub fn set_held(&self, providers: &[String]) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.clear();
        held.extend(providers.iter().cloned());
    }

    fn holds(&self, provider: &str) -> bool {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(provider)
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
    /// The room its provider's limits gave the call.
    send: SendSlot,
    /// Before the creating transaction began (see `Admitted::leased_since`).
    reserved_at: Instant,
    pub start: StartNow,
}

impl StartSlot {
    /// Hands the committed, started attempt to the worker. Called in the
    /// blocking task that committed it, which runs to the end even when the
    /// request that asked is dropped: a started attempt is never stranded.
    pub fn run(self, claim: Claim) {
        let admitted = Admitted {
            claim,
            slot: Some(self.send),
            leased_since: self.reserved_at,
        };
        (self.offer.run)(admitted, self.slot);
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

    /// Whether a job created now, for a provider with room and no pause,
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
        if !offer.is_open() || offer.holds(provider) {
            return None;
        }
        let provider = self.providers().get(provider)?;
        let slot = offer.slots.clone().try_acquire_owned().ok()?;
        let send = provider.limiter().try_admit(1).ok()?;
        let start = StartNow {
            lease_owner: offer.lease_owner.clone(),
            lease_ms: self.config().worker.lease_ms as i64,
            soft_timeout_ms: provider.soft_timeout().as_millis() as i64,
        };
        Some(StartSlot {
            reserved_at: Instant::now(),
            _in_flight: in_flight,
            offer,
            slot,
            send,
            start,
        })
    }
}
