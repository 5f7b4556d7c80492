//! Google's Gemini API (`generateContent`, `streamGenerateContent` with
//! `alt=sse`, `countTokens`): its wire types, a chat call written in its
//! terms, and its answers, stream events and errors read back.
//!
//! System messages become the `systemInstruction`, assistant turns `model`
//! turns (tool calls as `functionCall` parts), tool results
//! `functionResponse` parts named after the call they answer (Gemini names
//! functions, not calls); tools become `functionDeclarations` with their
//! JSON Schema as `parametersJsonSchema`; a JSON-schema output becomes
//! `responseMimeType` and `responseJsonSchema`. A safety block (a blocked
//! prompt, or an answer stopped for `SAFETY` and the like) is a definite
//! failure naming why.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::model::{
    self as m, Answer, CannotCarry, ChatRequest, Delta, OutputFormat, StopReason, StreamEvent,
    TokenCounts, ToolCall, ToolCallDelta, ToolChoice,
};

/// `GenerateContentRequest`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GenerateContentRequest {
    pub contents: Vec<Content>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_instruction: Option<Content>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Tool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_config: Option<ToolConfig>,
    pub generation_config: GenerationConfig,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Content {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default)]
    pub parts: Vec<Part>,
}

/// One part of a turn: exactly one of its data fields is set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Part {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inline_data: Option<Blob>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function_call: Option<FunctionCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function_response: Option<FunctionResponse>,
    /// A part of the model's thinking, not of its answer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub thought: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Blob {
    pub mime_type: String,
    /// Base64.
    pub data: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub name: String,
    #[serde(default)]
    pub args: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionResponse {
    pub name: String,
    pub response: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Tool {
    pub function_declarations: Vec<FunctionDeclaration>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FunctionDeclaration {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters_json_schema: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolConfig {
    pub function_calling_config: FunctionCallingConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FunctionCallingConfig {
    /// `AUTO`, `ANY` or `NONE`.
    pub mode: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_function_names: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GenerationConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stop_sequences: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_mime_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_json_schema: Option<Value>,
}

/// `GenerateContentResponse`: a whole answer, or one event of a stream.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GenerateContentResponse {
    #[serde(default)]
    pub candidates: Vec<Candidate>,
    #[serde(default)]
    pub prompt_feedback: Option<PromptFeedback>,
    #[serde(default)]
    pub usage_metadata: Option<UsageMetadata>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    #[serde(default)]
    pub content: Option<Content>,
    #[serde(default)]
    pub finish_reason: Option<String>,
    #[serde(default)]
    pub finish_message: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PromptFeedback {
    #[serde(default)]
    pub block_reason: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageMetadata {
    #[serde(default)]
    pub prompt_token_count: u64,
    #[serde(default)]
    pub candidates_token_count: u64,
    #[serde(default)]
    pub thoughts_token_count: u64,
    #[serde(default)]
    pub cached_content_token_count: u64,
}

impl UsageMetadata {
    /// The counts: the thinking tokens are output tokens, billed as such.
    pub fn counts(self) -> TokenCounts {
        TokenCounts {
            input: self.prompt_token_count,
            output: self.candidates_token_count + self.thoughts_token_count,
            cached_input: self.cached_content_token_count,
            reasoning: self.thoughts_token_count,
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
    CannotCarry(format!("Gemini cannot carry {what}"))
}

fn text_part(text: impl Into<String>) -> Part {
    Part {
        text: Some(text.into()),
        ..Part::default()
    }
}

/// The request for `request`, or what of it Gemini cannot carry.
pub fn write_request(
    request: &ChatRequest,
    target: ProviderTarget,
) -> Result<GenerateContentRequest, CannotCarry> {
    if let Some(member) = request.openai_extras.keys().next() {
        return Err(cannot(format!("`{member}`")));
    }
    if request.user.is_some() {
        return Err(cannot("`user`"));
    }
    let (system, contents) = conversation(&request.messages)?;
    let tools = tools(&request.tools);
    let tool_config = (!tools.is_empty())
        .then(|| request.tool_choice.as_ref().map(tool_config))
        .flatten();
    Ok(GenerateContentRequest {
        contents,
        system_instruction: system,
        tools,
        tool_config,
        generation_config: generation_config(request, target),
    })
}

/// A user turn's parts: text, and images given inline (`data:` URLs).
fn user_parts(content: &m::Content) -> Result<Vec<Part>, CannotCarry> {
    content
        .parts()
        .iter()
        .map(|part| match part {
            m::Part::Text(text) => Ok(text_part(text.as_str())),
            m::Part::Image(image) => {
                let (mime_type, data) = image
                    .inline()
                    .ok_or_else(|| cannot("an image by URL: send it inline, as a data: URL"))?;
                Ok(Part {
                    inline_data: Some(Blob {
                        mime_type: mime_type.to_owned(),
                        data: data.to_owned(),
                    }),
                    ..Part::default()
                })
            }
            m::Part::OpenAiOther(_) => Err(cannot("a content part other than text or an image")),
        })
        .collect()
}

/// The system instruction and the turns. A tool's result is answered by
/// the name of the call it answers; the results of one round share one
/// user turn.
fn conversation(messages: &[m::Message]) -> Result<(Option<Content>, Vec<Content>), CannotCarry> {
    let mut system: Vec<String> = Vec::new();
    let mut contents: Vec<Content> = Vec::new();
    let mut call_names: Vec<(&str, &str)> = Vec::new();
    for message in messages {
        match message {
            m::Message::System { name: Some(_), .. }
            | m::Message::User { name: Some(_), .. }
            | m::Message::Assistant { name: Some(_), .. } => {
                return Err(cannot("a message's `name`"))
            }
            m::Message::System { content, .. } => {
                system.push(text_only(content, "a system message")?)
            }
            m::Message::User { content, .. } => contents.push(turn("user", user_parts(content)?)),
            m::Message::Assistant {
                content,
                tool_calls,
                ..
            } => {
                call_names.extend(tool_calls.iter().map(|c| (c.id.as_str(), c.name.as_str())));
                contents.push(turn("model", model_parts(content.as_ref(), tool_calls)));
            }
            m::Message::Tool { call_id, content } => {
                let part = tool_result_part(call_id, content, &call_names)?;
                match contents.last_mut() {
                    Some(last)
                        if last.role.as_deref() == Some("user")
                            && last.parts.iter().all(|p| p.function_response.is_some()) =>
                    {
                        last.parts.push(part);
                    }
                    _ => contents.push(turn("user", vec![part])),
                }
            }
        }
    }
    let system = (!system.is_empty()).then(|| Content {
        role: None,
        parts: vec![text_part(system.join("\n\n"))],
    });
    Ok((system, contents))
}

fn turn(role: &str, parts: Vec<Part>) -> Content {
    Content {
        role: Some(role.to_owned()),
        parts,
    }
}

/// An assistant turn's parts: its text, and a function call for each tool
/// call (a turn with neither has one empty text).
fn model_parts(content: Option<&m::Content>, tool_calls: &[ToolCall]) -> Vec<Part> {
    let mut parts = Vec::new();
    let text = content.map(|c| c.text("")).unwrap_or_default();
    if !text.is_empty() {
        parts.push(text_part(text));
    }
    for call in tool_calls {
        parts.push(Part {
            function_call: Some(FunctionCall {
                id: None,
                name: call.name.clone(),
                args: call.input(),
            }),
            ..Part::default()
        });
    }
    if parts.is_empty() {
        parts.push(text_part(""));
    }
    parts
}

/// A tool's result as a function response, named after the latest call
/// with its id; a result that is no JSON object is wrapped as `content`.
fn tool_result_part(
    call_id: &str,
    content: &m::Content,
    call_names: &[(&str, &str)],
) -> Result<Part, CannotCarry> {
    let name = call_names
        .iter()
        .rev()
        .find(|(known, _)| *known == call_id)
        .map(|(_, name)| (*name).to_owned())
        .ok_or_else(|| {
            CannotCarry(format!(
                "the tool result for {call_id:?} answers no earlier tool call; Gemini \
                 names a result after its call"
            ))
        })?;
    let text = text_only(content, "a tool result")?;
    let response = serde_json::from_str::<Value>(&text)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| {
            Value::Object(Map::from_iter([(
                "content".to_owned(),
                Value::String(text),
            )]))
        });
    Ok(Part {
        function_response: Some(FunctionResponse { name, response }),
        ..Part::default()
    })
}

/// The client's tools, as one tool of function declarations (`strict` is
/// how Gemini reads a declaration's schema anyway).
fn tools(tools: &[m::Tool]) -> Vec<Tool> {
    if tools.is_empty() {
        return Vec::new();
    }
    vec![Tool {
        function_declarations: tools
            .iter()
            .map(|tool| FunctionDeclaration {
                name: tool.name.clone(),
                description: tool.description.clone(),
                parameters_json_schema: tool.parameters.clone(),
            })
            .collect(),
    }]
}

fn tool_config(choice: &ToolChoice) -> ToolConfig {
    let (mode, names) = match choice {
        ToolChoice::Auto => ("AUTO", Vec::new()),
        ToolChoice::Required => ("ANY", Vec::new()),
        ToolChoice::None => ("NONE", Vec::new()),
        ToolChoice::Named(name) => ("ANY", vec![name.clone()]),
    };
    ToolConfig {
        function_calling_config: FunctionCallingConfig {
            mode,
            allowed_function_names: names,
        },
    }
}

fn generation_config(request: &ChatRequest, target: ProviderTarget) -> GenerationConfig {
    let sampling = &request.sampling;
    let mut config = GenerationConfig {
        max_output_tokens: Some(sampling.max_tokens.unwrap_or(target.default_max_tokens)),
        temperature: sampling.temperature.or(target.default_temperature),
        top_p: sampling.top_p,
        top_k: sampling.top_k,
        stop_sequences: request.stop.clone(),
        seed: sampling.seed,
        presence_penalty: sampling.presence_penalty,
        frequency_penalty: sampling.frequency_penalty,
        ..GenerationConfig::default()
    };
    match &request.output {
        Some(OutputFormat::JsonSchema { schema, .. }) => {
            config.response_mime_type = Some("application/json");
            config.response_json_schema = Some(schema.clone());
        }
        Some(OutputFormat::JsonObject) => config.response_mime_type = Some("application/json"),
        None => {}
    }
    config
}

/// The finish reasons that mean the answer was stopped, not finished: a
/// safety filter, recitation, a blocklist, prohibited content and the like.
fn stopped_by_filter(reason: &str) -> bool {
    !matches!(
        reason,
        "STOP" | "MAX_TOKENS" | "FINISH_REASON_UNSPECIFIED" | "MALFORMED_FUNCTION_CALL"
    )
}

/// Why an answer is a definite failure, if it is one: a blocked prompt, or
/// an answer stopped by a filter.
pub fn blocked(response: &GenerateContentResponse) -> Option<String> {
    if let Some(reason) = response
        .prompt_feedback
        .as_ref()
        .and_then(|f| f.block_reason.as_deref())
    {
        return Some(format!("the provider blocked the prompt: {reason}"));
    }
    let candidate = response.candidates.first()?;
    let reason = candidate.finish_reason.as_deref()?;
    stopped_by_filter(reason).then(|| {
        let said = candidate
            .finish_message
            .as_deref()
            .map(|m| format!(" ({m})"))
            .unwrap_or_default();
        format!("the provider stopped the answer: {reason}{said}")
    })
}

/// The parts of the first candidate's answer (its thinking left out).
fn answer_parts(candidate: &Candidate) -> impl Iterator<Item = &Part> {
    candidate
        .content
        .iter()
        .flat_map(|c| c.parts.iter())
        .filter(|p| !p.thought)
}

/// A function call as a tool call; Gemini may leave its id out.
fn tool_call(index: usize, call: &FunctionCall) -> ToolCall {
    ToolCall {
        id: call
            .id
            .clone()
            .unwrap_or_else(|| format!("call_{index}_{}", call.name)),
        name: call.name.clone(),
        arguments: call.args.to_string(),
    }
}

fn read_stop(reason: Option<&str>, called: bool) -> StopReason {
    match reason {
        Some("MAX_TOKENS") => StopReason::MaxTokens,
        _ if called => StopReason::ToolUse,
        _ => StopReason::EndTurn,
    }
}

/// The answer out of a whole response (check [`blocked`] first).
pub fn read_answer(response: &GenerateContentResponse) -> Result<Answer, String> {
    let candidate = response
        .candidates
        .first()
        .ok_or("the response has no candidate")?;
    let text: String = answer_parts(candidate)
        .filter_map(|p| p.text.as_deref())
        .collect();
    let tool_calls: Vec<ToolCall> = answer_parts(candidate)
        .filter_map(|p| p.function_call.as_ref())
        .enumerate()
        .map(|(i, call)| tool_call(i, call))
        .collect();
    Ok(Answer {
        text: (!text.is_empty() || tool_calls.is_empty()).then_some(text),
        stop: read_stop(candidate.finish_reason.as_deref(), !tool_calls.is_empty()),
        tool_calls,
        usage: response.usage_metadata.unwrap_or_default().counts(),
        message_extras: Map::new(),
    })
}

/// A stream's events: each a whole `GenerateContentResponse` with the next
/// text, function calls (which come whole), and at the end the finish
/// reason and the usage.
#[derive(Debug, Default)]
pub struct EventReader {
    calls: usize,
}

impl super::StreamReader for EventReader {
    fn read(&mut self, _name: &str, data: &str) -> Result<Vec<StreamEvent>, super::StreamError> {
        let response: GenerateContentResponse =
            serde_json::from_str(data).map_err(|e| super::StreamError::Garbled(e.to_string()))?;
        if let Some(why) = blocked(&response) {
            return Ok(vec![StreamEvent::Failed(why)]);
        }
        let mut events = Vec::new();
        if let Some(candidate) = response.candidates.first() {
            let text: String = answer_parts(candidate)
                .filter_map(|p| p.text.as_deref())
                .collect();
            let tool_calls: Vec<ToolCallDelta> = answer_parts(candidate)
                .filter_map(|p| p.function_call.as_ref())
                .map(|call| {
                    let index = self.calls;
                    self.calls += 1;
                    let call = tool_call(index, call);
                    ToolCallDelta {
                        index,
                        id: Some(call.id),
                        name: Some(call.name),
                        arguments: Some(call.arguments),
                    }
                })
                .collect();
            let delta = Delta {
                text: (!text.is_empty()).then_some(text),
                tool_calls,
            };
            if !delta.is_empty() {
                events.push(StreamEvent::Delta(delta));
            }
            if let Some(reason) = candidate.finish_reason.as_deref() {
                events.push(StreamEvent::Stop(read_stop(Some(reason), self.calls > 0)));
            }
        }
        if let Some(usage) = response.usage_metadata {
            events.push(StreamEvent::Usage(usage.counts()));
        }
        Ok(events)
    }
}

/// Gemini's error body, as far as its retry delay goes.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ErrorBody {
    #[serde(default)]
    pub error: ErrorStatus,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ErrorStatus {
    #[serde(default)]
    pub details: Vec<ErrorDetail>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ErrorDetail {
    #[serde(rename = "@type", default)]
    pub kind: String,
    #[serde(rename = "retryDelay", default)]
    pub retry_delay: Option<String>,
}

/// The wait a Gemini error asks for (`RetryInfo`'s `retryDelay`, as `"40s"`
/// or `"0.5s"`), from its body: Gemini says it there, not in a header.
pub fn retry_delay(body: &[u8]) -> Option<std::time::Duration> {
    let body: ErrorBody = serde_json::from_slice(body).ok()?;
    body.error
        .details
        .iter()
        .find(|d| d.kind.ends_with("google.rpc.RetryInfo"))?
        .retry_delay
        .as_deref()?
        .strip_suffix('s')?
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(std::time::Duration::from_secs_f64)
}

/// `countTokens`' request for one user text.
#[derive(Debug, Clone, Serialize)]
pub struct CountTokensRequest {
    pub contents: Vec<Content>,
}

impl CountTokensRequest {
    pub fn of(text: &str) -> Self {
        Self {
            contents: vec![Content {
                role: Some("user".into()),
                parts: vec![text_part(text)],
            }],
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CountTokensResponse {
    pub total_tokens: u64,
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
            let refused = write_request(&request, TARGET).expect_err(&message.to_string());
            assert!(
                refused.0.contains("a part other than text"),
                "{}",
                refused.0
            );
        }
    }

    const TARGET: ProviderTarget = ProviderTarget {
        default_max_tokens: 256,
        default_temperature: None,
    };

    fn written(chat: Value) -> Result<Value, CannotCarry> {
        let request = openai_chat::read_request(&chat).unwrap().request;
        write_request(&request, TARGET).map(|r| serde_json::to_value(r).unwrap())
    }

    #[test]
    fn a_chat_request_becomes_turns_tools_and_a_generation_config() {
        let body = written(json!({
            "model": "gpt-safe",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Weather?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}]},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                    "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "{\"sky\":\"sunny\"}"},
            ],
            "tools": [{"type": "function", "function": {"name": "weather", "description": "Now",
                "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "weather"}},
            "stop": "END", "temperature": 0.2, "max_tokens": 64,
            "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}},
        }))
        .unwrap();
        assert_eq!(
            body,
            json!({
                "contents": [
                    {"role": "user", "parts": [{"text": "Weather?"},
                        {"inlineData": {"mimeType": "image/png", "data": "iVBO"}}]},
                    {"role": "model", "parts": [{"functionCall": {"name": "weather", "args": {"city": "Oslo"}}}]},
                    {"role": "user", "parts": [{"functionResponse": {"name": "weather", "response": {"sky": "sunny"}}}]},
                ],
                "systemInstruction": {"parts": [{"text": "Be brief."}]},
                "tools": [{"functionDeclarations": [{"name": "weather", "description": "Now",
                    "parametersJsonSchema": {"type": "object"}}]}],
                "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["weather"]}},
                "generationConfig": {"maxOutputTokens": 64, "temperature": 0.2, "stopSequences": ["END"],
                    "responseMimeType": "application/json", "responseJsonSchema": {"type": "object"}},
            })
        );
        let user = |content: Value| json!({"messages": [{"role": "user", "content": content}]});
        assert!(written(user(
            json!([{"type": "image_url", "image_url": {"url": "https://x/y.png"}}])
        ))
        .is_err());
        assert!(written(
            json!({"messages": [{"role": "tool", "tool_call_id": "c9", "content": "x"}]})
        )
        .is_err());
        let extra = json!({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"1": 2}});
        assert!(written(extra).unwrap_err().0.contains("logit_bias"));
    }

    #[test]
    fn answers_blocks_and_stream_events_are_read_into_the_model() {
        let whole: GenerateContentResponse = serde_json::from_value(json!({
            "candidates": [{"content": {"role": "model", "parts": [
                {"text": "thinking", "thought": true}, {"text": "Hi"},
                {"functionCall": {"name": "f", "args": {"a": 1}}}]}, "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 2, "thoughtsTokenCount": 3,
                "cachedContentTokenCount": 1, "totalTokenCount": 10}}))
        .unwrap();
        let answer = read_answer(&whole).unwrap();
        assert_eq!(answer.text(), "Hi");
        assert_eq!(answer.tool_calls[0].arguments, "{\"a\":1}");
        assert_eq!(answer.stop, StopReason::ToolUse);
        assert_eq!(answer.usage.output, 5);
        assert_eq!(answer.usage.cached_input, 1);

        let safety: GenerateContentResponse = serde_json::from_value(
            json!({"candidates": [{"finishReason": "SAFETY", "content": {"parts": []}}]}),
        )
        .unwrap();
        assert_eq!(
            blocked(&safety).unwrap(),
            "the provider stopped the answer: SAFETY"
        );
        let prompt: GenerateContentResponse = serde_json::from_value(
            json!({"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}}),
        )
        .unwrap();
        assert!(blocked(&prompt).unwrap().ends_with("PROHIBITED_CONTENT"));

        let mut events = EventReader::default();
        let text = events
            .read(
                "",
                r#"{"candidates": [{"content": {"parts": [{"text": "Hel"}]}}]}"#,
            )
            .unwrap();
        assert_eq!(text, [StreamEvent::Delta(Delta::text("Hel"))]);
        let last = events
            .read("", r#"{"candidates": [{"content": {"parts": [{"text": "lo"}]}, "finishReason": "MAX_TOKENS"}],
                "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 2}}"#)
            .unwrap();
        assert_eq!(last[1], StreamEvent::Stop(StopReason::MaxTokens));
        assert!(matches!(last[2], StreamEvent::Usage(usage) if usage.total() == 3));
        let stopped = events
            .read("", r#"{"candidates": [{"finishReason": "RECITATION"}]}"#)
            .unwrap();
        assert!(matches!(&stopped[..], [StreamEvent::Failed(_)]));
    }

    #[test]
    fn a_retry_delay_is_read_from_the_error_body() {
        let error = json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "details": [
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure"},
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "40.5s"}]}});
        assert_eq!(
            retry_delay(error.to_string().as_bytes()),
            Some(std::time::Duration::from_millis(40_500))
        );
        assert_eq!(retry_delay(br#"{"error": {"code": 429}}"#), None);
    }
}
