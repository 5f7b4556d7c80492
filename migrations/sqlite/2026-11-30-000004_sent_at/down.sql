ALTER TABLE attempts DROP COLUMN sent_at;
