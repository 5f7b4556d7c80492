//! Reading request input. JSON bodies follow one set of rules and problem+json errors: a size
//! limit (413), `application/json` required (415), well-formed JSON (400), the
//! documented shape (422).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::dev::{Payload, ServiceRequest};
use actix_web::error::PayloadError;
use actix_web::{web, HttpMessage, HttpRequest};
use futures_util::{Stream, StreamExt};
use serde::de::DeserializeOwned;

use super::error::{ApiError, ProblemType};
use crate::domain::json_depth::check_nesting;

/// How a client's JSON is read: at most `max_bytes` (413), nested at most
/// `max_depth` levels (422 `nesting-too-deep`).
#[derive(Debug, Clone, Copy)]
pub struct BodyRules {
    pub max_bytes: usize,
    pub max_depth: usize,
}

impl BodyRules {
    pub fn of(server: &crate::config::ServerSettings) -> Self {
        Self {
            max_bytes: server.body_limit_bytes,
            max_depth: server.max_json_depth,
        }
    }
}

/// The error a body stream yields once its time is up.
fn body_timed_out() -> PayloadError {
    PayloadError::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "the request body did not arrive in time",
    ))
}

/// Whether reading a body failed because it arrived too slowly.
pub fn is_body_timeout(error: &PayloadError) -> bool {
    matches!(error, PayloadError::Io(e) if e.kind() == std::io::ErrorKind::TimedOut)
}

/// A request body that must have arrived by a deadline.
struct DeadlinePayload {
    inner: Payload,
    deadline: Pin<Box<tokio::time::Sleep>>,
    timed_out: bool,
}

impl Stream for DeadlinePayload {
    type Item = Result<web::Bytes, PayloadError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.timed_out {
            return Poll::Ready(None);
        }
        if let Poll::Ready(item) = Pin::new(&mut self.inner).poll_next(cx) {
            return Poll::Ready(item);
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.timed_out = true;
                Poll::Ready(Some(Err(body_timed_out())))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Gives a request's body `timeout` to arrive once the headers have
/// (actix's own header timeout covers the headers): a body that trickles
/// in, or never comes after its `Content-Length`, ends the request with 408
/// and its connection is closed, instead of holding a connection and a
/// handler for as long as the client likes. Every request of the main
/// server gets `server.body_timeout_ms` ([`super::around_each_request`]).
pub fn body_deadline(req: &mut ServiceRequest, timeout: Duration) {
    let inner = req.take_payload();
    let limited = DeadlinePayload {
        inner,
        deadline: Box::pin(tokio::time::sleep(timeout)),
        timed_out: false,
    };
    let stream: Pin<Box<dyn Stream<Item = Result<web::Bytes, PayloadError>>>> = Box::pin(limited);
    req.set_payload(Payload::from(stream));
}

/// What an empty body means: a refusal, or this value.
pub enum EmptyBody<T> {
    Refuse,
    Is(T),
}

/// Reads a body of at most `limit` bytes (413 beyond it).
pub async fn limited_body(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<web::Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            ProblemType::PayloadTooLarge,
            format!("the body exceeds the limit of {limit} bytes"),
        )
    };
    let declared = req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(too_large());
    }
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| {
            if is_body_timeout(&e) {
                ApiError::new(ProblemType::RequestTimeout, e.to_string())
            } else {
                ApiError::new(
                    ProblemType::MalformedJson,
                    format!("the body could not be read: {e}"),
                )
            }
        })?;
        if body.len() + chunk.len() > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// 422 `nesting-too-deep` when a JSON text nests deeper than `max_depth`.
pub fn require_shallow(body: &[u8], max_depth: usize) -> Result<(), ApiError> {
    check_nesting(body, max_depth).map_err(ApiError::from)
}

pub async fn json_body<T: DeserializeOwned>(
    req: &HttpRequest,
    payload: web::Payload,
    rules: BodyRules,
    empty: EmptyBody<T>,
) -> Result<T, ApiError> {
    let body = limited_body(req, payload, rules.max_bytes).await?;
    if body.is_empty() {
        if let EmptyBody::Is(value) = empty {
            return Ok(value);
        }
    }
    require_json_type(req)?;
    require_shallow(&body, rules.max_depth)?;
    crate::domain::json_text::check_unique_names(&body).map_err(not_unique)?;
    serde_json::from_slice(&body).map_err(|e| {
        use serde_json::error::Category;
        match e.classify() {
            Category::Data => ApiError::new(ProblemType::InvalidBody, e.to_string()),
            Category::Syntax | Category::Eof | Category::Io => ApiError::new(
                ProblemType::MalformedJson,
                format!("the body is not valid JSON: {e}"),
            ),
        }
    })
}

/// 415 unless the body is declared as JSON (`application/json` or `+json`).
fn require_json_type(req: &HttpRequest) -> Result<(), ApiError> {
    let is_json = match req.mime_type() {
        Ok(Some(mime)) => {
            mime.essence_str() == "application/json" || mime.suffix().is_some_and(|s| s == "json")
        }
        _ => false,
    };
    if is_json {
        Ok(())
    } else {
        Err(ApiError::new(
            ProblemType::UnsupportedMediaType,
            "send the body with `Content-Type: application/json`",
        ))
    }
}

/// A JSON body kept as the exact text sent (for fingerprints), under the
/// same rules as [`json_body`]: size, media type, depth, well-formed JSON.
pub async fn json_text(
    req: &HttpRequest,
    payload: web::Payload,
    rules: BodyRules,
) -> Result<crate::domain::JsonText, ApiError> {
    let body = limited_body(req, payload, rules.max_bytes).await?;
    require_json_type(req)?;
    require_shallow(&body, rules.max_depth)?;
    let text = String::from_utf8(body.to_vec())
        .map_err(|_| ApiError::new(ProblemType::MalformedJson, "the body is not valid UTF-8"))?;
    crate::domain::JsonText::parse_unique(text).map_err(not_unique)
}

/// Every body's refusal of a malformed text, or of an object that names a
/// member twice (`422 invalid-body`, as a duplicate field of a typed body
/// is): one JSON, one reading.
fn not_unique(refusal: crate::domain::json_text::NotUnique) -> ApiError {
    use crate::domain::json_text::NotUnique;
    match refusal {
        NotUnique::Duplicate(_) => ApiError::new(ProblemType::InvalidBody, refusal.to_string()),
        NotUnique::Malformed(e) => ApiError::new(
            ProblemType::MalformedJson,
            format!("the body is not valid JSON: {e}"),
        ),
    }
}

/// Parses a query string, answering 400 `invalid-query` when it does not
/// fit, naming the parameter whose value does not.
pub fn parse_query<T: serde::de::DeserializeOwned>(req: &HttpRequest) -> Result<T, ApiError> {
    let pairs = form_urlencoded::parse(req.query_string().as_bytes());
    serde_path_to_error::deserialize(serde_urlencoded::Deserializer::new(pairs)).map_err(|error| {
        let path = error.path().to_string();
        let detail = match path.as_str() {
            "." => error.inner().to_string(),
            name => format!("`{name}`: {}", error.inner()),
        };
        ApiError::new(ProblemType::InvalidQuery, detail)
    })
}

/// The query of a path that takes none: empty, or 400 `invalid-query`
/// naming the parameter, which is never ignored.
pub fn no_query(req: &HttpRequest) -> Result<(), ApiError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct NoParameters {}
    parse_query::<NoParameters>(req).map(|NoParameters {}| ())
}

/// A page of a list read with one row more than `limit` (newest first):
/// the rows cut to `limit`, and the path of the following page, which
/// `next_path` makes from the page's last row, or `None` on the last page.
pub fn keyset_page<T>(
    mut rows: Vec<T>,
    limit: i64,
    next_path: impl FnOnce(&T) -> String,
) -> (Vec<T>, Option<String>) {
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let next = rows.last().filter(|_| more).map(next_path);
    (rows, next)
}

/// A page size from the query: `default` when absent, else 1..=`max` (400
/// `invalid-query` outside it).
pub fn page_limit(limit: Option<i64>, default: i64, max: i64) -> Result<i64, ApiError> {
    let limit = limit.unwrap_or(default);
    if (1..=max).contains(&limit) {
        Ok(limit)
    } else {
        Err(ApiError::new(
            ProblemType::InvalidQuery,
            format!("`limit` must be between 1 and {max}"),
        ))
    }
}

/// An id from the query, if given: `parse` it or answer 400 `invalid-query`
/// saying what `name` must be.
pub fn query_id<T>(
    raw: Option<String>,
    name: &str,
    what: &str,
    parse: impl FnOnce(&str) -> Option<T>,
) -> Result<Option<T>, ApiError> {
    raw.map(|raw| {
        parse(&raw).ok_or_else(|| {
            ApiError::new(
                ProblemType::InvalidQuery,
                format!("`{name}` must be {what}"),
            )
        })
    })
    .transpose()
}
