-- onejob core schema (PostgreSQL). Ids are UUIDv7 as TEXT; times are Unix milliseconds.
CREATE TABLE users (
    id          TEXT PRIMARY KEY NOT NULL,
    name        TEXT NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 64),
    role        TEXT NOT NULL CHECK (role IN ('user', 'support', 'admin')),
    created_at  BIGINT NOT NULL
);

-- Only the SHA-256 of a token is stored; the token itself is shown once.
CREATE TABLE api_tokens (
    id            TEXT PRIMARY KEY NOT NULL,
    user_id       TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    token_sha256  TEXT NOT NULL UNIQUE CHECK (length(token_sha256) = 64),
    created_at    BIGINT NOT NULL
);
CREATE INDEX api_tokens_user_id ON api_tokens (user_id);

CREATE TABLE jobs (
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
    completed_by     TEXT,
    failure_reason   TEXT,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    CONSTRAINT jobs_owner_key_unique UNIQUE (owner_id, idempotency_key),
    CHECK ((status = 'succeeded') = (completed_by IS NOT NULL AND result IS NOT NULL))
);
CREATE INDEX jobs_owner_newest ON jobs (owner_id, id);

CREATE TABLE attempts (
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
    CONSTRAINT attempts_job_number_unique UNIQUE (job_id, number)
);
-- The one-live-attempt rule lives here, not in application code.
CREATE UNIQUE INDEX attempts_one_live_per_job ON attempts (job_id)
    WHERE state IN ('queued', 'running', 'unknown');
CREATE INDEX attempts_queued ON attempts (state, created_at);

CREATE TABLE race_log (
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
CREATE INDEX race_log_lost_at ON race_log (lost_at);

CREATE TABLE audit_log (
    id          TEXT PRIMARY KEY NOT NULL,
    actor_id    TEXT NOT NULL REFERENCES users (id),
    action      TEXT NOT NULL,
    job_id      TEXT REFERENCES jobs (id),
    attempt_id  TEXT REFERENCES attempts (id),
    reason      TEXT NOT NULL CHECK (length(reason) > 0),
    at          BIGINT NOT NULL
);
CREATE INDEX audit_log_at ON audit_log (at);

-- jobs and attempts reference each other; PostgreSQL needs the second link added after both exist.
ALTER TABLE jobs ADD CONSTRAINT jobs_completed_by_fkey
    FOREIGN KEY (completed_by) REFERENCES attempts (id);
