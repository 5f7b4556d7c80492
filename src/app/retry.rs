//! Starting a new attempt on a job: the owner's "try again", or support's
//! "next attempt on …" (audited). Only providers the failover gate allows
//! may take it; the one-live-attempt index has the final word.

use super::intake::require_in_chain;
use super::{App, AppError, AppResult, Attempt, User};
use crate::domain::JobId;
use crate::store::operator;

impl App {
    /// Queues a new attempt on `provider`, or on the next untried allowed
    /// provider of the job's failover order.
    pub async fn start_attempt(
        &self,
        actor: &User,
        job_id: &JobId,
        provider: Option<String>,
    ) -> AppResult<Attempt> {
        let (job, _) = self.job_for(actor, job_id).await?;
        if let Some(contract) = self.config().contracts.get(&job.task) {
            require_in_chain(&contract, provider.as_deref())?;
        }
        let gate = self.allowed_providers(&job).await?;
        if let Some(p) = &provider {
            if !gate.allows(p) {
                return Err(AppError::ProviderNotQualified {
                    provider: p.clone(),
                    status: gate.skipped_entry(p).unwrap_or_default().to_owned(),
                    allowed: gate.allowed.clone(),
                });
            }
        }
        // Staff acting on another owner's job are audited.
        let audited_actor = (job.owner_id != actor.id).then(|| actor.id.clone());
        let key = job.key();
        let attempt = self
            .store()
            .run(move |conn| {
                Ok(operator::start_attempt(
                    conn,
                    &key,
                    provider.as_deref(),
                    &gate.allowed,
                    audited_actor.as_ref(),
                ))
            })
            .await??;
        self.notify_queued();
        tracing::info!(job_id = %job.id, attempt_id = %attempt.id, provider = %attempt.provider, "attempt queued");
        Ok(attempt)
    }
}
