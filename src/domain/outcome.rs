//! The outcome vocabulary: what a provider call produced ([`Outcome`]), what
//! applying it did to the job ([`Applied`]), and whether a succeeded attempt's
//! answer became the job's result ([`RaceResult`]).

use super::ids::text_enum;
use std::time::Duration;

use serde_json::Value;

use super::{AttemptId, AttemptState};

/// How a provider call ended, classified by the one table in
/// `providers::classify`. Only a definite failure allows automatic failover.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// An answer that parsed as JSON. It still has to satisfy the task's
    /// output schema (`contracts::TaskContract::judge`).
    Succeeded(Value),
    /// The provider surely did not do the work, or answered unusably
    /// (`invalid_output`).
    Failed(String),
    /// A definite failure in which nothing happened: the provider turned
    /// the request away before doing any work (rate limited, overloaded),
    /// or the request never reached it. Nothing was billed and nothing can
    /// happen twice, so the same request may be sent again as a new
    /// attempt (docs/design.md, "Rate limits and retries").
    Refused(Refusal),
    /// The request may have been acted on, but no usable answer came
    /// (timeout, connection lost after sending, 5xx, truncated body).
    Unknown(String),
}

/// Why a provider turned a request away without doing anything, and when
/// it said it may be called again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: String,
    /// What the provider's `Retry-After` asked for, if it said.
    pub retry_after: Option<Duration>,
    /// How long the provider asked not to be called at all, by anyone: its
    /// `Retry-After`, or a second for a `429` that gave none. `None` when it
    /// asked nothing (a refused connection).
    pub pause: Option<Duration>,
}

impl Refusal {
    /// A refusal that asks for nothing: the request never reached the provider.
    pub fn unreachable(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            retry_after: None,
            pause: None,
        }
    }
}

/// Where a reason's own words end and the provider's text (an error body,
/// a connection error naming hosts) begins. Owners see the words before it;
/// support staff see all (`summary_of`).
pub const DETAIL_MARKER: &str = "\n— the provider said: ";

/// A reason with the provider's text after it, when there is any.
pub fn with_detail(summary: impl Into<String>, detail: &str) -> String {
    let summary = summary.into();
    let detail = detail.trim();
    if detail.is_empty() {
        summary
    } else {
        format!("{summary}{DETAIL_MARKER}{detail}")
    }
}

/// The longest provider text kept in a reason.
pub const MAX_DETAIL_CHARS: usize = 400;

/// Provider text with every secret in `secrets` replaced by `***` (before
/// it is shortened, so no fragment survives a cut), then shortened to
/// [`MAX_DETAIL_CHARS`].
pub fn redacted<'a>(text: &str, secrets: impl IntoIterator<Item = &'a str>) -> String {
    let mut text = text.to_owned();
    for secret in secrets.into_iter().filter(|s| !s.is_empty()) {
        text = text.replace(secret, "***");
    }
    if text.chars().count() > MAX_DETAIL_CHARS {
        text = text.chars().take(MAX_DETAIL_CHARS).collect::<String>() + "…";
    }
    text
}

/// A reason without the provider's text: what a job's owner is shown.
pub fn summary_of(reason: &str) -> &str {
    reason.split(DETAIL_MARKER).next().unwrap_or(reason)
}

/// Provider text made safe to store and show: control characters (a NUL
/// byte would make PostgreSQL refuse the write, forever) are written as
/// `\u{…}` escapes; new lines and tabs stay.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            out.push_str(&format!("\\u{{{:04x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

impl Outcome {
    /// The same outcome with its reason made [`printable`].
    pub fn printable(self) -> Self {
        match self {
            Self::Failed(reason) => Self::Failed(printable(&reason)),
            Self::Refused(refusal) => Self::Refused(Refusal {
                reason: printable(&refusal.reason),
                ..refusal
            }),
            Self::Unknown(reason) => Self::Unknown(printable(&reason)),
            answer => answer,
        }
    }

    /// Why it failed or is unknown; `None` for a success.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Succeeded(_) => None,
            Self::Failed(reason) | Self::Unknown(reason) => Some(reason),
            Self::Refused(refusal) => Some(&refusal.reason),
        }
    }

    pub fn label(&self) -> &'static str {
        match self {
            Self::Succeeded(_) => "succeeded",
            Self::Failed(_) => "failed",
            Self::Refused(_) => "refused",
            Self::Unknown(_) => "unknown",
        }
    }

    /// The same outcome with its reason changed by `f` (redaction).
    pub fn map_reason(self, f: impl FnOnce(String) -> String) -> Self {
        match self {
            Self::Failed(reason) => Self::Failed(f(reason)),
            Self::Unknown(reason) => Self::Unknown(f(reason)),
            Self::Refused(refusal) => Self::Refused(Refusal {
                reason: f(refusal.reason),
                ..refusal
            }),
            answer => answer,
        }
    }
}

text_enum! {
    /// Whether a succeeded attempt's answer became the job's result (the
    /// attempt's `outcome` column).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, diesel::AsExpression, diesel::FromSqlRow)]
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub enum RaceResult {
        Won = "won",
        Lost = "lost",
    }
}

/// What applying an [`Outcome`] to its attempt did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The compare-and-swap succeeded: this answer is the job's result.
    Won,
    /// Another attempt won, or the job was finalized first: the answer was
    /// discarded and a race-log row written.
    Lost { winner: Option<AttemptId> },
    /// A definite failure; a new attempt was queued on the next qualified
    /// provider of the chain.
    FailedOver {
        attempt_id: AttemptId,
        provider: String,
    },
    /// A definite failure and no provider left: the job failed.
    JobFailed { reason: String },
    /// A definite failure in which nothing happened, on the only provider
    /// left (or the task waits out rate limits): a new attempt on the same
    /// provider is queued, not to be sent before `not_before` (Unix ms).
    RetryScheduled {
        attempt_id: AttemptId,
        provider: String,
        not_before: i64,
    },
    /// A definite failure recorded on the attempt only (it had been
    /// abandoned, or the job had finished).
    Recorded,
    /// The same news again (a callback repeated, the same answer twice):
    /// nothing new was written. Carries what the first delivery did.
    Repeated(&'static str),
    /// The call of an attempt whose job had finished through another
    /// attempt ended without an answer: the attempt was closed with a note
    /// (`abandoned`), not left for support as `unknown`.
    Superseded,
    /// The attempt is now `unknown`.
    MarkedUnknown,
    /// An answer for an attempt that had already finished (it had failed,
    /// or had answered before): discarded, and written to the race log.
    Discarded(AttemptState),
    /// The attempt was not in a state that takes this outcome.
    Ignored(AttemptState),
}

impl Applied {
    /// A short word for logs and the callback's answer.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Won => "won",
            Self::Lost { .. } => "lost",
            Self::FailedOver { .. }
            | Self::RetryScheduled { .. }
            | Self::JobFailed { .. }
            | Self::Recorded => "failed",
            Self::MarkedUnknown => "unknown",
            Self::Repeated(first) => first,
            Self::Superseded => "closed",
            Self::Discarded(_) | Self::Ignored(_) => "ignored",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_providers_own_text_is_kept_apart_from_the_reason() {
        let reason = with_detail(
            "the provider refused the request with 400",
            "db-7.internal: quota",
        );
        assert_eq!(
            summary_of(&reason),
            "the provider refused the request with 400"
        );
        assert!(reason.ends_with("db-7.internal: quota"));
        assert_eq!(with_detail("timeout", "  "), "timeout");
        assert_eq!(summary_of("no detail here"), "no detail here");
    }

    #[test]
    fn control_characters_in_provider_text_are_escaped_and_lines_kept() {
        assert_eq!(
            printable("a\0b\u{1b}[31m\nc\td"),
            "a\\u{0000}b\\u{001b}[31m\nc\td"
        );
        assert_eq!(
            Outcome::Failed("nul\0".into()).printable(),
            Outcome::Failed("nul\\u{0000}".into())
        );
    }
}
