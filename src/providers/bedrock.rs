//! AWS Bedrock's Converse API (`Converse`, `ConverseStream`): its wire
//! types, the signature every request carries (SigV4, by AWS's own
//! `aws-sigv4`), ConverseStream's binary event stream (decoded by AWS's own
//! `aws-smithy-eventstream`), and the translation of a call into Converse's
//! terms and of its answers, events and errors into onejob's one answer
//! shape (see `providers::chat`).
//!
//! A chat route's request arrives as the client's Chat Completions request:
//! system messages become `system` blocks, assistant tool calls `toolUse`
//! blocks, tool results `toolResult` blocks of a user turn, tools
//! `toolSpec`s with their JSON Schema, a JSON-schema `response_format` the
//! `outputConfig` (its schema as a string, as Converse takes it). A stop for
//! a guardrail or a content filter is a definite failure naming why.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::domain::Secret;

/// The credentials and region every request is signed with, read once
/// from the standard AWS variables.
#[derive(Clone)]
pub struct AwsSigning {
    pub access_key_id: String,
    pub secret_access_key: Secret,
    pub session_token: Option<Secret>,
    pub region: String,
}

impl std::fmt::Debug for AwsSigning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsSigning")
            .field("access_key_id", &self.access_key_id)
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

/// The service name Bedrock Runtime's requests are signed for.
pub const SIGNING_NAME: &str = "bedrock";

/// The headers that sign `body`, sent as `POST` to `url` with
/// `content-type` (and `accept`) at `time`: `authorization`, `x-amz-date`,
/// and `x-amz-security-token` with a session token.
pub fn sign(
    signing: &AwsSigning,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    time: std::time::SystemTime,
) -> Result<Vec<(String, String)>, String> {
    use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings};
    let identity: aws_smithy_runtime_api::client::identity::Identity =
        aws_credential_types::Credentials::new(
            signing.access_key_id.clone(),
            signing.secret_access_key.expose().to_owned(),
            signing
                .session_token
                .as_ref()
                .map(|t| t.expose().to_owned()),
            None,
            "onejob",
        )
        .into();
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region(&signing.region)
        .name(SIGNING_NAME)
        .time(time)
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| e.to_string())?
        .into();
    let request = SignableRequest::new(
        "POST",
        url,
        headers.iter().copied(),
        SignableBody::Bytes(body),
    )
    .map_err(|e| e.to_string())?;
    let (instructions, _) = aws_sigv4::http_request::sign(request, &params)
        .map_err(|e| e.to_string())?
        .into_parts();
    Ok(instructions
        .headers()
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect())
}

/// A model id as a path label: `:` and `/` percent-encoded
/// (`anthropic.claude-3-haiku-20240307-v1:0` →
/// `anthropic.claude-3-haiku-20240307-v1%3A0`).
pub fn model_label(model: &str) -> String {
    model
        .chars()
        .map(|c| match c {
            'A'..='Z' | 'a'..='z' | '0'..='9' | '-' | '_' | '.' | '~' => c.to_string(),
            other => {
                let mut bytes = [0u8; 4];
                other
                    .encode_utf8(&mut bytes)
                    .bytes()
                    .map(|b| format!("%{b:02X}"))
                    .collect()
            }
        })
        .collect()
}

/// `ConverseRequest` (the model is in the path).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConverseRequest {
    pub messages: Vec<Message>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub system: Vec<Value>,
    pub inference_config: InferenceConfig,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_config: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_config: Option<Value>,
}

/// A turn: `user` or `assistant`, and its content blocks (each a union:
/// one of `text`, `image`, `toolUse`, `toolResult`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: Vec<Value>,
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
    /// As the stored answer keeps usage (OpenAI's shape): the prompt is
    /// the input with what was read from and written to the cache.
    pub fn to_openai(self) -> Value {
        let prompt =
            self.input_tokens + self.cache_read_input_tokens + self.cache_write_input_tokens;
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": self.output_tokens,
            "total_tokens": prompt + self.output_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cache_read_input_tokens},
        })
    }
}

/// What the call asks, for a [`ConverseRequest`].
pub struct Ask<'a> {
    /// A chat route's request (OpenAI's Chat Completions), or `None` for a
    /// task's rendered prompt.
    pub chat: Option<&'a Value>,
    pub prompt: &'a str,
    pub task: &'a str,
    pub output_schema: Option<&'a Value>,
    pub max_tokens: u32,
    pub temperature: Option<f64>,
}

/// The request for `ask`, or why Converse cannot carry it (nothing sent).
pub fn request(ask: &Ask<'_>) -> Result<ConverseRequest, String> {
    let Some(chat) = ask.chat else {
        return Ok(ConverseRequest {
            messages: vec![Message {
                role: "user".into(),
                content: vec![json!({"text": ask.prompt})],
            }],
            inference_config: InferenceConfig {
                max_tokens: Some(u64::from(ask.max_tokens)),
                temperature: ask.temperature,
                ..InferenceConfig::default()
            },
            output_config: ask.output_schema.map(|s| output_config(ask.task, s)),
            ..ConverseRequest::default()
        });
    };
    let (system, messages) = conversation(chat)?;
    let stop_sequences = match &chat["stop"] {
        Value::String(one) => vec![one.clone()],
        Value::Array(list) => list
            .iter()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    };
    let output = match chat["response_format"]["type"].as_str() {
        Some("json_schema") => {
            let format = &chat["response_format"]["json_schema"];
            Some(output_config(
                format["name"].as_str().unwrap_or(ask.task),
                &format["schema"],
            ))
        }
        _ => None,
    };
    Ok(ConverseRequest {
        messages,
        system,
        inference_config: InferenceConfig {
            max_tokens: Some(
                super::chat::requested_max_tokens(chat).unwrap_or(u64::from(ask.max_tokens)),
            ),
            temperature: chat["temperature"].as_f64().or(ask.temperature),
            top_p: chat["top_p"].as_f64(),
            stop_sequences,
        },
        tool_config: tool_config(chat),
        output_config: output,
    })
}

/// Structured output: the schema as a JSON string, as Converse takes it.
fn output_config(name: &str, schema: &Value) -> Value {
    let name: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    json!({"textFormat": {"type": "json_schema", "structure": {"jsonSchema": {
        "schema": schema.to_string(), "name": name}}}})
}

fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        _ => String::new(),
    }
}

/// A user turn's blocks: text, and images given as `data:` URLs.
fn user_blocks(content: &Value) -> Result<Vec<Value>, String> {
    let Value::Array(parts) = content else {
        return Ok(vec![json!({"text": text_of(content)})]);
    };
    parts
        .iter()
        .map(|part| match part["type"].as_str() {
            Some("image_url") => {
                let url = part["image_url"]["url"].as_str().unwrap_or_default();
                let (mime, data) = url
                    .strip_prefix("data:image/")
                    .and_then(|rest| rest.split_once(";base64,"))
                    .ok_or("Bedrock takes images inline only: send them as data: URLs")?;
                Ok(json!({"image": {"format": mime, "source": {"bytes": data}}}))
            }
            _ => Ok(json!({"text": part["text"].as_str().unwrap_or_default()})),
        })
        .collect()
}

/// The system blocks and the turns; consecutive tool results share one
/// user turn.
fn conversation(chat: &Value) -> Result<(Vec<Value>, Vec<Message>), String> {
    let mut system = Vec::new();
    let mut messages: Vec<Message> = Vec::new();
    for message in chat["messages"].as_array().into_iter().flatten() {
        match message["role"].as_str() {
            Some("system" | "developer") => {
                let text = text_of(&message["content"]);
                if !text.is_empty() {
                    system.push(json!({"text": text}));
                }
            }
            Some("user") => messages.push(Message {
                role: "user".into(),
                content: user_blocks(&message["content"])?,
            }),
            Some("assistant") => {
                let mut content = Vec::new();
                let text = text_of(&message["content"]);
                if !text.is_empty() {
                    content.push(json!({"text": text}));
                }
                for call in message["tool_calls"].as_array().into_iter().flatten() {
                    let input = call["function"]["arguments"]
                        .as_str()
                        .and_then(|a| serde_json::from_str::<Value>(a).ok())
                        .filter(Value::is_object)
                        .unwrap_or_else(|| json!({}));
                    content.push(json!({"toolUse": {"toolUseId": call["id"],
                        "name": call["function"]["name"], "input": input}}));
                }
                if content.is_empty() {
                    content.push(json!({"text": ""}));
                }
                messages.push(Message {
                    role: "assistant".into(),
                    content,
                });
            }
            Some("tool") => {
                let text = text_of(&message["content"]);
                let result = match serde_json::from_str::<Value>(&text)
                    .ok()
                    .filter(Value::is_object)
                {
                    Some(json) => json!({"json": json}),
                    None => json!({"text": text}),
                };
                let block = json!({"toolResult": {"toolUseId": message["tool_call_id"],
                    "content": [result], "status": "success"}});
                match messages.last_mut() {
                    Some(last)
                        if last.role == "user"
                            && last.content.iter().all(|b| b.get("toolResult").is_some()) =>
                    {
                        last.content.push(block);
                    }
                    _ => messages.push(Message {
                        role: "user".into(),
                        content: vec![block],
                    }),
                }
            }
            _ => {}
        }
    }
    Ok((system, messages))
}

fn tool_config(chat: &Value) -> Option<Value> {
    let tools: Vec<Value> = chat["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|tool| {
            let function = &tool["function"];
            let mut spec = json!({"name": function["name"].as_str()?,
                "inputSchema": {"json": function.get("parameters").filter(|p| p.is_object())
                    .cloned().unwrap_or_else(|| json!({"type": "object"}))}});
            if let Some(description) = function["description"].as_str() {
                spec["description"] = json!(description);
            }
            Some(json!({"toolSpec": spec}))
        })
        .collect();
    if tools.is_empty() {
        return None;
    }
    let mut config = json!({"tools": tools});
    let choice = match &chat["tool_choice"] {
        Value::String(choice) => match choice.as_str() {
            "auto" => Some(json!({"auto": {}})),
            "required" => Some(json!({"any": {}})),
            _ => None,
        },
        Value::Object(choice) => choice
            .get("function")
            .and_then(|f| f["name"].as_str())
            .map(|name| json!({"tool": {"name": name}})),
        _ => None,
    };
    if let Some(choice) = choice {
        config["toolChoice"] = choice;
    }
    Some(config)
}

/// The stop reasons that mean the answer was stopped by a guardrail or a
/// filter: a definite failure.
fn stopped_by_filter(reason: &str) -> bool {
    matches!(reason, "guardrail_intervened" | "content_filtered")
}

/// Converse's stop reason as an OpenAI finish reason.
fn finish_reason(reason: &str) -> &'static str {
    match reason {
        "max_tokens" | "model_context_window_exceeded" => "length",
        "tool_use" => "tool_calls",
        _ => "stop",
    }
}

/// Why a whole answer is a definite failure, if it is one.
pub fn blocked(response: &ConverseResponse) -> Option<String> {
    stopped_by_filter(&response.stop_reason)
        .then(|| format!("the provider stopped the answer: {}", response.stop_reason))
}

/// The answer, in onejob's one shape.
pub fn answer(response: &ConverseResponse) -> Value {
    let blocks = &response.output.message.content;
    let text: String = blocks.iter().filter_map(|b| b["text"].as_str()).collect();
    let calls: Vec<Value> = blocks
        .iter()
        .filter_map(|b| b.get("toolUse"))
        .map(|call| {
            json!({"id": call["toolUseId"], "type": "function", "function": {
                "name": call["name"], "arguments": call.get("input").map_or_else(|| "{}".to_owned(), Value::to_string)}})
        })
        .collect();
    let mut message = json!({"role": "assistant", "content": text});
    if !calls.is_empty() {
        if text.is_empty() {
            message["content"] = Value::Null;
        }
        message["tool_calls"] = Value::Array(calls);
    }
    json!({
        "message": message,
        "finish_reason": finish_reason(&response.stop_reason),
        "usage": response.usage.to_openai(),
    })
}

/// The text of a task's answer.
pub fn answer_text(response: &ConverseResponse) -> Result<String, String> {
    let text: String = response
        .output
        .message
        .content
        .iter()
        .filter_map(|b| b["text"].as_str())
        .collect();
    if text.is_empty() {
        return Err("the response has no text".into());
    }
    Ok(text)
}

/// The error type of a Bedrock error answer: `x-amzn-ErrorType` (cut at
/// its first `:`), else the body's `__type` or `code` (after a `#`).
pub fn error_type(header: Option<&str>, body: &Value) -> Option<String> {
    let raw = header
        .map(str::to_owned)
        .or_else(|| body["__type"].as_str().map(str::to_owned))
        .or_else(|| body["code"].as_str().map(str::to_owned))?;
    let raw = raw.split(':').next().unwrap_or(&raw);
    Some(raw.rsplit('#').next().unwrap_or(raw).to_owned())
}

/// One ConverseStream event as an OpenAI chunk (or nothing), keeping what
/// the events spread out: which content block is which tool call.
#[derive(Debug, Default)]
pub struct ConverseEvents {
    /// `(content block index, tool call index)`.
    tools: Vec<(u64, usize)>,
}

/// What one event amounts to.
#[derive(Debug, PartialEq)]
pub enum Event {
    Chunk(Value),
    Nothing,
    /// An exception frame, or a stop for a guardrail: a definite failure.
    Failed(String),
}

impl ConverseEvents {
    /// Translates one frame: its `:message-type`, its event or exception
    /// type, and its payload.
    pub fn translate(&mut self, message_type: &str, kind: &str, payload: &Value) -> Event {
        let chunk = |delta: Value, finish: Value| {
            Event::Chunk(
                json!({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
            )
        };
        if message_type != "event" {
            let message = payload["message"].as_str().unwrap_or("no message");
            return Event::Failed(format!(
                "the provider ended the stream with {kind}: {message}"
            ));
        }
        match kind {
            "contentBlockStart" => {
                let Some(tool) = payload["start"].get("toolUse") else {
                    return Event::Nothing;
                };
                let block = payload["contentBlockIndex"].as_u64().unwrap_or(0);
                let index = self.tools.len();
                self.tools.push((block, index));
                chunk(
                    json!({"tool_calls": [{"index": index, "id": tool["toolUseId"], "type": "function",
                        "function": {"name": tool["name"], "arguments": ""}}]}),
                    Value::Null,
                )
            }
            "contentBlockDelta" => {
                let delta = &payload["delta"];
                if let Some(text) = delta["text"].as_str() {
                    return chunk(json!({"content": text}), Value::Null);
                }
                let Some(part) = delta["toolUse"]["input"].as_str() else {
                    return Event::Nothing;
                };
                let block = payload["contentBlockIndex"].as_u64().unwrap_or(0);
                match self.tools.iter().find(|(b, _)| *b == block) {
                    Some((_, index)) => chunk(
                        json!({"tool_calls": [{"index": index, "function": {"arguments": part}}]}),
                        Value::Null,
                    ),
                    None => Event::Nothing,
                }
            }
            "messageStop" => {
                let reason = payload["stopReason"].as_str().unwrap_or("end_turn");
                if stopped_by_filter(reason) {
                    return Event::Failed(format!("the provider stopped the answer: {reason}"));
                }
                chunk(json!({}), json!(finish_reason(reason)))
            }
            "metadata" => {
                let usage: TokenUsage =
                    serde_json::from_value(payload["usage"].clone()).unwrap_or_default();
                Event::Chunk(json!({"choices": [], "usage": usage.to_openai()}))
            }
            _ => Event::Nothing,
        }
    }
}

/// The header of a frame, as text.
pub fn header_of(message: &aws_smithy_types::event_stream::Message, name: &str) -> String {
    message
        .headers()
        .iter()
        .find(|h| h.name().as_str() == name)
        .and_then(|h| h.value().as_string().ok())
        .map(|s| s.as_str().to_owned())
        .unwrap_or_default()
}

/// A frame's payload as JSON (`{}` when empty).
pub fn payload_of(message: &aws_smithy_types::event_stream::Message) -> Result<Value, String> {
    if message.payload().is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    serde_json::from_slice(message.payload()).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(chat: &Value) -> Ask<'_> {
        Ask {
            chat: Some(chat),
            prompt: "",
            task: "t",
            output_schema: None,
            max_tokens: 256,
            temperature: None,
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
        let body = serde_json::to_value(request(&ask(&chat)).unwrap()).unwrap();
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
        assert_eq!(
            model_label("anthropic.claude-3-haiku-20240307-v1:0"),
            "anthropic.claude-3-haiku-20240307-v1%3A0"
        );
    }

    #[test]
    fn events_come_back_as_chunks_and_a_guardrail_fails_the_answer() {
        let mut events = ConverseEvents::default();
        assert_eq!(
            events.translate("event", "messageStart", &json!({"role": "assistant"})),
            Event::Nothing
        );
        let Event::Chunk(text) = events.translate(
            "event",
            "contentBlockDelta",
            &json!({"contentBlockIndex": 0, "delta": {"text": "Hi"}, "p": "abc"}),
        ) else {
            panic!()
        };
        assert_eq!(text["choices"][0]["delta"]["content"], "Hi");
        let Event::Chunk(start) = events.translate("event", "contentBlockStart",
            &json!({"contentBlockIndex": 1, "start": {"toolUse": {"toolUseId": "t1", "name": "f"}}})) else { panic!() };
        assert_eq!(start["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
        let Event::Chunk(args) = events.translate(
            "event",
            "contentBlockDelta",
            &json!({"contentBlockIndex": 1, "delta": {"toolUse": {"input": "{\"a\":"}}}),
        ) else {
            panic!()
        };
        assert_eq!(
            args["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"],
            "{\"a\":"
        );
        let Event::Chunk(stop) =
            events.translate("event", "messageStop", &json!({"stopReason": "tool_use"}))
        else {
            panic!()
        };
        assert_eq!(stop["choices"][0]["finish_reason"], "tool_calls");
        let Event::Chunk(usage) = events.translate("event", "metadata",
            &json!({"usage": {"inputTokens": 3, "outputTokens": 2, "totalTokens": 5}, "metrics": {"latencyMs": 9}})) else { panic!() };
        assert_eq!(usage["usage"]["total_tokens"], 5);
        assert!(matches!(
            events.translate(
                "event",
                "messageStop",
                &json!({"stopReason": "guardrail_intervened"})
            ),
            Event::Failed(_)
        ));
        assert!(matches!(
            events.translate(
                "exception",
                "throttlingException",
                &json!({"message": "slow down"})
            ),
            Event::Failed(_)
        ));
        assert_eq!(
            error_type(
                Some("ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/"),
                &json!({})
            ),
            Some("ThrottlingException".into())
        );
        assert_eq!(
            error_type(
                None,
                &json!({"__type": "com.amazon.coral.validate#ValidationException"})
            ),
            Some("ValidationException".into())
        );
    }
}
