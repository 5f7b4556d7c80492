//! OpenAI's Responses format, as the `/v1/responses` door speaks it: its
//! requests read into the model (what onejob honours; what it cannot is
//! refused with a 400 naming it, nothing silently ignored), and the
//! Responses object and stream events written from a job's answer.
//!
//! A response's conversation is text: the instructions (a system
//! message), the previous response's turns, and the input's messages.
//! The response's id and status rules are the domain's
//! (`domain::responses`).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use super::model::{ChatRequest, Content, Message, Sampling};
use super::wire::{decode, PathStyle, Refused, TextOr, WholeNumber};
use crate::domain::responses::{
    ResponseId, ResponseStatus, MAX_METADATA_KEY, MAX_METADATA_PAIRS, MAX_METADATA_VALUE,
};

const STYLE: PathStyle = PathStyle::Brackets;

/// A Responses request: the members onejob honours, typed; those it
/// accepts only when they ask for nothing, as sent; any other is refused.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResponsesRequest {
    #[serde(default)]
    pub model: Option<Value>,
    #[serde(default)]
    pub input: Option<TextOr<InputItem>>,
    #[serde(default)]
    pub instructions: Option<String>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub background: Option<bool>,
    #[serde(default)]
    pub temperature: Option<Value>,
    #[serde(default)]
    pub top_p: Option<Value>,
    #[serde(default)]
    pub max_output_tokens: Option<Value>,
    #[serde(default)]
    pub previous_response_id: Option<String>,
    #[serde(default)]
    pub store: Option<bool>,
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub text: Option<TextConfigIn>,
    #[serde(flatten)]
    pub others: Map<String, Value>,
}

/// One input item: a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputItem {
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub role: Option<String>,
    #[serde(default)]
    pub content: Option<TextOr<InputPart>>,
    /// An output message sent back as input carries these; they say nothing
    /// about the conversation.
    #[serde(default)]
    pub id: Option<Value>,
    #[serde(default)]
    pub status: Option<Value>,
    #[serde(flatten)]
    pub others: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputPart {
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub annotations: Option<Value>,
    #[serde(default)]
    pub logprobs: Option<Value>,
    #[serde(flatten)]
    pub others: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextConfigIn {
    #[serde(default)]
    pub format: Option<Map<String, Value>>,
    #[serde(flatten)]
    pub others: Map<String, Value>,
}

/// Members accepted only when they ask for nothing: null, or the value
/// that means "none" (an empty list, `disabled`, `none`/`auto` without
/// tools).
const ONLY_WHEN_EMPTY: [&str; 14] = [
    "tools",
    "tool_choice",
    "include",
    "truncation",
    "reasoning",
    "max_tool_calls",
    "parallel_tool_calls",
    "service_tier",
    "prompt",
    "prompt_cache_key",
    "safety_identifier",
    "top_logprobs",
    "stream_options",
    "conversation",
];

/// Why a member of [`ONLY_WHEN_EMPTY`] cannot be honoured.
fn why_not(member: &str) -> &'static str {
    match member {
        "tools" => "onejob's chat routes take no tools through the Responses API (built-in or function tools)",
        "tool_choice" => "without tools, `tool_choice` can only be `none` or `auto`",
        "include" => "onejob has no extra output to include",
        "truncation" => "onejob sends the conversation whole: only `disabled` is honoured",
        "reasoning" => "onejob's chat routes take no reasoning settings",
        "max_tool_calls" | "parallel_tool_calls" => "onejob's chat routes take no tools",
        "service_tier" => "the provider's tier is the route's configuration",
        "prompt" => "onejob has no stored prompts",
        "prompt_cache_key" | "safety_identifier" => "onejob does not pass it to the provider",
        "top_logprobs" => "onejob returns no log probabilities",
        "stream_options" => "onejob's Responses stream has no options",
        "conversation" => "onejob has no conversations: use `previous_response_id`",
        _ => "it is not supported",
    }
}

/// Whether `value` of `member` asks for nothing.
fn asks_nothing(member: &str, value: &Value) -> bool {
    match (member, value) {
        (_, Value::Null) => true,
        ("tools" | "include", Value::Array(items)) => items.is_empty(),
        ("tool_choice", Value::String(s)) => s == "none" || s == "auto",
        ("truncation", Value::String(s)) => s == "disabled",
        _ => false,
    }
}

/// A Responses request as the door reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadRequest {
    /// The chat route.
    pub route: String,
    pub stream: bool,
    pub background: bool,
    pub previous: Option<ResponseId>,
    pub instructions: Option<String>,
    /// The new turn's messages.
    pub messages: Vec<Message>,
    pub sampling: Sampling,
    pub user: Option<String>,
}

/// Reads a Responses request: what it asks, or the first member onejob
/// cannot honour.
pub fn read_request(body: &Value) -> Result<ReadRequest, Refused> {
    if !body.is_object() {
        return Err(Refused::new("body", "the body must be a JSON object"));
    }
    let wire: ResponsesRequest = decode(body, STYLE, "")?;
    for (member, value) in &wire.others {
        if ONLY_WHEN_EMPTY.contains(&member.as_str()) {
            if asks_nothing(member, value) {
                continue;
            }
            return Err(Refused::new(
                member.as_str(),
                format!(
                    "`{member}` is not supported by this server: {}",
                    why_not(member)
                ),
            ));
        }
        return Err(Refused::new(
            member.as_str(),
            format!("unknown parameter `{member}`: this server does not honour it"),
        ));
    }
    let route = match &wire.model {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => return Err(Refused::new("model", "you must provide a model parameter")),
    };
    if wire.store == Some(false) {
        return Err(Refused::new(
            "store",
            "`store: false` cannot be honoured: onejob stores every response (it is a job)",
        ));
    }
    if let Some(text) = &wire.text {
        check_text(text)?;
    }
    check_metadata(wire.metadata.as_ref())?;
    let previous = match &wire.previous_response_id {
        None => None,
        Some(id) => Some(ResponseId::parse(id).ok_or_else(|| {
            Refused::new(
                "previous_response_id",
                format!("`{id}` is not a response id (resp_ and 32 hex digits)"),
            )
        })?),
    };
    let messages = read_input(wire.input.as_ref())?;
    let max_tokens = match &wire.max_output_tokens {
        None | Some(Value::Null) => None,
        Some(n) => Some(WholeNumber::of(n).filter(|n| *n >= 1).ok_or_else(|| {
            Refused::new(
                "max_output_tokens",
                "`max_output_tokens` must be a whole number, 1 or more",
            )
        })?),
    };
    Ok(ReadRequest {
        route,
        stream: wire.stream.unwrap_or(false),
        background: wire.background.unwrap_or(false),
        previous,
        instructions: wire.instructions.clone(),
        messages,
        sampling: Sampling {
            max_tokens,
            temperature: number(wire.temperature.as_ref(), "temperature", 2.0)?,
            top_p: number(wire.top_p.as_ref(), "top_p", 1.0)?,
            ..Sampling::default()
        },
        user: wire.user.clone(),
    })
}

fn number(value: Option<&Value>, name: &str, max: f64) -> Result<Option<f64>, Refused> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(n) => match n.as_f64().filter(|n| (0.0..=max).contains(n)) {
            Some(n) => Ok(Some(n)),
            None => Err(Refused::new(
                name,
                format!("`{name}` must be a number from 0 to {max}"),
            )),
        },
    }
}

fn check_text(text: &TextConfigIn) -> Result<(), Refused> {
    if let Some(other) = text.others.keys().next() {
        return Err(Refused::new(
            format!("text.{other}"),
            format!("`text.{other}` is not supported by this server"),
        ));
    }
    let plain = |format: &Map<String, Value>| {
        format.len() == 1 && format.get("type").and_then(Value::as_str) == Some("text")
    };
    match &text.format {
        None => Ok(()),
        Some(format) if plain(format) => Ok(()),
        Some(_) => Err(Refused::new(
            "text.format",
            "only the `text` format is supported: onejob's chat routes return text",
        )),
    }
}

fn check_metadata(metadata: Option<&Map<String, Value>>) -> Result<(), Refused> {
    let Some(pairs) = metadata else {
        return Ok(());
    };
    if pairs.len() > MAX_METADATA_PAIRS {
        return Err(Refused::new(
            "metadata",
            format!("`metadata` may hold at most {MAX_METADATA_PAIRS} pairs"),
        ));
    }
    for (key, value) in pairs {
        let fits = key.chars().count() <= MAX_METADATA_KEY
            && value
                .as_str()
                .is_some_and(|v| v.chars().count() <= MAX_METADATA_VALUE);
        if !fits {
            return Err(Refused::new(
                format!("metadata.{key}"),
                format!(
                    "`metadata` keys must be at most {MAX_METADATA_KEY} characters and its \
                     values strings of at most {MAX_METADATA_VALUE}"
                ),
            ));
        }
    }
    Ok(())
}

/// `input`: a string (one user message) or a list of messages.
fn read_input(input: Option<&TextOr<InputItem>>) -> Result<Vec<Message>, Refused> {
    match input {
        Some(TextOr::Text(text)) if !text.is_empty() => Ok(vec![Message::User {
            content: Content::Text(text.clone()),
            name: None,
        }]),
        Some(TextOr::Items(items)) if !items.is_empty() => items
            .iter()
            .enumerate()
            .map(|(i, item)| read_item(i, item))
            .collect(),
        None => Err(Refused::new("input", "you must provide an input")),
        Some(_) => Err(Refused::new(
            "input",
            "`input` must be a non-empty string or a non-empty list of messages",
        )),
    }
}

fn read_item(i: usize, item: &InputItem) -> Result<Message, Refused> {
    let at = STYLE.join("input", i);
    match item.kind.as_deref() {
        None | Some("message") => {}
        Some(other) => {
            return Err(Refused::new(
                format!("{at}.type"),
                format!(
                    "input items of type \"{other}\" are not supported: onejob takes messages only"
                ),
            ))
        }
    }
    if let Some(member) = item.others.keys().next() {
        return Err(Refused::new(
            format!("{at}.{member}"),
            format!("`{at}.{member}` is not supported by this server"),
        ));
    }
    let content = match &item.content {
        Some(TextOr::Text(text)) => text.clone(),
        Some(TextOr::Items(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                text.push_str(read_part(&STYLE.join(&format!("{at}.content"), j), part)?);
            }
            text
        }
        None => {
            return Err(Refused::new(
                format!("{at}.content"),
                format!("`{at}.content` must be a string or a list of text parts"),
            ))
        }
    };
    let content = Content::Text(content);
    match item.role.as_deref() {
        Some("user") => Ok(Message::User {
            content,
            name: None,
        }),
        Some("assistant") => Ok(Message::Assistant {
            content: Some(content),
            tool_calls: Vec::new(),
            name: None,
        }),
        Some(role @ ("system" | "developer")) => Ok(Message::System {
            content,
            developer: role == "developer",
            name: None,
        }),
        _ => Err(Refused::new(
            format!("{at}.role"),
            format!("`{at}.role` must be user, assistant, system or developer"),
        )),
    }
}

fn read_part<'a>(at: &str, part: &'a InputPart) -> Result<&'a str, Refused> {
    match part.kind.as_deref() {
        Some("input_text" | "output_text") => {}
        _ => {
            return Err(Refused::new(
                format!("{at}.type"),
                "only `input_text` and `output_text` parts are supported: onejob's chat \
                 routes take text",
            ))
        }
    }
    if let Some(member) = part.others.keys().next() {
        return Err(Refused::new(
            format!("{at}.{member}"),
            format!("`{at}.{member}` is not supported by this server"),
        ));
    }
    part.text.as_deref().ok_or_else(|| {
        Refused::new(
            format!("{at}.text"),
            format!("`{at}.text` must be a string"),
        )
    })
}

impl ReadRequest {
    /// The chat request the job sends: the instructions as its system
    /// message, then the `earlier` turns (of the previous response), then
    /// this request's messages, with its sampling.
    pub fn chat_request(&self, earlier: &[Message]) -> ChatRequest {
        let mut messages = Vec::with_capacity(1 + earlier.len() + self.messages.len());
        if let Some(instructions) = &self.instructions {
            messages.push(Message::System {
                content: Content::Text(instructions.clone()),
                developer: false,
                name: None,
            });
        }
        messages.extend(earlier.iter().cloned());
        messages.extend(self.messages.iter().cloned());
        ChatRequest {
            messages,
            sampling: self.sampling.clone(),
            stream: self.stream,
            user: self.user.clone(),
            ..ChatRequest::default()
        }
    }
}

/// The turns a response carries to the next one (`previous_response_id`):
/// its conversation without its own instructions (they are not carried
/// over), then its answer as the assistant's message.
pub fn earlier_turns(previous: &ChatRequest, had_instructions: bool, answer: &str) -> Vec<Message> {
    let skip = usize::from(had_instructions);
    let mut turns: Vec<Message> = previous.messages.iter().skip(skip).cloned().collect();
    turns.push(Message::Assistant {
        content: Some(Content::Text(answer.to_owned())),
        tool_calls: Vec::new(),
        name: None,
    });
    turns
}

/// An answer's text part.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct OutputText {
    /// `output_text`
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
    #[schema(value_type = Vec<Object>)]
    pub annotations: Vec<Value>,
    #[schema(value_type = Vec<Object>)]
    pub logprobs: Vec<Value>,
}

impl OutputText {
    pub fn of(text: String) -> Self {
        Self {
            kind: "output_text".into(),
            text,
            annotations: Vec::new(),
            logprobs: Vec::new(),
        }
    }
}

/// The answer, as one assistant message.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct OutputMessage {
    /// `msg_<job id>`
    pub id: String,
    /// `message`
    #[serde(rename = "type")]
    pub kind: String,
    #[schema(pattern = "^(in_progress|completed|incomplete)$")]
    pub status: String,
    /// `assistant`
    pub role: String,
    pub content: Vec<OutputText>,
}

impl OutputMessage {
    pub fn of(id: &ResponseId, text: Option<String>, status: &str) -> Self {
        Self {
            id: id.message_id(),
            kind: "message".into(),
            status: status.into(),
            role: "assistant".into(),
            content: text.map(OutputText::of).into_iter().collect(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ResponseError {
    pub code: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct IncompleteDetails {
    /// `max_output_tokens`
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct InputTokensDetails {
    pub cached_tokens: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ResponseUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub total_tokens: u64,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens_details: OutputTokensDetails,
}

impl ResponseUsage {
    pub fn of(counts: super::TokenCounts) -> Self {
        Self {
            input_tokens: counts.input,
            output_tokens: counts.output,
            total_tokens: counts.total(),
            input_tokens_details: InputTokensDetails {
                cached_tokens: counts.cached_input,
            },
            output_tokens_details: OutputTokensDetails {
                reasoning_tokens: counts.reasoning,
            },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct TextFormat {
    /// `text`
    #[serde(rename = "type")]
    pub kind: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct TextConfig {
    pub format: TextFormat,
}

/// The Responses object: `id` is `resp_<job id>`; `status` is the job's.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ResponseObject {
    pub id: String,
    /// `response`
    pub object: String,
    /// Unix seconds
    pub created_at: i64,
    /// The job's status: pending → queued; running or unknown →
    /// in_progress; succeeded → completed (incomplete when cut at the
    /// token limit); failed; cancelled
    #[schema(value_type = String, pattern = "^(queued|in_progress|completed|incomplete|failed|cancelled)$")]
    #[serde(serialize_with = "status_text")]
    pub status: ResponseStatus,
    pub background: bool,
    pub error: Option<ResponseError>,
    pub incomplete_details: Option<IncompleteDetails>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u64>,
    pub model: String,
    pub output: Vec<OutputMessage>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// `none`: onejob's Responses routes take no tools
    pub tool_choice: String,
    #[schema(value_type = Vec<Object>)]
    pub tools: Vec<Value>,
    pub text: TextConfig,
    /// `disabled`
    pub truncation: String,
    pub usage: Option<ResponseUsage>,
    pub user: Option<String>,
    pub metadata: std::collections::BTreeMap<String, String>,
    /// Always true: onejob stores every response
    pub store: bool,
}

/// A status as its text.
fn status_text<S: serde::Serializer>(status: &ResponseStatus, to: S) -> Result<S::Ok, S::Error> {
    to.serialize_str(status.as_str())
}

/// What a Responses object shows of its job.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseView {
    pub id: ResponseId,
    pub created_at: i64,
    pub route: String,
    /// The status in the Responses vocabulary.
    pub status: ResponseStatus,
    /// The answer, once the job has one to show.
    pub answer: Option<super::Answer>,
    pub error: Option<ResponseError>,
    /// The request it was made by (kept with its job).
    pub request: ResponsesRequest,
}

impl ResponseObject {
    pub fn of(view: &ResponseView) -> Self {
        let request = &view.request;
        let output = view
            .answer
            .iter()
            .map(|answer| OutputMessage::of(&view.id, Some(answer.text().to_owned()), "completed"))
            .collect();
        let incomplete_details = (view.answer.is_some()
            && view.status == ResponseStatus::Incomplete)
            .then(|| IncompleteDetails {
                reason: "max_output_tokens".into(),
            });
        let metadata = request
            .metadata
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
            .collect();
        Self {
            id: view.id.to_string(),
            object: "response".into(),
            created_at: view.created_at,
            status: view.status,
            background: request.background.unwrap_or(false),
            error: view.error.clone(),
            incomplete_details,
            instructions: request.instructions.clone(),
            max_output_tokens: request.max_output_tokens.as_ref().and_then(WholeNumber::of),
            model: view.route.clone(),
            output,
            parallel_tool_calls: false,
            previous_response_id: request.previous_response_id.clone(),
            temperature: request.temperature.as_ref().and_then(Value::as_f64),
            top_p: request.top_p.as_ref().and_then(Value::as_f64),
            tool_choice: "none".into(),
            tools: Vec::new(),
            text: TextConfig {
                format: TextFormat {
                    kind: "text".into(),
                },
            },
            truncation: "disabled".into(),
            usage: view.answer.as_ref().map(|a| ResponseUsage::of(a.usage)),
            user: request.user.clone(),
            metadata,
            store: true,
        }
    }
}

/// An event of a Responses stream; its `type` and `sequence_number` are
/// added as it is written.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum StreamData {
    Response {
        response: Box<ResponseObject>,
    },
    ItemAdded {
        output_index: u32,
        item: OutputMessage,
    },
    Part {
        item_id: String,
        output_index: u32,
        content_index: u32,
        part: OutputText,
    },
    TextDelta {
        item_id: String,
        output_index: u32,
        content_index: u32,
        delta: String,
        logprobs: Vec<Value>,
    },
    TextDone {
        item_id: String,
        output_index: u32,
        content_index: u32,
        text: String,
        logprobs: Vec<Value>,
    },
    Error {
        code: Option<Value>,
        message: Option<String>,
        param: Option<String>,
    },
}

/// A numbered event's data: its `type`, its `sequence_number`, its members.
#[derive(Debug, Clone, Serialize)]
struct Numbered<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    sequence_number: u64,
    #[serde(flatten)]
    data: &'a StreamData,
}

/// One event's text: `event: <type>` and its numbered data.
pub fn event_text(kind: &str, sequence_number: u64, data: &StreamData) -> String {
    let data = serde_json::to_string(&Numbered {
        kind,
        sequence_number,
        data,
    })
    .expect("an event serializes");
    format!("event: {kind}\ndata: {data}\n\n")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::chat::openai_chat::{self, Target};

    fn input(request: &ReadRequest, earlier: &[Message]) -> Value {
        let chat = request.chat_request(earlier);
        serde_json::to_value(openai_chat::write_request(
            &chat,
            Target::Input {
                route: &request.route,
            },
        ))
        .unwrap()
    }

    #[test]
    fn a_string_input_is_one_user_message_after_the_instructions() {
        let request = read_request(&json!({"model": "m", "input": "Hi",
            "instructions": "Be brief.", "max_output_tokens": 20, "temperature": 0.5}))
        .unwrap();
        assert_eq!(
            input(&request, &[]),
            json!({"model": "m", "max_tokens": 20, "temperature": 0.5, "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
            ]})
        );
    }

    #[test]
    fn a_list_input_takes_strings_and_text_parts_of_every_role() {
        let request = read_request(&json!({"model": "m", "stream": true, "input": [
            {"role": "developer", "content": "Rules."},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "Hello "}, {"type": "input_text", "text": "you"}]},
            {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": "Hi!", "annotations": []}]},
        ]}))
        .unwrap();
        let chat = input(&request, &[]);
        assert_eq!(
            chat["messages"],
            json!([
                {"role": "developer", "content": "Rules."},
                {"role": "user", "content": "Hello you"},
                {"role": "assistant", "content": "Hi!"},
            ])
        );
        assert_eq!(chat["stream"], true);
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        let refusal = |body: Value| read_request(&body).unwrap_err().param;
        let base = |extra: Value| {
            let mut body = json!({"model": "m", "input": "x"});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            body
        };
        assert_eq!(
            refusal(base(json!({"tools": [{"type": "web_search"}]}))),
            "tools"
        );
        assert_eq!(refusal(base(json!({"store": false}))), "store");
        assert_eq!(
            refusal(base(json!({"include": ["reasoning.encrypted_content"]}))),
            "include"
        );
        assert_eq!(
            refusal(base(json!({"reasoning": {"effort": "low"}}))),
            "reasoning"
        );
        assert_eq!(refusal(base(json!({"truncation": "auto"}))), "truncation");
        assert_eq!(
            refusal(base(json!({"max_tool_calls": 3}))),
            "max_tool_calls"
        );
        assert_eq!(refusal(base(json!({"frobnicate": 1}))), "frobnicate");
        assert_eq!(
            refusal(base(json!({"text": {"format": {"type": "json_object"}}}))),
            "text.format"
        );
        assert_eq!(refusal(base(json!({"temperature": 3}))), "temperature");
        assert_eq!(
            refusal(base(json!({"max_output_tokens": 1.5}))),
            "max_output_tokens"
        );
        assert_eq!(refusal(base(json!({"stream": "yes"}))), "stream");
        let whole = read_request(&base(json!({"max_output_tokens": 32.0}))).unwrap();
        assert_eq!(input(&whole, &[])["max_tokens"], 32);
        assert_eq!(
            refusal(json!({"model": "m", "input": [{"type": "function_call_output"}]})),
            "input[0].type"
        );
        assert_eq!(
            refusal(json!({"model": "m", "input": [{"role": "user",
                "content": [{"type": "input_image", "image_url": "x"}]}]})),
            "input[0].content[0].type"
        );
        assert_eq!(refusal(json!({"input": "x"})), "model");
        assert_eq!(refusal(json!({"model": "m"})), "input");
        assert_eq!(refusal(json!({"model": "m", "input": []})), "input");
        // What asks for nothing is accepted.
        assert!(
            read_request(&base(json!({"tools": [], "include": null, "store": true,
            "truncation": "disabled", "tool_choice": "auto", "text": {"format": {"type": "text"}},
            "metadata": {"k": "v"}})))
            .is_ok()
        );
    }

    #[test]
    fn a_previous_turn_is_carried_without_its_instructions() {
        let previous = openai_chat::read_request(&json!({"model": "m", "messages": [
            {"role": "system", "content": "Old rules."},
            {"role": "user", "content": "Hi"},
        ]}))
        .unwrap()
        .request;
        let turns = earlier_turns(&previous, true, "Hello.");
        let request = read_request(&json!({"model": "m", "input": "And?",
            "instructions": "New rules."}))
        .unwrap();
        assert_eq!(
            input(&request, &turns)["messages"],
            json!([
                {"role": "system", "content": "New rules."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "And?"},
            ])
        );
    }
}
