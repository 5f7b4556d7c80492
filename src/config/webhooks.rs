//! The `[webhooks]` section: completion webhooks from the durable outbox
//! (docs/design.md, "Webhook outbox"; every key in docs/configuration.md).

use serde::Deserialize;

use crate::domain::webhook::{DeliveryCaps, DisableRule, RetrySchedule, WebhookKey};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhookSettings {
    /// The environment variable holding the server's webhook key (at
    /// least 32 bytes), from which every endpoint's signing secret is
    /// derived; unset means webhooks are off (creating an endpoint is
    /// refused).
    pub signing_key_env: Option<String>,
    /// Whether deliveries may reach loopback, private, link-local and
    /// other non-public addresses (tests, local setups).
    pub allow_private_addresses: bool,
    /// Whether this process runs the delivery loop.
    pub deliver: bool,
    /// How long one delivery may take, connecting included.
    pub timeout_ms: u64,
    /// The wait after an event's first failed delivery; it doubles.
    pub backoff_initial_ms: u64,
    /// The longest one wait between deliveries may be.
    pub backoff_max_ms: u64,
    /// How long an event is retried (per endpoint, changeable through the
    /// API); then it is dead.
    pub retry_for_seconds: u64,
    /// How long the previous secret still signs deliveries after a
    /// rotation.
    pub rotation_overlap_seconds: u64,
    /// Consecutive failed deliveries …
    pub disable_after_failures: u32,
    /// … over at least this long disable an endpoint.
    pub disable_after_seconds: u64,
    /// How often the delivery loop looks for due events when no delivery
    /// slot has freed meanwhile.
    pub poll_interval_ms: u64,
    /// The most deliveries in flight at once from this process.
    pub batch_size: u32,
    /// The most deliveries in flight at once for one owner, from this
    /// process: an owner whose endpoints never answer holds no more.
    pub max_in_flight_per_owner: u32,
    /// The most deliveries in flight at once to one endpoint, from this
    /// process.
    pub max_in_flight_per_endpoint: u32,
    /// The most endpoints one owner may register.
    pub max_endpoints_per_owner: u32,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        Self {
            signing_key_env: None,
            allow_private_addresses: false,
            deliver: true,
            timeout_ms: 10_000,
            backoff_initial_ms: 5_000,
            backoff_max_ms: 3_600_000,
            retry_for_seconds: 86_400,
            rotation_overlap_seconds: 86_400,
            disable_after_failures: 20,
            disable_after_seconds: 43_200,
            poll_interval_ms: 1_000,
            batch_size: 16,
            max_in_flight_per_owner: 4,
            max_in_flight_per_endpoint: 2,
            max_endpoints_per_owner: 10,
        }
    }
}

impl WebhookSettings {
    pub fn schedule(&self) -> RetrySchedule {
        RetrySchedule {
            initial_ms: ms(self.backoff_initial_ms),
            max_step_ms: ms(self.backoff_max_ms),
        }
    }

    pub fn disable_rule(&self) -> DisableRule {
        DisableRule {
            after_failures: self.disable_after_failures,
            after_ms: ms(self.disable_after_seconds.saturating_mul(1000)),
        }
    }

    /// The delivery slots of one process.
    pub fn caps(&self) -> DeliveryCaps {
        let n = |value: u32| usize::try_from(value).unwrap_or(usize::MAX);
        DeliveryCaps {
            total: n(self.batch_size),
            per_owner: n(self.max_in_flight_per_owner),
            per_endpoint: n(self.max_in_flight_per_endpoint),
        }
    }

    /// How long a claim holds an event: the delivery's timeout and a margin.
    pub fn lease_ms(&self) -> i64 {
        ms(self.timeout_ms).saturating_add(5_000)
    }

    pub fn retry_for_ms(&self) -> i64 {
        ms(self.retry_for_seconds.saturating_mul(1000))
    }

    pub fn overlap_ms(&self) -> i64 {
        ms(self.rotation_overlap_seconds.saturating_mul(1000))
    }

    /// `(key, message)` for a value out of range.
    pub fn check(&self) -> Result<(), (String, String)> {
        let bad = |key: &str, message: &str| Err((format!("webhooks.{key}"), message.to_owned()));
        if !(100..=120_000).contains(&self.timeout_ms) {
            return bad("timeout_ms", "must be between 100 and 120000");
        }
        if self.backoff_initial_ms == 0 || self.backoff_initial_ms > self.backoff_max_ms {
            return bad(
                "backoff_initial_ms",
                "must be at least 1 and at most backoff_max_ms",
            );
        }
        if self.backoff_max_ms > 86_400_000 {
            return bad("backoff_max_ms", "must be at most 86400000 (a day)");
        }
        if !(1..=MAX_RETRY_FOR_SECONDS).contains(&self.retry_for_seconds) {
            return bad(
                "retry_for_seconds",
                "must be between 1 and 2592000 (30 days)",
            );
        }
        if self.rotation_overlap_seconds > MAX_RETRY_FOR_SECONDS {
            return bad(
                "rotation_overlap_seconds",
                "must be at most 2592000 (30 days)",
            );
        }
        if self.disable_after_failures == 0 {
            return bad("disable_after_failures", "must be at least 1");
        }
        if self.disable_after_seconds > MAX_RETRY_FOR_SECONDS {
            return bad("disable_after_seconds", "must be at most 2592000 (30 days)");
        }
        if !(10..=60_000).contains(&self.poll_interval_ms) {
            return bad("poll_interval_ms", "must be between 10 and 60000");
        }
        if !(1..=256).contains(&self.batch_size) {
            return bad("batch_size", "must be between 1 and 256");
        }
        if !(1..=self.batch_size).contains(&self.max_in_flight_per_owner) {
            return bad(
                "max_in_flight_per_owner",
                "must be at least 1 and at most batch_size",
            );
        }
        if !(1..=self.max_in_flight_per_owner).contains(&self.max_in_flight_per_endpoint) {
            return bad(
                "max_in_flight_per_endpoint",
                "must be at least 1 and at most max_in_flight_per_owner",
            );
        }
        if !(1..=1000).contains(&self.max_endpoints_per_owner) {
            return bad("max_endpoints_per_owner", "must be between 1 and 1000");
        }
        Ok(())
    }
}

/// The longest retry window an endpoint may ask for: 30 days.
pub const MAX_RETRY_FOR_SECONDS: u64 = 2_592_000;

fn ms(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The section resolved: its settings and, when `signing_key_env` names
/// one, the server's webhook key.
#[derive(Debug, Clone, Default)]
pub struct WebhookConfig {
    pub settings: WebhookSettings,
    /// `None`: webhooks are off (no key configured, or a command that
    /// reads no secrets).
    pub key: Option<WebhookKey>,
}
