//! A fake AI provider: a tiny HTTP/1.1 server on 127.0.0.1, written over raw
//! tokio sockets so that it can misbehave at the byte level (hang, reset the
//! connection mid-body, lie about `Content-Length`, ...).
//!
//! Every connection serves exactly one request. Each request is recorded,
//! then answered with the next queued [`Behaviour`] (or the default one).
//! [`Behaviour::Hold`] keeps the answer back until the test releases it by
//! the request's `X-Request-Id` (the attempt id), so a test, not the clock,
//! orders a race.

#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Notify};
use tokio::task::{AbortHandle, JoinSet};

/// Largest request head (request line and headers) the server accepts.
const MAX_HEAD: usize = 64 * 1024;
/// Largest request body the server accepts.
const MAX_BODY: usize = 16 * 1024 * 1024;

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

/// What Bedrock refuses before it answers: the status and body, with the
/// error type for `x-amzn-ErrorType`.
fn bedrock_refusal(request: &RecordedRequest) -> Option<(u16, String)> {
    let refuse = |code: u16, kind: &str, message: &str| {
        Some((
            code,
            json!({"__type": kind, "message": message}).to_string(),
        ))
    };
    let (path, _) = request.path.split_once('?').unwrap_or((&request.path, ""));
    let operation = path
        .strip_prefix("/model/")
        .and_then(|rest| rest.rsplit_once('/'))
        .map(|(_, operation)| operation);
    if !matches!(
        operation,
        Some("converse" | "converse-stream" | "count-tokens")
    ) {
        return refuse(404, "UnknownOperationException", "no such operation");
    }
    if let Err(why) = crate::support::aws::verify_sigv4(request) {
        return refuse(403, "InvalidSignatureException", &why);
    }
    if operation == Some("count-tokens") {
        return request.body["input"]["converse"]["messages"]
            .as_array()
            .is_none()
            .then(|| (400, json!({"__type": "ValidationException", "message": "input.converse is required"}).to_string()));
    }
    let turns = request.body["messages"].as_array();
    let roles_ok = turns.is_some_and(|turns| {
        !turns.is_empty()
            && turns
                .iter()
                .all(|t| matches!(t["role"].as_str(), Some("user" | "assistant")))
    });
    if !roles_ok {
        return refuse(
            400,
            "ValidationException",
            "messages: each role is user or assistant",
        );
    }
    let schema = &request.body["outputConfig"]["textFormat"]["structure"]["jsonSchema"]["schema"];
    if !schema.is_null() && !schema.is_string() {
        return refuse(
            400,
            "ValidationException",
            "outputConfig...jsonSchema.schema must be a string",
        );
    }
    None
}

/// A Converse answer whose text is `text`.
fn converse_answer(text: &str) -> Value {
    json!({
        "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
        "stopReason": "end_turn",
        "usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2},
        "metrics": {"latencyMs": 1},
    })
}

/// The answer of a token-counting endpoint, if `request` asks one:
/// Anthropic's `POST /v1/messages/count_tokens`, Gemini's `countTokens`,
/// Bedrock's `count-tokens`; a word of the request's text a token.
fn token_count(shape: Shape, request: &RecordedRequest) -> Option<Value> {
    let words =
        |texts: Vec<&str>| -> usize { texts.iter().map(|t| t.split_whitespace().count()).sum() };
    let body = &request.body;
    match shape {
        Shape::Anthropic if request.path == "/v1/messages/count_tokens" => {
            let texts = body["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|m| m["content"].as_str())
                .collect();
            Some(json!({"input_tokens": words(texts)}))
        }
        Shape::Gemini if request.path.ends_with(":countTokens") => {
            let texts = body["contents"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|turn| turn["parts"].as_array().into_iter().flatten())
                .filter_map(|part| part["text"].as_str())
                .collect();
            Some(json!({"totalTokens": words(texts)}))
        }
        Shape::Bedrock if request.path.ends_with("/count-tokens") => {
            let texts = body["input"]["converse"]["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|m| m["content"].as_array().into_iter().flatten())
                .filter_map(|block| block["text"].as_str())
                .collect();
            Some(json!({"inputTokens": words(texts)}))
        }
        _ => None,
    }
}

/// A google.rpc.Status error body.
fn google_status(code: u16, status: &str, message: &str) -> String {
    json!({"error": {"code": code, "message": message, "status": status}}).to_string()
}

/// What the Gemini API refuses before it answers.
fn gemini_refusal(request: &RecordedRequest) -> Option<(u16, String)> {
    let refuse =
        |code: u16, status: &str, message: &str| Some((code, google_status(code, status, message)));
    let (path, query) = request.path.split_once('?').unwrap_or((&request.path, ""));
    let Some((_, method)) = path
        .strip_prefix("/v1beta/models/")
        .and_then(|rest| rest.split_once(':'))
        .filter(|(model, _)| !model.is_empty() && !model.contains('/'))
    else {
        return refuse(404, "NOT_FOUND", "Requested entity was not found.");
    };
    if !["generateContent", "streamGenerateContent", "countTokens"].contains(&method) {
        return refuse(404, "NOT_FOUND", "Requested entity was not found.");
    }
    let params: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
    if params.iter().any(|p| p.starts_with("key=")) {
        return refuse(
            400,
            "INVALID_ARGUMENT",
            "API keys go in the x-goog-api-key header, never in the URL.",
        );
    }
    match request.header("x-goog-api-key") {
        None => {
            return refuse(
                403,
                "PERMISSION_DENIED",
                "Method doesn't allow unregistered callers.",
            )
        }
        Some(key) if key != crate::support::harness::FAKE_API_KEY => {
            return refuse(
                400,
                "INVALID_ARGUMENT",
                "API key not valid. Please pass a valid API key.",
            )
        }
        Some(_) => {}
    }
    if method == "streamGenerateContent" && !params.contains(&"alt=sse") {
        return refuse(
            400,
            "INVALID_ARGUMENT",
            "this server streams only with alt=sse",
        );
    }
    if method == "countTokens" {
        return None;
    }
    let contents = request.body["contents"].as_array();
    let roles_ok = contents.is_some_and(|turns| {
        !turns.is_empty()
            && turns
                .iter()
                .all(|t| matches!(t["role"].as_str(), None | Some("user" | "model")))
    });
    if !roles_ok {
        return refuse(
            400,
            "INVALID_ARGUMENT",
            "contents: each turn's role is user or model",
        );
    }
    let config = &request.body["generationConfig"];
    if config.get("responseSchema").is_some() && config.get("responseJsonSchema").is_some() {
        return refuse(
            400,
            "INVALID_ARGUMENT",
            "responseSchema and responseJsonSchema are exclusive",
        );
    }
    None
}

/// A Gemini answer whose text is `text`.
fn gemini_answer(text: &str, finish: &str, model: &str) -> Value {
    json!({
        "candidates": [{"content": {"role": "model", "parts": [{"text": text}]},
                        "finishReason": finish, "index": 0}],
        "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 1, "totalTokenCount": 2},
        "modelVersion": model,
    })
}

/// What Azure OpenAI refuses before it looks at a request: the status and
/// its error body, or `None`.
fn azure_refusal(request: &RecordedRequest) -> Option<(u16, String)> {
    let error = |code: u16, message: &str| {
        Some((
            code,
            json!({"error": {"code": code.to_string(), "message": message}}).to_string(),
        ))
    };
    let (path, query) = request.path.split_once('?').unwrap_or((&request.path, ""));
    let deployment = path
        .strip_prefix("/openai/deployments/")
        .and_then(|rest| rest.strip_suffix("/chat/completions"))
        .filter(|d| !d.is_empty() && !d.contains('/'));
    if deployment.is_none() {
        return error(404, "Resource not found");
    }
    if !query
        .split('&')
        .any(|pair| pair.starts_with("api-version=") && pair.len() > "api-version=".len())
    {
        return error(404, "Resource not found");
    }
    let keyed = request.header("api-key").is_some_and(|k| !k.is_empty());
    let bearer = request
        .header("authorization")
        .is_some_and(|a| a.starts_with("Bearer ") && a.len() > 7);
    if keyed == bearer {
        return error(
            401,
            "Access denied due to invalid subscription key or wrong API endpoint. Make sure to \
             provide a valid key for an active subscription and use a correct regional API \
             endpoint for your resource.",
        );
    }
    None
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

/// Acts out a [`Behaviour::Stream`].
/// Counts a chunk the stream of `request_id` sent, and tells the waiters.
fn chunk_sent(state: &Shared, request_id: &str) {
    *lock(state)
        .chunks_sent
        .entry(request_id.to_owned())
        .or_default() += 1;
    state.changed.notify_waiters();
}

/// Holds the stream of `request_id` at its `gate`-th gate until the test
/// has opened that many.
async fn hold_at_gate(state: &Shared, request_id: &str, gate: usize) {
    *lock(state)
        .gates_reached
        .entry(request_id.to_owned())
        .or_default() += 1;
    state.changed.notify_waiters();
    loop {
        let changed = state.changed.notified();
        if lock(state)
            .gates_opened
            .get(request_id)
            .copied()
            .unwrap_or(0)
            >= gate
        {
            break;
        }
        changed.await;
    }
}

async fn stream_answer(
    mut stream: TcpStream,
    steps: &[StreamStep],
    model: &str,
    request_id: &str,
    usage: bool,
    shape: Shape,
    state: &Shared,
) -> std::io::Result<()> {
    let chunk = |delta: Value, finish: Value| {
        let chunk = json!({
            "id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        format!("data: {chunk}\n\n")
    };
    stream
        .write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\
              Connection: close\r\n\r\n",
        )
        .await?;
    if shape == Shape::Azure {
        // Azure's first event: the prompt's filter results, no choices.
        let filtered = json!({"id": "", "object": "", "created": 0, "model": "", "choices": [],
            "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {
                "hate": {"filtered": false, "severity": "safe"}}}]});
        stream
            .write_all(format!("data: {filtered}\n\n").as_bytes())
            .await?;
    }
    stream
        .write_all(chunk(json!({"role": "assistant", "content": ""}), Value::Null).as_bytes())
        .await?;
    stream.flush().await?;
    let mut gates = 0;
    for step in steps {
        match step {
            StreamStep::Text(text) => {
                stream
                    .write_all(chunk(json!({ "content": text }), Value::Null).as_bytes())
                    .await?;
                stream.flush().await?;
                chunk_sent(state, request_id);
            }
            StreamStep::Wait(ms) => tokio::time::sleep(Duration::from_millis(*ms)).await,
            StreamStep::Gate => {
                gates += 1;
                hold_at_gate(state, request_id, gates).await;
            }
            StreamStep::Stall => {
                std::future::pending::<()>().await;
            }
            StreamStep::Error(message) => {
                let error = json!({"error": {"message": message, "type": "server_error"}});
                stream
                    .write_all(format!("data: {error}\n\n").as_bytes())
                    .await?;
                return stream.shutdown().await;
            }
            StreamStep::Reset => {
                stream.set_zero_linger()?;
                drop(stream);
                return Ok(());
            }
        }
    }
    stream
        .write_all(chunk(json!({}), json!("stop")).as_bytes())
        .await?;
    if usage {
        let usage = json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
            "model": model, "choices": [],
            "usage": {"prompt_tokens": 3, "completion_tokens": steps.len(), "total_tokens": 3 + steps.len()}});
        stream
            .write_all(format!("data: {usage}\n\n").as_bytes())
            .await?;
    }
    stream.write_all(b"data: [DONE]\n\n").await?;
    stream.shutdown().await
}

/// Acts out a [`Behaviour::Stream`] in Gemini's events: one
/// `GenerateContentResponse` per text step, the last with `STOP` and the
/// usage; CRLF line endings, no `[DONE]`.
async fn stream_gemini(
    mut stream: TcpStream,
    steps: &[StreamStep],
    request_id: &str,
    state: &Shared,
) -> std::io::Result<()> {
    let event = |data: Value| format!("data: {data}\r\n\r\n");
    stream
        .write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\
              Connection: close\r\n\r\n",
        )
        .await?;
    let mut gates = 0;
    for step in steps {
        match step {
            StreamStep::Text(text) => {
                let data = json!({"candidates": [{"content": {"role": "model",
                    "parts": [{"text": text}]}, "index": 0}]});
                stream.write_all(event(data).as_bytes()).await?;
                stream.flush().await?;
                chunk_sent(state, request_id);
            }
            StreamStep::Wait(ms) => tokio::time::sleep(Duration::from_millis(*ms)).await,
            StreamStep::Gate => {
                gates += 1;
                hold_at_gate(state, request_id, gates).await;
            }
            StreamStep::Stall => std::future::pending::<()>().await,
            StreamStep::Error(message) => {
                let error =
                    json!({"error": {"code": 503, "status": "UNAVAILABLE", "message": message}});
                stream.write_all(event(error).as_bytes()).await?;
                return stream.shutdown().await;
            }
            StreamStep::Reset => {
                stream.set_zero_linger()?;
                drop(stream);
                return Ok(());
            }
        }
    }
    let last = json!({"candidates": [{"content": {"role": "model", "parts": [{"text": ""}]},
        "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": steps.len(), "totalTokenCount": 3 + steps.len()}});
    stream.write_all(event(last).as_bytes()).await?;
    stream.shutdown().await
}

/// Acts out a [`Behaviour::Stream`] as ConverseStream's event-stream
/// frames: `messageStart`, a `contentBlockDelta` per text step,
/// `contentBlockStop`, `messageStop` and `metadata`; an error step is an
/// exception frame.
async fn stream_converse(
    mut stream: TcpStream,
    steps: &[StreamStep],
    request_id: &str,
    state: &Shared,
) -> std::io::Result<()> {
    use crate::support::aws::frame;
    stream
        .write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.amazon.eventstream\r\n\
              Connection: close\r\n\r\n",
        )
        .await?;
    stream
        .write_all(&frame(
            "event",
            "messageStart",
            &json!({"role": "assistant"}),
        ))
        .await?;
    let mut gates = 0;
    for step in steps {
        match step {
            StreamStep::Text(text) => {
                let delta = frame(
                    "event",
                    "contentBlockDelta",
                    &json!({"contentBlockIndex": 0, "delta": {"text": text}, "p": "abcdef"}),
                );
                // Split across writes: the decoder must put frames together.
                let (first, rest) = delta.split_at(delta.len() / 2);
                stream.write_all(first).await?;
                stream.flush().await?;
                stream.write_all(rest).await?;
                stream.flush().await?;
                chunk_sent(state, request_id);
            }
            StreamStep::Wait(ms) => tokio::time::sleep(Duration::from_millis(*ms)).await,
            StreamStep::Gate => {
                gates += 1;
                hold_at_gate(state, request_id, gates).await;
            }
            StreamStep::Stall => std::future::pending::<()>().await,
            StreamStep::Error(message) => {
                let error = frame(
                    "exception",
                    "modelStreamErrorException",
                    &json!({"message": message}),
                );
                stream.write_all(&error).await?;
                return stream.shutdown().await;
            }
            StreamStep::Reset => {
                stream.set_zero_linger()?;
                drop(stream);
                return Ok(());
            }
        }
    }
    for (kind, payload) in [
        ("contentBlockStop", json!({"contentBlockIndex": 0})),
        ("messageStop", json!({"stopReason": "end_turn"})),
        (
            "metadata",
            json!({"usage": {"inputTokens": 3, "outputTokens": steps.len(),
            "totalTokens": 3 + steps.len()}, "metrics": {"latencyMs": 5}}),
        ),
    ] {
        stream.write_all(&frame("event", kind, &payload)).await?;
    }
    stream.shutdown().await
}

/// Acts out a [`Behaviour::Stream`] in Anthropic's events.
async fn stream_anthropic(
    mut stream: TcpStream,
    steps: &[StreamStep],
    model: &str,
    request_id: &str,
    stops: &[String],
    state: &Shared,
) -> std::io::Result<()> {
    let event = |data: Value| {
        format!(
            "event: {}\ndata: {data}\n\n",
            data["type"].as_str().unwrap()
        )
    };
    stream
        .write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\
              Connection: close\r\n\r\n",
        )
        .await?;
    let start = json!({"type": "message_start", "message": {"id": "msg_fake", "type": "message",
        "role": "assistant", "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": 3, "output_tokens": 1}}});
    let block = json!({"type": "content_block_start", "index": 0,
        "content_block": {"type": "text", "text": ""}});
    let ping = json!({"type": "ping"});
    for data in [start, block, ping] {
        stream.write_all(event(data).as_bytes()).await?;
    }
    stream.flush().await?;
    let mut gates = 0;
    let (mut written, mut stopped_by) = (String::new(), None);
    for step in steps {
        match step {
            StreamStep::Text(text) => {
                // A stop sequence the text would write ends the answer
                // before it.
                let whole = format!("{written}{text}");
                let text = match cut_at_stop(&whole, stops) {
                    Some((before, stop)) => {
                        stopped_by = Some(stop.to_owned());
                        before[written.len().min(before.len())..].to_owned()
                    }
                    None => text.clone(),
                };
                written.push_str(&text);
                if !text.is_empty() {
                    let delta = json!({"type": "content_block_delta", "index": 0,
                        "delta": {"type": "text_delta", "text": text}});
                    stream.write_all(event(delta).as_bytes()).await?;
                    stream.flush().await?;
                    chunk_sent(state, request_id);
                }
                if stopped_by.is_some() {
                    break;
                }
            }
            StreamStep::Wait(ms) => tokio::time::sleep(Duration::from_millis(*ms)).await,
            StreamStep::Gate => {
                gates += 1;
                hold_at_gate(state, request_id, gates).await;
            }
            StreamStep::Stall => {
                std::future::pending::<()>().await;
            }
            StreamStep::Error(message) => {
                let error = json!({"type": "error",
                    "error": {"type": "overloaded_error", "message": message}});
                stream.write_all(event(error).as_bytes()).await?;
                return stream.shutdown().await;
            }
            StreamStep::Reset => {
                stream.set_zero_linger()?;
                drop(stream);
                return Ok(());
            }
        }
    }
    let stop_reason = if stopped_by.is_some() {
        "stop_sequence"
    } else {
        "end_turn"
    };
    let end = [
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stopped_by},
               "usage": {"output_tokens": steps.len()}}),
        json!({"type": "message_stop"}),
    ];
    for data in end {
        stream.write_all(event(data).as_bytes()).await?;
    }
    stream.shutdown().await
}

/// Reads one request: head up to `\r\n\r\n`, then `Content-Length` body bytes.
/// `None` on malformed input, oversize input or a closed connection.
async fn read_request(stream: &mut TcpStream) -> Option<RecordedRequest> {
    let mut buf = Vec::with_capacity(4096);
    let head_end = loop {
        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos;
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };

    let head = std::str::from_utf8(&buf[..head_end]).ok()?;
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let method = request_line.next()?.to_owned();
    let path = request_line.next()?.to_owned();
    if !request_line.next()?.starts_with("HTTP/1.") || method.is_empty() {
        return None;
    }
    let mut headers = Vec::new();
    for line in lines {
        let (name, value) = line.split_once(':')?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }

    let length = match headers.iter().find(|(name, _)| name == "content-length") {
        Some((_, value)) => value.parse::<usize>().ok()?,
        None => 0,
    };
    if length > MAX_BODY {
        return None;
    }
    let mut body = buf.split_off(head_end + 4);
    if body.len() < length {
        let start = body.len();
        body.resize(length, 0);
        stream.read_exact(&mut body[start..]).await.ok()?;
    }
    body.truncate(length);

    Some(RecordedRequest {
        method,
        path,
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        raw: body,
    })
}

/// Acts out `behaviour` (never a `Delay`) on the connection.
async fn respond(
    mut stream: TcpStream,
    behaviour: Behaviour,
    shape: Shape,
    model: &str,
    stops: &[String],
) -> std::io::Result<()> {
    match behaviour {
        Behaviour::Answer(value) => {
            let body = completion_stopping(shape, model, &value.to_string(), stops);
            write_response(&mut stream, 200, None, &body).await
        }
        Behaviour::AnswerText(text) => {
            let body = completion_stopping(shape, model, &text, stops);
            write_response(&mut stream, 200, None, &body).await
        }
        Behaviour::AnswerToolCall { name, arguments } => {
            let body = tool_call_completion(shape, model, &name, &arguments);
            write_response(&mut stream, 200, None, &body).await
        }
        Behaviour::AnswerWithUsage { value, usage } => {
            let mut body: Value =
                serde_json::from_str(&completion(shape, model, &value.to_string())).unwrap();
            body["usage"] = usage;
            write_response(&mut stream, 200, None, &body.to_string()).await
        }
        Behaviour::Status {
            status,
            retry_after,
            body,
        } => write_response(&mut stream, status, retry_after, &body).await,
        Behaviour::Hang => {
            // Hold the connection open until the task is aborted.
            std::future::pending::<()>().await;
            Ok(())
        }
        Behaviour::ResetMidBody => {
            let body = completion(shape, model, "this answer is cut short");
            let partial = &body.as_bytes()[..40.min(body.len())];
            stream.write_all(head(200, 4096, None).as_bytes()).await?;
            stream.write_all(partial).await?;
            stream.flush().await?;
            // Let the client read the head before the reset arrives.
            tokio::time::sleep(Duration::from_millis(20)).await;
            stream.set_zero_linger()?;
            drop(stream);
            Ok(())
        }
        Behaviour::TruncatedBody => {
            let body = completion(shape, model, "this answer is cut short");
            let partial = &body.as_bytes()[..body.len() / 2];
            stream
                .write_all(head(200, body.len(), None).as_bytes())
                .await?;
            stream.write_all(partial).await?;
            stream.shutdown().await
        }
        Behaviour::Delay { .. } | Behaviour::Hold | Behaviour::Stream(_) => {
            unreachable!("delays, holds and streams are acted out by the caller")
        }
    }
}

/// Writes a complete response and closes the write side.
async fn write_response(
    stream: &mut TcpStream,
    status: u16,
    retry_after: Option<u64>,
    body: &str,
) -> std::io::Result<()> {
    let mut response = head(status, body.len(), retry_after);
    // A Bedrock error names its type in a header too.
    if let Some(kind) = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|b| b["__type"].as_str().map(str::to_owned))
    {
        let at = response.len() - 2;
        response.insert_str(
            at,
            &format!(
                "x-amzn-ErrorType: {kind}:http://internal.amazon.com/coral/com.amazon.bedrock/\r\n"
            ),
        );
    }
    response.push_str(body);
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// A response's status line and headers, blank line included.
fn head(status: u16, content_length: usize, retry_after: Option<u64>) -> String {
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\n\
         Content-Type: application/json\r\n\
         Content-Length: {content_length}\r\n\
         Connection: close\r\n",
        reason(status)
    );
    if let Some(seconds) = retry_after {
        head.push_str(&format!("Retry-After: {seconds}\r\n"));
    }
    head.push_str("\r\n");
    head
}

/// The reason phrase for common status codes.
fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Payload Too Large",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        529 => "Overloaded",
        _ => "Status",
    }
}

/// [`completion`], stopped before the first of `stops` the text holds, as
/// a model stops: the text before it, with the provider's stop reason
/// (Anthropic names the sequence; OpenAI says `stop`).
fn completion_stopping(shape: Shape, model: &str, text: &str, stops: &[String]) -> String {
    let Some((before, stop)) = cut_at_stop(text, stops) else {
        return completion(shape, model, text);
    };
    let mut body: Value = serde_json::from_str(&completion(shape, model, before)).unwrap();
    if shape == Shape::Anthropic {
        body["stop_reason"] = json!("stop_sequence");
        body["stop_sequence"] = json!(stop);
    }
    body.to_string()
}

/// A well-formed answer in `shape` that calls the tool `name` with
/// `arguments` (an object), as each provider says it.
fn tool_call_completion(shape: Shape, model: &str, name: &str, arguments: &Value) -> String {
    let body = match shape {
        Shape::Gemini => json!({
            "candidates": [{"content": {"role": "model", "parts": [
                {"functionCall": {"name": name, "args": arguments}}]},
                "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 1, "totalTokenCount": 2},
            "modelVersion": model,
        }),
        Shape::Bedrock => json!({
            "output": {"message": {"role": "assistant", "content": [
                {"toolUse": {"toolUseId": "tooluse_fake1", "name": name, "input": arguments}}]}},
            "stopReason": "tool_use",
            "usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2},
            "metrics": {"latencyMs": 1},
        }),
        Shape::OpenAi | Shape::Azure => json!({
            "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": null, "tool_calls": [{"id": "call_fake1",
                    "type": "function", "function": {"name": name, "arguments": arguments.to_string()}}]}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }),
        Shape::Anthropic => json!({
            "id": "msg_fake", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "tool_use", "id": "toolu_fake1", "name": name, "input": arguments}],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }),
    };
    body.to_string()
}

/// A well-formed completion body in `shape` whose text content is `text`.
fn completion(shape: Shape, model: &str, text: &str) -> String {
    let body = match shape {
        Shape::Gemini => gemini_answer(text, "STOP", model),
        Shape::Bedrock => converse_answer(text),
        Shape::OpenAi | Shape::Azure => json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }),
        Shape::Anthropic => json!({
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }),
    };
    body.to_string()
}

// Configurations and waits for tests that point onejob at fake providers.

/// How long a test waits for a job to settle.
pub const WAIT: Duration = Duration::from_secs(20);

/// The one way tests write a `[[providers]]` entry for a fake server.
///
/// Defaults: OpenAI-compatible, model `fake-model`, the test API key
/// (`ONEJOB_TEST_FAKE_KEY`), a 400 ms soft timeout, a 60 s late-result
/// window and a 300 ms connect timeout. Each setter changes one of them;
/// [`ProviderToml::with`] adds lines of its own (`callbacks = true`).
#[derive(Clone, Debug)]
pub struct ProviderToml {
    name: String,
    kind: &'static str,
    base_url: String,
    model: String,
    timeout_ms: u64,
    late_result_ms: u64,
    connect_timeout_ms: Option<u64>,
    /// The key naming the credential's variable.
    credential: &'static str,
    extra: Vec<String>,
}

impl ProviderToml {
    /// An OpenAI-compatible provider called `name` at `base_url`.
    pub fn openai(name: &str, base_url: &str) -> Self {
        Self {
            name: name.to_owned(),
            kind: "openai",
            base_url: base_url.to_owned(),
            model: "fake-model".to_owned(),
            timeout_ms: 400,
            late_result_ms: 60_000,
            connect_timeout_ms: Some(300),
            credential: "api_key_env",
            extra: Vec::new(),
        }
    }

    /// An Anthropic provider called `name` at `base_url`.
    pub fn anthropic(name: &str, base_url: &str) -> Self {
        Self {
            kind: "anthropic",
            ..Self::openai(name, base_url)
        }
    }

    /// An Azure OpenAI provider called `name`: the resource at `base_url`,
    /// `deployment`, API version 2024-10-21, the test key as `api-key`.
    pub fn azure(name: &str, base_url: &str, deployment: &str) -> Self {
        Self {
            kind: "azure_openai",
            ..Self::openai(name, base_url)
        }
        .with(&format!(
            "deployment = \"{deployment}\"\napi_version = \"2024-10-21\""
        ))
    }

    /// A Gemini provider called `name` at `base_url` (model `gemini-2.5-flash`).
    pub fn gemini(name: &str, base_url: &str) -> Self {
        Self {
            kind: "gemini",
            model: "gemini-2.5-flash".to_owned(),
            ..Self::openai(name, base_url)
        }
    }

    /// A Bedrock provider called `name` at `base_url` (model
    /// `anthropic.claude-3-haiku-20240307-v1:0`), signed with the test AWS
    /// credentials.
    pub fn bedrock(name: &str, base_url: &str) -> Self {
        Self {
            kind: "bedrock",
            model: "anthropic.claude-3-haiku-20240307-v1:0".to_owned(),
            credential: "",
            ..Self::openai(name, base_url)
        }
    }

    /// Authenticates with the test key as a bearer token (`azure_openai`'s
    /// Entra ID token) instead of an API key.
    pub fn bearer_token(mut self) -> Self {
        self.credential = "bearer_token_env";
        self
    }

    pub fn model(mut self, model: &str) -> Self {
        model.clone_into(&mut self.model);
        self
    }

    /// Points it at another server.
    pub fn base_url(mut self, base_url: &str) -> Self {
        base_url.clone_into(&mut self.base_url);
        self
    }

    /// The soft timeout.
    pub fn timeout_ms(mut self, ms: u64) -> Self {
        self.timeout_ms = ms;
        self
    }

    /// How long a late answer is still heard.
    pub fn late_result_ms(mut self, ms: u64) -> Self {
        self.late_result_ms = ms;
        self
    }

    /// The connect timeout; `None` leaves the configuration's default.
    pub fn connect_timeout_ms(mut self, ms: Option<u64>) -> Self {
        self.connect_timeout_ms = ms;
        self
    }

    /// More settings of this provider, as TOML lines.
    pub fn with(mut self, lines: &str) -> Self {
        self.extra.push(lines.to_owned());
        self
    }

    pub fn toml(&self) -> String {
        let Self {
            name,
            kind,
            base_url,
            model,
            timeout_ms,
            late_result_ms,
            connect_timeout_ms,
            credential,
            extra,
        } = self;
        let credential = if credential.is_empty() {
            String::new()
        } else {
            format!("{credential} = \"ONEJOB_TEST_FAKE_KEY\"")
        };
        let mut toml = format!(
            r#"
[[providers]]
name = "{name}"
kind = "{kind}"
base_url = "{base_url}"
model = "{model}"
{credential}
timeout_ms = {timeout_ms}
late_result_ms = {late_result_ms}
"#
        );
        if let Some(ms) = connect_timeout_ms {
            toml.push_str(&format!("connect_timeout_ms = {ms}\n"));
        }
        for lines in extra {
            toml.push_str(lines);
            toml.push('\n');
        }
        toml
    }
}

/// A fake provider's answer: a summary, as the strict task's schema wants.
pub fn answer(summary: &str) -> Behaviour {
    Behaviour::Answer(json!({ "summary": summary }))
}

/// A task with a template, a strict output schema and one golden example.
pub fn strict_task_toml(name: &str, chain: &[&str], template: &str) -> String {
    let chain = chain
        .iter()
        .map(|p| format!("{p:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"
[[tasks]]
name = "{name}"
providers = [{chain}]
input_fields = ["text"]
template = "{template}"
output_schema = {{ type = "object", required = ["summary"], additionalProperties = false, properties = {{ summary = {{ type = "string" }} }} }}

[[tasks.golden]]
input = {{ text = "golden" }}
expect = {{ "/summary" = "fake summary" }}
"#
    )
}

/// One fake provider, `fake`, as the only provider of a strict `summarize`
/// task; the worker has one slot.
pub fn one_fake_config(fake: &FakeProvider) -> onejob::config::Config {
    config_of(
        &[
            ProviderToml::openai("fake", &fake.base_url).toml(),
            strict_task_toml("summarize", &["fake"], "Summarize: {{ text }}"),
        ]
        .concat(),
    )
}

pub fn config_of(toml: &str) -> onejob::config::Config {
    let mut config = crate::support::harness::test_config(toml);
    config.worker.concurrency = 1;
    config
}

pub async fn settled_attempt(
    app: &crate::support::harness::TestApp,
    job_id: &str,
    index: usize,
) -> Value {
    let job = app
        .wait_for_job(job_id, WAIT, |j| {
            let state = &j["attempts"][index]["state"];
            !state.is_null() && state != "queued" && state != "running"
        })
        .await;
    job["attempts"][index].clone()
}

pub fn closed_port_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}
