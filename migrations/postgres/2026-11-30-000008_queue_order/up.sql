-- The claim takes the oldest queued attempts: `WHERE state = 'queued'
-- ORDER BY created_at, id LIMIT n`. With `id` in the index as well, the
-- index hands rows over in exactly that order and the scan stops after n,
-- whatever the planner believes about how many are queued. (On
-- (state, created_at) alone, a plan made while the queue looked empty sorts
-- the whole queue on every claim.) The same index serves the reaper
-- (`state = 'running'`) and the console (`state = 'unknown'`).
-- Building it blocks writes to `attempts` while it runs; on a large table,
-- build it first with `CREATE INDEX CONCURRENTLY attempts_state_order ON
-- attempts (state, created_at, id)`, and this migration keeps it.
CREATE INDEX IF NOT EXISTS attempts_state_order ON attempts (state, created_at, id);
DROP INDEX attempts_queued;
