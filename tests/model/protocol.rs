//! The model: onejob's processes, its database, the providers, the clients
//! and an operator, as one nondeterministic state machine that Stateright
//! explores exhaustively (within its bounds).
//!
//! **No second copy of the rules.** Every decision is the product's own
//! function: attempt transitions are `domain::AttemptEvent::apply`; the
//! guards of the conditional statements are `domain::guards` (which a test
//! of the SQL holds to the statements, `tests/api/guard_agreement.rs`);
//! failover goes through `domain::failover_order`, the gate
//! (`AllowedProviders::gate`) and `domain::retry::next_step`, after
//! `domain::stream::failure_after` for a streamed attempt; a replay is
//! told from a conflict by `domain::guards::is_replay` over the product's
//! `Fingerprint::of`. What the model writes itself is the order of the
//! steps inside each store procedure (which statement follows which), as
//! `store::{queue, completion, transitions, operator, retention}` run them.
//!
//! A [`Bug`] removes one guard, to show the checker catches it.

use onejob::domain::guards;
use onejob::domain::ledger::{may_reserve, BudgetCounters, BudgetLimits, Reservation};
use onejob::domain::retry::{next_step, Failure, Made, NextStep};
use onejob::domain::stream::failure_after;
use onejob::domain::webhook::{may_claim_event, records_event, EventKind, EventState};
use onejob::domain::{
    failover_order, next_provider, on_cancel, AllowedProviders, AttemptEvent, AttemptState,
    CancelDecision, Fingerprint, JobIntent, JobStatus, QualificationStatus, RaceResult,
    RetryPolicy,
};
use stateright::{Model, Property};

/// The one endpoint's subscription, as stored: every kind.
fn subscribed_to_all() -> String {
    onejob::domain::webhook::events_column(&EventKind::ALL)
}

/// The task's chain: its primary, a fallback that passed qualification,
/// and one that did not (the gate keeps it out).
pub const PROVIDERS: [&str; 3] = ["primary", "fallback", "unqualified"];

/// One guard removed, or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bug {
    None,
    /// The reaper requeues a claim whose lease ran out without asking
    /// whether it was sent (`sent_at IS NULL` dropped).
    RequeueSentAttempts,
    /// The one-live-attempt index leaves `unknown` out.
    UnknownNotLive,
    /// The compare-and-swap without its guard (`version = read AND
    /// completed_by IS NULL`).
    CasWithoutGuard,
    /// Retention without the window (`updated_at < cutoff`).
    PruneBeforeWindow,
    /// A request under a used key is a replay whatever its payload.
    NoFingerprintCheck,
    /// No `UNIQUE (owner_id, idempotency_key)`.
    NoUniqueKey,
    /// A soft timeout taken for a definite failure, and failed over.
    FailoverOnTimeout,
    /// A definite failure after a released chunk failed over as if
    /// nothing had been released (`domain::stream::failure_after` dropped).
    FailoverAfterChunk,
    /// A cancel that leaves the job's `version` as it was: a late answer's
    /// compare-and-swap still matches.
    CancelWithoutVersion,
    /// The outbox row written by the process after the state change
    /// commits, instead of in its transaction.
    EventAfterCommit,
    /// The delivery loop claims an event whatever lease is on it
    /// (`domain::webhook::may_claim_event` without its lease condition).
    ClaimIgnoresLease,
    /// A creation reserves without asking `domain::ledger::may_reserve`.
    NoBudgetCheck,
    /// The winning answer leaves its job's reservation held.
    KeepReservation,
}

/// How far the checker looks.
#[derive(Clone, Debug)]
pub struct Bounds {
    pub processes: usize,
    /// Idempotency keys (one job each, until retention frees the key).
    pub keys: usize,
    /// Sends of each key's intent by its client (retries, duplicates;
    /// every other one spelled differently: another key order and spacing).
    pub sends_per_key: u8,
    /// Key 0 is also sent once with another intent.
    pub other_payload: bool,
    /// `kill -9`s (the process restarts at once, its memory gone).
    pub kills: u8,
    /// Operator actions (abandon, new attempt, mark failed).
    pub operator_steps: u8,
    /// Retention windows end and finished jobs are pruned.
    pub retention: bool,
    /// Pauses between a claim and its send (the claim is given back).
    pub give_backs: bool,
    /// The database's clock runs from 0 to this (one tick: a lease).
    pub max_clock: u8,
    /// A lease lasts this many ticks.
    pub lease: u8,
    /// The task's `max_attempts`.
    pub max_attempts: u32,
    /// Fair runs only (no kill, no lost reply): for liveness.
    pub fair: bool,
    /// Attempts stream: a sent attempt may release chunks of its answer to
    /// the job's followers before the answer ends.
    pub streams: bool,
    /// Cancels by the client (`POST /v1/responses/{id}/cancel`).
    pub cancels: u8,
    /// The webhook outbox: one endpoint subscribed to every event kind,
    /// and each process's delivery loop.
    pub outbox: bool,
    /// The owner's monthly token limit, if it has a budget: each job
    /// reserves one token at creation, each answer recorded spends one.
    pub budget: Option<i64>,
}

/// The model of the protocol under `bounds`, with `bug`.
pub struct Protocol {
    pub bounds: Bounds,
    pub bug: Bug,
    /// `fingerprints[key][variant]`: variant 0 and 1 are one intent spelled
    /// two ways, variant 2 another intent.
    fingerprints: Vec<[Fingerprint; 3]>,
    gate: AllowedProviders,
    policy: RetryPolicy,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Answer {
    Success,
    /// A definite failure (400, invalid output).
    Failure,
    /// `429`: nothing happened.
    RateLimited,
}

/// Why an attempt was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Origin {
    Creation,
    /// After its predecessor's failure, on what that failure was taken for.
    FailOver(Basis),
    Operator,
}

/// What a failover was decided on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Basis {
    Definite,
    NothingHappened,
    /// Only under [`Bug::FailoverOnTimeout`].
    Timeout,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Via {
    /// The reply to the open call, read by the process that sent it.
    Call,
    /// A signed callback, applied by any process.
    Callback,
}

/// A `jobs` row, and what the invariants need to know of its past.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct JobRow {
    pub key: u8,
    pub variant: u8,
    pub status: JobStatus,
    pub version: u8,
    pub completed_by: Option<u8>,
    /// Whose answer `result` holds.
    pub result: Option<u8>,
    /// A race-log or audit-log entry names it (retention keeps it).
    pub logged: bool,
    /// Its retention window has ended (`updated_at < cutoff`).
    pub window_ended: bool,
    pub pruned: bool,
    /// A cancel moved it to `cancelled` once.
    pub was_cancelled: bool,
    /// A `budget_reservations` row: what it holds of its owner's budget.
    pub holds: bool,
}

/// An `attempts` row, and what the invariants need to know of its past.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AttemptRow {
    pub job: u8,
    pub provider: u8,
    pub state: AttemptState,
    pub outcome: Option<RaceResult>,
    /// `sent_at` is recorded.
    pub sent: bool,
    /// `lease_owner`: a process and its generation.
    pub lease_owner: Option<(u8, u8)>,
    pub lease_until: Option<u8>,
    pub version_read: Option<u8>,
    pub not_before: Option<u8>,
    pub created: u8,
    // Not in the schema: the history the invariants read.
    /// How many times its provider received it.
    pub received: u8,
    pub answer: Option<Answer>,
    pub delivered: (bool, bool),
    /// Its answer was applied (or logged): a repeat writes nothing.
    pub applied: bool,
    pub was_unknown: bool,
    pub left_unknown_by: Option<AttemptEvent>,
    pub origin: Origin,
    pub deleted: bool,
    /// A chunk of its streamed answer was released to the job's followers.
    pub released: bool,
    /// Made by a failover after an earlier attempt of its job had released
    /// a chunk.
    pub after_release: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Claimed and confirmed (`sent_at` recorded); the request leaves next.
    Confirmed,
    Sent,
    /// Past its soft timeout, kept open for a late answer.
    TimedOut,
}

/// A call a process holds in memory (lost when it is killed).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Call {
    pub attempt: u8,
    pub process: u8,
    pub phase: Phase,
}

/// A `webhook_events` row (the outbox) for the one endpoint, and what the
/// invariants need to know of its past.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EventRow {
    pub job: u8,
    pub kind: EventKind,
    /// The attempt a `job.unknown` is about.
    pub subject: Option<u8>,
    pub state: EventState,
    pub lease_owner: Option<(u8, u8)>,
    pub lease_until: Option<u8>,
    pub deleted: bool,
    // Not in the schema: the history the invariants read.
    /// How many times the receiver got it.
    pub received: u8,
    /// A claim was taken over from a lease that had run out.
    pub lapsed: bool,
}

/// A delivery a process holds in memory (lost when it is killed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Delivery {
    pub event: u8,
    pub process: u8,
    /// The request has reached the receiver.
    pub sent: bool,
}

/// An answer a client got: `key` sent as `variant`, answered with `job`
/// (`201` or a replay), or refused (`409`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reply {
    pub key: u8,
    pub variant: u8,
    pub job: u8,
    pub refused: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The database's clock.
    pub clock: u8,
    pub jobs: Vec<JobRow>,
    pub attempts: Vec<AttemptRow>,
    /// Each process's generation: a restart is a new lease owner.
    pub generations: Vec<u8>,
    /// Sorted: the order of calls in memory means nothing.
    pub calls: Vec<Call>,
    pub sends_left: Vec<u8>,
    pub other_left: bool,
    pub kills_left: u8,
    pub operator_left: u8,
    /// Sorted and without repeats.
    pub replies: Vec<Reply>,
    pub cancels_left: u8,
    pub outbox: Vec<EventRow>,
    /// Sorted: the delivery loops' requests in memory.
    pub deliveries: Vec<Delivery>,
    /// Under [`Bug::EventAfterCommit`]: state changes committed whose
    /// event process 0 has yet to write.
    pub unrecorded: Vec<(u8, EventKind, Option<u8>)>,
    /// The owner's `budgets` row (the month never changes here).
    pub budget: BudgetCounters,
    /// Creations the budget refused (answered `429`, nothing stored).
    pub budget_refusals: u8,
}

/// What one job reserves of its owner's budget here.
pub const RESERVATION: Reservation = Reservation {
    micros: 0,
    tokens: 1,
};

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A client sends `key`'s intent (spelled as `variant`) to `process`,
    /// which creates the job (starting its first attempt at once, `start`)
    /// or answers from the key's job.
    Submit {
        key: u8,
        variant: u8,
        process: u8,
        start: bool,
    },
    /// `process`'s worker claims (and confirms) `attempt`.
    Claim {
        process: u8,
        attempt: u8,
    },
    /// The confirmed request leaves: the provider receives it.
    Send {
        attempt: u8,
    },
    /// The provider asked for a pause between the claim and the send: the
    /// claim is given back.
    GiveBack {
        attempt: u8,
    },
    /// The provider answers (once); the reply may still be lost.
    Answer {
        attempt: u8,
        answer: Answer,
    },
    /// The answer reaches onejob.
    Deliver {
        attempt: u8,
        via: Via,
    },
    SoftTimeout {
        attempt: u8,
    },
    Renew {
        attempt: u8,
    },
    /// A chunk of the streamed answer arrives and is released to the job's
    /// followers (before the answer ends).
    Release {
        attempt: u8,
    },
    /// The database's clock moves on.
    Tick,
    /// A reaper finds `attempt`'s lease run out.
    Reap {
        attempt: u8,
    },
    /// `kill -9` and restart.
    Kill {
        process: u8,
    },
    Abandon {
        attempt: u8,
    },
    StartAttempt {
        job: u8,
    },
    MarkFailed {
        job: u8,
    },
    WindowEnds {
        job: u8,
    },
    Prune {
        job: u8,
    },
    /// The client cancels the job.
    Cancel {
        job: u8,
    },
    /// Under [`Bug::EventAfterCommit`]: process 0 writes an event after
    /// the commit.
    RecordLater,
    /// `process`'s delivery loop claims the outbox row `event`.
    ClaimEvent {
        process: u8,
        event: u8,
    },
    /// The delivery reaches the receiver.
    SendEvent {
        process: u8,
        event: u8,
    },
    /// The receiver's 2xx is recorded, if the claim still holds.
    AckEvent {
        process: u8,
        event: u8,
    },
}

fn intent_text(key: usize, variant: usize) -> String {
    match variant {
        0 => format!(r#"{{"text":"intent {key}","n":1}}"#),
        1 => format!("{{ \"n\" : 1.0 , \"text\" : \"intent {key}\" }}"),
        _ => format!(r#"{{"text":"another intent {key}","n":1}}"#),
    }
}

impl Protocol {
    pub fn new(bounds: Bounds, bug: Bug) -> Self {
        let fingerprints = (0..bounds.keys)
            .map(|key| {
                [0, 1, 2].map(|variant| {
                    let input = intent_text(key, variant);
                    Fingerprint::of(&JobIntent {
                        task: "summarize",
                        input: &input,
                        params: "{}",
                        provider: None,
                    })
                    .expect("a fingerprint")
                })
            })
            .collect();
        let chain: Vec<String> = PROVIDERS.iter().map(|p| (*p).to_owned()).collect();
        let order = failover_order(&chain, None);
        let gate = AllowedProviders::gate(&order, |name| match name {
            "fallback" => QualificationStatus::Qualified { at: 1 },
            _ => QualificationStatus::Never,
        });
        let policy = RetryPolicy {
            max_attempts: bounds.max_attempts,
            ..RetryPolicy::default()
        };
        Self {
            bounds,
            bug,
            fingerprints,
            gate,
            policy,
        }
    }

    pub fn fingerprint(&self, key: u8, variant: u8) -> &Fingerprint {
        &self.fingerprints[key as usize][variant as usize]
    }

    /// Whether `state` holds the job's one live slot, as the index says.
    fn holds_slot(&self, state: AttemptState) -> bool {
        guards::holds_the_live_slot(state)
            && !(self.bug == Bug::UnknownNotLive && state == AttemptState::Unknown)
    }

    fn lease_owner(state: &State, process: u8) -> (u8, u8) {
        (process, state.generations[process as usize])
    }

    fn lease_text(owner: Option<(u8, u8)>) -> Option<String> {
        owner.map(|(p, g)| format!("p{p}.{g}"))
    }

    fn busy(state: &State, process: u8) -> bool {
        state
            .calls
            .iter()
            .any(|c| c.process == process && c.phase != Phase::TimedOut)
    }

    fn call_of(state: &State, attempt: u8) -> Option<usize> {
        state.calls.iter().position(|c| c.attempt == attempt)
    }

    fn live_job(state: &State, key: u8) -> Option<usize> {
        state.jobs.iter().position(|j| j.key == key && !j.pruned)
    }

    fn attempts_of(state: &State, job: u8) -> impl Iterator<Item = (usize, &AttemptRow)> {
        state
            .attempts
            .iter()
            .enumerate()
            .filter(move |(_, a)| a.job == job && !a.deleted)
    }

    /// `store::webhooks::record_event`, in the state change's transaction:
    /// a row for the endpoint if it subscribes (`domain::webhook::
    /// records_event`), once per (job, kind, subject) as the unique key
    /// says.
    fn record_event(&self, state: &mut State, job: u8, kind: EventKind, subject: Option<u8>) {
        if !self.bounds.outbox || !records_event(true, &subscribed_to_all(), kind) {
            return;
        }
        if self.bug == Bug::EventAfterCommit {
            state.unrecorded.push((job, kind, subject));
            return;
        }
        Self::write_event(state, job, kind, subject);
    }

    fn write_event(state: &mut State, job: u8, kind: EventKind, subject: Option<u8>) {
        let exists = state
            .outbox
            .iter()
            .any(|e| e.job == job && e.kind == kind && e.subject == subject && !e.deleted);
        if !exists {
            state.outbox.push(EventRow {
                job,
                kind,
                subject,
                state: EventState::Pending,
                lease_owner: None,
                lease_until: None,
                deleted: false,
                received: 0,
                lapsed: false,
            });
        }
    }

    /// Whether `process`'s loop may claim `event` now.
    fn event_claimable(&self, state: &State, event: usize) -> bool {
        let e = &state.outbox[event];
        let lease = if self.bug == Bug::ClaimIgnoresLease {
            None
        } else {
            e.lease_until.map(i64::from)
        };
        !e.deleted && may_claim_event(e.state, 0, lease, true, i64::from(state.clock))
    }

    /// `refresh_job_status`: a non-terminal job's status from its live attempt.
    fn refresh(state: &mut State, job: u8) {
        let live = Self::attempts_of(state, job)
            .map(|(_, a)| a.state)
            .find(|s| s.is_live());
        let row = &mut state.jobs[job as usize];
        if !row.status.is_terminal() {
            row.status = JobStatus::for_live_attempt(live);
        }
    }

    /// A guarded transition: applied only from the event's from-states.
    fn transition(state: &mut State, attempt: u8, event: AttemptEvent) -> bool {
        let row = &mut state.attempts[attempt as usize];
        let Ok(target) = event.apply(row.state) else {
            return false;
        };
        if row.state == AttemptState::Unknown {
            row.left_unknown_by = Some(event);
        }
        if target == AttemptState::Unknown {
            row.was_unknown = true;
        }
        row.state = target;
        row.lease_until = None;
        if target == AttemptState::Queued {
            row.sent = false;
            row.version_read = None;
        }
        true
    }

    /// Inserts a queued attempt, if the one-live index lets it in.
    fn insert_attempt(
        &self,
        state: &mut State,
        job: u8,
        provider: u8,
        not_before: Option<u8>,
        origin: Origin,
    ) -> bool {
        if Self::attempts_of(state, job).any(|(_, a)| self.holds_slot(a.state)) {
            return false;
        }
        let after_release = matches!(origin, Origin::FailOver(_))
            && Self::attempts_of(state, job).any(|(_, a)| a.released);
        state.attempts.push(AttemptRow {
            job,
            provider,
            state: AttemptState::Queued,
            outcome: None,
            sent: false,
            lease_owner: None,
            lease_until: None,
            version_read: None,
            not_before,
            created: state.clock,
            received: 0,
            answer: None,
            delivered: (false, false),
            applied: false,
            was_unknown: false,
            left_unknown_by: None,
            origin,
            deleted: false,
            released: false,
            after_release,
        });
        true
    }

    /// `complete_success`.
    fn apply_success(&self, state: &mut State, attempt: u8) {
        let row = state.attempts[attempt as usize].clone();
        let job = row.job as usize;
        if row.applied {
            return; // a repeat: answered as the first delivery, nothing written
        }
        state.attempts[attempt as usize].applied = true;
        if AttemptEvent::ProviderSucceeded.apply(row.state).is_err() {
            state.jobs[job].logged = true;
            return;
        }
        let jobrow = &state.jobs[job];
        let won = guards::cas_wins(
            i64::from(jobrow.version),
            jobrow.completed_by.is_some(),
            i64::from(row.version_read.expect("claimed")),
        ) || self.bug == Bug::CasWithoutGuard;
        Self::transition(state, attempt, AttemptEvent::ProviderSucceeded);
        self.spend(state);
        if won {
            if self.bug != Bug::KeepReservation {
                Self::release(state, row.job);
            }
            let jobrow = &mut state.jobs[job];
            jobrow.result = Some(attempt);
            jobrow.completed_by = Some(attempt);
            jobrow.status = JobStatus::Succeeded;
            jobrow.version += 1;
            state.attempts[attempt as usize].outcome = Some(RaceResult::Won);
            self.record_event(state, row.job, EventKind::JobSucceeded, None);
            if !row.state.is_live() {
                let queued: Vec<u8> = Self::attempts_of(state, row.job)
                    .filter(|(_, a)| a.state == AttemptState::Queued)
                    .map(|(i, _)| i as u8)
                    .collect();
                for q in queued {
                    Self::transition(state, q, AttemptEvent::Skipped);
                }
            }
        } else {
            state.attempts[attempt as usize].outcome = Some(RaceResult::Lost);
            state.jobs[job].logged = true;
        }
    }

    /// `complete_failure`: the failure, then what `next_step` says follows.
    /// `None` when the transaction rolls back (the index refused).
    fn apply_failure(&self, mut state: State, attempt: u8, basis: Basis) -> Option<State> {
        let row = state.attempts[attempt as usize].clone();
        if row.applied && basis != Basis::Timeout {
            return Some(state);
        }
        state.attempts[attempt as usize].applied = basis != Basis::Timeout;
        if !Self::transition(&mut state, attempt, AttemptEvent::ProviderFailed) {
            return Some(state);
        }
        let job = row.job;
        let jobrow = state.jobs[job as usize].clone();
        if row.state == AttemptState::Abandoned || jobrow.status.is_terminal() {
            return Some(state);
        }
        let made: Vec<Made> = Self::attempts_of(&state, job)
            .map(|(_, a)| Made {
                provider: PROVIDERS[a.provider as usize],
                waited_ms: a
                    .not_before
                    .map_or(0, |nb| i64::from(nb - a.created) * 1000),
            })
            .collect();
        let order: Vec<&str> = self.gate.allowed.iter().map(String::as_str).collect();
        let failure = match basis {
            Basis::NothingHappened => Failure::NothingHappened {
                retry_after_ms: Some(1000),
            },
            _ => Failure::Definite,
        };
        let failure = if self.bug == Bug::FailoverAfterChunk {
            failure
        } else {
            failure_after(u64::from(row.released), failure)
        };
        let failed = PROVIDERS[row.provider as usize];
        let provider_index = |name: &str| PROVIDERS.iter().position(|p| *p == name).unwrap() as u8;
        match next_step(&self.policy, &order, &made, failed, failure, 0.0) {
            NextStep::FailOver(provider) => {
                let p = provider_index(provider);
                if !self.insert_attempt(&mut state, job, p, None, Origin::FailOver(basis)) {
                    return None;
                }
            }
            NextStep::RetryLater { provider, wait_ms } => {
                let ticks = u8::try_from((wait_ms + 999) / 1000)
                    .unwrap_or(u8::MAX)
                    .max(1);
                let not_before = state.clock.saturating_add(ticks);
                let p = provider_index(provider);
                let origin = Origin::FailOver(basis);
                if !self.insert_attempt(&mut state, job, p, Some(not_before), origin) {
                    return None;
                }
            }
            NextStep::GiveUp(_) => {
                self.fail_job(&mut state, job, jobrow.version);
                return Some(state);
            }
        }
        Self::refresh(&mut state, job);
        Some(state)
    }

    /// `store::budgets::release`: a finishing job gives its reservation
    /// back, once (its row is deleted with it).
    fn release(state: &mut State, job: u8) {
        let row = &mut state.jobs[job as usize];
        if row.holds {
            row.holds = false;
            state.budget = state.budget.release(RESERVATION);
        }
    }

    /// `store::budgets::spend`: a recorded answer's tokens.
    fn spend(&self, state: &mut State) {
        if self.bounds.budget.is_some() {
            state.budget = state.budget.spend(0, 0, 1);
        }
    }

    /// `fail_job`, guarded by the version the decision read.
    fn fail_job(&self, state: &mut State, job: u8, version_read: u8) -> bool {
        let row = &mut state.jobs[job as usize];
        if !guards::may_fail_job(
            row.status,
            i64::from(row.version),
            row.completed_by.is_some(),
            i64::from(version_read),
        ) {
            return false;
        }
        row.status = JobStatus::Failed;
        row.version += 1;
        self.record_event(state, job, EventKind::JobFailed, None);
        Self::release(state, job);
        true
    }

    fn submit(&self, mut state: State, key: u8, variant: u8, process: u8, start: bool) -> State {
        if variant == 2 {
            state.other_left = false;
        } else {
            state.sends_left[key as usize] -= 1;
        }
        let existing = Self::live_job(&state, key).filter(|_| self.bug != Bug::NoUniqueKey);
        if let Some(job) = existing {
            let row = &state.jobs[job];
            let stored = self.fingerprint(row.key, row.variant).as_str().to_owned();
            let replay = guards::is_replay(&stored, self.fingerprint(key, variant))
                || self.bug == Bug::NoFingerprintCheck;
            Self::reply(&mut state, key, variant, job as u8, !replay);
            return state;
        }
        // The creating transaction reserves under the budget row's lock;
        // refused, it rolls back and nothing is stored.
        let holds = match self.bounds.budget {
            None => false,
            Some(limit) => {
                let limits = BudgetLimits {
                    spend_micros: None,
                    tokens: Some(limit),
                };
                if self.bug != Bug::NoBudgetCheck
                    && !may_reserve(&limits, &state.budget, 0, RESERVATION)
                {
                    state.budget_refusals += 1;
                    return state;
                }
                state.budget = state.budget.reserve(0, RESERVATION);
                true
            }
        };
        let job = state.jobs.len() as u8;
        state.jobs.push(JobRow {
            holds,
            key,
            variant,
            status: JobStatus::Pending,
            version: 0,
            completed_by: None,
            result: None,
            logged: false,
            window_ended: false,
            pruned: false,
            was_cancelled: false,
        });
        self.insert_attempt(&mut state, job, 0, None, Origin::Creation);
        if start {
            let attempt = (state.attempts.len() - 1) as u8;
            self.claim(&mut state, process, attempt);
        }
        Self::reply(&mut state, key, variant, job, false);
        state
    }

    fn reply(state: &mut State, key: u8, variant: u8, job: u8, refused: bool) {
        let reply = Reply {
            key,
            variant,
            job,
            refused,
        };
        if let Err(at) = state.replies.binary_search(&reply) {
            state.replies.insert(at, reply);
        }
    }

    /// The claim, confirmed: `running`, `sent_at`, the version read, the lease.
    fn claim(&self, state: &mut State, process: u8, attempt: u8) {
        let owner = Self::lease_owner(state, process);
        let until = state.clock + self.bounds.lease;
        let job = state.attempts[attempt as usize].job;
        let version = state.jobs[job as usize].version;
        Self::transition(state, attempt, AttemptEvent::Claimed);
        let row = &mut state.attempts[attempt as usize];
        row.sent = true;
        row.version_read = Some(version);
        row.lease_owner = Some(owner);
        row.lease_until = Some(until);
        state.jobs[job as usize].status =
            JobStatus::for_live_attempt(Some(AttemptEvent::Claimed.target()));
        Self::open_call(state, attempt, process);
    }

    fn open_call(state: &mut State, attempt: u8, process: u8) {
        let call = Call {
            attempt,
            process,
            phase: Phase::Confirmed,
        };
        let at = state.calls.binary_search(&call).unwrap_or_else(|at| at);
        state.calls.insert(at, call);
    }

    fn set_phase(state: &mut State, call: usize, phase: Phase) {
        let mut c = state.calls.remove(call);
        c.phase = phase;
        let at = state.calls.binary_search(&c).unwrap_or_else(|at| at);
        state.calls.insert(at, c);
    }

    fn claimable(&self, state: &State, attempt: usize) -> bool {
        let a = &state.attempts[attempt];
        !a.deleted
            && guards::may_claim(
                a.state,
                state.jobs[a.job as usize].status,
                false,
                a.not_before.map(i64::from),
                i64::from(state.clock),
            )
    }

    /// What the reaper does to `attempt`, if its lease ran out.
    fn reap(&self, mut state: State, attempt: u8) -> Option<State> {
        let a = state.attempts[attempt as usize].clone();
        if a.deleted
            || !guards::lease_has_run_out(
                a.state,
                a.lease_until.map(i64::from),
                i64::from(state.clock),
            )
        {
            return None;
        }
        let finished = state.jobs[a.job as usize].status.is_terminal();
        let sent = a.sent && self.bug != Bug::RequeueSentAttempts;
        let event = guards::on_lease_expiry(sent, finished);
        if matches!(event, AttemptEvent::GivenBack | AttemptEvent::ClosedUnsent)
            && !guards::may_give_back(a.state, None, None, sent, true)
        {
            return None;
        }
        if !Self::transition(&mut state, attempt, event) {
            return None;
        }
        if matches!(event, AttemptEvent::GivenBack | AttemptEvent::LeaseExpired) {
            Self::refresh(&mut state, a.job);
        }
        if event.target() == AttemptState::Unknown {
            self.record_event(&mut state, a.job, EventKind::JobUnknown, Some(attempt));
        }
        Some(state)
    }

    /// `store::cancel::cancel_job`, under the job's lock: `domain::on_cancel`
    /// decides; a cancel moves the job to `cancelled` and its version on,
    /// withdraws its queued attempt and writes `job.cancelled`, in one
    /// transaction. A sent attempt stays as it is.
    fn cancel(&self, mut state: State, job: u8) -> Option<State> {
        if state.jobs[job as usize].pruned {
            return None;
        }
        if on_cancel(state.jobs[job as usize].status) != CancelDecision::Cancel {
            return Some(state);
        }
        let row = &mut state.jobs[job as usize];
        row.status = JobStatus::Cancelled;
        row.was_cancelled = true;
        if self.bug != Bug::CancelWithoutVersion {
            row.version += 1;
        }
        self.record_event(&mut state, job, EventKind::JobCancelled, None);
        Self::release(&mut state, job);
        let queued: Vec<u8> = Self::attempts_of(&state, job)
            .filter(|(_, a)| a.state == AttemptState::Queued)
            .map(|(i, _)| i as u8)
            .collect();
        for q in queued {
            Self::transition(&mut state, q, AttemptEvent::Skipped);
        }
        Some(state)
    }

    /// Whether a fair run is stuck here: nothing but waiting on the bound.
    pub fn stuck(&self, state: &State) -> bool {
        let mut actions = Vec::new();
        self.actions(state, &mut actions);
        actions.into_iter().all(|action| {
            self.next_state(state, action)
                .is_none_or(|next| next == *state)
        })
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            clock: 0,
            jobs: Vec::new(),
            attempts: Vec::new(),
            generations: vec![0; self.bounds.processes],
            calls: Vec::new(),
            sends_left: vec![self.bounds.sends_per_key; self.bounds.keys],
            other_left: self.bounds.other_payload,
            kills_left: if self.bounds.fair {
                0
            } else {
                self.bounds.kills
            },
            operator_left: self.bounds.operator_steps,
            replies: Vec::new(),
            cancels_left: if self.bounds.fair {
                0
            } else {
                self.bounds.cancels
            },
            outbox: Vec::new(),
            deliveries: Vec::new(),
            unrecorded: Vec::new(),
            budget: BudgetCounters::default(),
            budget_refusals: 0,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let processes = self.bounds.processes as u8;
        for key in 0..self.bounds.keys as u8 {
            let left = state.sends_left[key as usize];
            let mut variants = Vec::new();
            if left > 0 {
                variants.push((self.bounds.sends_per_key - left) % 2);
            }
            if key == 0 && state.other_left {
                variants.push(2);
            }
            let exists = Self::live_job(state, key).is_some() && self.bug != Bug::NoUniqueKey;
            for variant in variants {
                // Which process queues a job makes no difference.
                actions.push(Action::Submit {
                    key,
                    variant,
                    process: 0,
                    start: false,
                });
                for process in 0..processes {
                    if !exists && !Self::busy(state, process) {
                        actions.push(Action::Submit {
                            key,
                            variant,
                            process,
                            start: true,
                        });
                    }
                }
            }
        }
        for attempt in 0..state.attempts.len() {
            if self.claimable(state, attempt) {
                for process in 0..processes {
                    if !Self::busy(state, process) {
                        actions.push(Action::Claim {
                            process,
                            attempt: attempt as u8,
                        });
                    }
                }
            }
        }
        for call in &state.calls {
            let attempt = call.attempt;
            match call.phase {
                Phase::Confirmed => {
                    actions.push(Action::Send { attempt });
                    if self.bounds.give_backs {
                        actions.push(Action::GiveBack { attempt });
                    }
                }
                Phase::Sent => {
                    actions.push(Action::SoftTimeout { attempt });
                    actions.push(Action::Renew { attempt });
                    let a = &state.attempts[attempt as usize];
                    if self.bounds.streams && !a.released && a.answer.is_none() {
                        actions.push(Action::Release { attempt });
                    }
                }
                Phase::TimedOut => {}
            }
        }
        for (i, a) in state.attempts.iter().enumerate() {
            let attempt = i as u8;
            if a.received > 0 && a.answer.is_none() {
                for answer in [Answer::Success, Answer::Failure, Answer::RateLimited] {
                    actions.push(Action::Answer { attempt, answer });
                }
            }
            if a.answer.is_some() && !a.deleted {
                let open = state.calls.iter().any(|c| {
                    c.attempt == attempt && matches!(c.phase, Phase::Sent | Phase::TimedOut)
                });
                if open && !a.delivered.0 {
                    actions.push(Action::Deliver {
                        attempt,
                        via: Via::Call,
                    });
                }
                if !a.delivered.1 {
                    actions.push(Action::Deliver {
                        attempt,
                        via: Via::Callback,
                    });
                }
            }
            if a.state == AttemptState::Running && !a.deleted {
                actions.push(Action::Reap { attempt });
            }
            if state.operator_left > 0 && a.state == AttemptState::Unknown && !a.deleted {
                actions.push(Action::Abandon { attempt });
            }
        }
        // In fair runs leases never run out (nothing stops renewing them):
        // time moves only for a retry waiting its turn.
        let waiting = state.attempts.iter().any(|a| {
            a.state == AttemptState::Queued && a.not_before.is_some_and(|at| at > state.clock)
        });
        if state.clock < self.bounds.max_clock && (!self.bounds.fair || waiting) {
            actions.push(Action::Tick);
        }
        if state.kills_left > 0 {
            for process in 0..processes {
                actions.push(Action::Kill { process });
            }
        }
        for (j, job) in state.jobs.iter().enumerate() {
            if job.pruned {
                continue;
            }
            let job_id = j as u8;
            if state.operator_left > 0 && !job.status.is_terminal() {
                actions.push(Action::StartAttempt { job: job_id });
                actions.push(Action::MarkFailed { job: job_id });
            }
            if self.bounds.retention && job.status.is_terminal() {
                if !job.window_ended {
                    actions.push(Action::WindowEnds { job: job_id });
                }
                actions.push(Action::Prune { job: job_id });
            }
            if state.cancels_left > 0 && !job.status.is_terminal() {
                actions.push(Action::Cancel { job: job_id });
            }
        }
        if !state.unrecorded.is_empty() {
            actions.push(Action::RecordLater);
        }
        for event in 0..state.outbox.len() {
            let e = event as u8;
            if self.event_claimable(state, event) {
                for process in 0..processes {
                    let delivering = state
                        .deliveries
                        .iter()
                        .any(|d| d.event == e && d.process == process);
                    if !delivering {
                        actions.push(Action::ClaimEvent { process, event: e });
                    }
                }
            }
        }
        for d in &state.deliveries {
            let (process, event) = (d.process, d.event);
            if d.sent {
                actions.push(Action::AckEvent { process, event });
            } else {
                actions.push(Action::SendEvent { process, event });
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Submit {
                key,
                variant,
                process,
                start,
            } => return Some(self.submit(state, key, variant, process, start)),
            Action::Claim { process, attempt } => self.claim(&mut state, process, attempt),
            Action::Send { attempt } => {
                let call = Self::call_of(&state, attempt)?;
                state.attempts[attempt as usize].received += 1;
                Self::set_phase(&mut state, call, Phase::Sent);
            }
            Action::GiveBack { attempt } => {
                let call = Self::call_of(&state, attempt)?;
                let process = state.calls[call].process;
                state.calls.remove(call);
                let a = state.attempts[attempt as usize].clone();
                let me = Self::lease_text(Some(Self::lease_owner(&state, process)));
                let owner = Self::lease_text(a.lease_owner);
                if guards::may_give_back(a.state, owner.as_deref(), me.as_deref(), a.sent, false) {
                    let finished = state.jobs[a.job as usize].status.is_terminal();
                    let event = guards::on_lease_expiry(false, finished);
                    Self::transition(&mut state, attempt, event);
                    Self::refresh(&mut state, a.job);
                }
            }
            Action::Answer { attempt, answer } => {
                state.attempts[attempt as usize].answer = Some(answer);
            }
            Action::Deliver { attempt, via } => {
                let a = &mut state.attempts[attempt as usize];
                match via {
                    Via::Call => a.delivered.0 = true,
                    Via::Callback => a.delivered.1 = true,
                }
                let answer = a.answer?;
                if via == Via::Call {
                    let call = Self::call_of(&state, attempt)?;
                    state.calls.remove(call);
                }
                match answer {
                    Answer::Success => self.apply_success(&mut state, attempt),
                    Answer::Failure => {
                        state = self.apply_failure(state, attempt, Basis::Definite)?
                    }
                    Answer::RateLimited => {
                        state = self.apply_failure(state, attempt, Basis::NothingHappened)?
                    }
                }
            }
            Action::SoftTimeout { attempt } => {
                let call = Self::call_of(&state, attempt)?;
                Self::set_phase(&mut state, call, Phase::TimedOut);
                let a = state.attempts[attempt as usize].clone();
                let finished = state.jobs[a.job as usize].status.is_terminal();
                if self.bug == Bug::FailoverOnTimeout && !finished {
                    return self.apply_failure(state, attempt, Basis::Timeout);
                }
                let event = guards::on_soft_timeout(a.state, finished);
                if Self::transition(&mut state, attempt, event) && !finished {
                    Self::refresh(&mut state, a.job);
                }
                if event.target() == AttemptState::Unknown
                    && state.attempts[attempt as usize].state == AttemptState::Unknown
                {
                    self.record_event(&mut state, a.job, EventKind::JobUnknown, Some(attempt));
                }
            }
            Action::Renew { attempt } => {
                let call = Self::call_of(&state, attempt)?;
                let me =
                    Self::lease_text(Some(Self::lease_owner(&state, state.calls[call].process)));
                let a = &mut state.attempts[attempt as usize];
                let owner = Self::lease_text(a.lease_owner);
                if !guards::may_renew(a.state, owner.as_deref(), me.as_deref()?) {
                    return None;
                }
                a.lease_until = Some(last.clock + self.bounds.lease);
            }
            Action::Release { attempt } => {
                // Only the call's own process releases, and only while the
                // attempt runs (a stalled or timed-out one releases nothing).
                Self::call_of(&state, attempt)?;
                let a = &mut state.attempts[attempt as usize];
                if a.state != AttemptState::Running {
                    return None;
                }
                a.released = true;
            }
            Action::Tick => state.clock += 1,
            Action::Reap { attempt } => return self.reap(state, attempt),
            Action::Kill { process } => {
                state.kills_left -= 1;
                state.generations[process as usize] += 1;
                state.calls.retain(|c| c.process != process);
                state.deliveries.retain(|d| d.process != process);
                if process == 0 {
                    state.unrecorded.clear();
                }
            }
            Action::Abandon { attempt } => {
                state.operator_left -= 1;
                if !Self::transition(&mut state, attempt, AttemptEvent::Abandoned) {
                    return None;
                }
                let job = state.attempts[attempt as usize].job;
                state.jobs[job as usize].logged = true;
                Self::refresh(&mut state, job);
            }
            Action::StartAttempt { job } => {
                state.operator_left -= 1;
                let order: Vec<&str> = self.gate.allowed.iter().map(String::as_str).collect();
                let tried: Vec<String> = Self::attempts_of(&state, job)
                    .map(|(_, a)| PROVIDERS[a.provider as usize].to_owned())
                    .collect();
                let provider = next_provider(&order, &tried)?;
                let p = PROVIDERS.iter().position(|x| *x == provider).unwrap() as u8;
                if !self.insert_attempt(&mut state, job, p, None, Origin::Operator) {
                    return None;
                }
                Self::refresh(&mut state, job);
            }
            Action::MarkFailed { job } => {
                state.operator_left -= 1;
                if Self::attempts_of(&state, job).any(|(_, a)| self.holds_slot(a.state)) {
                    return None;
                }
                let version = state.jobs[job as usize].version;
                if !self.fail_job(&mut state, job, version) {
                    return None;
                }
                state.jobs[job as usize].logged = true;
            }
            Action::WindowEnds { job } => state.jobs[job as usize].window_ended = true,
            Action::Prune { job } => {
                let row = &state.jobs[job as usize];
                let has_live = Self::attempts_of(&state, job).any(|(_, a)| a.state.is_live());
                let window = row.window_ended || self.bug == Bug::PruneBeforeWindow;
                if !guards::may_prune(row.status, window, has_live, row.logged) {
                    return None;
                }
                state.jobs[job as usize].pruned = true;
                for a in state.attempts.iter_mut().filter(|a| a.job == job) {
                    a.deleted = true;
                }
                for e in state.outbox.iter_mut().filter(|e| e.job == job) {
                    e.deleted = true;
                }
            }
            Action::Cancel { job } => {
                state.cancels_left -= 1;
                return self.cancel(state, job);
            }
            Action::RecordLater => {
                let (job, kind, subject) = state.unrecorded.remove(0);
                Self::write_event(&mut state, job, kind, subject);
            }
            Action::ClaimEvent { process, event } => {
                if !self.event_claimable(&state, event as usize) {
                    return None;
                }
                let owner = Self::lease_owner(&state, process);
                let until = state.clock + self.bounds.lease;
                let e = &mut state.outbox[event as usize];
                if e.lease_until.is_some_and(|at| at < last.clock) {
                    e.lapsed = true;
                }
                e.lease_owner = Some(owner);
                e.lease_until = Some(until);
                let d = Delivery {
                    event,
                    process,
                    sent: false,
                };
                let at = state.deliveries.binary_search(&d).unwrap_or_else(|at| at);
                state.deliveries.insert(at, d);
            }
            Action::SendEvent { process, event } => {
                let at = state.deliveries.binary_search(&Delivery {
                    event,
                    process,
                    sent: false,
                });
                let mut d = state.deliveries.remove(at.ok()?);
                d.sent = true;
                let at = state.deliveries.binary_search(&d).unwrap_or_else(|at| at);
                state.deliveries.insert(at, d);
                state.outbox[event as usize].received += 1;
            }
            Action::AckEvent { process, event } => {
                let at = state.deliveries.binary_search(&Delivery {
                    event,
                    process,
                    sent: true,
                });
                state.deliveries.remove(at.ok()?);
                // `record_delivery`: only while this claim holds the row.
                let me = Self::lease_owner(&state, process);
                let e = &mut state.outbox[event as usize];
                if !e.deleted && e.state == EventState::Pending && e.lease_owner == Some(me) {
                    e.state = EventState::Delivered;
                    e.lease_owner = None;
                    e.lease_until = None;
                }
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        crate::properties::all()
    }
}
