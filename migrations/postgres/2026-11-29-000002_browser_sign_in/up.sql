-- Browser sign-in: an argon2id password per user (API-only users have none),
-- server-side sessions (only the SHA-256 of the cookie's token is stored), and
-- failed sign-ins for throttling.
ALTER TABLE users ADD COLUMN password_hash TEXT;

CREATE TABLE sessions (
    id            TEXT PRIMARY KEY NOT NULL,
    token_sha256  TEXT NOT NULL UNIQUE CHECK (length(token_sha256) = 64),
    user_id       TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    created_at    BIGINT NOT NULL,
    expires_at    BIGINT NOT NULL
);
CREATE INDEX sessions_user_id ON sessions (user_id);

CREATE TABLE login_failures (
    id         TEXT PRIMARY KEY NOT NULL,
    user_name  TEXT NOT NULL,
    at         BIGINT NOT NULL
);
CREATE INDEX login_failures_name_at ON login_failures (user_name, at);
