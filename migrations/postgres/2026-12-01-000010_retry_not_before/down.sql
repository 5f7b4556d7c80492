ALTER TABLE attempts DROP COLUMN not_before;
