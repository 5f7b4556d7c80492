//! Providers: where attempts are sent. Each call ends in one of three outcomes,
//! and only a definite failure allows automatic failover (DESIGN.md §5); the
//! table is in [`classify`].

pub mod classify;
pub mod http;
pub mod simulated;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::config::{Config, ProviderConfig, ProviderKind};
use crate::tasks::TaskSpec;
use http::{HttpCall, HttpProvider};
use simulated::SimulatedProvider;

/// What the worker (or a qualification run) sends: the job's intent under the
/// attempt's own identity.
#[derive(Clone)]
pub struct ProviderRequest {
    /// Sent as `Idempotency-Key` and `X-Request-Id`.
    pub attempt_id: String,
    pub attempt_number: i32,
    pub job_id: String,
    pub task: Arc<TaskSpec>,
    pub input: Value,
    pub params: Value,
    /// Overrides the provider's temperature (qualification uses the task's).
    pub temperature: Option<f64>,
    /// Where and with which secret the provider may call back late.
    pub callback: Option<CallbackTarget>,
}

/// A callback URL and the attempt's secret, sent to providers that answer
/// asynchronously (`callbacks = true`).
#[derive(Clone)]
pub struct CallbackTarget {
    pub url: String,
    pub secret: String,
}

/// How a provider call ended.
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderOutcome {
    /// A usable answer (JSON that satisfies the task's output schema).
    Succeeded(Value),
    /// The provider surely did not do the work, or answered unusably
    /// (`invalid_output`); failover is allowed.
    Failed(String),
    /// The request may have been acted on, but no usable answer came
    /// (connection lost after sending, 5xx, truncated body). The attempt
    /// becomes `unknown`.
    Unknown(String),
}

/// A configured provider with its timing rules.
pub struct Provider {
    pub name: String,
    pub config: ProviderConfig,
    /// Past this the attempt becomes `unknown`.
    pub soft_timeout: Duration,
    /// How much longer a timed-out call is kept open for a late answer.
    pub late_result_window: Duration,
    client: ProviderClient,
}

enum ProviderClient {
    Simulated(SimulatedProvider),
    Http(HttpProvider),
}

impl Provider {
    fn from_config(config: &ProviderConfig) -> Self {
        let client = match config.kind {
            ProviderKind::Simulated => {
                ProviderClient::Simulated(SimulatedProvider::from_config(config))
            }
            ProviderKind::Openai | ProviderKind::Anthropic => {
                ProviderClient::Http(HttpProvider::from_config(config))
            }
        };
        Self {
            name: config.name.clone(),
            config: config.clone(),
            soft_timeout: Duration::from_millis(config.timeout_ms),
            late_result_window: Duration::from_millis(config.late_result_ms),
            client,
        }
    }

    /// Sends the request and waits for the answer, however long it takes (the
    /// worker applies the soft timeout and the late-result window around this),
    /// then checks the answer against the task's output schema.
    pub async fn call(&self, request: &ProviderRequest) -> ProviderOutcome {
        let outcome = match &self.client {
            ProviderClient::Simulated(sim) => sim.call(&self.name, request).await,
            ProviderClient::Http(http) => {
                let prompt = match request.task.render_prompt(&request.input) {
                    Ok(prompt) => prompt,
                    // Nothing was sent: definite.
                    Err(reason) => return ProviderOutcome::Failed(reason),
                };
                let call = HttpCall {
                    request_id: &request.attempt_id,
                    task: &request.task.config.name,
                    prompt: &prompt,
                    output_schema: request.task.config.output_schema.as_ref(),
                    temperature: request.temperature,
                    callback: request.callback.as_ref(),
                };
                http.call(&call).await
            }
        };
        match outcome {
            ProviderOutcome::Succeeded(answer) => match request.task.check_output(&answer) {
                Ok(()) => ProviderOutcome::Succeeded(answer),
                Err(reason) => ProviderOutcome::Failed(format!("invalid_output: {reason}")),
            },
            other => other,
        }
    }

    /// When the provider asked (`Retry-After`) not to be called before.
    pub fn not_before(&self) -> Option<tokio::time::Instant> {
        match &self.client {
            ProviderClient::Simulated(_) => None,
            ProviderClient::Http(http) => http.not_before(),
        }
    }

    /// Attempt ids this provider has been sent, in order (kept in memory by the
    /// simulated provider; empty for others).
    pub fn sent_attempts(&self) -> Vec<String> {
        match &self.client {
            ProviderClient::Simulated(sim) => sim.sent_attempts(),
            ProviderClient::Http(_) => Vec::new(),
        }
    }
}

/// All configured providers, by name.
#[derive(Clone)]
pub struct Providers {
    by_name: Arc<HashMap<String, Arc<Provider>>>,
}

impl Providers {
    pub fn from_config(config: &Config) -> Self {
        let by_name = config
            .providers
            .iter()
            .map(|p| (p.name.clone(), Arc::new(Provider::from_config(p))))
            .collect();
        Self {
            by_name: Arc::new(by_name),
        }
    }

    pub fn get(&self, name: &str) -> Option<Arc<Provider>> {
        self.by_name.get(name).cloned()
    }
}
