//! A [`Behaviour::Stream`] acted out in each provider kind's events, chunk
//! by chunk, held at each gate until the test opens it.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::{cut_at_stop, lock, Shape, Shared, StreamStep};

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

/// Acts out a [`Behaviour::Stream`] in OpenAI's chunks (and Azure's).
pub(super) async fn stream_answer(
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
pub(super) async fn stream_gemini(
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
pub(super) async fn stream_converse(
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
pub(super) async fn stream_anthropic(
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
