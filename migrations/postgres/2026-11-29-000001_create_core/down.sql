DROP TABLE audit_log;
DROP TABLE race_log;
ALTER TABLE jobs DROP CONSTRAINT jobs_completed_by_fkey;
DROP TABLE attempts CASCADE;
DROP TABLE jobs;
DROP TABLE api_tokens;
DROP TABLE users;
