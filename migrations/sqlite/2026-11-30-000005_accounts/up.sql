-- Accounts that can be revoked: a disabled user's sessions and tokens stop
-- working at once; tokens may expire; the console shows the last sign-in.
ALTER TABLE users ADD COLUMN disabled_at BIGINT;
ALTER TABLE users ADD COLUMN last_sign_in_at BIGINT;
ALTER TABLE api_tokens ADD COLUMN expires_at BIGINT;

-- Failed sign-ins, counted atomically per scope: a (name, address) pair, or
-- an address alone. Growing delays, never a lockout that anyone elsewhere
-- could impose on a name.
CREATE TABLE sign_in_throttle (
    scope            TEXT PRIMARY KEY NOT NULL CHECK (length(scope) BETWEEN 1 AND 200),
    failures         INTEGER NOT NULL CHECK (failures >= 0),
    last_failure_at  BIGINT NOT NULL,
    blocked_until    BIGINT NOT NULL
);
CREATE INDEX sign_in_throttle_last_failure ON sign_in_throttle (last_failure_at);
DROP TABLE login_failures;

-- Console actions on a user (not a job) name that user.
ALTER TABLE audit_log ADD COLUMN subject_user_id TEXT REFERENCES users (id);
CREATE INDEX audit_log_job ON audit_log (job_id);
CREATE INDEX sessions_expires_at ON sessions (expires_at);
