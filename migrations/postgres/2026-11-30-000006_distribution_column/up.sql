-- Ready to be distributed by owner (docs/scaling.md). jobs, attempts,
-- race_log and audit_log are one owner's rows: each carries owner_id, every
-- key and unique index on them includes it, and the foreign keys between
-- them match on it as well as on the id. Ids are UUIDv7 and unique by
-- construction; the keys lead with the id, so a look-up by id alone still
-- uses them.

-- The owner's column, filled in from the job each row belongs to.
ALTER TABLE attempts ADD COLUMN owner_id TEXT;
UPDATE attempts SET owner_id = jobs.owner_id FROM jobs WHERE jobs.id = attempts.job_id;
ALTER TABLE attempts ALTER COLUMN owner_id SET NOT NULL;

ALTER TABLE race_log ADD COLUMN owner_id TEXT;
UPDATE race_log SET owner_id = jobs.owner_id FROM jobs WHERE jobs.id = race_log.job_id;
ALTER TABLE race_log ALTER COLUMN owner_id SET NOT NULL;

-- An audit entry is filed under the owner of the job it is about; an entry
-- about an account, under that account; any other (a qualification run),
-- under its actor.
ALTER TABLE audit_log ADD COLUMN owner_id TEXT;
UPDATE audit_log SET owner_id = COALESCE(
    (SELECT jobs.owner_id FROM jobs WHERE jobs.id = audit_log.job_id),
    subject_user_id,
    actor_id);
ALTER TABLE audit_log ALTER COLUMN owner_id SET NOT NULL;
ALTER TABLE audit_log ADD CONSTRAINT audit_log_owner_id_fkey
    FOREIGN KEY (owner_id) REFERENCES users (id);

-- The foreign keys on single-column ids go first: the keys they point at change.
ALTER TABLE jobs DROP CONSTRAINT jobs_completed_by_fkey;
ALTER TABLE attempts DROP CONSTRAINT attempts_job_id_fkey;
ALTER TABLE race_log
    DROP CONSTRAINT race_log_job_id_fkey,
    DROP CONSTRAINT race_log_losing_attempt_id_fkey,
    DROP CONSTRAINT race_log_winning_attempt_id_fkey;
ALTER TABLE audit_log
    DROP CONSTRAINT audit_log_job_id_fkey,
    DROP CONSTRAINT audit_log_attempt_id_fkey;

-- Keys and unique indexes that include the owner.
ALTER TABLE jobs DROP CONSTRAINT jobs_pkey,
    ADD CONSTRAINT jobs_pkey PRIMARY KEY (id, owner_id);
ALTER TABLE attempts DROP CONSTRAINT attempts_pkey,
    ADD CONSTRAINT attempts_pkey PRIMARY KEY (id, owner_id);
ALTER TABLE race_log DROP CONSTRAINT race_log_pkey,
    ADD CONSTRAINT race_log_pkey PRIMARY KEY (id, owner_id);
ALTER TABLE audit_log DROP CONSTRAINT audit_log_pkey,
    ADD CONSTRAINT audit_log_pkey PRIMARY KEY (id, owner_id);
ALTER TABLE attempts DROP CONSTRAINT attempts_job_number_unique,
    ADD CONSTRAINT attempts_job_number_unique UNIQUE (job_id, owner_id, number);
-- The one-live-attempt rule, per (job, owner): still one live attempt per job.
DROP INDEX attempts_one_live_per_job;
CREATE UNIQUE INDEX attempts_one_live_per_job ON attempts (job_id, owner_id)
    WHERE state IN ('queued', 'running', 'unknown');

-- The same links, now by (id, owner): a row can only point at rows of its own owner.
ALTER TABLE jobs ADD CONSTRAINT jobs_completed_by_fkey
    FOREIGN KEY (completed_by, owner_id) REFERENCES attempts (id, owner_id);
ALTER TABLE attempts ADD CONSTRAINT attempts_job_id_fkey
    FOREIGN KEY (job_id, owner_id) REFERENCES jobs (id, owner_id);
ALTER TABLE race_log
    ADD CONSTRAINT race_log_job_id_fkey
        FOREIGN KEY (job_id, owner_id) REFERENCES jobs (id, owner_id),
    ADD CONSTRAINT race_log_losing_attempt_id_fkey
        FOREIGN KEY (losing_attempt_id, owner_id) REFERENCES attempts (id, owner_id),
    ADD CONSTRAINT race_log_winning_attempt_id_fkey
        FOREIGN KEY (winning_attempt_id, owner_id) REFERENCES attempts (id, owner_id);
ALTER TABLE audit_log
    ADD CONSTRAINT audit_log_job_id_fkey
        FOREIGN KEY (job_id, owner_id) REFERENCES jobs (id, owner_id),
    ADD CONSTRAINT audit_log_attempt_id_fkey
        FOREIGN KEY (attempt_id, owner_id) REFERENCES attempts (id, owner_id);
