//! `/api/v1/webhooks`: an owner's completion webhook endpoints (register,
//! read, change, delete, rotate the secret), their events and delivery
//! log, and resending an event. Owner-scoped: another owner's endpoint is
//! not found; admins may list every owner's with `?all=true`. The signing
//! secret is in the answers to a creation and a rotation only.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, OpenApi, ToSchema};

use super::auth::Caller;
use super::body::{
    json_body, keyset_page, no_query, page_limit, parse_query, query_id, BodyRules, EmptyBody,
};
use super::error::ApiError;
use super::views::{rfc3339, Problem};
use super::{read, resource, READ};
use crate::app::webhooks::{parse_id, NewWebhook, WebhookChange, WithSecret};
use crate::app::App;
use crate::app::{Delivery, Endpoint, Event, Resent};
use crate::domain::webhook::{EventKind, MAX_URL_INPUT_LEN};

/// The webhook routes, inside the `/api/v1` scope (bearer tokens).
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        resource("/webhooks", "GET, HEAD, POST")
            .route(web::post().to(create_webhook))
            .route(read().to(list_webhooks)),
    )
    .service(
        resource("/webhooks/{id}", "GET, HEAD, PATCH, DELETE")
            .route(read().to(get_webhook))
            .route(web::patch().to(update_webhook))
            .route(web::delete().to(delete_webhook)),
    )
    .service(resource("/webhooks/{id}/rotate-secret", "POST").route(web::post().to(rotate_secret)))
    .service(resource("/webhooks/{id}/deliveries", READ).route(read().to(list_deliveries)))
    .service(resource("/webhooks/{id}/events", READ).route(read().to(list_events)))
    .service(
        resource("/webhooks/{id}/events/{event_id}/resend", "POST")
            .route(web::post().to(resend_event)),
    );
}

/// Body of `POST /api/v1/webhooks`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateWebhookRequest {
    /// Where events are POSTed: http or https, no user name or password;
    /// an IP literal must be a public address (a host name is checked at
    /// each delivery, by what it resolves to). The pattern describes URLs
    /// by host name; a public IP literal is accepted too.
    #[schema(
        min_length = 1,
        max_length = 2047,
        pattern = r"^https?://([A-Za-z0-9-]+\.)*[A-Za-z][A-Za-z0-9-]*(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}))?([/?#][A-Za-z0-9._~!$&'()*+,;=:@/?#%-]*)?$"
    )]
    pub url: String,
    /// The event types to send.
    #[schema(min_items = 1, max_items = 8, inline)]
    pub events: Vec<EventType>,
    /// How long an event is retried before it is dead; default
    /// `webhooks.retry_for_seconds` (24 h).
    #[schema(minimum = 1, maximum = 2592000)]
    #[serde(default, deserialize_with = "whole_number")]
    pub retry_for_seconds: Option<u64>,
}

/// Body of `PATCH /api/v1/webhooks/{id}`; each field left out is kept.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateWebhookRequest {
    #[schema(
        min_length = 1,
        max_length = 2047,
        pattern = r"^https?://([A-Za-z0-9-]+\.)*[A-Za-z][A-Za-z0-9-]*(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}))?([/?#][A-Za-z0-9._~!$&'()*+,;=:@/?#%-]*)?$"
    )]
    pub url: Option<String>,
    #[schema(min_items = 1, max_items = 8, inline)]
    pub events: Option<Vec<EventType>>,
    /// `true` enables the endpoint again (after it was disabled for
    /// failing, or by hand), resetting its failure count; `false` disables it.
    pub enabled: Option<bool>,
    #[schema(minimum = 1, maximum = 2592000)]
    #[serde(default, deserialize_with = "whole_number")]
    pub retry_for_seconds: Option<u64>,
}

/// An event type.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
pub enum EventType {
    #[serde(rename = "job.succeeded")]
    JobSucceeded,
    #[serde(rename = "job.failed")]
    JobFailed,
    #[serde(rename = "job.unknown")]
    JobUnknown,
    #[serde(rename = "job.cancelled")]
    JobCancelled,
}

impl EventType {
    fn kind(self) -> EventKind {
        match self {
            Self::JobSucceeded => EventKind::JobSucceeded,
            Self::JobFailed => EventKind::JobFailed,
            Self::JobUnknown => EventKind::JobUnknown,
            Self::JobCancelled => EventKind::JobCancelled,
        }
    }
}

/// A JSON number that is a whole number, written as an integer or not
/// (`1.0` is the integer 1 to JSON Schema); anything else is refused.
pub(super) fn whole_number<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<u64>, D::Error> {
    let Some(number) = Option::<serde_json::Number>::deserialize(d)? else {
        return Ok(None);
    };
    if let Some(n) = number.as_u64() {
        return Ok(Some(n));
    }
    match number.as_f64() {
        Some(f) if f.fract() == 0.0 && (0.0..=u64::MAX as f64).contains(&f) => Ok(Some(f as u64)),
        _ => Err(serde::de::Error::custom(format!(
            "expected a whole number, not {number}"
        ))),
    }
}

fn names(events: &[EventType]) -> Vec<String> {
    events
        .iter()
        .map(|e| e.kind().as_str().to_owned())
        .collect()
}

/// A webhook endpoint. Its secret is never shown here.
#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookView {
    pub id: String,
    /// The owner's user id.
    pub owner: String,
    pub url: String,
    pub events: Vec<String>,
    pub enabled: bool,
    /// Why it is disabled (it kept failing, or its owner disabled it).
    pub disabled_reason: Option<String>,
    pub disabled_at: Option<String>,
    /// The secret's generation: 1, then one more per rotation.
    pub secret_generation: i64,
    /// 8 hex digits of the current secret's SHA-256, to tell secrets apart.
    pub secret_fingerprint: String,
    /// Until when the previous secret also signs deliveries (after a rotation).
    pub previous_secret_valid_until: Option<String>,
    pub retry_for_seconds: i64,
    /// Failed deliveries in a row (a success resets it).
    pub consecutive_failures: i32,
    pub failing_since: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

impl From<&Endpoint> for WebhookView {
    fn from(e: &Endpoint) -> Self {
        Self {
            id: e.id.clone(),
            owner: e.owner_id.to_string(),
            url: e.url.clone(),
            events: e.kinds().iter().map(|k| k.as_str().to_owned()).collect(),
            enabled: e.enabled,
            disabled_reason: e.disabled_reason.clone(),
            disabled_at: e.disabled_at.map(rfc3339),
            secret_generation: e.generation,
            secret_fingerprint: e.secret_fingerprint.clone(),
            previous_secret_valid_until: e.previous_generation_valid_until.map(rfc3339),
            retry_for_seconds: e.retry_for_ms / 1000,
            consecutive_failures: e.consecutive_failures,
            failing_since: e.failing_since.map(rfc3339),
            created_at: rfc3339(e.created_at),
            updated_at: rfc3339(e.updated_at),
        }
    }
}

/// An endpoint with its signing secret: shown in this answer only.
#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookWithSecret {
    pub webhook: WebhookView,
    /// The Standard Webhooks secret, `whsec_<base64>`. Store it now: it is
    /// never shown again (a rotation makes a new one).
    pub secret: String,
}

impl From<&WithSecret> for WebhookWithSecret {
    fn from(w: &WithSecret) -> Self {
        Self {
            webhook: WebhookView::from(&w.endpoint),
            secret: w.secret.expose().to_owned(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookList {
    pub webhooks: Vec<WebhookView>,
}

/// An event for one endpoint (an outbox row).
#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookEventView {
    pub id: String,
    /// The `webhook-id` header: the same on every retry and resend.
    pub webhook_id: String,
    #[serde(rename = "type")]
    pub type_: String,
    pub job_id: String,
    /// pending | delivered | dead
    pub state: String,
    /// Delivery attempts made.
    pub attempts: i32,
    pub next_attempt_at: String,
    pub delivered_at: Option<String>,
    pub created_at: String,
}

impl From<&Event> for WebhookEventView {
    fn from(e: &Event) -> Self {
        Self {
            id: e.id.clone(),
            webhook_id: e.webhook_id.clone(),
            type_: e.kind.clone(),
            job_id: e.job_id.clone(),
            state: e.state.clone(),
            attempts: e.attempts,
            next_attempt_at: rfc3339(e.next_attempt_at),
            delivered_at: e.delivered_at.map(rfc3339),
            created_at: rfc3339(e.created_at),
        }
    }
}

/// A page of an endpoint's events, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookEventList {
    pub events: Vec<WebhookEventView>,
    /// The path of the following (older) page, with the same `limit`;
    /// `null` on the last page.
    pub next: Option<String>,
}

/// One delivery attempt.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryView {
    pub id: String,
    pub event_id: String,
    /// The event's attempt number, from 1.
    pub number: i32,
    /// delivered | failed | refused
    pub outcome: String,
    pub status_code: Option<i32>,
    pub error: Option<String>,
    pub latency_ms: i64,
    /// At most 1 KiB of the answer's body.
    pub response_body: Option<String>,
    pub at: String,
}

impl From<&Delivery> for DeliveryView {
    fn from(d: &Delivery) -> Self {
        Self {
            id: d.id.clone(),
            event_id: d.event_id.clone(),
            number: d.number,
            outcome: d.outcome.clone(),
            status_code: d.status_code,
            error: d.error.clone(),
            latency_ms: d.latency_ms,
            response_body: d.response_body.clone(),
            at: rfc3339(d.at),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryList {
    pub deliveries: Vec<DeliveryView>,
    /// The path of the following (older) page, with the same `limit`;
    /// `null` on the last page.
    pub next: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListWebhooksQuery {
    /// Every owner's endpoints (admins only; 403 for anyone else).
    pub all: Option<bool>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DeliveriesQuery {
    /// How many, newest first: 1-200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<i64>,
    /// Only the deliveries older than this one (a delivery id, as `next`
    /// gives it).
    #[param(
        pattern = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    pub before: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Page size, 1-200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<i64>,
    /// Return events older than this event id (from `next`).
    #[param(
        pattern = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    pub before: Option<String>,
}

fn location(id: &str) -> String {
    format!("/api/v1/webhooks/{id}")
}

/// Register a webhook endpoint.
#[utoipa::path(
    post, path = "/api/v1/webhooks", tag = "webhooks",
    request_body = CreateWebhookRequest,
    responses(
        (status = 201, description = "Registered; the answer holds the signing secret, shown this once", body = WebhookWithSecret, headers(("Location" = String))),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`webhooks-not-configured`: this server has no webhook key; `webhook-endpoint-limit`: the owner has `webhooks.max_endpoints_per_owner` endpoints already (`limit`)", body = Problem, content_type = "application/problem+json"),
        (status = 413, body = Problem, content_type = "application/problem+json"),
        (status = 415, body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A URL that is not http(s), carries credentials or names a non-public address; an unknown event type", body = Problem, content_type = "application/problem+json"),
        (status = 503, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn create_webhook(
    app: web::Data<App>,
    caller: Caller,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body: CreateWebhookRequest = json_body(
        &req,
        payload,
        BodyRules::of(&app.config().server),
        EmptyBody::Refuse,
    )
    .await?;
    let created = app
        .create_webhook(
            &caller.0,
            NewWebhook {
                url: body.url,
                events: names(&body.events),
                retry_for_seconds: body.retry_for_seconds,
            },
        )
        .await?;
    Ok(HttpResponse::Created()
        .insert_header((header::LOCATION, location(&created.endpoint.id)))
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(WebhookWithSecret::from(&created)))
}

/// The caller's webhook endpoints, newest first (at most 200).
#[utoipa::path(
    get, path = "/api/v1/webhooks", tag = "webhooks",
    params(ListWebhooksQuery),
    responses(
        (status = 200, body = WebhookList),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`all=true` by someone who is not an admin", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list_webhooks(
    app: web::Data<App>,
    caller: Caller,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let query: ListWebhooksQuery = parse_query(&req)?;
    let endpoints = app
        .list_webhooks(&caller.0, query.all.unwrap_or(false))
        .await?;
    Ok(HttpResponse::Ok().json(WebhookList {
        webhooks: endpoints.iter().map(WebhookView::from).collect(),
    }))
}

/// One webhook endpoint (with why it is disabled, if it is).
#[utoipa::path(
    get, path = "/api/v1/webhooks/{id}", tag = "webhooks",
    params(("id" = String, Path, description = "Endpoint id")),
    responses(
        (status = 200, body = WebhookView),
        (status = 400, description = "A query parameter: this path takes none", body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such endpoint, or another owner's", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_webhook(
    app: web::Data<App>,
    caller: Caller,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    no_query(&req)?;
    let endpoint = app.webhook(&caller.0, &path).await?;
    Ok(HttpResponse::Ok().json(WebhookView::from(&endpoint)))
}

/// Change an endpoint's URL, events or retry window; enable or disable it.
#[utoipa::path(
    patch, path = "/api/v1/webhooks/{id}", tag = "webhooks",
    params(("id" = String, Path, description = "Endpoint id")),
    request_body = UpdateWebhookRequest,
    responses(
        (status = 200, body = WebhookView),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 413, body = Problem, content_type = "application/problem+json"),
        (status = 415, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
        (status = 503, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn update_webhook(
    app: web::Data<App>,
    caller: Caller,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body: UpdateWebhookRequest = json_body(
        &req,
        payload,
        BodyRules::of(&app.config().server),
        EmptyBody::Refuse,
    )
    .await?;
    let endpoint = app
        .update_webhook(
            &caller.0,
            &path,
            WebhookChange {
                url: body.url,
                events: body.events.as_deref().map(names),
                retry_for_seconds: body.retry_for_seconds,
                enabled: body.enabled,
            },
        )
        .await?;
    Ok(HttpResponse::Ok().json(WebhookView::from(&endpoint)))
}

/// Remove an endpoint, with its events and delivery log.
#[utoipa::path(
    delete, path = "/api/v1/webhooks/{id}", tag = "webhooks",
    params(("id" = String, Path, description = "Endpoint id")),
    responses(
        (status = 204, description = "Removed"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 503, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn delete_webhook(
    app: web::Data<App>,
    caller: Caller,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    app.delete_webhook(&caller.0, &path).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// Rotate the signing secret: the answer holds the new one, shown this
/// once; the previous one also signs deliveries for
/// `webhooks.rotation_overlap_seconds` (24 h by default).
#[utoipa::path(
    post, path = "/api/v1/webhooks/{id}/rotate-secret", tag = "webhooks",
    params(("id" = String, Path, description = "Endpoint id")),
    responses(
        (status = 200, body = WebhookWithSecret),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`webhooks-not-configured`", body = Problem, content_type = "application/problem+json"),
        (status = 503, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn rotate_secret(
    app: web::Data<App>,
    caller: Caller,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let rotated = app.rotate_webhook_secret(&caller.0, &path).await?;
    Ok(HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(WebhookWithSecret::from(&rotated)))
}

/// An endpoint's delivery attempts, newest first, a page at a time: `next`
/// is the path of the following page.
#[utoipa::path(
    get, path = "/api/v1/webhooks/{id}/deliveries", tag = "webhooks",
    params(("id" = String, Path, description = "Endpoint id"), DeliveriesQuery),
    responses(
        (status = 200, body = DeliveryList),
        (status = 400, description = "`invalid-query`: a `limit` out of range, a `before` that is not a delivery id, or a parameter this path does not take", body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list_deliveries(
    app: web::Data<App>,
    caller: Caller,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let query: DeliveriesQuery = parse_query(&req)?;
    let limit = page_limit(query.limit, 50, 200)?;
    let before = query_id(query.before, "before", "a delivery id", parse_id)?;
    let read = app
        .webhook_deliveries(&caller.0, &path, before, limit + 1)
        .await?;
    let (deliveries, next) = keyset_page(read, limit, |last| {
        format!(
            "{}/deliveries?limit={limit}&before={}",
            location(&path),
            last.id
        )
    });
    Ok(HttpResponse::Ok().json(DeliveryList {
        deliveries: deliveries.iter().map(DeliveryView::from).collect(),
        next,
    }))
}

/// An endpoint's events, newest first, a page at a time: `next` is the
/// path of the following page.
#[utoipa::path(
    get, path = "/api/v1/webhooks/{id}/events", tag = "webhooks",
    params(("id" = String, Path, description = "Endpoint id"), EventsQuery),
    responses(
        (status = 200, body = WebhookEventList),
        (status = 400, description = "`invalid-query`: a `limit` out of range, a `before` that is not an event id, or a parameter this path does not take", body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list_events(
    app: web::Data<App>,
    caller: Caller,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let query: EventsQuery = parse_query(&req)?;
    let limit = page_limit(query.limit, 50, 200)?;
    let before = query_id(query.before, "before", "an event id", parse_id)?;
    let read = app
        .webhook_events(&caller.0, &path, before, limit + 1)
        .await?;
    let (events, next) = keyset_page(read, limit, |last| {
        format!(
            "{}/events?limit={limit}&before={}",
            location(&path),
            last.id
        )
    });
    Ok(HttpResponse::Ok().json(WebhookEventList {
        events: events.iter().map(WebhookEventView::from).collect(),
        next,
    }))
}

/// Send an event again: a delivered or dead one is queued, due now, with
/// the same `webhook-id` and body and a fresh retry window; a pending one
/// is already coming.
#[utoipa::path(
    post, path = "/api/v1/webhooks/{id}/events/{event_id}/resend", tag = "webhooks",
    params(
        ("id" = String, Path, description = "Endpoint id"),
        ("event_id" = String, Path, description = "Event id"),
    ),
    responses(
        (status = 202, description = "Queued (or still pending)", body = WebhookEventView),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 503, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn resend_event(
    app: web::Data<App>,
    caller: Caller,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (id, event_id) = path.into_inner();
    let event = match app.resend_webhook_event(&caller.0, &id, &event_id).await? {
        Resent::Queued(event) | Resent::StillPending(event) => event,
        Resent::NotFound => return Err(ApiError::not_found()),
    };
    Ok(HttpResponse::Accepted().json(WebhookEventView::from(&event)))
}

/// The webhook part of the OpenAPI document, merged into `openapi::ApiDoc`.
#[derive(OpenApi)]
#[openapi(
    paths(
        create_webhook,
        list_webhooks,
        get_webhook,
        update_webhook,
        delete_webhook,
        rotate_secret,
        list_deliveries,
        list_events,
        resend_event,
    ),
    components(schemas(
        CreateWebhookRequest,
        UpdateWebhookRequest,
        EventType,
        WebhookView,
        WebhookWithSecret,
        WebhookList,
        WebhookEventView,
        WebhookEventList,
        DeliveryView,
        DeliveryList,
    )),
    tags((name = "webhooks", description = "Completion webhooks: endpoints, their delivery log, resending"))
)]
pub struct WebhooksDoc;

// The schema's `max_length` above is this limit, written out.
const _: () = assert!(MAX_URL_INPUT_LEN == 2047);
