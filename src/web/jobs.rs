//! `/api/v1/jobs`: create (idempotent), read, list, and start a new attempt.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use utoipa::IntoParams;

use super::auth::Caller;
use super::body::{json_body, parse_query, EmptyBody};
use super::error::{ApiError, ProblemType};
use super::intake::{job_action_problem, prepare_job, require_allowed, require_in_chain};
use super::views::{
    AttemptView, CreateJobRequest, JobPage, JobSummary, JobView, Problem, StartAttemptRequest,
};
use super::AppState;
use crate::domain::{IdempotencyKey, IdempotencyKeyError, JobId};
use crate::qualify;
use crate::store::attempts::{self as attempt_store};
use crate::store::jobs::{self as job_store, CreateOutcome};
use crate::store::models::Job;
use crate::store::users::User;

fn idempotency_key(req: &HttpRequest) -> Result<IdempotencyKey, ApiError> {
    let raw = req.headers().get("Idempotency-Key").ok_or_else(|| {
        ApiError::new(
            ProblemType::MissingIdempotencyKey,
            IdempotencyKeyError::Missing.to_string(),
        )
    })?;
    IdempotencyKey::parse_bytes(raw.as_bytes())
        .map_err(|e| ApiError::new(ProblemType::InvalidIdempotencyKey, e.to_string()))
}

/// A job is visible to its owner and to support staff; to anyone else it does
/// not exist (404, never 403, so ids leak nothing).
pub fn visible_to(job: &Job, user: &User) -> bool {
    job.owner_id == user.id || user.role.is_staff()
}

fn location(job_id: &str) -> String {
    format!("/api/v1/jobs/{job_id}")
}

/// Create a job under an idempotency key.
#[utoipa::path(
    post, path = "/api/v1/jobs", tag = "jobs",
    request_body = CreateJobRequest,
    params(("Idempotency-Key" = String, Header, description = "1-255 printable ASCII characters; the same key and payload return the same job")),
    responses(
        (status = 201, description = "Created; `Location` names the job", body = JobView),
        (status = 200, description = "Replay of an earlier request with the same key and payload; header `Idempotent-Replayed: true`", body = JobView),
        (status = 400, description = "Missing or malformed Idempotency-Key, or malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid bearer token", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The key was used with a different payload (`idempotency-key-reused`)", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid body, unknown task or provider, bad input; the key is not reserved", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database busy; retry with the same key", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn create_job(
    state: web::Data<AppState>,
    caller: Caller,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let key = idempotency_key(&req)?;
    let body: CreateJobRequest = json_body(
        &req,
        payload,
        state.config.server.body_limit_bytes,
        EmptyBody::Refuse,
    )
    .await?;
    let new_job = prepare_job(&state.config, &state.tasks, &caller.0.id, key, body)?;
    let outcome = state
        .store
        .run(move |conn| job_store::create_job(conn, &new_job))
        .await?;
    let (job, created) = match outcome {
        CreateOutcome::Created(job) => (job, true),
        CreateOutcome::Replayed(job) => (job, false),
        CreateOutcome::KeyReused { existing_job_id } => {
            return Err(ApiError::new(
                ProblemType::IdempotencyKeyReused,
                "this idempotency key already created a job with a different payload; use a new key for a new job",
            )
            .with("job_id", existing_job_id.clone())
            .with("job", location(&existing_job_id)));
        }
    };
    if created {
        state.wake_worker();
        tracing::info!(job_id = %job.id, "job created");
    }
    let job_id = job.id.clone();
    let attempts = state
        .store
        .run(move |conn| job_store::attempts_of(conn, &job_id))
        .await?;
    let view = JobView::new(&job, &attempts);
    let mut response = if created {
        HttpResponse::Created()
    } else {
        HttpResponse::Ok()
    };
    response.insert_header((header::LOCATION, location(&job.id)));
    if !created {
        response.insert_header(("Idempotent-Replayed", "true"));
    }
    Ok(response.json(view))
}

async fn load_visible_job(
    state: &AppState,
    caller: &Caller,
    raw_id: &str,
) -> Result<(Job, Vec<crate::store::models::Attempt>), ApiError> {
    let job_id = JobId::parse(raw_id)
        .ok_or_else(ApiError::not_found)?
        .to_string();
    let (job, attempts) = state
        .store
        .run(move |conn| {
            let job = job_store::get_job(conn, &job_id)?;
            let attempts = job_store::attempts_of(conn, &job_id)?;
            Ok((job, attempts))
        })
        .await?;
    if !visible_to(&job, &caller.0) {
        return Err(ApiError::not_found());
    }
    Ok((job, attempts))
}

/// A job with its attempts.
#[utoipa::path(
    get, path = "/api/v1/jobs/{id}", tag = "jobs",
    params(("id" = String, Path, description = "Job id")),
    responses(
        (status = 200, body = JobView),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job, or another owner's", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_job(
    state: web::Data<AppState>,
    caller: Caller,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let (job, attempts) = load_visible_job(&state, &caller, &path).await?;
    Ok(HttpResponse::Ok().json(JobView::new(&job, &attempts)))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Page size, 1-100 (default 20).
    pub limit: Option<i64>,
    /// Return jobs older than this job id (from `next`).
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
    state: web::Data<AppState>,
    caller: Caller,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let query: ListQuery = parse_query(&req)?;
    let limit = query.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::new(
            ProblemType::InvalidQuery,
            "`limit` must be between 1 and 100",
        ));
    }
    let before = match query.before {
        Some(raw) => Some(
            JobId::parse(&raw)
                .ok_or_else(|| {
                    ApiError::new(ProblemType::InvalidQuery, "`before` must be a job id")
                })?
                .to_string(),
        ),
        None => None,
    };
    let owner = caller.0.id.clone();
    let mut jobs = state
        .store
        .run(move |conn| job_store::list_jobs(conn, &owner, before.as_deref(), limit + 1))
        .await?;
    let more = jobs.len() as i64 > limit;
    jobs.truncate(limit as usize);
    let next = match (more, jobs.last()) {
        (true, Some(last)) => Some(format!("/api/v1/jobs?limit={limit}&before={}", last.id)),
        _ => None,
    };
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
        (status = 201, description = "Queued", body = AttemptView),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`attempt-in-flight` (names the blocking attempt), `job-finished`, or `chain-exhausted`", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Provider not in the task's chain", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn start_attempt(
    state: web::Data<AppState>,
    caller: Caller,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body: StartAttemptRequest = json_body(
        &req,
        payload,
        state.config.server.body_limit_bytes,
        EmptyBody::AsDefault,
    )
    .await?;
    let (job, _) = load_visible_job(&state, &caller, &path).await?;
    let chain = state
        .config
        .task(&job.task)
        .map(|t| t.providers.clone())
        .unwrap_or_default();
    require_in_chain(&job.task, &chain, body.provider.as_ref())?;
    let (config, tasks, task, requested) = (
        state.config.clone(),
        state.tasks.clone(),
        job.task.clone(),
        job.requested_provider.clone(),
    );
    let (order, skipped) = state
        .store
        .run(move |conn| {
            qualify::allowed_for_job(conn, &config, &tasks, &task, requested.as_deref())
        })
        .await?;
    require_allowed(body.provider.as_deref(), &order, &skipped)?;
    // Staff acting on another owner's job are audited.
    let actor = (job.owner_id != caller.0.id).then(|| caller.0.id.clone());
    let job_id = job.id.clone();
    let result = state
        .store
        .run(move |conn| {
            Ok(attempt_store::start_attempt(
                conn,
                &job_id,
                body.provider.as_deref(),
                &order,
                actor.as_deref(),
            ))
        })
        .await?;
    let attempt = result.map_err(job_action_problem)?;
    state.wake_worker();
    tracing::info!(job_id = %job.id, attempt_id = %attempt.id, provider = %attempt.provider, "attempt queued");
    Ok(HttpResponse::Created()
        .insert_header((header::LOCATION, location(&job.id)))
        .json(AttemptView::from(&attempt)))
}
