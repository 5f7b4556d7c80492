//! A provider's late answer by callback, signed with the attempt's secret
//! over a timestamp and the body. A bad signature, or one older than
//! `server.callback_window_seconds`, changes nothing; a good one is held to
//! the task's contract and applied like any other outcome (a repeat of one
//! already applied writes nothing new).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::{App, AppError, AppResult};
use crate::domain::outcome::{redacted, Reason};
use crate::domain::{Applied, AttemptId, CallbackRefusal, Outcome, Timestamp};

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

/// What the callback did.
#[derive(Debug, Serialize, ToSchema)]
pub struct CallbackOutcome {
    /// `won`, `lost`, `failed`, `unknown` or `ignored` (the attempt was already finished).
    pub outcome: String,
}

impl App {
    /// Verifies, parses and applies a callback for `attempt_id`, signed at
    /// `timestamp` (Unix seconds, `X-Onejob-Timestamp`).
    pub async fn receive_callback(
        &self,
        attempt_id: &AttemptId,
        timestamp: Option<&str>,
        body: &[u8],
        signature: Option<&str>,
    ) -> AppResult<Applied> {
        // Callbacks off: the route does not exist.
        let callbacks = self.config().callbacks.as_ref().ok_or(AppError::NotFound)?;
        let window = self.config().server.callback_window_seconds;
        let now = Timestamp::now();
        match callbacks
            .key
            .verify(attempt_id.as_str(), timestamp, body, signature, now, window)
        {
            Ok(()) => {}
            Err(CallbackRefusal::BadSignature) => {
                tracing::warn!(%attempt_id, "callback refused: bad signature");
                return Err(AppError::InvalidSignature);
            }
            Err(CallbackRefusal::Expired {
                age_seconds,
                window_seconds,
            }) => {
                tracing::warn!(%attempt_id, age_seconds, "callback refused: signed outside the window");
                return Err(AppError::CallbackExpired {
                    age_seconds,
                    window_seconds,
                });
            }
        }
        crate::domain::json_depth::check_nesting(body, self.config().server.max_json_depth)?;
        // One JSON, one reading: a result that names a member twice is
        // refused, as every body is.
        crate::domain::json_text::check_unique_names(body).map_err(|refusal| {
            AppError::invalid_body(format!("the callback body is not valid: {refusal}"))
        })?;
        let parsed: CallbackBody = serde_json::from_slice(body)
            .map_err(|e| AppError::invalid_body(format!("the callback body is not valid: {e}")))?;
        // The URL names the attempt alone: its owner is found first.
        let key = self.locate_attempt(attempt_id).await?;
        let (attempt, job) = self.attempt_and_job(&key).await?;
        let outcome = match (parsed.result, parsed.error) {
            (Some(result), None) => Outcome::Succeeded(result),
            // As for an error answered at once: the owner sees the summary,
            // staff the provider's words, secrets masked.
            (None, Some(error)) => {
                let secrets = [
                    self.config()
                        .provider(&attempt.provider)
                        .and_then(|p| p.api_key.as_ref())
                        .map(|key| key.expose().to_owned()),
                    Some(
                        callbacks
                            .key
                            .attempt_secret(attempt_id.as_str())
                            .expose()
                            .to_owned(),
                    ),
                ];
                let detail = redacted(&error, secrets.iter().flatten().map(String::as_str));
                Outcome::Failed(
                    Reason::new("the provider reported a failure by callback").with_detail(&detail),
                )
            }
            _ => {
                return Err(AppError::invalid_body(
                    "send exactly one of `result` and `error`",
                ))
            }
        };
        let outcome = match self.config().contracts.get(&job.task) {
            Some(contract) => contract.judge(outcome),
            None => outcome,
        };
        self.apply_outcome(&key, &attempt.provider, outcome, None)
            .await
    }
}
