//! `POST /api/v1/callbacks/attempts/{id}`: a provider's late answer, signed
//! with the attempt's secret. A bad signature is 401 and changes nothing; a
//! good one goes through the same compare-and-swap as any answer.

use actix_web::{web, HttpRequest, HttpResponse};

use super::body::limited_body;
use super::error::ApiError;
use super::views::Problem;
use crate::app::callbacks::{CallbackBody, CallbackOutcome};
use crate::app::App;
use crate::domain::AttemptId;

/// Receive a provider's late answer for an attempt.
#[utoipa::path(
    post, path = "/api/v1/callbacks/attempts/{id}", tag = "callbacks",
    params(
        ("id" = String, Path, description = "Attempt id"),
        ("X-Onejob-Signature" = String, Header, description = "`sha256=` + hex HMAC-SHA256 of the body under the attempt's secret"),
    ),
    request_body = CallbackBody,
    responses(
        (status = 200, body = CallbackOutcome),
        (status = 401, description = "Missing or wrong signature; nothing changed", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Callbacks are off, or no such attempt", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body larger than `server.body_limit_bytes`", body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn receive(
    app: web::Data<App>,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = limited_body(&req, payload, app.config().server.body_limit_bytes).await?;
    let attempt_id = AttemptId::parse(&path).ok_or_else(ApiError::not_found)?;
    let signature = req
        .headers()
        .get("X-Onejob-Signature")
        .and_then(|v| v.to_str().ok());
    let applied = app.receive_callback(&attempt_id, &body, signature).await?;
    Ok(HttpResponse::Ok().json(CallbackOutcome {
        outcome: applied.label().to_owned(),
    }))
}
