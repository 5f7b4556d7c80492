//! Webhook endpoints in the browser (docs/design.md, "Webhook outbox"): a
//! user's endpoints under their menu, one endpoint's page with its
//! delivery log, the signing secret shown once, the log on the job page,
//! "send again", and the admins' list across owners.

use actix_web::http::{header, StatusCode};
use actix_web::{web, HttpResponse};
use askama::Template;
use serde::Deserialize;

use super::{duration, fragment, render, render_with, see_other, when, Nav, PageError, SignedIn};
use crate::app::webhooks::{NewWebhook, WebhookChange, WithSecret};
use crate::app::{App, AppError, Job};
use crate::app::{Delivery, Endpoint, Event};
use crate::domain::webhook::{DeliveryOutcome, EventKind, EventState};
use crate::domain::{Timestamp, UserId};

/// One event of the delivery log, with its delivery attempts.
pub struct EventLine {
    id: String,
    endpoint_id: String,
    webhook_id: String,
    kind: String,
    state: String,
    state_class: &'static str,
    job_id: String,
    endpoint_url: String,
    endpoint_link: String,
    /// When the next try is due, for a pending event.
    next: String,
    attempts: Vec<DeliveryLine>,
    can_resend: bool,
}

/// One delivery attempt.
pub struct DeliveryLine {
    number: i32,
    at: String,
    outcome: String,
    outcome_class: &'static str,
    status: String,
    took: String,
    response: String,
}

/// The delivery log: events, newest or oldest first as the caller gives them.
#[derive(Template)]
#[template(path = "_deliveries.html")]
pub struct DeliveryLog {
    events: Vec<EventLine>,
    /// The job page names endpoints; the endpoint page names jobs.
    show_job: bool,
    empty_note: &'static str,
    csrf: String,
    /// Where "send again" comes back to.
    back: String,
}

fn state_class(state: &str) -> &'static str {
    match EventState::parse(state) {
        Some(EventState::Delivered) => "succeeded",
        Some(EventState::Dead) => "failed",
        Some(EventState::Pending) | None => "pending",
    }
}

fn outcome_class(outcome: &str) -> &'static str {
    match DeliveryOutcome::parse(outcome) {
        Some(DeliveryOutcome::Delivered) => "succeeded",
        Some(DeliveryOutcome::Refused) => "abandoned",
        Some(DeliveryOutcome::Failed) | None => "failed",
    }
}

impl DeliveryLine {
    fn new(d: &Delivery) -> Self {
        Self {
            number: d.number,
            at: when(d.at),
            outcome: d.outcome.clone(),
            outcome_class: outcome_class(&d.outcome),
            status: match (d.status_code, &d.error) {
                (Some(code), _) => code.to_string(),
                (None, Some(error)) => error.clone(),
                (None, None) => String::new(),
            },
            took: duration(d.latency_ms),
            response: d.response_body.clone().unwrap_or_default(),
        }
    }
}

impl DeliveryLog {
    /// `events` and every delivery of them (in order); `urls` names the
    /// endpoints; `may_resend` says whether the viewer may send again.
    fn new(
        events: &[Event],
        deliveries: &[Delivery],
        urls: &[(String, String)],
        may_resend: bool,
        show_job: bool,
        csrf: &str,
        back: &str,
    ) -> Self {
        let lines = events
            .iter()
            .map(|e| {
                let pending = e.event_state() == Some(EventState::Pending);
                EventLine {
                    id: e.id.clone(),
                    endpoint_id: e.endpoint_id.clone(),
                    webhook_id: e.webhook_id.clone(),
                    kind: e.kind.clone(),
                    state: e.state.clone(),
                    state_class: state_class(&e.state),
                    job_id: e.job_id.clone(),
                    endpoint_url: urls
                        .iter()
                        .find(|(id, _)| *id == e.endpoint_id)
                        .map(|(_, url)| url.clone())
                        .unwrap_or_else(|| "a deleted endpoint".to_owned()),
                    endpoint_link: format!("/webhooks/{}", e.endpoint_id),
                    next: if pending {
                        format!("next try at {}", when(e.next_attempt_at))
                    } else {
                        String::new()
                    },
                    attempts: {
                        let mut of_event: Vec<&Delivery> =
                            deliveries.iter().filter(|d| d.event_id == e.id).collect();
                        of_event.sort_by_key(|d| d.number);
                        of_event.into_iter().map(DeliveryLine::new).collect()
                    },
                    can_resend: may_resend && !pending,
                }
            })
            .collect();
        Self {
            events: lines,
            show_job,
            empty_note: if show_job {
                "Nothing was sent to this endpoint yet."
            } else {
                "No webhook event for this job. Endpoints are added under Webhooks."
            },
            csrf: csrf.to_owned(),
            back: back.to_owned(),
        }
    }
}

/// The job page's delivery log: every endpoint's events about `job`. Its
/// owner may send one again; staff see it.
pub async fn job_deliveries(
    app: &App,
    user: &SignedIn,
    job: &Job,
) -> Result<JobDeliveries, PageError> {
    let log = app.webhook_log_of_job(&user.user, job).await?;
    let settling = !job.status.is_terminal()
        || log
            .events
            .iter()
            .any(|e| EventState::parse(&e.state) == Some(EventState::Pending));
    let rendered = fragment(&DeliveryLog::new(
        &log.events,
        &log.deliveries,
        &log.endpoints,
        job.owner_id == user.user.id,
        false,
        &user.csrf,
        &format!("/jobs/{}", job.id),
    ));
    Ok(JobDeliveries {
        id: job.id.to_string(),
        settling,
        log: rendered,
    })
}

/// The job page's deliveries section, polled (htmx) while it may change.
#[derive(Template)]
#[template(path = "_job_deliveries.html")]
pub struct JobDeliveries {
    id: String,
    settling: bool,
    /// The delivery log, rendered.
    log: String,
}

/// `GET /jobs/{id}/deliveries`: the job page's deliveries section alone,
/// for its polling.
pub async fn job_deliveries_section(
    app: web::Data<App>,
    user: SignedIn,
    path: web::Path<String>,
) -> Result<HttpResponse, PageError> {
    let job_id = crate::domain::JobId::parse(&path).ok_or_else(PageError::not_found)?;
    let (job, _) = app.job_for(&user.user, &job_id).await?;
    Ok(render(&job_deliveries(&app, &user, &job).await?))
}

/// One endpoint in a list.
struct EndpointLine {
    id: String,
    url: String,
    events: String,
    enabled: bool,
    disabled_reason: String,
    secret_hint: String,
    owner: String,
    failures: i32,
}

fn events_text(e: &Endpoint) -> String {
    let kinds: Vec<&str> = e.kinds().iter().map(|k| k.as_str()).collect();
    kinds.join(", ")
}

/// How a secret is named where it may not be shown: its fingerprint.
fn secret_hint(e: &Endpoint) -> String {
    format!("whsec_…{}", e.secret_fingerprint)
}

impl EndpointLine {
    fn new(e: &Endpoint, owner: String) -> Self {
        Self {
            id: e.id.clone(),
            url: e.url.clone(),
            events: events_text(e),
            enabled: e.enabled,
            disabled_reason: e.disabled_reason.clone().unwrap_or_default(),
            secret_hint: secret_hint(e),
            owner,
            failures: e.consecutive_failures,
        }
    }
}

/// An event kind in the form, with what it means.
struct KindChoice {
    name: &'static str,
    about: &'static str,
    checked: bool,
}

fn kind_about(kind: EventKind) -> &'static str {
    match kind {
        EventKind::JobSucceeded => "a job succeeded",
        EventKind::JobFailed => "a job failed for good",
        EventKind::JobUnknown => "an attempt's outcome became unknown (support resolves it)",
        EventKind::JobCancelled => "a job was cancelled",
    }
}

fn kind_choices(checked: &[String]) -> Vec<KindChoice> {
    EventKind::ALL
        .iter()
        .map(|&kind| KindChoice {
            name: kind.as_str(),
            about: kind_about(kind),
            checked: if checked.is_empty() {
                matches!(kind, EventKind::JobSucceeded | EventKind::JobFailed)
            } else {
                checked.iter().any(|c| c == kind.as_str())
            },
        })
        .collect()
}

#[derive(Template)]
#[template(path = "webhooks.html")]
struct WebhooksPage {
    nav: Nav,
    endpoints: Vec<EndpointLine>,
    kinds: Vec<KindChoice>,
    url: String,
    error: Option<String>,
}

async fn webhooks_page(
    app: &App,
    user: &SignedIn,
    status: StatusCode,
    url: String,
    checked: &[String],
    error: Option<String>,
) -> Result<HttpResponse, PageError> {
    let endpoints = app.list_webhooks(&user.user, false).await?;
    Ok(render_with(
        status,
        &WebhooksPage {
            nav: user.nav(),
            endpoints: endpoints
                .iter()
                .map(|e| EndpointLine::new(e, String::new()))
                .collect(),
            kinds: kind_choices(checked),
            url,
            error,
        },
    ))
}

/// `GET /webhooks`: the user's endpoints, and the form to add one.
pub async fn my_webhooks(app: web::Data<App>, user: SignedIn) -> Result<HttpResponse, PageError> {
    webhooks_page(&app, &user, StatusCode::OK, String::new(), &[], None).await
}

#[derive(Template)]
#[template(path = "webhook_secret.html")]
struct SecretPage {
    nav: Nav,
    title: &'static str,
    id: String,
    url: String,
    secret: String,
    overlap_until: Option<String>,
}

/// The secret, once: never cached, never stored by the browser's history.
fn secret_page(user: &SignedIn, title: &'static str, issued: &WithSecret) -> HttpResponse {
    let mut response = render(&SecretPage {
        nav: user.nav(),
        title,
        id: issued.endpoint.id.clone(),
        url: issued.endpoint.url.clone(),
        secret: issued.secret.expose().to_owned(),
        overlap_until: issued.endpoint.previous_generation_valid_until.map(when),
    });
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    response
}

/// A refusal the form shows beside what was typed, rather than an error page.
fn form_refusal(error: &AppError) -> Option<String> {
    match error {
        AppError::InvalidBody { .. }
        | AppError::InvalidInput { .. }
        | AppError::WebhooksOff
        | AppError::EndpointLimit { .. } => Some(error.to_string()),
        AppError::Unavailable(detail) => Some(detail.clone()),
        _ => None,
    }
}

/// `POST /webhooks`: add an endpoint; its secret is shown on the answer,
/// once.
pub async fn add_webhook(
    app: web::Data<App>,
    user: SignedIn,
    form: web::Form<Vec<(String, String)>>,
) -> Result<HttpResponse, PageError> {
    let fields = form.into_inner();
    let get = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    user.check_csrf(get("csrf"))?;
    let url = get("url").unwrap_or_default().trim().to_owned();
    let events: Vec<String> = fields
        .iter()
        .filter(|(k, _)| k == "events")
        .take(EventKind::ALL.len() + 1)
        .map(|(_, v)| v.clone())
        .collect();
    let request = NewWebhook {
        url: url.clone(),
        events: events.clone(),
        retry_for_seconds: None,
    };
    match app.create_webhook(&user.user, request).await {
        Ok(issued) => Ok(secret_page(&user, "Endpoint added", &issued)),
        Err(error) => match form_refusal(&error) {
            Some(message) => {
                webhooks_page(
                    &app,
                    &user,
                    StatusCode::UNPROCESSABLE_ENTITY,
                    url,
                    &events,
                    Some(message),
                )
                .await
            }
            None => Err(error.into()),
        },
    }
}

#[derive(Template)]
#[template(path = "webhook.html")]
struct EndpointPage {
    nav: Nav,
    id: String,
    url: String,
    events: String,
    enabled: bool,
    disabled_reason: String,
    disabled_at: String,
    failures: i32,
    retry_for: String,
    secret_hint: String,
    deliveries: String,
    error: Option<String>,
}

/// `GET /webhooks/{id}`: one of the user's endpoints and its delivery log.
pub async fn webhook_page(
    app: web::Data<App>,
    user: SignedIn,
    path: web::Path<String>,
) -> Result<HttpResponse, PageError> {
    endpoint_page(&app, &user, &path, StatusCode::OK, None).await
}

async fn endpoint_page(
    app: &App,
    user: &SignedIn,
    id: &str,
    status: StatusCode,
    error: Option<String>,
) -> Result<HttpResponse, PageError> {
    let log = app.webhook_log_of_endpoint(&user.user, id).await?;
    let e = &log.endpoint;
    let urls = [(e.id.clone(), e.url.clone())];
    let deliveries = fragment(&DeliveryLog::new(
        &log.events,
        &log.deliveries,
        &urls,
        true,
        true,
        &user.csrf,
        &format!("/webhooks/{}", e.id),
    ));
    Ok(render_with(
        status,
        &EndpointPage {
            nav: user.nav(),
            id: e.id.clone(),
            url: e.url.clone(),
            events: events_text(e),
            enabled: e.enabled,
            disabled_reason: e.disabled_reason.clone().unwrap_or_default(),
            disabled_at: e.disabled_at.map(when).unwrap_or_default(),
            failures: e.consecutive_failures,
            retry_for: duration(e.retry_for_ms),
            secret_hint: secret_hint(e),
            deliveries,
            error,
        },
    ))
}

#[derive(Deserialize)]
pub struct ActForm {
    csrf: Option<String>,
    action: Option<String>,
}

/// `POST /webhooks/{id}/act`: enable, disable, rotate the secret (shown
/// once on the answer) or delete.
pub async fn webhook_act(
    app: web::Data<App>,
    user: SignedIn,
    path: web::Path<String>,
    form: web::Form<ActForm>,
) -> Result<HttpResponse, PageError> {
    user.check_csrf(form.csrf.as_deref())?;
    let id = path.into_inner();
    let back = format!("/webhooks/{id}");
    let done = match form.action.as_deref() {
        Some("rotate") => {
            let issued = app.rotate_webhook_secret(&user.user, &id).await?;
            return Ok(secret_page(&user, "Secret rotated", &issued));
        }
        Some("delete") => {
            app.delete_webhook(&user.user, &id).await?;
            return Ok(see_other("/webhooks"));
        }
        Some(verb @ ("enable" | "disable")) => {
            let change = WebhookChange {
                enabled: Some(verb == "enable"),
                ..WebhookChange::default()
            };
            app.update_webhook(&user.user, &id, change).await
        }
        _ => {
            return Err(PageError::bad_request(
                "The action is enable, disable, rotate or delete.",
            ))
        }
    };
    match done {
        Ok(_) => Ok(see_other(&back)),
        Err(error) => match form_refusal(&error) {
            Some(message) => {
                endpoint_page(
                    &app,
                    &user,
                    &id,
                    StatusCode::UNPROCESSABLE_ENTITY,
                    Some(message),
                )
                .await
            }
            None => Err(error.into()),
        },
    }
}

#[derive(Deserialize)]
pub struct ResendForm {
    csrf: Option<String>,
    back: Option<String>,
}

/// Where a resend may send the browser back to: a job page or an
/// endpoint page, never elsewhere.
fn resend_back(back: Option<&str>) -> &str {
    match back {
        Some(path)
            if (path.starts_with("/jobs/") || path.starts_with("/webhooks/"))
                && path.len() <= 128
                && path[1..]
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'/') =>
        {
            path
        }
        _ => "/webhooks",
    }
}

/// `POST /webhooks/{endpoint}/events/{id}/resend`: the owner queues an
/// event again,
/// with the same `webhook-id` and body.
pub async fn resend(
    app: web::Data<App>,
    user: SignedIn,
    path: web::Path<(String, String)>,
    form: web::Form<ResendForm>,
) -> Result<HttpResponse, PageError> {
    user.check_csrf(form.csrf.as_deref())?;
    let (endpoint_id, event_id) = path.into_inner();
    app.resend_webhook_event(&user.user, &endpoint_id, &event_id)
        .await?;
    Ok(see_other(&format!(
        "{}#event-{event_id}",
        resend_back(form.back.as_deref())
    )))
}

#[derive(Template)]
#[template(path = "admin_webhooks.html")]
struct AdminWebhooksPage {
    nav: Nav,
    endpoints: Vec<EndpointLine>,
    disabled: i64,
    oldest: Option<String>,
}

/// `GET /admin/webhooks` (admin): every owner's endpoints, which are
/// disabled and why, and how long the oldest undelivered event has waited.
pub async fn admin_webhooks(
    app: web::Data<App>,
    user: SignedIn,
) -> Result<HttpResponse, PageError> {
    let overview = app.webhooks_overview(&user.user).await?;
    let name_of = |id: &UserId| {
        overview
            .owners
            .iter()
            .find(|(owner, _)| owner == id)
            .map(|(_, name)| name.clone())
            .unwrap_or_default()
    };
    Ok(render(&AdminWebhooksPage {
        nav: user.nav(),
        endpoints: overview
            .endpoints
            .iter()
            .map(|e| EndpointLine::new(e, name_of(&e.owner_id)))
            .collect(),
        disabled: overview.disabled,
        oldest: overview
            .oldest_pending
            .map(|since| duration(Timestamp::now() - since)),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resend_goes_back_only_to_a_job_or_an_endpoint_page() {
        assert_eq!(resend_back(Some("/jobs/0192-ab")), "/jobs/0192-ab");
        assert_eq!(resend_back(Some("/webhooks/x1")), "/webhooks/x1");
        for bad in [
            "https://elsewhere.example/jobs/1",
            "//elsewhere.example/jobs/",
            "/jobs/1?x=<script>",
            "/admin",
        ] {
            assert_eq!(resend_back(Some(bad)), "/webhooks", "{bad}");
        }
        assert_eq!(resend_back(None), "/webhooks");
    }
}
