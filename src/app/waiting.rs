//! Waiting for a job to finish, for `Prefer: wait=N` and chat completions.
//! A waiting request holds no database connection while it waits: it reads
//! the job, then sleeps until this process finishes some job or a short
//! poll interval passes (another process may finish it), and reads again.

use std::time::Duration;

use tokio::time::Instant;

use super::{App, AppResult, Attempt, Job};
use crate::domain::JobId;
use crate::store::jobs as job_store;

/// How often a waiter looks again for a job another process may finish.
const POLL: Duration = Duration::from_millis(200);

impl App {
    /// The job and its attempts once it is finished, or as it is when
    /// `within` has passed.
    pub async fn wait_for_job(
        &self,
        job_id: &JobId,
        within: Duration,
    ) -> AppResult<(Job, Vec<Attempt>)> {
        let deadline = Instant::now() + within;
        loop {
            // Registered before the read: a finish between the read and the
            // sleep still wakes this waiter.
            let finished = self.inner.job_finished.notified();
            tokio::pin!(finished);
            finished.as_mut().enable();
            let id = job_id.clone();
            let (job, attempts) = self
                .store()
                .run(move |conn| {
                    let job = job_store::get_job(conn, &id)?;
                    let attempts = job_store::attempts_of(conn, &id)?;
                    Ok((job, attempts))
                })
                .await?;
            if job.status.is_terminal() || Instant::now() >= deadline {
                return Ok((job, attempts));
            }
            tokio::select! {
                _ = finished => {}
                _ = tokio::time::sleep(POLL) => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// The longest a request may wait, from configuration.
    pub fn max_wait(&self) -> Duration {
        Duration::from_secs(self.config().server.max_wait_seconds)
    }
}
