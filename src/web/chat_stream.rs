//! A streamed chat completion (`stream: true`): the job's stream as
//! server-sent `chat.completion.chunk` events (docs/api.md, "Streaming").
//!
//! Every event carries an `id:`, the same for every request under the key:
//! `0` is the role chunk, `1..=n` the answer's chunks as they were released,
//! then `n+1` the finish reason, `n+2` the usage (when asked for) and
//! `n+3` `[DONE]`. A request with `Last-Event-ID: k` gets the events after
//! `k`. A job that ends without an answer ends its stream with one error
//! event, in OpenAI's error shape, and no `[DONE]`.

use std::convert::Infallible;

use actix_web::http::header;
use actix_web::web::Bytes;
use actix_web::{HttpRequest, HttpResponse};
use futures_util::stream;
use serde_json::{json, Value};

use actix_web::ResponseError;

use super::openai_compat::{completion_id, job_error, OpenAiError};
use crate::app::streams::{Followed, Follower};
use crate::app::{App, Job};
use crate::providers::streaming::whole_answer_deltas;

/// What a `Last-Event-ID` may be, for the OpenAPI document: an event id,
/// 1 to 18 decimal digits (so it always fits an `i64`).
pub const LAST_EVENT_ID_PATTERN: &str = "^[0-9]{1,18}$";

/// The `Last-Event-ID` a reconnecting client sent: the events after it
/// are sent. A value that is not an event id ([`LAST_EVENT_ID_PATTERN`]) is
/// a 400, on any request.
pub fn last_event_id(req: &HttpRequest) -> Result<Option<i64>, OpenAiError> {
    let Some(value) = req.headers().get("Last-Event-ID") else {
        return Ok(None);
    };
    match parse_event_id(value.as_bytes()) {
        Some(id) => Ok(Some(id)),
        None => Err(OpenAiError::invalid_request(
            "Last-Event-ID must be the id of an event of this stream: a whole number, 0 or more",
        )
        .param("Last-Event-ID")),
    }
}

/// What a quiet stream sends every `server.stream_keepalive_ms`: an SSE
/// comment, which clients (the SDKs' parsers, `EventSource`) pass over.
pub const KEEPALIVE: &str = ": keep-alive\n\n";

/// The id of a stream's event as a client sent it back (`Last-Event-ID`):
/// 1 to 18 decimal digits ([`LAST_EVENT_ID_PATTERN`]), else `None`.
pub fn parse_event_id(value: &[u8]) -> Option<i64> {
    std::str::from_utf8(value)
        .ok()
        .filter(|v| (1..=18).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|v| v.parse::<i64>().ok())
}

/// The response that follows `job`'s stream (a `429` when the job's stream
/// has as many followers as allowed).
pub fn response(
    app: &App,
    job: Job,
    replayed: bool,
    include_usage: bool,
    resume: Option<i64>,
) -> HttpResponse {
    let follower = match app.follow_stream(job.clone(), resume.unwrap_or(0), app.max_wait()) {
        Ok(follower) => follower,
        Err(refused) => return OpenAiError::too_many_followers(&job, &refused).error_response(),
    };
    let mut response = HttpResponse::Ok();
    response
        .content_type("text/event-stream")
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header(("X-Onejob-Job-Id", job.id.to_string()));
    if replayed {
        response.insert_header(("Idempotent-Replayed", "true"));
    }
    let events = Events {
        shape: Shape::of(&job, include_usage),
        follower,
        last_sent: resume.unwrap_or(-1),
        ended: false,
    };
    response.streaming(stream::unfold(events, |mut events| async move {
        let text = events.next_text().await?;
        Some((Ok::<_, Infallible>(Bytes::from(text)), events))
    }))
}

/// What every chunk of one job's stream shares.
struct Shape {
    id: String,
    created: i64,
    model: String,
    include_usage: bool,
}

impl Shape {
    fn of(job: &Job, include_usage: bool) -> Self {
        Self {
            id: completion_id(job),
            created: job.created_at / 1000,
            model: job.task.clone(),
            include_usage,
        }
    }

    /// A `chat.completion.chunk` with one choice.
    fn chunk(&self, delta: Value, finish_reason: Value) -> Value {
        let mut chunk = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": null}],
        });
        if self.include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    /// The last chunk when usage was asked for: no choices, the usage.
    fn usage(&self, usage: Value) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": [],
            "usage": usage,
        })
    }

    /// The events that end a succeeded job's stream, numbered after its
    /// `chunks` chunks: the answer whole first if none were stored.
    fn finish(&self, job: &Job, chunks: i64) -> Vec<(i64, String)> {
        let result = job.result.as_ref().map(|r| r.value()).unwrap_or_default();
        let mut events = Vec::new();
        let mut n = chunks;
        if chunks == 0 {
            for delta in whole_answer_deltas(&result) {
                n += 1;
                events.push((n, self.chunk(delta, Value::Null).to_string()));
            }
        }
        events.push((
            n + 1,
            self.chunk(json!({}), result["finish_reason"].clone())
                .to_string(),
        ));
        if self.include_usage {
            events.push((n + 2, self.usage(result["usage"].clone()).to_string()));
        }
        events.push((n + 3, "[DONE]".to_owned()));
        events
    }
}

/// One request's walk along the stream.
struct Events {
    shape: Shape,
    follower: Follower,
    /// The id of the last event this client has (sent, or named by its
    /// `Last-Event-ID`); -1 before the first.
    last_sent: i64,
    ended: bool,
}

impl Events {
    /// The next events' text; `None` once the stream has ended.
    async fn next_text(&mut self) -> Option<String> {
        if self.ended {
            return None;
        }
        if self.last_sent < 0 {
            let role = self
                .shape
                .chunk(json!({"role": "assistant", "content": ""}), Value::Null);
            return Some(self.event(0, &role.to_string()));
        }
        let followed = match self.follower.next().await {
            Ok(Some(followed)) => followed,
            Ok(None) => return None,
            Err(error) => {
                self.ended = true;
                let body = OpenAiError::from(error).body();
                let id = self.last_sent + 1;
                return Some(self.event(id, &json!(body).to_string()));
            }
        };
        Some(match followed {
            Followed::Chunk(chunk) => {
                let delta: Value = serde_json::from_str(&chunk.delta).unwrap_or_default();
                let text = self.shape.chunk(delta, Value::Null).to_string();
                self.event(chunk.seq, &text)
            }
            Followed::Finished { job, chunks } => {
                self.ended = true;
                let mut text = String::new();
                for (id, data) in self.shape.finish(&job, chunks) {
                    if id > self.last_sent {
                        text.push_str(&self.event(id, &data));
                    }
                }
                text
            }
            Followed::Ended { job, needs_support } => self.error_event(&job, needs_support),
            Followed::StillWaiting { job } => self.error_event(&job, false),
            Followed::Quiet => KEEPALIVE.to_owned(),
        })
    }

    /// The error event that ends the stream of a job with no answer.
    fn error_event(&mut self, job: &Job, needs_support: bool) -> String {
        self.ended = true;
        let body = job_error(job, needs_support)
            .map(|e| json!(e.body()))
            .unwrap_or_default();
        let id = self.last_sent + 1;
        self.event(id, &body.to_string())
    }

    /// One event's text; remembers its id as sent.
    fn event(&mut self, id: i64, data: &str) -> String {
        self.last_sent = self.last_sent.max(id);
        format!("id: {id}\ndata: {data}\n\n")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn job(result: Value) -> Job {
        Job::succeeded_for_tests("chat", Some(result))
    }

    #[test]
    fn a_stream_ends_with_its_finish_its_usage_and_done_numbered_after_its_chunks() {
        let job = job(json!({
            "message": {"role": "assistant", "content": "Hi"},
            "finish_reason": "stop",
            "usage": {"total_tokens": 3},
        }));
        let shape = Shape::of(&job, true);
        let events = shape.finish(&job, 4);
        let ids: Vec<i64> = events.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, [5, 6, 7]);
        let finish: Value = serde_json::from_str(&events[0].1).unwrap();
        assert_eq!(finish["choices"][0]["finish_reason"], "stop");
        assert_eq!(finish["choices"][0]["delta"], json!({}));
        assert!(finish["usage"].is_null() && finish.get("usage").is_some());
        assert_eq!(finish["id"], format!("chatcmpl-{}", job.id));
        assert_eq!(finish["created"], 5);
        let usage: Value = serde_json::from_str(&events[1].1).unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"], json!({"total_tokens": 3}));
        assert_eq!(events[2].1, "[DONE]");
    }

    #[test]
    fn an_answer_with_no_stored_chunks_is_sent_whole_first() {
        let job = job(json!({
            "message": {"role": "assistant", "content": null,
                "tool_calls": [{"id": "c1", "type": "function"}]},
            "finish_reason": "tool_calls",
            "usage": {"total_tokens": 3},
        }));
        let events = Shape::of(&job, false).finish(&job, 0);
        let ids: Vec<i64> = events.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, [1, 2, 4], "the tool calls, the finish, [DONE]");
        let calls: Value = serde_json::from_str(&events[0].1).unwrap();
        assert_eq!(
            calls["choices"][0]["delta"],
            json!({"tool_calls": [{"id": "c1", "type": "function", "index": 0}]})
        );
        assert!(calls.get("usage").is_none(), "no usage unless asked for");
    }
}
