//! One chat call, whatever wire format it came in or goes out in: the
//! request ([`ChatRequest`]), the answer ([`Answer`]) and the pieces of an
//! answer as it streams ([`Delta`], [`StreamEvent`]).
//!
//! Every codec reads its format into these types and writes them back out;
//! no codec reads another's format. What a format can say and the model
//! cannot is refused where it is read (a 400 naming it), and what the model
//! holds and a format cannot say is refused where it is written
//! ([`CannotCarry`]): nothing is silently dropped on the way.

use serde_json::{Map, Value};

/// A chat call: the conversation, what the model may use, how it samples,
/// and the shape its answer must take.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    pub tools: Vec<Tool>,
    pub tool_choice: Option<ToolChoice>,
    pub sampling: Sampling,
    /// Sequences that end the answer where they appear.
    pub stop: Vec<String>,
    /// The answer's shape: free text when `None`.
    pub output: Option<OutputFormat>,
    /// Whether the client takes the answer as it is generated.
    pub stream: bool,
    /// The end user the call is made for (OpenAI's `user`), when told.
    pub user: Option<String>,
    /// Members of an OpenAI Chat Completions request the model has no
    /// name for (a server's own extensions), as the client sent them: an
    /// OpenAI-format provider gets them as they are; any other refuses the
    /// call rather than drop them.
    pub openai_extras: Map<String, Value>,
}

impl ChatRequest {
    /// The text of the last user message (empty when there is none).
    pub fn last_user_text(&self) -> String {
        self.messages
            .iter()
            .rev()
            .find_map(|message| match message {
                Message::User { content, .. } => Some(content.text("")),
                _ => None,
            })
            .unwrap_or_default()
    }
}

impl Message {
    /// The message's text (its text parts joined; a tool call's arguments
    /// are not text).
    pub fn text(&self) -> String {
        match self {
            Self::System { content, .. }
            | Self::User { content, .. }
            | Self::Tool { content, .. } => content.text(""),
            Self::Assistant { content, .. } => {
                content.as_ref().map(|c| c.text("")).unwrap_or_default()
            }
        }
    }
}

/// One turn of the conversation.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// Instructions: a `system` message, or a `developer` one (`developer`
    /// is how reasoning models name it).
    System {
        content: Content,
        developer: bool,
        name: Option<String>,
    },
    User {
        content: Content,
        name: Option<String>,
    },
    /// The model's own earlier turn: its text (none beside tool calls is
    /// `None`) and the tools it called.
    Assistant {
        content: Option<Content>,
        tool_calls: Vec<ToolCall>,
        name: Option<String>,
    },
    /// A tool's result, answering the call `call_id`.
    Tool { call_id: String, content: Content },
}

/// A message's content: one text, or parts (as the client wrote it; both
/// formats that have a choice keep it).
#[derive(Debug, Clone, PartialEq)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

impl Content {
    /// The text of the content: the text, or its text parts joined by
    /// `separator`.
    pub fn text(&self, separator: &str) -> String {
        match self {
            Self::Text(text) => text.clone(),
            Self::Parts(parts) => parts
                .iter()
                .filter_map(Part::as_text)
                .collect::<Vec<_>>()
                .join(separator),
        }
    }

    /// The text of content that must be text alone (a system prompt, a
    /// tool result, for most formats); `None` when it has another part,
    /// which a writer then refuses rather than drops.
    pub fn text_only(&self) -> Option<String> {
        match self {
            Self::Text(text) => Some(text.clone()),
            Self::Parts(parts) => parts
                .iter()
                .map(Part::as_text)
                .collect::<Option<Vec<_>>>()
                .map(|texts| texts.concat()),
        }
    }

    /// The content's parts: a text is one text part.
    pub fn parts(&self) -> Vec<Part> {
        match self {
            Self::Text(text) => vec![Part::Text(text.clone())],
            Self::Parts(parts) => parts.clone(),
        }
    }

    /// Whether it has no text and no parts.
    pub fn is_empty(&self) -> bool {
        match self {
            Self::Text(text) => text.is_empty(),
            Self::Parts(parts) => parts.is_empty(),
        }
    }
}

/// A part of a message's content.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Text(String),
    Image(Image),
    /// A part of an OpenAI-format request the model has no name for
    /// (`input_audio`, `file`, …), as sent: only an OpenAI-format
    /// provider carries it.
    OpenAiOther(Value),
}

impl Part {
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Self::Text(text) => Some(text),
            _ => None,
        }
    }
}

/// An image: a URL, which may be a `data:` URL holding the image itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    pub url: String,
    /// OpenAI's `detail` (`low`, `high`, `auto`), when given.
    pub detail: Option<String>,
}

impl Image {
    /// The media type and base64 data of an image given inline (a
    /// `data:<type>;base64,<data>` URL); `None` for a link.
    pub fn inline(&self) -> Option<(&str, &str)> {
        self.url
            .strip_prefix("data:")
            .and_then(|rest| rest.split_once(";base64,"))
    }
}

/// A call of one of the client's tools.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as the model wrote them: JSON text.
    pub arguments: String,
}

impl ToolCall {
    /// The arguments as a JSON object (`{}` when they are not one): what
    /// the formats that take them as JSON send.
    pub fn input(&self) -> Value {
        serde_json::from_str::<Value>(&self.arguments)
            .ok()
            .filter(Value::is_object)
            .unwrap_or_else(|| Value::Object(Map::new()))
    }
}

/// One of the client's tools (a function).
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// Its parameters' JSON Schema, when given.
    pub parameters: Option<Value>,
    /// OpenAI's `strict`, when given.
    pub strict: Option<bool>,
}

impl Tool {
    /// The parameters' schema, or the schema of any object.
    pub fn parameters_or_any(&self) -> Value {
        self.parameters
            .clone()
            .unwrap_or_else(|| serde_json::json!({"type": "object"}))
    }
}

/// Whether and which tools the model must call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    None,
    /// At least one tool.
    Required,
    /// This one tool.
    Named(String),
}

/// How the answer is sampled. `None` leaves it to the provider's settings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampling {
    pub max_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<u64>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
}

/// The shape the answer must take.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputFormat {
    /// JSON matching `schema`.
    JsonSchema {
        name: String,
        schema: Value,
        description: Option<String>,
        strict: Option<bool>,
    },
    /// Any JSON object.
    JsonObject,
}

/// Why a format cannot carry a request: nothing is sent in it. The text
/// names what it cannot carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CannotCarry(pub String);

impl std::fmt::Display for CannotCarry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// An answer: the model's text and tool calls, why it stopped, and what it
/// used.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answer {
    /// The text; `None` when the answer is tool calls only.
    pub text: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub stop: StopReason,
    pub usage: TokenCounts,
    /// Members of an OpenAI-format answer's message the model has no name
    /// for (`refusal`, `annotations`, …), as the provider sent them: an
    /// OpenAI-format door shows them as they came.
    pub message_extras: Map<String, Value>,
}

impl Answer {
    /// The text, or nothing.
    pub fn text(&self) -> &str {
        self.text.as_deref().unwrap_or_default()
    }
}

/// Why the answer ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum StopReason {
    /// It was finished.
    #[default]
    EndTurn,
    /// It reached this stop sequence.
    StopSequence(String),
    /// It reached the token limit.
    MaxTokens,
    /// It called tools.
    ToolUse,
    /// A filter stopped it (or the model refused).
    ContentFilter,
    /// A reason the model has no name for, as the provider said it.
    Other(String),
}

/// The tokens a call used, as the provider counted them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenCounts {
    /// The prompt's tokens, cached ones included.
    pub input: u64,
    /// The answer's tokens, reasoning included.
    pub output: u64,
    /// Of `input`, those read from the provider's cache.
    pub cached_input: u64,
    /// Of `output`, those spent reasoning.
    pub reasoning: u64,
}

impl TokenCounts {
    pub fn total(&self) -> u64 {
        self.input + self.output
    }

    /// As the ledger keeps them.
    pub fn to_usage(self) -> crate::domain::Usage {
        crate::domain::Usage::reported(self.input, self.output, self.cached_input)
    }
}

/// A piece of an answer as it streams: text, and pieces of tool calls
/// (the first piece of a call names it; the next add to its arguments).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Delta {
    pub text: Option<String>,
    pub tool_calls: Vec<ToolCallDelta>,
}

impl Delta {
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: Some(text.into()),
            tool_calls: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.text.as_deref().is_none_or(str::is_empty) && self.tool_calls.is_empty()
    }
}

/// A piece of the tool call numbered `index` in its answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolCallDelta {
    pub index: usize,
    pub id: Option<String>,
    pub name: Option<String>,
    pub arguments: Option<String>,
}

/// What one event of a provider's stream says.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// More of the answer.
    Delta(Delta),
    /// Why it ended (the stream may still send its usage).
    Stop(StopReason),
    /// What it used so far.
    Usage(TokenCounts),
    /// The answer is complete.
    Done,
    /// The provider ended the stream without an answer: a definite failure.
    Failed(String),
}

/// The deltas of an answer that arrived whole: its text in one, its tool
/// calls (numbered) in another.
pub fn whole_answer_deltas(answer: &Answer) -> Vec<Delta> {
    let mut deltas = Vec::new();
    if let Some(text) = answer.text.as_deref().filter(|t| !t.is_empty()) {
        deltas.push(Delta::text(text));
    }
    if !answer.tool_calls.is_empty() {
        deltas.push(Delta {
            text: None,
            tool_calls: answer
                .tool_calls
                .iter()
                .enumerate()
                .map(|(index, call)| ToolCallDelta {
                    index,
                    id: Some(call.id.clone()),
                    name: Some(call.name.clone()),
                    arguments: Some(call.arguments.clone()),
                })
                .collect(),
        });
    }
    deltas
}
