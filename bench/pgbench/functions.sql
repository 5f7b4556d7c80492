-- Helpers for the pgbench scripts, created in the benchmark's own database.
-- onejob makes UUIDv7 ids (time-ordered) in Rust; this makes the same shape
-- in SQL, so the indexes see the same insertion pattern.
CREATE OR REPLACE FUNCTION bench_uuid7() RETURNS text LANGUAGE sql VOLATILE AS $$
  WITH h AS (
    SELECT lpad(to_hex(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') AS t,
           replace(gen_random_uuid()::text, '-', '') AS r)
  SELECT substr(t, 1, 8) || '-' || substr(t, 9, 4) || '-7' || substr(r, 13, 3) || '-'
         || substr(r, 17, 4) || '-' || substr(r, 21, 12)
  FROM h
$$;
CREATE OR REPLACE FUNCTION bench_now_ms() RETURNS bigint LANGUAGE sql VOLATILE AS $$
  SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint
$$;
