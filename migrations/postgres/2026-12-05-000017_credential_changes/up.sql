-- The SQLite migration of this name adds a counter that moves whenever what
-- a bearer token grants may have changed, so that a SQLite process may keep
-- the tokens it has read (docs/design.md, "A token's check, kept"). On
-- PostgreSQL every request reads its token's user, and nothing moves or
-- reads the counter: the table is here so that both schemas hold the same
-- tables (it stays on the coordinator when distributed: docs/scaling.md).
CREATE TABLE credential_changes (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    counter BIGINT NOT NULL
);
INSERT INTO credential_changes (id, counter) VALUES (1, 0);
