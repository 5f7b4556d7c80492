//! Waiting for a job to finish, for `Prefer: wait=N` and chat completions.
//! A waiting request holds no database connection while it waits. It hears
//! every job this process finishes and reads its own job again only when
//! that job comes by (or it fell behind), or every short poll interval
//! (another process may finish it). When the job comes with the row its
//! compare-and-swap returned, a request that answers from the job alone
//! (an AI endpoint) takes that row and reads nothing.
//!
//! The watch is taken *before* the job is created or first read, and the
//! wait starts from that row: no extra read, and a job that finishes in
//! between (a free worker can finish one before its creator's response is
//! written) is still heard.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast::{self, error::RecvError};
use tokio::time::Instant;

use super::{App, AppResult, Attempt, Job};
use crate::domain::JobId;

/// How often a waiter looks again for a job another process may finish.
const POLL: Duration = Duration::from_millis(200);

/// A job this process finished: its id, and the row as it finished when
/// the statement that finished it returned one.
#[derive(Clone, Debug)]
pub struct Finished {
    pub id: JobId,
    pub row: Option<Arc<Job>>,
}

/// The jobs this process finishes, from when it was taken.
pub struct FinishWatch(broadcast::Receiver<Finished>);

/// What a wait must bring back of a job that finished.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Wanted {
    /// The job and its attempts as stored.
    JobAndAttempts,
    /// The job as stored, for a request that answers from the job alone
    /// once it is finished: a job this process finished comes with its
    /// row, and the attempts then stay as they were passed in (an
    /// unfinished job's attempts are read with it, to tell whether it
    /// needs support).
    Job,
}

impl App {
    /// Starts hearing finished jobs; take it before creating or reading the
    /// job to wait for.
    pub fn watch_finishes(&self) -> FinishWatch {
        FinishWatch(self.inner.job_finished.subscribe())
    }

    /// The job and its attempts once it is finished, or as they are when
    /// `within` has passed; `wanted` says what of a finished job must be
    /// read. `job` and `attempts` are as created or read after `watch` was
    /// taken.
    pub async fn wait_for_job(
        &self,
        mut watch: FinishWatch,
        mut job: Job,
        mut attempts: Vec<Attempt>,
        within: Duration,
        wanted: Wanted,
    ) -> AppResult<(Job, Vec<Attempt>)> {
        let deadline = Instant::now() + within;
        let mut next_poll = Instant::now() + POLL;
        loop {
            if job.status.is_terminal() || Instant::now() >= deadline {
                return Ok((job, attempts));
            }
            let read_again = tokio::select! {
                heard = watch.0.recv() => match heard {
                    Ok(Finished { id, row: Some(row) })
                        if id == job.id && wanted == Wanted::Job && row.status.is_terminal() =>
                    {
                        return Ok((Arc::unwrap_or_clone(row), attempts));
                    }
                    Ok(finished) => finished.id == job.id,
                    Err(RecvError::Lagged(_)) => true,
                    // The application holds the sender; only polling is left.
                    Err(RecvError::Closed) => {
                        tokio::time::sleep_until(next_poll.min(deadline)).await;
                        true
                    }
                },
                _ = tokio::time::sleep_until(next_poll) => true,
                _ = tokio::time::sleep_until(deadline) => true,
            };
            if !read_again {
                continue;
            }
            next_poll = Instant::now() + POLL;
            let (key, passed_in) = (job.key(), std::mem::take(&mut attempts));
            (job, attempts) = self
                .store()
                .run(move |conn| {
                    let job = crate::store::reads::get_job(conn, &key)?;
                    // A finished job is all an answer needs.
                    if wanted == Wanted::Job && job.status.is_terminal() {
                        return Ok((job, passed_in));
                    }
                    crate::store::reads::with_attempts(conn, job)
                })
                .await?;
        }
    }

    /// [`App::wait_for_job`] for an AI endpoint's answer: as long as a
    /// request may wait, wanting only the job once it is finished.
    pub async fn wait_for_answer(
        &self,
        watch: FinishWatch,
        job: Job,
        attempts: Vec<Attempt>,
    ) -> AppResult<(Job, Vec<Attempt>)> {
        self.wait_for_job(watch, job, attempts, self.max_wait(), Wanted::Job)
            .await
    }

    /// The longest a request may wait, from configuration.
    pub fn max_wait(&self) -> Duration {
        Duration::from_secs(self.config().server.max_wait_seconds)
    }
}
