-- Nothing was changed on PostgreSQL.
SELECT 1;
