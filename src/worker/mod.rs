//! The worker: in-process tokio tasks that claim queued attempts with a lease,
//! send them, and hand what comes back to the application, each outcome in
//! one transaction.
//!
//! - success → the compare-and-swap (a loser goes to the race log);
//! - definite failure → `failed`, then the next allowed provider, a retry on
//!   the same provider once its wait is over (a refusal in which nothing
//!   happened), or the job fails;
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
use crate::app::work::{Admitted, StartOffer};
use crate::app::{App, AppError, AttemptKey, Claim};
use crate::domain::{Applied, AttemptId, AttemptState, Outcome, Timestamp, Usage, UserId};
use crate::providers::limits::{LateHold, SendSlot};
use crate::providers::Reply;

mod stream;
mod traced;

use traced::AttemptTrace;
use tracing::Instrument;

/// A running worker pool; dropping it does not stop it, [`WorkerHandle::shutdown`] does.
pub struct WorkerHandle {
    shutdown: CancellationToken,
    grace_over: CancellationToken,
    tracker: TaskTracker,
}

impl WorkerHandle {
    /// A deploy's stop, which strands nothing:
    /// - claiming stops at once (attempts waiting for a provider's pause or
    ///   capacity wait in the queue, never in a claim);
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

/// A call that outlasted its soft timeout and is kept open for late news.
struct LateCall {
    attempt_id: AttemptKey,
    provider: String,
    sent_at: Instant,
    window: Duration,
    /// Its place in flight at the provider (the provider is still working).
    slot: Option<SendSlot>,
    /// Its place under the provider's `max_late_calls`.
    _hold: LateHold,
    /// Its call's span, open until the late news (or none) comes.
    traced: AttemptTrace,
}

/// A call past its soft timeout, before it is marked unknown.
struct Unanswered {
    attempt_id: AttemptKey,
    provider: String,
    sent_at: Instant,
    slot: Option<SendSlot>,
    traced: AttemptTrace,
}

/// A sent claim's lease, kept while its call is out: renewed at each beat
/// of a heartbeat, every third of its length.
struct KeptLease {
    attempt_id: AttemptId,
    owner_id: UserId,
    length: Duration,
    heartbeat: tokio::time::Interval,
    /// Until when the lease holds.
    until: Instant,
    /// The attempt is no longer running under this worker: renewing it
    /// again would change nothing.
    lost: bool,
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
    // Every process delivers webhooks from the outbox.
    handle.tracker.spawn(crate::app::webhooks::delivery_loop(
        worker.app.clone(),
        worker.lease_owner.clone(),
        handle.shutdown.clone(),
    ));
    let ledger = worker.clone();
    handle
        .tracker
        .spawn(async move { ledger.ledger_loop().await });
    handle
        .tracker
        .spawn(async move { worker.housekeeping_loop().await });
    handle
}

impl Worker {
    /// Waits, once the queue is drained, for what may have queued work:
    /// an attempt queued in this process, a provider holding attempts back
    /// reopening (one of its calls ends, or a pause or a window ends by the
    /// clock), a retry of this process's falling due, or the poll interval.
    /// `false` when the worker is shutting down.
    async fn wait_for_work(&self, held: &[String], claimed_at: Timestamp, poll: Duration) -> bool {
        let providers = self.app.providers();
        let reopens = held
            .iter()
            .filter_map(|name| providers.get(name)?.limiter().closed()?.until())
            .min();
        let reopened = async {
            match (held.is_empty(), reopens) {
                (true, _) => std::future::pending().await,
                (false, Some(at)) => tokio::select! {
                    _ = providers.capacity_freed() => {}
                    _ = tokio::time::sleep_until(at) => {}
                },
                (false, None) => providers.capacity_freed().await,
            }
        };
        let now = Timestamp::now();
        let wake = match self.app.next_retry_claim(claimed_at) {
            Some(at) => poll.min(Duration::from_millis((at - now).max(0) as u64)),
            None => poll,
        };
        tokio::select! {
            _ = self.app.attempt_queued() => true,
            _ = reopened => true,
            _ = sleep(wake) => true,
            _ = self.shutdown.cancelled() => false,
        }
    }

    /// Claims queued attempts whenever a slot is free, as many at once as
    /// there are free slots (at most [`CLAIM_BATCH`]), and runs each in a
    /// task of its own holding its slot: at most `concurrency` attempts are
    /// in flight, and a busy queue costs one claiming transaction per batch
    /// rather than per attempt. While the last claim took all it asked for,
    /// a claim first waits up to `worker.claim_gather_ms` for a quarter of
    /// the slots to free (under a backlog they free one at a time). Once a
    /// claim finds fewer attempts than it asked for, the queue is drained:
    /// the claimer then waits to be told an attempt was queued (or for the
    /// poll interval, for other processes' queues) instead of claiming
    /// again as each slot frees, and its free slots go to jobs created
    /// meanwhile (`StartOffer`).
    async fn claim_loop(self, slots: Arc<Semaphore>, offer: Arc<StartOffer>) {
        let poll = Duration::from_millis(self.app.config().worker.poll_interval_ms);
        // A quarter of the slots, so that a batch gathers while the other
        // attempts are still under way.
        let batch_size = CLAIM_BATCH.min(self.app.config().worker.concurrency.div_ceil(4));
        // While attempts are queued, slots free one at a time: a claim per
        // freed slot would cost a claiming transaction per attempt.
        let gather_for = Duration::from_millis(self.app.config().worker.claim_gather_ms);
        // Attempts may be queued from before this process started.
        let mut drained = false;
        // Providers whose due attempts the last claim left queued.
        let mut held: Vec<String> = Vec::new();
        // When the last claim began: the retries due by then, give or
        // take the clocks' slack, it has seen.
        let mut claimed_at = Timestamp::from_millis(i64::MIN);
        while !self.shutdown.is_cancelled() {
            if drained && !self.wait_for_work(&held, claimed_at, poll).await {
                break;
            }
            let first = tokio::select! {
                slot = slots.clone().acquire_owned() => slot.expect("the slots are never closed"),
                _ = self.shutdown.cancelled() => break,
            };
            let mut free = vec![first];
            // Attempts are queued (the last claim took all it asked):
            // gather a batch's worth of slots, for a little while.
            let gather = (!drained).then(|| Instant::now() + gather_for);
            self.gather_slots(&slots, &mut free, gather, batch_size)
                .await;
            let asked = free.len();
            claimed_at = Timestamp::now();
            let claimed = self.app.claim_batch(&self.lease_owner, asked).await;
            match claimed {
                Ok(claimed) => {
                    let full = claimed.admitted.len() == asked;
                    offer.set_backlog(full);
                    offer.set_held(&claimed.held);
                    held = claimed.held;
                    drained = !full;
                    if !claimed.admitted.is_empty() {
                        let metrics = self.app.metrics();
                        metrics.claims.inc();
                        metrics
                            .claimed_attempts
                            .inc_by(claimed.admitted.len() as u64);
                    }
                    for admitted in claimed.admitted {
                        let slot = free.pop().expect("no more claims than free slots");
                        self.run_in_slot(admitted, slot);
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

    /// Adds free slots to `free`, up to `batch_size`: those free now and,
    /// until `gather` (when given), those that free meanwhile.
    async fn gather_slots(
        &self,
        slots: &Arc<Semaphore>,
        free: &mut Vec<tokio::sync::OwnedSemaphorePermit>,
        gather: Option<Instant>,
        batch_size: usize,
    ) {
        while free.len() < batch_size {
            if let Ok(slot) = slots.clone().try_acquire_owned() {
                free.push(slot);
                continue;
            }
            let Some(until) = gather else { break };
            tokio::select! {
                slot = slots.clone().acquire_owned() => free.push(slot.expect("the slots are never closed")),
                _ = tokio::time::sleep_until(until) => break,
                _ = self.shutdown.cancelled() => break,
            }
        }
        // Whatever else is free now rides along, up to a full batch.
        while free.len() < CLAIM_BATCH {
            match slots.clone().try_acquire_owned() {
                Ok(slot) => free.push(slot),
                Err(_) => break,
            }
        }
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
    fn run_in_slot(&self, admitted: Admitted, slot: tokio::sync::OwnedSemaphorePermit) {
        let claim = &admitted.claim;
        let span = tracing::info_span!(
            "run_attempt",
            job_id = %claim.job.id,
            attempt_id = %claim.attempt.id,
            provider = %claim.attempt.provider,
        );
        // Boxed before the task is made, and only there: the attempt's
        // future is kilobytes, and a task's future is copied whole each time
        // the task changes stage (spawned, done), as is a future each time
        // it is wrapped (a span, a box) after its first poll began.
        let attempt = Box::pin(self.clone().run_attempt(admitted)).instrument(span);
        self.tracker.spawn_on(
            async move {
                attempt.await;
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
                pruned = self.app.prune_expired(Timestamp::now()) => match pruned {
                    Ok(pruned) if pruned.is_empty() => {}
                    Ok(pruned) => tracing::info!(?pruned, "retention removed expired rows"),
                    Err(error) => tracing::warn!(%error, "pruning expired rows failed"),
                },
                _ = self.shutdown.cancelled() => return,
            }
        }
    }

    /// Adds the duplicate counts kept in memory to the database every
    /// `ledger.tally_flush_ms` (and once more at shutdown), and samples the
    /// Unknown backlog once a minute for the console's chart.
    async fn ledger_loop(self) {
        let every = Duration::from_millis(self.app.config().ledger.tally_flush_ms);
        let mut sampled_minute = None;
        loop {
            let stopping = tokio::select! {
                _ = sleep(every) => false,
                _ = self.shutdown.cancelled() => true,
            };
            if let Err(error) = self.app.flush_tallies().await {
                tracing::warn!(%error, "adding the duplicate counts failed; kept for the next flush");
            }
            if stopping {
                return;
            }
            let minute = Timestamp::now().floor_to(60_000);
            if sampled_minute != Some(minute) {
                match self.app.sample_backlog().await {
                    Ok(()) => sampled_minute = Some(minute),
                    Err(error) => tracing::warn!(%error, "sampling the unknown backlog failed"),
                }
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

    /// One claimed attempt, in the span [`Worker::run_in_slot`] opens. It
    /// owns its worker, so that its future is whole before it is boxed.
    async fn run_attempt(self, admitted: Admitted) {
        let Admitted {
            claim,
            slot,
            leased_since,
        } = admitted;
        let attempt_id = claim.attempt.key();
        let provider = claim.attempt.provider.clone();
        let lease = Duration::from_millis(self.app.config().worker.lease_ms);
        let mut dispatch = match self.app.dispatch(&claim) {
            Ok(dispatch) => dispatch,
            Err(not_sent) => {
                let deadline = Instant::now() + lease;
                self.apply(&attempt_id, &provider, not_sent, None, deadline)
                    .await;
                return;
            }
        };
        // Every claim this worker makes is confirmed by the claiming
        // statement (or the creating transaction): the send follows now,
        // unless a pause began since the claim took its slot. Then the
        // request does not leave: the attempt goes back to the queue (its
        // `sent_at` cleared) and is claimed again once the pause is over.
        let paused_since = slot.as_ref().is_some_and(|s| !s.clear_to_send());
        // The claim's reply came after its lease had surely run out (a
        // partition held it): the reaper may have made the attempt
        // `unknown` and support acted on it; it does not leave now. Given
        // back if nobody has touched it; else it stays as the reaper left it.
        let lapsed = leased_since.elapsed() >= lease;
        if lapsed {
            tracing::warn!("a claim came back after its lease had run out: not sent");
        }
        if claim.attempt.sent_at.is_none() || paused_since || lapsed {
            drop(slot);
            match self
                .app
                .give_back_before_sending(&attempt_id, &self.lease_owner)
                .await
            {
                Ok(permit) => {
                    tracing::info!(?permit, "the provider asked for a pause before the attempt left: not sent, given back")
                }
                Err(error) => {
                    tracing::error!(%error, "giving back an unsent claim failed; the attempt was not sent, and its lease will run out")
                }
            }
            return;
        }
        let traced = AttemptTrace::start(&claim, &dispatch);
        dispatch.call.trace = traced.context();
        self.send(claim, Arc::new(dispatch), slot, traced).await;
    }

    /// Sends a confirmed claim and applies what comes back (or, past the
    /// soft timeout, marks it unknown and keeps listening for late news).
    async fn send(
        &self,
        claim: Claim,
        dispatch: Arc<Dispatch>,
        mut slot: Option<SendSlot>,
        traced: AttemptTrace,
    ) {
        if let Some(slot) = slot.as_mut() {
            slot.sending();
            slot.settle_tokens(dispatch.estimated_tokens());
        }
        tracing::debug!("attempt sent");
        self.observe_waits(&claim);
        if dispatch.call.wants_stream() {
            return self.send_streaming(claim, dispatch, slot, traced).await;
        }
        let attempt_id = claim.attempt.key();
        let provider = claim.attempt.provider.clone();
        let mut lease = self.keep_lease(&claim);
        let sent_at = Instant::now();
        let soft_timeout = dispatch.provider.soft_timeout();
        let soft_deadline = Instant::now() + soft_timeout;
        let sending = dispatch.clone();
        let mut call = Box::pin(async move { sending.send().await });
        let answered = loop {
            tokio::select! {
                reply = &mut call => break Some(reply),
                _ = tokio::time::sleep_until(soft_deadline) => break None,
                _ = lease.heartbeat.tick() => {
                    // Sent already: the lease is kept while the call is out,
                    // whatever happened to the job (an answer still goes
                    // through the compare-and-swap).
                    self.renew_kept(&mut lease).await;
                }
            }
        };
        let Some(reply) = answered else {
            let unanswered = Unanswered {
                attempt_id,
                provider,
                sent_at,
                slot,
                traced,
            };
            return self
                .keep_for_late_news(&dispatch, unanswered, call, lease.until)
                .await;
        };
        self.app
            .metrics()
            .observe_provider_call(&provider, sent_at.elapsed());
        traced.answered(&reply);
        let settled = self.settle(&provider, reply, slot.as_ref());
        drop(slot);
        self.apply_traced(&traced, &attempt_id, &provider, settled, lease.until, 0)
            .await;
    }

    /// Past the soft timeout: the attempt is marked unknown, and its call
    /// kept open for late news, off the claim loop's slot, if the
    /// provider's cap on open late calls allows.
    async fn keep_for_late_news(
        &self,
        dispatch: &Dispatch,
        unanswered: Unanswered,
        call: std::pin::Pin<Box<dyn std::future::Future<Output = Reply> + Send>>,
        lease_until: Instant,
    ) {
        let Unanswered {
            attempt_id,
            provider,
            sent_at,
            slot,
            traced,
        } = unanswered;
        let reason = format!(
            "no answer within the soft timeout of {} ms",
            dispatch.provider.soft_timeout().as_millis()
        );
        tracing::warn!("{reason}: attempt is now unknown");
        traced.went_unknown();
        let unknown = (Outcome::Unknown(reason.into()), None);
        self.apply_traced(&traced, &attempt_id, &provider, unknown, lease_until, 0)
            .await;
        let Some(hold) = dispatch.provider.limiter().try_hold_late() else {
            self.late_call_dropped(dispatch, &provider);
            return;
        };
        let worker = self.clone();
        let late = LateCall {
            attempt_id,
            provider,
            sent_at,
            window: dispatch.provider.late_result_window(),
            slot,
            _hold: hold,
            traced,
        };
        self.tracker
            .spawn(async move { Box::pin(worker.await_late_result(late, call)).await });
    }

    /// Observes how long a claim waited: since it was queued, and since it
    /// was due (created, or a retry's Retry-After over).
    fn observe_waits(&self, claim: &Claim) {
        let metrics = self.app.metrics();
        let now = Timestamp::now();
        metrics
            .claim_lag_seconds
            .observe((now - claim.attempt.created_at).max(0) as f64 / 1000.0);
        let due = claim.attempt.not_before.unwrap_or(claim.attempt.created_at);
        metrics
            .provider_wait_seconds
            .get_or_create(&crate::app::metrics::ProviderLabel {
                provider: claim.attempt.provider.clone(),
            })
            .observe((now - due).max(0) as f64 / 1000.0);
    }

    /// Counts and logs a timed-out call dropped because too many are open.
    fn late_call_dropped(&self, dispatch: &Dispatch, provider: &str) {
        self.app
            .metrics()
            .late_calls_dropped
            .get_or_create(&crate::app::metrics::ProviderLabel {
                provider: provider.to_owned(),
            })
            .inc();
        tracing::warn!(
            max_late_calls = dispatch.provider.settings.max_late_calls,
            "too many timed-out calls are open to this provider: this one is dropped, \
             and its attempt stays unknown until support resolves it"
        );
    }

    /// The lease of a claim about to be sent, to keep while its call is out.
    fn keep_lease(&self, claim: &Claim) -> KeptLease {
        let length = Duration::from_millis(self.app.config().worker.lease_ms);
        // The first beat is one period from now (an `interval`'s immediate
        // first tick, awaited, would pass through the timer for nothing).
        let period = (length / 3).max(Duration::from_millis(50));
        let mut heartbeat = tokio::time::interval_at(Instant::now() + period, period);
        // Beats missed while a renewal hung (a partition) are not made up
        // in a burst afterwards.
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        KeptLease {
            lost: false,
            attempt_id: claim.attempt.id.clone(),
            owner_id: claim.attempt.owner_id.clone(),
            length,
            heartbeat,
            // The claim set the lease just now; each renewal moves it on.
            until: Instant::now() + length,
        }
    }

    /// Renews a kept lease at its heartbeat; `until` moves on only when it
    /// was renewed.
    async fn renew_kept(&self, lease: &mut KeptLease) {
        if lease.lost {
            return;
        }
        let renewed_at = Instant::now();
        match self.renew_lease(&lease.attempt_id, &lease.owner_id).await {
            Some(true) => lease.until = renewed_at + lease.length,
            Some(false) => lease.lost = true,
            None => {}
        }
    }

    /// What a reply says, with its bookkeeping done: the tokens it used are
    /// counted against the provider's `tokens_per_minute`, a pause it asked
    /// for is counted.
    fn settle(
        &self,
        provider: &str,
        reply: Reply,
        slot: Option<&SendSlot>,
    ) -> (Outcome, Option<Usage>) {
        if let (Some(tokens), Some(slot)) = (reply.tokens_used(), slot) {
            slot.settle_tokens(tokens);
        }
        if let Outcome::Refused(refusal) = &reply.outcome {
            if let Some(pause) = refusal.pause {
                self.app.metrics().paused(provider, pause);
                tracing::info!(
                    pause_ms = pause.as_millis() as u64,
                    "the provider asked for a pause"
                );
            }
        }
        (reply.outcome, reply.usage)
    }

    async fn await_late_result(
        self,
        late: LateCall,
        call: std::pin::Pin<Box<dyn std::future::Future<Output = Reply> + Send>>,
    ) {
        let LateCall {
            attempt_id,
            provider,
            sent_at,
            window,
            slot,
            _hold,
            traced,
        } = late;
        let lease = Duration::from_millis(self.app.config().worker.lease_ms);
        tokio::select! {
            reply = call => {
                traced.answered(&reply);
                let (outcome, usage) = self.settle(&provider, reply, slot.as_ref());
                drop(slot);
                match outcome {
                    Outcome::Unknown(reason) => tracing::warn!(%attempt_id, %reason, "late call ended without an answer"),
                    outcome => {
                        tracing::info!(%attempt_id, "late answer arrived");
                        self.app.metrics().observe_provider_call(&provider, sent_at.elapsed());
                        let until = Instant::now() + lease;
                        self.apply_traced(&traced, &attempt_id, &provider, (outcome, usage), until, 0).await;
                    }
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
    /// busy: `Some(true)` renewed, `Some(false)` lost (the attempt is no
    /// longer running under this worker; its kept lease stops renewing),
    /// `None` when the database stayed busy. An answer still goes through
    /// the CAS either way.
    async fn renew_lease(&self, attempt_id: &AttemptId, owner_id: &UserId) -> Option<bool> {
        let mut delay = Duration::from_millis(50);
        for attempt in 1..=4 {
            match self
                .app
                .renew_lease(attempt_id, owner_id, &self.lease_owner)
                .await
            {
                Ok(true) => return Some(true),
                Ok(false) => {
                    tracing::warn!(
                        "lease lost: the attempt is no longer running under this process"
                    );
                    return Some(false);
                }
                Err(error) => {
                    tracing::warn!(%error, attempt, "renewing the lease failed; retrying");
                    sleep(delay).await;
                    delay *= 2;
                }
            }
        }
        None
    }

    /// [`Worker::apply_released`] in its own span, a child of the call's,
    /// which records what the write did (the compare-and-swap's verdict).
    async fn apply_traced(
        &self,
        traced: &AttemptTrace,
        attempt_id: &AttemptKey,
        provider: &str,
        (outcome, usage): (Outcome, Option<Usage>),
        lease_until: Instant,
        released: u64,
    ) {
        let recording = traced.recording(&outcome);
        let applied = self
            .apply_released(attempt_id, provider, outcome, usage, lease_until, released)
            .instrument(recording.clone())
            .await;
        if let Some(applied) = &applied {
            AttemptTrace::recorded(&recording, applied);
        }
    }

    /// Applies an outcome, as it is: an outcome is never rewritten.
    ///
    /// While the database is busy or away, the write is retried until the
    /// shutdown grace ends: an answer must not be lost (if the lease runs
    /// out meanwhile, the attempt shows `unknown`, and the answer still
    /// applies as late news). A write the database refuses otherwise is
    /// retried until `lease_until`, the lease this worker last renewed;
    /// then it is left: the attempt stays `running`, and once its lease has
    /// run out the reaper makes it `unknown`, as for a process that
    /// stopped. Nothing fails over on an outcome that was not recorded.
    async fn apply(
        &self,
        attempt_id: &AttemptKey,
        provider: &str,
        outcome: Outcome,
        usage: Option<Usage>,
        lease_until: Instant,
    ) {
        self.apply_released(attempt_id, provider, outcome, usage, lease_until, 0)
            .await;
    }

    /// [`Worker::apply`] for an attempt that released `released` chunks of
    /// a streamed answer.
    async fn apply_released(
        &self,
        attempt_id: &AttemptKey,
        provider: &str,
        outcome: Outcome,
        usage: Option<Usage>,
        lease_until: Instant,
        released: u64,
    ) -> Option<Applied> {
        let mut delay = Duration::from_millis(100);
        for attempt in 1.. {
            match self
                .app
                .apply_streamed_outcome(attempt_id, provider, outcome.clone(), released, usage)
                .await
            {
                Ok(applied) => return Some(applied),
                Err(AppError::NotFound) => {
                    tracing::error!(%attempt_id, "the attempt is gone; its outcome cannot be applied");
                    return None;
                }
                Err(AppError::Unavailable(reason)) => {
                    tracing::warn!(%reason, attempt, "applying an outcome failed; retrying in {delay:?}");
                }
                Err(error) => {
                    tracing::error!(%error, attempt, outcome = outcome.label(), "the database refused an outcome; retrying while the lease holds");
                    if Instant::now() + delay >= lease_until {
                        tracing::error!(%attempt_id, outcome = outcome.label(), "the outcome could not be recorded before the lease ran out; the attempt stays running and the reaper makes it unknown");
                        return None;
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
        None
    }
}
