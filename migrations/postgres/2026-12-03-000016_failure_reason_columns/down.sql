-- Each reason back into one text: the kind's prefix, the summary, then the
-- marker and the provider's text.
UPDATE jobs
   SET failure_reason = CASE WHEN failure_kind = 'invalid_output' THEN 'invalid_output: ' ELSE '' END
                        || failure_reason
                        || CASE WHEN failure_detail IS NULL THEN '' ELSE chr(10) || '— the provider said: ' || failure_detail END
 WHERE failure_reason IS NOT NULL;
UPDATE attempts
   SET error = CASE WHEN error_kind = 'invalid_output' THEN 'invalid_output: ' ELSE '' END
               || error
               || CASE WHEN error_detail IS NULL THEN '' ELSE chr(10) || '— the provider said: ' || error_detail END
 WHERE error IS NOT NULL;
ALTER TABLE attempts DROP COLUMN error_detail;
ALTER TABLE attempts DROP COLUMN error_kind;
ALTER TABLE jobs DROP COLUMN failure_detail;
ALTER TABLE jobs DROP COLUMN failure_kind;
