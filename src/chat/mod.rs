//! Chat calls: one model of a call ([`model`]) and one codec per wire
//! format, each with serde types for its format's requests, answers,
//! stream events and errors, and the conversion to and from the model.
//!
//! | codec           | door                   | providers                 |
//! |-----------------|------------------------|---------------------------|
//! | [`openai_chat`] | `/v1/chat/completions` | `openai`, `azure_openai`  |
//! | [`responses`]   | `/v1/responses`        |                           |
//! | [`anthropic`]   | `/v1/messages`         | `anthropic`               |
//! | [`gemini`]      |                        | `gemini`                  |
//! | [`bedrock`]     |                        | `bedrock`                 |
//!
//! A chat job is kept in OpenAI's Chat Completions form, whichever door it
//! came through (its input, its answer and its stream's pieces; see
//! [`openai_chat`]), so its fingerprint and its replays do not depend on
//! the door. A door reads its format into the model and, for the job's
//! input, writes the model as a Chat Completions request; a provider's
//! codec writes the model in its format and reads the answer back into it.
//!
//! Nothing here does I/O: the doors (`web`) and the providers'
//! transports (`providers`) do.

pub mod anthropic;
pub mod assembly;
pub mod bedrock;
pub mod gemini;
pub mod model;
pub mod openai_chat;
pub mod responses;
pub mod wire;

pub use model::{
    Answer, CannotCarry, ChatRequest, Content, Delta, Message, OutputFormat, Part, StopReason,
    StreamEvent, TokenCounts, Tool, ToolCall, ToolChoice,
};
pub use wire::Refused;

/// Why a provider's stream could not be read on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamError {
    /// Data that is not what the format sends (cut, garbled): the provider
    /// may have finished, so the outcome is unknown.
    Garbled(String),
    /// An event that breaks the format's rules: a definite failure.
    Invalid(String),
}

/// A provider's stream read event by event (its framing is the
/// transport's): what each event says, in the model's terms.
pub trait StreamReader: Send {
    /// One event: its name (SSE's `event:`, or an event stream's type; may
    /// be empty) and its data.
    fn read(&mut self, name: &str, data: &str) -> Result<Vec<StreamEvent>, StreamError>;
}

/// OpenAI's chunks read one by one (they carry no state between them).
#[derive(Debug, Default)]
pub struct OpenAiChunks;

impl StreamReader for OpenAiChunks {
    fn read(&mut self, _name: &str, data: &str) -> Result<Vec<StreamEvent>, StreamError> {
        openai_chat::read_chunk(data).map_err(StreamError::Garbled)
    }
}
