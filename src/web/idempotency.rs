//! The idempotency key of a job-creating request: exactly one
//! `Idempotency-Key` header, whatever the door. The key is the identity
//! every layer must agree on, so two of them are refused, even if equal.

use actix_web::HttpRequest;

use super::error::{ApiError, ProblemType};
use crate::domain::{IdempotencyKey, IdempotencyKeyError};

/// The request's one key: `400 missing-idempotency-key` without one,
/// `400 invalid-idempotency-key` naming the reason for a malformed one or
/// for two or more headers.
pub fn idempotency_key(req: &HttpRequest) -> Result<IdempotencyKey, ApiError> {
    let mut sent = req.headers().get_all("Idempotency-Key");
    let Some(raw) = sent.next() else {
        return Err(ApiError::new(
            ProblemType::MissingIdempotencyKey,
            IdempotencyKeyError::Missing.to_string(),
        ));
    };
    let more = sent.count();
    if more > 0 {
        return Err(ApiError::new(
            ProblemType::InvalidIdempotencyKey,
            IdempotencyKeyError::Repeated(more + 1).to_string(),
        ));
    }
    IdempotencyKey::parse_bytes(raw.as_bytes())
        .map_err(|e| ApiError::new(ProblemType::InvalidIdempotencyKey, e.to_string()))
}
