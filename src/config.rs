//! Configuration: one TOML file (`--config FILE` or `ONEJOB_CONFIG`), or the
//! built-in default below so that no file is needed to start. Every key is
//! documented in `docs/configuration.md`.
//!
//! Precedence for the two settings that also come from the environment:
//! `--bind` > `ONEJOB_BIND` > `[server] bind`; `DATABASE_URL` > `[database] url`.

use std::collections::HashSet;
use std::path::Path;

use serde::Deserialize;

/// The configuration used when no file is given: two simulated providers and one task.
pub const DEFAULT_CONFIG_TOML: &str = include_str!("default_config.toml");

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub database: DatabaseConfig,
    #[serde(default)]
    pub worker: WorkerConfig,
    #[serde(default)]
    pub providers: Vec<ProviderConfig>,
    #[serde(default)]
    pub tasks: Vec<TaskConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub bind: String,
    /// Largest accepted request body, in bytes.
    pub body_limit_bytes: usize,
    /// HTTP worker threads; 0 means one per CPU core.
    pub http_workers: usize,
    /// How long a graceful shutdown waits for in-flight requests and calls.
    pub shutdown_grace_ms: u64,
    /// How long a browser sign-in lasts.
    pub session_hours: u64,
    /// The address providers reach this server at, for callback URLs
    /// (e.g. `https://onejob.example.com`).
    pub public_url: Option<String>,
    /// The environment variable holding the key that per-attempt callback
    /// secrets are derived from; unset means callbacks are off.
    pub callback_secret_env: Option<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            bind: "127.0.0.1:8080".into(),
            body_limit_bytes: 64 * 1024,
            http_workers: 0,
            shutdown_grace_ms: 10_000,
            session_hours: 12,
            public_url: None,
            callback_secret_env: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SqliteSynchronous {
    /// A 2xx means the row is on disk, even across a power loss.
    Full,
    /// Faster; a power loss may lose the last transactions (never corrupts).
    Normal,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    /// `postgres://…` or a SQLite file path.
    pub url: String,
    pub pool_size: u32,
    /// How long a request waits for a pooled connection before answering 503.
    pub pool_timeout_ms: u64,
    /// SQLite `busy_timeout`: how long a writer waits for the write lock.
    pub sqlite_busy_timeout_ms: u64,
    pub sqlite_synchronous: SqliteSynchronous,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: "onejob.db".into(),
            pool_size: 8,
            pool_timeout_ms: 5_000,
            sqlite_busy_timeout_ms: 5_000,
            sqlite_synchronous: SqliteSynchronous::Full,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// Attempts this process sends at once; 0 means this process only serves
    /// HTTP (it still reaps expired leases).
    pub concurrency: usize,
    /// How often an idle worker looks for queued attempts written by other processes.
    pub poll_interval_ms: u64,
    /// How long a claim on a running attempt lasts without renewal. A process that
    /// dies leaves its running attempts `unknown` once this passes.
    pub lease_ms: u64,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            concurrency: 4,
            poll_interval_ms: 250,
            lease_ms: 15_000,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// Offline and deterministic: answers JSON naming the provider and a digest of the input.
    Simulated,
    /// OpenAI-compatible chat completions (`/v1/chat/completions`): OpenAI, vLLM,
    /// llama.cpp server, Ollama, OpenRouter, …
    Openai,
    /// Anthropic messages (`/v1/messages`).
    Anthropic,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Simulated => "simulated",
            Self::Openai => "openai",
            Self::Anthropic => "anthropic",
        }
    }

    pub fn is_http(self) -> bool {
        !matches!(self, Self::Simulated)
    }
}

/// How a simulated provider misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SimulatedFailure {
    #[default]
    None,
    /// Refuses the call: a definite failure.
    Definite,
    /// Never answers.
    TimeoutForever,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    pub name: String,
    pub kind: ProviderKind,
    /// Soft timeout: past it the attempt becomes `unknown`.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// How long a timed-out call may still answer (its answer goes through the CAS).
    #[serde(default = "default_late_result_ms")]
    pub late_result_ms: u64,
    /// Simulated: how long an answer takes.
    #[serde(default = "default_latency_ms")]
    pub latency_ms: u64,
    /// Simulated: the failure mode.
    #[serde(default)]
    pub fail: SimulatedFailure,
    /// Simulated: behaviour for particular attempt numbers of a job.
    #[serde(default)]
    pub script: Vec<ScriptStep>,
    /// HTTP kinds: the server root; `/v1/chat/completions` or `/v1/messages` is appended.
    pub base_url: Option<String>,
    /// HTTP kinds: the model name sent with each request.
    pub model: Option<String>,
    /// HTTP kinds: the environment variable holding the API key (never stored or shown).
    pub api_key_env: Option<String>,
    /// HTTP kinds: how long establishing a connection may take (a failure here is definite).
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    /// Sampling temperature for ordinary calls; qualification uses the task's.
    pub temperature: Option<f64>,
    /// The context budget in tokens (prompt + max_tokens must fit).
    pub context_tokens: Option<u32>,
    /// HTTP kinds: send a callback URL and a per-attempt secret with each call,
    /// for providers that answer asynchronously.
    #[serde(default)]
    pub callbacks: bool,
}

fn default_connect_timeout_ms() -> u64 {
    5_000
}
fn default_max_tokens() -> u32 {
    1_024
}

impl ProviderConfig {
    /// The context budget: configured, else the kind's usual window.
    pub fn context_budget(&self) -> u32 {
        self.context_tokens.unwrap_or(match self.kind {
            ProviderKind::Simulated => 1_000_000,
            ProviderKind::Openai => 128_000,
            ProviderKind::Anthropic => 200_000,
        })
    }

    /// The model a qualification is bound to (`simulated` for the simulated kind).
    pub fn model_name(&self) -> &str {
        self.model.as_deref().unwrap_or("simulated")
    }
}

fn default_timeout_ms() -> u64 {
    30_000
}
fn default_late_result_ms() -> u64 {
    60_000
}
fn default_latency_ms() -> u64 {
    200
}

/// Overrides a simulated provider's behaviour for one attempt number.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptStep {
    pub attempt: u32,
    pub latency_ms: Option<u64>,
    pub fail: Option<SimulatedFailure>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskConfig {
    pub name: String,
    /// Primary first, then fallbacks.
    pub providers: Vec<String>,
    /// Input fields that must be present as non-empty strings (and the fields
    /// of the browser form).
    #[serde(default)]
    pub input_fields: Vec<String>,
    /// The prompt: a minijinja template over the input's fields, with strict
    /// undefined variables. Required when the chain has an HTTP provider.
    pub template: Option<String>,
    /// A JSON Schema every input must satisfy.
    pub input_schema: Option<serde_json::Value>,
    /// A JSON Schema every answer must satisfy (else the attempt fails with
    /// `invalid_output`); also sent as the structured-output format.
    pub output_schema: Option<serde_json::Value>,
    /// The low temperature used for qualification.
    #[serde(default)]
    pub temperature: f64,
    /// Examples that qualification runs: an input and expectations on the answer.
    #[serde(default)]
    pub golden: Vec<GoldenExample>,
}

/// A golden example: `expect` maps JSON Pointers into the answer (e.g.
/// `"/sentiment"`) to the value they must hold.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GoldenExample {
    pub input: serde_json::Value,
    #[serde(default)]
    pub expect: std::collections::BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read configuration file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("configuration {origin}: {source}")]
    Parse {
        origin: String,
        source: Box<toml::de::Error>,
    },
    #[error("configuration {origin}: `{key}`: {message}")]
    Invalid {
        origin: String,
        key: String,
        message: String,
    },
}

impl Config {
    /// Loads the file if one is given, else the built-in default, and validates it.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        match path {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.display().to_string(),
                    source,
                })?;
                Self::from_toml(&text, &path.display().to_string())
            }
            None => Self::from_toml(DEFAULT_CONFIG_TOML, "(built-in default)"),
        }
    }

    pub fn from_toml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|source| ConfigError::Parse {
            origin: origin.into(),
            source: Box::new(source),
        })?;
        config
            .validate()
            .map_err(|(key, message)| ConfigError::Invalid {
                origin: origin.into(),
                key,
                message,
            })?;
        Ok(config)
    }

    pub fn provider(&self, name: &str) -> Option<&ProviderConfig> {
        self.providers.iter().find(|p| p.name == name)
    }

    pub fn task(&self, name: &str) -> Option<&TaskConfig> {
        self.tasks.iter().find(|t| t.name == name)
    }

    /// The order in which a job of `task` tries providers: the one the user named
    /// first (if any), then the task's chain. Empty for an unknown task.
    pub fn failover_order(&self, task: &str, requested: Option<&str>) -> Vec<String> {
        self.task(task)
            .map(|t| crate::domain::failover_order(&t.providers, requested))
            .unwrap_or_default()
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    /// Checks what serde cannot; the error names the offending key.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let invalid = |key: String, message: &str| Err((key, message.to_owned()));
        if self.server.body_limit_bytes == 0 {
            return invalid("server.body_limit_bytes".into(), "must be greater than 0");
        }
        if let Some(var) = &self.server.callback_secret_env {
            if std::env::var(var).map_or(true, |v| v.is_empty()) {
                return invalid(
                    "server.callback_secret_env".into(),
                    &format!("the environment variable {var} is not set"),
                );
            }
            if self.server.public_url.is_none() {
                return invalid(
                    "server.public_url".into(),
                    "callbacks need the URL providers reach this server at",
                );
            }
        }
        if self.server.session_hours == 0 {
            return invalid("server.session_hours".into(), "must be at least 1");
        }
        if self.database.pool_size == 0 {
            return invalid("database.pool_size".into(), "must be at least 1");
        }
        if self.database.pool_timeout_ms == 0 {
            return invalid("database.pool_timeout_ms".into(), "must be greater than 0");
        }
        if self.worker.lease_ms < 1_000 {
            return invalid("worker.lease_ms".into(), "must be at least 1000");
        }
        if self.worker.poll_interval_ms == 0 {
            return invalid("worker.poll_interval_ms".into(), "must be greater than 0");
        }
        let mut names = HashSet::new();
        for (i, provider) in self.providers.iter().enumerate() {
            if !is_valid_name(&provider.name) {
                return invalid(
                    format!("providers[{i}].name"),
                    "must be 1-64 characters of a-z, 0-9, '-', '_' or '.'",
                );
            }
            if !names.insert(provider.name.as_str()) {
                return invalid(format!("providers[{i}].name"), "duplicate provider name");
            }
            if provider.timeout_ms == 0 {
                return invalid(
                    format!("providers[{i}].timeout_ms"),
                    "must be greater than 0",
                );
            }
            if provider.kind.is_http() {
                match &provider.base_url {
                    Some(url) if url.starts_with("http://") || url.starts_with("https://") => {}
                    _ => {
                        return invalid(
                            format!("providers[{i}].base_url"),
                            "an http:// or https:// URL is required",
                        )
                    }
                }
                if provider.model.as_deref().is_none_or(str::is_empty) {
                    return invalid(format!("providers[{i}].model"), "a model name is required");
                }
            }
            if let Some(var) = &provider.api_key_env {
                if std::env::var(var).map_or(true, |v| v.is_empty()) {
                    return invalid(
                        format!("providers[{i}].api_key_env"),
                        &format!("the environment variable {var} is not set"),
                    );
                }
            }
            if let Some(t) = provider.temperature {
                if !(0.0..=2.0).contains(&t) {
                    return invalid(
                        format!("providers[{i}].temperature"),
                        "must be between 0 and 2",
                    );
                }
            }
            for (j, step) in provider.script.iter().enumerate() {
                if step.attempt == 0 {
                    return invalid(
                        format!("providers[{i}].script[{j}].attempt"),
                        "attempt numbers start at 1",
                    );
                }
            }
        }
        if self.tasks.is_empty() {
            return invalid("tasks".into(), "at least one task is required");
        }
        let mut task_names = HashSet::new();
        for (i, task) in self.tasks.iter().enumerate() {
            if !is_valid_name(&task.name) {
                return invalid(
                    format!("tasks[{i}].name"),
                    "must be 1-64 characters of a-z, 0-9, '-', '_' or '.'",
                );
            }
            if !task_names.insert(task.name.as_str()) {
                return invalid(format!("tasks[{i}].name"), "duplicate task name");
            }
            if task.providers.is_empty() {
                return invalid(
                    format!("tasks[{i}].providers"),
                    "name at least one provider",
                );
            }
            crate::tasks::check_task(task)
                .map_err(|(key, message)| (format!("tasks[{i}].{key}"), message))?;
            let mut seen = HashSet::new();
            for (j, name) in task.providers.iter().enumerate() {
                if self.provider(name).is_none() {
                    return invalid(
                        format!("tasks[{i}].providers[{j}]"),
                        &format!("no provider named {name:?} is configured"),
                    );
                }
                if !seen.insert(name) {
                    return invalid(format!("tasks[{i}].providers[{j}]"), "listed twice");
                }
                if self.provider(name).is_some_and(|p| p.kind.is_http()) && task.template.is_none()
                {
                    return invalid(
                        format!("tasks[{i}].template"),
                        &format!("provider {name:?} is an HTTP provider: the task needs a prompt template"),
                    );
                }
            }
        }
        Ok(())
    }
}

fn is_valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_default_is_valid_and_has_two_simulated_providers() {
        let config = Config::load(None).unwrap();
        assert_eq!(config.providers.len(), 2);
        assert!(config
            .providers
            .iter()
            .all(|p| p.kind == ProviderKind::Simulated));
        assert_eq!(
            config.task("summarize").unwrap().providers,
            ["sim-fast", "sim-slow"]
        );
        assert_eq!(config.database.sqlite_synchronous, SqliteSynchronous::Full);
    }

    fn invalid_key(toml: &str) -> String {
        match Config::from_toml(toml, "test") {
            Err(ConfigError::Invalid { key, .. }) => key,
            Err(ConfigError::Parse { source, .. }) => format!("parse: {source}"),
            other => panic!("expected an invalid configuration, got {other:?}"),
        }
    }

    #[test]
    fn a_task_naming_an_unknown_provider_is_refused_naming_the_key() {
        let toml = r#"
            [[providers]]
            name = "a"
            kind = "simulated"
            [[tasks]]
            name = "t"
            providers = ["a", "b"]
        "#;
        assert_eq!(invalid_key(toml), "tasks[0].providers[1]");
    }

    #[test]
    fn unknown_keys_are_refused_naming_the_key() {
        let toml = r#"
            [[providers]]
            name = "a"
            kind = "simulated"
            latncy_ms = 5
            [[tasks]]
            name = "t"
            providers = ["a"]
        "#;
        let message = invalid_key(toml);
        assert!(message.contains("latncy_ms"), "{message}");
    }

    #[test]
    fn duplicate_provider_names_are_refused() {
        let toml = r#"
            [[providers]]
            name = "a"
            kind = "simulated"
            [[providers]]
            name = "a"
            kind = "simulated"
            [[tasks]]
            name = "t"
            providers = ["a"]
        "#;
        assert_eq!(invalid_key(toml), "providers[1].name");
    }

    #[test]
    fn an_unknown_failure_mode_is_refused() {
        let toml = r#"
            [[providers]]
            name = "a"
            kind = "simulated"
            fail = "sometimes"
            [[tasks]]
            name = "t"
            providers = ["a"]
        "#;
        assert!(invalid_key(toml).contains("fail"));
    }
}
