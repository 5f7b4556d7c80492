//! What the console reads: the unknown queue, the race log, the audit log and
//! the front page's numbers.

use diesel::prelude::*;

use super::queue::same_job;
use super::rows::RaceEntry;
use super::schema::{attempts, audit_log, jobs, race_log, users};
use super::{DbConnection, StoreResult};
use crate::domain::{
    AttemptId, AttemptState, AuditAction, JobId, JobStatus, Reason, ReasonKind, Timestamp, UserId,
};

/// An attempt stuck in `unknown`, with what is known about it.
#[derive(Debug, Clone, Queryable)]
pub struct UnknownAttempt {
    pub attempt_id: AttemptId,
    pub job_id: JobId,
    pub owner: String,
    pub task: String,
    pub provider: String,
    pub number: i32,
    pub started_at: Option<Timestamp>,
    pub timeout_at: Option<Timestamp>,
    /// Why it is unknown, in its three columns: see [`UnknownAttempt::reason`].
    pub error_kind: Option<ReasonKind>,
    pub error: Option<String>,
    pub error_detail: Option<String>,
    /// The job's status: an unknown attempt of a job that another attempt
    /// already won can only lose; support may abandon it without a worry.
    pub job_status: JobStatus,
}

impl UnknownAttempt {
    /// Why it is unknown, from its columns.
    pub fn reason(&self) -> Option<Reason> {
        super::rows::reason_of(
            self.error_kind,
            self.error.as_ref(),
            self.error_detail.as_ref(),
        )
    }
}

/// Attempts in `unknown`, oldest first, `limit` at a time, after the attempt
/// `after` (the last one of the previous page) when given.
pub fn unknown_attempts(
    conn: &mut DbConnection,
    after: Option<&AttemptId>,
    limit: i64,
) -> StoreResult<Vec<UnknownAttempt>> {
    let mut query = attempts::table
        .inner_join(jobs::table.on(same_job()))
        .inner_join(users::table.on(users::id.eq(jobs::owner_id)))
        .filter(attempts::state.eq(AttemptState::Unknown))
        .order((attempts::started_at.asc(), attempts::id.asc()))
        .limit(limit)
        .select((
            attempts::id,
            attempts::job_id,
            users::name,
            jobs::task,
            attempts::provider,
            attempts::number,
            attempts::started_at,
            attempts::timeout_at,
            attempts::error_kind,
            attempts::error,
            attempts::error_detail,
            jobs::status,
        ))
        .into_boxed();
    if let Some(after) = after {
        let started: Option<Option<i64>> = attempts::table
            .find(after)
            .select(attempts::started_at)
            .first(conn)
            .optional()?;
        if let Some(started) = started.flatten() {
            query = query.filter(
                attempts::started_at.gt(started).or(attempts::started_at
                    .eq(started)
                    .and(attempts::id.gt(after.clone()))),
            );
        }
    }
    Ok(query.load(conn)?)
}

/// Race-log rows, newest first.
pub fn races(conn: &mut DbConnection, limit: i64) -> StoreResult<Vec<RaceEntry>> {
    Ok(race_log::table
        .order((race_log::lost_at.desc(), race_log::id.desc()))
        .limit(limit)
        .select(RaceEntry::as_select())
        .load(conn)?)
}

/// One audit entry: who did what, when and why.
#[derive(Debug, Clone, Queryable)]
pub struct AuditEntry {
    pub id: String,
    pub actor: String,
    pub action: AuditAction,
    pub job_id: Option<JobId>,
    pub attempt_id: Option<AttemptId>,
    pub reason: String,
    pub at: Timestamp,
}

pub fn audit_entries(conn: &mut DbConnection, limit: i64) -> StoreResult<Vec<AuditEntry>> {
    audit_query(None, limit).load(conn).map_err(Into::into)
}

/// The audit entries about one job of `owner_id`, newest first.
pub fn audit_for_job(
    conn: &mut DbConnection,
    owner_id: &UserId,
    job_id: &JobId,
) -> StoreResult<Vec<AuditEntry>> {
    audit_query(Some((owner_id, job_id)), 200)
        .load(conn)
        .map_err(Into::into)
}

type AuditQuery<'a> = diesel::dsl::IntoBoxed<
    'a,
    diesel::dsl::Select<
        diesel::dsl::Limit<
            diesel::dsl::Order<
                diesel::dsl::InnerJoin<audit_log::table, users::table>,
                (
                    diesel::dsl::Desc<audit_log::at>,
                    diesel::dsl::Desc<audit_log::id>,
                ),
            >,
        >,
        (
            audit_log::id,
            users::name,
            audit_log::action,
            audit_log::job_id,
            audit_log::attempt_id,
            audit_log::reason,
            audit_log::at,
        ),
    >,
    <DbConnection as diesel::Connection>::Backend,
>;

fn audit_query(job: Option<(&UserId, &JobId)>, limit: i64) -> AuditQuery<'static> {
    let query = audit_log::table
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
        .into_boxed();
    match job {
        Some((owner_id, job_id)) => query
            .filter(audit_log::owner_id.eq(owner_id.clone()))
            .filter(audit_log::job_id.eq(job_id.clone())),
        None => query,
    }
}

/// What staff search jobs by; every field optional.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub owner_name: Option<String>,
    pub idempotency_key: Option<String>,
    pub status: Option<JobStatus>,
    pub provider: Option<String>,
    /// Jobs older than this one (the last of the previous page).
    pub before: Option<JobId>,
}

/// A job in the staff's list: with its owner's name.
#[derive(Debug, Clone, Queryable)]
pub struct JobListing {
    pub id: JobId,
    pub owner: String,
    pub idempotency_key: String,
    pub task: String,
    pub provider: String,
    pub status: JobStatus,
    pub created_at: Timestamp,
}

/// Jobs of every owner, newest first, `limit` at a time, narrowed by the
/// filter. `provider` matches any attempt's provider, not only the first.
/// A search by owner resolves the name first, so that on a database
/// distributed by owner it asks that owner's shard alone.
pub fn find_jobs(
    conn: &mut DbConnection,
    filter: &JobFilter,
    limit: i64,
) -> StoreResult<Vec<JobListing>> {
    let owner_id: Option<Option<UserId>> = match &filter.owner_name {
        Some(name) => Some(
            users::table
                .filter(users::name.eq(name))
                .select(users::id)
                .first(conn)
                .optional()?,
        ),
        None => None,
    };
    if owner_id == Some(None) {
        return Ok(Vec::new());
    }
    let mut query = jobs::table
        .inner_join(users::table)
        .order(jobs::id.desc())
        .limit(limit)
        .select((
            jobs::id,
            users::name,
            jobs::idempotency_key,
            jobs::task,
            jobs::provider,
            jobs::status,
            jobs::created_at,
        ))
        .into_boxed();
    if let Some(Some(owner_id)) = &owner_id {
        query = query.filter(jobs::owner_id.eq(owner_id.clone()));
    }
    if let Some(key) = &filter.idempotency_key {
        query = query.filter(jobs::idempotency_key.eq(key.clone()));
    }
    if let Some(status) = filter.status {
        query = query.filter(jobs::status.eq(status));
    }
    if let Some(provider) = &filter.provider {
        // Matched on the whole key, so each shard answers for its own; with
        // an owner named, by its value, so that Citus routes the subquery
        // to that owner's shard as it does the rest.
        let of_provider = attempts::table
            .filter(attempts::job_id.eq(jobs::id))
            .filter(attempts::provider.eq(provider.clone()));
        query = match &owner_id {
            Some(Some(owner_id)) => query.filter(diesel::dsl::exists(
                of_provider.filter(attempts::owner_id.eq(owner_id.clone())),
            )),
            _ => query.filter(diesel::dsl::exists(
                of_provider.filter(attempts::owner_id.eq(jobs::owner_id)),
            )),
        };
    }
    if let Some(before) = &filter.before {
        query = query.filter(jobs::id.lt(before.clone()));
    }
    Ok(query.load(conn)?)
}

/// The numbers on the console's front page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleCounts {
    pub unknown_now: i64,
    /// When the oldest unknown attempt was sent.
    pub oldest_unknown_started_at: Option<Timestamp>,
    pub races_last_24h: i64,
}

pub fn console_counts(conn: &mut DbConnection, now: Timestamp) -> StoreResult<ConsoleCounts> {
    let unknown = attempts::table.filter(attempts::state.eq(AttemptState::Unknown));
    let unknown_now: i64 = unknown.count().get_result(conn)?;
    let oldest_unknown_started_at: Option<Timestamp> = unknown
        .select(diesel::dsl::min(attempts::started_at))
        .first(conn)?;
    let races_last_24h: i64 = race_log::table
        .filter(race_log::lost_at.ge(now - 24 * 3600 * 1000))
        .count()
        .get_result(conn)?;
    Ok(ConsoleCounts {
        unknown_now,
        oldest_unknown_started_at,
        races_last_24h,
    })
}

/// One attempt's identity, for the race log's winner and loser columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptBrief {
    pub id: AttemptId,
    pub number: i32,
    pub provider: String,
    pub finished_at: Option<Timestamp>,
}

/// A race-log row with both sides of the race.
#[derive(Debug, Clone)]
pub struct RaceDetail {
    pub race: RaceEntry,
    pub loser: Option<AttemptBrief>,
    pub winner: Option<AttemptBrief>,
}

impl RaceDetail {
    /// How long after the winner's answer the loser's arrived, in ms.
    pub fn gap_ms(&self) -> Option<i64> {
        let winner_at = self.winner.as_ref()?.finished_at?;
        Some(self.race.lost_at - winner_at)
    }
}

/// Race-log rows for the console, newest first, optionally for one provider
/// (as winner or loser) and since a time.
pub fn race_details(
    conn: &mut DbConnection,
    provider: Option<&str>,
    since: Option<Timestamp>,
    limit: i64,
) -> StoreResult<Vec<RaceDetail>> {
    let mut query = race_log::table
        .order((race_log::lost_at.desc(), race_log::id.desc()))
        .limit(limit)
        .select(RaceEntry::as_select())
        .into_boxed();
    if let Some(since) = since {
        query = query.filter(race_log::lost_at.ge(since));
    }
    let rows = query.load(conn)?;
    let ids: Vec<AttemptId> = rows
        .iter()
        .flat_map(|r| {
            [
                Some(r.losing_attempt_id.clone()),
                r.winning_attempt_id.clone(),
            ]
        })
        .flatten()
        .collect();
    let briefs: Vec<AttemptBrief> = attempts::table
        .filter(attempts::id.eq_any(&ids))
        .select((
            attempts::id,
            attempts::number,
            attempts::provider,
            attempts::finished_at,
        ))
        .load::<(AttemptId, i32, String, Option<Timestamp>)>(conn)?
        .into_iter()
        .map(|(id, number, provider, finished_at)| AttemptBrief {
            id,
            number,
            provider,
            finished_at,
        })
        .collect();
    let find = |id: &AttemptId| briefs.iter().find(|b| &b.id == id).cloned();
    Ok(rows
        .into_iter()
        .map(|race| RaceDetail {
            loser: find(&race.losing_attempt_id),
            winner: race.winning_attempt_id.as_ref().and_then(find),
            race,
        })
        .filter(|d| match provider {
            None => true,
            Some(p) => d.race.provider == p || d.winner.as_ref().is_some_and(|w| w.provider == p),
        })
        .collect())
}
