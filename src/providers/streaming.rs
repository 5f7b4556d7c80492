//! Streamed answers from OpenAI-compatible and Anthropic providers: the
//! upstream's server-sent events are parsed (`eventsource-stream`), each
//! delta is handed on as it arrives, and the final answer is built from the
//! deltas, so the stored answer is exactly what was streamed.
//!
//! The deltas handed on are what a client's `chat.completion.chunk` carries
//! in `choices[0].delta`: `{"content": …}` or `{"tool_calls": […]}`. The
//! role, the finish reason and the usage are not deltas: they are part of
//! the final answer, which onejob sends at the stream's end.
//!
//! Anthropic's events (`message_start`, `content_block_start`,
//! `content_block_delta`, `message_delta`, `message_stop`, …) are first
//! translated into the `chat.completion.chunk` they amount to
//! ([`AnthropicEvents`]), then taken in like an OpenAI chunk: one delta
//! shape and one answer shape, whichever provider streamed.

use eventsource_stream::{EventStreamError, Eventsource};
use futures_util::StreamExt;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::ProviderKind;
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
    /// The stop sequence the provider says it stopped at (Anthropic names
    /// it; an OpenAI `stop` does not).
    stop_sequence: Option<String>,
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
        if let Some(stop) = choice["stop_sequence"].as_str() {
            self.stop_sequence = Some(stop.to_owned());
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

    /// What the stream's usage says the call used.
    pub fn usage(&self) -> Option<crate::domain::Usage> {
        super::openai_usage(self.usage.as_ref()?)
    }

    /// The tokens the stream's usage says the call used.
    pub fn tokens_used(&self) -> Option<u64> {
        self.usage().map(|usage| usage.total())
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
        let mut answer = json!({
            "message": message,
            "finish_reason": self.finish_reason.unwrap_or_else(|| "stop".to_owned()),
            "usage": self.usage.unwrap_or_else(|| json!({
                "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0
            })),
        });
        if let Some(stop) = self.stop_sequence {
            answer["stop_sequence"] = json!(stop);
        }
        answer
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

/// What one Anthropic event amounts to.
#[derive(Debug, PartialEq)]
pub enum Translated {
    /// The `chat.completion.chunk` it amounts to (a delta, a finish
    /// reason, the usage).
    Chunk(Value),
    /// Nothing for the answer (`ping`, `content_block_stop`, an event
    /// this client does not know).
    Nothing,
    /// `message_stop`: the answer is complete.
    Done,
    /// An `error` event: the provider ended the answer.
    Error(String),
}

/// Anthropic's Messages stream, translated event by event into OpenAI
/// chunks. It remembers what the events spread out: the prompt's tokens
/// (told in `message_start`, needed with the output's in `message_delta`)
/// and which content block is which tool call.
#[derive(Debug, Default)]
pub struct AnthropicEvents {
    input_tokens: u64,
    /// Tool calls by content block index: `(block index, tool call index)`.
    tools: Vec<(u64, usize)>,
}

impl AnthropicEvents {
    /// Translates one event: its name (`event:`) and its data as JSON (the
    /// data's own `type` is read when the name is missing).
    pub fn translate(&mut self, name: &str, data: &Value) -> Result<Translated, String> {
        let kind = if name.is_empty() || name == "message" {
            data["type"].as_str().unwrap_or_default()
        } else {
            name
        };
        let chunk = |delta: Value| {
            Translated::Chunk(
                json!({"choices": [{"index": 0, "delta": delta, "finish_reason": null}]}),
            )
        };
        Ok(match kind {
            "message_start" => {
                let usage = &data["message"]["usage"];
                self.input_tokens = usage["input_tokens"].as_u64().unwrap_or(0)
                    + usage["cache_creation_input_tokens"].as_u64().unwrap_or(0)
                    + usage["cache_read_input_tokens"].as_u64().unwrap_or(0);
                Translated::Nothing
            }
            "content_block_start" => {
                let block = &data["content_block"];
                match block["type"].as_str() {
                    Some("text") => match block["text"].as_str().filter(|t| !t.is_empty()) {
                        Some(text) => chunk(json!({ "content": text })),
                        None => Translated::Nothing,
                    },
                    Some("tool_use") => {
                        let index = self.tools.len();
                        if index >= MAX_TOOL_CALLS {
                            return Err(format!(
                                "the stream has more than {MAX_TOOL_CALLS} tool calls"
                            ));
                        }
                        self.tools
                            .push((data["index"].as_u64().unwrap_or(0), index));
                        // The arguments arrive as `input_json_delta`s.
                        chunk(json!({"tool_calls": [{
                            "index": index, "id": block["id"], "type": "function",
                            "function": {"name": block["name"].as_str().unwrap_or_default(), "arguments": ""},
                        }]}))
                    }
                    // Thinking and other blocks are not part of the answer.
                    _ => Translated::Nothing,
                }
            }
            "content_block_delta" => {
                let delta = &data["delta"];
                match delta["type"].as_str() {
                    Some("text_delta") => match delta["text"].as_str().filter(|t| !t.is_empty()) {
                        Some(text) => chunk(json!({ "content": text })),
                        None => Translated::Nothing,
                    },
                    Some("input_json_delta") => {
                        let block = data["index"].as_u64().unwrap_or(0);
                        let Some(&(_, index)) = self.tools.iter().find(|(b, _)| *b == block) else {
                            return Err(format!(
                                "the stream sent tool input for block {block}, which is no tool call"
                            ));
                        };
                        match delta["partial_json"].as_str().filter(|p| !p.is_empty()) {
                            Some(part) => chunk(json!({"tool_calls": [{
                                "index": index, "function": {"arguments": part},
                            }]})),
                            None => Translated::Nothing,
                        }
                    }
                    _ => Translated::Nothing,
                }
            }
            "message_delta" => {
                let output = data["usage"]["output_tokens"].as_u64().unwrap_or(0);
                // Newer servers repeat the prompt's tokens here.
                if let Some(input) = data["usage"]["input_tokens"].as_u64() {
                    self.input_tokens = input;
                }
                let finish =
                    super::chat::anthropic_finish_reason(data["delta"]["stop_reason"].as_str());
                // Which stop sequence it stopped at, kept with the answer.
                let mut choice = json!({"index": 0, "delta": {}, "finish_reason": finish});
                if let Some(stop) = super::chat::stop_sequence_met(&data["delta"]) {
                    choice["stop_sequence"] = json!(stop);
                }
                Translated::Chunk(json!({
                    "choices": [choice],
                    "usage": {
                        "prompt_tokens": self.input_tokens,
                        "completion_tokens": output,
                        "total_tokens": self.input_tokens + output,
                    },
                }))
            }
            "message_stop" => Translated::Done,
            "error" => Translated::Error(
                data["error"]["message"]
                    .as_str()
                    .unwrap_or("no message")
                    .to_owned(),
            ),
            _ => Translated::Nothing,
        })
    }
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

/// Reads a provider's event stream to its end (OpenAI's chunks, or
/// Anthropic's events when `kind` is Anthropic), handing each delta to
/// `sink` as it arrives, at most `cap` bytes in all. What it ends in:
///
/// - `[DONE]` (`message_stop` from Anthropic), or the end of the body after
///   a finish reason: the answer built from the deltas, and the tokens its
///   usage says;
/// - an `error` event: a definite failure (the provider ended the answer);
/// - a cut connection, a body that ends unfinished, or garbled data:
///   unknown (the provider may have finished and billed);
/// - more than `cap` bytes: a definite failure (`invalid_output`), as for
///   an answer too large to read whole.
pub async fn read_stream(
    kind: ProviderKind,
    response: reqwest::Response,
    cap: usize,
    sink: &DeltaSink,
) -> (Outcome, Option<crate::domain::Usage>) {
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
    let mut anthropic = AnthropicEvents::default();
    let mut gemini = super::gemini::GeminiEvents::default();
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
        let chunk = match kind {
            ProviderKind::Anthropic => match anthropic.translate(&event.event, &chunk) {
                Ok(Translated::Chunk(chunk)) => chunk,
                Ok(Translated::Nothing) => continue,
                Ok(Translated::Done) => break None,
                Ok(Translated::Error(message)) => {
                    break Some(Outcome::Failed(Reason::new(format!(
                        "the provider ended the stream with an error: {message}"
                    ))))
                }
                Err(reason) => break Some(Outcome::Failed(Reason::invalid_output(reason))),
            },
            // Each event a whole GenerateContentResponse; a filter that
            // stops the answer ends it as a definite failure.
            ProviderKind::Gemini => match gemini.translate(&chunk) {
                Ok(chunk) => chunk,
                Err(why) => break Some(Outcome::Failed(Reason::new(why))),
            },
            _ => chunk,
        };
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
        Some(outcome) => (outcome, assembly.usage()),
        None => {
            let usage = assembly.usage();
            (Outcome::Succeeded(assembly.answer()), usage)
        }
    }
}

/// Reads AWS's binary event stream (Bedrock's ConverseStream) to its end,
/// frame by frame with AWS's own decoder, each event translated
/// (`bedrock::ConverseEvents`) and handed on as [`read_stream`] does, under
/// the same rules: an exception frame or a stop for a guardrail is a
/// definite failure, a cut or garbled stream unknown, more than `cap`
/// bytes a definite failure.
pub async fn read_aws_event_stream(
    mut response: reqwest::Response,
    cap: usize,
    sink: &DeltaSink,
) -> (Outcome, Option<crate::domain::Usage>) {
    use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder};
    let mut decoder = MessageFrameDecoder::new();
    let mut buffer = bytes::BytesMut::new();
    let mut read = 0usize;
    let mut assembly = Assembly::default();
    let mut events = super::bedrock::ConverseEvents::default();
    let outcome = 'stream: loop {
        let chunk = match response.chunk().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) if assembly.finished() => break None,
            Ok(None) => {
                break Some(Outcome::Unknown(Reason::new(
                    "the stream ended before the answer was finished",
                )))
            }
            Err(e) => {
                break Some(Outcome::Unknown(
                    Reason::new("the stream was cut off")
                        .with_detail(&super::http::error_chain(&e)),
                ))
            }
        };
        read += chunk.len();
        if read > cap {
            break Some(Outcome::Failed(Reason::invalid_output(format!(
                "the streamed answer is larger than the {cap} bytes allowed (max_response_bytes)"
            ))));
        }
        buffer.extend_from_slice(&chunk);
        loop {
            let message = match decoder.decode_frame(&mut buffer) {
                Ok(DecodedFrame::Complete(message)) => message,
                Ok(DecodedFrame::Incomplete) => break,
                Err(e) => {
                    break 'stream Some(Outcome::Unknown(
                        Reason::new("the stream sent a garbled frame").with_detail(&e.to_string()),
                    ))
                }
            };
            let message_type = super::bedrock::header_of(&message, ":message-type");
            let kind = match message_type.as_str() {
                "event" => super::bedrock::header_of(&message, ":event-type"),
                "exception" => super::bedrock::header_of(&message, ":exception-type"),
                _ => super::bedrock::header_of(&message, ":error-code"),
            };
            let payload = match super::bedrock::payload_of(&message) {
                Ok(payload) => payload,
                Err(e) => {
                    break 'stream Some(Outcome::Unknown(
                        Reason::new("the stream sent garbled data").with_detail(&e),
                    ))
                }
            };
            let chunk = match events.translate(&message_type, &kind, &payload) {
                super::bedrock::Event::Chunk(chunk) => chunk,
                super::bedrock::Event::Nothing => continue,
                super::bedrock::Event::Failed(why) => {
                    break 'stream Some(Outcome::Failed(Reason::new(why)))
                }
            };
            match assembly.add(&chunk) {
                Ok(Some(delta)) => {
                    if sink.send(delta).await.is_err() {
                        break 'stream Some(Outcome::Unknown(Reason::new(
                            "the stream was abandoned",
                        )));
                    }
                }
                Ok(None) => {}
                Err(reason) => break 'stream Some(Outcome::Failed(Reason::invalid_output(reason))),
            }
        }
    };
    match outcome {
        Some(outcome) => (outcome, assembly.usage()),
        None => {
            let usage = assembly.usage();
            (Outcome::Succeeded(assembly.answer()), usage)
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

    /// Feeds Anthropic events through the translation and the assembly;
    /// the deltas handed on, and the answer.
    fn anthropic_stream(events: &[(&str, Value)]) -> (Vec<Value>, Option<Value>) {
        let mut translation = AnthropicEvents::default();
        let mut assembly = Assembly::default();
        let mut handed = Vec::new();
        for (name, data) in events {
            match translation.translate(name, data).unwrap() {
                Translated::Chunk(chunk) => handed.extend(assembly.add(&chunk).unwrap()),
                Translated::Nothing => {}
                Translated::Done => return (handed, Some(assembly.answer())),
                Translated::Error(message) => panic!("an error event: {message}"),
            }
        }
        (handed, None)
    }

    #[test]
    fn anthropic_events_become_the_same_deltas_and_the_same_answer_as_a_whole_message() {
        let events = [
            (
                "message_start",
                json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
                "role": "assistant", "content": [], "usage": {"input_tokens": 9, "output_tokens": 1}}}),
            ),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}),
            ),
            ("ping", json!({"type": "ping"})),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": "Hel"}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": "lo"}}),
            ),
            (
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            ),
            (
                "message_delta",
                json!({"type": "message_delta",
                "delta": {"stop_reason": "max_tokens", "stop_sequence": null}, "usage": {"output_tokens": 4}}),
            ),
            ("message_stop", json!({"type": "message_stop"})),
        ];
        let (handed, answer) = anthropic_stream(&events);
        assert_eq!(
            handed,
            [json!({"content": "Hel"}), json!({"content": "lo"})]
        );
        let whole = json!({"content": [{"type": "text", "text": "Hello"}], "stop_reason": "max_tokens",
                           "usage": {"input_tokens": 9, "output_tokens": 4}});
        let expected = crate::providers::chat::answer(ProviderKind::Anthropic, &whole).unwrap();
        assert_eq!(
            answer.unwrap(),
            expected,
            "the stored answer is the whole message's"
        );

        // Events without their `event:` name are known by their `type`.
        let unnamed: Vec<(&str, Value)> = events.iter().map(|(_, d)| ("", d.clone())).collect();
        assert_eq!(anthropic_stream(&unnamed).1, Some(expected));
    }

    #[test]
    fn anthropic_tool_use_streams_as_tool_calls() {
        let (handed, answer) = anthropic_stream(&[
            (
                "message_start",
                json!({"message": {"usage": {"input_tokens": 2}}}),
            ),
            (
                "content_block_start",
                json!({"index": 1,
                "content_block": {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}}),
            ),
            (
                "content_block_delta",
                json!({"index": 1,
                "delta": {"type": "input_json_delta", "partial_json": "{\"city\":"}}),
            ),
            (
                "content_block_delta",
                json!({"index": 1,
                "delta": {"type": "input_json_delta", "partial_json": "\"Oslo\"}"}}),
            ),
            (
                "message_delta",
                json!({"delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 5}}),
            ),
            ("message_stop", json!({})),
        ]);
        assert_eq!(handed[0]["tool_calls"][0]["id"], "toolu_1");
        assert_eq!(
            handed[1]["tool_calls"][0],
            json!({"index": 0, "function": {"arguments": "{\"city\":"}})
        );
        let answer = answer.unwrap();
        assert_eq!(answer["finish_reason"], "tool_calls");
        assert_eq!(answer["message"]["content"], Value::Null);
        assert_eq!(
            answer["message"]["tool_calls"],
            json!([{"id": "toolu_1", "type": "function",
                    "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}}])
        );
        assert_eq!(
            answer["usage"],
            json!({"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7})
        );
    }

    #[test]
    fn anthropic_errors_and_stray_tool_input_end_the_stream() {
        let mut translation = AnthropicEvents::default();
        assert_eq!(
            translation
                .translate(
                    "error",
                    &json!({"type": "error",
                    "error": {"type": "overloaded_error", "message": "Overloaded"}})
                )
                .unwrap(),
            Translated::Error("Overloaded".into())
        );
        let stray = json!({"index": 3, "delta": {"type": "input_json_delta", "partial_json": "{"}});
        assert!(translation
            .translate("content_block_delta", &stray)
            .is_err());
        assert_eq!(
            translation.translate("something_new", &json!({})).unwrap(),
            Translated::Nothing,
            "an unknown event is skipped, as Anthropic asks of its clients"
        );
    }
}
