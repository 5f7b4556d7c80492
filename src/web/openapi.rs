//! The OpenAPI 3 document, generated from the handlers' annotations.

use actix_web::{web, HttpResponse};
use serde_json::{json, Value};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::anthropic_messages::{
    self, AnthropicErrorBody, ErrorDetail, MessageObject, MessagesCreate, OutBlock,
};
use super::openai_compat::{
    self, ChatCompletion, ChatCompletionRequest, ChatMessage, Choice, Model, ModelList,
    OpenAiErrorBody, WireErrorDetail,
};
use super::responses::{
    self, IncompleteDetails, InputTokensDetails, OutputMessage, OutputText, OutputTokensDetails,
    ResponseCreate, ResponseObject, ResponseUsage, TextConfig, TextFormat,
};
use super::views::*;
use super::{api_callbacks, api_jobs, api_support, health};
use crate::app::callbacks::{CallbackBody, CallbackOutcome};
use crate::app::App;
use crate::chat::anthropic::DoorUsage;
use crate::chat::responses::ResponseError;
use crate::contracts::Contracts;
use crate::domain::responses as rules;
use crate::domain::JobStatus;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An API token from `onejob users add` or `onejob users token`",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "x_api_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "x-api-key",
                "A onejob API token, as the Anthropic SDK sends its `api_key` (POST /v1/messages)",
            ))),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "onejob",
        description = "One user intent, exactly one durable Job. Errors are RFC 9457 \
                       application/problem+json with a stable `type`."
    ),
    paths(
        api_jobs::create_job,
        api_jobs::list_jobs,
        api_jobs::get_job,
        api_jobs::start_attempt,
        api_jobs::cancel_job,
        api_support::abandon_attempt,
        api_support::unknown_attempts,
        api_support::races,
        api_callbacks::receive,
        openapi_json,
        health::healthz,
        health::readyz,
        health::metrics,
        openai_compat::chat_completions,
        openai_compat::list_models,
        openai_compat::get_model,
        responses::create_response,
        responses::get_response,
        responses::cancel_response,
        anthropic_messages::create_message,
    ),
    components(schemas(
        CreateJobRequest,
        StartAttemptRequest,
        AbandonRequest,
        JobView,
        AttemptView,
        JobSummary,
        JobPage,
        UnknownAttemptView,
        RaceView,
        Problem,
        Health,
        CallbackBody,
        CallbackOutcome,
        ChatCompletionRequest,
        ChatMessage,
        ChatCompletion,
        Choice,
        Model,
        ModelList,
        OpenAiErrorBody,
        WireErrorDetail,
        MessagesCreate,
        MessageObject,
        OutBlock,
        DoorUsage,
        AnthropicErrorBody,
        ErrorDetail,
        ResponseCreate,
        ResponseObject,
        OutputMessage,
        OutputText,
        ResponseError,
        IncompleteDetails,
        ResponseUsage,
        InputTokensDetails,
        OutputTokensDetails,
        TextConfig,
        TextFormat,
    )),
    modifiers(&BearerAuth),
    tags(
        (name = "jobs", description = "Create and follow jobs"),
        (name = "support", description = "Resolve attempts stuck in unknown"),
        (name = "admin", description = "Review races"),
        (name = "callbacks", description = "Late answers from asynchronous providers, signed per attempt"),
        (name = "health", description = "Liveness and readiness"),
        (name = "openai-compatible", description = "OpenAI Chat Completions wire format: `model` names a chat route; errors in OpenAI's shape"),
        (name = "anthropic-compatible", description = "Anthropic Messages wire format: `model` names a chat route; errors in Anthropic's shape"),
        (name = "usage", description = "The usage ledger: tokens and spend per call, and owners' monthly budgets"),
    )
)]
pub struct ApiDoc;

/// This document, with what this server's configuration decides.
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "health", responses((status = 200, description = "OpenAPI 3 document")))]
pub async fn openapi_json(app: web::Data<App>) -> HttpResponse {
    HttpResponse::Ok().json(document(app.config()))
}

/// What a well-formed `Idempotency-Key` header is: 1-255 printable ASCII
/// characters with no space at either end (HTTP trims them), or the RFC 8941
/// quoted-string form of such a key (`"…"`, escaping `"` and `\`).
pub const IDEMPOTENCY_KEY_PATTERN: &str =
    r#"^(?:[!#-~](?:[ -~]{0,253}[!-~])?|"(?:[ !#-\[\]-~]|\\["\\]){1,255}")$"#;

/// A string holding something besides white space, in Rust's sense of it
/// (`str::trim`, Unicode White_Space), spelled out because regex dialects
/// disagree on `\s` (U+0085, U+FEFF).
pub const NOT_BLANK: &str =
    r"[^\t-\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]";

/// With `stream: true` the answer is an event stream.
fn event_stream_schemas(doc: &mut Value) {
    doc["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
        ["text/event-stream"] = json!({
        "schema": {
            "description": "One server-sent event: `data` is a `chat.completion.chunk` as JSON, and the last event's is `[DONE]`",
            "type": "object",
            "required": ["data"],
            "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
        }
    });
    doc["paths"]["/v1/messages"]["post"]["responses"]["200"]["content"]["text/event-stream"] = json!({
        "schema": {
            "description": "One server-sent event: `event` names it (message_start, content_block_start, content_block_delta, content_block_stop, message_delta, message_stop, error), `data` is its JSON",
            "type": "object",
            "required": ["data"],
            "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}},
        }
    });
    doc["paths"]["/v1/responses"]["post"]["responses"]["200"]["content"]["text/event-stream"] = json!({
        "schema": {
            "description": "One server-sent event: `event` names it (response.created, response.in_progress, response.output_item.added, response.content_part.added, response.output_text.delta, response.output_text.done, response.content_part.done, response.output_item.done, then response.completed, response.incomplete, response.failed, response.cancelled or error); `data` is its JSON, with `type` and `sequence_number`",
            "type": "object",
            "required": ["data"],
            "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
        }
    });
}

/// The generated document, completed with the configuration's truths: the
/// task names and each task's input rules for `POST /api/v1/jobs`, the chat
/// routes for `/v1/chat/completions`, the most output tokens a chat job may
/// ask for, and the key's grammar.
pub fn document(config: &crate::config::Config) -> Value {
    let contracts = &config.contracts;
    let mut api = ApiDoc::openapi();
    api.merge(super::api_webhooks::WebhooksDoc::openapi());
    api.merge(super::api_usage::UsageDoc::openapi());
    let mut doc = serde_json::to_value(api).expect("the document is JSON");
    let schemas = &mut doc["components"]["schemas"];
    schemas["CreateJobRequest"] = create_job_schema(contracts);
    let routes: Vec<String> = contracts
        .iter()
        .filter(|c| c.is_chat())
        .map(|c| c.name().to_owned())
        .collect();
    // The largest of the routes' ceilings: a request above a smaller
    // route's own is still refused, naming it.
    let ceiling = contracts
        .iter()
        .filter(|c| c.is_chat())
        .map(|c| config.output_token_ceiling(c))
        .max()
        .unwrap_or(0);
    schemas["ChatCompletionRequest"] = chat_request_schema(&routes, ceiling);
    schemas["MessagesCreate"] = messages_request_schema(&routes, ceiling);
    schemas["JsonValue"] = json_value_schema();
    schemas["ResponseCreate"] = responses_request_schema(&routes, ceiling);
    let statuses: Vec<&str> = JobStatus::ALL.iter().map(|s| s.as_str()).collect();
    for view in ["JobView", "JobSummary"] {
        if schemas[view]["properties"].get("status").is_some() {
            schemas[view]["properties"]["status"] = json!({"type": "string", "enum": statuses});
        }
    }
    let providers: std::collections::BTreeSet<&str> = contracts
        .iter()
        .flat_map(|c| c.chain().iter().map(String::as_str))
        .collect();
    schemas["StartAttemptRequest"]["properties"]["provider"] = json!({
        "type": ["string", "null"],
        "enum": providers.iter().map(|p| json!(p)).chain([Value::Null]).collect::<Vec<_>>(),
        "description": "A provider of the job's task chain (422 for one outside it); default: the next untried one",
    });
    event_stream_schemas(&mut doc);
    for path in [
        "/api/v1/jobs",
        "/v1/chat/completions",
        "/v1/messages",
        "/v1/responses",
    ] {
        if let Some(parameters) = doc["paths"][path]["post"]["parameters"].as_array_mut() {
            for parameter in parameters {
                if parameter["name"] == "Idempotency-Key" {
                    parameter["schema"] =
                        json!({"type": "string", "pattern": IDEMPOTENCY_KEY_PATTERN});
                }
                if parameter["name"] == "Last-Event-ID" {
                    parameter["schema"] = json!({
                        "type": "string",
                        "pattern": super::chat_door::LAST_EVENT_ID_PATTERN,
                    });
                }
            }
        }
    }
    doc
}

/// Any JSON value onejob accepts inside `input` or `params`. Numbers must
/// lie within ±(2^53 − 1) and be written as the double they denote is
/// (RFC 8785 fingerprints them as doubles; onejob refuses rather than
/// rounds). One schema, no alternatives: every JSON type, numbers bounded.
fn json_value_schema() -> Value {
    let any = json!({"$ref": "#/components/schemas/JsonValue"});
    json!({
        "description": "Any JSON value. Numbers lie within ±9007199254740991 (2^53 − 1) and are \
                        written as the IEEE double they denote is (at most 17 significant digits, \
                        as any JSON library writes a double); others are refused with 422.",
        "type": ["string", "boolean", "null", "number", "array", "object"],
        "minimum": -9_007_199_254_740_991_i64,
        "maximum": 9_007_199_254_740_991_i64,
        "items": any,
        "additionalProperties": any,
    })
}

/// A chat request as the server checks it. Other members are passed to
/// the provider as sent.
fn chat_request_schema(routes: &[String], ceiling: u64) -> Value {
    let model = if routes.is_empty() {
        json!({"type": "string", "minLength": 1, "description": "No chat route is configured: every model is unknown (404)"})
    } else {
        json!({"type": "string", "enum": routes, "description": "A chat route (GET /v1/models); any other name is 404 `model_not_found`"})
    };
    let mut schema = chat_input_schema();
    schema["required"] = json!(["model", "messages"]);
    schema["properties"]["model"] = model;
    for limit in ["max_tokens", "max_completion_tokens"] {
        schema["properties"][limit] = json!({"type": ["integer", "null"], "minimum": 1, "maximum": ceiling,
            "description": "At most the largest context window of the route's providers (400 past it)"});
    }
    schema["description"] = json!(
        "An OpenAI Chat Completions request. The body as sent is the job's input and its \
         fingerprint (RFC 8785; numbers must be ones an IEEE double holds exactly). Members \
         not listed here are passed to OpenAI-compatible providers as sent."
    );
    schema
}

/// A Messages request as the server checks it (`chat::anthropic::read_request`).
fn messages_request_schema(routes: &[String], ceiling: u64) -> Value {
    let any = json!({"$ref": "#/components/schemas/JsonValue"});
    let model = if routes.is_empty() {
        json!({"type": "string", "minLength": 1, "description": "No chat route is configured: every model is unknown (404)"})
    } else {
        json!({"type": "string", "enum": routes, "description": "A chat route (GET /v1/models); any other name is 404 `not_found_error`"})
    };
    let text_blocks = json!({"type": "array", "items": messages_text_block(&any)});
    let tool = json!({
        "type": "object",
        "required": ["name", "input_schema"],
        "properties": {
            "type": {"type": ["string", "null"], "enum": ["custom", null]},
            "name": {"type": "string", "minLength": 1},
            "description": {"type": ["string", "null"]},
            "input_schema": {"type": "object", "additionalProperties": any},
        },
        "additionalProperties": any,
    });
    let tool_choice = json!({"anyOf": [
        {"type": "null"},
        {"type": "object", "required": ["type"],
         "properties": {"type": {"type": "string", "enum": ["auto", "any", "none"]}},
         "additionalProperties": any},
        {"type": "object", "required": ["type", "name"],
         "properties": {"type": {"type": "string", "enum": ["tool"]}, "name": {"type": "string"}},
         "additionalProperties": any},
    ]});
    let number =
        json!({"type": ["number", "null"], "minimum": 0, "maximum": 9_007_199_254_740_991_i64});
    json!({
        "description": "An Anthropic Messages request: text, `tool_use` and `tool_result` \
                        blocks, and the client's own tools. The body as sent is the job's \
                        fingerprint (RFC 8785; numbers must be ones an IEEE double holds \
                        exactly). A member not listed here is refused (400 naming it): \
                        nothing is silently dropped.",
        "type": "object",
        "required": ["model", "messages", "max_tokens"],
        "properties": {
            "model": model,
            "max_tokens": {"type": "integer", "minimum": 1, "maximum": ceiling, "description": "At most the largest context window of the route's providers (400 past it)"},
            "messages": {
                "type": "array",
                "minItems": 1,
                "items": messages_turn_schema(&any),
            },
            "system": {"anyOf": [{"type": "string"}, {"type": "null"}, text_blocks]},
            "stream": {"type": ["boolean", "null"], "description": "Answer as server-sent events, as the provider generates them"},
            "temperature": number,
            "top_p": number,
            "stop_sequences": {"type": ["array", "null"], "maxItems": 64, "items": {"type": "string"}},
            "tools": {"type": ["array", "null"], "maxItems": 128, "items": tool, "description": "The client's own tools (`custom`); Anthropic's server tools are refused"},
            "tool_choice": tool_choice,
            "top_k": {"type": ["integer", "null"], "minimum": 0, "maximum": 9_007_199_254_740_991_i64},
            "metadata": {"type": ["object", "null"], "properties": {"user_id": {"type": ["string", "null"]}}, "additionalProperties": any},
            "output_format": {"anyOf": [{"type": "null"}, {
                "type": "object", "required": ["type", "schema"],
                "properties": {"type": {"type": "string", "enum": ["json_schema"]}, "schema": {"type": "object", "additionalProperties": any}},
                "additionalProperties": any,
                "description": "Structured output: the answer is JSON matching `schema`",
            }]},
        },
        "additionalProperties": false,
    })
}

/// A text block of a Messages request.
fn messages_text_block(any: &Value) -> Value {
    json!({
        "type": "object",
        "required": ["type", "text"],
        "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}},
        "additionalProperties": any,
    })
}

/// A Messages turn: a user's, with text and `tool_result` blocks, or an
/// assistant's, with text and `tool_use` blocks.
fn messages_turn_schema(any: &Value) -> Value {
    let text_block = messages_text_block(any);
    let text_blocks = json!({"type": "array", "items": text_block});
    let tool_use = json!({
        "type": "object",
        "required": ["type", "id", "name", "input"],
        "properties": {
            "type": {"type": "string", "enum": ["tool_use"]},
            "id": {"type": "string"},
            "name": {"type": "string"},
            "input": {"type": "object", "additionalProperties": any},
        },
        "additionalProperties": any,
    });
    let tool_result = json!({
        "type": "object",
        "required": ["type", "tool_use_id"],
        "properties": {
            "type": {"type": "string", "enum": ["tool_result"]},
            "tool_use_id": {"type": "string"},
            "content": {"anyOf": [{"type": "string"}, {"type": "null"}, text_blocks]},
        },
        "additionalProperties": any,
    });
    let turn = |role: &str, block: &Value| {
        json!({
            "type": "object",
            "required": ["role", "content"],
            "properties": {
                "role": {"type": "string", "enum": [role]},
                "content": {"anyOf": [
                    {"type": "string"},
                    {"type": "array", "items": {"anyOf": [text_block, block]}},
                ]},
            },
            "additionalProperties": any,
        })
    };
    json!({"anyOf": [turn("user", &tool_result), turn("assistant", &tool_use)]})
}

/// A Responses request as the server checks it
/// (`chat::responses::read_request`): every member it honours, and those
/// it accepts only when they ask for nothing; any other is refused.
fn responses_request_schema(routes: &[String], ceiling: u64) -> Value {
    let any = json!({"$ref": "#/components/schemas/JsonValue"});
    let model = if routes.is_empty() {
        json!({"type": "string", "minLength": 1, "description": "No chat route is configured: every model is unknown (404)"})
    } else {
        json!({"type": "string", "enum": routes, "description": "A chat route (GET /v1/models); any other name is 404 `model_not_found`"})
    };
    let nothing = |why: &str| json!({"type": "null", "description": why});
    let max = ceiling;
    json!({
        "description": "An OpenAI Responses request. Its conversation (instructions, the \
                        previous response's turns, input) becomes the chat route's request; the \
                        body as sent is the job's fingerprint (RFC 8785; numbers must be ones an \
                        IEEE double holds exactly). Members onejob cannot honour are refused \
                        with 400 naming them.",
        "type": "object",
        "required": ["model", "input"],
        "additionalProperties": false,
        "properties": {
            "model": model,
            "input": {"anyOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "minItems": 1, "items": responses_input_message(&any)},
            ]},
            "instructions": {"type": ["string", "null"], "description": "The conversation's system message"},
            "stream": {"type": ["boolean", "null"]},
            "background": {"type": ["boolean", "null"], "description": "Answer at once; poll GET /v1/responses/{id}"},
            "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
            "top_p": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
            "max_output_tokens": {"type": ["integer", "null"], "minimum": 1, "maximum": max, "description": "The chat request's `max_tokens`"},
            "previous_response_id": {"type": ["string", "null"], "pattern": "^resp_[0-9a-fA-F]{32}$", "description": "One of the caller's completed responses: its conversation and answer come first"},
            "store": {"type": ["boolean", "null"], "enum": [true, null], "description": "onejob stores every response: `false` is refused"},
            "metadata": {
                "type": ["object", "null"],
                "maxProperties": rules::MAX_METADATA_PAIRS,
                "propertyNames": {"maxLength": rules::MAX_METADATA_KEY},
                "additionalProperties": {"type": "string", "maxLength": rules::MAX_METADATA_VALUE},
            },
            "user": {"type": ["string", "null"]},
            "text": {
                "type": ["object", "null"],
                "additionalProperties": false,
                "properties": {"format": {"anyOf": [
                    {"type": "null"},
                    {"type": "object", "required": ["type"], "additionalProperties": false,
                     "properties": {"type": {"type": "string", "enum": ["text"]}}},
                ]}},
            },
            "tools": {"type": ["array", "null"], "maxItems": 0, "items": any, "description": "No tools: a non-empty list is refused"},
            "include": {"type": ["array", "null"], "maxItems": 0, "items": any, "description": "Nothing to include: a non-empty list is refused"},
            "tool_choice": {"type": ["string", "null"], "enum": ["none", "auto", null]},
            "truncation": {"type": ["string", "null"], "enum": ["disabled", null]},
            "reasoning": nothing("Refused unless null"),
            "max_tool_calls": nothing("Refused unless null"),
            "parallel_tool_calls": nothing("Refused unless null"),
            "service_tier": nothing("Refused unless null"),
            "prompt": nothing("Refused unless null"),
            "prompt_cache_key": nothing("Refused unless null"),
            "safety_identifier": nothing("Refused unless null"),
            "top_logprobs": nothing("Refused unless null"),
            "stream_options": nothing("Refused unless null"),
            "conversation": nothing("Refused unless null"),
        },
    })
}

/// A message of a Responses request's `input`.
fn responses_input_message(any: &Value) -> Value {
    let part = json!({
        "type": "object",
        "required": ["type", "text"],
        "additionalProperties": false,
        "properties": {
            "type": {"type": "string", "enum": ["input_text", "output_text"]},
            "text": {"type": "string"},
            "annotations": any,
            "logprobs": any,
        },
    });
    json!({
        "type": "object",
        "required": ["role", "content"],
        "additionalProperties": false,
        "properties": {
            "type": {"type": ["string", "null"], "enum": ["message", null]},
            "role": {"type": "string", "enum": ["user", "assistant", "system", "developer"]},
            "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": part}]},
            "id": any,
            "status": any,
        },
    })
}

/// The rules every chat request meets, as a route's input.
fn chat_input_schema() -> Value {
    let any = json!({"$ref": "#/components/schemas/JsonValue"});
    let string_or_null = json!({"type": ["string", "null"]});
    let number = json!({"type": ["number", "null"], "minimum": -9_007_199_254_740_991_i64, "maximum": 9_007_199_254_740_991_i64});
    let whole =
        json!({"type": ["integer", "null"], "minimum": 0, "maximum": 9_007_199_254_740_991_i64});
    let tool = json!({"type": "object", "required": ["type", "function"], "properties": {
        "type": {"const": "function"},
        "function": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"}, "description": string_or_null,
            "parameters": any, "strict": {"type": ["boolean", "null"]}}}}});
    let mut schema = json!({
        "type": "object",
        "required": ["messages"],
        "properties": {
            "messages": {"type": "array", "minItems": 1, "items": chat_message_schema(&any, &string_or_null)},
            "stream": {"type": ["boolean", "null"], "description": "Answer as server-sent events, as the provider generates them"},
            "stream_options": {"anyOf": [{"type": "null"}, {"type": "object",
                "properties": {"include_usage": {"type": "boolean"}}}]},
            "n": {"type": ["integer", "null"], "enum": [1, null], "description": "One request, one answer"},
            "temperature": number,
            "top_p": number,
            "top_k": whole,
            "seed": {"type": ["integer", "null"], "minimum": -9_007_199_254_740_991_i64, "maximum": 9_007_199_254_740_991_i64},
            "presence_penalty": number,
            "frequency_penalty": number,
            "user": string_or_null,
            "stop": {"anyOf": [{"type": "null"}, {"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
            "tools": {"type": ["array", "null"], "items": tool},
            "tool_choice": {"anyOf": [{"type": "null"}, {"type": "string", "enum": ["auto", "none", "required"]},
                {"type": "object", "required": ["type", "function"], "properties": {
                    "type": {"const": "function"},
                    "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}}}]},
            "response_format": {"anyOf": [{"type": "null"},
                {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["text", "json_object"]}}},
                {"type": "object", "required": ["type", "json_schema"], "properties": {
                    "type": {"const": "json_schema"},
                    "json_schema": {"type": "object", "required": ["name"], "properties": {
                        "name": {"type": "string"}, "schema": any, "description": string_or_null,
                        "strict": {"type": ["boolean", "null"]}}}}}]},
        },
        "additionalProperties": any,
    });
    any_value_inside(&mut schema, &any);
    schema
}

/// A message of a chat request.
fn chat_message_schema(any: &Value, string_or_null: &Value) -> Value {
    // What `chat::openai_chat::read_request` reads; a member it has no name
    // for is refused in a message unless it asks for nothing.
    let asks_nothing = json!({"enum": [null, []]});
    let part = json!({"anyOf": [
        {"type": "object", "required": ["type", "text"], "additionalProperties": any,
         "properties": {"type": {"const": "text"}, "text": {"type": "string"}}},
        {"type": "object", "required": ["type", "image_url"],
         "properties": {"type": {"const": "image_url"}, "image_url": {"type": "object", "required": ["url"],
             "properties": {"url": {"type": "string"}, "detail": string_or_null}}}},
        {"type": "object", "required": ["type"],
         "properties": {"type": {"type": "string", "not": {"enum": ["text", "image_url"]}}}},
    ]});
    let tool_call = json!({"type": "object", "required": ["function"], "properties": {
        "id": string_or_null, "type": {"type": "string"},
        "function": {"type": "object", "required": ["name"],
            "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}}}}});
    json!({
        "type": "object",
        "required": ["role"],
        "properties": {
            "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
            "content": {"type": ["string", "array", "null"], "items": part},
            "name": string_or_null,
            "tool_calls": {"type": ["array", "null"], "items": tool_call},
            "tool_call_id": string_or_null,
        },
        "additionalProperties": asks_nothing,
        "allOf": [
            {"if": {"properties": {"role": {"const": "tool"}}},
             "then": {"required": ["tool_call_id"],
                      "properties": {"tool_call_id": {"type": "string"}, "name": {"type": "null"}}},
             "else": {"properties": {"tool_call_id": {"type": "null"}}}},
            {"if": {"properties": {"role": {"const": "assistant"}}},
             "else": {"properties": {"tool_calls": {"type": "null"}}}},
        ],
    })
}

/// Every object schema below `schema` that lists its members and says
/// nothing of others takes any other as any JSON value onejob accepts
/// (`JsonValue`: numbers an IEEE double holds exactly, bounded depth).
fn any_value_inside(schema: &mut Value, any: &Value) {
    match schema {
        Value::Object(members) => {
            if members.contains_key("properties") && !members.contains_key("additionalProperties") {
                members.insert("additionalProperties".into(), any.clone());
            }
            for (name, member) in members.iter_mut() {
                if name != "additionalProperties" {
                    any_value_inside(member, any);
                }
            }
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|item| any_value_inside(item, any)),
        _ => {}
    }
}

/// `POST /api/v1/jobs`'s body: one alternative per configured task, with
/// its input rules and its chain.
fn create_job_schema(contracts: &Contracts) -> Value {
    let alternatives: Vec<Value> = contracts
        .iter()
        .map(|contract| {
            let input = if contract.is_chat() {
                chat_input_schema()
            } else {
                let fields = &contract.definition.input_fields;
                let properties: serde_json::Map<String, Value> = fields
                    .iter()
                    .map(|f| (f.clone(), json!({"type": "string", "pattern": NOT_BLANK})))
                    .collect();
                let mut rules = vec![json!({
                    "type": "object",
                    "required": fields,
                    "properties": properties,
                    "additionalProperties": {"$ref": "#/components/schemas/JsonValue"},
                })];
                if let Some(schema) = &contract.definition.input_schema {
                    rules.push(schema.clone());
                }
                json!({"allOf": rules})
            };
            json!({
                "type": "object",
                "title": contract.name(),
                "required": ["task", "input"],
                "additionalProperties": false,
                "properties": {
                    "task": {"type": "string", "const": contract.name()},
                    "input": input,
                    "provider": {
                        "type": ["string", "null"],
                        "enum": contract.chain().iter().map(|p| json!(p)).chain([Value::Null]).collect::<Vec<_>>(),
                        "description": "A provider of the task's chain to try first; default: the primary",
                    },
                    "params": {
                        "type": ["object", "null"],
                        "additionalProperties": {"$ref": "#/components/schemas/JsonValue"},
                        "description": "Passed to the provider",
                    },
                },
            })
        })
        .collect();
    json!({
        "description": "A job request for one of the configured tasks. `input` and `params` are \
                        kept as sent and fingerprinted by their RFC 8785 canonical form; numbers \
                        must be ones an IEEE double holds exactly (else 422).",
        "oneOf": alternatives,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The document's "not blank" is the server's: a JSON Schema validator
    /// accepts a one-character string exactly when `trim` keeps it.
    #[test]
    fn not_blank_agrees_with_trim_on_every_character() {
        let validator =
            jsonschema::validator_for(&json!({"type": "string", "pattern": NOT_BLANK})).unwrap();
        for c in (0..=0x3100u32)
            .chain([0xfeff, 0xffff, 0x1f600])
            .filter_map(char::from_u32)
        {
            let text = c.to_string();
            assert_eq!(
                validator.is_valid(&json!(text)),
                !text.trim().is_empty(),
                "U+{:04X}",
                c as u32
            );
        }
    }

    #[test]
    fn the_key_pattern_agrees_with_the_key_parser_on_samples() {
        let validator = jsonschema::validator_for(
            &json!({"type": "string", "pattern": IDEMPOTENCY_KEY_PATTERN}),
        )
        .unwrap();
        let long = "k".repeat(255);
        let too_long = "k".repeat(256);
        for key in [
            "a",
            "order-42",
            "a b",
            "~",
            &long,
            r#""quoted""#,
            r#""with \" escape""#,
            r#""""#,
            "\"",
            "\"open",
            &too_long,
            "",
            "é",
            "tab\there",
        ] {
            assert_eq!(
                validator.is_valid(&json!(key)),
                crate::domain::IdempotencyKey::parse(key).is_ok(),
                "{key:?}"
            );
        }
    }

    /// Every `GET` under `/api/v1` documents the `400 invalid-query` an
    /// unknown or bad query parameter gets, and the events of an endpoint
    /// document their paging (`limit`, `before`) as the jobs list does.
    #[test]
    fn every_api_get_documents_its_query_and_the_events_page() {
        let config = crate::config::Config::from_toml(
            crate::config::DEFAULT_CONFIG_TOML,
            "built-in",
            &crate::config::Environment::from_pairs([]),
        )
        .unwrap();
        let doc = document(&config);
        let mut gets = 0;
        for (path, item) in doc["paths"].as_object().unwrap() {
            let Some(get) = item.get("get") else { continue };
            if !path.starts_with("/api/v1/") || path == "/api/v1/openapi.json" {
                continue;
            }
            gets += 1;
            assert!(
                get["responses"].get("400").is_some(),
                "GET {path} does not document its 400"
            );
        }
        assert!(gets >= 12, "only {gets} GET paths");
        let events = &doc["paths"]["/api/v1/webhooks/{id}/events"]["get"];
        let param = |name: &str| {
            events["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == name)
                .unwrap_or_else(|| panic!("no parameter {name}: {events:#}"))
                .clone()
        };
        assert_eq!(param("limit")["in"], "query");
        assert_eq!(param("limit")["schema"]["minimum"], 1);
        assert_eq!(param("limit")["schema"]["maximum"], 200);
        assert_eq!(param("before")["in"], "query");
        let jobs = &doc["paths"]["/api/v1/jobs"]["get"]["parameters"];
        let before_of_jobs = jobs
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "before")
            .unwrap();
        assert_eq!(
            param("before")["schema"]["pattern"],
            before_of_jobs["schema"]["pattern"]
        );
        let page = &doc["components"]["schemas"]["WebhookEventList"];
        assert!(page["properties"].get("next").is_some(), "{page:#}");
    }

    /// The documented `url` pattern is the one the server enforces, and a
    /// JSON Schema validator reads it as the hand-written check does.
    #[test]
    fn the_webhook_url_pattern_is_the_one_enforced() {
        use crate::domain::webhook::{follows_url_pattern, URL_PATTERN};
        let doc = serde_json::to_value(super::super::api_webhooks::WebhooksDoc::openapi()).unwrap();
        for schema in ["CreateWebhookRequest", "UpdateWebhookRequest"] {
            assert_eq!(
                doc["components"]["schemas"][schema]["properties"]["url"]["pattern"],
                json!(URL_PATTERN),
                "{schema}"
            );
        }
        let validator =
            jsonschema::validator_for(&json!({"type": "string", "pattern": URL_PATTERN})).unwrap();
        for url in [
            "https://hooks.example.com/in?x=1",
            "http://127.0.0.1:41234/",
            "http://[::1]:80/x",
            "http://a:65535",
            "http://a:65536",
            "http://a:9999",
            "http://a:099",
            "https://q0Z*",
            "https://q0Z",
            "https://9.example.9",
            "https://a..b/",
            "https://example.com:0",
            "https://example.com:99999/#frag",
            "https://example.com:100000",
            " https://example.com",
            "https://example.com/é",
            "https://example.com/%zz",
            "http://[]/",
            "http://[::1/",
            "http://1.2.3/",
            "http://1.2.3.4444/",
        ] {
            assert_eq!(
                validator.is_valid(&json!(url)),
                follows_url_pattern(url),
                "{url}"
            );
        }
    }
}
