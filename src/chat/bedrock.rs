//! AWS Bedrock's Converse API (`Converse`, `ConverseStream`, `CountTokens`):
//! its wire types, a chat call written in its terms, and its answers,
//! stream events and errors read back. (The signature and the binary event
//! stream's framing are the transport's: `providers::bedrock`.)
//!
//! System messages become `system` blocks, assistant tool calls `toolUse`
//! blocks, tool results `toolResult` blocks of a user turn, tools
//! `toolSpec`s with their JSON Schema, a JSON-schema output the
//! `outputConfig` (its schema as a string, as Converse takes it). A stop for
//! a guardrail or a content filter is a definite failure naming why.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::model::{
    self as m, Answer, CannotCarry, ChatRequest, Delta, OutputFormat, StopReason, StreamEvent,
    TokenCounts, ToolCall, ToolCallDelta, ToolChoice,
};

/// `ConverseRequest` (the model is in the path).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConverseRequest {
    pub messages: Vec<Message>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub system: Vec<SystemBlock>,
    pub inference_config: InferenceConfig,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_config: Option<ToolConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_config: Option<OutputConfig>,
}

/// A turn: `user` or `assistant`, and its content blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Vec<ContentBlock>,
}

/// A content block: a union, exactly one member set. Blocks of kinds
/// onejob does not send (reasoning, documents) read as empty.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContentBlock {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageBlock>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use: Option<ToolUseBlock>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_result: Option<ToolResultBlock>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageBlock {
    /// `png`, `jpeg`, `gif` or `webp`.
    pub format: String,
    pub source: ImageSource,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageSource {
    /// Base64.
    pub bytes: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolUseBlock {
    pub tool_use_id: String,
    pub name: String,
    #[serde(default)]
    pub input: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolResultBlock {
    pub tool_use_id: String,
    pub content: Vec<ToolResultContent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ToolResultContent {
    Text(String),
    Json(Value),
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SystemBlock {
    pub text: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InferenceConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stop_sequences: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolConfig {
    pub tools: Vec<ToolEntry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<WireToolChoice>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolEntry {
    pub tool_spec: ToolSpec,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolSpec {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub input_schema: InputSchema,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InputSchema {
    pub json: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum WireToolChoice {
    Auto(Empty),
    Any(Empty),
    Tool(NamedTool),
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Empty {}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NamedTool {
    pub name: String,
}

/// Structured output: the schema as a JSON string, as Converse takes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputConfig {
    pub text_format: TextFormat,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TextFormat {
    /// `json_schema`
    #[serde(rename = "type")]
    pub kind: String,
    pub structure: Structure,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Structure {
    pub json_schema: JsonSchema,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JsonSchema {
    pub schema: String,
    pub name: String,
}

/// `ConverseResponse`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConverseResponse {
    pub output: Output,
    pub stop_reason: String,
    #[serde(default)]
    pub usage: TokenUsage,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Output {
    pub message: Message,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenUsage {
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
    #[serde(default)]
    pub cache_read_input_tokens: u64,
    #[serde(default)]
    pub cache_write_input_tokens: u64,
}

impl TokenUsage {
    /// The counts: the prompt is the input with what was read from and
    /// written to the cache.
    pub fn counts(self) -> TokenCounts {
        TokenCounts {
            input: self.input_tokens + self.cache_read_input_tokens + self.cache_write_input_tokens,
            output: self.output_tokens,
            cached_input: self.cache_read_input_tokens,
            reasoning: 0,
        }
    }
}

/// What the request takes from the provider's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProviderTarget {
    pub default_max_tokens: u64,
    pub default_temperature: Option<f64>,
}

/// The text of content that must be text alone: another part is refused,
/// not dropped.
fn text_only(content: &m::Content, what: &str) -> Result<String, CannotCarry> {
    content
        .text_only()
        .ok_or_else(|| cannot(format!("a part other than text in {what}")))
}

fn cannot(what: impl std::fmt::Display) -> CannotCarry {
    CannotCarry(format!("Bedrock's Converse API cannot carry {what}"))
}

fn text_block(text: impl Into<String>) -> ContentBlock {
    ContentBlock {
        text: Some(text.into()),
        ..ContentBlock::default()
    }
}

/// The request for `request`, or what of it Converse cannot carry.
pub fn write_request(
    request: &ChatRequest,
    target: ProviderTarget,
) -> Result<ConverseRequest, CannotCarry> {
    if let Some(member) = request.openai_extras.keys().next() {
        return Err(cannot(format!("`{member}`")));
    }
    let sampling = &request.sampling;
    for (name, set) in [
        ("user", request.user.is_some()),
        ("top_k", sampling.top_k.is_some()),
        ("seed", sampling.seed.is_some()),
        ("presence_penalty", sampling.presence_penalty.is_some()),
        ("frequency_penalty", sampling.frequency_penalty.is_some()),
    ] {
        if set {
            return Err(cannot(format!("`{name}`")));
        }
    }
    let (system, messages) = conversation(&request.messages)?;
    let output_config = match &request.output {
        None => None,
        Some(OutputFormat::JsonSchema { name, schema, .. }) => Some(OutputConfig {
            text_format: TextFormat {
                kind: "json_schema".into(),
                structure: Structure {
                    json_schema: JsonSchema {
                        schema: schema.to_string(),
                        name: schema_name(name),
                    },
                },
            },
        }),
        Some(OutputFormat::JsonObject) => {
            return Err(cannot(
                "`response_format` `json_object` (it takes a JSON schema)",
            ))
        }
    };
    Ok(ConverseRequest {
        messages,
        system,
        inference_config: InferenceConfig {
            max_tokens: Some(sampling.max_tokens.unwrap_or(target.default_max_tokens)),
            temperature: sampling.temperature.or(target.default_temperature),
            top_p: sampling.top_p,
            stop_sequences: request.stop.clone(),
        },
        tool_config: tool_config(&request.tools, request.tool_choice.as_ref())?,
        output_config,
    })
}

/// A schema's name as Converse takes it: `[a-zA-Z0-9_-]`.
fn schema_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// A user turn's blocks: text, and images given inline (`data:` URLs).
fn user_blocks(content: &m::Content) -> Result<Vec<ContentBlock>, CannotCarry> {
    content
        .parts()
        .iter()
        .map(|part| match part {
            m::Part::Text(text) => Ok(text_block(text.as_str())),
            m::Part::Image(image) => {
                let (format, data) = image
                    .inline()
                    .and_then(|(mime, data)| Some((mime.strip_prefix("image/")?, data)))
                    .ok_or_else(|| cannot("an image by URL: send it inline, as a data: URL"))?;
                Ok(ContentBlock {
                    image: Some(ImageBlock {
                        format: format.to_owned(),
                        source: ImageSource {
                            bytes: data.to_owned(),
                        },
                    }),
                    ..ContentBlock::default()
                })
            }
            m::Part::OpenAiOther(_) => Err(cannot("a content part other than text or an image")),
        })
        .collect()
}

/// The system blocks and the turns; consecutive tool results share one
/// user turn.
fn conversation(messages: &[m::Message]) -> Result<(Vec<SystemBlock>, Vec<Message>), CannotCarry> {
    let mut system = Vec::new();
    let mut turns: Vec<Message> = Vec::new();
    let turn = |role: &str, content| Message {
        role: role.to_owned(),
        content,
    };
    for message in messages {
        match message {
            m::Message::System { name: Some(_), .. }
            | m::Message::User { name: Some(_), .. }
            | m::Message::Assistant { name: Some(_), .. } => {
                return Err(cannot("a message's `name`"))
            }
            m::Message::System { content, .. } => {
                let text = text_only(content, "a system message")?;
                if !text.is_empty() {
                    system.push(SystemBlock { text });
                }
            }
            m::Message::User { content, .. } => turns.push(turn("user", user_blocks(content)?)),
            m::Message::Assistant {
                content,
                tool_calls,
                ..
            } => {
                let mut blocks = Vec::new();
                let text = content.as_ref().map(|c| c.text("")).unwrap_or_default();
                if !text.is_empty() {
                    blocks.push(text_block(text));
                }
                for call in tool_calls {
                    blocks.push(ContentBlock {
                        tool_use: Some(ToolUseBlock {
                            tool_use_id: call.id.clone(),
                            name: call.name.clone(),
                            input: call.input(),
                        }),
                        ..ContentBlock::default()
                    });
                }
                if blocks.is_empty() {
                    blocks.push(text_block(""));
                }
                turns.push(turn("assistant", blocks));
            }
            m::Message::Tool { call_id, content } => {
                let text = text_only(content, "a tool result")?;
                let result = match serde_json::from_str::<Value>(&text)
                    .ok()
                    .filter(Value::is_object)
                {
                    Some(json) => ToolResultContent::Json(json),
                    None => ToolResultContent::Text(text),
                };
                let block = ContentBlock {
                    tool_result: Some(ToolResultBlock {
                        tool_use_id: call_id.clone(),
                        content: vec![result],
                        status: Some("success".into()),
                    }),
                    ..ContentBlock::default()
                };
                match turns.last_mut() {
                    Some(last)
                        if last.role == "user"
                            && last.content.iter().all(|b| b.tool_result.is_some()) =>
                    {
                        last.content.push(block);
                    }
                    _ => turns.push(turn("user", vec![block])),
                }
            }
        }
    }
    Ok((system, turns))
}

fn tool_config(
    tools: &[m::Tool],
    choice: Option<&ToolChoice>,
) -> Result<Option<ToolConfig>, CannotCarry> {
    if tools.is_empty() {
        return Ok(None);
    }
    let tool_choice = match choice {
        None => None,
        Some(ToolChoice::Auto) => Some(WireToolChoice::Auto(Empty {})),
        Some(ToolChoice::Required) => Some(WireToolChoice::Any(Empty {})),
        Some(ToolChoice::Named(name)) => {
            Some(WireToolChoice::Tool(NamedTool { name: name.clone() }))
        }
        Some(ToolChoice::None) => return Err(cannot("`tool_choice` `none` beside tools")),
    };
    Ok(Some(ToolConfig {
        tools: tools
            .iter()
            .map(|tool| ToolEntry {
                tool_spec: ToolSpec {
                    name: tool.name.clone(),
                    description: tool.description.clone(),
                    input_schema: InputSchema {
                        json: tool.parameters_or_any(),
                    },
                },
            })
            .collect(),
        tool_choice,
    }))
}

/// The stop reasons that mean the answer was stopped by a guardrail or a
/// filter: a definite failure.
fn stopped_by_filter(reason: &str) -> bool {
    matches!(reason, "guardrail_intervened" | "content_filtered")
}

fn read_stop(reason: &str) -> StopReason {
    match reason {
        "max_tokens" | "model_context_window_exceeded" => StopReason::MaxTokens,
        "tool_use" => StopReason::ToolUse,
        _ => StopReason::EndTurn,
    }
}

/// Why a whole answer is a definite failure, if it is one.
pub fn blocked(response: &ConverseResponse) -> Option<String> {
    stopped_by_filter(&response.stop_reason)
        .then(|| format!("the provider stopped the answer: {}", response.stop_reason))
}

/// The answer (check [`blocked`] first).
pub fn read_answer(response: &ConverseResponse) -> Answer {
    let blocks = &response.output.message.content;
    let text: String = blocks.iter().filter_map(|b| b.text.as_deref()).collect();
    let tool_calls: Vec<ToolCall> = blocks
        .iter()
        .filter_map(|b| b.tool_use.as_ref())
        .map(|call| ToolCall {
            id: call.tool_use_id.clone(),
            name: call.name.clone(),
            arguments: if call.input.is_null() {
                "{}".to_owned()
            } else {
                call.input.to_string()
            },
        })
        .collect();
    Answer {
        text: (!text.is_empty() || tool_calls.is_empty()).then_some(text),
        tool_calls,
        stop: read_stop(&response.stop_reason),
        usage: response.usage.counts(),
        message_extras: Map::new(),
    }
}

/// An error answer's body: its type and message, under the names Bedrock
/// and its proxies use.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ErrorBody {
    #[serde(rename = "__type", default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default, alias = "Message")]
    pub message: Option<String>,
}

/// The error type of a Bedrock error answer: `x-amzn-ErrorType` (cut at
/// its first `:`), else the body's `__type` or `code` (after a `#`).
pub fn error_type(header: Option<&str>, body: &ErrorBody) -> Option<String> {
    let raw = header
        .map(str::to_owned)
        .or_else(|| body.kind.clone())
        .or_else(|| body.code.clone())?;
    let raw = raw.split(':').next().unwrap_or(&raw);
    Some(raw.rsplit('#').next().unwrap_or(raw).to_owned())
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BlockStart {
    #[serde(default)]
    content_block_index: u64,
    #[serde(default)]
    start: Started,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Started {
    #[serde(default)]
    tool_use: Option<StartedToolUse>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StartedToolUse {
    tool_use_id: String,
    name: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BlockDelta {
    #[serde(default)]
    content_block_index: u64,
    #[serde(default)]
    delta: DeltaBody,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeltaBody {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    tool_use: Option<ToolInput>,
}

#[derive(Debug, Clone, Deserialize)]
struct ToolInput {
    input: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MessageStop {
    #[serde(default)]
    stop_reason: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct Metadata {
    #[serde(default)]
    usage: TokenUsage,
}

/// ConverseStream's events read one by one, keeping what they spread out:
/// which content block is which tool call. The event's name is its
/// `:event-type`.
#[derive(Debug, Default)]
pub struct EventReader {
    /// `(content block index, tool call index)`.
    tools: Vec<(u64, usize)>,
}

fn garbled(e: serde_json::Error) -> super::StreamError {
    super::StreamError::Garbled(e.to_string())
}

impl super::StreamReader for EventReader {
    fn read(&mut self, name: &str, data: &str) -> Result<Vec<StreamEvent>, super::StreamError> {
        let data = if data.is_empty() { "{}" } else { data };
        Ok(match name {
            "contentBlockStart" => {
                let start: BlockStart = serde_json::from_str(data).map_err(garbled)?;
                let Some(tool) = start.start.tool_use else {
                    return Ok(Vec::new());
                };
                let index = self.tools.len();
                self.tools.push((start.content_block_index, index));
                vec![StreamEvent::Delta(Delta {
                    text: None,
                    tool_calls: vec![ToolCallDelta {
                        index,
                        id: Some(tool.tool_use_id),
                        name: Some(tool.name),
                        arguments: Some(String::new()),
                    }],
                })]
            }
            "contentBlockDelta" => {
                let delta: BlockDelta = serde_json::from_str(data).map_err(garbled)?;
                if let Some(text) = delta.delta.text {
                    return Ok(vec![StreamEvent::Delta(Delta::text(text))]);
                }
                let Some(input) = delta.delta.tool_use else {
                    return Ok(Vec::new());
                };
                match self
                    .tools
                    .iter()
                    .find(|(block, _)| *block == delta.content_block_index)
                {
                    Some(&(_, index)) => vec![StreamEvent::Delta(Delta {
                        text: None,
                        tool_calls: vec![ToolCallDelta {
                            index,
                            arguments: Some(input.input),
                            ..ToolCallDelta::default()
                        }],
                    })],
                    None => Vec::new(),
                }
            }
            "messageStop" => {
                let stop: MessageStop = serde_json::from_str(data).map_err(garbled)?;
                let reason = stop.stop_reason.unwrap_or_else(|| "end_turn".to_owned());
                if stopped_by_filter(&reason) {
                    return Ok(vec![StreamEvent::Failed(format!(
                        "the provider stopped the answer: {reason}"
                    ))]);
                }
                vec![StreamEvent::Stop(read_stop(&reason))]
            }
            "metadata" => {
                let metadata: Metadata = serde_json::from_str(data).map_err(garbled)?;
                vec![StreamEvent::Usage(metadata.usage.counts())]
            }
            _ => Vec::new(),
        })
    }
}

impl EventReader {
    /// An exception frame (`kind` its `:exception-type`): the provider
    /// ended the stream.
    pub fn exception(&self, kind: &str, data: &str) -> StreamEvent {
        let body: ErrorBody = serde_json::from_str(data).unwrap_or_default();
        StreamEvent::Failed(format!(
            "the provider ended the stream with {kind}: {}",
            body.message.as_deref().unwrap_or("no message")
        ))
    }
}

/// `CountTokens`' request for one user text.
#[derive(Debug, Clone, Serialize)]
pub struct CountTokensRequest {
    pub input: CountInput,
}

#[derive(Debug, Clone, Serialize)]
pub struct CountInput {
    pub converse: CountConverse,
}

#[derive(Debug, Clone, Serialize)]
pub struct CountConverse {
    pub messages: Vec<Message>,
}

impl CountTokensRequest {
    pub fn of(text: &str) -> Self {
        Self {
            input: CountInput {
                converse: CountConverse {
                    messages: vec![Message {
                        role: "user".into(),
                        content: vec![text_block(text)],
                    }],
                },
            },
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CountTokensResponse {
    pub input_tokens: u64,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::chat::openai_chat;
    use crate::chat::StreamReader;

    #[test]
    fn a_part_other_than_text_in_a_system_message_or_a_tool_result_is_refused_not_dropped() {
        let image =
            json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}});
        for message in [
            json!({"role": "system", "content": [{"type": "text", "text": "Be brief."}, image]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "rain"}, image]}),
        ] {
            let chat = json!({"messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "weather", "arguments": "{}"}}]},
                message.clone(),
            ]});
            let request = openai_chat::read_request(&chat).unwrap().request;
            let refused = write_request(
                &request,
                ProviderTarget {
                    default_max_tokens: 256,
                    default_temperature: None,
                },
            )
            .expect_err(&message.to_string());
            assert!(
                refused.0.contains("a part other than text"),
                "{}",
                refused.0
            );
        }
    }

    #[test]
    fn a_chat_request_becomes_turns_tools_and_an_inference_config() {
        let chat = json!({
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "tooluse_1", "type": "function",
                    "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
                {"role": "tool", "tool_call_id": "tooluse_1", "content": "{\"sky\":\"sunny\"}"},
            ],
            "tools": [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}],
            "tool_choice": "required", "stop": ["END"], "max_tokens": 64, "temperature": 0.2,
            "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}},
        });
        let request = openai_chat::read_request(&chat).unwrap().request;
        let target = ProviderTarget {
            default_max_tokens: 256,
            default_temperature: None,
        };
        let body = serde_json::to_value(write_request(&request, target).unwrap()).unwrap();
        assert_eq!(
            body,
            json!({
                "messages": [
                    {"role": "user", "content": [{"text": "Weather?"}]},
                    {"role": "assistant", "content": [{"toolUse": {"toolUseId": "tooluse_1", "name": "weather",
                        "input": {"city": "Oslo"}}}]},
                    {"role": "user", "content": [{"toolResult": {"toolUseId": "tooluse_1",
                        "content": [{"json": {"sky": "sunny"}}], "status": "success"}}]},
                ],
                "system": [{"text": "Be brief."}],
                "inferenceConfig": {"maxTokens": 64, "temperature": 0.2, "stopSequences": ["END"]},
                "toolConfig": {"tools": [{"toolSpec": {"name": "weather", "inputSchema": {"json": {"type": "object"}}}}],
                    "toolChoice": {"any": {}}},
                "outputConfig": {"textFormat": {"type": "json_schema", "structure": {"jsonSchema": {
                    "schema": "{\"type\":\"object\"}", "name": "w"}}}},
            })
        );
        let mut seeded = request.clone();
        seeded.sampling.seed = Some(7);
        assert!(write_request(&seeded, target)
            .unwrap_err()
            .0
            .contains("seed"));
    }

    #[test]
    fn events_are_read_into_the_model_and_a_guardrail_fails_the_answer() {
        let mut events = EventReader::default();
        assert_eq!(
            events
                .read("messageStart", r#"{"role": "assistant"}"#)
                .unwrap(),
            []
        );
        assert_eq!(
            events
                .read(
                    "contentBlockDelta",
                    r#"{"contentBlockIndex": 0, "delta": {"text": "Hi"}, "p": "abc"}"#
                )
                .unwrap(),
            [StreamEvent::Delta(Delta::text("Hi"))]
        );
        let start = events
            .read(
                "contentBlockStart",
                r#"{"contentBlockIndex": 1, "start": {"toolUse": {"toolUseId": "t1", "name": "f"}}}"#,
            )
            .unwrap();
        assert!(matches!(&start[..], [StreamEvent::Delta(d)] if d.tool_calls[0].index == 0));
        let args = events
            .read(
                "contentBlockDelta",
                r#"{"contentBlockIndex": 1, "delta": {"toolUse": {"input": "{\"a\":"}}}"#,
            )
            .unwrap();
        assert!(
            matches!(&args[..], [StreamEvent::Delta(d)] if d.tool_calls[0].arguments.as_deref() == Some("{\"a\":"))
        );
        assert_eq!(
            events
                .read("messageStop", r#"{"stopReason": "tool_use"}"#)
                .unwrap(),
            [StreamEvent::Stop(StopReason::ToolUse)]
        );
        let usage = events
            .read("metadata", r#"{"usage": {"inputTokens": 3, "outputTokens": 2, "totalTokens": 5}, "metrics": {"latencyMs": 9}}"#)
            .unwrap();
        assert!(matches!(usage[..], [StreamEvent::Usage(u)] if u.total() == 5));
        assert!(matches!(
            &events
                .read("messageStop", r#"{"stopReason": "guardrail_intervened"}"#)
                .unwrap()[..],
            [StreamEvent::Failed(_)]
        ));
        assert!(matches!(
            events.exception("throttlingException", r#"{"message": "slow down"}"#),
            StreamEvent::Failed(why) if why.contains("slow down")
        ));
        assert_eq!(
            error_type(
                Some("ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/"),
                &ErrorBody::default()
            ),
            Some("ThrottlingException".into())
        );
        let body: ErrorBody =
            serde_json::from_str(r#"{"__type": "com.amazon.coral.validate#ValidationException"}"#)
                .unwrap();
        assert_eq!(error_type(None, &body), Some("ValidationException".into()));
    }
}
