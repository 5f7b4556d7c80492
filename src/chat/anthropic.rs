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
    let tools = match &wire.tools {
        None => Vec::new(),
        Some(tools) if tools.len() > MAX_TOOLS => {
            return Err(refused(
                "tools",
                format!("must be an array of at most {MAX_TOOLS} tools"),
            ))
        }
        Some(tools) => tools
            .iter()
            .enumerate()
            .map(|(i, tool)| read_tool(i, tool))
            .collect::<Result<_, _>>()?,
    };
    let output = match &wire.output_format {
        None => None,
        Some(format) if format.kind == "json_schema" && format.schema.is_object() => {
            Some(OutputFormat::JsonSchema {
                name: "output".into(),
                schema: format.schema.clone(),
                description: None,
                strict: Some(true),
            })
        }
        Some(_) => {
            return Err(refused(
                "output_format",
                "must be {\"type\": \"json_schema\", \"schema\": {…}}",
            ))
        }
    };
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
            messages.push(match role {
                TurnRole::User => Message::User {
                    content: Content::Text(text.clone()),
                    name: None,
                },
                TurnRole::Assistant => Message::Assistant {
                    content: Some(Content::Text(text.clone())),
                    tool_calls: Vec::new(),
                    name: None,
                },
            });
            return Ok(());
        }
        TextOr::Items(blocks) => blocks,
    };
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    let mut results = 0;
    for (i, block) in blocks.iter().enumerate() {
        let at = STYLE.join(at, i);
        let misplaced = |kind: &str| {
            let role = match role {
                TurnRole::User => "user",
                TurnRole::Assistant => "assistant",
            };
            Err(refused(
                STYLE.join(&at, "type"),
                format!("a {kind} block does not belong in a {role} turn"),
            ))
        };
        allowance.take()?;
        match (role, block) {
            (_, Block::Text { text }) => parts.push(Part::Text(text.clone())),
            (TurnRole::User, Block::Image { source }) => {
                parts.push(Part::Image(read_image(source)))
            }
            (TurnRole::Assistant, Block::Image { .. }) => return misplaced("image"),
            (TurnRole::Assistant, Block::ToolUse { id, name, input }) => calls.push(ToolCall {
                id: id.clone(),
                name: name.clone(),
                arguments: Value::Object(input.clone()).to_string(),
            }),
            (TurnRole::User, Block::ToolUse { .. }) => return misplaced("tool_use"),
            (
                TurnRole::User,
                Block::ToolResult {
                    tool_use_id,
                    content,
                    is_error,
                },
            ) => {
                if *is_error == Some(true) {
                    return Err(refused(
                        STYLE.join(&at, "is_error"),
                        "onejob cannot pass on that a tool failed: say so in the result's text",
                    ));
                }
                let text = match content {
                    None => String::new(),
                    Some(content) => {
                        texts(content, &STYLE.join(&at, "content"), allowance)?.join("\n\n")
                    }
                };
                // Tool results go first: the turn's other blocks follow them.
                messages.push(Message::Tool {
                    call_id: tool_use_id.clone(),
                    content: Content::Text(text),
                });
                results += 1;
            }
            (TurnRole::Assistant, Block::ToolResult { .. }) => return misplaced("tool_result"),
        }
    }
    match role {
        TurnRole::Assistant if !calls.is_empty() => {
            let text = Content::Parts(parts).text("\n\n");
            messages.push(Message::Assistant {
                content: (!text.is_empty()).then_some(Content::Text(text)),
                tool_calls: calls,
                name: None,
            });
        }
        TurnRole::Assistant => messages.push(Message::Assistant {
            content: Some(Content::Parts(parts)),
            tool_calls: Vec::new(),
            name: None,
        }),
        TurnRole::User if !parts.is_empty() || results == 0 => messages.push(Message::User {
            content: Content::Parts(parts),
            name: None,
        }),
        TurnRole::User => {}
    }
    Ok(())
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
    let mut system = Vec::new();
    let mut turns: Vec<WireTurn> = Vec::new();
    for message in &request.messages {
        match message {
            Message::System { content, name, .. } => {
                if name.is_some() {
                    return Err(cannot("a message's `name`"));
                }
                system.push(content.text(""));
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
                    content: Some(TextOr::Text(content.text(""))),
                    is_error: None,
                };
                // The results of one round of calls share one user turn.
                match turns.last_mut() {
                    Some(WireTurn {
                        role: TurnRole::User,
                        content: Some(TextOr::Items(blocks)),
                    }) if matches!(blocks.first(), Some(Block::ToolResult { .. })) => {
                        blocks.push(result)
                    }
                    _ => turns.push(WireTurn {
                        role: TurnRole::User,
                        content: Some(TextOr::Items(vec![result])),
                    }),
                }
            }
        }
    }
    let strict_tools = request.tools.iter().any(|tool| tool.strict == Some(true));
    let output_format = match &request.output {
        None => None,
        Some(OutputFormat::JsonSchema { schema, .. }) => Some(WireOutputFormat {
            kind: "json_schema".into(),
            schema: schema.clone(),
        }),
        Some(OutputFormat::JsonObject) => {
            return Err(cannot(
                "`response_format` `json_object` (it takes a JSON schema)",
            ))
        }
    };
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
        let piece = |delta: Delta| Ok(vec![StreamEvent::Delta(delta)]);
        match event {
            ProviderEvent::MessageStart { message } => {
                self.input = message.usage.counts();
                Ok(Vec::new())
            }
            ProviderEvent::ContentBlockStart {
                index,
                content_block,
            } => match content_block {
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
            },
            ProviderEvent::ContentBlockDelta { index, delta } => match delta {
                BlockDelta::TextDelta { text } if !text.is_empty() => piece(Delta::text(text)),
                BlockDelta::InputJsonDelta { partial_json } => {
                    let Some(&(_, call)) = self.tools.iter().find(|(block, _)| *block == index)
                    else {
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
            },
            ProviderEvent::MessageDelta { delta, usage } => {
                // Newer servers repeat the prompt's tokens here.
                if let Some(input) = usage.input_tokens {
                    self.input.input = input;
                }
                Ok(vec![
                    StreamEvent::Stop(read_stop(delta.stop_reason.as_deref(), delta.stop_sequence)),
                    StreamEvent::Usage(TokenCounts {
                        output: usage.output_tokens,
                        ..self.input
                    }),
                ])
            }
            ProviderEvent::MessageStop => Ok(vec![StreamEvent::Done]),
            ProviderEvent::Error { error } => Ok(vec![StreamEvent::Failed(format!(
                "the provider ended the stream with an error: {}",
                error.message.as_deref().unwrap_or("no message")
            ))]),
            ProviderEvent::Other => Ok(Vec::new()),
        }
    }
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
