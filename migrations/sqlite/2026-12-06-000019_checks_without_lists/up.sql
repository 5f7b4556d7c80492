-- A constraint's list of more than two values, `x IN ('a', 'b', 'c')`, is
-- evaluated by building a temporary table of the values, once for every
-- statement that checks it: SQLite opens, fills and closes that table for
-- each INSERT and for each UPDATE of the column, about 3 µs a list. A job's
-- path writes such columns some fourteen times (the job, its attempt, the
-- one-live-attempt index, the ledger's and the tallies' kinds), and the
-- equivalent `x = 'a' OR x = 'b' OR x = 'c'` is evaluated in place. Same
-- rules, same rows; only their form changes. (PostgreSQL compares against
-- a constant array and has nothing to change.)
--
-- A table's CHECK changes by rebuilding the table (as 000006 does): each
-- table written per job is made anew, filled from the old one with its
-- rowids, which is dropped, and renamed into its place; its indexes are made
-- again. Foreign keys are not enforced while migrations run
-- (store::migrations checks them all once they are done). The lists of two
-- values stay: SQLite compares those in place.

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
                     CHECK (status = 'pending' OR status = 'running' OR status = 'unknown'
                            OR status = 'succeeded' OR status = 'failed'
                            OR status = 'cancelled'),
    version          BIGINT NOT NULL DEFAULT 0 CHECK (version >= 0),
    result           TEXT,
    completed_by     TEXT,
    failure_reason   TEXT,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    failure_kind     TEXT CHECK (failure_kind IN ('invalid_output', 'other')),
    failure_detail   TEXT,
    trace_context    TEXT,
    CONSTRAINT jobs_pkey PRIMARY KEY (id, owner_id),
    CONSTRAINT jobs_owner_key_unique UNIQUE (owner_id, idempotency_key),
    CONSTRAINT jobs_completed_by_fkey
        FOREIGN KEY (completed_by, owner_id) REFERENCES attempts (id, owner_id),
    CHECK ((status = 'succeeded') = (completed_by IS NOT NULL AND result IS NOT NULL))
);
INSERT INTO jobs_new (rowid, id, owner_id, idempotency_key, task, provider,
    requested_provider, input, params, fingerprint, status, version, result, completed_by,
    failure_reason, created_at, updated_at, failure_kind, failure_detail, trace_context)
SELECT rowid, id, owner_id, idempotency_key, task, provider,
    requested_provider, input, params, fingerprint, status, version, result, completed_by,
    failure_reason, created_at, updated_at, failure_kind, failure_detail, trace_context
FROM jobs;

CREATE TABLE attempts_new (
    id                TEXT NOT NULL,
    job_id            TEXT NOT NULL,
    number            INTEGER NOT NULL CHECK (number >= 1),
    provider          TEXT NOT NULL,
    state             TEXT NOT NULL DEFAULT 'queued'
                      CHECK (state = 'queued' OR state = 'running' OR state = 'succeeded'
                             OR state = 'failed' OR state = 'unknown'
                             OR state = 'abandoned'),
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
    not_before        BIGINT,
    error_kind        TEXT CHECK (error_kind IN ('invalid_output', 'other')),
    error_detail      TEXT,
    CONSTRAINT attempts_pkey PRIMARY KEY (id, owner_id),
    CONSTRAINT attempts_job_number_unique UNIQUE (job_id, owner_id, number),
    CONSTRAINT attempts_job_id_fkey
        FOREIGN KEY (job_id, owner_id) REFERENCES jobs (id, owner_id)
);
INSERT INTO attempts_new (rowid, id, job_id, number, provider, state, outcome, version_read,
    lease_owner, lease_expires_at, created_at, started_at, timeout_at, finished_at, error,
    sent_at, owner_id, not_before, error_kind, error_detail)
SELECT rowid, id, job_id, number, provider, state, outcome, version_read,
    lease_owner, lease_expires_at, created_at, started_at, timeout_at, finished_at, error,
    sent_at, owner_id, not_before, error_kind, error_detail
FROM attempts;

CREATE TABLE usage_ledger_new (
    attempt_id           TEXT NOT NULL,
    owner_id             TEXT NOT NULL REFERENCES users (id),
    job_id               TEXT NOT NULL,
    task                 TEXT NOT NULL,
    provider             TEXT NOT NULL,
    model                TEXT NOT NULL,
    kind                 TEXT NOT NULL
                         CHECK (kind = 'won' OR kind = 'lost' OR kind = 'failed'
                                OR kind = 'rate_limited'),
    -- The answer came after the attempt was unknown or abandoned.
    late                 BOOLEAN NOT NULL,
    prompt_tokens        BIGINT NOT NULL CHECK (prompt_tokens >= 0),
    completion_tokens    BIGINT NOT NULL CHECK (completion_tokens >= 0),
    cached_tokens        BIGINT NOT NULL CHECK (cached_tokens BETWEEN 0 AND prompt_tokens),
    usage_source         TEXT NOT NULL CHECK (usage_source IN ('reported', 'estimated')),
    -- In micro-units of `currency`, at the price in force when recorded;
    -- NULL when no price was (the call is not priced).
    cost_micros          BIGINT CHECK (cost_micros >= 0),
    price_effective_from BIGINT,
    currency             TEXT,
    recorded_at          BIGINT NOT NULL,
    CONSTRAINT usage_ledger_pkey PRIMARY KEY (attempt_id, owner_id),
    CHECK ((cost_micros IS NULL) = (currency IS NULL))
);
INSERT INTO usage_ledger_new (rowid, attempt_id, owner_id, job_id, task, provider, model,
    kind, late, prompt_tokens, completion_tokens, cached_tokens, usage_source, cost_micros,
    price_effective_from, currency, recorded_at)
SELECT rowid, attempt_id, owner_id, job_id, task, provider, model,
    kind, late, prompt_tokens, completion_tokens, cached_tokens, usage_source, cost_micros,
    price_effective_from, currency, recorded_at
FROM usage_ledger;

CREATE TABLE usage_tallies_new (
    owner_id  TEXT NOT NULL,
    day       BIGINT NOT NULL,
    task      TEXT NOT NULL,
    provider  TEXT NOT NULL,
    job_id    TEXT NOT NULL,
    kind      TEXT NOT NULL
              CHECK (kind = 'replayed' OR kind = 'joined' OR kind = 'refused_budget'
                     OR kind = 'withdrawn'),
    count     BIGINT NOT NULL CHECK (count >= 0),
    CONSTRAINT usage_tallies_pkey PRIMARY KEY (owner_id, day, task, provider, job_id, kind)
);
INSERT INTO usage_tallies_new (rowid, owner_id, day, task, provider, job_id, kind, count)
SELECT rowid, owner_id, day, task, provider, job_id, kind, count
FROM usage_tallies;

CREATE TABLE webhook_events_new (
    id               TEXT NOT NULL,
    owner_id         TEXT NOT NULL,
    endpoint_id      TEXT NOT NULL,
    job_id           TEXT NOT NULL,
    kind             TEXT NOT NULL
                     CHECK (kind = 'job.succeeded' OR kind = 'job.failed'
                            OR kind = 'job.unknown' OR kind = 'job.cancelled'),
    subject          TEXT NOT NULL,
    webhook_id       TEXT NOT NULL CHECK (substr(webhook_id, 1, 4) = 'msg_'),
    body             TEXT NOT NULL,
    state            TEXT NOT NULL DEFAULT 'pending'
                     CHECK (state = 'pending' OR state = 'delivered' OR state = 'dead'),
    attempts         INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at  BIGINT NOT NULL,
    -- Where the retry window (the endpoint's retry_for_ms) starts: the
    -- event's creation, or its latest resend.
    window_start_at  BIGINT NOT NULL,
    lease_owner      TEXT,
    lease_expires_at BIGINT,
    delivered_at     BIGINT,
    created_at       BIGINT NOT NULL,
    trace_context    TEXT,
    CONSTRAINT webhook_events_pkey PRIMARY KEY (id, owner_id),
    CONSTRAINT webhook_events_once UNIQUE (endpoint_id, owner_id, job_id, kind, subject),
    CONSTRAINT webhook_events_webhook_id_unique UNIQUE (webhook_id, owner_id),
    CONSTRAINT webhook_events_endpoint_fkey FOREIGN KEY (endpoint_id, owner_id)
        REFERENCES webhook_endpoints (id, owner_id) ON DELETE CASCADE,
    CONSTRAINT webhook_events_job_fkey FOREIGN KEY (job_id, owner_id)
        REFERENCES jobs (id, owner_id) ON DELETE CASCADE,
    CHECK ((state = 'delivered') = (delivered_at IS NOT NULL))
);
INSERT INTO webhook_events_new (rowid, id, owner_id, endpoint_id, job_id, kind, subject,
    webhook_id, body, state, attempts, next_attempt_at, window_start_at, lease_owner,
    lease_expires_at, delivered_at, created_at, trace_context)
SELECT rowid, id, owner_id, endpoint_id, job_id, kind, subject,
    webhook_id, body, state, attempts, next_attempt_at, window_start_at, lease_owner,
    lease_expires_at, delivered_at, created_at, trace_context
FROM webhook_events;

CREATE TABLE webhook_deliveries_new (
    id            TEXT NOT NULL,
    owner_id      TEXT NOT NULL,
    event_id      TEXT NOT NULL,
    endpoint_id   TEXT NOT NULL,
    number        INTEGER NOT NULL CHECK (number >= 1),
    outcome       TEXT NOT NULL
                  CHECK (outcome = 'delivered' OR outcome = 'failed' OR outcome = 'refused'),
    status_code   INTEGER,
    error         TEXT,
    latency_ms    BIGINT NOT NULL CHECK (latency_ms >= 0),
    response_body TEXT CHECK (length(response_body) <= 1024),
    at            BIGINT NOT NULL,
    CONSTRAINT webhook_deliveries_pkey PRIMARY KEY (id, owner_id),
    CONSTRAINT webhook_deliveries_number_unique UNIQUE (event_id, owner_id, number),
    CONSTRAINT webhook_deliveries_event_fkey FOREIGN KEY (event_id, owner_id)
        REFERENCES webhook_events (id, owner_id) ON DELETE CASCADE
);
INSERT INTO webhook_deliveries_new (rowid, id, owner_id, event_id, endpoint_id, number,
    outcome, status_code, error, latency_ms, response_body, at)
SELECT rowid, id, owner_id, event_id, endpoint_id, number,
    outcome, status_code, error, latency_ms, response_body, at
FROM webhook_deliveries;

DROP TABLE webhook_deliveries;
DROP TABLE webhook_events;
DROP TABLE usage_tallies;
DROP TABLE usage_ledger;
DROP TABLE attempts;
DROP TABLE jobs;
ALTER TABLE jobs_new RENAME TO jobs;
ALTER TABLE attempts_new RENAME TO attempts;
ALTER TABLE usage_ledger_new RENAME TO usage_ledger;
ALTER TABLE usage_tallies_new RENAME TO usage_tallies;
ALTER TABLE webhook_events_new RENAME TO webhook_events;
ALTER TABLE webhook_deliveries_new RENAME TO webhook_deliveries;

CREATE INDEX jobs_owner_newest ON jobs (owner_id, id);
CREATE INDEX jobs_completed_by ON jobs (completed_by, owner_id)
    WHERE completed_by IS NOT NULL;
-- The one-live-attempt rule: at most one queued, running or unknown
-- attempt per job.
CREATE UNIQUE INDEX attempts_one_live_per_job ON attempts (job_id, owner_id)
    WHERE state = 'queued' OR state = 'running' OR state = 'unknown';
CREATE INDEX attempts_state_order ON attempts (state, created_at, id);
CREATE INDEX usage_ledger_recorded ON usage_ledger (recorded_at);
CREATE INDEX usage_ledger_owner_recorded ON usage_ledger (owner_id, recorded_at);
CREATE INDEX usage_ledger_job ON usage_ledger (job_id, owner_id);
CREATE INDEX usage_tallies_day ON usage_tallies (day);
CREATE INDEX webhook_events_due ON webhook_events (state, next_attempt_at);
CREATE INDEX webhook_events_oldest ON webhook_events (state, window_start_at);
CREATE INDEX webhook_events_job ON webhook_events (job_id, owner_id);
CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, owner_id, at);
