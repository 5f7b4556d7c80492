//! Diesel table definitions, kept in step with both `migrations/` folders by hand
//! (the same column names and types on SQLite and PostgreSQL).
//!
//! `jobs`, `attempts`, `race_log`, `audit_log` and `stream_chunks` are one owner's rows: in
//! the database their primary keys are `(id, owner_id)`, ready to be
//! distributed by owner (docs/scaling.md). Here each is keyed by its `id`
//! alone, the UUIDv7 that identifies a row by itself: what `find` and the
//! joins below use.

diesel::table! {
    users (id) {
        id -> Text,
        name -> Text,
        role -> Text,
        created_at -> BigInt,
        password_hash -> Nullable<Text>,
        disabled_at -> Nullable<BigInt>,
        last_sign_in_at -> Nullable<BigInt>,
        name_folded -> Nullable<Text>,
    }
}

diesel::table! {
    sessions (id) {
        id -> Text,
        token_sha256 -> Text,
        user_id -> Text,
        created_at -> BigInt,
        expires_at -> BigInt,
    }
}

diesel::table! {
    sign_in_throttle (scope) {
        scope -> Text,
        failures -> Integer,
        last_failure_at -> BigInt,
        blocked_until -> BigInt,
    }
}

diesel::table! {
    api_tokens (id) {
        id -> Text,
        user_id -> Text,
        token_sha256 -> Text,
        created_at -> BigInt,
        expires_at -> Nullable<BigInt>,
    }
}

diesel::table! {
    jobs (id) {
        id -> Text,
        owner_id -> Text,
        idempotency_key -> Text,
        task -> Text,
        provider -> Text,
        requested_provider -> Nullable<Text>,
        input -> Text,
        params -> Text,
        fingerprint -> Text,
        status -> Text,
        version -> BigInt,
        result -> Nullable<Text>,
        completed_by -> Nullable<Text>,
        /// A failed job's reason: its summary (`failure_kind` and
        /// `failure_detail` are the rest, `domain::outcome::Reason`).
        failure_reason -> Nullable<Text>,
        created_at -> BigInt,
        updated_at -> BigInt,
        failure_kind -> Nullable<Text>,
        failure_detail -> Nullable<Text>,
        /// The job's trace (`domain::TraceContext::to_column`), when
        /// tracing was on as it was created.
        trace_context -> Nullable<Text>,
    }
}

diesel::table! {
    attempts (id) {
        id -> Text,
        job_id -> Text,
        number -> Integer,
        provider -> Text,
        state -> Text,
        outcome -> Nullable<Text>,
        version_read -> Nullable<BigInt>,
        lease_owner -> Nullable<Text>,
        lease_expires_at -> Nullable<BigInt>,
        created_at -> BigInt,
        started_at -> Nullable<BigInt>,
        timeout_at -> Nullable<BigInt>,
        finished_at -> Nullable<BigInt>,
        /// Why it failed, is unknown or was closed: the reason's summary
        /// (`error_kind` and `error_detail` are the rest).
        error -> Nullable<Text>,
        sent_at -> Nullable<BigInt>,
        /// The job's owner.
        owner_id -> Text,
        not_before -> Nullable<BigInt>,
        error_kind -> Nullable<Text>,
        error_detail -> Nullable<Text>,
    }
}

diesel::table! {
    race_log (id) {
        id -> Text,
        job_id -> Text,
        losing_attempt_id -> Text,
        winning_attempt_id -> Nullable<Text>,
        reason -> Text,
        version_read -> BigInt,
        version_found -> BigInt,
        provider -> Text,
        payload_sha256 -> Text,
        loser_started_at -> Nullable<BigInt>,
        lost_at -> BigInt,
        /// The job's owner.
        owner_id -> Text,
    }
}

diesel::table! {
    audit_log (id) {
        id -> Text,
        actor_id -> Text,
        action -> Text,
        job_id -> Nullable<Text>,
        attempt_id -> Nullable<Text>,
        reason -> Text,
        at -> BigInt,
        subject_user_id -> Nullable<Text>,
        /// Whom the entry is filed under: the job's owner, the account
        /// acted on, or else the actor.
        owner_id -> Text,
    }
}

diesel::table! {
    /// A streamed answer's chunks, numbered from 1 per job
    /// (`store::stream_chunks`).
    stream_chunks (job_id, owner_id, seq) {
        job_id -> Text,
        owner_id -> Text,
        seq -> BigInt,
        attempt_id -> Text,
        delta -> Text,
        created_at -> BigInt,
    }
}

diesel::joinable!(api_tokens -> users (user_id));
diesel::joinable!(attempts -> jobs (job_id));
diesel::joinable!(race_log -> jobs (job_id));

diesel::joinable!(sessions -> users (user_id));

diesel::allow_tables_to_appear_in_same_query!(
    users,
    api_tokens,
    jobs,
    attempts,
    race_log,
    audit_log,
    sessions,
    sign_in_throttle,
    qualifications,
    stream_chunks
);
diesel::joinable!(jobs -> users (owner_id));
diesel::joinable!(audit_log -> users (actor_id));

diesel::table! {
    qualifications (id) {
        id -> Text,
        provider -> Text,
        model -> Text,
        task -> Text,
        template_sha256 -> Text,
        output_schema_sha256 -> Text,
        passed -> Bool,
        checks -> Text,
        round_trip_ms -> BigInt,
        qualified_at -> BigInt,
    }
}

diesel::table! {
    /// A webhook endpoint of one owner (`store::webhooks`).
    webhook_endpoints (id) {
        id -> Text,
        owner_id -> Text,
        url -> Text,
        enabled -> Bool,
        disabled_reason -> Nullable<Text>,
        disabled_at -> Nullable<BigInt>,
        generation -> BigInt,
        previous_generation_valid_until -> Nullable<BigInt>,
        secret_fingerprint -> Text,
        retry_for_ms -> BigInt,
        consecutive_failures -> Integer,
        failing_since -> Nullable<BigInt>,
        created_at -> BigInt,
        updated_at -> BigInt,
    }
}

diesel::table! {
    /// The event kinds an endpoint is subscribed to, one row each
    /// (`store::webhooks`).
    webhook_subscriptions (owner_id, endpoint_id, kind) {
        owner_id -> Text,
        endpoint_id -> Text,
        kind -> Text,
    }
}

diesel::table! {
    /// The webhook outbox: one row per (event, endpoint).
    webhook_events (id) {
        id -> Text,
        owner_id -> Text,
        endpoint_id -> Text,
        job_id -> Text,
        kind -> Text,
        subject -> Text,
        webhook_id -> Text,
        body -> Text,
        state -> Text,
        attempts -> Integer,
        next_attempt_at -> BigInt,
        window_start_at -> BigInt,
        lease_owner -> Nullable<Text>,
        lease_expires_at -> Nullable<BigInt>,
        delivered_at -> Nullable<BigInt>,
        created_at -> BigInt,
        /// Its job's trace, copied when the event was recorded.
        trace_context -> Nullable<Text>,
    }
}

diesel::table! {
    /// Each delivery attempt of a webhook event.
    webhook_deliveries (id) {
        id -> Text,
        owner_id -> Text,
        event_id -> Text,
        endpoint_id -> Text,
        number -> Integer,
        outcome -> Text,
        status_code -> Nullable<Integer>,
        error -> Nullable<Text>,
        latency_ms -> BigInt,
        response_body -> Nullable<Text>,
        at -> BigInt,
    }
}

diesel::joinable!(webhook_events -> webhook_endpoints (endpoint_id));
diesel::joinable!(webhook_deliveries -> webhook_events (event_id));
diesel::joinable!(webhook_subscriptions -> webhook_endpoints (endpoint_id));
diesel::allow_tables_to_appear_in_same_query!(
    webhook_endpoints,
    webhook_subscriptions,
    webhook_events,
    webhook_deliveries,
    jobs
);

diesel::table! {
    /// One row per provider call that answered (docs/design.md, "Usage,
    /// prices and budgets").
    usage_ledger (attempt_id, owner_id) {
        attempt_id -> Text,
        owner_id -> Text,
        job_id -> Text,
        task -> Text,
        provider -> Text,
        model -> Text,
        kind -> Text,
        late -> Bool,
        prompt_tokens -> BigInt,
        completion_tokens -> BigInt,
        cached_tokens -> BigInt,
        usage_source -> Text,
        cost_micros -> Nullable<BigInt>,
        price_effective_from -> Nullable<BigInt>,
        currency -> Nullable<Text>,
        recorded_at -> BigInt,
    }
}

diesel::table! {
    /// An owner's monthly limits and the counters held to them.
    budgets (owner_id) {
        owner_id -> Text,
        spend_limit_micros -> Nullable<BigInt>,
        token_limit -> Nullable<BigInt>,
        period_start -> BigInt,
        spent_micros -> BigInt,
        spent_tokens -> BigInt,
        reserved_micros -> BigInt,
        reserved_tokens -> BigInt,
        updated_at -> BigInt,
    }
}

diesel::table! {
    /// What an unfinished job holds of its owner's budget.
    budget_reservations (job_id, owner_id) {
        job_id -> Text,
        owner_id -> Text,
        micros -> BigInt,
        tokens -> BigInt,
        created_at -> BigInt,
    }
}

diesel::table! {
    /// Duplicates absorbed and requests never sent, counted per day.
    usage_tallies (owner_id, day, task, provider, job_id, kind) {
        owner_id -> Text,
        day -> BigInt,
        task -> Text,
        provider -> Text,
        job_id -> Text,
        kind -> Text,
        count -> BigInt,
    }
}

diesel::table! {
    /// The Unknown backlog, sampled once a minute.
    backlog_samples (at) {
        at -> BigInt,
        unknown_attempts -> BigInt,
        oldest_unknown_at -> Nullable<BigInt>,
    }
}
