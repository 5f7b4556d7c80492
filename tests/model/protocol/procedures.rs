//! The store procedures as the model runs them: each is one atomic step
//! at the database (the job-row lock on PostgreSQL, the write lock on
//! SQLite make it so), its statements in the order
//! `store::{queue, completion, transitions, operator, cancel, budgets,
//! webhooks}` run them, and every decision in them the product's own
//! function.

use onejob::domain::guards;
use onejob::domain::ledger::{may_reserve, BudgetLimits};
use onejob::domain::retry::{next_step, Failure, Made, NextStep};
use onejob::domain::stream::failure_after;
use onejob::domain::webhook::{may_claim_event, records_event, EventKind, EventState};
use onejob::domain::{
    on_cancel, AttemptEvent, AttemptState, CancelDecision, JobStatus, RaceResult, Timestamp,
};

use super::{
    AttemptRow, Basis, Bug, Call, EventRow, JobRow, Origin, Phase, Protocol, Reply, State,
    PROVIDERS, RESERVATION,
};

/// The model's clock, one tick a millisecond, as `domain` reads time.
fn tick(clock: u8) -> Timestamp {
    Timestamp::from_millis(i64::from(clock))
}

/// The one endpoint's subscription: every kind.
fn subscribed_to_all() -> Vec<EventKind> {
    onejob::domain::webhook::subscription(&EventKind::ALL)
}

impl Protocol {
    /// Whether `state` holds the job's one live slot, as the index says.
    pub(super) fn holds_slot(&self, state: AttemptState) -> bool {
        guards::holds_the_live_slot(state)
            && !(self.bug == Bug::UnknownNotLive && state == AttemptState::Unknown)
    }

    pub(super) fn lease_owner(state: &State, process: u8) -> (u8, u8) {
        (process, state.generations[process as usize])
    }

    pub(super) fn lease_text(owner: Option<(u8, u8)>) -> Option<String> {
        owner.map(|(p, g)| format!("p{p}.{g}"))
    }

    pub(super) fn busy(state: &State, process: u8) -> bool {
        state
            .calls
            .iter()
            .any(|c| c.process == process && c.phase != Phase::TimedOut)
    }

    pub(super) fn call_of(state: &State, attempt: u8) -> Option<usize> {
        state.calls.iter().position(|c| c.attempt == attempt)
    }

    pub(super) fn live_job(state: &State, key: u8) -> Option<usize> {
        state.jobs.iter().position(|j| j.key == key && !j.pruned)
    }

    pub(super) fn attempts_of(
        state: &State,
        job: u8,
    ) -> impl Iterator<Item = (usize, &AttemptRow)> {
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
    pub(super) fn record_event(
        &self,
        state: &mut State,
        job: u8,
        kind: EventKind,
        subject: Option<u8>,
    ) {
        if !self.bounds.outbox || !records_event(true, &subscribed_to_all(), kind) {
            return;
        }
        if self.bug == Bug::EventAfterCommit {
            state.unrecorded.push((job, kind, subject));
            return;
        }
        Self::write_event(state, job, kind, subject);
    }

    pub(super) fn write_event(state: &mut State, job: u8, kind: EventKind, subject: Option<u8>) {
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
    pub(super) fn event_claimable(&self, state: &State, event: usize) -> bool {
        let e = &state.outbox[event];
        let lease = if self.bug == Bug::ClaimIgnoresLease {
            None
        } else {
            e.lease_until.map(tick)
        };
        !e.deleted && may_claim_event(e.state, tick(0), lease, true, tick(state.clock))
    }

    /// `refresh_job_status`: a non-terminal job's status from its live attempt.
    pub(super) fn refresh(state: &mut State, job: u8) {
        let live = Self::attempts_of(state, job)
            .map(|(_, a)| a.state)
            .find(|s| s.is_live());
        let row = &mut state.jobs[job as usize];
        if !row.status.is_terminal() {
            row.status = JobStatus::for_live_attempt(live);
        }
    }

    /// A guarded transition: applied only from the event's from-states.
    pub(super) fn transition(state: &mut State, attempt: u8, event: AttemptEvent) -> bool {
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
    pub(super) fn insert_attempt(
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
    pub(super) fn apply_success(&self, state: &mut State, attempt: u8) {
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
    pub(super) fn apply_failure(
        &self,
        mut state: State,
        attempt: u8,
        basis: Basis,
    ) -> Option<State> {
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

    /// `store::ended::job_ended` (through `store::budgets::settle`): a
    /// finishing job gives its reservation back, once (its row is deleted
    /// with it).
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
            state.budget = state.budget.spend(tick(0), 0, 1);
        }
    }

    /// `fail_job`, guarded by the version the decision read.
    pub(super) fn fail_job(&self, state: &mut State, job: u8, version_read: u8) -> bool {
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

    pub(super) fn submit(
        &self,
        mut state: State,
        key: u8,
        variant: u8,
        process: u8,
        start: bool,
    ) -> State {
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
                    && !may_reserve(&limits, &state.budget, tick(0), RESERVATION)
                {
                    state.budget_refusals += 1;
                    return state;
                }
                state.budget = state.budget.reserve(tick(0), RESERVATION);
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
    pub(super) fn claim(&self, state: &mut State, process: u8, attempt: u8) {
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

    pub(super) fn set_phase(state: &mut State, call: usize, phase: Phase) {
        let mut c = state.calls.remove(call);
        c.phase = phase;
        let at = state.calls.binary_search(&c).unwrap_or_else(|at| at);
        state.calls.insert(at, c);
    }

    pub(super) fn claimable(&self, state: &State, attempt: usize) -> bool {
        let a = &state.attempts[attempt];
        !a.deleted
            && guards::may_claim(
                a.state,
                state.jobs[a.job as usize].status,
                false,
                a.not_before.map(tick),
                tick(state.clock),
            )
    }

    /// What the reaper does to `attempt`, if its lease ran out.
    pub(super) fn reap(&self, mut state: State, attempt: u8) -> Option<State> {
        let a = state.attempts[attempt as usize].clone();
        if a.deleted
            || !guards::lease_has_run_out(a.state, a.lease_until.map(tick), tick(state.clock))
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
    pub(super) fn cancel(&self, mut state: State, job: u8) -> Option<State> {
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
}
