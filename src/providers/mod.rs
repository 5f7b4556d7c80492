//! Providers: where attempts are sent. Each call ends in one of three outcomes,
//! and only a definite failure allows automatic failover (DESIGN.md §5).

pub mod simulated;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::config::{Config, ProviderConfig, ProviderKind};
use simulated::SimulatedProvider;

/// What the worker sends: the job's intent under the attempt's own identity.
#[derive(Debug, Clone)]
pub struct ProviderRequest {
    pub attempt_id: String,
    pub attempt_number: i32,
    pub job_id: String,
    pub task: String,
    pub input: Value,
    pub params: Value,
}

/// How a provider call ended.
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderOutcome {
    /// A usable answer.
    Succeeded(Value),
    /// The provider surely did not do the work (or answered unusably).
    Failed(String),
    /// The request may have been acted on, but no answer came (connection lost
    /// after sending, …). The attempt becomes `unknown`.
    Unknown(String),
}

/// A configured provider with its timing rules.
pub struct Provider {
    pub name: String,
    /// Past this the attempt becomes `unknown`.
    pub soft_timeout: Duration,
    /// How much longer a timed-out call is kept open for a late answer.
    pub late_result_window: Duration,
    client: ProviderClient,
}

enum ProviderClient {
    Simulated(SimulatedProvider),
}

impl Provider {
    fn from_config(config: &ProviderConfig) -> Self {
        let client = match config.kind {
            ProviderKind::Simulated => {
                ProviderClient::Simulated(SimulatedProvider::from_config(config))
            }
        };
        Self {
            name: config.name.clone(),
            soft_timeout: Duration::from_millis(config.timeout_ms),
            late_result_window: Duration::from_millis(config.late_result_ms),
            client,
        }
    }

    /// Sends the request and waits for the answer, however long it takes; the
    /// worker applies the soft timeout and late-result window around this.
    pub async fn call(&self, request: &ProviderRequest) -> ProviderOutcome {
        match &self.client {
            ProviderClient::Simulated(sim) => sim.call(&self.name, request).await,
        }
    }

    /// Attempt ids this provider has been sent, in order (a provider call log
    /// kept in memory by the simulated provider; empty for others).
    pub fn sent_attempts(&self) -> Vec<String> {
        match &self.client {
            ProviderClient::Simulated(sim) => sim.sent_attempts(),
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
