//! Chat routes: a client's OpenAI Chat Completions request passed through to
//! a provider, and the provider's answer brought back to one shape.
//!
//! - OpenAI-compatible providers get the client's body as it is, with the
//!   provider's own model and the token limit under the name the provider
//!   wants; `stream` and `stream_options` are onejob's to set (the HTTP
//!   client turns streaming on when the client asked for a stream, see
//!   `providers::streaming`).
//! - Either way, a request that sets no token limit or no temperature gets
//!   the provider's configured `max_tokens` and `temperature` (if set).
//! - Anthropic gets the same conversation translated: system messages to
//!   `system`, the rest as `messages`, `stop` to `stop_sequences`.
//!
//! Every answer becomes `{"message": {"role": "assistant", "content": …},
//! "finish_reason": …, "usage": {"prompt_tokens", "completion_tokens",
//! "total_tokens"}}`, whichever provider gave it.

use serde_json::{json, Map, Value};

use super::settings::MaxTokensField;
use super::ProviderKind;

/// Request members onejob decides, not the client.
const MANAGED: [&str; 3] = ["model", "stream", "stream_options"];

/// The provider's own settings, for a request that sets none of its own.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChatDefaults {
    pub max_tokens: u32,
    pub temperature: Option<f64>,
}

/// The token limit a request sets itself (`max_completion_tokens`, else
/// `max_tokens`), if it sets one.
pub fn requested_max_tokens(request: &Value) -> Option<u64> {
    whole_number(&request["max_completion_tokens"]).or_else(|| whole_number(&request["max_tokens"]))
}

/// A JSON number that is a whole number, 0 or more, however it is written
/// (`64` or `64.0`).
pub fn whole_number(value: &Value) -> Option<u64> {
    value.as_u64().or_else(|| {
        value
            .as_f64()
            .filter(|n| n.fract() == 0.0 && *n >= 0.0 && *n <= u64::MAX as f64)
            .map(|n| n as u64)
    })
}

/// The body to send for a chat request.
pub fn request_body(
    kind: ProviderKind,
    model: &str,
    max_tokens_field: MaxTokensField,
    defaults: ChatDefaults,
    request: &Value,
) -> Value {
    let mut body = match kind {
        ProviderKind::Anthropic => anthropic_body(model, defaults.max_tokens, request),
        _ => openai_body(model, max_tokens_field, defaults.max_tokens, request),
    };
    if body.get("temperature").is_none_or(Value::is_null) {
        match defaults.temperature {
            Some(t) => body["temperature"] = json!(t),
            None => {
                if let Some(body) = body.as_object_mut() {
                    body.remove("temperature");
                }
            }
        }
    }
    body
}

fn openai_body(
    model: &str,
    field: MaxTokensField,
    default_max_tokens: u32,
    request: &Value,
) -> Value {
    let mut body: Map<String, Value> = request
        .as_object()
        .map(|o| {
            o.iter()
                .filter(|(k, _)| !MANAGED.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    body.insert("model".into(), json!(model));
    // Reasoning models refuse `max_tokens`; older servers know no other.
    let limit = [
        body.remove("max_completion_tokens"),
        body.remove("max_tokens"),
    ]
    .into_iter()
    .flatten()
    .find(|limit| !limit.is_null())
    .unwrap_or_else(|| json!(default_max_tokens));
    let name = match field {
        MaxTokensField::MaxTokens => "max_tokens",
        MaxTokensField::MaxCompletionTokens => "max_completion_tokens",
    };
    body.insert(name.into(), limit);
    Value::Object(body)
}

/// The text of a message's content: a string, or the text parts of an array.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

fn anthropic_body(model: &str, default_max_tokens: u32, request: &Value) -> Value {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let system: Vec<String> = messages
        .iter()
        .filter(|m| m["role"] == "system" || m["role"] == "developer")
        .map(|m| content_text(&m["content"]))
        .collect();
    let mut conversation: Vec<Value> = Vec::new();
    for m in &messages {
        match m["role"].as_str() {
            Some("user") => {
                conversation.push(json!({"role": "user", "content": content_text(&m["content"])}));
            }
            Some("assistant") => conversation.push(anthropic_assistant_turn(m)),
            // A tool's result goes back as a `tool_result` block of a user
            // turn; the results of one round of calls share one turn.
            Some("tool") => {
                let result = json!({"type": "tool_result", "tool_use_id": m["tool_call_id"],
                                    "content": content_text(&m["content"])});
                match conversation.last_mut() {
                    Some(last)
                        if last["role"] == "user"
                            && last["content"][0]["type"] == "tool_result" =>
                    {
                        if let Some(blocks) = last["content"].as_array_mut() {
                            blocks.push(result);
                        }
                    }
                    _ => conversation.push(json!({"role": "user", "content": [result]})),
                }
            }
            _ => {}
        }
    }
    let max_tokens = requested_max_tokens(request).unwrap_or(u64::from(default_max_tokens));
    let mut body = json!({"model": model, "max_tokens": max_tokens, "messages": conversation});
    if let Some(tools) = request["tools"].as_array().filter(|t| !t.is_empty()) {
        let tools: Vec<Value> = tools
            .iter()
            .map(|tool| {
                let function = &tool["function"];
                let mut tool = json!({
                    "name": function["name"],
                    "input_schema": function.get("parameters").filter(|p| p.is_object())
                        .cloned().unwrap_or_else(|| json!({"type": "object"})),
                });
                if let Some(description) = function["description"].as_str() {
                    tool["description"] = json!(description);
                }
                tool
            })
            .collect();
        body["tools"] = Value::Array(tools);
    }
    let choice = match &request["tool_choice"] {
        Value::String(choice) => match choice.as_str() {
            "auto" => Some(json!({"type": "auto"})),
            "required" => Some(json!({"type": "any"})),
            "none" => Some(json!({"type": "none"})),
            _ => None,
        },
        Value::Object(choice) => choice
            .get("function")
            .and_then(|f| f["name"].as_str())
            .map(|name| json!({"type": "tool", "name": name})),
        _ => None,
    };
    if let Some(choice) = choice {
        body["tool_choice"] = choice;
    }
    if !system.is_empty() {
        body["system"] = json!(system.join("\n\n"));
    }
    for name in ["temperature", "top_p"] {
        if let Some(v) = request.get(name) {
            body[name] = v.clone();
        }
    }
    match &request["stop"] {
        Value::String(s) => body["stop_sequences"] = json!([s]),
        Value::Array(list) => body["stop_sequences"] = json!(list),
        _ => {}
    }
    body
}

/// An assistant turn for Anthropic: its text, and a `tool_use` block for
/// each tool call (whose arguments, a JSON text, become the block's input).
fn anthropic_assistant_turn(message: &Value) -> Value {
    let text = content_text(&message["content"]);
    let Some(calls) = message["tool_calls"].as_array().filter(|c| !c.is_empty()) else {
        return json!({"role": "assistant", "content": text});
    };
    let mut blocks = Vec::new();
    if !text.is_empty() {
        blocks.push(json!({"type": "text", "text": text}));
    }
    for call in calls {
        let input = call["function"]["arguments"]
            .as_str()
            .and_then(|a| serde_json::from_str::<Value>(a).ok())
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        blocks.push(json!({"type": "tool_use", "id": call["id"],
                           "name": call["function"]["name"], "input": input}));
    }
    json!({"role": "assistant", "content": blocks})
}

/// Anthropic's `stop_reason` as an OpenAI `finish_reason` (the answer's one
/// shape); [`messages_stop_reason`] is the way back.
pub fn anthropic_finish_reason(stop_reason: Option<&str>) -> &'static str {
    match stop_reason {
        Some("max_tokens") => "length",
        Some("tool_use") => "tool_calls",
        Some("refusal") => "content_filter",
        _ => "stop",
    }
}

/// The stop sequence an Anthropic answer (or its stream's `message_delta`
/// delta) says it stopped at: its `stop_sequence` when its `stop_reason` is
/// `stop_sequence`. The answer keeps it beside its `finish_reason`
/// (`"stop"`, which cannot say which), so that a `/v1/messages` client gets
/// it back.
pub fn stop_sequence_met(envelope: &Value) -> Option<&str> {
    (envelope["stop_reason"] == "stop_sequence")
        .then(|| envelope["stop_sequence"].as_str())
        .flatten()
}

/// An answer's `stop_reason` and `stop_sequence` for a client of
/// `/v1/messages`: from its `finish_reason`, and the stop sequence it
/// stopped at when the provider said.
pub fn messages_stop_reason(answer: &Value) -> (&'static str, Option<&str>) {
    if let Some(stop) = answer["stop_sequence"].as_str() {
        return ("stop_sequence", Some(stop));
    }
    let reason = match answer["finish_reason"].as_str() {
        Some("length") => "max_tokens",
        Some("tool_calls" | "function_call") => "tool_use",
        Some("content_filter") => "refusal",
        _ => "end_turn",
    };
    (reason, None)
}

/// The answer out of a provider's chat response, in onejob's one shape.
pub fn answer(kind: ProviderKind, envelope: &Value) -> Result<Value, String> {
    match kind {
        ProviderKind::Anthropic => {
            let parts = envelope["content"]
                .as_array()
                .ok_or("the response has no content")?;
            let text: String = parts
                .iter()
                .filter(|p| p["type"] == "text" || p.get("type").is_none())
                .filter_map(|p| p["text"].as_str())
                .collect();
            let calls: Vec<Value> = parts
                .iter()
                .filter(|p| p["type"] == "tool_use")
                .map(|p| {
                    json!({"id": p["id"], "type": "function", "function": {
                        "name": p["name"],
                        "arguments": p.get("input").map_or_else(|| "{}".to_owned(), Value::to_string),
                    }})
                })
                .collect();
            let finish_reason = anthropic_finish_reason(envelope["stop_reason"].as_str());
            let input = envelope["usage"]["input_tokens"].as_u64().unwrap_or(0);
            let output = envelope["usage"]["output_tokens"].as_u64().unwrap_or(0);
            // As a streamed answer is assembled: no text beside tool calls
            // is `null`.
            let mut message = json!({"role": "assistant", "content": text});
            if !calls.is_empty() {
                if text.is_empty() {
                    message["content"] = Value::Null;
                }
                message["tool_calls"] = Value::Array(calls);
            }
            let mut answer = json!({
                "message": message,
                "finish_reason": finish_reason,
                "usage": {"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output},
            });
            if let Some(stop) = stop_sequence_met(envelope) {
                answer["stop_sequence"] = json!(stop);
            }
            Ok(answer)
        }
        _ => {
            let choice = &envelope["choices"][0];
            let message = choice["message"]
                .as_object()
                .ok_or("the response has no message")?;
            let mut message = message.clone();
            message.insert("role".into(), json!("assistant"));
            Ok(json!({
                "message": message,
                "finish_reason": choice["finish_reason"].as_str().unwrap_or("stop"),
                "usage": envelope.get("usage").cloned().unwrap_or_else(|| json!({
                    "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0
                })),
            }))
        }
    }
}

/// The last user message's text, for simulated replies.
pub fn last_user_text(request: &Value) -> String {
    request["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .map(|m| content_text(&m["content"]))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> Value {
        json!({
            "model": "gpt-safe",
            "stream": true,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            ],
            "max_tokens": 50,
            "temperature": 0.2,
            "stop": "END",
        })
    }

    const DEFAULTS: ChatDefaults = ChatDefaults {
        max_tokens: 100,
        temperature: Some(0.7),
    };

    #[test]
    fn openai_providers_get_the_body_with_their_model_no_stream_and_their_limit_name() {
        let body = request_body(
            ProviderKind::Openai,
            "o3",
            MaxTokensField::MaxCompletionTokens,
            DEFAULTS,
            &request(),
        );
        assert_eq!(body["model"], "o3");
        assert!(body.get("stream").is_none());
        assert_eq!(body["max_completion_tokens"], 50);
        assert!(body.get("max_tokens").is_none());
        assert_eq!(body["messages"], request()["messages"]);
        let body = request_body(
            ProviderKind::Openai,
            "m",
            MaxTokensField::MaxTokens,
            DEFAULTS,
            &request(),
        );
        assert_eq!(body["max_tokens"], 50);
        assert_eq!(body["temperature"], 0.2, "the request's own wins");
    }

    #[test]
    fn a_request_without_a_limit_or_temperature_gets_the_providers() {
        let bare = json!({"messages": [{"role": "user", "content": "Hi"}]});
        for (kind, field, limit_name) in [
            (
                ProviderKind::Openai,
                MaxTokensField::MaxTokens,
                "max_tokens",
            ),
            (
                ProviderKind::Openai,
                MaxTokensField::MaxCompletionTokens,
                "max_completion_tokens",
            ),
            (
                ProviderKind::Anthropic,
                MaxTokensField::MaxTokens,
                "max_tokens",
            ),
        ] {
            let body = request_body(kind, "m", field, DEFAULTS, &bare);
            assert_eq!(body[limit_name], 100, "{kind:?} {limit_name}");
            assert_eq!(body["temperature"], 0.7, "{kind:?}");
            let unset = ChatDefaults {
                max_tokens: 64,
                temperature: None,
            };
            let body = request_body(kind, "m", field, unset, &bare);
            assert_eq!(body[limit_name], 64);
            assert!(body.get("temperature").is_none(), "{body}");
        }
        assert_eq!(requested_max_tokens(&bare), None);
        assert_eq!(requested_max_tokens(&request()), Some(50));
    }

    #[test]
    fn anthropic_gets_the_conversation_translated() {
        let body = request_body(
            ProviderKind::Anthropic,
            "claude",
            MaxTokensField::MaxTokens,
            DEFAULTS,
            &request(),
        );
        assert_eq!(body["system"], "Be brief.");
        assert_eq!(body["messages"], json!([{"role": "user", "content": "Hi"}]));
        assert_eq!(body["max_tokens"], 50);
        assert_eq!(body["stop_sequences"], json!(["END"]));
        assert_eq!(body["temperature"], 0.2);
    }

    #[test]
    fn answers_come_back_in_one_shape() {
        let anthropic = json!({"content": [{"type": "text", "text": "Hello"}], "stop_reason": "end_turn",
                               "usage": {"input_tokens": 3, "output_tokens": 1}});
        let openai = json!({"choices": [{"message": {"role": "assistant", "content": "Hello"}, "finish_reason": "stop"}],
                            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}});
        let a = answer(ProviderKind::Anthropic, &anthropic).unwrap();
        let o = answer(ProviderKind::Openai, &openai).unwrap();
        assert_eq!(a, o);
    }

    #[test]
    fn tools_and_their_results_reach_anthropic_in_its_terms_and_come_back_as_tool_calls() {
        let request = json!({
            "messages": [
                {"role": "user", "content": "Weather in Oslo and Rome?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}},
                    {"id": "c2", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Rome\"}"}},
                ]},
                {"role": "tool", "tool_call_id": "c1", "content": "rain"},
                {"role": "tool", "tool_call_id": "c2", "content": "sun"},
            ],
            "tools": [{"type": "function", "function": {"name": "weather", "description": "Weather by city",
                       "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
            "tool_choice": "required",
        });
        let body = request_body(
            ProviderKind::Anthropic,
            "claude",
            MaxTokensField::MaxTokens,
            DEFAULTS,
            &request,
        );
        assert_eq!(
            body["messages"][1],
            json!({"role": "assistant", "content": [
                {"type": "tool_use", "id": "c1", "name": "weather", "input": {"city": "Oslo"}},
                {"type": "tool_use", "id": "c2", "name": "weather", "input": {"city": "Rome"}},
            ]})
        );
        assert_eq!(
            body["messages"][2],
            json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": "rain"},
                {"type": "tool_result", "tool_use_id": "c2", "content": "sun"},
            ]}),
            "one round's results share one turn"
        );
        assert_eq!(
            body["tools"],
            json!([{"name": "weather", "description": "Weather by city",
                    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}])
        );
        assert_eq!(body["tool_choice"], json!({"type": "any"}));

        let envelope = json!({"content": [{"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Oslo"}}],
                              "stop_reason": "tool_use", "usage": {"input_tokens": 3, "output_tokens": 4}});
        let answer = answer(ProviderKind::Anthropic, &envelope).unwrap();
        assert_eq!(answer["finish_reason"], "tool_calls");
        assert_eq!(
            answer["message"],
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "t1", "type": "function",
                   "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}}]})
        );
    }
}
