//! A job's trace across requests, processes and restarts: the context a
//! job keeps ([`TraceContext`]), taken from the span that created it, given
//! as the parent of every span its work makes later, wherever that runs,
//! and sent on to providers and webhook receivers. Each is a no-op while
//! tracing is off.

use std::str::FromStr;

use opentelemetry::trace::{
    SpanContext, SpanId, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{Context, KeyValue};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::domain::TraceContext;

/// The context of `span` as a parent to hand on: `None` when tracing is
/// off or the span has none.
pub fn context_of(span: &Span) -> Option<TraceContext> {
    if !super::enabled() {
        return None;
    }
    let cx = span.context();
    let span_ref = cx.span();
    let context = span_ref.span_context();
    if !context.is_valid() {
        return None;
    }
    let found = TraceContext::from_parts(
        &context.trace_id().to_string(),
        &context.span_id().to_string(),
        context.is_sampled(),
    )?;
    Some(found.with_tracestate(&context.trace_state().header()))
}

/// The current span's context: what a job created now keeps.
pub fn current() -> Option<TraceContext> {
    context_of(&Span::current())
}

fn span_context(context: &TraceContext) -> Option<SpanContext> {
    let flags = if context.sampled() {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    Some(SpanContext::new(
        TraceId::from_hex(context.trace_id()).ok()?,
        SpanId::from_hex(context.span_id()).ok()?,
        flags,
        true,
        context
            .tracestate()
            .and_then(|s| TraceState::from_str(s).ok())
            .unwrap_or_default(),
    ))
}

/// Makes `parent` the parent of `span`, which must not have been entered
/// yet: a request's caller, or the job whose work `span` is.
pub fn set_parent(span: &Span, parent: Option<&TraceContext>) {
    if !super::enabled() {
        return;
    }
    if let Some(remote) = parent.and_then(span_context) {
        let _ = span.set_parent(Context::new().with_remote_span_context(remote));
    }
}

/// Links `span` to a job's trace: a request that joined the job, waited
/// for it or followed its stream, in a trace of its own.
pub fn link_to_job(span: &Span, job: Option<&TraceContext>) {
    if !super::enabled() {
        return;
    }
    if let Some(remote) = job.and_then(span_context) {
        span.add_link_with_attributes(remote, vec![KeyValue::new("onejob.link", "job")]);
    }
}

/// Sets an attribute on `span` (when tracing is on).
pub fn attribute(span: &Span, key: &'static str, value: impl Into<opentelemetry::Value>) {
    if super::enabled() {
        span.set_attribute(key, value);
    }
}

/// Marks `span` as failed, with `description`.
pub fn error(span: &Span, description: impl Into<String>) {
    if super::enabled() {
        span.set_status(Status::error(description.into()));
    }
}
