-- A counter that moves whenever what a bearer token grants may have
-- changed: a token deleted (revoked) or altered, a user disabled, enabled,
-- given another role, renamed into another id or deleted. A process may
-- keep the tokens it has read, with the counter as it was then, and trust
-- them only for a write that reads the counter unchanged in its own
-- transaction (docs/design.md, "A token's check, kept"). The triggers,
-- not onejob's code, move it: a change made by any process, or by hand in
-- SQL, moves it in the transaction that makes the change.
CREATE TABLE credential_changes (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    counter INTEGER NOT NULL
);
INSERT INTO credential_changes (id, counter) VALUES (1, 0);

CREATE TRIGGER credential_changes_token_deleted AFTER DELETE ON api_tokens
BEGIN
    UPDATE credential_changes SET counter = counter + 1 WHERE id = 1;
END;

CREATE TRIGGER credential_changes_token_altered
AFTER UPDATE OF user_id, token_sha256, expires_at ON api_tokens
BEGIN
    UPDATE credential_changes SET counter = counter + 1 WHERE id = 1;
END;

CREATE TRIGGER credential_changes_user_altered
AFTER UPDATE OF id, role, disabled_at ON users
BEGIN
    UPDATE credential_changes SET counter = counter + 1 WHERE id = 1;
END;

CREATE TRIGGER credential_changes_user_deleted AFTER DELETE ON users
BEGIN
    UPDATE credential_changes SET counter = counter + 1 WHERE id = 1;
END;
