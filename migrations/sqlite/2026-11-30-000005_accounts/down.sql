DROP INDEX sessions_expires_at;
DROP INDEX audit_log_job;
ALTER TABLE audit_log DROP COLUMN subject_user_id;
CREATE TABLE login_failures (
    id         TEXT PRIMARY KEY NOT NULL,
    user_name  TEXT NOT NULL,
    at         BIGINT NOT NULL
);
CREATE INDEX login_failures_name_at ON login_failures (user_name, at);
DROP TABLE sign_in_throttle;
ALTER TABLE api_tokens DROP COLUMN expires_at;
ALTER TABLE users DROP COLUMN last_sign_in_at;
ALTER TABLE users DROP COLUMN disabled_at;
