//! The OpenAI Responses API's rules, as pure functions (docs/design.md,
//! "Responses API"): a response is a job, named `resp_<job id>`; its
//! request is read here (what onejob honours, what it refuses, and the
//! chat conversation it becomes), and its job's status is told in the
//! Responses vocabulary.
//!
//! Every member of a request is either honoured or refused with a 400
//! naming it: nothing is silently ignored.

use serde_json::{json, Map, Value};

use super::{JobId, JobStatus};

/// The prefix of a response's id.
const RESPONSE_PREFIX: &str = "resp_";
/// The prefix of its one output message's id.
const MESSAGE_PREFIX: &str = "msg_";

/// The most `metadata` pairs, and their keys' and values' longest lengths
/// (OpenAI's limits).
pub const MAX_METADATA_PAIRS: usize = 16;
pub const MAX_METADATA_KEY: usize = 64;
pub const MAX_METADATA_VALUE: usize = 512;

/// A response's id: `resp_` and its job's id as 32 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResponseId(JobId);

impl ResponseId {
    pub fn of(job: &JobId) -> Self {
        Self(job.clone())
    }

    /// Parses `resp_<32 hex digits>`; anything else is `None`.
    pub fn parse(text: &str) -> Option<Self> {
        let hex = text.strip_prefix(RESPONSE_PREFIX)?;
        if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let uuid = uuid::Uuid::try_parse(hex).ok()?;
        JobId::parse(&uuid.hyphenated().to_string()).map(Self)
    }

    pub fn job_id(&self) -> &JobId {
        &self.0
    }

    fn hex(&self) -> String {
        self.0.as_str().replace('-', "")
    }

    /// The id of the response's output message.
    pub fn message_id(&self) -> String {
        format!("{MESSAGE_PREFIX}{}", self.hex())
    }
}

impl std::fmt::Display for ResponseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{RESPONSE_PREFIX}{}", self.hex())
    }
}

/// A refused request: what is wrong, and the parameter it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub message: String,
    pub param: String,
}

fn refused(param: impl Into<String>, message: impl Into<String>) -> Refused {
    Refused {
        message: message.into(),
        param: param.into(),
    }
}

/// Members onejob honours.
const HONOURED: [&str; 13] = [
    "model",
    "input",
    "instructions",
    "stream",
    "background",
    "temperature",
    "top_p",
    "max_output_tokens",
    "previous_response_id",
    "store",
    "metadata",
    "user",
    "text",
];

/// Members accepted only when they ask for nothing: null, or the value
/// that means "none" (an empty list, `disabled`, `none`/`auto` without tools).
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

/// A Responses request as onejob reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesRequest {
    /// The chat route.
    pub model: String,
    pub stream: bool,
    pub background: bool,
    pub previous: Option<ResponseId>,
    pub instructions: Option<String>,
    /// The new turn's messages, in chat form.
    pub messages: Vec<Value>,
    /// `temperature`, `top_p`, `max_tokens` (from `max_output_tokens`),
    /// `user`: the chat request's members.
    pub chat_params: Map<String, Value>,
}

/// Reads a Responses request: what it asks, or the first member onejob
/// cannot honour. The walk is over a body whose size and depth the web
/// layer has bounded already.
pub fn read_request(body: &Value) -> Result<ResponsesRequest, Refused> {
    let object = body
        .as_object()
        .ok_or_else(|| refused("body", "the body must be a JSON object"))?;
    for (member, value) in object {
        if HONOURED.contains(&member.as_str()) {
            continue;
        }
        if ONLY_WHEN_EMPTY.contains(&member.as_str()) {
            if asks_nothing(member, value) {
                continue;
            }
            return Err(refused(
                member.as_str(),
                format!(
                    "`{member}` is not supported by this server: {}",
                    why_not(member)
                ),
            ));
        }
        return Err(refused(
            member.as_str(),
            format!("unknown parameter `{member}`: this server does not honour it"),
        ));
    }
    let model = match object.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => return Err(refused("model", "you must provide a model parameter")),
    };
    let flag = |name: &str| match object.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(refused(name, format!("`{name}` must be a boolean"))),
    };
    let stream = flag("stream")?;
    let background = flag("background")?;
    match object.get("store") {
        None | Some(Value::Null | Value::Bool(true)) => {}
        Some(Value::Bool(false)) => {
            return Err(refused(
                "store",
                "`store: false` cannot be honoured: onejob stores every response (it is a job)",
            ))
        }
        Some(_) => return Err(refused("store", "`store` must be a boolean")),
    }
    match object.get("text") {
        None | Some(Value::Null) => {}
        Some(Value::Object(text)) => {
            for (member, value) in text {
                match (member.as_str(), value) {
                    ("format", Value::Null) => {}
                    ("format", Value::Object(format))
                        if format.len() == 1 && format.get("type") == Some(&json!("text")) => {}
                    ("format", _) => {
                        return Err(refused(
                            "text.format",
                            "only the `text` format is supported: onejob's chat routes return text",
                        ))
                    }
                    (other, _) => {
                        return Err(refused(
                            format!("text.{other}"),
                            format!("`text.{other}` is not supported by this server"),
                        ))
                    }
                }
            }
        }
        Some(_) => return Err(refused("text", "`text` must be an object")),
    }
    check_metadata(object.get("metadata"))?;
    let previous = match object.get("previous_response_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(ResponseId::parse(id).ok_or_else(|| {
            refused(
                "previous_response_id",
                format!("`{id}` is not a response id (resp_ and 32 hex digits)"),
            )
        })?),
        Some(_) => {
            return Err(refused(
                "previous_response_id",
                "`previous_response_id` must be a string",
            ))
        }
    };
    let instructions = match object.get("instructions") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(refused("instructions", "`instructions` must be a string")),
    };
    let messages = read_input(object.get("input"))?;
    let mut chat_params = Map::new();
    number(
        object,
        "temperature",
        0.0,
        2.0,
        &mut chat_params,
        "temperature",
    )?;
    number(object, "top_p", 0.0, 1.0, &mut chat_params, "top_p")?;
    match object.get("max_output_tokens") {
        None | Some(Value::Null) => {}
        Some(n) if whole_number(n).is_some_and(|n| n >= 1) => {
            chat_params.insert("max_tokens".into(), json!(whole_number(n)));
        }
        Some(_) => {
            return Err(refused(
                "max_output_tokens",
                "`max_output_tokens` must be a whole number, 1 or more",
            ))
        }
    }
    match object.get("user") {
        None | Some(Value::Null) => {}
        Some(Value::String(user)) => {
            chat_params.insert("user".into(), json!(user));
        }
        Some(_) => return Err(refused("user", "`user` must be a string")),
    }
    Ok(ResponsesRequest {
        model,
        stream,
        background,
        previous,
        instructions,
        messages,
        chat_params,
    })
}

/// A JSON number that is a whole number an IEEE double holds exactly
/// (`5` or `5.0`), 0 or more.
pub fn whole_number(n: &Value) -> Option<u64> {
    const MAX_EXACT: f64 = 9_007_199_254_740_991.0;
    n.as_u64().filter(|v| *v as f64 <= MAX_EXACT).or_else(|| {
        n.as_f64()
            .filter(|f| f.fract() == 0.0 && (0.0..=MAX_EXACT).contains(f))
            .map(|f| f as u64)
    })
}

fn number(
    object: &Map<String, Value>,
    name: &str,
    min: f64,
    max: f64,
    into: &mut Map<String, Value>,
    as_name: &str,
) -> Result<(), Refused> {
    match object.get(name) {
        None | Some(Value::Null) => Ok(()),
        Some(n) if n.as_f64().is_some_and(|n| (min..=max).contains(&n)) => {
            into.insert(as_name.into(), n.clone());
            Ok(())
        }
        Some(_) => Err(refused(
            name,
            format!("`{name}` must be a number from {min} to {max}"),
        )),
    }
}

fn check_metadata(metadata: Option<&Value>) -> Result<(), Refused> {
    let pairs = match metadata {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(pairs)) => pairs,
        Some(_) => return Err(refused("metadata", "`metadata` must be an object")),
    };
    if pairs.len() > MAX_METADATA_PAIRS {
        return Err(refused(
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
            return Err(refused(
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
fn read_input(input: Option<&Value>) -> Result<Vec<Value>, Refused> {
    match input {
        Some(Value::String(text)) if !text.is_empty() => {
            Ok(vec![json!({"role": "user", "content": text})])
        }
        Some(Value::Array(items)) if !items.is_empty() => items
            .iter()
            .enumerate()
            .map(|(i, item)| read_item(i, item))
            .collect(),
        None | Some(Value::Null) => Err(refused("input", "you must provide an input")),
        Some(_) => Err(refused(
            "input",
            "`input` must be a non-empty string or a non-empty list of messages",
        )),
    }
}

/// Item members onejob reads (`id` and `status` come with an output
/// message sent back as input, and say nothing about the conversation).
const ITEM_MEMBERS: [&str; 5] = ["type", "role", "content", "id", "status"];
const PART_MEMBERS: [&str; 4] = ["type", "text", "annotations", "logprobs"];

fn read_item(i: usize, item: &Value) -> Result<Value, Refused> {
    let at = format!("input[{i}]");
    let object = item
        .as_object()
        .ok_or_else(|| refused(&at, format!("`{at}` must be a message object")))?;
    match object.get("type") {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if t == "message" => {}
        Some(other) => {
            return Err(refused(
                format!("{at}.type"),
                format!(
                    "input items of type {other} are not supported: onejob takes messages only"
                ),
            ))
        }
    }
    if let Some(member) = object.keys().find(|k| !ITEM_MEMBERS.contains(&k.as_str())) {
        return Err(refused(
            format!("{at}.{member}"),
            format!("`{at}.{member}` is not supported by this server"),
        ));
    }
    let Some(role @ ("user" | "assistant" | "system" | "developer")) =
        object.get("role").and_then(Value::as_str)
    else {
        return Err(refused(
            format!("{at}.role"),
            format!("`{at}.role` must be user, assistant, system or developer"),
        ));
    };
    let content = match object.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                text.push_str(read_part(&format!("{at}.content[{j}]"), part)?);
            }
            text
        }
        _ => {
            return Err(refused(
                format!("{at}.content"),
                format!("`{at}.content` must be a string or a list of text parts"),
            ))
        }
    };
    Ok(json!({"role": role, "content": content}))
}

fn read_part<'a>(at: &str, part: &'a Value) -> Result<&'a str, Refused> {
    let object = part
        .as_object()
        .ok_or_else(|| refused(at, format!("`{at}` must be a content part object")))?;
    match object.get("type").and_then(Value::as_str) {
        Some("input_text" | "output_text") => {}
        _ => {
            return Err(refused(
                format!("{at}.type"),
                "only `input_text` and `output_text` parts are supported: onejob's chat \
                 routes take text",
            ))
        }
    }
    if let Some(member) = object.keys().find(|k| !PART_MEMBERS.contains(&k.as_str())) {
        return Err(refused(
            format!("{at}.{member}"),
            format!("`{at}.{member}` is not supported by this server"),
        ));
    }
    object.get("text").and_then(Value::as_str).ok_or_else(|| {
        refused(
            format!("{at}.text"),
            format!("`{at}.text` must be a string"),
        )
    })
}

impl ResponsesRequest {
    /// The chat request the job sends: the instructions as its system
    /// message, then the `earlier` turns (of the previous response), then
    /// this request's messages, with its chat parameters.
    pub fn chat_input(&self, earlier: &[Value]) -> Value {
        let mut messages = Vec::with_capacity(1 + earlier.len() + self.messages.len());
        if let Some(instructions) = &self.instructions {
            messages.push(json!({"role": "system", "content": instructions}));
        }
        messages.extend(earlier.iter().cloned());
        messages.extend(self.messages.iter().cloned());
        let mut body = self.chat_params.clone();
        body.insert("model".into(), json!(self.model));
        body.insert("messages".into(), Value::Array(messages));
        if self.stream {
            body.insert("stream".into(), json!(true));
        }
        Value::Object(body)
    }
}

/// The turns a response carries to the next one (`previous_response_id`):
/// its conversation without its own instructions (they are not carried
/// over), then its answer as the assistant's message.
pub fn earlier_turns(chat_input: &Value, had_instructions: bool, answer: &str) -> Vec<Value> {
    let messages = chat_input["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let skip = usize::from(had_instructions);
    let mut turns: Vec<Value> = messages.into_iter().skip(skip).collect();
    turns.push(json!({"role": "assistant", "content": answer}));
    turns
}

/// A response's `status` for its job's: `queued` until an attempt is
/// running, `in_progress` while one is out (an unknown outcome included:
/// it may yet answer), `completed` (or `incomplete` when the answer was
/// cut at the token limit), `failed`, `cancelled`.
pub fn status_of(job: JobStatus, finish_reason: Option<&str>) -> &'static str {
    match job {
        JobStatus::Pending => "queued",
        JobStatus::Running | JobStatus::Unknown => "in_progress",
        JobStatus::Succeeded if finish_reason == Some("length") => "incomplete",
        JobStatus::Succeeded => "completed",
        JobStatus::Failed => "failed",
        JobStatus::Cancelled => "cancelled",
    }
}

/// The text of a chat answer's message content: a string, or its text parts.
pub fn answer_text(result: &Value) -> String {
    match &result["message"]["content"] {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .concat(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_id_names_its_job_and_parses_back() {
        let job = JobId::new();
        let id = ResponseId::of(&job);
        let text = id.to_string();
        assert!(text.starts_with("resp_") && text.len() == 37, "{text}");
        assert_eq!(ResponseId::parse(&text), Some(id.clone()));
        assert_eq!(ResponseId::parse(&text).unwrap().job_id(), &job);
        assert!(id.message_id().starts_with("msg_"));
        for bad in [
            "",
            "resp_",
            job.as_str(),
            &format!("resp_{}", job.as_str()),
            &text[..36],
            &format!("{text}0"),
            &text.replace("resp_", "chatcmpl-"),
            "resp_zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz",
        ] {
            assert_eq!(ResponseId::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_string_input_is_one_user_message_after_the_instructions() {
        let request = read_request(&json!({"model": "m", "input": "Hi",
            "instructions": "Be brief.", "max_output_tokens": 20, "temperature": 0.5}))
        .unwrap();
        assert_eq!(
            request.chat_input(&[]),
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
        assert_eq!(
            request.chat_input(&[])["messages"],
            json!([
                {"role": "developer", "content": "Rules."},
                {"role": "user", "content": "Hello you"},
                {"role": "assistant", "content": "Hi!"},
            ])
        );
        assert_eq!(request.chat_input(&[])["stream"], true);
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
        let whole = read_request(&base(json!({"max_output_tokens": 32.0}))).unwrap();
        assert_eq!(whole.chat_input(&[])["max_tokens"], 32);
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
        let previous = json!({"model": "m", "messages": [
            {"role": "system", "content": "Old rules."},
            {"role": "user", "content": "Hi"},
        ]});
        let turns = earlier_turns(&previous, true, "Hello.");
        let request = read_request(&json!({"model": "m", "input": "And?",
            "instructions": "New rules."}))
        .unwrap();
        assert_eq!(
            request.chat_input(&turns)["messages"],
            json!([
                {"role": "system", "content": "New rules."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "And?"},
            ])
        );
    }

    #[test]
    fn statuses_are_told_in_the_responses_vocabulary() {
        assert_eq!(status_of(JobStatus::Pending, None), "queued");
        assert_eq!(status_of(JobStatus::Running, None), "in_progress");
        assert_eq!(status_of(JobStatus::Succeeded, Some("stop")), "completed");
        assert_eq!(
            status_of(JobStatus::Succeeded, Some("length")),
            "incomplete"
        );
        assert_eq!(status_of(JobStatus::Cancelled, None), "cancelled");
    }
}
