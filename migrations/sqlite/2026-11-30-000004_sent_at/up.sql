-- When the worker confirmed its claim and sent the attempt (NULL: never
-- sent). A claim whose process stopped before sending can be given back to
-- the queue; one that was sent becomes unknown.
ALTER TABLE attempts ADD COLUMN sent_at BIGINT;
-- Attempts claimed before this column existed were sent when claimed.
UPDATE attempts SET sent_at = started_at WHERE state <> 'queued' AND started_at IS NOT NULL;
