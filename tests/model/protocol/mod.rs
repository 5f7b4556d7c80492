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
//!
//! By part: here the bounds, the broken variants and the rows the state
//! holds; [`procedures`] the store procedures, each one atomic step, in
//! the order of their statements; [`actions`] what each state lets happen
//! next, and where each action leads.

use onejob::domain::ledger::{BudgetCounters, Reservation};
use onejob::domain::webhook::{EventKind, EventState};
use onejob::domain::{
    failover_order, AllowedProviders, AttemptEvent, AttemptState, Fingerprint, JobIntent,
    JobStatus, QualificationStatus, RaceResult, RetryPolicy, Timestamp,
};

mod actions;
mod procedures;

pub use actions::Action;

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
            "fallback" => QualificationStatus::Qualified {
                at: Timestamp::from_millis(1),
            },
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
}
