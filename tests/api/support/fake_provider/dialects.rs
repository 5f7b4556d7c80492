//! What each provider kind checks and says: the requests Azure, Gemini and
//! Bedrock refuse before they answer (with their own error bodies), the
//! token counters, and a well-formed answer in each kind's shape.

use serde_json::{json, Value};

use super::{cut_at_stop, RecordedRequest, Shape};

/// What Bedrock refuses before it answers: the status and body, with the
/// error type for `x-amzn-ErrorType`.
pub(super) fn bedrock_refusal(request: &RecordedRequest) -> Option<(u16, String)> {
    let refuse = |code: u16, kind: &str, message: &str| {
        Some((
            code,
            json!({"__type": kind, "message": message}).to_string(),
        ))
    };
    let (path, _) = request.path.split_once('?').unwrap_or((&request.path, ""));
    let operation = path
        .strip_prefix("/model/")
        .and_then(|rest| rest.rsplit_once('/'))
        .map(|(_, operation)| operation);
    if !matches!(
        operation,
        Some("converse" | "converse-stream" | "count-tokens")
    ) {
        return refuse(404, "UnknownOperationException", "no such operation");
    }
    if let Err(why) = crate::support::aws::verify_sigv4(request) {
        return refuse(403, "InvalidSignatureException", &why);
    }
    if operation == Some("count-tokens") {
        return request.body["input"]["converse"]["messages"]
            .as_array()
            .is_none()
            .then(|| (400, json!({"__type": "ValidationException", "message": "input.converse is required"}).to_string()));
    }
    let turns = request.body["messages"].as_array();
    let roles_ok = turns.is_some_and(|turns| {
        !turns.is_empty()
            && turns
                .iter()
                .all(|t| matches!(t["role"].as_str(), Some("user" | "assistant")))
    });
    if !roles_ok {
        return refuse(
            400,
            "ValidationException",
            "messages: each role is user or assistant",
        );
    }
    let schema = &request.body["outputConfig"]["textFormat"]["structure"]["jsonSchema"]["schema"];
    if !schema.is_null() && !schema.is_string() {
        return refuse(
            400,
            "ValidationException",
            "outputConfig...jsonSchema.schema must be a string",
        );
    }
    None
}

/// A Converse answer whose text is `text`.
fn converse_answer(text: &str) -> Value {
    json!({
        "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
        "stopReason": "end_turn",
        "usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2},
        "metrics": {"latencyMs": 1},
    })
}

/// The answer of a token-counting endpoint, if `request` asks one:
/// Anthropic's `POST /v1/messages/count_tokens`, Gemini's `countTokens`,
/// Bedrock's `count-tokens`; a word of the request's text a token.
pub(super) fn token_count(shape: Shape, request: &RecordedRequest) -> Option<Value> {
    let words =
        |texts: Vec<&str>| -> usize { texts.iter().map(|t| t.split_whitespace().count()).sum() };
    let body = &request.body;
    match shape {
        Shape::Anthropic if request.path == "/v1/messages/count_tokens" => {
            let texts = body["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|m| m["content"].as_str())
                .collect();
            Some(json!({"input_tokens": words(texts)}))
        }
        Shape::Gemini if request.path.ends_with(":countTokens") => {
            let texts = body["contents"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|turn| turn["parts"].as_array().into_iter().flatten())
                .filter_map(|part| part["text"].as_str())
                .collect();
            Some(json!({"totalTokens": words(texts)}))
        }
        Shape::Bedrock if request.path.ends_with("/count-tokens") => {
            let texts = body["input"]["converse"]["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|m| m["content"].as_array().into_iter().flatten())
                .filter_map(|block| block["text"].as_str())
                .collect();
            Some(json!({"inputTokens": words(texts)}))
        }
        _ => None,
    }
}

/// A google.rpc.Status error body.
fn google_status(code: u16, status: &str, message: &str) -> String {
    json!({"error": {"code": code, "message": message, "status": status}}).to_string()
}

/// What the Gemini API refuses before it answers.
pub(super) fn gemini_refusal(request: &RecordedRequest) -> Option<(u16, String)> {
    let refuse =
        |code: u16, status: &str, message: &str| Some((code, google_status(code, status, message)));
    let (path, query) = request.path.split_once('?').unwrap_or((&request.path, ""));
    let Some((_, method)) = path
        .strip_prefix("/v1beta/models/")
        .and_then(|rest| rest.split_once(':'))
        .filter(|(model, _)| !model.is_empty() && !model.contains('/'))
    else {
        return refuse(404, "NOT_FOUND", "Requested entity was not found.");
    };
    if !["generateContent", "streamGenerateContent", "countTokens"].contains(&method) {
        return refuse(404, "NOT_FOUND", "Requested entity was not found.");
    }
    let params: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
    if params.iter().any(|p| p.starts_with("key=")) {
        return refuse(
            400,
            "INVALID_ARGUMENT",
            "API keys go in the x-goog-api-key header, never in the URL.",
        );
    }
    match request.header("x-goog-api-key") {
        None => {
            return refuse(
                403,
                "PERMISSION_DENIED",
                "Method doesn't allow unregistered callers.",
            )
        }
        Some(key) if key != crate::support::harness::FAKE_API_KEY => {
            return refuse(
                400,
                "INVALID_ARGUMENT",
                "API key not valid. Please pass a valid API key.",
            )
        }
        Some(_) => {}
    }
    if method == "streamGenerateContent" && !params.contains(&"alt=sse") {
        return refuse(
            400,
            "INVALID_ARGUMENT",
            "this server streams only with alt=sse",
        );
    }
    if method == "countTokens" {
        return None;
    }
    let contents = request.body["contents"].as_array();
    let roles_ok = contents.is_some_and(|turns| {
        !turns.is_empty()
            && turns
                .iter()
                .all(|t| matches!(t["role"].as_str(), None | Some("user" | "model")))
    });
    if !roles_ok {
        return refuse(
            400,
            "INVALID_ARGUMENT",
            "contents: each turn's role is user or model",
        );
    }
    let config = &request.body["generationConfig"];
    if config.get("responseSchema").is_some() && config.get("responseJsonSchema").is_some() {
        return refuse(
            400,
            "INVALID_ARGUMENT",
            "responseSchema and responseJsonSchema are exclusive",
        );
    }
    None
}

/// A Gemini answer whose text is `text`.
fn gemini_answer(text: &str, finish: &str, model: &str) -> Value {
    json!({
        "candidates": [{"content": {"role": "model", "parts": [{"text": text}]},
                        "finishReason": finish, "index": 0}],
        "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 1, "totalTokenCount": 2},
        "modelVersion": model,
    })
}

/// What Azure OpenAI refuses before it looks at a request: the status and
/// its error body, or `None`.
pub(super) fn azure_refusal(request: &RecordedRequest) -> Option<(u16, String)> {
    let error = |code: u16, message: &str| {
        Some((
            code,
            json!({"error": {"code": code.to_string(), "message": message}}).to_string(),
        ))
    };
    let (path, query) = request.path.split_once('?').unwrap_or((&request.path, ""));
    let deployment = path
        .strip_prefix("/openai/deployments/")
        .and_then(|rest| rest.strip_suffix("/chat/completions"))
        .filter(|d| !d.is_empty() && !d.contains('/'));
    if deployment.is_none() {
        return error(404, "Resource not found");
    }
    if !query
        .split('&')
        .any(|pair| pair.starts_with("api-version=") && pair.len() > "api-version=".len())
    {
        return error(404, "Resource not found");
    }
    let keyed = request.header("api-key").is_some_and(|k| !k.is_empty());
    let bearer = request
        .header("authorization")
        .is_some_and(|a| a.starts_with("Bearer ") && a.len() > 7);
    if keyed == bearer {
        return error(
            401,
            "Access denied due to invalid subscription key or wrong API endpoint. Make sure to \
             provide a valid key for an active subscription and use a correct regional API \
             endpoint for your resource.",
        );
    }
    None
}

/// [`completion`], stopped before the first of `stops` the text holds, as
/// a model stops: the text before it, with the provider's stop reason
/// (Anthropic names the sequence; OpenAI says `stop`).
pub(super) fn completion_stopping(
    shape: Shape,
    model: &str,
    text: &str,
    stops: &[String],
) -> String {
    let Some((before, stop)) = cut_at_stop(text, stops) else {
        return completion(shape, model, text);
    };
    let mut body: Value = serde_json::from_str(&completion(shape, model, before)).unwrap();
    if shape == Shape::Anthropic {
        body["stop_reason"] = json!("stop_sequence");
        body["stop_sequence"] = json!(stop);
    }
    body.to_string()
}

/// A well-formed answer in `shape` that calls the tool `name` with
/// `arguments` (an object), as each provider says it.
pub(super) fn tool_call_completion(
    shape: Shape,
    model: &str,
    name: &str,
    arguments: &Value,
) -> String {
    let body = match shape {
        Shape::Gemini => json!({
            "candidates": [{"content": {"role": "model", "parts": [
                {"functionCall": {"name": name, "args": arguments}}]},
                "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 1, "totalTokenCount": 2},
            "modelVersion": model,
        }),
        Shape::Bedrock => json!({
            "output": {"message": {"role": "assistant", "content": [
                {"toolUse": {"toolUseId": "tooluse_fake1", "name": name, "input": arguments}}]}},
            "stopReason": "tool_use",
            "usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2},
            "metrics": {"latencyMs": 1},
        }),
        Shape::OpenAi | Shape::Azure => json!({
            "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": null, "tool_calls": [{"id": "call_fake1",
                    "type": "function", "function": {"name": name, "arguments": arguments.to_string()}}]}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }),
        Shape::Anthropic => json!({
            "id": "msg_fake", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "tool_use", "id": "toolu_fake1", "name": name, "input": arguments}],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }),
    };
    body.to_string()
}

/// A well-formed completion body in `shape` whose text content is `text`.
pub(super) fn completion(shape: Shape, model: &str, text: &str) -> String {
    let body = match shape {
        Shape::Gemini => gemini_answer(text, "STOP", model),
        Shape::Bedrock => converse_answer(text),
        Shape::OpenAi | Shape::Azure => json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }),
        Shape::Anthropic => json!({
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }),
    };
    body.to_string()
}
