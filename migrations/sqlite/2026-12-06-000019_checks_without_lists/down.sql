-- The one-live-attempt index goes back to its list. The tables keep their
-- checks written out: they hold the same values as the lists did, and the
-- code before this migration reads and writes them alike.
DROP INDEX attempts_one_live_per_job;
CREATE UNIQUE INDEX attempts_one_live_per_job ON attempts (job_id, owner_id)
    WHERE state IN ('queued', 'running', 'unknown');
