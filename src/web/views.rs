//! The JSON shapes of the API, shared by handlers and the OpenAPI document.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::ToSchema;

use crate::domain::{JsonText, Timestamp};

use crate::app::intake::JobRequest;
use crate::app::{Attempt, Job, RaceEntry, UnknownAttempt};

/// An RFC 3339 timestamp (UTC, milliseconds), as the API writes instants.
pub fn rfc3339(at: Timestamp) -> String {
    at.rfc3339()
}

fn rfc3339_opt(at: Option<Timestamp>) -> Option<String> {
    at.map(Timestamp::rfc3339)
}

/// Body of `POST /api/v1/jobs`. `input` and `params` are kept as the exact
/// text sent: stored as is, and fingerprinted by their canonical form.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateJobRequest {
    /// A configured task name, e.g. `summarize`.
    pub task: String,
    /// The task's input: a JSON object with the task's required fields.
    /// Numbers must be ones an IEEE double holds exactly.
    #[schema(value_type = Object)]
    pub input: Box<RawValue>,
    /// A provider of the task's chain to try first; default: the chain's primary.
    pub provider: Option<String>,
    /// Free-form parameters passed to the provider (a JSON object).
    #[schema(value_type = Option<Object>)]
    pub params: Option<Box<RawValue>>,
}

impl From<CreateJobRequest> for JobRequest {
    fn from(body: CreateJobRequest) -> Self {
        let text = |raw: Box<RawValue>| {
            JsonText::parse(raw.get()).expect("a raw value is one JSON document")
        };
        Self {
            task: body.task,
            input: text(body.input),
            provider: body.provider,
            params: body.params.map(text),
            chat_route: false,
        }
    }
}

/// Body of `POST /api/v1/jobs/{id}/attempts` (may be empty).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartAttemptRequest {
    /// A provider of the task's chain; default: the next untried one.
    pub provider: Option<String>,
}

/// Body of `POST /api/v1/attempts/{id}/abandon`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AbandonRequest {
    /// Why the attempt is abandoned (required, written to the audit log):
    /// not blank, at most 2000 characters once trimmed.
    #[schema(
        pattern = r"[^\t-\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]",
        max_length = 2000
    )]
    pub reason: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AttemptView {
    pub id: String,
    pub job_id: String,
    pub number: i32,
    pub provider: String,
    /// queued | running | succeeded | failed | unknown | abandoned
    pub state: String,
    /// "won" | "lost" | null
    pub outcome: Option<String>,
    /// The job version this attempt read when it started.
    pub version_read: Option<i64>,
    pub created_at: String,
    pub started_at: Option<String>,
    /// When the soft timeout falls (or fell).
    pub timeout_at: Option<String>,
    pub finished_at: Option<String>,
    pub error: Option<String>,
    /// A retry (after a refusal in which nothing happened) is not sent
    /// before this: its provider's `Retry-After`, or a backoff.
    pub not_before: Option<String>,
}

impl AttemptView {
    /// The attempt as its job's owner sees it: the reason without the
    /// provider's own text (which can name internal hosts or accounts).
    pub fn for_owner(a: &Attempt) -> Self {
        let mut view = Self::from(a);
        view.error = a.reason().map(|r| r.for_owner());
        view
    }
}

impl From<&Attempt> for AttemptView {
    fn from(a: &Attempt) -> Self {
        Self {
            id: a.id.to_string(),
            job_id: a.job_id.to_string(),
            number: a.number,
            provider: a.provider.clone(),
            state: a.state.as_str().to_owned(),
            outcome: a.outcome.map(|o| o.as_str().to_owned()),
            version_read: a.version_read,
            created_at: rfc3339(a.created_at),
            started_at: rfc3339_opt(a.started_at),
            timeout_at: rfc3339_opt(a.timeout_at),
            finished_at: rfc3339_opt(a.finished_at),
            error: a.reason().map(|r| r.for_staff()),
            not_before: rfc3339_opt(a.not_before),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct JobView {
    pub id: String,
    /// pending | running | unknown | succeeded | failed | cancelled
    pub status: String,
    /// Changes only when the job's outcome changes.
    pub version: i64,
    pub idempotency_key: String,
    pub task: String,
    /// The provider of the first attempt.
    pub provider: String,
    #[schema(value_type = Object)]
    pub input: JsonText,
    #[schema(value_type = Object)]
    pub params: JsonText,
    #[schema(value_type = Option<Object>)]
    pub result: Option<JsonText>,
    /// The attempt whose result won.
    pub completed_by: Option<String>,
    pub failure_reason: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    pub attempts: Vec<AttemptView>,
}

impl JobView {
    /// The job for `staff` (everything) or for its owner (reasons without
    /// the providers' own text).
    pub fn new(job: &Job, attempts: &[Attempt], staff: bool) -> Self {
        Self {
            id: job.id.to_string(),
            status: job.status.as_str().to_owned(),
            version: job.version,
            idempotency_key: job.idempotency_key.clone(),
            task: job.task.clone(),
            provider: job.provider.clone(),
            input: job.input.clone(),
            params: job.params.clone(),
            result: job.result.clone(),
            completed_by: job.completed_by.as_ref().map(ToString::to_string),
            failure_reason: job.failure().map(|r| r.for_staff()),
            created_at: rfc3339(job.created_at),
            updated_at: rfc3339(job.updated_at),
            attempts: attempts
                .iter()
                .map(|a| {
                    if staff {
                        AttemptView::from(a)
                    } else {
                        AttemptView::for_owner(a)
                    }
                })
                .collect(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct JobSummary {
    pub id: String,
    pub status: String,
    pub version: i64,
    pub idempotency_key: String,
    pub task: String,
    pub provider: String,
    pub created_at: String,
    pub updated_at: String,
}

impl From<&Job> for JobSummary {
    fn from(job: &Job) -> Self {
        Self {
            id: job.id.to_string(),
            status: job.status.as_str().to_owned(),
            version: job.version,
            idempotency_key: job.idempotency_key.clone(),
            task: job.task.clone(),
            provider: job.provider.clone(),
            created_at: rfc3339(job.created_at),
            updated_at: rfc3339(job.updated_at),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct JobPage {
    /// Newest first.
    pub jobs: Vec<JobSummary>,
    /// The URL of the next (older) page, if there is one.
    pub next: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct UnknownAttemptView {
    pub attempt_id: String,
    pub job_id: String,
    pub owner: String,
    pub task: String,
    pub provider: String,
    pub number: i32,
    pub started_at: Option<String>,
    pub timeout_at: Option<String>,
    /// Milliseconds since the attempt was sent.
    pub age_ms: i64,
    pub error: Option<String>,
    /// The job's status; `succeeded` means another attempt already won, so
    /// this one's answer can only lose.
    pub job_status: String,
}

impl UnknownAttemptView {
    pub fn new(u: &UnknownAttempt, now: Timestamp) -> Self {
        Self {
            attempt_id: u.attempt_id.to_string(),
            job_id: u.job_id.to_string(),
            owner: u.owner.clone(),
            task: u.task.clone(),
            provider: u.provider.clone(),
            number: u.number,
            started_at: rfc3339_opt(u.started_at),
            timeout_at: rfc3339_opt(u.timeout_at),
            age_ms: u.started_at.map_or(0, |s| (now - s).max(0)),
            error: u.reason().map(|r| r.for_staff()),
            job_status: u.job_status.as_str().to_owned(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RaceView {
    pub id: String,
    pub job_id: String,
    pub losing_attempt_id: String,
    pub winning_attempt_id: Option<String>,
    pub reason: String,
    pub version_read: i64,
    pub version_found: i64,
    pub provider: String,
    /// SHA-256 of the discarded payload's canonical JSON.
    pub payload_sha256: String,
    pub loser_started_at: Option<String>,
    pub lost_at: String,
}

impl From<&RaceEntry> for RaceView {
    fn from(r: &RaceEntry) -> Self {
        Self {
            id: r.id.clone(),
            job_id: r.job_id.to_string(),
            losing_attempt_id: r.losing_attempt_id.to_string(),
            winning_attempt_id: r.winning_attempt_id.as_ref().map(ToString::to_string),
            reason: r.reason.clone(),
            version_read: r.version_read,
            version_found: r.version_found,
            provider: r.provider.clone(),
            payload_sha256: r.payload_sha256.clone(),
            loser_started_at: rfc3339_opt(r.loser_started_at),
            lost_at: rfc3339(r.lost_at),
        }
    }
}

/// An RFC 9457 problem document.
#[derive(Debug, Serialize, ToSchema)]
pub struct Problem {
    /// A stable URI reference: `/problems/<slug>`.
    #[serde(rename = "type")]
    pub type_: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    pub status: String,
}
