-- A retry waits out its provider's Retry-After (or a backoff): the attempt
-- is queued, and no process claims it before this time (Unix ms, by the
-- database's clock). NULL: it may be sent at once. The wait it stands for
-- (`not_before - created_at`) counts against the task's retry budget.
ALTER TABLE attempts ADD COLUMN not_before BIGINT;
