//! A fake OpenAI-compatible upstream that answers every chat completion at
//! once, on its own thread, so the overhead of going through onejob can be
//! measured against calling it directly. Asked for a stream, it streams
//! [`STREAMED`]'s pieces as `chat.completion.chunk` events, the first at
//! once and each next one [`CHUNK_GAP`] later.

use std::net::TcpListener;

use actix_web::{web, App, HttpResponse, HttpServer};
use futures_util::StreamExt;
use serde_json::{json, Value};

/// The pieces a streamed answer comes in.
pub const STREAMED: [&str; 8] = [
    "Once", " upon", " a", " time", " there", " was", " one", " job.",
];
/// The time between two streamed pieces.
pub const CHUNK_GAP: std::time::Duration = std::time::Duration::from_millis(2);

async fn complete(body: web::Json<Value>) -> HttpResponse {
    if body.get("stream") == Some(&Value::Bool(true)) {
        return stream();
    }
    let model = body.get("model").cloned().unwrap_or(Value::Null);
    HttpResponse::Ok().json(json!({
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": "{\"summary\": \"ok\"}"},
            "finish_reason": "stop"
        }],
        "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}
    }))
}

/// The streamed answer: a role chunk, the pieces, the finish, `[DONE]`.
fn stream() -> HttpResponse {
    let chunk = |delta: Value, finish: Value| {
        let event = json!({"id": "chatcmpl-bench", "object": "chat.completion.chunk",
            "created": 0, "model": "bench-model",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        format!("data: {event}\n\n")
    };
    let mut events = vec![chunk(json!({"role": "assistant"}), Value::Null)];
    events.extend(
        STREAMED
            .iter()
            .map(|piece| chunk(json!({"content": piece}), Value::Null)),
    );
    events.push(chunk(json!({}), json!("stop")));
    events.push("data: [DONE]\n\n".into());
    // The role chunk and the first piece at once, then one piece a gap.
    let events =
        futures_util::stream::iter(events.into_iter().enumerate()).then(|(n, event)| async move {
            if n >= 2 {
                actix_web::rt::time::sleep(CHUNK_GAP).await;
            }
            Ok::<_, actix_web::Error>(actix_web::web::Bytes::from(event))
        });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .streaming(events)
}

/// Runs an upstream's system on a thread of its own, named so that the
/// benchmark counts its CPU apart from the load generator's (`cpu`).
fn spawn_named<T: Send + 'static>(run: impl FnOnce() -> T + Send + 'static) {
    std::thread::Builder::new()
        .name("bench-upstream".into())
        .spawn(run)
        .expect("starting the upstream's thread");
}

/// Starts the upstream; its base URL (`http://127.0.0.1:PORT`).
pub fn start() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding the upstream");
    let base = format!("http://{}", listener.local_addr().unwrap());
    spawn_named(move || {
        actix_web::rt::System::new().block_on(async move {
            HttpServer::new(|| App::new().route("/v1/chat/completions", web::post().to(complete)))
                .workers(1)
                .listen(listener)
                .expect("listening")
                .run()
                .await
        })
    });
    base
}

/// Starts an OTLP/HTTP collector that takes every export (`POST
/// /v1/traces`) and answers 200 at once; its base URL, and how many exports
/// came.
pub fn start_collector() -> (String, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding the collector");
    let base = format!("http://{}", listener.local_addr().unwrap());
    let exports = std::sync::Arc::new(AtomicU64::new(0));
    let counted = exports.clone();
    spawn_named(move || {
        actix_web::rt::System::new().block_on(async move {
            HttpServer::new(move || {
                let counted = counted.clone();
                App::new().route(
                    "/v1/traces",
                    web::post().to(move |_body: web::Bytes| {
                        counted.fetch_add(1, Relaxed);
                        async {
                            HttpResponse::Ok()
                                .content_type("application/x-protobuf")
                                .finish()
                        }
                    }),
                )
            })
            .workers(1)
            .listen(listener)
            .expect("listening")
            .run()
            .await
        })
    });
    (base, exports)
}

/// Starts a collector that accepts every connection and never answers:
/// its base URL.
pub fn start_dead_collector() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding the dead collector");
    let base = format!("http://{}", listener.local_addr().unwrap());
    spawn_named(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    base
}

/// What a rate-limited upstream saw.
#[derive(Clone, Default)]
pub struct Calls {
    pub total: std::sync::Arc<std::sync::atomic::AtomicU64>,
    pub refused: std::sync::Arc<std::sync::atomic::AtomicU64>,
    open: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Calls {
    pub fn read(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.total.load(Relaxed), self.refused.load(Relaxed))
    }
}

/// An OpenAI-compatible upstream with a concurrency limit, as providers
/// have: it answers `capacity` requests at once, each after `latency_ms`,
/// and refuses any more with `429` and `Retry-After: 1`. Its base URL,
/// and its counts.
pub fn start_limited(capacity: usize, latency_ms: u64) -> (String, Calls) {
    use std::sync::atomic::Ordering::Relaxed;
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding the upstream");
    let base = format!("http://{}", listener.local_addr().unwrap());
    let calls = Calls::default();
    let served = calls.clone();
    spawn_named(move || {
        actix_web::rt::System::new().block_on(async move {
            HttpServer::new(move || {
                let calls = served.clone();
                App::new().route(
                    "/v1/chat/completions",
                    web::post().to(move |body: web::Json<Value>| {
                        let calls = calls.clone();
                        async move {
                            calls.total.fetch_add(1, Relaxed);
                            let open = calls.open.fetch_add(1, Relaxed) + 1;
                            let response = if open > capacity {
                                calls.refused.fetch_add(1, Relaxed);
                                HttpResponse::TooManyRequests()
                                    .insert_header(("Retry-After", "1"))
                                    .json(json!({"error": {"type": "rate_limit_exceeded"}}))
                            } else {
                                actix_web::rt::time::sleep(std::time::Duration::from_millis(
                                    latency_ms,
                                ))
                                .await;
                                complete(body).await
                            };
                            calls.open.fetch_sub(1, Relaxed);
                            response
                        }
                    }),
                )
            })
            .workers(2)
            .listen(listener)
            .expect("listening")
            .run()
            .await
        })
    });
    (base, calls)
}
