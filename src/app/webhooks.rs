//! PLACEHOLDER for the webhooks branch's use cases, so that the pages
//! compile on their own; replaced by that branch's module at merge.
#![allow(dead_code, unused_variables)]

use super::{App, AppError, AppResult, User};
use crate::domain::Secret;
use crate::store::webhooks::Endpoint;

pub struct EndpointRequest {
    pub url: String,
    pub events: Vec<String>,
    pub retry_for_ms: Option<i64>,
}

pub struct IssuedSecret {
    pub endpoint: Endpoint,
    pub secret: Secret,
}

fn unwired() -> AppError {
    AppError::Unavailable("unwired".into())
}

impl App {
    pub async fn create_webhook_endpoint(
        &self,
        user: &User,
        request: EndpointRequest,
    ) -> AppResult<IssuedSecret> {
        Err(unwired())
    }
    pub async fn rotate_webhook_secret(&self, user: &User, id: &str) -> AppResult<IssuedSecret> {
        Err(unwired())
    }
    pub async fn delete_webhook_endpoint(&self, user: &User, id: &str) -> AppResult<()> {
        Err(unwired())
    }
    pub async fn set_webhook_enabled(
        &self,
        user: &User,
        id: &str,
        enabled: bool,
    ) -> AppResult<Endpoint> {
        Err(unwired())
    }
    pub async fn resend_webhook_event(&self, user: &User, id: &str) -> AppResult<()> {
        Err(unwired())
    }
}
