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
