//! A streamed response (`stream: true`): the job's stream (`app::streams`)
//! as the Responses API's server-sent events, each `event: <type>` with a
//! `data` that carries its `type` and `sequence_number`.
//!
//! The events, numbered from 0: `response.created`, `response.in_progress`,
//! `response.output_item.added`, `response.content_part.added`, one
//! `response.output_text.delta` per released chunk with text, then
//! `response.output_text.done`, `response.content_part.done`,
//! `response.output_item.done` and `response.completed` (or
//! `response.incomplete` when the answer was cut at the token limit). A
//! job that fails ends with `response.failed`, one cancelled with
//! `response.cancelled`; one still unfinished when the wait ends (or whose
//! outcome is unknown, or that waits for support) with an `error` event.
//!
//! Every request under the key follows the same stream from its first
//! chunk, so a reconnect (or a duplicate) gets the same events, numbered
//! the same, from one upstream call.

use std::convert::Infallible;

use actix_web::http::header;
use actix_web::web::Bytes;
use actix_web::{HttpResponse, ResponseError};
use futures_util::stream;
use serde_json::{json, Value};

use super::{output_message, response_object, OutputText, Stage};
use crate::app::streams::{Followed, Follower};
use crate::app::{App, Job};
use crate::domain::responses::{self as rules, ResponseId};
use crate::domain::JobStatus;
use crate::web::chat_stream::KEEPALIVE;
use crate::web::openai_compat::{job_error, OpenAiError};

/// The response that follows `job`'s stream (a `429` when the job's stream
/// has as many followers as allowed).
pub fn response(app: &App, job: Job, replayed: bool) -> HttpResponse {
    let follower = match app.follow_stream(job.clone(), 0, app.max_wait()) {
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
        id: ResponseId::of(&job.id),
        job,
        follower,
        sequence: 0,
        text: String::new(),
        started: false,
        ended: false,
    };
    response.streaming(stream::unfold(events, |mut events| async move {
        let text = events.next_text().await?;
        Some((Ok::<_, Infallible>(Bytes::from(text)), events))
    }))
}

/// One request's walk along the stream.
struct Events {
    id: ResponseId,
    job: Job,
    follower: Follower,
    /// The next event's `sequence_number`.
    sequence: u64,
    /// The text sent so far.
    text: String,
    started: bool,
    ended: bool,
}

impl Events {
    /// The next events' text; `None` once the stream has ended.
    async fn next_text(&mut self) -> Option<String> {
        if self.ended {
            return None;
        }
        if !self.started {
            self.started = true;
            return Some(self.opening());
        }
        let followed = match self.follower.next().await {
            Ok(Some(followed)) => followed,
            Ok(None) => return None,
            Err(error) => {
                self.ended = true;
                let body = OpenAiError::from(error).body();
                return Some(self.error_event(json!(body)["error"].clone()));
            }
        };
        Some(match followed {
            Followed::Chunk(chunk) => {
                let delta: Value = serde_json::from_str(&chunk.delta).unwrap_or_default();
                match delta["content"].as_str().filter(|t| !t.is_empty()) {
                    Some(text) => self.delta(text),
                    None => String::new(),
                }
            }
            Followed::Finished { job, .. } => {
                self.ended = true;
                self.finish(&job)
            }
            Followed::Ended { job, needs_support } => {
                self.ended = true;
                self.ending(&job, needs_support)
            }
            Followed::StillWaiting { job } => {
                self.ended = true;
                self.ending(&job, false)
            }
            Followed::Quiet => KEEPALIVE.to_owned(),
        })
    }

    /// `response.created` to `response.content_part.added`.
    fn opening(&mut self) -> String {
        let started = json!(response_object(&self.job, Stage::Started));
        let item_id = self.id.message_id();
        let mut text = self.event("response.created", json!({"response": started}));
        text.push_str(&self.event("response.in_progress", json!({"response": started})));
        let item = json!(output_message(&self.id, String::new(), "in_progress"));
        let mut item = item;
        item["content"] = json!([]);
        text.push_str(&self.event(
            "response.output_item.added",
            json!({"output_index": 0, "item": item}),
        ));
        text.push_str(&self.event(
            "response.content_part.added",
            json!({"item_id": item_id, "output_index": 0, "content_index": 0,
                   "part": OutputText::of(String::new())}),
        ));
        text
    }

    fn delta(&mut self, delta: &str) -> String {
        self.text.push_str(delta);
        let item_id = self.id.message_id();
        self.event(
            "response.output_text.delta",
            json!({"item_id": item_id, "output_index": 0, "content_index": 0,
                   "delta": delta, "logprobs": []}),
        )
    }

    /// The events that end a succeeded job's stream: its text whole first
    /// if none was streamed (an answer stored in one piece).
    fn finish(&mut self, job: &Job) -> String {
        let result = job.result.as_ref().map(|r| r.value()).unwrap_or_default();
        let answer = rules::answer_text(&result);
        let mut text = String::new();
        if self.text.is_empty() && !answer.is_empty() {
            text.push_str(&self.delta(&answer));
        }
        let item_id = self.id.message_id();
        text.push_str(&self.event(
            "response.output_text.done",
            json!({"item_id": item_id, "output_index": 0, "content_index": 0,
                   "text": answer, "logprobs": []}),
        ));
        text.push_str(&self.event(
            "response.content_part.done",
            json!({"item_id": item_id, "output_index": 0, "content_index": 0,
                   "part": OutputText::of(answer.clone())}),
        ));
        let response = json!(response_object(job, Stage::AsIs));
        text.push_str(&self.event(
            "response.output_item.done",
            json!({"output_index": 0, "item": response["output"][0]}),
        ));
        let kind = match response["status"].as_str() {
            Some("incomplete") => "response.incomplete",
            _ => "response.completed",
        };
        text.push_str(&self.event(kind, json!({ "response": response })));
        text
    }

    /// The event that ends the stream of a job with no answer.
    fn ending(&mut self, job: &Job, needs_support: bool) -> String {
        match job.status {
            JobStatus::Failed => {
                let response = json!(response_object(job, Stage::AsIs));
                self.event("response.failed", json!({ "response": response }))
            }
            JobStatus::Cancelled => {
                let response = json!(response_object(job, Stage::AsIs));
                self.event("response.cancelled", json!({ "response": response }))
            }
            _ => {
                let error = job_error(job, needs_support)
                    .map(|e| json!(e.body())["error"].clone())
                    .unwrap_or_default();
                self.error_event(error)
            }
        }
    }

    /// An `error` event: OpenAI's error members at its top level.
    fn error_event(&mut self, error: Value) -> String {
        self.event(
            "error",
            json!({"code": error["code"], "message": error["message"], "param": error["param"]}),
        )
    }

    /// One event's text, numbered.
    fn event(&mut self, kind: &str, mut data: Value) -> String {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        format!("event: {kind}\ndata: {data}\n\n")
    }
}
