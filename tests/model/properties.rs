//! The properties checked in every reachable state (docs/design.md,
//! "Invariants and what enforces them"), and examples the checker must
//! reach (so that no property holds only because nothing happens).

use onejob::domain::webhook::{EventKind, EventState};
use onejob::domain::{AttemptEvent, AttemptState, JobStatus, RaceResult};
use stateright::Property;

use crate::protocol::{Answer, Basis, Origin, Protocol, State};

pub const SENT_ONCE: &str = "an attempt id is sent at most once";
pub const ONE_LIVE: &str =
    "a job never has two sent attempts while neither reached an outcome that makes that safe";
pub const ONE_WINNER: &str = "at most one winner, and the job's result is the winner's";
pub const ACKED_EXISTS: &str =
    "every acknowledged creation names a job that exists until its retention window ends";
pub const ONE_JOB_PER_KEY: &str =
    "a key names one job at a time, and the same key with another payload is refused";
pub const FAILOVER_DEFINITE: &str =
    "no attempt is failed over from an outcome that was not definite";
pub const NO_SPLICE: &str =
    "no attempt is failed over to after a chunk of an earlier answer reached the clients";
pub const UNKNOWN_ENDS: &str = "an unknown attempt ends only by an answer or an operator";
pub const CANCEL_IS_FINAL: &str = "a cancelled job stays cancelled, with no result and no winner";
pub const EVENT_NEVER_LOST: &str =
    "every committed state change that has an event has its outbox row";
pub const NO_PHANTOM_EVENT: &str =
    "every outbox row is of a state change that committed, once per occurrence";
pub const DELIVERED_ONCE_WHILE_HEALTHY: &str =
    "a receiver gets an event twice only after a delivery's lease ran out";
pub const BUDGET_HELD: &str = "an owner's reservations never pass its budget's limit";
pub const RESERVATIONS_BALANCE: &str =
    "a job holds its reservation exactly while it is unfinished, and the budget row holds their sum";
pub const EVERY_JOB_ENDS: &str =
    "with no kill and a provider that answers, every job ends succeeded or failed";

/// The invariants, in the order of the issue; then liveness; then examples.
pub fn all() -> Vec<Property<Protocol>> {
    vec![
        Property::always(SENT_ONCE, |_: &Protocol, s: &State| {
            s.attempts.iter().all(|a| a.received <= 1)
        }),
        Property::always(ONE_LIVE, |_: &Protocol, s: &State| {
            (0..s.jobs.len()).all(|job| {
                s.attempts
                    .iter()
                    .filter(|a| a.job as usize == job && !a.deleted)
                    .filter(|a| (a.sent || a.received > 0) && a.state.is_live())
                    .count()
                    <= 1
            })
        }),
        Property::always(ONE_WINNER, |_: &Protocol, s: &State| {
            s.jobs.iter().enumerate().all(|(j, job)| {
                let winners: Vec<usize> = s
                    .attempts
                    .iter()
                    .enumerate()
                    .filter(|(_, a)| a.job as usize == j && a.outcome == Some(RaceResult::Won))
                    .map(|(i, _)| i)
                    .collect();
                let consistent = match winners.as_slice() {
                    [] => job.completed_by.is_none() && job.status != JobStatus::Succeeded,
                    [w] => {
                        job.completed_by == Some(*w as u8)
                            && job.result == Some(*w as u8)
                            && job.status == JobStatus::Succeeded
                    }
                    _ => false,
                };
                job.pruned || consistent
            })
        }),
        Property::always(ACKED_EXISTS, |_: &Protocol, s: &State| {
            s.replies.iter().filter(|r| !r.refused).all(|r| {
                let job = &s.jobs[r.job as usize];
                !job.pruned || job.window_ended
            })
        }),
        Property::always(ONE_JOB_PER_KEY, |m: &Protocol, s: &State| {
            let one_job = (0..m.bounds.keys as u8)
                .all(|key| s.jobs.iter().filter(|j| j.key == key && !j.pruned).count() <= 1);
            let answered_right = s.replies.iter().all(|r| {
                let job = &s.jobs[r.job as usize];
                let same = m.fingerprint(job.key, job.variant) == m.fingerprint(r.key, r.variant);
                job.key == r.key && same != r.refused
            });
            one_job && answered_right
        }),
        Property::always(FAILOVER_DEFINITE, |_: &Protocol, s: &State| {
            s.attempts.iter().enumerate().all(|(i, a)| {
                if !matches!(a.origin, Origin::FailOver(_)) {
                    return true;
                }
                let before = s.attempts[..i].iter().rev().find(|p| p.job == a.job);
                before.is_some_and(|p| {
                    matches!(p.state, AttemptState::Failed)
                        && matches!(p.answer, Some(Answer::Failure | Answer::RateLimited))
                })
            })
        }),
        Property::always(NO_SPLICE, |_: &Protocol, s: &State| {
            s.attempts.iter().all(|a| !a.after_release)
        }),
        Property::always(UNKNOWN_ENDS, |_: &Protocol, s: &State| {
            s.attempts.iter().all(|a| {
                !a.was_unknown
                    || a.state == AttemptState::Unknown
                    || matches!(
                        a.left_unknown_by,
                        Some(
                            AttemptEvent::ProviderSucceeded
                                | AttemptEvent::ProviderFailed
                                | AttemptEvent::Abandoned
                        )
                    )
            })
        }),
        Property::always(CANCEL_IS_FINAL, |_: &Protocol, s: &State| {
            s.jobs.iter().all(|j| {
                !j.was_cancelled
                    || (j.status == JobStatus::Cancelled
                        && j.result.is_none()
                        && j.completed_by.is_none())
            })
        }),
        Property::always(EVENT_NEVER_LOST, |m: &Protocol, s: &State| {
            // A row, or (only under the broken variant) one its process
            // will still write: what a kill then loses is lost for good.
            let has = |job: u8, kind: EventKind, subject: Option<u8>| {
                s.outbox
                    .iter()
                    .any(|e| e.job == job && e.kind == kind && e.subject == subject)
                    || s.unrecorded.contains(&(job, kind, subject))
            };
            let jobs = s.jobs.iter().enumerate().all(|(j, job)| {
                let kind = match job.status {
                    JobStatus::Succeeded => Some(EventKind::JobSucceeded),
                    JobStatus::Failed => Some(EventKind::JobFailed),
                    JobStatus::Cancelled => Some(EventKind::JobCancelled),
                    _ => None,
                };
                job.pruned || kind.is_none_or(|kind| has(j as u8, kind, None))
            });
            let unknowns = s.attempts.iter().enumerate().all(|(i, a)| {
                a.deleted || !a.was_unknown || has(a.job, EventKind::JobUnknown, Some(i as u8))
            });
            !m.bounds.outbox || (jobs && unknowns)
        }),
        Property::always(NO_PHANTOM_EVENT, |_: &Protocol, s: &State| {
            s.outbox.iter().enumerate().all(|(i, e)| {
                let job = &s.jobs[e.job as usize];
                let happened = match e.kind {
                    EventKind::JobSucceeded => job.status == JobStatus::Succeeded,
                    EventKind::JobFailed => job.status == JobStatus::Failed,
                    EventKind::JobCancelled => job.was_cancelled,
                    EventKind::JobUnknown => e
                        .subject
                        .is_some_and(|a| s.attempts[a as usize].was_unknown),
                };
                let once = s.outbox[..i]
                    .iter()
                    .all(|f| (f.job, f.kind, f.subject) != (e.job, e.kind, e.subject));
                e.deleted || (happened && once)
            })
        }),
        Property::always(DELIVERED_ONCE_WHILE_HEALTHY, |_: &Protocol, s: &State| {
            s.outbox.iter().all(|e| e.received <= 1 || e.lapsed)
        }),
        Property::always(BUDGET_HELD, |m: &Protocol, s: &State| {
            m.bounds
                .budget
                .is_none_or(|limit| s.budget.reserved_tokens <= limit)
        }),
        Property::always(RESERVATIONS_BALANCE, |m: &Protocol, s: &State| {
            let held = s.jobs.iter().filter(|j| j.holds).count() as i64;
            m.bounds.budget.is_none()
                || (s.budget.reserved_tokens == held
                    && s.jobs
                        .iter()
                        .all(|j| j.holds != (j.pruned || j.status.is_terminal())))
        }),
        Property::always(EVERY_JOB_ENDS, |m: &Protocol, s: &State| {
            !m.bounds.fair || all_settled(s) || waits_past_the_bound(m, s) || !m.stuck(s)
        }),
        Property::sometimes("a late answer loses the race", |_: &Protocol, s: &State| {
            s.attempts
                .iter()
                .any(|a| a.outcome == Some(RaceResult::Lost))
        }),
        Property::sometimes(
            "a refused (429) attempt is retried as a new attempt",
            |_: &Protocol, s: &State| {
                s.attempts
                    .iter()
                    .any(|a| a.origin == Origin::FailOver(Basis::NothingHappened))
            },
        ),
        Property::sometimes(
            "a definite failure fails over to the qualified fallback",
            |_: &Protocol, s: &State| {
                s.attempts
                    .iter()
                    .any(|a| a.origin == Origin::FailOver(Basis::Definite) && a.provider == 1)
            },
        ),
        Property::sometimes(
            "a killed process's sent attempt becomes unknown",
            |_: &Protocol, s: &State| {
                s.attempts.iter().any(|a| {
                    a.was_unknown && a.received == 1 && a.left_unknown_by.is_none() && a.sent
                }) && s.generations.iter().any(|g| *g > 0)
            },
        ),
        Property::sometimes(
            "a stream that fails after a released chunk fails its job",
            |_: &Protocol, s: &State| {
                s.attempts.iter().any(|a| {
                    a.released
                        && a.state == AttemptState::Failed
                        && s.jobs[a.job as usize].status == JobStatus::Failed
                })
            },
        ),
        Property::sometimes(
            "a cancelled job's late answer loses the race",
            |_: &Protocol, s: &State| {
                s.attempts.iter().any(|a| {
                    a.outcome == Some(RaceResult::Lost) && s.jobs[a.job as usize].was_cancelled
                })
            },
        ),
        Property::sometimes(
            "an event whose delivery lease ran out is delivered again",
            |_: &Protocol, s: &State| {
                s.outbox
                    .iter()
                    .any(|e| e.received == 2 && e.lapsed && e.state == EventState::Delivered)
            },
        ),
        Property::sometimes(
            "a creation past the budget is refused, and a later one fits again",
            |_: &Protocol, s: &State| {
                s.budget_refusals > 0 && s.jobs.iter().filter(|j| !j.pruned).count() > 1
            },
        ),
        Property::sometimes(
            "a key freed by retention makes a new job",
            |_: &Protocol, s: &State| {
                s.jobs
                    .iter()
                    .any(|j| j.pruned && s.jobs.iter().any(|k| k.key == j.key && !k.pruned))
            },
        ),
    ]
}

/// Every job finished, and no attempt left unknown.
fn all_settled(s: &State) -> bool {
    s.jobs.iter().all(|j| j.pruned || j.status.is_terminal())
        && s.attempts
            .iter()
            .all(|a| a.deleted || a.state != AttemptState::Unknown)
}

/// The clock reached its bound while a retry still waits for its turn:
/// the bound, not the protocol, stops the run.
fn waits_past_the_bound(m: &Protocol, s: &State) -> bool {
    s.clock == m.bounds.max_clock
        && s.attempts
            .iter()
            .any(|a| a.state == AttemptState::Queued && a.not_before.is_some_and(|at| at > s.clock))
}
