//! What a worker asks of the application: a queued attempt to send, with a
//! lease; renewing that lease; and reaping the leases of processes that
//! stopped (their running attempts become `unknown`, never re-sent).

use super::{App, AppResult, Claim};
use crate::domain::{AttemptId, AttemptState};
use crate::store::queue::{self, SendPermit};

impl App {
    /// Claims up to `limit` of the oldest queued attempts for `lease_owner`,
    /// in one transaction. An attempt whose provider asked for no pause is
    /// confirmed for sending by the claim itself (its `sent_at` is set): the
    /// caller sends it at once.
    pub async fn claim_batch(&self, lease_owner: &str, limit: usize) -> AppResult<Vec<Claim>> {
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
                let send_now = |name: &str| {
                    providers
                        .get(name)
                        .is_some_and(|p| p.not_before().is_none())
                };
                queue::claim_batch(
                    conn,
                    &owner,
                    lease_ms,
                    limit as i64,
                    &soft_timeout_ms,
                    &send_now,
                )
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

    /// Reaps running attempts whose lease ran out: `unknown` if they were
    /// sent, back to the queue if not. Returns what each became.
    pub async fn expire_leases(&self) -> AppResult<Vec<(AttemptId, AttemptState)>> {
        Ok(self.store().run(queue::expire_leases).await?)
    }

    /// Confirms this worker's claim immediately before sending (see
    /// `store::queue::confirm_send`).
    pub async fn confirm_send(
        &self,
        attempt_id: &AttemptId,
        lease_owner: &str,
    ) -> AppResult<SendPermit> {
        let (id, owner) = (attempt_id.clone(), lease_owner.to_owned());
        let lease_ms = self.config().worker.lease_ms as i64;
        Ok(self
            .store()
            .run(move |conn| queue::confirm_send(conn, &id, &owner, lease_ms))
            .await?)
    }

    /// Gives an unsent claim back to the queue (or closes it, if its job
    /// finished): at shutdown, or when the claim became void.
    pub async fn give_back_unsent(
        &self,
        attempt_id: &AttemptId,
        lease_owner: &str,
    ) -> AppResult<SendPermit> {
        let (id, owner) = (attempt_id.clone(), lease_owner.to_owned());
        Ok(self
            .store()
            .run(move |conn| queue::give_back_unsent(conn, &id, &owner))
            .await?)
    }
}
