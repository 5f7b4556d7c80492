//! The HTTP layer (actix-web): routes, the JSON API under `/api/v1`, the
//! signed callback endpoint and the pages. Handlers parse the request, call
//! one use case of [`crate::app::App`] (shared as `web::Data<App>`) and
//! render; errors leave as problem+json through [`error::ApiError`].

pub mod anthropic_messages;
pub mod api_callbacks;
pub mod api_jobs;
pub mod api_support;
pub mod api_usage;
pub mod api_webhooks;
pub mod auth;
pub mod body;
pub mod chat_door;
pub mod chat_stream;
pub mod error;
pub mod health;
pub mod idempotency;
pub mod openai_compat;
pub mod openapi;
pub mod pages;
pub mod responses;
pub mod views;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::{from_fn, Next};
use actix_web::{guard, web, HttpMessage};

use crate::telemetry::http_span::MatchedRoute;
use error::{ApiError, ProblemType};

/// A route for GET that also answers HEAD (actix's GET routes do not).
fn read() -> actix_web::Route {
    web::route().guard(guard::Any(guard::Get()).or(guard::Head()))
}

/// The methods of a read-only path.
const READ: &str = "GET, HEAD";

/// A path answering `allow`; any other method gets 405 with `Allow`.
fn resource(path: &str, allow: &'static str) -> actix_web::Resource {
    web::resource(path).default_service(web::to(move |req: actix_web::HttpRequest| async move {
        method_not_allowed(&req, allow)
    }))
}

/// 405 in the form of the path's audience: OpenAI's error under `/v1/`,
/// problem+json under `/api/`, a readable page elsewhere.
fn method_not_allowed(req: &actix_web::HttpRequest, allow: &str) -> actix_web::HttpResponse {
    use actix_web::ResponseError;
    let method = req.method().as_str();
    let mut response = if req.path() == "/v1/messages" {
        anthropic_messages::AnthropicError::method_not_allowed(method, allow).error_response()
    } else if req.path().starts_with("/v1/") {
        openai_compat::OpenAiError::method_not_allowed(method, allow).error_response()
    } else if req.path().starts_with("/api/") {
        ApiError::new(
            error::ProblemType::MethodNotAllowed,
            format!("{method} is not allowed on this path; allowed: {allow}"),
        )
        .with("allow", allow)
        .error_response()
    } else {
        pages::PageError::new(
            actix_web::http::StatusCode::METHOD_NOT_ALLOWED,
            "Method not allowed",
            format!("This address does not answer {method}."),
        )
        .error_response()
    };
    if let Ok(value) = HeaderValue::from_str(allow) {
        response
            .headers_mut()
            .insert(actix_web::http::header::ALLOW, value);
    }
    response
}

/// Every route; forms are read up to `body_limit` bytes
/// (`server.body_limit_bytes`, as the JSON API).
pub fn routes(cfg: &mut web::ServiceConfig, body_limit: usize) {
    cfg.app_data(
        web::FormConfig::default()
            .limit(body_limit)
            .error_handler(|error, _| {
                let timed_out = matches!(&error,
                    actix_web::error::UrlencodedError::Payload(e) if body::is_body_timeout(e));
                if timed_out {
                    return pages::PageError::from(ApiError::new(
                        ProblemType::RequestTimeout,
                        "The form did not arrive in time. Send it again.",
                    ))
                    .into();
                }
                pages::PageError::bad_request(format!("The form could not be read: {error}")).into()
            }),
    )
    .app_data(web::QueryConfig::default().error_handler(|error, _| {
        pages::PageError::bad_request(format!("The link's parameters could not be read: {error}"))
            .into()
    }))
    .configure(api_routes)
    .configure(page_routes)
    .default_service(web::to(not_found));
}

/// The machine-facing surfaces: the JSON API, the signed callbacks and the
/// OpenAI- and Anthropic-compatible endpoints. Registered before the pages
/// so that API requests, the hot path, are matched first; no page path
/// starts with `/api/v1` or `/v1`, so the order changes no answer.
fn api_routes(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/api/v1/openapi.json", READ).route(read().to(openapi::openapi_json)))
        // Signed per attempt, not by a bearer token. A scope, so that every
        // other request passes it by a comparison of its static prefix: a
        // path with a parameter is matched by a regular expression, which
        // each request would otherwise run here on its way to its route.
        .service(
            web::scope("/api/v1/callbacks/attempts")
                .service(resource("/{id}", "POST").route(web::post().to(api_callbacks::receive)))
                .default_service(web::to(not_found)),
        )
        .service(
            web::scope("/api/v1")
                .wrap(from_fn(auth::require_bearer))
                .service(
                    resource("/jobs", "GET, HEAD, POST")
                        .route(web::post().to(api_jobs::create_job))
                        .route(read().to(api_jobs::list_jobs)),
                )
                .service(resource("/jobs/{id}", READ).route(read().to(api_jobs::get_job)))
                .service(
                    resource("/jobs/{id}/attempts", "POST")
                        .route(web::post().to(api_jobs::start_attempt)),
                )
                .service(
                    resource("/jobs/{id}/cancel", "POST")
                        .route(web::post().to(api_jobs::cancel_job)),
                )
                .service(
                    resource("/attempts/{id}/abandon", "POST")
                        .route(web::post().to(api_support::abandon_attempt)),
                )
                .service(
                    resource("/admin/unknown", READ)
                        .route(read().to(api_support::unknown_attempts)),
                )
                .service(resource("/admin/races", READ).route(read().to(api_support::races)))
                .configure(api_webhooks::routes)
                .configure(api_usage::routes)
                .default_service(web::to(not_found)),
        )
        // The Anthropic-compatible endpoint, before the OpenAI-compatible
        // scope: Anthropic's error shape, its `x-api-key`.
        .service(
            resource("/v1/messages", "POST")
                .wrap(from_fn(chat_door::require_api_key::<chat_door::Messages>))
                .route(web::post().to(anthropic_messages::create_message)),
        )
        // The OpenAI-compatible surface: OpenAI's error shape throughout.
        .service(
            web::scope("/v1")
                .wrap(from_fn(
                    chat_door::require_bearer::<chat_door::ChatCompletions>,
                ))
                .service(
                    resource("/chat/completions", "POST")
                        .route(web::post().to(openai_compat::chat_completions)),
                )
                .service(
                    resource("/responses", "POST")
                        .route(web::post().to(responses::create_response)),
                )
                .service(
                    resource("/responses/{id}", READ).route(read().to(responses::get_response)),
                )
                .service(
                    resource("/responses/{id}/cancel", "POST")
                        .route(web::post().to(responses::cancel_response)),
                )
                .service(resource("/models", READ).route(read().to(openai_compat::list_models)))
                .service(
                    resource("/models/{model}", READ).route(read().to(openai_compat::get_model)),
                )
                .default_service(web::to(openai_compat::unknown_path)),
        );
}

/// The browser's pages, their assets, the probes and `/metrics`.
fn page_routes(cfg: &mut web::ServiceConfig) {
    use pages::{console, job_pages, session, usage_pages, webhook_pages};
    cfg.service(resource("/", READ).route(read().to(pages::home)))
        .service(resource("/static/style.css", READ).route(read().to(pages::stylesheet)))
        .service(resource(pages::HTMX_PATH, READ).route(read().to(pages::htmx)))
        .service(resource(pages::LIVE_TEXT_PATH, READ).route(read().to(pages::live_text_js)))
        .service(resource("/problems/{slug}", READ).route(read().to(pages::problem)))
        .service(resource("/healthz", READ).route(read().to(health::healthz)))
        .service(resource("/readyz", READ).route(read().to(health::readyz)))
        .service(
            resource("/login", "GET, HEAD, POST")
                .route(read().to(session::sign_in_form))
                .route(web::post().to(session::sign_in)),
        )
        .service(resource("/logout", "POST").route(web::post().to(session::sign_out)))
        .service(resource("/jobs/new", READ).route(read().to(job_pages::new_job_form)))
        .service(
            resource("/jobs", "GET, HEAD, POST")
                .route(read().to(job_pages::my_jobs))
                .route(web::post().to(job_pages::submit_job)),
        )
        .service(resource("/jobs/{id}", READ).route(read().to(job_pages::job_page)))
        .service(resource("/jobs/{id}/stream", READ).route(read().to(pages::live_text::job_stream)))
        .service(
            resource("/jobs/{id}/deliveries", READ)
                .route(read().to(webhook_pages::job_deliveries_section)),
        )
        .service(
            resource("/jobs/{id}/attempts", "POST").route(web::post().to(job_pages::start_attempt)),
        )
        .service(resource("/jobs/{id}/fail", "POST").route(web::post().to(job_pages::fail_job)))
        .service(resource("/jobs/{id}/cancel", "POST").route(web::post().to(job_pages::cancel_job)))
        .service(
            resource("/webhooks", "GET, HEAD, POST")
                .route(read().to(webhook_pages::my_webhooks))
                .route(web::post().to(webhook_pages::add_webhook)),
        )
        .service(resource("/webhooks/{id}", READ).route(read().to(webhook_pages::webhook_page)))
        .service(
            resource("/webhooks/{id}/act", "POST")
                .route(web::post().to(webhook_pages::webhook_act)),
        )
        .service(
            resource("/webhooks/{endpoint}/events/{id}/resend", "POST")
                .route(web::post().to(webhook_pages::resend)),
        )
        .service(resource("/admin/webhooks", READ).route(read().to(webhook_pages::admin_webhooks)))
        .service(resource("/admin", READ).route(read().to(console::console)))
        .service(resource("/admin/unknown", READ).route(read().to(console::unknown_queue)))
        .service(
            resource("/admin/attempts/{id}/abandon", "POST")
                .route(web::post().to(console::abandon)),
        )
        .service(resource("/admin/races", READ).route(read().to(console::races)))
        .service(resource("/admin/usage", READ).route(read().to(usage_pages::admin_usage)))
        .service(resource("/admin/budgets", "POST").route(web::post().to(usage_pages::budget_act)))
        .service(resource("/usage", READ).route(read().to(usage_pages::my_usage)))
        .service(resource("/admin/audit", READ).route(read().to(console::audit)))
        .service(
            resource("/admin/users", "GET, HEAD, POST")
                .route(read().to(console::users))
                .route(web::post().to(console::add_user)),
        )
        .service(
            resource("/admin/users/{name}/act", "POST").route(web::post().to(console::user_act)),
        )
        .service(resource("/admin/jobs", READ).route(read().to(console::jobs_search)))
        .service(resource("/admin/providers", READ).route(read().to(console::providers)))
        .service(
            resource("/admin/providers/qualify", "POST").route(web::post().to(console::qualify)),
        )
        .service(
            resource("/metrics", READ)
                .wrap(from_fn(auth::require_bearer))
                .route(read().to(health::metrics)),
        );
}

/// A worker-only process's routes: what the orchestrator and Prometheus
/// need, and nothing a client could use.
pub fn probe_routes(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/healthz", READ).route(read().to(health::healthz)))
        .service(resource("/readyz", READ).route(read().to(health::readyz)))
        .service(
            resource("/metrics", READ)
                .wrap(from_fn(auth::require_bearer))
                .route(read().to(health::metrics)),
        )
        .default_service(web::to(not_found));
}

/// The routes of `[server] metrics_bind`: `/metrics` without a token, and
/// nothing else. Whoever reaches that address may read the metrics, so it
/// belongs on a private network.
pub fn metrics_routes(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/metrics", READ).route(read().to(health::open_metrics)))
        .default_service(web::to(not_found));
}

/// Unknown paths: problem+json under `/api/`, a readable page elsewhere.
async fn not_found(req: actix_web::HttpRequest) -> actix_web::HttpResponse {
    use actix_web::ResponseError;
    if req.path().starts_with("/api/") {
        ApiError::not_found().error_response()
    } else {
        pages::PageError::not_found().error_response()
    }
}

/// The Content Security Policy of every response: only this origin's
/// scripts, styles and forms; no framing (console actions cannot be
/// clickjacked), no `<base>`. htmx is configured to work under it (no
/// injected styles, no eval).
pub const CONTENT_SECURITY_POLICY: &str =
    "default-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'";

/// Security headers on every response of the metrics listener
/// ([`add_security_headers`]); the main server's come from
/// [`around_each_request`].
pub async fn security_headers(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let mut response = next.call(req).await?;
    add_security_headers(response.headers_mut());
    Ok(response)
}

/// Security headers on every response; `no-store` on everything not marked
/// cacheable (pages and API answers are per user); `Vary: HX-Request` on
/// pages, which are a whole page or an htmx fragment by that header;
/// [`X_ACCEL_BUFFERING`] on event streams.
fn add_security_headers(headers: &mut actix_web::http::header::HeaderMap) {
    use actix_web::http::header;
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let is_page = content_type.starts_with("text/html");
    let is_event_stream = content_type.starts_with("text/event-stream");
    if is_page {
        headers.append(header::VARY, HeaderValue::from_static("HX-Request"));
    }
    if is_event_stream {
        headers.insert(
            HeaderName::from_static(X_ACCEL_BUFFERING),
            HeaderValue::from_static("no"),
        );
    }
}

/// Sent with every event stream: a proxy that honours it (nginx does)
/// passes each event on as it comes instead of buffering the response,
/// whatever its own settings for the path (docs/deployment.md).
pub const X_ACCEL_BUFFERING: &str = "x-accel-buffering";

/// The client's address: the socket's peer, or, when the peer is a trusted
/// proxy, the rightmost `X-Forwarded-For` entry that is not itself one.
pub fn client_address(
    req: &actix_web::HttpRequest,
    trusted: &[std::net::IpAddr],
) -> std::net::IpAddr {
    let peer = req
        .peer_addr()
        .map_or(std::net::IpAddr::from([0, 0, 0, 0]), |a| a.ip());
    if !trusted.contains(&peer) {
        return peer;
    }
    let forwarded: Vec<std::net::IpAddr> = req
        .headers()
        .get_all("x-forwarded-for")
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|a| a.trim().parse().ok())
        .collect();
    forwarded
        .into_iter()
        .rev()
        .find(|a| !trusted.contains(a))
        .unwrap_or(peer)
}

/// What every request of the main server passes through, in one layer
/// (each layer of its own cost a boxed future and a move of the request and
/// of the response, on every request):
/// - its body must arrive within `server.body_timeout_ms`
///   ([`body::body_deadline`]);
/// - it is timed into `onejob_http_request_seconds`, labelled by the
///   route's pattern (never the raw path) and the status;
/// - its response gets the security headers ([`add_security_headers`]) and
///   echoes, as `X-Request-Id`, the request id that `tracing-actix-web`
///   gave the request's span, so that a client report can be matched to
///   the server's logs.
pub async fn around_each_request(
    mut req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = std::time::Instant::now();
    let app = req.app_data::<web::Data<crate::app::App>>().cloned();
    if let Some(app) = &app {
        let timeout = std::time::Duration::from_millis(app.config().server.body_timeout_ms);
        body::body_deadline(&mut req, timeout);
    }
    let request_id = req
        .extensions()
        .get::<tracing_actix_web::RequestId>()
        .copied();
    let method = req.method().clone();
    let mut response = next.call(req).await?;
    add_security_headers(response.headers_mut());
    if let Some(app) = app {
        record_http(&app, &method, &response, started);
    }
    if let Some(id) = request_id {
        if let Ok(value) = HeaderValue::from_str(&id.to_string()) {
            response
                .headers_mut()
                .insert(HeaderName::from_static("x-request-id"), value);
        }
    }
    Ok(response)
}

/// Times a request into `onejob_http_request_seconds`, labelled by the
/// route's pattern (kept by its span, [`MatchedRoute`]) and the status.
fn record_http<B>(
    app: &crate::app::App,
    method: &actix_web::http::Method,
    response: &ServiceResponse<B>,
    started: std::time::Instant,
) {
    let request = response.request();
    let extensions = request.extensions();
    let matched_again;
    let route = match extensions.get::<MatchedRoute>() {
        Some(MatchedRoute(route)) => route.as_deref(),
        None => {
            matched_again = request.match_pattern();
            matched_again.as_deref()
        }
    };
    app.metrics().observe_http(
        method.as_str(),
        route.unwrap_or("unmatched"),
        response.status().as_u16(),
        started.elapsed(),
    );
}
