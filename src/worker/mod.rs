//! The worker: in-process tokio tasks that claim queued attempts with a lease,
//! send them, and hand what comes back to the application, each outcome in
//! one transaction.
//!
//! - success → the compare-and-swap (a loser goes to the race log);
//! - definite failure → `failed`, then the next allowed provider, or the job fails;
//! - soft timeout → `unknown`; the call stays open for the late-result window and
//!   whatever comes back still goes through the CAS;
//! - a `running` attempt whose lease expired (its process died) → `unknown`,
//!   never re-sent.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::{sleep, Instant};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::app::dispatch::Dispatch;
use crate::app::work::StartOffer;
use crate::app::{now_ms, App, AppError, Claim, SendPermit};
use crate::domain::{AttemptId, AttemptState, Outcome};

/// A running worker pool; dropping it does not stop it, [`WorkerHandle::shutdown`] does.
pub struct WorkerHandle {
    shutdown: CancellationToken,
    grace_over: CancellationToken,
    tracker: TaskTracker,
}

impl WorkerHandle {
    /// A deploy's stop, which strands nothing:
    /// - claiming stops at once; a claim not yet sent (waiting out a
    ///   provider's `Retry-After`) goes back to the queue;
    /// - calls in flight may answer, or reach their soft timeout (the
    ///   configuration keeps `grace` longer than every soft timeout);
    /// - writing their outcomes is retried until `grace` ends;
    /// - waiting for late answers stops (those attempts are already `unknown`).
    pub async fn shutdown(self, grace: Duration) {
        self.shutdown.cancel();
        self.tracker.close();
        if tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_err()
        {
            self.grace_over.cancel();
            tracing::warn!(
                "worker tasks still busy after the shutdown grace period; a running \
                 attempt whose outcome was not written becomes unknown when its lease expires"
            );
            let _ = tokio::time::timeout(Duration::from_secs(1), self.tracker.wait()).await;
        }
    }
}

/// How often each process removes expired sessions, quiet sign-in failure
/// counters, and what retention says has expired.
const CLEANUP_EVERY: Duration = Duration::from_secs(60);

/// How a failure reads when the provider's outcome itself could not be stored.
const UNRECORDABLE: &str = "the provider's outcome could not be recorded";

/// A call that outlasted its soft timeout and is kept open for late news.
struct LateCall {
    attempt_id: AttemptId,
    provider: String,
    sent_at: Instant,
    window: Duration,
}

#[derive(Clone)]
struct Worker {
    app: App,
    lease_owner: String,
    /// Stop claiming and waiting.
    shutdown: CancellationToken,
    /// The shutdown grace is over: stop retrying writes.
    grace_over: CancellationToken,
    tracker: TaskTracker,
    /// The runtime the worker's tasks run on (creation hands attempts over
    /// from blocking threads).
    runtime: tokio::runtime::Handle,
}

/// The most attempts one claiming transaction takes.
const CLAIM_BATCH: usize = 16;

/// Starts the claimer, which keeps up to `worker.concurrency` attempts in
/// flight (0: this process sends nothing), the lease reaper and the
/// housekeeping.
pub fn spawn(app: App) -> WorkerHandle {
    let handle = WorkerHandle {
        shutdown: CancellationToken::new(),
        grace_over: CancellationToken::new(),
        tracker: TaskTracker::new(),
    };
    let worker = Worker {
        app,
        // Kept on the attempt after it finishes: which process ran it.
        lease_owner: format!("pid{}-{}", std::process::id(), uuid::Uuid::now_v7()),
        shutdown: handle.shutdown.clone(),
        grace_over: handle.grace_over.clone(),
        tracker: handle.tracker.clone(),
        runtime: tokio::runtime::Handle::current(),
    };
    let concurrency = worker.app.config().worker.concurrency;
    tracing::info!(lease_owner = %worker.lease_owner, concurrency, "worker started");
    if concurrency > 0 {
        // Offered before anything is served: the first request may already
        // start its job here.
        let slots = Arc::new(Semaphore::new(concurrency));
        let offer = worker.offer_starts(slots.clone());
        let claimer = worker.clone();
        handle
            .tracker
            .spawn(async move { claimer.claim_loop(slots, offer).await });
    }
    // Every process reaps expired leases, even one that sends nothing itself:
    // a dead worker's attempts must surface as unknown.
    let reaper = worker.clone();
    handle
        .tracker
        .spawn(async move { reaper.reaper_loop().await });
    handle
        .tracker
        .spawn(async move { worker.housekeeping_loop().await });
    handle
}

impl Worker {
    /// Claims queued attempts whenever a slot is free, as many at once as
    /// there are free slots (at most [`CLAIM_BATCH`]), and runs each in a
    /// task of its own holding its slot: at most `concurrency` attempts are
    /// in flight, and a busy queue costs one claiming transaction per batch
    /// rather than per attempt. Once a claim finds fewer attempts than it
    /// asked for, the queue is drained: the claimer then waits to be told
    /// an attempt was queued (or for the poll interval, for other
    /// processes' queues) instead of claiming again as each slot frees, and
    /// its free slots go to jobs created meanwhile (`StartOffer`).
    async fn claim_loop(self, slots: Arc<Semaphore>, offer: Arc<StartOffer>) {
        let poll = Duration::from_millis(self.app.config().worker.poll_interval_ms);
        // Attempts may be queued from before this process started.
        let mut drained = false;
        while !self.shutdown.is_cancelled() {
            if drained {
                tokio::select! {
                    _ = self.app.attempt_queued() => {}
                    _ = sleep(poll) => {}
                    _ = self.shutdown.cancelled() => break,
                }
            }
            let first = tokio::select! {
                slot = slots.clone().acquire_owned() => slot.expect("the slots are never closed"),
                _ = self.shutdown.cancelled() => break,
            };
            let mut free = vec![first];
            while free.len() < CLAIM_BATCH {
                match slots.clone().try_acquire_owned() {
                    Ok(slot) => free.push(slot),
                    Err(_) => break,
                }
            }
            let asked = free.len();
            let claimed = self.app.claim_batch(&self.lease_owner, asked).await;
            match claimed {
                Ok(claims) => {
                    let full = claims.len() == asked;
                    offer.set_backlog(full);
                    drained = !full;
                    for claim in claims {
                        let slot = free.pop().expect("no more claims than free slots");
                        self.run_in_slot(claim, slot);
                    }
                }
                Err(error) => {
                    // What is queued is unknown: the backlog flag stays as
                    // it was, and the next turn claims again.
                    drop(free);
                    tracing::error!(%error, "claiming queued attempts failed");
                    tokio::select! {
                        _ = sleep(poll * 4) => {}
                        _ = self.shutdown.cancelled() => {}
                    }
                    drained = false;
                }
            }
        }
        offer.withdraw();
    }

    /// Offers the claimer's free slots to job creation in this process (see
    /// `app::work::StartOffer`): an attempt started there runs here, in a
    /// task of its own holding its slot, like a claimed one.
    fn offer_starts(&self, slots: Arc<Semaphore>) -> Arc<StartOffer> {
        let worker = self.clone();
        let offer = Arc::new(StartOffer::new(
            self.lease_owner.clone(),
            slots,
            self.tracker.clone(),
            Box::new(move |claim, slot| worker.run_in_slot(claim, slot)),
        ));
        self.app.offer_starts(&offer);
        offer
    }

    /// Runs a claimed (or started) attempt in a task of its own, holding
    /// its slot until the attempt is done.
    fn run_in_slot(&self, claim: Claim, slot: tokio::sync::OwnedSemaphorePermit) {
        let worker = self.clone();
        self.tracker.spawn_on(
            async move {
                worker.run_attempt(claim).await;
                drop(slot);
            },
            &self.runtime,
        );
    }

    /// Now and then removes expired sessions, quiet sign-in counters and,
    /// when `[retention]` sets a window, expired jobs and log entries. A loop
    /// of its own: pruning a backlog never delays the reaper.
    async fn housekeeping_loop(self) {
        loop {
            tokio::select! {
                _ = sleep(CLEANUP_EVERY) => {}
                _ = self.shutdown.cancelled() => return,
            }
            match self.app.clean_up().await {
                Ok(cleaned) => {
                    tracing::debug!(?cleaned, "cleaned up expired sessions and sign-in counters")
                }
                Err(error) => tracing::warn!(%error, "cleaning up failed"),
            }
            if !self.app.config().retention.prunes_anything() {
                continue;
            }
            // Stopping mid-run is safe: each batch commits or rolls back whole.
            tokio::select! {
                pruned = self.app.prune_expired(now_ms()) => match pruned {
                    Ok(pruned) if pruned.is_empty() => {}
                    Ok(pruned) => tracing::info!(?pruned, "retention removed expired rows"),
                    Err(error) => tracing::warn!(%error, "pruning expired rows failed"),
                },
                _ = self.shutdown.cancelled() => return,
            }
        }
    }

    /// Reaps the leases of dead processes.
    async fn reaper_loop(self) {
        let every = Duration::from_millis((self.app.config().worker.lease_ms / 2).max(100));
        loop {
            tokio::select! {
                _ = sleep(every) => {}
                _ = self.shutdown.cancelled() => return,
            }
            match self.app.expire_leases().await {
                Ok(expired) => {
                    for (attempt_id, state) in expired {
                        match state {
                            AttemptState::Unknown => {
                                tracing::warn!(%attempt_id, "lease expired on a sent attempt: now unknown, never re-sent")
                            }
                            AttemptState::Queued => {
                                tracing::warn!(%attempt_id, "lease expired before the attempt was sent: back in the queue")
                            }
                            other => {
                                tracing::warn!(%attempt_id, state = %other, "lease expired before the attempt was sent; its job had finished")
                            }
                        }
                    }
                }
                Err(error) => tracing::error!(%error, "expiring leases failed"),
            }
        }
    }

    #[tracing::instrument(skip_all, fields(job_id = %claim.job.id, attempt_id = %claim.attempt.id, provider = %claim.attempt.provider))]
    async fn run_attempt(&self, claim: Claim) {
        let attempt_id = claim.attempt.id.clone();
        let provider = claim.attempt.provider.clone();
        let dispatch = match self.app.dispatch(&claim) {
            Ok(dispatch) => Arc::new(dispatch),
            Err(not_sent) => {
                self.apply(&attempt_id, &provider, not_sent).await;
                return;
            }
        };
        let lease_ms = self.app.config().worker.lease_ms;
        // The first beat is one period from now (an `interval`'s immediate
        // first tick, awaited, would pass through the timer for nothing).
        let period = Duration::from_millis((lease_ms / 3).max(50));
        let mut heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        // Confirmed by the claim itself (no pause was asked for): send now.
        if claim.attempt.sent_at.is_none()
            && !self
                .wait_and_confirm(&claim, &dispatch, &mut heartbeat)
                .await
        {
            return;
        }
        self.send(claim, dispatch, heartbeat).await;
    }

    /// For a claim that was not confirmed when it was made: waits out the
    /// provider's pause, then confirms the claim immediately before sending.
    /// False when nothing may be sent (and the attempt records why).
    async fn wait_and_confirm(
        &self,
        claim: &Claim,
        dispatch: &Dispatch,
        heartbeat: &mut tokio::time::Interval,
    ) -> bool {
        let attempt_id = &claim.attempt.id;
        // A provider that asked for a pause (429/529 Retry-After) is not called
        // before it ends; the soft timeout starts only when the request is sent.
        // The claim is kept alive meanwhile; if it becomes void (the job
        // finished, the lease was lost) or the process is stopping, nothing
        // is sent.
        if let Some(until) = dispatch.provider.not_before() {
            tracing::info!("waiting for the provider's Retry-After before sending");
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(until) => break,
                    _ = self.shutdown.cancelled() => break,
                    _ = heartbeat.tick() => {
                        if !self.renew_lease(attempt_id).await {
                            break;
                        }
                    }
                }
            }
        }
        if self.shutdown.is_cancelled() {
            self.give_back(attempt_id).await;
            return false;
        }
        // The one guarded statement before the send.
        match self.app.confirm_send(attempt_id, &self.lease_owner).await {
            Ok(SendPermit::Granted) => true,
            Ok(refused) => {
                tracing::warn!(?refused, "the claim is void: the attempt was not sent");
                false
            }
            Err(error) => {
                // Unconfirmed means unsent; the lease will run out and the
                // attempt go back to the queue.
                tracing::error!(%error, "confirming the claim failed: the attempt was not sent");
                false
            }
        }
    }

    /// Sends a confirmed claim and applies what comes back (or, past the
    /// soft timeout, marks it unknown and keeps listening for late news).
    async fn send(
        &self,
        claim: Claim,
        dispatch: Arc<Dispatch>,
        mut heartbeat: tokio::time::Interval,
    ) {
        let attempt_id = claim.attempt.id.clone();
        let provider = claim.attempt.provider.clone();
        tracing::info!("attempt sent");
        let metrics = self.app.metrics();
        metrics
            .claim_lag_seconds
            .observe((now_ms() - claim.attempt.created_at).max(0) as f64 / 1000.0);
        let sent_at = Instant::now();
        let soft_timeout = dispatch.provider.soft_timeout();
        let soft_deadline = Instant::now() + soft_timeout;
        let sending = dispatch.clone();
        let mut call = Box::pin(async move { sending.send().await });
        let answered = loop {
            tokio::select! {
                outcome = &mut call => break Some(outcome),
                _ = tokio::time::sleep_until(soft_deadline) => break None,
                _ = heartbeat.tick() => {
                    // Sent already: a lost lease changes nothing here; the
                    // answer still goes through the compare-and-swap.
                    self.renew_lease(&attempt_id).await;
                }
            }
        };
        match answered {
            Some(outcome) => {
                metrics.observe_provider_call(&provider, sent_at.elapsed());
                self.apply(&attempt_id, &provider, outcome).await
            }
            None => {
                let reason = format!(
                    "no answer within the soft timeout of {} ms",
                    soft_timeout.as_millis()
                );
                tracing::warn!("{reason}: attempt is now unknown");
                self.apply(&attempt_id, &provider, Outcome::Unknown(reason))
                    .await;
                // Keep the call open for late news, off this claim loop's slot.
                let worker = self.clone();
                let window = dispatch.provider.late_result_window();
                let late = LateCall {
                    attempt_id,
                    provider,
                    sent_at,
                    window,
                };
                self.tracker
                    .spawn(async move { worker.await_late_result(late, call).await });
            }
        }
    }

    async fn await_late_result(
        self,
        late: LateCall,
        call: std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + Send>>,
    ) {
        let LateCall {
            attempt_id,
            provider,
            sent_at,
            window,
        } = late;
        tokio::select! {
            outcome = call => match outcome {
                Outcome::Unknown(reason) => tracing::warn!(%attempt_id, %reason, "late call ended without an answer"),
                outcome => {
                    tracing::info!(%attempt_id, "late answer arrived");
                    self.app.metrics().observe_provider_call(&provider, sent_at.elapsed());
                    self.apply(&attempt_id, &provider, outcome).await;
                }
            },
            _ = sleep(window) => {
                tracing::warn!(%attempt_id, "late-result window closed; the attempt stays unknown until support resolves it");
            }
            _ = self.shutdown.cancelled() => {
                tracing::info!(%attempt_id, "stopped waiting for a late result at shutdown; the attempt stays unknown");
            }
        }
    }

    /// Renews the claim's lease, retrying a few times when the database is
    /// busy. False when the claim is void (not running under this worker any
    /// more, or its job finished); an answer still goes through the CAS.
    async fn renew_lease(&self, attempt_id: &AttemptId) -> bool {
        let mut delay = Duration::from_millis(50);
        for attempt in 1..=4 {
            match self.app.renew_lease(attempt_id, &self.lease_owner).await {
                Ok(true) => return true,
                Ok(false) => {
                    tracing::warn!(
                        "lease lost: the attempt is no longer running under this process, or its \
                         job finished"
                    );
                    return false;
                }
                Err(error) => {
                    tracing::warn!(%error, attempt, "renewing the lease failed; retrying");
                    sleep(delay).await;
                    delay *= 2;
                }
            }
        }
        // Still unknown whether it holds; treat it as held (the reaper
        // decides by the database's clock) rather than drop a live call.
        true
    }

    /// Gives an unsent claim back (at shutdown).
    async fn give_back(&self, attempt_id: &AttemptId) {
        match self
            .app
            .give_back_unsent(attempt_id, &self.lease_owner)
            .await
        {
            Ok(outcome) => {
                tracing::info!(%attempt_id, ?outcome, "unsent claim given back at shutdown")
            }
            Err(error) => {
                tracing::error!(%error, %attempt_id, "giving back an unsent claim failed; its lease will run out and return it to the queue")
            }
        }
    }

    /// Applies an outcome, retrying while the database is busy or away: an
    /// answer must not be lost. Gives up only when the shutdown grace ends;
    /// the attempt then surfaces as `unknown` (its lease expires), which is
    /// the truth. An error a retry cannot fix (the database refuses what
    /// was sent) is not retried forever: the attempt fails, with the reason.
    async fn apply(&self, attempt_id: &AttemptId, provider: &str, outcome: Outcome) {
        let mut outcome = outcome;
        let mut delay = Duration::from_millis(100);
        let mut refused = 0;
        for attempt in 1.. {
            match self
                .app
                .apply_outcome(attempt_id, provider, outcome.clone())
                .await
            {
                Ok(_) => return,
                Err(AppError::NotFound) => {
                    tracing::error!(%attempt_id, "the attempt is gone; its outcome cannot be applied");
                    return;
                }
                Err(AppError::Unavailable(reason)) => {
                    tracing::warn!(%reason, attempt, "applying an outcome failed; retrying in {delay:?}");
                }
                Err(error) => {
                    refused += 1;
                    tracing::error!(%error, attempt, "the database refused an outcome");
                    if refused >= 3 {
                        if matches!(outcome, Outcome::Failed(ref r) if r.starts_with(UNRECORDABLE))
                        {
                            tracing::error!(%attempt_id, "even the failure could not be recorded; the attempt will surface as unknown");
                            return;
                        }
                        outcome = Outcome::Failed(format!(
                            "{UNRECORDABLE} ({}): {error}",
                            outcome.label()
                        ));
                        refused = 0;
                        continue;
                    }
                }
            }
            tokio::select! {
                _ = sleep(delay) => {}
                _ = self.grace_over.cancelled() => break,
            }
            delay = (delay * 2).min(Duration::from_secs(5));
        }
        tracing::error!(%attempt_id, "applying an outcome given up when the shutdown grace ended; the attempt will surface as unknown");
    }
}
