//! The OpenAI Responses API's rules (docs/design.md, "Responses API"): a
//! response is a job, named `resp_<job id>`, and its job's status is told
//! in the Responses vocabulary. Its request is read by its codec
//! (`chat::responses`), under the limits here.

use super::ids::text_enum;
use super::{JobId, JobStatus};

/// The prefix of a response's id.
const RESPONSE_PREFIX: &str = "resp_";
/// The prefix of its one output message's id.
const MESSAGE_PREFIX: &str = "msg_";

/// The most `metadata` pairs, and their keys' and values' longest lengths
/// (OpenAI's limits).
pub const MAX_METADATA_PAIRS: usize = 16;
pub const MAX_METADATA_KEY: usize = 64;
pub const MAX_METADATA_VALUE: usize = 512;

/// A response's id: `resp_` and its job's id as 32 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResponseId(JobId);

impl ResponseId {
    pub fn of(job: &JobId) -> Self {
        Self(job.clone())
    }

    /// Parses `resp_<32 hex digits>`; anything else is `None`.
    pub fn parse(text: &str) -> Option<Self> {
        let hex = text.strip_prefix(RESPONSE_PREFIX)?;
        if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let uuid = uuid::Uuid::try_parse(hex).ok()?;
        JobId::parse(&uuid.hyphenated().to_string()).map(Self)
    }

    pub fn job_id(&self) -> &JobId {
        &self.0
    }

    fn hex(&self) -> String {
        self.0.as_str().replace('-', "")
    }

    /// The id of the response's output message.
    pub fn message_id(&self) -> String {
        format!("{MESSAGE_PREFIX}{}", self.hex())
    }
}

impl std::fmt::Display for ResponseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{RESPONSE_PREFIX}{}", self.hex())
    }
}

text_enum! {
    /// A response's `status`, in the Responses vocabulary.
    pub enum ResponseStatus {
        Queued = "queued",
        InProgress = "in_progress",
        Completed = "completed",
        /// Completed, its answer cut at the token limit.
        Incomplete = "incomplete",
        Failed = "failed",
        Cancelled = "cancelled",
    }
}

/// A response's `status` for its job's: `queued` until an attempt is
/// running, `in_progress` while one is out (an unknown outcome included:
/// it may yet answer), `completed` (or `incomplete` when the answer was
/// `cut_at_limit`, the token limit), `failed`, `cancelled`.
pub fn status_of(job: JobStatus, cut_at_limit: bool) -> ResponseStatus {
    match job {
        JobStatus::Pending => ResponseStatus::Queued,
        JobStatus::Running | JobStatus::Unknown => ResponseStatus::InProgress,
        JobStatus::Succeeded if cut_at_limit => ResponseStatus::Incomplete,
        JobStatus::Succeeded => ResponseStatus::Completed,
        JobStatus::Failed => ResponseStatus::Failed,
        JobStatus::Cancelled => ResponseStatus::Cancelled,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_id_names_its_job_and_parses_back() {
        let job = JobId::new();
        let id = ResponseId::of(&job);
        let text = id.to_string();
        assert!(text.starts_with("resp_") && text.len() == 37, "{text}");
        assert_eq!(ResponseId::parse(&text), Some(id.clone()));
        assert_eq!(ResponseId::parse(&text).unwrap().job_id(), &job);
        assert!(id.message_id().starts_with("msg_"));
        for bad in [
            "",
            "resp_",
            job.as_str(),
            &format!("resp_{}", job.as_str()),
            &text[..36],
            &format!("{text}0"),
            &text.replace("resp_", "chatcmpl-"),
            "resp_zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz",
        ] {
            assert_eq!(ResponseId::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_jobs_status_in_the_responses_vocabulary() {
        let shown = |job, cut| status_of(job, cut).as_str();
        assert_eq!(shown(JobStatus::Pending, false), "queued");
        assert_eq!(shown(JobStatus::Unknown, false), "in_progress");
        assert_eq!(shown(JobStatus::Succeeded, false), "completed");
        assert_eq!(shown(JobStatus::Succeeded, true), "incomplete");
        assert_eq!(shown(JobStatus::Failed, false), "failed");
        assert_eq!(shown(JobStatus::Cancelled, false), "cancelled");
    }
}
