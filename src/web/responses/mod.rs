//! The OpenAI Responses API under `/v1/responses` (docs/design.md,
//! "Responses API"): a response is a job. Its id is `resp_<job id>`
//! (`domain::responses::ResponseId`); a poll (`GET`) is a read of the job;
//! a cancel is the job's cancel (`app::cancel`); retries and fallbacks stay
//! the job's attempts.
//!
//! The request is read by `domain::responses::read_request`: what onejob
//! honours becomes the chat conversation of the route `model` names (the
//! job's input, as a chat completion's would be), and the whole request is
//! kept as the job's `params` under `responses`, so its fingerprint is the
//! request's: the same key and body join the same job, another body under
//! the key is a 409. What onejob cannot honour is a 400 naming it.
//!
//! - plain: waits for the job as `/v1/chat/completions` does, and answers
//!   the Responses object once it has finished (a wait that ends first is
//!   the same retryable 503 as a chat completion's);
//! - `background: true`: answers at once (`queued`, or `in_progress` once
//!   its attempt runs); the worker runs the job;
//! - `stream: true`: the Responses events, following the job's stream
//!   (`app::streams`) as a streamed chat completion does (`stream`).

mod stream;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;
use serde_json::{json, Value};
use utoipa::ToSchema;

use super::auth::Caller;
use super::body::{json_text, BodyRules};
use super::openai_compat::{idempotency_key, job_error, needs_support, OpenAiError};
use crate::app::intake::JobRequest;
use crate::app::{App, AppError, Attempt, Job};
use crate::domain::responses::{self as rules, ResponseId};
use crate::domain::{JobStatus, JsonText};

/// The member of a job's `params` that holds its Responses request.
pub const PARAMS_MEMBER: &str = "responses";

/// The Responses request a job was made from, if it was made by one.
pub fn request_of(job: &Job) -> Option<Value> {
    let params = job.params.value();
    params.get(PARAMS_MEMBER).filter(|r| r.is_object()).cloned()
}

/// `POST /v1/responses`.
#[utoipa::path(
    post, path = "/v1/responses", tag = "openai-compatible",
    request_body(content = ResponseCreate, description = "An OpenAI Responses request; `model` names a chat route (see GET /v1/models). Every member is honoured or refused with a 400 naming it."),
    params(
        ("Idempotency-Key" = String, Header, description = "Required: 1-255 printable ASCII characters, one per intent, the same on every retry"),
    ),
    responses(
        (status = 200, description = "The response (its `id` is `resp_<job id>`): finished for a plain request, `queued` or `in_progress` with `background: true`. With `stream: true`, `text/event-stream` Responses events, each with its `sequence_number`. `X-Onejob-Job-Id` names the job; `Idempotent-Replayed: true` on a replay or a joined duplicate.", body = ResponseObject,
            headers(("X-Onejob-Job-Id" = String, description = "The job"), ("Idempotent-Replayed" = String, description = "`true` when the key had already made this job"))),
        (status = 400, description = "Missing or invalid Idempotency-Key, malformed JSON, a parameter onejob cannot honour (`param` names it), or a `previous_response_id` that has not completed", body = OpenAiErrorBody),
        (status = 401, description = "No valid onejob API token as the bearer", body = OpenAiErrorBody),
        (status = 404, description = "`model` is not a chat route (`model_not_found`), or `previous_response_id` is not one of the caller's responses", body = OpenAiErrorBody),
        (status = 409, description = "The key already made a request with a different body (`idempotency_key_reused`), or the job waits for support (`job_needs_support`); not retried", body = OpenAiErrorBody),
        (status = 413, description = "Body too large", body = OpenAiErrorBody),
        (status = 415, description = "Not application/json", body = OpenAiErrorBody),
        (status = 422, description = "JSON nested too deep, or a number no IEEE double holds exactly", body = OpenAiErrorBody),
        (status = 429, description = "A stream with as many followers as `server.max_followers_per_job` allows; retried after `Retry-After`. Or the owner's monthly budget has no room (`insufficient_quota`, code `budget_exceeded`, `x-should-retry: false`)", body = OpenAiErrorBody),
        (status = 503, description = "Still running when the wait ended (`job_in_progress`), outcome unknown pending support (`outcome_unknown`), or database busy; `Retry-After` says when to retry with the same key", body = OpenAiErrorBody,
            headers(("Retry-After" = String, description = "Seconds"))),
    ),
    security(("bearer" = []))
)]
pub async fn create_response(
    app: web::Data<App>,
    caller: Caller,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, OpenAiError> {
    let key = idempotency_key(&req)?;
    let body = json_text(&req, payload, BodyRules::of(&app.config().server)).await?;
    let sent = body.value();
    let request = rules::read_request(&sent)
        .map_err(|refused| OpenAiError::invalid_request(refused.message).param(refused.param))?;
    let earlier = match &request.previous {
        Some(previous) => earlier_turns(&app, &caller, previous).await?,
        None => Vec::new(),
    };
    let input = JsonText::from_value(&request.chat_input(&earlier));
    let params = JsonText::from_value(&json!({ PARAMS_MEMBER: sent }));
    let watch = app.watch_finishes();
    let created = app
        .create_job(
            &caller.0,
            key,
            JobRequest {
                task: request.model.clone(),
                input,
                provider: None,
                params: Some(params),
                chat_route: true,
            },
        )
        .await?;
    if request.stream {
        return Ok(stream::response(&app, created.job, created.replayed));
    }
    let (job, attempts) = if request.background
        || created.job.status == JobStatus::Unknown
        || needs_support(&created.job, &created.attempts)
    {
        (created.job, created.attempts)
    } else {
        app.wait_for_answer(watch, created.job, created.attempts)
            .await?
    };
    if !request.background {
        refuse_unfinished(&job, &attempts)?;
    }
    Ok(answer(&job, created.replayed))
}

/// A plain request answers a finished job; anything else is the error a
/// chat completion gets for it (a retryable 503 while it runs or its
/// outcome is unknown, a 409 when it waits for support).
fn refuse_unfinished(job: &Job, attempts: &[Attempt]) -> Result<(), OpenAiError> {
    if job.status.is_terminal() {
        return Ok(());
    }
    match job_error(job, needs_support(job, attempts)) {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// The turns `previous` carries into a new request: one of the caller's
/// own responses that completed.
async fn earlier_turns(
    app: &App,
    caller: &Caller,
    previous: &ResponseId,
) -> Result<Vec<Value>, OpenAiError> {
    let param = "previous_response_id";
    let (job, _) = own_response(app, caller, previous)
        .await
        .map_err(|error| error.param(param))?;
    if job.status != JobStatus::Succeeded {
        return Err(OpenAiError::invalid_request(format!(
            "Previous response {previous} is {}: only a completed response can be continued.",
            rules::status_of(job.status, None)
        ))
        .param(param));
    }
    let request = request_of(&job).unwrap_or_default();
    let result = job.result.as_ref().map(|r| r.value()).unwrap_or_default();
    let had_instructions = request["instructions"].is_string();
    Ok(rules::earlier_turns(
        &job.input.value(),
        had_instructions,
        &rules::answer_text(&result),
    ))
}

/// The caller's own response `id`: a job of theirs made by a Responses
/// request. Anything else (another owner's, a chat completion's, none) is
/// a 404, so an id tells nothing about other owners.
async fn own_response(
    app: &App,
    caller: &Caller,
    id: &ResponseId,
) -> Result<(Job, Vec<Attempt>), OpenAiError> {
    let not_found = || OpenAiError::response_not_found(&id.to_string());
    match app.own_job(&caller.0, id.job_id()).await {
        Ok((job, attempts)) if request_of(&job).is_some() => Ok((job, attempts)),
        Ok(_) | Err(AppError::NotFound) => Err(not_found()),
        Err(other) => Err(other.into()),
    }
}

/// A path's response id; one that is not an id is not found.
fn path_id(raw: &str) -> Result<ResponseId, OpenAiError> {
    ResponseId::parse(raw).ok_or_else(|| OpenAiError::response_not_found(raw))
}

/// `GET /v1/responses/{id}`.
#[utoipa::path(
    get, path = "/v1/responses/{id}", tag = "openai-compatible",
    params(("id" = String, Path, description = "A response id, `resp_` and 32 hex digits")),
    responses(
        (status = 200, description = "The response as its job is now; reading it changes nothing", body = ResponseObject),
        (status = 401, body = OpenAiErrorBody),
        (status = 404, description = "Not one of the caller's responses", body = OpenAiErrorBody),
        (status = 503, description = "Database busy", body = OpenAiErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get_response(
    app: web::Data<App>,
    caller: Caller,
    path: web::Path<String>,
) -> Result<HttpResponse, OpenAiError> {
    let id = path_id(&path)?;
    let (job, _) = own_response(&app, &caller, &id).await?;
    Ok(answer(&job, false))
}

/// `POST /v1/responses/{id}/cancel`.
#[utoipa::path(
    post, path = "/v1/responses/{id}/cancel", tag = "openai-compatible",
    params(("id" = String, Path, description = "A response id, `resp_` and 32 hex digits")),
    responses(
        (status = 200, description = "The response, `cancelled`: it takes no new attempt, a queued one is withdrawn unsent, and a late answer of one already sent is logged, never applied. Cancelling it again answers the same.", body = ResponseObject),
        (status = 401, body = OpenAiErrorBody),
        (status = 404, description = "Not one of the caller's responses", body = OpenAiErrorBody),
        (status = 409, description = "It has completed or failed already (`response_already_finished`); not retried", body = OpenAiErrorBody),
        (status = 503, description = "Database busy", body = OpenAiErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn cancel_response(
    app: web::Data<App>,
    caller: Caller,
    path: web::Path<String>,
) -> Result<HttpResponse, OpenAiError> {
    let id = path_id(&path)?;
    own_response(&app, &caller, &id).await?;
    match app.cancel_job(&caller.0, id.job_id()).await {
        Ok(cancelled) => Ok(answer(&cancelled.job, !cancelled.changed)),
        Err(AppError::JobFinished(status)) => Err(OpenAiError::response_finished(&id, status)),
        Err(AppError::NotFound) => Err(OpenAiError::response_not_found(&id.to_string())),
        Err(other) => Err(other.into()),
    }
}

/// The Responses object for `job`, as a 200.
fn answer(job: &Job, replayed: bool) -> HttpResponse {
    let mut response = HttpResponse::Ok();
    response.insert_header(("X-Onejob-Job-Id", job.id.to_string()));
    if replayed {
        response.insert_header(("Idempotent-Replayed", "true"));
    }
    response.json(response_object(job, Stage::AsIs))
}

/// How much of the job a Responses object shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// As the job is.
    AsIs,
    /// As a stream starts: `in_progress`, no output yet.
    Started,
}

/// The Responses object of a job made by a Responses request.
fn response_object(job: &Job, stage: Stage) -> ResponseObject {
    let request = request_of(job).unwrap_or_default();
    let result = job.result.as_ref().map(|r| r.value()).unwrap_or_default();
    let finish_reason = result["finish_reason"].as_str();
    let id = ResponseId::of(&job.id);
    let status = match stage {
        Stage::AsIs => rules::status_of(job.status, finish_reason),
        Stage::Started => "in_progress",
    };
    let finished = stage == Stage::AsIs && job.status == JobStatus::Succeeded;
    let output = if finished {
        vec![output_message(
            &id,
            rules::answer_text(&result),
            "completed",
        )]
    } else {
        Vec::new()
    };
    let error = (stage == Stage::AsIs && job.status == JobStatus::Failed).then(|| {
        let reason = job.failure_reason.as_deref().map_or_else(
            || "no provider could answer".to_owned(),
            |reason| crate::domain::outcome::Reason::from_stored(reason).for_owner(),
        );
        ResponseError {
            code: "server_error".into(),
            message: format!("The request failed: {reason}"),
        }
    });
    let incomplete_details = (finished && status == "incomplete").then(|| IncompleteDetails {
        reason: "max_output_tokens".into(),
    });
    let usage = finished.then(|| usage_of(&result["usage"]));
    let metadata = request["metadata"]
        .as_object()
        .map(|pairs| {
            pairs
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect()
        })
        .unwrap_or_default();
    ResponseObject {
        id: id.to_string(),
        object: "response".into(),
        created_at: job.created_at / 1000,
        status: status.into(),
        background: request["background"].as_bool().unwrap_or(false),
        error,
        incomplete_details,
        instructions: request["instructions"].as_str().map(str::to_owned),
        max_output_tokens: rules::whole_number(&request["max_output_tokens"]),
        model: job.task.clone(),
        output,
        parallel_tool_calls: false,
        previous_response_id: request["previous_response_id"].as_str().map(str::to_owned),
        temperature: request["temperature"].as_f64(),
        top_p: request["top_p"].as_f64(),
        tool_choice: "none".into(),
        tools: Vec::new(),
        text: TextConfig {
            format: TextFormat {
                r#type: "text".into(),
            },
        },
        truncation: "disabled".into(),
        usage,
        user: request["user"].as_str().map(str::to_owned),
        metadata,
        store: true,
    }
}

fn output_message(id: &ResponseId, text: String, status: &str) -> OutputMessage {
    OutputMessage {
        id: id.message_id(),
        r#type: "message".into(),
        status: status.into(),
        role: "assistant".into(),
        content: vec![OutputText::of(text)],
    }
}

/// A chat answer's usage in the Responses vocabulary.
fn usage_of(usage: &Value) -> ResponseUsage {
    let count = |name: &str| usage[name].as_i64().unwrap_or(0).max(0);
    let (input, output) = (count("prompt_tokens"), count("completion_tokens"));
    let total = usage["total_tokens"].as_i64().unwrap_or(input + output);
    ResponseUsage {
        input_tokens: input,
        output_tokens: output,
        total_tokens: total.max(0),
        input_tokens_details: InputTokensDetails { cached_tokens: 0 },
        output_tokens_details: OutputTokensDetails {
            reasoning_tokens: 0,
        },
    }
}

impl OpenAiError {
    /// 404 for a response id that is not one of the caller's.
    fn response_not_found(id: &str) -> Self {
        Self::not_found_error(format!(
            "No response with id '{id}' found: it is not one of your responses."
        ))
        .with_code("response_not_found")
    }

    /// 409 for a cancel of a response that finished already.
    fn response_finished(id: &ResponseId, status: JobStatus) -> Self {
        Self::conflict(format!(
            "Response {id} has {} already and can no longer be cancelled.",
            match status {
                JobStatus::Failed => "failed",
                _ => "completed",
            }
        ))
        .with_code("response_already_finished")
    }
}

/// The Responses API's documents: the answers are built from them, and the
/// OpenAPI document describes them.
mod schemas {
    use super::*;

    /// An OpenAI Responses request (the OpenAPI document spells out its rules).
    #[derive(ToSchema)]
    pub struct ResponseCreate {
        /// A chat route (GET /v1/models)
        pub model: String,
        /// A string (one user message) or a list of messages
        #[schema(value_type = Object)]
        pub input: Value,
    }

    #[derive(Serialize, ToSchema)]
    pub struct OutputText {
        /// `output_text`
        pub r#type: String,
        pub text: String,
        #[schema(value_type = Vec<Object>)]
        pub annotations: Vec<Value>,
        #[schema(value_type = Vec<Object>)]
        pub logprobs: Vec<Value>,
    }

    impl OutputText {
        pub fn of(text: String) -> Self {
            Self {
                r#type: "output_text".into(),
                text,
                annotations: Vec::new(),
                logprobs: Vec::new(),
            }
        }
    }

    /// The answer, as one assistant message.
    #[derive(Serialize, ToSchema)]
    pub struct OutputMessage {
        /// `msg_<job id>`
        pub id: String,
        /// `message`
        pub r#type: String,
        #[schema(pattern = "^(in_progress|completed|incomplete)$")]
        pub status: String,
        /// `assistant`
        pub role: String,
        pub content: Vec<OutputText>,
    }

    #[derive(Serialize, ToSchema)]
    pub struct ResponseError {
        pub code: String,
        pub message: String,
    }

    #[derive(Serialize, ToSchema)]
    pub struct IncompleteDetails {
        /// `max_output_tokens`
        pub reason: String,
    }

    #[derive(Serialize, ToSchema)]
    pub struct InputTokensDetails {
        pub cached_tokens: i64,
    }

    #[derive(Serialize, ToSchema)]
    pub struct OutputTokensDetails {
        pub reasoning_tokens: i64,
    }

    #[derive(Serialize, ToSchema)]
    pub struct ResponseUsage {
        pub input_tokens: i64,
        pub output_tokens: i64,
        pub total_tokens: i64,
        pub input_tokens_details: InputTokensDetails,
        pub output_tokens_details: OutputTokensDetails,
    }

    #[derive(Serialize, ToSchema)]
    pub struct TextFormat {
        /// `text`
        pub r#type: String,
    }

    #[derive(Serialize, ToSchema)]
    pub struct TextConfig {
        pub format: TextFormat,
    }

    /// The Responses object: `id` is `resp_<job id>`; `status` is the job's.
    #[derive(Serialize, ToSchema)]
    pub struct ResponseObject {
        pub id: String,
        /// `response`
        pub object: String,
        /// Unix seconds
        pub created_at: i64,
        /// The job's status: pending → queued; running or unknown →
        /// in_progress; succeeded → completed (incomplete when cut at the
        /// token limit); failed; cancelled
        #[schema(pattern = "^(queued|in_progress|completed|incomplete|failed|cancelled)$")]
        pub status: String,
        pub background: bool,
        pub error: Option<ResponseError>,
        pub incomplete_details: Option<IncompleteDetails>,
        pub instructions: Option<String>,
        pub max_output_tokens: Option<u64>,
        pub model: String,
        pub output: Vec<OutputMessage>,
        pub parallel_tool_calls: bool,
        pub previous_response_id: Option<String>,
        pub temperature: Option<f64>,
        pub top_p: Option<f64>,
        /// `none`: onejob's Responses routes take no tools
        pub tool_choice: String,
        #[schema(value_type = Vec<Object>)]
        pub tools: Vec<Value>,
        pub text: TextConfig,
        /// `disabled`
        pub truncation: String,
        pub usage: Option<ResponseUsage>,
        pub user: Option<String>,
        pub metadata: std::collections::BTreeMap<String, String>,
        /// Always true: onejob stores every response
        pub store: bool,
    }
}

pub use schemas::{
    IncompleteDetails, InputTokensDetails, OutputMessage, OutputText, OutputTokensDetails,
    ResponseCreate, ResponseError, ResponseObject, ResponseUsage, TextConfig, TextFormat,
};

use super::openai_compat::OpenAiErrorBody;
