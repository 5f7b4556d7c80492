-- A job may be cancelled by its owner (docs/design.md, "Cancelling"):
-- `cancelled` is a finished status, beside `succeeded` and `failed`.
--
-- SQLite changes a CHECK constraint by rebuilding the table, as
-- 2026-11-30-000006_distribution_column did: the table is made anew with
-- every key, foreign key and check it had, filled from the old one, which
-- is dropped, and renamed into its place; its indexes are made again.
-- Foreign keys are not enforced while migrations run (store::migrations
-- checks them all once they are done); the tables that reference jobs
-- (attempts, race_log, audit_log, stream_chunks) name it by its final name.

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
                     CHECK (status IN ('pending', 'running', 'unknown', 'succeeded', 'failed', 'cancelled')),
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

DROP TABLE jobs;
ALTER TABLE jobs_new RENAME TO jobs;

CREATE INDEX jobs_owner_newest ON jobs (owner_id, id);
CREATE INDEX jobs_completed_by ON jobs (completed_by, owner_id)
    WHERE completed_by IS NOT NULL;
