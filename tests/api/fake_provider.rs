//! A fake AI provider: a tiny HTTP/1.1 server on 127.0.0.1, written over raw
//! tokio sockets so that it can misbehave at the byte level (hang, reset the
//! connection mid-body, lie about `Content-Length`, ...).
//!
//! Every connection serves exactly one request. Each request is recorded,
//! then answered with the next queued [`Behaviour`] (or the default one).

#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
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
}

type Shared = Arc<Mutex<State>>;

fn lock(state: &Shared) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running fake provider; dropping it stops the server and closes every
/// open connection.
pub struct FakeProvider {
    /// Like `http://127.0.0.1:PORT` (no trailing slash).
    pub base_url: String,
    state: Shared,
    server: AbortHandle,
}

impl FakeProvider {
    /// Binds 127.0.0.1:0 and serves in a spawned tokio task.
    pub async fn start(shape: Shape) -> FakeProvider {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake provider");
        let addr = listener.local_addr().expect("fake provider address");
        let state = Arc::new(Mutex::new(State {
            queue: VecDeque::new(),
            default: Behaviour::Answer(json!({"summary": "fake summary"})),
            requests: Vec::new(),
        }));
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
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        // The accept loop owns the `JoinSet` of connection tasks; aborting it
        // drops the set, which aborts every connection (hanging ones too).
        self.server.abort();
    }
}

/// Accepts connections forever, one task per connection.
async fn serve(listener: TcpListener, shape: Shape, state: Shared) {
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
async fn handle(mut stream: TcpStream, shape: Shape, state: Shared) {
    let Some(request) = read_request(&mut stream).await else {
        return;
    };
    let model = request
        .body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("fake")
        .to_owned();
    let mut behaviour = {
        let mut state = lock(&state);
        state.requests.push(request);
        match state.queue.pop_front() {
            Some(behaviour) => behaviour,
            None => state.default.clone(),
        }
    };
    while let Behaviour::Delay { ms, then } = behaviour {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        behaviour = *then;
    }
    // Write errors just mean the client went away.
    let _ = respond(stream, behaviour, shape, &model).await;
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
    })
}

/// Acts out `behaviour` (never a `Delay`) on the connection.
async fn respond(
    mut stream: TcpStream,
    behaviour: Behaviour,
    shape: Shape,
    model: &str,
) -> std::io::Result<()> {
    match behaviour {
        Behaviour::Answer(value) => {
            let body = completion(shape, model, &value.to_string());
            write_response(&mut stream, 200, None, &body).await
        }
        Behaviour::AnswerText(text) => {
            let body = completion(shape, model, &text);
            write_response(&mut stream, 200, None, &body).await
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
        Behaviour::Delay { .. } => unreachable!("delays are resolved by the caller"),
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

/// A well-formed completion body in `shape` whose text content is `text`.
fn completion(shape: Shape, model: &str, text: &str) -> String {
    let body = match shape {
        Shape::OpenAi => json!({
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
