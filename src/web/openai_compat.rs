//! The OpenAI-compatible surface under `/v1`: `POST /v1/chat/completions`
//! and `GET /v1/models`, so a client written against the OpenAI SDK switches
//! to onejob by changing its `base_url` (and passing an `Idempotency-Key`).
//!
//! A chat completion is a job: the request body is the job's input, `model`
//! names a chat route (a task with `kind = "chat"`), and the answer is the
//! winning attempt's, in OpenAI's shape. A retry or a concurrent duplicate
//! under the same key joins the same job; it never calls a provider again.
//!
//! Errors carry OpenAI's body (`{"error": {"message", "type", "param",
//! "code"}}`) and tell the SDKs whether to retry (`x-should-retry`): a wait
//! that ends before the job does, or an unknown outcome, is a 503 with
//! `Retry-After` that the SDK retries, and its retry rejoins the job; a key
//! reused for another body is a 409 that it must not retry.

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{header, StatusCode};
use actix_web::middleware::Next;
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use serde_json::Value;

use super::auth::{authenticate_or, Caller};
use super::body::{json_text, BodyRules};
use super::error::{ApiError, ProblemType};
use crate::app::intake::JobRequest;
use crate::app::streams::FollowRefused;
use crate::app::{App, AppError, Attempt, Job};
use crate::domain::{IdempotencyKey, JobStatus};

/// How long a client should wait before rejoining a job still in flight.
const RETRY_IN_FLIGHT_SECONDS: u64 = 1;
/// How long before asking again about an unknown outcome, which waits for a
/// person: long enough not to hammer, inside the SDKs' 60 s cap.
const RETRY_UNKNOWN_SECONDS: u64 = 30;

/// Whether the SDK should retry an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// `x-should-retry: false`: the same request gets the same answer.
    Never,
    /// `Retry-After: n` and `x-should-retry: true`.
    After(u64),
    /// The SDK's own rule for the status.
    SdkDefault,
}

/// An error in OpenAI's wire format.
#[derive(Debug)]
pub struct OpenAiError {
    status: StatusCode,
    message: Box<str>,
    kind: &'static str,
    code: Option<&'static str>,
    param: Option<Box<str>>,
    retry: Retry,
    job_id: Option<Box<str>>,
}

impl OpenAiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        let kind = match status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            409 => "conflict_error",
            500.. => "server_error",
            _ => "invalid_request_error",
        };
        Self {
            status,
            message: message.into().into_boxed_str(),
            kind,
            code: None,
            param: None,
            retry: Retry::SdkDefault,
            job_id: None,
        }
    }

    fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub(super) fn param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into().into_boxed_str());
        self
    }

    fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    fn job(mut self, job: &Job) -> Self {
        self.job_id = Some(job.id.to_string().into_boxed_str());
        self
    }

    fn model_not_found(model: &str) -> Self {
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

    fn not_found(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            format!("Unrecognized request URL ({path}). This server answers /v1/chat/completions, /v1/responses and /v1/models."),
        )
        .code("unknown_url")
        .retry(Retry::Never)
    }

    /// The `429` for a follower past `server.max_followers_per_job`: the
    /// SDKs retry it after `Retry-After`, under the same key, and the retry
    /// follows the same stream once there is room (followers come and go
    /// with their clients).
    pub fn too_many_followers(job: &Job, refused: &FollowRefused) -> Self {
        let mut error = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!("Job {}: {refused}.", job.id),
        )
        .code("too_many_followers")
        .retry(Retry::After(1))
        .job(job);
        error.kind = "rate_limit_error";
        error
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

    /// The error document.
    pub fn body(&self) -> OpenAiErrorBody {
        OpenAiErrorBody {
            error: OpenAiErrorDetail {
                message: self.message.to_string(),
                r#type: self.kind.to_owned(),
                param: self.param.as_deref().map(str::to_owned),
                code: self.code.map(str::to_owned),
            },
        }
    }

    /// A request of the wrong shape: OpenAI answers it with 400.
    pub(super) fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
            .code("invalid_request")
            .retry(Retry::Never)
    }

    /// The OpenAI form of a refusal the web layer made itself (the bearer,
    /// the body, the key), or of an application error with nothing more to
    /// say than its problem type.
    fn of_problem(problem: ProblemType, detail: String) -> Self {
        let status = problem.status();
        match problem {
            ProblemType::Unauthorized => Self::new(status, detail)
                .code("invalid_api_key")
                .retry(Retry::Never),
            ProblemType::MissingIdempotencyKey => Self::new(status, missing_key_message())
                .code("missing_idempotency_key")
                .param("Idempotency-Key")
                .retry(Retry::Never),
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

    /// A 404 the SDKs do not retry.
    pub(super) fn not_found_error(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message).retry(Retry::Never)
    }

    /// A 409 the SDKs do not retry.
    pub(super) fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, message).retry(Retry::Never)
    }

    pub(super) fn with_code(self, code: &'static str) -> Self {
        self.code(code)
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
}

impl std::fmt::Display for OpenAiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl ResponseError for OpenAiError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status);
        match self.retry {
            Retry::Never => {
                response.insert_header(("x-should-retry", "false"));
            }
            Retry::After(seconds) => {
                response.insert_header((header::RETRY_AFTER, seconds.to_string()));
                response.insert_header(("x-should-retry", "true"));
            }
            Retry::SdkDefault => {}
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response.insert_header((header::WWW_AUTHENTICATE, "Bearer realm=\"onejob\""));
        }
        if let Some(job_id) = &self.job_id {
            response.insert_header(("X-Onejob-Job-Id", &**job_id));
        }
        response.json(self.body())
    }
}

impl From<ApiError> for OpenAiError {
    fn from(error: ApiError) -> Self {
        Self::of_problem(error.problem, error.detail)
    }
}

impl From<AppError> for OpenAiError {
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
                let mut error = Self::new(StatusCode::TOO_MANY_REQUESTS, refused.to_string())
                    .code("budget_exceeded")
                    .retry(Retry::Never);
                error.kind = "insufficient_quota";
                error
            }
            other => ApiError::from(other).into(),
        }
    }
}

/// The 400 for a request without a key, showing how to send one.
fn missing_key_message() -> String {
    "onejob needs an Idempotency-Key header on every chat completion, so that a retry \
     rejoins the same request instead of calling the provider again. Send one key per \
     intent, the same on every retry; with the OpenAI SDK: \
     client.chat.completions.create(..., extra_headers={\"Idempotency-Key\": \"<a key for this request>\"})"
        .to_owned()
}

/// Middleware for `/v1`: the bearer token is a onejob API token; a refusal
/// is an OpenAI-shaped 401.
pub async fn require_bearer(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    authenticate_or(req, next, |refusal| {
        OpenAiError::from(refusal).error_response()
    })
    .await
}

/// Unknown paths under `/v1`.
pub async fn unknown_path(req: HttpRequest) -> HttpResponse {
    OpenAiError::not_found(req.path()).error_response()
}

pub(super) fn idempotency_key(req: &HttpRequest) -> Result<IdempotencyKey, OpenAiError> {
    super::idempotency::idempotency_key(req).map_err(OpenAiError::from)
}

/// What the request asks of the answer's delivery.
struct Delivery {
    stream: bool,
    include_usage: bool,
}

/// The route and the delivery options; the rest of the body is the
/// provider's business, checked against the route's contract.
fn read_request(body: &Value) -> Result<(String, Delivery), OpenAiError> {
    let invalid = |message: &str, param: &str| OpenAiError::invalid_request(message).param(param);
    if !body.is_object() {
        return Err(invalid("the body must be a JSON object", "body"));
    }
    let model = match body.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => return Err(invalid("you must provide a model parameter", "model")),
    };
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(invalid("`stream` must be a boolean", "stream")),
    };
    let include_usage = body["stream_options"]["include_usage"]
        .as_bool()
        .unwrap_or(false);
    Ok((
        model,
        Delivery {
            stream,
            include_usage,
        },
    ))
}

/// `POST /v1/chat/completions`.
#[utoipa::path(
    post, path = "/v1/chat/completions", tag = "openai-compatible",
    request_body(content = ChatCompletionRequest, description = "An OpenAI Chat Completions request; `model` names a chat route (see GET /v1/models). The body, as sent, is the job's input and fingerprint."),
    params(
        ("Idempotency-Key" = String, Header, description = "Required: 1-255 printable ASCII characters, one per intent, the same on every retry"),
        ("Last-Event-ID" = Option<String>, Header, description = "With `stream: true`: the id of the last event received (1 to 18 digits); the events after it are sent. A malformed one is refused with 400 on any request"),
    ),
    responses(
        (status = 200, description = "The winning answer. `X-Onejob-Job-Id` names the job; `Idempotent-Replayed: true` on a replay or a joined duplicate. With `stream: true`, `text/event-stream` chunks as the provider generates them, each with an `id:` (send `Last-Event-ID` with the same key to resume after it), ending with `data: [DONE]`, or with an error event when the job ends without an answer.", body = ChatCompletion,
            headers(("X-Onejob-Job-Id" = String, description = "The job"), ("Idempotent-Replayed" = String, description = "`true` when the key had already made this job"))),
        (status = 400, description = "Missing or invalid Idempotency-Key, malformed JSON, or a request of the wrong shape", body = OpenAiErrorBody),
        (status = 401, description = "No valid onejob API token as the bearer", body = OpenAiErrorBody),
        (status = 404, description = "`model` is not a chat route (`model_not_found`); a replay of a request it accepted is answered whatever today's routes", body = OpenAiErrorBody),
        (status = 409, description = "The key already made a request with a different body (`idempotency_key_reused`), or its job has no attempt in flight and waits for support (`job_needs_support`); not retried", body = OpenAiErrorBody),
        (status = 413, description = "Body too large", body = OpenAiErrorBody),
        (status = 415, description = "Not application/json", body = OpenAiErrorBody),
        (status = 424, description = "The job failed: every provider allowed for the route failed (`job_failed`); not retried", body = OpenAiErrorBody),
        (status = 429, description = "A stream with as many followers as `server.max_followers_per_job` allows (`too_many_followers`); retried after `Retry-After`. Or the owner's monthly budget has no room (`insufficient_quota`, code `budget_exceeded`, `x-should-retry: false`)", body = OpenAiErrorBody),
        (status = 503, description = "Still running when the wait ended (`job_in_progress`), outcome unknown pending support (`outcome_unknown`, answered at once for a duplicate), or database busy; `Retry-After` says when to retry with the same key", body = OpenAiErrorBody,
            headers(("Retry-After" = String, description = "Seconds"))),
    ),
    security(("bearer" = []))
)]
pub async fn chat_completions(
    app: web::Data<App>,
    caller: Caller,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, OpenAiError> {
    let key = idempotency_key(&req)?;
    let input = json_text(&req, payload, BodyRules::of(&app.config().server)).await?;
    let (model, delivery) = read_request(&input.value())?;
    // A malformed `Last-Event-ID` is refused whatever the request; only a
    // stream has event ids to resume after.
    let resume = super::chat_stream::last_event_id(&req)?.filter(|_| delivery.stream);
    // A name that is not a chat route today is left to creation, which
    // answers a replay from the key's job before it looks at today's
    // configuration (and refuses a new request for it as `model_not_found`).
    let watch = app.watch_finishes();
    let created = app
        .create_job(
            &caller.0,
            key,
            JobRequest {
                task: model,
                input,
                provider: None,
                params: None,
                chat_route: true,
            },
        )
        .await?;
    // A stream follows the job from here: its chunks so far, then live.
    if delivery.stream {
        let stuck = needs_support(&created.job, &created.attempts);
        return match created.job.status {
            JobStatus::Pending | JobStatus::Running | JobStatus::Succeeded if !stuck => {
                Ok(super::chat_stream::response(
                    &app,
                    created.job,
                    created.replayed,
                    delivery.include_usage,
                    resume,
                ))
            }
            _ => answer(&created.job, &created.attempts, created.replayed),
        };
    }
    // What only a person can move on is answered at once, not after the
    // whole wait: an unknown outcome, and a job left with no attempt.
    let (job, attempts) = if created.job.status == JobStatus::Unknown
        || needs_support(&created.job, &created.attempts)
    {
        (created.job, created.attempts)
    } else {
        app.wait_for_answer(watch, created.job, created.attempts)
            .await?
    };
    answer(&job, &attempts, created.replayed)
}

/// A job that is not finished and has no live attempt (its last one was
/// abandoned and nobody started another): nothing will move it but support.
pub(super) fn needs_support(job: &Job, attempts: &[Attempt]) -> bool {
    !job.status.is_terminal() && !attempts.iter().any(|a| a.state.is_live())
}

/// The response for a job as the wait left it.
fn answer(job: &Job, attempts: &[Attempt], replayed: bool) -> Result<HttpResponse, OpenAiError> {
    if let Some(error) = job_error(job, needs_support(job, attempts)) {
        return Err(error);
    }
    let result = job.result.as_ref().map(|r| r.value()).unwrap_or_default();
    let mut response = HttpResponse::Ok();
    response.insert_header(("X-Onejob-Job-Id", job.id.to_string()));
    if replayed {
        response.insert_header(("Idempotent-Replayed", "true"));
    }
    Ok(response.json(completion(job, &result)))
}

/// Why a job gives no answer (yet): the error for it, or `None` once it
/// succeeded. `needs_support`: it has no live attempt and is not finished.
pub(super) fn job_error(job: &Job, needs_support: bool) -> Option<OpenAiError> {
    if needs_support {
        return Some(
            OpenAiError::new(
                StatusCode::CONFLICT,
                format!(
                    "Job {id} is pending with no attempt in flight: its last attempt was abandoned \
                     and no new one was started, so nothing will answer this request until support \
                     acts. Support must start a new attempt (POST /api/v1/jobs/{id}/attempts, or the \
                     console's job page) or mark the job failed; until then, retrying with the same \
                     Idempotency-Key gets this answer.",
                    id = job.id
                ),
            )
            .code("job_needs_support")
            .retry(Retry::Never)
            .job(job),
        );
    }
    let error = match job.status {
        JobStatus::Succeeded => return None,
        JobStatus::Failed => {
            let reason = job.failure_reason.as_deref().map_or_else(
                || "no provider could answer".to_owned(),
                |reason| crate::domain::outcome::Reason::from_stored(reason).for_owner(),
            );
            OpenAiError::new(
                StatusCode::FAILED_DEPENDENCY,
                format!("The request failed: {reason}"),
            )
            .code("job_failed")
            .retry(Retry::Never)
        }
        JobStatus::Cancelled => OpenAiError::new(
            StatusCode::CONFLICT,
            format!(
                "Job {} was cancelled by its owner: it has no answer and will get none. \
                 Use a new Idempotency-Key for a new request.",
                job.id
            ),
        )
        .code("job_cancelled")
        .retry(Retry::Never),
        JobStatus::Unknown => OpenAiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "A provider call timed out and its outcome is unknown; onejob will not call \
             again until support resolves it. Retry later with the same Idempotency-Key.",
        )
        .code("outcome_unknown")
        .retry(Retry::After(RETRY_UNKNOWN_SECONDS)),
        JobStatus::Pending | JobStatus::Running => OpenAiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "The request is still running. Retry with the same Idempotency-Key to rejoin it; \
             the provider is not called again.",
        )
        .code("job_in_progress")
        .retry(Retry::After(RETRY_IN_FLIGHT_SECONDS)),
    };
    Some(error.job(job))
}

/// `chatcmpl-<job id>`: the id every representation of a job's answer shares.
pub(super) fn completion_id(job: &Job) -> String {
    format!("chatcmpl-{}", job.id)
}

/// `chat.completion`, from the stored answer.
fn completion(job: &Job, result: &Value) -> ChatCompletion {
    ChatCompletion {
        id: completion_id(job),
        object: "chat.completion".into(),
        created: job.created_at / 1000,
        model: job.task.clone(),
        choices: vec![Choice {
            index: 0,
            message: result["message"].clone(),
            finish_reason: result["finish_reason"].clone(),
            logprobs: None,
        }],
        usage: result["usage"].clone(),
        system_fingerprint: None,
    }
}

/// One chat route as a model.
fn model_entry(name: &str) -> Model {
    Model {
        id: name.to_owned(),
        object: "model".into(),
        created: 0,
        owned_by: "onejob".into(),
    }
}

/// `GET /v1/models`: the chat routes.
#[utoipa::path(
    get, path = "/v1/models", tag = "openai-compatible",
    responses(
        (status = 200, description = "The chat routes, as models", body = ModelList),
        (status = 401, body = OpenAiErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list_models(app: web::Data<App>, _caller: Caller) -> HttpResponse {
    let data = app
        .config()
        .contracts
        .iter()
        .filter(|c| c.is_chat())
        .map(|c| model_entry(c.name()))
        .collect();
    HttpResponse::Ok().json(ModelList {
        object: "list".into(),
        data,
    })
}

/// `GET /v1/models/{model}`.
#[utoipa::path(
    get, path = "/v1/models/{model}", tag = "openai-compatible",
    params(("model" = String, Path, description = "A chat route's name")),
    responses(
        (status = 200, body = Model),
        (status = 401, body = OpenAiErrorBody),
        (status = 404, description = "Not a chat route", body = OpenAiErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get_model(
    app: web::Data<App>,
    _caller: Caller,
    path: web::Path<String>,
) -> Result<HttpResponse, OpenAiError> {
    match app.config().contracts.get(&path) {
        Some(contract) if contract.is_chat() => {
            Ok(HttpResponse::Ok().json(model_entry(contract.name())))
        }
        _ => Err(OpenAiError::model_not_found(&path)),
    }
}

/// The OpenAI-compatible routes' documents: the answers are built from
/// them, and the OpenAPI document describes them.
mod schemas {
    use serde::Serialize;
    use serde_json::Value;
    use utoipa::ToSchema;

    /// One message of a conversation.
    #[derive(ToSchema)]
    pub struct ChatMessage {
        /// system, developer, user, assistant or tool
        #[schema(pattern = "^(system|developer|user|assistant|tool)$")]
        pub role: String,
        /// A string, or an array of content parts
        pub content: Option<Value>,
    }

    /// An OpenAI Chat Completions request. Members other than these are
    /// passed to OpenAI-compatible providers as sent.
    #[derive(ToSchema)]
    pub struct ChatCompletionRequest {
        /// A chat route (GET /v1/models)
        #[schema(min_length = 1)]
        pub model: String,
        #[schema(min_items = 1)]
        pub messages: Vec<ChatMessage>,
        /// Answer as server-sent events, as the provider generates them
        pub stream: Option<bool>,
        pub max_tokens: Option<u32>,
        /// For reasoning models; sent under the provider's own name for the limit
        pub max_completion_tokens: Option<u32>,
        pub temperature: Option<f64>,
        /// Must be 1 when given: one request, one answer
        #[schema(minimum = 1, maximum = 1)]
        pub n: Option<u32>,
    }

    #[derive(Serialize, ToSchema)]
    pub struct Choice {
        pub index: u32,
        pub message: Value,
        /// As the provider gave it: a string, or null
        #[schema(value_type = Option<String>)]
        pub finish_reason: Value,
        pub logprobs: Option<Value>,
    }

    /// `chat.completion`; `id` is `chatcmpl-<job id>`.
    #[derive(Serialize, ToSchema)]
    pub struct ChatCompletion {
        pub id: String,
        pub object: String,
        pub created: i64,
        pub model: String,
        pub choices: Vec<Choice>,
        pub usage: Value,
        pub system_fingerprint: Option<String>,
    }

    #[derive(Serialize, ToSchema)]
    pub struct Model {
        pub id: String,
        pub object: String,
        pub created: i64,
        pub owned_by: String,
    }

    #[derive(Serialize, ToSchema)]
    pub struct ModelList {
        pub object: String,
        pub data: Vec<Model>,
    }

    #[derive(Serialize, ToSchema)]
    pub struct OpenAiErrorDetail {
        pub message: String,
        pub r#type: String,
        pub param: Option<String>,
        pub code: Option<String>,
    }

    /// OpenAI's error body.
    #[derive(Serialize, ToSchema)]
    pub struct OpenAiErrorBody {
        pub error: OpenAiErrorDetail,
    }
}

pub use schemas::{
    ChatCompletion, ChatCompletionRequest, ChatMessage, Choice, Model, ModelList, OpenAiErrorBody,
    OpenAiErrorDetail,
};

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_missing_key_error_shows_how_to_send_one_and_is_not_retried() {
        let error = OpenAiError::from(ApiError::new(ProblemType::MissingIdempotencyKey, "x"));
        assert_eq!(error.status, StatusCode::BAD_REQUEST);
        assert!(error.message.contains("extra_headers={\"Idempotency-Key\""));
        assert_eq!(error.retry, Retry::Never);
        let body = serde_json::to_value(error.body()).unwrap();
        assert_eq!(body["error"]["code"], "missing_idempotency_key");
        assert_eq!(body["error"]["type"], "invalid_request_error");
    }

    #[test]
    fn a_reused_key_is_a_409_the_sdk_does_not_retry() {
        let error = OpenAiError::from(ApiError::new(ProblemType::IdempotencyKeyReused, "x"));
        assert_eq!(error.status, StatusCode::CONFLICT);
        let response = error.error_response();
        assert_eq!(response.headers().get("x-should-retry").unwrap(), "false");
    }

    #[test]
    fn a_busy_database_is_a_503_with_retry_after() {
        let error = OpenAiError::from(ApiError::new(ProblemType::ServiceUnavailable, "busy"));
        let response = error.error_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers().get(header::RETRY_AFTER).unwrap(), "1");
        assert_eq!(response.headers().get("x-should-retry").unwrap(), "true");
    }

    #[test]
    fn model_and_stream_are_read_and_checked() {
        let (model, delivery) = read_request(&json!({"model": "m", "stream": true,
            "stream_options": {"include_usage": true}}))
        .unwrap();
        assert_eq!(model, "m");
        assert!(delivery.stream && delivery.include_usage);
        assert!(read_request(&json!({"messages": []})).is_err());
        assert!(read_request(&json!({"model": "m", "stream": "yes"})).is_err());
        assert!(read_request(&json!([1])).is_err());
    }
}
