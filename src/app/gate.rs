//! The failover gate: a job's new attempts (automatic failover, an owner's
//! retry, support's choice) go only to its primary and to providers whose
//! latest qualification for the task passed and still matches the
//! provider's model and the task's template and output schema.

use std::collections::HashMap;

use super::{App, AppResult, Job};
use crate::contracts::TaskContract;
use crate::domain::{AllowedProviders, QualificationStatus};
use crate::store::qualifications;
use crate::store::QualificationRun;

/// The status of a provider (running `provider_model`) for a task, given the
/// latest stored run for the pair.
pub fn status_of(
    latest: Option<&QualificationRun>,
    provider_model: &str,
    contract: &TaskContract,
) -> QualificationStatus {
    let Some(run) = latest else {
        return QualificationStatus::Never;
    };
    let current = run.model == provider_model
        && run.template_sha256 == contract.template_sha256
        && run.output_schema_sha256 == contract.output_schema_sha256;
    if !current {
        return QualificationStatus::Stale {
            at: run.qualified_at,
        };
    }
    if run.passed {
        QualificationStatus::Qualified {
            at: run.qualified_at,
        }
    } else {
        let checks: Vec<super::qualification::Check> =
            serde_json::from_str(&run.checks).unwrap_or_default();
        let check = checks
            .into_iter()
            .find(|c| !c.passed)
            .map(|c| format!("{}: {}", c.name, c.detail))
            .unwrap_or_default();
        QualificationStatus::Failed {
            at: run.qualified_at,
            check,
        }
    }
}

impl App {
    /// Statuses of every provider of `task`'s chain.
    pub async fn statuses_for_task(
        &self,
        task: &str,
    ) -> AppResult<HashMap<String, QualificationStatus>> {
        let Some(contract) = self.config().contracts.get(task) else {
            return Ok(HashMap::new());
        };
        let name = task.to_owned();
        let latest = self
            .store()
            .run(move |conn| qualifications::latest(conn, Some(&name)))
            .await?;
        Ok(contract
            .chain()
            .iter()
            .map(|provider| {
                let model = self
                    .config()
                    .provider(provider)
                    .map(|p| p.model_name())
                    .unwrap_or_default();
                let run = latest.iter().find(|r| &r.provider == provider);
                (provider.clone(), status_of(run, model, &contract))
            })
            .collect())
    }

    /// The providers `job` may take a new attempt on, in failover order, and
    /// the ones the gate keeps out. Waits for the start-up qualification of
    /// simulated providers, so that its outcome is what decides.
    pub async fn allowed_providers(&self, job: &Job) -> AppResult<AllowedProviders> {
        self.startup_qualification_settled().await;
        let Some(contract) = self.config().contracts.get(&job.task) else {
            // The task left the configuration: only the job's own primary.
            return Ok(AllowedProviders {
                allowed: vec![job.provider.clone()],
                skipped: Vec::new(),
            });
        };
        let statuses = self.statuses_for_task(&job.task).await?;
        let order = contract.failover_order(job.requested_provider.as_deref());
        Ok(AllowedProviders::gate(&order, |name| {
            statuses
                .get(name)
                .cloned()
                .unwrap_or(QualificationStatus::Never)
        }))
    }
}
