//! Creating a job: the request is validated against the task's contract and
//! fingerprinted, then the store inserts it under (owner, key) or finds the
//! job that key already made. A refusal here stores nothing, so it never
//! reserves the key.

use serde_json::Value;

use super::{App, AppError, AppResult, Attempt, Job, User};
use crate::contracts::TaskContract;
use crate::domain::{Fingerprint, IdempotencyKey, JobIntent, JsonText};
use crate::store::jobs::{self as job_store, CreateOutcome, NewJob};

/// What a client asks for.
#[derive(Debug, Clone, Default)]
pub struct JobRequest {
    pub task: String,
    pub input: Value,
    /// A provider of the task's chain to try first.
    pub provider: Option<String>,
    pub params: Option<Value>,
}

/// A job as creation left it.
#[derive(Debug)]
pub struct JobCreation {
    pub job: Job,
    pub attempts: Vec<Attempt>,
    /// True when the key had already made this job with the same payload.
    pub replayed: bool,
}

/// Checks the input against the task's rules: a JSON object whose required
/// fields are non-empty strings, valid against the input schema.
fn check_input(contract: &TaskContract, input: &Value) -> AppResult<()> {
    let object = input
        .as_object()
        .ok_or_else(|| AppError::invalid_input("`input` must be a JSON object"))?;
    for field in &contract.definition.input_fields {
        match object.get(field) {
            Some(Value::String(s)) if !s.trim().is_empty() => {}
            _ => {
                return Err(AppError::InvalidInput {
                    detail: format!(
                        "task {:?} needs `input.{field}` as a non-empty string",
                        contract.name()
                    ),
                    field: Some(format!("input.{field}")),
                })
            }
        }
    }
    contract.check_input(input).map_err(AppError::invalid_input)
}

/// A provider named by a client must belong to the task's chain.
pub fn require_in_chain(contract: &TaskContract, provider: Option<&str>) -> AppResult<()> {
    match provider {
        Some(p) if !contract.chain().iter().any(|c| c == p) => Err(AppError::UnknownProvider {
            provider: p.to_owned(),
            task: contract.name().to_owned(),
            chain: contract.chain().to_vec(),
        }),
        _ => Ok(()),
    }
}

impl App {
    /// Validates and fingerprints a request. Nothing is stored.
    fn prepare_job(
        &self,
        owner: &User,
        key: IdempotencyKey,
        request: JobRequest,
    ) -> AppResult<NewJob> {
        let contracts = &self.config().contracts;
        let contract = contracts
            .get(&request.task)
            .ok_or_else(|| AppError::UnknownTask {
                task: request.task.clone(),
                tasks: contracts.names(),
            })?;
        require_in_chain(&contract, request.provider.as_deref())?;
        check_input(&contract, &request.input)?;
        let params = request
            .params
            .unwrap_or_else(|| Value::Object(Default::default()));
        if !params.is_object() {
            return Err(AppError::invalid_body("`params` must be a JSON object"));
        }
        let fingerprint = Fingerprint::of(&JobIntent {
            task: contract.name(),
            input: &request.input,
            params: &params,
            provider: request.provider.as_deref(),
        });
        Ok(NewJob {
            owner_id: owner.id.clone(),
            key,
            task: contract.name().to_owned(),
            provider: request
                .provider
                .clone()
                .unwrap_or_else(|| contract.chain()[0].clone()),
            requested_provider: request.provider,
            input: JsonText::from_value(&request.input),
            params: JsonText::from_value(&params),
            fingerprint: fingerprint.as_str().to_owned(),
        })
    }

    /// Creates the job `owner`'s key names, or returns the one it already
    /// made (same payload), or refuses (different payload: `KeyReused`).
    pub async fn create_job(
        &self,
        owner: &User,
        key: IdempotencyKey,
        request: JobRequest,
    ) -> AppResult<JobCreation> {
        let new_job = self.prepare_job(owner, key, request)?;
        let outcome = self
            .store()
            .run(move |conn| {
                let outcome = job_store::create_job(conn, &new_job)?;
                let attempts = match &outcome {
                    CreateOutcome::KeyReused { .. } => Vec::new(),
                    CreateOutcome::Created(job) | CreateOutcome::Replayed(job) => {
                        job_store::attempts_of(conn, &job.id)?
                    }
                };
                Ok((outcome, attempts))
            })
            .await?;
        match outcome {
            (CreateOutcome::Created(job), attempts) => {
                self.notify_queued();
                self.metrics().jobs_created.inc();
                tracing::info!(job_id = %job.id, "job created");
                Ok(JobCreation {
                    job,
                    attempts,
                    replayed: false,
                })
            }
            (CreateOutcome::Replayed(job), attempts) => {
                self.metrics().jobs_replayed.inc();
                Ok(JobCreation {
                    job,
                    attempts,
                    replayed: true,
                })
            }
            (CreateOutcome::KeyReused { existing_job_id }, _) => {
                self.metrics().key_conflicts.inc();
                Err(AppError::KeyReused {
                    job_id: existing_job_id,
                })
            }
        }
    }
}
