//! The browser app: server-rendered askama pages, progressively enhanced with
//! htmx. Every page works without JavaScript (plain forms, 303 redirects);
//! for htmx requests that are not boosted navigations, handlers return the
//! partial that changed.

pub mod charts;
pub mod console;
pub mod job_pages;
pub mod live_text;
pub mod paging;
pub mod session;
pub mod timeline;
pub mod usage_pages;
pub mod webhook_pages;

use actix_web::http::{header, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use askama::Template;

use super::error::{ApiError, ProblemType};
use crate::app::AppError;
use crate::domain::{Role, Timestamp};
pub use session::SignedIn;

/// The vendored htmx, pinned; its version is in the file name so it can be
/// cached forever.
pub const HTMX_PATH: &str = "/static/htmx-2.0.11.min.js";
const HTMX_JS: &str = include_str!("../../../static/htmx-2.0.11.min.js");
const STYLESHEET: &str = include_str!("../../../static/style.css");
/// onejob's own script for a job page's live text (an `EventSource` on
/// `/jobs/{id}/stream`); versioned in its name like htmx.
pub const LIVE_TEXT_PATH: &str = "/static/live-text-1.js";
const LIVE_TEXT_JS: &str = include_str!("../../../static/live-text-1.js");

/// What the layout needs to draw the navigation.
#[derive(Debug, Clone, Default)]
pub struct Nav {
    pub user: Option<String>,
    pub is_staff: bool,
    pub is_admin: bool,
    /// The session's CSRF token, for the sign-out form.
    pub csrf: String,
    pub htmx: &'static str,
    pub live_text: &'static str,
}

impl Nav {
    pub fn anonymous() -> Self {
        Self {
            htmx: HTMX_PATH,
            live_text: LIVE_TEXT_PATH,
            ..Self::default()
        }
    }
}

/// Renders a template with a status.
pub fn render_with(status: StatusCode, page: &impl Template) -> HttpResponse {
    match page.render() {
        Ok(html) => HttpResponse::build(status)
            .content_type("text/html; charset=utf-8")
            .body(html),
        Err(e) => {
            tracing::error!(error = %e, "template rendering failed");
            HttpResponse::InternalServerError()
                .content_type("text/plain; charset=utf-8")
                .body("internal error")
        }
    }
}

pub fn render(page: &impl Template) -> HttpResponse {
    render_with(StatusCode::OK, page)
}

/// A part of a page, rendered to embed in another (empty, and logged, if
/// it cannot be).
pub fn fragment(part: &impl Template) -> String {
    part.render().unwrap_or_else(|e| {
        tracing::error!(error = %e, "template rendering failed");
        String::new()
    })
}

/// A 303 See Other: where every successful form POST goes.
pub fn see_other(location: &str) -> HttpResponse {
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, location))
        .finish()
}

/// True for htmx requests that want a fragment (polling, targeted swaps), not
/// boosted navigations, which want the whole page.
pub fn wants_partial(req: &HttpRequest) -> bool {
    let has = |name: &str| {
        req.headers()
            .get(name)
            .is_some_and(|v| v.as_bytes() == b"true")
    };
    has("HX-Request") && !has("HX-Boosted")
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage<'a> {
    nav: Nav,
    status: u16,
    title: &'a str,
    message: &'a str,
}

/// Errors of the browser app: a readable page, or a redirect to sign in.
#[derive(Debug)]
pub enum PageError {
    SignInRequired {
        next: String,
    },
    Page {
        status: StatusCode,
        title: String,
        message: String,
    },
}

impl PageError {
    pub fn new(status: StatusCode, title: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Page {
            status,
            title: title.into(),
            message: message.into(),
        }
    }

    pub fn not_found() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "Not found",
            "There is nothing here, or it is not yours to see.",
        )
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "Not allowed", message)
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "That request could not be used",
            message,
        )
    }
}

impl std::fmt::Display for PageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::SignInRequired { .. } => f.write_str("sign-in required"),
            Self::Page { status, title, .. } => write!(f, "{status}: {title}"),
        }
    }
}

impl ResponseError for PageError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::SignInRequired { .. } => StatusCode::SEE_OTHER,
            Self::Page { status, .. } => *status,
        }
    }

    fn error_response(&self) -> HttpResponse {
        match self {
            Self::SignInRequired { next } => {
                let target = format!("/login?next={}", percent_encode(next));
                see_other(&target)
            }
            Self::Page {
                status,
                title,
                message,
            } => {
                let mut response = render_with(
                    *status,
                    &ErrorPage {
                        nav: Nav::anonymous(),
                        status: status.as_u16(),
                        title,
                        message,
                    },
                );
                // The rest of a slow body may still be on its way.
                if *status == StatusCode::REQUEST_TIMEOUT {
                    response
                        .head_mut()
                        .set_connection_type(actix_web::http::ConnectionType::Close);
                }
                response
            }
        }
    }
}

impl From<ApiError> for PageError {
    fn from(e: ApiError) -> Self {
        let (_, status, title, _) = e.problem.describe();
        if e.problem == ProblemType::NotFound {
            return Self::not_found();
        }
        Self::new(status, title, e.detail)
    }
}

impl From<AppError> for PageError {
    fn from(e: AppError) -> Self {
        match e {
            AppError::Forbidden(Role::Admin) => Self::forbidden("This is for admins."),
            AppError::Forbidden(_) => Self::forbidden("This is for support staff and admins."),
            other => ApiError::from(other).into(),
        }
    }
}

/// Minimal percent-encoding for a path placed in a query string.
pub fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `/`: signed-in users go to the submit page, others to sign in.
pub async fn home(user: Option<SignedIn>) -> HttpResponse {
    match user {
        Some(_) => see_other("/jobs/new"),
        None => see_other("/login"),
    }
}

#[derive(Template)]
#[template(path = "problem.html")]
struct ProblemPage {
    nav: Nav,
    slug: &'static str,
    status: u16,
    title: &'static str,
    description: &'static str,
}

/// `GET /problems/{slug}`: what a problem `type` means.
pub async fn problem(path: web::Path<String>) -> Result<HttpResponse, PageError> {
    let problem = ProblemType::from_slug(&path).ok_or_else(PageError::not_found)?;
    let (slug, status, title, description) = problem.describe();
    Ok(render(&ProblemPage {
        nav: Nav::anonymous(),
        slug,
        status: status.as_u16(),
        title,
        description,
    }))
}

pub async fn stylesheet() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/css; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "public, max-age=3600"))
        .body(STYLESHEET)
}

/// The pinned htmx: its name changes with its version, so it is immutable.
pub async fn htmx() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/javascript; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "public, max-age=31536000, immutable"))
        .body(HTMX_JS)
}

/// The live-text script: its name changes with its content, so it is
/// immutable.
pub async fn live_text_js() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/javascript; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "public, max-age=31536000, immutable"))
        .body(LIVE_TEXT_JS)
}

/// Formats an instant for people: `2026-11-29 14:03:07 UTC`.
pub fn when(at: Timestamp) -> String {
    chrono::DateTime::from_timestamp_millis(at.millis())
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_default()
}

/// Formats a duration in ms for people: `850 ms`, `4.2 s`, `3 min 5 s`, `2 h 10 min`.
pub fn duration(ms: i64) -> String {
    let ms = ms.max(0);
    match ms {
        0..=999 => format!("{ms} ms"),
        1_000..=59_999 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..=3_599_999 => format!("{} min {} s", ms / 60_000, (ms % 60_000) / 1000),
        _ => format!("{} h {} min", ms / 3_600_000, (ms % 3_600_000) / 60_000),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_well() {
        assert_eq!(duration(850), "850 ms");
        assert_eq!(duration(4_200), "4.2 s");
        assert_eq!(duration(185_000), "3 min 5 s");
        assert_eq!(duration(7_800_000), "2 h 10 min");
    }

    #[test]
    fn next_paths_are_encoded_for_the_query_string() {
        assert_eq!(percent_encode("/jobs/1?x=a b&c"), "/jobs/1%3Fx%3Da%20b%26c");
    }
}
