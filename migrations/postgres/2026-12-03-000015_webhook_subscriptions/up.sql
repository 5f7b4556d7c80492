-- An endpoint's subscriptions as rows of their own, one per event kind,
-- matched by equality when a job's state change writes its outbox rows
-- (docs/design.md, "Webhook outbox"). They replace the comma-separated
-- `webhook_endpoints.events` text, which was matched with LIKE. One
-- owner's rows, keyed by owner, ready to be distributed by owner
-- (docs/scaling.md); removed with their endpoint.
CREATE TABLE webhook_subscriptions (
    owner_id    TEXT NOT NULL,
    endpoint_id TEXT NOT NULL,
    kind        TEXT NOT NULL
                CHECK (kind IN ('job.succeeded', 'job.failed', 'job.unknown', 'job.cancelled')),
    CONSTRAINT webhook_subscriptions_pkey PRIMARY KEY (owner_id, endpoint_id, kind),
    CONSTRAINT webhook_subscriptions_endpoint_fkey FOREIGN KEY (endpoint_id, owner_id)
        REFERENCES webhook_endpoints (id, owner_id) ON DELETE CASCADE
);
-- Which of an owner's endpoints an event of a kind goes to.
CREATE INDEX webhook_subscriptions_kind ON webhook_subscriptions (owner_id, kind, endpoint_id);

-- The existing subscriptions: each known kind the stored text names
-- between commas (",job.failed,job.succeeded,"), as it was matched.
INSERT INTO webhook_subscriptions (owner_id, endpoint_id, kind)
SELECT e.owner_id, e.id, k.kind
  FROM webhook_endpoints e
  JOIN (SELECT 'job.succeeded' AS kind UNION ALL SELECT 'job.failed'
        UNION ALL SELECT 'job.unknown' UNION ALL SELECT 'job.cancelled') k
    ON strpos(e.events, ',' || k.kind || ',') > 0;

-- The rows are the subscription now: the text goes.
ALTER TABLE webhook_endpoints DROP COLUMN events;
