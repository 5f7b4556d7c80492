DROP INDEX audit_log_attempt;
DROP INDEX race_log_winning_attempt;
DROP INDEX race_log_losing_attempt;
DROP INDEX race_log_job;
DROP INDEX jobs_completed_by;
