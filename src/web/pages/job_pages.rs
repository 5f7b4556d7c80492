//! The submit page, the job page (live while the job is), and "My jobs".

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use askama::Template;
use serde::Deserialize;
use serde_json::Value;

use super::paging::{cursor, Paging};
use super::timeline::{self, Timeline};
use super::{
    duration, render, render_with, see_other, wants_partial, when, Nav, PageError, SignedIn,
};
use crate::app::intake::JobRequest;
use crate::app::TaskDefinition;
use crate::app::{App, AppError, Attempt, Credential, Job};
use crate::contracts::TaskKind;
use crate::domain::{
    may_start_attempt, AttemptState, IdempotencyKey, JobId, JobStatus, JsonText, NewAttemptRefusal,
    Timestamp,
};

/// One input field of the submit form, with what was typed.
#[derive(Clone)]
struct Field {
    name: String,
    value: String,
}

#[derive(Template)]
#[template(path = "submit.html")]
struct SubmitPage<'a> {
    nav: Nav,
    tasks: Vec<String>,
    task: &'a TaskDefinition,
    idempotency_key: String,
    provider: String,
    fields: Vec<Field>,
    /// A chat route: the input is a chat request, shown with an example.
    is_chat: bool,
    input_json: String,
    params_json: String,
    error: Option<String>,
    /// The job this form's key already made, if it made one.
    submitted: Option<String>,
}

/// What a fresh form for a chat route holds: a request to start from.
const CHAT_EXAMPLE: &str = r#"{
  "stream": true,
  "messages": [
    {"role": "system", "content": "Answer in one sentence."},
    {"role": "user", "content": "What does an idempotency key do?"}
  ]
}"#;

/// What a fresh form's JSON input holds.
fn fresh_input(task: &TaskDefinition) -> String {
    match task.kind {
        TaskKind::Chat => CHAT_EXAMPLE.to_owned(),
        TaskKind::Prompt => "{}".to_owned(),
    }
}

impl SubmitPage<'_> {
    /// Where the form posts: `/jobs`, with its key in the address too, so
    /// that a load balancer, which cannot read a form's body, can route
    /// every submission of one form to one process (docs/deployment.md).
    fn action(&self) -> String {
        format!(
            "/jobs?{KEY_IN_ADDRESS}={}",
            super::percent_encode(&self.idempotency_key)
        )
    }
}

/// The query argument of the submit form's address that repeats its key.
const KEY_IN_ADDRESS: &str = "idempotency_key";

#[derive(Deserialize)]
pub struct NewJobQuery {
    task: Option<String>,
    key: Option<String>,
}

fn fresh_key() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// `GET /jobs/new`: the submit form. A form's idempotency key is in its URL
/// (`/jobs/new?key=…`; without one, the server redirects to a fresh key), so
/// Back, a reload or a restored tab shows the same form with the same key,
/// whatever the browser's cache or script settings. A form whose key
/// already made a job says so, links to it, and is filled with what it
/// sent: submitting it again unchanged returns that job; edited, it is
/// refused.
pub async fn new_job_form(
    app: web::Data<App>,
    user: SignedIn,
    req: HttpRequest,
    query: web::Query<NewJobQuery>,
) -> Result<HttpResponse, PageError> {
    let Some(raw_key) = &query.key else {
        let mut target = format!("/jobs/new?key={}", fresh_key());
        if let Some(task) = &query.task {
            target.push_str(&format!("&task={}", super::percent_encode(task)));
        }
        return Ok(see_other(&target));
    };
    let key = IdempotencyKey::parse(raw_key).map_err(|e| {
        PageError::bad_request(format!(
            "That form's link is not valid ({e}). Open a fresh form."
        ))
    })?;
    let contracts = &app.config().contracts;
    let existing = app.job_by_key(&user.user, &key).await?;
    let task_name = existing
        .as_ref()
        .map(|job| job.task.clone())
        .or_else(|| query.task.clone());
    let contract = match &task_name {
        Some(name) => contracts.get(name),
        None => contracts.first().cloned(),
    }
    .ok_or_else(PageError::not_found)?;
    let task = &contract.definition;
    let sent = existing.as_ref().map(|job| job.input.value());
    let fields = task
        .input_fields
        .iter()
        .map(|f| Field {
            name: f.clone(),
            value: sent
                .as_ref()
                .and_then(|input| input.get(f))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        })
        .collect();
    let mut response = render(&SubmitPage {
        nav: user.nav(),
        tasks: contracts.names(),
        task,
        idempotency_key: key.as_str().to_owned(),
        provider: existing
            .as_ref()
            .and_then(|job| job.requested_provider.clone())
            .unwrap_or_default(),
        fields,
        is_chat: task.kind == TaskKind::Chat,
        input_json: existing
            .as_ref()
            .map_or_else(|| fresh_input(task), |job| job.input.as_str().to_owned()),
        params_json: existing
            .as_ref()
            .map(|job| job.params.as_str().to_owned())
            .filter(|p| p != "{}")
            .unwrap_or_default(),
        error: None,
        submitted: existing.map(|job| job.id.to_string()),
    });
    // A boosted navigation shows this URL, key and all.
    if let Ok(url) = actix_web::http::header::HeaderValue::from_str(&req.uri().to_string()) {
        response.headers_mut().insert(
            actix_web::http::header::HeaderName::from_static("hx-push-url"),
            url,
        );
    }
    Ok(response)
}

#[derive(Template)]
#[template(path = "key_reused.html")]
struct KeyReusedPage<'a> {
    nav: Nav,
    job_id: &'a str,
    task: &'a str,
}

/// The posted form, as name/value pairs: input fields are named `input.<field>`.
struct SubmittedForm(Vec<(String, String)>);

impl SubmittedForm {
    /// How many fields are named `name`.
    fn all(&self, name: &str) -> usize {
        self.0.iter().filter(|(k, _)| k == name).count()
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The form's one submission key.
    fn submission_key(&self) -> Result<IdempotencyKey, PageError> {
        let keys = self.all("idempotency_key");
        if keys > 1 {
            return Err(PageError::bad_request(format!(
                "The form carries {keys} submission keys, and only one can say which job it \
                 makes ({}). Open a fresh form.",
                crate::domain::IdempotencyKeyError::Repeated(keys)
            )));
        }
        let raw_key = self.get("idempotency_key").unwrap_or_default();
        IdempotencyKey::parse(raw_key).map_err(|e| {
            PageError::bad_request(format!(
                "The form's submission key is not valid ({e}). Open a fresh form."
            ))
        })
    }
}

/// Checks that the key the form's address repeats, if it has one (what a
/// load balancer routed the submission by), is the form's own: a form
/// posted with another key in its address is refused, so that every layer
/// agrees on which job a submission names. The field stays the key: a
/// form posted to `/jobs` alone is taken as before.
fn key_in_address_agrees(
    address: &[(String, String)],
    key: &IdempotencyKey,
) -> Result<(), PageError> {
    let named = address.iter().filter(|(name, _)| name == KEY_IN_ADDRESS);
    for (_, raw) in named {
        if IdempotencyKey::parse(raw).as_ref() != Ok(key) {
            return Err(PageError::bad_request(
                "The form's address carries another submission key than the form itself. \
                 Open a fresh form.",
            ));
        }
    }
    Ok(())
}

/// `POST /jobs?idempotency_key=…`: a double click, Enter twice or a
/// resubmitted POST all carry the same key, so all land on the one job.
pub async fn submit_job(
    app: web::Data<App>,
    user: SignedIn,
    address: web::Query<Vec<(String, String)>>,
    form: web::Form<Vec<(String, String)>>,
) -> Result<HttpResponse, PageError> {
    let form = SubmittedForm(form.into_inner());
    user.check_csrf(form.get("csrf"))?;
    let key = form.submission_key()?;
    key_in_address_agrees(&address, &key)?;
    let contract = app
        .config()
        .contracts
        .get(form.get("task").unwrap_or_default())
        .ok_or_else(|| PageError::bad_request("That task does not exist. Open a fresh form."))?;
    let task = &contract.definition;
    let typed = Typed::read(&form, task);
    let key_text = key.as_str().to_owned();
    let redisplay = |error: String| {
        render_with(
            StatusCode::UNPROCESSABLE_ENTITY,
            &SubmitPage {
                nav: user.nav(),
                tasks: app.config().contracts.names(),
                task,
                // The key is not reserved by a refused submission: keep it.
                idempotency_key: key_text.clone(),
                provider: typed.provider.clone().unwrap_or_default(),
                fields: typed.fields.clone(),
                is_chat: task.kind == TaskKind::Chat,
                input_json: typed.input_json.clone(),
                params_json: typed.params_json.clone(),
                error: Some(error),
                submitted: None,
            },
        )
    };
    let (input, params) = match typed.input_and_params(task) {
        Ok(read) => read,
        Err(error) => return Ok(redisplay(error)),
    };
    let request = JobRequest {
        task: task.name.clone(),
        input,
        provider: typed.provider.clone(),
        params,
        chat_route: false,
    };
    match app
        .create_job(&user.user, &Credential::Checked, key, request)
        .await
    {
        Ok(created) => Ok(see_other(&format!("/jobs/{}", created.job.id))),
        Err(AppError::KeyReused { job_id }) => Ok(render_with(
            StatusCode::CONFLICT,
            &KeyReusedPage {
                nav: user.nav(),
                job_id: job_id.as_str(),
                task: &task.name,
            },
        )),
        // The form is shown again with what was typed and why it was refused.
        Err(
            refusal @ (AppError::UnknownTask { .. }
            | AppError::UnknownProvider { .. }
            | AppError::InvalidInput { .. }
            | AppError::InvalidBody { .. }
            | AppError::NestingTooDeep(_)),
        ) => Ok(redisplay(refusal.to_string())),
        Err(other) => Err(other.into()),
    }
}

/// What was typed into the submit form, kept to show it again.
struct Typed {
    provider: Option<String>,
    fields: Vec<Field>,
    input_json: String,
    params_json: String,
}

impl Typed {
    fn read(form: &SubmittedForm, task: &TaskDefinition) -> Self {
        Self {
            provider: form
                .get("provider")
                .filter(|p| !p.is_empty())
                .map(str::to_owned),
            fields: task
                .input_fields
                .iter()
                .map(|f| Field {
                    name: f.clone(),
                    value: form
                        .get(&format!("input.{f}"))
                        .unwrap_or_default()
                        .to_owned(),
                })
                .collect(),
            input_json: form.get("input_json").unwrap_or("{}").to_owned(),
            params_json: form
                .get("params_json")
                .unwrap_or_default()
                .trim()
                .to_owned(),
        }
    }

    /// The job's input (the fields, or the JSON typed) and parameters, or
    /// why they are refused, for the form. JSON typed into the form is kept
    /// as typed, like an API request's.
    fn input_and_params(
        &self,
        task: &TaskDefinition,
    ) -> Result<(JsonText, Option<JsonText>), String> {
        let input = if task.input_fields.is_empty() {
            JsonText::parse(self.input_json.trim())
                .map_err(|e| format!("The input is not valid JSON: {e}"))?
        } else {
            JsonText::from_value(&Value::Object(
                self.fields
                    .iter()
                    .map(|f| (f.name.clone(), Value::String(f.value.clone())))
                    .collect(),
            ))
        };
        let params = if self.params_json.is_empty() {
            None
        } else {
            Some(
                JsonText::parse(self.params_json.as_str())
                    .map_err(|e| format!("The parameters are not valid JSON: {e}"))?,
            )
        };
        Ok((input, params))
    }
}

/// One line of the attempts table.
struct AttemptLine {
    number: i32,
    provider: String,
    state: &'static str,
    outcome: &'static str,
    sent: String,
    answered: String,
    took: String,
    error: String,
    /// Its call's tokens and cost, "usage unknown" while its outcome is.
    usage: String,
}

/// An attempt's usage in words (docs/design.md, "Usage, prices and budgets").
fn usage_words(a: &Attempt, entry: Option<&crate::app::LedgerEntry>) -> String {
    use crate::domain::ledger::{format_micros, usage_status, UsageStatus};
    match (
        usage_status(a.state, a.sent_at.is_some(), entry.is_some()),
        entry,
    ) {
        (UsageStatus::Recorded, Some(e)) => {
            let cost = match (e.cost_micros, &e.currency) {
                (Some(micros), Some(currency)) => format!(", {} {currency}", format_micros(micros)),
                _ => ", not priced".to_owned(),
            };
            let estimated = if e.usage_source == crate::domain::UsageSource::Estimated {
                " (estimated)"
            } else {
                ""
            };
            format!(
                "{} + {} tokens{estimated}{cost}",
                e.prompt_tokens, e.completion_tokens
            )
        }
        (UsageStatus::Pending, _) => "call out".to_owned(),
        (UsageStatus::NotSent, _) => "not sent".to_owned(),
        _ => "usage unknown".to_owned(),
    }
}

impl AttemptLine {
    /// Staff see the provider's own text; the owner sees the reason.
    fn new(a: &Attempt, staff: bool, entry: Option<&crate::app::LedgerEntry>) -> Self {
        let error = a.reason().map(|reason| {
            if staff {
                reason.for_staff()
            } else {
                reason.for_owner()
            }
        });
        Self {
            usage: usage_words(a, entry),
            number: a.number,
            provider: a.provider.clone(),
            state: a.state.as_str(),
            outcome: a.outcome.map(|o| o.as_str()).unwrap_or(""),
            sent: a.started_at.map(when).unwrap_or_else(|| "not yet".into()),
            answered: a.finished_at.map(when).unwrap_or_default(),
            took: match (a.started_at, a.finished_at) {
                (Some(s), Some(f)) => duration(f - s),
                _ => String::new(),
            },
            // A success keeps the text of what it recovered from.
            error: match (error, a.state, a.not_before) {
                (_, AttemptState::Queued, Some(not_before)) => format!(
                    "a retry: not sent before {}, when its provider said it may be called again",
                    when(not_before)
                ),
                (Some(earlier), AttemptState::Succeeded, _) => format!("earlier: {earlier}"),
                (error, _, Some(_)) => {
                    let waited = format!("a retry, sent after waiting {}", duration(a.waited_ms()));
                    match error {
                        Some(error) => format!("{waited}; {error}"),
                        None => waited,
                    }
                }
                (error, _, None) => error.unwrap_or_default(),
            },
        }
    }
}

/// One audit entry about the job, for staff.
struct AuditLine {
    at: String,
    actor: String,
    action: &'static str,
    reason: String,
}

#[derive(Template)]
#[template(path = "job.html")]
struct JobPage {
    nav: Nav,
    live: JobLive,
    /// The owner's page of a streaming chat job that has not finished:
    /// it follows the job's text live (`/jobs/{id}/stream`).
    live_text: bool,
    /// For staff: whose job it is.
    owner: Option<String>,
    /// For staff: what support did to it.
    audit: Vec<AuditLine>,
    /// The webhook events about it and their deliveries (rendered).
    deliveries: String,
}

/// The part of the job page that refreshes itself while the job is live.
#[derive(Template)]
#[template(path = "_job_live.html")]
struct JobLive {
    csrf: String,
    id: String,
    task: String,
    status: &'static str,
    is_live: bool,
    created: String,
    input: String,
    /// A chat answer's text, shown as text.
    answer: Option<String>,
    result: String,
    failure_reason: String,
    attempts: Vec<AttemptLine>,
    timeline: Timeline,
    /// Why no new attempt may start now; empty when one may.
    retry_refusal: String,
    /// For staff, while an attempt is unknown: where to resolve it.
    queue_link: Option<String>,
    /// Staff tools: the providers a new attempt may use (the job's primary and
    /// qualified fallbacks), for "next attempt on …".
    staff: bool,
    chain: Vec<String>,
    can_fail: bool,
    /// The owner's, while the job is unfinished.
    can_cancel: bool,
}

impl JobLive {
    /// Whether a form on the page asks for something to fill in (a reason
    /// to mark the job failed, staff's choice of provider), rather than a
    /// button alone.
    fn asks_for_input(&self) -> bool {
        self.can_fail || (self.staff && self.retry_refusal.is_empty())
    }

    /// Whether the page reloads itself where JavaScript is off (a meta
    /// refresh): while the job is live, unless a reload would wipe what
    /// someone is filling in; that page offers a link to refresh instead.
    fn reloads_without_javascript(&self) -> bool {
        self.is_live && !self.asks_for_input()
    }
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

fn job_live(
    user: &SignedIn,
    job: &Job,
    attempts: &[Attempt],
    allowed: Vec<String>,
    usage: &[crate::app::LedgerEntry],
) -> JobLive {
    let live = attempts.iter().find(|a| a.state.is_live());
    let retry_refusal = match may_start_attempt(job.status, live.map(|a| a.state)) {
        Ok(()) => String::new(),
        Err(NewAttemptRefusal::JobFinished(crate::domain::JobStatus::Cancelled)) => {
            "The job was cancelled by its owner; it takes no more attempts.".to_owned()
        }
        Err(NewAttemptRefusal::JobFinished(status)) => {
            format!("The job has {status}; it takes no more attempts.")
        }
        Err(NewAttemptRefusal::AttemptInFlight(state)) => {
            let number = live.map(|a| a.number).unwrap_or_default();
            match state {
                AttemptState::Unknown if user.user.role.is_staff() => format!(
                    "Attempt {number} timed out and its outcome is unknown: the provider may still be working. \
                     A new attempt can start once it answers, or once you abandon it in the Unknown queue."
                ),
                AttemptState::Unknown => format!(
                    "Attempt {number} timed out and its outcome is unknown: the provider may still be working. \
                     A new attempt can start once it answers or support resolves it."
                ),
                other => format!("Attempt {number} is {other}; wait for it to finish."),
            }
        }
    };
    let staff = user.user.role.is_staff();
    // Staff resolve an unknown attempt in the queue: the page leads there.
    let queue_link = live
        .filter(|a| staff && a.state == AttemptState::Unknown)
        .map(|a| format!("/admin/unknown#attempt-{}", a.id));
    JobLive {
        csrf: user.csrf.clone(),
        id: job.id.to_string(),
        task: job.task.clone(),
        status: job.status.as_str(),
        is_live: !job.status.is_terminal() || live.is_some(),
        created: when(job.created_at),
        input: pretty(&job.input.value()),
        answer: job.result.as_ref().and_then(|r| {
            crate::chat::openai_chat::StoredAnswer::read(&r.value())
                .answer()
                .text
        }),
        result: job
            .result
            .as_ref()
            .map(|r| pretty(&r.value()))
            .unwrap_or_default(),
        failure_reason: job.failure().map(|r| r.for_staff()).unwrap_or_default(),
        attempts: attempts
            .iter()
            .map(|a| AttemptLine::new(a, staff, usage.iter().find(|e| e.attempt_id == a.id)))
            .collect(),
        timeline: timeline::layout(job.created_at, attempts, Timestamp::now()),
        can_fail: staff && live.is_none() && !job.status.is_terminal(),
        can_cancel: job.owner_id == user.user.id && job.status.is_cancellable(),
        queue_link,
        staff,
        chain: allowed,
        retry_refusal,
    }
}

/// The job named in the path, if `user` may see it.
async fn visible_job(
    app: &App,
    user: &SignedIn,
    raw_id: &str,
) -> Result<(Job, Vec<Attempt>), PageError> {
    let job_id = JobId::parse(raw_id).ok_or_else(PageError::not_found)?;
    Ok(app.job_for(&user.user, &job_id).await?)
}

/// `GET /jobs/{id}`: the whole page, or (for htmx polling) the live part.
pub async fn job_page(
    app: web::Data<App>,
    user: SignedIn,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, PageError> {
    let (job, attempts) = visible_job(&app, &user, &path).await?;
    let allowed = app.allowed_providers(&job).await?.allowed;
    let usage = app.job_usage(&job).await?;
    let live = job_live(&user, &job, &attempts, allowed, &usage);
    if wants_partial(&req) {
        return Ok(render(&live));
    }
    let (owner, audit) = if user.user.role.is_staff() {
        let notes = app.staff_notes(&user.user, &job).await?;
        let audit = notes
            .audit
            .into_iter()
            .map(|e| AuditLine {
                at: when(e.at),
                actor: e.actor,
                action: e.action.label(),
                reason: e.reason,
            })
            .collect();
        (Some(notes.owner), audit)
    } else {
        (None, Vec::new())
    };
    let live_text = job.owner_id == user.user.id && super::live_text::streams_live(&job);
    let deliveries =
        super::fragment(&super::webhook_pages::job_deliveries(&app, &user, &job).await?);
    Ok(render(&JobPage {
        nav: user.nav(),
        live,
        live_text,
        owner,
        audit,
        deliveries,
    }))
}

#[derive(Deserialize)]
pub struct AttemptForm {
    csrf: Option<String>,
    provider: Option<String>,
}

/// `POST /jobs/{id}/attempts`: the owner's "try again", or support's "next
/// attempt on …" (audited).
pub async fn start_attempt(
    app: web::Data<App>,
    user: SignedIn,
    path: web::Path<String>,
    form: web::Form<AttemptForm>,
) -> Result<HttpResponse, PageError> {
    user.check_csrf(form.csrf.as_deref())?;
    let job_id = JobId::parse(&path).ok_or_else(PageError::not_found)?;
    let provider = form.provider.clone().filter(|p| !p.is_empty());
    app.start_attempt(&user.user, &job_id, provider).await?;
    Ok(see_other(&format!("/jobs/{job_id}")))
}

/// `POST /jobs/{id}/cancel`: the owner cancels their job (docs/design.md,
/// "Cancelling"); a second cancel changes nothing.
pub async fn cancel_job(
    app: web::Data<App>,
    user: SignedIn,
    path: web::Path<String>,
    form: web::Form<crate::web::pages::session::CsrfForm>,
) -> Result<HttpResponse, PageError> {
    user.check_csrf(form.csrf.as_deref())?;
    let job_id = JobId::parse(&path).ok_or_else(PageError::not_found)?;
    app.cancel_job(&user.user, &job_id).await?;
    Ok(see_other(&format!("/jobs/{job_id}")))
}

#[derive(Deserialize)]
pub struct ReasonForm {
    csrf: Option<String>,
    reason: Option<String>,
}

/// `POST /jobs/{id}/fail` (support, admin): finalize a job whose unknown
/// attempt was abandoned, with a reason (audited).
pub async fn fail_job(
    app: web::Data<App>,
    user: SignedIn,
    path: web::Path<String>,
    form: web::Form<ReasonForm>,
) -> Result<HttpResponse, PageError> {
    user.check_csrf(form.csrf.as_deref())?;
    let job_id = JobId::parse(&path).ok_or_else(PageError::not_found)?;
    app.fail_job(
        &user.user,
        &job_id,
        form.reason.as_deref().unwrap_or_default(),
    )
    .await?;
    Ok(see_other(&format!("/jobs/{job_id}")))
}

struct JobListRow {
    id: String,
    key: String,
    task: String,
    /// The provider the job is with: the winner's, else its latest attempt's.
    provider: String,
    status: &'static str,
    created: String,
    age: String,
}

#[derive(Template)]
#[template(path = "jobs.html")]
struct JobsPage {
    nav: Nav,
    jobs: Vec<JobListRow>,
    next: Option<String>,
    statuses: Vec<&'static str>,
    /// The status shown (empty: every status).
    status: String,
    oldest_first: bool,
    /// The same list in the other order (the Age column's link).
    reorder: String,
    /// Whether the user has any job at all (with a filter, none may show).
    filtered: bool,
}

#[derive(Deserialize)]
pub struct JobsQuery {
    status: Option<String>,
    /// `newest` (the default) or `oldest`.
    order: Option<String>,
    /// Continue past this job, in the list's order.
    after: Option<String>,
    /// The older link of earlier versions: `after` in newest-first order.
    before: Option<String>,
}

const JOBS_PAGE: Paging = Paging { per_page: 20 };

/// `/jobs?status=…&order=…`, for the links of the list.
fn jobs_link(status: &str, oldest_first: bool, after: Option<&JobId>) -> String {
    let mut query = Vec::new();
    if !status.is_empty() {
        query.push(format!("status={status}"));
    }
    if oldest_first {
        query.push("order=oldest".to_owned());
    }
    if let Some(after) = after {
        query.push(format!("after={after}"));
    }
    if query.is_empty() {
        "/jobs".to_owned()
    } else {
        format!("/jobs?{}", query.join("&"))
    }
}

/// `GET /jobs`: the user's jobs, newest (or oldest) first, optionally of one
/// status, with their key, provider and age.
pub async fn my_jobs(
    app: web::Data<App>,
    user: SignedIn,
    query: web::Query<JobsQuery>,
) -> Result<HttpResponse, PageError> {
    fn text(value: &Option<String>) -> Option<&str> {
        value.as_deref().filter(|v| !v.is_empty())
    }
    let status = match text(&query.status) {
        None => None,
        Some(raw) => Some(
            JobStatus::parse(raw)
                .ok_or_else(|| PageError::bad_request("That is not a job status."))?,
        ),
    };
    let oldest_first = match text(&query.order) {
        None | Some("newest") => false,
        Some("oldest") => true,
        Some(_) => {
            return Err(PageError::bad_request(
                "The order is newest or oldest (first).",
            ))
        }
    };
    let after = cursor(text(&query.after).or(text(&query.before)), JobId::parse)?;
    let page = crate::app::queries::JobPage {
        status,
        oldest_first,
        after,
    };
    let jobs = app.my_jobs(&user.user, page, JOBS_PAGE.fetch()).await?;
    let status_text = status.map(JobStatus::as_str).unwrap_or_default();
    let (jobs, next) = JOBS_PAGE.cut(jobs, |(j, _)| {
        jobs_link(status_text, oldest_first, Some(&j.id))
    });
    let now = Timestamp::now();
    Ok(render(&JobsPage {
        nav: user.nav(),
        jobs: jobs
            .iter()
            .map(|(j, provider)| JobListRow {
                id: j.id.to_string(),
                key: j.idempotency_key.clone(),
                task: j.task.clone(),
                provider: provider.clone().unwrap_or_else(|| j.provider.clone()),
                status: j.status.as_str(),
                created: when(j.created_at),
                age: duration(now - j.created_at),
            })
            .collect(),
        next,
        statuses: JobStatus::ALL.iter().map(|s| s.as_str()).collect(),
        status: status_text.to_owned(),
        oldest_first,
        reorder: jobs_link(status_text, !oldest_first, None),
        filtered: status.is_some(),
    }))
}
