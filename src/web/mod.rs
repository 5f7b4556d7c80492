//! The HTTP layer (actix-web): routes, the JSON API under `/api/v1`, the
//! signed callback endpoint and the pages. Handlers parse the request, call
//! one use case of [`crate::app::App`] (shared as `web::Data<App>`) and
//! render; errors leave as problem+json through [`error::ApiError`].

pub mod api_callbacks;
pub mod api_jobs;
pub mod api_support;
pub mod auth;
pub mod body;
pub mod error;
pub mod health;
pub mod openapi;
pub mod pages;
pub mod views;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::{from_fn, Next};
use actix_web::{guard, web, HttpMessage};

use error::ApiError;

/// A route for GET that also answers HEAD (actix's GET routes do not).
fn read() -> actix_web::Route {
    web::route().guard(guard::Any(guard::Get()).or(guard::Head()))
}

/// Registers every route.
pub fn routes(cfg: &mut web::ServiceConfig) {
    use pages::{console, job_pages, session};
    cfg.app_data(
        web::FormConfig::default()
            .limit(64 * 1024)
            .error_handler(|error, _| {
                pages::PageError::bad_request(format!("The form could not be read: {error}")).into()
            }),
    )
    .app_data(web::QueryConfig::default().error_handler(|error, _| {
        pages::PageError::bad_request(format!("The link's parameters could not be read: {error}"))
            .into()
    }))
    .route("/", read().to(pages::home))
    .route("/static/style.css", read().to(pages::stylesheet))
    .route(pages::HTMX_PATH, read().to(pages::htmx))
    .route("/problems/{slug}", read().to(pages::problem))
    .route("/healthz", read().to(health::healthz))
    .route("/readyz", read().to(health::readyz))
    .route("/login", read().to(session::sign_in_form))
    .route("/login", web::post().to(session::sign_in))
    .route("/logout", web::post().to(session::sign_out))
    .route("/jobs/new", read().to(job_pages::new_job_form))
    .route("/jobs", read().to(job_pages::my_jobs))
    .route("/jobs", web::post().to(job_pages::submit_job))
    .route("/jobs/{id}", read().to(job_pages::job_page))
    .route(
        "/jobs/{id}/attempts",
        web::post().to(job_pages::start_attempt),
    )
    .route("/jobs/{id}/fail", web::post().to(job_pages::fail_job))
    .route("/admin", read().to(console::console))
    .route("/admin/unknown", read().to(console::unknown_queue))
    .route(
        "/admin/attempts/{id}/abandon",
        web::post().to(console::abandon),
    )
    .route("/admin/races", read().to(console::races))
    .route("/admin/audit", read().to(console::audit))
    .route("/admin/users", read().to(console::users))
    .route("/admin/users", web::post().to(console::add_user))
    .route("/admin/users/{name}/act", web::post().to(console::user_act))
    .route("/admin/jobs", read().to(console::jobs_search))
    .route("/admin/providers", read().to(console::providers))
    .route("/admin/providers/qualify", web::post().to(console::qualify))
    .route("/api/v1/openapi.json", read().to(openapi::openapi_json))
    .service(
        web::resource("/metrics")
            .wrap(from_fn(auth::require_bearer))
            .route(read().to(health::metrics)),
    )
    // Signed per attempt, not by a bearer token.
    .route(
        "/api/v1/callbacks/attempts/{id}",
        web::post().to(api_callbacks::receive),
    )
    .service(
        web::scope("/api/v1")
            .wrap(from_fn(auth::require_bearer))
            .route("/jobs", web::post().to(api_jobs::create_job))
            .route("/jobs", read().to(api_jobs::list_jobs))
            .route("/jobs/{id}", read().to(api_jobs::get_job))
            .route(
                "/jobs/{id}/attempts",
                web::post().to(api_jobs::start_attempt),
            )
            .route(
                "/attempts/{id}/abandon",
                web::post().to(api_support::abandon_attempt),
            )
            .route("/admin/unknown", read().to(api_support::unknown_attempts))
            .route("/admin/races", read().to(api_support::races))
            .default_service(web::to(not_found)),
    )
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

/// Security headers on every response; `no-store` on everything not marked
/// cacheable (pages and API answers are per user); `Vary: HX-Request` on
/// pages, which are a whole page or an htmx fragment by that header.
pub async fn security_headers(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    use actix_web::http::header;
    let mut response = next.call(req).await?;
    let headers = response.headers_mut();
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
    let is_page = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/html"));
    if is_page {
        headers.append(header::VARY, HeaderValue::from_static("HX-Request"));
    }
    Ok(response)
}

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

/// Times every request into `onejob_http_request_seconds`, labelled by the
/// route's pattern (never the raw path) and the status.
pub async fn record_http(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = std::time::Instant::now();
    let app = req.app_data::<web::Data<crate::app::App>>().cloned();
    let method = req.method().as_str().to_owned();
    let response = next.call(req).await?;
    if let Some(app) = app {
        let route = response
            .request()
            .match_pattern()
            .unwrap_or_else(|| "unmatched".to_owned());
        app.metrics().observe_http(
            &method,
            &route,
            response.status().as_u16(),
            started.elapsed(),
        );
    }
    Ok(response)
}

/// Echoes the request id that `tracing-actix-web` gave the request's span as
/// `X-Request-Id`, so a client report can be matched to the server's logs.
pub async fn echo_request_id(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let request_id = req
        .extensions()
        .get::<tracing_actix_web::RequestId>()
        .copied();
    let mut response = next.call(req).await?;
    if let Some(id) = request_id {
        if let Ok(value) = HeaderValue::from_str(&id.to_string()) {
            response
                .headers_mut()
                .insert(HeaderName::from_static("x-request-id"), value);
        }
    }
    Ok(response)
}
