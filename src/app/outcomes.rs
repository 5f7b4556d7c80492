//! Applying a provider's outcome to its attempt, whoever brings it (the
//! worker, a late call, a signed callback): a success goes through the
//! compare-and-swap (a loser to the race log); a definite failure fails over
//! to the next provider the gate allows, or fails the job; an unknown
//! outcome makes the attempt `unknown`.

use serde_json::Value;

use super::{App, AppError, AppResult, Attempt, Job};
use crate::domain::retry::Failure;
use crate::domain::stream::failure_after;
use crate::domain::{Applied, AttemptId, Outcome, Reason, RetryPolicy, Usage};
use crate::store::completion::{FailurePlan, Recorded};
use crate::store::ledger::Charge;
use crate::store::rows::AttemptKey;
use crate::store::{completion, queue, reads, transitions};

impl App {
    /// Applies `outcome` (already held to the task's contract) to the
    /// attempt, sent to `provider`, in one transaction, with the tokens
    /// the call used (`None`: not known).
    pub async fn apply_outcome(
        &self,
        attempt: &AttemptKey,
        provider: &str,
        outcome: Outcome,
        usage: Option<Usage>,
    ) -> AppResult<Applied> {
        self.apply_streamed_outcome(attempt, provider, outcome, 0, usage)
            .await
    }

    /// Applies `outcome` to an attempt that released `released` chunks of
    /// a streamed answer: after one, a failure fails the job
    /// (`domain::stream::failure_after`).
    pub async fn apply_streamed_outcome(
        &self,
        attempt: &AttemptKey,
        provider: &str,
        outcome: Outcome,
        released: u64,
        usage: Option<Usage>,
    ) -> AppResult<Applied> {
        let attempt_id = &attempt.id;
        // Priced now, when the answer is recorded.
        let charge = self.charge_for(provider, usage);
        let (applied, job_id) = match outcome.printable() {
            Outcome::Succeeded(answer) => {
                // Counted, and its waiters told, on the committing thread.
                let applied = self
                    .apply_success(attempt, provider, answer, charge)
                    .await?;
                return Ok(self.log_applied(attempt_id, applied));
            }
            Outcome::Failed(error) => {
                let recorded = self
                    .apply_failure(
                        attempt,
                        error,
                        failure_after(released, Failure::Definite),
                        charge,
                    )
                    .await?;
                self.count_usage(&recorded);
                (recorded.applied, Some(recorded.job_id))
            }
            Outcome::Refused(refusal) => {
                let failure = Failure::NothingHappened {
                    retry_after_ms: refusal.retry_after.map(|d| d.as_millis() as i64),
                };
                let failure = failure_after(released, failure);
                let recorded = self
                    .apply_failure(attempt, refusal.reason, failure, charge)
                    .await?;
                self.count_usage(&recorded);
                (recorded.applied, Some(recorded.job_id))
            }
            Outcome::Unknown(reason) => {
                let key = attempt.clone();
                let applied = self
                    .store()
                    .run(move |conn| queue::mark_unknown(conn, &key, &reason))
                    .await?;
                (applied, None)
            }
        };
        self.metrics().record_applied(provider, &applied);
        if let (Applied::JobFailed { .. }, Some(job_id)) = (&applied, &job_id) {
            self.notify_job_finished(job_id, None);
        }
        Ok(self.log_applied(attempt_id, applied))
    }

    /// Logs what applying an outcome did, and hands it back.
    fn log_applied(&self, attempt_id: &AttemptId, applied: Applied) -> Applied {
        match &applied {
            Applied::Won => {
                tracing::debug!(%attempt_id, "attempt won: its answer is the job's result")
            }
            Applied::Lost { winner } => {
                tracing::warn!(%attempt_id, ?winner, "answer lost the race; discarded and written to the race log")
            }
            Applied::FailedOver {
                attempt_id: next,
                provider,
            } => {
                tracing::info!(%attempt_id, next_attempt = %next, next_provider = %provider, "definite failure: failing over");
                self.notify_queued();
            }
            Applied::RetryScheduled {
                attempt_id: next,
                provider,
                not_before,
            } => {
                tracing::info!(%attempt_id, next_attempt = %next, %provider, not_before = %not_before.rfc3339(), "nothing happened: retrying on the same provider once its wait is over");
                self.notify_retry_due(*not_before);
            }
            Applied::JobFailed { reason } => tracing::warn!(%attempt_id, %reason, "job failed"),
            Applied::Recorded => tracing::info!(%attempt_id, "failure recorded"),
            Applied::Repeated(first) => {
                tracing::info!(%attempt_id, first, "the same news again: nothing new written")
            }
            Applied::Superseded => {
                tracing::info!(%attempt_id, "the job had finished through another attempt: closed with a note")
            }
            Applied::MarkedUnknown => tracing::warn!(%attempt_id, "attempt is now unknown"),
            Applied::Discarded(state) => {
                tracing::warn!(%attempt_id, %state, "an answer for a finished attempt: discarded and written to the race log")
            }
            Applied::Ignored(state) => {
                tracing::warn!(%attempt_id, %state, "outcome ignored: the attempt was already finished")
            }
        }
        applied
    }

    /// The compare-and-swap. What it did is counted, and a winner's
    /// waiters hear of it with the row it returned, on the thread that
    /// committed it: the waiter answers without waiting for this task to
    /// be woken, and the counts are up to date when it does.
    async fn apply_success(
        &self,
        attempt: &AttemptKey,
        provider: &str,
        answer: Value,
        charge: Charge,
    ) -> AppResult<Applied> {
        let key = attempt.clone();
        let (app, provider) = (self.clone(), provider.to_owned());
        let tell = Box::new(move |recorded: &mut Recorded| {
            app.count_usage(recorded);
            app.metrics().record_applied(&provider, &recorded.applied);
            match recorded.applied {
                Applied::Won => app.notify_job_finished(&recorded.job_id, recorded.finished.take()),
                // This answer had won already, and whoever waits may not
                // have heard (the first try's reply was lost, say).
                Applied::Repeated("won") => app.notify_job_finished(&recorded.job_id, None),
                _ => {}
            }
        });
        let recorded = self
            .store()
            .write_batched_then(
                move |conn| completion::settle_answer(conn, &key, &answer, &charge),
                Some(tell),
            )
            .await?;
        Ok(recorded.applied)
    }

    fn count_usage(&self, recorded: &Recorded) {
        if let Some(entry) = &recorded.entry {
            self.metrics().record_ledger(entry);
        }
    }

    /// An attempt and the job it works for.
    pub(crate) async fn attempt_and_job(&self, attempt: &AttemptKey) -> AppResult<(Attempt, Job)> {
        let key = attempt.clone();
        Ok(self
            .store()
            .run(move |conn| {
                let attempt = reads::find_owned_attempt(conn, &key.id, &key.owner_id)?
                    .ok_or(crate::store::StoreError::NotFound)?;
                let job = reads::get_job(conn, &attempt.job_key())?;
                Ok((attempt, job))
            })
            .await?)
    }

    /// The key of an attempt known by its id alone (a callback's URL).
    pub(crate) async fn locate_attempt(&self, attempt_id: &AttemptId) -> AppResult<AttemptKey> {
        let id = attempt_id.clone();
        self.store()
            .run(move |conn| transitions::locate_attempt(conn, &id))
            .await?
            .ok_or(AppError::NotFound)
    }

    async fn apply_failure(
        &self,
        attempt: &AttemptKey,
        error: Reason,
        failure: Failure,
        charge: Charge,
    ) -> AppResult<Recorded> {
        let (_, job) = self.attempt_and_job(attempt).await?;
        // Failover goes only where the gate allows; retries within the
        // task's budget.
        let plan = FailurePlan {
            gate: self.allowed_providers(&job).await?,
            policy: self
                .config()
                .contracts
                .get(&job.task)
                .map_or_else(RetryPolicy::default, |c| c.definition.retry_policy()),
            jitter: fastrand::f64(),
        };
        let key = attempt.clone();
        Ok(self
            .store()
            .write_batched(move |conn| {
                completion::record_failure(conn, &key, &error, failure, &plan, &charge)
            })
            .await?)
    }
}
