-- A job may be cancelled by its owner (docs/design.md, "Cancelling"):
-- `cancelled` is a finished status, beside `succeeded` and `failed`. One
-- subcommand per ALTER TABLE (jobs may be distributed by owner).
ALTER TABLE jobs DROP CONSTRAINT jobs_status_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_status_check
    CHECK (status IN ('pending', 'running', 'unknown', 'succeeded', 'failed', 'cancelled'));
