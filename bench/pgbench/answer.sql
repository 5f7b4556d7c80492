-- The durable floor of one `/v1` answer, after `running_job.sql` (the
-- benchmark puts the two together): the answer in one autocommitted
-- statement (the attempt's end, the job's result and the call's row in the
-- usage ledger), the fewest round trips and commits an answer can take.
-- Run by one client: each transaction is one call's two commits.
WITH att AS (
  UPDATE attempts SET state = 'succeeded', finished_at = bench_now_ms(), lease_expires_at = NULL,
      outcome = 'won'
    WHERE id = :attempt_id AND owner_id = :owner AND state = 'running'
    RETURNING job_id, provider
), cas AS (
  UPDATE jobs SET result = '{"summary":"ok"}', completed_by = :attempt_id, status = 'succeeded',
      version = version + 1, updated_at = bench_now_ms()
    WHERE id = (SELECT job_id FROM att) AND owner_id = :owner AND version = 0
      AND completed_by IS NULL
    RETURNING id, task
)
INSERT INTO usage_ledger (attempt_id, owner_id, job_id, task, provider, model, kind, late,
                          prompt_tokens, completion_tokens, cached_tokens, usage_source,
                          cost_micros, price_effective_from, currency, recorded_at)
  SELECT :attempt_id, :owner, cas.id, cas.task, att.provider, 'simulated', 'won', false, 12, 3, 0,
         'estimated', NULL, NULL, NULL, bench_now_ms()
  FROM cas, att;
