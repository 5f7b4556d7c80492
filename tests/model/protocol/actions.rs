//! What each state lets happen next ([`Model::actions`]) and where each
//! action leads ([`Model::next_state`]): the clients, the workers, the
//! providers, the clock, kills, the operator, retention, cancels and the
//! delivery loops, interleaved every way the bounds allow.

use onejob::domain::ledger::BudgetCounters;
use onejob::domain::webhook::{EventKind, EventState};
use onejob::domain::{guards, next_provider, AttemptEvent, AttemptState};
use stateright::{Model, Property};

use super::{Answer, Basis, Bug, Delivery, Origin, Phase, Protocol, State, Via, PROVIDERS};

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

impl Protocol {
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
