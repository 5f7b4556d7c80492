//! Sending an attempt: the prompt is rendered from the job's input by the
//! task's contract, the provider is called under the attempt's identity, and
//! its answer is held to the contract. The worker times it; qualification
//! sends its golden calls the same way.

use std::sync::Arc;

use super::App;
use crate::config::CallbackSettings;
use crate::contracts::TaskContract;
use crate::domain::{AttemptId, JsonText, Outcome};
use crate::providers::limits::estimate_tokens;
use crate::providers::{Call, CallbackTarget, Provider, Reply};
use crate::store::queue::Claim;

/// A call ready to send, with what it needs to be judged.
pub struct Dispatch {
    pub provider: Arc<Provider>,
    pub contract: Arc<TaskContract>,
    pub call: Call,
}

impl Dispatch {
    /// Renders the prompt; a template that does not render means nothing is
    /// sent (a definite failure).
    pub fn new(
        provider: Arc<Provider>,
        contract: Arc<TaskContract>,
        input: &JsonText,
        request_id: String,
        attempt_number: i32,
        temperature: Option<f64>,
        callback: Option<CallbackTarget>,
    ) -> Result<Self, Outcome> {
        let mut call = if contract.is_chat() {
            // A chat job's input was read when it was created: one that no
            // longer reads is a definite failure, and nothing is sent.
            let read =
                crate::chat::openai_chat::read_request_text(input.as_str()).map_err(|refused| {
                    Outcome::Failed(format!("the chat request cannot be read: {refused}").into())
                })?;
            Call::for_chat(
                request_id,
                attempt_number,
                contract.name(),
                read.request,
                temperature,
            )
        } else {
            let prompt = contract
                .render_prompt(&input.value())
                .map_err(|e| Outcome::Failed(e.into()))?;
            Call::for_task(
                request_id,
                attempt_number,
                contract.name(),
                prompt,
                contract.definition.output_schema.clone(),
                temperature,
            )
        };
        call.callback = callback;
        Ok(Self {
            provider,
            contract,
            call,
        })
    }

    /// Sends the call and holds the answer to the contract.
    pub async fn send(&self) -> Reply {
        let reply = self.provider.call(&self.call).await;
        Reply {
            outcome: self.contract.judge(reply.outcome),
            ..reply
        }
    }

    /// Sends the call streaming, each delta to `sink` as it arrives, and
    /// holds the whole answer to the contract.
    pub async fn send_streaming(&self, sink: crate::providers::streaming::DeltaSink) -> Reply {
        let reply = self.provider.stream(&self.call, sink).await;
        Reply {
            outcome: self.contract.judge(reply.outcome),
            ..reply
        }
    }

    /// Whether the answer may be released as it is generated: not when it
    /// must first match an output schema.
    pub fn releases_as_generated(&self) -> bool {
        crate::domain::stream::releases_as_generated(
            self.contract.definition.output_schema.is_some(),
        )
    }

    /// What the call is expected to use of the provider's
    /// `tokens_per_minute`: the prompt's estimate (the chat request's text
    /// for a chat route), before the answer's usage says.
    pub fn estimated_tokens(&self) -> u64 {
        estimate_tokens(self.call.prompt_bytes())
    }
}

/// A callback URL and the attempt's secret, for providers that answer
/// asynchronously.
pub fn callback_target(
    callbacks: Option<&CallbackSettings>,
    provider: &Provider,
    attempt_id: &AttemptId,
) -> Option<CallbackTarget> {
    if !provider.settings.callbacks {
        return None;
    }
    let callbacks = callbacks?;
    Some(CallbackTarget {
        url: format!(
            "{}/api/v1/callbacks/attempts/{attempt_id}",
            callbacks.public_url
        ),
        secret: callbacks.key.attempt_secret(attempt_id.as_str()),
    })
}

impl App {
    /// What sending a claimed attempt takes; a definite failure if its
    /// provider or task is no longer configured or its prompt does not render
    /// (nothing is sent then).
    pub fn dispatch(&self, claim: &Claim) -> Result<Dispatch, Outcome> {
        let provider = self
            .providers()
            .get(&claim.attempt.provider)
            .ok_or_else(|| {
                Outcome::Failed(
                    format!(
                        "provider {:?} is not configured; the attempt was not sent",
                        claim.attempt.provider
                    )
                    .into(),
                )
            })?;
        let contract = self
            .config()
            .contracts
            .get(&claim.job.task)
            .ok_or_else(|| {
                Outcome::Failed(
                    format!(
                        "task {:?} is not configured; the attempt was not sent",
                        claim.job.task
                    )
                    .into(),
                )
            })?;
        let callback = callback_target(
            self.config().callbacks.as_ref(),
            &provider,
            &claim.attempt.id,
        );
        Dispatch::new(
            provider,
            contract,
            &claim.job.input,
            claim.attempt.id.to_string(),
            claim.attempt.number,
            None,
            callback,
        )
    }
}
