//! Twins in flight: a request under a key that this process is already
//! creating a job for waits for that creation and answers from its job,
//! instead of taking a connection to ask the database the same question.
//! This is the pattern known as request coalescing, or "single flight"
//! (Go's `golang.org/x/sync/singleflight`): one call per key is in flight,
//! and the duplicates that arrive meanwhile share its result. Here the
//! words are twins (duplicate requests), a flight (the call in progress),
//! boarding (joining one) and landing (its end, handed to the followers).
//!
//! The first request (the leader) goes on as usual; each twin that arrives
//! while it is in flight (a follower) waits for its end:
//! - the leader found or created the key's job: the follower answers from
//!   that committed row exactly as the database would have answered it, the
//!   same job as a replay for the same payload, 409 for another. A storm of
//!   retries or double-clicks then costs one insert per process;
//! - the database was busy (no connection free, a lock timeout): the
//!   follower gets the same retryable 503 at once, rather than adding its
//!   own wait to a database that is already behind;
//! - anything else (refused by today's configuration, another error, or its
//!   future dropped, as at shutdown): the followers board again, so one of
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

/// How a leader ended, for its followers.
#[derive(Debug)]
pub(crate) enum Landed {
    /// The key's job as the leader read it from its committed row.
    Job {
        job: Box<Job>,
        attempts: Vec<Attempt>,
    },
    /// The database was busy; the leader's retryable refusal.
    Unavailable(String),
}

type Flight = Arc<watch::Sender<Option<Arc<Landed>>>>;

/// The keys this process is creating jobs for right now.
#[derive(Default)]
pub(crate) struct KeyFlights {
    flights: Mutex<HashMap<(UserId, String), Flight>>,
}

/// What a request under a key does.
pub(crate) enum Boarding<'a> {
    /// No twin is in flight: create, then [`Leader::land`].
    Leader(Leader<'a>),
    /// A twin is in flight: wait for its job ([`follow`]).
    Follower(watch::Receiver<Option<Arc<Landed>>>),
}

impl KeyFlights {
    pub fn board(&self, owner: &UserId, key: &str) -> Boarding<'_> {
        let mut flights = self.flights.lock().unwrap_or_else(PoisonError::into_inner);
        let id = (owner.clone(), key.to_owned());
        if let Some(flight) = flights.get(&id) {
            return Boarding::Follower(flight.subscribe());
        }
        let flight: Flight = Arc::new(watch::channel(None).0);
        flights.insert(id.clone(), flight.clone());
        Boarding::Leader(Leader {
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
/// dropped, with its job if it landed one.
pub(crate) struct Leader<'a> {
    flights: &'a KeyFlights,
    id: (UserId, String),
    flight: Flight,
}

impl Leader<'_> {
    /// Hands the key's committed job to every follower.
    pub fn land(&self, job: &Job, attempts: &[Attempt]) {
        self.end(|| Landed::Job {
            job: Box::new(job.clone()),
            attempts: attempts.to_vec(),
        });
    }

    /// Hands the database's busy refusal to every follower.
    pub fn land_unavailable(&self, detail: &str) {
        self.end(|| Landed::Unavailable(detail.to_owned()));
    }

    /// Nothing is handed on (nor the job cloned) while no follower waits,
    /// the common case: a twin that boards after this and before the
    /// leader is dropped then boards again and asks the database itself.
    fn end(&self, landed: impl FnOnce() -> Landed) {
        if self.flight.receiver_count() > 0 {
            self.flight.send_replace(Some(Arc::new(landed())));
        }
    }
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        // Only this leader's flight is under its key: a new one boards only
        // after this removal. Dropping the last sender closes the channel,
        // which releases followers still waiting when nothing landed.
        self.flights
            .flights
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

/// How the leader ended, or `None` when it ended with nothing to hand on
/// (the follower then boards again).
pub(crate) async fn follow(
    mut flight: watch::Receiver<Option<Arc<Landed>>>,
) -> Option<Arc<Landed>> {
    flight
        .wait_for(Option::is_some)
        .await
        .ok()
        .and_then(|landed| landed.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> UserId {
        UserId::parse("0190f1a2-0000-7000-8000-000000000001").unwrap()
    }

    #[tokio::test]
    async fn a_follower_hears_how_its_leader_ended() {
        let flights = KeyFlights::default();
        let Boarding::Leader(leader) = flights.board(&owner(), "k") else {
            panic!("the first request under a key leads");
        };
        let Boarding::Follower(flight) = flights.board(&owner(), "k") else {
            panic!("a twin in flight follows");
        };
        assert!(matches!(
            flights.board(&owner(), "other"),
            Boarding::Leader(_)
        ));
        assert_eq!(flights.counts(), (1, 1));
        leader.land_unavailable("busy");
        // A twin that boards after the leader ended, before it is dropped,
        // still hears how it ended.
        let Boarding::Follower(late) = flights.board(&owner(), "k") else {
            panic!("the flight is still listed");
        };
        drop(leader);
        assert_eq!(flights.counts(), (0, 0));
        for flight in [flight, late] {
            assert!(matches!(
                follow(flight).await.as_deref(),
                Some(Landed::Unavailable(detail)) if detail == "busy"
            ));
        }
    }

    #[tokio::test]
    async fn a_leader_dropped_without_landing_releases_its_followers_empty_handed() {
        let flights = KeyFlights::default();
        let Boarding::Leader(leader) = flights.board(&owner(), "k") else {
            panic!("the first request under a key leads");
        };
        let Boarding::Follower(flight) = flights.board(&owner(), "k") else {
            panic!("a twin in flight follows");
        };
        let waiting = tokio::spawn(follow(flight));
        tokio::task::yield_now().await;
        drop(leader);
        assert!(waiting.await.unwrap().is_none());
        assert_eq!(flights.counts(), (0, 0));
        assert!(matches!(flights.board(&owner(), "k"), Boarding::Leader(_)));
    }
}
