//! One row type per table the domain reads: stored columns, typed (ids,
//! states and JSON are checked as they are read).

use diesel::prelude::*;

use super::schema::{attempts, jobs, qualifications, race_log};
use crate::domain::{
    AttemptId, AttemptState, JobId, JobStatus, JsonText, RaceResult, Reason, ReasonKind, Timestamp,
    UserId,
};

/// The attempt's columns a creating statement returns, named: a prepared
/// statement that returned `*` would fail once a migration added a column
/// while it was kept ("cached plan must not change result type").
pub(super) const ATTEMPT_COLUMNS: &str = "id, job_id, owner_id, number, provider, state, outcome, \
     version_read, lease_owner, lease_expires_at, created_at, started_at, timeout_at, \
     finished_at, error, sent_at, not_before, error_kind, error_detail";

/// A job: one user intent. Its intent columns never change.
///
/// Inserted with every column, `None` as NULL (none of its nullable columns
/// has another default): the insert's text is then the same for every job,
/// and a connection keeps it prepared by type (`keep_prepared_as`).
#[derive(Debug, Clone, PartialEq, Queryable, QueryableByName, Selectable, Insertable)]
#[diesel(table_name = jobs, treat_none_as_default_value = false)]
pub struct Job {
    pub id: JobId,
    pub owner_id: UserId,
    pub idempotency_key: String,
    pub task: String,
    /// The provider of the first attempt.
    pub provider: String,
    /// The provider the client named, if it named one.
    pub requested_provider: Option<String>,
    pub input: JsonText,
    pub params: JsonText,
    pub fingerprint: String,
    pub status: JobStatus,
    /// Changes only when the job's outcome changes.
    pub version: i64,
    pub result: Option<JsonText>,
    /// The attempt whose answer won.
    pub completed_by: Option<AttemptId>,
    /// A failed job's reason, in three columns: see [`Job::failure`].
    pub failure_reason: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub failure_kind: Option<ReasonKind>,
    pub failure_detail: Option<String>,
    /// Its trace's context, in its stored form: see [`Job::trace`].
    pub trace_context: Option<String>,
}

impl Job {
    /// The job's trace, which its attempts and webhooks continue.
    pub fn trace(&self) -> Option<crate::domain::TraceContext> {
        crate::domain::TraceContext::from_column(self.trace_context.as_deref()?)
    }

    /// Why the job failed, from its columns; `None` unless it failed.
    pub fn failure(&self) -> Option<Reason> {
        reason_of(
            self.failure_kind,
            self.failure_reason.as_ref(),
            self.failure_detail.as_ref(),
        )
    }

    /// The job with `reason` as its failure.
    pub fn set_failure(&mut self, reason: Option<&Reason>) {
        (self.failure_kind, self.failure_reason, self.failure_detail) = columns_of(reason);
    }
}

/// A reason from its columns (kind, summary, detail): none without a
/// summary; a summary written without its kind reads as
/// [`ReasonKind::Other`].
pub fn reason_of(
    kind: Option<ReasonKind>,
    summary: Option<&String>,
    detail: Option<&String>,
) -> Option<Reason> {
    summary.map(|summary| {
        Reason::from_columns(
            kind.unwrap_or(ReasonKind::Other),
            summary.clone(),
            detail.cloned(),
        )
    })
}

/// A reason's columns: (kind, summary, detail).
pub fn columns_of(reason: Option<&Reason>) -> (Option<ReasonKind>, Option<String>, Option<String>) {
    match reason {
        Some(reason) => (
            Some(reason.kind()),
            Some(reason.summary().to_owned()),
            reason.detail().map(str::to_owned),
        ),
        None => (None, None, None),
    }
}

#[cfg(test)]
impl Job {
    /// A succeeded job of `task` holding `result`, for unit tests.
    pub(crate) fn succeeded_for_tests(task: &str, result: Option<serde_json::Value>) -> Self {
        use crate::domain::{JobId, JobStatus, JsonText, UserId};
        Self {
            id: JobId::new(),
            owner_id: UserId::new(),
            idempotency_key: "k".into(),
            task: task.into(),
            provider: "p".into(),
            requested_provider: None,
            input: JsonText::from_value(&serde_json::json!({})),
            params: JsonText::from_value(&serde_json::json!({})),
            fingerprint: "0".repeat(64),
            status: JobStatus::Succeeded,
            version: 1,
            result: result.map(|r| JsonText::from_value(&r)),
            completed_by: None,
            failure_reason: None,
            created_at: Timestamp::from_millis(5_000),
            updated_at: Timestamp::from_millis(5_000),
            failure_kind: None,
            failure_detail: None,
            trace_context: None,
        }
    }
}

/// An attempt: one try at a job against one provider. Inserted with every
/// column (`None` as NULL, which is each optional column's default), so
/// that its insert has one text and stays prepared.
#[derive(Debug, Clone, PartialEq, Queryable, QueryableByName, Selectable, Insertable)]
#[diesel(table_name = attempts, treat_none_as_default_value = false)]
pub struct Attempt {
    pub id: AttemptId,
    pub job_id: JobId,
    /// The job's owner: an attempt lives with its job.
    pub owner_id: UserId,
    pub number: i32,
    pub provider: String,
    pub state: AttemptState,
    /// For a succeeded attempt: whether its answer became the job's result.
    pub outcome: Option<RaceResult>,
    /// The job version read when the attempt was claimed.
    pub version_read: Option<i64>,
    /// The worker that claimed the attempt (`pid<N>-<uuid>`), kept after
    /// the attempt finishes.
    pub lease_owner: Option<String>,
    /// Until when the claim holds; cleared when the attempt leaves `running`.
    pub lease_expires_at: Option<Timestamp>,
    pub created_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub timeout_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    /// Why it failed, is unknown or was closed, in three columns: see
    /// [`Attempt::reason`].
    pub error: Option<String>,
    /// When the worker confirmed its claim and sent the attempt; `None`:
    /// never sent.
    pub sent_at: Option<Timestamp>,
    /// A retry is not sent before this time (the database's
    /// clock): its provider's `Retry-After`, or a backoff.
    pub not_before: Option<Timestamp>,
    pub error_kind: Option<ReasonKind>,
    pub error_detail: Option<String>,
}

impl Attempt {
    /// Why it failed, is unknown or was closed, from its columns.
    pub fn reason(&self) -> Option<Reason> {
        reason_of(
            self.error_kind,
            self.error.as_ref(),
            self.error_detail.as_ref(),
        )
    }

    /// How long this attempt had to wait before it could be sent (a
    /// retry's wait; 0 for any other attempt).
    pub fn waited_ms(&self) -> i64 {
        self.not_before
            .map_or(0, |not_before| (not_before - self.created_at).max(0))
    }
}

/// A race-log row: an answer that did not win, and why.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Insertable)]
#[diesel(table_name = race_log)]
pub struct RaceEntry {
    pub id: String,
    pub job_id: JobId,
    /// The job's owner.
    pub owner_id: UserId,
    pub losing_attempt_id: AttemptId,
    pub winning_attempt_id: Option<AttemptId>,
    pub reason: String,
    pub version_read: i64,
    pub version_found: i64,
    pub provider: String,
    /// SHA-256 of the discarded answer's canonical JSON.
    pub payload_sha256: String,
    pub loser_started_at: Option<Timestamp>,
    pub lost_at: Timestamp,
}

/// One qualification run of a provider against a task's contract.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Insertable)]
#[diesel(table_name = qualifications)]
pub struct QualificationRun {
    pub id: String,
    pub provider: String,
    pub model: String,
    pub task: String,
    pub template_sha256: String,
    pub output_schema_sha256: String,
    pub passed: bool,
    /// JSON: `[{"name": …, "passed": …, "detail": …}]`.
    pub checks: String,
    pub round_trip_ms: i64,
    pub qualified_at: Timestamp,
}

/// A job named by its whole primary key: its id and its owner. Every
/// statement that locks, updates or deletes a job's rows names the owner,
/// so on a database distributed by owner it runs on one shard
/// (docs/scaling.md, "The statement rule").
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JobKey {
    pub id: JobId,
    pub owner_id: UserId,
}

/// An attempt named by its whole primary key, as [`JobKey`] names a job.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AttemptKey {
    pub id: AttemptId,
    pub owner_id: UserId,
}

/// Shown as the attempt's id, which names it to people.
impl std::fmt::Display for AttemptKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.id.fmt(f)
    }
}

impl Job {
    pub fn key(&self) -> JobKey {
        JobKey {
            id: self.id.clone(),
            owner_id: self.owner_id.clone(),
        }
    }
}

impl Attempt {
    pub fn key(&self) -> AttemptKey {
        AttemptKey {
            id: self.id.clone(),
            owner_id: self.owner_id.clone(),
        }
    }

    /// The key of this attempt's job.
    pub fn job_key(&self) -> JobKey {
        JobKey {
            id: self.job_id.clone(),
            owner_id: self.owner_id.clone(),
        }
    }
}
