-- A failure reason in columns: its kind, its summary and the provider's
-- own text (`domain::outcome::Reason`), read back without parsing. They
-- were one text, `invalid_output: <summary>\n— the provider said: <detail>`
-- (the prefix only for that kind, the marker only with a detail). The
-- summary keeps the old column (`jobs.failure_reason`, `attempts.error`);
-- the kind is `invalid_output` or `other`, set whenever a summary is. The
-- existing rows are split here exactly as onejob read them: at the first
-- marker, then the prefix.
ALTER TABLE jobs ADD COLUMN failure_kind TEXT CHECK (failure_kind IN ('invalid_output', 'other'));
ALTER TABLE jobs ADD COLUMN failure_detail TEXT;
ALTER TABLE attempts ADD COLUMN error_kind TEXT CHECK (error_kind IN ('invalid_output', 'other'));
ALTER TABLE attempts ADD COLUMN error_detail TEXT;

-- jobs: the provider's text, after the first marker, into failure_detail; the words
-- before it stay in failure_reason.
UPDATE jobs
   SET failure_reason = substr(failure_reason, 1, instr(failure_reason, char(10) || '— the provider said: ') - 1),
       failure_detail = substr(failure_reason, instr(failure_reason, char(10) || '— the provider said: ') + length(char(10) || '— the provider said: '))
 WHERE instr(failure_reason, char(10) || '— the provider said: ') > 0;
-- jobs: the kind from the words' prefix, which leaves the summary.
UPDATE jobs
   SET failure_kind = CASE WHEN substr(failure_reason, 1, 16) = 'invalid_output: '
                 THEN 'invalid_output' ELSE 'other' END,
       failure_reason = CASE WHEN substr(failure_reason, 1, 16) = 'invalid_output: '
                 THEN substr(failure_reason, 17) ELSE failure_reason END
 WHERE failure_reason IS NOT NULL;

-- attempts: the provider's text, after the first marker, into error_detail; the words
-- before it stay in error.
UPDATE attempts
   SET error = substr(error, 1, instr(error, char(10) || '— the provider said: ') - 1),
       error_detail = substr(error, instr(error, char(10) || '— the provider said: ') + length(char(10) || '— the provider said: '))
 WHERE instr(error, char(10) || '— the provider said: ') > 0;
-- attempts: the kind from the words' prefix, which leaves the summary.
UPDATE attempts
   SET error_kind = CASE WHEN substr(error, 1, 16) = 'invalid_output: '
                 THEN 'invalid_output' ELSE 'other' END,
       error = CASE WHEN substr(error, 1, 16) = 'invalid_output: '
                 THEN substr(error, 17) ELSE error END
 WHERE error IS NOT NULL;
