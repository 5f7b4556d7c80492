-- The usage ledger and owner budgets (docs/design.md, "Usage, prices and
-- budgets"). Every table of one owner's rows is keyed by owner, ready to be
-- distributed by owner (docs/scaling.md).
--
-- One row per provider call that answered: written in the transaction that
-- records the call's outcome (the compare-and-swap, a definite failure), at
-- most once per attempt (the primary key), so a call is counted once
-- however often its news arrives. No row for an attempt whose outcome is
-- unknown: its usage is unknown. Rows outlive their job's retention (a
-- ledger is not pruned with the work it paid for), so nothing refers to
-- `jobs` here.
CREATE TABLE usage_ledger (
    attempt_id           TEXT NOT NULL,
    owner_id             TEXT NOT NULL REFERENCES users (id),
    job_id               TEXT NOT NULL,
    task                 TEXT NOT NULL,
    provider             TEXT NOT NULL,
    model                TEXT NOT NULL,
    kind                 TEXT NOT NULL CHECK (kind IN ('won', 'lost', 'failed', 'rate_limited')),
    -- The answer came after the attempt was unknown or abandoned.
    late                 BOOLEAN NOT NULL,
    prompt_tokens        BIGINT NOT NULL CHECK (prompt_tokens >= 0),
    completion_tokens    BIGINT NOT NULL CHECK (completion_tokens >= 0),
    cached_tokens        BIGINT NOT NULL CHECK (cached_tokens BETWEEN 0 AND prompt_tokens),
    usage_source         TEXT NOT NULL CHECK (usage_source IN ('reported', 'estimated')),
    -- In micro-units of `currency`, at the price in force when recorded;
    -- NULL when no price was (the call is not priced).
    cost_micros          BIGINT CHECK (cost_micros >= 0),
    price_effective_from BIGINT,
    currency             TEXT,
    recorded_at          BIGINT NOT NULL,
    CONSTRAINT usage_ledger_pkey PRIMARY KEY (attempt_id, owner_id),
    CHECK ((cost_micros IS NULL) = (currency IS NULL))
);
CREATE INDEX usage_ledger_recorded ON usage_ledger (recorded_at);
CREATE INDEX usage_ledger_owner_recorded ON usage_ledger (owner_id, recorded_at);
CREATE INDEX usage_ledger_job ON usage_ledger (job_id, owner_id);

-- An owner's monthly limits and the counters they are held to. `spent_*`
-- are the recorded costs of the month starting at `period_start` (reset
-- when a later month's first write comes); `reserved_*` what unfinished
-- jobs hold. A creation reserves with one conditional UPDATE of this row,
-- which the database serializes: the limit holds across processes.
CREATE TABLE budgets (
    owner_id            TEXT NOT NULL REFERENCES users (id),
    spend_limit_micros  BIGINT CHECK (spend_limit_micros >= 0),
    token_limit         BIGINT CHECK (token_limit >= 0),
    period_start        BIGINT NOT NULL,
    spent_micros        BIGINT NOT NULL DEFAULT 0,
    spent_tokens        BIGINT NOT NULL DEFAULT 0,
    reserved_micros     BIGINT NOT NULL DEFAULT 0 CHECK (reserved_micros >= 0),
    reserved_tokens     BIGINT NOT NULL DEFAULT 0 CHECK (reserved_tokens >= 0),
    updated_at          BIGINT NOT NULL,
    CONSTRAINT budgets_pkey PRIMARY KEY (owner_id)
);

-- What an unfinished job holds of its owner's budget: inserted with the
-- job, deleted (and given back) in the transaction that finishes it. The
-- delete happens once, so a reservation is given back once.
CREATE TABLE budget_reservations (
    job_id      TEXT NOT NULL,
    owner_id    TEXT NOT NULL,
    micros      BIGINT NOT NULL CHECK (micros >= 0),
    tokens      BIGINT NOT NULL CHECK (tokens >= 0),
    created_at  BIGINT NOT NULL,
    CONSTRAINT budget_reservations_pkey PRIMARY KEY (job_id, owner_id),
    CONSTRAINT budget_reservations_job_fkey FOREIGN KEY (job_id, owner_id)
        REFERENCES jobs (id, owner_id) ON DELETE CASCADE
);

-- Counts kept in each process's memory and added here every
-- `ledger.tally_flush_ms`: duplicates absorbed (a replay, a twin that
-- joined its job), creations a budget refused; and attempts withdrawn
-- unsent, added in the transaction that withdrew them. `job_id` is ''
-- for a count of no job (a refused creation).
CREATE TABLE usage_tallies (
    owner_id  TEXT NOT NULL,
    day       BIGINT NOT NULL,
    task      TEXT NOT NULL,
    provider  TEXT NOT NULL,
    job_id    TEXT NOT NULL,
    kind      TEXT NOT NULL CHECK (kind IN ('replayed', 'joined', 'refused_budget', 'withdrawn')),
    count     BIGINT NOT NULL CHECK (count >= 0),
    CONSTRAINT usage_tallies_pkey PRIMARY KEY (owner_id, day, task, provider, job_id, kind)
);
CREATE INDEX usage_tallies_day ON usage_tallies (day);

-- The Unknown backlog, sampled once a minute by whichever process comes
-- first: how many attempts were unknown and since when the oldest was.
CREATE TABLE backlog_samples (
    at                BIGINT NOT NULL,
    unknown_attempts  BIGINT NOT NULL CHECK (unknown_attempts >= 0),
    oldest_unknown_at BIGINT,
    CONSTRAINT backlog_samples_pkey PRIMARY KEY (at)
);
