ALTER TABLE audit_log
    DROP CONSTRAINT audit_log_job_id_fkey,
    DROP CONSTRAINT audit_log_attempt_id_fkey;
ALTER TABLE race_log
    DROP CONSTRAINT race_log_job_id_fkey,
    DROP CONSTRAINT race_log_losing_attempt_id_fkey,
    DROP CONSTRAINT race_log_winning_attempt_id_fkey;
ALTER TABLE attempts DROP CONSTRAINT attempts_job_id_fkey;
ALTER TABLE jobs DROP CONSTRAINT jobs_completed_by_fkey;

DROP INDEX attempts_one_live_per_job;
CREATE UNIQUE INDEX attempts_one_live_per_job ON attempts (job_id)
    WHERE state IN ('queued', 'running', 'unknown');
ALTER TABLE attempts DROP CONSTRAINT attempts_job_number_unique,
    ADD CONSTRAINT attempts_job_number_unique UNIQUE (job_id, number);
ALTER TABLE audit_log DROP CONSTRAINT audit_log_pkey,
    ADD CONSTRAINT audit_log_pkey PRIMARY KEY (id);
ALTER TABLE race_log DROP CONSTRAINT race_log_pkey,
    ADD CONSTRAINT race_log_pkey PRIMARY KEY (id);
ALTER TABLE attempts DROP CONSTRAINT attempts_pkey,
    ADD CONSTRAINT attempts_pkey PRIMARY KEY (id);
ALTER TABLE jobs DROP CONSTRAINT jobs_pkey,
    ADD CONSTRAINT jobs_pkey PRIMARY KEY (id);

ALTER TABLE jobs ADD CONSTRAINT jobs_completed_by_fkey
    FOREIGN KEY (completed_by) REFERENCES attempts (id);
ALTER TABLE attempts ADD CONSTRAINT attempts_job_id_fkey
    FOREIGN KEY (job_id) REFERENCES jobs (id);
ALTER TABLE race_log
    ADD CONSTRAINT race_log_job_id_fkey FOREIGN KEY (job_id) REFERENCES jobs (id),
    ADD CONSTRAINT race_log_losing_attempt_id_fkey
        FOREIGN KEY (losing_attempt_id) REFERENCES attempts (id),
    ADD CONSTRAINT race_log_winning_attempt_id_fkey
        FOREIGN KEY (winning_attempt_id) REFERENCES attempts (id);
ALTER TABLE audit_log
    ADD CONSTRAINT audit_log_job_id_fkey FOREIGN KEY (job_id) REFERENCES jobs (id),
    ADD CONSTRAINT audit_log_attempt_id_fkey FOREIGN KEY (attempt_id) REFERENCES attempts (id);

ALTER TABLE audit_log DROP CONSTRAINT audit_log_owner_id_fkey;
ALTER TABLE audit_log DROP COLUMN owner_id;
ALTER TABLE race_log DROP COLUMN owner_id;
ALTER TABLE attempts DROP COLUMN owner_id;
