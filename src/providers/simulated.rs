//! The `simulated` provider: offline and deterministic, so that the demo and the
//! tests need no API key. It answers JSON that names the provider and a digest
//! of the prompt, after `latency_ms`, unless told to fail; a script can give one
//! attempt number of a job its own behaviour.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::json;

use super::{
    AnswerShape, BoxFuture, Call, ProviderClient, ProviderSettings, Reply, ScriptStep,
    SimulatedFailure,
};
use crate::chat::openai_chat::StoredAnswer;
use crate::chat::{Answer, ChatRequest, StopReason, TokenCounts};
use crate::domain::{sha256_hex, Outcome};

/// How many of the latest attempt ids a simulated provider remembers: its
/// memory stays bounded however long it runs.
pub const SENT_LOG_CAP: usize = 100_000;

pub struct SimulatedClient {
    name: String,
    latency: Duration,
    fail: SimulatedFailure,
    script: Vec<ScriptStep>,
    sent: Mutex<VecDeque<String>>,
}

impl SimulatedClient {
    pub fn from_settings(settings: &ProviderSettings) -> Self {
        Self {
            name: settings.name.clone(),
            latency: Duration::from_millis(settings.latency_ms),
            fail: settings.fail,
            script: settings.script.clone(),
            sent: Mutex::new(VecDeque::new()),
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

    async fn answer(&self, call: &Call) -> Outcome {
        // The log holds job attempts only; qualification calls (number 0) are not attempts.
        if call.attempt_number >= 1 {
            let mut sent = self.sent.lock().expect("sent log lock");
            remember(&mut sent, call.request_id.clone(), SENT_LOG_CAP);
        }
        let (latency, fail) = self.behaviour(call.attempt_number);
        match fail {
            SimulatedFailure::Definite => {
                tokio::time::sleep(latency).await;
                Outcome::Failed(format!("{} refused the request (simulated)", self.name).into())
            }
            SimulatedFailure::TimeoutForever => std::future::pending().await,
            SimulatedFailure::None => {
                tokio::time::sleep(latency).await;
                Outcome::Succeeded(match call.shape {
                    AnswerShape::Message => chat_answer(&self.name, &call.request),
                    AnswerShape::Json => answer(&self.name, call),
                })
            }
        }
    }
}

/// Adds `id` to the log, forgetting the oldest past `cap`.
fn remember(log: &mut VecDeque<String>, id: String, cap: usize) {
    while log.len() >= cap {
        log.pop_front();
    }
    log.push_back(id);
}

impl ProviderClient for SimulatedClient {
    fn call<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            let outcome = self.answer(call).await;
            // It says what it used, as a real provider's `usage` would:
            // counted as onejob estimates, one token per three bytes.
            let usage = match &outcome {
                Outcome::Succeeded(answer) => {
                    let prompt = call.prompt_bytes();
                    Some(crate::domain::Usage::estimated(
                        prompt.div_ceil(3) as u64,
                        answer.to_string().len().div_ceil(3) as u64,
                    ))
                }
                _ => None,
            };
            Reply {
                outcome,
                usage,
                facts: super::AnswerFacts::default(),
            }
        })
    }

    fn sent_request_ids(&self) -> Vec<String> {
        self.sent
            .lock()
            .expect("sent log lock")
            .iter()
            .cloned()
            .collect()
    }
}

/// The deterministic answer: the same prompt always gives the same JSON.
fn answer(provider_name: &str, call: &Call) -> serde_json::Value {
    let digest = sha256_hex(call.request.last_user_text().as_bytes());
    json!({
        "provider": provider_name,
        "task": call.task,
        "prompt_sha256": digest,
        "summary": format!("simulated {} of prompt {}", call.task, &digest[..12]),
    })
}

/// The deterministic reply to a chat request.
fn chat_answer(provider_name: &str, request: &ChatRequest) -> serde_json::Value {
    let said = request.last_user_text();
    let content = format!("simulated reply from {provider_name} to: {said}");
    let (prompt, completion) = (
        said.split_whitespace().count(),
        content.split_whitespace().count(),
    );
    let answer = Answer {
        text: Some(content),
        stop: StopReason::EndTurn,
        usage: TokenCounts {
            input: prompt as u64,
            output: completion as u64,
            ..TokenCounts::default()
        },
        ..Answer::default()
    };
    StoredAnswer::of(&answer).to_value()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::ProviderKind;

    fn settings(script: Vec<ScriptStep>) -> ProviderSettings {
        let mut settings: ProviderSettings =
            toml::from_str("name = \"sim\"\nkind = \"simulated\"\nlatency_ms = 1").unwrap();
        assert_eq!(settings.kind, ProviderKind::Simulated);
        settings.script = script;
        settings
    }

    fn call(number: i32, prompt: &str) -> Call {
        Call::for_task(
            format!("attempt-{number}"),
            number,
            "summarize",
            prompt.into(),
            None,
            None,
        )
    }

    #[tokio::test]
    async fn answers_are_deterministic_and_name_the_provider() {
        let sim = SimulatedClient::from_settings(&settings(vec![]));
        let a = sim.call(&call(1, "hi")).await.outcome;
        let b = sim.call(&call(2, "hi")).await.outcome;
        assert_eq!(a, b);
        let Outcome::Succeeded(value) = a else {
            panic!("expected success")
        };
        assert_eq!(value["provider"], "sim");
        assert_eq!(value["prompt_sha256"].as_str().unwrap().len(), 64);
    }

    #[tokio::test]
    async fn a_script_step_overrides_one_attempt_number() {
        let sim = SimulatedClient::from_settings(&settings(vec![ScriptStep {
            attempt: 2,
            latency_ms: None,
            fail: Some(SimulatedFailure::Definite),
        }]));
        assert!(matches!(
            sim.call(&call(1, "x")).await.outcome,
            Outcome::Succeeded(_)
        ));
        assert!(matches!(
            sim.call(&call(2, "x")).await.outcome,
            Outcome::Failed(_)
        ));
        assert_eq!(sim.sent_request_ids(), ["attempt-1", "attempt-2"]);
    }

    #[test]
    fn the_log_of_sent_attempts_keeps_only_the_latest() {
        let mut log = VecDeque::new();
        for n in 0..5 {
            remember(&mut log, format!("attempt-{n}"), 3);
        }
        assert_eq!(log, ["attempt-2", "attempt-3", "attempt-4"]);
        const { assert!(SENT_LOG_CAP >= 10_000, "enough for any test's checks") };
    }

    #[tokio::test]
    async fn timeout_forever_never_answers() {
        let mut s = settings(vec![]);
        s.fail = SimulatedFailure::TimeoutForever;
        let sim = SimulatedClient::from_settings(&s);
        let c = call(1, "x");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), sim.call(&c))
                .await
                .is_err()
        );
    }
}
