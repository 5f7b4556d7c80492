//! The rows the scenarios judge by, read straight from the database.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use onejob::app::RaceEntry;
use onejob::domain::{AttemptId, AttemptState};
use onejob::store::schema::{attempts, jobs, race_log};
use onejob::store::{Attempt, DbConnection, Job, Store, StoreResult};

use super::STEP;

/// Every job, attempt and race-log row.
#[derive(Clone)]
pub struct Rows {
    pub jobs: Vec<Job>,
    pub attempts: Vec<Attempt>,
    pub races: Vec<RaceEntry>,
}

/// A finished job's result and winner.
pub type Outcome = (Option<String>, Option<String>);

impl Rows {
    pub async fn read(store: &Store) -> Self {
        store
            .run(|conn| {
                Ok(Rows {
                    jobs: jobs::table
                        .select(Job::as_select())
                        .order(jobs::created_at)
                        .load(conn)?,
                    attempts: attempts::table
                        .select(Attempt::as_select())
                        .order(attempts::created_at)
                        .load(conn)?,
                    races: race_log::table.select(RaceEntry::as_select()).load(conn)?,
                })
            })
            .await
            .unwrap()
    }

    pub fn attempt(&self, id: &str) -> &Attempt {
        self.attempts
            .iter()
            .find(|a| a.id.as_str() == id)
            .unwrap_or_else(|| panic!("no attempt {id}"))
    }

    pub fn job(&self, id: &str) -> &Job {
        self.jobs
            .iter()
            .find(|j| j.id.as_str() == id)
            .unwrap_or_else(|| panic!("no job {id}"))
    }

    pub fn state(&self, id: &str) -> AttemptState {
        self.attempt(id).state
    }

    /// The finished jobs' results and winners, by job.
    pub fn outcomes(&self) -> HashMap<String, Outcome> {
        self.jobs
            .iter()
            .filter(|j| j.status.is_terminal())
            .map(|j| {
                let result = j.result.as_ref().map(|r| r.as_str().to_owned());
                let winner = j.completed_by.as_ref().map(|a| a.to_string());
                (j.id.to_string(), (result, winner))
            })
            .collect()
    }
}

/// Reads the rows until `done` holds (panics, with the attempts, after
/// [`STEP`]).
pub async fn wait_rows(store: &Store, what: &str, done: impl Fn(&Rows) -> bool) -> Rows {
    let deadline = Instant::now() + STEP;
    loop {
        let rows = Rows::read(store).await;
        if done(&rows) {
            return rows;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {STEP:?}: {:#?}",
            rows.attempts
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The process id in an attempt's lease owner (`pid<N>-<uuid>`).
pub fn pid_of(attempt: &Attempt) -> u32 {
    attempt
        .lease_owner
        .as_deref()
        .and_then(|owner| owner.strip_prefix("pid"))
        .and_then(|rest| rest.split('-').next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("attempt {} names no process", attempt.id))
}

/// The running attempts whose lease ran out by the database's clock, in
/// the order `store::queue::expire_leases` meets them (its statement).
pub fn expired_leases(conn: &mut DbConnection) -> StoreResult<Vec<AttemptId>> {
    let now = diesel::dsl::sql::<diesel::sql_types::Nullable<diesel::sql_types::BigInt>>(
        onejob::store::connection::PG_NOW_MS,
    );
    Ok(attempts::table
        .filter(attempts::state.eq(AttemptState::Running))
        .filter(attempts::lease_expires_at.lt(now))
        .select(attempts::id)
        .limit(100)
        .load(conn)?)
}
