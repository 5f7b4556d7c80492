//! Providers: where attempts are sent. A provider knows what to send and how
//! to classify what comes back, nothing more: the caller renders the prompt
//! and holds the answer to the task's contract. Each call ends in one
//! [`Outcome`]; the table is in [`classify`].
//!
//! [`ProviderClient`] is the seam: the simulated and HTTP clients implement
//! it, and tests may inject their own.

pub mod bedrock;
pub mod classify;
pub mod codec;
pub mod http;
pub mod limits;
pub mod settings;
pub mod simulated;
pub mod streaming;
pub mod tokens;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::Notify;

use crate::chat::model::Sampling;
use crate::chat::{ChatRequest, Content, Message, OutputFormat};

use crate::domain::{Outcome, Secret, Usage};
use http::HttpClient;
use limits::Limiter;
pub use settings::{MaxTokensField, ProviderKind, ProviderSettings, ScriptStep, SimulatedFailure};
use simulated::SimulatedClient;

/// What a call's answer is taken as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerShape {
    /// A chat route's: the model's whole message (its text and tool calls),
    /// kept as `chat::openai_chat::StoredAnswer`.
    Message,
    /// A task's: the JSON its text holds.
    Json,
}

/// One call, ready to send: the request is written in the model's terms,
/// the identity chosen. Each provider's codec writes it in its format.
#[derive(Debug, Clone)]
pub struct Call {
    /// Sent as `Idempotency-Key` and `X-Request-Id`: the attempt id, or
    /// `qualify-…` for a qualification call.
    pub request_id: String,
    /// The attempt's number within its job; 0 for a qualification call.
    pub attempt_number: i32,
    /// The task's name (a structured-output schema is named after it).
    pub task: String,
    pub request: ChatRequest,
    pub shape: AnswerShape,
    /// Where and with which secret the provider may call back late.
    pub callback: Option<CallbackTarget>,
    /// The span of the attempt's call, sent as `traceparent` (and
    /// `tracestate`) while tracing is on.
    pub trace: Option<crate::domain::TraceContext>,
}

impl Call {
    /// A task's call: its rendered prompt as one user message, asking for
    /// the task's output schema (named after the task, strict) when it has
    /// one; `temperature` overrides the provider's.
    pub fn for_task(
        request_id: String,
        attempt_number: i32,
        task: &str,
        prompt: String,
        output_schema: Option<Value>,
        temperature: Option<f64>,
    ) -> Self {
        let request = ChatRequest {
            messages: vec![Message::User {
                content: Content::Text(prompt),
                name: None,
            }],
            output: output_schema.map(|schema| OutputFormat::JsonSchema {
                name: schema_name(task),
                schema,
                description: None,
                strict: Some(true),
            }),
            sampling: Sampling {
                temperature,
                ..Sampling::default()
            },
            ..ChatRequest::default()
        };
        Self {
            request_id,
            attempt_number,
            task: task.to_owned(),
            request,
            shape: AnswerShape::Json,
            callback: None,
            trace: None,
        }
    }

    /// A chat route's call: the client's request as it asked;
    /// `temperature` overrides its own (qualification uses the task's).
    pub fn for_chat(
        request_id: String,
        attempt_number: i32,
        task: &str,
        mut request: ChatRequest,
        temperature: Option<f64>,
    ) -> Self {
        if temperature.is_some() {
            request.sampling.temperature = temperature;
        }
        Self {
            request_id,
            attempt_number,
            task: task.to_owned(),
            request,
            shape: AnswerShape::Message,
            callback: None,
            trace: None,
        }
    }

    /// The size of what is asked, for estimates before the provider says:
    /// a task's prompt, or a chat request as its job keeps it.
    pub fn prompt_bytes(&self) -> usize {
        match self.shape {
            AnswerShape::Json => self.request.last_user_text().len(),
            AnswerShape::Message => {
                let input = crate::chat::openai_chat::write_request(
                    &self.request,
                    crate::chat::openai_chat::Target::Input { route: &self.task },
                );
                serde_json::to_vec(&input).map_or(0, |bytes| bytes.len())
            }
        }
    }

    /// Whether the client asked for its answer as a stream.
    pub fn wants_stream(&self) -> bool {
        self.shape == AnswerShape::Message && self.request.stream
    }
}

/// OpenAI schema names allow `[a-zA-Z0-9_-]`.
fn schema_name(task: &str) -> String {
    task.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// A callback URL and the attempt's secret, sent to providers that answer
/// asynchronously (`callbacks = true`).
#[derive(Debug, Clone)]
pub struct CallbackTarget {
    pub url: String,
    pub secret: Secret,
}

/// A boxed future, so that [`ProviderClient`] can be used as a trait object.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a call came back with: its outcome, and the tokens the provider
/// says it used, when it says.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub outcome: Outcome,
    pub usage: Option<Usage>,
    /// What the answer said of itself, for its trace.
    pub facts: AnswerFacts,
}

/// What an answer says of itself, beyond its content: read for the
/// provider call's span (docs/tracing.md), and only for a traced call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AnswerFacts {
    /// The model that answered, as the provider named it.
    pub model: Option<String>,
    /// Why it stopped, in OpenAI's words (`stop`, `length`, `tool_calls`,
    /// `content_filter`).
    pub finish_reason: Option<String>,
}

impl AnswerFacts {
    /// The facts of `answer`, which `model` answered; nothing unless the
    /// call is `traced`.
    pub fn of(answer: &crate::chat::Answer, model: Option<String>, traced: bool) -> Self {
        if !traced {
            return Self::default();
        }
        Self {
            model,
            finish_reason: Some(crate::chat::openai_chat::write_finish_reason(&answer.stop)),
        }
    }

    /// The model an answer (or one of its stream's events) names: its
    /// `model` (OpenAI's, Anthropic's), `message.model` (Anthropic's
    /// `message_start`) or Gemini's `modelVersion`.
    pub fn model_named(json: &[u8]) -> Option<String> {
        #[derive(serde::Deserialize)]
        struct Message {
            model: Option<String>,
        }
        #[derive(serde::Deserialize)]
        struct Named {
            model: Option<String>,
            #[serde(rename = "modelVersion")]
            model_version: Option<String>,
            message: Option<Message>,
        }
        let named: Named = serde_json::from_slice(json).ok()?;
        named
            .model
            .or(named.model_version)
            .or(named.message.and_then(|m| m.model))
            .filter(|m| !m.is_empty())
    }
}

impl Reply {
    /// Prompt and answer tokens together, when the provider said.
    pub fn tokens_used(&self) -> Option<u64> {
        self.usage.map(|usage| usage.total())
    }
}

impl From<Outcome> for Reply {
    fn from(outcome: Outcome) -> Self {
        Self {
            outcome,
            usage: None,
            facts: AnswerFacts::default(),
        }
    }
}

/// Something that can be sent a [`Call`].
pub trait ProviderClient: Send + Sync {
    /// Sends the call and waits for the answer, however long it takes (the
    /// worker applies the soft timeout and the late-result window around
    /// this). Never retries by itself.
    fn call<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Reply>;

    /// Sends the call with streaming on, handing each delta of the answer
    /// to `sink` as it arrives (see [`streaming`]); the reply is the whole
    /// answer, built from the deltas. A client that cannot stream answers
    /// whole and hands the answer on as it came.
    fn stream<'a>(&'a self, call: &'a Call, sink: streaming::DeltaSink) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            let reply = self.call(call).await;
            if let Outcome::Succeeded(answer) = &reply.outcome {
                let answer = crate::chat::openai_chat::StoredAnswer::read(answer).answer();
                for delta in crate::chat::model::whole_answer_deltas(&answer) {
                    let _ = sink.send(delta).await;
                }
            }
            reply
        })
    }

    /// `text`'s tokens counted by the provider itself, and how (a
    /// qualification's call, never an attempt); `None` when it has no
    /// counter (the caller counts or estimates locally).
    fn count_tokens<'a>(&'a self, _text: &'a str) -> BoxFuture<'a, Option<(u32, &'static str)>> {
        Box::pin(async { None })
    }

    /// Request ids this client has been sent for job attempts, in order (the
    /// simulated client keeps them in memory; others keep none).
    fn sent_request_ids(&self) -> Vec<String> {
        Vec::new()
    }
}

/// A configured provider with its timing rules, its limits and its client.
pub struct Provider {
    pub settings: ProviderSettings,
    client: Arc<dyn ProviderClient>,
    limiter: Arc<Limiter>,
}

impl Provider {
    /// The client the provider's kind calls for; `freed` is told whenever
    /// one of its call slots is given back.
    pub fn from_settings(settings: &ProviderSettings, freed: Arc<Notify>) -> Self {
        let client: Arc<dyn ProviderClient> = match settings.kind {
            ProviderKind::Simulated => Arc::new(SimulatedClient::from_settings(settings)),
            ProviderKind::Openai
            | ProviderKind::Anthropic
            | ProviderKind::AzureOpenai
            | ProviderKind::Gemini
            | ProviderKind::Bedrock => Arc::new(HttpClient::from_settings(settings)),
        };
        Self::with_client(settings, client, freed)
    }

    /// A provider that sends through `client` instead (tests inject fakes).
    pub fn with_client(
        settings: &ProviderSettings,
        client: Arc<dyn ProviderClient>,
        freed: Arc<Notify>,
    ) -> Self {
        Self {
            settings: settings.clone(),
            client,
            limiter: Arc::new(Limiter::new(settings.limits(), freed)),
        }
    }

    /// The provider's limits in this process, and their counts.
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }

    pub fn name(&self) -> &str {
        &self.settings.name
    }

    /// Past this the attempt becomes `unknown`.
    pub fn soft_timeout(&self) -> Duration {
        Duration::from_millis(self.settings.timeout_ms)
    }

    /// A streaming call's clocks: the soft timeout for its first chunk,
    /// the idle timeout between chunks.
    pub fn stream_timeouts(&self) -> crate::domain::stream::StreamTimeouts {
        crate::domain::stream::StreamTimeouts {
            first_chunk: self.soft_timeout(),
            idle: Duration::from_millis(self.settings.idle_timeout_ms),
        }
    }

    /// How much longer a timed-out call is kept open for a late answer.
    pub fn late_result_window(&self) -> Duration {
        Duration::from_millis(self.settings.late_result_ms)
    }

    /// Sends the call (the caller holds a [`limits::SendSlot`]). A refusal
    /// that asks for a pause pauses every call to this provider in this
    /// process.
    pub async fn call(&self, call: &Call) -> Reply {
        let reply = self.client.call(call).await;
        self.heed_pause(&reply);
        reply
    }

    /// Sends the call streaming (see [`ProviderClient::stream`]), under the
    /// same rules as [`Provider::call`].
    pub async fn stream(&self, call: &Call, sink: streaming::DeltaSink) -> Reply {
        let reply = self.client.stream(call, sink).await;
        self.heed_pause(&reply);
        reply
    }

    fn heed_pause(&self, reply: &Reply) {
        if let Outcome::Refused(refusal) = &reply.outcome {
            if let Some(pause) = refusal.pause {
                self.limiter.pause(pause);
            }
        }
    }

    /// `text`'s tokens, by the provider's own counter where it has one, else
    /// by onejob's (`tokens::count_tokens`: tiktoken, or an estimate); and
    /// which counted.
    pub async fn count_tokens(&self, text: &str) -> (u32, &'static str) {
        match self.client.count_tokens(text).await {
            Some(counted) => counted,
            None => tokens::count_tokens(&self.settings, text),
        }
    }

    /// Attempt ids this provider has been sent, in order (simulated providers
    /// only; empty for others).
    pub fn sent_attempts(&self) -> Vec<String> {
        self.client.sent_request_ids()
    }
}

/// All configured providers, by name.
#[derive(Clone, Default)]
pub struct Providers {
    by_name: Arc<HashMap<String, Arc<Provider>>>,
    freed: Arc<Notify>,
}

impl Providers {
    pub fn from_settings(settings: &[ProviderSettings]) -> Self {
        let freed = Arc::new(Notify::new());
        let providers: Vec<Provider> = settings
            .iter()
            .map(|s| Provider::from_settings(s, freed.clone()))
            .collect();
        Self::from_providers_with(providers, freed)
    }

    /// Providers built elsewhere (tests inject clients), sharing `freed`.
    pub fn from_providers_with(
        providers: impl IntoIterator<Item = Provider>,
        freed: Arc<Notify>,
    ) -> Self {
        let by_name = providers
            .into_iter()
            .map(|p| (p.settings.name.clone(), Arc::new(p)))
            .collect();
        Self {
            by_name: Arc::new(by_name),
            freed,
        }
    }

    pub fn get(&self, name: &str) -> Option<Arc<Provider>> {
        self.by_name.get(name).cloned()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Provider>> {
        self.by_name.values()
    }

    /// Resolves when a call slot of any provider was given back (or was,
    /// since the last wait).
    pub async fn capacity_freed(&self) {
        self.freed.notified().await;
    }

    /// The providers that cannot take a call now (paused, or at a limit),
    /// with why: a claim passes their queued attempts over.
    pub fn closed_now(&self) -> Vec<(String, limits::Closed)> {
        self.by_name
            .iter()
            .filter_map(|(name, p)| p.limiter.closed().map(|c| (name.clone(), c)))
            .collect()
    }
}

/// An error with its sources, for a reason people can act on.
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_keep_to_the_allowed_characters() {
        assert_eq!(schema_name("sum.marize v2"), "sum_marize_v2");
    }

    #[test]
    fn a_task_call_is_one_user_message_asking_for_its_schema() {
        let call = Call::for_task(
            "a".into(),
            1,
            "sum.marize",
            "Sum up".into(),
            Some(serde_json::json!({"type": "object"})),
            Some(0.0),
        );
        assert_eq!(call.request.messages.len(), 1);
        assert_eq!(call.request.sampling.temperature, Some(0.0));
        assert!(matches!(
            &call.request.output,
            Some(OutputFormat::JsonSchema { name, strict: Some(true), .. }) if name == "sum_marize"
        ));
        assert!(!call.wants_stream());
    }
}
