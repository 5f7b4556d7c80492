//! The admin console: the unknown queue (support, admin), the race log and the
//! audit log (admin). Roles are checked here, on the server.

use actix_web::{web, HttpResponse};
use askama::Template;
use serde::Deserialize;

use super::{duration, render, see_other, when, Nav, PageError, SignedIn};
use crate::domain::AttemptId;
use crate::qualify::Status;
use crate::store::attempts as attempt_store;
use crate::store::{admin as admin_store, now_ms};
use crate::web::intake::{abandon_problem, operator_reason};
use crate::web::AppState;

#[derive(Template)]
#[template(path = "admin_home.html")]
struct ConsolePage {
    nav: Nav,
    unknown_now: i64,
    oldest_unknown_age: String,
    races_last_24h: i64,
    is_admin: bool,
}

/// `GET /admin`
pub async fn console(
    state: web::Data<AppState>,
    user: SignedIn,
) -> Result<HttpResponse, PageError> {
    user.require_staff()?;
    let now = now_ms();
    let counts = state
        .store
        .run(move |conn| admin_store::console_counts(conn, now))
        .await?;
    Ok(render(&ConsolePage {
        nav: user.nav(),
        unknown_now: counts.unknown_now,
        oldest_unknown_age: counts
            .oldest_unknown_started_at
            .map(|t| duration(now - t))
            .unwrap_or_else(|| "none".into()),
        races_last_24h: counts.races_last_24h,
        is_admin: user.user.role.is_admin(),
    }))
}

struct UnknownRow {
    attempt_id: String,
    job_id: String,
    owner: String,
    task: String,
    provider: String,
    number: i32,
    age: String,
    sent_at: String,
    timeout_at: String,
    error: String,
}

#[derive(Template)]
#[template(path = "admin_unknown.html")]
struct UnknownPage {
    nav: Nav,
    rows: Vec<UnknownRow>,
}

/// `GET /admin/unknown`: every attempt stuck in `unknown`, oldest first.
pub async fn unknown_queue(
    state: web::Data<AppState>,
    user: SignedIn,
) -> Result<HttpResponse, PageError> {
    user.require_staff()?;
    let now = now_ms();
    let rows = state.store.run(admin_store::unknown_attempts).await?;
    Ok(render(&UnknownPage {
        nav: user.nav(),
        rows: rows
            .into_iter()
            .map(|u| UnknownRow {
                age: u.started_at.map(|s| duration(now - s)).unwrap_or_default(),
                sent_at: u.started_at.map(when).unwrap_or_default(),
                timeout_at: u.timeout_at.map(when).unwrap_or_default(),
                error: u.error.unwrap_or_default(),
                attempt_id: u.attempt_id,
                job_id: u.job_id,
                owner: u.owner,
                task: u.task,
                provider: u.provider,
                number: u.number,
            })
            .collect(),
    }))
}

#[derive(Deserialize)]
pub struct AbandonForm {
    csrf: Option<String>,
    reason: Option<String>,
}

/// `POST /admin/attempts/{id}/abandon`: then on to the job, where the next
/// attempt can be started or the job marked failed.
pub async fn abandon(
    state: web::Data<AppState>,
    user: SignedIn,
    path: web::Path<String>,
    form: web::Form<AbandonForm>,
) -> Result<HttpResponse, PageError> {
    user.check_csrf(form.csrf.as_deref())?;
    user.require_staff()?;
    let reason = operator_reason(form.reason.as_deref().unwrap_or_default())?;
    let attempt_id = AttemptId::parse(&path)
        .ok_or_else(PageError::not_found)?
        .to_string();
    let actor = user.user.id.clone();
    let result = state
        .store
        .run(move |conn| Ok(attempt_store::abandon(conn, &attempt_id, &actor, &reason)))
        .await?;
    let attempt = result.map_err(|e| PageError::from(abandon_problem(e)))?;
    tracing::info!(attempt_id = %attempt.id, actor = %user.user.name, "attempt abandoned from the console");
    Ok(see_other(&format!("/jobs/{}", attempt.job_id)))
}

struct RaceRowView {
    job_id: String,
    lost_at: String,
    winner: String,
    loser: String,
    gap: String,
    reason: String,
    digest: String,
}

#[derive(Template)]
#[template(path = "admin_races.html")]
struct RacesPage {
    nav: Nav,
    providers: Vec<String>,
    provider: String,
    period: String,
    rows: Vec<RaceRowView>,
}

#[derive(Deserialize)]
pub struct RaceFilter {
    provider: Option<String>,
    period: Option<String>,
}

/// Filter periods offered on the race log: (value, label, milliseconds).
pub const PERIODS: [(&str, i64); 4] = [
    ("24h", 86_400_000),
    ("7d", 604_800_000),
    ("30d", 2_592_000_000),
    ("all", 0),
];

/// `GET /admin/races` (admin): discarded late results, filterable by provider and time.
pub async fn races(
    state: web::Data<AppState>,
    user: SignedIn,
    filter: web::Query<RaceFilter>,
) -> Result<HttpResponse, PageError> {
    user.require_admin()?;
    let provider = filter.provider.clone().filter(|p| !p.is_empty());
    if let Some(p) = &provider {
        if state.config.provider(p).is_none() {
            return Err(PageError::bad_request(format!(
                "There is no provider named {p}."
            )));
        }
    }
    let period = filter.period.clone().unwrap_or_else(|| "7d".into());
    let window = PERIODS
        .iter()
        .find(|(name, _)| *name == period)
        .map(|(_, ms)| *ms)
        .ok_or_else(|| PageError::bad_request("Choose a period of 24h, 7d, 30d or all."))?;
    let since = (window > 0).then(|| now_ms() - window);
    let lookup = provider.clone();
    let details = state
        .store
        .run(move |conn| admin_store::race_details(conn, lookup.as_deref(), since, 500))
        .await?;
    let side = |b: &Option<admin_store::AttemptBrief>| {
        b.as_ref()
            .map(|b| format!("#{} {}", b.number, b.provider))
            .unwrap_or_else(|| "—".into())
    };
    Ok(render(&RacesPage {
        nav: user.nav(),
        providers: state
            .config
            .providers
            .iter()
            .map(|p| p.name.clone())
            .collect(),
        provider: provider.unwrap_or_default(),
        period,
        rows: details
            .iter()
            .map(|d| RaceRowView {
                job_id: d.race.job_id.clone(),
                lost_at: when(d.race.lost_at),
                winner: side(&d.winner),
                loser: side(&d.loser),
                gap: d
                    .gap_ms()
                    .map(|g| format!("+{}", duration(g)))
                    .unwrap_or_default(),
                reason: d.race.reason.clone(),
                digest: d.race.payload_sha256[..16].to_owned(),
            })
            .collect(),
    }))
}

struct AuditRow {
    at: String,
    actor: String,
    action: String,
    job_id: String,
    reason: String,
}

#[derive(Template)]
#[template(path = "admin_audit.html")]
struct AuditPage {
    nav: Nav,
    rows: Vec<AuditRow>,
}

/// `GET /admin/audit` (admin): operator actions, newest first.
pub async fn audit(state: web::Data<AppState>, user: SignedIn) -> Result<HttpResponse, PageError> {
    user.require_admin()?;
    let entries = state
        .store
        .run(|conn| admin_store::audit_entries(conn, 500))
        .await?;
    Ok(render(&AuditPage {
        nav: user.nav(),
        rows: entries
            .into_iter()
            .map(|e| AuditRow {
                at: when(e.at),
                actor: e.actor,
                action: e.action.replace('_', " "),
                job_id: e.job_id.unwrap_or_default(),
                reason: e.reason,
            })
            .collect(),
    }))
}

struct QualificationCell {
    provider: String,
    kind: &'static str,
    model: String,
    task: String,
    status: &'static str,
    age: String,
    failing_check: String,
}

#[derive(Template)]
#[template(path = "admin_providers.html")]
struct ProvidersPage {
    nav: Nav,
    rows: Vec<QualificationCell>,
}

/// `GET /admin/providers` (admin): the provider × task qualification matrix.
pub async fn providers(
    state: web::Data<AppState>,
    user: SignedIn,
) -> Result<HttpResponse, PageError> {
    user.require_admin()?;
    let (config, tasks) = (state.config.clone(), state.tasks.clone());
    let statuses = state
        .store
        .run(move |conn| {
            config
                .tasks
                .iter()
                .map(|t| {
                    Ok((
                        t.name.clone(),
                        crate::qualify::statuses_for_task(conn, &config, &tasks, &t.name)?,
                    ))
                })
                .collect::<Result<Vec<_>, crate::store::StoreError>>()
        })
        .await?;
    let now = now_ms();
    let mut rows = Vec::new();
    for (task, by_provider) in statuses {
        let Some(task_config) = state.config.task(&task) else {
            continue;
        };
        for provider in &task_config.providers {
            let Some(provider_config) = state.config.provider(provider) else {
                continue;
            };
            let status = by_provider.get(provider).cloned().unwrap_or(Status::Never);
            let (age, failing_check) = match &status {
                Status::Qualified { at } | Status::Stale { at } => {
                    (duration(now - at), String::new())
                }
                Status::Failed { at, check } => (duration(now - at), check.clone()),
                Status::Never => (String::new(), String::new()),
            };
            rows.push(QualificationCell {
                provider: provider.clone(),
                kind: provider_config.kind.as_str(),
                model: provider_config.model_name().to_owned(),
                task: task.clone(),
                status: status.label(),
                age,
                failing_check,
            });
        }
    }
    Ok(render(&ProvidersPage {
        nav: user.nav(),
        rows,
    }))
}

#[derive(Deserialize)]
pub struct QualifyForm {
    csrf: Option<String>,
    provider: String,
    task: String,
}

/// `POST /admin/providers/qualify` (admin): runs the task's contract against the
/// provider now, records it (and an audit entry), and shows the matrix again.
pub async fn qualify(
    state: web::Data<AppState>,
    user: SignedIn,
    form: web::Form<QualifyForm>,
) -> Result<HttpResponse, PageError> {
    user.check_csrf(form.csrf.as_deref())?;
    user.require_admin()?;
    let provider = state
        .providers
        .get(&form.provider)
        .ok_or_else(PageError::not_found)?;
    let task = state
        .tasks
        .get(&form.task)
        .ok_or_else(PageError::not_found)?;
    if !task.config.providers.contains(&provider.name) {
        return Err(PageError::bad_request(
            "That provider is not in the task's chain.",
        ));
    }
    let report = crate::qualify::run(&provider, &task).await;
    let row = report.to_row();
    let reason = match report.first_failure() {
        None => format!("qualified {} for {}", report.provider, report.task),
        Some(check) => format!(
            "qualification of {} for {} failed: {}: {}",
            report.provider, report.task, check.name, check.detail
        ),
    };
    let actor = user.user.id.clone();
    state
        .store
        .run(move |conn| {
            crate::store::qualifications::record(conn, &row)?;
            admin_store::record_audit(conn, &actor, "qualify", None, None, &reason, now_ms())?;
            Ok(())
        })
        .await?;
    Ok(see_other("/admin/providers"))
}
