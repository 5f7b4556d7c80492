//! The configuration file as written: its sections, with their defaults.

use serde::Deserialize;

use crate::contracts::TaskDefinition;
use crate::providers::ProviderSettings;
use crate::store::DatabaseSettings;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    #[serde(default)]
    pub server: ServerSettings,
    #[serde(default)]
    pub database: DatabaseSettings,
    #[serde(default)]
    pub worker: WorkerSettings,
    #[serde(default)]
    pub retention: RetentionSettings,
    #[serde(default)]
    pub webhooks: super::webhooks::WebhookSettings,
    #[serde(default)]
    pub ledger: super::ledger::LedgerSettings,
    #[serde(default)]
    pub telemetry: super::telemetry::TelemetrySettings,
    #[serde(default)]
    pub providers: Vec<ProviderSettings>,
    #[serde(default)]
    pub tasks: Vec<TaskDefinition>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSettings {
    pub bind: String,
    /// A second address that serves only `/metrics`, without a token, for a
    /// Prometheus on a private network; unset (the default) means metrics
    /// are read on `bind` with an admin's API token.
    pub metrics_bind: Option<String>,
    /// Largest accepted request body, in bytes.
    pub body_limit_bytes: usize,
    /// The deepest a client's JSON may nest (arrays and objects), checked
    /// before anything walks it: deeper is refused with 422
    /// `nesting-too-deep`. 1 to 128.
    pub max_json_depth: usize,
    /// How long a request body may take to arrive once its headers have;
    /// a slower one is answered 408 and its connection closed.
    pub body_timeout_ms: u64,
    /// HTTP worker threads; 0 means one per CPU core.
    pub http_workers: usize,
    /// Threads of the runtime that carries provider calls, streams,
    /// webhooks and timers (HTTP has its own workers, the database a
    /// blocking pool); 0 means a quarter of the CPU cores, at least one.
    /// See [`ServerSettings::async_threads`].
    pub async_threads: usize,
    /// How long a graceful shutdown waits for in-flight requests and calls.
    /// 0 (the default) means: the longest provider soft timeout plus 2 s,
    /// and at least 10 s. A value shorter than some provider's `timeout_ms`
    /// is refused: a deploy would cut calls off before they could answer.
    pub shutdown_grace_ms: u64,
    /// How long a browser sign-in lasts.
    pub session_hours: u64,
    /// How many passwords may be hashed at once (sign-ins, resets); 0 means
    /// half the CPU cores, at least one. A sign-in finding every slot busy
    /// answers 503 with Retry-After.
    pub password_hashing_concurrency: usize,
    /// The address providers reach this server at, for callback URLs
    /// (e.g. `https://onejob.example.com`).
    pub public_url: Option<String>,
    /// The environment variable holding the key that per-attempt callback
    /// secrets are derived from; unset means callbacks are off.
    pub callback_secret_env: Option<String>,
    /// How old a signed callback's timestamp may be (and how far ahead of
    /// this server's clock), in seconds; older ones are refused.
    pub callback_window_seconds: u64,
    /// Whether cookies are `Secure` (with the `__Host-` prefix); default: on
    /// when `public_url` is https.
    pub secure_cookies: Option<bool>,
    /// Reverse proxies whose `X-Forwarded-For` is believed (their IP
    /// addresses); from anyone else, the socket's address is the client's.
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// The longest a request may wait for its job to finish: `Prefer: wait=N`
    /// on the jobs API is capped to it, and a chat completion waits this long
    /// before answering 503 (retry: the retry rejoins the same job).
    pub max_wait_seconds: u64,
    /// The most requests following one job's stream at once in this
    /// process (chat completions with `stream: true` under its key, and job
    /// pages): one past it is refused (429 on `/v1`, a message on the page).
    pub max_followers_per_job: usize,
    /// The most bytes of released deltas one stream holds in this process's
    /// memory for its followers: a streamed answer that would pass it is
    /// refused as too large (`invalid_output`), and its clients get a
    /// terminal error event.
    pub max_stream_bytes: usize,
    /// How long a followed stream may stay silent before a keep-alive
    /// comment is sent: it keeps proxies from closing a quiet stream, and a
    /// client that hung up is noticed (and its place given back) when the
    /// write fails.
    pub stream_keepalive_ms: u64,
    /// Allows `http://` for a non-loopback `public_url` or provider
    /// `base_url` (keys and callback secrets would travel in clear text).
    pub allow_insecure_http: bool,
}

/// The most threads `server.async_threads` may ask for.
pub const MAX_ASYNC_THREADS: usize = 256;

impl ServerSettings {
    /// The async runtime's threads: as configured, else a quarter of the
    /// CPU cores, at least one. Each hand-off between two of its threads
    /// is a wake-up of a sleeping one; at one request at a time, one
    /// thread answered the `/v1` door on SQLite with 12–21 % less CPU per
    /// call than two on a 2-core machine (docs/benchmarks.md), and the
    /// runtime's work (provider calls, timers) is light beside HTTP's and
    /// the database's, which run on threads of their own.
    pub fn async_threads(&self) -> usize {
        match self.async_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| (n.get() / 4).max(1)),
            configured => configured,
        }
    }

    /// Whether cookies carry `Secure`.
    pub fn secure_cookies(&self) -> bool {
        self.secure_cookies.unwrap_or_else(|| {
            self.public_url
                .as_deref()
                .is_some_and(|url| url.starts_with("https://"))
        })
    }
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            bind: "127.0.0.1:8080".into(),
            metrics_bind: None,
            body_limit_bytes: 64 * 1024,
            max_json_depth: crate::domain::json_depth::DEFAULT_MAX_NESTING,
            body_timeout_ms: 10_000,
            http_workers: 0,
            async_threads: 0,
            shutdown_grace_ms: 0,
            session_hours: 12,
            password_hashing_concurrency: 0,
            public_url: None,
            callback_secret_env: None,
            callback_window_seconds: 300,
            secure_cookies: None,
            trusted_proxies: Vec::new(),
            max_wait_seconds: 60,
            max_followers_per_job: 64,
            max_stream_bytes: 1024 * 1024,
            stream_keepalive_ms: 15_000,
            allow_insecure_http: false,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerSettings {
    /// Attempts this process sends at once; 0 means this process only serves
    /// HTTP (it still reaps expired leases).
    pub concurrency: usize,
    /// How often an idle worker looks for queued attempts written by other processes.
    pub poll_interval_ms: u64,
    /// How long a claim on a running attempt lasts without renewal. A process that
    /// dies leaves its running attempts `unknown` once this passes.
    pub lease_ms: u64,
    /// While attempts are known to be queued, how long a claim waits for a
    /// quarter of the slots (at most 16) to free, so that one claiming
    /// transaction takes several attempts instead of one per freed slot.
    pub claim_gather_ms: u64,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            concurrency: 4,
            poll_interval_ms: 250,
            lease_ms: 30_000,
            claim_gather_ms: 2,
        }
    }
}

/// How long finished work and the logs are kept, in days. A window left out
/// keeps everything (the default).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionSettings {
    /// Days a finished (succeeded or failed) job, its attempts and its
    /// idempotency key are kept after it finished; then the key may make a
    /// new job. A job with race- or audit-log entries is kept while they are.
    pub jobs_days: Option<u32>,
    /// Days a race-log entry is kept after the race.
    pub races_days: Option<u32>,
    /// Days an audit-log entry is kept after the action.
    pub audit_days: Option<u32>,
}

impl RetentionSettings {
    /// The longest window accepted: a century.
    pub const MAX_DAYS: u32 = 36_500;

    /// Whether any window is set (else nothing is ever pruned).
    pub fn prunes_anything(&self) -> bool {
        self.jobs_days.is_some() || self.races_days.is_some() || self.audit_days.is_some()
    }

    /// The windows with their keys, for checks and reports.
    pub fn windows(&self) -> [(&'static str, Option<u32>); 3] {
        [
            ("retention.jobs_days", self.jobs_days),
            ("retention.races_days", self.races_days),
            ("retention.audit_days", self.audit_days),
        ]
    }
}
