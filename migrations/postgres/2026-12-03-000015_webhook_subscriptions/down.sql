-- The subscriptions back into comma-separated text (",job.failed,job.succeeded,",
-- sorted); an endpoint with no row gets ",," (it received nothing).
ALTER TABLE webhook_endpoints ADD COLUMN events TEXT NOT NULL DEFAULT ',,' CHECK (events LIKE ',%,');
UPDATE webhook_endpoints SET events = ',' || coalesce((
    SELECT string_agg(s.kind, ',' ORDER BY s.kind COLLATE "C") FROM webhook_subscriptions s
     WHERE s.owner_id = webhook_endpoints.owner_id AND s.endpoint_id = webhook_endpoints.id), '') || ',';
DROP TABLE webhook_subscriptions;
