-- The bare lifecycle of one job, as onejob runs it when its worker has a
-- free slot, after `running_job.sql` (the benchmark puts the two together):
-- the provider answers at once, and the compare-and-swap makes the answer
-- the job's result (one transaction: lock the job, read the attempt under
-- the lock, the versioned update, the attempt's guarded transition, the
-- call's usage-ledger row and the look at the owner's budget row; the owner
-- has no webhook endpoint, which the compare-and-swap's statement finds out
-- itself).
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
