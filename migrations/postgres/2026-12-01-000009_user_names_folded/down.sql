DROP INDEX users_name_folded_unique;
ALTER TABLE users DROP COLUMN name_folded;
