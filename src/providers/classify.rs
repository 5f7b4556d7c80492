//! How every outcome of a provider call is classified (docs/design.md,
//! "Providers"). This is the one table; the README shows it to people.
//!
//! | what happened | outcome | failover |
//! |---|---|---|
//! | connection refused, DNS or TLS failure, connect timeout (nothing was sent) | definite failure | yes |
//! | 400, 401, 403, 404, 422 (the provider refused the request) | definite failure, not retried on that provider | yes |
//! | 429 rate limited; 529 overloaded | definite failure; later calls to that provider wait for `Retry-After` | yes |
//! | soft timeout, connection reset after sending, truncated body | unknown | no |
//! | any other status: 408, 409, 499, 500, 502, 503, 504, … | unknown | no |
//! | 2xx whose content is not JSON or fails the output schema | failed (`invalid_output`) | yes |
//! | 2xx with a valid answer | succeeded | – |
//! | anything else | unknown | no |

use std::time::Duration;

use crate::domain::outcome::with_detail;

/// The classification of a non-2xx HTTP status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatusClass {
    /// The provider surely did not do the work.
    Definite {
        reason: String,
        retry_after: Option<Duration>,
    },
    /// The provider may have done the work.
    Unknown { reason: String },
}

/// Classifies a non-2xx status (with its `Retry-After`, if any, and a short
/// excerpt of the body for the reason).
pub fn classify_status(
    status: u16,
    retry_after: Option<Duration>,
    body_excerpt: &str,
) -> StatusClass {
    let reason = |summary: String| with_detail(summary, body_excerpt);
    match status {
        400 | 401 | 403 | 404 | 422 => StatusClass::Definite {
            reason: reason(format!("the provider refused the request with {status}")),
            retry_after: None,
        },
        429 => StatusClass::Definite {
            reason: reason("rate limited (429)".to_owned()),
            retry_after: retry_after.or(Some(Duration::from_secs(1))),
        },
        529 => StatusClass::Definite {
            reason: reason("the provider is overloaded (529)".to_owned()),
            retry_after,
        },
        // Anything else may have been acted on (a 409 can mean "a request with
        // this key is still running"): when in doubt, unknown.
        _ => StatusClass::Unknown {
            reason: reason(format!(
                "the provider answered {status}; it may or may not have done the work"
            )),
        },
    }
}

/// Parses `Retry-After` given in seconds (the HTTP-date form is treated as absent).
pub fn parse_retry_after(value: Option<&str>) -> Option<Duration> {
    value
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_definite(status: u16) -> bool {
        matches!(
            classify_status(status, None, ""),
            StatusClass::Definite { .. }
        )
    }

    #[test]
    fn explicit_rejections_are_definite() {
        for status in [400, 401, 403, 404, 422, 429, 529] {
            assert!(is_definite(status), "{status}");
        }
    }

    #[test]
    fn everything_else_is_unknown_when_in_doubt() {
        for status in [408, 409, 413, 499, 500, 502, 503, 504, 520] {
            assert!(!is_definite(status), "{status}");
        }
    }

    #[test]
    fn rate_limits_carry_their_retry_after() {
        let class = classify_status(429, parse_retry_after(Some("7")), "");
        assert_eq!(
            class,
            StatusClass::Definite {
                reason: "rate limited (429)".into(),
                retry_after: Some(Duration::from_secs(7))
            }
        );
        assert_eq!(
            parse_retry_after(Some("Wed, 21 Oct 2026 07:28:00 GMT")),
            None
        );
    }
}
