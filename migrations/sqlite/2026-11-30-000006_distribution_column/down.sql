-- Back to single-column keys, by rebuilding the four tables. Like the up
-- migration, this expects foreign keys not to be enforced while it runs
-- (the default of a new SQLite connection, as the diesel CLI opens one).

CREATE TABLE jobs_old (
    id               TEXT PRIMARY KEY NOT NULL,
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
    completed_by     TEXT REFERENCES attempts (id),
    failure_reason   TEXT,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    CONSTRAINT jobs_owner_key_unique UNIQUE (owner_id, idempotency_key),
    CHECK ((status = 'succeeded') = (completed_by IS NOT NULL AND result IS NOT NULL))
);
INSERT INTO jobs_old (id, owner_id, idempotency_key, task, provider, requested_provider,
    input, params, fingerprint, status, version, result, completed_by, failure_reason,
    created_at, updated_at)
SELECT id, owner_id, idempotency_key, task, provider, requested_provider,
    input, params, fingerprint, status, version, result, completed_by, failure_reason,
    created_at, updated_at
FROM jobs;

CREATE TABLE attempts_old (
    id                TEXT PRIMARY KEY NOT NULL,
    job_id            TEXT NOT NULL REFERENCES jobs (id),
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
    CONSTRAINT attempts_job_number_unique UNIQUE (job_id, number)
);
INSERT INTO attempts_old (id, job_id, number, provider, state, outcome, version_read,
    lease_owner, lease_expires_at, created_at, started_at, timeout_at, finished_at, error,
    sent_at)
SELECT id, job_id, number, provider, state, outcome, version_read,
    lease_owner, lease_expires_at, created_at, started_at, timeout_at, finished_at, error,
    sent_at
FROM attempts;

CREATE TABLE race_log_old (
    id                  TEXT PRIMARY KEY NOT NULL,
    job_id              TEXT NOT NULL REFERENCES jobs (id),
    losing_attempt_id   TEXT NOT NULL REFERENCES attempts (id),
    winning_attempt_id  TEXT REFERENCES attempts (id),
    reason              TEXT NOT NULL,
    version_read        BIGINT NOT NULL,
    version_found       BIGINT NOT NULL,
    provider            TEXT NOT NULL,
    payload_sha256      TEXT NOT NULL CHECK (length(payload_sha256) = 64),
    loser_started_at    BIGINT,
    lost_at             BIGINT NOT NULL
);
INSERT INTO race_log_old (id, job_id, losing_attempt_id, winning_attempt_id, reason,
    version_read, version_found, provider, payload_sha256, loser_started_at, lost_at)
SELECT id, job_id, losing_attempt_id, winning_attempt_id, reason,
    version_read, version_found, provider, payload_sha256, loser_started_at, lost_at
FROM race_log;

CREATE TABLE audit_log_old (
    id          TEXT PRIMARY KEY NOT NULL,
    actor_id    TEXT NOT NULL REFERENCES users (id),
    action      TEXT NOT NULL,
    job_id      TEXT REFERENCES jobs (id),
    attempt_id  TEXT REFERENCES attempts (id),
    reason      TEXT NOT NULL CHECK (length(reason) > 0),
    at          BIGINT NOT NULL,
    subject_user_id TEXT REFERENCES users (id)
);
INSERT INTO audit_log_old (id, actor_id, action, job_id, attempt_id, reason, at,
    subject_user_id)
SELECT id, actor_id, action, job_id, attempt_id, reason, at, subject_user_id
FROM audit_log;

DROP TABLE audit_log;
DROP TABLE race_log;
DROP TABLE attempts;
DROP TABLE jobs;
ALTER TABLE jobs_old RENAME TO jobs;
ALTER TABLE attempts_old RENAME TO attempts;
ALTER TABLE race_log_old RENAME TO race_log;
ALTER TABLE audit_log_old RENAME TO audit_log;

CREATE INDEX jobs_owner_newest ON jobs (owner_id, id);
CREATE UNIQUE INDEX attempts_one_live_per_job ON attempts (job_id)
    WHERE state IN ('queued', 'running', 'unknown');
CREATE INDEX attempts_queued ON attempts (state, created_at);
CREATE INDEX race_log_lost_at ON race_log (lost_at);
CREATE INDEX audit_log_at ON audit_log (at);
CREATE INDEX audit_log_job ON audit_log (job_id);
