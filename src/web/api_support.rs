//! Support and admin endpoints: abandon an unknown attempt, the unknown queue,
//! the race log.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use utoipa::IntoParams;

use super::auth::Caller;
use super::body::{json_body, page_limit, parse_query, query_id, BodyRules, EmptyBody};
use super::error::ApiError;
use super::views::{AbandonRequest, AttemptView, Problem, RaceView, UnknownAttemptView};
use crate::app::{require_staff, App};
use crate::domain::{AttemptId, Timestamp};

/// Abandon an attempt whose outcome is unknown (support/admin). The job may
/// then take a new attempt; a late result still goes through the CAS.
#[utoipa::path(
    post, path = "/api/v1/attempts/{id}/abandon", tag = "support",
    params(("id" = String, Path, description = "Attempt id")),
    request_body = AbandonRequest,
    responses(
        (status = 200, description = "Abandoned; written to the audit log", body = AttemptView),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not support or admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The attempt is not unknown (`attempt-not-unknown`)", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Missing, blank or too long reason", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn abandon_attempt(
    app: web::Data<App>,
    caller: Caller,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    // The role first: someone without it learns nothing from the body's checks.
    require_staff(&caller.0)?;
    let body: AbandonRequest = json_body(
        &req,
        payload,
        BodyRules::of(&app.config().server),
        EmptyBody::Refuse,
    )
    .await?;
    let attempt_id = AttemptId::parse(&path).ok_or_else(ApiError::not_found)?;
    let attempt = app
        .abandon_attempt(&caller.0, &attempt_id, &body.reason)
        .await?;
    Ok(HttpResponse::Ok().json(AttemptView::from(&attempt)))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct UnknownQuery {
    /// How many rows, 1-500 (default 100), oldest first.
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<i64>,
    /// Continue after this attempt (the last `attempt_id` of the previous page).
    #[param(
        pattern = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    pub after: Option<String>,
}

/// Attempts stuck in `unknown`, oldest first, a page at a time (support/admin).
#[utoipa::path(
    get, path = "/api/v1/admin/unknown", tag = "support",
    params(UnknownQuery),
    responses(
        (status = 200, body = Vec<UnknownAttemptView>),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 403, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn unknown_attempts(
    app: web::Data<App>,
    caller: Caller,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    require_staff(&caller.0)?;
    let query: UnknownQuery = parse_query(&req)?;
    let limit = page_limit(query.limit, 100, 500)?;
    let after = query_id(query.after, "after", "an attempt id", AttemptId::parse)?;
    let rows = app.unknown_queue(&caller.0, after, limit).await?;
    let now = Timestamp::now();
    Ok(HttpResponse::Ok().json(
        rows.iter()
            .map(|u| UnknownAttemptView::new(u, now))
            .collect::<Vec<_>>(),
    ))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct RaceQuery {
    /// How many rows, 1-1000 (default 100), newest first.
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
}

/// Discarded late results (admin).
#[utoipa::path(
    get, path = "/api/v1/admin/races", tag = "admin",
    params(RaceQuery),
    responses(
        (status = 200, body = Vec<RaceView>),
        (status = 400, description = "A query parameter out of range or unknown", body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 403, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn races(
    app: web::Data<App>,
    caller: Caller,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    crate::app::require_admin(&caller.0)?;
    let query: RaceQuery = parse_query(&req)?;
    let limit = page_limit(query.limit, 100, 1000)?;
    let rows = app.races(&caller.0, limit).await?;
    Ok(HttpResponse::Ok().json(rows.iter().map(RaceView::from).collect::<Vec<_>>()))
}
