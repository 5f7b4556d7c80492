//! The one application error type. Every use case answers with it; storage
//! errors are mapped here, in one place (not found → `NotFound`, pool
//! exhausted, a busy database or a full disk → `Unavailable`, anything
//! else → `Internal`, logged), and each
//! front end words it once (problem+json in `web::error`, a page in
//! `web::pages`).

use crate::domain::ledger::BudgetLimit;
use crate::domain::{AttemptId, AttemptState, AuditReasonError, JobId, JobStatus, Role, Timestamp};
use crate::store::operator::ActionError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// No such resource, or not the caller's to see (ids leak nothing).
    #[error("no such resource")]
    NotFound,
    /// The caller's role does not allow this; names the least role needed
    /// (support: support staff or an admin).
    #[error("{}", forbidden_detail(*.0))]
    Forbidden(Role),
    #[error("no task named {task:?} is configured")]
    UnknownTask { task: String, tasks: Vec<String> },
    #[error("provider {provider:?} is not in the chain of task {task:?}")]
    UnknownProvider {
        provider: String,
        task: String,
        chain: Vec<String>,
    },
    /// The input does not fit the task.
    #[error("{detail}")]
    InvalidInput {
        detail: String,
        field: Option<String>,
    },
    /// The request does not have the documented shape.
    #[error("{detail}")]
    InvalidBody {
        detail: String,
        field: Option<String>,
    },
    #[error("this idempotency key already created a job with a different payload; use a new key for a new job")]
    KeyReused { job_id: JobId },
    #[error("attempt {attempt_id} is {state}; a new attempt may start once it finishes or support abandons it")]
    AttemptInFlight {
        attempt_id: AttemptId,
        state: AttemptState,
    },
    #[error("the job is {0}; it takes no more attempts")]
    JobFinished(JobStatus),
    #[error("every provider of the task's chain has been tried on this job; name one explicitly")]
    ChainExhausted,
    #[error("provider {provider:?} has no current passing qualification for this task ({status})")]
    ProviderNotQualified {
        provider: String,
        status: String,
        allowed: Vec<String>,
    },
    #[error("the attempt is {0}; only an unknown attempt can be abandoned")]
    AttemptNotUnknown(AttemptState),
    #[error("the signature does not match this attempt, its X-Onejob-Timestamp and the body")]
    InvalidSignature,
    /// A correctly signed callback whose timestamp is outside the window.
    #[error("{}", callback_age(*age_seconds, *window_seconds))]
    CallbackExpired {
        age_seconds: i64,
        window_seconds: u64,
    },
    /// Client JSON nests deeper than the configured limit; nothing walked it.
    #[error("{0}; send a flatter document")]
    NestingTooDeep(#[from] crate::domain::json_depth::TooDeep),
    /// No server webhook key is configured (`webhooks.signing_key_env`).
    #[error(
        "webhooks are not enabled on this server: an operator sets webhooks.signing_key_env to \
         the name of an environment variable holding at least 32 random bytes \
         (e.g. `openssl rand -hex 32`) and restarts it"
    )]
    WebhooksOff,
    /// The owner has as many webhook endpoints as one may have.
    #[error(
        "you have {existing} webhook endpoints, the most one owner may have \
         (webhooks.max_endpoints_per_owner = {cap}); delete one you no longer use first"
    )]
    EndpointLimit { existing: usize, cap: usize },
    /// The owner's monthly budget has no room for this job's reservation.
    #[error("{0}")]
    BudgetExceeded(BudgetRefusal),
    /// The caller's token stopped being valid while its request ran
    /// (revoked, expired, or its user disabled): the middleware's refusal.
    #[error("the bearer token is not valid")]
    TokenRevoked,
    /// Busy for now; retrying (with the same idempotency key) is safe.
    #[error("{0}")]
    Unavailable(String),
    #[error("an internal error occurred; it has been logged")]
    Internal,
}

/// Which of an owner's limits refused a creation, and by how much.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetRefusal {
    /// Which limit it met.
    pub limit_name: BudgetLimit,
    /// The limit, in micro-units of `currency` or in tokens.
    pub limit: i64,
    /// What the month has spent and unfinished jobs hold.
    pub committed: i64,
    /// What this job would hold.
    pub wanted: i64,
    /// When the month's spend starts again from zero.
    pub resets_at: Timestamp,
    pub currency: String,
}

impl BudgetRefusal {
    fn amount(&self, value: i64) -> String {
        match self.limit_name {
            BudgetLimit::Spend => format!(
                "{} {}",
                crate::domain::ledger::format_micros(value),
                self.currency
            ),
            BudgetLimit::Tokens => format!("{value} tokens"),
        }
    }
}

impl std::fmt::Display for BudgetRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.limit_name {
            BudgetLimit::Spend => "spend",
            BudgetLimit::Tokens => "token",
        };
        write!(
            f,
            "the monthly {what} limit of {} is reached: {} spent or held by unfinished jobs, and \
             this job could use up to {}; the limit resets at {}",
            self.amount(self.limit),
            self.amount(self.committed),
            self.amount(self.wanted),
            self.resets_at.rfc3339(),
        )
    }
}

impl AppError {
    /// The refusal of a creation the owner's budget has no room for.
    pub fn budget_exceeded(refused: &crate::store::budgets::Refused, currency: &str) -> Self {
        let spend_hit = refused.limits.spend_micros.is_some_and(|limit| {
            refused
                .committed
                .micros
                .saturating_add(refused.wanted.micros)
                > limit
        });
        let (limit_name, limit, committed, wanted) = match (spend_hit, refused.limits) {
            (true, limits) => (
                BudgetLimit::Spend,
                limits.spend_micros.unwrap_or(0),
                refused.committed.micros,
                refused.wanted.micros,
            ),
            (false, limits) => (
                BudgetLimit::Tokens,
                limits.tokens.unwrap_or(0),
                refused.committed.tokens,
                refused.wanted.tokens,
            ),
        };
        Self::BudgetExceeded(BudgetRefusal {
            limit_name,
            limit,
            committed,
            wanted,
            resets_at: refused.resets_at,
            currency: currency.to_owned(),
        })
    }
}

fn callback_age(age_seconds: i64, window_seconds: u64) -> String {
    if age_seconds < 0 {
        format!(
            "the callback is signed {} s in the future; callbacks more than {window_seconds} s \
             from this server's clock are refused (check the clocks)",
            -age_seconds
        )
    } else {
        format!(
            "the callback was signed {age_seconds} s ago; callbacks older than {window_seconds} s \
             are refused: sign each delivery with the current time"
        )
    }
}

/// The words of [`AppError::Forbidden`]: the role needed, and those above it.
fn forbidden_detail(needed: Role) -> &'static str {
    match needed {
        Role::User => "this action needs a signed-in user",
        Role::Support => "this action needs the support or admin role",
        Role::Admin => "this action needs the admin role",
    }
}

impl AppError {
    pub fn invalid_body(detail: impl Into<String>) -> Self {
        Self::InvalidBody {
            detail: detail.into(),
            field: None,
        }
    }

    pub fn invalid_input(detail: impl Into<String>) -> Self {
        Self::InvalidInput {
            detail: detail.into(),
            field: None,
        }
    }

    /// An operator's reason that does not parse.
    pub fn bad_reason(error: AuditReasonError) -> Self {
        Self::InvalidBody {
            detail: error.to_string(),
            field: Some("reason".into()),
        }
    }
}

impl From<StoreError> for AppError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::NotFound => Self::NotFound,
            StoreError::PoolExhausted(source) => {
                tracing::warn!(error = %source, "no database connection free in time");
                Self::Unavailable("the database is busy; retry shortly".into())
            }
            StoreError::Busy(reason) | StoreError::ConnectionLost(reason) => {
                tracing::warn!(%reason, "the database could not serve the request now");
                Self::Unavailable(
                    "the database is busy or briefly unavailable; retry shortly with the same key"
                        .into(),
                )
            }
            StoreError::DiskFull(reason) => {
                tracing::error!(%reason, "the database's disk is full: nothing can be written until an operator frees space");
                Self::Unavailable(
                    "the database's disk is full, so nothing was stored; retry later with the same key"
                        .into(),
                )
            }
            other => {
                tracing::error!(error = %other, "storage error");
                Self::Internal
            }
        }
    }
}

impl From<ActionError> for AppError {
    fn from(error: ActionError) -> Self {
        match error {
            ActionError::JobNotFound | ActionError::AttemptNotFound => Self::NotFound,
            ActionError::JobFinished(status) => Self::JobFinished(status),
            ActionError::InFlight { attempt_id, state } => {
                Self::AttemptInFlight { attempt_id, state }
            }
            ActionError::ChainExhausted => Self::ChainExhausted,
            ActionError::NotUnknown(state) => Self::AttemptNotUnknown(state),
            ActionError::Store(e) => e.into(),
        }
    }
}

pub type AppResult<T> = Result<T, AppError>;
