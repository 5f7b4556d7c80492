-- Group commit's creation on PostgreSQL: one multi-row statement inserting
-- a batch of one owner's jobs under their idempotency keys (ON CONFLICT DO
-- NOTHING; for an owner without a budget; each row only while the API
-- token of its kept check still grants the owner) and, for each job inserted, its
-- first, queued attempt: onejob's statement, with its rows made here by
-- generate_series instead of bound as arrays. Run by one client, as
-- onejob's one batching connection runs it; each transaction is :rows jobs.
-- Variables: owner (the user's id), digest (sha-256 of its API token),
-- role (the owner's).
\set rows 32
SELECT bench_now_ms() AS now \gset
WITH input AS (
  SELECT bench_uuid7() AS id, bench_uuid7() AS idempotency_key, 'summarize' AS task,
         'sim' AS provider, NULL::text AS requested_provider, '{"text":"pgbench"}' AS input,
         '{}' AS params, md5(random()::text) || md5(random()::text) AS fingerprint,
         'pending' AS status, bench_uuid7() AS attempt_id, 'queued' AS state,
         NULL::text AS lease_owner, NULL::bigint AS lease_ms, NULL::bigint AS started_at,
         NULL::bigint AS soft_timeout_ms
  FROM generate_series(1, :rows)
),
job AS (
  INSERT INTO jobs (id, owner_id, idempotency_key, task, provider, requested_provider, input,
                    params, fingerprint, status, version, created_at, updated_at)
    SELECT id, :owner, idempotency_key, task, provider, requested_provider, input, params,
           fingerprint, status, 0, :now, :now
    FROM input
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
  SELECT input.attempt_id, job.id, job.owner_id, 1, job.provider, input.state,
         CASE WHEN input.started_at IS NULL THEN NULL ELSE 0 END, input.lease_owner,
         bench_now_ms() + input.lease_ms, :now, input.started_at,
         input.started_at + input.soft_timeout_ms, input.started_at
  FROM job JOIN input ON input.id = job.id
  RETURNING *;
