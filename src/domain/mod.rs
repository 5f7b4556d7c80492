//! The pure domain: identifiers, idempotency keys, the payload fingerprint, the
//! attempt/job state machine, the outcome vocabulary and the failover gate.
//! Nothing in here does I/O. (Ids and state enums derive diesel's expression
//! markers so that rows can hold them; their SQL conversion is in the store.)

pub mod audit;
pub mod callback_key;
pub mod failover;
pub mod fingerprint;
pub mod guards;
pub mod idempotency_key;
pub mod ids;
pub mod jcs;
pub mod json_depth;
pub mod json_text;
pub mod ledger;
pub mod outcome;
pub mod password;
pub mod reason;
pub mod responses;
pub mod retry;
pub mod role;
pub mod secret;
pub mod state;
pub mod stream;
pub mod throttle;
pub mod time;
pub mod trace_context;
pub mod usage;
pub mod webhook;

pub use audit::AuditAction;
pub use callback_key::{CallbackKey, CallbackRefusal};
pub use failover::{failover_order, next_provider, AllowedProviders, QualificationStatus};
pub use fingerprint::{canonical_json, sha256_hex, Fingerprint, JobIntent};
pub use idempotency_key::{IdempotencyKey, IdempotencyKeyError};
pub use ids::{AttemptId, JobId, UserId};
pub use json_text::JsonText;
pub use outcome::{Applied, Outcome, RaceResult, Reason, ReasonKind, Refusal};
pub use reason::{AuditReason, AuditReasonError};
pub use retry::{OnRateLimit, RetryPolicy};
pub use role::Role;
pub use secret::Secret;
pub use state::{
    may_start_attempt, on_cancel, AttemptEvent, AttemptState, CancelDecision, JobStatus,
    NewAttemptRefusal, TransitionError,
};
pub use time::Timestamp;
pub use trace_context::TraceContext;
pub use usage::{Usage, UsageSource};
