//! A streamed answer put together from its events, whatever format it
//! streamed in: the answer stored is exactly what was streamed.

use super::model::{Answer, Delta, StopReason, StreamEvent, TokenCounts, ToolCall};

/// The most tool calls one answer may stream (an index past it is refused
/// as invalid output, not grown into).
pub const MAX_TOOL_CALLS: usize = 128;

/// The answer so far.
#[derive(Debug, Default)]
pub struct Assembly {
    text: String,
    has_text: bool,
    tool_calls: Vec<ToolCall>,
    stop: Option<StopReason>,
    usage: Option<TokenCounts>,
}

impl Assembly {
    /// Takes in one event (not `Done` or `Failed`, which end the stream);
    /// returns the delta to hand on, if it adds to the answer.
    pub fn add(&mut self, event: StreamEvent) -> Result<Option<Delta>, String> {
        match event {
            StreamEvent::Delta(delta) => self.add_delta(delta),
            StreamEvent::Stop(stop) => {
                self.stop = Some(stop);
                Ok(None)
            }
            StreamEvent::Usage(usage) => {
                self.usage = Some(usage);
                Ok(None)
            }
            StreamEvent::Done | StreamEvent::Failed(_) => Ok(None),
        }
    }

    fn add_delta(&mut self, delta: Delta) -> Result<Option<Delta>, String> {
        if let Some(text) = delta.text.as_deref().filter(|t| !t.is_empty()) {
            self.text.push_str(text);
            self.has_text = true;
        }
        for call in &delta.tool_calls {
            if call.index >= MAX_TOOL_CALLS {
                return Err(format!(
                    "the stream has more than {MAX_TOOL_CALLS} tool calls"
                ));
            }
            while self.tool_calls.len() <= call.index {
                self.tool_calls.push(ToolCall {
                    id: String::new(),
                    name: String::new(),
                    arguments: String::new(),
                });
            }
            let known = &mut self.tool_calls[call.index];
            if let Some(id) = &call.id {
                known.id.clone_from(id);
            }
            // Appended in place: an answer of many small pieces costs its
            // length, not its length squared.
            if let Some(name) = &call.name {
                known.name.push_str(name);
            }
            if let Some(arguments) = &call.arguments {
                known.arguments.push_str(arguments);
            }
        }
        Ok((!delta.is_empty()).then_some(delta))
    }

    /// Whether the stream said why it ended.
    pub fn finished(&self) -> bool {
        self.stop.is_some()
    }

    /// What the stream's usage says the call used.
    pub fn usage(&self) -> Option<TokenCounts> {
        self.usage
    }

    /// The answer, as a whole one would have given it: no text beside tool
    /// calls is `None`.
    pub fn answer(self) -> Answer {
        let text = (self.has_text || self.tool_calls.is_empty()).then_some(self.text);
        Answer {
            text,
            tool_calls: self.tool_calls,
            stop: self.stop.unwrap_or_default(),
            usage: self.usage.unwrap_or_default(),
            message_extras: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::model::ToolCallDelta;

    #[test]
    fn the_answer_is_the_deltas_put_together() {
        let mut assembly = Assembly::default();
        let handed: Vec<Option<Delta>> = [
            StreamEvent::Delta(Delta::text("Hel")),
            StreamEvent::Delta(Delta::text("")),
            StreamEvent::Delta(Delta::text("lo")),
            StreamEvent::Stop(StopReason::EndTurn),
            StreamEvent::Usage(TokenCounts {
                input: 2,
                output: 3,
                ..TokenCounts::default()
            }),
        ]
        .into_iter()
        .map(|event| assembly.add(event).unwrap())
        .collect();
        assert_eq!(
            handed,
            [
                Some(Delta::text("Hel")),
                None,
                Some(Delta::text("lo")),
                None,
                None
            ]
        );
        assert!(assembly.finished());
        let answer = assembly.answer();
        assert_eq!(answer.text(), "Hello");
        assert_eq!(answer.usage.total(), 5);
    }

    #[test]
    fn tool_calls_are_named_once_and_their_arguments_added_up() {
        let piece = |id: Option<&str>, name: Option<&str>, arguments: &str| {
            StreamEvent::Delta(Delta {
                text: None,
                tool_calls: vec![ToolCallDelta {
                    index: 0,
                    id: id.map(str::to_owned),
                    name: name.map(str::to_owned),
                    arguments: Some(arguments.to_owned()),
                }],
            })
        };
        let mut assembly = Assembly::default();
        assembly
            .add(piece(Some("c1"), Some("f"), "{\"a\""))
            .unwrap();
        assembly.add(piece(None, None, ":1}")).unwrap();
        assembly
            .add(StreamEvent::Stop(StopReason::ToolUse))
            .unwrap();
        let answer = assembly.answer();
        assert_eq!(answer.text, None, "no text beside tool calls");
        assert_eq!(
            answer.tool_calls,
            [ToolCall {
                id: "c1".into(),
                name: "f".into(),
                arguments: "{\"a\":1}".into()
            }]
        );
        let far = StreamEvent::Delta(Delta {
            text: None,
            tool_calls: vec![ToolCallDelta {
                index: 100_000,
                ..ToolCallDelta::default()
            }],
        });
        assert!(Assembly::default().add(far).is_err());
    }
}
