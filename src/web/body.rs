//! Reading request input. JSON bodies follow one set of rules and problem+json errors: a size
//! limit (413), `application/json` required (415), well-formed JSON (400), the
//! documented shape (422).

use actix_web::{web, HttpMessage, HttpRequest};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;

use super::error::{ApiError, ProblemType};

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
            ApiError::new(
                ProblemType::MalformedJson,
                format!("the body could not be read: {e}"),
            )
        })?;
        if body.len() + chunk.len() > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

pub async fn json_body<T: DeserializeOwned>(
    req: &HttpRequest,
    payload: web::Payload,
    limit: usize,
    empty: EmptyBody<T>,
) -> Result<T, ApiError> {
    let body = limited_body(req, payload, limit).await?;
    if body.is_empty() {
        if let EmptyBody::Is(value) = empty {
            return Ok(value);
        }
    }
    require_json_type(req)?;
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
/// same rules as [`json_body`]: size, media type, well-formed JSON.
pub async fn json_text(
    req: &HttpRequest,
    payload: web::Payload,
    limit: usize,
) -> Result<crate::domain::JsonText, ApiError> {
    let body = limited_body(req, payload, limit).await?;
    require_json_type(req)?;
    let text = String::from_utf8(body.to_vec())
        .map_err(|_| ApiError::new(ProblemType::MalformedJson, "the body is not valid UTF-8"))?;
    crate::domain::JsonText::parse(text).map_err(|e| {
        ApiError::new(
            ProblemType::MalformedJson,
            format!("the body is not valid JSON: {e}"),
        )
    })
}

/// Parses a query string, answering 400 `invalid-query` when it does not fit.
pub fn parse_query<T: serde::de::DeserializeOwned>(req: &HttpRequest) -> Result<T, ApiError> {
    web::Query::<T>::from_query(req.query_string())
        .map(web::Query::into_inner)
        .map_err(|e| ApiError::new(ProblemType::InvalidQuery, e.to_string()))
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
