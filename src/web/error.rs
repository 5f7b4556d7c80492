//! The HTTP form of errors. Every error leaves the API as RFC 9457
//! `application/problem+json` with a stable `type`; application errors are
//! worded here, in one place (not found → 404, busy → 503 with
//! `Retry-After`).

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use serde_json::{json, Map, Value};

use crate::app::AppError;
use crate::domain::ledger::BudgetLimit;

/// The stable problem types. The `type` URI is `/problems/<slug>`, which
/// the server also answers with a short description.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemType {
    Unauthorized,
    Forbidden,
    NotFound,
    MissingIdempotencyKey,
    InvalidIdempotencyKey,
    IdempotencyKeyReused,
    AttemptInFlight,
    JobFinished,
    AttemptNotUnknown,
    ChainExhausted,
    ProviderNotQualified,
    InvalidSignature,
    CallbackExpired,
    MalformedJson,
    InvalidBody,
    UnknownTask,
    UnknownProvider,
    InvalidInput,
    InvalidQuery,
    UnsupportedMediaType,
    PayloadTooLarge,
    NestingTooDeep,
    RequestTimeout,
    MethodNotAllowed,
    ServiceUnavailable,
    Internal,
    WebhooksNotConfigured,
    BudgetExceeded,
    WebhookEndpointLimit,
}

impl ProblemType {
    pub const ALL: [ProblemType; 29] = [
        Self::Unauthorized,
        Self::Forbidden,
        Self::NotFound,
        Self::MissingIdempotencyKey,
        Self::InvalidIdempotencyKey,
        Self::IdempotencyKeyReused,
        Self::AttemptInFlight,
        Self::JobFinished,
        Self::AttemptNotUnknown,
        Self::ChainExhausted,
        Self::ProviderNotQualified,
        Self::InvalidSignature,
        Self::CallbackExpired,
        Self::MalformedJson,
        Self::InvalidBody,
        Self::UnknownTask,
        Self::UnknownProvider,
        Self::InvalidInput,
        Self::InvalidQuery,
        Self::UnsupportedMediaType,
        Self::PayloadTooLarge,
        Self::NestingTooDeep,
        Self::RequestTimeout,
        Self::MethodNotAllowed,
        Self::ServiceUnavailable,
        Self::Internal,
        Self::WebhooksNotConfigured,
        Self::BudgetExceeded,
        Self::WebhookEndpointLimit,
    ];

    /// (slug, status, title, what it means)
    pub fn describe(self) -> (&'static str, StatusCode, &'static str, &'static str) {
        use StatusCode as S;
        match self {
            Self::Unauthorized => ("unauthorized", S::UNAUTHORIZED, "Authentication required",
                "Send `Authorization: Bearer <token>` with a token from `onejob users add` or `onejob users token`."),
            Self::Forbidden => ("forbidden", S::FORBIDDEN, "Not allowed for your role",
                "This action needs the support or admin role."),
            Self::NotFound => ("not-found", S::NOT_FOUND, "Not found",
                "No such resource is visible to you. Other owners' jobs are reported as not found."),
            Self::MissingIdempotencyKey => ("missing-idempotency-key", S::BAD_REQUEST, "Idempotency-Key header required",
                "Every request that creates a job carries an `Idempotency-Key` header: 1-255 printable ASCII characters."),
            Self::InvalidIdempotencyKey => ("invalid-idempotency-key", S::BAD_REQUEST, "Invalid Idempotency-Key",
                "The key must be 1-255 printable ASCII characters; the quoted-string form \"...\" is accepted."),
            Self::IdempotencyKeyReused => ("idempotency-key-reused", S::CONFLICT, "Idempotency key reused with a different payload",
                "This key already created a job with a different task, input, params or provider. Use a new key for a new job."),
            Self::AttemptInFlight => ("attempt-in-flight", S::CONFLICT, "An attempt is still in flight",
                "The job has an attempt that is queued, running or unknown. Wait for it, or have support abandon an unknown attempt."),
            Self::JobFinished => ("job-finished", S::CONFLICT, "The job is finished",
                "The job already succeeded or failed; it takes no more attempts."),
            Self::AttemptNotUnknown => ("attempt-not-unknown", S::CONFLICT, "Only an unknown attempt can be abandoned",
                "Abandoning is for attempts whose outcome is unknown."),
            Self::ChainExhausted => ("chain-exhausted", S::CONFLICT, "No untried provider left",
                "Every provider of the task's chain has been tried on this job; name a provider explicitly."),
            Self::ProviderNotQualified => ("provider-not-qualified", S::CONFLICT, "Provider not qualified for this task",
                "Only the job's primary provider and providers with a current passing qualification for the task may take a new attempt. Run `onejob qualify` or use the console's Providers page."),
            Self::InvalidSignature => ("invalid-signature", S::UNAUTHORIZED, "Invalid callback signature",
                "The callback's `X-Onejob-Signature` is missing or is not the HMAC-SHA256, under this attempt's secret, of `X-Onejob-Timestamp`, a dot and the body."),
            Self::CallbackExpired => ("callback-expired", S::UNAUTHORIZED, "Callback signed outside the window",
                "The callback is signed correctly, but its `X-Onejob-Timestamp` is further from this server's clock than `server.callback_window_seconds` (5 minutes by default). Sign each delivery with the current time."),
            Self::MalformedJson => ("malformed-json", S::BAD_REQUEST, "Malformed JSON",
                "The request body is not well-formed JSON."),
            Self::InvalidBody => ("invalid-body", S::UNPROCESSABLE_ENTITY, "Invalid request body",
                "The JSON does not have the documented shape."),
            Self::UnknownTask => ("unknown-task", S::UNPROCESSABLE_ENTITY, "Unknown task",
                "No task of that name is configured."),
            Self::UnknownProvider => ("unknown-provider", S::UNPROCESSABLE_ENTITY, "Provider not in the task's chain",
                "The provider must be one of the task's configured providers."),
            Self::InvalidInput => ("invalid-input", S::UNPROCESSABLE_ENTITY, "Input does not fit the task",
                "The input must be a JSON object with the task's required fields."),
            Self::InvalidQuery => ("invalid-query", S::BAD_REQUEST, "Invalid query parameters",
                "A query parameter is malformed or out of range."),
            Self::UnsupportedMediaType => ("unsupported-media-type", S::UNSUPPORTED_MEDIA_TYPE, "Unsupported media type",
                "Send the body as `Content-Type: application/json`."),
            Self::PayloadTooLarge => ("payload-too-large", S::PAYLOAD_TOO_LARGE, "Request body too large",
                "The body is larger than the configured limit (`server.body_limit_bytes`)."),
            Self::NestingTooDeep => ("nesting-too-deep", S::UNPROCESSABLE_ENTITY, "JSON nested too deeply",
                "The JSON nests more arrays and objects inside each other than the configured limit (`server.max_json_depth`, named in `limit`). Nothing was stored."),
            Self::RequestTimeout => ("request-timeout", S::REQUEST_TIMEOUT, "The request body arrived too slowly",
                "The body did not arrive within `server.body_timeout_ms` of the headers. Nothing was stored; the connection is closed."),
            Self::MethodNotAllowed => ("method-not-allowed", S::METHOD_NOT_ALLOWED, "Method not allowed",
                "The path exists but does not answer this method; the `Allow` header lists those it does."),
            Self::ServiceUnavailable => ("service-unavailable", S::SERVICE_UNAVAILABLE, "Temporarily unavailable",
                "The database could not serve the request in time. Retry with the same idempotency key."),
            Self::Internal => ("internal", S::INTERNAL_SERVER_ERROR, "Internal error",
                "Something failed on the server. Retrying with the same idempotency key is safe."),
            Self::WebhooksNotConfigured => ("webhooks-not-configured", S::CONFLICT, "Webhooks are not enabled on this server",
                "Endpoint secrets are derived from a server key that is not configured. An operator sets `webhooks.signing_key_env` (docs/configuration.md) to an environment variable holding at least 32 random bytes and restarts the server."),
            Self::WebhookEndpointLimit => ("webhook-endpoint-limit", S::CONFLICT, "Too many webhook endpoints",
                "The owner has as many endpoints as one may have (`webhooks.max_endpoints_per_owner`, 10 by default, named in `limit`). Nothing was registered; delete an endpoint first."),
            Self::BudgetExceeded => ("budget-exceeded", S::TOO_MANY_REQUESTS, "Monthly budget reached",
                "The owner's monthly spend or token limit has no room for the most this job could cost (its prompt estimate plus max_tokens at the dearest provider of its route). Nothing was created. `limit` names the limit, `resets_at` when the month starts again; an admin can raise it. A retry of a job already created is never refused."),
        }
    }

    pub fn slug(self) -> &'static str {
        self.describe().0
    }

    pub fn status(self) -> StatusCode {
        self.describe().1
    }

    pub fn type_uri(self) -> String {
        format!("/problems/{}", self.slug())
    }

    pub fn from_slug(slug: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.slug() == slug)
    }
}

#[derive(Debug)]
pub struct ApiError {
    pub problem: ProblemType,
    pub detail: String,
    pub extensions: Map<String, Value>,
}

impl ApiError {
    pub fn new(problem: ProblemType, detail: impl Into<String>) -> Self {
        Self {
            problem,
            detail: detail.into(),
            extensions: Map::new(),
        }
    }

    /// Adds a member to the problem document (e.g. the blocking attempt).
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.extensions.insert(key.to_owned(), value.into());
        self
    }

    pub fn not_found() -> Self {
        Self::new(ProblemType::NotFound, "no such resource")
    }

    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(ProblemType::Forbidden, detail)
    }

    pub fn internal() -> Self {
        Self::new(
            ProblemType::Internal,
            "an internal error occurred; it has been logged",
        )
    }

    /// The problem document as JSON.
    pub fn body(&self) -> Value {
        let (_, status, title, _) = self.problem.describe();
        let mut doc = Map::new();
        doc.insert("type".into(), json!(self.problem.type_uri()));
        doc.insert("title".into(), json!(title));
        doc.insert("status".into(), json!(status.as_u16()));
        doc.insert("detail".into(), json!(self.detail));
        for (k, v) in &self.extensions {
            doc.insert(k.clone(), v.clone());
        }
        Value::Object(doc)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.problem.slug(), self.detail)
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.problem.status()
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status_code());
        response.content_type("application/problem+json");
        match self.problem {
            ProblemType::Unauthorized => {
                response.insert_header((header::WWW_AUTHENTICATE, "Bearer realm=\"onejob\""));
            }
            ProblemType::ServiceUnavailable => {
                response.insert_header((header::RETRY_AFTER, "1"));
            }
            // A 429 that waiting a moment does not cure.
            ProblemType::BudgetExceeded => {
                response.insert_header(("x-should-retry", "false"));
            }
            // The rest of a slow body may still be on its way: nothing more
            // is read from this connection.
            ProblemType::RequestTimeout => {
                response.force_close();
            }
            _ => {}
        }
        response.body(self.body().to_string())
    }
}

impl From<crate::domain::json_depth::TooDeep> for ApiError {
    fn from(too_deep: crate::domain::json_depth::TooDeep) -> Self {
        Self::new(
            ProblemType::NestingTooDeep,
            format!("{too_deep}; send a flatter document"),
        )
        .with("limit", too_deep.limit)
    }
}

/// A budget amount as the API shows it: currency units (a decimal string)
/// for a spend limit, a count for a token limit.
fn refused_amount(refused: &crate::app::BudgetRefusal, value: i64) -> Value {
    match refused.limit_name {
        BudgetLimit::Spend => json!(crate::domain::ledger::format_micros(value)),
        BudgetLimit::Tokens => json!(value),
    }
}

fn refused_unit(refused: &crate::app::BudgetRefusal) -> String {
    match refused.limit_name {
        BudgetLimit::Spend => refused.currency.clone(),
        BudgetLimit::Tokens => "tokens".into(),
    }
}

/// The API path of a job.
pub fn job_location(job_id: &impl std::fmt::Display) -> String {
    format!("/api/v1/jobs/{job_id}")
}

impl From<AppError> for ApiError {
    fn from(error: AppError) -> Self {
        let detail = error.to_string();
        match error {
            AppError::NotFound => Self::not_found(),
            AppError::Forbidden(_) => Self::forbidden(detail),
            AppError::UnknownTask { tasks, .. } => {
                Self::new(ProblemType::UnknownTask, detail).with("tasks", tasks)
            }
            AppError::UnknownProvider { chain, .. } => {
                Self::new(ProblemType::UnknownProvider, detail).with("providers", chain)
            }
            AppError::InvalidInput { field, .. } => {
                let problem = Self::new(ProblemType::InvalidInput, detail);
                match field {
                    Some(field) => problem.with("field", field),
                    None => problem,
                }
            }
            AppError::InvalidBody { field, .. } => {
                let problem = Self::new(ProblemType::InvalidBody, detail);
                match field {
                    Some(field) => problem.with("field", field),
                    None => problem,
                }
            }
            AppError::KeyReused { job_id } => Self::new(ProblemType::IdempotencyKeyReused, detail)
                .with("job_id", job_id.to_string())
                .with("job", job_location(&job_id)),
            AppError::AttemptInFlight { attempt_id, state } => {
                Self::new(ProblemType::AttemptInFlight, detail)
                    .with("attempt_id", attempt_id.to_string())
                    .with("attempt_state", state.as_str())
            }
            AppError::JobFinished(status) => {
                Self::new(ProblemType::JobFinished, detail).with("job_status", status.as_str())
            }
            AppError::ChainExhausted => Self::new(ProblemType::ChainExhausted, detail),
            AppError::ProviderNotQualified { allowed, .. } => {
                Self::new(ProblemType::ProviderNotQualified, detail)
                    .with("allowed_providers", allowed)
            }
            AppError::AttemptNotUnknown(state) => Self::new(ProblemType::AttemptNotUnknown, detail)
                .with("attempt_state", state.as_str()),
            AppError::InvalidSignature => Self::new(ProblemType::InvalidSignature, detail),
            AppError::TokenRevoked => Self::new(ProblemType::Unauthorized, detail),
            AppError::CallbackExpired {
                age_seconds,
                window_seconds,
            } => Self::new(ProblemType::CallbackExpired, detail)
                .with("age_seconds", age_seconds)
                .with("window_seconds", window_seconds),
            AppError::NestingTooDeep(too_deep) => too_deep.into(),
            AppError::Unavailable(_) => Self::new(ProblemType::ServiceUnavailable, detail),
            AppError::Internal => Self::internal(),
            AppError::WebhooksOff => Self::new(ProblemType::WebhooksNotConfigured, detail),
            AppError::EndpointLimit { cap, .. } => {
                Self::new(ProblemType::WebhookEndpointLimit, detail).with("limit", cap)
            }
            AppError::BudgetExceeded(refused) => Self::new(ProblemType::BudgetExceeded, detail)
                .with("limit", refused.limit_name.as_str())
                .with("limit_value", refused_amount(&refused, refused.limit))
                .with("committed", refused_amount(&refused, refused.committed))
                .with("requested", refused_amount(&refused, refused.wanted))
                .with("unit", refused_unit(&refused))
                .with("resets_at", refused.resets_at.rfc3339()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_type_has_a_unique_slug() {
        let mut slugs: Vec<_> = ProblemType::ALL.iter().map(|p| p.slug()).collect();
        slugs.sort();
        slugs.dedup();
        assert_eq!(slugs.len(), ProblemType::ALL.len());
        for p in ProblemType::ALL {
            assert_eq!(ProblemType::from_slug(p.slug()), Some(p));
        }
    }

    #[test]
    fn the_problem_document_carries_type_status_and_extensions() {
        let body = ApiError::new(ProblemType::AttemptInFlight, "busy")
            .with("attempt_id", "a1")
            .body();
        assert_eq!(body["type"], "/problems/attempt-in-flight");
        assert_eq!(body["status"], 409);
        assert_eq!(body["attempt_id"], "a1");
    }

    #[test]
    fn storage_errors_map_to_404_503_and_500() {
        use crate::app::StoreError;
        let status = |e: StoreError| ApiError::from(AppError::from(e)).problem.status();
        assert_eq!(status(StoreError::NotFound), StatusCode::NOT_FOUND);
        assert_eq!(
            status(StoreError::corrupt("x")),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        let busy = ApiError::from(AppError::Unavailable("busy".into()));
        assert_eq!(busy.problem.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}
