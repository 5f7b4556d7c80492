//! Singleflight for creations: a request under a key that this process is
//! already creating a job for waits for that creation and answers from its
//! job, instead of taking a connection to ask the database the same
//! question. One call per key is in flight (its leader); the duplicates
//! (twins) that arrive meanwhile are its followers and share its result,
//! as in Go's `golang.org/x/sync/singleflight`.
//!
//! The leader goes on as usual; each follower waits for what it shares:
//! - the leader found or created the key's job: the follower answers from
//!   that committed row exactly as the database would have answered it, the
//!   same job as a replay for the same payload, 409 for another. A storm of
//!   retries or double-clicks then costs one insert per process;
//! - the database was busy (no connection free, a lock timeout): the
//!   follower gets the same retryable 503 at once, rather than adding its
//!   own wait to a database that is already behind;
//! - anything else (refused by today's configuration, another error, or its
//!   future dropped, as at shutdown): the followers join again, so one of
//!   them leads and the rest wait on it. (A client that hangs up does not
//!   end its request early: the server finishes it.)
//!
//! This spares the database work; it decides nothing. `UNIQUE(owner, key)`
//! still settles twins that reach different processes, or that arrive
//! after their leader has finished.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

use super::{Attempt, Job};
use crate::domain::UserId;

/// What a leader shares with its followers.
#[derive(Debug)]
pub(crate) enum Shared {
    /// The key's job as the leader read it from its committed row.
    Job {
        job: Box<Job>,
        attempts: Vec<Attempt>,
    },
    /// The database was busy; the leader's retryable refusal.
    Unavailable(String),
}

type InFlight = Arc<watch::Sender<Option<Arc<Shared>>>>;

/// The keys this process is creating jobs for right now.
#[derive(Default)]
pub(crate) struct Singleflight {
    flights: Mutex<HashMap<(UserId, String), InFlight>>,
}

/// What a request under a key does.
pub(crate) enum Call<'a> {
    /// No twin is in flight: create, then [`Leader::share`].
    Leader(Leader<'a>),
    /// A twin is in flight: wait for its job ([`Follower::wait`]).
    Follower(Follower),
}

/// A twin waiting on its leader.
pub(crate) struct Follower(watch::Receiver<Option<Arc<Shared>>>);

impl Singleflight {
    /// Leads the call under `owner`'s `key`, or follows the one in flight.
    pub fn join(&self, owner: &UserId, key: &str) -> Call<'_> {
        let mut flights = self.flights.lock().unwrap_or_else(PoisonError::into_inner);
        let id = (owner.clone(), key.to_owned());
        if let Some(flight) = flights.get(&id) {
            return Call::Follower(Follower(flight.subscribe()));
        }
        let flight: InFlight = Arc::new(watch::channel(None).0);
        flights.insert(id.clone(), flight.clone());
        Call::Leader(Leader {
            flights: self,
            id,
            flight,
        })
    }

    /// Keys in flight, and the followers waiting on them.
    pub fn counts(&self) -> (usize, usize) {
        let flights = self.flights.lock().unwrap_or_else(PoisonError::into_inner);
        let followers = flights.values().map(|f| f.receiver_count()).sum();
        (flights.len(), followers)
    }
}

/// The request that creates; its followers are released when it is
/// dropped, with its job if it shared one.
pub(crate) struct Leader<'a> {
    flights: &'a Singleflight,
    id: (UserId, String),
    flight: InFlight,
}

impl Leader<'_> {
    /// Hands the key's committed job to every follower.
    pub fn share(&self, job: &Job, attempts: &[Attempt]) {
        self.end(|| Shared::Job {
            job: Box::new(job.clone()),
            attempts: attempts.to_vec(),
        });
    }

    /// Hands the database's busy refusal to every follower.
    pub fn share_unavailable(&self, detail: &str) {
        self.end(|| Shared::Unavailable(detail.to_owned()));
    }

    /// Nothing is handed on (nor the job cloned) while no follower waits,
    /// the common case: a twin that joins after this and before the
    /// leader is dropped then joins again and asks the database itself.
    fn end(&self, shared: impl FnOnce() -> Shared) {
        if self.flight.receiver_count() > 0 {
            self.flight.send_replace(Some(Arc::new(shared())));
        }
    }
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        // Only this leader's call is under its key: a new one leads only
        // after this removal. Dropping the last sender closes the channel,
        // which releases followers still waiting when nothing was shared.
        self.flights
            .flights
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

impl Follower {
    /// What the leader shared, or `None` when it ended with nothing to
    /// share (the follower then joins again).
    pub async fn wait(mut self) -> Option<Arc<Shared>> {
        self.0
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|shared| shared.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> UserId {
        UserId::parse("0190f1a2-0000-7000-8000-000000000001").unwrap()
    }

    #[tokio::test]
    async fn a_follower_hears_how_its_leader_ended() {
        let flights = Singleflight::default();
        let Call::Leader(leader) = flights.join(&owner(), "k") else {
            panic!("the first request under a key leads");
        };
        let Call::Follower(flight) = flights.join(&owner(), "k") else {
            panic!("a twin in flight follows");
        };
        assert!(matches!(flights.join(&owner(), "other"), Call::Leader(_)));
        assert_eq!(flights.counts(), (1, 1));
        leader.share_unavailable("busy");
        // A twin that joins after the leader ended, before it is dropped,
        // still hears how it ended.
        let Call::Follower(late) = flights.join(&owner(), "k") else {
            panic!("the call is still listed");
        };
        drop(leader);
        assert_eq!(flights.counts(), (0, 0));
        for flight in [flight, late] {
            assert!(matches!(
                flight.wait().await.as_deref(),
                Some(Shared::Unavailable(detail)) if detail == "busy"
            ));
        }
    }

    #[tokio::test]
    async fn a_leader_dropped_without_sharing_releases_its_followers_empty_handed() {
        let flights = Singleflight::default();
        let Call::Leader(leader) = flights.join(&owner(), "k") else {
            panic!("the first request under a key leads");
        };
        let Call::Follower(flight) = flights.join(&owner(), "k") else {
            panic!("a twin in flight follows");
        };
        let waiting = tokio::spawn(flight.wait());
        tokio::task::yield_now().await;
        drop(leader);
        assert!(waiting.await.unwrap().is_none());
        assert_eq!(flights.counts(), (0, 0));
        assert!(matches!(flights.join(&owner(), "k"), Call::Leader(_)));
    }
}
