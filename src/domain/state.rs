//! The attempt and job state machine (docs/design.md, "States"), as pure
//! functions.
//!
//! The store uses [`AttemptEvent::from_states`] as the guard of each conditional
//! `UPDATE`, so the transitions allowed here are the transitions the database
//! will perform.

use super::ids::text_enum;

text_enum! {
    stored pub enum AttemptState {
        Queued = "queued",
        Running = "running",
        Succeeded = "succeeded",
        Failed = "failed",
        Unknown = "unknown",
        Abandoned = "abandoned",
    }
}

impl AttemptState {
    /// States that block a new attempt on the same job.
    pub const LIVE: [AttemptState; 3] = [Self::Queued, Self::Running, Self::Unknown];

    pub fn is_live(self) -> bool {
        Self::LIVE.contains(&self)
    }
}

/// Something that happens to an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttemptEvent {
    /// A worker took the queued attempt and is about to send it.
    Claimed,
    /// The job became terminal before this queued attempt was ever sent.
    Skipped,
    /// The provider answered with a usable result (it may still lose the CAS).
    ProviderSucceeded,
    /// The provider surely did not do the work, or answered unusably.
    ProviderFailed,
    /// The soft timeout passed with no answer: the provider may still be working.
    SoftTimeout,
    /// The process that was running the attempt stopped renewing its lease.
    LeaseExpired,
    /// Support staff gave up waiting on an unknown attempt.
    Abandoned,
    /// A claim whose request never left goes back to the queue: its lease
    /// ran out, its process is stopping, or its provider asked for a pause
    /// between the claim and the send. Nothing was sent, so sending it
    /// later sends it once. (The store applies it only to an attempt that
    /// was never sent: judged by `sent_at` when another process decides, by
    /// the claiming worker's own word before it sends.)
    GivenBack,
    /// A claim whose request never left, of a job that finished meanwhile:
    /// closed, never sent.
    ClosedUnsent,
    /// The job finished through another attempt while this one's request
    /// was out, and its call ended (or its process stopped) without an
    /// answer: closed with a note rather than left `unknown` for support.
    /// A late answer still goes through the compare-and-swap, and loses.
    Superseded,
}

impl AttemptEvent {
    /// The states this event may be applied to.
    pub fn from_states(self) -> &'static [AttemptState] {
        use AttemptState::*;
        match self {
            Self::Claimed | Self::Skipped => &[Queued],
            // Late news for an unknown or abandoned attempt is still news.
            Self::ProviderSucceeded | Self::ProviderFailed => &[Running, Unknown, Abandoned],
            Self::SoftTimeout | Self::LeaseExpired => &[Running],
            Self::GivenBack | Self::ClosedUnsent | Self::Superseded => &[Running],
            Self::Abandoned => &[Unknown],
        }
    }

    pub fn target(self) -> AttemptState {
        match self {
            Self::Claimed => AttemptState::Running,
            Self::GivenBack => AttemptState::Queued,
            Self::Skipped | Self::ProviderFailed | Self::ClosedUnsent => AttemptState::Failed,
            Self::ProviderSucceeded => AttemptState::Succeeded,
            Self::SoftTimeout | Self::LeaseExpired => AttemptState::Unknown,
            Self::Abandoned | Self::Superseded => AttemptState::Abandoned,
        }
    }

    /// The state after this event, or why it cannot happen.
    pub fn apply(self, from: AttemptState) -> Result<AttemptState, TransitionError> {
        if self.from_states().contains(&from) {
            Ok(self.target())
        } else {
            Err(TransitionError { from, event: self })
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an attempt in state `{from}` cannot take the event {event:?}")]
pub struct TransitionError {
    pub from: AttemptState,
    pub event: AttemptEvent,
}

text_enum! {
    stored pub enum JobStatus {
        Pending = "pending",
        Running = "running",
        Unknown = "unknown",
        Succeeded = "succeeded",
        Failed = "failed",
        Cancelled = "cancelled",
    }
}

impl JobStatus {
    /// Finished: no attempt will start again. A cancelled job is finished
    /// too, though an attempt sent before the cancel may still be out (its
    /// late answer loses the compare-and-swap).
    pub const TERMINAL: [JobStatus; 3] = [Self::Succeeded, Self::Failed, Self::Cancelled];

    /// The statuses a cancel moves to `cancelled` (docs/design.md,
    /// "Cancelling"): every unfinished one. The store's cancel takes its
    /// `WHERE status IN (…)` from here.
    pub const CANCELLABLE: [JobStatus; 3] = [Self::Pending, Self::Running, Self::Unknown];

    pub fn is_terminal(self) -> bool {
        Self::TERMINAL.contains(&self)
    }

    pub fn is_cancellable(self) -> bool {
        Self::CANCELLABLE.contains(&self)
    }

    /// The status of a non-terminal job, derived from its live attempt (if any):
    /// queued (not yet sent) or none → pending, running → running, unknown → unknown.
    pub fn for_live_attempt(live: Option<AttemptState>) -> Self {
        match live {
            Some(AttemptState::Running) => Self::Running,
            Some(AttemptState::Unknown) => Self::Unknown,
            _ => Self::Pending,
        }
    }
}

/// What a cancel does to a job in a given status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelDecision {
    /// Unfinished: it becomes `cancelled`, its version moves on, and a
    /// queued (unsent) attempt is withdrawn.
    Cancel,
    /// Already cancelled: the same answer again, nothing changes.
    AlreadyCancelled,
    /// It succeeded or failed: a finished job keeps its outcome.
    Refused(JobStatus),
}

/// Whether a job in `status` may be cancelled.
pub fn on_cancel(status: JobStatus) -> CancelDecision {
    if status.is_cancellable() {
        CancelDecision::Cancel
    } else if status == JobStatus::Cancelled {
        CancelDecision::AlreadyCancelled
    } else {
        CancelDecision::Refused(status)
    }
}

/// Why a new attempt may not start now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewAttemptRefusal {
    /// The job already succeeded, failed or was cancelled.
    JobFinished(JobStatus),
    /// An attempt is queued, running or unknown.
    AttemptInFlight(AttemptState),
}

/// Whether a new attempt may start on a job in `status` whose live attempt (if
/// any) is in `live`. The database's partial unique index enforces the same rule.
pub fn may_start_attempt(
    status: JobStatus,
    live: Option<AttemptState>,
) -> Result<(), NewAttemptRefusal> {
    if status.is_terminal() {
        return Err(NewAttemptRefusal::JobFinished(status));
    }
    match live {
        Some(state) => Err(NewAttemptRefusal::AttemptInFlight(state)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use AttemptEvent as E;
    use AttemptState as S;

    #[test]
    fn the_happy_path_is_queued_running_succeeded() {
        let running = E::Claimed.apply(S::Queued).unwrap();
        assert_eq!(running, S::Running);
        assert_eq!(E::ProviderSucceeded.apply(running), Ok(S::Succeeded));
    }

    #[test]
    fn a_timeout_makes_an_attempt_unknown_never_failed() {
        assert_eq!(E::SoftTimeout.apply(S::Running), Ok(S::Unknown));
        assert_eq!(E::LeaseExpired.apply(S::Running), Ok(S::Unknown));
    }

    #[test]
    fn unknown_takes_late_news_or_an_operator_abandon() {
        assert_eq!(E::ProviderSucceeded.apply(S::Unknown), Ok(S::Succeeded));
        assert_eq!(E::ProviderFailed.apply(S::Unknown), Ok(S::Failed));
        assert_eq!(E::Abandoned.apply(S::Unknown), Ok(S::Abandoned));
    }

    #[test]
    fn a_late_result_of_an_abandoned_attempt_is_still_applied() {
        assert_eq!(E::ProviderSucceeded.apply(S::Abandoned), Ok(S::Succeeded));
    }

    #[test]
    fn only_unknown_attempts_can_be_abandoned() {
        for state in [S::Queued, S::Running, S::Succeeded, S::Failed, S::Abandoned] {
            assert!(E::Abandoned.apply(state).is_err(), "{state}");
        }
    }

    #[test]
    fn unknown_never_expires_by_itself() {
        assert!(E::SoftTimeout.apply(S::Unknown).is_err());
        assert!(E::LeaseExpired.apply(S::Unknown).is_err());
    }

    #[test]
    fn an_unsent_claim_goes_back_to_the_queue_or_is_closed() {
        assert_eq!(E::GivenBack.apply(S::Running), Ok(S::Queued));
        assert_eq!(E::ClosedUnsent.apply(S::Running), Ok(S::Failed));
        for state in [S::Queued, S::Unknown, S::Abandoned] {
            assert!(E::GivenBack.apply(state).is_err(), "{state}");
            assert!(E::ClosedUnsent.apply(state).is_err(), "{state}");
        }
    }

    #[test]
    fn a_running_attempt_whose_job_finished_elsewhere_is_closed_not_left_unknown() {
        assert_eq!(E::Superseded.apply(S::Running), Ok(S::Abandoned));
        assert!(
            E::Superseded.apply(S::Unknown).is_err(),
            "support's to resolve"
        );
        assert_eq!(
            E::ProviderSucceeded.apply(E::Superseded.target()),
            Ok(S::Succeeded),
            "a late answer is still applied (and loses the compare-and-swap)"
        );
    }

    #[test]
    fn finished_attempts_take_no_further_events() {
        for event in [
            E::Claimed,
            E::Skipped,
            E::ProviderSucceeded,
            E::ProviderFailed,
            E::SoftTimeout,
            E::LeaseExpired,
            E::Abandoned,
            E::GivenBack,
            E::ClosedUnsent,
            E::Superseded,
        ] {
            assert!(event.apply(S::Succeeded).is_err(), "{event:?}");
            assert!(event.apply(S::Failed).is_err(), "{event:?}");
        }
    }

    #[test]
    fn a_running_attempt_is_never_claimed_again() {
        assert!(E::Claimed.apply(S::Running).is_err());
        assert!(E::Claimed.apply(S::Unknown).is_err());
    }

    #[test]
    fn live_states_are_queued_running_and_unknown() {
        let live: Vec<_> = S::ALL.into_iter().filter(|s| s.is_live()).collect();
        assert_eq!(live, vec![S::Queued, S::Running, S::Unknown]);
    }

    #[test]
    fn states_round_trip_through_text() {
        for s in S::ALL {
            assert_eq!(S::parse(s.as_str()), Some(s));
        }
        for s in JobStatus::ALL {
            assert_eq!(JobStatus::parse(s.as_str()), Some(s));
        }
        assert_eq!(S::parse("done"), None);
    }

    #[test]
    fn job_status_follows_the_live_attempt() {
        assert_eq!(JobStatus::for_live_attempt(None), JobStatus::Pending);
        assert_eq!(
            JobStatus::for_live_attempt(Some(S::Queued)),
            JobStatus::Pending
        );
        assert_eq!(
            JobStatus::for_live_attempt(Some(S::Running)),
            JobStatus::Running
        );
        assert_eq!(
            JobStatus::for_live_attempt(Some(S::Unknown)),
            JobStatus::Unknown
        );
    }

    #[test]
    fn every_unfinished_job_may_be_cancelled_and_no_finished_one() {
        for status in JobStatus::ALL {
            assert_eq!(status.is_cancellable(), !status.is_terminal(), "{status}");
        }
        assert_eq!(on_cancel(JobStatus::Running), CancelDecision::Cancel);
        assert_eq!(
            on_cancel(JobStatus::Cancelled),
            CancelDecision::AlreadyCancelled
        );
        assert_eq!(
            on_cancel(JobStatus::Succeeded),
            CancelDecision::Refused(JobStatus::Succeeded)
        );
        assert_eq!(
            may_start_attempt(JobStatus::Cancelled, None),
            Err(NewAttemptRefusal::JobFinished(JobStatus::Cancelled))
        );
    }

    #[test]
    fn a_new_attempt_is_refused_while_one_is_live_or_the_job_is_finished() {
        assert_eq!(may_start_attempt(JobStatus::Pending, None), Ok(()));
        assert_eq!(
            may_start_attempt(JobStatus::Unknown, Some(S::Unknown)),
            Err(NewAttemptRefusal::AttemptInFlight(S::Unknown))
        );
        assert_eq!(
            may_start_attempt(JobStatus::Succeeded, None),
            Err(NewAttemptRefusal::JobFinished(JobStatus::Succeeded))
        );
    }
}
