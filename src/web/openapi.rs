//! The OpenAPI 3 document, generated from the handlers' annotations.

use actix_web::HttpResponse;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::views::*;
use super::openai_compat::{
    self, ChatCompletion, ChatCompletionRequest, ChatMessage, Choice, Model, ModelList,
    OpenAiErrorBody, OpenAiErrorDetail,
};
use super::{api_callbacks, api_jobs, api_support, health};
use crate::app::callbacks::{CallbackBody, CallbackOutcome};

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An API token from `onejob users add` or `onejob users token`",
                    ))
                    .build(),
            ),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "onejob",
        description = "One user intent, exactly one durable Job. Errors are RFC 9457 \
                       application/problem+json with a stable `type`."
    ),
    paths(
        api_jobs::create_job,
        api_jobs::list_jobs,
        api_jobs::get_job,
        api_jobs::start_attempt,
        api_support::abandon_attempt,
        api_support::unknown_attempts,
        api_support::races,
        api_callbacks::receive,
        openapi_json,
        health::healthz,
        health::readyz,
        health::metrics,
        openai_compat::chat_completions,
        openai_compat::list_models,
        openai_compat::get_model,
    ),
    components(schemas(
        CreateJobRequest,
        StartAttemptRequest,
        AbandonRequest,
        JobView,
        AttemptView,
        JobSummary,
        JobPage,
        UnknownAttemptView,
        RaceView,
        Problem,
        Health,
        CallbackBody,
        CallbackOutcome,
        ChatCompletionRequest,
        ChatMessage,
        ChatCompletion,
        Choice,
        Model,
        ModelList,
        OpenAiErrorBody,
        OpenAiErrorDetail,
    )),
    modifiers(&BearerAuth),
    tags(
        (name = "jobs", description = "Create and follow jobs"),
        (name = "support", description = "Resolve attempts stuck in unknown"),
        (name = "admin", description = "Review races"),
        (name = "callbacks", description = "Late answers from asynchronous providers, signed per attempt"),
        (name = "health", description = "Liveness and readiness"),
        (name = "openai-compatible", description = "OpenAI Chat Completions wire format: `model` names a chat route; errors in OpenAI's shape"),
    )
)]
pub struct ApiDoc;

/// This document.
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "health", responses((status = 200, description = "OpenAPI 3 document")))]
pub async fn openapi_json() -> HttpResponse {
    HttpResponse::Ok().json(ApiDoc::openapi())
}
