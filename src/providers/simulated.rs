//! The `simulated` provider: offline and deterministic, so that the demo and the
//! tests need no API key. It answers JSON that names the provider and a digest
//! of the input, after `latency_ms`, unless told to fail; a script can give one
//! attempt number of a job its own behaviour.

use std::sync::Mutex;
use std::time::Duration;

use serde_json::json;

use super::{ProviderOutcome, ProviderRequest};
use crate::config::{ProviderConfig, ScriptStep, SimulatedFailure};
use crate::domain::fingerprint::{canonical_json, sha256_hex};

pub struct SimulatedProvider {
    latency: Duration,
    fail: SimulatedFailure,
    script: Vec<ScriptStep>,
    sent: Mutex<Vec<String>>,
}

impl SimulatedProvider {
    pub fn from_config(config: &ProviderConfig) -> Self {
        Self {
            latency: Duration::from_millis(config.latency_ms),
            fail: config.fail,
            script: config.script.clone(),
            sent: Mutex::new(Vec::new()),
        }
    }

    /// The behaviour for this attempt number: its script step, else the defaults.
    fn behaviour(&self, attempt_number: i32) -> (Duration, SimulatedFailure) {
        let step = self
            .script
            .iter()
            .find(|s| i64::from(s.attempt) == i64::from(attempt_number));
        let latency = step
            .and_then(|s| s.latency_ms)
            .map(Duration::from_millis)
            .unwrap_or(self.latency);
        let fail = step.and_then(|s| s.fail).unwrap_or(self.fail);
        (latency, fail)
    }

    pub async fn call(&self, provider_name: &str, request: &ProviderRequest) -> ProviderOutcome {
        // The log holds job attempts only; qualification calls (number 0) are not attempts.
        if request.attempt_number >= 1 {
            self.sent
                .lock()
                .expect("sent log lock")
                .push(request.attempt_id.clone());
        }
        let (latency, fail) = self.behaviour(request.attempt_number);
        match fail {
            SimulatedFailure::Definite => {
                tokio::time::sleep(latency).await;
                ProviderOutcome::Failed(format!("{provider_name} refused the request (simulated)"))
            }
            SimulatedFailure::TimeoutForever => std::future::pending().await,
            SimulatedFailure::None => {
                tokio::time::sleep(latency).await;
                ProviderOutcome::Succeeded(answer(provider_name, request))
            }
        }
    }

    pub fn sent_attempts(&self) -> Vec<String> {
        self.sent.lock().expect("sent log lock").clone()
    }
}

/// The deterministic answer: the same input always gives the same JSON.
fn answer(provider_name: &str, request: &ProviderRequest) -> serde_json::Value {
    let digest = sha256_hex(canonical_json(&request.input).as_bytes());
    json!({
        "provider": provider_name,
        "task": request.task.config.name,
        "input_sha256": digest,
        "summary": format!("simulated {} of input {}", request.task.config.name, &digest[..12]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ProviderKind;

    fn config(script: Vec<ScriptStep>) -> ProviderConfig {
        ProviderConfig {
            name: "sim".into(),
            kind: ProviderKind::Simulated,
            timeout_ms: 1000,
            late_result_ms: 1000,
            latency_ms: 1,
            fail: SimulatedFailure::None,
            script,
            base_url: None,
            model: None,
            api_key_env: None,
            connect_timeout_ms: 1000,
            max_tokens: 100,
            temperature: None,
            context_tokens: None,
            callbacks: false,
        }
    }

    fn request(number: i32, input: serde_json::Value) -> ProviderRequest {
        let config = crate::config::Config::load(None).unwrap();
        ProviderRequest {
            attempt_id: format!("attempt-{number}"),
            attempt_number: number,
            job_id: "job".into(),
            task: crate::tasks::Tasks::from_config(&config)
                .get("summarize")
                .unwrap(),
            input,
            params: json!({}),
            temperature: None,
            callback: None,
        }
    }

    #[tokio::test]
    async fn answers_are_deterministic_and_name_the_provider() {
        let sim = SimulatedProvider::from_config(&config(vec![]));
        let a = sim
            .call("sim", &request(1, json!({"text": "hi", "n": 1})))
            .await;
        let b = sim
            .call("sim", &request(2, json!({"n": 1, "text": "hi"})))
            .await;
        assert_eq!(a, b);
        let ProviderOutcome::Succeeded(value) = a else {
            panic!("expected success")
        };
        assert_eq!(value["provider"], "sim");
        assert_eq!(value["input_sha256"].as_str().unwrap().len(), 64);
    }

    #[tokio::test]
    async fn a_script_step_overrides_one_attempt_number() {
        let sim = SimulatedProvider::from_config(&config(vec![ScriptStep {
            attempt: 2,
            latency_ms: None,
            fail: Some(SimulatedFailure::Definite),
        }]));
        assert!(matches!(
            sim.call("sim", &request(1, json!({}))).await,
            ProviderOutcome::Succeeded(_)
        ));
        assert!(matches!(
            sim.call("sim", &request(2, json!({}))).await,
            ProviderOutcome::Failed(_)
        ));
        assert_eq!(sim.sent_attempts(), ["attempt-1", "attempt-2"]);
    }

    #[tokio::test]
    async fn timeout_forever_never_answers() {
        let mut cfg = config(vec![]);
        cfg.fail = SimulatedFailure::TimeoutForever;
        let sim = SimulatedProvider::from_config(&cfg);
        let req = request(1, json!({}));
        let call = sim.call("sim", &req);
        assert!(tokio::time::timeout(Duration::from_millis(50), call)
            .await
            .is_err());
    }
}
