//! Support resolves what automation must not decide: abandoning an attempt
//! whose outcome is unknown, and finalizing a job as failed. Both need the
//! support or admin role and a reason, and both are audited.

use super::{require_staff, App, AppError, AppResult, Attempt, Job, User};
use crate::domain::{AttemptId, AttemptState, AuditReason, JobId};
use crate::store::operator;

impl App {
    /// Gives up on an unknown attempt: the job may then take a new attempt; a
    /// late result of the abandoned attempt still goes through the CAS.
    pub async fn abandon_attempt(
        &self,
        actor: &User,
        attempt_id: &AttemptId,
        reason: &str,
    ) -> AppResult<Attempt> {
        require_staff(actor)?;
        let reason = AuditReason::parse(reason).map_err(AppError::bad_reason)?;
        let (id, actor_id) = (attempt_id.clone(), actor.id.clone());
        let attempt = self
            .store()
            .run(move |conn| {
                // Staff name the attempt alone: find its owner first.
                let Some(key) = crate::store::transitions::locate_attempt(conn, &id)? else {
                    return Ok(Err(operator::ActionError::AttemptNotFound));
                };
                Ok(operator::abandon(conn, &key, &actor_id, reason.as_str()))
            })
            .await??;
        self.metrics()
            .attempt_reached(&attempt.provider, AttemptState::Abandoned);
        tracing::info!(attempt_id = %attempt.id, job_id = %attempt.job_id, actor = %actor.name, "attempt abandoned");
        Ok(attempt)
    }

    /// Finalizes a job whose unknown attempt was resolved as failed.
    pub async fn fail_job(&self, actor: &User, job_id: &JobId, reason: &str) -> AppResult<Job> {
        require_staff(actor)?;
        let reason = AuditReason::parse(reason).map_err(AppError::bad_reason)?;
        let (job, _) = self.job_for(actor, job_id).await?;
        let (key, actor_id) = (job.key(), actor.id.clone());
        let job = self
            .store()
            .run(move |conn| {
                Ok(operator::fail_job_by_operator(
                    conn,
                    &key,
                    &actor_id,
                    reason.as_str(),
                ))
            })
            .await??;
        self.notify_job_finished(&job.id, None);
        tracing::info!(job_id = %job.id, actor = %actor.name, "job marked failed by support");
        Ok(job)
    }
}
