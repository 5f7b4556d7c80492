//! The chat doors' one error: what went wrong (status, code, message, the
//! member at fault), whether the SDK should retry, and the job it concerns,
//! decided once for every door and written in each door's format by its
//! [`Door`]: OpenAI's `{"error": {"message", "type", "param", "code"}}`,
//! Anthropic's `{"type": "error", "error": {"type", "message"}}`.
//!
//! The retry rule is carried by headers every SDK reads: `x-should-retry`
//! and `Retry-After`. A wait that ends before the job does, or an unknown
//! outcome, is a 503 the SDK retries, and its retry rejoins the job; a key
//! reused for another body is a 409 it must not retry.

use std::marker::PhantomData;

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use serde_json::Value;

use crate::app::streams::FollowRefused;
use crate::app::{AppError, Job};
use crate::chat::{anthropic, openai_chat};
use crate::web::error::{ApiError, ProblemType};

/// How long a client should wait before rejoining a job still in flight.
pub const RETRY_IN_FLIGHT_SECONDS: u64 = 1;
/// How long before asking again about an unknown outcome, which waits for a
/// person: long enough not to hammer, inside the SDKs' 60 s cap.
pub const RETRY_UNKNOWN_SECONDS: u64 = 30;

/// Whether the SDK should retry an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// `x-should-retry: false`: the same request gets the same answer.
    Never,
    /// `Retry-After: n` and `x-should-retry: true`.
    After(u64),
    /// The SDK's own rule for the status.
    SdkDefault,
}

/// A chat door's wire format for errors, and how its SDK is shown sending
/// an `Idempotency-Key`.
pub trait Door: Send + Sync + 'static {
    /// What one request makes, in the 400 for a request without a key
    /// (`chat completion`, `message`, `response`).
    const REQUEST: &'static str;
    /// The SDK's call that takes the key (`client.messages.create`).
    const SDK_CALL: &'static str;
    /// The SDK's name (`OpenAI`, `Anthropic`).
    const SDK: &'static str;

    /// The error's body in this door's format.
    fn body(error: &ErrorDetail) -> Value;
}

/// `/v1/chat/completions`: OpenAI's error body.
#[derive(Debug)]
pub enum ChatCompletions {}

impl Door for ChatCompletions {
    const REQUEST: &'static str = "chat completion";
    const SDK_CALL: &'static str = "client.chat.completions.create";
    const SDK: &'static str = "OpenAI";

    fn body(error: &ErrorDetail) -> Value {
        openai_body(error)
    }
}

/// `/v1/responses`: OpenAI's error body.
#[derive(Debug)]
pub enum Responses {}

impl Door for Responses {
    const REQUEST: &'static str = "response";
    const SDK_CALL: &'static str = "client.responses.create";
    const SDK: &'static str = "OpenAI";

    fn body(error: &ErrorDetail) -> Value {
        openai_body(error)
    }
}

/// `/v1/messages`: Anthropic's error body, its `type` from the status.
#[derive(Debug)]
pub enum Messages {}

impl Door for Messages {
    const REQUEST: &'static str = "message";
    const SDK_CALL: &'static str = "client.messages.create";
    const SDK: &'static str = "Anthropic";

    fn body(error: &ErrorDetail) -> Value {
        let body = anthropic::error_body(error.status.as_u16(), &error.message);
        serde_json::to_value(body).expect("an error body serializes")
    }
}

fn openai_body(error: &ErrorDetail) -> Value {
    let body = openai_chat::OpenAiErrorBody {
        error: openai_chat::WireErrorDetail {
            message: Some(error.message.to_string()),
            kind: Some(error.kind.to_owned()),
            param: error.param.as_deref().map(str::to_owned),
            code: error.code.map(|code| Value::String(code.to_owned())),
        },
    };
    serde_json::to_value(body).expect("an error body serializes")
}

/// What went wrong, whichever door says it.
#[derive(Debug, Clone)]
pub struct ErrorDetail {
    pub status: StatusCode,
    pub message: Box<str>,
    /// OpenAI's error `type` (Anthropic's is read from the status).
    pub kind: &'static str,
    pub code: Option<&'static str>,
    pub param: Option<Box<str>>,
    pub retry: Retry,
    pub job_id: Option<Box<str>>,
}

/// An error of the door `D`.
#[derive(Debug)]
pub struct ChatError<D: Door> {
    pub detail: ErrorDetail,
    door: PhantomData<D>,
}

impl<D: Door> ChatError<D> {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        let kind = match status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            409 => "conflict_error",
            500.. => "server_error",
            _ => "invalid_request_error",
        };
        Self {
            detail: ErrorDetail {
                status,
                message: message.into().into_boxed_str(),
                kind,
                code: None,
                param: None,
                retry: Retry::SdkDefault,
                job_id: None,
            },
            door: PhantomData,
        }
    }

    /// The same error, said by another door.
    pub fn to_door<E: Door>(self) -> ChatError<E> {
        ChatError {
            detail: self.detail,
            door: PhantomData,
        }
    }

    pub fn code(mut self, code: &'static str) -> Self {
        self.detail.code = Some(code);
        self
    }

    pub fn param(mut self, param: impl Into<String>) -> Self {
        self.detail.param = Some(param.into().into_boxed_str());
        self
    }

    pub fn retry(mut self, retry: Retry) -> Self {
        self.detail.retry = retry;
        self
    }

    pub fn kind(mut self, kind: &'static str) -> Self {
        self.detail.kind = kind;
        self
    }

    pub fn job(mut self, job: &Job) -> Self {
        self.detail.job_id = Some(job.id.to_string().into_boxed_str());
        self
    }

    /// The error document.
    pub fn body(&self) -> Value {
        D::body(&self.detail)
    }

    /// A request of the wrong shape: 400, not retried.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
            .code("invalid_request")
            .retry(Retry::Never)
    }

    pub fn model_not_found(model: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            format!(
                "The model `{model}` does not exist: it is not a chat route of this server. \
                 GET /v1/models lists them."
            ),
        )
        .code("model_not_found")
        .param("model")
        .retry(Retry::Never)
    }

    pub fn not_found(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            format!("Unrecognized request URL ({path}). This server answers /v1/chat/completions, /v1/responses, /v1/messages and /v1/models."),
        )
        .code("unknown_url")
        .retry(Retry::Never)
    }

    /// The `429` for a follower past `server.max_followers_per_job`: the
    /// SDKs retry it after `Retry-After`, under the same key, and the retry
    /// follows the same stream once there is room (followers come and go
    /// with their clients).
    pub fn too_many_followers(job: &Job, refused: &FollowRefused) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!("Job {}: {refused}.", job.id),
        )
        .code("too_many_followers")
        .kind("rate_limit_error")
        .retry(Retry::After(1))
        .job(job)
    }

    /// 405 for a method the path does not declare; `Allow` is set by the caller.
    pub fn method_not_allowed(method: &str, allow: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} is not allowed here; allowed: {allow}"),
        )
        .code("method_not_allowed")
        .retry(Retry::Never)
    }

    /// A 404 the SDKs do not retry.
    pub fn not_found_error(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message).retry(Retry::Never)
    }

    /// A 409 the SDKs do not retry.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, message).retry(Retry::Never)
    }

    fn key_reused() -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "This Idempotency-Key already made a request with a different body. \
             Use a new key for a new request.",
        )
        .code("idempotency_key_reused")
        .retry(Retry::Never)
    }

    /// The 400 for a request without a key, showing how the door's SDK
    /// sends one.
    fn missing_key() -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            format!(
                "onejob needs an Idempotency-Key header on every {request}, so that a retry \
                 rejoins the same request instead of calling the provider again. Send one key \
                 per intent, the same on every retry; with the {sdk} SDK: \
                 {call}(..., extra_headers={{\"Idempotency-Key\": \"<a key for this request>\"}})",
                request = D::REQUEST,
                sdk = D::SDK,
                call = D::SDK_CALL,
            ),
        )
        .code("missing_idempotency_key")
        .param("Idempotency-Key")
        .retry(Retry::Never)
    }

    /// A refusal the web layer made itself (the token, the body, the key),
    /// or an application error with nothing more to say than its problem
    /// type.
    fn of_problem(problem: ProblemType, detail: String) -> Self {
        let status = problem.status();
        match problem {
            ProblemType::Unauthorized => Self::new(status, detail)
                .code("invalid_api_key")
                .retry(Retry::Never),
            ProblemType::MissingIdempotencyKey => Self::missing_key(),
            ProblemType::InvalidIdempotencyKey => Self::new(status, detail)
                .code("invalid_idempotency_key")
                .param("Idempotency-Key")
                .retry(Retry::Never),
            ProblemType::IdempotencyKeyReused => Self::key_reused(),
            ProblemType::MalformedJson => Self::new(status, detail)
                .code("invalid_json")
                .retry(Retry::Never),
            ProblemType::InvalidBody | ProblemType::InvalidInput => Self::invalid_request(detail),
            ProblemType::UnsupportedMediaType => Self::new(status, detail)
                .code("unsupported_media_type")
                .retry(Retry::Never),
            ProblemType::PayloadTooLarge => Self::new(status, detail)
                .code("payload_too_large")
                .retry(Retry::Never),
            ProblemType::ServiceUnavailable => Self::new(status, detail)
                .code("service_unavailable")
                .retry(Retry::After(1)),
            ProblemType::Internal => Self::new(status, detail).code("internal_error"),
            ProblemType::NotFound => Self::new(status, detail).code("not_found"),
            _ => Self::new(status, detail),
        }
    }
}

impl<D: Door> std::fmt::Display for ChatError<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.detail.status, self.detail.message)
    }
}

impl<D: Door + std::fmt::Debug> ResponseError for ChatError<D> {
    fn status_code(&self) -> StatusCode {
        self.detail.status
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.detail.status);
        match self.detail.retry {
            Retry::Never => {
                response.insert_header(("x-should-retry", "false"));
            }
            Retry::After(seconds) => {
                response.insert_header((header::RETRY_AFTER, seconds.to_string()));
                response.insert_header(("x-should-retry", "true"));
            }
            Retry::SdkDefault => {}
        }
        if self.detail.status == StatusCode::UNAUTHORIZED {
            response.insert_header((header::WWW_AUTHENTICATE, "Bearer realm=\"onejob\""));
        }
        if let Some(job_id) = &self.detail.job_id {
            response.insert_header(("X-Onejob-Job-Id", &**job_id));
        }
        response.json(self.body())
    }
}

impl<D: Door> From<ApiError> for ChatError<D> {
    fn from(error: ApiError) -> Self {
        Self::of_problem(error.problem, error.detail)
    }
}

impl<D: Door> From<AppError> for ChatError<D> {
    fn from(error: AppError) -> Self {
        match error {
            AppError::UnknownTask { task, .. } => Self::model_not_found(&task),
            AppError::InvalidInput { detail, field } | AppError::InvalidBody { detail, field } => {
                let refusal = Self::invalid_request(detail);
                match field {
                    Some(field) => refusal.param(field.trim_start_matches("input.")),
                    None => refusal,
                }
            }
            AppError::KeyReused { .. } => Self::key_reused(),
            AppError::BudgetExceeded(refused) => {
                Self::new(StatusCode::TOO_MANY_REQUESTS, refused.to_string())
                    .code("budget_exceeded")
                    .kind("insufficient_quota")
                    .retry(Retry::Never)
            }
            other => ApiError::from(other).into(),
        }
    }
}

impl<D: Door> From<crate::chat::Refused> for ChatError<D> {
    fn from(refused: crate::chat::Refused) -> Self {
        Self::invalid_request(refused.message).param(refused.param)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_missing_key_error_shows_how_each_sdk_sends_one_and_is_not_retried() {
        let error = ChatError::<ChatCompletions>::from(ApiError::new(
            ProblemType::MissingIdempotencyKey,
            "x",
        ));
        assert_eq!(error.detail.status, StatusCode::BAD_REQUEST);
        assert!(error
            .detail
            .message
            .contains("client.chat.completions.create(..., extra_headers={\"Idempotency-Key\""));
        assert_eq!(error.detail.retry, Retry::Never);
        let body = error.body();
        assert_eq!(body["error"]["code"], "missing_idempotency_key");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        let error =
            ChatError::<Messages>::from(ApiError::new(ProblemType::MissingIdempotencyKey, "x"));
        let body = error.body();
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("every message"), "{message}");
        assert!(message.contains("client.messages.create("), "{message}");
    }

    #[test]
    fn a_reused_key_is_a_409_the_sdk_does_not_retry() {
        let error =
            ChatError::<Messages>::from(ApiError::new(ProblemType::IdempotencyKeyReused, "x"));
        assert_eq!(error.detail.status, StatusCode::CONFLICT);
        let response = error.error_response();
        assert_eq!(response.headers().get("x-should-retry").unwrap(), "false");
    }

    #[test]
    fn a_busy_database_is_a_503_with_retry_after() {
        let error = ChatError::<ChatCompletions>::from(ApiError::new(
            ProblemType::ServiceUnavailable,
            "busy",
        ));
        let response = error.error_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers().get(header::RETRY_AFTER).unwrap(), "1");
        assert_eq!(response.headers().get("x-should-retry").unwrap(), "true");
        let anthropic = ChatError::<ChatCompletions>::from(ApiError::new(
            ProblemType::ServiceUnavailable,
            "busy",
        ))
        .to_door::<Messages>();
        assert_eq!(anthropic.body()["error"]["type"], "overloaded_error");
    }
}
