//! A provider's limits in this process, so that onejob does not provoke the
//! rate limits it would then have to wait out: at most `max_in_flight`
//! calls open at once, at most `requests_per_minute` requests and
//! `tokens_per_minute` tokens sent in any 60 seconds, and no call at all
//! while a pause the provider asked for (`429`/`529` with `Retry-After`)
//! runs. An attempt is sent only with a [`SendSlot`]; one that cannot get
//! one stays queued. Open late calls (past the soft timeout) are capped by
//! `max_late_calls`.
//!
//! The limits hold per process (docs/configuration.md says how to share
//! them across several). Times are tokio's, so tests can run the clock.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// What the limits are measured over.
const WINDOW: Duration = Duration::from_secs(60);
/// The longest pause a provider can ask for: a `Retry-After` of a day is
/// taken as five minutes (retries still wait what they were told).
pub const MAX_PAUSE: Duration = Duration::from_secs(300);

/// A provider's limits, from its settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    pub max_in_flight: Option<u32>,
    pub requests_per_minute: Option<u32>,
    pub tokens_per_minute: Option<u32>,
    /// The most timed-out calls kept open for a late answer at once.
    pub max_late_calls: usize,
}

/// Why a provider cannot take a call now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// The provider asked for a pause, until then.
    Paused(Instant),
    /// `max_in_flight` calls are open.
    InFlight,
    /// `requests_per_minute` were sent in the last minute; room at `until`.
    Requests(Instant),
    /// `tokens_per_minute` were used in the last minute; room at `until`.
    Tokens(Instant),
}

impl Closed {
    /// When the provider may open again by the clock alone (a freed call
    /// slot opens it sooner).
    pub fn until(self) -> Option<Instant> {
        match self {
            Self::Paused(t) | Self::Requests(t) | Self::Tokens(t) => Some(t),
            Self::InFlight => None,
        }
    }

    pub fn is_pause(self) -> bool {
        matches!(self, Self::Paused(_))
    }
}

#[derive(Debug)]
struct TokenUse {
    id: u64,
    at: Instant,
    tokens: u64,
}

#[derive(Debug, Default)]
struct State {
    paused_until: Option<Instant>,
    in_flight: u32,
    /// When each request of the last minute was sent.
    sent: VecDeque<Instant>,
    /// Tokens each request of the last minute used (or is expected to).
    tokens: VecDeque<TokenUse>,
    late_calls: usize,
}

impl State {
    fn forget_before(&mut self, now: Instant) {
        let cutoff = now.checked_sub(WINDOW);
        while self
            .sent
            .front()
            .is_some_and(|t| cutoff.is_some_and(|c| *t <= c))
        {
            self.sent.pop_front();
        }
        while self
            .tokens
            .front()
            .is_some_and(|u| cutoff.is_some_and(|c| u.at <= c))
        {
            self.tokens.pop_front();
        }
        if self.paused_until.is_some_and(|t| t <= now) {
            self.paused_until = None;
        }
    }

    fn tokens_used(&self) -> u64 {
        self.tokens.iter().map(|u| u.tokens).sum()
    }
}

/// One provider's limits and what they have counted.
#[derive(Debug)]
pub struct Limiter {
    limits: Limits,
    state: Mutex<State>,
    /// Told whenever a call slot is given back (shared by a process's
    /// providers: the claimer waits on it).
    freed: Arc<Notify>,
    next_id: AtomicU64,
}

impl Limiter {
    pub fn new(limits: Limits, freed: Arc<Notify>) -> Self {
        Self {
            limits,
            state: Mutex::new(State::default()),
            freed,
            next_id: AtomicU64::new(0),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check(&self, state: &State, now: Instant, estimated_tokens: u64) -> Result<(), Closed> {
        if let Some(until) = state.paused_until.filter(|t| *t > now) {
            return Err(Closed::Paused(until));
        }
        if let Some(max) = self.limits.max_in_flight {
            if state.in_flight >= max {
                return Err(Closed::InFlight);
            }
        }
        if let Some(rpm) = self.limits.requests_per_minute {
            if state.sent.len() as u64 >= u64::from(rpm) {
                let oldest = state.sent.front().copied().unwrap_or(now);
                return Err(Closed::Requests(oldest + WINDOW));
            }
        }
        if let Some(tpm) = self.limits.tokens_per_minute {
            let used = state.tokens_used();
            // One request larger than the whole budget still goes, alone.
            if !state.tokens.is_empty() && used + estimated_tokens > u64::from(tpm) {
                // Room once enough of the window's oldest uses have aged out.
                let mut freed = 0;
                let needed = used + estimated_tokens - u64::from(tpm);
                let mut at = now;
                for used in &state.tokens {
                    freed += used.tokens;
                    at = used.at + WINDOW;
                    if freed >= needed {
                        break;
                    }
                }
                return Err(Closed::Tokens(at));
            }
        }
        Ok(())
    }

    /// A slot to send one call now, expected to use `estimated_tokens`, or
    /// why not. The slot counts the call as in flight until it is dropped;
    /// dropped unused, it gives back what it took.
    pub fn try_admit(self: &Arc<Self>, estimated_tokens: u64) -> Result<SendSlot, Closed> {
        let now = Instant::now();
        let mut state = self.state();
        state.forget_before(now);
        self.check(&state, now, estimated_tokens)?;
        state.in_flight += 1;
        state.sent.push_back(now);
        let token_id = self.limits.tokens_per_minute.map(|_| {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            state.tokens.push_back(TokenUse {
                id,
                at: now,
                tokens: estimated_tokens,
            });
            id
        });
        Ok(SendSlot {
            limiter: self.clone(),
            admitted_at: now,
            token_id,
            used: false,
        })
    }

    /// Waits for a slot (qualification calls, which are not queued).
    pub async fn admit(self: &Arc<Self>, estimated_tokens: u64) -> SendSlot {
        loop {
            match self.try_admit(estimated_tokens) {
                Ok(slot) => return slot,
                Err(closed) => {
                    let wake = closed
                        .until()
                        .unwrap_or_else(|| Instant::now() + Duration::from_millis(50));
                    tokio::time::sleep_until(wake.min(Instant::now() + Duration::from_millis(200)))
                        .await;
                }
            }
        }
    }

    /// Why a call could not be sent now, if it could not (for a call that
    /// uses one token: the claim passes such providers over).
    pub fn closed(&self) -> Option<Closed> {
        let now = Instant::now();
        let mut state = self.state();
        state.forget_before(now);
        self.check(&state, now, 1).err()
    }

    /// Whether a pause the provider asked for runs now.
    pub fn paused_until(&self) -> Option<Instant> {
        let now = Instant::now();
        self.state().paused_until.filter(|t| *t > now)
    }

    /// The provider asked not to be called for `pause` (capped at
    /// [`MAX_PAUSE`]); a longer pause already running is kept.
    pub fn pause(&self, pause: Duration) {
        let until = Instant::now() + pause.min(MAX_PAUSE);
        let mut state = self.state();
        if state.paused_until.is_none_or(|current| current < until) {
            state.paused_until = Some(until);
        }
    }

    /// Calls open now (sent or admitted, not yet answered).
    pub fn in_flight(&self) -> u32 {
        self.state().in_flight
    }

    /// A place for one more timed-out call kept open for its late answer,
    /// if fewer than `max_late_calls` are open.
    pub fn try_hold_late(self: &Arc<Self>) -> Option<LateHold> {
        let mut state = self.state();
        if state.late_calls >= self.limits.max_late_calls {
            return None;
        }
        state.late_calls += 1;
        Some(LateHold {
            limiter: self.clone(),
        })
    }

    /// Timed-out calls kept open now.
    pub fn late_calls(&self) -> usize {
        self.state().late_calls
    }

    fn release(&self, slot: &SendSlot) {
        {
            let mut state = self.state();
            state.in_flight = state.in_flight.saturating_sub(1);
            if !slot.used {
                if let Some(i) = state.sent.iter().rposition(|t| *t == slot.admitted_at) {
                    state.sent.remove(i);
                }
                if let Some(id) = slot.token_id {
                    state.tokens.retain(|u| u.id != id);
                }
            }
        }
        self.freed.notify_one();
    }

    fn settle(&self, token_id: u64, tokens: u64) {
        let mut state = self.state();
        if let Some(used) = state.tokens.iter_mut().find(|u| u.id == token_id) {
            used.tokens = tokens;
        }
    }
}

/// Room for one call to a provider, taken before it is sent. Dropping it
/// ends the call's place in flight; dropped before [`SendSlot::sending`],
/// it also gives back the request and tokens it had counted.
#[derive(Debug)]
pub struct SendSlot {
    limiter: Arc<Limiter>,
    admitted_at: Instant,
    token_id: Option<u64>,
    used: bool,
}

impl SendSlot {
    /// Whether no pause began since the slot was taken: a call that finds
    /// one is not sent (its attempt goes back to the queue).
    pub fn clear_to_send(&self) -> bool {
        self.limiter.paused_until().is_none()
    }

    /// The request is leaving now: what the slot counted stays counted.
    pub fn sending(&mut self) {
        self.used = true;
    }

    /// The tokens the call used, from the answer's usage.
    pub fn settle_tokens(&self, tokens: u64) {
        if let Some(id) = self.token_id {
            self.limiter.settle(id, tokens);
        }
    }
}

impl Drop for SendSlot {
    fn drop(&mut self) {
        self.limiter.release(self);
    }
}

/// One open late call's place under `max_late_calls`.
#[derive(Debug)]
pub struct LateHold {
    limiter: Arc<Limiter>,
}

impl Drop for LateHold {
    fn drop(&mut self) {
        let mut state = self.limiter.state();
        state.late_calls = state.late_calls.saturating_sub(1);
    }
}

/// A conservative token estimate of what a call sends: one token per
/// three bytes (English runs about four characters a token).
pub fn estimate_tokens(text_len: usize) -> u64 {
    text_len.div_ceil(3) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(limits: Limits) -> Arc<Limiter> {
        Arc::new(Limiter::new(limits, Arc::new(Notify::new())))
    }

    #[tokio::test(start_paused = true)]
    async fn max_in_flight_admits_that_many_until_one_is_given_back() {
        let limiter = limiter(Limits {
            max_in_flight: Some(2),
            ..Limits::default()
        });
        let mut first = limiter.try_admit(0).unwrap();
        first.sending();
        let _second = limiter.try_admit(0).unwrap();
        assert_eq!(limiter.try_admit(0).unwrap_err(), Closed::InFlight);
        drop(first);
        assert!(limiter.try_admit(0).is_ok(), "a freed slot admits again");
    }

    #[tokio::test(start_paused = true)]
    async fn requests_per_minute_count_the_last_sixty_seconds() {
        let limiter = limiter(Limits {
            requests_per_minute: Some(2),
            ..Limits::default()
        });
        let start = Instant::now();
        for _ in 0..2 {
            limiter.try_admit(0).unwrap().sending();
        }
        assert_eq!(
            limiter.try_admit(0).unwrap_err(),
            Closed::Requests(start + WINDOW)
        );
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(limiter.try_admit(0).is_err());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(limiter.try_admit(0).is_ok(), "the first ones aged out");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_dropped_unused_gives_its_request_back() {
        let limiter = limiter(Limits {
            requests_per_minute: Some(1),
            tokens_per_minute: Some(100),
            ..Limits::default()
        });
        drop(limiter.try_admit(80).unwrap());
        let mut slot = limiter.try_admit(80).expect("nothing was sent");
        slot.sending();
        drop(slot);
        assert!(matches!(limiter.try_admit(1), Err(Closed::Requests(_))));
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_per_minute_count_the_estimate_then_the_usage() {
        let limiter = limiter(Limits {
            tokens_per_minute: Some(1_000),
            ..Limits::default()
        });
        let mut slot = limiter.try_admit(600).unwrap();
        slot.sending();
        assert!(
            matches!(limiter.try_admit(600), Err(Closed::Tokens(_))),
            "600 + 600 > 1000"
        );
        slot.settle_tokens(300);
        drop(slot);
        assert!(limiter.try_admit(600).is_ok(), "the answer used only 300");
        // A request larger than the whole budget goes alone.
        let small = self::limiter(Limits {
            tokens_per_minute: Some(10),
            ..Limits::default()
        });
        assert!(small.try_admit(50).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_closes_the_provider_until_it_ends() {
        let limiter = limiter(Limits::default());
        let slot = limiter.try_admit(0).unwrap();
        limiter.pause(Duration::from_secs(1));
        assert!(!slot.clear_to_send(), "a slot taken before the pause waits");
        assert!(limiter.closed().is_some_and(Closed::is_pause));
        limiter.pause(Duration::from_millis(10));
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(
            limiter.closed().is_some(),
            "a shorter pause keeps the longer"
        );
        tokio::time::advance(Duration::from_millis(500)).await;
        assert_eq!(limiter.closed(), None);
        assert!(slot.clear_to_send());
        limiter.pause(Duration::from_secs(86_400));
        assert!(limiter.paused_until().unwrap() <= Instant::now() + MAX_PAUSE);
    }

    #[tokio::test(start_paused = true)]
    async fn late_calls_are_capped() {
        let limiter = limiter(Limits {
            max_late_calls: 1,
            ..Limits::default()
        });
        let held = limiter.try_hold_late().unwrap();
        assert!(limiter.try_hold_late().is_none());
        drop(held);
        assert!(limiter.try_hold_late().is_some());
    }
}
