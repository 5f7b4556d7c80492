//! What the JSON API and the browser forms share: turning a request into a
//! validated, fingerprinted [`NewJob`], and the wording of refusals.

use serde_json::Value;

use super::error::{ApiError, ProblemType};
use super::views::CreateJobRequest;
use crate::config::{Config, TaskConfig};
use crate::domain::{Fingerprint, IdempotencyKey, JobIntent};
use crate::store::attempts::{AbandonError, JobActionError};
use crate::store::jobs::NewJob;
use crate::tasks::Tasks;

/// Checks the input against the task's rules: a JSON object whose required
/// fields are non-empty strings.
pub fn check_input(task: &TaskConfig, input: &Value) -> Result<(), ApiError> {
    let object = input
        .as_object()
        .ok_or_else(|| ApiError::new(ProblemType::InvalidInput, "`input` must be a JSON object"))?;
    for field in &task.input_fields {
        match object.get(field) {
            Some(Value::String(s)) if !s.trim().is_empty() => {}
            _ => {
                return Err(ApiError::new(
                    ProblemType::InvalidInput,
                    format!(
                        "task {:?} needs `input.{field}` as a non-empty string",
                        task.name
                    ),
                )
                .with("field", format!("input.{field}")))
            }
        }
    }
    Ok(())
}

/// A provider named by a client must belong to the task's chain.
pub fn require_in_chain(
    task: &str,
    chain: &[String],
    provider: Option<&String>,
) -> Result<(), ApiError> {
    match provider {
        Some(p) if !chain.contains(p) => Err(ApiError::new(
            ProblemType::UnknownProvider,
            format!("provider {p:?} is not in the chain of task {task:?}"),
        )
        .with("providers", chain.to_vec())),
        _ => Ok(()),
    }
}

/// Validates a creation request and fingerprints its intent. Nothing is
/// stored, so a refusal here never reserves the key.
pub fn prepare_job(
    config: &Config,
    tasks: &Tasks,
    owner_id: &str,
    key: IdempotencyKey,
    body: CreateJobRequest,
) -> Result<NewJob, ApiError> {
    let task = config.task(&body.task).ok_or_else(|| {
        ApiError::new(
            ProblemType::UnknownTask,
            format!("no task named {:?} is configured", body.task),
        )
        .with(
            "tasks",
            config
                .tasks
                .iter()
                .map(|t| t.name.clone())
                .collect::<Vec<_>>(),
        )
    })?;
    require_in_chain(&task.name, &task.providers, body.provider.as_ref())?;
    check_input(task, &body.input)?;
    if let Some(spec) = tasks.get(&task.name) {
        spec.check_input(&body.input)
            .map_err(|reason| ApiError::new(ProblemType::InvalidInput, reason))?;
    }
    let params = body
        .params
        .unwrap_or_else(|| Value::Object(Default::default()));
    if !params.is_object() {
        return Err(ApiError::new(
            ProblemType::InvalidBody,
            "`params` must be a JSON object",
        ));
    }
    let fingerprint = Fingerprint::of(&JobIntent {
        task: &task.name,
        input: &body.input,
        params: &params,
        provider: body.provider.as_deref(),
    });
    Ok(NewJob {
        owner_id: owner_id.to_owned(),
        key,
        task: task.name.clone(),
        provider: body
            .provider
            .clone()
            .unwrap_or_else(|| task.providers[0].clone()),
        requested_provider: body.provider,
        input: body.input,
        params,
        fingerprint: fingerprint.as_str().to_owned(),
    })
}

/// Why a new attempt was refused, as a problem.
pub fn job_action_problem(error: JobActionError) -> ApiError {
    match error {
        JobActionError::JobNotFound => ApiError::not_found(),
        JobActionError::JobFinished(status) => {
            ApiError::new(ProblemType::JobFinished, format!("the job is {status}; it takes no more attempts"))
                .with("job_status", status.as_str())
        }
        JobActionError::InFlight { attempt_id, state } => ApiError::new(
            ProblemType::AttemptInFlight,
            format!(
                "attempt {attempt_id} is {state}; a new attempt may start once it finishes or support abandons it"
            ),
        )
        .with("attempt_id", attempt_id)
        .with("attempt_state", state.as_str()),
        JobActionError::ChainExhausted => ApiError::new(
            ProblemType::ChainExhausted,
            "every provider of the task's chain has been tried on this job; name one explicitly",
        ),
        JobActionError::Store(e) => e.into(),
    }
}

/// Why an abandon was refused, as a problem.
pub fn abandon_problem(error: AbandonError) -> ApiError {
    match error {
        AbandonError::NotFound => ApiError::not_found(),
        AbandonError::NotUnknown(s) => ApiError::new(
            ProblemType::AttemptNotUnknown,
            format!("the attempt is {s}; only an unknown attempt can be abandoned"),
        )
        .with("attempt_state", s.as_str()),
        AbandonError::Store(e) => e.into(),
    }
}

/// Checks an operator's reason: required, trimmed, at most 2000 characters.
pub fn operator_reason(raw: &str) -> Result<String, ApiError> {
    const MAX_REASON_LEN: usize = 2000;
    let reason = raw.trim();
    if reason.is_empty() {
        return Err(
            ApiError::new(ProblemType::InvalidBody, "a reason is required").with("field", "reason"),
        );
    }
    if reason.chars().count() > MAX_REASON_LEN {
        return Err(ApiError::new(
            ProblemType::InvalidBody,
            format!("the reason is longer than {MAX_REASON_LEN} characters"),
        )
        .with("field", "reason"));
    }
    Ok(reason.to_owned())
}

/// Refuses a named provider that may not take a new attempt on this job.
pub fn require_allowed(
    provider: Option<&str>,
    allowed: &[String],
    skipped: &[String],
) -> Result<(), ApiError> {
    match provider {
        Some(p) if !allowed.iter().any(|a| a == p) => {
            let status = skipped
                .iter()
                .find(|s| s.starts_with(&format!("{p} (")))
                .cloned()
                .unwrap_or_default();
            Err(ApiError::new(
                ProblemType::ProviderNotQualified,
                format!(
                    "provider {p:?} has no current passing qualification for this task ({status})"
                ),
            )
            .with("allowed_providers", allowed.to_vec()))
        }
        _ => Ok(()),
    }
}
