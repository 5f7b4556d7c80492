//! The OpenAI Responses API under `/v1/responses` (docs/design.md,
//! "Responses API"): a response is a job. Its id is `resp_<job id>`
//! (`domain::responses::ResponseId`); a poll (`GET`) is a read of the job;
//! a cancel is the job's cancel (`app::cancel`); retries and fallbacks stay
//! the job's attempts.
//!
//! The request is read by `chat::responses::read_request`: what onejob
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
use serde_json::{json, Value};

use super::auth::Caller;
use super::body::{json_text, BodyRules};
use super::chat_door::{
    answered, create_or_join, idempotency_key, ChatError, Delivery, DoorRequest, Responses, Settled,
};
use crate::app::{App, AppError, Attempt, Job};
use crate::chat::openai_chat::{self, StoredAnswer, Target};
use crate::chat::responses::{self as codec, ResponseError, ResponseView, ResponsesRequest};
use crate::chat::{Answer, Message, StopReason};
use crate::domain::responses::{status_of, ResponseId, ResponseStatus};
use crate::domain::{JobStatus, JsonText};

/// The door's error: OpenAI's body.
pub type ResponsesError = ChatError<Responses>;

/// The member of a job's `params` that holds its Responses request.
pub const PARAMS_MEMBER: &str = crate::domain::fingerprint::RESPONSES_BODY;

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
) -> Result<HttpResponse, ResponsesError> {
    let key = idempotency_key(&req)?;
    let body = json_text(&req, payload, BodyRules::of(&app.config().server)).await?;
    let sent = body.value();
    let read = codec::read_request(&sent)?;
    let earlier = match &read.previous {
        Some(previous) => earlier_turns(&app, &caller, previous).await?,
        None => Vec::new(),
    };
    let chat = read.chat_request(&earlier);
    let input = openai_chat::write_request(&chat, Target::Input { route: &read.route });
    let request = DoorRequest {
        route: read.route.clone(),
        input: JsonText::from_value(&serde_json::to_value(input).expect("a request serializes")),
        params: Some(JsonText::from_value(&json!({ PARAMS_MEMBER: sent }))),
        // A stream tells itself how its job ended; a plain request answers
        // a finished job whichever way it ended.
        delivery: if read.stream {
            Delivery::Stream { while_live: false }
        } else if read.background {
            Delivery::Background
        } else {
            Delivery::Wait {
                ended_is_answer: true,
            }
        },
    };
    Ok(match create_or_join(&app, &caller, key, request).await? {
        Settled::Stream { job, replayed } => stream::response(&app, job, replayed),
        Settled::Answer { job, replayed } => answer(&job, replayed),
    })
}

/// The turns `previous` carries into a new request: one of the caller's
/// own responses that completed.
async fn earlier_turns(
    app: &App,
    caller: &Caller,
    previous: &ResponseId,
) -> Result<Vec<Message>, ResponsesError> {
    let param = "previous_response_id";
    let (job, _) = own_response(app, caller, previous)
        .await
        .map_err(|error| error.param(param))?;
    if job.status != JobStatus::Succeeded {
        return Err(ResponsesError::invalid_request(format!(
            "Previous response {previous} is {}: only a completed response can be continued.",
            status_of(job.status, false)
        ))
        .param(param));
    }
    let had_instructions = kept_request(&job).instructions.is_some();
    // Its input was read when it was made; it reads the same now.
    let conversation = openai_chat::read_request_text(job.input.as_str())
        .map(|read| read.request)
        .unwrap_or_default();
    Ok(codec::earlier_turns(
        &conversation,
        had_instructions,
        answer_of(&job).text(),
    ))
}

/// The Responses request `job` was made by, as it was sent.
fn kept_request(job: &Job) -> ResponsesRequest {
    request_of(job)
        .and_then(|request| serde_json::from_value(request).ok())
        .unwrap_or_default()
}

/// A job's stored answer.
fn answer_of(job: &Job) -> Answer {
    StoredAnswer::read_text(job.result.as_ref().map(|r| r.as_str())).answer()
}

/// The caller's own response `id`: a job of theirs made by a Responses
/// request. Anything else (another owner's, a chat completion's, none) is
/// a 404, so an id tells nothing about other owners.
async fn own_response(
    app: &App,
    caller: &Caller,
    id: &ResponseId,
) -> Result<(Job, Vec<Attempt>), ResponsesError> {
    let not_found = || ResponsesError::response_not_found(&id.to_string());
    match app.own_job(&caller.0, id.job_id()).await {
        Ok((job, attempts)) if request_of(&job).is_some() => Ok((job, attempts)),
        Ok(_) | Err(AppError::NotFound) => Err(not_found()),
        Err(other) => Err(other.into()),
    }
}

/// A path's response id; one that is not an id is not found.
fn path_id(raw: &str) -> Result<ResponseId, ResponsesError> {
    ResponseId::parse(raw).ok_or_else(|| ResponsesError::response_not_found(raw))
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
) -> Result<HttpResponse, ResponsesError> {
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
) -> Result<HttpResponse, ResponsesError> {
    let id = path_id(&path)?;
    own_response(&app, &caller, &id).await?;
    match app.cancel_job(&caller.0, id.job_id()).await {
        Ok(cancelled) => Ok(answer(&cancelled.job, !cancelled.changed)),
        Err(AppError::JobFinished(status)) => Err(ResponsesError::response_finished(&id, status)),
        Err(AppError::NotFound) => Err(ResponsesError::response_not_found(&id.to_string())),
        Err(other) => Err(other.into()),
    }
}

/// The Responses object for `job`, as a 200.
fn answer(job: &Job, replayed: bool) -> HttpResponse {
    answered(job, replayed).json(response_object(job, Stage::AsIs))
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
    let finished = stage == Stage::AsIs && job.status == JobStatus::Succeeded;
    let answer = finished.then(|| answer_of(job));
    let status = match stage {
        Stage::AsIs => status_of(
            job.status,
            answer
                .as_ref()
                .is_some_and(|a| a.stop == StopReason::MaxTokens),
        ),
        Stage::Started => ResponseStatus::InProgress,
    };
    let error = (stage == Stage::AsIs && job.status == JobStatus::Failed).then(|| {
        let reason = job.failure().map_or_else(
            || "no provider could answer".to_owned(),
            |reason| reason.for_owner(),
        );
        ResponseError {
            code: "server_error".into(),
            message: format!("The request failed: {reason}"),
        }
    });
    ResponseObject::of(&ResponseView {
        id: ResponseId::of(&job.id),
        created_at: job.created_at.unix_seconds(),
        route: job.task.clone(),
        status,
        answer,
        error,
        request: kept_request(job),
    })
}

impl ResponsesError {
    /// 404 for a response id that is not one of the caller's.
    fn response_not_found(id: &str) -> Self {
        Self::not_found_error(format!(
            "No response with id '{id}' found: it is not one of your responses."
        ))
        .code("response_not_found")
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
        .code("response_already_finished")
    }
}

/// The Responses request, for the OpenAPI document (which spells out its
/// rules from the codec's).
mod schemas {
    use serde_json::Value;
    use utoipa::ToSchema;

    /// An OpenAI Responses request (the OpenAPI document spells out its rules).
    #[derive(ToSchema)]
    pub struct ResponseCreate {
        /// A chat route (GET /v1/models)
        pub model: String,
        /// A string (one user message) or a list of messages
        #[schema(value_type = Object)]
        pub input: Value,
    }
}

pub use crate::chat::responses::{
    IncompleteDetails, InputTokensDetails, OutputMessage, OutputText, OutputTokensDetails,
    ResponseObject, ResponseUsage, TextConfig, TextFormat,
};
pub use schemas::ResponseCreate;

use crate::chat::openai_chat::OpenAiErrorBody;
