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
        ("X-Onejob-Timestamp" = String, Header, description = "When the callback was signed, in Unix seconds; older than `server.callback_window_seconds` is refused"),
        ("X-Onejob-Signature" = String, Header, description = "`sha256=` + hex HMAC-SHA256, under the attempt's secret, of the timestamp, a dot and the body"),
    ),
    request_body = CallbackBody,
    responses(
        (status = 200, description = "Applied; a repeat of a callback already applied answers as the first did and writes nothing", body = CallbackOutcome),
        (status = 401, description = "Missing or wrong signature or timestamp (`invalid-signature`), or signed outside the window (`callback-expired`); nothing changed", body = Problem, content_type = "application/problem+json"),
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
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    let applied = app
        .receive_callback(
            &attempt_id,
            header("X-Onejob-Timestamp"),
            &body,
            header("X-Onejob-Signature"),
        )
        .await?;
    Ok(HttpResponse::Ok().json(CallbackOutcome {
        outcome: applied.label().to_owned(),
    }))
}
