//! OpenAI's Chat Completions format, both ways: the `/v1/chat/completions`
//! door reads requests in it and writes completions and chunks; the
//! `openai` and `azure_openai` providers are written requests in it and
//! read completions, chunks and errors.
//!
//! It is also how a chat job is kept: its input is a Chat Completions
//! request (whichever door it came through), its answer a completion's
//! message with its finish reason and usage ([`StoredAnswer`]), and each
//! released piece of a streamed answer a chunk's delta ([`WireDelta`]).
//!
//! Members of a request the model has no name for are kept as
//! `openai_extras` and passed to OpenAI-format providers as they came; a
//! message member that asks for something the model cannot hold is refused
//! with its path.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use super::model::{
    Answer, ChatRequest, Content, Delta, Image, Message, OutputFormat, Part, Sampling, StopReason,
    StreamEvent, TokenCounts, Tool, ToolCall, ToolCallDelta, ToolChoice,
};
use super::wire::{decode, PathStyle, Refused, TextOr, WholeInteger, WholeNumber};

const STYLE: PathStyle = PathStyle::Brackets;

/// A Chat Completions request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub messages: Vec<WireMessage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<WireTool>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<WireToolChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<WholeNumber>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<WholeNumber>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Not OpenAI's own: the servers that take it (vLLM and the like) do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<WholeNumber>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<WholeInteger>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<TextOr<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<WireResponseFormat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<WholeNumber>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(flatten)]
    pub extras: Map<String, Value>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
}

/// One message; which members it may have depends on its role.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireMessage {
    pub role: Role,
    /// Always written: `null` for an assistant turn of tool calls only.
    #[serde(default)]
    pub content: Option<TextOr<WirePart>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<WireToolCall>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(flatten)]
    pub extras: Map<String, Value>,
}

/// A content part. A part of another type is kept as it came.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WirePart {
    Text {
        text: String,
    },
    ImageUrl {
        image_url: WireImageUrl,
    },
    #[serde(untagged)]
    Other(Map<String, Value>),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireImageUrl {
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WireToolCall {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: WireFunctionCall,
}

fn function_type() -> String {
    "function".to_owned()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WireFunctionCall {
    pub name: String,
    #[serde(default)]
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireTool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: WireFunction,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireFunction {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// `"auto"`, `"none"`, `"required"`, or one function by name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    untagged,
    expecting = "\"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": …}}"
)]
pub enum WireToolChoice {
    Mode(String),
    Function {
        #[serde(rename = "type")]
        kind: String,
        function: NamedFunction,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NamedFunction {
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WireResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: WireJsonSchema },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireJsonSchema {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// A request as the door reads it: the route it names, the call, and
/// whether a stream should end with the usage.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadRequest {
    pub route: Option<String>,
    pub request: ChatRequest,
    pub include_usage: bool,
}

/// Reads a request (a client's, or a job's stored input): what it asks, or
/// the first member that is wrong or that the model cannot hold.
pub fn read_request(body: &Value) -> Result<ReadRequest, Refused> {
    if !body.is_object() {
        return Err(Refused::new("body", "the body must be a JSON object"));
    }
    read_wire(decode(body, STYLE, "")?)
}

/// [`read_request`] from the request's JSON text, read straight into its
/// types: the JSON tree is built only to word a refusal. For a chat job's
/// input, read on every attempt, and a door's body.
pub fn read_request_text(text: &str) -> Result<ReadRequest, Refused> {
    match serde_json::from_str::<ChatCompletionRequest>(text) {
        Ok(wire) => read_wire(wire),
        // As `JsonText::value` reads it: what does not read is no object.
        Err(_) => read_request(&serde_json::from_str(text).unwrap_or(Value::Null)),
    }
}

/// A decoded request held to the rules the model keeps.
fn read_wire(wire: ChatCompletionRequest) -> Result<ReadRequest, Refused> {
    if wire.messages.is_empty() {
        return Err(Refused::new(
            "messages",
            "`messages` must be a non-empty array",
        ));
    }
    if wire.n.is_some_and(|n| n.0 != 1) {
        return Err(Refused::new("n", "`n` must be 1: one request, one answer"));
    }
    let messages = wire
        .messages
        .iter()
        .enumerate()
        .map(|(i, message)| read_message(i, message))
        .collect::<Result<Vec<_>, _>>()?;
    let tools = wire
        .tools
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, tool)| read_tool(i, tool))
        .collect::<Result<Vec<_>, _>>()?;
    let tool_choice = wire
        .tool_choice
        .as_ref()
        .map(read_tool_choice)
        .transpose()?;
    check_max_tokens(&wire)?;
    let output = read_response_format(wire.response_format.as_ref());
    let request = ChatRequest {
        messages,
        tools,
        tool_choice,
        sampling: Sampling {
            max_tokens: wire.max_completion_tokens.or(wire.max_tokens).map(|n| n.0),
            temperature: wire.temperature,
            top_p: wire.top_p,
            top_k: wire.top_k.map(|n| n.0),
            seed: wire.seed.map(|n| n.0),
            presence_penalty: wire.presence_penalty,
            frequency_penalty: wire.frequency_penalty,
        },
        stop: match wire.stop {
            None => Vec::new(),
            Some(TextOr::Text(one)) => vec![one],
            Some(TextOr::Items(list)) => list,
        },
        output,
        stream: wire.stream.unwrap_or(false),
        user: wire.user,
        // A member that is null asks for nothing.
        openai_extras: wire
            .extras
            .into_iter()
            .filter(|(_, value)| !value.is_null())
            .collect(),
    };
    Ok(ReadRequest {
        route: wire.model,
        request,
        include_usage: wire.stream_options.is_some_and(|o| o.include_usage),
    })
}

/// A token limit of 0 is refused (`max_completion_tokens` first, which
/// wins over `max_tokens`).
fn check_max_tokens(wire: &ChatCompletionRequest) -> Result<(), Refused> {
    let zero = match (wire.max_completion_tokens, wire.max_tokens) {
        (Some(WholeNumber(0)), _) => Some("max_completion_tokens"),
        (None, Some(WholeNumber(0))) => Some("max_tokens"),
        _ => None,
    };
    match zero {
        Some(member) => Err(Refused::new(
            member,
            format!("`{member}` must be a whole number, 1 or more"),
        )),
        None => Ok(()),
    }
}

fn read_response_format(format: Option<&WireResponseFormat>) -> Option<OutputFormat> {
    match format {
        None | Some(WireResponseFormat::Text) => None,
        Some(WireResponseFormat::JsonObject) => Some(OutputFormat::JsonObject),
        Some(WireResponseFormat::JsonSchema { json_schema }) => Some(OutputFormat::JsonSchema {
            name: json_schema.name.clone(),
            schema: json_schema
                .schema
                .clone()
                .unwrap_or_else(|| Value::Object(Map::new())),
            description: json_schema.description.clone(),
            strict: json_schema.strict,
        }),
    }
}

/// Whether a member the model has no name for asks for nothing (`null`,
/// an empty list): such members of a message are passed over, so that a
/// client may send back the message it was answered with.
fn asks_nothing(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

fn read_message(i: usize, message: &WireMessage) -> Result<Message, Refused> {
    let at = STYLE.join("messages", i);
    if let Some((member, _)) = message.extras.iter().find(|(_, v)| !asks_nothing(v)) {
        let param = STYLE.join(&at, member);
        return Err(Refused::new(
            param.clone(),
            format!("`{param}` is not supported by this server"),
        ));
    }
    let content = |required: bool| -> Result<Option<Content>, Refused> {
        match &message.content {
            None if required => Ok(Some(Content::Text(String::new()))),
            None => Ok(None),
            Some(content) => read_content(&STYLE.join(&at, "content"), content).map(Some),
        }
    };
    let refuse_member = |member: &str, present: bool| {
        if present {
            let param = STYLE.join(&at, member);
            Err(Refused::new(
                param.clone(),
                format!("`{param}` does not belong in a {:?} message", message.role).to_lowercase(),
            ))
        } else {
            Ok(())
        }
    };
    if message.role != Role::Assistant {
        refuse_member("tool_calls", message.tool_calls.is_some())?;
    }
    if message.role != Role::Tool {
        refuse_member("tool_call_id", message.tool_call_id.is_some())?;
    }
    let name = message.name.clone();
    Ok(match message.role {
        Role::System | Role::Developer => Message::System {
            content: content(true)?.unwrap_or(Content::Text(String::new())),
            developer: message.role == Role::Developer,
            name,
        },
        Role::User => Message::User {
            content: content(true)?.unwrap_or(Content::Text(String::new())),
            name,
        },
        Role::Assistant => Message::Assistant {
            content: content(false)?,
            tool_calls: message
                .tool_calls
                .iter()
                .flatten()
                .map(read_tool_call)
                .collect(),
            name,
        },
        Role::Tool => {
            refuse_member("name", name.is_some())?;
            let Some(call_id) = message.tool_call_id.clone() else {
                let param = STYLE.join(&at, "tool_call_id");
                return Err(Refused::new(
                    param.clone(),
                    format!("`{param}`: a tool message needs the id of the call it answers"),
                ));
            };
            Message::Tool {
                call_id,
                content: content(true)?.unwrap_or(Content::Text(String::new())),
            }
        }
    })
}

fn read_content(at: &str, content: &TextOr<WirePart>) -> Result<Content, Refused> {
    match content {
        TextOr::Text(text) => Ok(Content::Text(text.clone())),
        TextOr::Items(parts) => parts
            .iter()
            .enumerate()
            .map(|(j, part)| read_part(&STYLE.join(at, j), part))
            .collect::<Result<Vec<_>, _>>()
            .map(Content::Parts),
    }
}

fn read_part(at: &str, part: &WirePart) -> Result<Part, Refused> {
    Ok(match part {
        WirePart::Text { text } => Part::Text(text.clone()),
        WirePart::ImageUrl { image_url } => Part::Image(Image {
            url: image_url.url.clone(),
            detail: image_url.detail.clone(),
        }),
        WirePart::Other(other) => {
            // A known type that did not read as one: say what is wrong.
            let known = matches!(
                other.get("type").and_then(Value::as_str),
                Some("text" | "image_url")
            );
            if known {
                let value = Value::Object(other.clone());
                decode::<KnownPart>(&value, STYLE, at)?;
            }
            if !other.get("type").is_some_and(Value::is_string) {
                let param = STYLE.join(at, "type");
                return Err(Refused::new(
                    param.clone(),
                    format!("`{param}`: each content part needs a `type`"),
                ));
            }
            Part::OpenAiOther(Value::Object(other.clone()))
        }
    })
}

/// The parts the model has names for, read strictly (for their errors).
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[allow(dead_code)]
enum KnownPart {
    Text { text: String },
    ImageUrl { image_url: WireImageUrl },
}

fn read_tool_call(call: &WireToolCall) -> ToolCall {
    ToolCall {
        id: call.id.clone().unwrap_or_default(),
        name: call.function.name.clone(),
        arguments: call.function.arguments.clone(),
    }
}

fn read_tool(i: usize, tool: &WireTool) -> Result<Tool, Refused> {
    if tool.kind != "function" {
        let param = STYLE.join(&STYLE.join("tools", i), "type");
        return Err(Refused::new(
            param.clone(),
            format!(
                "`{param}`: onejob offers function tools only, not `{}`",
                tool.kind
            ),
        ));
    }
    Ok(Tool {
        name: tool.function.name.clone(),
        description: tool.function.description.clone(),
        parameters: tool.function.parameters.clone(),
        strict: tool.function.strict,
    })
}

fn read_tool_choice(choice: &WireToolChoice) -> Result<ToolChoice, Refused> {
    match choice {
        WireToolChoice::Mode(mode) => match mode.as_str() {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" => Ok(ToolChoice::Required),
            other => Err(Refused::new(
                "tool_choice",
                format!("`tool_choice` must be auto, none, required or a function, not `{other}`"),
            )),
        },
        WireToolChoice::Function { kind, function } if kind == "function" => {
            Ok(ToolChoice::Named(function.name.clone()))
        }
        WireToolChoice::Function { kind, .. } => Err(Refused::new(
            "tool_choice.type",
            format!("`tool_choice.type` must be `function`, not `{kind}`"),
        )),
    }
}

/// Where a written request goes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target<'a> {
    /// A job's input, for the route `route` (from a door of another
    /// format): what the client asked, nothing added.
    Input { route: &'a str },
    /// A provider, with its defaults for what the request leaves unset.
    Provider(ProviderTarget<'a>),
}

/// What a provider's request takes from the provider's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProviderTarget<'a> {
    /// The model named in the body; `None` where the URL names it (Azure's
    /// deployment).
    pub model: Option<&'a str>,
    /// Reasoning models refuse `max_tokens`; older servers know no other.
    pub max_completion_tokens: bool,
    pub default_max_tokens: u64,
    pub default_temperature: Option<f64>,
    /// Whether the answer is taken as it streams (usage asked for too).
    pub stream: bool,
}

/// The request for `request`, written for `target`. OpenAI's format
/// carries everything the model holds.
pub fn write_request(request: &ChatRequest, target: Target<'_>) -> ChatCompletionRequest {
    let sampling = &request.sampling;
    let mut wire = ChatCompletionRequest {
        messages: request.messages.iter().map(write_message).collect(),
        tools: (!request.tools.is_empty()).then(|| request.tools.iter().map(write_tool).collect()),
        tool_choice: request.tool_choice.as_ref().map(write_tool_choice),
        temperature: sampling.temperature,
        top_p: sampling.top_p,
        top_k: sampling.top_k.map(WholeNumber),
        seed: sampling.seed.map(WholeInteger),
        presence_penalty: sampling.presence_penalty,
        frequency_penalty: sampling.frequency_penalty,
        stop: (!request.stop.is_empty()).then(|| TextOr::Items(request.stop.clone())),
        response_format: request.output.as_ref().map(write_output),
        user: request.user.clone(),
        extras: request.openai_extras.clone(),
        ..ChatCompletionRequest::default()
    };
    match target {
        Target::Input { route } => {
            wire.model = Some(route.to_owned());
            wire.max_tokens = sampling.max_tokens.map(WholeNumber);
            wire.stream = request.stream.then_some(true);
        }
        Target::Provider(provider) => {
            wire.model = provider.model.map(str::to_owned);
            let limit = WholeNumber(sampling.max_tokens.unwrap_or(provider.default_max_tokens));
            if provider.max_completion_tokens {
                wire.max_completion_tokens = Some(limit);
            } else {
                wire.max_tokens = Some(limit);
            }
            wire.temperature = sampling.temperature.or(provider.default_temperature);
            if provider.stream {
                wire.stream = Some(true);
                // Usage is asked for whatever the client asked: the stored
                // answer has it, as a whole one does.
                wire.stream_options = Some(StreamOptions {
                    include_usage: true,
                });
            }
        }
    }
    wire
}

fn write_content(content: &Content) -> TextOr<WirePart> {
    match content {
        Content::Text(text) => TextOr::Text(text.clone()),
        Content::Parts(parts) => TextOr::Items(parts.iter().map(write_part).collect()),
    }
}

fn write_part(part: &Part) -> WirePart {
    match part {
        Part::Text(text) => WirePart::Text { text: text.clone() },
        Part::Image(image) => WirePart::ImageUrl {
            image_url: WireImageUrl {
                url: image.url.clone(),
                detail: image.detail.clone(),
            },
        },
        Part::OpenAiOther(Value::Object(other)) => WirePart::Other(other.clone()),
        Part::OpenAiOther(_) => WirePart::Other(Map::new()),
    }
}

fn message(role: Role, content: Option<TextOr<WirePart>>) -> WireMessage {
    WireMessage {
        role,
        content,
        name: None,
        tool_calls: None,
        tool_call_id: None,
        extras: Map::new(),
    }
}

fn write_message(turn: &Message) -> WireMessage {
    match turn {
        Message::System {
            content,
            developer,
            name,
        } => {
            let role = if *developer {
                Role::Developer
            } else {
                Role::System
            };
            WireMessage {
                name: name.clone(),
                ..message(role, Some(write_content(content)))
            }
        }
        Message::User { content, name } => WireMessage {
            name: name.clone(),
            ..message(Role::User, Some(write_content(content)))
        },
        Message::Assistant {
            content,
            tool_calls,
            name,
        } => WireMessage {
            name: name.clone(),
            tool_calls: (!tool_calls.is_empty())
                .then(|| tool_calls.iter().map(write_tool_call).collect()),
            ..message(Role::Assistant, content.as_ref().map(write_content))
        },
        Message::Tool { call_id, content } => WireMessage {
            tool_call_id: Some(call_id.clone()),
            ..message(Role::Tool, Some(write_content(content)))
        },
    }
}

pub fn write_tool_call(call: &ToolCall) -> WireToolCall {
    WireToolCall {
        id: Some(call.id.clone()),
        kind: function_type(),
        function: WireFunctionCall {
            name: call.name.clone(),
            arguments: call.arguments.clone(),
        },
    }
}

fn write_tool(tool: &Tool) -> WireTool {
    WireTool {
        kind: function_type(),
        function: WireFunction {
            name: tool.name.clone(),
            description: tool.description.clone(),
            parameters: tool.parameters.clone(),
            strict: tool.strict,
        },
    }
}

fn write_tool_choice(choice: &ToolChoice) -> WireToolChoice {
    match choice {
        ToolChoice::Auto => WireToolChoice::Mode("auto".into()),
        ToolChoice::None => WireToolChoice::Mode("none".into()),
        ToolChoice::Required => WireToolChoice::Mode("required".into()),
        ToolChoice::Named(name) => WireToolChoice::Function {
            kind: function_type(),
            function: NamedFunction { name: name.clone() },
        },
    }
}

fn write_output(output: &OutputFormat) -> WireResponseFormat {
    match output {
        OutputFormat::JsonObject => WireResponseFormat::JsonObject,
        OutputFormat::JsonSchema {
            name,
            schema,
            description,
            strict,
        } => WireResponseFormat::JsonSchema {
            json_schema: WireJsonSchema {
                name: name.clone(),
                schema: Some(schema.clone()),
                description: description.clone(),
                strict: *strict,
            },
        },
    }
}

/// A completion's usage (and a stored answer's): the counts OpenAI names,
/// and whatever else it said, as it said it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WireUsage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
    #[serde(flatten)]
    pub extras: Map<String, Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
    #[serde(flatten)]
    pub extras: Map<String, Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionTokensDetails {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u64>,
    #[serde(flatten)]
    pub extras: Map<String, Value>,
}

impl WireUsage {
    /// The counts; a lone `total_tokens` counts as the prompt's.
    pub fn counts(&self) -> Option<TokenCounts> {
        let cached = self
            .prompt_tokens_details
            .as_ref()
            .and_then(|d| d.cached_tokens)
            .unwrap_or(0);
        let reasoning = self
            .completion_tokens_details
            .as_ref()
            .and_then(|d| d.reasoning_tokens)
            .unwrap_or(0);
        match (
            self.prompt_tokens,
            self.completion_tokens,
            self.total_tokens,
        ) {
            (Some(input), output, _) => Some(TokenCounts {
                input,
                output: output.unwrap_or(0),
                cached_input: cached,
                reasoning,
            }),
            (None, _, Some(total)) => Some(TokenCounts {
                input: total,
                ..TokenCounts::default()
            }),
            (None, _, None) => None,
        }
    }

    /// The counts as OpenAI names them: the details only when there are
    /// some.
    pub fn of(counts: TokenCounts) -> Self {
        Self {
            prompt_tokens: Some(counts.input),
            completion_tokens: Some(counts.output),
            total_tokens: Some(counts.total()),
            prompt_tokens_details: (counts.cached_input > 0).then(|| PromptTokensDetails {
                cached_tokens: Some(counts.cached_input),
                extras: Map::new(),
            }),
            completion_tokens_details: (counts.reasoning > 0).then(|| CompletionTokensDetails {
                reasoning_tokens: Some(counts.reasoning),
                extras: Map::new(),
            }),
            extras: Map::new(),
        }
    }
}

/// An answer's message: its text, its tool calls, and whatever else the
/// provider put in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireAnswerMessage {
    #[serde(default = "assistant")]
    pub role: String,
    /// Always written: `null` beside tool calls.
    #[serde(default)]
    pub content: Option<TextOr<WirePart>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<WireToolCall>>,
    #[serde(flatten)]
    pub extras: Map<String, Value>,
}

fn assistant() -> String {
    "assistant".to_owned()
}

/// A chat completion as a provider answers it.
#[derive(Debug, Clone, Deserialize)]
pub struct ProviderCompletion {
    #[serde(default)]
    pub choices: Vec<ProviderChoice>,
    #[serde(default)]
    pub usage: Option<WireUsage>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ProviderChoice {
    #[serde(default)]
    pub message: Option<WireAnswerMessage>,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

/// A finish reason as a stop reason (`function_call`, OpenAI's older
/// name, is a tool call's).
pub fn read_finish_reason(reason: Option<&str>, stop_sequence: Option<String>) -> StopReason {
    match (reason, stop_sequence) {
        (_, Some(sequence)) => StopReason::StopSequence(sequence),
        (None | Some("stop"), None) => StopReason::EndTurn,
        (Some("length"), None) => StopReason::MaxTokens,
        (Some("tool_calls"), None) => StopReason::ToolUse,
        (Some("content_filter"), None) => StopReason::ContentFilter,
        (Some(other), None) => StopReason::Other(other.to_owned()),
    }
}

/// A stop reason as a finish reason.
pub fn write_finish_reason(stop: &StopReason) -> String {
    match stop {
        StopReason::EndTurn | StopReason::StopSequence(_) => "stop".into(),
        StopReason::MaxTokens => "length".into(),
        StopReason::ToolUse => "tool_calls".into(),
        StopReason::ContentFilter => "content_filter".into(),
        StopReason::Other(other) => other.clone(),
    }
}

/// The answer of a provider's completion, or why it has none.
pub fn read_answer(completion: ProviderCompletion) -> Result<Answer, String> {
    let usage = completion.usage.as_ref().and_then(WireUsage::counts);
    let choice = completion
        .choices
        .into_iter()
        .next()
        .ok_or("the response has no choice")?;
    let message = choice.message.ok_or("the response has no message")?;
    Ok(answer_of(
        message,
        choice.finish_reason.as_deref(),
        None,
        usage,
    ))
}

fn answer_of(
    message: WireAnswerMessage,
    finish_reason: Option<&str>,
    stop_sequence: Option<String>,
    usage: Option<TokenCounts>,
) -> Answer {
    let text = message.content.map(|content| match content {
        TextOr::Text(text) => text,
        TextOr::Items(parts) => parts
            .iter()
            .filter_map(|part| match part {
                WirePart::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect(),
    });
    Answer {
        text,
        tool_calls: message
            .tool_calls
            .iter()
            .flatten()
            .map(read_tool_call)
            .collect(),
        stop: read_finish_reason(finish_reason, stop_sequence),
        usage: usage.unwrap_or_default(),
        message_extras: message.extras,
    }
}

/// What the model said instead of answering, when it refused.
pub fn refusal(answer: &Answer) -> Option<&str> {
    answer.message_extras.get("refusal").and_then(Value::as_str)
}

/// A chat job's answer as it is kept: a completion's message, its finish
/// reason, its usage, and the stop sequence it stopped at when the provider
/// said (a finish reason cannot say which).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredAnswer {
    pub message: WireAnswerMessage,
    #[serde(default)]
    pub finish_reason: Option<String>,
    #[serde(default)]
    pub usage: Option<WireUsage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_sequence: Option<String>,
}

impl StoredAnswer {
    /// A job's stored answer; an answer kept in another shape reads as an
    /// empty one.
    pub fn read(stored: &Value) -> Self {
        Self::deserialize(stored).unwrap_or_else(|_| Self::of(&Answer::default()))
    }

    /// [`read`](Self::read) from a job's result as stored (`None`: no
    /// result), straight from its text.
    pub fn read_text(stored: Option<&str>) -> Self {
        stored
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or_else(|| Self::of(&Answer::default()))
    }

    /// How `answer` is kept.
    pub fn of(answer: &Answer) -> Self {
        let stop_sequence = match &answer.stop {
            StopReason::StopSequence(sequence) => Some(sequence.clone()),
            _ => None,
        };
        Self {
            message: WireAnswerMessage {
                role: assistant(),
                content: answer.text.clone().map(TextOr::Text),
                tool_calls: (!answer.tool_calls.is_empty())
                    .then(|| answer.tool_calls.iter().map(write_tool_call).collect()),
                extras: answer.message_extras.clone(),
            },
            finish_reason: Some(write_finish_reason(&answer.stop)),
            usage: Some(WireUsage::of(answer.usage)),
            stop_sequence,
        }
    }

    /// The answer it keeps.
    pub fn answer(&self) -> Answer {
        answer_of(
            self.message.clone(),
            self.finish_reason.as_deref(),
            self.stop_sequence.clone(),
            self.usage.as_ref().and_then(WireUsage::counts),
        )
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("an answer serializes")
    }
}

/// A chunk's delta, and a released piece of a streamed answer as it is
/// kept.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WireDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<WireToolCallDelta>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WireToolCallDelta {
    #[serde(default)]
    pub index: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<WireFunctionDelta>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WireFunctionDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

impl WireDelta {
    /// How a delta is written: a call's first piece (the one with its id)
    /// says it is a function's.
    pub fn of(delta: &Delta) -> Self {
        Self {
            role: None,
            content: delta.text.clone(),
            tool_calls: (!delta.tool_calls.is_empty()).then(|| {
                delta
                    .tool_calls
                    .iter()
                    .map(|call| WireToolCallDelta {
                        index: call.index,
                        id: call.id.clone(),
                        kind: call.id.as_ref().map(|_| function_type()),
                        function: (call.name.is_some() || call.arguments.is_some()).then(|| {
                            WireFunctionDelta {
                                name: call.name.clone(),
                                arguments: call.arguments.clone(),
                            }
                        }),
                    })
                    .collect()
            }),
        }
    }

    /// A kept delta, read back (one kept in another shape reads as empty).
    pub fn read(kept: &str) -> Self {
        serde_json::from_str(kept).unwrap_or_default()
    }

    pub fn delta(&self) -> Delta {
        Delta {
            text: self.content.clone().filter(|text| !text.is_empty()),
            tool_calls: self
                .tool_calls
                .iter()
                .flatten()
                .map(|call| ToolCallDelta {
                    index: call.index,
                    id: call.id.clone(),
                    name: call.function.as_ref().and_then(|f| f.name.clone()),
                    arguments: call.function.as_ref().and_then(|f| f.arguments.clone()),
                })
                .collect(),
        }
    }

    pub fn to_text(&self) -> String {
        serde_json::to_string(self).expect("a delta serializes")
    }
}

/// A chunk of a provider's stream.
#[derive(Debug, Clone, Deserialize)]
pub struct ProviderChunk {
    #[serde(default)]
    pub choices: Vec<ProviderChunkChoice>,
    #[serde(default)]
    pub usage: Option<WireUsage>,
    #[serde(default)]
    pub error: Option<WireErrorDetail>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ProviderChunkChoice {
    #[serde(default)]
    pub delta: Option<WireDelta>,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

/// What one chunk of a provider's stream says, in order.
pub fn read_chunk(data: &str) -> Result<Vec<StreamEvent>, String> {
    let chunk: ProviderChunk = serde_json::from_str(data).map_err(|e| e.to_string())?;
    if let Some(error) = chunk.error {
        return Ok(vec![StreamEvent::Failed(format!(
            "the provider ended the stream with an error: {}",
            error.message_or_default()
        ))]);
    }
    let mut events = Vec::new();
    if let Some(choice) = chunk.choices.into_iter().next() {
        if let Some(delta) = choice.delta.map(|d| d.delta()).filter(|d| !d.is_empty()) {
            events.push(StreamEvent::Delta(delta));
        }
        if let Some(reason) = choice.finish_reason {
            events.push(StreamEvent::Stop(read_finish_reason(Some(&reason), None)));
        }
    }
    if let Some(usage) = chunk.usage.as_ref().and_then(WireUsage::counts) {
        events.push(StreamEvent::Usage(usage));
    }
    Ok(events)
}

/// OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct OpenAiErrorBody {
    pub error: WireErrorDetail,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WireErrorDetail {
    #[serde(default)]
    pub message: Option<String>,
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub param: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub code: Option<Value>,
}

impl WireErrorDetail {
    pub fn message_or_default(&self) -> String {
        self.message
            .clone()
            .unwrap_or_else(|| "no message".to_owned())
    }
}

/// Azure OpenAI's error body, as far as its content filter goes: the code,
/// and the categories filtered, under `innererror` or `inner_error` and
/// `content_filter_result` or `content_filter_results` (the service and
/// its spec spell them both ways).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct AzureErrorBody {
    #[serde(default)]
    pub error: AzureError,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct AzureError {
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default, alias = "inner_error")]
    pub innererror: Option<AzureInnerError>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct AzureInnerError {
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default, alias = "content_filter_results")]
    pub content_filter_result: Option<std::collections::BTreeMap<String, FilterResult>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct FilterResult {
    #[serde(default)]
    pub filtered: bool,
    #[serde(default)]
    pub severity: Option<String>,
}

/// Why Azure's content filter refused a request, from its error body; `None`
/// when the body is not a content filter's.
pub fn azure_content_filter(body: &[u8]) -> Option<String> {
    let body: AzureErrorBody = serde_json::from_slice(body).ok()?;
    let inner = body.error.innererror.unwrap_or_default();
    let filtered = body.error.code.as_deref() == Some("content_filter")
        || inner.code.as_deref() == Some("ResponsibleAIPolicyViolation");
    if !filtered {
        return None;
    }
    let categories: Vec<String> = inner
        .content_filter_result
        .unwrap_or_default()
        .into_iter()
        .filter(|(_, result)| result.filtered)
        .map(|(category, result)| match result.severity {
            Some(severity) => format!("{category} ({severity})"),
            None => category,
        })
        .collect();
    Some(if categories.is_empty() {
        "the provider's content filter refused the request".to_owned()
    } else {
        format!(
            "the provider's content filter refused the request: {}",
            categories.join(", ")
        )
    })
}

/// `chat.completion`: a job's answer as the door gives it; `id` is
/// `chatcmpl-<job id>`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatCompletion {
    pub id: String,
    /// `chat.completion`
    pub object: String,
    pub created: i64,
    pub model: String,
    pub choices: Vec<Choice>,
    #[schema(value_type = Object)]
    pub usage: Option<WireUsage>,
    pub system_fingerprint: Option<String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Choice {
    pub index: u32,
    #[schema(value_type = Object)]
    pub message: WireAnswerMessage,
    /// As the provider gave it
    pub finish_reason: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub logprobs: Option<Value>,
}

/// Who an answer is for: the job's id, when it was made (Unix seconds) and
/// the route it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    pub id: String,
    pub created: i64,
    pub model: String,
}

/// The door's completion for a stored answer, as it was kept.
pub fn completion(subject: &Subject, stored: &StoredAnswer) -> ChatCompletion {
    ChatCompletion {
        id: subject.id.clone(),
        object: "chat.completion".into(),
        created: subject.created,
        model: subject.model.clone(),
        choices: vec![Choice {
            index: 0,
            message: stored.message.clone(),
            finish_reason: stored.finish_reason.clone(),
            logprobs: None,
        }],
        usage: stored.usage.clone(),
        system_fingerprint: None,
    }
}

/// `chat.completion.chunk`, as the door streams it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatCompletionChunk {
    pub id: String,
    /// `chat.completion.chunk`
    pub object: String,
    pub created: i64,
    pub model: String,
    pub system_fingerprint: Option<String>,
    pub choices: Vec<ChunkChoice>,
    /// `null` on every chunk but the last when usage was asked for; absent
    /// otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub usage: Option<Option<WireUsage>>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: WireDelta,
    pub finish_reason: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub logprobs: Option<Value>,
}

/// The chunks of one job's stream, as the door writes them.
#[derive(Debug, Clone)]
pub struct ChunkWriter {
    pub subject: Subject,
    pub include_usage: bool,
}

impl ChunkWriter {
    fn chunk(&self, choices: Vec<ChunkChoice>, usage: Option<Option<WireUsage>>) -> String {
        let chunk = ChatCompletionChunk {
            id: self.subject.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.subject.created,
            model: self.subject.model.clone(),
            system_fingerprint: None,
            choices,
            usage,
        };
        serde_json::to_string(&chunk).expect("a chunk serializes")
    }

    fn choice(&self, delta: WireDelta, finish_reason: Option<String>) -> String {
        let choice = ChunkChoice {
            index: 0,
            delta,
            finish_reason,
            logprobs: None,
        };
        self.chunk(vec![choice], self.include_usage.then_some(None))
    }

    /// The first chunk: the role.
    pub fn opening(&self) -> String {
        self.choice(
            WireDelta {
                role: Some(assistant()),
                content: Some(String::new()),
                tool_calls: None,
            },
            None,
        )
    }

    /// A released piece of the answer.
    pub fn delta(&self, delta: &WireDelta) -> String {
        self.choice(delta.clone(), None)
    }

    /// The finish reason.
    pub fn finish(&self, stored: &StoredAnswer) -> String {
        self.choice(WireDelta::default(), stored.finish_reason.clone())
    }

    /// The last chunk when usage was asked for: no choices, the usage.
    pub fn usage(&self, stored: &StoredAnswer) -> Option<String> {
        self.include_usage
            .then(|| self.chunk(Vec::new(), Some(stored.usage.clone())))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_request_read_from_its_text_reads_as_from_its_json_tree() {
        let user = json!([{"role": "user", "content": "hello"}]);
        for body in [
            json!({"model": "m", "messages": user, "temperature": 0.5, "stop": "x",
                   "max_tokens": 7, "stream": true, "stream_options": {"include_usage": true},
                   "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
                   "tool_choice": "auto", "logit_bias": {"5": 1}, "seed": 3}),
            json!({"model": "m", "messages": []}),
            json!({"model": "m", "messages": user, "n": 2}),
            json!({"model": "m", "messages": [{"role": "robot", "content": "x"}]}),
            json!({"model": "m", "messages": [{"role": "user", "content": 5}]}),
            json!({"model": 5, "messages": user}),
            json!({"model": "m", "messages": user, "max_tokens": 0}),
            json!({"model": "m", "messages": user, "temperature": "hot"}),
            json!([1, 2]),
            json!("text"),
        ] {
            assert_eq!(
                read_request_text(&body.to_string()),
                read_request(&body),
                "{body}"
            );
        }
        // Text that is no JSON document reads as no object, as a job's
        // input that does not read is taken.
        assert_eq!(
            read_request_text("{").unwrap_err(),
            read_request(&Value::Null).unwrap_err()
        );
    }

    fn read(body: Value) -> ChatRequest {
        read_request(&body).unwrap().request
    }

    #[test]
    fn a_request_reads_into_the_model_and_writes_back_as_it_came() {
        let body = json!({
            "model": "route",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}}]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "done"},
            ],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
            "max_tokens": 50,
            "temperature": 0.2,
            "stop": "END",
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}, "strict": true}},
            "logit_bias": {"50256": -100},
            "stream": true,
        });
        let request = read(body.clone());
        assert_eq!(request.sampling.max_tokens, Some(50));
        assert_eq!(request.stop, ["END"]);
        assert_eq!(request.tool_choice, Some(ToolChoice::Named("f".into())));
        assert!(request.stream);
        assert_eq!(request.openai_extras.len(), 1, "logit_bias is passed on");
        let written = write_request(&request, Target::Input { route: "route" });
        let mut expected = body;
        expected["stop"] = json!(["END"]);
        assert_eq!(serde_json::to_value(&written).unwrap(), expected);
    }

    #[test]
    fn a_provider_gets_its_model_its_limit_name_and_its_defaults() {
        let request =
            read(json!({"messages": [{"role": "user", "content": "Hi"}], "stream": true}));
        let target = |stream| {
            Target::Provider(ProviderTarget {
                model: Some("o3"),
                max_completion_tokens: true,
                default_max_tokens: 100,
                default_temperature: Some(0.7),
                stream,
            })
        };
        let body = serde_json::to_value(write_request(&request, target(false))).unwrap();
        assert_eq!(
            body,
            json!({"model": "o3", "messages": [{"role": "user", "content": "Hi"}],
                   "max_completion_tokens": 100, "temperature": 0.7})
        );
        let body = serde_json::to_value(write_request(&request, target(true))).unwrap();
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"], json!({"include_usage": true}));
    }

    #[test]
    fn what_is_wrong_is_refused_with_its_path() {
        for (body, param) in [
            (json!([1]), "body"),
            (json!({"messages": []}), "messages"),
            (
                json!({"messages": [{"role": "wizard", "content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"messages": [{"role": "user", "content": 7}]}),
                "messages[0].content",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]}),
                "messages[0].content[0]",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x", "audio": {"id": "a"}}]}),
                "messages[0].audio",
            ),
            (
                json!({"messages": [{"role": "tool", "content": "x"}]}),
                "messages[0].tool_call_id",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}),
                "messages[0].tool_calls",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "n": 2}),
                "n",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}),
                "max_tokens",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5}),
                "max_tokens",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}),
                "stream",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web", "function": {"name": "f"}}]}),
                "tools[0].type",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": "any"}),
                "tool_choice",
            ),
        ] {
            let refused = read_request(&body).expect_err(&body.to_string());
            assert_eq!(refused.param, param, "{body}: {}", refused.message);
        }
        // What the client was answered with may be sent back as it was.
        read(
            json!({"messages": [{"role": "assistant", "content": "x", "refusal": null, "annotations": []}]}),
        );
    }

    #[test]
    fn an_answer_is_kept_and_read_back_whole() {
        let completion: ProviderCompletion = serde_json::from_value(json!({
            "choices": [{"message": {"role": "assistant", "content": "Hi", "refusal": null}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4,
                      "prompt_tokens_details": {"cached_tokens": 2}},
        }))
        .unwrap();
        let answer = read_answer(completion).unwrap();
        assert_eq!(answer.text(), "Hi");
        assert_eq!(answer.stop, StopReason::MaxTokens);
        assert_eq!(answer.usage.cached_input, 2);
        let stored = StoredAnswer::of(&answer).to_value();
        assert_eq!(
            stored,
            json!({"message": {"role": "assistant", "content": "Hi", "refusal": null},
                   "finish_reason": "length",
                   "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4,
                             "prompt_tokens_details": {"cached_tokens": 2}}})
        );
        assert_eq!(StoredAnswer::read(&stored).answer(), answer);
    }

    #[test]
    fn an_old_stored_answer_is_shown_as_it_was_kept() {
        let kept = json!({"message": {"role": "assistant", "content": "Hi", "annotations": []},
                          "finish_reason": "stop",
                          "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2,
                                    "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0}}});
        let subject = Subject {
            id: "chatcmpl-x".into(),
            created: 5,
            model: "m".into(),
        };
        let shown = serde_json::to_value(completion(&subject, &StoredAnswer::read(&kept))).unwrap();
        assert_eq!(shown["choices"][0]["message"], kept["message"]);
        assert_eq!(shown["usage"], kept["usage"]);
    }

    #[test]
    fn chunks_read_into_events() {
        let events = read_chunk(
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f","arguments":""}}]},"finish_reason":null}]}"#,
        )
        .unwrap();
        assert_eq!(
            events,
            [StreamEvent::Delta(Delta {
                text: None,
                tool_calls: vec![ToolCallDelta {
                    index: 0,
                    id: Some("c1".into()),
                    name: Some("f".into()),
                    arguments: Some(String::new()),
                }],
            })]
        );
        let events =
            read_chunk(r#"{"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":3}}"#)
                .unwrap();
        assert!(matches!(
            events[..],
            [StreamEvent::Usage(TokenCounts {
                input: 2,
                output: 3,
                ..
            })]
        ));
        let events = read_chunk(r#"{"error":{"message":"overloaded"}}"#).unwrap();
        assert_eq!(
            events,
            [StreamEvent::Failed(
                "the provider ended the stream with an error: overloaded".into()
            )]
        );
    }
}
