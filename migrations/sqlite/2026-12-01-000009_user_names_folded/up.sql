-- User names are unique without regard to case: `admin` and `Admin` cannot
-- both exist, so the console and the audit log cannot show look-alikes.
-- Names are ASCII letters, digits, '-', '_' and '.', for which Unicode's
-- compatibility case folding (NFKC_Casefold) is exactly `lower()`.
--
-- Users created before this rule whose names differ only in case keep
-- working: the first of them (by creation) takes the folded name, each
-- later one keeps a NULL here, and onejob names them at every start and in
-- `onejob migrate` until they are renamed (`onejob users rename`).
ALTER TABLE users ADD COLUMN name_folded TEXT
    CHECK (name_folded IS NULL OR name_folded = lower(name));
UPDATE users SET name_folded = lower(name)
 WHERE NOT EXISTS (
       SELECT 1 FROM users AS earlier
        WHERE lower(earlier.name) = lower(users.name)
          AND (earlier.created_at < users.created_at
               OR (earlier.created_at = users.created_at AND earlier.id < users.id)));
CREATE UNIQUE INDEX users_name_folded_unique ON users (name_folded);
