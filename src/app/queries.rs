//! What people read: a job with its attempts, their own jobs, and the
//! console (the unknown queue, the race and audit logs, the provider ×
//! task qualification matrix). Roles are checked here.

use super::{
    require_admin, require_staff, visible_to, App, AppError, AppResult, Attempt, AuditEntry,
    ConsoleCounts, Job, RaceDetail, RaceEntry, UnknownAttempt, User,
};
use crate::domain::{AttemptId, IdempotencyKey, JobId, QualificationStatus, Timestamp};
pub use crate::store::console::{JobFilter, JobListing};
pub use crate::store::jobs::JobPage;
use crate::store::rows::JobKey;
use crate::store::{console, jobs as job_store};

/// One cell of the provider × task qualification matrix.
#[derive(Debug, Clone)]
pub struct MatrixCell {
    pub provider: String,
    pub kind: &'static str,
    pub model: String,
    pub task: String,
    pub status: QualificationStatus,
}

/// Links the request reading `job` (a wait, a stream followed, a look) to
/// the job's trace (docs/tracing.md).
fn link_request_to(job: &Job) {
    crate::telemetry::trace::link_to_job(&tracing::Span::current(), job.trace().as_ref());
}

impl App {
    /// A job and its attempts, if `viewer` may see it (else not found).
    pub async fn job_for(&self, viewer: &User, job_id: &JobId) -> AppResult<(Job, Vec<Attempt>)> {
        let id = job_id.clone();
        // An owner's look-up names the owner (one shard when distributed);
        // staff may open anyone's job, found by its id alone.
        let owner = (!viewer.role.is_staff()).then(|| viewer.id.clone());
        let found = self
            .store()
            .run(move |conn| {
                let job = match owner {
                    Some(owner_id) => {
                        crate::store::reads::find_owned_job(conn, &JobKey { id, owner_id })?
                    }
                    None => crate::store::reads::find_job(conn, &id)?,
                };
                let Some(job) = job else {
                    return Ok(None);
                };
                Ok(Some(crate::store::reads::with_attempts(conn, job)?))
            })
            .await?;
        match found {
            Some((job, attempts)) if visible_to(&job, viewer) => {
                link_request_to(&job);
                Ok((job, attempts))
            }
            _ => Err(AppError::NotFound),
        }
    }

    /// One of `owner`'s own jobs with its attempts: staff see only theirs
    /// here too (the Responses API's reads are the owner's).
    pub async fn own_job(&self, owner: &User, job_id: &JobId) -> AppResult<(Job, Vec<Attempt>)> {
        let key = JobKey {
            id: job_id.clone(),
            owner_id: owner.id.clone(),
        };
        self.store()
            .run(
                move |conn| match crate::store::reads::find_owned_job(conn, &key)? {
                    Some(job) => Ok(Some(crate::store::reads::with_attempts(conn, job)?)),
                    None => Ok(None),
                },
            )
            .await?
            .ok_or(AppError::NotFound)
            .inspect(|(job, _)| link_request_to(job))
    }

    /// The job `owner`'s key already made, if any.
    pub async fn job_by_key(&self, owner: &User, key: &IdempotencyKey) -> AppResult<Option<Job>> {
        let (owner, key) = (owner.id.clone(), key.as_str().to_owned());
        Ok(self
            .store()
            .run(move |conn| job_store::find_by_key(conn, &owner, &key))
            .await?)
    }

    /// The owner's jobs, newest first, `limit` at a time, older than `before`.
    pub async fn list_jobs(
        &self,
        owner: &User,
        before: Option<JobId>,
        limit: i64,
    ) -> AppResult<Vec<Job>> {
        let owner = owner.id.clone();
        Ok(self
            .store()
            .run(move |conn| job_store::list_jobs(conn, &owner, before.as_ref(), limit))
            .await?)
    }

    /// The owner's jobs as `page` says, `limit` at a time, each with the
    /// provider it is with (the winner's, else its latest attempt's).
    pub async fn my_jobs(
        &self,
        owner: &User,
        page: job_store::JobPage,
        limit: i64,
    ) -> AppResult<Vec<(Job, Option<String>)>> {
        let owner = owner.id.clone();
        Ok(self
            .store()
            .run(move |conn| {
                let jobs = job_store::list_jobs_page(conn, &owner, &page, limit)?;
                let mut providers = job_store::providers_of(conn, &owner, &jobs)?;
                Ok(jobs
                    .into_iter()
                    .map(|job| {
                        let provider = providers.remove(&job.id);
                        (job, provider)
                    })
                    .collect())
            })
            .await?)
    }

    /// The console's front page numbers (support, admin).
    pub async fn console_counts(&self, actor: &User) -> AppResult<ConsoleCounts> {
        require_staff(actor)?;
        let now = Timestamp::now();
        Ok(self
            .store()
            .run(move |conn| console::console_counts(conn, now))
            .await?)
    }

    /// Attempts in `unknown`, oldest first, a page at a time (support, admin).
    pub async fn unknown_queue(
        &self,
        actor: &User,
        after: Option<AttemptId>,
        limit: i64,
    ) -> AppResult<Vec<UnknownAttempt>> {
        require_staff(actor)?;
        Ok(self
            .store()
            .run(move |conn| console::unknown_attempts(conn, after.as_ref(), limit))
            .await?)
    }

    /// Race-log rows, newest first (admin).
    pub async fn races(&self, actor: &User, limit: i64) -> AppResult<Vec<RaceEntry>> {
        require_admin(actor)?;
        Ok(self
            .store()
            .run(move |conn| console::races(conn, limit))
            .await?)
    }

    /// Race-log rows with both sides of each race, optionally for one
    /// provider and since a time (admin).
    pub async fn race_details(
        &self,
        actor: &User,
        provider: Option<String>,
        since: Option<Timestamp>,
        limit: i64,
    ) -> AppResult<Vec<RaceDetail>> {
        require_admin(actor)?;
        Ok(self
            .store()
            .run(move |conn| console::race_details(conn, provider.as_deref(), since, limit))
            .await?)
    }

    /// Operator actions, newest first (admin).
    pub async fn audit_log(&self, actor: &User, limit: i64) -> AppResult<Vec<AuditEntry>> {
        require_admin(actor)?;
        Ok(self
            .store()
            .run(move |conn| console::audit_entries(conn, limit))
            .await?)
    }

    /// The provider × task qualification matrix (admin), once the start-up
    /// qualification has had its say.
    pub async fn qualification_matrix(&self, actor: &User) -> AppResult<Vec<MatrixCell>> {
        require_admin(actor)?;
        self.startup_qualification_settled().await;
        let mut cells = Vec::new();
        for contract in self.config().contracts.iter() {
            let statuses = self.statuses_for_task(contract.name()).await?;
            for provider in contract.chain() {
                let Some(settings) = self.config().provider(provider) else {
                    continue;
                };
                cells.push(MatrixCell {
                    provider: provider.clone(),
                    kind: settings.kind.as_str(),
                    model: settings.model_name().to_owned(),
                    task: contract.name().to_owned(),
                    status: statuses
                        .get(provider)
                        .cloned()
                        .unwrap_or(QualificationStatus::Never),
                });
            }
        }
        Ok(cells)
    }
}

impl App {
    /// Whether the database answers (readiness).
    pub async fn database_ready(&self) -> AppResult<()> {
        use diesel::connection::SimpleConnection;
        self.store()
            .run(|conn| Ok(conn.batch_execute("SELECT 1")?))
            .await?;
        Ok(())
    }
}

/// What support sees on a job's page beyond what its owner sees.
#[derive(Debug, Clone)]
pub struct StaffNotes {
    pub owner: String,
    pub audit: Vec<AuditEntry>,
}

impl App {
    /// Jobs of every owner, newest first, narrowed by `filter` (support, admin).
    pub async fn search_jobs(
        &self,
        actor: &User,
        filter: JobFilter,
        limit: i64,
    ) -> AppResult<Vec<JobListing>> {
        require_staff(actor)?;
        Ok(self
            .store()
            .run(move |conn| console::find_jobs(conn, &filter, limit))
            .await?)
    }

    /// A job's owner and its audit entries (support, admin).
    pub async fn staff_notes(&self, actor: &User, job: &Job) -> AppResult<StaffNotes> {
        require_staff(actor)?;
        let (job_id, owner_id) = (job.id.clone(), job.owner_id.clone());
        Ok(self
            .store()
            .run(move |conn| {
                let owner = crate::store::users::name_of(conn, &owner_id)?;
                let audit = console::audit_for_job(conn, &owner_id, &job_id)?;
                Ok(StaffNotes { owner, audit })
            })
            .await?)
    }
}
