CREATE INDEX attempts_queued ON attempts (state, created_at);
DROP INDEX attempts_state_order;
