-- The subscriptions back into comma-separated text (",job.failed,job.succeeded,",
-- sorted); an endpoint with no row gets ",," (it received nothing).
ALTER TABLE webhook_endpoints ADD COLUMN events TEXT NOT NULL DEFAULT ',,' CHECK (events LIKE ',%,');
UPDATE webhook_endpoints SET events = ',' || coalesce((
    SELECT group_concat(kind, ',') FROM (
        SELECT s.kind FROM webhook_subscriptions s
         WHERE s.owner_id = webhook_endpoints.owner_id AND s.endpoint_id = webhook_endpoints.id
         ORDER BY s.kind)), '') || ',';
DROP TABLE webhook_subscriptions;
