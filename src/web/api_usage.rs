//! The usage ledger and budgets over the API: `GET /api/v1/usage` (an
//! owner's own, an admin's over anyone), a job's calls and their cost, and
//! owners' monthly budgets (admins set them).

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, OpenApi, ToSchema};

use super::auth::Caller;
use super::body::{json_body, no_query, parse_query, BodyRules, EmptyBody};
use super::error::{ApiError, ProblemType};
use super::views::{rfc3339, Problem};
use crate::app::ledger::{BudgetState, UsageGroup, UsageReport};
use crate::app::App;
use crate::app::{LedgerEntry, UsageFilter, UsageGrouping};
use crate::domain::ledger::{format_micros, usage_status, BudgetLimits, UsageStatus, DAY_MS};
use crate::domain::{JobId, Timestamp};

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct UsageQuery {
    /// The first day of the range (UTC), inclusive. Default: 30 days
    /// before `to`. A range is at most 93 days: an earlier `from` is moved
    /// up (the answer's `from` says where it starts).
    #[param(format = Date)]
    pub from: Option<String>,
    /// The day after the range (UTC), exclusive. Default: now.
    #[param(format = Date)]
    pub to: Option<String>,
    /// Only this owner's calls (a user name; admins only: others see their
    /// own).
    pub owner: Option<String>,
    /// Only this provider's calls.
    pub provider: Option<String>,
    /// Only this task's calls.
    pub task: Option<String>,
    /// `day` (default), `owner`, `provider` or `task`.
    #[param(pattern = "^(day|owner|provider|task)$")]
    pub group_by: Option<String>,
}

/// Tokens and spend of a set of calls, and what onejob absorbed.
#[derive(Debug, Serialize, ToSchema)]
pub struct UsageGroupView {
    /// The group's value: a day (`YYYY-MM-DD`), an owner's name, a provider
    /// or a task; `total` for the sum of all groups.
    pub key: String,
    /// Provider calls that answered, each counted once.
    pub calls: i64,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    /// Prompt tokens read from the provider's cache (within `prompt_tokens`).
    pub cached_tokens: i64,
    /// Their cost, in currency units (a decimal string).
    pub spend: String,
    /// Calls with no price in force when recorded (not in `spend`).
    pub unpriced_calls: i64,
    /// Calls whose tokens onejob estimated (the provider did not say).
    pub estimated_calls: i64,
    pub won_calls: i64,
    /// Answers that lost the race (billed all the same) and their cost.
    pub lost_calls: i64,
    pub lost_spend: String,
    /// Answers that came after their attempt was unknown or abandoned.
    pub late_calls: i64,
    pub late_spend: String,
    pub failed_calls: i64,
    /// Calls refused with nothing done (rate limited, overloaded).
    pub rate_limited_calls: i64,
    /// Requests answered with the job their key had made.
    pub replays: i64,
    /// Twin requests that joined a job being created.
    pub joined: i64,
    /// What `replays` and `joined` would have cost at their jobs' own
    /// price, had each been sent: an estimate.
    pub duplicates_estimated_spend: String,
    /// Creations refused by a budget (never sent).
    pub refused_by_budget: i64,
    /// Queued attempts withdrawn unsent (a cancel).
    pub withdrawn: i64,
}

impl From<&UsageGroup> for UsageGroupView {
    fn from(group: &UsageGroup) -> Self {
        let l = &group.ledger;
        Self {
            key: group.key.clone(),
            calls: l.calls,
            prompt_tokens: l.prompt_tokens,
            completion_tokens: l.completion_tokens,
            cached_tokens: l.cached_tokens,
            spend: format_micros(l.cost_micros),
            unpriced_calls: l.unpriced_calls,
            estimated_calls: l.estimated_calls,
            won_calls: l.won_calls,
            lost_calls: l.lost_calls,
            lost_spend: format_micros(l.lost_micros),
            late_calls: l.late_calls,
            late_spend: format_micros(l.late_micros),
            failed_calls: l.failed_calls,
            rate_limited_calls: l.rate_limited_calls,
            replays: group.replayed,
            joined: group.joined,
            duplicates_estimated_spend: format_micros(group.duplicates_estimate_micros),
            refused_by_budget: group.refused_budget,
            withdrawn: group.withdrawn,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct UsageReportView {
    pub from: String,
    pub to: String,
    pub group_by: String,
    /// The currency of every amount (ISO 4217).
    pub currency: String,
    pub groups: Vec<UsageGroupView>,
    pub total: UsageGroupView,
}

/// Shows a day group's key as a date.
fn group_key(grouping: UsageGrouping, key: &str) -> String {
    match (grouping, key.parse::<i64>()) {
        (UsageGrouping::Day, Ok(ms)) => rfc3339(Timestamp::from_millis(ms))[..10].to_owned(),
        _ => key.to_owned(),
    }
}

impl UsageReportView {
    pub fn new(report: &UsageReport) -> Self {
        let groups = report
            .groups
            .iter()
            .map(|g| UsageGroupView {
                key: group_key(report.grouping, &g.key),
                ..UsageGroupView::from(g)
            })
            .collect();
        Self {
            from: rfc3339(report.filter.from),
            to: rfc3339(report.filter.to),
            group_by: report.grouping.as_str().to_owned(),
            currency: report.currency.clone(),
            groups,
            total: UsageGroupView::from(&report.total),
        }
    }
}

/// A day from a query, `YYYY-MM-DD` exactly (as the document's `date`
/// format says): its first instant, UTC.
pub fn parse_time(text: &str, name: &str) -> Result<Timestamp, ApiError> {
    let shaped = text.len() == 10
        && text.char_indices().all(|(i, c)| match i {
            4 | 7 => c == '-',
            _ => c.is_ascii_digit(),
        });
    shaped
        .then(|| chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d").ok())
        .flatten()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|t| Timestamp::from_millis(t.and_utc().timestamp_millis()))
        .ok_or_else(|| {
            ApiError::new(
                ProblemType::InvalidQuery,
                format!("`{name}` must be a date, YYYY-MM-DD"),
            )
            .with("field", name)
        })
}

/// The report's filter and grouping from a query (`owner` is a name,
/// looked up by the caller).
pub fn usage_filter(
    query: &UsageQuery,
    owner_id: String,
) -> Result<(UsageFilter, UsageGrouping), ApiError> {
    let to = match &query.to {
        Some(to) => parse_time(to, "to")?,
        None => Timestamp::now(),
    };
    let from = match &query.from {
        Some(from) => parse_time(from, "from")?,
        None => to - 30 * DAY_MS,
    };
    // At most MAX_REPORT_DAYS, ending at `to`; a `from` after `to` is an
    // empty range.
    let from = from
        .max(to - crate::app::ledger::MAX_REPORT_DAYS * DAY_MS)
        .min(to);
    let grouping = match query.group_by.as_deref() {
        None => UsageGrouping::Day,
        Some(text) => UsageGrouping::parse(text).ok_or_else(|| {
            ApiError::new(
                ProblemType::InvalidQuery,
                "`group_by` must be day, owner, provider or task",
            )
            .with("field", "group_by")
        })?,
    };
    Ok((
        UsageFilter {
            from,
            to,
            owner_id,
            provider: query.provider.clone().unwrap_or_default(),
            task: query.task.clone().unwrap_or_default(),
        },
        grouping,
    ))
}

/// Looks an owner's name up for a filter: `""` for none; an unknown name
/// is a 404 for admins (others are held to their own usage anyway).
pub async fn owner_filter(app: &App, name: Option<&str>) -> Result<String, ApiError> {
    let Some(name) = name.filter(|n| !n.is_empty()) else {
        return Ok(String::new());
    };
    app.user_id_by_name(name)
        .await?
        .map(|id| id.as_str().to_owned())
        .ok_or_else(ApiError::not_found)
}

/// Tokens, spend, races, late answers and duplicates absorbed over a
/// range, grouped (an owner sees their own; admins anyone's).
#[utoipa::path(
    get, path = "/api/v1/usage", tag = "usage",
    params(UsageQuery),
    responses(
        (status = 200, body = UsageReportView),
        (status = 400, description = "A malformed time, an unknown group_by or parameter", body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such owner (admins)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn usage(
    app: web::Data<App>,
    caller: Caller,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let query: UsageQuery = parse_query(&req)?;
    let owner = if caller.0.role == crate::domain::Role::Admin {
        owner_filter(&app, query.owner.as_deref()).await?
    } else {
        String::new()
    };
    let (filter, grouping) = usage_filter(&query, owner)?;
    let report = app.usage_report(&caller.0, filter, grouping).await?;
    Ok(HttpResponse::Ok().json(UsageReportView::new(&report)))
}

/// One attempt's call as the ledger holds it.
#[derive(Debug, Serialize, ToSchema)]
pub struct AttemptUsageView {
    pub attempt_id: String,
    pub provider: String,
    /// `recorded`; `pending` (its call is out); `unknown` (its outcome is
    /// unknown: it may have run and been billed; never shown as zero);
    /// `not_sent`.
    pub status: String,
    /// `won`, `lost`, `failed` or `rate_limited` (recorded calls only).
    pub kind: Option<String>,
    /// The answer came after the attempt was unknown or abandoned.
    pub late: Option<bool>,
    pub model: Option<String>,
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    pub cached_tokens: Option<i64>,
    /// `reported` by the provider or `estimated` by onejob.
    pub usage_source: Option<String>,
    /// In currency units; null when unpriced or not recorded.
    pub cost: Option<String>,
    /// The price's `effective_from`, RFC 3339 (null for a price in force
    /// always).
    pub price_effective_from: Option<String>,
    pub recorded_at: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct JobUsageView {
    pub job_id: String,
    pub currency: String,
    /// The recorded calls' cost together.
    pub cost: String,
    /// Whether some attempt's usage is unknown (so `cost` may be short).
    pub incomplete: bool,
    pub attempts: Vec<AttemptUsageView>,
}

fn attempt_usage(attempt: &crate::app::Attempt, entry: Option<&LedgerEntry>) -> AttemptUsageView {
    let status = usage_status(attempt.state, attempt.sent_at.is_some(), entry.is_some());
    AttemptUsageView {
        attempt_id: attempt.id.to_string(),
        provider: attempt.provider.clone(),
        status: status.as_str().to_owned(),
        kind: entry.map(|e| e.kind.clone()),
        late: entry.map(|e| e.late),
        model: entry.map(|e| e.model.clone()),
        prompt_tokens: entry.map(|e| e.prompt_tokens),
        completion_tokens: entry.map(|e| e.completion_tokens),
        cached_tokens: entry.map(|e| e.cached_tokens),
        usage_source: entry.map(|e| e.usage_source.as_str().to_owned()),
        cost: entry.and_then(|e| e.cost_micros).map(format_micros),
        price_effective_from: entry
            .and_then(|e| e.price_effective_from)
            .filter(|at| *at > Timestamp::from_millis(i64::MIN))
            .map(rfc3339),
        recorded_at: entry.map(|e| rfc3339(e.recorded_at)),
    }
}

impl JobUsageView {
    pub fn new(
        job: &crate::app::Job,
        attempts: &[crate::app::Attempt],
        entries: &[LedgerEntry],
        currency: &str,
    ) -> Self {
        let views: Vec<AttemptUsageView> = attempts
            .iter()
            .map(|a| attempt_usage(a, entries.iter().find(|e| e.attempt_id == a.id)))
            .collect();
        Self {
            job_id: job.id.to_string(),
            currency: currency.to_owned(),
            cost: format_micros(entries.iter().filter_map(|e| e.cost_micros).sum()),
            incomplete: views
                .iter()
                .any(|v| v.status == UsageStatus::Unknown.as_str()),
            attempts: views,
        }
    }
}

/// A job's provider calls: tokens and cost per attempt, `unknown` for an
/// attempt whose outcome is unknown.
#[utoipa::path(
    get, path = "/api/v1/jobs/{id}/usage", tag = "usage",
    params(("id" = String, Path, description = "Job id")),
    responses(
        (status = 200, body = JobUsageView),
        (status = 400, description = "A query parameter: this path takes none", body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn job_usage(
    app: web::Data<App>,
    caller: Caller,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    no_query(&req)?;
    let id = JobId::parse(&path).ok_or_else(ApiError::not_found)?;
    let (job, attempts) = app.job_for(&caller.0, &id).await?;
    let entries = app.job_usage(&job).await?;
    Ok(HttpResponse::Ok().json(JobUsageView::new(
        &job,
        &attempts,
        &entries,
        &app.config().ledger.currency,
    )))
}

/// An owner's monthly budget.
#[derive(Debug, Serialize, ToSchema)]
pub struct BudgetView {
    pub owner: String,
    /// In currency units; null: no spend limit.
    pub spend_limit: Option<String>,
    /// Null: no token limit.
    pub token_limit: Option<i64>,
    /// This month's recorded spend and tokens.
    pub spent: String,
    pub spent_tokens: i64,
    /// What unfinished jobs hold (the most each can still cost).
    pub reserved: String,
    pub reserved_tokens: i64,
    pub currency: String,
    pub period_start: String,
    /// When the month's spend starts again from zero.
    pub resets_at: String,
}

impl From<&BudgetState> for BudgetView {
    fn from(b: &BudgetState) -> Self {
        Self {
            owner: b.owner.clone(),
            spend_limit: b.limits.spend_micros.map(format_micros),
            token_limit: b.limits.tokens,
            spent: format_micros(b.spent.micros),
            spent_tokens: b.spent.tokens,
            reserved: format_micros(b.reserved.micros),
            reserved_tokens: b.reserved.tokens,
            currency: b.currency.clone(),
            period_start: rfc3339(b.period_start),
            resets_at: rfc3339(b.resets_at),
        }
    }
}

/// Body of `PUT /api/v1/budgets/{owner}`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetBudgetRequest {
    /// The monthly spend limit in currency units, to a millionth at most
    /// (a finer one is refused, never rounded);
    /// null or absent: none. With neither limit the month is tracked and
    /// nothing is refused.
    #[schema(minimum = 0, maximum = 1_000_000_000_000.0, multiple_of = 0.000001)]
    pub spend_limit: Option<f64>,
    /// The monthly token limit; null or absent: none.
    #[schema(minimum = 0, maximum = 1_000_000_000_000_000i64)]
    #[serde(default, deserialize_with = "super::api_webhooks::whole_number")]
    pub token_limit: Option<u64>,
    /// Why (written to the audit log): not blank, at most 2000 characters.
    #[schema(
        pattern = r"[^\t-\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]",
        max_length = 2000
    )]
    pub reason: String,
}

/// Body of `DELETE /api/v1/budgets/{owner}`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RemoveBudgetRequest {
    /// Why (written to the audit log).
    #[schema(
        pattern = r"[^\t-\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]",
        max_length = 2000
    )]
    pub reason: String,
}

/// A spend limit in micro-units, exactly (`domain::ledger::spend_micros`),
/// or `422 invalid-body` naming `spend_limit`.
pub fn spend_micros(limit: f64) -> Result<i64, ApiError> {
    crate::domain::ledger::spend_micros(limit).map_err(|refusal| {
        ApiError::new(ProblemType::InvalidBody, refusal.to_string()).with("field", "spend_limit")
    })
}

/// Sets an owner's monthly budget (admins); audited. A new budget starts
/// with this month's recorded spend.
#[utoipa::path(
    put, path = "/api/v1/budgets/{owner}", tag = "usage",
    params(("owner" = String, Path, description = "The owner's user name")),
    request_body = SetBudgetRequest,
    responses(
        (status = 200, body = BudgetView),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such user", body = Problem, content_type = "application/problem+json"),
        (status = 413, body = Problem, content_type = "application/problem+json"),
        (status = 415, body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A limit out of range, or a blank reason", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn set_budget(
    app: web::Data<App>,
    caller: Caller,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    crate::app::require_admin(&caller.0)?;
    let body: SetBudgetRequest = json_body(
        &req,
        payload,
        BodyRules::of(&app.config().server),
        EmptyBody::Refuse,
    )
    .await?;
    let limits = BudgetLimits {
        spend_micros: body.spend_limit.map(spend_micros).transpose()?,
        tokens: match body.token_limit {
            Some(t) if t > 1_000_000_000_000_000 => {
                return Err(ApiError::new(
                    ProblemType::InvalidBody,
                    "`token_limit` must be between 0 and 10^18",
                )
                .with("field", "token_limit"))
            }
            other => other.map(|t| t as i64),
        },
    };
    let budget = app
        .set_budget(&caller.0, &path, limits, &body.reason)
        .await?;
    Ok(HttpResponse::Ok().json(BudgetView::from(&budget)))
}

/// An owner's budget: admins anyone's, a user their own.
#[utoipa::path(
    get, path = "/api/v1/budgets/{owner}", tag = "usage",
    params(("owner" = String, Path, description = "The owner's user name")),
    responses(
        (status = 200, body = BudgetView),
        (status = 400, description = "A query parameter: this path takes none", body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Another owner's, and not an admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such user, or no budget", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_budget(
    app: web::Data<App>,
    caller: Caller,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    no_query(&req)?;
    match app.budget(&caller.0, &path).await? {
        Some(budget) => Ok(HttpResponse::Ok().json(BudgetView::from(&budget))),
        None => Err(ApiError::not_found()),
    }
}

/// Removes an owner's budget (admins); audited.
#[utoipa::path(
    delete, path = "/api/v1/budgets/{owner}", tag = "usage",
    params(("owner" = String, Path, description = "The owner's user name")),
    request_body = RemoveBudgetRequest,
    responses(
        (status = 204, description = "Removed"),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 403, body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such user, or no budget", body = Problem, content_type = "application/problem+json"),
        (status = 413, body = Problem, content_type = "application/problem+json"),
        (status = 415, body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A blank reason", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn remove_budget(
    app: web::Data<App>,
    caller: Caller,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    crate::app::require_admin(&caller.0)?;
    let body: RemoveBudgetRequest = json_body(
        &req,
        payload,
        BodyRules::of(&app.config().server),
        EmptyBody::Refuse,
    )
    .await?;
    if app.remove_budget(&caller.0, &path, &body.reason).await? {
        Ok(HttpResponse::NoContent().finish())
    } else {
        Err(ApiError::not_found())
    }
}

/// Every owner's budget (admins).
#[utoipa::path(
    get, path = "/api/v1/budgets", tag = "usage",
    responses(
        (status = 200, body = Vec<BudgetView>),
        (status = 400, description = "A query parameter: this path takes none", body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 403, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list_budgets(
    app: web::Data<App>,
    caller: Caller,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    no_query(&req)?;
    let budgets = app.budgets(&caller.0).await?;
    Ok(HttpResponse::Ok().json(budgets.iter().map(BudgetView::from).collect::<Vec<_>>()))
}

/// The routes, inside the `/api/v1` scope.
pub fn routes(cfg: &mut web::ServiceConfig) {
    use super::{read, resource, READ};
    cfg.service(resource("/usage", READ).route(read().to(usage)))
        .service(resource("/jobs/{id}/usage", READ).route(read().to(job_usage)))
        .service(resource("/budgets", READ).route(read().to(list_budgets)))
        .service(
            resource("/budgets/{owner}", "GET, HEAD, PUT, DELETE")
                .route(read().to(get_budget))
                .route(web::put().to(set_budget))
                .route(web::delete().to(remove_budget)),
        );
}

/// The usage part of the OpenAPI document, merged into `openapi::ApiDoc`.
#[derive(OpenApi)]
#[openapi(
    paths(usage, job_usage, list_budgets, get_budget, set_budget, remove_budget),
    components(schemas(
        UsageReportView,
        UsageGroupView,
        JobUsageView,
        AttemptUsageView,
        BudgetView,
        SetBudgetRequest,
        RemoveBudgetRequest
    ))
)]
pub struct UsageDoc;
