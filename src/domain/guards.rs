//! The guards of the statements that decide what may happen to a job and
//! its attempts (docs/design.md, "Invariants and what enforces them"), each
//! expressed once as a predicate over the columns its `WHERE` clause reads.
//!
//! The database enforces these rules: the store's conditional statements
//! carry them in SQL, and only a statement's guard decides. The predicates
//! here say the same rule in Rust, so that the model checker (`tests/model`)
//! applies the product's own rules rather than a second copy, the store's
//! own decisions in Rust (which event a lease that ran out takes, say) call
//! them, and a test (`tests/api/guard_agreement.rs`) shows, for every
//! combination of the column values a guard reads, that the SQL and the
//! predicate agree. A change to one without the other fails that test.

use super::state::{AttemptEvent, AttemptState, JobStatus};
use super::{Fingerprint, Role, Timestamp};

/// The claim (`store::queue::claim_batch`): a queued attempt of an
/// unfinished job, whose provider this process has not closed, and which is
/// due: not a retry still waiting for its `not_before`, by the database's
/// clock `now`.
///
/// SQL: `attempts.state IN (<Claimed's from-states>) AND jobs.status NOT IN
/// ('succeeded','failed') AND attempts.provider NOT IN (<closed>) AND
/// (attempts.not_before IS NULL OR attempts.not_before <= now)`.
pub fn may_claim(
    state: AttemptState,
    job: JobStatus,
    provider_closed: bool,
    not_before: Option<Timestamp>,
    now: Timestamp,
) -> bool {
    AttemptEvent::Claimed.from_states().contains(&state)
        && !job.is_terminal()
        && !provider_closed
        && not_before.is_none_or(|at| at <= now)
}

/// The reaper (`store::queue::expire_leases`): a running attempt whose
/// lease ran out by the database's clock `now`.
///
/// SQL: `attempts.state = 'running' AND attempts.lease_expires_at < now`
/// (a NULL lease never runs out).
pub fn lease_has_run_out(
    state: AttemptState,
    lease_expires_at: Option<Timestamp>,
    now: Timestamp,
) -> bool {
    state == AttemptState::Running && lease_expires_at.is_some_and(|until| until < now)
}

/// What a running attempt whose lease ran out becomes: one that was never
/// sent (`sent_at` NULL) goes back to the queue, or is closed unsent if
/// its job finished meanwhile; one that was sent becomes `unknown` (the
/// provider may have received it: it is never sent again), or is closed
/// as superseded if its job finished through another attempt.
///
/// The requeue and the unsent close carry `sent_at IS NULL` in their
/// statement as well ([`may_give_back`] with `judged_by_row`).
pub fn on_lease_expiry(sent: bool, job_finished: bool) -> AttemptEvent {
    match (sent, job_finished) {
        (false, false) => AttemptEvent::GivenBack,
        (false, true) => AttemptEvent::ClosedUnsent,
        (true, false) => AttemptEvent::LeaseExpired,
        (true, true) => AttemptEvent::Superseded,
    }
}

/// What a call that reached its soft timeout does to its attempt: closed as
/// superseded when the attempt is still running and its job finished
/// through another attempt, else `unknown` (guarded by the event's
/// from-states: an attempt that already has news is left alone).
pub fn on_soft_timeout(state: AttemptState, job_finished: bool) -> AttemptEvent {
    if job_finished && state == AttemptState::Running {
        AttemptEvent::Superseded
    } else {
        AttemptEvent::SoftTimeout
    }
}

/// Giving a claim back (`store::queue::give_back_*`): the attempt is
/// running under `worker`'s lease and, when the row must show it was never
/// sent (`judged_by_row`: the reaper, or a worker that cannot vouch for
/// itself), has no `sent_at`. A worker that gives back a claim before its
/// request left vouches for itself (`judged_by_row` false), and the
/// statement clears `sent_at`.
///
/// SQL: `state = 'running' AND lease_owner = worker [AND sent_at IS NULL]`.
pub fn may_give_back(
    state: AttemptState,
    lease_owner: Option<&str>,
    worker: Option<&str>,
    sent: bool,
    judged_by_row: bool,
) -> bool {
    AttemptEvent::GivenBack.from_states().contains(&state)
        && worker.is_none_or(|worker| lease_owner == Some(worker))
        && !(judged_by_row && sent)
}

/// Renewing a lease (`store::queue::renew_lease`): only a running attempt
/// under this worker's lease.
///
/// SQL: `state = 'running' AND lease_owner = worker`.
pub fn may_renew(state: AttemptState, lease_owner: Option<&str>, worker: &str) -> bool {
    state == AttemptState::Running && lease_owner == Some(worker)
}

/// The compare-and-swap (`store::completion`): an answer becomes the job's
/// result only if the job is still at the version the attempt read when it
/// was claimed, and nothing completed it. (`version` alone implies the
/// second condition: every completion bumps it. The second is kept as a
/// belt to the braces; see docs/design.md.)
///
/// SQL: `jobs.version = version_read AND jobs.completed_by IS NULL`.
pub fn cas_wins(job_version: i64, completed: bool, version_read: i64) -> bool {
    job_version == version_read && !completed
}

/// Failing a job (`store::transitions::fail_job`): at the version the
/// decision read, not completed, not finished.
///
/// SQL: `version = read AND completed_by IS NULL AND status NOT IN
/// ('succeeded','failed')`.
pub fn may_fail_job(
    status: JobStatus,
    job_version: i64,
    completed: bool,
    version_read: i64,
) -> bool {
    cas_wins(job_version, completed, version_read) && !status.is_terminal()
}

/// The one-live-attempt rule (`attempts_one_live_per_job`, a partial unique
/// index): an attempt in one of these states counts against its job's one
/// live attempt.
///
/// SQL: `… WHERE state IN ('queued','running','unknown')` (on SQLite the
/// same states as `state = 'queued' OR …`, which it checks without building
/// a table of the list for each statement).
pub fn holds_the_live_slot(state: AttemptState) -> bool {
    state.is_live()
}

/// Whether a job may go (`store::retention::prune_finished_jobs`): finished,
/// last changed before the cutoff (its retention window has ended), with
/// no live attempt (a late answer awaited) and nothing in the race or
/// audit log about it.
///
/// SQL: `status IN ('succeeded','failed','cancelled') AND updated_at < cutoff AND NOT
/// EXISTS (<live attempt>) AND NOT EXISTS (<race or audit entry>)`.
pub fn may_prune(status: JobStatus, window_ended: bool, has_live: bool, logged: bool) -> bool {
    status.is_terminal() && window_ended && !has_live && !logged
}

/// Whether a request under a key that already made a job is a replay of
/// it (`app::intake`): the stored fingerprint decides. Otherwise the
/// request is refused (`409 idempotency-key-reused`).
pub fn is_replay(stored: &str, sent: &Fingerprint) -> bool {
    stored == sent.as_str()
}

/// Whether a creation may be stored on a token check this process kept
/// (`app::credentials`): only while the credential counter its creating
/// transaction reads (`now`) is the one the check was read at (`kept`).
/// Every revocation, expiry change and disabled, enabled or changed user
/// moves the counter, by trigger, in the transaction that makes it.
pub fn kept_check_holds(kept: i64, now: Option<i64>) -> bool {
    now == Some(kept)
}

/// A token as the statement storing a creation finds it, by the digest of
/// a grant kept without a counter (PostgreSQL, `app::credentials`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenFound {
    /// Its user is the job's owner.
    pub of_owner: bool,
    pub expires_at: Option<Timestamp>,
    pub user_disabled: bool,
    pub role: Role,
}

/// Whether a creation may be stored on a grant kept in `kept_role`: the
/// token is still there (`None`: revoked), unexpired at `now`, and grants
/// the job's owner, who is not disabled and still has that role.
///
/// SQL: `EXISTS (SELECT 1 FROM api_tokens JOIN users … WHERE token_sha256 =
/// <digest> AND users.id = <owner> AND users.role = <kept role> AND
/// disabled_at IS NULL AND (expires_at IS NULL OR expires_at > now))`.
pub fn kept_grant_holds(token: Option<TokenFound>, kept_role: Role, now: Timestamp) -> bool {
    token.is_some_and(|token| {
        token.of_owner
            && token.role == kept_role
            && !token.user_disabled
            && token.expires_at.is_none_or(|at| at > now)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use AttemptState as S;

    const T4: Timestamp = Timestamp::from_millis(4);
    const T5: Timestamp = Timestamp::from_millis(5);
    const T6: Timestamp = Timestamp::from_millis(6);

    #[test]
    fn only_a_due_queued_attempt_of_an_unfinished_job_is_claimed() {
        assert!(may_claim(S::Queued, JobStatus::Pending, false, None, T5));
        assert!(may_claim(
            S::Queued,
            JobStatus::Pending,
            false,
            Some(T5),
            T5
        ));
        assert!(!may_claim(
            S::Queued,
            JobStatus::Pending,
            false,
            Some(T6),
            T5
        ));
        assert!(!may_claim(S::Queued, JobStatus::Pending, true, None, T5));
        assert!(!may_claim(S::Queued, JobStatus::Succeeded, false, None, T5));
        for state in [
            S::Running,
            S::Unknown,
            S::Succeeded,
            S::Failed,
            S::Abandoned,
        ] {
            assert!(!may_claim(state, JobStatus::Pending, false, None, T5));
        }
    }

    #[test]
    fn a_sent_attempt_whose_lease_ran_out_is_never_requeued() {
        assert_eq!(on_lease_expiry(false, false), AttemptEvent::GivenBack);
        assert_eq!(on_lease_expiry(true, false), AttemptEvent::LeaseExpired);
        assert_eq!(on_lease_expiry(true, true), AttemptEvent::Superseded);
        assert_eq!(on_lease_expiry(false, true), AttemptEvent::ClosedUnsent);
        assert!(!may_give_back(S::Running, Some("w"), None, true, true));
        assert!(may_give_back(S::Running, Some("w"), None, false, true));
        assert!(may_give_back(S::Running, Some("w"), Some("w"), true, false));
        assert!(!may_give_back(
            S::Running,
            Some("w"),
            Some("v"),
            false,
            false
        ));
        assert!(!may_give_back(
            S::Unknown,
            Some("w"),
            Some("w"),
            false,
            false
        ));
    }

    #[test]
    fn leases_run_out_strictly_after_their_end_and_only_while_running() {
        assert!(lease_has_run_out(S::Running, Some(T4), T5));
        assert!(!lease_has_run_out(S::Running, Some(T5), T5));
        assert!(!lease_has_run_out(S::Running, None, T5));
        assert!(!lease_has_run_out(S::Unknown, Some(T4), T5));
        assert!(may_renew(S::Running, Some("w"), "w"));
        assert!(!may_renew(S::Running, Some("v"), "w"));
        assert!(!may_renew(S::Unknown, Some("w"), "w"));
    }

    #[test]
    fn the_cas_needs_the_version_read_and_no_completion() {
        assert!(cas_wins(3, false, 3));
        assert!(!cas_wins(4, false, 3));
        assert!(!cas_wins(3, true, 3));
        assert!(may_fail_job(JobStatus::Unknown, 3, false, 3));
        assert!(!may_fail_job(JobStatus::Failed, 3, false, 3));
    }

    #[test]
    fn unknown_holds_the_live_slot_and_retention_waits_for_it() {
        assert!(holds_the_live_slot(S::Unknown));
        assert!(!holds_the_live_slot(S::Abandoned));
        assert!(may_prune(JobStatus::Succeeded, true, false, false));
        assert!(!may_prune(JobStatus::Succeeded, true, true, false));
        assert!(!may_prune(JobStatus::Succeeded, false, false, false));
        assert!(!may_prune(JobStatus::Succeeded, true, false, true));
        assert!(!may_prune(JobStatus::Unknown, true, false, false));
    }

    #[test]
    fn a_soft_timeout_of_a_superseded_attempt_closes_it() {
        assert_eq!(on_soft_timeout(S::Running, true), AttemptEvent::Superseded);
        assert_eq!(
            on_soft_timeout(S::Running, false),
            AttemptEvent::SoftTimeout
        );
        assert_eq!(on_soft_timeout(S::Unknown, true), AttemptEvent::SoftTimeout);
    }
}
