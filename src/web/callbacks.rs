//! `POST /api/v1/callbacks/attempts/{id}`: a provider's late answer, signed
//! with the attempt's secret. A bad signature is 401 and changes nothing; a
//! good one goes through the same compare-and-swap as any answer.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::error::{ApiError, ProblemType};
use super::views::Problem;
use super::AppState;
use crate::callbacks::CallbackKey;
use crate::domain::AttemptId;
use crate::qualify;
use crate::store::attempts::{self as attempt_store, Completion};
use crate::store::jobs as job_store;

/// A callback's body: exactly one of `result` and `error`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CallbackBody {
    /// The answer (checked against the task's output schema).
    #[schema(value_type = Option<Object>)]
    pub result: Option<Value>,
    /// A definite failure reported by the provider.
    pub error: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CallbackOutcome {
    /// `won`, `lost`, `failed` or `ignored` (the attempt was already finished).
    pub outcome: String,
}

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
        (status = 422, body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn receive(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let key = state
        .config
        .server
        .callback_secret_env
        .as_deref()
        .and_then(CallbackKey::from_env)
        .ok_or_else(ApiError::not_found)?;
    let attempt_id = AttemptId::parse(&path)
        .ok_or_else(ApiError::not_found)?
        .to_string();
    let signature = req
        .headers()
        .get("X-Onejob-Signature")
        .and_then(|v| v.to_str().ok());
    if !key.verify(&attempt_id, &body, signature) {
        tracing::warn!(%attempt_id, "callback refused: bad signature");
        return Err(ApiError::new(
            ProblemType::InvalidSignature,
            "the signature does not match this attempt and body",
        ));
    }
    let parsed: CallbackBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            ProblemType::InvalidBody,
            format!("the callback body is not valid: {e}"),
        )
    })?;
    let (config, tasks) = (state.config.clone(), state.tasks.clone());
    let outcome = state
        .store
        .run(move |conn| {
            let attempt = attempt_store::get_attempt(conn, &attempt_id)?;
            let job = job_store::get_job(conn, &attempt.job_id)?;
            let failure = match (parsed.result, parsed.error) {
                (Some(result), None) => match tasks.get(&job.task).map(|t| t.check_output(&result))
                {
                    Some(Err(reason)) => format!("invalid_output: {reason}"),
                    _ => {
                        let completion =
                            attempt_store::complete_success(conn, &attempt_id, &result)?;
                        return Ok(Ok(match completion {
                            Completion::Won => "won",
                            Completion::Lost { .. } => "lost",
                            Completion::Ignored(_) => "ignored",
                        }));
                    }
                },
                (None, Some(error)) => error,
                _ => return Ok(Err(())),
            };
            let (allowed, skipped) = qualify::allowed_for_job(
                conn,
                &config,
                &tasks,
                &job.task,
                job.requested_provider.as_deref(),
            )?;
            attempt_store::complete_failure(conn, &attempt_id, &failure, &allowed, &skipped)?;
            Ok(Ok("failed"))
        })
        .await?
        .map_err(|()| {
            ApiError::new(
                ProblemType::InvalidBody,
                "send exactly one of `result` and `error`",
            )
        })?;
    state.wake_worker();
    Ok(HttpResponse::Ok().json(CallbackOutcome {
        outcome: outcome.to_owned(),
    }))
}
