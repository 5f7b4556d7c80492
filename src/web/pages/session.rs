//! Sign-in, sign-out, the session extractor and CSRF protection.
//!
//! The session cookie holds a random token (HttpOnly, SameSite=Lax, Secure
//! over TLS); the server keeps only its SHA-256, so sessions can be ended
//! and shared by every process on one database. Each form carries a CSRF
//! token derived from the session token, which another site can neither read
//! nor compute. The sign-in form, before any session exists, uses a
//! double-submit cookie instead.

use actix_web::cookie::{time::Duration as CookieDuration, Cookie, SameSite};
use actix_web::dev::Payload;
use actix_web::http::StatusCode;
use actix_web::{web, FromRequest, HttpRequest, HttpResponse};
use askama::Template;
use futures_util::future::LocalBoxFuture;
use serde::Deserialize;

use super::{render_with, see_other, Nav, PageError, HTMX_PATH};
use crate::app::SignIn;
use crate::app::{App, User};
use crate::domain::password::UserName;
use crate::domain::secret::random_hex_token;
use crate::domain::sha256_hex;

pub const SESSION_COOKIE: &str = "onejob_session";
pub const SIGN_IN_CSRF_COOKIE: &str = "onejob_signin_csrf";

/// Over TLS the cookies carry the `__Host-` prefix, so that a sibling
/// subdomain cannot plant or shadow them (browsers refuse the prefix on
/// plain HTTP, where the bare names are used).
fn cookie_name(req: &HttpRequest, base: &'static str) -> &'static str {
    match (secure(req), base) {
        (true, SESSION_COOKIE) => "__Host-onejob_session",
        (true, SIGN_IN_CSRF_COOKIE) => "__Host-onejob_signin_csrf",
        _ => base,
    }
}

fn cookie_value(req: &HttpRequest, base: &'static str) -> Option<String> {
    req.cookie(cookie_name(req, base))
        .map(|c| c.value().to_owned())
}

/// The CSRF token that goes with a session token.
pub fn csrf_for(session_token: &str) -> String {
    sha256_hex(format!("onejob-csrf:{session_token}").as_bytes())
}

/// Compares two tokens in time independent of where they differ.
fn same_token(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// A signed-in browser user.
#[derive(Debug, Clone)]
pub struct SignedIn {
    pub user: User,
    pub csrf: String,
}

impl SignedIn {
    pub fn nav(&self) -> Nav {
        Nav {
            user: Some(self.user.name.clone()),
            is_staff: self.user.role.is_staff(),
            is_admin: self.user.role.is_admin(),
            csrf: self.csrf.clone(),
            htmx: HTMX_PATH,
            live_text: super::LIVE_TEXT_PATH,
        }
    }

    /// Refuses a state-changing form without this session's CSRF token.
    pub fn check_csrf(&self, submitted: Option<&str>) -> Result<(), PageError> {
        match submitted {
            Some(token) if same_token(token, &self.csrf) => Ok(()),
            _ => Err(PageError::forbidden(
                "This form did not come from this session (it may have expired, or come from another site). \
                 Reload the page and try again.",
            )),
        }
    }
}

impl FromRequest for SignedIn {
    type Error = PageError;
    type Future = LocalBoxFuture<'static, Result<Self, PageError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let token = cookie_value(req, SESSION_COOKIE);
        let app = req.app_data::<web::Data<App>>().cloned();
        // After signing in, come back here (for a GET; a POST goes to its referrer's page).
        let next = if req.method() == actix_web::http::Method::GET {
            req.uri()
                .path_and_query()
                .map(|p| p.as_str().to_owned())
                .unwrap_or_else(|| "/".into())
        } else {
            "/".into()
        };
        Box::pin(async move {
            let (Some(token), Some(app)) = (token, app) else {
                return Err(PageError::SignInRequired { next });
            };
            let user = app.user_for_session(&token).await?;
            match user {
                Some(user) => Ok(SignedIn {
                    user,
                    csrf: csrf_for(&token),
                }),
                None => Err(PageError::SignInRequired { next }),
            }
        })
    }
}

/// Whether cookies carry `Secure` (and the `__Host-` prefix): the
/// configuration decides (`server.secure_cookies`, by default on when
/// `public_url` is https), never a header a client could send.
fn secure(req: &HttpRequest) -> bool {
    req.app_data::<web::Data<App>>()
        .is_some_and(|app| app.config().server.secure_cookies())
}

fn cookie<'a>(
    req: &HttpRequest,
    name: &'a str,
    value: String,
    max_age: CookieDuration,
) -> Cookie<'a> {
    Cookie::build(name, value)
        .path("/")
        .http_only(true)
        .same_site(SameSite::Lax)
        .secure(secure(req))
        .max_age(max_age)
        .finish()
}

/// Only local paths may be a sign-in's destination (no open redirect).
/// Only visible ASCII is allowed: browsers drop tabs and newlines from URLs,
/// so `/\t/evil.example` would otherwise become `//evil.example`.
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with('/')
                && !n.starts_with("//")
                && n.bytes().all(|b| b.is_ascii_graphic() && b != b'\\') =>
        {
            n.to_owned()
        }
        _ => "/jobs/new".to_owned(),
    }
}

#[derive(Template)]
#[template(path = "sign_in.html")]
struct SignInPage<'a> {
    nav: Nav,
    csrf: &'a str,
    next: &'a str,
    name: &'a str,
    error: Option<&'a str>,
}

#[derive(Deserialize)]
pub struct NextQuery {
    next: Option<String>,
}

fn sign_in_page(
    req: &HttpRequest,
    status: StatusCode,
    next: &str,
    name: &str,
    error: Option<&str>,
) -> HttpResponse {
    let csrf = cookie_value(req, SIGN_IN_CSRF_COOKIE)
        .filter(|v| v.len() == 64)
        .unwrap_or_else(random_hex_token);
    let mut response = render_with(
        status,
        &SignInPage {
            nav: Nav::anonymous(),
            csrf: &csrf,
            next,
            name,
            error,
        },
    );
    let _ = response.add_cookie(&cookie(
        req,
        cookie_name(req, SIGN_IN_CSRF_COOKIE),
        csrf.clone(),
        CookieDuration::hours(2),
    ));
    response
}

pub async fn sign_in_form(req: HttpRequest, query: web::Query<NextQuery>) -> HttpResponse {
    sign_in_page(
        &req,
        StatusCode::OK,
        &safe_next(query.next.as_deref()),
        "",
        None,
    )
}

#[derive(Deserialize)]
pub struct SignInForm {
    name: String,
    password: String,
    csrf: String,
    next: Option<String>,
}

pub async fn sign_in(
    app: web::Data<App>,
    req: HttpRequest,
    form: web::Form<SignInForm>,
) -> Result<HttpResponse, PageError> {
    let form = form.into_inner();
    let next = safe_next(form.next.as_deref());
    let expected = cookie_value(&req, SIGN_IN_CSRF_COOKIE);
    if !expected.is_some_and(|e| same_token(&e, &form.csrf)) {
        return Err(PageError::forbidden(
            "This sign-in form did not come from this site, or it expired. Open the sign-in page again.",
        ));
    }
    // Only a name that could exist is logged or shown again.
    let name = UserName::parse(&form.name)
        .map(|n| n.as_str().to_owned())
        .unwrap_or_default();
    let address = crate::web::client_address(&req, &app.config().server.trusted_proxies);
    let again =
        |status: StatusCode, error: &str| sign_in_page(&req, status, &next, &name, Some(error));
    match app.sign_in(&form.name, &form.password, address).await? {
        SignIn::Ok(user) => {
            let token = app.start_session(&user).await?;
            tracing::info!(user = %user.name, "signed in");
            let mut response = see_other(&next);
            let max_age = CookieDuration::hours(app.config().server.session_hours as i64);
            let _ = response.add_cookie(&cookie(
                &req,
                cookie_name(&req, SESSION_COOKIE),
                token,
                max_age,
            ));
            Ok(response)
        }
        SignIn::BadCredentials { account } => {
            // A name that is no account's may be a password typed into the
            // wrong field: only a digest of it is logged.
            match account {
                Some(user) => tracing::warn!(%user, %address, "failed sign-in"),
                None => tracing::warn!(
                    name_sha256 = &crate::domain::sha256_hex(form.name.as_bytes())[..12],
                    %address,
                    "failed sign-in for a name that is no account's"
                ),
            }
            Ok(again(StatusCode::UNAUTHORIZED, "Wrong name or password."))
        }
        SignIn::Disabled => {
            tracing::warn!(user = %name, "sign-in refused: the user is disabled");
            Ok(again(
                StatusCode::FORBIDDEN,
                "This account is disabled. Ask an admin to enable it.",
            ))
        }
        SignIn::Busy => Ok(retry_after(
            again(
                StatusCode::SERVICE_UNAVAILABLE,
                "Signing in is busy right now. Try again in a moment.",
            ),
            actix_web::http::header::HeaderValue::from(1),
        )),
        SignIn::Throttled { retry_after_s } => {
            tracing::warn!(%address, "sign-in throttled");
            Ok(retry_after(
                again(StatusCode::TOO_MANY_REQUESTS, &throttled(retry_after_s)),
                actix_web::http::header::HeaderValue::from(retry_after_s),
            ))
        }
    }
}

/// Why signing in from here must wait, and for how long.
fn throttled(retry_after_s: i64) -> String {
    if retry_after_s < 60 {
        format!("Too many failed sign-ins from here. Try again in {retry_after_s} second(s).")
    } else {
        format!(
            "Too many failed sign-ins from here. Try again in {} minute(s).",
            (retry_after_s + 59) / 60
        )
    }
}

/// The response, saying when to try again.
fn retry_after(
    mut response: HttpResponse,
    after: actix_web::http::header::HeaderValue,
) -> HttpResponse {
    response
        .headers_mut()
        .insert(actix_web::http::header::RETRY_AFTER, after);
    response
}

#[derive(Deserialize)]
pub struct CsrfForm {
    pub csrf: Option<String>,
}

pub async fn sign_out(
    app: web::Data<App>,
    req: HttpRequest,
    user: SignedIn,
    form: web::Form<CsrfForm>,
) -> Result<HttpResponse, PageError> {
    user.check_csrf(form.csrf.as_deref())?;
    if let Some(token) = cookie_value(&req, SESSION_COOKIE) {
        app.end_session(&token).await?;
    }
    let mut response = see_other("/login");
    let mut gone = cookie(
        &req,
        cookie_name(&req, SESSION_COOKIE),
        String::new(),
        CookieDuration::ZERO,
    );
    gone.make_removal();
    let _ = response.add_cookie(&gone);
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_local_paths_are_accepted_as_next() {
        assert_eq!(safe_next(Some("/jobs/1")), "/jobs/1");
        assert_eq!(safe_next(Some("//evil.example/x")), "/jobs/new");
        assert_eq!(safe_next(Some("https://evil.example")), "/jobs/new");
        assert_eq!(safe_next(Some("/\\evil.example")), "/jobs/new");
        assert_eq!(safe_next(Some("/\t/evil.example")), "/jobs/new");
        assert_eq!(safe_next(Some("/jobs/1 x")), "/jobs/new");
        assert_eq!(safe_next(None), "/jobs/new");
    }

    #[test]
    fn csrf_tokens_follow_the_session_and_compare_exactly() {
        let a = csrf_for("session-a");
        assert_eq!(a, csrf_for("session-a"));
        assert_ne!(a, csrf_for("session-b"));
        assert!(same_token(&a, &a.clone()));
        assert!(!same_token(&a, &a[..63]));
    }
}
