//! `/api/v1/jobs`: create (idempotent), read, list, start a new attempt,
//! and cancel.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use utoipa::IntoParams;

use super::auth::Caller;
use super::body::{
    json_body, keyset_page, no_query, page_limit, parse_query, query_id, BodyRules, EmptyBody,
};
use super::error::{job_location, ApiError};
use super::views::{
    AttemptView, CreateJobRequest, JobPage, JobSummary, JobView, Problem, StartAttemptRequest,
};
use std::time::Duration;

use super::idempotency::idempotency_key;
use crate::app::waiting::Wanted;
use crate::app::{App, Attempt, Job};
use crate::domain::JobId;

/// The wait a client asked for with `Prefer: wait=N` (RFC 7240), in whole
/// seconds, capped at `cap`. Preferences this server does not know, and a
/// `wait` that is not a number, are ignored, as the RFC asks.
pub fn preferred_wait(req: &HttpRequest, cap: Duration) -> Option<Duration> {
    let seconds = req
        .headers()
        .get_all("prefer")
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|preference| {
            let preference = preference.split(';').next().unwrap_or_default();
            let (name, value) = preference.split_once('=')?;
            name.trim()
                .eq_ignore_ascii_case("wait")
                .then(|| value.trim().trim_matches('"').parse::<u64>().ok())
                .flatten()
        })
        .next()?;
    Some(Duration::from_secs(seconds).min(cap))
}

/// Holds the answer until the job is finished or the preferred wait ends;
/// the response then says which wait it applied.
/// `read` creates or reads the job; a preferred wait starts watching for
/// finished jobs before it does.
async fn wait_if_preferred<F>(
    app: &App,
    req: &HttpRequest,
    read: F,
) -> Result<(Job, Vec<Attempt>, Option<String>), ApiError>
where
    F: std::future::Future<Output = Result<(Job, Vec<Attempt>), ApiError>>,
{
    let Some(wait) = preferred_wait(req, app.max_wait()) else {
        let (job, attempts) = read.await?;
        return Ok((job, attempts, None));
    };
    let watch = app.watch_finishes();
    let (job, attempts) = read.await?;
    let (job, attempts) = app
        .wait_for_job(watch, job, attempts, wait, Wanted::JobAndAttempts)
        .await?;
    Ok((job, attempts, Some(format!("wait={}", wait.as_secs()))))
}

/// Create a job under an idempotency key.
#[utoipa::path(
    post, path = "/api/v1/jobs", tag = "jobs",
    request_body = CreateJobRequest,
    params(
        ("Idempotency-Key" = String, Header, description = "1-255 printable ASCII characters; the same key and payload return the same job"),
        ("Prefer" = Option<String>, Header, description = "`wait=N` (RFC 7240): answer once the job is finished or N seconds have passed, at most `server.max_wait_seconds`"),
    ),
    responses(
        (status = 201, description = "Created; `Location` names the job", body = JobView,
            headers(("Location" = String), ("Preference-Applied" = String, description = "`wait=N` when a wait was honoured"))),
        (status = 200, description = "Replay of an earlier request with the same key and payload; header `Idempotent-Replayed: true`", body = JobView,
            headers(("Location" = String), ("Idempotent-Replayed" = String), ("Preference-Applied" = String))),
        (status = 400, description = "Missing or malformed Idempotency-Key, or malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid bearer token", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The key was used with a different payload (`idempotency-key-reused`)", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid body, unknown task or provider, bad input; the key is not reserved", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "The owner's monthly budget has no room for the job (`budget-exceeded`, naming `limit` and `resets_at`); nothing created, not worth retrying before the reset", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database busy; retry with the same key", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn create_job(
    app: web::Data<App>,
    caller: Caller,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let key = idempotency_key(&req)?;
    let body: CreateJobRequest = json_body(
        &req,
        payload,
        BodyRules::of(&app.config().server),
        EmptyBody::Refuse,
    )
    .await?;
    let mut replayed = false;
    // Boxed: the creation's future is over 4 KB, and held inline it was
    // stored twice over in `wait_if_preferred`'s (its argument, and the
    // same future once awaited), each copy moved on every request.
    let create = Box::pin(async {
        let created = app
            .create_job(&caller.0, &caller.1, key, body.into())
            .await?;
        replayed = created.replayed;
        Ok((created.job, created.attempts))
    });
    let (job, attempts, applied) = wait_if_preferred(&app, &req, create).await?;
    let mut response = if replayed {
        HttpResponse::Ok()
    } else {
        HttpResponse::Created()
    };
    response.insert_header((header::LOCATION, job_location(&job.id)));
    response.insert_header((header::VARY, "Prefer"));
    if replayed {
        response.insert_header(("Idempotent-Replayed", "true"));
    }
    if let Some(applied) = applied {
        response.insert_header(("Preference-Applied", applied));
    }
    Ok(response.json(JobView::new(&job, &attempts, caller.0.role.is_staff())))
}

/// Parses a job id from the path; anything else is simply not found.
pub fn job_id(raw: &str) -> Result<JobId, ApiError> {
    JobId::parse(raw).ok_or_else(ApiError::not_found)
}

/// A job with its attempts.
#[utoipa::path(
    get, path = "/api/v1/jobs/{id}", tag = "jobs",
    params(
        ("id" = String, Path, description = "Job id"),
        ("Prefer" = Option<String>, Header, description = "`wait=N` (RFC 7240): answer once the job is finished or N seconds have passed, at most `server.max_wait_seconds`"),
    ),
    responses(
        (status = 200, body = JobView,
            headers(("Preference-Applied" = String, description = "`wait=N` when a wait was honoured"))),
        (status = 400, description = "A query parameter: this path takes none", body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job, or another owner's", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_job(
    app: web::Data<App>,
    caller: Caller,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    no_query(&req)?;
    let id = job_id(&path)?;
    let (job, attempts, applied) =
        wait_if_preferred(&app, &req, async { Ok(app.job_for(&caller.0, &id).await?) }).await?;
    let mut response = HttpResponse::Ok();
    response.insert_header((header::VARY, "Prefer"));
    if let Some(applied) = applied {
        response.insert_header(("Preference-Applied", applied));
    }
    Ok(response.json(JobView::new(&job, &attempts, caller.0.role.is_staff())))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Page size, 1-100 (default 20).
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<i64>,
    /// Return jobs older than this job id (from `next`).
    #[param(
        pattern = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    pub before: Option<String>,
}

/// The caller's jobs, newest first.
#[utoipa::path(
    get, path = "/api/v1/jobs", tag = "jobs",
    params(ListQuery),
    responses(
        (status = 200, body = JobPage),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list_jobs(
    app: web::Data<App>,
    caller: Caller,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let query: ListQuery = parse_query(&req)?;
    let limit = page_limit(query.limit, 20, 100)?;
    let before = query_id(query.before, "before", "a job id", JobId::parse)?;
    let read = app.list_jobs(&caller.0, before, limit + 1).await?;
    let (jobs, next) = keyset_page(read, limit, |last| {
        format!("/api/v1/jobs?limit={limit}&before={}", last.id)
    });
    Ok(HttpResponse::Ok().json(JobPage {
        jobs: jobs.iter().map(JobSummary::from).collect(),
        next,
    }))
}

/// Start a new attempt (a retry or a fallback) on a job.
#[utoipa::path(
    post, path = "/api/v1/jobs/{id}/attempts", tag = "jobs",
    params(("id" = String, Path, description = "Job id")),
    request_body(content = StartAttemptRequest, description = "Optional; an empty body picks the next untried provider"),
    responses(
        (status = 201, description = "Queued", body = AttemptView, headers(("Location" = String))),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`attempt-in-flight` (names the blocking attempt), `job-finished`, or `chain-exhausted`", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "A body that is not application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Provider not in the task's chain, or a body of the wrong shape", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn start_attempt(
    app: web::Data<App>,
    caller: Caller,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body: StartAttemptRequest = json_body(
        &req,
        payload,
        BodyRules::of(&app.config().server),
        EmptyBody::Is(StartAttemptRequest::default()),
    )
    .await?;
    let job_id = job_id(&path)?;
    let attempt = app.start_attempt(&caller.0, &job_id, body.provider).await?;
    Ok(HttpResponse::Created()
        .insert_header((header::LOCATION, job_location(&job_id)))
        .json(AttemptView::from(&attempt)))
}

/// Cancel a job: it becomes `cancelled` and takes no new attempt; a queued
/// attempt is withdrawn unsent; one already sent cannot be recalled, and
/// its late answer goes to the race log (docs/design.md, "Cancelling").
#[utoipa::path(
    post, path = "/api/v1/jobs/{id}/cancel", tag = "jobs",
    params(("id" = String, Path, description = "Job id")),
    responses(
        (status = 200, description = "The job, cancelled. Cancelling a cancelled job answers the same again (`Idempotent-Replayed: true`) and changes nothing.", body = JobView,
            headers(("Idempotent-Replayed" = String, description = "`true` when the job had been cancelled already"))),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job of the caller's", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`job-finished`: it succeeded or failed already and keeps its outcome", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database busy; retry", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn cancel_job(
    app: web::Data<App>,
    caller: Caller,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let job_id = job_id(&path)?;
    let cancelled = app.cancel_job(&caller.0, &job_id).await?;
    let mut response = HttpResponse::Ok();
    if !cancelled.changed {
        response.insert_header(("Idempotent-Replayed", "true"));
    }
    Ok(response.json(JobView::new(
        &cancelled.job,
        &cancelled.attempts,
        caller.0.role.is_staff(),
    )))
}
