-- The bare lifecycle of one job, as onejob runs it when its worker has a
-- free slot, on a kept token check: the job is created with its first
-- attempt already claimed and confirmed for sending (one statement, which
-- checks the token too), the provider answers at once, and
-- the compare-and-swap makes the answer the job's result (one transaction:
-- lock the job, read the attempt under the lock, the versioned update, the
-- attempt's guarded transition, the call's usage-ledger row and the look
-- at the owner's budget row; the owner has no webhook endpoint, which the
-- compare-and-swap's statement finds out itself).
-- Variables: owner, digest, role.
SELECT bench_uuid7() AS job_id, bench_uuid7() AS attempt_id, bench_uuid7() AS idem_key,
       bench_now_ms() AS now, bench_now_ms() + 5000 AS soft_timeout,
       md5(random()::text) || md5(random()::text) AS fingerprint \gset
WITH job AS (
  INSERT INTO jobs (id, owner_id, idempotency_key, task, provider, requested_provider, input,
                    params, fingerprint, status, version, created_at, updated_at)
    SELECT :job_id, :owner, :idem_key, 'summarize', 'sim', NULL, '{"text":"pgbench"}', '{}',
           :fingerprint, 'running', 0, :now, :now
    WHERE NOT EXISTS (SELECT 1 FROM budgets WHERE budgets.owner_id = :owner)
    AND EXISTS (SELECT 1 FROM api_tokens JOIN users ON users.id = api_tokens.user_id
                 WHERE api_tokens.token_sha256 = :digest AND users.id = :owner
                   AND users.role = :role AND users.disabled_at IS NULL
                   AND (api_tokens.expires_at IS NULL OR api_tokens.expires_at > :now))
    ON CONFLICT (owner_id, idempotency_key) DO NOTHING
    RETURNING id, owner_id, provider
)
INSERT INTO attempts (id, job_id, owner_id, number, provider, state, version_read, lease_owner,
                      lease_expires_at, created_at, started_at, timeout_at, sent_at)
  SELECT :attempt_id, job.id, job.owner_id, 1, job.provider, 'running', 0, 'pgbench',
         bench_now_ms() + 30000, :now, :now, :soft_timeout, :now
  FROM job
  RETURNING *;
-- the compare-and-swap
BEGIN;
SELECT jobs.id FROM jobs
  WHERE jobs.owner_id = :owner
    AND jobs.id = (SELECT job_id FROM attempts
                    WHERE attempts.id = :attempt_id AND attempts.owner_id = :owner LIMIT 1)
  LIMIT 1 FOR UPDATE;
SELECT * FROM attempts WHERE id = :attempt_id AND owner_id = :owner LIMIT 1;
WITH cas AS (
  UPDATE jobs SET result = '{"summary":"ok"}', completed_by = :attempt_id, status = 'succeeded',
      version = version + 1, updated_at = bench_now_ms()
    WHERE id = :job_id AND owner_id = :owner AND version = 0 AND completed_by IS NULL
    RETURNING *
)
UPDATE attempts SET state = 'succeeded', finished_at = bench_now_ms(), lease_expires_at = NULL,
    outcome = CASE WHEN EXISTS (SELECT 1 FROM cas) THEN 'won' ELSE 'lost' END
  WHERE id = :attempt_id AND owner_id = :owner AND state IN ('running', 'unknown', 'abandoned')
  RETURNING outcome,
    (SELECT id FROM cas) AS id,
    (SELECT owner_id FROM cas) AS owner_id,
    (SELECT idempotency_key FROM cas) AS idempotency_key,
    (SELECT task FROM cas) AS task,
    (SELECT provider FROM cas) AS provider,
    (SELECT requested_provider FROM cas) AS requested_provider,
    (SELECT input FROM cas) AS input,
    (SELECT params FROM cas) AS params,
    (SELECT fingerprint FROM cas) AS fingerprint,
    (SELECT status FROM cas) AS status,
    (SELECT version FROM cas) AS version,
    (SELECT result FROM cas) AS result,
    (SELECT completed_by FROM cas) AS completed_by,
    (SELECT failure_reason FROM cas) AS failure_reason,
    (SELECT created_at FROM cas) AS created_at,
    (SELECT updated_at FROM cas) AS updated_at,
    (SELECT failure_kind FROM cas) AS failure_kind,
    (SELECT failure_detail FROM cas) AS failure_detail,
    EXISTS (SELECT 1 FROM webhook_subscriptions s JOIN webhook_endpoints e
              ON e.id = s.endpoint_id AND e.owner_id = s.owner_id
            WHERE s.owner_id = :owner AND e.owner_id = :owner AND s.kind = 'job.succeeded'
              AND e.enabled = TRUE) AS subscribed;
-- the call in the usage ledger, and the owner's budget row (none here)
INSERT INTO usage_ledger (attempt_id, owner_id, job_id, task, provider, model, kind, late,
                          prompt_tokens, completion_tokens, cached_tokens, usage_source,
                          cost_micros, price_effective_from, currency, recorded_at)
  VALUES (:attempt_id, :owner, :job_id, 'summarize', 'sim', 'simulated', 'won', false, 12, 30, 0,
          'estimated', NULL, NULL, NULL, bench_now_ms())
  ON CONFLICT (attempt_id, owner_id) DO NOTHING;
SELECT * FROM budgets WHERE owner_id = :owner LIMIT 1 FOR UPDATE;
COMMIT;
