//! Contract qualification (DESIGN.md §6): before automatic failover may go to a
//! provider, it must show that it honours the task's contract. A run checks
//! that the template renders for every golden input, that the prompt fits the
//! provider's context budget, and that at the task's low temperature every
//! golden answer is JSON, validates against the output schema and meets the
//! golden expectations; the round trip is timed. The result is stored, bound to
//! (provider, model, task, template hash, output-schema hash): change any of
//! them and it no longer counts.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::providers::{Provider, ProviderOutcome, ProviderRequest, Providers};
use crate::store::qualifications::{self, QualificationRow};
use crate::store::{now_ms, DbConnection, StoreResult};
use crate::tasks::{count_tokens, golden_mismatches, TaskSpec, Tasks};

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

    pub fn to_row(&self) -> QualificationRow {
        QualificationRow {
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
}

/// Runs the task's contract against the provider. Calls are real calls, with a
/// request id of their own (`qualify-…`), bounded by the provider's soft timeout.
pub async fn run(provider: &Provider, task: &std::sync::Arc<TaskSpec>) -> Report {
    let started = Instant::now();
    let mut checks = Vec::new();
    let goldens = &task.config.golden;
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
        match task.render_prompt(&golden.input) {
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
        let budget = provider.config.context_budget();
        let (longest, method) = prompts
            .iter()
            .map(|p| count_tokens(&provider.config, p))
            .max_by_key(|(tokens, _)| *tokens)
            .unwrap_or((0, "none"));
        let needed = longest + provider.config.max_tokens;
        checks.push(Check::new(
            "fits the context budget",
            needed <= budget,
            format!(
                "longest prompt {longest} tokens ({method}) + max_tokens {} = {needed}, budget {budget}",
                provider.config.max_tokens
            ),
        ));
        if needed <= budget {
            for (i, golden) in goldens.iter().enumerate() {
                checks.push(golden_check(provider, task, i, golden).await);
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
        provider: provider.name.clone(),
        model: provider.config.model_name().to_owned(),
        task: task.config.name.clone(),
        checks,
        round_trip,
        template_sha256: task.template_sha256.clone(),
        output_schema_sha256: task.output_schema_sha256.clone(),
    }
}

async fn golden_check(
    provider: &Provider,
    task: &std::sync::Arc<TaskSpec>,
    i: usize,
    golden: &crate::config::GoldenExample,
) -> Check {
    let name = format!("golden[{i}] answer");
    let request = ProviderRequest {
        attempt_id: format!("qualify-{}", uuid::Uuid::now_v7()),
        // Not a job's attempt: a simulated provider's script does not apply.
        attempt_number: 0,
        job_id: String::new(),
        task: task.clone(),
        input: golden.input.clone(),
        params: serde_json::json!({}),
        temperature: Some(task.config.temperature),
        callback: None,
    };
    // Wait out a Retry-After pause first: the timeout measures the call alone.
    if let Some(until) = provider.not_before() {
        tokio::time::sleep_until(until).await;
    }
    let timed = tokio::time::timeout(provider.soft_timeout, provider.call(&request)).await;
    match timed {
        Err(_) => Check::new(
            name,
            false,
            format!("no answer within {} ms", provider.soft_timeout.as_millis()),
        ),
        Ok(ProviderOutcome::Failed(reason)) | Ok(ProviderOutcome::Unknown(reason)) => {
            Check::new(name, false, reason)
        }
        Ok(ProviderOutcome::Succeeded(answer)) => {
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

/// Where a (provider, task) pair stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// The latest run passed and still matches the provider and task.
    Qualified {
        at: i64,
    },
    /// The latest current run failed; the first failing check.
    Failed {
        at: i64,
        check: String,
    },
    /// The latest run was for another model, template or output schema.
    Stale {
        at: i64,
    },
    Never,
}

impl Status {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Qualified { .. } => "qualified",
            Self::Failed { .. } => "failed",
            Self::Stale { .. } => "stale",
            Self::Never => "never",
        }
    }

    pub fn is_qualified(&self) -> bool {
        matches!(self, Self::Qualified { .. })
    }
}

/// The status of `provider` for `task`, given the latest stored run.
pub fn status_of(
    latest: Option<&QualificationRow>,
    provider_model: &str,
    task: &TaskSpec,
) -> Status {
    let Some(row) = latest else {
        return Status::Never;
    };
    let current = row.model == provider_model
        && row.template_sha256 == task.template_sha256
        && row.output_schema_sha256 == task.output_schema_sha256;
    if !current {
        return Status::Stale {
            at: row.qualified_at,
        };
    }
    if row.passed {
        Status::Qualified {
            at: row.qualified_at,
        }
    } else {
        let checks: Vec<Check> = serde_json::from_str(&row.checks).unwrap_or_default();
        let check = checks
            .into_iter()
            .find(|c| !c.passed)
            .map(|c| format!("{}: {}", c.name, c.detail))
            .unwrap_or_default();
        Status::Failed {
            at: row.qualified_at,
            check,
        }
    }
}

/// Statuses of every provider of `task`'s chain.
pub fn statuses_for_task(
    conn: &mut DbConnection,
    config: &Config,
    tasks: &Tasks,
    task: &str,
) -> StoreResult<HashMap<String, Status>> {
    let (Some(task_config), Some(spec)) = (config.task(task), tasks.get(task)) else {
        return Ok(HashMap::new());
    };
    let latest = qualifications::latest(conn, Some(task))?;
    Ok(task_config
        .providers
        .iter()
        .map(|name| {
            let model = config
                .provider(name)
                .map(|p| p.model_name())
                .unwrap_or_default();
            let row = latest.iter().find(|r| &r.provider == name);
            (name.clone(), status_of(row, model, &spec))
        })
        .collect())
}

/// The failover order a job may use: its primary (the provider it started on,
/// which a user named or the chain put first) always, then only providers
/// with a current passing qualification. Also returns why the others were
/// skipped, e.g. `sim-b (stale)`.
pub fn allowed_order(
    order: &[String],
    statuses: &HashMap<String, Status>,
) -> (Vec<String>, Vec<String>) {
    let mut allowed = Vec::new();
    let mut skipped = Vec::new();
    for (i, name) in order.iter().enumerate() {
        let status = statuses.get(name).cloned().unwrap_or(Status::Never);
        if i == 0 || status.is_qualified() {
            allowed.push(name.clone());
        } else {
            skipped.push(format!("{name} ({})", status.label()));
        }
    }
    (allowed, skipped)
}

/// The providers a job of `task` (started on `requested`, if named) may fail
/// over to, in order, and the ones skipped for want of a qualification.
pub fn allowed_for_job(
    conn: &mut DbConnection,
    config: &Config,
    tasks: &Tasks,
    task: &str,
    requested: Option<&str>,
) -> StoreResult<(Vec<String>, Vec<String>)> {
    let order = config.failover_order(task, requested);
    let statuses = statuses_for_task(conn, config, tasks, task)?;
    Ok(allowed_order(&order, &statuses))
}

/// Qualifies every simulated provider for every task whose chain holds it,
/// unless a current run exists. Simulated providers are offline and
/// deterministic, so this is cheap, and it lets the built-in demo fail over.
pub async fn qualify_simulated(
    store: &crate::store::Store,
    config: &Config,
    providers: &Providers,
    tasks: &Tasks,
) {
    for task_config in &config.tasks {
        let Some(spec) = tasks.get(&task_config.name) else {
            continue;
        };
        let name = task_config.name.clone();
        let (config_copy, tasks_copy) = (config.clone(), tasks.clone());
        let statuses = match store
            .run(move |conn| statuses_for_task(conn, &config_copy, &tasks_copy, &name))
            .await
        {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "reading qualifications failed");
                continue;
            }
        };
        // Run them side by side: a slow simulated provider costs its timeout once.
        let due: Vec<_> = task_config
            .providers
            .iter()
            .filter_map(|name| providers.get(name))
            .filter(|p| {
                !p.config.kind.is_http() && !statuses.get(&p.name).is_some_and(Status::is_qualified)
            })
            .collect();
        let reports = futures_util::future::join_all(due.iter().map(|p| run(p, &spec))).await;
        for report in reports {
            let row = report.to_row();
            match store
                .run(move |conn| qualifications::record(conn, &row))
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statuses(pairs: &[(&str, Status)]) -> HashMap<String, Status> {
        pairs
            .iter()
            .map(|(n, s)| (n.to_string(), s.clone()))
            .collect()
    }

    #[test]
    fn the_primary_is_always_allowed_and_fallbacks_need_a_current_pass() {
        let order = vec![
            "a".to_owned(),
            "b".to_owned(),
            "c".to_owned(),
            "d".to_owned(),
        ];
        let (allowed, skipped) = allowed_order(
            &order,
            &statuses(&[
                ("a", Status::Never),
                ("b", Status::Stale { at: 1 }),
                ("c", Status::Qualified { at: 1 }),
                (
                    "d",
                    Status::Failed {
                        at: 1,
                        check: "x".into(),
                    },
                ),
            ]),
        );
        assert_eq!(allowed, vec!["a", "c"]);
        assert_eq!(skipped, vec!["b (stale)", "d (failed)"]);
    }
}
