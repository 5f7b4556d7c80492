//! The worker: in-process tokio tasks that claim queued attempts with a lease,
//! call the provider, and apply the outcome, each in one transaction.
//!
//! - success → the compare-and-swap (a loser goes to the race log);
//! - definite failure → `failed`, then the next provider of the chain, or the job fails;
//! - soft timeout → `unknown`; the call stays open for the late-result window and
//!   whatever comes back still goes through the CAS;
//! - a `running` attempt whose lease expired (its process died) → `unknown`,
//!   never re-sent.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{sleep, Instant};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::callbacks::CallbackKey;
use crate::config::Config;
use crate::providers::{CallbackTarget, Provider, ProviderOutcome, ProviderRequest, Providers};
use crate::qualify;
use crate::store::attempts::{self, Claim, Completion, FailureOutcome};
use crate::store::{Store, StoreError};
use crate::tasks::Tasks;

/// A running worker pool; dropping it does not stop it, [`WorkerHandle::shutdown`] does.
pub struct WorkerHandle {
    wake: Arc<Notify>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
}

impl WorkerHandle {
    /// A handle that lets request handlers wake an idle worker at once.
    pub fn waker(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// Stops claiming, lets in-flight calls reach an answer or their soft timeout,
    /// stops waiting for late results, and waits at most `grace` for all that.
    pub async fn shutdown(self, grace: Duration) {
        self.shutdown.cancel();
        self.tracker.close();
        if tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                "worker tasks still busy after the shutdown grace period; their running \
                 attempts become unknown when their leases expire"
            );
        }
    }
}

#[derive(Clone)]
struct Worker {
    store: Store,
    providers: Providers,
    tasks: Tasks,
    config: Arc<Config>,
    /// This process's lease owner id.
    lease_owner: String,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
}

/// Starts `config.worker.concurrency` claim loops (0: this process sends
/// nothing) and the lease reaper.
pub fn spawn(
    store: Store,
    providers: Providers,
    tasks: Tasks,
    config: Arc<Config>,
) -> WorkerHandle {
    let handle = WorkerHandle {
        wake: Arc::new(Notify::new()),
        shutdown: CancellationToken::new(),
        tracker: TaskTracker::new(),
    };
    let worker = Worker {
        store,
        providers,
        tasks,
        lease_owner: format!("worker-{}", uuid::Uuid::now_v7()),
        wake: handle.wake.clone(),
        shutdown: handle.shutdown.clone(),
        tracker: handle.tracker.clone(),
        config,
    };
    let concurrency = worker.config.worker.concurrency;
    tracing::info!(lease_owner = %worker.lease_owner, concurrency, "worker started");
    for _ in 0..concurrency {
        let w = worker.clone();
        handle.tracker.spawn(async move { w.claim_loop().await });
    }
    // Every process reaps expired leases, even one that sends nothing itself:
    // a dead worker's attempts must surface as unknown.
    handle
        .tracker
        .spawn(async move { worker.reaper_loop().await });
    handle
}

impl Worker {
    fn lease_ms(&self) -> i64 {
        self.config.worker.lease_ms as i64
    }

    async fn claim_loop(self) {
        let poll = Duration::from_millis(self.config.worker.poll_interval_ms);
        while !self.shutdown.is_cancelled() {
            match self.claim().await {
                Ok(Some(claim)) => self.run_attempt(claim).await,
                Ok(None) => {
                    tokio::select! {
                        _ = self.wake.notified() => {}
                        _ = sleep(poll) => {}
                        _ = self.shutdown.cancelled() => {}
                    }
                }
                Err(error) => {
                    tracing::error!(%error, "claiming a queued attempt failed");
                    tokio::select! {
                        _ = sleep(poll * 4) => {}
                        _ = self.shutdown.cancelled() => {}
                    }
                }
            }
        }
    }

    async fn claim(&self) -> Result<Option<Claim>, StoreError> {
        let owner = self.lease_owner.clone();
        let lease = self.lease_ms();
        let providers = self.providers.clone();
        self.store
            .run(move |conn| {
                let soft_timeout_ms = |name: &str| {
                    providers
                        .get(name)
                        .map_or(0, |p| p.soft_timeout.as_millis() as i64)
                };
                attempts::claim_next(conn, &owner, lease, &soft_timeout_ms)
            })
            .await
    }

    /// Makes running attempts of dead processes `unknown`.
    async fn reaper_loop(self) {
        let every = Duration::from_millis((self.config.worker.lease_ms / 2).max(100));
        loop {
            tokio::select! {
                _ = sleep(every) => {}
                _ = self.shutdown.cancelled() => return,
            }
            match self.store.run(attempts::expire_leases).await {
                Ok(expired) => {
                    for attempt_id in expired {
                        tracing::warn!(%attempt_id, "lease expired on a running attempt: now unknown, not re-sent");
                    }
                }
                Err(error) => tracing::error!(%error, "expiring leases failed"),
            }
        }
    }

    #[tracing::instrument(skip_all, fields(job_id = %claim.job.id, attempt_id = %claim.attempt.id, provider = %claim.attempt.provider))]
    async fn run_attempt(&self, claim: Claim) {
        let Some(provider) = self.providers.get(&claim.attempt.provider) else {
            let error = format!(
                "provider {:?} is not configured; the attempt was not sent",
                claim.attempt.provider
            );
            self.apply(&claim, ProviderOutcome::Failed(error)).await;
            return;
        };
        let Some(task) = self.tasks.get(&claim.job.task) else {
            let error = format!(
                "task {:?} is not configured; the attempt was not sent",
                claim.job.task
            );
            self.apply(&claim, ProviderOutcome::Failed(error)).await;
            return;
        };
        let request = ProviderRequest {
            attempt_id: claim.attempt.id.clone(),
            attempt_number: claim.attempt.number,
            job_id: claim.job.id.clone(),
            task,
            input: claim.job.input.clone(),
            params: claim.job.params.clone(),
            temperature: None,
            callback: self.callback_target(&provider, &claim.attempt.id),
        };
        let mut heartbeat = tokio::time::interval(Duration::from_millis(
            (self.config.worker.lease_ms / 3).max(50),
        ));
        heartbeat.tick().await;
        // A provider that asked for a pause (429/529 Retry-After) is not called
        // before it ends; the soft timeout starts only when the request is sent.
        if let Some(until) = provider.not_before() {
            tracing::info!("waiting for the provider's Retry-After before sending");
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(until) => break,
                    _ = heartbeat.tick() => self.renew_lease(&claim.attempt.id).await,
                }
            }
        }
        tracing::info!("attempt sent");
        let worker = self.clone();
        let soft_deadline = Instant::now() + provider.soft_timeout;
        let mut call = Box::pin(async move { provider.call(&request).await });
        let answered = loop {
            tokio::select! {
                outcome = &mut call => break Some(outcome),
                _ = tokio::time::sleep_until(soft_deadline) => break None,
                _ = heartbeat.tick() => self.renew_lease(&claim.attempt.id).await,
            }
        };
        match answered {
            Some(ProviderOutcome::Unknown(reason)) => {
                self.mark_unknown(&claim.attempt.id, &reason).await;
            }
            Some(outcome) => self.apply(&claim, outcome).await,
            None => {
                let provider = self
                    .providers
                    .get(&claim.attempt.provider)
                    .expect("provider checked above");
                let reason = format!(
                    "no answer within the soft timeout of {} ms",
                    provider.soft_timeout.as_millis()
                );
                tracing::warn!("{reason}: attempt is now unknown");
                self.mark_unknown(&claim.attempt.id, &reason).await;
                // Keep the call open for late news, off this claim loop's slot.
                self.tracker
                    .spawn(async move { worker.await_late_result(claim, provider, call).await });
            }
        }
    }

    /// A callback URL and secret for providers that answer asynchronously.
    fn callback_target(&self, provider: &Provider, attempt_id: &str) -> Option<CallbackTarget> {
        if !provider.config.callbacks {
            return None;
        }
        let key = self
            .config
            .server
            .callback_secret_env
            .as_deref()
            .and_then(CallbackKey::from_env)?;
        let base = self
            .config
            .server
            .public_url
            .as_deref()?
            .trim_end_matches('/');
        Some(CallbackTarget {
            url: format!("{base}/api/v1/callbacks/attempts/{attempt_id}"),
            secret: key.attempt_secret(attempt_id),
        })
    }

    async fn await_late_result(
        self,
        claim: Claim,
        provider: Arc<Provider>,
        call: std::pin::Pin<Box<dyn std::future::Future<Output = ProviderOutcome> + Send>>,
    ) {
        tokio::select! {
            outcome = call => match outcome {
                ProviderOutcome::Unknown(reason) => tracing::warn!(attempt_id = %claim.attempt.id, %reason, "late call ended without an answer"),
                outcome => {
                    tracing::info!(attempt_id = %claim.attempt.id, "late answer arrived");
                    self.apply(&claim, outcome).await;
                }
            },
            _ = sleep(provider.late_result_window) => {
                tracing::warn!(attempt_id = %claim.attempt.id, "late-result window closed; the attempt stays unknown until support resolves it");
            }
            _ = self.shutdown.cancelled() => {
                tracing::info!(attempt_id = %claim.attempt.id, "stopped waiting for a late result at shutdown; the attempt stays unknown");
            }
        }
    }

    async fn renew_lease(&self, attempt_id: &str) {
        let (id, owner, lease) = (
            attempt_id.to_owned(),
            self.lease_owner.clone(),
            self.lease_ms(),
        );
        match self
            .store
            .run(move |conn| attempts::renew_lease(conn, &id, &owner, lease))
            .await
        {
            Ok(true) => {}
            Ok(false) => tracing::warn!(
                "lease lost: the attempt is no longer running under this process (it may have been \
                 marked unknown); its answer will still go through the compare-and-swap"
            ),
            Err(error) => tracing::error!(%error, "renewing the lease failed"),
        }
    }

    async fn mark_unknown(&self, attempt_id: &str, reason: &str) {
        let (id, reason) = (attempt_id.to_owned(), reason.to_owned());
        self.with_retries("marking the attempt unknown", move |store| {
            let (id, reason) = (id.clone(), reason.clone());
            async move {
                store
                    .run(move |conn| attempts::mark_unknown(conn, &id, &reason))
                    .await
            }
        })
        .await;
    }

    /// Applies a provider's answer in one transaction.
    async fn apply(&self, claim: &Claim, outcome: ProviderOutcome) {
        let attempt_id = claim.attempt.id.clone();
        match outcome {
            ProviderOutcome::Succeeded(payload) => {
                let result = self
                    .with_retries("applying a result", move |store| {
                        let (id, payload) = (attempt_id.clone(), payload.clone());
                        async move {
                            store
                                .run(move |conn| attempts::complete_success(conn, &id, &payload))
                                .await
                        }
                    })
                    .await;
                match result {
                    Some(Completion::Won) => {
                        tracing::info!("attempt won: its result is the job's result")
                    }
                    Some(Completion::Lost { winner }) => {
                        tracing::warn!(winner = ?winner, "late result lost the race; discarded and written to the race log")
                    }
                    Some(Completion::Ignored(state)) => {
                        tracing::warn!(%state, "result ignored: the attempt was already finished")
                    }
                    None => {}
                }
            }
            ProviderOutcome::Failed(error) => {
                let (task, requested) =
                    (claim.job.task.clone(), claim.job.requested_provider.clone());
                let (config, tasks) = (self.config.clone(), self.tasks.clone());
                let result = self
                    .with_retries("applying a failure", move |store| {
                        let (id, error, task, requested) = (
                            attempt_id.clone(),
                            error.clone(),
                            task.clone(),
                            requested.clone(),
                        );
                        let (config, tasks) = (config.clone(), tasks.clone());
                        async move {
                            store
                                .run(move |conn| {
                                    // Failover goes only to qualified providers (DESIGN.md §6).
                                    let (allowed, skipped) = qualify::allowed_for_job(
                                        conn,
                                        &config,
                                        &tasks,
                                        &task,
                                        requested.as_deref(),
                                    )?;
                                    attempts::complete_failure(
                                        conn, &id, &error, &allowed, &skipped,
                                    )
                                })
                                .await
                        }
                    })
                    .await;
                match result {
                    Some(FailureOutcome::FailedOver {
                        attempt_id,
                        provider,
                    }) => {
                        tracing::info!(next_attempt = %attempt_id, next_provider = %provider, "definite failure: failing over");
                        self.wake.notify_one();
                    }
                    Some(FailureOutcome::JobFailed { reason }) => {
                        tracing::warn!(%reason, "job failed")
                    }
                    Some(FailureOutcome::Recorded) => tracing::info!("failure recorded"),
                    Some(FailureOutcome::Ignored(state)) => {
                        tracing::warn!(%state, "failure ignored: the attempt was already finished")
                    }
                    None => {}
                }
            }
            ProviderOutcome::Unknown(reason) => self.mark_unknown(&claim.attempt.id, &reason).await,
        }
    }

    /// Retries a store write until it succeeds: an answer must not be lost to
    /// a database that is busy or briefly away. Gives up only at shutdown; the
    /// attempt then surfaces as `unknown` (its lease expires), which is the truth.
    async fn with_retries<T, F, Fut>(&self, what: &str, mut op: F) -> Option<T>
    where
        F: FnMut(Store) -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        let mut delay = Duration::from_millis(100);
        for attempt in 1.. {
            match op(self.store.clone()).await {
                Ok(value) => return Some(value),
                Err(error) => {
                    tracing::error!(%error, attempt, "{what} failed; retrying in {delay:?}");
                    tokio::select! {
                        _ = sleep(delay) => {}
                        _ = self.shutdown.cancelled() => break,
                    }
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
        tracing::error!("{what} abandoned at shutdown; the attempt will surface as unknown");
        None
    }
}
