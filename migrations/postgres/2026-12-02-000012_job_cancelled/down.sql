-- Back to the statuses before cancelling existed. A cancelled job has no
-- such status: it is kept as failed, with why.
UPDATE jobs SET status = 'failed', failure_reason = 'cancelled by its owner'
    WHERE status = 'cancelled';
ALTER TABLE jobs DROP CONSTRAINT jobs_status_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_status_check
    CHECK (status IN ('pending', 'running', 'unknown', 'succeeded', 'failed'));
