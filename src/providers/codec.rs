//! Which wire format each provider kind speaks (its codec in `chat`), and
//! what its answers amount to: the request written in the kind's format,
//! a whole answer or an error body read back, a stream's reader.

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{AnswerShape, MaxTokensField, ProviderKind, ProviderSettings};
use crate::chat::{
    anthropic, bedrock, gemini, model::whole_answer_deltas, openai_chat, Answer, CannotCarry,
    ChatRequest, Delta, StreamReader, TokenCounts,
};
use crate::domain::outcome::Reason;
use crate::domain::Outcome;

/// A request ready to send, and whether it needs Anthropic's
/// structured-outputs beta.
#[derive(Debug)]
pub struct Encoded {
    pub body: Vec<u8>,
    pub structured_outputs_beta: bool,
}

/// A whole answer read back: the answer, or the outcome it amounts to
/// instead; and the usage the provider told, when it told.
#[derive(Debug)]
pub struct Decoded {
    pub answer: Result<Answer, Outcome>,
    pub usage: Option<TokenCounts>,
}

/// A provider kind's codec, with what its requests take from the
/// provider's settings.
#[derive(Debug, Clone)]
pub struct Codec {
    kind: ProviderKind,
    model: String,
    max_tokens: u64,
    temperature: Option<f64>,
    max_tokens_field: MaxTokensField,
}

impl Codec {
    pub fn from_settings(settings: &ProviderSettings) -> Self {
        Self {
            kind: settings.kind,
            model: settings.model.clone().unwrap_or_default(),
            max_tokens: u64::from(settings.max_tokens),
            temperature: settings.temperature,
            max_tokens_field: settings.max_tokens_field,
        }
    }

    /// The request in the kind's format; `streamed` when the answer is
    /// taken as it streams. A request the format cannot carry is never
    /// sent.
    pub fn encode(&self, request: &ChatRequest, streamed: bool) -> Result<Encoded, CannotCarry> {
        let (body, structured_outputs_beta) = match self.kind {
            ProviderKind::Anthropic => {
                let written = anthropic::write_request(
                    request,
                    anthropic::ProviderTarget {
                        model: &self.model,
                        default_max_tokens: self.max_tokens,
                        default_temperature: self.temperature,
                        stream: streamed,
                    },
                )?;
                (json(&written.body), written.structured_outputs_beta)
            }
            ProviderKind::Gemini => {
                let target = gemini::ProviderTarget {
                    default_max_tokens: self.max_tokens,
                    default_temperature: self.temperature,
                };
                (json(&gemini::write_request(request, target)?), false)
            }
            ProviderKind::Bedrock => {
                let target = bedrock::ProviderTarget {
                    default_max_tokens: self.max_tokens,
                    default_temperature: self.temperature,
                };
                (json(&bedrock::write_request(request, target)?), false)
            }
            ProviderKind::Openai | ProviderKind::AzureOpenai | ProviderKind::Simulated => {
                let target = openai_chat::ProviderTarget {
                    // Azure names the model by the deployment in the path.
                    model: (self.kind != ProviderKind::AzureOpenai).then_some(self.model.as_str()),
                    max_completion_tokens: self.max_tokens_field
                        == MaxTokensField::MaxCompletionTokens,
                    default_max_tokens: self.max_tokens,
                    default_temperature: self.temperature,
                    stream: streamed,
                };
                let wire =
                    openai_chat::write_request(request, openai_chat::Target::Provider(target));
                (json(&wire), false)
            }
        };
        Ok(Encoded {
            body,
            structured_outputs_beta,
        })
    }

    /// Whether the kind's format can carry `request` (a fallback that
    /// cannot is passed over rather than sent and failed).
    pub fn carries(&self, request: &ChatRequest) -> Result<(), CannotCarry> {
        self.encode(request, false).map(drop)
    }

    /// The reader of the kind's server-sent events.
    pub fn stream_reader(&self) -> Box<dyn StreamReader> {
        match self.kind {
            ProviderKind::Anthropic => Box::<anthropic::EventReader>::default(),
            ProviderKind::Gemini => Box::<gemini::EventReader>::default(),
            ProviderKind::Bedrock => Box::<bedrock::EventReader>::default(),
            _ => Box::new(crate::chat::OpenAiChunks),
        }
    }

    /// A whole answer's body read back. Data that is not JSON is unknown
    /// (cut or garbled: the provider may have answered); JSON of the wrong
    /// shape, or an answer that says nothing, is a definite failure; a
    /// blocked prompt or an answer stopped by a filter is a definite
    /// failure naming why.
    pub fn decode(&self, bytes: &[u8], status: u16) -> Decoded {
        match self.kind {
            ProviderKind::Anthropic => {
                match read::<anthropic::ProviderMessage>(bytes, status, "Message") {
                    Ok(message) => {
                        let answer = anthropic::read_answer(message);
                        let usage = Some(answer.usage);
                        Decoded {
                            answer: Ok(answer),
                            usage,
                        }
                    }
                    Err(outcome) => no_answer(outcome),
                }
            }
            ProviderKind::Gemini => {
                let name = "GenerateContentResponse";
                match read::<gemini::GenerateContentResponse>(bytes, status, name) {
                    Ok(response) => {
                        let usage = response.usage_metadata.map(gemini::UsageMetadata::counts);
                        let answer = match gemini::blocked(&response) {
                            Some(why) => Err(Outcome::Failed(Reason::new(why))),
                            None => gemini::read_answer(&response).map_err(invalid),
                        };
                        Decoded { answer, usage }
                    }
                    Err(outcome) => no_answer(outcome),
                }
            }
            ProviderKind::Bedrock => {
                match read::<bedrock::ConverseResponse>(bytes, status, "ConverseResponse") {
                    Ok(response) => {
                        let usage = Some(response.usage.counts());
                        let answer = match bedrock::blocked(&response) {
                            Some(why) => Err(Outcome::Failed(Reason::new(why))),
                            None => Ok(bedrock::read_answer(&response)),
                        };
                        Decoded { answer, usage }
                    }
                    Err(outcome) => no_answer(outcome),
                }
            }
            _ => match read::<openai_chat::ProviderCompletion>(bytes, status, "chat completion") {
                Ok(completion) => {
                    let usage = completion
                        .usage
                        .as_ref()
                        .and_then(openai_chat::WireUsage::counts);
                    Decoded {
                        answer: openai_chat::read_answer(completion).map_err(invalid),
                        usage,
                    }
                }
                Err(outcome) => no_answer(outcome),
            },
        }
    }

    /// An error answer's reason: Bedrock's names its error type first
    /// (`x-amzn-ErrorType`, or the body's), Azure's content filter names
    /// what it filtered; others quote the body. A content filter is
    /// returned apart: it is a definite failure whatever the status.
    pub fn error_reason(&self, body: &[u8], error_type: Option<&str>) -> ErrorReason {
        let excerpt = String::from_utf8_lossy(body).trim().to_owned();
        if self.kind == ProviderKind::AzureOpenai {
            if let Some(filtered) = openai_chat::azure_content_filter(body) {
                return ErrorReason::Filtered(Reason::new(filtered).with_detail(&excerpt));
            }
        }
        if self.kind == ProviderKind::Bedrock {
            let said: bedrock::ErrorBody = serde_json::from_slice(body).unwrap_or_default();
            if let Some(kind) = bedrock::error_type(error_type, &said) {
                let message = said.message.unwrap_or(excerpt);
                return ErrorReason::Quoted(format!("{kind}: {message}"));
            }
        }
        ErrorReason::Quoted(excerpt)
    }

    /// The wait an error answer asks for in its body (Gemini says it
    /// there, not in a header).
    pub fn retry_delay(&self, body: &[u8]) -> Option<std::time::Duration> {
        match self.kind {
            ProviderKind::Gemini => gemini::retry_delay(body),
            _ => None,
        }
    }
}

/// What an error answer says.
#[derive(Debug)]
pub enum ErrorReason {
    /// A content filter refused the request: definite.
    Filtered(Reason),
    /// The text to classify by status.
    Quoted(String),
}

/// The answer as its call takes it: a chat route's whole message (handed
/// on to `sink` first when a stream was asked for and the provider
/// answered whole), or the JSON a task's answer text holds.
pub async fn conclude(
    shape: AnswerShape,
    answer: Answer,
    sink: Option<&tokio::sync::mpsc::Sender<Delta>>,
) -> Outcome {
    match shape {
        AnswerShape::Message => {
            if let Some(sink) = sink {
                for delta in whole_answer_deltas(&answer) {
                    let _ = sink.send(delta).await;
                }
            }
            Outcome::Succeeded(openai_chat::StoredAnswer::of(&answer).to_value())
        }
        AnswerShape::Json => match json_answer(&answer) {
            Ok(value) => Outcome::Succeeded(value),
            Err(why) => Outcome::Failed(Reason::invalid_output(why)),
        },
    }
}

/// The JSON a task's answer text holds.
fn json_answer(answer: &Answer) -> Result<Value, String> {
    if let Some(refusal) = openai_chat::refusal(answer) {
        return Err(format!("the model refused: {refusal}"));
    }
    let text = answer
        .text
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or("the response has no text content")?;
    serde_json::from_str(text).map_err(|_| format!("the answer is not JSON: {text:?}"))
}

fn invalid(why: String) -> Outcome {
    Outcome::Failed(Reason::invalid_output(why))
}

fn no_answer(outcome: Outcome) -> Decoded {
    Decoded {
        answer: Err(outcome),
        usage: None,
    }
}

/// A whole answer's body read as the format's answer type: data that is
/// not JSON is unknown (cut or garbled: the provider may have answered);
/// JSON of the wrong shape is a definite failure.
fn read<T: DeserializeOwned>(bytes: &[u8], status: u16, name: &str) -> Result<T, Outcome> {
    serde_json::from_slice(bytes).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => invalid(format!("the answer is not a {name}: {e}")),
        _ => Outcome::Unknown(
            Reason::new(format!("the answer is truncated or garbled ({status})"))
                .with_detail(&e.to_string()),
        ),
    })
}

fn json<T: serde::Serialize>(body: &T) -> Vec<u8> {
    serde_json::to_vec(body).expect("a request serializes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::StopReason;

    fn answer(text: &str) -> Answer {
        Answer {
            text: Some(text.to_owned()),
            stop: StopReason::EndTurn,
            ..Answer::default()
        }
    }

    #[tokio::test]
    async fn a_task_answer_is_the_json_its_text_holds() {
        assert_eq!(
            conclude(AnswerShape::Json, answer(" {\"a\": 1} "), None).await,
            Outcome::Succeeded(serde_json::json!({"a": 1}))
        );
        let Outcome::Failed(reason) = conclude(AnswerShape::Json, answer("no"), None).await else {
            panic!()
        };
        assert!(reason.to_string().contains("not JSON"), "{reason}");
    }

    #[test]
    fn garbled_json_is_unknown_and_the_wrong_shape_definite() {
        let settings: ProviderSettings =
            toml::from_str("name = \"p\"\nkind = \"openai\"\nmodel = \"m\"").unwrap();
        let codec = Codec::from_settings(&settings);
        assert!(matches!(
            codec.decode(b"{\"choices\": [", 200).answer,
            Err(Outcome::Unknown(_))
        ));
        assert!(matches!(
            codec.decode(b"{\"choices\": 3}", 200).answer,
            Err(Outcome::Failed(_))
        ));
    }
}
