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
use crate::domain::Outcome;
use crate::providers::tokens::count_tokens;
use crate::providers::Provider;
use crate::store::operator::record_audit;
use crate::store::{now_ms, qualifications, QualificationRun};

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
            qualified_at: now_ms(),
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
    // Render every golden prompt first: nothing is sent if one does not render.
    let mut prompts = Vec::new();
    for (i, golden) in goldens.iter().enumerate() {
        match contract.render_prompt(&golden.input) {
            Ok(prompt) => prompts.push(prompt),
            Err(e) => checks.push(Check::new(
                format!("golden[{i}] template renders"),
                false,
                e,
            )),
        }
    }
    if prompts.len() == goldens.len() && !goldens.is_empty() {
        checks.push(Check::new(
            "template renders",
            true,
            format!("for all {} golden inputs", goldens.len()),
        ));
        let settings = &provider.settings;
        let budget = settings.context_budget();
        let (longest, method) = prompts
            .iter()
            .map(|p| count_tokens(settings, p))
            .max_by_key(|(tokens, _)| *tokens)
            .unwrap_or((0, "none"));
        let needed = longest + settings.max_tokens;
        checks.push(Check::new(
            "fits the context budget",
            needed <= budget,
            format!(
                "longest prompt {longest} tokens ({method}) + max_tokens {} = {needed}, budget {budget}",
                settings.max_tokens
            ),
        ));
        if needed <= budget {
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
        &golden.input,
        format!("qualify-{}", uuid::Uuid::now_v7()),
        // Not a job's attempt: a simulated provider's script does not apply.
        0,
        Some(contract.definition.temperature),
        None,
    ) {
        Ok(dispatch) => dispatch,
        Err(outcome) => {
            return Check::new(name, false, outcome.reason().unwrap_or_default().to_owned())
        }
    };
    // Room under the provider's limits first (a Retry-After pause waited
    // out): the timeout measures the call alone.
    let mut slot = provider.limiter().admit(dispatch.estimated_tokens()).await;
    slot.sending();
    let timed = tokio::time::timeout(provider.soft_timeout(), dispatch.send())
        .await
        .map(|reply| {
            if let Some(tokens) = reply.tokens_used {
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
                "no answer within {} ms",
                provider.soft_timeout().as_millis()
            ),
        ),
        Ok(Outcome::Failed(reason)) | Ok(Outcome::Unknown(reason)) => {
            Check::new(name, false, reason)
        }
        Ok(Outcome::Refused(refusal)) => Check::new(name, false, refusal.reason),
        Ok(Outcome::Succeeded(answer)) => {
            let mismatches = golden_mismatches(&golden.expect, &answer);
            if mismatches.is_empty() {
                Check::new(
                    name,
                    true,
                    "JSON, valid against the output schema, expectations met",
                )
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
                        &actor,
                        "qualify",
                        None,
                        None,
                        &summary,
                        now_ms(),
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
                Ok(()) => tracing::info!(
                    provider = %report.provider, task = %report.task, passed = report.passed(),
                    "simulated provider qualified at start"
                ),
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
