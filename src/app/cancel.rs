//! Cancelling a job (docs/design.md, "Cancelling"): its owner asks, the
//! database decides (`store::cancel`). An unfinished job becomes
//! `cancelled` and takes no new attempt; a queued attempt is withdrawn
//! before it is sent; one already sent cannot be recalled, and its late
//! answer goes to the race log. Cancelling a cancelled job answers the same
//! again; a job that succeeded or failed keeps its outcome (`JobFinished`).

use super::{App, AppError, AppResult, Attempt, Job, User};
use crate::domain::JobId;
use crate::store::cancel::{self as cancel_store, Cancelled};
use crate::store::rows::JobKey;
use crate::store::StoreError;

/// A cancel's answer: the job as it is now.
#[derive(Debug)]
pub struct Cancellation {
    pub job: Job,
    pub attempts: Vec<Attempt>,
    /// False when the job had been cancelled already.
    pub changed: bool,
}

impl App {
    /// Cancels `owner`'s job. Another owner's job is not found, as for any
    /// read (support staff cancel nothing of others': a cancel is the
    /// owner's decision about their own request).
    pub async fn cancel_job(&self, owner: &User, job_id: &JobId) -> AppResult<Cancellation> {
        let key = JobKey {
            id: job_id.clone(),
            owner_id: owner.id.clone(),
        };
        let done = self
            .store()
            .run(move |conn| match cancel_store::cancel_job(conn, &key) {
                Err(StoreError::NotFound) => Ok(None),
                other => other.map(Some),
            })
            .await?;
        match done.ok_or(AppError::NotFound)? {
            Cancelled::Now {
                job,
                attempts,
                withdrawn,
            } => {
                tracing::info!(job_id = %job.id, withdrawn, "job cancelled");
                self.metrics().jobs_cancelled.inc();
                self.notify_job_finished(&job.id, None);
                Ok(Cancellation {
                    job,
                    attempts,
                    changed: true,
                })
            }
            Cancelled::Already { job, attempts } => Ok(Cancellation {
                job,
                attempts,
                changed: false,
            }),
            Cancelled::Refused(status) => Err(AppError::JobFinished(status)),
        }
    }
}
