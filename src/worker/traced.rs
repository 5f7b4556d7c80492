//! The spans of an attempt (docs/tracing.md): its provider call, in the
//! OpenTelemetry GenAI conventions, a child of the job's trace wherever and
//! whenever the attempt runs, and the compare-and-swap that records its
//! answer, with its verdict. While tracing is off these are disabled spans
//! and every method costs a branch.

use opentelemetry::{Array, StringValue, Value};
use tracing::field::Empty;
use tracing::Span;

use crate::app::dispatch::Dispatch;
use crate::app::Claim;
use crate::domain::{Applied, Outcome, TraceContext};
use crate::providers::{ProviderKind, Reply};
use crate::telemetry::trace;

/// The most of a prompt or an answer a span carries when content is
/// recorded (`telemetry.record_content`).
const MAX_CONTENT_BYTES: usize = 16 * 1024;

/// An attempt's provider-call span.
pub(super) struct AttemptTrace {
    span: Span,
}

/// `gen_ai.provider.name` for a provider kind, in the conventions' words.
fn gen_ai_provider(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::Simulated => "onejob.simulated",
        ProviderKind::Openai => "openai",
        ProviderKind::Anthropic => "anthropic",
        ProviderKind::AzureOpenai => "azure.ai.openai",
        ProviderKind::Gemini => "gcp.gemini",
        ProviderKind::Bedrock => "aws.bedrock",
    }
}

/// `text` cut at a character boundary to at most [`MAX_CONTENT_BYTES`].
fn bounded(text: &str) -> String {
    let mut end = text.len().min(MAX_CONTENT_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

impl AttemptTrace {
    /// The span of `claim`'s call, a child of its job's trace.
    pub fn start(claim: &Claim, dispatch: &Dispatch) -> Self {
        let settings = &dispatch.provider.settings;
        let model = settings.model.as_deref().unwrap_or(&settings.name);
        let provider = gen_ai_provider(settings.kind);
        let span = tracing::info_span!(
            target: "onejob::trace",
            "provider call",
            otel.name = Empty,
            otel.kind = "client",
            otel.status_code = Empty,
            gen_ai.operation.name = "chat",
            gen_ai.provider.name = provider,
            gen_ai.system = provider,
            gen_ai.request.model = model,
            gen_ai.response.model = Empty,
            gen_ai.usage.input_tokens = Empty,
            gen_ai.usage.output_tokens = Empty,
            onejob.job.id = %claim.job.id,
            onejob.attempt.id = %claim.attempt.id,
            onejob.attempt.number = claim.attempt.number,
            onejob.provider = %settings.name,
            onejob.attempt.outcome = Empty,
            onejob.attempt.unknown = false,
        );
        if crate::telemetry::enabled() {
            span.record("otel.name", format!("chat {model}"));
            trace::set_parent(&span, claim.job.trace().as_ref());
            if crate::telemetry::records_content() {
                trace::attribute(
                    &span,
                    "gen_ai.input.messages",
                    bounded(claim.job.input.as_str()),
                );
            }
        }
        Self { span }
    }

    /// The context the provider is sent: this span's.
    pub fn context(&self) -> Option<TraceContext> {
        trace::context_of(&self.span)
    }

    /// The call ended with `reply`.
    pub fn answered(&self, reply: &Reply) {
        if !crate::telemetry::enabled() {
            return;
        }
        let span = &self.span;
        if let Some(usage) = reply.usage {
            // As signed integers: an unsigned one is exported as text.
            let count = |tokens: u64| i64::try_from(tokens).unwrap_or(i64::MAX);
            span.record("gen_ai.usage.input_tokens", count(usage.prompt_tokens));
            span.record("gen_ai.usage.output_tokens", count(usage.completion_tokens));
        }
        if let Some(model) = &reply.facts.model {
            span.record("gen_ai.response.model", model.as_str());
        }
        if let Some(reason) = &reply.facts.finish_reason {
            let reasons = Array::String(vec![StringValue::from(reason.clone())]);
            trace::attribute(
                span,
                "gen_ai.response.finish_reasons",
                Value::Array(reasons),
            );
        }
        self.outcome(&reply.outcome);
    }

    /// The attempt's outcome, as the call ended (or as the worker stopped
    /// waiting).
    pub fn outcome(&self, outcome: &Outcome) {
        if !crate::telemetry::enabled() {
            return;
        }
        self.span.record("onejob.attempt.outcome", outcome.label());
        match outcome {
            Outcome::Succeeded(answer) if crate::telemetry::records_content() => {
                trace::attribute(
                    &self.span,
                    "gen_ai.output.messages",
                    bounded(&answer.to_string()),
                );
            }
            Outcome::Succeeded(_) => {}
            Outcome::Failed(reason) | Outcome::Unknown(reason) => {
                trace::error(&self.span, reason.summary());
            }
            Outcome::Refused(refusal) => trace::error(&self.span, refusal.reason.summary()),
        }
    }

    /// The soft timeout passed without an answer: the attempt is unknown.
    /// The span stays open while the call may still answer late.
    pub fn went_unknown(&self) {
        self.span.record("onejob.attempt.unknown", true);
        self.span.record("onejob.attempt.outcome", "unknown");
    }

    /// The span of the write that records the call's outcome: for an
    /// answer, the compare-and-swap.
    pub fn recording(&self, outcome: &Outcome) -> Span {
        let name = match outcome {
            Outcome::Succeeded(_) => "compare-and-swap",
            _ => "record outcome",
        };
        tracing::info_span!(
            target: "onejob::trace",
            parent: &self.span,
            "attempt outcome",
            otel.name = name,
            onejob.attempt.outcome = outcome.label(),
            onejob.cas.verdict = Empty,
            onejob.failover.provider = Empty,
        )
    }

    /// What the recording write did, on its span: the verdict of the
    /// compare-and-swap (`won`, `lost`, `discarded_late`), or where the job
    /// went next.
    pub fn recorded(recording: &Span, applied: &Applied) {
        if !crate::telemetry::enabled() {
            return;
        }
        let verdict = match applied {
            Applied::Won => "won",
            Applied::Lost { .. } => "lost",
            Applied::Discarded(_) => "discarded_late",
            other => other.label(),
        };
        recording.record("onejob.cas.verdict", verdict);
        if let Applied::FailedOver { provider, .. } = applied {
            recording.record("onejob.failover.provider", provider.as_str());
        }
    }
}
