//! A fake AI provider: a tiny HTTP/1.1 server on 127.0.0.1, written over raw
//! tokio sockets so that it can misbehave at the byte level (hang, reset the
//! connection mid-body, lie about `Content-Length`, ...).
//!
//! Every connection serves exactly one request. Each request is recorded,
//! then answered with the next queued [`Behaviour`] (or the default one).
//! [`Behaviour::Hold`] keeps the answer back until the test releases it by
//! the request's `X-Request-Id` (the attempt id), so a test, not the clock,
//! orders a race.
//!
//! Here: what a test sets and reads ([`FakeProvider`], [`Behaviour`]) and the
//! serving of one connection. [`dialects`] holds what each provider kind
//! refuses and how its answers look; [`streams`] acts out a stream in each
//! kind's events; [`wire`] reads a request and writes an answer; [`config`]
//! writes onejob's configuration for fakes (re-exported here).

#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Notify};
use tokio::task::{AbortHandle, JoinSet};

mod config;
mod dialects;
mod streams;
mod wire;

pub use config::{
    answer, closed_port_url, config_of, one_fake_config, settled_attempt, strict_task_toml,
    ProviderToml, WAIT,
};
use dialects::{azure_refusal, bedrock_refusal, gemini_refusal, token_count};
use streams::{stream_answer, stream_anthropic, stream_converse, stream_gemini};
use wire::{read_request, respond, write_response};

/// Which provider's response body shape the server speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// OpenAI chat completions (`choices[0].message.content`).
    OpenAi,
    /// Anthropic messages (`content[0].text`).
    Anthropic,
    /// Azure OpenAI: OpenAI's bodies, at a deployment's path. Checks what the
    /// service checks before anything else: the path
    /// (`/openai/deployments/{deployment}/chat/completions`, else 404), an
    /// `api-version` query (else 404), and an `api-key` header or a bearer
    /// token (else 401), each refused with Azure's error envelope; a stream
    /// begins with Azure's `prompt_filter_results` chunk (no choices).
    Azure,
    /// Google's Gemini API: `/v1beta/models/{model}:generateContent`, and
    /// `:streamGenerateContent` with `alt=sse` only (events `data: …` with
    /// CRLF endings, no `[DONE]`). Refuses, in google.rpc.Status bodies, any
    /// other path (404), a key in the URL (400: keys go in the header), a
    /// missing `x-goog-api-key` (403) or another key (400), a stream
    /// without `alt=sse` (400), turns with roles other than `user` and
    /// `model`, and both response-schema forms at once (400).
    Gemini,
    /// AWS Bedrock's Converse API: `/model/{model id}/converse` and
    /// `converse-stream` (binary event-stream frames, written by AWS's own
    /// encoder). Every request's SigV4 signature is recomputed with AWS's
    /// own signer from the test credentials, the request's signed headers,
    /// its path and its body bytes; one off by a byte is refused (403
    /// `InvalidSignatureException`), as is a request signed for another
    /// service or region, or without the session token. Errors carry their
    /// type in `x-amzn-ErrorType` and `__type`.
    Bedrock,
}

/// How the server answers one request.
#[derive(Clone, Debug)]
pub enum Behaviour {
    /// 200 with a well-formed completion whose text content is
    /// `value.to_string()` (compact JSON).
    Answer(Value),
    /// 200 with a well-formed completion whose text content is this raw text
    /// (e.g. prose).
    AnswerText(String),
    /// As [`Behaviour::Answer`], with this `usage` member (in the
    /// provider's own shape) instead of the default one.
    AnswerWithUsage { value: Value, usage: Value },
    /// 200 with an answer that calls the tool `name` with `arguments` (an
    /// object), in the shape's own terms.
    AnswerToolCall { name: String, arguments: Value },
    /// Any status with this body; `retry_after` adds a `Retry-After: N`
    /// header (seconds).
    Status {
        status: u16,
        retry_after: Option<u64>,
        body: String,
    },
    /// Reads the request, then never answers (keeps the connection open until
    /// the server is dropped).
    Hang,
    /// Waits `ms` milliseconds, then behaves as `then`.
    Delay { ms: u64, then: Box<Behaviour> },
    /// Sends a 200 status line and headers with `Content-Length: 4096`, then
    /// about 40 bytes of body, then resets the connection (`SO_LINGER` 0).
    ResetMidBody,
    /// Sends a 200 with a `Content-Length` larger than the bytes actually
    /// sent, sends part of a JSON body, then closes cleanly.
    TruncatedBody,
    /// Holds the request until the test calls [`FakeProvider::release`] with
    /// its `X-Request-Id`, then behaves as the released behaviour.
    Hold,
    /// 200 `text/event-stream` in OpenAI's chunk format: a role chunk, then
    /// the steps in order; if no step ended it, a finish chunk, a usage
    /// chunk (when the request asked for usage) and `[DONE]`. A server of
    /// [`Shape::Anthropic`] speaks Anthropic's events instead:
    /// `message_start`, a text block's start, a `ping`, one
    /// `content_block_delta` per text step, then the block's stop,
    /// `message_delta` (stop reason and usage) and `message_stop`.
    Stream(Vec<StreamStep>),
}

/// One step of a streamed answer ([`Behaviour::Stream`]).
#[derive(Clone, Debug)]
pub enum StreamStep {
    /// A chunk whose delta content is this text.
    Text(String),
    /// Waits this many milliseconds.
    Wait(u64),
    /// Waits until the test opens this request's next gate
    /// ([`FakeProvider::open_gate`]): the test, not the clock, orders
    /// what the client sees against what the upstream sends.
    Gate,
    /// Sends nothing more and keeps the connection open.
    Stall,
    /// An error event (`data: {"error": …}`), then the connection closes.
    Error(String),
    /// Resets the connection.
    Reset,
}

impl Behaviour {
    /// A stream of these texts, one chunk each, at once.
    pub fn stream_of(texts: &[&str]) -> Self {
        Self::Stream(
            texts
                .iter()
                .map(|t| StreamStep::Text((*t).to_owned()))
                .collect(),
        )
    }
}

/// One request as the fake provider received it.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    /// Header names lowercased.
    pub headers: Vec<(String, String)>,
    /// The JSON body (`Value::Null` if absent or not JSON).
    pub body: Value,
    /// The body's bytes as they came (what a signature covers).
    pub raw: Vec<u8>,
}

impl RecordedRequest {
    /// The value of the first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

/// State shared between the handle and the server tasks.
struct State {
    queue: VecDeque<Behaviour>,
    default: Behaviour,
    requests: Vec<RecordedRequest>,
    /// Held requests by `X-Request-Id`, each waiting for its release.
    held: HashMap<String, oneshot::Sender<Behaviour>>,
    /// Every id ever held, in order.
    held_order: Vec<String>,
    /// When the queue is empty, requests take these in turn (then the default).
    rotation: Vec<Behaviour>,
    rotation_next: usize,
    /// Requests being answered now, and the most there ever were at once.
    open: usize,
    max_open: usize,
    /// Past this many requests at once, a request gets this behaviour.
    capacity: Option<(usize, Behaviour)>,
    /// Streams by `X-Request-Id`: gates waited at, gates opened, chunks sent.
    gates_reached: HashMap<String, usize>,
    gates_opened: HashMap<String, usize>,
    chunks_sent: HashMap<String, usize>,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled whenever a request is recorded or held.
    changed: Notify,
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running fake provider; dropping it stops the server and closes every
/// open connection.
pub struct FakeProvider {
    /// Like `http://127.0.0.1:PORT` (no trailing slash).
    pub base_url: String,
    state: Arc<Shared>,
    server: AbortHandle,
}

impl FakeProvider {
    /// Binds 127.0.0.1:0 and serves in a spawned tokio task.
    pub async fn start(shape: Shape) -> FakeProvider {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake provider");
        let addr = listener.local_addr().expect("fake provider address");
        let state = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                default: Behaviour::Answer(json!({"summary": "fake summary"})),
                requests: Vec::new(),
                held: HashMap::new(),
                held_order: Vec::new(),
                rotation: Vec::new(),
                rotation_next: 0,
                open: 0,
                max_open: 0,
                capacity: None,
                gates_reached: HashMap::new(),
                gates_opened: HashMap::new(),
                chunks_sent: HashMap::new(),
            }),
            changed: Notify::new(),
        });
        let server = tokio::spawn(serve(listener, shape, state.clone())).abort_handle();
        FakeProvider {
            base_url: format!("http://{addr}"),
            state,
            server,
        }
    }

    /// Queues a behaviour for the next request (FIFO). When the queue is
    /// empty, the default is used.
    pub fn push(&self, behaviour: Behaviour) {
        lock(&self.state).queue.push_back(behaviour);
    }

    /// Sets the default behaviour (initially
    /// `Answer(json!({"summary": "fake summary"}))`).
    pub fn set_default(&self, behaviour: Behaviour) {
        lock(&self.state).default = behaviour;
    }

    /// When the queue is empty, requests take these behaviours in turn
    /// (the first request the first one, and round again).
    pub fn set_rotation(&self, behaviours: Vec<Behaviour>) {
        let mut state = lock(&self.state);
        state.rotation = behaviours;
        state.rotation_next = 0;
    }

    /// Serves at most `requests` at once, as a provider's concurrency limit
    /// does: a request beyond them gets `refusal` instead.
    pub fn set_capacity(&self, requests: usize, refusal: Behaviour) {
        lock(&self.state).capacity = Some((requests, refusal));
    }

    /// The most requests it was answering at once.
    pub fn max_open(&self) -> usize {
        lock(&self.state).max_open
    }

    /// How many requests carried this `X-Request-Id` header value.
    pub fn requests_for(&self, request_id: &str) -> usize {
        lock(&self.state)
            .requests
            .iter()
            .filter(|request| request.header("x-request-id") == Some(request_id))
            .count()
    }

    /// How many requests the server has received.
    pub fn total_requests(&self) -> usize {
        lock(&self.state).requests.len()
    }

    /// Every request received so far, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.state).requests.clone()
    }

    /// The most recent request, if any.
    pub fn last_request(&self) -> Option<RecordedRequest> {
        lock(&self.state).requests.last().cloned()
    }

    /// Waits until a request with this `X-Request-Id` is held (panics after
    /// 20 s: the worker never sent it).
    pub async fn wait_held(&self, request_id: &str) {
        self.wait_until(&format!("request {request_id} to be held"), |state| {
            state.held.contains_key(request_id)
        })
        .await;
    }

    /// Waits until `n` requests have been held in all, and returns their
    /// ids in the order they arrived.
    pub async fn wait_held_count(&self, n: usize) -> Vec<String> {
        self.wait_until(&format!("{n} held requests"), |state| {
            state.held_order.len() >= n
        })
        .await;
        lock(&self.state).held_order[..n].to_vec()
    }

    /// Waits until `n` requests have been received in all.
    pub async fn wait_requests(&self, n: usize) {
        self.wait_until(&format!("{n} requests"), |state| state.requests.len() >= n)
            .await;
    }

    async fn wait_until(&self, what: &str, done: impl Fn(&State) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let changed = self.state.changed.notified();
            if done(&lock(&self.state)) {
                return;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                panic!("the fake provider waited 20 s for {what}");
            }
        }
    }

    /// Waits until the stream of `request_id` waits at its `n`th gate (from 1).
    pub async fn wait_gate(&self, request_id: &str, n: usize) {
        self.wait_until(&format!("stream {request_id} to reach gate {n}"), |state| {
            state.gates_reached.get(request_id).copied().unwrap_or(0) >= n
        })
        .await;
    }

    /// Lets the stream of `request_id` past its next gate.
    pub fn open_gate(&self, request_id: &str) {
        *lock(&self.state)
            .gates_opened
            .entry(request_id.to_owned())
            .or_default() += 1;
        self.state.changed.notify_waiters();
    }

    /// How many text chunks the stream of `request_id` has sent.
    pub fn chunks_sent(&self, request_id: &str) -> usize {
        lock(&self.state)
            .chunks_sent
            .get(request_id)
            .copied()
            .unwrap_or(0)
    }

    /// The `X-Request-Id` of every request received, oldest first.
    pub fn request_ids(&self) -> Vec<String> {
        lock(&self.state)
            .requests
            .iter()
            .filter_map(|r| r.header("x-request-id").map(str::to_owned))
            .collect()
    }

    /// Lets a held request go on as `behaviour`. Panics if it is not held.
    pub fn release(&self, request_id: &str, behaviour: Behaviour) {
        let sender = lock(&self.state)
            .held
            .remove(request_id)
            .unwrap_or_else(|| panic!("request {request_id} is not held"));
        // The client may have gone away; the test learns that from its own checks.
        let _ = sender.send(behaviour);
    }
}

impl FakeProvider {
    /// A base URL to replace (`ProviderToml::base_url`) once a fake runs.
    pub fn placeholder() -> String {
        "http://127.0.0.1:9".to_owned()
    }
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        // The accept loop owns the `JoinSet` of connection tasks; aborting it
        // drops the set, which aborts every connection (hanging ones too).
        self.server.abort();
    }
}

/// Accepts connections forever, one task per connection.
async fn serve(listener: TcpListener, shape: Shape, state: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        while connections.try_join_next().is_some() {}
        connections.spawn(handle(stream, shape, state.clone()));
    }
}

/// Serves one connection: reads and records a request, then answers it.
async fn handle(mut stream: TcpStream, shape: Shape, state: Arc<Shared>) {
    let Some(request) = read_request(&mut stream).await else {
        return;
    };
    let model = request
        .body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("fake")
        .to_owned();
    let request_id = request
        .header("x-request-id")
        .unwrap_or_default()
        .to_owned();
    let refused = match shape {
        Shape::Azure => azure_refusal(&request),
        Shape::Gemini => gemini_refusal(&request),
        Shape::Bedrock => bedrock_refusal(&request),
        _ => None,
    };
    // Token counters answer at once, a word a token, in each API's terms.
    if let (Some(count), None) = (token_count(shape, &request), &refused) {
        lock(&state).requests.push(request);
        let _ = write_response(&mut stream, 200, None, &count.to_string()).await;
        return;
    }
    if let Some((status, body)) = refused {
        lock(&state).requests.push(request);
        let _ = write_response(&mut stream, status, None, &body).await;
        return;
    }
    let mut behaviour = {
        let mut guard = lock(&state);
        guard.requests.push(request);
        guard.open += 1;
        guard.max_open = guard.max_open.max(guard.open);
        let over = match &guard.capacity {
            Some((requests, refusal)) if guard.open > *requests => Some(refusal.clone()),
            _ => None,
        };
        match (over, guard.queue.pop_front()) {
            (Some(refusal), _) => refusal,
            (None, Some(behaviour)) => behaviour,
            (None, None) if !guard.rotation.is_empty() => {
                let next = guard.rotation_next % guard.rotation.len();
                guard.rotation_next += 1;
                guard.rotation[next].clone()
            }
            (None, None) => guard.default.clone(),
        }
    };
    state.changed.notify_waiters();
    // Counted as open until this connection is done, however it ends.
    struct Open(Arc<Shared>);
    impl Drop for Open {
        fn drop(&mut self) {
            let mut state = lock(&self.0);
            state.open = state.open.saturating_sub(1);
        }
    }
    let _open = Open(state.clone());
    let behaviour = loop {
        behaviour = match behaviour {
            Behaviour::Delay { ms, then } => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                *then
            }
            Behaviour::Hold => {
                let (sender, released) = oneshot::channel();
                {
                    let mut guard = lock(&state);
                    guard.held.insert(request_id.clone(), sender);
                    guard.held_order.push(request_id.clone());
                }
                state.changed.notify_waiters();
                match released.await {
                    Ok(behaviour) => behaviour,
                    // The provider was dropped: nothing to answer.
                    Err(_) => return,
                }
            }
            other => break other,
        };
    };
    // Write errors just mean the client went away.
    let stops = request_stop_sequences(&state, &request_id);
    if let Behaviour::Stream(steps) = behaviour {
        let usage = request_asks_usage(&state, &request_id);
        let _ = match shape {
            Shape::OpenAi | Shape::Azure => {
                stream_answer(stream, &steps, &model, &request_id, usage, shape, &state).await
            }
            Shape::Anthropic => {
                stream_anthropic(stream, &steps, &model, &request_id, &stops, &state).await
            }
            Shape::Gemini => stream_gemini(stream, &steps, &request_id, &state).await,
            Shape::Bedrock => stream_converse(stream, &steps, &request_id, &state).await,
        };
        return;
    }
    let _ = respond(stream, behaviour, shape, &model, &stops).await;
}

/// The stop sequences the request of `request_id` set (Anthropic's
/// `stop_sequences`, OpenAI's `stop`): the fake stops its answer before the
/// first it would write, as a model does.
fn request_stop_sequences(state: &Shared, request_id: &str) -> Vec<String> {
    let guard = lock(state);
    let Some(request) = guard
        .requests
        .iter()
        .rev()
        .find(|r| r.header("x-request-id") == Some(request_id))
    else {
        return Vec::new();
    };
    let stops = match (&request.body["stop_sequences"], &request.body["stop"]) {
        (Value::Array(list), _) | (_, Value::Array(list)) => list.clone(),
        (_, Value::String(one)) => vec![Value::String(one.clone())],
        _ => Vec::new(),
    };
    stops
        .iter()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

/// Where `text` meets the first of `stops` it contains: the text before it
/// and the sequence met.
fn cut_at_stop<'a>(text: &'a str, stops: &'a [String]) -> Option<(&'a str, &'a str)> {
    stops
        .iter()
        .filter(|stop| !stop.is_empty())
        .filter_map(|stop| text.find(stop.as_str()).map(|at| (at, stop.as_str())))
        .min_by_key(|(at, _)| *at)
        .map(|(at, stop)| (&text[..at], stop))
}

/// Whether the request of `request_id` asked for usage in its stream.
fn request_asks_usage(state: &Shared, request_id: &str) -> bool {
    lock(state)
        .requests
        .iter()
        .rev()
        .find(|r| r.header("x-request-id") == Some(request_id))
        .is_some_and(|r| r.body["stream_options"]["include_usage"] == true)
}
