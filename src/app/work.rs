//! What a worker asks of the application: a queued attempt to send, with a
//! lease; renewing that lease; and reaping the leases of processes that
//! stopped (their running attempts become `unknown`, never re-sent).

use super::{App, AppResult, Claim};
use crate::domain::AttemptId;
use crate::store::queue;

impl App {
    /// Claims the oldest queued attempt for `lease_owner`.
    pub async fn claim_next(&self, lease_owner: &str) -> AppResult<Option<Claim>> {
        let owner = lease_owner.to_owned();
        let lease_ms = self.config().worker.lease_ms as i64;
        let providers = self.providers().clone();
        Ok(self
            .store()
            .run(move |conn| {
                let soft_timeout_ms = |name: &str| {
                    providers
                        .get(name)
                        .map_or(0, |p| p.soft_timeout().as_millis() as i64)
                };
                queue::claim_next(conn, &owner, lease_ms, &soft_timeout_ms)
            })
            .await?)
    }

    /// Extends this worker's lease on a running attempt; false when the
    /// attempt is no longer running under it.
    pub async fn renew_lease(&self, attempt_id: &AttemptId, lease_owner: &str) -> AppResult<bool> {
        let (id, owner) = (attempt_id.clone(), lease_owner.to_owned());
        let lease_ms = self.config().worker.lease_ms as i64;
        Ok(self
            .store()
            .run(move |conn| queue::renew_lease(conn, &id, &owner, lease_ms))
            .await?)
    }

    /// Makes running attempts whose lease ran out `unknown`; returns them.
    pub async fn expire_leases(&self) -> AppResult<Vec<AttemptId>> {
        Ok(self.store().run(queue::expire_leases).await?)
    }
}
