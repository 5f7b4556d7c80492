-- Contract qualification runs: bound to (provider, model, task, template hash,
-- output-schema hash); a change of any of them makes the latest run stale.
CREATE TABLE qualifications (
    id                    TEXT PRIMARY KEY NOT NULL,
    provider              TEXT NOT NULL,
    model                 TEXT NOT NULL,
    task                  TEXT NOT NULL,
    template_sha256       TEXT NOT NULL CHECK (length(template_sha256) = 64),
    output_schema_sha256  TEXT NOT NULL CHECK (length(output_schema_sha256) = 64),
    passed                BOOLEAN NOT NULL,
    checks                TEXT NOT NULL,
    round_trip_ms         BIGINT NOT NULL,
    qualified_at          BIGINT NOT NULL
);
CREATE INDEX qualifications_pair ON qualifications (provider, task, qualified_at);
