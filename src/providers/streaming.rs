//! Streamed answers from OpenAI-compatible providers: the upstream's
//! server-sent events are parsed (`eventsource-stream`), each delta is
//! handed on as it arrives, and the final answer is built from the deltas,
//! so the stored answer is exactly what was streamed.
//!
//! The deltas handed on are what a client's `chat.completion.chunk` carries
//! in `choices[0].delta`: `{"content": …}` or `{"tool_calls": […]}`. The
//! role, the finish reason and the usage are not deltas: they are part of
//! the final answer, which onejob sends at the stream's end.

use eventsource_stream::{EventStreamError, Eventsource};
use futures_util::StreamExt;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::domain::outcome::Reason;
use crate::domain::Outcome;

/// Where a streaming call hands each delta as it arrives.
pub type DeltaSink = mpsc::Sender<Value>;

/// The most tool calls one answer may stream (an index past it is refused
/// as invalid output, not grown into).
const MAX_TOOL_CALLS: usize = 128;

/// The answer put together from a stream's chunks, in onejob's one answer
/// shape (see `providers::chat`).
#[derive(Debug, Default)]
pub struct Assembly {
    content: String,
    has_content: bool,
    tool_calls: Vec<Value>,
    finish_reason: Option<String>,
    usage: Option<Value>,
}

impl Assembly {
    /// Takes in one upstream `chat.completion.chunk`; returns the delta to
    /// hand on, if it adds to the answer.
    pub fn add(&mut self, chunk: &Value) -> Result<Option<Value>, String> {
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(usage.clone());
        }
        let Some(choice) = chunk["choices"].get(0) else {
            return Ok(None);
        };
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.finish_reason = Some(reason.to_owned());
        }
        let delta = &choice["delta"];
        let mut handed_on = Map::new();
        if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            self.content.push_str(text);
            self.has_content = true;
            handed_on.insert("content".into(), json!(text));
        }
        if let Some(calls) = delta["tool_calls"].as_array().filter(|c| !c.is_empty()) {
            for call in calls {
                self.add_tool_call(call)?;
            }
            handed_on.insert("tool_calls".into(), Value::Array(calls.clone()));
        }
        Ok((!handed_on.is_empty()).then_some(Value::Object(handed_on)))
    }

    /// A tool call's delta: the first names it, the next ones add to its
    /// arguments.
    fn add_tool_call(&mut self, call: &Value) -> Result<(), String> {
        let index = call["index"].as_u64().unwrap_or(0) as usize;
        if index >= MAX_TOOL_CALLS {
            return Err(format!(
                "the stream has more than {MAX_TOOL_CALLS} tool calls"
            ));
        }
        while self.tool_calls.len() <= index {
            self.tool_calls.push(
                json!({"id": null, "type": "function", "function": {"name": "", "arguments": ""}}),
            );
        }
        let known = &mut self.tool_calls[index];
        for member in ["id", "type"] {
            if let Some(value) = call.get(member).filter(|v| v.is_string()) {
                known[member] = value.clone();
            }
        }
        for member in ["name", "arguments"] {
            if let Some(part) = call["function"][member].as_str() {
                // Appended in place: an answer of many small pieces costs
                // its length, not its length squared.
                match &mut known["function"][member] {
                    Value::String(so_far) => so_far.push_str(part),
                    other => *other = json!(part),
                }
            }
        }
        Ok(())
    }

    /// Whether the stream said how it finished.
    pub fn finished(&self) -> bool {
        self.finish_reason.is_some()
    }

    /// The tokens the stream's usage says the call used.
    pub fn tokens_used(&self) -> Option<u64> {
        let usage = self.usage.as_ref()?;
        usage["total_tokens"].as_u64().or_else(|| {
            Some(
                usage["prompt_tokens"].as_u64()? + usage["completion_tokens"].as_u64().unwrap_or(0),
            )
        })
    }

    /// The answer, as a non-streamed call would have given it.
    pub fn answer(self) -> Value {
        let mut message = json!({
            "role": "assistant",
            "content": if self.has_content || self.tool_calls.is_empty() {
                json!(self.content)
            } else {
                Value::Null
            },
        });
        if !self.tool_calls.is_empty() {
            message["tool_calls"] = Value::Array(self.tool_calls);
        }
        json!({
            "message": message,
            "finish_reason": self.finish_reason.unwrap_or_else(|| "stop".to_owned()),
            "usage": self.usage.unwrap_or_else(|| json!({
                "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0
            })),
        })
    }
}

/// The deltas of an answer that arrived whole (a provider that does not
/// stream, or a job that stored no chunks): its content in one delta, its
/// tool calls (numbered) in another.
pub fn whole_answer_deltas(answer: &Value) -> Vec<Value> {
    let message = &answer["message"];
    let mut deltas = Vec::new();
    if let Some(text) = message["content"].as_str().filter(|t| !t.is_empty()) {
        deltas.push(json!({ "content": text }));
    }
    if let Some(calls) = message["tool_calls"].as_array().filter(|c| !c.is_empty()) {
        let numbered = calls
            .iter()
            .enumerate()
            .map(|(i, call)| {
                let mut call = call.clone();
                call["index"] = json!(i);
                call
            })
            .collect();
        deltas.push(json!({ "tool_calls": Value::Array(numbered) }));
    }
    deltas
}

/// Why reading a stream's bytes stopped early.
#[derive(Debug)]
enum ReadError {
    Transport(reqwest::Error),
    TooLarge,
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Transport(e) => write!(f, "{}", super::http::error_chain(e)),
            Self::TooLarge => f.write_str("too large"),
        }
    }
}

/// Reads an OpenAI-compatible event stream to its end, handing each delta
/// to `sink` as it arrives, at most `cap` bytes in all. What it ends in:
///
/// - `[DONE]`, or the end of the body after a finish reason: the answer
///   built from the deltas, and the tokens its usage says;
/// - an `error` event: a definite failure (the provider ended the answer);
/// - a cut connection, a body that ends unfinished, or garbled data:
///   unknown (the provider may have finished and billed);
/// - more than `cap` bytes: a definite failure (`invalid_output`), as for
///   an answer too large to read whole.
pub async fn read_stream(
    response: reqwest::Response,
    cap: usize,
    sink: &DeltaSink,
) -> (Outcome, Option<u64>) {
    let mut read = 0usize;
    let bytes = response.bytes_stream().map(move |chunk| {
        let chunk = chunk.map_err(ReadError::Transport)?;
        read += chunk.len();
        if read > cap {
            return Err(ReadError::TooLarge);
        }
        Ok(chunk)
    });
    let mut events = Box::pin(bytes.eventsource());
    let mut assembly = Assembly::default();
    let outcome = loop {
        let event = match events.next().await {
            None if assembly.finished() => break None,
            None => {
                break Some(Outcome::Unknown(Reason::new(
                    "the stream ended before the answer was finished",
                )))
            }
            Some(Ok(event)) => event,
            Some(Err(EventStreamError::Transport(ReadError::TooLarge))) => {
                break Some(Outcome::Failed(Reason::invalid_output(format!(
                    "the streamed answer is larger than the {cap} bytes allowed (max_response_bytes)"
                ))))
            }
            Some(Err(e)) => {
                let detail = match e {
                    EventStreamError::Transport(e) => e.to_string(),
                    EventStreamError::Utf8(e) => e.to_string(),
                    EventStreamError::Parser(e) => e.to_string(),
                };
                break Some(Outcome::Unknown(
                    Reason::new("the stream was cut off").with_detail(&detail),
                ));
            }
        };
        let data = event.data.trim();
        if data == "[DONE]" {
            break None;
        }
        if data.is_empty() {
            continue;
        }
        let chunk: Value = match serde_json::from_str(data) {
            Ok(chunk) => chunk,
            Err(e) => {
                break Some(Outcome::Unknown(
                    Reason::new("the stream sent garbled data").with_detail(&e.to_string()),
                ))
            }
        };
        if let Some(error) = chunk.get("error").filter(|e| !e.is_null()) {
            let message = error["message"].as_str().unwrap_or("no message");
            break Some(Outcome::Failed(Reason::new(format!(
                "the provider ended the stream with an error: {message}"
            ))));
        }
        match assembly.add(&chunk) {
            Ok(Some(delta)) => {
                // The worker stopped listening (a timeout): nothing more to do.
                if sink.send(delta).await.is_err() {
                    break Some(Outcome::Unknown(Reason::new("the stream was abandoned")));
                }
            }
            Ok(None) => {}
            Err(reason) => break Some(Outcome::Failed(Reason::invalid_output(reason))),
        }
    };
    match outcome {
        Some(outcome) => (outcome, assembly.tokens_used()),
        None => {
            let tokens = assembly.tokens_used();
            (Outcome::Succeeded(assembly.answer()), tokens)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(delta: Value, finish: Value) -> Value {
        json!({"object": "chat.completion.chunk",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    }

    #[test]
    fn the_answer_is_the_deltas_put_together() {
        let mut assembly = Assembly::default();
        let handed: Vec<Option<Value>> = [
            chunk(json!({"role": "assistant", "content": ""}), Value::Null),
            chunk(json!({"content": "Hel"}), Value::Null),
            chunk(json!({"content": "lo"}), Value::Null),
            chunk(json!({}), json!("stop")),
            json!({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}}),
        ]
        .iter()
        .map(|c| assembly.add(c).unwrap())
        .collect();
        assert_eq!(
            handed,
            [
                None,
                Some(json!({"content": "Hel"})),
                Some(json!({"content": "lo"})),
                None,
                None
            ]
        );
        assert!(assembly.finished());
        assert_eq!(assembly.tokens_used(), Some(5));
        let answer = assembly.answer();
        assert_eq!(
            answer,
            json!({"message": {"role": "assistant", "content": "Hello"}, "finish_reason": "stop",
                   "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}})
        );
        assert_eq!(whole_answer_deltas(&answer), [json!({"content": "Hello"})]);
    }

    #[test]
    fn tool_calls_are_named_once_and_their_arguments_added_up() {
        let mut assembly = Assembly::default();
        for delta in [
            json!({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                   "function": {"name": "f", "arguments": "{\"a\""}}]}),
            json!({"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}),
        ] {
            assert!(assembly.add(&chunk(delta, Value::Null)).unwrap().is_some());
        }
        assembly
            .add(&chunk(json!({}), json!("tool_calls")))
            .unwrap();
        let answer = assembly.answer();
        assert_eq!(answer["message"]["content"], Value::Null);
        assert_eq!(
            answer["message"]["tool_calls"],
            json!([{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}])
        );
        let far = json!({"tool_calls": [{"index": 100_000, "function": {"arguments": "x"}}]});
        assert!(Assembly::default().add(&chunk(far, Value::Null)).is_err());
    }
}
