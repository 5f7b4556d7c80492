//! A reader of server-sent events over a live response, event by event, so
//! a scenario can act between two events (open the fake upstream's gate,
//! hang up). Every wait is bounded: a stream that stops sending fails the
//! scenario after [`WAIT`] instead of hanging it.

#![allow(dead_code)]

use std::time::Duration;

use serde_json::Value;

/// How long one event may take to arrive.
pub const WAIT: Duration = Duration::from_secs(20);

/// One event: its `id:` (if it had one), its `event:` name (if it had
/// one) and its `data:`.
#[derive(Debug, Clone, PartialEq)]
pub struct SseEvent {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: String,
}

impl SseEvent {
    /// The data as JSON (`Value::Null` for `[DONE]` or anything else).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or(Value::Null)
    }

    /// The content of a chunk's delta, if it has some.
    pub fn content(&self) -> Option<String> {
        self.json()["choices"][0]["delta"]["content"]
            .as_str()
            .map(str::to_owned)
    }

    pub fn is_done(&self) -> bool {
        self.data == "[DONE]"
    }

    /// The error code of an error event.
    pub fn error_code(&self) -> Option<String> {
        self.json()["error"]["code"].as_str().map(str::to_owned)
    }
}

/// The concatenated text of the `content_block_delta` events among
/// `events` (Anthropic's stream, as `/v1/messages` sends it).
pub fn text_of(events: &[SseEvent]) -> String {
    events
        .iter()
        .filter(|e| e.event.as_deref() == Some("content_block_delta"))
        .filter_map(|e| e.json()["delta"]["text"].as_str().map(str::to_owned))
        .collect()
}

/// The concatenated content of the chunks among `events`.
pub fn content_of(events: &[SseEvent]) -> String {
    events.iter().filter_map(SseEvent::content).collect()
}

pub struct SseReader {
    response: reqwest::Response,
    buffer: String,
    ended: bool,
}

impl SseReader {
    pub fn new(response: reqwest::Response) -> Self {
        assert!(
            response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream")),
            "not an event stream: {response:?}"
        );
        Self {
            response,
            buffer: String::new(),
            ended: false,
        }
    }

    /// The next event; `None` once the response has ended.
    pub async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut event = SseEvent {
                    id: None,
                    event: None,
                    data: String::new(),
                };
                for line in block.lines() {
                    if let Some(id) = line.strip_prefix("id: ") {
                        event.id = Some(id.to_owned());
                    } else if let Some(name) = line.strip_prefix("event: ") {
                        event.event = Some(name.to_owned());
                    } else if let Some(data) = line.strip_prefix("data: ") {
                        event.data.push_str(data);
                    }
                }
                // A block of comments only (a keep-alive) is no event.
                if block
                    .lines()
                    .all(|line| line.is_empty() || line.starts_with(':'))
                {
                    continue;
                }
                return Some(event);
            }
            if self.ended {
                return None;
            }
            let chunk = tokio::time::timeout(WAIT, self.response.chunk())
                .await
                .unwrap_or_else(|_| panic!("no event within {WAIT:?}; so far: {:?}", self.buffer))
                .expect("the stream reads");
            match chunk {
                Some(bytes) => self.buffer.push_str(&String::from_utf8_lossy(&bytes)),
                None => self.ended = true,
            }
        }
    }

    /// Events until one has content (returned last).
    pub async fn until_content(&mut self) -> Vec<SseEvent> {
        let mut events = Vec::new();
        loop {
            let event = self.next().await.expect("a content chunk before the end");
            let has_content = event.content().is_some_and(|c| !c.is_empty());
            events.push(event);
            if has_content {
                return events;
            }
        }
    }

    /// Every event to the end of the response.
    pub async fn rest(&mut self) -> Vec<SseEvent> {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            events.push(event);
        }
        events
    }
}
