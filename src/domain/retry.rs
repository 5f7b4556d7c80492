//! What follows a definite failure (docs/design.md, "Rate limits and
//! retries"): the next provider of the chain, the same provider again once
//! its wait is over, or the end of the job, within the task's budget.
//!
//! A retry is a new attempt under the same job. Only a failure in which
//! nothing happened (a `429`, a `529`, a request that never reached the
//! provider) may send the same request to the same provider again: nothing
//! was billed, and nothing can happen twice. A timeout or any other unknown
//! outcome never leads here.

use serde::Deserialize;

use super::ids::text_enum;
use super::next_provider;

text_enum! {
    /// What a task does when a provider turns its request away without doing
    /// anything (`on_rate_limit`).
    #[derive(Default, Deserialize)]
    #[serde(rename_all = "lowercase")]
    pub enum OnRateLimit {
        /// The next qualified provider of the chain the job has not tried; when
        /// none is left, the same provider once its wait is over.
        #[default]
        Failover = "failover",
        /// The same provider once its wait is over; a refusal never moves the
        /// job elsewhere (a definite failure of another kind still fails over).
        Wait = "wait",
    }
}

/// A task's retry policy and budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub on_rate_limit: OnRateLimit,
    /// The most attempts a job gets without a person: failovers and retries
    /// together, the first attempt included.
    pub max_attempts: u32,
    /// The longest a job's retries may wait in all, in milliseconds.
    pub max_wait_ms: i64,
}

impl RetryPolicy {
    pub const DEFAULT_MAX_ATTEMPTS: u32 = 6;
    pub const DEFAULT_MAX_WAIT_SECONDS: u64 = 300;
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            on_rate_limit: OnRateLimit::default(),
            max_attempts: Self::DEFAULT_MAX_ATTEMPTS,
            max_wait_ms: Self::DEFAULT_MAX_WAIT_SECONDS as i64 * 1000,
        }
    }
}

/// An attempt the job already has: its provider, and how long it had to
/// wait before it could be sent (0 unless it was a retry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Made<'a> {
    pub provider: &'a str,
    pub waited_ms: i64,
}

/// What kind of definite failure ended an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The provider refused the request or answered unusably: sending it
    /// there again would end the same way.
    Definite,
    /// Nothing happened (rate limited, overloaded, never reached): the same
    /// request may go to the same provider again, after `retry_after_ms`
    /// if the provider said, else after a backoff.
    NothingHappened { retry_after_ms: Option<i64> },
    /// Any failure after part of a streamed answer was released to a
    /// client (`domain::stream::failure_after`): another provider's answer
    /// would be spliced onto it, so the job ends.
    PartlyDelivered,
}

/// What the job does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextStep<'a> {
    /// A new attempt on this provider, at once.
    FailOver(&'a str),
    /// A new attempt on the same provider, not sent before `wait_ms` from now.
    RetryLater { provider: &'a str, wait_ms: i64 },
    /// No new attempt: the job fails.
    GiveUp(GiveUp),
}

/// Why a job gets no new attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GiveUp {
    /// Every provider the gate allows was tried, and the failure leaves
    /// nothing to retry.
    ChainExhausted,
    /// Part of a streamed answer had reached its clients.
    PartlyDelivered,
    /// The job has made as many attempts as its task allows.
    AttemptsSpent { max_attempts: u32 },
    /// Waiting for the provider again would take the job past the longest
    /// total wait its task allows.
    WaitSpent {
        provider: String,
        wait_ms: i64,
        waited_ms: i64,
        max_wait_ms: i64,
    },
}

/// The first backoff step when a provider gave no `Retry-After`.
pub const BACKOFF_BASE_MS: i64 = 1_000;
/// The longest backoff step.
pub const BACKOFF_CAP_MS: i64 = 60_000;
/// The most jitter added to a `Retry-After`: retries that were told the
/// same pause do not all come back in the same millisecond.
const RETRY_AFTER_JITTER_CAP_MS: i64 = 1_000;

/// How long a retry waits: the provider's `Retry-After` plus a little
/// jitter (never less than it asked), or, when it said nothing, an
/// exponential backoff with jitter over the attempts already made on that
/// provider (`made_there` ≥ 1): 1 s, 2 s, 4 s … up to 60 s, each between
/// half and all of its step. `jitter` is uniform in [0, 1).
pub fn retry_wait_ms(retry_after_ms: Option<i64>, made_there: u32, jitter: f64) -> i64 {
    let jitter = jitter.clamp(0.0, 1.0);
    match retry_after_ms {
        Some(after) => {
            let after = after.max(0);
            let spread = (after / 5).min(RETRY_AFTER_JITTER_CAP_MS);
            after + (spread as f64 * jitter) as i64
        }
        None => {
            let doublings = made_there.saturating_sub(1).min(16);
            let step = (BACKOFF_BASE_MS << doublings).min(BACKOFF_CAP_MS);
            step / 2 + ((step / 2) as f64 * jitter) as i64
        }
    }
}

/// What follows a definite failure of an attempt on `failed`.
///
/// `order` is what the failover gate allows (the job's primary, then its
/// qualified fallbacks); `made` is every attempt of the job, this one
/// included, oldest first. A refusal in which nothing happened goes to the
/// next untried provider (policy `failover`) or else back to `failed`
/// itself once its wait is over; any other definite failure goes to the
/// next untried provider or ends the job. No new attempt is made past the
/// policy's `max_attempts`, or when its wait would take the job's waits
/// past `max_wait_ms`.
pub fn next_step<'a>(
    policy: &RetryPolicy,
    order: &[&'a str],
    made: &[Made<'_>],
    failed: &str,
    failure: Failure,
    jitter: f64,
) -> NextStep<'a> {
    let tried: Vec<String> = made.iter().map(|m| m.provider.to_owned()).collect();
    let untried = next_provider(order, &tried);
    let step = match failure {
        Failure::PartlyDelivered => NextStep::GiveUp(GiveUp::PartlyDelivered),
        Failure::Definite => match untried {
            Some(provider) => NextStep::FailOver(provider),
            None => NextStep::GiveUp(GiveUp::ChainExhausted),
        },
        Failure::NothingHappened { retry_after_ms } => {
            match (policy.on_rate_limit, untried) {
                (OnRateLimit::Failover, Some(provider)) => NextStep::FailOver(provider),
                _ => match order.iter().copied().find(|p| *p == failed) {
                    // The gate no longer allows it: nowhere to go.
                    None => NextStep::GiveUp(GiveUp::ChainExhausted),
                    Some(provider) => {
                        let made_there = made.iter().filter(|m| m.provider == failed).count();
                        let wait_ms = retry_wait_ms(retry_after_ms, made_there as u32, jitter);
                        let waited_ms: i64 = made.iter().map(|m| m.waited_ms.max(0)).sum();
                        if waited_ms + wait_ms > policy.max_wait_ms {
                            NextStep::GiveUp(GiveUp::WaitSpent {
                                provider: provider.to_owned(),
                                wait_ms,
                                waited_ms,
                                max_wait_ms: policy.max_wait_ms,
                            })
                        } else {
                            NextStep::RetryLater { provider, wait_ms }
                        }
                    }
                },
            }
        }
    };
    let spent = made.len() as u64 >= u64::from(policy.max_attempts);
    match step {
        NextStep::FailOver(_) | NextStep::RetryLater { .. } if spent => {
            NextStep::GiveUp(GiveUp::AttemptsSpent {
                max_attempts: policy.max_attempts,
            })
        }
        step => step,
    }
}

impl GiveUp {
    /// The job's failure reason, for its owner. `tried` are the providers
    /// of the job's attempts in order, `skipped` those the gate kept out
    /// (with their status), `last_error` the failure's summary.
    pub fn reason(&self, tried: &[String], skipped: &[String], last_error: &str) -> String {
        let mut providers: Vec<&str> = Vec::new();
        for name in tried {
            if !providers.contains(&name.as_str()) {
                providers.push(name);
            }
        }
        let providers = providers.join(", ");
        let attempts = tried.len();
        match self {
            Self::ChainExhausted if skipped.is_empty() => format!(
                "every provider in the chain failed ({providers}); last error: {last_error}"
            ),
            Self::ChainExhausted => format!(
                "no qualified fallback provider is left: {} not qualified for this task; tried \
                 {providers}; last error: {last_error}",
                skipped.join(", ")
            ),
            Self::PartlyDelivered => format!(
                "the stream from {providers} failed after part of the answer had reached the \
                 client, so no other provider may finish it; last error: {last_error}"
            ),
            Self::AttemptsSpent { max_attempts } => format!(
                "the retry budget is spent: {attempts} attempts made ({providers}), the most the \
                 task allows (max_attempts = {max_attempts}); last error: {last_error}"
            ),
            Self::WaitSpent {
                provider,
                wait_ms,
                waited_ms,
                max_wait_ms,
            } => format!(
                "the retry budget is spent: {provider} asked to wait {} s more, and the job's \
                 retries had already waited {} s of the {} s the task allows \
                 (max_retry_wait_seconds); {attempts} attempts made; last error: {last_error}",
                seconds(*wait_ms),
                seconds(*waited_ms),
                seconds(*max_wait_ms)
            ),
        }
    }
}

fn seconds(ms: i64) -> String {
    let tenths = (ms.max(0) + 50) / 100;
    if tenths % 10 == 0 {
        format!("{}", tenths / 10)
    } else {
        format!("{}.{}", tenths / 10, tenths % 10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn made<'a>(providers: &[&'a str]) -> Vec<Made<'a>> {
        providers
            .iter()
            .map(|p| Made {
                provider: p,
                waited_ms: 0,
            })
            .collect()
    }

    const RATE_LIMITED: Failure = Failure::NothingHappened {
        retry_after_ms: Some(1_000),
    };

    #[test]
    fn a_rate_limit_fails_over_first_then_waits_for_the_same_provider() {
        let policy = RetryPolicy::default();
        let order = ["a", "b"];
        assert_eq!(
            next_step(&policy, &order, &made(&["a"]), "a", RATE_LIMITED, 0.0),
            NextStep::FailOver("b")
        );
        assert_eq!(
            next_step(&policy, &order, &made(&["a", "b"]), "b", RATE_LIMITED, 0.0),
            NextStep::RetryLater {
                provider: "b",
                wait_ms: 1_000
            }
        );
    }

    #[test]
    fn the_wait_policy_stays_on_the_same_provider() {
        let policy = RetryPolicy {
            on_rate_limit: OnRateLimit::Wait,
            ..RetryPolicy::default()
        };
        assert_eq!(
            next_step(&policy, &["a", "b"], &made(&["a"]), "a", RATE_LIMITED, 0.0),
            NextStep::RetryLater {
                provider: "a",
                wait_ms: 1_000
            }
        );
        assert_eq!(
            next_step(
                &policy,
                &["a", "b"],
                &made(&["a"]),
                "a",
                Failure::Definite,
                0.0
            ),
            NextStep::FailOver("b"),
            "a definite failure of another kind still fails over"
        );
    }

    #[test]
    fn a_definite_failure_is_never_retried_on_the_same_provider() {
        let policy = RetryPolicy::default();
        assert_eq!(
            next_step(&policy, &["a"], &made(&["a"]), "a", Failure::Definite, 0.0),
            NextStep::GiveUp(GiveUp::ChainExhausted)
        );
    }

    #[test]
    fn the_budget_bounds_attempts_and_total_wait() {
        let policy = RetryPolicy {
            max_attempts: 2,
            ..RetryPolicy::default()
        };
        assert_eq!(
            next_step(&policy, &["a"], &made(&["a"]), "a", RATE_LIMITED, 0.0),
            NextStep::RetryLater {
                provider: "a",
                wait_ms: 1_000
            }
        );
        assert_eq!(
            next_step(&policy, &["a"], &made(&["a", "a"]), "a", RATE_LIMITED, 0.0),
            NextStep::GiveUp(GiveUp::AttemptsSpent { max_attempts: 2 })
        );
        let policy = RetryPolicy {
            max_wait_ms: 2_500,
            ..RetryPolicy::default()
        };
        let waited = [
            Made {
                provider: "a",
                waited_ms: 0,
            },
            Made {
                provider: "a",
                waited_ms: 2_000,
            },
        ];
        assert_eq!(
            next_step(&policy, &["a"], &waited, "a", RATE_LIMITED, 0.0),
            NextStep::GiveUp(GiveUp::WaitSpent {
                provider: "a".into(),
                wait_ms: 1_000,
                waited_ms: 2_000,
                max_wait_ms: 2_500
            })
        );
    }

    #[test]
    fn a_provider_the_gate_no_longer_allows_is_not_retried() {
        assert_eq!(
            next_step(
                &RetryPolicy::default(),
                &["a"],
                &made(&["a", "b"]),
                "b",
                RATE_LIMITED,
                0.0
            ),
            NextStep::GiveUp(GiveUp::ChainExhausted)
        );
    }

    #[test]
    fn waits_follow_retry_after_or_back_off_exponentially_with_jitter() {
        assert_eq!(retry_wait_ms(Some(1_000), 1, 0.0), 1_000);
        assert_eq!(retry_wait_ms(Some(1_000), 1, 0.999), 1_199);
        assert_eq!(
            retry_wait_ms(Some(60_000), 1, 0.999),
            60_999,
            "jitter is capped"
        );
        assert_eq!(retry_wait_ms(None, 1, 0.0), 500);
        assert_eq!(retry_wait_ms(None, 1, 0.999), 999);
        assert_eq!(retry_wait_ms(None, 2, 0.0), 1_000);
        assert_eq!(retry_wait_ms(None, 3, 0.0), 2_000);
        assert_eq!(retry_wait_ms(None, 40, 0.0), 30_000, "capped at 60 s");
    }

    #[test]
    fn reasons_say_which_budget_was_spent() {
        let tried = vec!["a".to_owned(), "a".to_owned()];
        let reason = GiveUp::AttemptsSpent { max_attempts: 2 }.reason(&tried, &[], "rate limited");
        assert_eq!(
            reason,
            "the retry budget is spent: 2 attempts made (a), the most the task allows \
             (max_attempts = 2); last error: rate limited"
        );
        let reason = GiveUp::WaitSpent {
            provider: "a".into(),
            wait_ms: 1_500,
            waited_ms: 2_000,
            max_wait_ms: 3_000,
        }
        .reason(&tried, &[], "rate limited");
        assert!(
            reason.contains("a asked to wait 1.5 s more")
                && reason.contains("already waited 2 s of the 3 s"),
            "{reason}"
        );
        assert_eq!(
            GiveUp::ChainExhausted.reason(&["a".into(), "b".into()], &[], "x"),
            "every provider in the chain failed (a, b); last error: x"
        );
    }
}
