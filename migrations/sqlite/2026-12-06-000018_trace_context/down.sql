ALTER TABLE webhook_events DROP COLUMN trace_context;
ALTER TABLE jobs DROP COLUMN trace_context;
