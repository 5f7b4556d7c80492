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

use actix_web::HttpResponse;

use super::{answer_of, response_object, Stage};
use crate::app::{App, Job};
use crate::chat::responses::{event_text, OutputMessage, OutputText, StreamData};
use crate::chat::Delta;
use crate::domain::responses::{ResponseId, ResponseStatus};
use crate::domain::JobStatus;
use crate::web::chat_door::{stream_response, ChatError, Responses, StreamFormat};

/// The response that follows `job`'s stream (a `429` when the job's stream
/// has as many followers as allowed).
pub fn response(app: &App, job: Job, replayed: bool) -> HttpResponse {
    let events = Events {
        id: ResponseId::of(&job.id),
        job: job.clone(),
        sequence: 0,
        text: String::new(),
    };
    stream_response(app, job, replayed, 0, events)
}

/// One request's Responses events.
struct Events {
    id: ResponseId,
    job: Job,
    /// The next event's `sequence_number`.
    sequence: u64,
    /// The text sent so far.
    text: String,
}

impl Events {
    /// A text part of the one output message.
    fn part(&self, text: String) -> StreamData {
        StreamData::Part {
            item_id: self.id.message_id(),
            output_index: 0,
            content_index: 0,
            part: OutputText::of(text),
        }
    }

    fn delta(&mut self, delta: &str) -> String {
        self.text.push_str(delta);
        let data = StreamData::TextDelta {
            item_id: self.id.message_id(),
            output_index: 0,
            content_index: 0,
            delta: delta.to_owned(),
            logprobs: Vec::new(),
        };
        self.event("response.output_text.delta", &data)
    }

    fn response_event(&mut self, kind: &str, job: &Job, stage: Stage) -> String {
        let response = Box::new(response_object(job, stage));
        self.event(kind, &StreamData::Response { response })
    }

    /// One event's text, numbered.
    fn event(&mut self, kind: &str, data: &StreamData) -> String {
        let text = event_text(kind, self.sequence, data);
        self.sequence += 1;
        text
    }
}

impl StreamFormat for Events {
    type Door = Responses;

    /// `response.created` to `response.content_part.added`.
    fn opening(&mut self) -> String {
        let job = self.job.clone();
        let mut text = self.response_event("response.created", &job, Stage::Started);
        text.push_str(&self.response_event("response.in_progress", &job, Stage::Started));
        let item = StreamData::ItemAdded {
            output_index: 0,
            item: OutputMessage::of(&self.id, None, "in_progress"),
        };
        text.push_str(&self.event("response.output_item.added", &item));
        let part = self.part(String::new());
        text.push_str(&self.event("response.content_part.added", &part));
        text
    }

    fn chunk(&mut self, _seq: i64, delta: &Delta) -> String {
        match delta.text.as_deref().filter(|t| !t.is_empty()) {
            Some(text) => self.delta(text),
            None => String::new(),
        }
    }

    /// The events that end a succeeded job's stream: its text whole first
    /// if none was streamed (an answer stored in one piece).
    fn finished(&mut self, job: &Job, _chunks: i64) -> String {
        let answer = answer_of(job).text().to_owned();
        let mut text = String::new();
        if self.text.is_empty() && !answer.is_empty() {
            text.push_str(&self.delta(&answer));
        }
        let done = StreamData::TextDone {
            item_id: self.id.message_id(),
            output_index: 0,
            content_index: 0,
            text: answer.clone(),
            logprobs: Vec::new(),
        };
        text.push_str(&self.event("response.output_text.done", &done));
        let part = self.part(answer.clone());
        text.push_str(&self.event("response.content_part.done", &part));
        let response = response_object(job, Stage::AsIs);
        let item = StreamData::ItemAdded {
            output_index: 0,
            item: OutputMessage::of(&self.id, Some(answer), "completed"),
        };
        text.push_str(&self.event("response.output_item.done", &item));
        let kind = match response.status {
            ResponseStatus::Incomplete => "response.incomplete",
            _ => "response.completed",
        };
        let response = Box::new(response);
        text.push_str(&self.event(kind, &StreamData::Response { response }));
        text
    }

    /// An `error` event: OpenAI's error members at its top level.
    fn failed(&mut self, error: ChatError<Responses>) -> String {
        let detail = &error.detail;
        let data = StreamData::Error {
            code: detail.code.map(|code| code.into()),
            message: Some(detail.message.to_string()),
            param: detail.param.as_deref().map(str::to_owned),
        };
        self.event("error", &data)
    }

    /// The event that ends the stream of a job with no answer.
    fn ended(&mut self, job: &Job, needs_support: bool) -> String {
        match job.status {
            JobStatus::Failed => self.response_event("response.failed", job, Stage::AsIs),
            JobStatus::Cancelled => self.response_event("response.cancelled", job, Stage::AsIs),
            _ => match crate::web::chat_door::job_error::<Responses>(job, needs_support) {
                Some(error) => self.failed(error),
                None => String::new(),
            },
        }
    }
}
