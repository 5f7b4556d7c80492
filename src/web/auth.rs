//! Bearer-token authentication for `/api/v1`. The middleware runs before any
//! extractor, so an unauthenticated request gets 401 whatever its body; the
//! [`Caller`] extractor then hands the user to handlers.

use std::future::{ready, Ready};

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::middleware::Next;
use actix_web::{web, FromRequest, HttpMessage, HttpRequest, ResponseError};

use super::error::{ApiError, ProblemType};
use crate::app::{App, Credential, User};

/// The authenticated user making the request, and how its token was
/// checked (read for this request, or kept: see `app::credentials`).
#[derive(Debug, Clone)]
pub struct Caller(pub User, pub Credential);

impl FromRequest for Caller {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let extensions = req.extensions();
        let credential = extensions.get::<Credential>().cloned().unwrap_or_default();
        ready(
            extensions
                .get::<User>()
                .cloned()
                .map(|user| Caller(user, credential))
                .ok_or_else(|| {
                    ApiError::new(ProblemType::Unauthorized, "no valid bearer token was sent")
                }),
        )
    }
}

/// The requests whose handlers create a job with the caller's credential
/// ([`App::create_job`]), which confirms a kept token check in the
/// creating transaction: only these may use one. Every other request's
/// token is read for it.
const CREATING: [&str; 4] = [
    "/api/v1/jobs",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/messages",
];

fn creates_a_job(req: &ServiceRequest) -> bool {
    req.method() == actix_web::http::Method::POST && CREATING.contains(&req.path())
}

/// Where a request may carry its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Accepted {
    /// `Authorization: Bearer <token>` only.
    Bearer,
    /// `x-api-key: <token>` (how Anthropic's SDKs send their `api_key`), or
    /// a bearer token.
    BearerOrApiKey,
}

/// The one token the request presents. Every credential it carries counts,
/// `x-api-key` included wherever it is sent: two that name different tokens
/// (or one header repeated with different values) are refused, since who
/// the request acts for would be a matter of which one a reader picked. The
/// same token twice is one credential.
fn presented_token(req: &ServiceRequest, accepted: Accepted) -> Result<String, ApiError> {
    let unauthorized = |detail: &str| ApiError::new(ProblemType::Unauthorized, detail);
    let mut tokens: Vec<String> = Vec::new();
    for value in req.headers().get_all(header::AUTHORIZATION) {
        let value = value
            .to_str()
            .map_err(|_| unauthorized("the Authorization header is not valid text"))?;
        let token = value
            .split_once(' ')
            .filter(|(scheme, token)| {
                scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()
            })
            .map(|(_, token)| token.trim().to_owned())
            .ok_or_else(|| unauthorized("the Authorization header must be `Bearer <token>`"))?;
        tokens.push(token);
    }
    let bearers = tokens.len();
    for value in req.headers().get_all("x-api-key") {
        let token = value
            .to_str()
            .ok()
            .map(str::trim)
            .filter(|token| !token.is_empty())
            .ok_or_else(|| unauthorized("the x-api-key header is not a token"))?;
        tokens.push(token.to_owned());
    }
    tokens.dedup();
    if tokens.iter().any(|token| *token != tokens[0]) {
        return Err(unauthorized(
            "the request carries different credentials (Authorization and x-api-key headers \
             naming different tokens); send one token, once",
        ));
    }
    match (tokens.pop(), accepted) {
        (Some(token), Accepted::BearerOrApiKey) => Ok(token),
        (Some(token), Accepted::Bearer) if bearers > 0 => Ok(token),
        (_, Accepted::Bearer) => Err(unauthorized("send `Authorization: Bearer <token>`")),
        (None, Accepted::BearerOrApiKey) => Err(unauthorized(
            "send your onejob API token as `x-api-key: <token>` or `Authorization: Bearer <token>`",
        )),
    }
}

/// Middleware: resolves the bearer token to a user or answers 401. A refusal
/// is answered here as a response (not an error), so outer middleware still
/// decorates it (request id).
pub async fn require_bearer(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    authenticate_or(req, next, |refusal| refusal.error_response()).await
}

/// Resolves the bearer token and runs the rest of the chain as that user,
/// or answers with `refuse`'s rendering of why not (each surface words
/// refusals in its own format).
pub(crate) async fn authenticate_or<B: MessageBody>(
    req: ServiceRequest,
    next: Next<B>,
    refuse: impl FnOnce(ApiError) -> actix_web::HttpResponse,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error> {
    let token = presented_token(&req, Accepted::Bearer);
    run_as_or(req, token, next, refuse).await
}

/// [`authenticate_or`] for clients that send their token as `x-api-key`
/// (how Anthropic's SDKs send their `api_key`), or as a bearer token.
pub(crate) async fn authenticate_api_key_or<B: MessageBody>(
    req: ServiceRequest,
    next: Next<B>,
    refuse: impl FnOnce(ApiError) -> actix_web::HttpResponse,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error> {
    let token = presented_token(&req, Accepted::BearerOrApiKey);
    run_as_or(req, token, next, refuse).await
}

async fn run_as_or<B: MessageBody>(
    req: ServiceRequest,
    token: Result<String, ApiError>,
    next: Next<B>,
    refuse: impl FnOnce(ApiError) -> actix_web::HttpResponse,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error> {
    let user = match token {
        Ok(token) => authenticate(&req, &token).await,
        Err(refusal) => Err(refusal),
    };
    match user {
        Ok((user, credential)) => {
            {
                let mut extensions = req.extensions_mut();
                extensions.insert(user);
                extensions.insert(credential);
            }
            Ok(next.call(req).await?.map_into_left_body())
        }
        Err(refusal) => Ok(req.into_response(refuse(refusal)).map_into_right_body()),
    }
}

async fn authenticate(req: &ServiceRequest, token: &str) -> Result<(User, Credential), ApiError> {
    let app = req
        .app_data::<web::Data<App>>()
        .cloned()
        .ok_or_else(ApiError::internal)?;
    let user = if creates_a_job(req) {
        app.user_for_creating_token(token).await?
    } else {
        let user = app.user_for_token(token).await?;
        user.map(|user| (user, Credential::Checked))
    };
    user.ok_or_else(|| ApiError::new(ProblemType::Unauthorized, "the bearer token is not valid"))
}
