//! The usage pages: an owner's own usage and budget (`/usage`), the
//! admins' ledger view with budgets (`/admin/usage`), and the console's
//! charts (drawn on `/admin`).

use actix_web::{web, HttpResponse};
use askama::Template;
use serde::Deserialize;

use super::charts::{Chart, ChartKind, Series};
use super::{render, see_other, Nav, PageError, SignedIn};
use crate::app::charts::{Buckets, ConsoleCharts};
use crate::app::ledger::{BudgetState, UsageReport};
use crate::app::App;
use crate::domain::ledger::{format_micros, BudgetLimits};
use crate::domain::Timestamp;
use crate::web::api_usage::{owner_filter, spend_micros, usage_filter, UsageGroupView, UsageQuery};
use crate::web::views::rfc3339;

/// The charts of the console's front page, drawn.
pub fn console_charts(data: &ConsoleCharts) -> Vec<Chart> {
    let label = |at: Timestamp, from: usize, to: usize| rfc3339(at)[from..to].to_owned();
    let chart = |id: &str,
                 title: String,
                 unit: &str,
                 kind,
                 b: &Buckets,
                 fmt: &dyn Fn(Timestamp) -> String| {
        Chart {
            id: id.to_owned(),
            title,
            unit: unit.to_owned(),
            kind,
            buckets: b.starts.iter().map(|s| fmt(*s)).collect(),
            series: b
                .series
                .iter()
                .map(|(name, values)| Series {
                    name: name.clone(),
                    values: values.clone(),
                })
                .collect(),
        }
    };
    let minute = |at: Timestamp| label(at, 11, 16);
    let hour = |at: Timestamp| label(at, 5, 13).replace('T', " ") + "h";
    let day = |at: Timestamp| label(at, 0, 10);
    let mut charts = vec![
        chart(
            "jobs-hour",
            "Jobs created per minute, last hour, by status now".into(),
            "jobs/min",
            ChartKind::StackedBars,
            &data.jobs_last_hour,
            &minute,
        ),
        chart(
            "jobs-day",
            "Jobs created per minute, last day (hourly average), by status now".into(),
            "jobs/min",
            ChartKind::StackedBars,
            &data.jobs_last_day,
            &hour,
        ),
        chart(
            "unknown-backlog",
            "Unknown backlog, last day: attempts, and the oldest one's age".into(),
            "",
            ChartKind::Lines,
            &data.backlog,
            &minute,
        ),
    ];
    if let Some(races) = &data.races {
        charts.push(chart(
            "races",
            "Races per hour, last two days (answers that lost)".into(),
            "races",
            ChartKind::StackedBars,
            races,
            &|ms| label(ms, 5, 13).replace('T', " ") + "h",
        ));
    }
    if let Some(spend) = &data.spend {
        charts.push(chart(
            "spend",
            format!(
                "Spend per day by provider, last 30 days ({})",
                data.currency
            ),
            &data.currency,
            ChartKind::StackedBars,
            spend,
            &day,
        ));
    }
    charts
}

/// A budget as the pages show it.
pub struct BudgetLine {
    pub owner: String,
    pub spend_limit: String,
    pub token_limit: String,
    pub spent: String,
    pub spent_tokens: i64,
    pub reserved: String,
    pub reserved_tokens: i64,
    pub resets_at: String,
}

impl From<&BudgetState> for BudgetLine {
    fn from(b: &BudgetState) -> Self {
        Self {
            owner: b.owner.clone(),
            spend_limit: b.limits.spend_micros.map_or_else(
                || "none".into(),
                |m| format!("{} {}", format_micros(m), b.currency),
            ),
            token_limit: b
                .limits
                .tokens
                .map_or_else(|| "none".into(), |t| t.to_string()),
            spent: format!("{} {}", format_micros(b.spent.micros), b.currency),
            spent_tokens: b.spent.tokens,
            reserved: format!("{} {}", format_micros(b.reserved.micros), b.currency),
            reserved_tokens: b.reserved.tokens,
            resets_at: rfc3339(b.resets_at)[..10].to_owned(),
        }
    }
}

/// The filter form's fields, echoed back.
#[derive(Default)]
pub struct UsageEcho {
    pub from: String,
    pub to: String,
    pub owner: String,
    pub provider: String,
    pub task: String,
    pub group_by: String,
}

#[derive(Template)]
#[template(path = "usage.html")]
struct UsagePage {
    nav: Nav,
    /// The admins' view (every owner, budgets, the owner filter).
    admin: bool,
    echo: UsageEcho,
    currency: String,
    groups: Vec<UsageGroupView>,
    total: UsageGroupView,
    range: String,
    budgets: Vec<BudgetLine>,
    spend_chart: Option<Chart>,
}

/// `GET /usage`: the signed-in owner's usage and budget.
pub async fn my_usage(
    app: web::Data<App>,
    user: SignedIn,
    query: web::Query<UsageQuery>,
) -> Result<HttpResponse, PageError> {
    usage_page(&app, &user, query.into_inner(), false).await
}

/// `GET /admin/usage`: the ledger view (admins).
pub async fn admin_usage(
    app: web::Data<App>,
    user: SignedIn,
    query: web::Query<UsageQuery>,
) -> Result<HttpResponse, PageError> {
    crate::app::require_admin(&user.user)?;
    usage_page(&app, &user, query.into_inner(), true).await
}

async fn usage_page(
    app: &App,
    user: &SignedIn,
    mut query: UsageQuery,
    admin: bool,
) -> Result<HttpResponse, PageError> {
    // The form sends its empty fields: empty is absent.
    for field in [
        &mut query.from,
        &mut query.to,
        &mut query.owner,
        &mut query.provider,
        &mut query.task,
        &mut query.group_by,
    ] {
        if field.as_deref().is_some_and(|v| v.trim().is_empty()) {
            *field = None;
        }
    }
    let owner = if admin {
        owner_filter(app, query.owner.as_deref())
            .await
            .map_err(|_| PageError::bad_request("No user has that name."))?
    } else {
        String::new()
    };
    let (filter, grouping) =
        usage_filter(&query, owner).map_err(|e| PageError::bad_request(e.detail.clone()))?;
    let report = app.usage_report(&user.user, filter, grouping).await?;
    let budgets = if admin {
        app.budgets(&user.user).await?
    } else {
        app.budget(&user.user, &user.user.name)
            .await?
            .into_iter()
            .collect()
    };
    let view = crate::web::api_usage::UsageReportView::new(&report);
    Ok(render(&UsagePage {
        nav: user.nav(),
        admin,
        echo: UsageEcho {
            from: query.from.unwrap_or_default(),
            to: query.to.unwrap_or_default(),
            owner: query.owner.unwrap_or_default(),
            provider: query.provider.unwrap_or_default(),
            task: query.task.unwrap_or_default(),
            group_by: report.grouping.as_str().to_owned(),
        },
        currency: report.currency.clone(),
        spend_chart: spend_chart(&report, &view.groups),
        range: format!("{} to {}", &view.from[..10], &view.to[..10]),
        groups: view.groups,
        total: view.total,
        budgets: budgets.iter().map(BudgetLine::from).collect(),
    }))
}

/// Spend and the cost of races and late answers per group, drawn.
fn spend_chart(report: &UsageReport, groups: &[UsageGroupView]) -> Option<Chart> {
    if groups.is_empty() {
        return None;
    }
    let micros = |f: &dyn Fn(&crate::app::LedgerSums) -> i64| -> Vec<f64> {
        report
            .groups
            .iter()
            .map(|g| f(&g.ledger) as f64 / 1e6)
            .collect()
    };
    Some(Chart {
        id: "usage-spend".into(),
        title: format!(
            "Spend by {}: answers used and races lost ({})",
            report.grouping.as_str(),
            report.currency
        ),
        unit: report.currency.clone(),
        kind: ChartKind::StackedBars,
        buckets: groups.iter().map(|g| g.key.clone()).collect(),
        series: vec![
            Series {
                name: "answers used".into(),
                values: micros(&|l| l.cost_micros - l.lost_micros),
            },
            Series {
                name: "races lost".into(),
                values: micros(&|l| l.lost_micros),
            },
        ],
    })
}

#[derive(Deserialize)]
pub struct BudgetForm {
    pub csrf: Option<String>,
    pub owner: Option<String>,
    pub spend_limit: Option<String>,
    pub token_limit: Option<String>,
    pub reason: Option<String>,
    /// `set` (default) or `remove`.
    pub action: Option<String>,
}

/// `POST /admin/budgets`: sets or removes an owner's budget (admins).
pub async fn budget_act(
    app: web::Data<App>,
    user: SignedIn,
    form: web::Form<BudgetForm>,
) -> Result<HttpResponse, PageError> {
    user.check_csrf(form.csrf.as_deref())?;
    crate::app::require_admin(&user.user)?;
    let owner = form.owner.as_deref().unwrap_or_default().trim();
    let reason = form.reason.as_deref().unwrap_or_default();
    if form.action.as_deref() == Some("remove") {
        app.remove_budget(&user.user, owner, reason).await?;
        return Ok(see_other("/admin/usage"));
    }
    let spend = match form.spend_limit.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(text) => {
            let value: f64 = text.parse().map_err(|_| {
                PageError::bad_request("The spend limit is a number of currency units, like 25.50.")
            })?;
            Some(spend_micros(value).map_err(|e| PageError::bad_request(e.detail.clone()))?)
        }
    };
    let tokens = match form.token_limit.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(text) => Some(
            text.parse::<i64>()
                .ok()
                .filter(|t| (0..=1_000_000_000_000_000).contains(t))
                .ok_or_else(|| {
                    PageError::bad_request("The token limit is a whole number of tokens.")
                })?,
        ),
    };
    let limits = BudgetLimits {
        spend_micros: spend,
        tokens,
    };
    app.set_budget(&user.user, owner, limits, reason).await?;
    Ok(see_other("/admin/usage"))
}
