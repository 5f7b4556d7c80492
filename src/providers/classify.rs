//! How every outcome of a provider call is classified. This is the one
//! table; docs/providers.md ("How each outcome is classified") shows it to
//! people.
//!
//! | what happened | outcome | nothing happened | what follows |
//! |---|---|---|---|
//! | connection refused, DNS or TLS failure, connect timeout (nothing was sent) | definite failure | yes | failover; with no fallback left, a retry on the same provider after a backoff |
//! | 400, 401, 403, 404, 422 (the provider refused the request) | definite failure | no | failover; never retried on that provider |
//! | 429 rate limited; 529 overloaded | definite failure | yes | the provider is paused for `Retry-After` (a 429 without one: 1 s); failover, or (no fallback left, or `on_rate_limit = "wait"`) a retry on the same provider once `Retry-After` passed (absent: backoff) |
//! | soft timeout, connection reset after sending, truncated body | unknown | no | nothing: never retried |
//! | any other status: 408, 409, 499, 500, 502, 503, 504, … | unknown | no | nothing: never retried |
//! | 2xx whose content is not JSON or fails the output schema | failed (`invalid_output`) | no | failover |
//! | 2xx with a valid answer | succeeded | – | the compare-and-swap |
//! | anything else | unknown | no | nothing |
//!
//! "Nothing happened" outcomes are [`Outcome::Refused`](crate::domain::Outcome):
//! the request may be sent again, as a new attempt, within the task's
//! retry budget.

use std::time::Duration;

use crate::domain::outcome::Reason;
use crate::domain::Refusal;

/// How long a `429` without `Retry-After` pauses its provider.
pub const DEFAULT_RATE_LIMIT_PAUSE: Duration = Duration::from_secs(1);

/// The classification of a non-2xx HTTP status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatusClass {
    /// The provider surely did not do the work; sending it again would end
    /// the same way.
    Definite { reason: Reason },
    /// The provider turned the request away before doing anything.
    NothingHappened(Refusal),
    /// The provider may have done the work.
    Unknown { reason: Reason },
}

/// Classifies a non-2xx status (with its `Retry-After`, if any, and a short
/// excerpt of the body for the reason).
pub fn classify_status(
    status: u16,
    retry_after: Option<Duration>,
    body_excerpt: &str,
) -> StatusClass {
    let reason = |summary: String| Reason::new(summary).with_detail(body_excerpt);
    match status {
        400 | 401 | 403 | 404 | 422 => StatusClass::Definite {
            reason: reason(format!("the provider refused the request with {status}")),
        },
        429 => StatusClass::NothingHappened(Refusal {
            reason: reason("rate limited (429)".to_owned()),
            retry_after,
            pause: retry_after.or(Some(DEFAULT_RATE_LIMIT_PAUSE)),
        }),
        529 => StatusClass::NothingHappened(Refusal {
            reason: reason("the provider is overloaded (529)".to_owned()),
            retry_after,
            pause: retry_after,
        }),
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

/// The wait a refusal asks for: `retry-after-ms` (Azure OpenAI, OpenAI),
/// finer and read first, else `Retry-After` in seconds.
pub fn parse_retry_after_headers(ms: Option<&str>, seconds: Option<&str>) -> Option<Duration> {
    ms.and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_millis)
        .or_else(|| parse_retry_after(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::openai_chat::azure_content_filter;

    #[test]
    fn azures_content_filter_is_named_with_what_it_filtered() {
        let live = serde_json::json!({"error": {"code": "content_filter", "status": 400,
            "innererror": {"code": "ResponsibleAIPolicyViolation", "content_filter_result": {
                "hate": {"filtered": true, "severity": "medium"},
                "violence": {"filtered": false, "severity": "safe"}}}}});
        assert_eq!(
            azure_content_filter(live.to_string().as_bytes()).unwrap(),
            "the provider's content filter refused the request: hate (medium)"
        );
        let spec = serde_json::json!({"error": {"code": "400",
            "inner_error": {"code": "ResponsibleAIPolicyViolation", "content_filter_results": {
                "jailbreak": {"filtered": true, "detected": true}}}}});
        assert!(azure_content_filter(spec.to_string().as_bytes())
            .unwrap()
            .ends_with("jailbreak"));
        assert_eq!(azure_content_filter(br#"{"error": {"code": "429"}}"#), None);
        assert_eq!(
            parse_retry_after_headers(Some("1500"), Some("2")),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            parse_retry_after_headers(None, Some("2")),
            Some(Duration::from_secs(2))
        );
    }

    fn is_definite(status: u16) -> bool {
        matches!(
            classify_status(status, None, ""),
            StatusClass::Definite { .. } | StatusClass::NothingHappened(_)
        )
    }

    #[test]
    fn only_rate_limits_and_overload_are_refusals_in_which_nothing_happened() {
        for status in [429, 529] {
            assert!(matches!(
                classify_status(status, None, ""),
                StatusClass::NothingHappened(_)
            ));
        }
        for status in [400, 401, 403, 404, 422] {
            assert!(matches!(
                classify_status(status, None, ""),
                StatusClass::Definite { .. }
            ));
        }
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
            StatusClass::NothingHappened(Refusal {
                reason: "rate limited (429)".into(),
                retry_after: Some(Duration::from_secs(7)),
                pause: Some(Duration::from_secs(7)),
            })
        );
        let StatusClass::NothingHappened(bare) = classify_status(429, None, "") else {
            panic!("a 429 is a refusal");
        };
        assert_eq!(
            (bare.retry_after, bare.pause),
            (None, Some(DEFAULT_RATE_LIMIT_PAUSE)),
            "no Retry-After: the retry backs off; the provider pauses a second"
        );
        let StatusClass::NothingHappened(overloaded) = classify_status(529, None, "") else {
            panic!("a 529 is a refusal");
        };
        assert_eq!(overloaded.pause, None);
        assert_eq!(
            parse_retry_after(Some("Wed, 21 Oct 2026 07:28:00 GMT")),
            None
        );
    }
}
