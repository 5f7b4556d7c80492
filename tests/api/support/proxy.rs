//! A TCP proxy between a browser and the app that can hold back the app's
//! answer to the next form post (`POST /jobs`) until the test releases it:
//! a second click lands while the first submission is still in flight.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{oneshot, Notify};
use tokio::task::{AbortHandle, JoinSet};

use super::webdriver::WAIT;
use crate::support::harness::TestApp;

/// One request the proxy passed to the app, and the app's answer.
#[derive(Clone, Debug)]
pub struct ProxiedRequest {
    pub method: String,
    /// The path, without the query (the submit form's address repeats its
    /// key there).
    pub path: String,
    /// Whether it carried `HX-Request` (htmx sent it).
    pub from_htmx: bool,
    pub status: u16,
}

#[derive(Default)]
struct ProxyState {
    /// Hold the app's answer to the next `POST /jobs`.
    hold_next_form_post: bool,
    /// The held answer's release.
    held: Option<oneshot::Sender<()>>,
    /// How many answers have been held in all.
    held_count: usize,
    passed: Vec<ProxiedRequest>,
}

#[derive(Default)]
struct ProxyShared {
    state: std::sync::Mutex<ProxyState>,
    changed: Notify,
}

impl ProxyShared {
    fn state(&self) -> std::sync::MutexGuard<'_, ProxyState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A reverse proxy on 127.0.0.1 between the browser and the app, one request
/// per connection. It passes every request on at once, and can keep the
/// app's answer to one `POST /jobs` from the browser until the test releases
/// it: the app has handled that submission, but the browser, still waiting,
/// shows the form, so a second click lands while the first submission is in
/// flight. The test, not the clock, orders the two.
pub struct HoldingProxy {
    pub origin: String,
    shared: Arc<ProxyShared>,
    server: AbortHandle,
}

impl HoldingProxy {
    pub async fn start(app: &TestApp) -> Self {
        let upstream: std::net::SocketAddr = app
            .address
            .strip_prefix("http://")
            .unwrap()
            .parse()
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap());
        let shared = Arc::new(ProxyShared::default());
        let accept = {
            let shared = shared.clone();
            async move {
                // Dropping the set (when the loop is aborted) aborts every
                // connection, held ones too.
                let mut connections = JoinSet::new();
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    while connections.try_join_next().is_some() {}
                    connections.spawn(proxy_connection(stream, upstream, shared.clone()));
                }
            }
        };
        let server = tokio::spawn(accept).abort_handle();
        Self {
            origin,
            shared,
            server,
        }
    }

    /// Holds the app's answer to the next `POST /jobs`.
    pub fn hold_next_form_post(&self) {
        self.shared.state().hold_next_form_post = true;
    }

    /// Waits until an answer is held (panics after `WAIT`).
    pub async fn wait_held(&self) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let changed = self.shared.changed.notified();
            if self.shared.state().held.is_some() {
                return;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                panic!("no POST /jobs reached the proxy in {WAIT:?}");
            }
        }
    }

    /// Lets the held answer go to the browser (which may have moved on).
    pub fn release(&self) {
        let held = self.shared.state().held.take().expect("an answer is held");
        let _ = held.send(());
    }

    pub fn held_count(&self) -> usize {
        self.shared.state().held_count
    }

    /// The requests passed to the app so far, oldest first.
    pub fn passed(&self) -> Vec<ProxiedRequest> {
        self.shared.state().passed.clone()
    }
}

impl Drop for HoldingProxy {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Reads one request, passes it to the app with `Connection: close`, reads
/// the whole answer, holds it if asked to, and writes it back.
async fn proxy_connection(
    mut browser: tokio::net::TcpStream,
    upstream: std::net::SocketAddr,
    shared: Arc<ProxyShared>,
) {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos;
        }
        let mut chunk = [0u8; 8192];
        match browser.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let Ok(head) = std::str::from_utf8(&buf[..head_end]) else {
        return;
    };
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default().to_owned();
    let mut parts = request_line.split(' ');
    let method = parts.next().unwrap_or_default().to_owned();
    let target = parts.next().unwrap_or_default();
    let path = target.split('?').next().unwrap_or_default().to_owned();
    let mut forwarded = format!("{request_line}\r\n");
    let (mut length, mut from_htmx) = (0, false);
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let name = name.trim().to_ascii_lowercase();
        match name.as_str() {
            "connection" | "keep-alive" | "proxy-connection" => continue,
            "content-length" => length = value.trim().parse().unwrap_or(0),
            "hx-request" => from_htmx = true,
            _ => {}
        }
        forwarded.push_str(line);
        forwarded.push_str("\r\n");
    }
    forwarded.push_str("Connection: close\r\n\r\n");
    let mut body = buf.split_off(head_end + 4);
    while body.len() < length {
        let mut chunk = [0u8; 8192];
        match browser.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }

    let Ok(mut app) = tokio::net::TcpStream::connect(upstream).await else {
        return;
    };
    let mut answer = Vec::new();
    let sent = async {
        app.write_all(forwarded.as_bytes()).await?;
        app.write_all(&body).await?;
        app.read_to_end(&mut answer).await
    };
    if sent.await.is_err() {
        return;
    }
    let status = std::str::from_utf8(&answer[..answer.len().min(12)])
        .ok()
        .and_then(|line| line.get(9..12)?.parse().ok())
        .unwrap_or(0);

    let held = {
        let mut state = shared.state();
        state.passed.push(ProxiedRequest {
            method: method.clone(),
            path: path.clone(),
            from_htmx,
            status,
        });
        if state.hold_next_form_post && method == "POST" && path == "/jobs" {
            let (release, released) = oneshot::channel();
            state.hold_next_form_post = false;
            state.held = Some(release);
            state.held_count += 1;
            Some(released)
        } else {
            None
        }
    };
    shared.changed.notify_waiters();
    if let Some(released) = held {
        let _ = released.await;
    }
    // The app was asked to close, so its answer says `Connection: close`.
    let _ = browser.write_all(&answer).await;
    let _ = browser.shutdown().await;
}
