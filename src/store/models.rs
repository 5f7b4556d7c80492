//! Rows as stored, and their conversion into domain-checked records.

use diesel::prelude::*;
use serde_json::Value;

use super::schema::{attempts, jobs, race_log};
use super::{StoreError, StoreResult};
use crate::domain::{AttemptOutcome, AttemptState, JobStatus};

#[derive(Debug, Clone, Queryable, Selectable, Insertable)]
#[diesel(table_name = jobs)]
pub struct JobRow {
    pub id: String,
    pub owner_id: String,
    pub idempotency_key: String,
    pub task: String,
    pub provider: String,
    pub requested_provider: Option<String>,
    pub input: String,
    pub params: String,
    pub fingerprint: String,
    pub status: String,
    pub version: i64,
    pub result: Option<String>,
    pub completed_by: Option<String>,
    pub failure_reason: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

#[derive(Debug, Clone, Queryable, Selectable, Insertable)]
#[diesel(table_name = attempts)]
pub struct AttemptRow {
    pub id: String,
    pub job_id: String,
    pub number: i32,
    pub provider: String,
    pub state: String,
    pub outcome: Option<String>,
    pub version_read: Option<i64>,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<i64>,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub timeout_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Queryable, Selectable, Insertable)]
#[diesel(table_name = race_log)]
pub struct RaceRow {
    pub id: String,
    pub job_id: String,
    pub losing_attempt_id: String,
    pub winning_attempt_id: Option<String>,
    pub reason: String,
    pub version_read: i64,
    pub version_found: i64,
    pub provider: String,
    pub payload_sha256: String,
    pub loser_started_at: Option<i64>,
    pub lost_at: i64,
}

/// A job as read back, with its JSON and enum columns checked.
#[derive(Debug, Clone)]
pub struct Job {
    pub id: String,
    pub owner_id: String,
    pub idempotency_key: String,
    pub task: String,
    pub provider: String,
    pub requested_provider: Option<String>,
    pub input: Value,
    pub params: Value,
    pub fingerprint: String,
    pub status: JobStatus,
    pub version: i64,
    pub result: Option<Value>,
    pub completed_by: Option<String>,
    pub failure_reason: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

fn parse_json(column: &str, text: &str) -> StoreResult<Value> {
    serde_json::from_str(text)
        .map_err(|e| StoreError::corrupt(format!("{column} is not JSON: {e}")))
}

impl TryFrom<JobRow> for Job {
    type Error = StoreError;

    fn try_from(row: JobRow) -> StoreResult<Self> {
        Ok(Self {
            status: JobStatus::parse(&row.status)
                .ok_or_else(|| StoreError::corrupt(format!("job status {:?}", row.status)))?,
            input: parse_json("jobs.input", &row.input)?,
            params: parse_json("jobs.params", &row.params)?,
            result: row
                .result
                .as_deref()
                .map(|r| parse_json("jobs.result", r))
                .transpose()?,
            id: row.id,
            owner_id: row.owner_id,
            idempotency_key: row.idempotency_key,
            task: row.task,
            provider: row.provider,
            requested_provider: row.requested_provider,
            fingerprint: row.fingerprint,
            version: row.version,
            completed_by: row.completed_by,
            failure_reason: row.failure_reason,
            created_at: row.created_at,
            updated_at: row.updated_at,
        })
    }
}

/// An attempt as read back, with its enum columns checked.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub id: String,
    pub job_id: String,
    pub number: i32,
    pub provider: String,
    pub state: AttemptState,
    pub outcome: Option<AttemptOutcome>,
    pub version_read: Option<i64>,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub timeout_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub error: Option<String>,
}

impl TryFrom<AttemptRow> for Attempt {
    type Error = StoreError;

    fn try_from(row: AttemptRow) -> StoreResult<Self> {
        Ok(Self {
            state: AttemptState::parse(&row.state)
                .ok_or_else(|| StoreError::corrupt(format!("attempt state {:?}", row.state)))?,
            outcome: row
                .outcome
                .as_deref()
                .map(|o| {
                    AttemptOutcome::parse(o)
                        .ok_or_else(|| StoreError::corrupt(format!("outcome {o:?}")))
                })
                .transpose()?,
            id: row.id,
            job_id: row.job_id,
            number: row.number,
            provider: row.provider,
            version_read: row.version_read,
            created_at: row.created_at,
            started_at: row.started_at,
            timeout_at: row.timeout_at,
            finished_at: row.finished_at,
            error: row.error,
        })
    }
}

/// Converts a list of rows, failing on the first inconsistent one.
pub fn convert_all<R, T>(rows: Vec<R>) -> StoreResult<Vec<T>>
where
    T: TryFrom<R, Error = StoreError>,
{
    rows.into_iter().map(T::try_from).collect()
}

/// SQL text values of a set of attempt states, for `IN (…)` filters.
pub fn state_names(states: &[AttemptState]) -> Vec<&'static str> {
    states.iter().map(|s| s.as_str()).collect()
}

/// SQL text values of the terminal job statuses.
pub fn terminal_status_names() -> Vec<&'static str> {
    JobStatus::TERMINAL.iter().map(|s| s.as_str()).collect()
}
