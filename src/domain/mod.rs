//! The pure domain: identifiers, idempotency keys, the payload fingerprint and the
//! attempt/job state machine. Nothing in here does I/O.

pub mod fingerprint;
pub mod idempotency_key;
pub mod ids;
pub mod role;
pub mod state;

pub use fingerprint::{canonical_json, Fingerprint, JobIntent};
pub use idempotency_key::{IdempotencyKey, IdempotencyKeyError};
pub use ids::{AttemptId, JobId, UserId};
pub use role::Role;
pub use state::{
    failover_order, may_start_attempt, next_provider, AttemptEvent, AttemptOutcome, AttemptState,
    JobStatus, NewAttemptRefusal, TransitionError,
};
