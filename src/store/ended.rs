//! What a job's end brings with it, written in the transaction that ends
//! the job: its webhook events (docs/design.md, "Webhook outbox") and its
//! budget reservation given back. Every statement that ends a job (an
//! answer that wins, a definite failure, a cancel) ends it through
//! [`job_ended`], so none of them can forget either.

use super::rows::JobKey;
use super::{budgets, webhooks, DbConnection, StoreResult};
use crate::domain::ledger::Reservation;
use crate::domain::webhook::EventKind;
use crate::domain::Timestamp;

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum JobEnd {
    /// Its answer won. `spent` is the winning call's cost, added to the
    /// owner's month under the same lock that gives the reservation back;
    /// `subscribed` is `Some(false)` when the compare-and-swap already
    /// found no endpoint for the event (nothing to look up).
    Succeeded {
        spent: Reservation,
        subscribed: Option<bool>,
    },
    Failed,
    Cancelled,
}

impl JobEnd {
    fn event(self) -> EventKind {
        match self {
            JobEnd::Succeeded { .. } => EventKind::JobSucceeded,
            JobEnd::Failed => EventKind::JobFailed,
            JobEnd::Cancelled => EventKind::JobCancelled,
        }
    }
}

/// Records the end of the job `key` inside the caller's transaction, right
/// after the guarded update that ended it: its webhook events, then its
/// budget reservation back (with a winner's cost added).
pub fn job_ended(
    conn: &mut DbConnection,
    key: &JobKey,
    end: JobEnd,
    now: Timestamp,
) -> StoreResult<()> {
    let (spent, subscribed) = match end {
        JobEnd::Succeeded { spent, subscribed } => (spent, subscribed),
        JobEnd::Failed | JobEnd::Cancelled => (Reservation::default(), None),
    };
    if subscribed != Some(false) {
        webhooks::record_event(conn, key, end.event(), now)?;
    }
    budgets::settle(conn, key, true, spent, now)
}
