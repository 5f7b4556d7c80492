//! Anthropic's Messages format, both ways: the `/v1/messages` door reads
//! requests in it and writes messages, stream events and errors; the
//! `anthropic` provider is written requests in it and reads messages,
//! stream events and errors.
//!
//! What the door takes: text, image, `tool_use` and `tool_result` blocks;
//! the client's own tools; `system`, `max_tokens`, `temperature`, `top_p`,
//! `top_k`, `stop_sequences`, `stream`, and `metadata` (about the caller:
//! kept with the job, not passed on). Any other member is refused with its
//! path. Blocks' prompt-caching hints (`cache_control`) are not passed on.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use super::model::{
    Answer, CannotCarry, ChatRequest, Content, Delta, Image, Message, OutputFormat, Part, Sampling,
    StopReason, StreamEvent, TokenCounts, Tool, ToolCall, ToolCallDelta, ToolChoice,
};
use super::wire::{decode, PathStyle, Refused, TextOr, WholeNumber};

const STYLE: PathStyle = PathStyle::Dots;

/// The most messages, and content blocks in all, one request may carry.
pub const MAX_MESSAGES: usize = 10_000;
pub const MAX_BLOCKS: usize = 100_000;
/// The most stop sequences (Anthropic's own limit is far lower).
pub const MAX_STOP_SEQUENCES: usize = 64;
/// The most tools one request may offer.
pub const MAX_TOOLS: usize = 128;

/// A Messages request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MessagesRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<WireTurn>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<TextOr<Block>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<WholeNumber>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_sequences: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<WireTool>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<WireToolChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    /// Structured output (the structured-outputs beta).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_format: Option<WireOutputFormat>,
    #[serde(flatten)]
    pub extras: Map<String, Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireOutputFormat {
    #[serde(rename = "type")]
    pub kind: String,
    pub schema: Value,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TurnRole {
    User,
    Assistant,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireTurn {
    pub role: TurnRole,
    #[serde(default)]
    pub content: Option<TextOr<Block>>,
}

/// A content block of a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    Text {
        text: String,
    },
    Image {
        source: ImageSource,
    },
    ToolUse {
        id: String,
        name: String,
        input: Map<String, Value>,
    },
    ToolResult {
        tool_use_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<TextOr<Block>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        is_error: Option<bool>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ImageSource {
    Base64 { media_type: String, data: String },
    Url { url: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireTool {
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "type",
    rename_all = "snake_case",
    expecting = "{\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": \"none\"} or {\"type\": \"tool\", \"name\": …}"
)]
pub enum WireToolChoice {
    Auto,
    Any,
    None,
    Tool { name: String },
}

/// A Messages request as the door reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadRequest {
    pub route: String,
    pub request: ChatRequest,
}

fn refused(param: impl Into<String>, message: impl std::fmt::Display) -> Refused {
    let param = param.into();
    Refused {
        message: format!("{param}: {message}"),
        param,
    }
}

/// Counts blocks down against the request's allowance.
struct Allowance(usize);

impl Allowance {
    fn take(&mut self) -> Result<(), Refused> {
        self.0 = self.0.checked_sub(1).ok_or_else(|| {
            Refused::new(
                "messages",
                format!("a request may have at most {MAX_BLOCKS} content blocks"),
            )
        })?;
        Ok(())
    }
}

/// Reads a client's Messages request: what it asks, or the first member
/// that is wrong or that onejob does not carry.
pub fn read_request(body: &Value) -> Result<ReadRequest, Refused> {
    if !body.is_object() {
        return Err(Refused::new("body", "the body must be a JSON object"));
    }
    let wire: MessagesRequest = decode(body, STYLE, "")?;
    if let Some(member) = wire.extras.keys().next() {
        return Err(refused(
            member.as_str(),
            "onejob's /v1/messages does not take this member",
        ));
    }
    let route = match &wire.model {
        Some(Value::String(model)) if !model.is_empty() => model.clone(),
        _ => return Err(refused("model", "Field required (a chat route's name)")),
    };
    let max_tokens = match &wire.max_tokens {
        None => return Err(refused("max_tokens", "Field required")),
        Some(value) => WholeNumber::of(value)
            .filter(|n| *n >= 1)
            .ok_or_else(|| refused("max_tokens", "must be a whole number, 1 or more"))?,
    };
    let messages = read_messages(&wire)?;
    for (name, value) in [("temperature", wire.temperature), ("top_p", wire.top_p)] {
        if value.is_some_and(|v| v < 0.0) {
            return Err(refused(name, "must be a number, 0 or more"));
        }
    }
    let stop = wire.stop_sequences.clone().unwrap_or_default();
    if stop.len() > MAX_STOP_SEQUENCES {
        return Err(refused(
            "stop_sequences",
            format!("must be an array of at most {MAX_STOP_SEQUENCES} strings"),
        ));
    }
    let tools = read_tools(wire.tools.as_deref())?;
    let output = read_output_format(wire.output_format.as_ref())?;
    let request = ChatRequest {
        messages,
        tools,
        tool_choice: wire.tool_choice.as_ref().map(read_tool_choice),
        sampling: Sampling {
            max_tokens: Some(max_tokens),
            temperature: wire.temperature,
            top_p: wire.top_p,
            top_k: wire.top_k.map(|n| n.0),
            ..Sampling::default()
        },
        stop,
        output,
        stream: wire.stream.unwrap_or(false),
        user: None,
        openai_extras: Map::new(),
    };
    Ok(ReadRequest { route, request })
}

/// The conversation: the `system` prompt as a system message, then each
/// turn's messages.
fn read_messages(wire: &MessagesRequest) -> Result<Vec<Message>, Refused> {
    let turns = match &wire.messages {
        None => return Err(refused("messages", "Field required (an array of messages)")),
        Some(turns) if turns.is_empty() => {
            return Err(refused("messages", "at least one message is required"))
        }
        Some(turns) if turns.len() > MAX_MESSAGES => {
            return Err(refused(
                "messages",
                format!("at most {MAX_MESSAGES} messages"),
            ))
        }
        Some(turns) => turns,
    };
    let mut allowance = Allowance(MAX_BLOCKS);
    let mut messages = Vec::new();
    if let Some(system) = &wire.system {
        let text = texts(system, "system", &mut allowance)?;
        messages.push(Message::System {
            content: Content::Text(text.join("\n\n")),
            developer: false,
            name: None,
        });
    }
    for (i, turn) in turns.iter().enumerate() {
        let at = STYLE.join("messages", i);
        let Some(content) = &turn.content else {
            return Err(refused(STYLE.join(&at, "content"), "Field required"));
        };
        read_turn(
            turn.role,
            content,
            &STYLE.join(&at, "content"),
            &mut allowance,
            &mut messages,
        )?;
    }
    Ok(messages)
}

fn read_tools(tools: Option<&[WireTool]>) -> Result<Vec<Tool>, Refused> {
    match tools {
        None => Ok(Vec::new()),
        Some(tools) if tools.len() > MAX_TOOLS => Err(refused(
            "tools",
            format!("must be an array of at most {MAX_TOOLS} tools"),
        )),
        Some(tools) => tools
            .iter()
            .enumerate()
            .map(|(i, tool)| read_tool(i, tool))
            .collect(),
    }
}

fn read_output_format(format: Option<&WireOutputFormat>) -> Result<Option<OutputFormat>, Refused> {
    match format {
        None => Ok(None),
        Some(format) if format.kind == "json_schema" && format.schema.is_object() => {
            Ok(Some(OutputFormat::JsonSchema {
                name: "output".into(),
                schema: format.schema.clone(),
                description: None,
                strict: Some(true),
            }))
        }
        Some(_) => Err(refused(
            "output_format",
            "must be {\"type\": \"json_schema\", \"schema\": {…}}",
        )),
    }
}

/// The texts of a `system` prompt or a tool result: a string, or text
/// blocks.
fn texts(
    content: &TextOr<Block>,
    at: &str,
    allowance: &mut Allowance,
) -> Result<Vec<String>, Refused> {
    match content {
        TextOr::Text(text) => Ok(vec![text.clone()]),
        TextOr::Items(blocks) => blocks
            .iter()
            .enumerate()
            .map(|(i, block)| {
                allowance.take()?;
                match block {
                    Block::Text { text } => Ok(text.clone()),
                    _ => Err(refused(
                        STYLE.join(&STYLE.join(at, i), "type"),
                        "only text blocks are taken here",
                    )),
                }
            })
            .collect(),
    }
}

fn read_image(source: &ImageSource) -> Image {
    let url = match source {
        ImageSource::Base64 { media_type, data } => format!("data:{media_type};base64,{data}"),
        ImageSource::Url { url } => url.clone(),
    };
    Image { url, detail: None }
}

/// One turn as the model's messages: a user's `tool_result` blocks become
/// tool messages (before the turn's other blocks, which follow them); an
/// assistant's `tool_use` blocks its tool calls.
fn read_turn(
    role: TurnRole,
    content: &TextOr<Block>,
    at: &str,
    allowance: &mut Allowance,
    messages: &mut Vec<Message>,
) -> Result<(), Refused> {
    let blocks = match content {
        TextOr::Text(text) => {
            messages.push(text_turn(role, text));
            return Ok(());
        }
        TextOr::Items(blocks) => blocks,
    };
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    let mut results = 0;
    for (i, block) in blocks.iter().enumerate() {
        let at = STYLE.join(at, i);
        allowance.take()?;
        match (role, block) {
            (_, Block::Text { text }) => parts.push(Part::Text(text.clone())),
            (TurnRole::User, Block::Image { source }) => {
                parts.push(Part::Image(read_image(source)))
            }
            (TurnRole::Assistant, Block::Image { .. }) => return misplaced(role, "image", &at),
            (TurnRole::Assistant, Block::ToolUse { id, name, input }) => calls.push(ToolCall {
                id: id.clone(),
                name: name.clone(),
                arguments: Value::Object(input.clone()).to_string(),
            }),
            (TurnRole::User, Block::ToolUse { .. }) => return misplaced(role, "tool_use", &at),
            (
                TurnRole::User,
                Block::ToolResult {
                    tool_use_id,
                    content,
                    is_error,
                },
            ) => {
                // Tool results go first: the turn's other blocks follow them.
                messages.push(read_tool_result(
                    tool_use_id,
                    content.as_ref(),
                    *is_error,
                    &at,
                    allowance,
                )?);
                results += 1;
            }
            (TurnRole::Assistant, Block::ToolResult { .. }) => {
                return misplaced(role, "tool_result", &at)
            }
        }
    }
    messages.extend(blocks_turn(role, parts, calls, results));
    Ok(())
}

/// A turn whose content is a string.
fn text_turn(role: TurnRole, text: &str) -> Message {
    match role {
        TurnRole::User => Message::User {
            content: Content::Text(text.to_owned()),
            name: None,
        },
        TurnRole::Assistant => Message::Assistant {
            content: Some(Content::Text(text.to_owned())),
            tool_calls: Vec::new(),
            name: None,
        },
    }
}

/// The refusal of a `kind` block in a turn of `role`, at `at`.
fn misplaced(role: TurnRole, kind: &str, at: &str) -> Result<(), Refused> {
    let role = match role {
        TurnRole::User => "user",
        TurnRole::Assistant => "assistant",
    };
    Err(refused(
        STYLE.join(at, "type"),
        format!("a {kind} block does not belong in a {role} turn"),
    ))
}

/// A user's `tool_result` block, as a tool message.
fn read_tool_result(
    tool_use_id: &str,
    content: Option<&TextOr<Block>>,
    is_error: Option<bool>,
    at: &str,
    allowance: &mut Allowance,
) -> Result<Message, Refused> {
    if is_error == Some(true) {
        return Err(refused(
            STYLE.join(at, "is_error"),
            "onejob cannot pass on that a tool failed: say so in the result's text",
        ));
    }
    let text = match content {
        None => String::new(),
        Some(content) => texts(content, &STYLE.join(at, "content"), allowance)?.join("\n\n"),
    };
    Ok(Message::Tool {
        call_id: tool_use_id.to_owned(),
        content: Content::Text(text),
    })
}

/// The message a turn of blocks leaves besides its tool results: an
/// assistant's text and tool calls; a user's parts, unless the turn held
/// only tool results.
fn blocks_turn(
    role: TurnRole,
    parts: Vec<Part>,
    calls: Vec<ToolCall>,
    results: usize,
) -> Option<Message> {
    match role {
        TurnRole::Assistant if !calls.is_empty() => {
            let text = Content::Parts(parts).text("\n\n");
            Some(Message::Assistant {
                content: (!text.is_empty()).then_some(Content::Text(text)),
                tool_calls: calls,
                name: None,
            })
        }
        TurnRole::Assistant => Some(Message::Assistant {
            content: Some(Content::Parts(parts)),
            tool_calls: Vec::new(),
            name: None,
        }),
        TurnRole::User if !parts.is_empty() || results == 0 => Some(Message::User {
            content: Content::Parts(parts),
            name: None,
        }),
        TurnRole::User => None,
    }
}

fn read_tool(i: usize, tool: &WireTool) -> Result<Tool, Refused> {
    let at = STYLE.join("tools", i);
    if tool.kind.as_deref().is_some_and(|kind| kind != "custom") {
        return Err(refused(
            STYLE.join(&at, "type"),
            "onejob offers the client's own tools only (`custom`), not Anthropic's server tools",
        ));
    }
    let Some(schema) = tool.input_schema.clone().filter(|_| !tool.name.is_empty()) else {
        return Err(refused(
            at,
            "a tool needs a `name` and an `input_schema` object",
        ));
    };
    Ok(Tool {
        name: tool.name.clone(),
        description: tool.description.clone(),
        parameters: Some(Value::Object(schema)),
        strict: None,
    })
}

fn read_tool_choice(choice: &WireToolChoice) -> ToolChoice {
    match choice {
        WireToolChoice::Auto => ToolChoice::Auto,
        WireToolChoice::Any => ToolChoice::Required,
        WireToolChoice::None => ToolChoice::None,
        WireToolChoice::Tool { name } => ToolChoice::Named(name.clone()),
    }
}

/// A request written for Anthropic, and whether it needs the
/// structured-outputs beta.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    pub body: MessagesRequest,
    pub structured_outputs_beta: bool,
}

/// What the provider's request takes from its settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProviderTarget<'a> {
    pub model: &'a str,
    pub default_max_tokens: u64,
    pub default_temperature: Option<f64>,
    pub stream: bool,
}

fn cannot(what: impl std::fmt::Display) -> CannotCarry {
    CannotCarry(format!("Anthropic's Messages API cannot carry {what}"))
}

/// The request for `request`, or what of it Anthropic cannot carry.
pub fn write_request(
    request: &ChatRequest,
    target: ProviderTarget<'_>,
) -> Result<Written, CannotCarry> {
    if let Some(member) = request.openai_extras.keys().next() {
        return Err(cannot(format!("`{member}`")));
    }
    let sampling = &request.sampling;
    for (name, set) in [
        ("seed", sampling.seed.is_some()),
        ("presence_penalty", sampling.presence_penalty.is_some()),
        ("frequency_penalty", sampling.frequency_penalty.is_some()),
    ] {
        if set {
            return Err(cannot(format!("`{name}`")));
        }
    }
    let (system, turns) = write_conversation(&request.messages)?;
    let strict_tools = request.tools.iter().any(|tool| tool.strict == Some(true));
    let output_format = write_output_format(request.output.as_ref())?;
    let body = MessagesRequest {
        model: Some(Value::String(target.model.to_owned())),
        messages: Some(turns),
        max_tokens: Some(Value::from(
            sampling.max_tokens.unwrap_or(target.default_max_tokens),
        )),
        system: (!system.is_empty()).then(|| TextOr::Text(system.join("\n\n"))),
        stream: target.stream.then_some(true),
        temperature: sampling.temperature.or(target.default_temperature),
        top_p: sampling.top_p,
        top_k: sampling.top_k.map(WholeNumber),
        stop_sequences: (!request.stop.is_empty()).then(|| request.stop.clone()),
        tools: (!request.tools.is_empty()).then(|| request.tools.iter().map(write_tool).collect()),
        tool_choice: request.tool_choice.as_ref().map(write_tool_choice),
        metadata: request.user.as_ref().map(|user| Metadata {
            user_id: Some(user.clone()),
        }),
        output_format,
        extras: Map::new(),
    };
    Ok(Written {
        structured_outputs_beta: body.output_format.is_some() || strict_tools,
        body,
    })
}

/// The system prompts' texts and the turns of the conversation.
fn write_conversation(messages: &[Message]) -> Result<(Vec<String>, Vec<WireTurn>), CannotCarry> {
    let mut system = Vec::new();
    let mut turns: Vec<WireTurn> = Vec::new();
    for message in messages {
        match message {
            Message::System { content, name, .. } => {
                if name.is_some() {
                    return Err(cannot("a message's `name`"));
                }
                system.push(text_only(content, "a system message")?);
            }
            Message::User { content, name } => {
                if name.is_some() {
                    return Err(cannot("a message's `name`"));
                }
                turns.push(WireTurn {
                    role: TurnRole::User,
                    content: Some(write_content(content)?),
                });
            }
            Message::Assistant {
                content,
                tool_calls,
                name,
            } => {
                if name.is_some() {
                    return Err(cannot("a message's `name`"));
                }
                turns.push(write_assistant(content.as_ref(), tool_calls)?);
            }
            Message::Tool { call_id, content } => {
                let result = Block::ToolResult {
                    tool_use_id: call_id.clone(),
                    content: Some(TextOr::Text(text_only(content, "a tool result")?)),
                    is_error: None,
                };
                push_tool_result(&mut turns, result);
            }
        }
    }
    Ok((system, turns))
}

/// Adds a tool result to the turns: the results of one round of calls share
/// one user turn.
fn push_tool_result(turns: &mut Vec<WireTurn>, result: Block) {
    match turns.last_mut() {
        Some(WireTurn {
            role: TurnRole::User,
            content: Some(TextOr::Items(blocks)),
        }) if matches!(blocks.first(), Some(Block::ToolResult { .. })) => blocks.push(result),
        _ => turns.push(WireTurn {
            role: TurnRole::User,
            content: Some(TextOr::Items(vec![result])),
        }),
    }
}

fn write_output_format(
    output: Option<&OutputFormat>,
) -> Result<Option<WireOutputFormat>, CannotCarry> {
    match output {
        None => Ok(None),
        Some(OutputFormat::JsonSchema { schema, .. }) => Ok(Some(WireOutputFormat {
            kind: "json_schema".into(),
            schema: schema.clone(),
        })),
        Some(OutputFormat::JsonObject) => Err(cannot(
            "`response_format` `json_object` (it takes a JSON schema)",
        )),
    }
}

/// The text of content that must be text alone (a system prompt, a tool
/// result): another part is refused, not dropped.
fn text_only(content: &Content, what: &str) -> Result<String, CannotCarry> {
    content
        .text_only()
        .ok_or_else(|| cannot(format!("a part other than text in {what}")))
}

fn write_content(content: &Content) -> Result<TextOr<Block>, CannotCarry> {
    match content {
        Content::Text(text) => Ok(TextOr::Text(text.clone())),
        Content::Parts(parts) => parts
            .iter()
            .map(write_part)
            .collect::<Result<_, _>>()
            .map(TextOr::Items),
    }
}

fn write_part(part: &Part) -> Result<Block, CannotCarry> {
    match part {
        Part::Text(text) => Ok(Block::Text { text: text.clone() }),
        Part::Image(image) => Ok(Block::Image {
            source: match image.inline() {
                Some((media_type, data)) => ImageSource::Base64 {
                    media_type: media_type.to_owned(),
                    data: data.to_owned(),
                },
                None => ImageSource::Url {
                    url: image.url.clone(),
                },
            },
        }),
        Part::OpenAiOther(_) => Err(cannot("a content part other than text or an image")),
    }
}

/// An assistant turn: its text, and a `tool_use` block for each call.
fn write_assistant(content: Option<&Content>, calls: &[ToolCall]) -> Result<WireTurn, CannotCarry> {
    let content = match (content, calls.is_empty()) {
        (Some(content), true) => write_content(content)?,
        (None, true) => TextOr::Text(String::new()),
        (content, false) => {
            let mut blocks = Vec::new();
            let text = content.map(|c| c.text("")).unwrap_or_default();
            if !text.is_empty() {
                blocks.push(Block::Text { text });
            }
            for call in calls {
                let Value::Object(input) = call.input() else {
                    unreachable!("ToolCall::input is an object")
                };
                blocks.push(Block::ToolUse {
                    id: call.id.clone(),
                    name: call.name.clone(),
                    input,
                });
            }
            TextOr::Items(blocks)
        }
    };
    Ok(WireTurn {
        role: TurnRole::Assistant,
        content: Some(content),
    })
}

fn write_tool(tool: &Tool) -> WireTool {
    let schema = match tool.parameters_or_any() {
        Value::Object(schema) => schema,
        _ => Map::new(),
    };
    WireTool {
        kind: None,
        name: tool.name.clone(),
        description: tool.description.clone(),
        input_schema: Some(schema),
        strict: tool.strict.filter(|strict| *strict),
    }
}

fn write_tool_choice(choice: &ToolChoice) -> WireToolChoice {
    match choice {
        ToolChoice::Auto => WireToolChoice::Auto,
        ToolChoice::Required => WireToolChoice::Any,
        ToolChoice::None => WireToolChoice::None,
        ToolChoice::Named(name) => WireToolChoice::Tool { name: name.clone() },
    }
}

/// Anthropic's usage: the prompt is `input_tokens` plus what was written to
/// and read from the cache; the cached tokens are those read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WireUsage {
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_creation_input_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_input_tokens: Option<u64>,
}

impl WireUsage {
    pub fn counts(&self) -> TokenCounts {
        let read = self.cache_read_input_tokens.unwrap_or(0);
        TokenCounts {
            input: self.input_tokens + self.cache_creation_input_tokens.unwrap_or(0) + read,
            output: self.output_tokens,
            cached_input: read,
            reasoning: 0,
        }
    }

    /// As the door shows it.
    fn of(counts: TokenCounts) -> Self {
        Self {
            input_tokens: counts.input,
            output_tokens: counts.output,
            ..Self::default()
        }
    }
}

/// A message as the provider answers it.
#[derive(Debug, Clone, Deserialize)]
pub struct ProviderMessage {
    #[serde(default)]
    pub content: Vec<AnswerBlock>,
    #[serde(default)]
    pub stop_reason: Option<String>,
    #[serde(default)]
    pub stop_sequence: Option<String>,
    #[serde(default)]
    pub usage: WireUsage,
}

/// A block of an answer; thinking and server-tool blocks are not part of
/// the answer.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AnswerBlock {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Value,
    },
    #[serde(other)]
    Other,
}

/// A stop reason as Anthropic says it (and the sequence it met).
fn read_stop(reason: Option<&str>, sequence: Option<String>) -> StopReason {
    match (reason, sequence) {
        (Some("stop_sequence"), Some(sequence)) => StopReason::StopSequence(sequence),
        (Some("max_tokens"), _) => StopReason::MaxTokens,
        (Some("tool_use"), _) => StopReason::ToolUse,
        (Some("refusal"), _) => StopReason::ContentFilter,
        _ => StopReason::EndTurn,
    }
}

/// The answer out of a provider's message.
pub fn read_answer(message: ProviderMessage) -> Answer {
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for block in message.content {
        match block {
            AnswerBlock::Text { text: piece } => text.push_str(&piece),
            AnswerBlock::ToolUse { id, name, input } => tool_calls.push(ToolCall {
                id,
                name,
                arguments: if input.is_null() {
                    "{}".to_owned()
                } else {
                    input.to_string()
                },
            }),
            AnswerBlock::Other => {}
        }
    }
    Answer {
        text: (!text.is_empty() || tool_calls.is_empty()).then_some(text),
        tool_calls,
        stop: read_stop(message.stop_reason.as_deref(), message.stop_sequence),
        usage: message.usage.counts(),
        message_extras: Map::new(),
    }
}

/// An event of a provider's stream.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ProviderEvent {
    MessageStart {
        message: StartedMessage,
    },
    ContentBlockStart {
        #[serde(default)]
        index: u64,
        content_block: StartedBlock,
    },
    ContentBlockDelta {
        #[serde(default)]
        index: u64,
        delta: BlockDelta,
    },
    MessageDelta {
        #[serde(default)]
        delta: StopDelta,
        #[serde(default)]
        usage: DeltaUsage,
    },
    MessageStop,
    Error {
        error: ErrorDetail,
    },
    #[serde(other)]
    Other,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct StartedMessage {
    #[serde(default)]
    usage: WireUsage,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum StartedBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockDelta {
    TextDelta {
        text: String,
    },
    InputJsonDelta {
        partial_json: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct StopDelta {
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    stop_sequence: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct DeltaUsage {
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

/// Anthropic's stream, read event by event. It remembers what the events
/// spread out: the prompt's tokens (told in `message_start`, needed with
/// the output's in `message_delta`) and which content block is which tool
/// call.
#[derive(Debug, Default)]
pub struct EventReader {
    input: TokenCounts,
    /// `(content block index, tool call index)`.
    tools: Vec<(u64, usize)>,
}

impl super::StreamReader for EventReader {
    fn read(&mut self, name: &str, data: &str) -> Result<Vec<StreamEvent>, super::StreamError> {
        let mut value: Value =
            serde_json::from_str(data).map_err(|e| super::StreamError::Garbled(e.to_string()))?;
        // An event's data may leave its type to the event's name.
        if let Value::Object(object) = &mut value {
            if !object.contains_key("type") && !name.is_empty() && name != "message" {
                object.insert("type".into(), Value::String(name.to_owned()));
            }
        }
        let event: ProviderEvent = serde_json::from_value(value).map_err(|e| {
            super::StreamError::Invalid(format!("an event of the wrong shape: {e}"))
        })?;
        self.event(event).map_err(super::StreamError::Invalid)
    }
}

impl EventReader {
    fn event(&mut self, event: ProviderEvent) -> Result<Vec<StreamEvent>, String> {
        match event {
            ProviderEvent::MessageStart { message } => {
                self.input = message.usage.counts();
                Ok(Vec::new())
            }
            ProviderEvent::ContentBlockStart {
                index,
                content_block,
            } => self.block_started(index, content_block),
            ProviderEvent::ContentBlockDelta { index, delta } => self.block_delta(index, delta),
            ProviderEvent::MessageDelta { delta, usage } => Ok(self.message_delta(delta, usage)),
            ProviderEvent::MessageStop => Ok(vec![StreamEvent::Done]),
            ProviderEvent::Error { error } => Ok(vec![StreamEvent::Failed(format!(
                "the provider ended the stream with an error: {}",
                error.message.as_deref().unwrap_or("no message")
            ))]),
            ProviderEvent::Other => Ok(Vec::new()),
        }
    }

    /// A content block begins: text, or a tool call (remembered by its
    /// block's index).
    fn block_started(
        &mut self,
        index: u64,
        block: StartedBlock,
    ) -> Result<Vec<StreamEvent>, String> {
        match block {
            StartedBlock::Text { text } if !text.is_empty() => piece(Delta::text(text)),
            StartedBlock::ToolUse { id, name } => {
                let call = self.tools.len();
                if call >= super::assembly::MAX_TOOL_CALLS {
                    return Err(format!(
                        "the stream has more than {} tool calls",
                        super::assembly::MAX_TOOL_CALLS
                    ));
                }
                self.tools.push((index, call));
                // The arguments arrive as `input_json_delta`s.
                piece(Delta {
                    text: None,
                    tool_calls: vec![ToolCallDelta {
                        index: call,
                        id: Some(id),
                        name: Some(name),
                        arguments: Some(String::new()),
                    }],
                })
            }
            _ => Ok(Vec::new()),
        }
    }

    /// More of a content block: text, or a piece of a tool call's arguments.
    fn block_delta(&self, index: u64, delta: BlockDelta) -> Result<Vec<StreamEvent>, String> {
        match delta {
            BlockDelta::TextDelta { text } if !text.is_empty() => piece(Delta::text(text)),
            BlockDelta::InputJsonDelta { partial_json } => {
                let Some(&(_, call)) = self.tools.iter().find(|(block, _)| *block == index) else {
                    return Err(format!(
                        "the stream sent tool input for block {index}, which is no tool call"
                    ));
                };
                if partial_json.is_empty() {
                    return Ok(Vec::new());
                }
                piece(Delta {
                    text: None,
                    tool_calls: vec![ToolCallDelta {
                        index: call,
                        arguments: Some(partial_json),
                        ..ToolCallDelta::default()
                    }],
                })
            }
            _ => Ok(Vec::new()),
        }
    }

    /// The message's end: why it stopped, and its usage.
    fn message_delta(&mut self, delta: StopDelta, usage: DeltaUsage) -> Vec<StreamEvent> {
        // Newer servers repeat the prompt's tokens here, the cache's
        // with them: counted as a whole message's are.
        if let Some(input_tokens) = usage.input_tokens {
            self.input = WireUsage {
                input_tokens,
                output_tokens: 0,
                cache_creation_input_tokens: usage.cache_creation_input_tokens,
                cache_read_input_tokens: usage.cache_read_input_tokens,
            }
            .counts();
        }
        vec![
            StreamEvent::Stop(read_stop(delta.stop_reason.as_deref(), delta.stop_sequence)),
            StreamEvent::Usage(TokenCounts {
                output: usage.output_tokens,
                ..self.input
            }),
        ]
    }
}

/// One delta, as the events it makes.
fn piece(delta: Delta) -> Result<Vec<StreamEvent>, String> {
    Ok(vec![StreamEvent::Delta(delta)])
}

/// Anthropic's error detail: `{"type", "message"}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// invalid_request_error, authentication_error, permission_error,
    /// not_found_error, request_too_large, rate_limit_error, api_error or
    /// overloaded_error
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
}

/// Anthropic's error body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AnthropicErrorBody {
    /// Always `error`
    #[serde(rename = "type")]
    pub kind: String,
    pub error: ErrorDetail,
}

/// Anthropic's error `type` for a status.
pub fn error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        500.. | 424 => "api_error",
        _ => "invalid_request_error",
    }
}

/// The error body for a refusal with `status` and `message`.
pub fn error_body(status: u16, message: &str) -> AnthropicErrorBody {
    AnthropicErrorBody {
        kind: "error".into(),
        error: ErrorDetail {
            kind: Some(error_type(status).to_owned()),
            message: Some(message.to_owned()),
        },
    }
}

/// A content block of the door's answer.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutBlock {
    Text {
        text: String,
    },
    ToolUse {
        id: Option<String>,
        name: String,
        #[schema(value_type = Object)]
        input: Value,
    },
}

/// `message`: a job's answer as the door gives it; `id` is `msg_<job id>`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct MessageObject {
    pub id: String,
    /// `message`
    #[serde(rename = "type")]
    pub kind: String,
    pub role: String,
    pub model: String,
    pub content: Vec<OutBlock>,
    /// end_turn, stop_sequence, max_tokens, tool_use or refusal
    pub stop_reason: Option<String>,
    pub stop_sequence: Option<String>,
    pub usage: DoorUsage,
}

/// The usage the door shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct DoorUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl DoorUsage {
    fn of(counts: TokenCounts) -> Self {
        let usage = WireUsage::of(counts);
        Self {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
        }
    }
}

/// An answer's `stop_reason` and `stop_sequence` for the door.
pub fn write_stop(stop: &StopReason) -> (&'static str, Option<String>) {
    match stop {
        StopReason::StopSequence(sequence) => ("stop_sequence", Some(sequence.clone())),
        StopReason::MaxTokens => ("max_tokens", None),
        StopReason::ToolUse => ("tool_use", None),
        StopReason::Other(other) if other == "function_call" => ("tool_use", None),
        StopReason::ContentFilter => ("refusal", None),
        StopReason::EndTurn | StopReason::Other(_) => ("end_turn", None),
    }
}

/// Who an answer is for: `msg_<job id>`, and the route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    pub id: String,
    pub model: String,
}

/// The door's `message` for an answer.
pub fn message(subject: &Subject, answer: &Answer) -> MessageObject {
    let mut content = Vec::new();
    if !answer.text().is_empty() {
        content.push(OutBlock::Text {
            text: answer.text().to_owned(),
        });
    }
    for call in &answer.tool_calls {
        content.push(OutBlock::ToolUse {
            id: Some(call.id.clone()),
            name: call.name.clone(),
            input: call.input(),
        });
    }
    let (stop_reason, stop_sequence) = write_stop(&answer.stop);
    MessageObject {
        content,
        stop_reason: Some(stop_reason.to_owned()),
        stop_sequence,
        usage: DoorUsage::of(answer.usage),
        ..started(subject)
    }
}

/// The message as a stream starts: no content, no stop, no usage yet.
fn started(subject: &Subject) -> MessageObject {
    MessageObject {
        id: subject.id.clone(),
        kind: "message".into(),
        role: "assistant".into(),
        model: subject.model.clone(),
        content: Vec::new(),
        stop_reason: None,
        stop_sequence: None,
        usage: DoorUsage {
            input_tokens: 0,
            output_tokens: 0,
        },
    }
}

/// An event the door streams.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum DoorEvent {
    MessageStart { message: MessageObject },
    ContentBlockStart { index: u64, content_block: OutBlock },
    ContentBlockDelta { index: u64, delta: OutDelta },
    ContentBlockStop { index: u64 },
    MessageDelta { delta: OutStop, usage: DoorUsage },
    MessageStop,
    Error { error: ErrorDetail },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutDelta {
    TextDelta { text: String },
    InputJsonDelta { partial_json: String },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutStop {
    pub stop_reason: String,
    pub stop_sequence: Option<String>,
}

impl DoorEvent {
    /// The event's name: its type.
    pub fn name(&self) -> &'static str {
        match self {
            Self::MessageStart { .. } => "message_start",
            Self::ContentBlockStart { .. } => "content_block_start",
            Self::ContentBlockDelta { .. } => "content_block_delta",
            Self::ContentBlockStop { .. } => "content_block_stop",
            Self::MessageDelta { .. } => "message_delta",
            Self::MessageStop => "message_stop",
            Self::Error { .. } => "error",
        }
    }

    pub fn data(&self) -> String {
        serde_json::to_string(self).expect("an event serializes")
    }

    /// The error event for a refusal with `status` and `message`.
    pub fn error(status: u16, message: &str) -> Self {
        Self::Error {
            error: error_body(status, message).error,
        }
    }
}

/// The content blocks a door's stream has opened, so each delta lands in
/// its own block: text in a text block, each tool call in a `tool_use`
/// block.
#[derive(Debug, Default)]
pub struct BlockWriter {
    /// How many blocks were opened.
    count: u64,
    /// The block open now, and whether it is text.
    open: Option<(u64, bool)>,
    /// The block of each tool call, by the call's index.
    tools: Vec<(usize, u64)>,
}

impl BlockWriter {
    /// `message_start`.
    pub fn opening(subject: &Subject) -> DoorEvent {
        DoorEvent::MessageStart {
            message: started(subject),
        }
    }

    /// Closes the open block, then opens one with `start`.
    fn open_block(&mut self, events: &mut Vec<DoorEvent>, text: bool, start: OutBlock) -> u64 {
        if let Some((index, _)) = self.open.take() {
            events.push(DoorEvent::ContentBlockStop { index });
        }
        let index = self.count;
        self.count += 1;
        self.open = Some((index, text));
        events.push(DoorEvent::ContentBlockStart {
            index,
            content_block: start,
        });
        index
    }

    /// The events one released delta amounts to.
    pub fn delta(&mut self, delta: &Delta) -> Vec<DoorEvent> {
        let mut events = Vec::new();
        if let Some(text) = delta.text.as_deref().filter(|t| !t.is_empty()) {
            let index = match self.open {
                Some((index, true)) => index,
                _ => self.open_block(
                    &mut events,
                    true,
                    OutBlock::Text {
                        text: String::new(),
                    },
                ),
            };
            events.push(DoorEvent::ContentBlockDelta {
                index,
                delta: OutDelta::TextDelta {
                    text: text.to_owned(),
                },
            });
        }
        for call in &delta.tool_calls {
            let index = match self.tools.iter().find(|(n, _)| *n == call.index) {
                Some(&(_, index)) => index,
                None => {
                    let start = OutBlock::ToolUse {
                        id: call.id.clone(),
                        name: call.name.clone().unwrap_or_default(),
                        input: Value::Object(Map::new()),
                    };
                    let index = self.open_block(&mut events, false, start);
                    self.tools.push((call.index, index));
                    index
                }
            };
            if let Some(part) = call.arguments.as_deref().filter(|p| !p.is_empty()) {
                events.push(DoorEvent::ContentBlockDelta {
                    index,
                    delta: OutDelta::InputJsonDelta {
                        partial_json: part.to_owned(),
                    },
                });
            }
        }
        events
    }

    /// The events that end a succeeded job's stream: the open block's
    /// stop, `message_delta`, `message_stop`.
    pub fn finish(&mut self, answer: &Answer) -> [Option<DoorEvent>; 3] {
        let stop = self
            .open
            .take()
            .map(|(index, _)| DoorEvent::ContentBlockStop { index });
        let (stop_reason, stop_sequence) = write_stop(&answer.stop);
        [
            stop,
            Some(DoorEvent::MessageDelta {
                delta: OutStop {
                    stop_reason: stop_reason.to_owned(),
                    stop_sequence,
                },
                usage: DoorUsage::of(answer.usage),
            }),
            Some(DoorEvent::MessageStop),
        ]
    }
}

/// `POST /v1/messages/count_tokens`' request for one user text.
#[derive(Debug, Clone, Serialize)]
pub struct CountTokensRequest<'a> {
    pub model: &'a str,
    pub messages: [CountMessage<'a>; 1],
}

#[derive(Debug, Clone, Serialize)]
pub struct CountMessage<'a> {
    pub role: &'static str,
    pub content: &'a str,
}

impl<'a> CountTokensRequest<'a> {
    pub fn of(model: &'a str, text: &'a str) -> Self {
        Self {
            model,
            messages: [CountMessage {
                role: "user",
                content: text,
            }],
        }
    }
}

/// `count_tokens`' answer.
#[derive(Debug, Clone, Deserialize)]
pub struct CountTokensResponse {
    pub input_tokens: u64,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::chat::assembly::Assembly;
    use crate::chat::{openai_chat, StreamError, StreamReader};

    fn read(body: Value) -> ChatRequest {
        read_request(&body).unwrap().request
    }

    /// A request in OpenAI's form, as the chat-completions door reads it.
    fn from_openai(body: Value) -> ChatRequest {
        openai_chat::read_request(&body).unwrap().request
    }

    /// The request in OpenAI's form, as a job's input keeps it.
    fn as_openai(request: &ChatRequest, route: &str) -> Value {
        let written = openai_chat::write_request(request, openai_chat::Target::Input { route });
        serde_json::to_value(written).unwrap()
    }

    fn target(stream: bool) -> ProviderTarget<'static> {
        ProviderTarget {
            model: "claude",
            default_max_tokens: 100,
            default_temperature: Some(0.7),
            stream,
        }
    }

    fn written(request: &ChatRequest) -> Value {
        serde_json::to_value(write_request(request, target(false)).unwrap().body).unwrap()
    }

    fn provider_message(value: Value) -> ProviderMessage {
        serde_json::from_value(value).unwrap()
    }

    fn subject() -> Subject {
        Subject {
            id: "msg_1".into(),
            model: "route".into(),
        }
    }

    fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn a_messages_request_becomes_the_chat_request_a_chat_completions_client_would_send() {
        let read = read_request(&json!({
            "model": "claude-route",
            "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]},
                {"role": "user", "content": [{"type": "text", "text": "Again"}]},
            ],
            "max_tokens": 64,
            "temperature": 0.5,
            "top_k": 5,
            "stop_sequences": ["END"],
            "metadata": {"user_id": "u1"},
            "stream": true,
        }))
        .unwrap();
        assert_eq!(read.route, "claude-route");
        assert!(read.request.stream);
        assert_eq!(read.request.user, None, "metadata is about the caller");
        assert_eq!(
            as_openai(&read.request, &read.route),
            json!({
                "model": "claude-route",
                "messages": [
                    {"role": "system", "content": "Be brief.\n\nBe kind."},
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]},
                    {"role": "user", "content": [{"type": "text", "text": "Again"}]},
                ],
                "max_tokens": 64,
                "temperature": 0.5,
                "top_k": 5,
                "stop": ["END"],
                "stream": true,
            })
        );
    }

    /// A request with a tool, a call of it and its result.
    fn weather_request() -> ChatRequest {
        read(json!({
            "model": "m",
            "max_tokens": 50,
            "tools": [{"name": "weather", "description": "By city",
                       "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "tool", "name": "weather"},
            "messages": [
                {"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "rain"}]},
                    {"type": "text", "text": "And tomorrow?"},
                ]},
            ],
        }))
    }

    #[test]
    fn tool_use_and_tool_results_become_tool_calls_and_tool_messages() {
        assert_eq!(
            weather_request().messages,
            [
                Message::User {
                    content: Content::Text("Weather in Oslo?".into()),
                    name: None,
                },
                Message::Assistant {
                    content: Some(Content::Text("Let me look.".into())),
                    tool_calls: vec![call("toolu_1", "weather", "{\"city\":\"Oslo\"}")],
                    name: None,
                },
                Message::Tool {
                    call_id: "toolu_1".into(),
                    content: Content::Text("rain".into()),
                },
                Message::User {
                    content: Content::Parts(vec![Part::Text("And tomorrow?".into())]),
                    name: None,
                },
            ]
        );
    }

    #[test]
    fn tools_and_a_named_tool_choice_are_read_as_the_models() {
        let request = weather_request();
        assert_eq!(
            request.tools,
            [Tool {
                name: "weather".into(),
                description: Some("By city".into()),
                parameters: Some(
                    json!({"type": "object", "properties": {"city": {"type": "string"}}})
                ),
                strict: None,
            }]
        );
        assert_eq!(
            request.tool_choice,
            Some(ToolChoice::Named("weather".into()))
        );
    }

    #[test]
    fn tools_and_a_named_tool_choice_become_chat_completions_functions() {
        let openai = as_openai(&weather_request(), "m");
        assert_eq!(
            openai["tools"],
            json!([{"type": "function", "function": {"name": "weather", "description": "By city",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
        );
        assert_eq!(
            openai["tool_choice"],
            json!({"type": "function", "function": {"name": "weather"}})
        );
    }

    #[test]
    fn a_tool_call_in_the_answer_goes_back_as_a_tool_use_block() {
        let answer = Answer {
            text: None,
            tool_calls: vec![call("c1", "weather", "{\"city\":\"Rome\"}")],
            stop: StopReason::ToolUse,
            ..Answer::default()
        };
        let message = serde_json::to_value(message(&subject(), &answer)).unwrap();
        assert_eq!(
            message["content"],
            json!([{"type": "tool_use", "id": "c1", "name": "weather", "input": {"city": "Rome"}}])
        );
        assert_eq!(message["stop_reason"], "tool_use");
    }

    #[test]
    fn images_are_taken_as_urls_and_reach_anthropic_as_they_came() {
        let blocks = json!([
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
            {"type": "text", "text": "What is this?"},
        ]);
        let request = read(json!({"model": "m", "max_tokens": 8,
                                  "messages": [{"role": "user", "content": blocks}]}));
        let image = |url: &str| {
            Part::Image(Image {
                url: url.into(),
                detail: None,
            })
        };
        assert_eq!(
            request.messages,
            [Message::User {
                content: Content::Parts(vec![
                    image("data:image/png;base64,AAAA"),
                    image("https://example.com/a.png"),
                    Part::Text("What is this?".into()),
                ]),
                name: None,
            }]
        );
        assert_eq!(
            written(&request)["messages"],
            json!([{"role": "user", "content": blocks}])
        );
    }

    /// The request every refusal case changes: one that is taken.
    fn well_formed() -> Value {
        json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]})
    }

    /// Each change to the well-formed request is refused, naming the member
    /// that is wrong (the message starts with it).
    fn assert_refused<const N: usize>(cases: [(Value, &str); N]) {
        for (change, expected) in cases {
            let mut body = well_formed();
            for (name, value) in change.as_object().unwrap() {
                body[name] = value.clone();
            }
            let refused = read_request(&body).expect_err(&format!("{change}"));
            assert_eq!(refused.param, expected, "{change}: {}", refused.message);
            assert!(
                refused.message.starts_with(expected),
                "{change}: {}",
                refused.message
            );
        }
    }

    #[test]
    fn a_well_formed_request_is_taken() {
        assert!(read_request(&well_formed()).is_ok());
    }

    #[test]
    fn missing_or_empty_required_members_are_refused() {
        assert_refused([
            (json!({"model": null}), "model"),
            (json!({"model": ""}), "model"),
            (json!({"max_tokens": 0}), "max_tokens"),
            (json!({"max_tokens": 1.5}), "max_tokens"),
            (json!({"max_tokens": null}), "max_tokens"),
            (json!({"messages": []}), "messages"),
            (json!({"messages": null}), "messages"),
        ]);
    }

    #[test]
    fn turns_of_the_wrong_shape_are_refused() {
        assert_refused([
            (
                json!({"messages": [{"role": "system", "content": "x"}]}),
                "messages.0.role",
            ),
            (
                json!({"messages": [{"role": "user"}]}),
                "messages.0.content",
            ),
            (
                json!({"messages": [{"role": "user", "content": 7}]}),
                "messages.0.content",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "document"}]}]}),
                "messages.0.content.0.type",
            ),
            (
                json!({"messages": [{"role": "assistant", "content": [{"type": "image",
                "source": {"type": "url", "url": "https://example.com/a.png"}}]}]}),
                "messages.0.content.0.type",
            ),
        ]);
    }

    #[test]
    fn stream_sampling_and_stop_members_of_the_wrong_shape_are_refused() {
        assert_refused([
            (json!({"stream": "yes"}), "stream"),
            (json!({"temperature": "hot"}), "temperature"),
            (json!({"temperature": -1}), "temperature"),
            (json!({"top_k": -1}), "top_k"),
            (json!({"stop_sequences": [1]}), "stop_sequences.0"),
        ]);
    }

    #[test]
    fn system_prompts_and_tools_of_the_wrong_shape_are_refused() {
        assert_refused([
            (
                json!({"system": [{"type": "image",
                "source": {"type": "url", "url": "https://example.com/a.png"}}]}),
                "system.0.type",
            ),
            (json!({"tools": [{"name": "f"}]}), "tools.0"),
            (
                json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
                "tools.0.type",
            ),
            (json!({"tool_choice": {"type": "tool"}}), "tool_choice"),
        ]);
    }

    #[test]
    fn tool_blocks_out_of_place_or_of_the_wrong_shape_are_refused() {
        assert_refused([
            (
                json!({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t",
                "name": "f", "input": {}}]}]}),
                "messages.0.content.0.type",
            ),
            (
                json!({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t",
                "name": "f", "input": "x"}]}]}),
                "messages.0.content.0",
            ),
            (
                json!({"messages": [{"role": "assistant", "content": [{"type": "tool_result",
                "tool_use_id": "t", "content": "x"}]}]}),
                "messages.0.content.0.type",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "tool_result",
                "tool_use_id": "t", "content": "failed", "is_error": true}]}]}),
                "messages.0.content.0.is_error",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "tool_result",
                "tool_use_id": "t", "content": [{"type": "document"}]}]}]}),
                "messages.0.content.0",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "tool_result",
                "tool_use_id": "t", "content": [{"type": "image",
                "source": {"type": "url", "url": "https://example.com/a.png"}}]}]}]}),
                "messages.0.content.0.content.0.type",
            ),
        ]);
    }

    #[test]
    fn other_output_formats_and_members_not_taken_are_refused() {
        assert_refused([
            (
                json!({"output_format": {"type": "json_object", "schema": {}}}),
                "output_format",
            ),
            (
                json!({"thinking": {"type": "enabled", "budget_tokens": 1024}}),
                "thinking",
            ),
        ]);
    }

    #[test]
    fn a_body_that_is_no_object_is_refused() {
        assert_eq!(read_request(&json!([1])).unwrap_err().param, "body");
    }

    #[test]
    fn errors_take_anthropics_shape_and_type_by_status() {
        for (status, kind) in [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (403, "permission_error"),
            (404, "not_found_error"),
            (409, "invalid_request_error"),
            (413, "request_too_large"),
            (429, "rate_limit_error"),
            (500, "api_error"),
            (503, "overloaded_error"),
            (529, "overloaded_error"),
        ] {
            assert_eq!(
                serde_json::to_value(error_body(status, "x")).unwrap(),
                json!({"type": "error", "error": {"type": kind, "message": "x"}}),
                "{status}"
            );
        }
        let event = DoorEvent::error(429, "slow down");
        assert_eq!(event.name(), "error");
        assert_eq!(
            serde_json::from_str::<Value>(&event.data()).unwrap(),
            json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}})
        );
    }

    #[test]
    fn deltas_open_one_block_each_and_the_finish_closes_the_last() {
        let events = |events: Vec<DoorEvent>| -> Vec<Value> {
            events
                .iter()
                .map(|event| serde_json::to_value(event).unwrap())
                .collect()
        };
        let mut blocks = BlockWriter::default();
        assert_eq!(
            serde_json::to_value(BlockWriter::opening(&subject())).unwrap()["message"]["content"],
            json!([])
        );
        assert_eq!(
            events(blocks.delta(&Delta::text("Hel"))),
            [
                json!({"type": "content_block_start", "index": 0,
                       "content_block": {"type": "text", "text": ""}}),
                json!({"type": "content_block_delta", "index": 0,
                       "delta": {"type": "text_delta", "text": "Hel"}}),
            ]
        );
        assert_eq!(
            events(blocks.delta(&Delta::text("lo"))),
            [json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": "lo"}})],
            "the text block is still open"
        );
        let piece = |id: Option<&str>, arguments: &str| Delta {
            text: None,
            tool_calls: vec![ToolCallDelta {
                index: 0,
                id: id.map(str::to_owned),
                name: id.map(|_| "f".to_owned()),
                arguments: Some(arguments.to_owned()),
            }],
        };
        assert_eq!(
            events(blocks.delta(&piece(Some("c1"), "{\"a\":"))),
            [
                json!({"type": "content_block_stop", "index": 0}),
                json!({"type": "content_block_start", "index": 1,
                       "content_block": {"type": "tool_use", "id": "c1", "name": "f", "input": {}}}),
                json!({"type": "content_block_delta", "index": 1,
                       "delta": {"type": "input_json_delta", "partial_json": "{\"a\":"}}),
            ]
        );
        assert_eq!(
            events(blocks.delta(&piece(None, "1}"))),
            [json!({"type": "content_block_delta", "index": 1,
                    "delta": {"type": "input_json_delta", "partial_json": "1}"}})],
            "the call's next pieces land in its block"
        );
        let answer = Answer {
            text: Some("Hello".into()),
            tool_calls: vec![call("c1", "f", "{\"a\":1}")],
            stop: StopReason::ToolUse,
            usage: TokenCounts {
                input: 3,
                output: 2,
                ..TokenCounts::default()
            },
            ..Answer::default()
        };
        let [stop, delta, end] = blocks.finish(&answer);
        assert_eq!(stop, Some(DoorEvent::ContentBlockStop { index: 1 }));
        assert_eq!(
            serde_json::to_value(delta.unwrap()).unwrap(),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
                   "usage": {"input_tokens": 3, "output_tokens": 2}})
        );
        assert_eq!(end, Some(DoorEvent::MessageStop));
    }

    #[test]
    fn a_stream_that_opened_no_block_closes_none() {
        let [stop, delta, end] = BlockWriter::default().finish(&Answer::default());
        assert_eq!(stop, None);
        assert!(matches!(delta, Some(DoorEvent::MessageDelta { .. })));
        assert_eq!(end, Some(DoorEvent::MessageStop));
    }

    /// Feeds a provider's events through the reader and the assembly: the
    /// deltas handed on, and the answer once the stream is done.
    fn stream(events: &[(&str, Value)]) -> (Vec<Delta>, Option<Answer>) {
        let mut reader = EventReader::default();
        let mut assembly = Assembly::default();
        let mut handed = Vec::new();
        for (name, data) in events {
            for event in reader.read(name, &data.to_string()).unwrap() {
                match event {
                    StreamEvent::Done => return (handed, Some(assembly.answer())),
                    StreamEvent::Failed(message) => panic!("a failed stream: {message}"),
                    event => handed.extend(assembly.add(event).unwrap()),
                }
            }
        }
        (handed, None)
    }

    #[test]
    fn anthropic_events_become_the_same_deltas_and_the_same_answer_as_a_whole_message() {
        let events = [
            (
                "message_start",
                json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
                "role": "assistant", "content": [], "usage": {"input_tokens": 9, "output_tokens": 1}}}),
            ),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}),
            ),
            ("ping", json!({"type": "ping"})),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": "Hel"}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": "lo"}}),
            ),
            (
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            ),
            (
                "message_delta",
                json!({"type": "message_delta",
                "delta": {"stop_reason": "max_tokens", "stop_sequence": null}, "usage": {"output_tokens": 4}}),
            ),
            ("message_stop", json!({"type": "message_stop"})),
        ];
        let (handed, answer) = stream(&events);
        assert_eq!(handed, [Delta::text("Hel"), Delta::text("lo")]);
        let whole = read_answer(provider_message(json!({
            "content": [{"type": "text", "text": "Hello"}], "stop_reason": "max_tokens",
            "usage": {"input_tokens": 9, "output_tokens": 4}})));
        assert_eq!(whole.stop, StopReason::MaxTokens);
        assert_eq!(whole.usage.total(), 13);
        assert_eq!(
            answer.as_ref(),
            Some(&whole),
            "the stored answer is the whole message's"
        );

        // Events without their `event:` name are known by their `type`.
        let unnamed: Vec<(&str, Value)> = events.iter().map(|(_, d)| ("", d.clone())).collect();
        assert_eq!(stream(&unnamed).1, Some(whole));
    }

    #[test]
    fn anthropic_tool_use_streams_as_tool_calls() {
        let (handed, answer) = stream(&[
            (
                "message_start",
                json!({"message": {"usage": {"input_tokens": 2}}}),
            ),
            (
                "content_block_start",
                json!({"index": 1,
                "content_block": {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}}),
            ),
            (
                "content_block_delta",
                json!({"index": 1,
                "delta": {"type": "input_json_delta", "partial_json": "{\"city\":"}}),
            ),
            (
                "content_block_delta",
                json!({"index": 1,
                "delta": {"type": "input_json_delta", "partial_json": "\"Oslo\"}"}}),
            ),
            (
                "content_block_start",
                json!({"index": 2,
                "content_block": {"type": "tool_use", "id": "toolu_2", "name": "time", "input": {}}}),
            ),
            (
                "content_block_delta",
                json!({"index": 2, "delta": {"type": "input_json_delta", "partial_json": "{}"}}),
            ),
            (
                "message_delta",
                json!({"delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 5}}),
            ),
            ("message_stop", json!({})),
        ]);
        assert_eq!(
            handed[0].tool_calls,
            [ToolCallDelta {
                index: 0,
                id: Some("toolu_1".into()),
                name: Some("weather".into()),
                arguments: Some(String::new()),
            }]
        );
        assert_eq!(
            handed[1].tool_calls,
            [ToolCallDelta {
                index: 0,
                arguments: Some("{\"city\":".into()),
                ..ToolCallDelta::default()
            }]
        );
        assert_eq!(
            handed[3].tool_calls[0].index, 1,
            "the next block, the next call"
        );
        let answer = answer.unwrap();
        assert_eq!(answer.stop, StopReason::ToolUse);
        assert_eq!(answer.text, None, "no text beside tool calls");
        assert_eq!(
            answer.tool_calls,
            [
                call("toolu_1", "weather", "{\"city\":\"Oslo\"}"),
                call("toolu_2", "time", "{}")
            ]
        );
        assert_eq!(
            answer.usage,
            TokenCounts {
                input: 2,
                output: 5,
                ..TokenCounts::default()
            }
        );
    }

    #[test]
    fn an_error_event_fails_the_stream_and_stray_tool_input_is_invalid() {
        let mut reader = EventReader::default();
        let failed = reader
            .read(
                "error",
                &json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
                    .to_string(),
            )
            .unwrap();
        assert!(
            matches!(&failed[..], [StreamEvent::Failed(message)] if message.contains("Overloaded")),
            "{failed:?}"
        );
        let text_block = json!({"index": 0, "content_block": {"type": "text", "text": ""}});
        reader
            .read("content_block_start", &text_block.to_string())
            .unwrap();
        for index in [0, 3] {
            let stray = json!({"index": index,
                "delta": {"type": "input_json_delta", "partial_json": "{"}});
            assert!(
                matches!(
                    reader.read("content_block_delta", &stray.to_string()),
                    Err(StreamError::Invalid(_))
                ),
                "tool input for block {index}, which is no tool call"
            );
        }
        assert_eq!(
            reader.read("something_new", "{}").unwrap(),
            [],
            "an unknown event is skipped, as Anthropic asks of its clients"
        );
        assert!(matches!(
            reader.read("content_block_delta", "{\"index\": 0, \"del"),
            Err(StreamError::Garbled(_))
        ));
    }

    #[test]
    fn a_streams_usage_with_cached_tokens_is_the_whole_messages() {
        let usage = json!({"input_tokens": 5, "cache_creation_input_tokens": 10,
                           "cache_read_input_tokens": 100, "output_tokens": 4});
        let (_, answer) = stream(&[
            (
                "message_start",
                json!({"message": {"usage": {"input_tokens": 5, "cache_creation_input_tokens": 10,
                       "cache_read_input_tokens": 100, "output_tokens": 1}}}),
            ),
            (
                "content_block_start",
                json!({"index": 0, "content_block": {"type": "text", "text": "Hi"}}),
            ),
            (
                "message_delta",
                json!({"delta": {"stop_reason": "end_turn"}, "usage": usage}),
            ),
            ("message_stop", json!({})),
        ]);
        let whole = read_answer(provider_message(json!({
            "content": [{"type": "text", "text": "Hi"}], "stop_reason": "end_turn", "usage": usage})));
        assert_eq!(whole.usage.input, 115);
        assert_eq!(answer.unwrap().usage, whole.usage);
    }

    /// A Chat Completions request as the old provider tests sent it.
    fn brief_request() -> ChatRequest {
        from_openai(json!({
            "model": "gpt-safe",
            "stream": true,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
            ],
            "max_tokens": 50,
            "temperature": 0.2,
            "stop": "END",
            "user": "u1",
        }))
    }

    #[test]
    fn anthropic_gets_the_conversation_in_its_terms() {
        let written = write_request(&brief_request(), target(false)).unwrap();
        assert!(!written.structured_outputs_beta);
        assert_eq!(
            serde_json::to_value(written.body).unwrap(),
            json!({
                "model": "claude",
                "system": "Be brief.",
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 50,
                "temperature": 0.2,
                "stop_sequences": ["END"],
                "metadata": {"user_id": "u1"},
            }),
            "the provider's model; the request's own limit and temperature; no stream unasked"
        );
        let streamed = write_request(&brief_request(), target(true)).unwrap();
        assert_eq!(streamed.body.stream, Some(true));
    }

    #[test]
    fn a_request_without_a_limit_or_temperature_gets_the_providers() {
        let bare = from_openai(json!({"messages": [{"role": "user", "content": "Hi"}]}));
        let body = written(&bare);
        assert_eq!(body["max_tokens"], 100);
        assert_eq!(body["temperature"], 0.7);
        let unset = ProviderTarget {
            default_max_tokens: 64,
            default_temperature: None,
            ..target(false)
        };
        let body = serde_json::to_value(write_request(&bare, unset).unwrap().body).unwrap();
        assert_eq!(body["max_tokens"], 64);
        assert!(body.get("temperature").is_none(), "{body}");
    }

    #[test]
    fn tools_and_their_results_reach_anthropic_in_its_terms_and_come_back_as_tool_calls() {
        let request = from_openai(json!({
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
        }));
        let body = written(&request);
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
        assert_eq!(body["messages"].as_array().unwrap().len(), 3);
        assert_eq!(
            body["tools"],
            json!([{"name": "weather", "description": "Weather by city",
                    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}])
        );
        assert_eq!(body["tool_choice"], json!({"type": "any"}));

        let answer = read_answer(provider_message(json!({
            "content": [{"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Oslo"}}],
            "stop_reason": "tool_use", "usage": {"input_tokens": 3, "output_tokens": 4}})));
        assert_eq!(
            answer,
            Answer {
                text: None,
                tool_calls: vec![call("t1", "weather", "{\"city\":\"Oslo\"}")],
                stop: StopReason::ToolUse,
                usage: TokenCounts {
                    input: 3,
                    output: 4,
                    ..TokenCounts::default()
                },
                message_extras: Map::new(),
            }
        );
    }

    #[test]
    fn a_messages_request_reaches_an_anthropic_provider_as_the_client_wrote_it() {
        let body = json!({
            "model": "claude",
            "system": "Be brief.",
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "Weather here?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/"}},
                ]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "rain"},
                ]},
            ],
            "max_tokens": 64,
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 5,
            "stop_sequences": ["END"],
            "tools": [{"name": "weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "auto"},
        });
        assert_eq!(written(&read(body.clone())), body);
    }

    #[test]
    fn a_json_schema_output_or_a_strict_tool_asks_for_the_structured_outputs_beta() {
        let request = read(json!({
            "model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}],
            "output_format": {"type": "json_schema", "schema": {"type": "object"}},
        }));
        let written = write_request(&request, target(false)).unwrap();
        assert!(written.structured_outputs_beta);
        assert_eq!(
            serde_json::to_value(&written.body).unwrap()["output_format"],
            json!({"type": "json_schema", "schema": {"type": "object"}})
        );
        let strict = from_openai(json!({
            "messages": [{"role": "user", "content": "Hi"}],
            "tools": [{"type": "function", "function": {"name": "f", "strict": true,
                       "parameters": {"type": "object"}}}],
        }));
        let written = write_request(&strict, target(false)).unwrap();
        assert!(written.structured_outputs_beta);
        assert_eq!(written.body.tools.unwrap()[0].strict, Some(true));
        assert!(
            !write_request(&brief_request(), target(false))
                .unwrap()
                .structured_outputs_beta
        );
    }

    #[test]
    fn what_anthropic_cannot_carry_is_refused_rather_than_dropped() {
        let carried = brief_request();
        assert!(write_request(&carried, target(false)).is_ok());
        let with = |change: fn(&mut ChatRequest)| {
            let mut request = carried.clone();
            change(&mut request);
            request
        };
        for (request, named) in [
            (with(|r| r.sampling.seed = Some(7)), "seed"),
            (
                with(|r| r.sampling.presence_penalty = Some(0.5)),
                "presence_penalty",
            ),
            (
                with(|r| r.sampling.frequency_penalty = Some(0.5)),
                "frequency_penalty",
            ),
            (
                with(|r| {
                    r.openai_extras
                        .insert("logit_bias".into(), json!({"50256": -100}));
                }),
                "logit_bias",
            ),
            (
                with(|r| r.output = Some(OutputFormat::JsonObject)),
                "json_object",
            ),
            (
                with(|r| {
                    r.messages[1] = Message::User {
                        content: Content::Text("Hi".into()),
                        name: Some("ann".into()),
                    }
                }),
                "name",
            ),
            (
                with(|r| {
                    r.messages[1] = Message::User {
                        content: Content::Parts(vec![Part::OpenAiOther(
                            json!({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}),
                        )]),
                        name: None,
                    }
                }),
                "content part",
            ),
        ] {
            let CannotCarry(why) = write_request(&request, target(false)).expect_err(named);
            assert!(why.contains(named), "{named}: {why}");
        }
    }

    #[test]
    fn parts_of_a_system_or_tool_message_that_are_not_text_are_refused_rather_than_dropped() {
        let image = json!({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}});
        for message in [
            json!({"role": "system", "content": [{"type": "text", "text": "Be brief."}, image]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "rain"}, image]}),
        ] {
            let request =
                from_openai(json!({"messages": [message, {"role": "user", "content": "Hi"}]}));
            assert!(
                write_request(&request, target(false)).is_err(),
                "{message} was written as {}",
                written(&request)
            );
        }
    }

    #[test]
    fn a_stop_sequence_stop_comes_back_as_that_sequence_and_the_door_writes_it_back() {
        let answer = read_answer(provider_message(json!({
            "content": [{"type": "text", "text": "Done"}],
            "stop_reason": "stop_sequence", "stop_sequence": "END",
            "usage": {"input_tokens": 3, "output_tokens": 1}})));
        assert_eq!(answer.stop, StopReason::StopSequence("END".into()));
        assert_eq!(answer.text(), "Done");
        let message = serde_json::to_value(message(&subject(), &answer)).unwrap();
        assert_eq!(
            message,
            json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "route",
                   "content": [{"type": "text", "text": "Done"}],
                   "stop_reason": "stop_sequence", "stop_sequence": "END",
                   "usage": {"input_tokens": 3, "output_tokens": 1}})
        );
        let [_, delta, _] = BlockWriter::default().finish(&answer);
        assert_eq!(
            serde_json::to_value(delta.unwrap()).unwrap()["delta"],
            json!({"stop_reason": "stop_sequence", "stop_sequence": "END"})
        );
    }

    #[test]
    fn each_stop_reason_anthropic_gives_is_given_back_as_it_said_it() {
        for reason in ["end_turn", "max_tokens", "tool_use", "refusal"] {
            let answer = read_answer(provider_message(json!({
                "content": [{"type": "text", "text": "x"}], "stop_reason": reason})));
            let message = message(&subject(), &answer);
            assert_eq!(message.stop_reason.as_deref(), Some(reason));
            assert_eq!(message.stop_sequence, None);
        }
    }

    #[test]
    fn a_whole_messages_cached_tokens_count_in_its_prompt() {
        let answer = read_answer(provider_message(json!({
            "content": [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "Hi"}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 5, "cache_creation_input_tokens": 10,
                      "cache_read_input_tokens": 100, "output_tokens": 4}})));
        assert_eq!(answer.text(), "Hi", "thinking is not part of the answer");
        assert_eq!(
            answer.usage,
            TokenCounts {
                input: 115,
                output: 4,
                cached_input: 100,
                reasoning: 0,
            }
        );
    }
}
