//! The admin console: the unknown queue (support, admin), the race log and the
//! audit log (admin). Roles are checked here, on the server.

use actix_web::{web, HttpResponse};
use askama::Template;
use serde::Deserialize;

use super::paging::{cursor, Paging};
use super::{duration, render, see_other, when, Nav, PageError, SignedIn};
use crate::app::accounts::{UserAction, UserActionDone};
use crate::app::queries::JobFilter;
use crate::app::{App, AttemptBrief};
use crate::domain::{AttemptId, JobStatus, QualificationStatus, Timestamp};
use crate::domain::{JobId, Role};

#[derive(Template)]
#[template(path = "admin_home.html")]
struct ConsolePage {
    nav: Nav,
    unknown_now: i64,
    oldest_unknown_age: String,
    races_last_24h: i64,
    is_admin: bool,
    charts: Vec<super::charts::Chart>,
}

/// `GET /admin`
pub async fn console(app: web::Data<App>, user: SignedIn) -> Result<HttpResponse, PageError> {
    let counts = app.console_counts(&user.user).await?;
    let charts = super::usage_pages::console_charts(&app.console_charts(&user.user).await?);
    let now = Timestamp::now();
    Ok(render(&ConsolePage {
        nav: user.nav(),
        unknown_now: counts.unknown_now,
        oldest_unknown_age: counts
            .oldest_unknown_started_at
            .map(|t| duration(now - t))
            .unwrap_or_else(|| "none".into()),
        races_last_24h: counts.races_last_24h,
        is_admin: user.user.role.is_admin(),
        charts,
    }))
}

struct UnknownRow {
    /// Set when the job finished meanwhile.
    job_finished: &'static str,
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
    /// The next (older) page, if there is one.
    next: Option<String>,
}

#[derive(Deserialize)]
pub struct UnknownPageQuery {
    after: Option<String>,
}

/// Rows per page of the unknown queue.
const UNKNOWN_PAGE: Paging = Paging { per_page: 50 };

/// `GET /admin/unknown`: attempts stuck in `unknown`, oldest first, a page
/// at a time.
pub async fn unknown_queue(
    app: web::Data<App>,
    user: SignedIn,
    query: web::Query<UnknownPageQuery>,
) -> Result<HttpResponse, PageError> {
    let after = cursor(query.after.as_deref(), AttemptId::parse)?;
    let rows = app
        .unknown_queue(&user.user, after, UNKNOWN_PAGE.fetch())
        .await?;
    let (rows, next) = UNKNOWN_PAGE.cut(rows, |u| format!("/admin/unknown?after={}", u.attempt_id));
    let now = Timestamp::now();
    Ok(render(&UnknownPage {
        nav: user.nav(),
        next,
        rows: rows
            .into_iter()
            .map(|u| UnknownRow {
                job_finished: match u.job_status {
                    JobStatus::Succeeded => "The job already succeeded: this answer can only lose.",
                    JobStatus::Failed => "The job was already marked failed.",
                    JobStatus::Cancelled => {
                        "The job was cancelled by its owner: this answer can only lose."
                    }
                    _ => "",
                },
                age: u.started_at.map(|s| duration(now - s)).unwrap_or_default(),
                sent_at: u.started_at.map(when).unwrap_or_default(),
                timeout_at: u.timeout_at.map(when).unwrap_or_default(),
                error: u.reason().map(|r| r.for_staff()).unwrap_or_default(),
                attempt_id: u.attempt_id.to_string(),
                job_id: u.job_id.to_string(),
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
    app: web::Data<App>,
    user: SignedIn,
    path: web::Path<String>,
    form: web::Form<AbandonForm>,
) -> Result<HttpResponse, PageError> {
    user.check_csrf(form.csrf.as_deref())?;
    let attempt_id = AttemptId::parse(&path).ok_or_else(PageError::not_found)?;
    let attempt = app
        .abandon_attempt(
            &user.user,
            &attempt_id,
            form.reason.as_deref().unwrap_or_default(),
        )
        .await?;
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
    app: web::Data<App>,
    user: SignedIn,
    filter: web::Query<RaceFilter>,
) -> Result<HttpResponse, PageError> {
    crate::app::require_admin(&user.user)?;
    let provider = filter.provider.clone().filter(|p| !p.is_empty());
    if let Some(p) = &provider {
        if app.config().provider(p).is_none() {
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
    let since = (window > 0).then(|| Timestamp::now() - window);
    let details = app
        .race_details(&user.user, provider.clone(), since, 500)
        .await?;
    let side = |b: &Option<AttemptBrief>| {
        b.as_ref()
            .map(|b| format!("#{} {}", b.number, b.provider))
            .unwrap_or_else(|| "—".into())
    };
    Ok(render(&RacesPage {
        nav: user.nav(),
        providers: app
            .config()
            .providers
            .iter()
            .map(|p| p.name.clone())
            .collect(),
        provider: provider.unwrap_or_default(),
        period,
        rows: details
            .iter()
            .map(|d| RaceRowView {
                job_id: d.race.job_id.to_string(),
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
    action: &'static str,
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
pub async fn audit(app: web::Data<App>, user: SignedIn) -> Result<HttpResponse, PageError> {
    let entries = app.audit_log(&user.user, 500).await?;
    Ok(render(&AuditPage {
        nav: user.nav(),
        rows: entries
            .into_iter()
            .map(|e| AuditRow {
                at: when(e.at),
                actor: e.actor,
                action: e.action.label(),
                job_id: e.job_id.map(|j| j.to_string()).unwrap_or_default(),
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
pub async fn providers(app: web::Data<App>, user: SignedIn) -> Result<HttpResponse, PageError> {
    let cells = app.qualification_matrix(&user.user).await?;
    let now = Timestamp::now();
    let rows = cells
        .into_iter()
        .map(|cell| {
            let age = cell
                .status
                .at()
                .map(|at| duration(now - at))
                .unwrap_or_default();
            let failing_check = match &cell.status {
                QualificationStatus::Failed { check, .. } => check.clone(),
                _ => String::new(),
            };
            QualificationCell {
                status: cell.status.label(),
                provider: cell.provider,
                kind: cell.kind,
                model: cell.model,
                task: cell.task,
                age,
                failing_check,
            }
        })
        .collect();
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
    app: web::Data<App>,
    user: SignedIn,
    form: web::Form<QualifyForm>,
) -> Result<HttpResponse, PageError> {
    user.check_csrf(form.csrf.as_deref())?;
    app.qualify(Some(&user.user), &form.provider, &form.task)
        .await?;
    Ok(see_other("/admin/providers"))
}

struct UserLine {
    name: String,
    role: &'static str,
    last_sign_in: String,
    tokens: i64,
    disabled: bool,
}

#[derive(Template)]
#[template(path = "admin_users.html")]
struct UsersPage {
    nav: Nav,
    users: Vec<UserLine>,
}

/// `GET /admin/users` (admin): every user, their role, last sign-in and
/// tokens, with the actions an admin may take.
pub async fn users(app: web::Data<App>, user: SignedIn) -> Result<HttpResponse, PageError> {
    let users = app.list_users(&user.user).await?;
    Ok(render(&UsersPage {
        nav: user.nav(),
        users: users
            .into_iter()
            .map(|u| UserLine {
                last_sign_in: u
                    .last_sign_in_at
                    .map(when)
                    .unwrap_or_else(|| "never".into()),
                role: u.role.as_str(),
                tokens: u.tokens,
                disabled: u.disabled_at.is_some(),
                name: u.name,
            })
            .collect(),
    }))
}

#[derive(Template)]
#[template(path = "admin_user_done.html")]
struct UserDonePage {
    nav: Nav,
    user: String,
    note: String,
    password: Option<String>,
}

fn user_done(user: &SignedIn, done: UserActionDone) -> HttpResponse {
    if done.password.is_none() {
        return see_other("/admin/users");
    }
    let mut page = render(&UserDonePage {
        nav: user.nav(),
        user: done.user,
        note: done.note,
        password: done.password,
    });
    // The password is shown once: with htmx the address bar says the Users
    // page, so a reload or Back shows the list instead of posting again.
    page.headers_mut().insert(
        actix_web::http::header::HeaderName::from_static("hx-replace-url"),
        actix_web::http::header::HeaderValue::from_static("/admin/users"),
    );
    page
}

#[derive(Deserialize)]
pub struct AddUserForm {
    csrf: Option<String>,
    name: Option<String>,
    role: Option<String>,
    reason: Option<String>,
}

/// `POST /admin/users` (admin): adds a user; shows their password once.
pub async fn add_user(
    app: web::Data<App>,
    user: SignedIn,
    form: web::Form<AddUserForm>,
) -> Result<HttpResponse, PageError> {
    user.check_csrf(form.csrf.as_deref())?;
    let role = Role::parse(form.role.as_deref().unwrap_or_default())
        .ok_or_else(|| PageError::bad_request("Choose a role: user, support or admin."))?;
    let name = form.name.clone().unwrap_or_default();
    let done = app
        .user_action(
            &user.user,
            &name,
            UserAction::Add {
                name: name.clone(),
                role,
            },
            form.reason.as_deref().unwrap_or_default(),
        )
        .await?;
    Ok(user_done(&user, done))
}

#[derive(Deserialize)]
pub struct UserActForm {
    csrf: Option<String>,
    action: Option<String>,
    reason: Option<String>,
}

/// `POST /admin/users/{name}/act` (admin): reset a password (shown once),
/// revoke tokens, disable, enable, or change the role.
pub async fn user_act(
    app: web::Data<App>,
    user: SignedIn,
    path: web::Path<String>,
    form: web::Form<UserActForm>,
) -> Result<HttpResponse, PageError> {
    user.check_csrf(form.csrf.as_deref())?;
    let action = match form.action.as_deref().unwrap_or_default() {
        "reset-password" => UserAction::ResetPassword,
        "revoke-tokens" => UserAction::RevokeTokens,
        "disable" => UserAction::Disable,
        "enable" => UserAction::Enable,
        "role-user" => UserAction::SetRole(Role::User),
        "role-support" => UserAction::SetRole(Role::Support),
        "role-admin" => UserAction::SetRole(Role::Admin),
        _ => return Err(PageError::bad_request("Choose an action.")),
    };
    let done = app
        .user_action(
            &user.user,
            &path,
            action,
            form.reason.as_deref().unwrap_or_default(),
        )
        .await?;
    Ok(user_done(&user, done))
}

struct JobLine {
    id: String,
    owner: String,
    key: String,
    task: String,
    provider: String,
    status: &'static str,
    created: String,
}

/// The search form's fields, echoed back.
#[derive(Default)]
struct SearchEcho {
    job: String,
    owner: String,
    key: String,
    status: String,
    provider: String,
}

#[derive(Template)]
#[template(path = "admin_jobs.html")]
struct JobsSearchPage {
    nav: Nav,
    query: SearchEcho,
    statuses: Vec<&'static str>,
    providers: Vec<String>,
    rows: Vec<JobLine>,
    message: Option<String>,
    next: Option<String>,
}

#[derive(Deserialize)]
pub struct JobSearchQuery {
    job: Option<String>,
    owner: Option<String>,
    key: Option<String>,
    status: Option<String>,
    provider: Option<String>,
    before: Option<String>,
}

const JOBS_SEARCHED_PAGE: Paging = Paging { per_page: 50 };

/// `GET /admin/jobs` (support, admin): find a job a customer asks about by
/// its id, by their idempotency key, or by owner; or list every job by
/// status and provider.
pub async fn jobs_search(
    app: web::Data<App>,
    user: SignedIn,
    query: web::Query<JobSearchQuery>,
) -> Result<HttpResponse, PageError> {
    crate::app::require_staff(&user.user)?;
    let echo = SearchEcho::of(&query);
    let mut message = None;
    if let Some(raw) = given(&query.job) {
        match JobId::parse(&raw) {
            Some(id) => match app.job_for(&user.user, &id).await {
                Ok((job, _)) => return Ok(see_other(&format!("/jobs/{}", job.id))),
                Err(crate::app::AppError::NotFound) => {
                    message = Some(format!("No job has the id {raw}."))
                }
                Err(other) => return Err(other.into()),
            },
            None => message = Some(format!("{raw} is not a job id.")),
        }
    }
    let filter = query.filter()?;
    let rows = if message.is_some() {
        Vec::new()
    } else {
        app.search_jobs(&user.user, filter, JOBS_SEARCHED_PAGE.fetch())
            .await?
    };
    let (rows, next) = JOBS_SEARCHED_PAGE.cut(rows, |last| echo.page_before(&last.id));
    if rows.is_empty() && message.is_none() {
        message = Some("No job matches.".into());
    }
    Ok(render(&JobsSearchPage {
        nav: user.nav(),
        statuses: JobStatus::ALL.iter().map(|s| s.as_str()).collect(),
        providers: app
            .config()
            .providers
            .iter()
            .map(|p| p.name.clone())
            .collect(),
        rows: rows.into_iter().map(JobLine::of).collect(),
        query: echo,
        message,
        next,
    }))
}

/// A search field's text, trimmed; none when blank.
fn given(field: &Option<String>) -> Option<String> {
    field
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

impl JobSearchQuery {
    /// The filter the search asks for.
    fn filter(&self) -> Result<JobFilter, PageError> {
        let status = match given(&self.status) {
            Some(s) => Some(
                JobStatus::parse(&s)
                    .ok_or_else(|| PageError::bad_request("That is not a job status."))?,
            ),
            None => None,
        };
        let before = cursor(given(&self.before).as_deref(), JobId::parse)?;
        Ok(JobFilter {
            owner_name: given(&self.owner),
            idempotency_key: given(&self.key),
            status,
            provider: given(&self.provider),
            before,
        })
    }
}

impl SearchEcho {
    fn of(query: &JobSearchQuery) -> Self {
        Self {
            job: given(&query.job).unwrap_or_default(),
            owner: given(&query.owner).unwrap_or_default(),
            key: given(&query.key).unwrap_or_default(),
            status: given(&query.status).unwrap_or_default(),
            provider: given(&query.provider).unwrap_or_default(),
        }
    }

    /// The link to the same search's jobs older than `before`.
    fn page_before(&self, before: &JobId) -> String {
        format!(
            "/admin/jobs?owner={}&key={}&status={}&provider={}&before={}",
            super::percent_encode(&self.owner),
            super::percent_encode(&self.key),
            super::percent_encode(&self.status),
            super::percent_encode(&self.provider),
            before
        )
    }
}

impl JobLine {
    fn of(job: crate::app::queries::JobListing) -> Self {
        Self {
            id: job.id.to_string(),
            owner: job.owner,
            key: job.idempotency_key,
            task: job.task,
            provider: job.provider,
            status: job.status.as_str(),
            created: when(job.created_at),
        }
    }
}
