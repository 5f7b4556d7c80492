//! Google's Gemini API (`generateContent`, `streamGenerateContent` with
//! `alt=sse`): its wire types, and the translation of a call into them and
//! of their answers, stream events and errors into onejob's one answer
//! shape (an OpenAI chat completion's message, finish reason and usage;
//! see `providers::chat`).
//!
//! A chat route's request arrives as the client's Chat Completions request:
//! system and developer messages become the `systemInstruction`, assistant
//! turns `model` turns (tool calls as `functionCall` parts), tool results
//! `functionResponse` parts named after the call they answer; tools become
//! `functionDeclarations` with their JSON Schema as `parametersJsonSchema`;
//! a JSON-schema `response_format` becomes `responseMimeType` and
//! `responseJsonSchema`. A safety block (a blocked prompt, or an answer
//! stopped for `SAFETY` and the like) is a definite failure naming why.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

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
    /// As the stored answer keeps usage (OpenAI's shape): the thinking
    /// tokens are output tokens, billed as such.
    pub fn to_openai(self) -> Value {
        let completion = self.candidates_token_count + self.thoughts_token_count;
        json!({
            "prompt_tokens": self.prompt_token_count,
            "completion_tokens": completion,
            "total_tokens": self.prompt_token_count + completion,
            "prompt_tokens_details": {"cached_tokens": self.cached_content_token_count},
            "completion_tokens_details": {"reasoning_tokens": self.thoughts_token_count},
        })
    }
}

/// What the call asks, in onejob's terms, for a [`GenerateContentRequest`].
pub struct Ask<'a> {
    /// A chat route's request (OpenAI's Chat Completions), or `None` for a
    /// task's rendered prompt.
    pub chat: Option<&'a Value>,
    pub prompt: &'a str,
    pub output_schema: Option<&'a Value>,
    pub max_tokens: u32,
    pub temperature: Option<f64>,
}

/// Why a call cannot be put in Gemini's terms: nothing is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CannotCarry(pub String);

/// The request for `ask`.
pub fn request(ask: &Ask<'_>) -> Result<GenerateContentRequest, CannotCarry> {
    let Some(chat) = ask.chat else {
        let mut config = GenerationConfig {
            max_output_tokens: Some(u64::from(ask.max_tokens)),
            temperature: ask.temperature,
            ..GenerationConfig::default()
        };
        if let Some(schema) = ask.output_schema {
            config.response_mime_type = Some("application/json");
            config.response_json_schema = Some(schema.clone());
        }
        return Ok(GenerateContentRequest {
            contents: vec![Content {
                role: Some("user".into()),
                parts: vec![text_part(ask.prompt)],
            }],
            generation_config: config,
            ..GenerateContentRequest::default()
        });
    };
    let (system, contents) = conversation(chat)?;
    let mut request = GenerateContentRequest {
        contents,
        system_instruction: system,
        tools: tools(chat),
        tool_config: tool_config(&chat["tool_choice"]),
        generation_config: generation_config(chat, ask),
    };
    if request.tools.is_empty() {
        request.tool_config = None;
    }
    Ok(request)
}

fn text_part(text: &str) -> Part {
    Part {
        text: Some(text.to_owned()),
        ..Part::default()
    }
}

/// The text of a message's content: a string, or its text parts.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        _ => String::new(),
    }
}

/// A user turn's parts: text, and images given as `data:` URLs.
fn user_parts(content: &Value) -> Result<Vec<Part>, CannotCarry> {
    let Value::Array(parts) = content else {
        return Ok(vec![text_part(&text_of(content))]);
    };
    parts
        .iter()
        .map(|part| match part["type"].as_str() {
            Some("image_url") => {
                let url = part["image_url"]["url"].as_str().unwrap_or_default();
                let (head, data) = url
                    .strip_prefix("data:")
                    .and_then(|rest| rest.split_once(";base64,"))
                    .ok_or_else(|| {
                        CannotCarry(
                            "Gemini takes images inline only: send them as data: URLs".into(),
                        )
                    })?;
                Ok(Part {
                    inline_data: Some(Blob {
                        mime_type: head.to_owned(),
                        data: data.to_owned(),
                    }),
                    ..Part::default()
                })
            }
            _ => Ok(text_part(part["text"].as_str().unwrap_or_default())),
        })
        .collect()
}

/// The system instruction and the turns. A tool's result is answered by
/// the name of the call it answers (Gemini names functions, not calls);
/// the results of one round share one user turn.
fn conversation(chat: &Value) -> Result<(Option<Content>, Vec<Content>), CannotCarry> {
    let messages = chat["messages"].as_array().cloned().unwrap_or_default();
    let mut system: Vec<String> = Vec::new();
    let mut contents: Vec<Content> = Vec::new();
    let mut call_names: Vec<(String, String)> = Vec::new();
    for message in &messages {
        match message["role"].as_str() {
            Some("system" | "developer") => system.push(text_of(&message["content"])),
            Some("user") => contents.push(Content {
                role: Some("user".into()),
                parts: user_parts(&message["content"])?,
            }),
            Some("assistant") => {
                let mut parts = Vec::new();
                let text = text_of(&message["content"]);
                if !text.is_empty() {
                    parts.push(text_part(&text));
                }
                for call in message["tool_calls"].as_array().into_iter().flatten() {
                    let name = call["function"]["name"].as_str().unwrap_or_default();
                    if let Some(id) = call["id"].as_str() {
                        call_names.push((id.to_owned(), name.to_owned()));
                    }
                    let args = call["function"]["arguments"]
                        .as_str()
                        .and_then(|a| serde_json::from_str::<Value>(a).ok())
                        .filter(Value::is_object)
                        .unwrap_or_else(|| json!({}));
                    parts.push(Part {
                        function_call: Some(FunctionCall {
                            id: None,
                            name: name.to_owned(),
                            args,
                        }),
                        ..Part::default()
                    });
                }
                if parts.is_empty() {
                    parts.push(text_part(""));
                }
                contents.push(Content {
                    role: Some("model".into()),
                    parts,
                });
            }
            Some("tool") => {
                let id = message["tool_call_id"].as_str().unwrap_or_default();
                let name = call_names
                    .iter()
                    .rev()
                    .find(|(known, _)| known == id)
                    .map(|(_, name)| name.clone())
                    .ok_or_else(|| {
                        CannotCarry(format!(
                            "the tool result for {id:?} answers no earlier tool call; Gemini \
                             names a result after its call"
                        ))
                    })?;
                let text = text_of(&message["content"]);
                let response = serde_json::from_str::<Value>(&text)
                    .ok()
                    .filter(Value::is_object)
                    .unwrap_or_else(|| json!({ "content": text }));
                let part = Part {
                    function_response: Some(FunctionResponse { name, response }),
                    ..Part::default()
                };
                match contents.last_mut() {
                    Some(last)
                        if last.role.as_deref() == Some("user")
                            && last.parts.iter().all(|p| p.function_response.is_some()) =>
                    {
                        last.parts.push(part);
                    }
                    _ => contents.push(Content {
                        role: Some("user".into()),
                        parts: vec![part],
                    }),
                }
            }
            _ => {}
        }
    }
    let system = (!system.is_empty()).then(|| Content {
        role: None,
        parts: vec![text_part(&system.join("\n\n"))],
    });
    Ok((system, contents))
}

fn tools(chat: &Value) -> Vec<Tool> {
    let declarations: Vec<FunctionDeclaration> = chat["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|tool| {
            let function = &tool["function"];
            Some(FunctionDeclaration {
                name: function["name"].as_str()?.to_owned(),
                description: function["description"].as_str().map(str::to_owned),
                parameters_json_schema: function
                    .get("parameters")
                    .filter(|p| p.is_object())
                    .cloned(),
            })
        })
        .collect();
    if declarations.is_empty() {
        Vec::new()
    } else {
        vec![Tool {
            function_declarations: declarations,
        }]
    }
}

fn tool_config(choice: &Value) -> Option<ToolConfig> {
    let config = |mode, names: Vec<String>| {
        Some(ToolConfig {
            function_calling_config: FunctionCallingConfig {
                mode,
                allowed_function_names: names,
            },
        })
    };
    match choice {
        Value::String(choice) => match choice.as_str() {
            "auto" => config("AUTO", Vec::new()),
            "required" => config("ANY", Vec::new()),
            "none" => config("NONE", Vec::new()),
            _ => None,
        },
        Value::Object(choice) => choice
            .get("function")
            .and_then(|f| f["name"].as_str())
            .and_then(|name| config("ANY", vec![name.to_owned()])),
        _ => None,
    }
}

fn generation_config(chat: &Value, ask: &Ask<'_>) -> GenerationConfig {
    let stop_sequences = match &chat["stop"] {
        Value::String(one) => vec![one.clone()],
        Value::Array(list) => list
            .iter()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    };
    let mut config = GenerationConfig {
        max_output_tokens: Some(
            super::chat::requested_max_tokens(chat).unwrap_or(u64::from(ask.max_tokens)),
        ),
        temperature: chat["temperature"].as_f64().or(ask.temperature),
        top_p: chat["top_p"].as_f64(),
        stop_sequences,
        seed: chat["seed"].as_i64(),
        presence_penalty: chat["presence_penalty"].as_f64(),
        frequency_penalty: chat["frequency_penalty"].as_f64(),
        ..GenerationConfig::default()
    };
    match chat["response_format"]["type"].as_str() {
        Some("json_schema") => {
            config.response_mime_type = Some("application/json");
            config.response_json_schema = chat["response_format"]["json_schema"]
                .get("schema")
                .cloned();
        }
        Some("json_object") => config.response_mime_type = Some("application/json"),
        _ => {}
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

/// The answer, in onejob's one shape, out of a whole response.
pub fn answer(response: &GenerateContentResponse) -> Result<Value, String> {
    let candidate = response
        .candidates
        .first()
        .ok_or("the response has no candidate")?;
    let parts = candidate
        .content
        .as_ref()
        .map(|c| c.parts.as_slice())
        .unwrap_or_default();
    let text: String = parts
        .iter()
        .filter(|p| !p.thought)
        .filter_map(|p| p.text.as_deref())
        .collect();
    let calls: Vec<Value> = parts
        .iter()
        .filter_map(|p| p.function_call.as_ref())
        .enumerate()
        .map(|(i, call)| tool_call(i, call))
        .collect();
    let mut message = json!({"role": "assistant", "content": text});
    if !calls.is_empty() {
        if text.is_empty() {
            message["content"] = Value::Null;
        }
        message["tool_calls"] = Value::Array(calls.clone());
    }
    Ok(json!({
        "message": message,
        "finish_reason": finish_reason(candidate.finish_reason.as_deref(), !calls.is_empty()),
        "usage": response.usage_metadata.unwrap_or_default().to_openai(),
    }))
}

/// A function call as an OpenAI tool call; Gemini may leave its id out.
fn tool_call(index: usize, call: &FunctionCall) -> Value {
    let id = call
        .id
        .clone()
        .unwrap_or_else(|| format!("call_{index}_{}", call.name));
    json!({"id": id, "type": "function",
           "function": {"name": call.name, "arguments": call.args.to_string()}})
}

fn finish_reason(reason: Option<&str>, called: bool) -> &'static str {
    match reason {
        Some("MAX_TOKENS") => "length",
        _ if called => "tool_calls",
        _ => "stop",
    }
}

/// The text of a task's answer.
pub fn answer_text(response: &GenerateContentResponse) -> Result<String, String> {
    let text: String = response
        .candidates
        .first()
        .and_then(|c| c.content.as_ref())
        .map(|c| {
            c.parts
                .iter()
                .filter(|p| !p.thought)
                .filter_map(|p| p.text.as_deref())
                .collect()
        })
        .unwrap_or_default();
    if text.is_empty() {
        return Err("the response has no text".into());
    }
    Ok(text)
}

/// A stream's events as OpenAI chunks: each event's text as a delta, each
/// function call (they come whole) as a tool call of its own, the finish
/// reason and the usage once they come.
#[derive(Debug, Default)]
pub struct GeminiEvents {
    calls: usize,
}

impl GeminiEvents {
    /// One event's chunk, or why the answer was stopped (a definite
    /// failure).
    pub fn translate(&mut self, data: &Value) -> Result<Value, String> {
        let response: GenerateContentResponse =
            serde_json::from_value(data.clone()).map_err(|e| e.to_string())?;
        if let Some(why) = blocked(&response) {
            return Err(why);
        }
        let mut delta = Map::new();
        let mut finish = Value::Null;
        if let Some(candidate) = response.candidates.first() {
            let parts = candidate
                .content
                .as_ref()
                .map(|c| c.parts.as_slice())
                .unwrap_or_default();
            let text: String = parts
                .iter()
                .filter(|p| !p.thought)
                .filter_map(|p| p.text.as_deref())
                .collect();
            if !text.is_empty() {
                delta.insert("content".into(), json!(text));
            }
            let calls: Vec<Value> = parts
                .iter()
                .filter_map(|p| p.function_call.as_ref())
                .map(|call| {
                    let index = self.calls;
                    self.calls += 1;
                    let mut call = tool_call(index, call);
                    call["index"] = json!(index);
                    call
                })
                .collect();
            if !calls.is_empty() {
                delta.insert("tool_calls".into(), Value::Array(calls));
            }
            if let Some(reason) = candidate.finish_reason.as_deref() {
                finish = json!(finish_reason(Some(reason), self.calls > 0));
            }
        }
        let mut chunk = json!({"choices": [{"index": 0, "delta": Value::Object(delta), "finish_reason": finish}]});
        if let Some(usage) = response.usage_metadata {
            chunk["usage"] = usage.to_openai();
        }
        Ok(chunk)
    }
}

/// The wait a Gemini error asks for (`RetryInfo`'s `retryDelay`, as `"40s"`
/// or `"0.5s"`), from its body: Gemini says it there, not in a header.
pub fn retry_delay(error: &Value) -> Option<std::time::Duration> {
    error["error"]["details"].as_array()?.iter().find(|d| {
        d["@type"]
            .as_str()
            .is_some_and(|t| t.ends_with("google.rpc.RetryInfo"))
    })?["retryDelay"]
        .as_str()?
        .strip_suffix('s')?
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(std::time::Duration::from_secs_f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(chat: &Value) -> Ask<'_> {
        Ask {
            chat: Some(chat),
            prompt: "",
            output_schema: None,
            max_tokens: 256,
            temperature: None,
        }
    }

    #[test]
    fn a_chat_request_becomes_turns_tools_and_a_generation_config() {
        let chat = json!({
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
        });
        let body = serde_json::to_value(request(&ask(&chat)).unwrap()).unwrap();
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
        let remote = json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]});
        assert!(request(&ask(&remote)).is_err());
        let orphan = json!({"messages": [{"role": "tool", "tool_call_id": "c9", "content": "x"}]});
        assert!(request(&ask(&orphan)).is_err());
    }

    #[test]
    fn answers_blocks_and_stream_events_come_back_in_onejobs_shape() {
        let whole: GenerateContentResponse = serde_json::from_value(json!({
            "candidates": [{"content": {"role": "model", "parts": [
                {"text": "thinking", "thought": true}, {"text": "Hi"},
                {"functionCall": {"name": "f", "args": {"a": 1}}}]}, "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 2, "thoughtsTokenCount": 3,
                "cachedContentTokenCount": 1, "totalTokenCount": 10}}))
        .unwrap();
        let answer = answer(&whole).unwrap();
        assert_eq!(answer["message"]["content"], "Hi");
        assert_eq!(
            answer["message"]["tool_calls"][0]["function"]["arguments"],
            "{\"a\":1}"
        );
        assert_eq!(answer["finish_reason"], "tool_calls");
        assert_eq!(answer["usage"]["completion_tokens"], 5);
        assert_eq!(answer["usage"]["prompt_tokens_details"]["cached_tokens"], 1);

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

        let mut events = GeminiEvents::default();
        let text = events
            .translate(&json!({"candidates": [{"content": {"parts": [{"text": "Hel"}]}}]}))
            .unwrap();
        assert_eq!(text["choices"][0]["delta"]["content"], "Hel");
        let last = events
            .translate(&json!({"candidates": [{"content": {"parts": [{"text": "lo"}]}, "finishReason": "MAX_TOKENS"}],
                "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 2}}))
            .unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "length");
        assert_eq!(last["usage"]["total_tokens"], 3);
        assert!(events
            .translate(&json!({"candidates": [{"finishReason": "RECITATION"}]}))
            .is_err());
    }

    #[test]
    fn a_retry_delay_is_read_from_the_error_body() {
        let error = json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "details": [
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure"},
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "40.5s"}]}});
        assert_eq!(
            retry_delay(&error),
            Some(std::time::Duration::from_millis(40_500))
        );
        assert_eq!(retry_delay(&json!({"error": {"code": 429}})), None);
    }
}
