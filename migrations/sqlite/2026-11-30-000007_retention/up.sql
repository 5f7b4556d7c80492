-- Retention deletes finished jobs with their attempts, a batch at a time.
-- Deleting a row makes the database look for rows that still reference it
-- (by id and owner): an attempt is referenced by its job's completed_by, by
-- the race log and by the audit log; a job by the race log. Without these
-- indexes each such look-up would read the whole referencing table.
-- (Finished jobs themselves are found through the primary key: ids are
-- UUIDv7, ordered by creation time.)
CREATE INDEX jobs_completed_by ON jobs (completed_by, owner_id)
    WHERE completed_by IS NOT NULL;
CREATE INDEX race_log_job ON race_log (job_id, owner_id);
CREATE INDEX race_log_losing_attempt ON race_log (losing_attempt_id, owner_id);
CREATE INDEX race_log_winning_attempt ON race_log (winning_attempt_id, owner_id)
    WHERE winning_attempt_id IS NOT NULL;
CREATE INDEX audit_log_attempt ON audit_log (attempt_id, owner_id)
    WHERE attempt_id IS NOT NULL;
