//! `POST /v1/messages`: job creation in Anthropic's Messages wire format, so
//! a client written against the Anthropic SDK switches to onejob by
//! changing its `base_url` (and passing an `Idempotency-Key`).
//!
//! - The onejob API token comes as `x-api-key` (how the Anthropic SDK sends
//!   its `api_key`) or as a bearer token.
//! - `model` names a chat route, as on `/v1/chat/completions`, and the job
//!   is made by the same intake: the same key with the same body is the same
//!   job (a retry or a concurrent duplicate never calls a provider again);
//!   the same key with another body is a 409.
//! - The request is translated into onejob's chat request (an OpenAI Chat
//!   Completions body), which is the job's input: every provider kind serves
//!   it (an Anthropic provider gets it translated back). The body as sent is
//!   kept in the job's params (`messages_request`), so the fingerprint covers
//!   exactly what the client sent, and a Chat Completions request under the
//!   same key is another payload. Tools become functions, `tool_use` blocks
//!   tool calls, `tool_result` blocks `tool` messages; other blocks (images,
//!   documents) and Anthropic's server tools are refused.
//! - The answer is the winning attempt's, as an Anthropic `message`; with
//!   `stream: true`, Anthropic's event sequence, following the job's stream
//!   (docs/design.md, "Streaming") as `web::chat_stream` does for Chat
//!   Completions: the same chunks, the same resumption by `Last-Event-ID`.
//! - Errors are Anthropic's (`{"type": "error", "error": {"type", "message"}}`),
//!   with the statuses and retry headers of the Chat Completions surface.

use std::convert::Infallible;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{header, StatusCode};
use actix_web::middleware::Next;
use actix_web::web::Bytes;
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use futures_util::stream;
use serde_json::{json, Map, Value};

use super::auth::{authenticate_api_key_or, Caller};
use super::body::{json_text, BodyRules};
use super::chat_stream::KEEPALIVE;
use super::error::ApiError;
use super::openai_compat::{job_error, needs_support, OpenAiError};
use crate::app::intake::JobRequest;
use crate::app::streams::{Followed, Follower};
use crate::app::{App, AppError, Job};
use crate::domain::{JobStatus, JsonText};
use crate::providers::chat::messages_stop_reason;
use crate::providers::streaming::whole_answer_deltas;

/// The most messages, and content blocks in all, one request may carry:
/// every walk over the client's conversation is bounded by them (the body
/// limit bounds them too; these say so in the error).
const MAX_MESSAGES: usize = 10_000;
const MAX_BLOCKS: usize = 100_000;
/// The most stop sequences (Anthropic's own limit is far lower).
const MAX_STOP_SEQUENCES: usize = 64;

/// An error in Anthropic's wire format, with the status and the retry
/// headers (`x-should-retry`, `Retry-After`) the SDK acts on.
#[derive(Debug)]
pub struct AnthropicError {
    status: StatusCode,
    message: String,
    /// Headers carried over from the Chat Completions surface's answer.
    headers: Vec<(header::HeaderName, header::HeaderValue)>,
}

impl AnthropicError {
    /// A request of the wrong shape: 400 `invalid_request_error`, not retried.
    fn invalid(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            headers: vec![(
                header::HeaderName::from_static("x-should-retry"),
                header::HeaderValue::from_static("false"),
            )],
        }
    }

    /// Anthropic's error `type` for a status.
    pub fn kind(status: StatusCode) -> &'static str {
        match status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            500.. | 424 => "api_error",
            _ => "invalid_request_error",
        }
    }

    /// The error document.
    pub fn body(&self) -> Value {
        json!({
            "type": "error",
            "error": {"type": Self::kind(self.status), "message": self.message},
        })
    }

    /// 405 for a method `/v1/messages` does not answer.
    pub fn method_not_allowed(method: &str, allow: &str) -> Self {
        Self {
            status: StatusCode::METHOD_NOT_ALLOWED,
            ..Self::invalid(format!("{method} is not allowed here; allowed: {allow}"))
        }
    }
}

impl std::fmt::Display for AnthropicError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl ResponseError for AnthropicError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status);
        for (name, value) in &self.headers {
            response.insert_header((name.clone(), value.clone()));
        }
        response.json(self.body())
    }
}

/// The Chat Completions surface decides the status and the retry rule of
/// every refusal; this one only words it in Anthropic's shape.
impl From<OpenAiError> for AnthropicError {
    fn from(error: OpenAiError) -> Self {
        let message = error.body().error.message;
        let response = error.error_response();
        let headers = response
            .headers()
            .iter()
            .filter(|(name, _)| {
                ["x-should-retry", "retry-after", "x-onejob-job-id"].contains(&name.as_str())
            })
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        Self {
            status: response.status(),
            message: message.replace("client.chat.completions.create(", "client.messages.create("),
            headers,
        }
    }
}

impl From<ApiError> for AnthropicError {
    fn from(error: ApiError) -> Self {
        OpenAiError::from(error).into()
    }
}

impl From<AppError> for AnthropicError {
    fn from(error: AppError) -> Self {
        OpenAiError::from(error).into()
    }
}

/// Middleware for `/v1/messages`: the onejob API token as `x-api-key` or a
/// bearer; a refusal is an Anthropic-shaped 401.
pub async fn require_api_key(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    authenticate_api_key_or(req, next, |refusal| {
        AnthropicError::from(refusal).error_response()
    })
    .await
}

/// A Messages request, read: the route, whether it streams, and onejob's
/// chat request it amounts to.
#[derive(Debug, PartialEq)]
pub struct MessagesRequest {
    pub model: String,
    pub stream: bool,
    pub chat: Value,
}

/// The text of a `system` prompt or of a message's content: a string, or
/// text blocks (`max_blocks` counts down the blocks the request may still
/// have).
fn text_blocks(content: &Value, at: &str, max_blocks: &mut usize) -> Result<Value, AnthropicError> {
    match content {
        Value::String(text) => Ok(json!(text)),
        Value::Array(blocks) => {
            let mut parts = Vec::with_capacity(blocks.len().min(64));
            for (i, block) in blocks.iter().enumerate() {
                count_block(max_blocks)?;
                parts.push(text_block(block, &format!("{at}.{i}"))?);
            }
            Ok(Value::Array(parts))
        }
        _ => Err(AnthropicError::invalid(format!(
            "{at}: must be a string or an array of text blocks"
        ))),
    }
}

/// One `text` block (at `at`), as a text part; any other block is refused.
fn text_block(block: &Value, at: &str) -> Result<Value, AnthropicError> {
    match (block["type"].as_str(), block["text"].as_str()) {
        (Some("text"), Some(text)) => Ok(json!({"type": "text", "text": text})),
        (Some("text"), None) => Err(AnthropicError::invalid(format!(
            "{at}.text: a text block needs its text as a string"
        ))),
        (Some(other), _) => Err(AnthropicError::invalid(format!(
            "{at}.type: onejob's /v1/messages takes text, tool_use and tool_result blocks, not `{other}`"
        ))),
        (None, _) => Err(AnthropicError::invalid(format!(
            "{at}.type: each content block needs a `type`"
        ))),
    }
}

/// The block of `blocks` counted against the request's allowance.
fn count_block(max_blocks: &mut usize) -> Result<(), AnthropicError> {
    *max_blocks = max_blocks.checked_sub(1).ok_or_else(|| {
        AnthropicError::invalid(format!(
            "a request may have at most {MAX_BLOCKS} content blocks"
        ))
    })?;
    Ok(())
}

/// One turn of the conversation as onejob's chat messages: its text, an
/// assistant's `tool_use` blocks as tool calls, a user's `tool_result`
/// blocks as `tool` messages (before the turn's text, which answers them).
fn turn(
    role: &str,
    content: &Value,
    at: &str,
    max_blocks: &mut usize,
) -> Result<Vec<Value>, AnthropicError> {
    let invalid = |message: String| AnthropicError::invalid(message);
    let Value::Array(blocks) = content else {
        return Ok(vec![
            json!({"role": role, "content": text_blocks(content, at, max_blocks)?}),
        ]);
    };
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    let mut results = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        let kind = block["type"].as_str();
        match (role, kind) {
            ("assistant", Some("tool_use")) => {
                count_block(max_blocks)?;
                let (Some(id), Some(name), Some(input)) = (
                    block["id"].as_str(),
                    block["name"].as_str(),
                    block.get("input").filter(|i| i.is_object()),
                ) else {
                    return Err(invalid(format!(
                        "{at}.{i}: a tool_use block needs its `id` and `name` as strings and its `input` as an object"
                    )));
                };
                calls.push(json!({"id": id, "type": "function",
                                  "function": {"name": name, "arguments": input.to_string()}}));
            }
            ("user", Some("tool_result")) => {
                count_block(max_blocks)?;
                let Some(id) = block["tool_use_id"].as_str() else {
                    return Err(invalid(format!(
                        "{at}.{i}.tool_use_id: a tool_result block needs the id of its tool_use"
                    )));
                };
                let text = match block.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(content) => joined_text(&text_blocks(
                        content,
                        &format!("{at}.{i}.content"),
                        max_blocks,
                    )?),
                };
                results.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
            }
            (_, Some("tool_use" | "tool_result")) => {
                return Err(invalid(format!(
                    "{at}.{i}.type: a {} block does not belong in a {role} turn",
                    kind.unwrap_or_default()
                )))
            }
            _ => {
                count_block(max_blocks)?;
                parts.push(text_block(block, &format!("{at}.{i}"))?);
            }
        }
    }
    let mut turns = results;
    if !calls.is_empty() {
        let text = joined_text(&Value::Array(parts));
        let content = if text.is_empty() {
            Value::Null
        } else {
            json!(text)
        };
        turns.push(json!({"role": role, "content": content, "tool_calls": calls}));
    } else if !parts.is_empty() || turns.is_empty() {
        turns.push(json!({"role": role, "content": parts}));
    }
    Ok(turns)
}

/// The most tools one request may offer.
const MAX_TOOLS: usize = 128;

/// Anthropic's tools as OpenAI functions.
fn read_tools(tools: &Value) -> Result<Value, AnthropicError> {
    let invalid = |message: String| AnthropicError::invalid(message);
    let Some(tools) = tools.as_array().filter(|t| t.len() <= MAX_TOOLS) else {
        return Err(invalid(format!(
            "tools: must be an array of at most {MAX_TOOLS} tools"
        )));
    };
    let mut functions = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        if tool
            .get("type")
            .is_some_and(|t| !t.is_null() && t != "custom")
        {
            return Err(invalid(format!(
                "tools.{i}.type: onejob offers the client's own tools only (`custom`), not Anthropic's server tools"
            )));
        }
        let (Some(name), Some(schema)) = (
            tool["name"].as_str().filter(|n| !n.is_empty()),
            tool.get("input_schema").filter(|s| s.is_object()),
        ) else {
            return Err(invalid(format!(
                "tools.{i}: a tool needs a `name` and an `input_schema` object"
            )));
        };
        let mut function = json!({"name": name, "parameters": schema});
        match tool.get("description") {
            None | Some(Value::Null) => {}
            Some(Value::String(text)) => function["description"] = json!(text),
            Some(_) => return Err(invalid(format!("tools.{i}.description: must be a string"))),
        }
        functions.push(json!({"type": "function", "function": function}));
    }
    Ok(Value::Array(functions))
}

/// Anthropic's `tool_choice` in OpenAI's terms.
fn read_tool_choice(choice: &Value) -> Result<Value, AnthropicError> {
    Ok(match (choice["type"].as_str(), choice["name"].as_str()) {
        (Some("auto"), _) => json!("auto"),
        (Some("any"), _) => json!("required"),
        (Some("none"), _) => json!("none"),
        (Some("tool"), Some(name)) => json!({"type": "function", "function": {"name": name}}),
        _ => {
            return Err(AnthropicError::invalid(
                "tool_choice: must be {\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": \"none\"} or {\"type\": \"tool\", \"name\": …}",
            ))
        }
    })
}

/// The plain text of translated content (for `system`, which onejob's chat
/// request carries as one message).
fn joined_text(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n\n"),
        _ => String::new(),
    }
}

/// Reads a Messages request and translates it into onejob's chat request:
/// `system` becomes the first message, `max_tokens`, `temperature`, `top_p`
/// pass as they are, `stop_sequences` become `stop`, tools become
/// functions. Members it does not name (`metadata`, `top_k`, …) are not
/// passed on; content other than text and tool blocks is refused, not
/// dropped.
pub fn read_request(body: &Value) -> Result<MessagesRequest, AnthropicError> {
    let invalid = |message: String| AnthropicError::invalid(message);
    let Some(object) = body.as_object() else {
        return Err(AnthropicError::invalid("the body must be a JSON object"));
    };
    let model = match object.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => {
            return Err(AnthropicError::invalid(
                "model: Field required (a chat route's name)",
            ))
        }
    };
    let stream = match object.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(AnthropicError::invalid("stream: must be a boolean")),
    };
    // `20` and `20.0` are one number (as in the fingerprint).
    let whole = |n: &serde_json::Number| {
        n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && (1.0..9_007_199_254_740_992.0).contains(f))
                .map(|f| f as u64)
        })
    };
    let max_tokens = match object.get("max_tokens") {
        Some(Value::Number(n)) if whole(n).is_some_and(|n| n >= 1) => {
            whole(n).map(serde_json::Number::from).expect("checked")
        }
        Some(_) => {
            return Err(AnthropicError::invalid(
                "max_tokens: must be a whole number, 1 or more",
            ))
        }
        None => return Err(AnthropicError::invalid("max_tokens: Field required")),
    };
    let mut max_blocks = MAX_BLOCKS;
    let mut messages = Vec::new();
    match object.get("system") {
        None | Some(Value::Null) => {}
        Some(system) => {
            let text = joined_text(&text_blocks(system, "system", &mut max_blocks)?);
            messages.push(json!({"role": "system", "content": text}));
        }
    }
    let conversation = match object.get("messages") {
        Some(Value::Array(list)) if !list.is_empty() => list,
        Some(Value::Array(_)) => {
            return Err(AnthropicError::invalid(
                "messages: at least one message is required",
            ))
        }
        _ => {
            return Err(AnthropicError::invalid(
                "messages: Field required (an array of messages)",
            ))
        }
    };
    if conversation.len() > MAX_MESSAGES {
        return Err(invalid(format!(
            "messages: at most {MAX_MESSAGES} messages"
        )));
    }
    for (i, message) in conversation.iter().enumerate() {
        let Some(role @ ("user" | "assistant")) = message["role"].as_str() else {
            return Err(invalid(format!(
                "messages.{i}.role: must be `user` or `assistant`"
            )));
        };
        let Some(content) = message.get("content") else {
            return Err(invalid(format!("messages.{i}.content: Field required")));
        };
        let at = format!("messages.{i}.content");
        messages.extend(turn(role, content, &at, &mut max_blocks)?);
    }
    let mut chat = Map::new();
    chat.insert("model".into(), json!(model));
    chat.insert("messages".into(), Value::Array(messages));
    chat.insert("max_tokens".into(), Value::Number(max_tokens));
    for name in ["temperature", "top_p"] {
        match object.get(name) {
            None | Some(Value::Null) => {}
            Some(Value::Number(n)) if n.as_f64().is_some_and(|v| v >= 0.0) => {
                chat.insert(name.into(), Value::Number(n.clone()));
            }
            Some(_) => return Err(invalid(format!("{name}: must be a number, 0 or more"))),
        }
    }
    match object.get("stop_sequences") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list))
            if list.len() <= MAX_STOP_SEQUENCES && list.iter().all(Value::is_string) =>
        {
            if !list.is_empty() {
                chat.insert("stop".into(), Value::Array(list.clone()));
            }
        }
        Some(_) => {
            return Err(invalid(format!(
                "stop_sequences: must be an array of at most {MAX_STOP_SEQUENCES} strings"
            )))
        }
    }
    match object.get("tools") {
        None | Some(Value::Null) => {}
        Some(tools) => {
            chat.insert("tools".into(), read_tools(tools)?);
        }
    }
    match object.get("tool_choice") {
        None | Some(Value::Null) => {}
        Some(choice) => {
            chat.insert("tool_choice".into(), read_tool_choice(choice)?);
        }
    }
    if stream {
        chat.insert("stream".into(), json!(true));
    }
    Ok(MessagesRequest {
        model,
        stream,
        chat: Value::Object(chat),
    })
}

/// `msg_<job id>`: the id every representation of a job's message shares.
fn message_id(job: &Job) -> String {
    format!("msg_{}", job.id)
}

/// The answer's usage in Anthropic's names.
fn usage(result: &Value) -> Value {
    json!({
        "input_tokens": result["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
        "output_tokens": result["usage"]["completion_tokens"].as_u64().unwrap_or(0),
    })
}

/// A tool call's arguments as a `tool_use` block's `input` (an object; `{}`
/// when they are not one).
fn tool_input(arguments: &Value) -> Value {
    arguments
        .as_str()
        .and_then(|a| serde_json::from_str::<Value>(a).ok())
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}))
}

/// The stored answer as Anthropic's `message` object.
pub fn message(job: &Job, result: &Value) -> Value {
    let mut content = Vec::new();
    let text = joined_text(&result["message"]["content"]);
    if !text.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    for call in result["message"]["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
    {
        content.push(json!({
            "type": "tool_use",
            "id": call["id"],
            "name": call["function"]["name"],
            "input": tool_input(&call["function"]["arguments"]),
        }));
    }
    let (stop_reason, stop_sequence) = messages_stop_reason(result);
    json!({
        "id": message_id(job),
        "type": "message",
        "role": "assistant",
        "model": job.task,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": usage(result),
    })
}

/// `POST /v1/messages`.
#[utoipa::path(
    post, path = "/v1/messages", tag = "anthropic-compatible",
    request_body(content = MessagesCreate, description = "An Anthropic Messages request; `model` names a chat route (see GET /v1/models). Text, tool_use and tool_result blocks; the client's own tools. The body, as sent, is the job's fingerprint."),
    params(
        ("Idempotency-Key" = String, Header, description = "Required: 1-255 printable ASCII characters, one per intent, the same on every retry"),
        ("Last-Event-ID" = Option<String>, Header, description = "With `stream: true`: the id of the last event received (1 to 18 digits); the events after it are sent. A malformed one is refused with 400 on any request"),
    ),
    responses(
        (status = 200, description = "The winning answer as a `message`. `X-Onejob-Job-Id` names the job; `Idempotent-Replayed: true` on a replay or a joined duplicate. With `stream: true`, `text/event-stream`: `message_start`, the content blocks as the provider generates them, `message_delta`, `message_stop`, each with an `id:` (send `Last-Event-ID` with the same key to resume after it), or an `error` event when the job ends without an answer.", body = MessagesMessage,
            headers(("X-Onejob-Job-Id" = String, description = "The job"), ("Idempotent-Replayed" = String, description = "`true` when the key had already made this job"))),
        (status = 400, description = "Missing or invalid Idempotency-Key, malformed JSON, or a request of the wrong shape (`invalid_request_error`)", body = AnthropicErrorBody),
        (status = 401, description = "No valid onejob API token as `x-api-key` or bearer (`authentication_error`)", body = AnthropicErrorBody),
        (status = 404, description = "`model` is not a chat route (`not_found_error`)", body = AnthropicErrorBody),
        (status = 409, description = "The key already made a request with a different body, or its job waits for support; not retried", body = AnthropicErrorBody),
        (status = 413, description = "Body too large (`request_too_large`)", body = AnthropicErrorBody),
        (status = 415, description = "Not application/json", body = AnthropicErrorBody),
        (status = 422, description = "A number no double holds exactly, or nesting too deep", body = AnthropicErrorBody),
        (status = 424, description = "The job failed (`api_error`); not retried", body = AnthropicErrorBody),
        (status = 429, description = "A stream with as many followers as `server.max_followers_per_job` allows (`rate_limit_error`); retried after `Retry-After`. Or the owner's monthly budget has no room (`rate_limit_error` with `x-should-retry: false`)", body = AnthropicErrorBody),
        (status = 503, description = "Still running when the wait ended, outcome unknown pending support, or database busy (`overloaded_error`); `Retry-After` says when to retry with the same key", body = AnthropicErrorBody,
            headers(("Retry-After" = String, description = "Seconds"))),
    ),
    security(("bearer" = []), ("x_api_key" = []))
)]
pub async fn create_message(
    app: web::Data<App>,
    caller: Caller,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, AnthropicError> {
    let key = super::idempotency::idempotency_key(&req)
        .map_err(|refusal| missing_or_bad_key(&req, refusal))?;
    let sent = json_text(&req, payload, BodyRules::of(&app.config().server)).await?;
    let request = read_request(&sent.value())?;
    let resume = super::chat_stream::last_event_id(&req)?.filter(|_| request.stream);
    let params = JsonText::parse(format!("{{\"messages_request\":{}}}", sent.as_str()))
        .map_err(|_| AnthropicError::invalid("the body could not be read"))?;
    let watch = app.watch_finishes();
    let created = app
        .create_job(
            &caller.0,
            key,
            JobRequest {
                task: request.model,
                input: JsonText::from_value(&request.chat),
                provider: None,
                params: Some(params),
                chat_route: true,
            },
        )
        .await?;
    let stuck = needs_support(&created.job, &created.attempts);
    if request.stream {
        return match created.job.status {
            JobStatus::Pending | JobStatus::Running | JobStatus::Succeeded if !stuck => {
                Ok(stream_response(&app, created.job, created.replayed, resume))
            }
            _ => answer(&created.job, stuck, created.replayed),
        };
    }
    let (job, attempts) = if created.job.status == JobStatus::Unknown || stuck {
        (created.job, created.attempts)
    } else {
        app.wait_for_answer(watch, created.job, created.attempts)
            .await?
    };
    answer(&job, needs_support(&job, &attempts), created.replayed)
}

/// The 400 for a request without a key (or with a malformed one, or
/// several), showing how the Anthropic SDK sends one.
fn missing_or_bad_key(req: &HttpRequest, refusal: super::error::ApiError) -> AnthropicError {
    if req.headers().get_all("Idempotency-Key").nth(1).is_some() {
        return AnthropicError::invalid(format!("Idempotency-Key: {}", refusal.detail));
    }
    if req.headers().contains_key("Idempotency-Key") {
        return AnthropicError::invalid("Idempotency-Key must be 1-255 printable ASCII characters");
    }
    AnthropicError::invalid(
        "onejob needs an Idempotency-Key header on every message, so that a retry rejoins \
         the same request instead of calling the provider again. Send one key per intent, \
         the same on every retry; with the Anthropic SDK: client.messages.create(..., \
         extra_headers={\"Idempotency-Key\": \"<a key for this request>\"})",
    )
}

/// The response for a job as the wait left it.
fn answer(job: &Job, stuck: bool, replayed: bool) -> Result<HttpResponse, AnthropicError> {
    if let Some(error) = job_error(job, stuck) {
        return Err(error.into());
    }
    let result = job.result.as_ref().map(|r| r.value()).unwrap_or_default();
    let mut response = HttpResponse::Ok();
    response.insert_header(("X-Onejob-Job-Id", job.id.to_string()));
    if replayed {
        response.insert_header(("Idempotent-Replayed", "true"));
    }
    Ok(response.json(message(job, &result)))
}

/// The response that follows `job`'s stream as Anthropic's events.
fn stream_response(app: &App, job: Job, replayed: bool, resume: Option<i64>) -> HttpResponse {
    let mut response = HttpResponse::Ok();
    response
        .content_type("text/event-stream")
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header(("X-Onejob-Job-Id", job.id.to_string()));
    if replayed {
        response.insert_header(("Idempotent-Replayed", "true"));
    }
    // From the first chunk whatever the resumption: which block a chunk
    // belongs to depends on the chunks before it.
    let follower = match app.follow_stream(job.clone(), 0, app.max_wait()) {
        Ok(follower) => follower,
        Err(refused) => {
            return AnthropicError::from(OpenAiError::too_many_followers(&job, &refused))
                .error_response()
        }
    };
    let events = Events {
        blocks: Blocks::default(),
        start: message_start(&job),
        follower,
        last_sent: resume.unwrap_or(-1),
        ended: false,
    };
    response.streaming(stream::unfold(events, |mut events| async move {
        let text = events.next_text().await?;
        Some((Ok::<_, Infallible>(Bytes::from(text)), events))
    }))
}

/// `message_start`'s data: the message, with no content yet.
fn message_start(job: &Job) -> Value {
    json!({
        "type": "message_start",
        "message": {
            "id": message_id(job), "type": "message", "role": "assistant", "model": job.task,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        },
    })
}

/// The content blocks a stream has opened, so each delta lands in its own
/// block: text in a text block, each tool call in a `tool_use` block.
#[derive(Debug, Default)]
struct Blocks {
    /// How many blocks were opened.
    count: u64,
    /// The block open now, and whether it is text.
    open: Option<(u64, bool)>,
    /// The block of each tool call, by the call's index.
    tools: Vec<(u64, u64)>,
}

impl Blocks {
    /// Closes the open block unless it is `keep`, then opens one with `start`.
    fn open_block(&mut self, events: &mut Vec<Value>, text: bool, start: Value) -> u64 {
        if let Some((index, _)) = self.open.take() {
            events.push(json!({"type": "content_block_stop", "index": index}));
        }
        let index = self.count;
        self.count += 1;
        self.open = Some((index, text));
        events.push(json!({"type": "content_block_start", "index": index, "content_block": start}));
        index
    }

    /// The events one released delta amounts to.
    fn events_of(&mut self, delta: &Value) -> Vec<Value> {
        let mut events = Vec::new();
        if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            let index = match self.open {
                Some((index, true)) => index,
                _ => self.open_block(&mut events, true, json!({"type": "text", "text": ""})),
            };
            events.push(json!({"type": "content_block_delta", "index": index,
                               "delta": {"type": "text_delta", "text": text}}));
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let number = call["index"].as_u64().unwrap_or(0);
            let index = match self.tools.iter().find(|(n, _)| *n == number) {
                Some(&(_, index)) => index,
                None => {
                    let start = json!({"type": "tool_use", "id": call["id"],
                        "name": call["function"]["name"].as_str().unwrap_or_default(), "input": {}});
                    let index = self.open_block(&mut events, false, start);
                    self.tools.push((number, index));
                    index
                }
            };
            if let Some(part) = call["function"]["arguments"]
                .as_str()
                .filter(|p| !p.is_empty())
            {
                events.push(json!({"type": "content_block_delta", "index": index,
                                   "delta": {"type": "input_json_delta", "partial_json": part}}));
            }
        }
        events
    }

    /// The events that end a succeeded job's stream.
    fn finish(&mut self, result: &Value) -> [Option<Value>; 3] {
        let stop = self
            .open
            .take()
            .map(|(index, _)| json!({"type": "content_block_stop", "index": index}));
        let usage = usage(result);
        let (stop_reason, stop_sequence) = messages_stop_reason(result);
        [
            stop,
            Some(json!({
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                "usage": usage,
            })),
            Some(json!({"type": "message_stop"})),
        ]
    }
}

/// One request's walk along the stream. Event ids: `0` is `message_start`,
/// `k` the events of the stream's chunk `k` (a chunk that opens a block
/// carries its `content_block_start` under the same id), then after the
/// `n` chunks `n+1` the last `content_block_stop`, `n+2` `message_delta`
/// and `n+3` `message_stop`: the same for every request under the key.
struct Events {
    blocks: Blocks,
    start: Value,
    follower: Follower,
    /// The id of the last event this client has (sent, or named by its
    /// `Last-Event-ID`); -1 before the first.
    last_sent: i64,
    ended: bool,
}

impl Events {
    /// The next events' text; `None` once the stream has ended.
    async fn next_text(&mut self) -> Option<String> {
        loop {
            if self.ended {
                return None;
            }
            if self.last_sent < 0 {
                let start = self.start.clone();
                return Some(self.events(0, [start]));
            }
            let followed = match self.follower.next().await {
                Ok(Some(followed)) => followed,
                Ok(None) => return None,
                Err(error) => {
                    self.ended = true;
                    let error = AnthropicError::from(error).body();
                    return Some(self.events(self.last_sent + 1, [error]));
                }
            };
            let text = match followed {
                Followed::Chunk(chunk) => {
                    let delta: Value = serde_json::from_str(&chunk.delta).unwrap_or_default();
                    let events = self.blocks.events_of(&delta);
                    self.events(chunk.seq, events)
                }
                Followed::Finished { job, chunks } => {
                    self.ended = true;
                    let result = job.result.as_ref().map(|r| r.value()).unwrap_or_default();
                    let mut text = String::new();
                    let mut n = chunks;
                    if chunks == 0 {
                        for delta in whole_answer_deltas(&result) {
                            n += 1;
                            let events = self.blocks.events_of(&delta);
                            text.push_str(&self.events(n, events));
                        }
                    }
                    for (id, event) in (n + 1..).zip(self.blocks.finish(&result)) {
                        text.push_str(&self.events(id, event));
                    }
                    text
                }
                Followed::Ended { job, needs_support } => self.error_event(&job, needs_support),
                Followed::StillWaiting { job } => self.error_event(&job, false),
                Followed::Quiet => KEEPALIVE.to_owned(),
            };
            // A chunk this client already has (before its Last-Event-ID)
            // moves the blocks on and sends nothing.
            if !text.is_empty() {
                return Some(text);
            }
        }
    }

    /// The error event that ends the stream of a job with no answer.
    fn error_event(&mut self, job: &Job, needs_support: bool) -> String {
        self.ended = true;
        let body = job_error(job, needs_support)
            .map(|e| AnthropicError::from(e).body())
            .unwrap_or_default();
        self.events(self.last_sent + 1, [body])
    }

    /// The text of events sharing one id, unless the client has that id
    /// already; remembers the id as sent.
    fn events(&mut self, id: i64, events: impl IntoIterator<Item = Value>) -> String {
        if id <= self.last_sent {
            return String::new();
        }
        let mut text = String::new();
        for data in events {
            let name = data["type"].as_str().unwrap_or("message").to_owned();
            text.push_str(&format!("event: {name}\nid: {id}\ndata: {data}\n\n"));
            self.last_sent = id;
        }
        text
    }
}

/// The Messages documents, for the OpenAPI document.
mod schemas {
    use serde::Serialize;
    use serde_json::Value;
    use utoipa::ToSchema;

    /// One message of a conversation.
    #[derive(ToSchema)]
    pub struct MessagesTurn {
        #[schema(pattern = "^(user|assistant)$")]
        pub role: String,
        /// A string, or an array of `{"type": "text", "text": …}` blocks
        pub content: Value,
    }

    /// An Anthropic Messages request. Members other than these are not
    /// passed on.
    #[derive(ToSchema)]
    pub struct MessagesCreate {
        /// A chat route (GET /v1/models)
        #[schema(min_length = 1)]
        pub model: String,
        #[schema(min_items = 1)]
        pub messages: Vec<MessagesTurn>,
        #[schema(minimum = 1)]
        pub max_tokens: u64,
        /// A string, or text blocks
        pub system: Option<Value>,
        /// Answer as server-sent events, as the provider generates them
        pub stream: Option<bool>,
        #[schema(minimum = 0)]
        pub temperature: Option<f64>,
        #[schema(minimum = 0)]
        pub top_p: Option<f64>,
        #[schema(max_items = 64)]
        pub stop_sequences: Option<Vec<String>>,
        /// The client's own tools: `name`, `description`, `input_schema`
        pub tools: Option<Vec<Value>>,
        /// auto, any, none, or one tool by name
        pub tool_choice: Option<Value>,
    }

    /// `message`; `id` is `msg_<job id>`.
    #[derive(Serialize, ToSchema)]
    pub struct MessagesMessage {
        pub id: String,
        pub r#type: String,
        pub role: String,
        pub model: String,
        /// `text` and `tool_use` blocks
        pub content: Vec<Value>,
        /// end_turn, max_tokens, tool_use or refusal
        pub stop_reason: Option<String>,
        pub stop_sequence: Option<String>,
        /// `input_tokens`, `output_tokens`
        pub usage: Value,
    }

    #[derive(Serialize, ToSchema)]
    pub struct AnthropicErrorDetail {
        /// invalid_request_error, authentication_error, permission_error,
        /// not_found_error, request_too_large, rate_limit_error, api_error
        /// or overloaded_error
        pub r#type: String,
        pub message: String,
    }

    /// Anthropic's error body.
    #[derive(Serialize, ToSchema)]
    pub struct AnthropicErrorBody {
        /// Always `error`
        pub r#type: String,
        pub error: AnthropicErrorDetail,
    }
}

pub use schemas::{
    AnthropicErrorBody, AnthropicErrorDetail, MessagesCreate, MessagesMessage, MessagesTurn,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::web::error::ProblemType;

    fn a_job() -> Job {
        Job::succeeded_for_tests("route", None)
    }

    #[test]
    fn a_messages_request_becomes_onejobs_chat_request() {
        let read = read_request(&json!({
            "model": "claude-route",
            "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]},
                {"role": "user", "content": [{"type": "text", "text": "Again"}]},
            ],
            "max_tokens": 64,
            "temperature": 0.5,
            "stop_sequences": ["END"],
            "metadata": {"user_id": "u1"},
            "stream": true,
        }))
        .unwrap();
        assert_eq!(read.model, "claude-route");
        assert!(read.stream);
        assert_eq!(
            read.chat,
            json!({
                "model": "claude-route",
                "messages": [
                    {"role": "system", "content": "Be brief.\n\nBe kind."},
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]},
                    {"role": "user", "content": [{"type": "text", "text": "Again"}]},
                ],
                "max_tokens": 64,
                "temperature": 0.5,
                "stop": ["END"],
                "stream": true,
            })
        );
        crate::contracts::check_chat_request(&read.chat).expect("a valid chat request");
    }

    #[test]
    fn tools_tool_use_and_tool_results_become_functions_tool_calls_and_tool_messages() {
        let read = read_request(&json!({
            "model": "m",
            "max_tokens": 50,
            "tools": [{"name": "weather", "description": "By city",
                       "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "tool", "name": "weather"},
            "messages": [
                {"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "rain"}]},
                    {"type": "text", "text": "And tomorrow?"},
                ]},
            ],
        }))
        .unwrap();
        assert_eq!(
            read.chat["messages"],
            json!([
                {"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": "Let me look.", "tool_calls": [
                    {"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "rain"},
                {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]},
            ])
        );
        assert_eq!(
            read.chat["tools"],
            json!([{"type": "function", "function": {"name": "weather", "description": "By city",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
        );
        assert_eq!(
            read.chat["tool_choice"],
            json!({"type": "function", "function": {"name": "weather"}})
        );
        crate::contracts::check_chat_request(&read.chat).expect("a valid chat request");

        // A tool call in the answer comes back as a tool_use block.
        let job = a_job();
        let result = json!({"message": {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Rome\"}"}}]},
            "finish_reason": "tool_calls", "usage": {"prompt_tokens": 1, "completion_tokens": 2}});
        let message = message(&job, &result);
        assert_eq!(
            message["content"],
            json!([{"type": "tool_use", "id": "c1", "name": "weather", "input": {"city": "Rome"}}])
        );
        assert_eq!(message["stop_reason"], "tool_use");
    }

    #[test]
    fn requests_of_the_wrong_shape_are_refused_with_what_is_wrong() {
        let base =
            json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]});
        assert!(read_request(&base).is_ok());
        for (change, expected) in [
            (json!({"model": null}), "model"),
            (json!({"max_tokens": 0}), "max_tokens"),
            (json!({"max_tokens": null}), "max_tokens"),
            (json!({"messages": []}), "messages"),
            (
                json!({"messages": [{"role": "system", "content": "x"}]}),
                "messages.0.role",
            ),
            (
                json!({"messages": [{"role": "user"}]}),
                "messages.0.content",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image"}]}]}),
                "messages.0.content.0.type",
            ),
            (
                json!({"messages": [{"role": "user", "content": 7}]}),
                "messages.0.content",
            ),
            (json!({"stream": "yes"}), "stream"),
            (json!({"temperature": "hot"}), "temperature"),
            (json!({"stop_sequences": [1]}), "stop_sequences"),
            (json!({"tools": [{"name": "f"}]}), "tools.0"),
            (
                json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
                "tools.0.type",
            ),
            (json!({"tool_choice": {"type": "tool"}}), "tool_choice"),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t",
                "name": "f", "input": {}}]}]}),
                "messages.0.content.0.type",
            ),
            (
                json!({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t",
                "name": "f", "input": "x"}]}]}),
                "messages.0.content.0",
            ),
        ] {
            let mut body = base.clone();
            for (name, value) in change.as_object().unwrap() {
                body[name] = value.clone();
            }
            let error = read_request(&body).expect_err(&format!("{change}"));
            assert_eq!(error.status, StatusCode::BAD_REQUEST);
            let body = error.body();
            assert_eq!(body["type"], "error");
            assert_eq!(body["error"]["type"], "invalid_request_error");
            let message = body["error"]["message"].as_str().unwrap();
            assert!(message.starts_with(expected), "{change}: {message}");
        }
        assert!(read_request(&json!([1])).is_err());
    }

    #[test]
    fn errors_take_the_status_and_retry_rule_of_the_chat_surface_in_anthropics_shape() {
        for (problem, status, kind) in [
            (ProblemType::Unauthorized, 401, "authentication_error"),
            (
                ProblemType::IdempotencyKeyReused,
                409,
                "invalid_request_error",
            ),
            (ProblemType::PayloadTooLarge, 413, "request_too_large"),
            (ProblemType::ServiceUnavailable, 503, "overloaded_error"),
            (ProblemType::Internal, 500, "api_error"),
        ] {
            let error = AnthropicError::from(ApiError::new(problem, "x"));
            assert_eq!(error.status.as_u16(), status, "{problem:?}");
            assert_eq!(error.body()["error"]["type"], kind, "{problem:?}");
        }
        let busy = AnthropicError::from(ApiError::new(ProblemType::ServiceUnavailable, "busy"))
            .error_response();
        assert_eq!(busy.headers().get("x-should-retry").unwrap(), "true");
        assert_eq!(busy.headers().get(header::RETRY_AFTER).unwrap(), "1");
        let reused = AnthropicError::from(ApiError::new(ProblemType::IdempotencyKeyReused, "x"))
            .error_response();
        assert_eq!(reused.headers().get("x-should-retry").unwrap(), "false");
    }

    #[test]
    fn deltas_open_one_block_each_and_the_finish_closes_the_last() {
        let mut blocks = Blocks::default();
        let first = blocks.events_of(&json!({"content": "Hel"}));
        assert_eq!(first[0]["type"], "content_block_start");
        assert_eq!(
            first[0]["content_block"],
            json!({"type": "text", "text": ""})
        );
        assert_eq!(
            first[1]["delta"],
            json!({"type": "text_delta", "text": "Hel"})
        );
        let second = blocks.events_of(&json!({"content": "lo"}));
        assert_eq!(second.len(), 1, "the text block is still open");
        let tool = blocks.events_of(&json!({"tool_calls": [{"index": 0, "id": "c1",
            "function": {"name": "f", "arguments": "{\"a\":1}"}}]}));
        let kinds: Vec<&str> = tool.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "content_block_stop",
                "content_block_start",
                "content_block_delta"
            ]
        );
        assert_eq!(tool[1]["index"], 1);
        let result = json!({"message": {"content": "Hello"}, "finish_reason": "tool_calls",
                            "usage": {"prompt_tokens": 3, "completion_tokens": 2}});
        let [stop, delta, end] = blocks.finish(&result);
        assert_eq!(stop.unwrap()["index"], 1);
        let delta = delta.unwrap();
        assert_eq!(delta["delta"]["stop_reason"], "tool_use");
        assert_eq!(
            delta["usage"],
            json!({"input_tokens": 3, "output_tokens": 2})
        );
        assert_eq!(end.unwrap()["type"], "message_stop");
    }
}
