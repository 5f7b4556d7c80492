//! A fake OpenAI-compatible upstream that answers every chat completion at
//! once, on its own thread, so the overhead of going through onejob can be
//! measured against calling it directly.

use std::net::TcpListener;

use actix_web::{web, App, HttpResponse, HttpServer};
use serde_json::{json, Value};

async fn complete(body: web::Json<Value>) -> HttpResponse {
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

/// Starts the upstream; its base URL (`http://127.0.0.1:PORT`).
pub fn start() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding the upstream");
    let base = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
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
    std::thread::spawn(move || {
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
