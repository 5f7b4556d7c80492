//! Completion webhooks (docs/design.md, "Webhook outbox"): an owner's
//! endpoints (register, change, rotate the secret, read the delivery log,
//! resend), and the delivery loop every `onejob serve` process runs: it
//! claims due outbox rows with a lease, signs each with the Standard
//! Webhooks headers, sends it to a checked address (no redirects, a
//! timeout) and records what happened.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{require_admin, App, AppError, AppResult, User};
use crate::domain::webhook::{
    check_resolved, check_url, parse_events, signing_generations, truncate_response,
    DeliveryOutcome, EventKind, InFlight, MAX_RESPONSE_BODY,
};
use crate::domain::{Secret, Timestamp};
use crate::store::webhooks::{
    self as outbox, Attempted, Claimed, Delivery, Endpoint, EndpointChange, EndpointKey, Event,
    EventKey, FollowUp, NewEndpoint, Recorded, Resent,
};

/// The `user-agent` of every delivery.
pub const USER_AGENT: &str = concat!("onejob-webhooks/", env!("CARGO_PKG_VERSION"));

/// What a client asks for when registering an endpoint.
#[derive(Debug, Clone)]
pub struct NewWebhook {
    pub url: String,
    pub events: Vec<String>,
    /// How long an event is retried; default `webhooks.retry_for_seconds`.
    pub retry_for_seconds: Option<u64>,
}

/// What a client asks to change; `None` leaves it.
#[derive(Debug, Clone, Default)]
pub struct WebhookChange {
    pub url: Option<String>,
    pub events: Option<Vec<String>>,
    pub retry_for_seconds: Option<u64>,
    pub enabled: Option<bool>,
}

/// An endpoint with its signing secret: the answer to a creation or a
/// rotation, the only time the secret is shown.
#[derive(Debug)]
pub struct WithSecret {
    pub endpoint: Endpoint,
    pub secret: Secret,
}

/// An endpoint, event or delivery id from a path or a query: a UUID in its
/// hyphenated form, or nothing.
pub fn parse_id(raw: &str) -> Option<String> {
    crate::domain::JobId::parse(raw).map(|id| id.to_string())
}

impl App {
    fn webhook_key(&self) -> AppResult<&crate::domain::webhook::WebhookKey> {
        self.config()
            .webhooks
            .key
            .as_ref()
            .ok_or(AppError::WebhooksOff)
    }

    fn checked_url(&self, url: &str) -> AppResult<String> {
        let allow = self.config().webhooks.settings.allow_private_addresses;
        check_url(url, allow)
            .map(|url| url.to_string())
            .map_err(|e| AppError::InvalidBody {
                detail: e.to_string(),
                field: Some("url".into()),
            })
    }

    fn checked_events(events: &[String]) -> AppResult<Vec<EventKind>> {
        parse_events(events).map_err(|e| AppError::InvalidBody {
            detail: e.to_string(),
            field: Some("events".into()),
        })
    }

    fn checked_retry_for(seconds: u64) -> AppResult<i64> {
        if !(1..=crate::config::webhooks::MAX_RETRY_FOR_SECONDS).contains(&seconds) {
            return Err(AppError::InvalidBody {
                detail: "`retry_for_seconds` must be between 1 and 2592000 (30 days)".into(),
                field: Some("retry_for_seconds".into()),
            });
        }
        Ok(seconds as i64 * 1000)
    }

    /// Registers an endpoint for `user`; the answer holds its secret, shown
    /// this once.
    pub async fn create_webhook(&self, user: &User, new: NewWebhook) -> AppResult<WithSecret> {
        let key = self.webhook_key()?.clone();
        let url = self.checked_url(&new.url)?;
        let events = Self::checked_events(&new.events)?;
        let retry_for_ms = match new.retry_for_seconds {
            Some(seconds) => Self::checked_retry_for(seconds)?,
            None => self.config().webhooks.settings.retry_for_ms(),
        };
        let id = uuid::Uuid::now_v7().hyphenated().to_string();
        let secret = key.endpoint_secret(&id, 1);
        let row = NewEndpoint {
            id,
            owner_id: user.id.clone(),
            url,
            events,
            retry_for_ms,
            secret_fingerprint: secret.fingerprint(),
        };
        let cap = self.config().webhooks.settings.max_endpoints_per_owner;
        let endpoint = self
            .store()
            .run(move |conn| outbox::create_endpoint(conn, &row, cap as usize, Timestamp::now()))
            .await?
            .map_err(|outbox::AtEndpointCap(existing)| AppError::EndpointLimit {
                existing,
                cap: cap as usize,
            })?;
        tracing::info!(endpoint_id = %endpoint.id, owner = %user.name, "webhook endpoint registered");
        Ok(WithSecret {
            endpoint,
            secret: secret.whsec(),
        })
    }

    /// The caller's endpoints; with `all`, every owner's (admins only).
    pub async fn list_webhooks(&self, user: &User, all: bool) -> AppResult<Vec<Endpoint>> {
        if all {
            require_admin(user)?;
            return Ok(self.store().run(outbox::list_all_endpoints).await?);
        }
        let owner = user.id.clone();
        Ok(self
            .store()
            .run(move |conn| outbox::list_endpoints(conn, &owner))
            .await?)
    }

    fn endpoint_key(user: &User, id: &str) -> AppResult<EndpointKey> {
        Ok(EndpointKey {
            id: parse_id(id).ok_or(AppError::NotFound)?,
            owner_id: user.id.clone(),
        })
    }

    /// One of the caller's endpoints (another owner's is not found).
    pub async fn webhook(&self, user: &User, id: &str) -> AppResult<Endpoint> {
        let key = Self::endpoint_key(user, id)?;
        self.store()
            .run(move |conn| outbox::get_endpoint(conn, &key))
            .await?
            .ok_or(AppError::NotFound)
    }

    /// Changes an endpoint; `enabled: true` enables a disabled one again.
    pub async fn update_webhook(
        &self,
        user: &User,
        id: &str,
        change: WebhookChange,
    ) -> AppResult<Endpoint> {
        let key = Self::endpoint_key(user, id)?;
        let change = EndpointChange {
            url: change.url.map(|u| self.checked_url(&u)).transpose()?,
            events: change
                .events
                .map(|e| Self::checked_events(&e))
                .transpose()?,
            retry_for_ms: change
                .retry_for_seconds
                .map(Self::checked_retry_for)
                .transpose()?,
            enabled: change.enabled,
        };
        let endpoint = self
            .store()
            .run(move |conn| outbox::update_endpoint(conn, &key, &change, Timestamp::now()))
            .await?
            .ok_or(AppError::NotFound)?;
        Ok(endpoint)
    }

    /// Removes an endpoint with its events and their delivery log.
    pub async fn delete_webhook(&self, user: &User, id: &str) -> AppResult<()> {
        let key = Self::endpoint_key(user, id)?;
        let removed = self
            .store()
            .run(move |conn| outbox::delete_endpoint(conn, &key))
            .await?;
        if removed {
            Ok(())
        } else {
            Err(AppError::NotFound)
        }
    }

    /// Moves the endpoint to a new secret, shown this once; the previous
    /// one still signs deliveries for `webhooks.rotation_overlap_seconds`.
    pub async fn rotate_webhook_secret(&self, user: &User, id: &str) -> AppResult<WithSecret> {
        let webhook_key = self.webhook_key()?.clone();
        let key = Self::endpoint_key(user, id)?;
        let overlap = self.config().webhooks.settings.overlap_ms();
        let fingerprints = webhook_key.clone();
        let endpoint_id = key.id.clone();
        let endpoint = self
            .store()
            .run(move |conn| {
                let fingerprint = |generation: i64| {
                    fingerprints
                        .endpoint_secret(&endpoint_id, generation)
                        .fingerprint()
                };
                outbox::rotate_secret(conn, &key, overlap, &fingerprint, Timestamp::now())
            })
            .await?
            .ok_or(AppError::NotFound)?;
        let secret = webhook_key
            .endpoint_secret(&endpoint.id, endpoint.generation)
            .whsec();
        tracing::info!(endpoint_id = %endpoint.id, generation = endpoint.generation, "webhook secret rotated");
        Ok(WithSecret { endpoint, secret })
    }

    /// A page of an endpoint's delivery attempts, newest first: at most
    /// `limit`, after the delivery `before` (a parsed delivery id) when
    /// given.
    pub async fn webhook_deliveries(
        &self,
        user: &User,
        id: &str,
        before: Option<String>,
        limit: i64,
    ) -> AppResult<Vec<Delivery>> {
        let endpoint = self.webhook(user, id).await?;
        let key = endpoint.key();
        Ok(self
            .store()
            .run(move |conn| outbox::deliveries_of_endpoint(conn, &key, before.as_deref(), limit))
            .await?)
    }

    /// A page of an endpoint's events, newest first: at most `limit`,
    /// older than the event `before` (a parsed event id) when given.
    pub async fn webhook_events(
        &self,
        user: &User,
        id: &str,
        before: Option<String>,
        limit: i64,
    ) -> AppResult<Vec<Event>> {
        let endpoint = self.webhook(user, id).await?;
        let key = endpoint.key();
        Ok(self
            .store()
            .run(move |conn| outbox::events_of_endpoint_page(conn, &key, before.as_deref(), limit))
            .await?)
    }

    /// Queues a delivered or dead event of one of the caller's endpoints
    /// again: the same `webhook-id` and body.
    pub async fn resend_webhook_event(
        &self,
        user: &User,
        endpoint_id: &str,
        event_id: &str,
    ) -> AppResult<Resent> {
        let endpoint = self.webhook(user, endpoint_id).await?;
        let event_id = parse_id(event_id).ok_or(AppError::NotFound)?;
        let key = EventKey {
            id: event_id,
            owner_id: user.id.clone(),
        };
        let resent = self
            .store()
            .run(move |conn| match outbox::get_event(conn, &key)? {
                Some(event) if event.endpoint_id == endpoint.id => {
                    outbox::resend(conn, &key, Timestamp::now())
                }
                _ => Ok(Resent::NotFound),
            })
            .await?;
        if resent == Resent::NotFound {
            return Err(AppError::NotFound);
        }
        Ok(resent)
    }
}

/// Runs until `shutdown`: claims due events into the process's free
/// delivery slots and sends each on a task of its own, which frees its
/// slot the moment its send is recorded; no send waits for another.
///
/// The slots are `webhooks.batch_size` in all, `max_in_flight_per_owner`
/// for one owner and `max_in_flight_per_endpoint` for one endpoint; a claim
/// takes due events in turns between owners (`domain::webhook::take_turns`).
/// So an owner whose endpoints never answer holds at most its own slots,
/// each until the delivery's timeout, and every other owner's events go
/// out in the remaining ones: fairness in one process. The loop claims
/// again when a slot frees, or each `poll_interval_ms` when none did.
///
/// A process whose configuration holds no webhook key, or says `deliver =
/// false`, delivers nothing (what it claims nothing of stays for others, or
/// for later). A shutdown stops the sends in flight; their leases run out
/// and the events are sent again (the same webhook-id).
pub async fn delivery_loop(app: App, lease_owner: String, shutdown: CancellationToken) {
    let settings = app.config().webhooks.settings.clone();
    if app.config().webhooks.key.is_none() || !settings.deliver {
        return;
    }
    let poll = Duration::from_millis(settings.poll_interval_ms);
    let lease_ms = settings.lease_ms();
    let caps = settings.caps();
    let in_flight = std::sync::Arc::new(std::sync::Mutex::new(InFlight::default()));
    let freed = std::sync::Arc::new(tokio::sync::Notify::new());
    let mut sends = tokio::task::JoinSet::new();
    let mut wait = false;
    loop {
        if wait {
            tokio::select! {
                _ = tokio::time::sleep(poll) => {}
                _ = freed.notified() => {}
                _ = shutdown.cancelled() => break,
            }
        } else if shutdown.is_cancelled() {
            break;
        }
        // Finished sends are reaped here, so the set stays small.
        while sends.try_join_next().is_some() {}
        let busy = lock(&in_flight).clone();
        if busy.total() >= caps.total {
            wait = true;
            continue;
        }
        let owner = lease_owner.clone();
        let claimed = app
            .store()
            .run(move |conn| outbox::claim_due_in_turns(conn, &owner, lease_ms, caps, &busy))
            .await;
        let claimed = match claimed {
            Ok(claimed) => claimed,
            Err(error) => {
                tracing::warn!(%error, "claiming webhook events failed");
                wait = true;
                continue;
            }
        };
        // Nothing new: wait for a slot or the next poll. Something: look
        // again at once, for what the turns left.
        wait = claimed.is_empty();
        for claimed in claimed {
            let (owner, endpoint) = (
                claimed.event.owner_id.to_string(),
                claimed.endpoint.id.clone(),
            );
            lock(&in_flight).start(&owner, &endpoint);
            let (app, lease_owner) = (app.clone(), lease_owner.clone());
            let (in_flight, freed) = (in_flight.clone(), freed.clone());
            sends.spawn(async move {
                deliver(&app, claimed, &lease_owner).await;
                lock(&in_flight).end(&owner, &endpoint);
                freed.notify_one();
            });
        }
    }
    sends.abort_all();
}

/// The in-flight counts: every change is one call, so a panic leaves them
/// whole.
fn lock(in_flight: &std::sync::Mutex<InFlight>) -> std::sync::MutexGuard<'_, InFlight> {
    in_flight
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Sends one claimed event and records what happened.
async fn deliver(app: &App, claimed: Claimed, lease_owner: &str) {
    let Some(key) = app.config().webhooks.key.clone() else {
        return;
    };
    let settings = &app.config().webhooks.settings;
    let span = delivery_span(&claimed);
    let mut headers = signed_headers(&key, &claimed, Timestamp::now()).to_vec();
    if let Some(context) = crate::telemetry::trace::context_of(&span) {
        headers.extend(context.headers());
    }
    let started = Instant::now();
    let attempted = send(
        &claimed.endpoint.url,
        settings.allow_private_addresses,
        Duration::from_millis(settings.timeout_ms),
        &headers,
        claimed.event.body.clone(),
        started,
    )
    .instrument(span.clone())
    .await;
    span.record("onejob.webhook.outcome", attempted.outcome.as_str());
    if let Some(status) = attempted.status_code {
        span.record("http.response.status_code", status);
    }
    if attempted.outcome != DeliveryOutcome::Delivered {
        crate::telemetry::trace::error(&span, attempted.error.clone().unwrap_or_default());
    }
    drop(span);
    app.metrics().webhook_delivery(attempted.outcome);
    let follow_up = FollowUp {
        schedule: settings.schedule(),
        disable: settings.disable_rule(),
        jitter: fastrand::f64(),
    };
    let owner = lease_owner.to_owned();
    let logged = attempted.clone();
    let recorded = app
        .store()
        .run(move |conn| {
            outbox::record_delivery(conn, &claimed, &owner, &logged, follow_up, Timestamp::now())
                .map(|recorded| (recorded, claimed))
        })
        .await;
    match recorded {
        Ok(((recorded, disabled), claimed)) => {
            log_recorded(&claimed, &attempted, recorded, disabled)
        }
        Err(error) => {
            tracing::warn!(%error, "recording a webhook delivery failed; its lease will run out and it is sent again")
        }
    }
}

/// The span of one delivery of a claimed event, a child of its job's trace
/// (docs/tracing.md).
fn delivery_span(claimed: &Claimed) -> tracing::Span {
    let event = &claimed.event;
    let span = tracing::info_span!(
        target: "onejob::trace",
        "webhook delivery",
        otel.name = "webhook delivery",
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        onejob.job.id = %event.job_id,
        onejob.webhook.event_id = %event.id,
        onejob.webhook.endpoint_id = %claimed.endpoint.id,
        onejob.webhook.kind = %event.kind,
        onejob.webhook.delivery = event.attempts,
        onejob.webhook.outcome = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
    );
    let job = event
        .trace_context
        .as_deref()
        .and_then(crate::domain::TraceContext::from_column);
    crate::telemetry::trace::set_parent(&span, job.as_ref());
    span
}

/// The Standard Webhooks headers of a claimed event sent at `now`: its id,
/// the timestamp, and its signature by each secret generation still valid.
fn signed_headers(
    key: &crate::domain::webhook::WebhookKey,
    claimed: &Claimed,
    now: Timestamp,
) -> [(&'static str, String); 3] {
    let timestamp = now.unix_seconds();
    let endpoint = &claimed.endpoint;
    let generations = signing_generations(
        endpoint.generation,
        endpoint.previous_generation_valid_until,
        now,
    );
    let signature = key.signature_header(
        &endpoint.id,
        &generations,
        &claimed.event.webhook_id,
        timestamp,
        claimed.event.body.as_bytes(),
    );
    [
        ("webhook-id", claimed.event.webhook_id.clone()),
        ("webhook-timestamp", timestamp.to_string()),
        ("webhook-signature", signature),
    ]
}

/// Logs what a recorded delivery leads to.
fn log_recorded(claimed: &Claimed, attempted: &Attempted, recorded: Recorded, disabled: bool) {
    let (event_id, endpoint_id) = (&claimed.event.id, &claimed.endpoint.id);
    match recorded {
        Recorded::Delivered => {
            tracing::debug!(%event_id, %endpoint_id, "webhook delivered")
        }
        Recorded::RetryAt(at) => tracing::info!(
            %event_id, %endpoint_id, outcome = %attempted.outcome,
            error = attempted.error.as_deref().unwrap_or(""),
            status = attempted.status_code.unwrap_or(0),
            retry_in_ms = at - Timestamp::now(),
            "webhook delivery failed; retried later"
        ),
        Recorded::Dead => tracing::warn!(
            %event_id, %endpoint_id,
            "webhook delivery failed for the endpoint's whole retry window: the event is dead"
        ),
        Recorded::LeaseLost => tracing::warn!(
            %event_id, %endpoint_id,
            "a webhook delivery's lease passed on before its result was recorded"
        ),
    }
    if disabled {
        tracing::warn!(%endpoint_id, "webhook endpoint disabled: it kept failing");
    }
}

/// Why a delivery got no answer: its outcome, and what went wrong.
type NoAnswer = (DeliveryOutcome, String);

/// Milliseconds since `started`.
fn elapsed_ms(started: Instant) -> i64 {
    started.elapsed().as_millis().min(i64::MAX as u128) as i64
}

/// One POST of `body` to `url`, to an address checked by
/// `domain::webhook::check_resolved` and pinned for the connection (so a
/// second resolution cannot switch it), no redirects, within `timeout`.
async fn send(
    url: &str,
    allow_private: bool,
    timeout: Duration,
    headers: &[(&str, String)],
    body: String,
    started: Instant,
) -> Attempted {
    match post(url, allow_private, timeout, headers, body, started).await {
        Ok(response) => read_answer(response, started).await,
        Err((outcome, error)) => Attempted {
            outcome,
            status_code: None,
            error: Some(error),
            latency_ms: elapsed_ms(started),
            response_body: None,
        },
    }
}

/// Checks the URL, resolves and checks its host, and POSTs to the address
/// found: the response, or why there is none.
async fn post(
    url: &str,
    allow_private: bool,
    timeout: Duration,
    headers: &[(&str, String)],
    body: String,
    started: Instant,
) -> Result<reqwest::Response, NoAnswer> {
    let refused = |why: &str| (DeliveryOutcome::Refused, why.to_owned());
    let parsed = url::Url::parse(url).map_err(|_| refused("the URL does not parse"))?;
    let port = parsed
        .port_or_known_default()
        .ok_or_else(|| refused("the URL has no port"))?;
    let (domain, addresses) = resolve_host(&parsed, port, timeout).await?;
    let address =
        check_resolved(&addresses, allow_private).map_err(|why| (DeliveryOutcome::Refused, why))?;
    let client = pinned_client(
        domain.as_deref(),
        SocketAddr::new(address, port),
        timeout,
        started,
    )
    .map_err(|error| {
        (
            DeliveryOutcome::Failed,
            format!("no HTTP client: {}", error.without_url()),
        )
    })?;
    let mut request = client
        .post(parsed)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body);
    for (name, value) in headers {
        request = request.header(*name, value.as_str());
    }
    request.send().await.map_err(|error| {
        let what = if error.is_timeout() {
            "the delivery timed out"
        } else if error.is_connect() {
            "could not connect"
        } else {
            "the request failed"
        };
        let detail = error.without_url();
        (DeliveryOutcome::Failed, format!("{what}: {detail}"))
    })
}

/// The addresses of the URL's host, within `timeout`, and its name when it
/// is a domain (to pin the address found for it).
async fn resolve_host(
    parsed: &url::Url,
    port: u16,
    timeout: Duration,
) -> Result<(Option<String>, Vec<IpAddr>), NoAnswer> {
    match parsed.host() {
        Some(url::Host::Ipv4(v4)) => Ok((None, vec![IpAddr::V4(v4)])),
        Some(url::Host::Ipv6(v6)) => Ok((None, vec![IpAddr::V6(v6)])),
        Some(url::Host::Domain(name)) => {
            let name = name.to_owned();
            let looked_up =
                tokio::time::timeout(timeout, tokio::net::lookup_host((name.clone(), port))).await;
            match looked_up {
                Ok(Ok(found)) => {
                    let found: Vec<IpAddr> = found.map(|a| a.ip()).collect();
                    Ok((Some(name), found))
                }
                Ok(Err(error)) => Err((
                    DeliveryOutcome::Refused,
                    format!("the host did not resolve: {error}"),
                )),
                Err(_) => Err((
                    DeliveryOutcome::Failed,
                    "resolving the host timed out".into(),
                )),
            }
        }
        None => Err((DeliveryOutcome::Refused, "the URL has no host".into())),
    }
}

/// A client that follows no redirects, uses no proxy, reaches `domain` (if
/// any) at `address` alone, and gives up when `timeout` since `started`
/// runs out.
fn pinned_client(
    domain: Option<&str>,
    address: SocketAddr,
    timeout: Duration,
    started: Instant,
) -> reqwest::Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .timeout(
            timeout
                .saturating_sub(started.elapsed())
                .max(Duration::from_millis(1)),
        )
        .user_agent(USER_AGENT);
    if let Some(domain) = domain {
        builder = builder.resolve(domain, address);
    }
    builder.build()
}

/// What the endpoint answered: delivered on a 2xx, else failed.
async fn read_answer(mut response: reqwest::Response, started: Instant) -> Attempted {
    let status = response.status();
    let mut kept: Vec<u8> = Vec::new();
    // At most 1 KiB of the answer is kept, and no more is read.
    while kept.len() < MAX_RESPONSE_BODY {
        match response.chunk().await {
            Ok(Some(chunk)) => kept.extend_from_slice(&chunk),
            _ => break,
        }
    }
    let code = Some(i32::from(status.as_u16()));
    let response_body = (!kept.is_empty()).then(|| truncate_response(&kept));
    let (outcome, error) = if status.is_success() {
        (DeliveryOutcome::Delivered, None)
    } else if status.is_redirection() {
        (
            DeliveryOutcome::Failed,
            Some(format!(
                "answered {status}: redirects are not followed; register the final URL"
            )),
        )
    } else {
        (DeliveryOutcome::Failed, Some(format!("answered {status}")))
    };
    Attempted {
        outcome,
        status_code: code,
        error,
        latency_ms: elapsed_ms(started),
        response_body,
    }
}
