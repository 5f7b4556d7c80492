//! HTTP/1.1 by hand: one request read (head, then `Content-Length` bytes),
//! one answer written, well-formed or broken on purpose.

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::dialects::{completion, completion_stopping, tool_call_completion};
use super::{Behaviour, RecordedRequest, Shape};

/// Largest request head (request line and headers) the server accepts.
const MAX_HEAD: usize = 64 * 1024;
/// Largest request body the server accepts.
const MAX_BODY: usize = 16 * 1024 * 1024;

/// Reads one request: head up to `\r\n\r\n`, then `Content-Length` body bytes.
/// `None` on malformed input, oversize input or a closed connection.
pub(super) async fn read_request(stream: &mut TcpStream) -> Option<RecordedRequest> {
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
pub(super) async fn respond(
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
pub(super) async fn write_response(
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
