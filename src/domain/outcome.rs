//! The outcome vocabulary: what a provider call produced ([`Outcome`]), what
//! applying it did to the job ([`Applied`]), and whether a succeeded attempt's
//! answer became the job's result ([`RaceResult`]).

use std::fmt;
use std::time::Duration;

use serde_json::Value;

use super::ids::text_enum;
use super::{AttemptId, AttemptState, Timestamp};

/// How a provider call ended, classified by the one table in
/// `providers::classify`. Only a definite failure allows automatic failover.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// An answer that parsed as JSON. It still has to satisfy the task's
    /// output schema (`contracts::TaskContract::judge`).
    Succeeded(Value),
    /// The provider surely did not do the work, or answered unusably
    /// (`invalid_output`).
    Failed(Reason),
    /// A definite failure in which nothing happened: the provider turned
    /// the request away before doing any work (rate limited, overloaded),
    /// or the request never reached it. Nothing was billed and nothing can
    /// happen twice, so the same request may be sent again as a new
    /// attempt (docs/design.md, "Rate limits and retries").
    Refused(Refusal),
    /// The request may have been acted on, but no usable answer came
    /// (timeout, connection lost after sending, 5xx, truncated body).
    Unknown(Reason),
}

/// Why a provider turned a request away without doing anything, and when
/// it said it may be called again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: Reason,
    /// What the provider's `Retry-After` asked for, if it said.
    pub retry_after: Option<Duration>,
    /// How long the provider asked not to be called at all, by anyone: its
    /// `Retry-After`, or a second for a `429` that gave none. `None` when it
    /// asked nothing (a refused connection).
    pub pause: Option<Duration>,
}

impl Refusal {
    /// A refusal that asks for nothing: the request never reached the provider.
    pub fn unreachable(reason: Reason) -> Self {
        Self {
            reason,
            retry_after: None,
            pause: None,
        }
    }
}

text_enum! {
    /// What kind of failure a [`Reason`] tells of (stored as its text in
    /// `attempts.error_kind` and `jobs.failure_kind`).
    stored pub enum ReasonKind {
        /// The provider answered, but not with what the task takes: not
        /// JSON, outside the output schema, too large (`invalid_output`).
        InvalidOutput = "invalid_output",
        /// Any other failure; its summary says which.
        Other = "other",
    }
}

/// How an [`ReasonKind::InvalidOutput`] reason's text begins.
const INVALID_OUTPUT_PREFIX: &str = "invalid_output: ";

/// Where a reason's own words end and the provider's text (an error body,
/// a connection error naming hosts) begins, in the text support staff are
/// shown ([`Reason::for_staff`]). Owners see the words before it.
pub const DETAIL_MARKER: &str = "\n— the provider said: ";

/// Why an attempt failed or has an unknown outcome: its kind, the summary
/// its job's owner may see, and the provider's own text (which can name
/// internal hosts or accounts), for support staff only.
///
/// It is stored in three columns: the kind, the summary and the detail
/// (`attempts.error_kind`, `error`, `error_detail`; `jobs.failure_kind`,
/// `failure_reason`, `failure_detail`), and read back with
/// [`Reason::from_columns`]. Rows written when it was one text, the kind's
/// prefix (`invalid_output: `), the summary, then [`DETAIL_MARKER`] and the
/// provider's text, were split into the columns by the migration
/// `2026-12-03-000016_failure_reason_columns`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reason {
    kind: ReasonKind,
    summary: String,
    detail: Option<String>,
}

impl Reason {
    pub fn new(summary: impl Into<String>) -> Self {
        Self {
            kind: ReasonKind::Other,
            summary: summary.into(),
            detail: None,
        }
    }

    /// An answer the task cannot take.
    pub fn invalid_output(summary: impl Into<String>) -> Self {
        Self {
            kind: ReasonKind::InvalidOutput,
            ..Self::new(summary)
        }
    }

    /// A reason as its columns hold it: nothing is parsed, trimmed or
    /// dropped.
    pub fn from_columns(kind: ReasonKind, summary: String, detail: Option<String>) -> Self {
        Self {
            kind,
            summary,
            detail,
        }
    }

    /// The same reason with the provider's text, when there is any.
    pub fn with_detail(mut self, detail: &str) -> Self {
        let detail = detail.trim();
        self.detail = (!detail.is_empty()).then(|| detail.to_owned());
        self
    }

    pub fn kind(&self) -> ReasonKind {
        self.kind
    }

    pub fn summary(&self) -> &str {
        &self.summary
    }

    /// The provider's own text, for support staff.
    pub fn detail(&self) -> Option<&str> {
        self.detail.as_deref()
    }

    /// What a job's owner is shown: the kind and the summary, without the
    /// provider's text.
    pub fn for_owner(&self) -> String {
        match self.kind {
            ReasonKind::InvalidOutput => format!("{INVALID_OUTPUT_PREFIX}{}", self.summary),
            ReasonKind::Other => self.summary.clone(),
        }
    }

    /// What support staff are shown: what the owner sees, then
    /// [`DETAIL_MARKER`] and the provider's text, if any.
    pub fn for_staff(&self) -> String {
        match &self.detail {
            Some(detail) => format!("{}{DETAIL_MARKER}{detail}", self.for_owner()),
            None => self.for_owner(),
        }
    }

    /// The same reason with `tail` written after all of it: after the
    /// provider's text when there is some, else after the summary. Its
    /// [`Reason::for_staff`] is the old one's followed by `tail`.
    pub fn followed_by(mut self, tail: &str) -> Self {
        match &mut self.detail {
            Some(detail) => detail.push_str(tail),
            None => self.summary.push_str(tail),
        }
        self
    }

    /// The same reason with `f` applied to its summary and to its
    /// provider's text (redaction, [`printable`]).
    pub fn map_text(self, f: impl Fn(String) -> String) -> Self {
        Self {
            kind: self.kind,
            summary: f(self.summary),
            detail: self.detail.map(&f),
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.for_staff())
    }
}

impl From<&str> for Reason {
    fn from(summary: &str) -> Self {
        Self::new(summary)
    }
}

impl From<String> for Reason {
    fn from(summary: String) -> Self {
        Self::new(summary)
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
        self.map_reason(|text| printable(&text))
    }

    /// Why it failed or is unknown; `None` for a success.
    pub fn reason(&self) -> Option<&Reason> {
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

    /// The same outcome with the text of its reason changed by `f`
    /// (redaction).
    pub fn map_reason(self, f: impl Fn(String) -> String) -> Self {
        match self {
            Self::Failed(reason) => Self::Failed(reason.map_text(f)),
            Self::Unknown(reason) => Self::Unknown(reason.map_text(f)),
            Self::Refused(refusal) => Self::Refused(Refusal {
                reason: refusal.reason.map_text(f),
                ..refusal
            }),
            answer => answer,
        }
    }
}

text_enum! {
    /// Whether a succeeded attempt's answer became the job's result (the
    /// attempt's `outcome` column).
    stored pub enum RaceResult {
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
    /// provider is queued, not to be sent before `not_before`.
    RetryScheduled {
        attempt_id: AttemptId,
        provider: String,
        not_before: Timestamp,
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
        let reason = Reason::new("the provider refused the request with 400")
            .with_detail("db-7.internal: quota");
        assert_eq!(
            reason.for_owner(),
            "the provider refused the request with 400"
        );
        assert!(reason.for_staff().ends_with("db-7.internal: quota"));
        assert_eq!(
            Reason::new("timeout").with_detail("  ").for_staff(),
            "timeout"
        );
    }

    #[test]
    fn reasons_read_back_from_their_columns_as_written() {
        let reason = Reason::from_columns(
            ReasonKind::InvalidOutput,
            "the answer is not JSON".into(),
            Some("<html>".into()),
        );
        assert_eq!(
            reason,
            Reason::invalid_output("the answer is not JSON").with_detail("<html>")
        );
        assert_eq!(reason.for_owner(), "invalid_output: the answer is not JSON");
        assert_eq!(
            reason.for_staff(),
            "invalid_output: the answer is not JSON\n— the provider said: <html>"
        );
        let plain = Reason::from_columns(ReasonKind::Other, "rate limited (429)".into(), None);
        assert_eq!(plain, Reason::new("rate limited (429)"));
        assert_eq!(
            Reason::invalid_output("too large").to_string(),
            "invalid_output: too large"
        );
        assert_eq!(
            ReasonKind::parse("invalid_output"),
            Some(ReasonKind::InvalidOutput)
        );
    }

    #[test]
    fn a_tail_follows_the_whole_reason() {
        let tail = "; closed";
        let with_detail = Reason::new("timeout").with_detail("upstream");
        assert_eq!(
            with_detail.clone().followed_by(tail).for_staff(),
            with_detail.for_staff() + tail
        );
        let plain = Reason::invalid_output("too large");
        assert_eq!(
            plain.clone().followed_by(tail).for_owner(),
            plain.for_owner() + tail
        );
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
