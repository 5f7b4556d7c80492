//! The OpenAI-compatible surface under `/v1`: `POST /v1/chat/completions`
//! and `GET /v1/models`, so a client written against the OpenAI SDK switches
//! to onejob by changing its `base_url` (and passing an `Idempotency-Key`).
//!
//! A chat completion is a job: the request body is the job's input, `model`
//! names a chat route (a task with `kind = "chat"`), and the answer is the
//! winning attempt's, in OpenAI's shape. A retry or a concurrent duplicate
//! under the same key joins the same job; it never calls a provider again.
//!
//! The request is read by its codec (`chat::openai_chat`); the job is made
//! or joined, waited for and streamed by the doors' shared flow
//! (`chat_door`), whose errors this door writes in OpenAI's body.

use actix_web::{web, HttpRequest, HttpResponse, ResponseError};

use super::auth::Caller;
use super::body::{json_text, BodyRules};
use super::chat_door::{
    answered, create_or_join, idempotency_key, last_event_id, stream_response, ChatCompletions,
    ChatError, Delivery, DoorRequest, Settled,
};
use super::chat_stream::{subject_of, Chunks};
use crate::app::App;
use crate::chat::openai_chat::{self, StoredAnswer};

/// The door's error: OpenAI's body.
pub type OpenAiError = ChatError<ChatCompletions>;

/// Unknown paths under `/v1`.
pub async fn unknown_path(req: HttpRequest) -> HttpResponse {
    OpenAiError::not_found(req.path()).error_response()
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
    let read = openai_chat::read_request_text(input.as_str())?;
    let route = read.route.ok_or_else(|| {
        OpenAiError::invalid_request("you must provide a model parameter").param("model")
    })?;
    let stream = read.request.stream;
    // A malformed `Last-Event-ID` is refused whatever the request; only a
    // stream has event ids to resume after.
    let resume = last_event_id(&req)?.filter(|_| stream);
    let request = DoorRequest {
        route,
        input,
        params: None,
        delivery: Delivery::streamed_or_waited(stream),
    };
    Ok(match create_or_join(&app, &caller, key, request).await? {
        Settled::Stream { job, replayed } => {
            let chunks = Chunks::new(&job, read.include_usage, resume);
            stream_response(&app, job, replayed, resume.unwrap_or(0), chunks)
        }
        Settled::Answer { job, replayed } => {
            let stored = StoredAnswer::read_text(job.result.as_ref().map(|r| r.as_str()));
            answered(&job, replayed).json(openai_chat::completion(&subject_of(&job), &stored))
        }
    })
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
}

pub use crate::chat::openai_chat::{ChatCompletion, Choice, OpenAiErrorBody, WireErrorDetail};
pub use schemas::{ChatCompletionRequest, ChatMessage, Model, ModelList};
