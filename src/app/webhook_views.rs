//! What the browser's webhook pages read: an owner's endpoints, one
//! endpoint's delivery log, a job's, and the admins' overview. Writes are
//! the use cases of [`crate::app::webhooks`].

use super::{require_admin, App, AppError, AppResult, Job, User};
use crate::domain::{Timestamp, UserId};
use crate::store::webhooks::{self, Delivery, Endpoint, EndpointKey, Event};

/// A job's events (every endpoint of its owner), their deliveries, and the
/// endpoints' URLs by id.
pub struct JobWebhookLog {
    pub events: Vec<Event>,
    pub deliveries: Vec<Delivery>,
    pub endpoints: Vec<(String, String)>,
}

/// One endpoint, its events (newest first) and their deliveries.
pub struct EndpointLog {
    pub endpoint: Endpoint,
    pub events: Vec<Event>,
    pub deliveries: Vec<Delivery>,
}

/// Every owner's endpoints, with the owners' names, for admins.
pub struct WebhooksOverview {
    pub endpoints: Vec<Endpoint>,
    pub owners: Vec<(UserId, String)>,
    pub disabled: i64,
    pub oldest_pending: Option<Timestamp>,
}

impl App {
    /// The delivery log of a job `user` may see (its owner, or staff), with
    /// the URLs of its owner's endpoints: one read of the store.
    pub async fn webhook_log_of_job(&self, user: &User, job: &Job) -> AppResult<JobWebhookLog> {
        if !super::visible_to(job, user) {
            return Err(AppError::NotFound);
        }
        let key = job.key();
        Ok(self
            .store()
            .run(move |conn| {
                Ok(JobWebhookLog {
                    events: webhooks::events_of_job(conn, &key)?,
                    deliveries: webhooks::deliveries_of_job(conn, &key)?,
                    endpoints: webhooks::list_endpoints(conn, &key.owner_id)?
                        .into_iter()
                        .map(|e| (e.row.id, e.row.url))
                        .collect(),
                })
            })
            .await?)
    }

    /// One of `user`'s own endpoints and its log, in one read; another
    /// owner's is not found.
    pub async fn webhook_log_of_endpoint(&self, user: &User, id: &str) -> AppResult<EndpointLog> {
        let key = EndpointKey {
            id: super::webhooks::parse_id(id).ok_or(AppError::NotFound)?,
            owner_id: user.id.clone(),
        };
        self.store()
            .run(move |conn| {
                let Some(endpoint) = webhooks::get_endpoint(conn, &key)? else {
                    return Ok(None);
                };
                Ok(Some(EndpointLog {
                    endpoint,
                    events: webhooks::events_of_endpoint(conn, &key)?,
                    deliveries: webhooks::deliveries_of_endpoint(
                        conn,
                        &key,
                        None,
                        webhooks::LIST_LIMIT,
                    )?,
                }))
            })
            .await?
            .ok_or(AppError::NotFound)
    }

    /// Every owner's endpoints (admins).
    pub async fn webhooks_overview(&self, user: &User) -> AppResult<WebhooksOverview> {
        require_admin(user)?;
        Ok(self
            .store()
            .run(|conn| {
                let endpoints = webhooks::list_all_endpoints(conn)?;
                let mut owners: Vec<(UserId, String)> = Vec::new();
                for e in &endpoints {
                    if !owners.iter().any(|(id, _)| *id == e.owner_id) {
                        let name = crate::store::users::name_of(conn, &e.owner_id)?;
                        owners.push((e.owner_id.clone(), name));
                    }
                }
                Ok(WebhooksOverview {
                    disabled: webhooks::disabled_endpoints(conn)?,
                    oldest_pending: webhooks::oldest_pending(conn)?,
                    endpoints,
                    owners,
                })
            })
            .await?)
    }
}
