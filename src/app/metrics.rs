//! Prometheus metrics, one registry per application (so that several in one
//! process, as in tests, keep their own). Counters and histograms move as
//! things happen; the gauges about unknown attempts are read from the
//! database when `/metrics` is scraped. `docs/operations.md` lists every
//! series with example alert rules.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::{App, AppResult};
use crate::domain::{Applied, AttemptState, Timestamp};
use crate::store::console;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderLabel {
    pub provider: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AttemptLabels {
    pub provider: String,
    /// succeeded | failed | unknown | abandoned
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HeldLabels {
    pub provider: String,
    /// paused | at_capacity
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: String,
    /// The route's pattern (`/api/v1/jobs/{id}`), never the raw path.
    pub route: String,
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabel {
    /// followers | buffer
    pub limit: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// delivered | failed | refused
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TableLabel {
    /// jobs | attempts | race_log | audit_log
    pub table: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    pub provider: String,
    /// prompt | completion | cached (cached tokens are also prompt tokens)
    pub kind: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn label(provider: &str) -> ProviderLabel {
    ProviderLabel {
        provider: provider.to_owned(),
    }
}

fn seconds_histogram() -> Histogram {
    // 1 ms … about 65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Every series onejob exports.
pub struct Metrics {
    registry: Registry,
    pub jobs_created: Counter,
    pub jobs_replayed: Counter,
    pub key_conflicts: Counter,
    /// Jobs their owner cancelled (a repeated cancel is not counted).
    pub jobs_cancelled: Counter,
    pub twins_joined: Counter,
    /// Creations that took their token's check from this process's kept
    /// grants, confirmed by the creating transaction (`credentials`).
    pub token_checks_kept: Counter,
    pub attempts: Family<AttemptLabels, Counter>,
    pub races: Counter,
    pub provider_call_seconds: HistogramFamily<ProviderLabel>,
    pub claim_lag_seconds: Histogram,
    /// Claims that took at least one attempt, and the attempts they took:
    /// their quotient is the mean batch a claiming transaction carried.
    pub claims: Counter,
    pub claimed_attempts: Counter,
    pub pool_wait_seconds: Histogram,
    pub http_request_seconds: HistogramFamily<HttpLabels>,
    pub pruned_rows: Family<TableLabel, Counter>,
    pub provider_wait_seconds: HistogramFamily<ProviderLabel>,
    pub provider_pauses: Family<ProviderLabel, Counter>,
    pub provider_paused_seconds: Family<ProviderLabel, Counter<f64, AtomicU64>>,
    pub provider_held_back: Family<HeldLabels, Counter>,
    pub retries: Family<ProviderLabel, Counter>,
    pub late_calls_dropped: Family<ProviderLabel, Counter>,
    pub time_to_first_token_seconds: HistogramFamily<ProviderLabel>,
    /// Requests following a job's stream now, in this process.
    pub streams_followed: Gauge,
    pub stream_limits_hit: Family<LimitLabel, Counter>,
    unknown_attempts: Gauge,
    oldest_unknown_seconds: Gauge<f64, AtomicU64>,
    /// Webhook delivery attempts, by outcome.
    pub webhook_deliveries: Family<OutcomeLabel, Counter>,
    webhook_outbox_oldest_seconds: Gauge<f64, AtomicU64>,
    webhook_endpoints_disabled: Gauge,
    group_commits: Gauge,
    group_commit_rows: Gauge,
    /// Tokens of the calls in the usage ledger, by provider and kind.
    pub tokens: Family<TokenLabels, Counter>,
    /// Their cost in micro-units of `ledger.currency`, by provider.
    pub spend: Family<ProviderLabel, Counter>,
    /// Creations a budget refused.
    pub budget_refusals: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let metrics = Self {
            jobs_created: Counter::default(),
            jobs_replayed: Counter::default(),
            key_conflicts: Counter::default(),
            jobs_cancelled: Counter::default(),
            twins_joined: Counter::default(),
            token_checks_kept: Counter::default(),
            attempts: Family::default(),
            races: Counter::default(),
            provider_call_seconds: Family::new_with_constructor(seconds_histogram),
            claim_lag_seconds: seconds_histogram(),
            claims: Counter::default(),
            claimed_attempts: Counter::default(),
            pool_wait_seconds: seconds_histogram(),
            http_request_seconds: Family::new_with_constructor(seconds_histogram),
            pruned_rows: Family::default(),
            provider_wait_seconds: Family::new_with_constructor(seconds_histogram),
            provider_pauses: Family::default(),
            provider_paused_seconds: Family::default(),
            provider_held_back: Family::default(),
            retries: Family::default(),
            late_calls_dropped: Family::default(),
            time_to_first_token_seconds: Family::new_with_constructor(seconds_histogram),
            streams_followed: Gauge::default(),
            stream_limits_hit: Family::default(),
            unknown_attempts: Gauge::default(),
            oldest_unknown_seconds: Gauge::default(),
            webhook_deliveries: Family::default(),
            webhook_outbox_oldest_seconds: Gauge::default(),
            group_commits: Gauge::default(),
            group_commit_rows: Gauge::default(),
            webhook_endpoints_disabled: Gauge::default(),
            tokens: Family::default(),
            spend: Family::default(),
            budget_refusals: Counter::default(),
            registry: Registry::default(),
        };
        metrics.register_job_metrics(&mut registry);
        metrics.register_latency_metrics(&mut registry);
        metrics.register_provider_metrics(&mut registry);
        metrics.register_stream_and_unknown_metrics(&mut registry);
        metrics.register_webhook_metrics(&mut registry);
        metrics.register_commit_and_usage_metrics(&mut registry);
        registry.register(
            "onejob_trace_spans",
            "Finished spans of this process by fate, while traces are exported: exported, \
             dropped_queue_full (the export queue was full) or dropped_export_failed (the \
             collector refused, failed or outlasted the export timeout)",
            crate::telemetry::SPANS.clone(),
        );
        Self {
            registry,
            ..metrics
        }
    }

    /// Jobs: created, replayed, refused, cancelled, joined; attempts and races.
    fn register_job_metrics(&self, registry: &mut Registry) {
        registry.register(
            "onejob_jobs_created",
            "Jobs created (first requests under a key)",
            self.jobs_created.clone(),
        );
        registry.register(
            "onejob_jobs_replayed",
            "Requests answered with the job their key already made (same payload)",
            self.jobs_replayed.clone(),
        );
        registry.register(
            "onejob_idempotency_conflicts",
            "Requests refused because their key made a job with a different payload",
            self.key_conflicts.clone(),
        );
        registry.register(
            "onejob_jobs_cancelled",
            "Jobs their owner cancelled (each once, however often the cancel was repeated)",
            self.jobs_cancelled.clone(),
        );
        registry.register(
            "onejob_twins_joined",
            "Requests answered from the job a twin under the same key was creating in this \
             process, without a database round trip (also counted as replays or conflicts)",
            self.twins_joined.clone(),
        );
        registry.register(
            "onejob_token_checks_kept",
            "Job-creating requests whose bearer token was checked from this process's kept \
             grants, without a read of their own; the write that stores the job confirms that \
             the token still grants what it did",
            self.token_checks_kept.clone(),
        );
        registry.register(
            "onejob_attempts",
            "Attempts that reached a final or unknown state, by provider and state",
            self.attempts.clone(),
        );
        registry.register(
            "onejob_races",
            "Answers that did not win and were written to the race log",
            self.races.clone(),
        );
    }

    /// How long calls, claims, connections and HTTP requests took; what retention removed.
    fn register_latency_metrics(&self, registry: &mut Registry) {
        registry.register(
            "onejob_provider_call_seconds",
            "How long provider calls took to answer, by provider",
            self.provider_call_seconds.clone(),
        );
        registry.register(
            "onejob_claim_lag_seconds",
            "From an attempt being queued to it being sent",
            self.claim_lag_seconds.clone(),
        );
        registry.register(
            "onejob_claims",
            "Claiming transactions that took at least one queued attempt",
            self.claims.clone(),
        );
        registry.register(
            "onejob_claimed_attempts",
            "Queued attempts taken by claims (divided by onejob_claims_total: the mean batch)",
            self.claimed_attempts.clone(),
        );
        registry.register(
            "onejob_pool_wait_seconds",
            "How long a request waited for a database connection",
            self.pool_wait_seconds.clone(),
        );
        registry.register(
            "onejob_http_request_seconds",
            "HTTP requests, by method, route and status",
            self.http_request_seconds.clone(),
        );
        registry.register(
            "onejob_pruned_rows",
            "Rows retention removed, by table",
            self.pruned_rows.clone(),
        );
    }

    /// Providers' waits, pauses, limits, retries and dropped late calls.
    fn register_provider_metrics(&self, registry: &mut Registry) {
        registry.register(
            "onejob_provider_wait_seconds",
            "How long attempts waited from being due (created, or a retry's Retry-After over) to \
             being sent, by provider: grows while a provider's limits or pauses hold attempts \
             back (or every worker slot is busy)",
            self.provider_wait_seconds.clone(),
        );
        registry.register(
            "onejob_provider_pauses",
            "Pauses a provider asked for (429 or 529 with Retry-After; a 429 without one pauses 1 s)",
            self.provider_pauses.clone(),
        );
        registry.register(
            "onejob_provider_paused_seconds",
            "Seconds of pause providers asked for, in all",
            self.provider_paused_seconds.clone(),
        );
        registry.register(
            "onejob_provider_held_back",
            "Claims that found a provider paused or at one of its limits (max_in_flight, \
             requests_per_minute, tokens_per_minute) and passed its queued attempts, if any, over",
            self.provider_held_back.clone(),
        );
        registry.register(
            "onejob_retries",
            "Retries scheduled on the same provider after a refusal in which nothing happened",
            self.retries.clone(),
        );
        registry.register(
            "onejob_late_calls_dropped",
            "Timed-out calls dropped instead of kept open for a late answer, because \
             max_late_calls were open (their attempts stay unknown)",
            self.late_calls_dropped.clone(),
        );
    }

    /// Streams, and attempts whose outcome is unknown.
    fn register_stream_and_unknown_metrics(&self, registry: &mut Registry) {
        registry.register(
            "onejob_time_to_first_token_seconds",
            "From a streamed call's start to its first delta being released to the job's \
             followers, by provider",
            self.time_to_first_token_seconds.clone(),
        );
        registry.register(
            "onejob_streams_followed",
            "Requests following a job's stream now in this process (chat completions with \
             stream: true, job pages' live text)",
            self.streams_followed.clone(),
        );
        registry.register(
            "onejob_stream_limits_hit",
            "Stream limits reached: a follower refused past server.max_followers_per_job \
             (followers), a streamed answer refused past server.max_stream_bytes (buffer)",
            self.stream_limits_hit.clone(),
        );
        registry.register(
            "onejob_unknown_attempts",
            "Attempts whose outcome is unknown now (read at scrape time)",
            self.unknown_attempts.clone(),
        );
        registry.register(
            "onejob_oldest_unknown_attempt_age_seconds",
            "Age of the oldest unknown attempt since it was sent; 0 when there is none",
            self.oldest_unknown_seconds.clone(),
        );
    }

    /// Webhook deliveries, the outbox and disabled endpoints.
    fn register_webhook_metrics(&self, registry: &mut Registry) {
        registry.register(
            "onejob_webhook_deliveries",
            "Webhook delivery attempts by outcome: delivered (2xx), failed (another status, \
             a timeout, a connection error, a redirect), refused (the host resolved to an \
             address webhooks may not reach)",
            self.webhook_deliveries.clone(),
        );
        registry.register(
            "onejob_webhook_outbox_oldest_age_seconds",
            "How long the oldest undelivered, not dead webhook event of an enabled endpoint \
             has waited (read at scrape time); 0 when there is none",
            self.webhook_outbox_oldest_seconds.clone(),
        );
        registry.register(
            "onejob_webhook_endpoints_disabled",
            "Webhook endpoints disabled now, by their owner or for failing (read at scrape time)",
            self.webhook_endpoints_disabled.clone(),
        );
    }

    /// Group commits, and the usage ledger's tokens, spend and budget refusals.
    fn register_commit_and_usage_metrics(&self, registry: &mut Registry) {
        registry.register(
            "onejob_group_commits",
            "Commits (on PostgreSQL, multi-row statements) that carried batched writes since \
             the start (read at scrape time); with onejob_group_commit_rows, the writes each \
             flush carried",
            self.group_commits.clone(),
        );
        registry.register(
            "onejob_group_commit_rows",
            "Writes those commits carried: job creations (each creation, replay or refusal \
             once) and, on SQLite, compare-and-swaps",
            self.group_commit_rows.clone(),
        );
        registry.register(
            "onejob_tokens",
            "Tokens of the provider calls counted in the usage ledger (each call once, winners, \
             losers and late answers alike), by provider and kind: prompt, completion, and \
             cached (the prompt tokens read from the provider's cache, also counted as prompt)",
            self.tokens.clone(),
        );
        registry.register(
            "onejob_spend",
            "Cost of the provider calls counted in the usage ledger, in micro-units \
             (millionths) of ledger.currency, by provider; calls without a price add nothing",
            self.spend.clone(),
        );
        registry.register(
            "onejob_budget_refusals",
            "Job creations refused because the owner's monthly budget had no room",
            self.budget_refusals.clone(),
        );
    }

    /// Counts a call just written to the usage ledger.
    pub fn record_ledger(&self, entry: &crate::store::ledger::LedgerEntry) {
        let tokens = |kind: &str, count: i64| {
            self.tokens
                .get_or_create(&TokenLabels {
                    provider: entry.provider.clone(),
                    kind: kind.to_owned(),
                })
                .inc_by(count.max(0) as u64);
        };
        tokens("prompt", entry.prompt_tokens);
        tokens("completion", entry.completion_tokens);
        tokens("cached", entry.cached_tokens);
        if let Some(micros) = entry.cost_micros {
            self.spend
                .get_or_create(&label(&entry.provider))
                .inc_by(micros.max(0) as u64);
        }
    }

    /// Counts what applying an outcome did to an attempt.
    pub fn record_applied(&self, provider: &str, applied: &Applied) {
        let state = match applied {
            Applied::Won => AttemptState::Succeeded,
            Applied::Lost { .. } => {
                self.races.inc();
                AttemptState::Succeeded
            }
            Applied::Discarded(_) => {
                self.races.inc();
                return;
            }
            Applied::RetryScheduled { .. } => {
                self.retries.get_or_create(&label(provider)).inc();
                AttemptState::Failed
            }
            Applied::FailedOver { .. } | Applied::JobFailed { .. } | Applied::Recorded => {
                AttemptState::Failed
            }
            Applied::MarkedUnknown => AttemptState::Unknown,
            Applied::Superseded => AttemptState::Abandoned,
            Applied::Ignored(_) | Applied::Repeated(_) => return,
        };
        self.attempt_reached(provider, state);
    }

    /// A provider asked for a pause of `pause`.
    pub fn paused(&self, provider: &str, pause: Duration) {
        self.provider_pauses.get_or_create(&label(provider)).inc();
        self.provider_paused_seconds
            .get_or_create(&label(provider))
            .inc_by(pause.as_secs_f64());
    }

    /// A claim left this provider's due attempts queued.
    pub fn held_back(&self, provider: &str, paused: bool) {
        self.provider_held_back
            .get_or_create(&HeldLabels {
                provider: provider.to_owned(),
                reason: if paused { "paused" } else { "at_capacity" }.to_owned(),
            })
            .inc();
    }

    /// An attempt of `provider` reached `state`.
    pub fn attempt_reached(&self, provider: &str, state: AttemptState) {
        self.attempts
            .get_or_create(&AttemptLabels {
                provider: provider.to_owned(),
                state: state.as_str().to_owned(),
            })
            .inc();
    }

    /// Writes the series of each provider (and of each table retention
    /// prunes) at zero from the start: Prometheus reads a missing series as
    /// no data, so a rate or an alert over one would stay silent until its
    /// first event.
    pub fn start_at_zero<'a>(&self, providers: impl IntoIterator<Item = &'a str>) {
        for provider in providers {
            for state in [
                AttemptState::Succeeded,
                AttemptState::Failed,
                AttemptState::Unknown,
                AttemptState::Abandoned,
            ] {
                let _ = self.attempts.get_or_create(&AttemptLabels {
                    provider: provider.to_owned(),
                    state: state.as_str().to_owned(),
                });
            }
            let _ = self.provider_call_seconds.get_or_create(&label(provider));
            let _ = self.provider_wait_seconds.get_or_create(&label(provider));
            let _ = self.provider_pauses.get_or_create(&label(provider));
            let _ = self.provider_paused_seconds.get_or_create(&label(provider));
            let _ = self.retries.get_or_create(&label(provider));
            let _ = self.late_calls_dropped.get_or_create(&label(provider));
            let _ = self
                .time_to_first_token_seconds
                .get_or_create(&label(provider));
            for reason in ["paused", "at_capacity"] {
                let _ = self.provider_held_back.get_or_create(&HeldLabels {
                    provider: provider.to_owned(),
                    reason: reason.to_owned(),
                });
            }
        }
        for limit in ["followers", "buffer"] {
            let _ = self.stream_limits_hit.get_or_create(&LimitLabel {
                limit: limit.to_owned(),
            });
        }
        for outcome in crate::domain::webhook::DeliveryOutcome::ALL {
            let _ = self.webhook_deliveries.get_or_create(&OutcomeLabel {
                outcome: outcome.as_str().to_owned(),
            });
        }
        for table in ["jobs", "attempts", "race_log", "audit_log"] {
            let _ = self.pruned_rows.get_or_create(&TableLabel {
                table: table.to_owned(),
            });
        }
    }

    /// Counts one webhook delivery attempt.
    pub fn webhook_delivery(&self, outcome: crate::domain::webhook::DeliveryOutcome) {
        self.webhook_deliveries
            .get_or_create(&OutcomeLabel {
                outcome: outcome.as_str().to_owned(),
            })
            .inc();
    }

    pub fn count_pruned(&self, table: &str, rows: u64) {
        self.pruned_rows
            .get_or_create(&TableLabel {
                table: table.to_owned(),
            })
            .inc_by(rows);
    }

    pub fn observe_provider_call(&self, provider: &str, took: Duration) {
        self.provider_call_seconds
            .get_or_create(&ProviderLabel {
                provider: provider.to_owned(),
            })
            .observe(took.as_secs_f64());
    }

    /// A streamed attempt of `provider` released its first delta, `took`
    /// after its call started.
    pub fn first_token(&self, provider: &str, took: Duration) {
        self.time_to_first_token_seconds
            .get_or_create(&label(provider))
            .observe(took.as_secs_f64());
    }

    /// A stream limit (`followers` or `buffer`) refused something.
    pub fn stream_limit_hit(&self, limit: &str) {
        self.stream_limits_hit
            .get_or_create(&LimitLabel {
                limit: limit.to_owned(),
            })
            .inc();
    }

    pub fn observe_http(&self, method: &str, route: &str, status: u16, took: Duration) {
        self.http_request_seconds
            .get_or_create(&HttpLabels {
                method: method.to_owned(),
                route: route.to_owned(),
                status: status.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }
}

impl App {
    /// The metrics in the text exposition format, with the unknown-attempt
    /// gauges read from the database now (admins only; see `web`).
    pub async fn scrape_metrics(&self) -> AppResult<String> {
        let now = Timestamp::now();
        let (counts, oldest_webhook, disabled) = self
            .store()
            .run(move |conn| {
                Ok((
                    console::console_counts(conn, now)?,
                    crate::store::webhooks::oldest_pending(conn)?,
                    crate::store::webhooks::disabled_endpoints(conn)?,
                ))
            })
            .await?;
        let metrics = self.metrics();
        metrics.unknown_attempts.set(counts.unknown_now);
        metrics.oldest_unknown_seconds.set(
            counts
                .oldest_unknown_started_at
                .map_or(0.0, |t| (now - t).max(0) as f64 / 1000.0),
        );
        metrics
            .webhook_outbox_oldest_seconds
            .set(oldest_webhook.map_or(0.0, |t| (now - t).max(0) as f64 / 1000.0));
        metrics.webhook_endpoints_disabled.set(disabled);
        let (commits, rows) = self.store().group_commit_counts();
        metrics.group_commits.set(commits as i64);
        metrics.group_commit_rows.set(rows as i64);
        Ok(metrics.encode())
    }
}
