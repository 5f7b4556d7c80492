//! Reading what the server stored, straight from its database: rows as
//! stored (status and JSON columns as their text), for tests that check the
//! store and not only what an API answers.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use onejob::domain::{IdempotencyKey, JsonText, UserId};
use onejob::store::jobs::NewJob;
use onejob::store::schema::{api_tokens, attempts, audit_log, jobs, race_log, sessions, users};
use onejob::store::{Attempt, DbConnection, Job, RaceEntry};
use serde_json::{json, Value};

use super::webdriver::WAIT;
use crate::support::harness::TestApp;

/// A job row, as stored (JSON columns as their text).
#[derive(Debug, Queryable)]
pub struct JobRow {
    pub id: String,
    pub idempotency_key: String,
    pub status: String,
    pub input: String,
    pub result: Option<String>,
    pub completed_by: Option<String>,
}

impl JobRow {
    pub fn input(&self) -> Value {
        serde_json::from_str(&self.input).unwrap()
    }

    pub fn result(&self) -> Option<Value> {
        self.result
            .as_deref()
            .map(|result| serde_json::from_str(result).unwrap())
    }
}

/// Every job the user owns, oldest first.
pub async fn job_rows(app: &TestApp, owner: &onejob::domain::UserId) -> Vec<JobRow> {
    let owner = owner.clone();
    app.with_conn(move |conn| {
        jobs::table
            .filter(jobs::owner_id.eq(owner))
            .order(jobs::created_at)
            .select((
                jobs::id,
                jobs::idempotency_key,
                jobs::status,
                jobs::input,
                jobs::result,
                jobs::completed_by,
            ))
            .load(conn)
            .unwrap()
    })
    .await
}

/// An attempt row, as stored.
#[derive(Debug, Queryable)]
pub struct AttemptRow {
    pub id: String,
    pub number: i32,
    pub provider: String,
    pub state: String,
    pub outcome: Option<String>,
}

/// The job's attempts, by number.
pub async fn attempt_rows(app: &TestApp, job_id: &str) -> Vec<AttemptRow> {
    let job_id = job_id.to_owned();
    app.with_conn(move |conn| {
        attempts::table
            .filter(attempts::job_id.eq(job_id))
            .order(attempts::number)
            .select((
                attempts::id,
                attempts::number,
                attempts::provider,
                attempts::state,
                attempts::outcome,
            ))
            .load(conn)
            .unwrap()
    })
    .await
}

/// What attempt rows say: (number, provider, state, outcome) each.
pub fn summary(rows: &[AttemptRow]) -> Vec<(i32, &str, &str, Option<&str>)> {
    rows.iter()
        .map(|a| {
            (
                a.number,
                a.provider.as_str(),
                a.state.as_str(),
                a.outcome.as_deref(),
            )
        })
        .collect()
}

/// An audit-log row, as stored.
#[derive(Debug, Queryable)]
pub struct AuditRow {
    pub actor_id: String,
    pub action: String,
    pub job_id: Option<String>,
    pub attempt_id: Option<String>,
    pub reason: String,
}

/// The whole audit log, oldest first.
pub async fn audit_rows(app: &TestApp) -> Vec<AuditRow> {
    app.with_conn(|conn| {
        audit_log::table
            .order((audit_log::at, audit_log::id))
            .select((
                audit_log::actor_id,
                audit_log::action,
                audit_log::job_id,
                audit_log::attempt_id,
                audit_log::reason,
            ))
            .load(conn)
            .unwrap()
    })
    .await
}

/// A race-log row, as stored.
#[derive(Debug, Queryable)]
pub struct RaceRow {
    pub losing_attempt_id: String,
    pub winning_attempt_id: Option<String>,
    pub provider: String,
    pub version_read: i64,
    pub version_found: i64,
    pub payload_sha256: String,
}

/// The job's race-log rows.
pub async fn race_rows(app: &TestApp, job_id: &str) -> Vec<RaceRow> {
    let job_id = job_id.to_owned();
    app.with_conn(move |conn| {
        race_log::table
            .filter(race_log::job_id.eq(job_id))
            .select((
                race_log::losing_attempt_id,
                race_log::winning_attempt_id,
                race_log::provider,
                race_log::version_read,
                race_log::version_found,
                race_log::payload_sha256,
            ))
            .load(conn)
            .unwrap()
    })
    .await
}

/// A user row, as stored.
#[derive(Debug, Queryable)]
pub struct UserRow {
    pub role: String,
    pub disabled_at: Option<i64>,
    pub password_hash: Option<String>,
}

/// The user called `name`, if there is one.
pub async fn user_row(app: &TestApp, name: &str) -> Option<UserRow> {
    let name = name.to_owned();
    app.with_conn(move |conn| {
        users::table
            .filter(users::name.eq(name))
            .select((users::role, users::disabled_at, users::password_hash))
            .first(conn)
            .optional()
            .unwrap()
    })
    .await
}

/// How many API tokens the user called `name` has.
pub async fn token_count(app: &TestApp, name: &str) -> i64 {
    let name = name.to_owned();
    app.with_conn(move |conn| {
        api_tokens::table
            .inner_join(users::table)
            .filter(users::name.eq(name))
            .count()
            .get_result(conn)
            .unwrap()
    })
    .await
}

/// One audit entry about a user: (actor, action, subject, reason), names
/// for ids.
pub type UserAudit = (String, String, String, String);

/// The audit log's entries about users, oldest first.
pub async fn user_audit(app: &TestApp) -> Vec<UserAudit> {
    app.with_conn(|conn| {
        let names: Vec<(String, String)> = users::table
            .select((users::id, users::name))
            .load(conn)
            .unwrap();
        let name = |id: &str| {
            names
                .iter()
                .find(|(user, _)| user == id)
                .map_or_else(|| format!("unknown user {id}"), |(_, name)| name.clone())
        };
        let rows: Vec<(String, String, Option<String>, String)> = audit_log::table
            .filter(audit_log::subject_user_id.is_not_null())
            .order((audit_log::at, audit_log::id))
            .select((
                audit_log::actor_id,
                audit_log::action,
                audit_log::subject_user_id,
                audit_log::reason,
            ))
            .load(conn)
            .unwrap();
        rows.into_iter()
            .map(|(actor, action, subject, reason)| {
                (
                    name(&actor),
                    action,
                    name(subject.as_deref().unwrap_or_default()),
                    reason,
                )
            })
            .collect()
    })
    .await
}

/// A job as the search page lists it: (id, owner's name, key, status).
pub type ListedJob = (String, String, String, String);

/// Every job, newest first, with its owner's name.
pub async fn every_job(app: &TestApp) -> Vec<ListedJob> {
    app.with_conn(|conn| {
        jobs::table
            .inner_join(users::table.on(users::id.eq(jobs::owner_id)))
            .order((jobs::created_at.desc(), jobs::id.desc()))
            .select((jobs::id, users::name, jobs::idempotency_key, jobs::status))
            .load(conn)
            .unwrap()
    })
    .await
}

/// Polls the database until `done` holds for the job's attempts (panics
/// after `WAIT`).
pub async fn wait_for_attempts(
    app: &TestApp,
    job_id: &str,
    done: impl Fn(&[AttemptRow]) -> bool,
) -> Vec<AttemptRow> {
    let deadline = Instant::now() + WAIT;
    loop {
        let rows = attempt_rows(app, job_id).await;
        if done(&rows) {
            return rows;
        }
        assert!(
            Instant::now() < deadline,
            "the attempts of job {job_id} never reached the expected state: {rows:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// One audit row about a job: `(action, attempt_id, reason)`.
pub type JobAudit = (String, Option<String>, String);

/// Everything stored about one job: its row, its attempts (oldest first),
/// its race-log rows and its audit rows, each in the order they were
/// written.
#[derive(Debug, PartialEq)]
pub struct StoredJob {
    pub job: Job,
    pub attempts: Vec<Attempt>,
    pub races: Vec<RaceEntry>,
    pub audit: Vec<JobAudit>,
}

impl StoredJob {
    /// The audit rows' actions, oldest first.
    pub fn audit_actions(&self) -> Vec<&str> {
        self.audit
            .iter()
            .map(|(action, _, _)| action.as_str())
            .collect()
    }
}

/// Reads [`StoredJob`] for `job_id`.
pub async fn stored(app: &TestApp, job_id: &str) -> StoredJob {
    let job_id = job_id.to_owned();
    app.with_conn(move |conn| StoredJob {
        job: jobs::table
            .find(&job_id)
            .select(Job::as_select())
            .first(conn)
            .unwrap(),
        attempts: attempts::table
            .filter(attempts::job_id.eq(&job_id))
            .order(attempts::number.asc())
            .select(Attempt::as_select())
            .load(conn)
            .unwrap(),
        races: race_log::table
            .filter(race_log::job_id.eq(&job_id))
            .order((race_log::lost_at.asc(), race_log::id.asc()))
            .select(RaceEntry::as_select())
            .load(conn)
            .unwrap(),
        audit: audit_log::table
            .filter(audit_log::job_id.eq(&job_id))
            .order((audit_log::at.asc(), audit_log::id.asc()))
            .select((audit_log::action, audit_log::attempt_id, audit_log::reason))
            .load(conn)
            .unwrap(),
    })
    .await
}

/// The whole database at one moment, for tests that check what a request
/// changed, or did not: the jobs, each attempt's state and error, how many
/// attempts each job has, and how many race, audit, user, session and
/// token rows there are.
#[derive(Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub jobs: BTreeSet<String>,
    /// `(id, state, error)` of every attempt, by id.
    pub attempts: Vec<(String, String, Option<String>)>,
    /// `(job id, attempts)`, by job id.
    pub attempts_of: Vec<(String, i64)>,
    pub races: i64,
    pub audit: i64,
    pub users: i64,
    pub sessions: i64,
    pub tokens: i64,
}

/// Reads a [`Snapshot`] on `conn`.
pub fn snapshot_in(conn: &mut DbConnection) -> Snapshot {
    Snapshot {
        jobs: jobs::table
            .select(jobs::id)
            .load::<String>(conn)
            .unwrap()
            .into_iter()
            .collect(),
        attempts: attempts::table
            .order(attempts::id)
            .select((attempts::id, attempts::state, attempts::error))
            .load(conn)
            .unwrap(),
        attempts_of: attempts::table
            .group_by(attempts::job_id)
            .select((attempts::job_id, diesel::dsl::count_star()))
            .order(attempts::job_id)
            .load(conn)
            .unwrap(),
        races: race_log::table.count().get_result(conn).unwrap(),
        audit: audit_log::table.count().get_result(conn).unwrap(),
        users: users::table.count().get_result(conn).unwrap(),
        sessions: sessions::table.count().get_result(conn).unwrap(),
        tokens: api_tokens::table.count().get_result(conn).unwrap(),
    }
}

/// Reads a [`Snapshot`] of the app's database.
pub async fn snapshot(app: &TestApp) -> Snapshot {
    app.with_conn(snapshot_in).await
}

/// A job's attempts, oldest first, read by the job's id alone (tests look
/// rows up by id; the application names the owner too).
pub fn attempts_in(conn: &mut DbConnection, job_id: &onejob::domain::JobId) -> Vec<Attempt> {
    attempts::table
        .filter(attempts::job_id.eq(job_id))
        .order(attempts::number.asc())
        .select(Attempt::as_select())
        .load(conn)
        .unwrap()
}

/// [`attempts_in`] the app's database.
pub async fn attempts_of(app: &TestApp, job_id: &str) -> Vec<Attempt> {
    let job_id = onejob::domain::JobId::parse(job_id).unwrap();
    app.with_conn(move |conn| attempts_in(conn, &job_id)).await
}

/// A `summarize` job for the store itself, as the guard tests write them:
/// `owner`'s, under `key`, whose text is the key.
pub fn new_job(owner: &UserId, key: &str) -> NewJob {
    NewJob {
        id: onejob::domain::JobId::new(),
        start: None,
        reservation: Default::default(),
        trace_context: None,
        kept_grant: None,
        owner_id: owner.clone(),
        key: IdempotencyKey::parse(key).unwrap(),
        task: "summarize".into(),
        provider: "sim-fast".into(),
        requested_provider: None,
        input: JsonText::from_value(&json!({"text": key})),
        params: JsonText::from_value(&json!({})),
        fingerprint: "0".repeat(64),
    }
}
