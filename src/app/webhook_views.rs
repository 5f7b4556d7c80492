//! What the browser's webhook pages read: an owner's endpoints, one
//! endpoint's delivery log, a job's, and the admins' overview. Writes are
//! the use cases of [`crate::app::webhooks`].

use super::{require_admin, App, AppResult, Job, User};
use crate::domain::UserId;
use crate::store::webhooks::{self, Delivery, Endpoint, Event};

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
    pub oldest_pending_ms: Option<i64>,
}

impl App {
    /// The delivery log of a job `user` may see (its owner, or staff), with
    /// the URLs of its owner's endpoints.
    pub async fn webhook_log_of_job(&self, user: &User, job: &Job) -> AppResult<JobWebhookLog> {
        let (events, deliveries) = self.job_webhooks(user, &job.id).await?;
        let owner = job.owner_id.clone();
        let endpoints = self
            .store()
            .run(move |conn| webhooks::list_endpoints(conn, &owner))
            .await?
            .into_iter()
            .map(|e| (e.id, e.url))
            .collect();
        Ok(JobWebhookLog {
            events,
            deliveries,
            endpoints,
        })
    }

    /// One of `user`'s own endpoints and its log; another owner's is not
    /// found.
    pub async fn webhook_log_of_endpoint(&self, user: &User, id: &str) -> AppResult<EndpointLog> {
        Ok(EndpointLog {
            endpoint: self.webhook(user, id).await?,
            events: self.webhook_events(user, id).await?,
            deliveries: self
                .webhook_deliveries(user, id, webhooks::LIST_LIMIT)
                .await?,
        })
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
                    oldest_pending_ms: webhooks::oldest_pending_ms(conn)?,
                    endpoints,
                    owners,
                })
            })
            .await?)
    }
}
