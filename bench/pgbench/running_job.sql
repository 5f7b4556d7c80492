-- A job created with its first attempt already claimed and confirmed for
-- sending, as onejob creates it when its worker has a free slot, on a kept
-- token check (one statement, which checks the token too). The first part
-- of the scripts `lifecycle.sql` and `answer.sql`: the benchmark puts this
-- before each.
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
