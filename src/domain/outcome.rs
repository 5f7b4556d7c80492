//! The outcome vocabulary: what a provider call produced ([`Outcome`]), what
//! applying it did to the job ([`Applied`]), and whether a succeeded attempt's
//! answer became the job's result ([`RaceResult`]).

use std::fmt;

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
    /// The request may have been acted on, but no usable answer came
    /// (timeout, connection lost after sending, 5xx, truncated body).
    Unknown(String),
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
            Self::Unknown(reason) => Self::Unknown(printable(&reason)),
            answer => answer,
        }
    }

    /// Why it failed or is unknown; `None` for a success.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Succeeded(_) => None,
            Self::Failed(reason) | Self::Unknown(reason) => Some(reason),
        }
    }

    pub fn label(&self) -> &'static str {
        match self {
            Self::Succeeded(_) => "succeeded",
            Self::Failed(_) => "failed",
            Self::Unknown(_) => "unknown",
        }
    }
}

/// Whether a succeeded attempt's answer became the job's result (the
/// attempt's `outcome` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, diesel::AsExpression, diesel::FromSqlRow)]
#[diesel(sql_type = diesel::sql_types::Text)]
pub enum RaceResult {
    Won,
    Lost,
}

impl RaceResult {
    pub const ALL: [RaceResult; 2] = [Self::Won, Self::Lost];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Won => "won",
            Self::Lost => "lost",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == text)
    }
}

impl fmt::Display for RaceResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
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
    /// A definite failure recorded on the attempt only (it had been
    /// abandoned, or the job had finished).
    Recorded,
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
            Self::FailedOver { .. } | Self::JobFailed { .. } | Self::Recorded => "failed",
            Self::MarkedUnknown => "unknown",
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
