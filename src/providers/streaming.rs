//! Streamed answers: the transport's framing (server-sent events, parsed by
//! `eventsource-stream`; AWS's binary event stream, decoded by
//! `aws-smithy-eventstream`), each event read by its format's codec (a
//! [`StreamReader`]), each delta handed on as it arrives, and the answer
//! built from the deltas ([`Assembly`]), so the stored answer is exactly
//! what was streamed.
//!
//! The role, the stop reason and the usage are not deltas: they are part of
//! the final answer, which onejob sends at the stream's end.

use eventsource_stream::{EventStreamError, Eventsource};
use futures_util::StreamExt;
use tokio::sync::mpsc;

use crate::chat::assembly::Assembly;
use crate::chat::{Answer, Delta, StreamError, StreamEvent, StreamReader, TokenCounts};
use crate::domain::outcome::Reason;
use crate::domain::Outcome;

/// Where a streaming call hands each delta as it arrives.
pub type DeltaSink = mpsc::Sender<Delta>;

/// How a stream ended: the answer built from its deltas, or the outcome
/// it ended in instead; and the usage it told either way.
#[derive(Debug)]
pub struct Streamed {
    pub ended: Result<Answer, Outcome>,
    pub usage: Option<TokenCounts>,
    /// The model the stream's events named, for a traced call.
    pub model: Option<String>,
}

/// Why reading a stream's bytes stopped early.
#[derive(Debug)]
enum ReadError {
    Transport(reqwest::Error),
    TooLarge,
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Transport(e) => write!(f, "{}", super::error_chain(e)),
            Self::TooLarge => f.write_str("too large"),
        }
    }
}

fn too_large(cap: usize) -> Outcome {
    Outcome::Failed(Reason::invalid_output(format!(
        "the streamed answer is larger than the {cap} bytes allowed (max_response_bytes)"
    )))
}

fn unfinished() -> Outcome {
    Outcome::Unknown(Reason::new(
        "the stream ended before the answer was finished",
    ))
}

/// What the stream's data amounts to, as an outcome when it ends it.
fn stream_error(error: StreamError) -> Outcome {
    match error {
        StreamError::Garbled(detail) => {
            Outcome::Unknown(Reason::new("the stream sent garbled data").with_detail(&detail))
        }
        StreamError::Invalid(why) => Outcome::Failed(Reason::invalid_output(why)),
    }
}

/// The answer being streamed, and where its deltas go.
struct Taking<'a> {
    assembly: Assembly,
    sink: &'a DeltaSink,
}

impl Taking<'_> {
    /// Takes in one event's worth; `Some` when the stream is over (its
    /// answer complete, or ended in an outcome).
    async fn take(&mut self, events: Vec<StreamEvent>) -> Option<Result<(), Outcome>> {
        for event in events {
            match event {
                StreamEvent::Done => return Some(Ok(())),
                StreamEvent::Failed(why) => return Some(Err(Outcome::Failed(Reason::new(why)))),
                event => match self.assembly.add(event) {
                    Ok(Some(delta)) => {
                        // The worker stopped listening (a timeout).
                        if self.sink.send(delta).await.is_err() {
                            return Some(Err(Outcome::Unknown(Reason::new(
                                "the stream was abandoned",
                            ))));
                        }
                    }
                    Ok(None) => {}
                    Err(why) => return Some(Err(Outcome::Failed(Reason::invalid_output(why)))),
                },
            }
        }
        None
    }

    fn ended(self, ended: Result<(), Outcome>) -> Streamed {
        let usage = self.assembly.usage();
        Streamed {
            ended: ended.map(|()| self.assembly.answer()),
            usage,
            model: None,
        }
    }
}

/// Reads a provider's server-sent events to their end, each read by
/// `reader`, handing each delta to `sink` as it arrives, at most `cap`
/// bytes in all. What it ends in:
///
/// - `[DONE]` or the format's last event, or the end of the body after a
///   stop reason: the answer built from the deltas;
/// - an error event: a definite failure (the provider ended the answer);
/// - a cut connection, a body that ends unfinished, or garbled data:
///   unknown (the provider may have finished and billed);
/// - more than `cap` bytes: a definite failure (`invalid_output`), as for
///   an answer too large to read whole.
pub async fn read_sse(
    response: reqwest::Response,
    cap: usize,
    mut reader: Box<dyn StreamReader>,
    sink: &DeltaSink,
    traced: bool,
) -> Streamed {
    let mut model = None;
    let mut read = 0usize;
    let bytes = response.bytes_stream().map(move |chunk| {
        let chunk = chunk.map_err(ReadError::Transport)?;
        read += chunk.len();
        if read > cap {
            return Err(ReadError::TooLarge);
        }
        Ok(chunk)
    });
    let mut events = Box::pin(bytes.eventsource());
    let mut taking = Taking {
        assembly: Assembly::default(),
        sink,
    };
    let ended = loop {
        let event = match events.next().await {
            None if taking.assembly.finished() => break Ok(()),
            None => break Err(unfinished()),
            Some(Ok(event)) => event,
            Some(Err(EventStreamError::Transport(ReadError::TooLarge))) => {
                break Err(too_large(cap))
            }
            Some(Err(e)) => {
                let detail = match e {
                    EventStreamError::Transport(e) => e.to_string(),
                    EventStreamError::Utf8(e) => e.to_string(),
                    EventStreamError::Parser(e) => e.to_string(),
                };
                break Err(Outcome::Unknown(
                    Reason::new("the stream was cut off").with_detail(&detail),
                ));
            }
        };
        let data = event.data.trim();
        if data == "[DONE]" {
            break Ok(());
        }
        if data.is_empty() {
            continue;
        }
        if traced && model.is_none() {
            model = super::AnswerFacts::model_named(data.as_bytes());
        }
        let read = match reader.read(&event.event, data) {
            Ok(read) => read,
            Err(error) => break Err(stream_error(error)),
        };
        if let Some(ended) = taking.take(read).await {
            break ended;
        }
    };
    Streamed {
        model,
        ..taking.ended(ended)
    }
}

/// Reads AWS's binary event stream (Bedrock's ConverseStream) to its end,
/// frame by frame with AWS's own decoder, each event read by Bedrock's
/// codec, under the same rules as [`read_sse`]: an exception frame or a
/// stop for a guardrail is a definite failure, a cut or garbled stream
/// unknown, more than `cap` bytes a definite failure.
pub async fn read_aws_event_stream(
    mut response: reqwest::Response,
    cap: usize,
    sink: &DeltaSink,
) -> Streamed {
    use crate::chat::bedrock::EventReader;
    use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder};
    let mut decoder = MessageFrameDecoder::new();
    let mut buffer = bytes::BytesMut::new();
    let mut read = 0usize;
    let mut reader = EventReader::default();
    let mut taking = Taking {
        assembly: Assembly::default(),
        sink,
    };
    let ended = 'stream: loop {
        let chunk = match response.chunk().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) if taking.assembly.finished() => break Ok(()),
            Ok(None) => break Err(unfinished()),
            Err(e) => {
                break Err(Outcome::Unknown(
                    Reason::new("the stream was cut off").with_detail(&super::error_chain(&e)),
                ))
            }
        };
        read += chunk.len();
        if read > cap {
            break Err(too_large(cap));
        }
        buffer.extend_from_slice(&chunk);
        loop {
            let message = match decoder.decode_frame(&mut buffer) {
                Ok(DecodedFrame::Complete(message)) => message,
                Ok(DecodedFrame::Incomplete) => break,
                Err(e) => {
                    break 'stream Err(Outcome::Unknown(
                        Reason::new("the stream sent a garbled frame").with_detail(&e.to_string()),
                    ))
                }
            };
            let payload = match super::bedrock::payload_of(&message) {
                Ok(payload) => payload,
                Err(e) => break 'stream Err(stream_error(StreamError::Garbled(e))),
            };
            let events = match super::bedrock::header_of(&message, ":message-type").as_str() {
                "event" => {
                    let name = super::bedrock::header_of(&message, ":event-type");
                    match reader.read(&name, &payload) {
                        Ok(events) => events,
                        Err(error) => break 'stream Err(stream_error(error)),
                    }
                }
                "exception" => {
                    let kind = super::bedrock::header_of(&message, ":exception-type");
                    vec![reader.exception(&kind, &payload)]
                }
                _ => {
                    let kind = super::bedrock::header_of(&message, ":error-code");
                    vec![reader.exception(&kind, &payload)]
                }
            };
            if let Some(ended) = taking.take(events).await {
                break 'stream ended;
            }
        }
    };
    taking.ended(ended)
}
