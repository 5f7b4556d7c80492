-- SQLite only (see its migration of this name): PostgreSQL evaluates a
-- constraint's `IN` list against a constant array, with nothing built per
-- statement, so its constraints stay as they are.
SELECT 1;
