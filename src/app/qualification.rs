//! Contract qualification: before automatic failover may go to a provider, it
//! must show that it honours the task's contract. A run checks that the
//! template renders for every golden input, that the prompt fits the
//! provider's context budget, and that at the task's low temperature every
//! golden answer is JSON, validates against the output schema and meets the
//! golden expectations; the round trip is timed. The result is stored, bound to
//! (provider, model, task, template hash, output-schema hash): change any of
//! them and it no longer counts (see [`super::gate`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::dispatch::Dispatch;
use super::{App, AppError, AppResult, User};
use crate::contracts::{golden_mismatches, GoldenExample, TaskContract};
use crate::domain::{AuditAction, JsonText, Outcome, Timestamp};
use crate::providers::Provider;
use crate::store::operator::{record_audit, Audited};
use crate::store::{qualifications, QualificationRun};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    pub passed: bool,
    pub detail: String,
}

impl Check {
    fn new(name: impl Into<String>, passed: bool, detail: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            passed,
            detail: detail.into(),
        }
    }
}

/// The outcome of one qualification run.
#[derive(Debug, Clone)]
pub struct Report {
    pub provider: String,
    pub model: String,
    pub task: String,
    pub checks: Vec<Check>,
    pub round_trip: Duration,
    pub template_sha256: String,
    pub output_schema_sha256: String,
}

impl Report {
    pub fn passed(&self) -> bool {
        !self.checks.is_empty() && self.checks.iter().all(|c| c.passed)
    }

    pub fn first_failure(&self) -> Option<&Check> {
        self.checks.iter().find(|c| !c.passed)
    }

    pub fn to_run(&self) -> QualificationRun {
        QualificationRun {
            id: uuid::Uuid::now_v7().to_string(),
            provider: self.provider.clone(),
            model: self.model.clone(),
            task: self.task.clone(),
            template_sha256: self.template_sha256.clone(),
            output_schema_sha256: self.output_schema_sha256.clone(),
            passed: self.passed(),
            checks: serde_json::to_string(&self.checks).expect("checks serialize"),
            round_trip_ms: self.round_trip.as_millis() as i64,
            qualified_at: Timestamp::now(),
        }
    }

    /// One line for the audit log.
    pub fn summary(&self) -> String {
        match self.first_failure() {
            None => format!("qualified {} for {}", self.provider, self.task),
            Some(check) => format!(
                "qualification of {} for {} failed: {}: {}",
                self.provider, self.task, check.name, check.detail
            ),
        }
    }
}

/// Runs the task's contract against the provider. Calls are real calls, with a
/// request id of their own (`qualify-…`), bounded by the provider's soft timeout.
///
/// Only the checks the task has are run and reported: "template renders"
/// for a task with a template, the output schema for a task with one. A
/// chat route's golden inputs are requests: its budget counts their
/// messages and their own token limit, else the provider's `max_tokens`.
pub async fn check_contract(provider: &Arc<Provider>, contract: &Arc<TaskContract>) -> Report {
    let started = Instant::now();
    let mut checks = Vec::new();
    let goldens = &contract.definition.golden;
    if goldens.is_empty() {
        checks.push(Check::new(
            "golden examples",
            false,
            "the task has no golden examples to run",
        ));
    }
    let has_template = !contract.is_chat() && contract.definition.template.is_some();
    // Render every golden prompt first: nothing is sent if one does not render.
    let prompts = render_goldens(contract, &mut checks);
    if prompts.len() == goldens.len() && !goldens.is_empty() {
        if has_template {
            checks.push(Check::new(
                "template renders",
                true,
                format!("for all {} golden inputs", goldens.len()),
            ));
        }
        let budget = budget_check(provider, contract, &prompts).await;
        let fits = budget.passed;
        checks.push(budget);
        if fits {
            for (i, golden) in goldens.iter().enumerate() {
                checks.push(golden_check(provider, contract, i, golden).await);
            }
        }
    }
    let round_trip = started.elapsed();
    if checks.iter().all(|c| c.passed) && !checks.is_empty() {
        checks.push(Check::new(
            "round trip",
            true,
            format!(
                "{} ms for {} golden calls",
                round_trip.as_millis(),
                goldens.len()
            ),
        ));
    }
    Report {
        provider: provider.name().to_owned(),
        model: provider.settings.model_name().to_owned(),
        task: contract.name().to_owned(),
        checks,
        round_trip,
        template_sha256: contract.template_sha256.clone(),
        output_schema_sha256: contract.output_schema_sha256.clone(),
    }
}

/// The prompt of every golden input that renders; a failed check for each
/// one that does not.
fn render_goldens(contract: &TaskContract, checks: &mut Vec<Check>) -> Vec<String> {
    let mut prompts = Vec::new();
    for (i, golden) in contract.definition.golden.iter().enumerate() {
        match prompt_of(contract, &golden.input) {
            Ok(prompt) => prompts.push(prompt),
            Err(e) => checks.push(Check::new(
                format!("golden[{i}] template renders"),
                false,
                e,
            )),
        }
    }
    prompts
}

/// Whether the longest golden prompt, with the most tokens its answer may
/// take, fits the provider's context budget.
async fn budget_check(
    provider: &Arc<Provider>,
    contract: &TaskContract,
    prompts: &[String],
) -> Check {
    let settings = &provider.settings;
    let budget = settings.context_budget();
    let mut counted = Vec::with_capacity(prompts.len());
    for (prompt, golden) in prompts.iter().zip(&contract.definition.golden) {
        // The provider's own tokenizer where it has one (a count call,
        // never an attempt), else tiktoken or an estimate.
        let (tokens, method) = provider.count_tokens(prompt).await;
        counted.push((
            tokens,
            method,
            answer_limit(contract, settings, &golden.input),
        ));
    }
    let (longest, method, answer_limit) = counted
        .into_iter()
        .max_by_key(|(tokens, _, limit)| u64::from(*tokens) + limit)
        .unwrap_or((0, "none", u64::from(settings.max_tokens)));
    let needed = u64::from(longest) + answer_limit;
    let what = if contract.is_chat() {
        "request"
    } else {
        "prompt"
    };
    Check::new(
        "fits the context budget",
        needed <= u64::from(budget),
        format!(
            "longest {what} {longest} tokens ({method}) + max_tokens {answer_limit} = {needed}, budget {budget}"
        ),
    )
}

/// The text a golden input puts in front of the provider: the rendered
/// prompt, or a chat request's messages.
fn prompt_of(contract: &TaskContract, input: &serde_json::Value) -> Result<String, String> {
    if !contract.is_chat() {
        return contract.render_prompt(input);
    }
    let read = crate::chat::openai_chat::read_request(input).map_err(|refused| refused.message)?;
    Ok(read
        .request
        .messages
        .iter()
        .map(crate::chat::Message::text)
        .collect::<Vec<_>>()
        .join("\n"))
}

/// The answer's token limit a call of this golden input is sent with.
fn answer_limit(
    contract: &TaskContract,
    settings: &crate::providers::ProviderSettings,
    input: &serde_json::Value,
) -> u64 {
    let own = contract
        .is_chat()
        .then(|| crate::chat::openai_chat::read_request(input).ok())
        .flatten()
        .and_then(|read| read.request.sampling.max_tokens);
    own.unwrap_or(u64::from(settings.max_tokens))
}

/// What a passing golden answer showed, naming only the checks the task has.
fn passed_detail(contract: &TaskContract, golden: &GoldenExample) -> String {
    let mut held = vec![if contract.is_chat() {
        "an answer"
    } else {
        "JSON"
    }];
    if contract.definition.output_schema.is_some() {
        held.push("valid against the output schema");
    }
    held.push(if golden.expect.is_empty() {
        "no expectations to meet"
    } else {
        "expectations met"
    });
    held.join(", ")
}

async fn golden_check(
    provider: &Arc<Provider>,
    contract: &Arc<TaskContract>,
    i: usize,
    golden: &GoldenExample,
) -> Check {
    let name = format!("golden[{i}] answer");
    let dispatch = match Dispatch::new(
        provider.clone(),
        contract.clone(),
        &JsonText::from_value(&golden.input),
        format!("qualify-{}", uuid::Uuid::now_v7()),
        // Not a job's attempt: a simulated provider's script does not apply.
        0,
        Some(contract.definition.temperature),
        None,
    ) {
        Ok(dispatch) => dispatch,
        Err(outcome) => {
            return Check::new(
                name,
                false,
                outcome
                    .reason()
                    .map(ToString::to_string)
                    .unwrap_or_default(),
            )
        }
    };
    // Room under the provider's limits first (a Retry-After pause waited
    // out): the timeout measures the call alone.
    let mut slot = provider.limiter().admit(dispatch.estimated_tokens()).await;
    slot.sending();
    let timed = tokio::time::timeout(provider.soft_timeout(), dispatch.send())
        .await
        .map(|reply| {
            if let Some(tokens) = reply.tokens_used() {
                slot.settle_tokens(tokens);
            }
            reply.outcome
        });
    drop(slot);
    match timed {
        Err(_) => Check::new(
            name,
            false,
            format!(
                "no answer within the provider's soft timeout of {} ms (`timeout_ms`)",
                provider.soft_timeout().as_millis()
            ),
        ),
        Ok(Outcome::Failed(reason)) | Ok(Outcome::Unknown(reason)) => {
            Check::new(name, false, reason.to_string())
        }
        Ok(Outcome::Refused(refusal)) => Check::new(name, false, refusal.reason.to_string()),
        Ok(Outcome::Succeeded(answer)) => {
            let mismatches = golden_mismatches(&golden.expect, &answer);
            if mismatches.is_empty() {
                Check::new(name, true, passed_detail(contract, golden))
            } else {
                Check::new(
                    name,
                    false,
                    format!("golden expectations not met: {}", mismatches.join("; ")),
                )
            }
        }
    }
}

impl App {
    /// Runs a task's contract against a provider now and records the run (and,
    /// when an admin asked for it, an audit entry). Admins only, when an actor
    /// is given; the CLI runs it as the operator of the machine.
    pub async fn qualify(
        &self,
        actor: Option<&User>,
        provider: &str,
        task: &str,
    ) -> AppResult<Report> {
        if let Some(actor) = actor {
            super::require_admin(actor)?;
        }
        let provider = self.providers().get(provider).ok_or_else(|| {
            AppError::invalid_body(format!("no provider named {provider:?} is configured"))
        })?;
        let contract = self.config().contracts.get(task).ok_or_else(|| {
            AppError::invalid_body(format!("no task named {task:?} is configured"))
        })?;
        if !contract.chain().iter().any(|p| p == provider.name()) {
            return Err(AppError::UnknownProvider {
                provider: provider.name().to_owned(),
                task: task.to_owned(),
                chain: contract.chain().to_vec(),
            });
        }
        let report = check_contract(&provider, &contract).await;
        let run = report.to_run();
        let audit = actor.map(|a| (a.id.clone(), report.summary()));
        self.store()
            .run(move |conn| {
                qualifications::record(conn, &run)?;
                if let Some((actor, summary)) = audit {
                    // About no one's job: filed under its actor.
                    record_audit(
                        conn,
                        &actor,
                        AuditAction::Qualify,
                        Audited::Nothing,
                        &summary,
                        Timestamp::now(),
                    )?;
                }
                Ok(())
            })
            .await?;
        Ok(report)
    }

    /// Qualifies every simulated provider for every task whose chain holds it,
    /// unless a current run exists. Simulated providers are offline and
    /// deterministic, so this is cheap, and it lets the built-in demo fail
    /// over. Runs in the background at start; the failover gate waits for it.
    pub fn qualify_simulated_in_background(&self) {
        self.inner.startup_qualified.send_replace(false);
        let app = self.clone();
        tokio::spawn(async move {
            app.qualify_simulated().await;
            app.inner.startup_qualified.send_replace(true);
        });
    }

    async fn qualify_simulated(&self) {
        let mut due = Vec::new();
        for contract in self.config().contracts.iter() {
            let statuses = match self.statuses_for_task(contract.name()).await {
                Ok(statuses) => statuses,
                Err(e) => {
                    tracing::error!(error = %e, "reading qualifications failed");
                    continue;
                }
            };
            for provider in contract
                .chain()
                .iter()
                .filter_map(|name| self.providers().get(name))
            {
                let current = statuses
                    .get(provider.name())
                    .is_some_and(|s| s.is_qualified());
                if !provider.settings.kind.is_http() && !current {
                    due.push((provider, contract.clone()));
                }
            }
        }
        // Side by side: a slow simulated provider costs its timeout once.
        let reports = futures_util::future::join_all(
            due.iter()
                .map(|(provider, contract)| check_contract(provider, contract)),
        )
        .await;
        for report in reports {
            let run = report.to_run();
            match self
                .store()
                .run(move |conn| qualifications::record(conn, &run))
                .await
            {
                Ok(()) => match report.first_failure() {
                    None => tracing::info!(
                        provider = %report.provider, task = %report.task, passed = true,
                        "simulated provider qualified at start"
                    ),
                    Some(check) => tracing::warn!(
                        provider = %report.provider, task = %report.task, passed = false,
                        "simulated provider {} did not qualify for task {} at start, so no job \
                         fails over to it (a job may still name it): {} failed: {}",
                        report.provider, report.task, check.name, check.detail
                    ),
                },
                Err(e) => tracing::error!(error = %e, "storing a qualification failed"),
            }
        }
    }

    /// Resolves once the start-up qualification has finished (at once when
    /// none was started).
    pub async fn startup_qualification_settled(&self) {
        let mut settled = self.inner.startup_qualified.subscribe();
        let _ = settled.wait_for(|done| *done).await;
    }
}
