//! A webhook receiver over real HTTP on 127.0.0.1: it records every
//! request (path, headers, body) and answers by its script: `500` for the
//! first N, a stall (no answer until released or the connection drops) for
//! the first N, a redirect for every request, or `204`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::AbortHandle;

/// A server that accepts every connection and never answers, nor reads,
/// nor closes: what a webhook endpoint that hangs looks like to a sender.
pub struct SilentServer {
    pub port: u16,
    accepted: Arc<Mutex<usize>>,
    server: AbortHandle,
}

impl Drop for SilentServer {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl SilentServer {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(Mutex::new(0));
        let count = accepted.clone();
        let server = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                *count.lock().unwrap() += 1;
                held.push(stream);
            }
        })
        .abort_handle();
        Self {
            port,
            accepted,
            server,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        *self.accepted.lock().unwrap()
    }
}

/// One request the receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    /// Header names lower-cased.
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
    /// When the request's body had arrived whole.
    pub at: std::time::SystemTime,
}

impl Received {
    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).map_or("", String::as_str)
    }

    pub fn webhook_id(&self) -> &str {
        self.header("webhook-id")
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("a webhook body is JSON")
    }
}

#[derive(Default)]
struct Script {
    fail_first: usize,
    stall_first: usize,
    redirect_to: Option<String>,
    answered: usize,
}

#[derive(Default)]
struct Shared {
    received: Mutex<Vec<Received>>,
    script: Mutex<Script>,
    release: Notify,
}

pub struct WebhookReceiver {
    pub port: u16,
    shared: Arc<Shared>,
    server: AbortHandle,
}

impl Drop for WebhookReceiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl WebhookReceiver {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared::default());
        let server = tokio::spawn(serve(listener, shared.clone())).abort_handle();
        Self {
            port,
            shared,
            server,
        }
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The same, by the name `localhost`.
    pub fn localhost_url(&self, path: &str) -> String {
        format!("http://localhost:{}{path}", self.port)
    }

    /// Answers 500 to the next `n` requests.
    pub fn fail_first(&self, n: usize) {
        let mut script = self.shared.script.lock().unwrap();
        script.fail_first = script.answered + n;
    }

    /// Holds the next `n` requests unanswered until [`release`](Self::release).
    pub fn stall_first(&self, n: usize) {
        let mut script = self.shared.script.lock().unwrap();
        script.stall_first = script.answered + n;
    }

    /// Answers every request `302 Found` to `location`.
    pub fn redirect_to(&self, location: &str) {
        self.shared.script.lock().unwrap().redirect_to = Some(location.to_owned());
    }

    /// Lets stalled requests answer (204).
    pub fn release(&self) {
        self.shared.release.notify_waiters();
    }

    pub fn received(&self) -> Vec<Received> {
        self.shared.received.lock().unwrap().clone()
    }

    /// Waits until at least `n` requests came, or panics after `within`.
    pub async fn wait_for(&self, n: usize, within: Duration) -> Vec<Received> {
        let deadline = Instant::now() + within;
        loop {
            let got = self.received();
            if got.len() >= n {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "the receiver got {} requests, not {n}, within {within:?}",
                got.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        connections.spawn(handle(stream, shared.clone()));
    }
}

async fn handle(mut stream: TcpStream, shared: Arc<Shared>) {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
        if buffer.len() > 1 << 20 {
            return;
        }
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let path = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .unwrap_or("/")
        .to_owned();
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = buffer[head_end + 4..].to_vec();
    while body.len() < length {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    body.truncate(length);
    shared.received.lock().unwrap().push(Received {
        path,
        headers,
        body,
        at: std::time::SystemTime::now(),
    });
    let (fail, stall, redirect) = {
        let mut script = shared.script.lock().unwrap();
        let number = script.answered;
        script.answered += 1;
        (
            number < script.fail_first,
            number < script.stall_first,
            script.redirect_to.clone(),
        )
    };
    if stall {
        shared.release.notified().await;
    }
    let answer = if let Some(location) = redirect {
        format!("HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    } else if fail {
        let text = "receiver says no";
        format!(
            "HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
            text.len()
        )
    } else {
        "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n".to_owned()
    };
    let _ = stream.write_all(answer.as_bytes()).await;
    let _ = stream.shutdown().await;
}
