//! Liveness and readiness.

use actix_web::{web, HttpResponse};

use super::auth::Caller;
use super::error::{ApiError, ProblemType};
use super::views::{Health, Problem};
use crate::app::App;

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
pub async fn readyz(app: web::Data<App>) -> Result<HttpResponse, ApiError> {
    app.database_ready().await.map_err(|e| {
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

/// Prometheus metrics in the OpenMetrics text format (admins' API tokens).
#[utoipa::path(
    get, path = "/metrics", tag = "health",
    responses(
        (status = 200, description = "OpenMetrics text exposition format", content_type = "application/openmetrics-text"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 403, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn metrics(app: web::Data<App>, caller: Caller) -> Result<HttpResponse, ApiError> {
    crate::app::require_admin(&caller.0)?;
    metrics_text(app).await
}

/// The same text on `[server] metrics_bind`, where the address is the
/// access control (see `web::metrics_routes`).
pub async fn open_metrics(app: web::Data<App>) -> Result<HttpResponse, ApiError> {
    metrics_text(app).await
}

async fn metrics_text(app: web::Data<App>) -> Result<HttpResponse, ApiError> {
    let text = app.scrape_metrics().await?;
    // What the encoder writes (counters' samples end in `_total` under a
    // family without it, and `# EOF` ends the text): labelled as Prometheus'
    // older text format, a scraper would take every counter as untyped.
    Ok(HttpResponse::Ok()
        .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(text))
}
