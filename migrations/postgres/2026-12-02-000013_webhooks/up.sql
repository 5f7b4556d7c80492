-- Completion webhooks from a durable outbox (docs/design.md, "Webhook
-- outbox"). Three tables of one owner's rows, keyed and linked by
-- (id, owner_id), ready to be distributed by owner (docs/scaling.md).
--
-- An endpoint: where one owner's events are sent. Its signing secret is
-- never stored: it is derived from the server's webhook key, the endpoint's
-- id and its `generation` (bumped by a rotation); `secret_fingerprint` is a
-- short hash of it, for display. During a rotation's overlap
-- (`previous_generation_valid_until`) deliveries carry both signatures.
CREATE TABLE webhook_endpoints (
    id                              TEXT NOT NULL,
    owner_id                        TEXT NOT NULL REFERENCES users (id),
    url                             TEXT NOT NULL CHECK (length(url) BETWEEN 1 AND 2048),
    -- The kinds subscribed to, as ",job.failed,job.succeeded," (sorted).
    events                          TEXT NOT NULL CHECK (events LIKE ',%,'),
    enabled                         BOOLEAN NOT NULL DEFAULT TRUE,
    disabled_reason                 TEXT,
    disabled_at                     BIGINT,
    generation                      BIGINT NOT NULL DEFAULT 1 CHECK (generation >= 1),
    previous_generation_valid_until BIGINT,
    secret_fingerprint              TEXT NOT NULL,
    retry_for_ms                    BIGINT NOT NULL CHECK (retry_for_ms > 0),
    consecutive_failures            INTEGER NOT NULL DEFAULT 0 CHECK (consecutive_failures >= 0),
    failing_since                   BIGINT,
    created_at                      BIGINT NOT NULL,
    updated_at                      BIGINT NOT NULL,
    CONSTRAINT webhook_endpoints_pkey PRIMARY KEY (id, owner_id),
    CHECK (enabled = (disabled_at IS NULL))
);
CREATE INDEX webhook_endpoints_owner ON webhook_endpoints (owner_id, id);

-- The outbox: one row per (event, endpoint), written in the transaction
-- that changes the job's state. `webhook_id` (msg_<uuid>) is the
-- Standard Webhooks message id, the same on every retry and resend;
-- `body` is fixed at event time. `subject` tells one occurrence of a kind
-- from another (the attempt that went unknown; empty for the job's end),
-- so an event is never recorded twice.
CREATE TABLE webhook_events (
    id               TEXT NOT NULL,
    owner_id         TEXT NOT NULL,
    endpoint_id      TEXT NOT NULL,
    job_id           TEXT NOT NULL,
    kind             TEXT NOT NULL
                     CHECK (kind IN ('job.succeeded', 'job.failed', 'job.unknown', 'job.cancelled')),
    subject          TEXT NOT NULL,
    webhook_id       TEXT NOT NULL CHECK (substr(webhook_id, 1, 4) = 'msg_'),
    body             TEXT NOT NULL,
    state            TEXT NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'delivered', 'dead')),
    attempts         INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at  BIGINT NOT NULL,
    -- Where the retry window (the endpoint's retry_for_ms) starts: the
    -- event's creation, or its latest resend.
    window_start_at  BIGINT NOT NULL,
    lease_owner      TEXT,
    lease_expires_at BIGINT,
    delivered_at     BIGINT,
    created_at       BIGINT NOT NULL,
    CONSTRAINT webhook_events_pkey PRIMARY KEY (id, owner_id),
    CONSTRAINT webhook_events_once UNIQUE (endpoint_id, owner_id, job_id, kind, subject),
    CONSTRAINT webhook_events_webhook_id_unique UNIQUE (webhook_id, owner_id),
    CONSTRAINT webhook_events_endpoint_fkey FOREIGN KEY (endpoint_id, owner_id)
        REFERENCES webhook_endpoints (id, owner_id) ON DELETE CASCADE,
    CONSTRAINT webhook_events_job_fkey FOREIGN KEY (job_id, owner_id)
        REFERENCES jobs (id, owner_id) ON DELETE CASCADE,
    CHECK ((state = 'delivered') = (delivered_at IS NOT NULL))
);
CREATE INDEX webhook_events_due ON webhook_events (state, next_attempt_at);
CREATE INDEX webhook_events_oldest ON webhook_events (state, window_start_at);
CREATE INDEX webhook_events_job ON webhook_events (job_id, owner_id);

-- Each delivery attempt of an event: its number, the answer's status or
-- the error, how long it took, the first KiB of the answer's body.
CREATE TABLE webhook_deliveries (
    id            TEXT NOT NULL,
    owner_id      TEXT NOT NULL,
    event_id      TEXT NOT NULL,
    endpoint_id   TEXT NOT NULL,
    number        INTEGER NOT NULL CHECK (number >= 1),
    outcome       TEXT NOT NULL CHECK (outcome IN ('delivered', 'failed', 'refused')),
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
CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, owner_id, at);
