//! `POST /v1/messages`: job creation in Anthropic's Messages wire format, so
//! a client written against the Anthropic SDK switches to onejob by
//! changing its `base_url` (and passing an `Idempotency-Key`).
//!
//! - The onejob API token comes as `x-api-key` (how the Anthropic SDK sends
//!   its `api_key`) or as a bearer token.
//! - `model` names a chat route, as on `/v1/chat/completions`. The request
//!   is read by its codec (`chat::anthropic`) into the chat model, and the
//!   job's input is that request as a Chat Completions request, so every
//!   provider kind serves it. The body as sent is kept in the job's params
//!   (`messages_request`), so the fingerprint covers exactly what the client
//!   sent, and a Chat Completions request under the same key is another
//!   payload. What onejob cannot carry is a 400 naming it.
//! - The job is made or joined, waited for and streamed by the doors'
//!   shared flow (`chat_door`); the answer is the winning attempt's, as an
//!   Anthropic `message`, or with `stream: true` Anthropic's event
//!   sequence, with the same resumption by `Last-Event-ID`.
//! - Errors are the doors' one error, in Anthropic's body
//!   (`{"type": "error", "error": {"type", "message"}}`).

use actix_web::{web, HttpRequest, HttpResponse};

use super::auth::Caller;
use super::body::{json_text, BodyRules};
use super::chat_door::{
    answered, create_or_join, idempotency_key, last_event_id, stream_response, ChatError, Delivery,
    DoorRequest, Messages, Settled, StreamFormat,
};
use crate::app::{App, Job};
use crate::chat::anthropic::{self, BlockWriter, DoorEvent, Subject};
use crate::chat::model::whole_answer_deltas;
use crate::chat::openai_chat::{self, StoredAnswer, Target};
use crate::chat::{Answer, Delta};
use crate::domain::JsonText;

/// The door's error: Anthropic's body.
pub type AnthropicError = ChatError<Messages>;

/// `msg_<job id>`: the id every representation of a job's message shares.
fn subject_of(job: &Job) -> Subject {
    Subject {
        id: format!("msg_{}", job.id),
        model: job.task.clone(),
    }
}

/// A succeeded job's answer.
fn answer_of(job: &Job) -> Answer {
    StoredAnswer::read_text(job.result.as_ref().map(|r| r.as_str())).answer()
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
        (status = 200, description = "The winning answer as a `message`. `X-Onejob-Job-Id` names the job; `Idempotent-Replayed: true` on a replay or a joined duplicate. With `stream: true`, `text/event-stream`: `message_start`, the content blocks as the provider generates them, `message_delta`, `message_stop`, each with an `id:` (send `Last-Event-ID` with the same key to resume after it), or an `error` event when the job ends without an answer.", body = MessageObject,
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
    let key = idempotency_key(&req)?;
    let sent = json_text(&req, payload, BodyRules::of(&app.config().server)).await?;
    let read = anthropic::read_request(&sent.value())?;
    let stream = read.request.stream;
    let resume = last_event_id(&req)?.filter(|_| stream);
    let member = crate::domain::fingerprint::MESSAGES_BODY;
    let params = JsonText::parse(format!("{{\"{member}\":{}}}", sent.as_str()))
        .map_err(|_| AnthropicError::invalid_request("the body could not be read"))?;
    let input = openai_chat::write_request(&read.request, Target::Input { route: &read.route });
    let request = DoorRequest {
        route: read.route.clone(),
        input: JsonText::from_value(&serde_json::to_value(input).expect("a request serializes")),
        params: Some(params),
        delivery: Delivery::streamed_or_waited(stream),
    };
    Ok(match create_or_join(&app, &caller, key, request).await? {
        // From the first chunk whatever the resumption: which block a chunk
        // belongs to depends on the chunks before it.
        Settled::Stream { job, replayed } => {
            let events = Events::new(&job, resume);
            stream_response(&app, job, replayed, 0, events)
        }
        Settled::Answer { job, replayed } => {
            answered(&job, replayed).json(anthropic::message(&subject_of(&job), &answer_of(&job)))
        }
    })
}

/// One request's walk along the stream, as Anthropic's events. Event ids:
/// `0` is `message_start`, `k` the events of the stream's chunk `k` (a
/// chunk that opens a block carries its `content_block_start` under the
/// same id), then after the `n` chunks `n+1` the last
/// `content_block_stop`, `n+2` `message_delta` and `n+3` `message_stop`:
/// the same for every request under the key.
struct Events {
    blocks: BlockWriter,
    subject: Subject,
    /// The id of the last event this client has (sent, or named by its
    /// `Last-Event-ID`); -1 before the first.
    last_sent: i64,
}

impl Events {
    fn new(job: &Job, resume: Option<i64>) -> Self {
        Self {
            blocks: BlockWriter::default(),
            subject: subject_of(job),
            last_sent: resume.unwrap_or(-1),
        }
    }

    /// The text of events sharing one id, unless the client has that id
    /// already; remembers the id as sent.
    fn events(&mut self, id: i64, events: impl IntoIterator<Item = DoorEvent>) -> String {
        if id <= self.last_sent {
            return String::new();
        }
        let mut text = String::new();
        for event in events {
            text.push_str(&format!(
                "event: {}\nid: {id}\ndata: {}\n\n",
                event.name(),
                event.data()
            ));
            self.last_sent = id;
        }
        text
    }
}

impl StreamFormat for Events {
    type Door = Messages;

    fn opening(&mut self) -> String {
        let start = BlockWriter::opening(&self.subject);
        self.events(0, [start])
    }

    fn chunk(&mut self, seq: i64, delta: &Delta) -> String {
        let events = self.blocks.delta(delta);
        self.events(seq, events)
    }

    fn finished(&mut self, job: &Job, chunks: i64) -> String {
        let answer = answer_of(job);
        let mut text = String::new();
        let mut n = chunks;
        if chunks == 0 {
            for delta in whole_answer_deltas(&answer) {
                n += 1;
                let events = self.blocks.delta(&delta);
                text.push_str(&self.events(n, events));
            }
        }
        for (id, event) in (n + 1..).zip(self.blocks.finish(&answer)) {
            text.push_str(&self.events(id, event));
        }
        text
    }

    fn failed(&mut self, error: AnthropicError) -> String {
        let event = DoorEvent::error(error.detail.status.as_u16(), &error.detail.message);
        self.events(self.last_sent + 1, [event])
    }
}

/// The Messages request, for the OpenAPI document: the checked schema
/// (`web::openapi`) replaces it, spelling out the codec's rules.
mod schemas {
    use utoipa::ToSchema;

    /// An Anthropic Messages request.
    #[derive(ToSchema)]
    pub struct MessagesCreate {
        /// A chat route (GET /v1/models)
        #[schema(min_length = 1)]
        pub model: String,
    }
}

pub use crate::chat::anthropic::{AnthropicErrorBody, ErrorDetail, MessageObject, OutBlock};
pub use schemas::MessagesCreate;

#[cfg(test)]
mod tests {
    use actix_web::http::header;
    use actix_web::ResponseError;
    use serde_json::json;

    use super::*;
    use crate::web::error::{ApiError, ProblemType};

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
            assert_eq!(error.detail.status.as_u16(), status, "{problem:?}");
            assert_eq!(error.body()["error"]["type"], kind, "{problem:?}");
        }
        let busy = AnthropicError::from(ApiError::new(ProblemType::ServiceUnavailable, "busy"))
            .error_response();
        assert_eq!(busy.headers().get("x-should-retry").unwrap(), "true");
        assert_eq!(busy.headers().get(header::RETRY_AFTER).unwrap(), "1");
    }

    #[test]
    fn a_refused_request_names_what_is_wrong_in_anthropics_shape() {
        let refused = anthropic::read_request(&json!({"model": "m", "max_tokens": 0,
            "messages": [{"role": "user", "content": "Hi"}]}))
        .unwrap_err();
        let body = AnthropicError::from(refused).body();
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("max_tokens"));
    }

    #[test]
    fn a_resumed_stream_sends_only_the_events_after_its_last_event_id() {
        let job = Job::succeeded_for_tests(
            "route",
            Some(json!({"message": {"role": "assistant", "content": "Hello"},
                "finish_reason": "stop", "usage": {"prompt_tokens": 3, "completion_tokens": 2}})),
        );
        let mut whole = Events::new(&job, None);
        let text = whole.opening() + &whole.finished(&job, 0);
        let ids: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("id: "))
            .collect();
        assert_eq!(ids, ["0", "1", "1", "2", "3", "4"]);
        assert!(text.contains("\"stop_reason\":\"end_turn\""), "{text}");
        let mut resumed = Events::new(&job, Some(2));
        assert_eq!(resumed.opening(), "");
        let text = resumed.finished(&job, 0);
        let names: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("event: "))
            .collect();
        assert_eq!(names, ["message_delta", "message_stop"]);
    }
}
