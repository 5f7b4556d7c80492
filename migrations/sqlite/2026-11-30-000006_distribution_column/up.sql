-- Ready to be distributed by owner (docs/scaling.md). jobs, attempts,
-- race_log and audit_log are one owner's rows: each carries owner_id, every
-- key and unique index on them includes it, and the foreign keys between
-- them match on it as well as on the id. Ids are UUIDv7 and unique by
-- construction; the keys lead with the id, so a look-up by id alone still
-- uses them.
--
-- SQLite changes a table's keys by rebuilding it: each table is made anew,
-- filled from the old one, which is dropped, and renamed into its place.
-- Foreign keys are not enforced while migrations run (store::migrations
-- checks them all once they are done), so the tables can be dropped in any
-- order; the new tables name their parents by the final names.

CREATE TABLE jobs_new (
    id               TEXT NOT NULL,
    owner_id         TEXT NOT NULL REFERENCES users (id),
    idempotency_key  TEXT NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    task             TEXT NOT NULL,
    provider         TEXT NOT NULL,
    requested_provider TEXT,
    input            TEXT NOT NULL,
    params           TEXT NOT NULL,
    fingerprint      TEXT NOT NULL CHECK (length(fingerprint) = 64),
    status           TEXT NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'running', 'unknown', 'succeeded', 'failed')),
    version          BIGINT NOT NULL DEFAULT 0 CHECK (version >= 0),
    result           TEXT,
    completed_by     TEXT,
    failure_reason   TEXT,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    CONSTRAINT jobs_pkey PRIMARY KEY (id, owner_id),
    CONSTRAINT jobs_owner_key_unique UNIQUE (owner_id, idempotency_key),
    CONSTRAINT jobs_completed_by_fkey
        FOREIGN KEY (completed_by, owner_id) REFERENCES attempts (id, owner_id),
    CHECK ((status = 'succeeded') = (completed_by IS NOT NULL AND result IS NOT NULL))
);
INSERT INTO jobs_new (id, owner_id, idempotency_key, task, provider, requested_provider,
    input, params, fingerprint, status, version, result, completed_by, failure_reason,
    created_at, updated_at)
SELECT id, owner_id, idempotency_key, task, provider, requested_provider,
    input, params, fingerprint, status, version, result, completed_by, failure_reason,
    created_at, updated_at
FROM jobs;

CREATE TABLE attempts_new (
    id                TEXT NOT NULL,
    job_id            TEXT NOT NULL,
    number            INTEGER NOT NULL CHECK (number >= 1),
    provider          TEXT NOT NULL,
    state             TEXT NOT NULL DEFAULT 'queued'
                      CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'unknown', 'abandoned')),
    outcome           TEXT CHECK (outcome IN ('won', 'lost')),
    version_read      BIGINT,
    lease_owner       TEXT,
    lease_expires_at  BIGINT,
    created_at        BIGINT NOT NULL,
    started_at        BIGINT,
    timeout_at        BIGINT,
    finished_at       BIGINT,
    error             TEXT,
    sent_at           BIGINT,
    owner_id          TEXT NOT NULL,
    CONSTRAINT attempts_pkey PRIMARY KEY (id, owner_id),
    CONSTRAINT attempts_job_number_unique UNIQUE (job_id, owner_id, number),
    CONSTRAINT attempts_job_id_fkey
        FOREIGN KEY (job_id, owner_id) REFERENCES jobs (id, owner_id)
);
INSERT INTO attempts_new (id, job_id, number, provider, state, outcome, version_read,
    lease_owner, lease_expires_at, created_at, started_at, timeout_at, finished_at, error,
    sent_at, owner_id)
SELECT a.id, a.job_id, a.number, a.provider, a.state, a.outcome, a.version_read,
    a.lease_owner, a.lease_expires_at, a.created_at, a.started_at, a.timeout_at,
    a.finished_at, a.error, a.sent_at, j.owner_id
FROM attempts a JOIN jobs j ON j.id = a.job_id;

CREATE TABLE race_log_new (
    id                  TEXT NOT NULL,
    job_id              TEXT NOT NULL,
    losing_attempt_id   TEXT NOT NULL,
    winning_attempt_id  TEXT,
    reason              TEXT NOT NULL,
    version_read        BIGINT NOT NULL,
    version_found       BIGINT NOT NULL,
    provider            TEXT NOT NULL,
    payload_sha256      TEXT NOT NULL CHECK (length(payload_sha256) = 64),
    loser_started_at    BIGINT,
    lost_at             BIGINT NOT NULL,
    owner_id            TEXT NOT NULL,
    CONSTRAINT race_log_pkey PRIMARY KEY (id, owner_id),
    CONSTRAINT race_log_job_id_fkey
        FOREIGN KEY (job_id, owner_id) REFERENCES jobs (id, owner_id),
    CONSTRAINT race_log_losing_attempt_id_fkey
        FOREIGN KEY (losing_attempt_id, owner_id) REFERENCES attempts (id, owner_id),
    CONSTRAINT race_log_winning_attempt_id_fkey
        FOREIGN KEY (winning_attempt_id, owner_id) REFERENCES attempts (id, owner_id)
);
INSERT INTO race_log_new (id, job_id, losing_attempt_id, winning_attempt_id, reason,
    version_read, version_found, provider, payload_sha256, loser_started_at, lost_at,
    owner_id)
SELECT r.id, r.job_id, r.losing_attempt_id, r.winning_attempt_id, r.reason,
    r.version_read, r.version_found, r.provider, r.payload_sha256, r.loser_started_at,
    r.lost_at, j.owner_id
FROM race_log r JOIN jobs j ON j.id = r.job_id;

-- An audit entry is filed under the owner of the job it is about; an entry
-- about an account, under that account; any other (a qualification run),
-- under its actor.
CREATE TABLE audit_log_new (
    id          TEXT NOT NULL,
    actor_id    TEXT NOT NULL REFERENCES users (id),
    action      TEXT NOT NULL,
    job_id      TEXT,
    attempt_id  TEXT,
    reason      TEXT NOT NULL CHECK (length(reason) > 0),
    at          BIGINT NOT NULL,
    subject_user_id TEXT REFERENCES users (id),
    owner_id    TEXT NOT NULL,
    CONSTRAINT audit_log_pkey PRIMARY KEY (id, owner_id),
    CONSTRAINT audit_log_owner_id_fkey FOREIGN KEY (owner_id) REFERENCES users (id),
    CONSTRAINT audit_log_job_id_fkey
        FOREIGN KEY (job_id, owner_id) REFERENCES jobs (id, owner_id),
    CONSTRAINT audit_log_attempt_id_fkey
        FOREIGN KEY (attempt_id, owner_id) REFERENCES attempts (id, owner_id)
);
INSERT INTO audit_log_new (id, actor_id, action, job_id, attempt_id, reason, at,
    subject_user_id, owner_id)
SELECT id, actor_id, action, job_id, attempt_id, reason, at, subject_user_id,
    COALESCE((SELECT jobs.owner_id FROM jobs WHERE jobs.id = audit_log.job_id),
             subject_user_id, actor_id)
FROM audit_log;

DROP TABLE audit_log;
DROP TABLE race_log;
DROP TABLE attempts;
DROP TABLE jobs;
ALTER TABLE jobs_new RENAME TO jobs;
ALTER TABLE attempts_new RENAME TO attempts;
ALTER TABLE race_log_new RENAME TO race_log;
ALTER TABLE audit_log_new RENAME TO audit_log;

CREATE INDEX jobs_owner_newest ON jobs (owner_id, id);
-- The one-live-attempt rule, per (job, owner): still one live attempt per job.
CREATE UNIQUE INDEX attempts_one_live_per_job ON attempts (job_id, owner_id)
    WHERE state IN ('queued', 'running', 'unknown');
CREATE INDEX attempts_queued ON attempts (state, created_at);
CREATE INDEX race_log_lost_at ON race_log (lost_at);
CREATE INDEX audit_log_at ON audit_log (at);
CREATE INDEX audit_log_job ON audit_log (job_id);
