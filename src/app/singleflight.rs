//! Singleflight for creations: a request under a key that this process is
//! already creating a job for waits for that creation and answers from its
//! job, instead of taking a connection to ask the database the same
//! question. One call per key is in flight (its leader); the duplicates
//! (twins) that arrive meanwhile are its followers and share its result,
//! as in Go's `golang.org/x/sync/singleflight`. The sharing is
//! [`super::flights`]'s; what is shared, and when, is this module's.
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

use std::sync::Arc;

use super::flights::{Flight, Flights, Joined, Waiter};
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

/// An owner's idempotency key.
type OwnersKey = (UserId, String);

/// The keys this process is creating jobs for right now.
#[derive(Default)]
pub(crate) struct Singleflight(Flights<OwnersKey, Arc<Shared>>);

/// What a request under a key does.
pub(crate) enum Call<'a> {
    /// No twin is in flight: create, then [`Leader::share`].
    Leader(Leader<'a>),
    /// A twin is in flight: wait for its job ([`Follower::wait`]).
    Follower(Follower),
}

/// A twin waiting on its leader: `wait` gives what the leader shared, or
/// `None` when it ended with nothing to share (the follower then joins
/// again).
pub(crate) type Follower = Waiter<Arc<Shared>>;

impl Singleflight {
    /// Leads the call under `owner`'s `key`, or follows the one in flight.
    pub fn join(&self, owner: &UserId, key: &str) -> Call<'_> {
        match self.0.join((owner.clone(), key.to_owned())) {
            Joined::Started(flight) => Call::Leader(Leader(flight)),
            Joined::Waiting(waiter) => Call::Follower(waiter),
        }
    }

    /// Keys in flight, and the followers waiting on them.
    pub fn counts(&self) -> (usize, usize) {
        self.0.counts()
    }
}

/// The request that creates; its followers are released when it is
/// dropped, with its job if it shared one. Only this leader's call is
/// under its key until then: a new one leads only after.
pub(crate) struct Leader<'a>(Flight<'a, OwnersKey, Arc<Shared>>);

impl Leader<'_> {
    /// Hands the key's committed job to every follower (nothing is cloned
    /// while none waits).
    pub fn share(&self, job: &Job, attempts: &[Attempt]) {
        self.0.share(|| {
            Arc::new(Shared::Job {
                job: Box::new(job.clone()),
                attempts: attempts.to_vec(),
            })
        });
    }

    /// Hands the database's busy refusal to every follower.
    pub fn share_unavailable(&self, detail: &str) {
        self.0
            .share(|| Arc::new(Shared::Unavailable(detail.to_owned())));
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
}
