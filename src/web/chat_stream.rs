//! A streamed chat completion (`stream: true`): the job's stream as
//! server-sent `chat.completion.chunk` events (docs/api.md, "Streaming").
//!
//! Every event carries an `id:`, the same for every request under the key:
//! `0` is the role chunk, `1..=n` the answer's chunks as they were released,
//! then `n+1` the finish reason, `n+2` the usage (when asked for) and
//! `n+3` `[DONE]`. A request with `Last-Event-ID: k` gets the events after
//! `k`. A job that ends without an answer ends its stream with one error
//! event, in OpenAI's error shape, and no `[DONE]`. The walk along the
//! job's stream is the doors' own (`chat_door::stream_response`).

use super::chat_door::{ChatCompletions, ChatError, StreamFormat};
use crate::app::Job;
use crate::chat::model::whole_answer_deltas;
use crate::chat::openai_chat::{ChunkWriter, StoredAnswer, Subject, WireDelta};
use crate::chat::Delta;

/// `chatcmpl-<job id>`: the id every representation of a job's answer shares.
pub fn completion_id(job: &Job) -> String {
    format!("chatcmpl-{}", job.id)
}

/// Who a job's answer is for, in Chat Completions' terms.
pub fn subject_of(job: &Job) -> Subject {
    Subject {
        id: completion_id(job),
        created: job.created_at.unix_seconds(),
        model: job.task.clone(),
    }
}

/// The chunks of `job`'s stream.
fn writer_of(job: &Job, include_usage: bool) -> ChunkWriter {
    ChunkWriter {
        subject: subject_of(job),
        include_usage,
    }
}

/// The events that end a succeeded job's stream, numbered after its
/// `chunks` chunks: the answer whole first if none were stored.
fn finish(writer: &ChunkWriter, job: &Job, chunks: i64) -> Vec<(i64, String)> {
    let stored = StoredAnswer::read_text(job.result.as_ref().map(|r| r.as_str()));
    let mut events = Vec::new();
    let mut n = chunks;
    if chunks == 0 {
        for delta in whole_answer_deltas(&stored.answer()) {
            n += 1;
            events.push((n, writer.delta(&WireDelta::of(&delta))));
        }
    }
    events.push((n + 1, writer.finish(&stored)));
    if let Some(usage) = writer.usage(&stored) {
        events.push((n + 2, usage));
    }
    events.push((n + 3, "[DONE]".to_owned()));
    events
}

/// A streamed chat completion's events for one request.
pub struct Chunks {
    writer: ChunkWriter,
    /// The id of the last event this client has (sent, or named by its
    /// `Last-Event-ID`); -1 before the first.
    last_sent: i64,
}

impl Chunks {
    /// The events of `job`'s stream after the client's `resume`.
    pub fn new(job: &Job, include_usage: bool, resume: Option<i64>) -> Self {
        Self {
            writer: writer_of(job, include_usage),
            last_sent: resume.unwrap_or(-1),
        }
    }

    /// One event's text; remembers its id as sent.
    fn event(&mut self, id: i64, data: &str) -> String {
        self.last_sent = self.last_sent.max(id);
        format!("id: {id}\ndata: {data}\n\n")
    }
}

impl StreamFormat for Chunks {
    type Door = ChatCompletions;

    fn opening(&mut self) -> String {
        if self.last_sent >= 0 {
            return String::new();
        }
        let role = self.writer.opening();
        self.event(0, &role)
    }

    fn chunk(&mut self, seq: i64, delta: &Delta) -> String {
        let text = self.writer.delta(&WireDelta::of(delta));
        self.event(seq, &text)
    }

    fn finished(&mut self, job: &Job, chunks: i64) -> String {
        let mut text = String::new();
        for (id, data) in finish(&self.writer, job, chunks) {
            if id > self.last_sent {
                text.push_str(&self.event(id, &data));
            }
        }
        text
    }

    fn failed(&mut self, error: ChatError<ChatCompletions>) -> String {
        let id = self.last_sent + 1;
        self.event(id, &error.body().to_string())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    fn job(result: Value) -> Job {
        Job::succeeded_for_tests("chat", Some(result))
    }

    #[test]
    fn a_stream_ends_with_its_finish_its_usage_and_done_numbered_after_its_chunks() {
        let job = job(json!({
            "message": {"role": "assistant", "content": "Hi"},
            "finish_reason": "stop",
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
        }));
        let events = finish(&writer_of(&job, true), &job, 4);
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
        assert_eq!(usage["usage"]["total_tokens"], 3);
        assert_eq!(events[2].1, "[DONE]");
    }

    #[test]
    fn an_answer_with_no_stored_chunks_is_sent_whole_first() {
        let job = job(json!({
            "message": {"role": "assistant", "content": null,
                "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "f", "arguments": "{}"}}]},
            "finish_reason": "tool_calls",
            "usage": {"total_tokens": 3},
        }));
        let events = finish(&writer_of(&job, false), &job, 0);
        let ids: Vec<i64> = events.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, [1, 2, 4], "the tool calls, the finish, [DONE]");
        let calls: Value = serde_json::from_str(&events[0].1).unwrap();
        assert_eq!(
            calls["choices"][0]["delta"],
            json!({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                "function": {"name": "f", "arguments": "{}"}}]})
        );
        assert!(calls.get("usage").is_none(), "no usage unless asked for");
    }
}
