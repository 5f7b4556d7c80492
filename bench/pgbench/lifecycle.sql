-- The bare lifecycle of one job, each step in the transaction onejob gives
-- it: create (as create.sql), claim the oldest queued attempt with a lease
-- (FOR UPDATE SKIP LOCKED), confirm the claim immediately before sending,
-- then the compare-and-swap that makes the answer the job's result.
-- Variables: owner, digest.
SELECT users.id, users.name, users.role FROM api_tokens
  INNER JOIN users ON api_tokens.user_id = users.id
  WHERE api_tokens.token_sha256 = :digest
    AND (api_tokens.expires_at IS NULL OR api_tokens.expires_at > bench_now_ms())
    AND users.disabled_at IS NULL
  LIMIT 1;
SELECT bench_uuid7() AS job_id, bench_uuid7() AS attempt_id, bench_uuid7() AS idem_key,
       bench_now_ms() AS now,
       md5(random()::text) || md5(random()::text) AS fingerprint \gset
BEGIN;
INSERT INTO jobs (id, owner_id, idempotency_key, task, provider, requested_provider, input,
                  params, fingerprint, status, version, result, completed_by, failure_reason,
                  created_at, updated_at)
  VALUES (:job_id, :owner, :idem_key, 'summarize', 'sim', NULL, '{"text":"pgbench"}', '{}',
          :fingerprint, 'pending', 0, NULL, NULL, NULL, :now, :now)
  ON CONFLICT (owner_id, idempotency_key) DO NOTHING;
INSERT INTO attempts (id, job_id, owner_id, number, provider, state, outcome, version_read,
                      lease_owner, lease_expires_at, created_at, started_at, timeout_at,
                      finished_at, error, sent_at)
  VALUES (:attempt_id, :job_id, :owner, 1, 'sim', 'queued', NULL, NULL, NULL, NULL, :now, NULL,
          NULL, NULL, NULL, NULL);
COMMIT;
-- claim: the oldest queued attempt no one else holds. Under read committed
-- the scan can come back empty for a moment (every visible row locked by
-- other clients); that round then claims nothing and finishes nothing, and
-- the benchmark counts finished jobs, not rounds.
BEGIN;
SELECT count(*) AS c_found, max(c.id) AS c_attempt, max(c.job_id) AS c_job,
       coalesce(max(c.version), 0) AS c_version
  FROM (SELECT attempts.id, attempts.job_id, jobs.version
          FROM attempts
          INNER JOIN jobs ON jobs.id = attempts.job_id AND jobs.owner_id = attempts.owner_id
          WHERE attempts.state = 'queued' AND jobs.status NOT IN ('succeeded', 'failed')
          ORDER BY attempts.created_at, attempts.id
          LIMIT 1 FOR UPDATE SKIP LOCKED) AS c \gset
\if :c_found
UPDATE attempts SET state = 'running', sent_at = NULL, version_read = :c_version,
    lease_owner = 'pgbench', lease_expires_at = bench_now_ms() + 30000,
    started_at = bench_now_ms(), timeout_at = bench_now_ms() + 5000
  WHERE id = :c_attempt AND owner_id = :owner AND state = 'queued';
UPDATE jobs SET status = 'running', updated_at = bench_now_ms()
  WHERE id = :c_job AND owner_id = :owner AND status NOT IN ('succeeded', 'failed');
COMMIT;
-- confirm, immediately before sending
UPDATE attempts SET sent_at = bench_now_ms(), lease_expires_at = bench_now_ms() + 30000
  WHERE id = :c_attempt AND state = 'running' AND lease_owner = 'pgbench' AND sent_at IS NULL
    AND lease_expires_at > bench_now_ms()
    AND job_id IN (SELECT id FROM jobs WHERE status NOT IN ('succeeded', 'failed'));
-- the compare-and-swap
BEGIN;
SELECT id FROM jobs WHERE id = :c_job AND owner_id = :owner FOR UPDATE;
UPDATE jobs SET result = '{"summary":"ok"}', completed_by = :c_attempt, status = 'succeeded',
    version = version + 1, updated_at = bench_now_ms()
  WHERE id = :c_job AND owner_id = :owner AND version = :c_version AND completed_by IS NULL;
UPDATE attempts SET state = 'succeeded', outcome = 'won', finished_at = bench_now_ms(),
    lease_expires_at = NULL
  WHERE id = :c_attempt AND owner_id = :owner AND state IN ('running', 'unknown');
COMMIT;
\else
COMMIT;
\endif
