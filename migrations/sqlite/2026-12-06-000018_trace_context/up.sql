-- A job's trace (docs/tracing.md): the W3C `traceparent` of the request
-- that created it, and its `tracestate` on a second line, kept so that
-- whichever process sends the job's attempts or delivers its webhooks,
-- after a restart or elsewhere, continues the same trace. NULL when
-- tracing was off. Each webhook event keeps a copy, made in the
-- transaction that records it.
ALTER TABLE jobs ADD COLUMN trace_context TEXT;
ALTER TABLE webhook_events ADD COLUMN trace_context TEXT;
