//! What support staff and admins read and write: the unknown queue, the race
//! log and the audit log.

use diesel::prelude::*;

use super::models::RaceRow;
use super::schema::{attempts, audit_log, jobs, race_log, users};
use super::{DbConnection, StoreResult};
use crate::domain::AttemptState;

/// An attempt stuck in `unknown`, with what is known about it.
#[derive(Debug, Clone, Queryable)]
pub struct UnknownAttempt {
    pub attempt_id: String,
    pub job_id: String,
    pub owner: String,
    pub task: String,
    pub provider: String,
    pub number: i32,
    pub started_at: Option<i64>,
    pub timeout_at: Option<i64>,
    pub error: Option<String>,
}

/// Every attempt in `unknown`, oldest first.
pub fn unknown_attempts(conn: &mut DbConnection) -> StoreResult<Vec<UnknownAttempt>> {
    Ok(attempts::table
        .inner_join(jobs::table.inner_join(users::table))
        .filter(attempts::state.eq(AttemptState::Unknown.as_str()))
        .order((attempts::started_at.asc(), attempts::id.asc()))
        .select((
            attempts::id,
            attempts::job_id,
            users::name,
            jobs::task,
            attempts::provider,
            attempts::number,
            attempts::started_at,
            attempts::timeout_at,
            attempts::error,
        ))
        .load(conn)?)
}

/// Race-log rows, newest first.
pub fn races(conn: &mut DbConnection, limit: i64) -> StoreResult<Vec<RaceRow>> {
    Ok(race_log::table
        .order((race_log::lost_at.desc(), race_log::id.desc()))
        .limit(limit)
        .select(RaceRow::as_select())
        .load(conn)?)
}

pub fn record_audit(
    conn: &mut DbConnection,
    actor_id: &str,
    action: &str,
    job_id: Option<&str>,
    attempt_id: Option<&str>,
    reason: &str,
    at: i64,
) -> QueryResult<()> {
    diesel::insert_into(audit_log::table)
        .values((
            audit_log::id.eq(uuid::Uuid::now_v7().to_string()),
            audit_log::actor_id.eq(actor_id),
            audit_log::action.eq(action),
            audit_log::job_id.eq(job_id),
            audit_log::attempt_id.eq(attempt_id),
            audit_log::reason.eq(reason),
            audit_log::at.eq(at),
        ))
        .execute(conn)?;
    Ok(())
}

/// One audit entry: who did what, when and why.
#[derive(Debug, Clone, Queryable)]
pub struct AuditEntry {
    pub id: String,
    pub actor: String,
    pub action: String,
    pub job_id: Option<String>,
    pub attempt_id: Option<String>,
    pub reason: String,
    pub at: i64,
}

pub fn audit_entries(conn: &mut DbConnection, limit: i64) -> StoreResult<Vec<AuditEntry>> {
    Ok(audit_log::table
        .inner_join(users::table)
        .order((audit_log::at.desc(), audit_log::id.desc()))
        .limit(limit)
        .select((
            audit_log::id,
            users::name,
            audit_log::action,
            audit_log::job_id,
            audit_log::attempt_id,
            audit_log::reason,
            audit_log::at,
        ))
        .load(conn)?)
}
