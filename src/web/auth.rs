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
use crate::app::{App, User};

/// The authenticated user making the request.
#[derive(Debug, Clone)]
pub struct Caller(pub User);

impl FromRequest for Caller {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(
            req.extensions()
                .get::<User>()
                .cloned()
                .map(Caller)
                .ok_or_else(|| {
                    ApiError::new(ProblemType::Unauthorized, "no valid bearer token was sent")
                }),
        )
    }
}

/// Extracts the token from `Authorization: Bearer <token>`.
fn bearer_token(req: &ServiceRequest) -> Result<String, ApiError> {
    let unauthorized = |detail: &str| ApiError::new(ProblemType::Unauthorized, detail);
    let value = req
        .headers()
        .get(header::AUTHORIZATION)
        .ok_or_else(|| unauthorized("send `Authorization: Bearer <token>`"))?;
    let value = value
        .to_str()
        .map_err(|_| unauthorized("the Authorization header is not valid text"))?;
    let (scheme, token) = value
        .split_once(' ')
        .ok_or_else(|| unauthorized("the Authorization header must be `Bearer <token>`"))?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(unauthorized(
            "the Authorization header must be `Bearer <token>`",
        ));
    }
    Ok(token.to_owned())
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
    let token = bearer_token(&req);
    run_as_or(req, token, next, refuse).await
}

/// [`authenticate_or`] for clients that send their token as `x-api-key`
/// (how Anthropic's SDKs send their `api_key`), or as a bearer token.
pub(crate) async fn authenticate_api_key_or<B: MessageBody>(
    req: ServiceRequest,
    next: Next<B>,
    refuse: impl FnOnce(ApiError) -> actix_web::HttpResponse,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error> {
    let token = match req.headers().get("x-api-key") {
        Some(value) => value
            .to_str()
            .ok()
            .map(str::trim)
            .filter(|token| !token.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| {
                ApiError::new(ProblemType::Unauthorized, "the x-api-key header is not a token")
            }),
        None => bearer_token(&req).map_err(|_| {
            ApiError::new(
                ProblemType::Unauthorized,
                "send your onejob API token as `x-api-key: <token>` or `Authorization: Bearer <token>`",
            )
        }),
    };
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
        Ok(user) => {
            req.extensions_mut().insert(user);
            Ok(next.call(req).await?.map_into_left_body())
        }
        Err(refusal) => Ok(req.into_response(refuse(refusal)).map_into_right_body()),
    }
}

async fn authenticate(req: &ServiceRequest, token: &str) -> Result<User, ApiError> {
    let app = req
        .app_data::<web::Data<App>>()
        .cloned()
        .ok_or_else(ApiError::internal)?;
    app.user_for_token(token)
        .await?
        .ok_or_else(|| ApiError::new(ProblemType::Unauthorized, "the bearer token is not valid"))
}
