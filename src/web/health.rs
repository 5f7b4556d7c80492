//! Liveness and readiness.

use actix_web::{web, HttpResponse};
use diesel::connection::SimpleConnection;

use super::error::{ApiError, ProblemType};
use super::views::{Health, Problem};
use super::AppState;

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "health", responses((status = 200, body = Health)))]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(Health {
        status: "ok".into(),
    })
}

/// The database answers.
#[utoipa::path(
    get, path = "/readyz", tag = "health",
    responses((status = 200, body = Health), (status = 503, body = Problem, content_type = "application/problem+json"))
)]
pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    state
        .store
        .run(|conn| Ok(conn.batch_execute("SELECT 1")))
        .await?
        .map_err(|e| {
            tracing::warn!(error = %e, "readiness check failed");
            ApiError::new(
                ProblemType::ServiceUnavailable,
                "the database did not answer",
            )
        })?;
    Ok(HttpResponse::Ok().json(Health {
        status: "ready".into(),
    }))
}
